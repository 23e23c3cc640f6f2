"""CPU kernels of the pooling operators.

Every kernel works on planes: the input as a C-contiguous ``(P, H, W)``
array (``P = N * C``; a 1-D pool is a 2-D pool with ``H = 1``), the output
as ``(P, OH, OW)``. Window geometry (kernel, stride, padding, dilation) comes
in as plain ints, already checked by :mod:`nbops.pooling`.

The forward max and average pools are separable: for each output row the
``kh`` input rows of its window are combined column by column into a scratch
row (a unit-stride loop LLVM vectorizes), padded on both sides with the
neutral value (-inf or 0), and each output element then reduces ``kw``
entries of that row, which sits in L1. Common horizontal windows
(:data:`SPECIALISED`) get kernels compiled with ``kw``/``sw``/``dw`` as
constants, which lets LLVM vectorize that strided pass too (3x faster for
max, 5x for average pooling than with runtime values; the stride-2
windows of 2 and 3 columns, ResNet's and VGG's, of both pools run as vector
blocks written in LLVM IR, :func:`_stride2_windows`); the average pool's
divisor is split into a row factor and a per-column factor computed once per
chunk. Each input element is read from memory once per window row it
belongs to (rows shared by consecutive windows come back from cache), each
output written once. The work is split into a few chunks of output rows per
thread, each chunk with its own scratch row, so nothing is allocated per row.

Max pooling propagates NaN as PyTorch does (``v > m or v != v``). The
version that also returns argmax indices (flat ``ih * W + iw`` per plane,
int64) walks each window directly, in PyTorch's order, so ties and NaN pick
the same index as PyTorch.
"""

import numpy as np
from llvmlite import ir
from numba import get_num_threads, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, register_jitable

from .._jit import FASTMATH_REDUCE, cpu_kernel
from ._memory import lane_mask, masked_op, splat

__all__ = ["max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
           "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"]


def max_pool2d(x, out, indices, kh, kw, sh, sw, ph, pw, dh, dw):
    """``out`` (and ``indices``, when not None) of a max pool over planes."""
    if out.size == 0:
        return out
    if indices is None:
        _max_pool_rows(x, out, kh, kw, sh, sw, ph, pw, dh, dw, _chunks(out))
    else:
        _max_pool_argmax(x, out, indices, kh, kw, sh, sw, ph, pw, dh, dw)
    return out


def max_pool2d_backward(grad, indices, grad_x):
    """``grad_x`` (zeroed here) receives each output gradient at its argmax."""
    _max_pool_scatter(grad, indices, grad_x)
    return grad_x


def avg_pool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    """Average pool over planes; ``divisor`` > 0 overrides the window count."""
    if out.size:
        _avg_pool_rows(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor, _chunks(out))
    return out


