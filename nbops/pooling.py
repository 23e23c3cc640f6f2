"""Pooling: max, average, adaptive average and global average pools, 1-D
and 2-D, with PyTorch's semantics, on CPU and CUDA, with backward passes.

Inputs are ``(N, C, H, W)`` or ``(C, H, W)`` for the 2-D pools and
``(N, C, L)`` or ``(C, L)`` for the 1-D ones, float32 or float64. A 1-D
pool runs the 2-D kernels on planes of height 1. Strided inputs are made
C-contiguous first (one copy). Output sizes follow PyTorch:
``floor((H + 2 p - d (k - 1) - 1) / s) + 1``, or ``ceil`` with
``ceil_mode=True``, in which case the last window must still start inside
the input or the left padding. Max pooling propagates NaN; its indices are
flat ``h * W + w`` positions within each plane, int64, as PyTorch's.

Kernels: ``nbops/cpu/pooling.py`` (separable row-buffer kernels that
vectorize) and ``nbops/cuda/pooling.py`` (one thread per output element).
"""

import numpy as np

from . import _checks, _dispatch, _layout, _spec
from . import tensor as _tensor
from ._dispatch import operator

__all__ = ["max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d", "global_avg_pool2d"]

FAMILY = _spec.mirror("pooling")


# ---------------------------------------------------------------------------
# Backward rules: (ctx, grad, ...) -> (grad_x,) (defined before the
# declarations that name them)


def _max_rule(nd):
    def rule(ctx, grad, *unused):
        op = "max_pool%dd" % nd
        kw = ctx.kwargs
        x = ctx.inputs[0]
        _, xc, lead, h, w = _input(op, nd, x)
        g = _geometry(op, nd, (h, w), kw["kernel_size"], kw["stride"], kw["padding"],
                      kw["dilation"], kw["ceil_mode"])
        dev = _dispatch.device_of_array(x)
        p = int(np.prod(lead))
        oshape = (p,) + g.out
        if kw["return_indices"]:
            idx = _as(_tensor.contiguous(ctx.output[1]), oshape)
        else:  # the fast forward kept no indices: find them again
            idx = _checks.empty(oshape, np.int64, dev)
            vals = _checks.empty(oshape, x.dtype, dev)
            FAMILY.kernel("max_pool2d", dev)(_as(xc, (p, h, w)), vals, idx, *g.args)
        gx = _checks.empty(tuple(x.shape), x.dtype, dev)
        FAMILY.kernel("max_pool2d_backward", dev)(
            _as(_tensor.contiguous(grad), oshape), idx, _as(gx, (p, h, w)))
        return (gx,)

    return rule


def _avg_rule(nd):
    def rule(ctx, grad):
        op = "avg_pool%dd" % nd
        kw = ctx.kwargs
        x = ctx.inputs[0]
        _, _, lead, h, w = _input(op, nd, x)
        g = _geometry(op, nd, (h, w), kw["kernel_size"], kw["stride"], kw["padding"], 1,
                      kw["ceil_mode"])
        dev = _dispatch.device_of_array(x)
        p = int(np.prod(lead))
        gx = _checks.empty(tuple(x.shape), x.dtype, dev)
        FAMILY.kernel("avg_pool2d_backward", dev)(
            _as(_tensor.contiguous(grad), (p,) + g.out), _as(gx, (p, h, w)), *g.args[:6],
            bool(kw["count_include_pad"]), _divisor(op, kw.get("divisor_override")))
        return (gx,)

    return rule


def _adaptive_rule(nd):
    return lambda ctx, grad: (_adaptive_grad_nd(ctx.inputs[0], grad, nd),)


def _global_rule(ctx, grad):
    return (_adaptive_grad_nd(ctx.inputs[0], grad, 2),)


def _adaptive_grad_nd(x, grad, nd):
    dev = _dispatch.device_of_array(x)
    shape = tuple(x.shape)
    h, w = (shape[-2], shape[-1]) if nd == 2 else (1, shape[-1])
    p = int(np.prod(shape[:-nd]))
    gshape = tuple(grad.shape)
    if len(gshape) == len(shape):
        o = (gshape[-2], gshape[-1]) if nd == 2 else (1, gshape[-1])
    else:  # global_avg_pool2d without keepdim
        o = (1, 1)
    gx = _checks.empty(shape, x.dtype, dev)
    if p:
        FAMILY.kernel("adaptive_avg_pool2d_backward", dev)(
            _as(_tensor.contiguous(grad), (p,) + o), _as(gx, (p, h, w)))
    return gx


