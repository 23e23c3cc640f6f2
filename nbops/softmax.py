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

from . import _checks, _dispatch, _layout, _spec
from . import tensor as _tensor
from ._dispatch import operator

__all__ = ["softmax", "log_softmax"]

FAMILY = _spec.mirror("softmax")

_INF, _NAN = float("inf"), float("nan")
_SAMPLES = _spec.Shapes(
    cases=(((7,), dict(axis=0)), ((3, 5), dict(axis=-1)), ((3, 5), dict(axis=0)),
           ((2, 3, 4, 5), dict(axis=1)), ((2, 3, 4, 5), dict(axis=2)),
           ((2, 33, 17), dict(axis=1)), ((2, 600, 40), dict(axis=1)),  # column blocks
           ((4, 1, 3), dict(axis=1)), ((1, 257), dict(axis=-1)), ((0, 4), dict(axis=1)),
           ((), dict(axis=-1))),
    # fully masked, large magnitudes with a masked entry, NaN, +inf, huge of both signs
    edge=((((-_INF,) * 4, (1e4, 1e4 + 1, -_INF, 0.0), (1.0, _NAN, 2.0, 3.0),
             (_INF, 1.0, 2.0, 3.0), (1e30, -1e30, 0.0, 1e30)), dict(axis=-1)),))
_BAD = _spec.float_only(1, ("x",), (
    (dict(axis=2), ValueError, "'axis' is 2, out of range"),
    (dict(axis=-3), ValueError, "'axis' is -3"),
    (dict(axis=1.0), TypeError, "'axis' must be an int")))


def _backward_rule(log):
    def rule(ctx, grad):
        y = ctx.output
        dev = _dispatch.device_of_array(y)
        ax = _checks.axis("softmax", "axis", ctx.kwargs["axis"], max(y.ndim, 1))
        gx = _checks.empty(tuple(y.shape), y.dtype, dev)
        if y.size:
            shape3 = _split(tuple(y.shape), ax)
            FAMILY.kernel("softmax_backward", dev)(
                _as(_tensor.contiguous(grad), shape3), _as(y, shape3), _as(gx, shape3), log)
        return (gx,)

    return rule


def _spec_of(name, log):
    bench = (_spec.Bench(f"nbops.bench.softmax:{name}_numpy", name,
                         "nbops.bench.softmax:setup_rows", options=dict(tol=(1e-6, 1e-14))),)
    if not log:
        bench += (_spec.Bench("nbops.bench.softmax:softmax_numpy_axis1", "softmax_axis1",
                              "nbops.bench.softmax:setup_middle", dict(axis=1),
                              options=dict(tol=(1e-6, 1e-14))),)
    return _spec.OpSpec(name, FAMILY, ("softmax", "softmax_backward"),
                        backward=_backward_rule(log), save=("output",), samples=_SAMPLES,
                        bad=_BAD, grad=_spec.Grad((0,)),
                        tol={_spec.F32: (2e-6, 2e-6), _spec.F64: (1e-13, 1e-13)}, bench=bench)


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


@operator(_spec_of("softmax", False))
def softmax(x, axis=-1, out=None):
    return _forward("softmax", x, axis, out, False)


@operator(_spec_of("log_softmax", True))
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
    FAMILY.kernel("softmax", dev)(_as(_tensor.contiguous(x), shape3),
                                  _as(out, shape3), log)
    return out


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
