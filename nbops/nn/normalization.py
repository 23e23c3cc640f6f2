"""Normalization layers: BatchNorm1d, BatchNorm2d, LayerNorm and RMSNorm, with
PyTorch's attribute names and semantics.

Batch norm's running statistics are *buffers*
(:meth:`~nbops.nn.Module.register_buffer`), not parameters: ``running_mean``
and ``running_var`` (C,) of the layer's dtype and the int64 0-d counter
``num_batches_tracked``, which no optimizer sees. They follow the weights in
``state_dict()`` under PyTorch's names (``1.running_mean``), are restored by
``load_state_dict``/``load`` and move with ``to()`` on the layer or on any
model that holds it.
"""

import numbers

import numpy as np

from .. import _checks, _dispatch, normalization
from .layers import _dtype, _operands
from .module import Module, Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm"]


class _BatchNorm(Module):
    _ranks = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, dtype=np.float32):
        super().__init__()
        name = type(self).__name__
        num_features = _checks.int_arg(name, "num_features", num_features, low=1)
        if momentum is not None and not (isinstance(momentum, numbers.Real)
                                         and 0.0 <= momentum <= 1.0):
            raise ValueError(f"{name}: momentum must be in [0, 1] or None (cumulative "
                             f"average), got {momentum!r}")
        if not isinstance(eps, numbers.Real) or not eps >= 0:
            raise ValueError(f"{name}: eps must be a real number >= 0, got {eps!r}")
        dtype = _dtype(name, dtype)
        self.num_features = num_features
        self.eps = float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        c = self.num_features
        self.weight = Parameter(np.ones(c, dtype)) if affine else None
        self.bias = Parameter(np.zeros(c, dtype)) if affine else None
        track = self.track_running_stats
        # as PyTorch: registered as None when not tracked, so the names exist
        # and state_dict() leaves them out
        self.register_buffer("running_mean", np.zeros(c, dtype) if track else None)
        self.register_buffer("running_var", np.ones(c, dtype) if track else None)
        self.register_buffer("num_batches_tracked", np.zeros((), np.int64) if track else None)

    def reset_running_stats(self):
        """Running mean 0, running variance 1, counter 0, on the buffers' device."""
        if self.track_running_stats:
            for name, fill in (("running_mean", 0), ("running_var", 1),
                               ("num_batches_tracked", 0)):
                cur = getattr(self, name)
                fresh = np.full(cur.shape, fill, cur.dtype)
                setattr(self, name, fresh if isinstance(cur, np.ndarray)
                        else _dispatch.to_device(fresh))

    def forward(self, x):
        name = type(self).__name__
        ndim = len(getattr(x, "shape", ()))
        if ndim not in self._ranks:
            raise ValueError(f"{name}: expected a {' or '.join(f'{r}-D' for r in self._ranks)} "
                             f"input, got shape {tuple(getattr(x, 'shape', ()))}")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            count = self._count_batch()
            if self.momentum is None:  # cumulative moving average
                momentum = 1.0 / count
        # as PyTorch: batch statistics in training, and also in evaluation
        # when no running statistics are kept
        use_batch = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        weight, bias = _operands(x, self.weight, self.bias)
        return normalization.batch_norm(
            x, self.running_mean if keep else None, self.running_var if keep else None,
            weight, bias, training=use_batch, momentum=momentum, eps=self.eps)

    def _count_batch(self):
        n = self.num_batches_tracked
        if isinstance(n, np.ndarray):
            n += 1
            return int(n)
        # on the GPU the counter is one element: a round trip per training
        # step, the same synchronisation PyTorch's momentum=None path makes
        count = np.array(_dispatch.to_host(n) + 1, np.int64)
        self.num_batches_tracked = _dispatch.to_device(count)
        return int(count)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs (``torch.nn.BatchNorm1d``).

    Parameters: ``num_features`` (C), ``eps`` (1e-5), ``momentum`` (0.1, or
    None for a cumulative average over ``num_batches_tracked`` batches),
    ``affine`` (learnable ``weight``/``bias``, initialised to 1 and 0),
    ``track_running_stats``, ``dtype`` (float32 or float64). In training
    mode (``train()``) it normalises with the batch's statistics and updates
    ``running_mean``/``running_var`` (unbiased variance) in place and counts
    ``num_batches_tracked``; in ``eval()`` mode it uses them. These three
    are buffers: (C,) arrays of ``dtype`` and an int64 0-d array, in
    ``state_dict()`` after ``weight``/``bias``, moved by ``to()``; None
    (and left out of ``state_dict()``) when ``track_running_stats=False``.
    Raises TypeError for a non-int ``num_features``, ValueError for bad
    sizes or input ranks.

    >>> bn = nbops.nn.BatchNorm1d(3)
    >>> with nbops.no_grad():
    ...     bn(np.ones((4, 3), np.float32)).shape
    (4, 3)
    >>> bn.num_batches_tracked
    array(1)
    """

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs (``torch.nn.BatchNorm2d``);
    parameters, attributes and modes as :class:`BatchNorm1d`.

    >>> bn = nbops.nn.BatchNorm2d(8).eval()
    >>> with nbops.no_grad():
    ...     bn(np.zeros((2, 8, 4, 4), np.float32)).shape
    (2, 8, 4, 4)
    """

    _ranks = (4,)