# ---------------------------------------------------------------------------
# Declarations. Sample values are distinct multiples of 0.1 in random order:
# no window holds a tie, where max pooling's gradient is undefined (the
# gradient check takes the largest sample of at most 128 elements). The CPU
# kernels are compiled per window (width, stride, dilation): the samples
# reuse a few windows, those of the hand-written tests they replace.

_INF, _NAN = float("inf"), float("nan")


def _distinct(rng, shape, dtype):
    """Distinct multiples of 0.1 around 0 in random order, of ``shape``."""
    n = int(np.prod(shape))
    return ((rng.permutation(n) - n // 2) * 0.1).reshape(shape).astype(dtype)


def _pool_samples(cases, edge=()):
    """``samples(dtype)``: one input of distinct values per ``(shape, args,
    kwargs)`` in ``cases`` (``args`` follow ``x``), then per ``(shape, args,
    kwargs, specials)`` in ``edge`` one with ``specials`` (flat index ->
    value) written over it."""
    def samples(dtype):
        rng = np.random.default_rng(0)
        out = [_spec.Sample((_distinct(rng, shape, dtype),) + args, dict(kw),
                            f"{shape}{args}{kw}") for shape, args, kw in cases]
        for shape, args, kw, specials in edge:
            x = _distinct(rng, shape, dtype)
            x.reshape(-1)[list(specials)] = list(specials.values())
            out.append(_spec.Sample((x,) + args, dict(kw), f"edge{shape}{args}{kw}"))
        return out

    return samples


# NaN wins its windows, a window of -inf only is -inf, +inf wins the rest
_MAX_SPECIALS = {1: _NAN, 2: -_INF, 3: -_INF, 9: -_INF, 10: -_INF, 20: _INF, 33: _NAN,
                 40: -_INF, 41: _INF}
_MAX2D_SAMPLES = _pool_samples((
    ((1, 2, 8, 8), (3,), dict(stride=2, padding=1, ceil_mode=True)),  # overlapping: the grad
    ((2, 3, 9, 11), (3,), dict(stride=2, padding=1)),          # ResNet's stem pool, odd sizes
    ((2, 3, 9, 11), (3,), dict(stride=2, padding=1, ceil_mode=True)),
    ((1, 2, 8, 8), (2,), {}),                                   # stride = kernel
    ((1, 2, 7, 7), (2,), dict(ceil_mode=True)),                 # ceil adds a partial window
    ((2, 1, 10, 13), ((3, 2),), dict(stride=(2, 1), padding=(1, 0), dilation=(2, 1),
                                     ceil_mode=True)),
    ((3, 7, 6), (3,), dict(stride=3, padding=1, dilation=2, ceil_mode=True)),  # (C, H, W)
    ((1, 2, 5, 5), (5,), dict(stride=1, padding=2)),            # window = padded input
    ((2, 2, 6, 9), ((1, 4),), dict(stride=(1, 3), padding=(0, 2), ceil_mode=True)),
    ((1, 1, 4, 4), (2,), dict(stride=3, padding=1, ceil_mode=True)),  # last window dropped
    ((0, 3, 6, 6), (2,), {}),                                   # an empty batch
), edge=(((1, 2, 5, 7), (3,), dict(stride=2, padding=1, ceil_mode=True), _MAX_SPECIALS),
         ((1, 1, 4, 4), (2,), {}, {1: _NAN, 0: -_INF, 2: -_INF, 3: -_INF, 6: -_INF,
                                   7: -_INF, 15: _INF})))
_MAX1D_SAMPLES = _pool_samples((
    ((2, 3, 20), (3,), dict(stride=2, padding=1)),
    ((2, 3, 11), (3,), dict(stride=2, padding=1, dilation=2, ceil_mode=True)),
    ((3, 11), (2,), {}),                                        # (C, L)
    ((2, 4, 7), (2,), dict(ceil_mode=True)),
    ((2, 4, 40), (3,), dict(stride=2, padding=1)),
    ((0, 3, 7), (2,), {}),
), edge=(((2, 3, 9), (3,), dict(stride=2, padding=1, ceil_mode=True), _MAX_SPECIALS),))

# NaN and infinities through the sums: NaN, inf, -inf, and inf - inf (NaN)
_AVG_SPECIALS = {1: _NAN, 17: _INF, 30: -_INF, 50: _INF, 51: -_INF}
_AVG2D_SAMPLES = _pool_samples((
    ((1, 2, 8, 8), (3,), dict(stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 9, 11), (3,), dict(stride=2, padding=1)),
    ((2, 3, 9, 11), (3,), dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 2, 7, 7), (2,), dict(ceil_mode=True)),
    ((2, 1, 10, 13), ((3, 2),), dict(stride=(2, 1), padding=(1, 0), ceil_mode=True)),
    ((3, 5, 6), (3,), dict(stride=2, padding=1, divisor_override=4)),  # (C, H, W)
    ((1, 2, 5, 8), ((2, 4),), dict(stride=(3, 3), padding=(1, 2), ceil_mode=True,
                                   count_include_pad=False)),
    ((1, 2, 6, 6), (2,), dict(stride=1, divisor_override=3)),
    ((0, 3, 6, 6), (2,), {}),
), edge=(((1, 2, 5, 7), (3,), dict(stride=2, padding=1), _AVG_SPECIALS),))
_AVG1D_SAMPLES = _pool_samples((
    ((2, 3, 20), (3,), dict(stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 11), (4,), dict(stride=3, padding=2, ceil_mode=True, count_include_pad=False)),
    ((3, 11), (2,), dict(stride=1, padding=1, count_include_pad=False)),  # (C, L)
    ((2, 4, 40), (3,), dict(stride=2, padding=1)),
    ((0, 3, 7), (2,), {}),
), edge=(((2, 3, 9), (3,), dict(stride=2, padding=1), _AVG_SPECIALS),))
_ADAPTIVE2D_SAMPLES = _pool_samples((
    ((2, 2, 5, 6), ((3, 4),), {}),
    ((1, 2, 5, 7), ((2, 3),), {}),
    ((3, 4, 5), (2,), {}),                                      # (C, H, W)
    ((2, 3, 3, 4), ((5, 7),), {}),                              # more bins than inputs
    ((2, 3, 7, 9), ((3, 4),), {}),
    ((2, 3, 5, 5), ((5, 5),), {}),
    ((2, 3, 6, 6), (1,), {}),
    ((2, 3, 7, 5), ((2, None),), {}),                           # None keeps W
    ((0, 3, 4, 4), (2,), {}),
))
_ADAPTIVE1D_SAMPLES = _pool_samples((
    ((2, 3, 20), (7,), {}),
    ((2, 3, 11), (4,), {}),
    ((3, 7), ((3,),), {}),                                      # (C, L), a 1-tuple
    ((2, 3, 5), (8,), {}),
    ((2, 4, 40), (3,), {}),
    ((0, 2, 5), (2,), {}),
))
_GLOBAL_SAMPLES = _pool_samples((
    ((2, 2, 5, 6), (), dict(keepdim=True)),
    ((2, 3, 5, 7), (), {}),
    ((2, 3, 5, 7), (), dict(keepdim=True)),
    ((3, 4, 5), (), {}),                                        # (C, H, W) -> (C,)
    ((1, 3, 1, 1), (), {}),
    ((0, 3, 4, 4), (), {}),
))


def _bad(x_shape, good, calls):
    """``bad(dtype)``: ``x`` (of shape ``x_shape``, ``good`` the other
    arguments) of each non-float dtype and as a list, then each ``(x's
    shape, args after x, kwargs, error, match)`` of ``calls``."""
    def bad(dtype):
        out = [_spec.Bad((np.ones(x_shape, d),) + good, {}, TypeError,
                         "argument 'x' must be a float32 or float64") for d in _spec.NOT_FLOAT]
        out.append(_spec.Bad((np.ones(x_shape).tolist(),) + good, {}, TypeError,
                             "argument 'x' must be a numpy.ndarray"))
        out += [_spec.Bad((np.ones(shape, dtype),) + args, kwargs, error, match)
                for shape, args, kwargs, error, match in calls]
        return out

    return bad


_X4, _X3 = (1, 1, 4, 4), (1, 1, 4)
_WINDOW2D_BAD = (
    ((4, 4), (2,), {}, ValueError, "'x' must be 3-D or 4-D"),
    ((1, 0, 4, 4), (2,), {}, ValueError, "only the batch"),
    (_X4, (5,), {}, ValueError, "'kernel_size' 5 .* larger than the padded input"),
    (_X4, (0,), {}, ValueError, "'kernel_size' must be >= 1"),
    (_X4, (2,), dict(stride=0), ValueError, "'stride' must be >= 1"),
    (_X4, (2,), dict(stride=(1, -1)), ValueError, "'stride' must be >= 1"),
    (_X4, (2,), dict(padding=-1), ValueError, "'padding' must be >= 0"),
    (_X4, (3,), dict(padding=2), ValueError,
     "'padding' 2 must be at most half of kernel_size 3"),
    (_X4, (2.0,), {}, TypeError, "'kernel_size' must be an int"),
    (_X4, ((2, 2, 2),), {}, ValueError, "'kernel_size' must be an int or a tuple of 2 ints"),
    (_X4, (2,), dict(ceil_mode=1), TypeError, "'ceil_mode'"),
)
_MAX2D_BAD = _bad(_X4, (2,), _WINDOW2D_BAD + (
    (_X4, (3,), dict(dilation=2), ValueError,
     r"'kernel_size' 3 \(dilation 2, spanning 5\) is larger"),
    (_X4, (2,), dict(dilation=0), ValueError, "'dilation' must be >= 1"),
    (_X4, (2,), dict(return_indices=None), TypeError, "'return_indices'")))
_AVG2D_BAD = _bad(_X4, (2,), _WINDOW2D_BAD + (
    (_X4, ((2, 2),), dict(padding=(0, 2)), ValueError, "'padding' .* at most half"),
    (_X4, (2,), dict(divisor_override=0), ValueError, "'divisor_override' must be >= 1"),
    (_X4, (2,), dict(divisor_override=1.5), TypeError, "'divisor_override'"),
    (_X4, (2,), dict(count_include_pad="yes"), TypeError, "'count_include_pad'")))
_WINDOW1D_BAD = (
    ((1, 1, 1, 4), (2,), {}, ValueError, "'x' must be 2-D or 3-D"),
    ((4,), (2,), {}, ValueError, "'x' must be 2-D or 3-D"),
    ((1, 0, 4), (2,), {}, ValueError, "only the batch"),
    (_X3, (5,), {}, ValueError, "'kernel_size' 5 .* larger than the padded input"),
    (_X3, ((2, 2),), {}, ValueError, "'kernel_size' must be an int or a tuple of 1 ints"),
    (_X3, (2,), dict(stride=0), ValueError, "'stride' must be >= 1"),
    (_X3, (3,), dict(padding=2), ValueError, "'padding' 2 must be at most half"),
    (_X3, (2,), dict(ceil_mode=1), TypeError, "'ceil_mode'"),
)
_MAX1D_BAD = _bad(_X3, (2,), _WINDOW1D_BAD + (
    (_X3, (3,), dict(dilation=2), ValueError, r"\(dilation 2, spanning 5\) is larger"),
    (_X3, (2,), dict(return_indices=None), TypeError, "'return_indices'")))
_AVG1D_BAD = _bad(_X3, (2,), _WINDOW1D_BAD + (
    (_X3, (2,), dict(count_include_pad="yes"), TypeError, "'count_include_pad'"),))
_ADAPTIVE2D_BAD = _bad(_X4, (2,), (
    ((4, 4), (2,), {}, ValueError, "'x' must be 3-D or 4-D"),
    ((1, 1, 0, 4), (2,), {}, ValueError, "only the batch"),
    (_X4, ((0, 2),), {}, ValueError, "'output_size' must be >= 1"),
    (_X4, ("a",), {}, TypeError, "'output_size'"),
    (_X4, ((2, 2, 2),), {}, ValueError, "'output_size' must be an int or a tuple of 2 ints")))
_ADAPTIVE1D_BAD = _bad(_X3, (2,), (
    ((4,), (2,), {}, ValueError, "'x' must be 2-D or 3-D"),
    ((1, 4), (-1,), {}, ValueError, "'output_size' must be >= 1"),
    (_X3, (2.5,), {}, TypeError, "'output_size'")))
_GLOBAL_BAD = _bad(_X4, (), (
    ((4, 4), (), {}, ValueError, "'x' must be 3-D or 4-D"),
    ((1, 3, 0, 4), (), {}, ValueError, "only the batch"),
    (_X4, (), dict(keepdim=1), TypeError, "'keepdim'")))

_EXACT = {_spec.F32: (0.0, 0.0), _spec.F64: (0.0, 0.0)}   # max pooling picks, never rounds
_MEAN = {_spec.F32: (2e-6, 1e-6), _spec.F64: (1e-13, 1e-14)}

# the bench's ResNet stem pool: 3x3, stride 2, padding 1 over (N, 64, 112, 112)
_STEM = dict(kernel_size=3, stride=2, padding=1)


def _bench(name, baseline, tol):
    return (_spec.Bench(f"nbops.bench.pooling:{baseline}", name, "nbops.bench.pooling:setup_planes",
                        _STEM, options=dict(out_like="nbops.bench.pooling:out_shape",
                                            requires=(name,), tol=tol)),)


def _declare(name, kernels, rule, samples, bad, tol, bench=()):
    return _spec.OpSpec(name, FAMILY, kernels, backward=rule, reference=f"test_pooling:{name}",
                        samples=samples, bad=bad, grad=_spec.Grad((0,)), tol=tol, bench=bench)


_MAX = ("max_pool2d", "max_pool2d_backward")
_AVG = ("avg_pool2d", "avg_pool2d_backward")
_ADAPTIVE = ("adaptive_avg_pool2d", "adaptive_avg_pool2d_backward")
SPECS = {s.name: s for s in (
    _declare("max_pool2d", _MAX, _max_rule(2), _MAX2D_SAMPLES, _MAX2D_BAD, _EXACT,
             _bench("max_pool2d", "max_pool_numpy", (0.0, 0.0))),
    _declare("max_pool1d", _MAX, _max_rule(1), _MAX1D_SAMPLES, _MAX1D_BAD, _EXACT),
    _declare("avg_pool2d", _AVG, _avg_rule(2), _AVG2D_SAMPLES, _AVG2D_BAD, _MEAN,
             _bench("avg_pool2d", "avg_pool_numpy", (1e-6, 1e-14))),
    _declare("avg_pool1d", _AVG, _avg_rule(1), _AVG1D_SAMPLES, _AVG1D_BAD, _MEAN),
    _declare("adaptive_avg_pool2d", _ADAPTIVE, _adaptive_rule(2), _ADAPTIVE2D_SAMPLES,
             _ADAPTIVE2D_BAD, _MEAN),
    _declare("adaptive_avg_pool1d", _ADAPTIVE, _adaptive_rule(1), _ADAPTIVE1D_SAMPLES,
             _ADAPTIVE1D_BAD, _MEAN),
    _declare("global_avg_pool2d", _ADAPTIVE, _global_rule, _GLOBAL_SAMPLES, _GLOBAL_BAD,
             _MEAN),
)}


# ---------------------------------------------------------------------------
# Public operators


@operator(SPECS["max_pool2d"])
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, out=None):
    """2-D max pooling over the last two axes, as ``torch.nn.functional.max_pool2d``.

    Parameters
    ----------
    x : array (N, C, H, W) or (C, H, W), float32 or float64, CPU or CUDA
    kernel_size, stride, dilation : int or pair of ints, positive
        ``stride`` defaults to ``kernel_size``.
    padding : int or pair of ints
        Implicit -inf padding on both sides, ``0 <= padding <= kernel_size // 2``.
    ceil_mode : bool
        Round the output size up; the last window must start inside the
        input or the left padding.
    return_indices : bool
        Also return the argmax of each window as int64 flat indices
        ``h * W + w`` within its plane (NaN wins, then the first maximum).
    out : array, optional
        C-contiguous output of the result's shape, dtype and device.

    Returns
    -------
    array (N, C, OH, OW) (or (C, OH, OW)), or ``(values, indices)``.

    Raises
    ------
    TypeError
        ``x`` not a float32/float64 array, non-integer window parameters,
        ``out`` of the wrong dtype or device.
    ValueError
        ``x`` not 3-D or 4-D or with empty C/H/W, a window parameter tuple of
        the wrong length, kernel_size, stride or dilation below 1, negative
        padding or padding above kernel_size // 2,
        a kernel larger than the padded input, a bad ``out``.

    Example
    -------
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> nbops.max_pool2d(x, 2)
    array([[[[ 5.,  7.],
             [13., 15.]]]], dtype=float32)
    """
    return _max_pool("max_pool2d", 2, x, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices, out)


