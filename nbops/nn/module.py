"""Module, Parameter and Sequential: the containers of learnable weights
and of buffers.

Naming follows PyTorch so that weights exported from PyTorch as arrays load
by name: a layer's parameters are ``weight``/``bias``, a child's are
prefixed with its attribute name (``encoder.weight``), a ``Sequential``'s
children are ``0``, ``1``, ... (``0.weight``). Buffers are arrays that are
part of a module's state but not learned (batch norm's ``running_mean``):
registered with ``Module.register_buffer``, they are saved, loaded and moved
with the parameters (``0.running_mean``) and no optimizer sees them.
``state_dict()`` maps these names to arrays; ``save``/``load`` write and
read them as ``.npz``.
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
    (:class:`Parameter`) and child modules as attributes, register buffers
    (state that is not learned) with :meth:`register_buffer`, and define
    ``forward``; calling the module calls ``forward``.

    Methods: ``parameters(recurse=True)``, ``named_parameters(prefix="",
    recurse=True)``, ``register_buffer(name, array, persistent=True)``,
    ``buffers(recurse=True)``, ``named_buffers(prefix="", recurse=True)``,
    ``children()``, ``named_children()``, ``modules()``, ``named_modules()``,
    ``train(mode=True)``, ``eval()``, ``zero_grad()``, ``state_dict()``,
    ``load_state_dict(state, strict=True)``, ``save(path)``, ``load(path)``,
    ``to(device)``.

    Example
    -------
    >>> class Net(nbops.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nbops.nn.Linear(4, 2)
    ...         self.register_buffer("scale", np.ones(2, np.float32))
    ...     def forward(self, x):
    ...         return nbops.mul(self.fc(x), self.scale)
    >>> list(Net().state_dict())
    ['scale', 'fc.weight', 'fc.bias']
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None and isinstance(value, (Parameter, Module)):
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before "
                                 f"assigning parameters or submodules ('{name}')")
        if params is not None:
            if name in self._buffers and not isinstance(value, (Parameter, Module)):
                self._buffers[name] = _buffer_value(type(self).__name__, name, value)
            else:
                # as PyTorch: a parameter or submodule takes the name over from a buffer
                self._buffers.pop(name, None)
                self._non_persistent_buffers.discard(name)
                params.pop(name, None)
                self._modules.pop(name, None)
                if isinstance(value, Parameter):
                    params[name] = value
                elif isinstance(value, Module):
                    self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent_buffers.discard(name)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    def register_buffer(self, name, array, persistent=True):
        """Add an array that belongs to the module's state but is not learned.

        The buffer is an attribute (``self.<name>``); assigning an array or
        None to that attribute later replaces it, assigning a
        :class:`Parameter` or a :class:`Module` replaces the buffer by it,
        ``del self.<name>`` removes it. Buffers move with :meth:`to`; the
        persistent ones are saved and loaded by :meth:`state_dict` /
        :meth:`load_state_dict` after the module's parameters.

        Parameters
        ----------
        name : str
            Attribute name: not empty, without ``"."``, not already a
            parameter, submodule or other attribute (an existing buffer may
            be registered again).
        array : numpy.ndarray, device array or None
            Any shape and dtype, kept as it is (not copied). None keeps the
            name registered without state (``track_running_stats=False``).
        persistent : bool
            False keeps the buffer out of ``state_dict()``: not saved, not
            expected by ``load_state_dict``.

        Raises
        ------
        AttributeError
            ``super().__init__()`` has not been called.
        TypeError
            ``name`` is not a string, or ``array`` is not an array or None.
        KeyError
            ``name`` is empty, contains ``"."``, or is already taken.

        Example
        -------
        >>> m = nbops.nn.Module()
        >>> m.register_buffer("count", np.zeros((), np.int64))
        >>> m.register_buffer("cache", np.zeros(3), persistent=False)
        >>> [n for n, _ in m.named_buffers()], list(m.state_dict())
        (['count', 'cache'], ['count'])
        """
        cls = type(self).__name__
        if "_buffers" not in self.__dict__:
            raise AttributeError(f"{cls}: call super().__init__() before register_buffer "
                                 f"({name!r})")
        if not isinstance(name, str):
            raise TypeError(f"{cls}.register_buffer: name must be a str, got "
                            f"{type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"{cls}.register_buffer: name must be non-empty and contain no "
                           f"'.', got {name!r}")
        if name not in self._buffers and hasattr(self, name):
            kind = ("a parameter" if name in self._parameters else
                    "a submodule" if name in self._modules else "an attribute")
            raise KeyError(f"{cls}.register_buffer: {name!r} is already {kind}")
        self._buffers[name] = _buffer_value(cls, name, array)
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)
        object.__setattr__(self, name, array)

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

    def _named_members(self, registry, prefix, recurse):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, m in mods:
            for k, v in getattr(m, registry).items():
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    yield (f"{mod_name}.{k}" if mod_name else k), v

    def named_parameters(self, prefix="", recurse=True):
        """``(name, parameter)`` pairs, each parameter once, in registration
        order, depth first (this module's own only when ``recurse=False``)."""
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True):
        """``(name, array)`` of the buffers, persistent or not, each once, in
        registration order, depth first (this module's own only when
        ``recurse=False``); buffers set to None are skipped.

        >>> bn = nbops.nn.Sequential(nbops.nn.BatchNorm1d(3))
        >>> [n for n, _ in bn.named_buffers()]
        ['0.running_mean', '0.running_var', '0.num_batches_tracked']
        """
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse=recurse))

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
        """Move every parameter (and gradient) and every buffer to ``device``
        ("cpu"/"cuda") in place; returns self. Raises ValueError for another
        device name."""
        if device not in _dispatch.DEVICES:
            raise ValueError(f"Module.to: device must be 'cpu' or 'cuda', got {device!r}")
        move = _dispatch.to_device if device == _dispatch.CUDA else _dispatch.to_host
        with no_grad():
            for p in self.parameters():
                if p.device != device:
                    p.data = move(p.data)
                    p.grad = None if p.grad is None else move(p.grad)
        moved = {}  # an array registered in two modules stays one array
        for m in self.modules():
            for k, b in list(m._buffers.items()):
                if b is not None and _dispatch.device_of_array(b) != device:
                    if id(b) not in moved:
                        moved[id(b)] = move(b)
                    setattr(m, k, moved[id(b)])
        return self

    # -- state ---------------------------------------------------------------------
    def _state_entries(self):
        # (name, module, attribute, Parameter or buffer array), in PyTorch's
        # order: each module's parameters, then its persistent buffers
        seen = set()
        for mod_name, m in self.named_modules():
            dot = f"{mod_name}." if mod_name else ""
            persistent = ((k, b) for k, b in m._buffers.items()
                          if k not in m._non_persistent_buffers)
            for k, v in list(m._parameters.items()) + list(persistent):
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    yield dot + k, m, k, v

    def state_dict(self):
        """Ordered ``{name: array}`` of every parameter and persistent buffer,
        module by module depth first, each module's parameters before its
        buffers (PyTorch's order). The arrays themselves, on their device:
        copy them to keep a snapshot.

        >>> m = nbops.nn.Sequential(nbops.nn.Linear(2, 3), nbops.nn.BatchNorm1d(3))
        >>> list(m.state_dict())  # doctest: +NORMALIZE_WHITESPACE
        ['0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean', '1.running_var',
         '1.num_batches_tracked']
        """
        return OrderedDict((k, v.data if isinstance(v, Parameter) else v)
                           for k, _, _, v in self._state_entries())

    def load_state_dict(self, state, strict=True):
        """Copy arrays from ``state`` (name -> NumPy/device array or anything
        ``numpy.asarray`` accepts, PyTorch CPU tensors included) into the
        parameters and persistent buffers, cast to each one's dtype and moved
        to its device; the module never shares memory with ``state``.
        Non-persistent buffers and buffers set to None are not expected.

        Returns ``(missing, unexpected)``, the lists of names. Raises KeyError
        listing both when ``strict`` and either is non-empty, ValueError on a
        shape mismatch. Nothing is changed when an error is raised.
        """
        own = OrderedDict((k, (m, attr, v)) for k, m, attr, v in self._state_entries())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: {type(self).__name__}: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        staged = []
        for k, (m, attr, cur) in own.items():
            if k not in state:
                continue
            is_param = isinstance(cur, Parameter)
            target = cur.data if is_param else cur
            v = state[k]
            host = np.asarray(_dispatch.to_host(v) if _dispatch.is_device_array(v) else v)
            if tuple(host.shape) != tuple(target.shape):
                raise ValueError(f"load_state_dict: '{k}' has shape {tuple(host.shape)}, the "
                                 f"{'parameter' if is_param else 'buffer'} has shape "
                                 f"{tuple(target.shape)}")
            # always a copy: a model must not share memory with the dict it loaded
            host = np.array(host, dtype=target.dtype, order="C", copy=True)
            if _dispatch.device_of_array(target) == _dispatch.CUDA:
                host = _dispatch.to_device(host)
            staged.append((m, attr, cur, is_param, host))
        with no_grad():
            for m, attr, cur, is_param, value in staged:
                if is_param:
                    cur.data = value
                else:
                    setattr(m, attr, value)
        return missing, unexpected

    def save(self, path):
        """Write ``state_dict()`` (parameters and persistent buffers) to an
        ``.npz`` file (host copies)."""
        np.savez(path, **{k: np.asarray(_dispatch.to_host(v)) for k, v in
                          self.state_dict().items()})

    def load(self, path, strict=True):
        """Load parameters and buffers saved by :meth:`save` (or any ``.npz``
        of arrays named like ``state_dict()``), as :meth:`load_state_dict`."""
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


def _buffer_value(cls, name, value):
    if value is None or isinstance(value, np.ndarray) or (
            _dispatch.is_device_array(value) and not getattr(value, "__nbops_tensor__", False)):
        return value
    hint = " (pass its .data)" if getattr(value, "__nbops_tensor__", False) else ""
    raise TypeError(f"{cls}: buffer '{name}' must be a NumPy array, a device array or None, "
                    f"got {type(value).__name__}{hint}")


class Sequential(Module):
    """Modules applied in order; children are named ``0``, ``1``, ...
    A Linear directly followed by ReLU, Sigmoid, Tanh, Hardtanh or ReLU6
    runs as one product with the activation in its epilogue (same results).

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
        mods = list(self._modules.values())
        i = 0
        while i < len(mods):
            m = mods[i]
            # Linear followed by an activation its epilogue applies: one fused product
            fuse = getattr(m, "_epilogue_for", None)
            act = fuse(mods[i + 1]) if fuse is not None and i + 1 < len(mods) else None
            if act is not None:
                x = m._linear(x, act)
                i += 2
            else:
                x = m(x)
                i += 1
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
