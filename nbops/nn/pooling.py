"""Pooling, flattening and softmax layers: thin modules over
:mod:`nbops.pooling`, :mod:`nbops.softmax` and :func:`nbops.reshape`, with
PyTorch's constructor arguments. They hold no parameters; arrays in give
arrays out, tensors in give tensors (with gradients) out.

>>> pool = nbops.nn.MaxPool2d(3, stride=2, padding=1)
>>> pool(np.zeros((1, 4, 8, 8), np.float32)).shape
(1, 4, 4, 4)
"""

import numpy as np

from .. import _checks, pooling, tensor
from ..softmax import log_softmax as _log_softmax, softmax as _softmax
from .module import Module

__all__ = ["MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
           "AdaptiveAvgPool2d", "Flatten", "Softmax", "LogSoftmax"]


class _Functional(Module):
    """A module calling ``fn(x, **kwargs)``; arguments are checked by the
    operator at the first call, as PyTorch's modules do."""

    fn = None

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def forward(self, x):
        return type(self).fn(x, **self.kwargs)

    def extra_repr(self):
        return ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())


class MaxPool2d(_Functional):
    """:func:`nbops.max_pool2d` as a module:
    ``MaxPool2d(kernel_size, stride=None, padding=0, dilation=1,
    return_indices=False, ceil_mode=False)`` (PyTorch's argument order).

    >>> nbops.nn.MaxPool2d(2)(np.ones((1, 1, 4, 4), np.float32)).shape
    (1, 1, 2, 2)
    """

    fn = staticmethod(pooling.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode,
                         return_indices=return_indices)


class MaxPool1d(MaxPool2d):
    """:func:`nbops.max_pool1d` as a module (arguments as :class:`MaxPool2d`)."""

    fn = staticmethod(pooling.max_pool1d)


class AvgPool2d(_Functional):
    """:func:`nbops.avg_pool2d` as a module:
    ``AvgPool2d(kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True, divisor_override=None)``."""

    fn = staticmethod(pooling.avg_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                         divisor_override=divisor_override)


class AvgPool1d(_Functional):
    """:func:`nbops.avg_pool1d` as a module:
    ``AvgPool1d(kernel_size, stride=None, padding=0, ceil_mode=False,
    count_include_pad=True)``."""

    fn = staticmethod(pooling.avg_pool1d)

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad)


class AdaptiveAvgPool2d(_Functional):
    """:func:`nbops.adaptive_avg_pool2d` as a module; ``AdaptiveAvgPool2d(1)``
    is ResNet's global pool (output (N, C, 1, 1))."""

    fn = staticmethod(pooling.adaptive_avg_pool2d)

    def __init__(self, output_size):
        super().__init__(output_size=output_size)


class AdaptiveAvgPool1d(_Functional):
    """:func:`nbops.adaptive_avg_pool1d` as a module."""

    fn = staticmethod(pooling.adaptive_avg_pool1d)

    def __init__(self, output_size):
        super().__init__(output_size=output_size)


class Softmax(_Functional):
    """:func:`nbops.softmax` along ``dim`` (PyTorch's name for the axis;
    required here, where PyTorch guesses one with a warning)."""

    fn = staticmethod(_softmax)

    def __init__(self, dim):
        _checks.int_arg(type(self).__name__, "dim", dim)
        super().__init__(axis=dim)
        self.dim = dim


class LogSoftmax(Softmax):
    """:func:`nbops.log_softmax` along ``dim``."""

    fn = staticmethod(_log_softmax)


class Flatten(Module):
    """Merge axes ``start_dim`` to ``end_dim`` (inclusive, negative from the
    end) into one, as ``torch.nn.Flatten``: (N, C, H, W) -> (N, C*H*W) by
    default. A view when the input is contiguous, through
    :func:`nbops.reshape` (so gradients flow).

    Raises TypeError for non-int dims and, at call time, ValueError when a
    dim is out of range or ``start_dim`` comes after ``end_dim``.

    >>> nbops.nn.Flatten()(np.ones((2, 3, 4, 5), np.float32)).shape
    (2, 60)
    """

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = _checks.int_arg("Flatten", "start_dim", start_dim)
        self.end_dim = _checks.int_arg("Flatten", "end_dim", end_dim)

    def forward(self, x):
        shape = tuple(x.shape)
        nd = max(len(shape), 1)
        s, e = (_axis(self.start_dim, nd, "start_dim"), _axis(self.end_dim, nd, "end_dim"))
        if s > e:
            raise ValueError(f"Flatten: start_dim {self.start_dim} comes after end_dim "
                             f"{self.end_dim} for an input of shape {shape}")
        if not shape:
            return tensor.reshape(x, (1,))
        merged = int(np.prod(shape[s:e + 1]))
        return tensor.reshape(x, shape[:s] + (merged,) + shape[e + 1:])

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


def _axis(dim, nd, name):
    if not -nd <= dim < nd:
        raise ValueError(f"Flatten: argument '{name}' is {dim}, out of range for an input "
                         f"of {nd} dimension(s)")
    return dim % nd
