"""Memory hints for Numba CPU kernels.

:func:`prefetch` asks for a cache line that the hardware prefetchers cannot
guess (the random rows of a sparse product), or for the next row of a
row-by-row kernel before the current row's arithmetic, so that its memory
traffic overlaps that arithmetic instead of following it. An ``@intrinsic``
emitting ``llvm.prefetch``: generic LLVM IR, so it builds for any target
(``prefetcht0`` on x86-64).

:func:`stream_affine` writes one whole cache line of an output with a
non-temporal store (``vmovntps`` on x86-64), and :func:`stream_rows` a row
that way (its unaligned ends with ordinary stores). An ordinary store to a
line that is not in cache first reads the line from memory (write-allocate),
so a kernel writing a large output moves three bytes for every two it
needs: here a copy with non-temporal stores ran 1.9x faster than the same
copy with ordinary ones. The written lines bypass the caches, so only
outputs much larger than the last-level cache should be streamed
(:data:`STREAM_BYTES`): a consumer reading a small output straight after
would find it in memory instead of in L2/L3. Nor do compute-bound kernels
gain: a kernel that computes a block into L1 and then streams it out does
not overlap the two, which cost more than the saved traffic where the
arithmetic per element is long (see :mod:`nbops.cpu.activations`).
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, register_jitable

from .. import _tunables

__all__ = ["prefetch", "stream_affine", "stream_rows", "streams", "LINE", "STREAM_BYTES",
           "splat", "lane_mask", "masked_op"]

#: Bytes of one cache line: the unit of :func:`stream_affine`.
LINE = 64

#: Outputs from this many bytes on are streamed (nbops/_tunables.py).
STREAM_BYTES = _tunables.STREAM_BYTES


def streams(out):
    """Whether a kernel should stream ``out`` (see :data:`STREAM_BYTES`)."""
    return out.nbytes >= STREAM_BYTES


@intrinsic
def prefetch(typingctx, arr, i, j):
    """Hint the cache to fetch ``arr[i, j]`` (``arr[i]`` for 1-D arrays, ``j``
    ignored): read, keep in all cache levels. Never faults, whatever the
    index."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, v, t, types.intp)
               for v, t in zip(args[1:], sig.args[1:])][:aryty.ndim]
        prefetch_line(builder, cgutils.get_item_pointer(context, builder, aryty, ary, idx,
                                                        wraparound=False))
        return context.get_dummy_value()

    return types.void(arr, i, j), codegen


def prefetch_line(builder, ptr):
    """Emit the prefetch of the line holding ``ptr`` (for the ``@intrinsic``
    code generators): read, keep in all cache levels, data cache."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                      ir.Constant(i32, 1)])


@intrinsic
def stream_affine(typingctx, dst, i, src, k, a, b):
    """``dst[i:i + L] = src[k:k + L] * a + b`` for the ``L = LINE / itemsize``
    elements of one cache line, stored with one non-temporal store (1-D
    arrays of one float dtype; ``a``, ``b`` scalars of that dtype). The
    address of ``dst[i]`` must be a multiple of ``LINE`` and both ranges in
    bounds: nothing is checked (see :func:`stream_rows`)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.ndim == 1 and src.ndim == 1 and dst.dtype == src.dtype
            and isinstance(dst.dtype, types.Float) and a == dst.dtype and b == dst.dtype):
        return None

    def codegen(context, builder, sig, args):
        dty, ity, sty, kty = sig.args[:4]
        lanes = LINE // context.get_abi_sizeof(context.get_value_type(dty.dtype))
        vty = ir.VectorType(context.get_value_type(dty.dtype), lanes)
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[2])
        dp = cgutils.get_item_pointer(context, builder, dty, d,
                                      [context.cast(builder, args[1], ity, types.intp)],
                                      wraparound=False)
        sp = cgutils.get_item_pointer(context, builder, sty, s,
                                      [context.cast(builder, args[3], kty, types.intp)],
                                      wraparound=False)
        v = builder.load(builder.bitcast(sp, vty.as_pointer()),
                         align=context.get_abi_sizeof(vty.element))
        # a * v + b as two rounded operations (see stream_rows for how the
        # ordinary stores of the ends round)
        v = builder.fadd(builder.fmul(v, splat(builder, vty, args[4])),
                         splat(builder, vty, args[5]))
        store = builder.store(v, builder.bitcast(dp, vty.as_pointer()), align=LINE)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(dst, i, src, k, a, b), codegen


