"""Module, Parameter and Sequential: the containers of learnable weights.

Naming follows PyTorch so that weights exported from PyTorch as arrays load
by name: a layer's parameters are ``weight``/``bias``, a child's are
prefixed with its attribute name (``encoder.weight``), a ``Sequential``'s
children are ``0``, ``1``, ... (``0.weight``). ``state_dict()`` maps these
names to arrays; ``save``/``load`` write and read them as ``.npz``.
"""

from collections import OrderedDict

import numpy as np

from .. import _dispatch
from ..autograd import Tensor, no_grad

__all__ = ["Parameter", "Module", "Sequential"]


class Parameter(Tensor):
    """A :class:`~nbops.Tensor` that a :class:`Module` owns as a learnable
    weight (``requires_grad=True`` unless told otherwise)."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter" + super().__repr__()[len("Tensor"):]


class Module:
    """Base class of layers and models.

    Subclasses call ``super().__init__()`` first, assign parameters
    (:class:`Parameter`) and child modules as attributes, and define
    ``forward``; calling the module calls ``forward``.

    Methods: ``parameters()``, ``named_parameters()``, ``children()``,
    ``named_children()``, ``modules()``, ``train(mode=True)``, ``eval()``,
    ``zero_grad()``, ``state_dict()``, ``load_state_dict(state, strict=True)``,
    ``save(path)``, ``load(path)``, ``to(device)``.

    Example
    -------
    >>> class Net(nbops.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nbops.nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> list(Net().state_dict())
    ['fc.weight', 'fc.bias']
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None and isinstance(value, (Parameter, Module)):
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before "
                                 f"assigning parameters or submodules ('{name}')")
        if params is not None:
            params.pop(name, None)
            self._modules.pop(name, None)
            if isinstance(value, Parameter):
                params[name] = value
            elif isinstance(value, Module):
                self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- traversal -------------------------------------------------------------
    def named_children(self):
        return iter(self._modules.items())

    def children(self):
        return iter(self._modules.values())

    def named_modules(self, prefix=""):
        """``(name, module)`` for this module and every descendant, depth first."""
        stack = [(prefix, self)]
        seen = set()
        while stack:
            name, m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            stack.extend(reversed([(f"{name}.{k}" if name else k, c)
                                   for k, c in m._modules.items()]))

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_parameters(self, prefix=""):
        """``(name, parameter)`` pairs, each parameter once, in registration order."""
        seen = set()
        for mod_name, m in self.named_modules(prefix):
            for k, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{k}" if mod_name else k), p

    def parameters(self):
        return (p for _, p in self.named_parameters())

    # -- modes and gradients -----------------------------------------------------
    def train(self, mode=True):
        """Training mode (dropout active) for this module and its children."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        """Evaluation mode: ``train(False)``."""
        return self.train(False)

    def zero_grad(self):
        """Drop every parameter's gradient (``grad = None``)."""
        for p in self.parameters():
            p.grad = None

    def to(self, device):
        """Move every parameter (and gradient) to ``device`` ("cpu"/"cuda")
        in place; returns self."""
        if device not in _dispatch.DEVICES:
            raise ValueError(f"Module.to: device must be 'cpu' or 'cuda', got {device!r}")
        move = _dispatch.to_device if device == _dispatch.CUDA else _dispatch.to_host
        with no_grad():
            for p in self.parameters():
                if p.device != device:
                    p.data = move(p.data)
                    p.grad = None if p.grad is None else move(p.grad)
        return self

    # -- state ---------------------------------------------------------------------
    def state_dict(self):
        """Ordered ``{name: array}`` of every parameter (the arrays themselves,
        on their device; copy them to keep a snapshot)."""
        return OrderedDict((k, p.data) for k, p in self.named_parameters())

    def load_state_dict(self, state, strict=True):
        """Copy arrays from ``state`` (name -> NumPy/device array or anything
        ``numpy.asarray`` accepts, PyTorch CPU tensors included) into the
        parameters, cast to each parameter's dtype and moved to its device.

        Raises KeyError listing missing and unexpected names when ``strict``
        (otherwise returns them as ``(missing, unexpected)``), ValueError on
        a shape mismatch. Nothing is changed when an error is raised.
        """
        own = OrderedDict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: {type(self).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        staged = []
        for k, p in own.items():
            if k not in state:
                continue
            v = state[k]
            host = np.asarray(_dispatch.to_host(v) if _dispatch.is_device_array(v) else v)
            if tuple(host.shape) != p.shape:
                raise ValueError(f"load_state_dict: '{k}' has shape {tuple(host.shape)}, the "
                                 f"parameter has shape {p.shape}")
            # always a copy: a model must not share memory with the dict it loaded
            host = np.array(host, dtype=p.dtype, order="C", copy=True)
            staged.append((p, host if p.device == _dispatch.CPU else _dispatch.to_device(host)))
        with no_grad():
            for p, value in staged:
                p.data = value
        return missing, unexpected

    def save(self, path):
        """Write ``state_dict()`` to an ``.npz`` file (host copies)."""
        np.savez(path, **{k: np.asarray(_dispatch.to_host(v)) for k, v in
                          self.state_dict().items()})

    def load(self, path, strict=True):
        """Load parameters saved by :meth:`save` (or any ``.npz`` of arrays
        named like ``state_dict()``)."""
        with np.load(path) as f:
            return self.load_state_dict({k: f[k] for k in f.files}, strict=strict)

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + ("\n)" if self._modules else ")")

    def extra_repr(self):
        return ""


class Sequential(Module):
    """Modules applied in order; children are named ``0``, ``1``, ...

    >>> model = nbops.nn.Sequential(nbops.nn.Linear(4, 8), nbops.nn.ReLU(),
    ...                             nbops.nn.Linear(8, 2))
    >>> list(model.state_dict())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    """

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: item {i} must be a Module, got "
                                f"{type(m).__name__}")
            setattr(self, str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
