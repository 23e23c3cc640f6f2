"""Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW.

Each ``step()`` updates every parameter that has a gradient with one fused
kernel on the parameter's device (``nbops/cpu/optim.py``,
``nbops/cuda/optim.py``), in the parameter's dtype, following PyTorch's
update rules. Steps run outside the autograd tape and bump each
parameter's version counter, so a graph that saved a parameter before the
step refuses to backward afterwards.

>>> opt = nbops.optim.Adam(model.parameters(), lr=1e-3)
>>> loss = nbops.nn.cross_entropy(model(x), y)
>>> opt.zero_grad(); loss.backward(); opt.step()
"""

import math

import numpy as np

from . import _checks, _dispatch, _layout, _spec, arith
from .autograd import _is_tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]

FAMILY = _spec.mirror("optim")
_dispatch.register_kernels(FAMILY, ("sgd_step", "adam_step"))


class Optimizer:
    """Base class: holds the parameters and per-parameter state.

    ``params`` is an iterable of tensors that require grad (a module's
    ``parameters()``); ``zero_grad()`` drops their gradients and ``step()``
    applies one update to those that have one.
    """

    def __init__(self, params, name):
        self.name = name
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{name}: got an empty parameter list")
        for i, p in enumerate(self.params):
            if not _is_tensor(p) or not p.requires_grad:
                raise TypeError(f"{name}: parameter {i} must be a Tensor that requires grad, "
                                f"got {_checks.describe(p)}")
            if not _layout.is_c_contiguous(p.data):
                raise ValueError(f"{name}: parameter {i} must be C-contiguous")
        self.state = [None] * len(self.params)
        self.steps = 0

    def zero_grad(self):
        """Set every parameter's ``grad`` to None."""
        for p in self.params:
            p.grad = None

    def step(self):
        """Apply one update to every parameter that has a gradient."""
        self.steps += 1
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if _dispatch.device_of_array(g) != p.device or tuple(g.shape) != p.shape:
                raise ValueError(f"{self.name}: parameter {i} ({p.shape} on {p.device}) has a "
                                 f"gradient of shape {tuple(g.shape)} on "
                                 f"{_dispatch.device_of_array(g)}")
            if self.state[i] is None:
                self.state[i] = [arith.zeros(p.shape, p.dtype, p.device)
                                 for _ in range(self._n_buffers())]
            flat = [_flat(a) for a in [p.data, _contiguous(g)] + self.state[i]]
            scalars = tuple(np.dtype(p.dtype).type(v) if not isinstance(v, bool) else v
                            for v in self._scalars(i))
            _dispatch.kernel(self._kernel, p.device)(*flat, scalars)
            p._version += 1


def _contiguous(a):
    from .tensor import contiguous

    return contiguous(a)


def _flat(a):
    return a.reshape(a.size) if a.ndim != 1 else a


def _nonneg(name, opt, value):
    return _checks.scalar(name, opt, value, low=0.0)


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (PyTorch's rule:
    ``buf = momentum * buf + (1 - dampening) * g``, ``buf = g`` on the first
    step), Nesterov momentum and L2 weight decay (``g += weight_decay * p``).

    Raises ValueError for negative ``lr``/``momentum``/``weight_decay``, or
    Nesterov without momentum or with dampening.
    """

    _kernel = FAMILY.key("sgd_step")

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        super().__init__(params, "SGD")
        self.lr = _nonneg("SGD", "lr", lr)
        self.momentum = _nonneg("SGD", "momentum", momentum)
        self.dampening = _checks.scalar("SGD", "dampening", dampening)
        self.weight_decay = _nonneg("SGD", "weight_decay", weight_decay)
        self.nesterov = bool(nesterov)
        if nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        self._first = [True] * len(self.params)

    def _n_buffers(self):
        return 1

    def _scalars(self, i):
        first, self._first[i] = self._first[i], False
        keep = 0.0 if first else self.momentum
        mix = 1.0 if first else 1.0 - self.dampening
        return (self.lr, self.weight_decay, keep, mix, self.momentum, self.nesterov,
                self.momentum != 0.0)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with PyTorch's bias correction; ``weight_decay``
    is L2 (added to the gradient). See :class:`AdamW` for decoupled decay.

    Raises ValueError for negative ``lr``/``eps``/``weight_decay`` or betas
    outside [0, 1).
    """

    _kernel = FAMILY.key("adam_step")
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        name = type(self).__name__
        super().__init__(params, name)
        self.lr = _nonneg(name, "lr", lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{name}: betas must be a pair of floats, got {betas!r}")
        self.betas = tuple(_checks.scalar(name, f"betas[{k}]", b, low=0.0)
                           for k, b in enumerate(betas))
        if any(b >= 1.0 for b in self.betas):
            raise ValueError(f"{name}: betas must be in [0, 1), got {betas!r}")
        self.eps = _nonneg(name, "eps", eps)
        self.weight_decay = _nonneg(name, "weight_decay", weight_decay)
        self._t = [0] * len(self.params)

    def _n_buffers(self):
        return 2

    def _scalars(self, i):
        self._t[i] += 1
        t = self._t[i]
        b1, b2 = self.betas
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        l2 = 0.0 if self._decoupled else self.weight_decay
        decay = 1.0 - self.lr * self.weight_decay if self._decoupled else 1.0
        return (b1, 1.0 - b1, b2, 1.0 - b2, l2, decay, self.lr / bc1, 1.0 / math.sqrt(bc2),
                self.eps)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): each step first
    scales the parameter by ``1 - lr * weight_decay`` (default 0.01)."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
