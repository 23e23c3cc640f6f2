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
_dispatch.register_kernels(FAMILY, ("max_pool2d", "max_pool2d_backward", "avg_pool2d",
                                    "avg_pool2d_backward", "adaptive_avg_pool2d",
                                    "adaptive_avg_pool2d_backward"))


# ---------------------------------------------------------------------------
# Public operators


@operator("max_pool2d")
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


@operator("max_pool1d")
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


@operator("avg_pool2d")
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


@operator("avg_pool1d")
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


@operator("adaptive_avg_pool2d")
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


@operator("adaptive_avg_pool1d")
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


@operator("global_avg_pool2d")
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
    dev, xc, lead, h, w = _input(op, 2, x)
    shape = lead + ((1, 1) if keepdim else ())
    out = _checks.output(op, out, shape, xc.dtype, dev, {"x": x})
    p = int(np.prod(lead))
    if p:
        FAMILY.kernel("adaptive_avg_pool2d", dev)(_as(xc, (p, h, w)), _as(out, (p, 1, 1)))
    return out


# ---------------------------------------------------------------------------
# Backward rules: (ctx, grad, ...) -> (grad_x,)


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


max_pool2d.backward = _max_rule(2)
max_pool1d.backward = _max_rule(1)
avg_pool2d.backward = _avg_rule(2)
avg_pool1d.backward = _avg_rule(1)
adaptive_avg_pool2d.backward = _adaptive_rule(2)
adaptive_avg_pool1d.backward = _adaptive_rule(1)
global_avg_pool2d.backward = lambda ctx, grad: (_adaptive_grad_nd(ctx.inputs[0], grad, 2),)


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


def _input(op, nd, x):
    """``(device, C-contiguous x, leading shape, H, W)`` of a pool's input;
    1-D inputs (.., L) give H = 1. The contiguous x is the one to size
    outputs by (its dtype native where ``x``'s byte order was not)."""
    x = _checks.array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x)
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
    dev, xc, lead, h, w = _input(op, nd, x)
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
    dev, xc, lead, h, w = _input(op, nd, x)
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
    dev, xc, lead, h, w = _input(op, nd, x)
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