def _shape(name, normalized_shape):
    # the functional op's check: a TypeError for a float or bool size
    shape = normalization._normalized_shape(name, normalized_shape)
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"{name}: normalized_shape must be non-empty with positive sizes, "
                         f"got {shape}")
    return shape


class LayerNorm(Module):
    """Layer norm over the trailing ``normalized_shape`` axes
    (``torch.nn.LayerNorm``): ``weight`` (ones) and ``bias`` (zeros) of that
    shape when ``elementwise_affine`` (``bias=False`` drops the bias).

    Parameters: ``normalized_shape`` (int or tuple), ``eps`` (1e-5),
    ``elementwise_affine``, ``bias``, ``dtype``. Raises TypeError for a
    non-int size, ValueError for an empty or non-positive shape.

    >>> ln = nbops.nn.LayerNorm(4)
    >>> with nbops.no_grad():
    ...     ln(np.arange(8, dtype=np.float32).reshape(2, 4)).round(3)
    array([[-1.342, -0.447,  0.447,  1.342],
           [-1.342, -0.447,  0.447,  1.342]], dtype=float32)
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 dtype=np.float32):
        super().__init__()
        self.normalized_shape = _shape("LayerNorm", normalized_shape)
        self.eps = float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dtype = _dtype("LayerNorm", dtype)
        self.weight = Parameter(np.ones(self.normalized_shape, dtype)) \
            if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        weight, bias = _operands(x, self.weight, self.bias)
        return normalization.layer_norm(x, self.normalized_shape, weight, bias, eps=self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    """RMS norm over the trailing ``normalized_shape`` axes
    (``torch.nn.RMSNorm``): ``x / sqrt(mean(x^2) + eps) * weight``, with
    ``eps=None`` meaning the dtype's machine epsilon.

    >>> rn = nbops.nn.RMSNorm(2)
    >>> with nbops.no_grad():
    ...     rn(np.array([[3.0, 4.0]], np.float32)).round(3)
    array([[0.849, 1.131]], dtype=float32)
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, dtype=np.float32):
        super().__init__()
        self.normalized_shape = _shape("RMSNorm", normalized_shape)
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        dtype = _dtype("RMSNorm", dtype)
        self.weight = Parameter(np.ones(self.normalized_shape, dtype)) \
            if elementwise_affine else None

    def forward(self, x):
        (weight,) = _operands(x, self.weight)
        return normalization.rms_norm(x, self.normalized_shape, weight, eps=self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
