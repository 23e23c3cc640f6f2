"""The register tile of the GEMM, convolution and attention kernels, in LLVM IR.

One MR x NR tile of C accumulates ``A[:, rows] . B[rows, :]`` over k steps:
each step loads NR contiguous elements of one row of B as whole vectors,
broadcasts MR elements of A and issues MR * NR / VL vector multiply-adds
(VL = 64 bytes of lanes: 16 float32, 8 float64) into accumulators that stay
in registers for the whole loop; the tile is then stored into (or added
to) C. Written as vectors from the start, it compiles in a fraction of a
second, where MR * NR scalar accumulators left to the SLP vectorizer cost
seconds per tile shape for the same instructions (docs/startup.md).

Each accumulator element is ``fmuladd(a, b, acc)`` in k order, as the scalar
``acc += a * b`` compiled with ``contract`` was: results are bit-identical.
"""

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._memory import splat

#: Bytes of one vector register the tiles are built from (AVX-512).
VECTOR_BYTES = 64
#: Function attributes: prefer 512-bit vectors, and (for the tile's explicit
#: vectors) keep them legal where the CPU's tuning prefers 256 bits.
_WIDE = ('"prefer-vector-width"="512"', '"min-legal-vector-width"="512"')


@functools.lru_cache(maxsize=None)
def fma_tile(mr, nr):
    """The MR x NR register-tile intrinsic, for kernels to call as

    ``tile(k, abuf, a0, a_step, a_row, bbuf, b0, b_rows, cbuf, c0, ldc, rows, add)``

    * A's element (step p, tile row i) is ``abuf[a0 + p * a_step + i * a_row]``
      (packed slivers: ``a_step = MR``, ``a_row = 1``; a matrix read where it
      lies: its k and row strides);
    * B's row p is ``bbuf[r:r + NR]`` with ``r = b0 + p * b_rows`` when
      ``b_rows`` is an integer, or ``r = b0 + b_rows[p]`` when it is an
      integer array (a convolution's offset table);
    * tile row i goes to ``cbuf[c0 + i * ldc:][:NR]``, for i > 0 only where
      ``i < rows``; stored, or added where ``add`` is true.

    ``abuf``, ``bbuf`` and ``cbuf`` are C-contiguous arrays of one float
    dtype (any number of dimensions: offsets count elements of the flat
    data); NR must be a multiple of the dtype's vector lanes. Nothing is
    bounds-checked: the kernels guarantee every element read and written
    exists. Integer arguments may be runtime values or constants.
    """

    @intrinsic
    def tile(typingctx, k, abuf, a0, a_step, a_row, bbuf, b0, b_rows, cbuf, c0, ldc, rows, add):
        bufs = (abuf, bbuf, cbuf)
        if not all(isinstance(b, types.Array) and b.layout == "C" for b in bufs):
            return None
        dtype = abuf.dtype
        if not isinstance(dtype, types.Float) or bbuf.dtype != dtype or cbuf.dtype != dtype:
            return None
        if nr % (VECTOR_BYTES // (dtype.bitwidth // 8)):
            return None
        table = isinstance(b_rows, types.Array)
        if table and not (isinstance(b_rows.dtype, types.Integer) and b_rows.ndim == 1):
            return None
        intp = types.intp
        sig = types.void(intp, abuf, intp, intp, intp, bbuf, intp, b_rows if table else intp,
                         cbuf, intp, intp, intp, types.boolean)

        def codegen(context, builder, signature, args):
            _emit(context, builder, signature, args, mr, nr, table)
            return context.get_dummy_value()

        return sig, codegen

    return tile


def _emit(context, builder, signature, args, mr, nr, table):
    k, abuf, a0, a_step, a_row, bbuf, b0, b_rows, cbuf, c0, ldc, rows, add = args
    sty = signature.args
    _mark(builder, _WIDE)
    ety = context.get_value_type(sty[1].dtype)
    align = context.get_abi_sizeof(ety)
    lanes = VECTOR_BYTES // align
    vty = ir.VectorType(ety, lanes)
    vptr = vty.as_pointer()
    nv = nr // lanes
    i64 = ir.IntType(64)
    fmuladd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty, vty, vty]),
        f"llvm.fmuladd.v{lanes}{'f32' if align == 4 else 'f64'}")

    def data(i, value):
        return context.make_array(sty[i])(context, builder, value).data

    ap, bp, cp = data(1, abuf), data(5, bbuf), data(8, cbuf)
    tp = data(7, b_rows) if table else None

    def const(v):
        return ir.Constant(i64, v)

    def vec_at(base, offset):
        return builder.bitcast(builder.gep(base, [offset]), vptr)

    row_offsets = [builder.mul(const(i), a_row) for i in range(mr)]
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(vty, None)) for _ in range(nv)]
            for _ in range(mr)]
    a_at = cgutils.alloca_once_value(builder, a0)
    b_at = cgutils.alloca_once_value(builder, b0)
    with cgutils.for_range(builder, k) as loop:
        if table:
            entry = builder.load(builder.gep(tp, [loop.index]))
            row = builder.add(b0, context.cast(builder, entry, sty[7].dtype, types.intp))
        else:
            row = builder.load(b_at)
            builder.store(builder.add(row, b_rows), b_at)
        bvec = [builder.load(vec_at(bp, builder.add(row, const(j * lanes))), align=align)
                for j in range(nv)]
        a = builder.load(a_at)
        for i in range(mr):
            ai = builder.load(builder.gep(ap, [builder.add(a, row_offsets[i])]))
            x = splat(builder, vty, ai)
            for j in range(nv):
                builder.store(builder.call(fmuladd, [x, bvec[j], builder.load(accs[i][j])]),
                              accs[i][j])
        builder.store(builder.add(a, a_step), a_at)
    for i in range(mr):
        if i == 0:
            _store_row(builder, cp, c0, ldc, i, accs[i], add, lanes, align, vptr)
            continue
        with builder.if_then(builder.icmp_signed("<", const(i), rows)):
            _store_row(builder, cp, c0, ldc, i, accs[i], add, lanes, align, vptr)


@intrinsic
def prefer_wide_vectors(typingctx):
    """Let the calling kernel use 512-bit vectors: LLVM's tuning for recent
    Intel (and some AMD) cores prefers 256-bit ones, so vectorized loops
    ran on half of AVX-512's width (docs/benchmarks.md). On hosts without
    AVX-512 it changes nothing."""

    def codegen(context, builder, signature, args):
        _mark(builder, _WIDE[:1])
        return context.get_dummy_value()

    return types.void(), codegen


def _mark(builder, attributes):
    for attr in attributes:
        # llvmlite validates attribute names; these string attributes are valid IR
        set.add(builder.function.attributes, attr)


def _store_row(builder, cp, c0, ldc, i, accs, add, lanes, align, vptr):
    start = builder.add(c0, builder.mul(ir.Constant(c0.type, i), ldc))
    ptrs = [builder.bitcast(builder.gep(cp, [builder.add(start, ir.Constant(c0.type, j * lanes))]),
                            vptr) for j in range(len(accs))]
    with builder.if_else(add) as (added, stored):
        with added:
            for p, acc in zip(ptrs, accs):
                builder.store(builder.fadd(builder.load(p, align=align), builder.load(acc)), p,
                              align=align)
        with stored:
            for p, acc in zip(ptrs, accs):
                builder.store(builder.load(acc), p, align=align)
