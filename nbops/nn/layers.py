"""Layers: Linear, the activation modules (Swish with a learnable beta) and
Dropout.

Inputs may be arrays or tensors. While gradients are recorded and the
layer has parameters that require grad, outputs are :class:`~nbops.Tensor`
(so ``model(x_array)`` trains); under :func:`nbops.no_grad` arrays in give
arrays out, for plain NumPy (or device-array) inference.
"""

import math

import numpy as np

from .. import _checks, _dispatch, activations, arith, linalg
from ..autograd import _is_tensor, is_grad_enabled
from .module import Module, Parameter

__all__ = ["Linear", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardtanh", "ReLU6", "Swish",
           "Dropout"]


def _operands(x, *params):
    """The parameters as tensors when the call is to be recorded, else their arrays."""
    record = _is_tensor(x) or (is_grad_enabled() and any(
        p is not None and p.requires_grad for p in params))
    return params if record else tuple(None if p is None else p.data for p in params)


def _rng(rng):
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def _dtype(cls, dtype):
    dtype = np.dtype(dtype)
    if dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"{cls}: dtype must be float32 or float64, got {dtype}")
    return dtype


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` (out_features, in_features)
    and ``bias`` (out_features,), initialised as PyTorch does
    (uniform in +-1/sqrt(in_features)).

    Parameters: ``in_features``, ``out_features`` (positive ints), ``bias``
    (bool), ``dtype`` (float32 default, or float64), ``rng`` (a
    ``numpy.random.Generator`` or a seed). Input (..., in_features) on the
    parameters' device. Raises TypeError for non-int sizes or a bad dtype,
    ValueError for sizes below 1.

    >>> layer = nbops.nn.Linear(3, 2, rng=0)
    >>> with nbops.no_grad():
    ...     layer(np.ones((4, 3), np.float32)).shape
    (4, 2)
    """

    def __init__(self, in_features, out_features, bias=True, dtype=np.float32, rng=None):
        super().__init__()
        op = type(self).__name__   # subclasses (GraphConv) name themselves
        in_features = _checks.int_arg(op, "in_features", in_features, low=1)
        out_features = _checks.int_arg(op, "out_features", out_features, low=1)
        dtype = _dtype(op, dtype)
        self.in_features, self.out_features = in_features, out_features
        rng = _rng(rng)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features))
                                .astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, out_features).astype(dtype)) \
            if bias else None

    def forward(self, x):
        return self._linear(x, None)

    def _linear(self, x, activation):
        weight, bias = _operands(x, self.weight, self.bias)
        return linalg.linear(x, weight, bias, activation=activation)

    def _epilogue_for(self, module):
        """The activation of ``module`` (the next one in a Sequential) that
        this layer can apply in its GEMM's epilogue, or None."""
        if type(self).forward is not Linear.forward:  # a subclass computes something else
            return None
        act = _EPILOGUE_ACTIVATIONS.get(type(module))
        return act(module) if callable(act) else act

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class _Elementwise(Module):
    """An activation with fixed parameters, calling the nbops operator."""

    fn = None

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return type(self).fn(x, **self.kwargs)

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())


def _activation_module(name, fn, doc, **defaults):
    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise TypeError(f"{name}: unexpected arguments {sorted(unknown)}")
        _Elementwise.__init__(self, **{**defaults, **kwargs})

    return type(name, (_Elementwise,), {"fn": staticmethod(fn), "__init__": __init__,
                                        "__doc__": doc, "__module__": __name__})


ReLU = _activation_module("ReLU", activations.relu, "``nbops.relu`` as a module.")
GELU = _activation_module("GELU", activations.gelu,
                          "``nbops.gelu`` as a module; ``GELU(approximate='tanh')``.",
                          approximate="none")
SiLU = _activation_module("SiLU", activations.silu, "``nbops.silu`` as a module.")
Sigmoid = _activation_module("Sigmoid", activations.sigmoid, "``nbops.sigmoid`` as a module.")
Tanh = _activation_module("Tanh", activations.tanh, "``nbops.tanh`` as a module.")


class Hardtanh(_Elementwise):
    """``nbops.hardtanh`` as a module: ``x`` clipped to ``[min_val, max_val]``.

    Raises ValueError (naming Hardtanh) when ``min_val > max_val`` or either
    is NaN, TypeError for a non-number.

    >>> nbops.nn.Hardtanh(-2.0, 2.0)(np.array([-3.0, 1.0, 3.0]))
    array([-2.,  1.,  2.])
    """

    fn = staticmethod(activations.hardtanh)

    def __init__(self, min_val=-1.0, max_val=1.0):
        lo, hi = _checks.bounds(type(self).__name__, "min_val", min_val, "max_val", max_val)
        super().__init__(min_val=lo, max_val=hi)


class ReLU6(Hardtanh):
    """``min(max(x, 0), 6)``: ``nbops.hardtanh(x, 0, 6)`` as a module
    (MobileNet's activation).

    >>> nbops.nn.ReLU6()(np.array([-1.0, 3.0, 7.0]))
    array([0., 3., 6.])
    """

    def __init__(self):
        super().__init__(0.0, 6.0)

    def extra_repr(self):
        return ""


#: Activation modules that a Linear right before them in a Sequential applies
#: in its product's epilogue (one pass over the output fewer, one graph node
#: fewer): those whose derivative comes from the output, so the fused
#: backward needs no recomputed product. Same results to the bit. A value is
#: the epilogue activation, or a function of the module giving it.
_EPILOGUE_ACTIVATIONS = {
    ReLU: "relu", Sigmoid: "sigmoid", Tanh: "tanh",
    Hardtanh: lambda m: ("hardtanh", m.kwargs["min_val"], m.kwargs["max_val"]),
}
_EPILOGUE_ACTIVATIONS[ReLU6] = _EPILOGUE_ACTIVATIONS[Hardtanh]


class Swish(Module):
    """``x * sigmoid(beta * x)`` with ``beta`` a learnable one-element
    parameter (state key ``beta``), or a fixed float when
    ``learnable=False``.

    >>> act = nbops.nn.Swish(beta=1.0)
    >>> [name for name, _ in act.named_parameters()]
    ['beta']
    """

    def __init__(self, beta=1.0, learnable=True, dtype=np.float32):
        super().__init__()
        beta = _checks.scalar("Swish", "beta", beta)
        self.beta = Parameter(np.array([beta], _dtype("Swish", dtype))) if learnable else beta

    def forward(self, x):
        if isinstance(self.beta, float):
            return activations.swish(x, self.beta)
        (beta,) = _operands(x, self.beta)
        return activations.swish(x, beta)

    def extra_repr(self):
        b = self.beta if isinstance(self.beta, float) else self.beta.item()
        return f"beta={b:g}"


class Dropout(Module):
    """Zero each element with probability ``p`` in training mode and scale
    the rest by ``1 / (1 - p)``; the identity in eval mode. The mask is drawn
    on the host from ``rng`` (a Generator or seed) and copied to the input's
    device.

    Raises ValueError for ``p`` outside [0, 1].
    """

    def __init__(self, p=0.5, rng=None):
        super().__init__()
        self.p = _checks.scalar("Dropout", "p", p, low=0.0, high=1.0)
        self._rng = _rng(rng)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        data = x.data if _is_tensor(x) else x
        keep = self._rng.random(tuple(data.shape)) >= self.p
        mask = (keep / (1.0 - self.p) if self.p < 1.0 else keep * 0.0).astype(data.dtype)
        if _dispatch.device_of_array(data) == _dispatch.CUDA:
            mask = _dispatch.to_device(mask)
        return arith.mul(x, mask)

    def extra_repr(self):
        return f"p={self.p}"