def avg_pool2d_backward(grad, grad_x, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    _avg_pool_spread(grad, grad_x, kh, kw, sh, sw, ph, pw, include_pad, divisor)
    return grad_x


def adaptive_avg_pool2d(x, out):
    if out.size:
        _adaptive_avg(x, out)
    return out


def adaptive_avg_pool2d_backward(grad, grad_x):
    _adaptive_avg_spread(grad, grad_x)
    return grad_x


# ---------------------------------------------------------------------------
# Window geometry shared by the kernels


@register_jitable(inline="always")
def _avg_window(o, s, p, k, size):
    """``(start, end, padded_count)``: the in-bounds extent of window ``o``
    and its length counting padding (PyTorch: ends at most ``size + p``)."""
    start = o * s - p
    end = min(start + k, size + p)
    count = end - start
    return max(start, 0), min(end, size), count


@register_jitable(inline="always")
def _avg_divisor(hcount, wcount, h0, h1, w0, w1, include_pad, divisor):
    if divisor > 0:
        return divisor
    if include_pad:
        return hcount * wcount
    return (h1 - h0) * (w1 - w0)


@register_jitable(inline="always")
def _bin(o, out_size, size):
    """Adaptive pooling's bin ``o``: ``[floor(o*size/out), ceil((o+1)*size/out))``."""
    return (o * size) // out_size, ((o + 1) * size + out_size - 1) // out_size


def _chunks(out):
    # a few chunks per thread balance uneven rows; passed in, since a kernel
    # calling get_num_threads() could not be cached
    items = out.shape[0] * out.shape[1]
    return max(1, min(items, 4 * get_num_threads()))


# ---------------------------------------------------------------------------
# Forward kernels


@register_jitable(inline="always")
def _item_before(i0, oh_n):
    """(plane, output row - 1) of item ``i0`` of the (plane, output row)
    sequence: :func:`_next_item` steps onto it. The items of a chunk are
    counted along, not divided out per row."""
    p = i0 // oh_n
    return p, i0 - p * oh_n - 1


@register_jitable(inline="always")
def _next_item(p, oh, oh_n):
    oh += 1
    return (p + 1, 0) if oh == oh_n else (p, oh)


def _max_rows_kernel(KW, SW, DW):
    """The separable max pool, with the horizontal window (kw, sw, dw) fixed
    at compile time when ``KW`` > 0 (the strided horizontal pass then
    vectorizes: stride 2 through ``_stride2_windows``, other strides by
    LLVM), else read from the arguments.

    Only ints sit in the kernel's closure: Numba keys its disk cache on the
    pickled closure, and an intrinsic object there pickles differently in
    every process (the kernels were compiled again at each start)."""

    def kernel(x, out, kh, kw, sh, sw, ph, pw, dh, dw, nchunk):
        kw_ = KW if KW else kw
        sw_ = SW if KW else sw
        dw_ = DW if KW else dw
        planes, h, w = x.shape
        oh_n, ow_n = out.shape[1], out.shape[2]
        # scratch column t holds input column t - pw; it spans every window
        span = (ow_n - 1) * sw_ + (kw_ - 1) * dw_ + 1
        cols = min(w, span - pw)
        items = planes * oh_n
        neg = x.dtype.type(-np.inf)
        # spare columns past the last window: the stride-2 pass reads whole
        # vectors (see _stride2_windows)
        size = span + SPARE
        for c in prange(nchunk):
            row = np.empty(size, x.dtype)
            for t in range(pw):
                row[t] = neg
            for t in range(pw + cols, size):
                row[t] = neg
            mid = row[pw:pw + cols]
            i0 = c * items // nchunk
            p, oh = _item_before(i0, oh_n)
            for _ in range(i0, (c + 1) * items // nchunk):
                p, oh = _next_item(p, oh, oh_n)
                first = True
                for i in range(kh):
                    ih = oh * sh - ph + i * dh
                    if 0 <= ih < h:
                        src = x[p, ih]
                        if first:  # the first row is copied: no -inf fill
                            _ROW_COPY_MAX(row, src, pw, cols)
                            first = False
                        else:
                            _ROW_MAX(row, src, pw, cols)
                if first:  # no row of the window inside the input
                    for j in range(cols):
                        mid[j] = neg
                dst = out[p, oh]
                if SW == 2 and DW == 1:
                    if KW == 3:
                        _WINDOW_MAX3(dst, row, ow_n)
                    else:
                        _WINDOW_MAX2(dst, row, ow_n)
                else:
                    for o in range(ow_n):
                        b = o * sw_
                        m = row[b]
                        for j in range(1, kw_):
                            v = row[b + j * dw_]
                            m = v if (v > m) | (v != v) else m
                        dst[o] = m

    name = f"_max_pool_rows_k{KW}s{SW}d{DW}"
    kernel.__name__ = kernel.__qualname__ = name  # its own on-disk cache entry
    return cpu_kernel(kernel, parallel=True)


#: Spare scratch columns past the last window's: three 64-byte vectors of
#: float32, so that the unmasked loads of :func:`_stride2_windows`' last
#: (partial) block stay inside the row (that block may start at output
#: n - 1, at column 2 n - 2, and read three vectors from there: up to
#: ``2 n + 3 L - 3`` for L lanes, inside a row of ``span + SPARE`` >=
#: ``2 n + 3 L``), and :func:`_rows_op`'s whole last block too.
SPARE = 3 * 64 // 4


def _stride2_windows(kw, average):
    """An intrinsic for the horizontal pass of a stride-2 pool over a
    scratch row, ``o < n``, windows of ``kw`` (2 or 3) columns:

    * ``window_max(dst, row, n)``: ``dst[o]`` = the max of ``row[2 o + j]``,
      j = 0, 1, ... in that order, NaN propagating as ``v > m or v != v``;
    * ``window_mean(dst, row, n, wdiv, hdiv, wrec)``: ``dst[o] = s / d``
      where ``s = row[2 o] + row[2 o + 1] (+ row[2 o + 2])`` summed in
      that order and ``d = hdiv * wdiv[o]``, or 0 where ``d <= 0``;
      ``wrec[o]`` holds ``1 / d``. The quotient is ``q = s * (1/d)``
      corrected once with the FMA residual ``s - q d`` (Markstein: the
      correctly rounded quotient, as a division gives, NaN and infinities
      passed through), cheaper than the vector division
      (docs/benchmarks.md).

    The same operations as the scalar loops they replace, so the same
    results; ``row`` must hold ``2 n + SPARE`` elements. Written in LLVM
    IR: a block of L outputs (one 64-byte vector) from two vector loads at
    ``2 o`` shuffled into their even and odd columns (for kw = 3 the even
    ones shifted by one, with a third load), the last partial block stored
    under a mask. LLVM vectorizes a loop only from 64 iterations on (16
    lanes, 4 interleaved), so the Numba loop over a 56-column ResNet row
    ran scalar and took most of the pool's time (docs/benchmarks.md)."""

    def typer(typingctx, dst, row, n, *rest):
        # 1-D C-contiguous arrays only: the code reads the data pointers
        # and ignores strides
        if not _float_rows(dst, row):
            return None
        args = (dst, row, types.intp)
        if average:
            wdiv, hdiv, wrec = rest
            if not all(isinstance(a, types.Array) and a.dtype == dst.dtype and a.ndim == 1
                       and a.layout == "C" for a in (wdiv, wrec)) or hdiv != dst.dtype:
                return None
            args += (wdiv, hdiv, wrec)
        return types.void(*args), _codegen

    def _codegen(context, builder, signature, args):
        size, lanes, vt, (dp, rp) = _vector_rows(context, builder, signature, args)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        n = args[2]
        if average:
            wp = context.make_array(signature.args[3])(context, builder, args[3]).data
            hdiv = splat(builder, vt, args[4])
            rcp = context.make_array(signature.args[5])(context, builder, args[5]).data
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                f"llvm.fma.v{lanes}{'f32' if size == 4 else 'f64'}")

        evens = ir.Constant(ir.VectorType(i32, lanes), [2 * i for i in range(lanes)])
        odds = ir.Constant(ir.VectorType(i32, lanes), [2 * i + 1 for i in range(lanes)])
        shift = ir.Constant(ir.VectorType(i32, lanes), list(range(1, lanes + 1)))

        def load_at(at, k):
            return builder.load(builder.bitcast(builder.gep(rp, [builder.add(
                at, ir.Constant(i64, k))]), vt.as_pointer()), align=size)

        def combine(m, v):
            if average:
                return builder.fadd(m, v)
            take = builder.or_(builder.fcmp_ordered(">", v, m),
                               builder.fcmp_unordered("uno", v, v))
            return builder.select(take, v, m)

        def vector_at(ptr, o, mask):
            p = builder.bitcast(builder.gep(ptr, [o]), vt.as_pointer())
            if mask is None:
                return builder.load(p, align=size)
            return builder.call(masked_op(builder, "load", vt),
                                [p, ir.Constant(i32, size), mask, ir.Constant(vt, None)])

        def block(o, mask):
            at = builder.mul(o, ir.Constant(i64, 2))
            a, b = load_at(at, 0), load_at(at, lanes)
            first = builder.shuffle_vector(a, b, evens)
            m = combine(first, builder.shuffle_vector(a, b, odds))
            if kw == 3:
                # columns 2 o + 2: the even ones shifted by one, the last from
                # the next vector (loads only at multiples of a vector from
                # the row's start, where the vertical pass stored: see
                # _rows_op)
                c = load_at(at, 2 * lanes)
                m = combine(m, builder.shuffle_vector(first, c, shift))
            if average:
                d = builder.fmul(hdiv, vector_at(wp, o, mask))
                r = vector_at(rcp, o, mask)
                q = builder.fmul(m, r)
                e = builder.call(fma, [builder.fneg(q), d, m])
                # e is NaN where s is (q passes it on) or is infinite (q = s / d)
                q = builder.select(builder.fcmp_unordered("uno", e, e), q,
                                   builder.call(fma, [e, r, q]))
                m = builder.select(builder.fcmp_ordered(">", d, ir.Constant(vt, None)),
                                   q, ir.Constant(vt, None))
            ptr = builder.bitcast(builder.gep(dp, [o]), vt.as_pointer())
            if mask is None:
                builder.store(m, ptr, align=size)
            else:
                builder.call(masked_op(builder, "store", vt),
                             [m, ptr, ir.Constant(i32, size), mask])

        full = builder.udiv(n, ir.Constant(i64, lanes))
        with cgutils.for_range(builder, full) as loop:
            block(builder.mul(loop.index, ir.Constant(i64, lanes)), None)
        rest = builder.urem(n, ir.Constant(i64, lanes))
        with builder.if_then(builder.icmp_unsigned("!=", rest, ir.Constant(i64, 0))):
            block(builder.mul(full, ir.Constant(i64, lanes)), lane_mask(builder, lanes, rest))
        return context.get_dummy_value()

    if average:
        def window_mean(typingctx, dst, row, n, wdiv, hdiv, wrec):
            return typer(typingctx, dst, row, n, wdiv, hdiv, wrec)
        return intrinsic(window_mean)

    def window_max(typingctx, dst, row, n):
        return typer(typingctx, dst, row, n)
    return intrinsic(window_max)


def _float_rows(a, b):
    """Typing check of the row intrinsics: two 1-D C-contiguous arrays of
    one float dtype (the code reads their data pointers, not strides)."""
    return (isinstance(a, types.Array) and isinstance(b, types.Array)
            and a.ndim == b.ndim == 1 and a.layout == b.layout == "C"
            and a.dtype == b.dtype and a.dtype in (types.float32, types.float64))


def _vector_rows(context, builder, signature, args):
    """``(itemsize, lanes, vector type, (data pointers))`` of the row
    intrinsics' two array arguments, for 64-byte vectors."""
    ety = context.get_value_type(signature.args[0].dtype)
    size = context.get_abi_sizeof(ety)
    pointers = tuple(context.make_array(signature.args[i])(context, builder, args[i]).data
                     for i in (0, 1))
    return size, 64 // size, ir.VectorType(ety, 64 // size), pointers


_WINDOW_MAX2 = _stride2_windows(2, False)
_WINDOW_MAX3 = _stride2_windows(3, False)
_WINDOW_MEAN2 = _stride2_windows(2, True)
_WINDOW_MEAN3 = _stride2_windows(3, True)


def _rows_op(kind, neutral):
    """An intrinsic for the vertical pass into a scratch row:
    ``op(row, src, pw, cols)`` sets ``row[pw + j]`` for ``j < cols`` to
    ``src[j]`` (``kind`` "copy"), ``row[pw + j] + src[j]`` ("add") or the max
    of the two, NaN propagating as ``v > m or v != v`` with ``v = src[j]``
    ("max"): the operations of the scalar loops it replaces, so the same
    results. The blocks of ``row`` that this touches are rewritten whole:
    outside ``[pw, pw + cols)`` they get ``neutral`` (-inf or 0, what the
    row's padding holds), so ``row`` needs room for ``pw + cols`` rounded up
    to a 64-byte vector.

    Written in LLVM IR, a 64-byte vector per block, the src lanes of the
    first and last blocks loaded under a mask. The blocks start at multiples
    of a vector from ``row[0]``, not from ``row[pw]``: the horizontal pass
    (:func:`_stride2_windows`) reads ``row`` in such blocks right after, and
    a load that straddles two recent stores cannot take its data from the
    store buffer (3x3/2 with padding 1 ran 20% slower than without). LLVM
    vectorizes a Numba loop only from 64 iterations on, so of a 112-column
    ResNet row the scalar loops this replaces left 48 columns scalar."""

    def op(typingctx, row, src, pw, cols):
        if not (_float_rows(row, src) and isinstance(pw, types.Integer)
                and isinstance(cols, types.Integer)):
            return None
        return types.void(row, src, types.intp, types.intp), codegen

    def codegen(context, builder, signature, args):
        size, lanes, vt, (rp, sp) = _vector_rows(context, builder, signature, args)
        i32, i64 = ir.IntType(32), ir.IntType(64)
        it = ir.VectorType(i64, lanes)
        pw = context.cast(builder, args[2], signature.args[2], types.intp)
        end = builder.add(pw, context.cast(builder, args[3], signature.args[3], types.intp))
        fill = ir.Constant(vt, neutral)
        lane_ids = ir.Constant(it, list(range(lanes)))

        def src_at(b):
            # src lanes t - pw of row positions t = b .. b + lanes - 1
            return builder.bitcast(builder.gep(sp, [builder.sub(b, pw)]), vt.as_pointer())

        def combine(b, v):
            q = builder.bitcast(builder.gep(rp, [b]), vt.as_pointer())
            if kind != "copy":
                m = builder.load(q, align=size)
                if kind == "add":
                    v = builder.fadd(m, v)
                else:
                    take = builder.or_(builder.fcmp_ordered(">", v, m),
                                       builder.fcmp_unordered("uno", v, v))
                    v = builder.select(take, v, m)
            builder.store(v, q, align=size)

        step = ir.Constant(i64, lanes)
        nblocks = builder.udiv(builder.add(end, ir.Constant(i64, lanes - 1)), step)
        with cgutils.for_range(builder, nblocks) as loop:
            b = builder.mul(loop.index, step)
            inside = builder.and_(builder.icmp_signed(">=", b, pw),
                                  builder.icmp_signed("<=", builder.add(b, step), end))
            with builder.if_else(inside) as (whole, part):
                with whole:
                    combine(b, builder.load(src_at(b), align=size))
                with part:
                    t = builder.add(splat(builder, it, b), lane_ids)
                    mask = builder.and_(builder.icmp_signed(">=", t, splat(builder, it, pw)),
                                        builder.icmp_signed("<", t, splat(builder, it, end)))
                    v = builder.call(masked_op(builder, "load", vt),
                                     [src_at(b), ir.Constant(i32, size), mask, fill])
                    combine(b, v)
        return context.get_dummy_value()

    op.__name__ = f"row_{kind}"
    return intrinsic(op)


_ROW_COPY_MAX = _rows_op("copy", -np.inf)   # the max pool's first row (padding -inf)
_ROW_COPY_SUM = _rows_op("copy", 0.0)       # the average pool's first row (padding 0)
_ROW_ADD = _rows_op("add", 0.0)
_ROW_MAX = _rows_op("max", -np.inf)


#: Horizontal windows (kw, sw, dw) with a compiled kernel of their own
#: (ResNet's 3x3/2, the 2x2/2 of VGG and U-Nets, stride-1 3x3 and 2x2);
#: others run the generic kernel.
SPECIALISED = ((3, 2, 1), (2, 2, 1), (3, 1, 1), (2, 1, 1))
_max_rows = {}


def _max_pool_rows(x, out, kh, kw, sh, sw, ph, pw, dh, dw, nchunk):
    key = (kw, sw, dw) if (kw, sw, dw) in SPECIALISED else (0, 0, 0)
    kernel = _max_rows.get(key)
    if kernel is None:
        kernel = _max_rows[key] = _max_rows_kernel(*key)
    kernel(x, out, kh, kw, sh, sw, ph, pw, dh, dw, nchunk)


@cpu_kernel(parallel=True)
def _max_pool_argmax(x, out, indices, kh, kw, sh, sw, ph, pw, dh, dw):
    planes, h, w = x.shape
    oh_n, ow_n = out.shape[1], out.shape[2]
    neg = x.dtype.type(-np.inf)
    for p in prange(planes):
        for oh in range(oh_n):
            h0 = oh * sh - ph
            h1 = min(h0 + (kh - 1) * dh + 1, h)
            while h0 < 0:
                h0 += dh
            for ow in range(ow_n):
                w0 = ow * sw - pw
                w1 = min(w0 + (kw - 1) * dw + 1, w)
                while w0 < 0:
                    w0 += dw
                best = h0 * w + w0
                m = neg
                for ih in range(h0, h1, dh):
                    for iw in range(w0, w1, dw):
                        v = x[p, ih, iw]
                        if v > m or v != v:
                            m = v
                            best = ih * w + iw
                out[p, oh, ow] = m
                indices[p, oh, ow] = best


def _avg_rows_kernel(KW, SW):
    """The separable average pool: zero-padded scratch rows as in the max
    pool, and each output column's share of the divisor computed once per
    chunk, so that the horizontal pass is a fixed-length sum and a division
    (vectorized when ``KW`` > 0 fixes kw and sw at compile time; stride 2
    through ``_stride2_windows``). Only ints in the closure, as for the
    max pool."""

    def kernel(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor, nchunk):
        kw_ = KW if KW else kw
        sw_ = SW if KW else sw
        planes, h, w = x.shape
        oh_n, ow_n = out.shape[1], out.shape[2]
        span = (ow_n - 1) * sw_ + kw_
        cols = min(w, span - pw)
        items = planes * oh_n
        zero = x.dtype.type(0)
        for c in prange(nchunk):
            row = np.zeros(span + SPARE, x.dtype)
            mid = row[pw:pw + cols]
            wdiv = np.empty(ow_n, x.dtype)  # column factor of each divisor
            for o in range(ow_n):
                w0, w1, wcount = _avg_window(o, sw_, pw, kw_, w)
                wdiv[o] = 1 if divisor > 0 else (wcount if include_pad else w1 - w0)
            # 1 / divisor per column for the interior rows' factor, and for
            # a row with another (clipped or ceil-mode windows), made for it
            hfull = x.dtype.type(divisor if divisor > 0 else kh)
            wrec = np.empty(ow_n, x.dtype)
            wrec_row = np.empty(ow_n, x.dtype)
            for o in range(ow_n):
                d = hfull * wdiv[o]
                wrec[o] = 1 / d if d > zero else zero
            i0 = c * items // nchunk
            p, oh = _item_before(i0, oh_n)
            for _ in range(i0, (c + 1) * items // nchunk):
                p, oh = _next_item(p, oh, oh_n)
                h0, h1, hcount = _avg_window(oh, sh, ph, kh, h)
                hdiv = x.dtype.type(divisor if divisor > 0 else
                                    (hcount if include_pad else h1 - h0))
                # the rows [h0, h1), walked as the max pool walks its window:
                # a loop over range(h0, h1) ran slower (docs/benchmarks.md)
                first = True
                for i in range(kh):
                    ih = oh * sh - ph + i
                    if 0 <= ih < h:
                        src = x[p, ih]
                        if first:
                            _ROW_COPY_SUM(row, src, pw, cols)
                            first = False
                        else:
                            _ROW_ADD(row, src, pw, cols)
                if first:  # no row of the window inside the input
                    for j in range(cols):
                        mid[j] = zero
                dst = out[p, oh]
                if SW == 2:
                    rec = wrec
                    if hdiv != hfull:
                        for o in range(ow_n):
                            d = hdiv * wdiv[o]
                            wrec_row[o] = 1 / d if d > zero else zero
                        rec = wrec_row
                    if KW == 3:
                        _WINDOW_MEAN3(dst, row, ow_n, wdiv, hdiv, rec)
                    else:
                        _WINDOW_MEAN2(dst, row, ow_n, wdiv, hdiv, rec)
                    continue
                for o in range(ow_n):
                    b = o * sw_
                    s = row[b]
                    for j in range(1, kw_):
                        s += row[b + j]
                    d = hdiv * wdiv[o]
                    dst[o] = s / d if d > zero else zero

    kernel.__name__ = kernel.__qualname__ = f"_avg_pool_rows_k{KW}s{SW}"
    return cpu_kernel(kernel, parallel=True)


_avg_rows = {}


def _avg_pool_rows(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor, nchunk):
    key = (kw, sw) if (kw, sw, 1) in SPECIALISED else (0, 0)
    kernel = _avg_rows.get(key)
    if kernel is None:
        kernel = _avg_rows[key] = _avg_rows_kernel(*key)
    kernel(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor, nchunk)


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _adaptive_avg(x, out):
    # sums in float64: a global pool adds up a whole plane
    planes, h, w = x.shape
    oh_n, ow_n = out.shape[1], out.shape[2]
    for p in prange(planes):
        for oh in range(oh_n):
            h0, h1 = _bin(oh, oh_n, h)
            for ow in range(ow_n):
                w0, w1 = _bin(ow, ow_n, w)
                s = 0.0
                for ih in range(h0, h1):
                    src = x[p, ih]
                    for iw in range(w0, w1):
                        s += src[iw]
                out[p, oh, ow] = s / ((h1 - h0) * (w1 - w0))


# ---------------------------------------------------------------------------
# Backward kernels: one plane per iteration, so overlapping windows add up
# without races.


@cpu_kernel(parallel=True)
def _max_pool_scatter(grad, indices, grad_x):
    planes = grad_x.shape[0]
    w = grad_x.shape[2]
    n_out = grad.shape[1] * grad.shape[2]
    zero = grad_x.dtype.type(0)
    for p in prange(planes):
        gx = grad_x[p]
        for i in range(gx.shape[0]):
            for j in range(w):
                gx[i, j] = zero
        g = grad[p].reshape(n_out)
        idx = indices[p].reshape(n_out)
        for k in range(n_out):
            q = idx[k]
            gx[q // w, q % w] += g[k]


@cpu_kernel(parallel=True)
def _avg_pool_spread(grad, grad_x, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    planes, h, w = grad_x.shape
    oh_n, ow_n = grad.shape[1], grad.shape[2]
    zero = grad_x.dtype.type(0)
    for p in prange(planes):
        gx = grad_x[p]
        for i in range(h):
            for j in range(w):
                gx[i, j] = zero
        for oh in range(oh_n):
            h0, h1, hcount = _avg_window(oh, sh, ph, kh, h)
            for ow in range(ow_n):
                w0, w1, wcount = _avg_window(ow, sw, pw, kw, w)
                d = _avg_divisor(hcount, wcount, h0, h1, w0, w1, include_pad, divisor)
                if d <= 0:
                    continue
                g = grad[p, oh, ow] / d
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        gx[ih, iw] += g


@cpu_kernel(parallel=True)
def _adaptive_avg_spread(grad, grad_x):
    planes, h, w = grad_x.shape
    oh_n, ow_n = grad.shape[1], grad.shape[2]
    zero = grad_x.dtype.type(0)
    for p in prange(planes):
        gx = grad_x[p]
        for i in range(h):
            for j in range(w):
                gx[i, j] = zero
        for oh in range(oh_n):
            h0, h1 = _bin(oh, oh_n, h)
            for ow in range(ow_n):
                w0, w1 = _bin(ow, ow_n, w)
                g = grad[p, oh, ow] / ((h1 - h0) * (w1 - w0))
                for ih in range(h0, h1):
                    for iw in range(w0, w1):
                        gx[ih, iw] += g