@operator(SPECS["max_pool1d"])
def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, out=None):
    """1-D max pooling over the last axis of ``x`` (N, C, L) or (C, L), as
    ``torch.nn.functional.max_pool1d``; the 2-D pool with height 1.

    Parameters and rules are those of :func:`max_pool2d` with single ints
    (or 1-tuples); indices are positions along L. Raises TypeError and
    ValueError as :func:`max_pool2d` does (``x`` must be 2-D or 3-D).

    Example
    -------
    >>> nbops.max_pool1d(np.array([[1., 3., 2., 5., 4.]]), 2, ceil_mode=True)
    array([[3., 5., 4.]])
    """
    return _max_pool("max_pool1d", 1, x, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices, out)


@operator(SPECS["avg_pool2d"])
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None, out=None):
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d``.

    Parameters
    ----------
    x : array (N, C, H, W) or (C, H, W), float32 or float64, CPU or CUDA
    kernel_size, stride : int or pair of ints, positive (stride defaults
        to kernel_size)
    padding : int or pair, zero padding, ``0 <= padding <= kernel_size // 2``
    ceil_mode : bool
        As :func:`max_pool2d`. Windows that run past the right padding
        count only up to it.
    count_include_pad : bool
        Divide by the window size including padding (default), or by the
        number of input elements in the window.
    divisor_override : int, optional
        A positive divisor used for every window instead.
    out : array, optional

    Returns
    -------
    array (N, C, OH, OW) (or (C, OH, OW)) of x's dtype.

    Raises
    ------
    TypeError
        As :func:`max_pool2d`; a non-integer ``divisor_override``.
    ValueError
        As :func:`max_pool2d`; ``divisor_override`` below 1.

    Example
    -------
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> nbops.avg_pool2d(x, 2)
    array([[[[ 2.5,  4.5],
             [10.5, 12.5]]]], dtype=float32)
    """
    return _avg_pool("avg_pool2d", 2, x, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override, out)


@operator(SPECS["avg_pool1d"])
def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, out=None):
    """1-D average pooling of ``x`` (N, C, L) or (C, L), as
    ``torch.nn.functional.avg_pool1d``: the 2-D pool with height 1.

    Raises TypeError and ValueError as :func:`avg_pool2d`.

    Example
    -------
    >>> nbops.avg_pool1d(np.array([[1., 3., 2., 6.]]), 2)
    array([[2., 4.]])
    """
    return _avg_pool("avg_pool1d", 1, x, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, None, out)


@operator(SPECS["adaptive_avg_pool2d"])
def adaptive_avg_pool2d(x, output_size, out=None):
    """Average over PyTorch's adaptive bins: output row ``i`` of ``OH``
    averages input rows ``floor(i H / OH)`` to ``ceil((i + 1) H / OH)``
    (exclusive), and likewise for columns.

    Parameters
    ----------
    x : array (N, C, H, W) or (C, H, W), float32 or float64, CPU or CUDA
    output_size : int or pair
        ``(OH, OW)``, positive; an entry of None keeps that input size.
    out : array, optional

    Sums accumulate in float64.

    Raises
    ------
    TypeError
        Bad dtype, non-integer output_size, bad ``out`` dtype/device.
    ValueError
        Wrong rank, empty C/H/W, output size below 1, bad ``out``.

    Example
    -------
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> nbops.adaptive_avg_pool2d(x, 1)
    array([[[[7.5]]]], dtype=float32)
    """
    return _adaptive("adaptive_avg_pool2d", 2, x, output_size, out)


@operator(SPECS["adaptive_avg_pool1d"])
def adaptive_avg_pool1d(x, output_size, out=None):
    """Adaptive average pooling of ``x`` (N, C, L) or (C, L) to length
    ``output_size`` (a positive int); see :func:`adaptive_avg_pool2d`.

    Raises TypeError and ValueError as :func:`adaptive_avg_pool2d`.

    Example
    -------
    >>> nbops.adaptive_avg_pool1d(np.array([[1., 2., 3., 4., 5.]]), 2)
    array([[2., 4.]])
    """
    return _adaptive("adaptive_avg_pool1d", 1, x, output_size, out)


@operator(SPECS["global_avg_pool2d"])
def global_avg_pool2d(x, keepdim=False, out=None):
    """Mean over the spatial axes: (N, C, H, W) -> (N, C), or (N, C, 1, 1)
    with ``keepdim=True`` (also (C, H, W) -> (C,) or (C, 1, 1)); the
    adaptive pool with one bin. Sums accumulate in float64.

    Raises
    ------
    TypeError
        Bad dtype or ``out``; ValueError: wrong rank, empty C/H/W, bad ``out``.

    Example
    -------
    >>> nbops.global_avg_pool2d(np.ones((2, 3, 5, 5), np.float32)).shape
    (2, 3)
    """
    op = "global_avg_pool2d"
    if not isinstance(keepdim, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'keepdim' must be a bool, got {_checks.describe(keepdim)}")
    dev, xc, lead, h, w = _input(op, 2, x, out)
    shape = lead + ((1, 1) if keepdim else ())
    out = _checks.output(op, out, shape, xc.dtype, dev, {"x": x})
    p = int(np.prod(lead))
    if p:
        FAMILY.kernel("adaptive_avg_pool2d", dev)(_as(xc, (p, h, w)), _as(out, (p, 1, 1)))
    return out


# ---------------------------------------------------------------------------
# Argument checks and geometry


class _Geometry:
    """Checked window parameters of a pool over (H, W) (1-D: H = 1)."""

    __slots__ = ("k", "s", "p", "d", "out")

    def __init__(self, k, s, p, d, out):
        self.k, self.s, self.p, self.d, self.out = k, s, p, d, out

    @property
    def args(self):
        """Kernel arguments ``kh, kw, sh, sw, ph, pw, dh, dw``."""
        return (*self.k, *self.s, *self.p, *self.d)


def _out_size(size, k, s, p, d, ceil_mode):
    """Output length of a pool along one axis (PyTorch's
    pooling_output_shape; quant.max_pool2d's too): 0 where the dilated
    window is longer than the padded input."""
    span = size + 2 * p - d * (k - 1) - 1
    if span < 0:
        return 0
    n = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (n - 1) * s >= size + p:
        n -= 1
    return n


def _geometry(op, nd, hw, kernel_size, stride, padding, dilation, ceil_mode):
    """Check the window parameters against the input's (H, W); 1-D pools
    get a unit kernel, stride and dilation and no padding along H.

    Remembered per call pattern (types included, so that ``True`` is not
    taken for ``1``): the checks cost 20 us a call, a third of a pool over
    a 56 x 56 x 64 feature map."""
    return _GEOMETRIES.get(
        (op, nd, hw) + _checks.typed_key(kernel_size, stride, padding, dilation, ceil_mode),
        lambda: _check_geometry(op, nd, hw, kernel_size, stride, padding, dilation, ceil_mode))


_GEOMETRIES = _checks.CheckedCache()


def _check_geometry(op, nd, hw, kernel_size, stride, padding, dilation, ceil_mode):
    k = _checks.int_tuple(op, "kernel_size", kernel_size, nd, low=1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _checks.int_tuple(op, "stride", stride, nd, low=1)
    p = _checks.int_tuple(op, "padding", padding, nd, low=0)
    d = _checks.int_tuple(op, "dilation", dilation, nd, low=1)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'ceil_mode' must be a bool, got {ceil_mode!r}")
    for kk, pp in zip(k, p):
        if pp > kk // 2:
            raise ValueError(f"{op}: argument 'padding' {padding!r} must be at most half of "
                             f"kernel_size {kernel_size!r} (padding <= kernel_size // 2)")
    sizes = hw[2 - nd:]
    for size, kk, pp, dd in zip(sizes, k, p, d):
        if _span(kk, dd) > size + 2 * pp:
            raise ValueError(
                f"{op}: argument 'kernel_size' {kernel_size!r} (dilation {dilation!r}, "
                f"spanning {_span(kk, dd)}) is larger than the padded input "
                f"{size} + 2 * {pp} = {size + 2 * pp}")
    out = tuple(_out_size(*a, bool(ceil_mode)) for a in zip(sizes, k, s, p, d))
    if any(o < 1 for o in out):
        raise ValueError(f"{op}: output size {out} is too small for input {sizes}")
    if nd == 1:
        k, s, p, d, out = (1,) + k, (1,) + s, (0,) + p, (1,) + d, (1,) + out
    return _Geometry(k, s, p, d, out)


def _span(k, d):
    """Span of a dilated window."""
    return d * (k - 1) + 1


def _input(op, nd, x, out=None):
    """``(device, C-contiguous x, leading shape, H, W)`` of a pool's input
    (and ``out``, which must be on its device); 1-D inputs (.., L) give
    H = 1. The contiguous x is the one to size outputs by (its dtype native
    where ``x``'s byte order was not)."""
    x = _checks.array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    ranks = (3, 4) if nd == 2 else (2, 3)
    if x.ndim not in ranks:
        names = ("(C, H, W) or (N, C, H, W)" if nd == 2 else "(C, L) or (N, C, L)")
        raise ValueError(f"{op}: argument 'x' must be {ranks[0]}-D or {ranks[1]}-D "
                         f"{names}, got shape {tuple(x.shape)}")
    shape = tuple(x.shape)
    if any(n == 0 for n in shape[-nd - 1:]):
        raise ValueError(f"{op}: argument 'x' has shape {shape}: only the batch axis may "
                         "be empty")
    lead = shape[:-nd]
    h, w = (shape[-2], shape[-1]) if nd == 2 else (1, shape[-1])
    return dev, _tensor.contiguous(x), lead, h, w


def _as(x, shape):
    """C-contiguous ``x`` seen with another shape of the same size."""
    if isinstance(x, np.ndarray):
        return x.reshape(shape)
    return _layout.strided_view(x, shape, _tensor._c_strides(shape, x.dtype.itemsize))


def _divisor(op, divisor_override):
    """The kernels' divisor: 0 for None (the window's size)."""
    if divisor_override is None:
        return 0
    return _checks.int_arg(op, "divisor_override", divisor_override, low=1)


def _spatial_shape(lead, out, nd):
    return lead + (out if nd == 2 else out[1:])


def _max_pool(op, nd, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
              out):
    dev, xc, lead, h, w = _input(op, nd, x, out)
    g = _geometry(op, nd, (h, w), kernel_size, stride, padding, dilation, ceil_mode)
    if not isinstance(return_indices, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'return_indices' must be a bool, "
                        f"got {return_indices!r}")
    shape = _spatial_shape(lead, g.out, nd)
    out = _checks.output(op, out, shape, xc.dtype, dev, {"x": x})
    idx = _checks.empty(shape, np.int64, dev) if return_indices else None
    p = int(np.prod(lead))
    if p:
        oshape = (p,) + g.out
        FAMILY.kernel("max_pool2d", dev)(
            _as(xc, (p, h, w)), _as(out, oshape), None if idx is None else _as(idx, oshape),
            *g.args)
    return (out, idx) if return_indices else out


def _avg_pool(op, nd, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override, out):
    dev, xc, lead, h, w = _input(op, nd, x, out)
    g = _geometry(op, nd, (h, w), kernel_size, stride, padding, 1, ceil_mode)
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'count_include_pad' must be a bool, "
                        f"got {count_include_pad!r}")
    divisor = _divisor(op, divisor_override)
    shape = _spatial_shape(lead, g.out, nd)
    out = _checks.output(op, out, shape, xc.dtype, dev, {"x": x})
    p = int(np.prod(lead))
    if p:
        FAMILY.kernel("avg_pool2d", dev)(
            _as(xc, (p, h, w)), _as(out, (p,) + g.out), *g.args[:6], bool(count_include_pad),
            divisor)
    return out


def _adaptive(op, nd, x, output_size, out):
    dev, xc, lead, h, w = _input(op, nd, x, out)
    if nd == 2 and isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        output_size = tuple(size if o is None else o for o, size in zip(output_size, (h, w)))
    o = _checks.int_tuple(op, "output_size", output_size, nd, low=1)
    o2 = o if nd == 2 else (1,) + o
    shape = _spatial_shape(lead, o2, nd)
    out = _checks.output(op, out, shape, xc.dtype, dev, {"x": x})
    p = int(np.prod(lead))
    if p:
        FAMILY.kernel("adaptive_avg_pool2d", dev)(_as(xc, (p, h, w)),
                                                  _as(out, (p,) + o2))
    return out
