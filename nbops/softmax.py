"""Softmax and log-softmax along any axis, on CPU and CUDA, with backward.

``softmax(x)_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x))`` and
``log_softmax(x)_i = x_i - max(x) - log(sum_j exp(x_j - max(x)))``: the
row maximum is subtracted first, so values of any magnitude (1e4, 1e30)
neither overflow nor lose the result. Semantics of special values are
PyTorch's: a row of all -inf (a fully masked row) gives NaN in every
element, a row holding NaN or +inf gives NaN in every element; -inf entries
of an otherwise finite row give 0 (softmax) and -inf (log_softmax).

Kernels: ``nbops/cpu/softmax.py`` (one read and one write of memory per
element where a row fits in cache; other axes in blocks of columns, never
transposed) and ``nbops/cuda/softmax.py`` (one block per row with
shared-memory reductions; one thread per column for other axes). On the CPU
the exponential is nbops' vectorized approximation (within 1 ulp).
"""

import numpy as np

from . import _checks, _dispatch, _layout
from . import tensor as _tensor
from ._dispatch import CPU, CUDA, operator

__all__ = ["softmax", "log_softmax"]

for _k in ("softmax", "softmax_backward"):
    _dispatch.register_kernel("softmax." + _k, CPU, f"nbops.cpu.softmax:{_k}")
    _dispatch.register_kernel("softmax." + _k, CUDA, f"nbops.cuda.softmax:{_k}")
del _k


_DOC = """{title}

    Parameters
    ----------
    x : ndarray or device array, float32 or float64, any shape (0-d is one
        element)
        Strided inputs are copied to C order first.
    axis : int
        The axis to normalise over (negative counts from the end).
    out : array, optional
        C-contiguous array of x's shape, dtype and device, not overlapping
        ``x``.

    Returns
    -------
    array of x's shape and dtype on x's device.

    Raises
    ------
    TypeError
        ``x`` is not a float32/float64 array, ``axis`` is not an int,
        ``out`` has the wrong dtype or device.
    ValueError
        ``axis`` out of range, ``out`` of the wrong shape, not C-contiguous
        or overlapping ``x``.

    Example
    -------
    {example}
    """


@operator("softmax", save=("output",))
def softmax(x, axis=-1, out=None):
    return _forward("softmax", x, axis, out, False)


@operator("log_softmax", save=("output",))
def log_softmax(x, axis=-1, out=None):
    return _forward("log_softmax", x, axis, out, True)


softmax.__doc__ = softmax.front.__doc__ = _DOC.format(
    title="Softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``, each slice "
          "summing to 1.\n\n    Gradient: ``y * (g - sum(g * y))`` along the axis.",
    example=">>> nbops.softmax(np.array([1e4, 1e4 + np.log(3)], np.float32))\n"
            "    array([0.25, 0.75], dtype=float32)")
log_softmax.__doc__ = log_softmax.front.__doc__ = _DOC.format(
    title="Log-softmax along ``axis``: ``x - max - log(sum(exp(x - max)))``, exact "
          "for very negative entries\n    (where ``log(softmax(x))`` would give -inf)."
          "\n\n    Gradient: ``g - exp(y) * sum(g)`` along the axis.",
    example=">>> nbops.log_softmax(np.array([0.0, -200.0]))\n"
            "    array([   0., -200.])")


def _forward(op, x, axis, out, log):
    x = _checks.array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    ax = _checks.axis(op, "axis", axis, max(x.ndim, 1))
    out = _checks.output(op, out, tuple(x.shape), x.dtype, dev, {"x": x})
    if x.size == 0:
        return out
    shape3 = _split(tuple(x.shape), ax)
    _dispatch.kernel("softmax.softmax", dev)(_as(_tensor.contiguous(x), shape3),
                                             _as(out, shape3), log)
    return out


def _backward_rule(log):
    def rule(ctx, grad):
        y = ctx.output
        dev = _dispatch.device_of_array(y)
        ax = _checks.axis("softmax", "axis", ctx.kwargs["axis"], max(y.ndim, 1))
        gx = _checks.empty(tuple(y.shape), y.dtype, dev)
        if y.size:
            shape3 = _split(tuple(y.shape), ax)
            _dispatch.kernel("softmax.softmax_backward", dev)(
                _as(_tensor.contiguous(grad), shape3), _as(y, shape3), _as(gx, shape3), log)
        return (gx,)

    return rule


softmax.backward = _backward_rule(False)
log_softmax.backward = _backward_rule(True)


def _split(shape, axis):
    """``(outer, n, inner)`` around ``axis``."""
    if not shape:
        return (1, 1, 1)
    return (int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:])))


def _as(x, shape):
    """C-contiguous ``x`` seen with another shape of the same size."""
    if isinstance(x, np.ndarray):
        return x.reshape(shape)
    return _layout.strided_view(x, shape, _tensor._c_strides(shape, x.dtype.itemsize))
