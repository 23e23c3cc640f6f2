"""Spiking layers: LIF, Synaptic and ALIF neurons over time-major sequences.

A layer takes ``[T, B, ...]`` (time first) and returns the spikes
``[T, B, ...]``, running the whole time loop in one fused kernel
(:mod:`nbops.neuromorphic`). Weights compose over time without a Python
loop: ``nn.Linear`` applies to the last axis of ``[T, B, in]`` as one
batched product over all steps; other layers (a convolution over
``[B, C, H, W]``) go through :class:`TimeDistributed`, which folds time
into the batch for one call.

>>> from nbops import nn
>>> net = nn.Sequential(nn.Linear(16, 32, rng=0), nn.LIF(beta=0.9),
...                     nn.Linear(32, 4, rng=1), nn.LIF(beta=0.9))
>>> with nbops.no_grad():
...     net(np.random.rand(25, 8, 16).astype(np.float32)).shape
(25, 8, 4)

Learnable ``beta``/``threshold`` (``learn_beta=True``...) are parameters of
shape ``shape`` (default ``(1,)``: one value for the layer; ``(features,)``
for one per neuron). Gradient steps may leave their valid range, so each
forward first projects them back (beta into [0, 1], threshold to at least
``1e-6``), as snnTorch clamps its beta.
"""

import numpy as np

from .. import neuromorphic as _nm
from .._dispatch import to_host
from .layers import _dtype, _operands
from .module import Module, Parameter

__all__ = ["LIF", "Synaptic", "ALIF", "TimeDistributed"]


class _Spiking(Module):
    """Shared body of the spiking layers: parameters and the fused call."""

    fn = None           # the neuromorphic operator
    learnable = ()      # names of parameters that may be learned
    bounds = {"beta": (0.0, 1.0), "threshold": (1e-6, None), "alpha": (0.0, 1.0)}

    def __init__(self, values, learn, shape, dtype, options):
        super().__init__()
        dtype = _dtype(type(self).__name__, dtype)
        self.options = options
        self._names = tuple(values)
        for name, value in values.items():
            if name in learn:
                setattr(self, name, Parameter(np.full(shape, value, dtype)))
            else:
                setattr(self, name, value)

    def _args(self, x):
        params = [getattr(self, n) for n in self._names]
        learned = [p for p in params if isinstance(p, Parameter)]
        for n, p in zip(self._names, params):
            # projection after an optimizer step, outside the graph
            if isinstance(p, Parameter) and n in self.bounds:
                if isinstance(p.data, np.ndarray):
                    np.clip(p.data, *self.bounds[n], out=p.data)
                else:
                    p.data.copy_to_device(np.clip(to_host(p.data), *self.bounds[n]))
        ops = iter(_operands(x, *learned))
        return [next(ops) if isinstance(p, Parameter) else p for p in params]

    def forward(self, x):
        out = type(self).fn(x, *self._args(x), **self.options)
        return out[0]

    def extra_repr(self):
        parts = []
        for n in self._names:
            p = getattr(self, n)
            parts.append(f"{n}={'learned' if isinstance(p, Parameter) else p}")
        return ", ".join(parts + [f"{k}={v!r}" for k, v in self.options.items()])


def _surrogate_options(reset, surrogate, detach_reset, extra):
    return {"reset": reset, "surrogate": surrogate, "detach_reset": detach_reset, **extra}


class LIF(_Spiking):
    """Leaky integrate-and-fire layer (:func:`nbops.neuromorphic.lif`).

    Parameters: ``beta`` (decay in [0, 1]), ``threshold`` (> 0), ``reset``
    ("subtract", "zero", "none"), ``learn_beta``/``learn_threshold``,
    ``shape`` of learned parameters, ``surrogate`` (a name or
    ``(name, value)``) and ``detach_reset`` for training, ``dtype``.
    Input ``[T, B, ...]``; output spikes of the same shape. Errors as
    :func:`nbops.neuromorphic.lif`.

    >>> layer = nbops.nn.LIF(beta=0.9, learn_beta=True)
    >>> [n for n, _ in layer.named_parameters()]
    ['beta']
    """

    fn = _nm.lif

    def __init__(self, beta=0.9, threshold=1.0, reset="subtract", *, learn_beta=False,
                 learn_threshold=False, shape=(1,), surrogate="fast_sigmoid",
                 detach_reset=True, dtype=np.float32):
        learn = {n for n, f in (("beta", learn_beta), ("threshold", learn_threshold)) if f}
        super().__init__({"beta": beta, "threshold": threshold}, learn, shape, dtype,
                         _surrogate_options(reset, surrogate, detach_reset, {}))


class Synaptic(_Spiking):
    """Second-order LIF layer (:func:`nbops.neuromorphic.synaptic`): synaptic
    decay ``alpha`` and membrane decay ``beta`` in [0, 1], ``threshold``;
    learnable as :class:`LIF` (``learn_beta``, ``learn_threshold``).

    >>> nbops.nn.Synaptic(alpha=0.8, beta=0.9)
    Synaptic(alpha=0.8, beta=0.9, threshold=1.0, reset='subtract', surrogate='fast_sigmoid', detach_reset=True)
    """

    fn = _nm.synaptic

    def __init__(self, alpha=0.8, beta=0.9, threshold=1.0, reset="subtract", *,
                 learn_beta=False, learn_threshold=False, shape=(1,),
                 surrogate="fast_sigmoid", detach_reset=True, dtype=np.float32):
        learn = {n for n, f in (("beta", learn_beta), ("threshold", learn_threshold)) if f}
        super().__init__({"alpha": alpha, "beta": beta, "threshold": threshold}, learn, shape,
                         dtype, _surrogate_options(reset, surrogate, detach_reset, {}))


class ALIF(_Spiking):
    """Adaptive-threshold LIF layer (:func:`nbops.neuromorphic.alif`):
    ``beta``, base ``threshold``, ``adapt_decay`` and ``adapt_scale`` of the
    threshold's adaptation; learnable as :class:`LIF`.

    >>> layer = nbops.nn.ALIF(beta=0.9, adapt_scale=0.5)
    """

    fn = _nm.alif

    def __init__(self, beta=0.9, threshold=1.0, adapt_decay=0.95, adapt_scale=0.2,
                 reset="subtract", *, learn_beta=False, learn_threshold=False, shape=(1,),
                 surrogate="fast_sigmoid", detach_reset=True, dtype=np.float32):
        learn = {n for n, f in (("beta", learn_beta), ("threshold", learn_threshold)) if f}
        super().__init__({"beta": beta, "threshold": threshold, "adapt_decay": adapt_decay,
                          "adapt_scale": adapt_scale}, learn, shape, dtype,
                         _surrogate_options(reset, surrogate, detach_reset, {}))


class TimeDistributed(Module):
    """Apply ``module`` to every time step of ``[T, B, ...]`` in one call, by
    folding time into the batch (``[T * B, ...]``) and back.

    Use it for layers that expect a plain batch (a convolution over
    ``[B, C, H, W]``); ``Linear`` already applies over leading axes.

    >>> layer = nbops.nn.TimeDistributed(nbops.nn.Linear(3, 2, rng=0))
    """

    def __init__(self, module):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"TimeDistributed: expected a Module, got {type(module).__name__}")
        self.module = module

    def forward(self, x):
        shape = tuple(x.shape)
        if len(shape) < 2:
            raise ValueError(f"TimeDistributed: expected [T, B, ...], got shape {shape}")
        y = self.module(x.reshape((shape[0] * shape[1],) + shape[2:]))
        return y.reshape(shape[:2] + tuple(y.shape[1:]))