def lane_mask(builder, lanes, count):
    """The ``<lanes x i1>`` mask of the lanes below ``count`` (an i64, 1 to
    ``lanes``), for the ``@intrinsic`` code generators' masked last blocks:
    all ones shifted right, as a bit vector (one k-register move; comparing
    a lane index vector took 8 zmm compares)."""
    it = ir.IntType(lanes)
    bits = builder.lshr(ir.Constant(it, (1 << lanes) - 1),
                        builder.trunc(builder.sub(ir.Constant(ir.IntType(64), lanes), count), it))
    return builder.bitcast(bits, ir.VectorType(ir.IntType(1), lanes))


def masked_op(builder, kind, vt):
    """The declaration of ``llvm.masked.load`` or ``llvm.masked.store``
    (``kind``) for the LLVM vector type ``vt``; called as ``load(ptr, align,
    mask, passthru)`` and ``store(value, ptr, align, mask)``. Masked-off
    lanes are neither read nor written."""
    names = {"float": "f32", "double": "f64"}
    el = str(vt.element)
    tn = f"v{vt.count}{names.get(el, el)}"
    i32, mt = ir.IntType(32), ir.VectorType(ir.IntType(1), vt.count)
    fty = (ir.FunctionType(vt, [vt.as_pointer(), i32, mt, vt]) if kind == "load" else
           ir.FunctionType(ir.VoidType(), [vt, vt.as_pointer(), i32, mt]))
    return cgutils.get_or_insert_function(builder.module, fty,
                                          f"llvm.masked.{kind}.{tn}.p0{tn}")


def splat(builder, vt, value):
    """``value`` in every lane of the LLVM vector type ``vt`` (for the
    ``@intrinsic`` code generators here and in :mod:`nbops.quant.cpu_gemm`)."""
    i32 = ir.IntType(32)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(i32, vt.count), [0] * vt.count))


@register_jitable(inline="always")
def stream_rows(dst, o0, src, a, b, carry, first, last):
    """``dst[o0:o0 + n] = src * a + b`` for the ``n`` elements of ``src``,
    ``dst`` a flat array written span after span in order (one row of a
    C-contiguous output after the other). Whole lines go through
    :func:`stream_affine`. The line shared with the previous span is
    completed from ``carry`` (``LINE / itemsize`` elements of scratch, where
    the previous span left its last values) and streamed too, unless
    ``first``; the part shared with the next span is left in ``carry``,
    unless ``last``, where it is stored. So with NumPy's 16-byte-aligned
    allocations every line is still streamed but the first and last of a
    run of spans. Spans must be at least two lines long. Values round like
    ``src[j] * a + b`` in two steps, or in one where a caller's ``contract``
    flag fuses the ordinary stores' expression: the same for ``a = 1`` or
    ``b = -0.0``, the kernels' uses. A plain copy passes the constants 1.0
    and -0.0: x * 1 + (-0.0) is x for every x, -0.0 included (+0.0 would
    turn -0.0 into +0.0), and LLVM folds both operations away.

    Inlined at Numba's IR level: compiled as a call, the row buffer filled
    just before it escaped into the call and its loop ran 1.7x slower."""
    n = src.shape[0]
    size = dst.itemsize
    lanes = LINE // size
    addr = dst.ctypes.data + o0 * size
    if addr % size != 0:       # not aligned even to its items: no streaming
        for j in range(n):
            dst[o0 + j] = src[j] * a + b
        return
    head = ((LINE - addr % LINE) % LINE) // size
    if head > 0:
        if first:
            for j in range(head):
                dst[o0 + j] = src[j] * a + b
        else:
            for j in range(head):
                carry[lanes - head + j] = src[j] * a + b
            t = dst.dtype.type
            stream_affine(dst, o0 - (lanes - head), carry, 0, t(1.0), t(-0.0))
    j = head
    while j + lanes <= n:
        stream_affine(dst, o0 + j, src, j, a, b)
        j += lanes
    if last:
        for q in range(j, n):
            dst[o0 + q] = src[q] * a + b
    else:
        for q in range(j, n):
            carry[q - j] = src[q] * a + b
