"""CPU kernels of the CSR operators (:mod:`nbops.sparse`).

Load balance: power-law graphs put most of the nonzeros in a few rows, so
splitting rows evenly leaves one thread with nearly all the work. Every
kernel here splits its work by *merge path* (Merrill and Garland, 2016):
the rows and the nonzeros form one sequence of ``nrows + nnz`` items (a row
end or a nonzero), and each chunk takes an equal share of it, found by a
binary search on ``indptr``. A chunk may start or stop inside a row; SpMV
and SpMM then keep that partial row's sum as a *carry* that is added after
the parallel loop, so one long row is shared by all threads. Kernels whose
rows cannot be split (softmax, add, canonicalisation) keep whole rows per
chunk but still balance ``rows + nnz``.

Launchers (the names in ``__all__``) take arrays already checked and
allocated by :mod:`nbops.sparse`, and fill or return arrays. None of them
needs sorted or duplicate-free column indices except ``add_count`` /
``add_fill`` (the caller canonicalises first).
"""

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, register_jitable

from .._jit import FASTMATH_REDUCE, cpu_kernel
from .._scalars import canonical_count, canonical_fill_row, merge_rows, stable_argsort
from .._tunables import SPARSE_AHEAD as _AHEAD, SPARSE_CHUNKS_PER_THREAD as _CHUNKS_PER_THREAD
from .._tunables import SPARSE_GRAIN as _GRAIN
from ..cpu import _memory
from ..cpu._approx import exp_nonpos
from ..cpu._memory import prefetch as _prefetch
from ..cpu._memory import prefetch_line, splat, stream_affine, streams

__all__ = ["spmv", "spmm", "sddmm", "row_softmax", "row_softmax_backward", "scale",
           "to_dense", "gather", "scatter", "counting_sort", "canonicalize", "add",
           "expand_rows", "is_canonical", "row_lengths", "check_structure", "from_dense",
           "inv_sqrt", "dequantize"]


def _n_chunks(items):
    return int(max(1, min(numba.get_num_threads() * _CHUNKS_PER_THREAD, items // _GRAIN)))


@cpu_kernel
def _merge_path(diag, indptr, nrows, nnz):
    """Rows completed before merge-path diagonal ``diag``; the nonzero
    position there is ``diag - rows``."""
    lo = max(0, diag - nnz)
    hi = min(diag, nrows)
    while lo < hi:
        mid = (lo + hi) // 2
        if indptr[mid + 1] <= diag - mid - 1:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cpu_kernel
def _chunk(t, n_chunks, indptr):
    """``(row0, nz0, row1, nz1)`` of chunk ``t``: it finishes rows
    ``row0 .. row1 - 1`` starting at nonzero ``nz0``, then sums nonzeros
    ``.. nz1`` of row ``row1`` as a carry."""
    nrows = indptr.size - 1
    nnz = indptr[nrows]
    total = nrows + nnz
    d0 = t * total // n_chunks
    d1 = (t + 1) * total // n_chunks
    r0 = _merge_path(d0, indptr, nrows, nnz)
    r1 = _merge_path(d1, indptr, nrows, nnz)
    return r0, d0 - r0, r1, d1 - r1


# ---------------------------------------------------------------------------
# SpMV and SpMM: y = scale * A @ x


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _spmv(data, indices, indptr, x, y, scale, n_chunks):
    carry_row = np.empty(n_chunks, np.int64)
    carry = np.empty(n_chunks, y.dtype)
    zero = y.dtype.type(0)
    for t in prange(n_chunks):
        r0, j, r1, j1 = _chunk(t, n_chunks, indptr)
        # rows r0 .. r1 - 1 go to y, the partial row r1 to the carry.
        # Unsigned indices skip Numba's negative-index wraparound checks
        # (0.8x the CPU time of signed ones, or of per-row slices, measured)
        for r in range(r0, r1 + 1):
            k1 = indptr[r + 1] if r < r1 else j1
            acc = zero
            for k in range(np.uint64(j), np.uint64(k1)):
                acc += data[k] * x[np.uint64(indices[k])]
            if r < r1:
                y[r] = acc * scale
            else:
                carry[t] = acc * scale
            j = k1
        carry_row[t] = r1
    for t in range(n_chunks):
        if carry_row[t] < y.size:
            y[carry_row[t]] += carry[t]


def spmv(data, indices, indptr, x, y, scale):
    _spmv(data, indices, indptr, x, y, y.dtype.type(scale),
          _n_chunks(y.size + data.size))
    return y


# A row of C is computed a block of dense columns at a time (up to 8 cache
# lines of it), its accumulators held in vector registers while the row's
# nonzeros stream past (:func:`_axpy_rows`). Accumulated in C itself, each
# nonzero's update waited for the store of the previous one
# (docs/benchmarks.md).
@cpu_kernel(parallel=True)
def _spmm(data, indices, indptr, B, C, scale, stream, n_chunks):
    n = B.shape[1]
    lanes = _memory.LINE // C.itemsize
    n_lines = n - n % lanes
    carry_row = np.empty(n_chunks, np.int64)
    carry = np.empty((n_chunks, n), C.dtype)
    for t in prange(n_chunks):
        r0, j, r1, j1 = _chunk(t, n_chunks, indptr)
        # rows r0 .. r1 - 1 go to C, the partial row r1 to this chunk's carry
        for r in range(r0, r1 + 1):
            k1 = indptr[r + 1] if r < r1 else j1
            D = C if r < r1 else carry
            i = np.int64(r) if r < r1 else np.int64(t)
            c = 0
            while c < n_lines:
                c += lanes * _axpy_rows(D, i, c, data, indices, B, j, k1, scale,
                                        stream and r < r1, (n_lines - c) // lanes)
            for c in range(n_lines, n):
                acc = C.dtype.type(0)
                for k in range(j, k1):
                    acc += data[k] * B[indices[k], c]
                D[i, c] = acc * scale
            j = k1
        carry_row[t] = r1
    for t in range(n_chunks):
        if carry_row[t] < C.shape[0]:
            C[carry_row[t]] += carry[t]


def spmm(data, indices, indptr, B, C, scale):
    stream = streams(C) and C.ctypes.data % _memory.LINE == 0 and C.strides[0] % _memory.LINE == 0
    _spmm(data, indices, indptr, line_rows(B, data.size), C, C.dtype.type(scale), stream,
          _n_chunks(C.shape[0] + data.size))
    return C


def line_rows(A, reads):
    """``A`` (C-contiguous, 2-D), or a copy of it whose rows start on cache
    lines, for a kernel that reads ``reads`` rows of it in random order. At
    NumPy's 16-byte offset a row of 256 bytes spans five lines instead of
    four, and SpMM, bound by fetching such rows, ran 1.3x slower than from
    an aligned copy. Copied only where that pays: rows of whole lines (no
    padding), ``A`` of ``STREAM_BYTES`` or more (smaller ones mostly stay in
    cache), and at least as many rows read as ``A`` has lines (the copy
    streams ``A`` twice; a random row fetch is about three times slower per
    byte). The copy is temporary: it needs ``A.nbytes`` more memory during
    the call."""
    row = A.shape[1] * A.itemsize
    if (A.ctypes.data % _memory.LINE == 0 or row % _memory.LINE or not streams(A)
            or reads * _memory.LINE < A.nbytes):
        return A
    from .._checks import empty

    out = empty(A.shape, A.dtype, "cpu")
    _copy_lines(out.reshape(-1), A.reshape(-1))
    return out


@cpu_kernel(parallel=True)
def _copy_lines(dst, src):
    """``dst[:] = src`` for a line-aligned ``dst`` of whole lines, with
    non-temporal stores (the copy is not read back soon in order)."""
    lanes = _memory.LINE // dst.itemsize
    one = dst.dtype.type(1)
    zero = dst.dtype.type(-0.0)    # x * 1 + -0.0 is x, -0.0 included (folded away)
    for q in prange(dst.size // lanes):
        stream_affine(dst, q * lanes, src, q * lanes, one, zero)


@intrinsic
def _axpy_rows(typingctx, dst, i, c, data, indices, src, j, k1, scale, stream, lines):
    """``dst[i, c:c + w] = scale * sum(data[k] * src[indices[k], c:c + w])``
    over ``k`` in ``[j, k1)``, ``w`` the elements of the first 8, 4, 2 or 1
    of the ``lines`` cache lines left (see :meth:`_RowLoop.by_lines`);
    returns that line count. An LLVM loop whose vector accumulators stay in
    registers; each iteration prefetches the lines of the row
    ``indices[k + _AHEAD]`` (clamped to the last nonzero). The rows
    are stored with non-temporal stores where ``stream`` is true (then
    ``dst[i, c]`` must start a cache line). ``data`` of any number type is
    converted to ``dst``'s (int8 values of quantized matrices). Unaligned
    vector loads; no bounds checks (the CSR arrays were validated, so the
    columns are in range)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.ndim == 2 and src.ndim == 2 and dst.dtype == src.dtype
            and isinstance(dst.dtype, types.Float) and scale == dst.dtype
            and isinstance(data, types.Array) and data.ndim == 1
            and _row_loop_types(indices, stream, lines)):
        return None
    sig = types.intp(dst, i, c, data, indices, src, j, k1, scale, stream, lines)

    def codegen(context, builder, sig, args):
        g = _RowLoop(context, builder, sig, args, dst.dtype, indices=4)
        return g.by_lines(g.index(10), lambda n_acc: _axpy_block(g, n_acc))

    return sig, codegen


def _axpy_block(g, n_acc):
    """The loop of :func:`_axpy_rows` over ``n_acc`` lines."""
    builder, args = g.builder, g.args
    row, c0 = g.index(1), g.index(2)
    zero = ir.Constant(g.vty, None)
    k, entry = g.open(g.index(6), g.index(7), "axpy_rows")
    accs = [builder.phi(g.vty) for _ in range(n_acc)]
    g.prefetch_rows(5, k, c0, n_acc)
    a = g.context.cast(builder, builder.load(g.item(3, k)), g.sig.args[3].dtype,
                       g.sig.args[0].dtype)
    a = splat(builder, g.vty, a)
    col = g.column(k)
    sums = [builder.call(g.fma, [a, g.load_line(5, col, c0, n), acc])
            for n, acc in enumerate(accs)]
    tail = g.close(k, g.index(6), entry, g.index(7))
    for acc, v in zip(accs, sums):
        acc.add_incoming(zero, entry)
        acc.add_incoming(v, tail)
    results = [builder.phi(g.vty) for _ in range(n_acc)]
    for res, v in zip(results, sums):
        res.add_incoming(zero, entry)
        res.add_incoming(v, tail)
    factor = splat(builder, g.vty, args[8])
    values = [builder.fmul(res, factor) for res in results]
    with builder.if_else(args[9]) as (streamed, cached):
        with streamed:
            for n, v in enumerate(values):
                store = builder.store(v, g.line(0, row, c0, n), align=_memory.LINE)
                store.set_metadata("nontemporal", builder.module.add_metadata(
                    [ir.Constant(ir.IntType(32), 1)]))
        with cached:
            for n, v in enumerate(values):
                builder.store(v, g.line(0, row, c0, n), align=g.size)


# ---------------------------------------------------------------------------
# SDDMM: out[k] = X[row(k)] . Y[indices[k]], split by equal nonzero shares


@cpu_kernel(parallel=True)
def _sddmm(indices, indptr, X, Y, out, n_chunks):
    nnz = out.size
    d = X.shape[1]
    lanes = _memory.LINE // X.itemsize
    d_lines = d - d % lanes
    for t in prange(n_chunks):
        k0 = t * nnz // n_chunks
        k1 = (t + 1) * nnz // n_chunks
        r = np.searchsorted(indptr, k0, side="right") - 1
        j = k0
        while j < k1:
            while indptr[r + 1] <= j:
                r += 1
            e = min(k1, indptr[r + 1])
            # row r's nonzeros j .. e - 1, a block of X[r]'s lines at a time
            c = 0
            while c < d_lines:
                c += lanes * _dot_rows(out, X, r, c, indices, Y, j, e, c > 0,
                                       (d_lines - c) // lanes)
            for k in range(j, e):
                col = indices[k]
                acc = out.dtype.type(0)
                for c in range(d_lines, d):
                    acc += X[r, c] * Y[col, c]
                out[k] = out[k] + acc if d_lines > 0 else acc
            j = e


def sddmm(indices, indptr, X, Y, out):
    if out.size:
        _sddmm(indices, indptr, X, line_rows(Y, out.size), out,
               _n_chunks(out.size * max(1, X.shape[1]) // 4))
    return out


@intrinsic
def _dot_rows(typingctx, out, x, r, c, indices, y, j, e, add, lines):
    """``out[k] (+)= x[r, c:c + w] . y[indices[k], c:c + w]`` for ``k`` in
    ``[j, e)``, ``w`` the elements of the first 8, 4, 2 or 1 of the
    ``lines`` cache lines left (returns that count), added to ``out[k]``
    where ``add`` is true: ``x``'s lines held in registers, one vector
    product per nonzero summed by halving (lane ``i`` with lane
    ``i + w/2``, ...), the rows of ``y`` ``_AHEAD`` nonzeros on prefetched.
    Unaligned loads, no bounds checks (see :func:`_axpy_rows`)."""
    if not (isinstance(out, types.Array) and isinstance(x, types.Array)
            and isinstance(y, types.Array) and out.ndim == 1 and x.ndim == 2 and y.ndim == 2
            and out.dtype == x.dtype == y.dtype and isinstance(x.dtype, types.Float)
            and _row_loop_types(indices, add, lines)):
        return None
    sig = types.intp(out, x, r, c, indices, y, j, e, add, lines)

    def codegen(context, builder, sig, args):
        g = _RowLoop(context, builder, sig, args, x.dtype, indices=4)
        return g.by_lines(g.index(9), lambda n_lines: _dot_block(g, n_lines))

    return sig, codegen


def _dot_block(g, n_lines):
    """The loop of :func:`_dot_rows` over ``n_lines`` lines."""
    builder = g.builder
    row, c0 = g.index(2), g.index(3)
    i32 = ir.IntType(32)
    xs = [g.load_line(1, row, c0, n) for n in range(n_lines)]
    k, entry = g.open(g.index(6), g.index(7), "dot_rows")
    g.prefetch_rows(5, k, c0, n_lines)
    col = g.column(k)
    acc = builder.fmul(xs[0], g.load_line(5, col, c0, 0))
    for n in range(1, n_lines):
        acc = builder.call(g.fma, [xs[n], g.load_line(5, col, c0, n), acc])
    width = g.vty.count
    while width > 1:
        width //= 2
        halves = [builder.shuffle_vector(acc, acc, ir.Constant(
            ir.VectorType(i32, width), list(range(h * width, (h + 1) * width))))
            for h in (0, 1)]
        acc = builder.fadd(*halves)
    dot = builder.extract_element(acc, ir.Constant(i32, 0))
    target = g.item(0, k)
    builder.store(builder.select(g.args[8], builder.fadd(builder.load(target), dot), dot),
                  target)
    g.close(k, g.index(6), entry, g.index(7))


def _row_loop_types(indices, flag, lines):
    """The argument types both row intrinsics share: 1-D integer column
    indices, a boolean flag, an integer count of lines left."""
    return (isinstance(indices, types.Array) and indices.ndim == 1
            and isinstance(indices.dtype, types.Integer) and isinstance(flag, types.Boolean)
            and isinstance(lines, types.Integer))


class _RowLoop:
    """Code generation shared by the row intrinsics (:func:`_axpy_rows`,
    :func:`_dot_rows`): the arguments as typed values, pointers to line
    ``n`` of a block of columns starting at ``c0`` in a row of a 2-D
    argument, the loop over a row's nonzeros ``k`` (:meth:`open` ...
    :meth:`close`), the prefetch of the dense rows ``_AHEAD`` nonzeros on,
    and the choice of a block of lines (:meth:`by_lines`). ``indices`` is
    the position of the column-index argument."""

    def __init__(self, context, builder, sig, args, dtype, indices):
        self.context, self.builder, self.sig, self.args = context, builder, sig, args
        self.indices = indices
        self.intp = context.get_value_type(types.intp)
        et = context.get_value_type(dtype)
        self.size = context.get_abi_sizeof(et)
        self.vty = ir.VectorType(et, _memory.LINE // self.size)
        self.fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(self.vty, [self.vty] * 3),
            f"llvm.fma.v{self.vty.count}f{self.size * 8}")

    def index(self, k):
        return self.context.cast(self.builder, self.args[k], self.sig.args[k], types.intp)

    def item(self, k, *index):
        aryty = self.sig.args[k]
        ary = self.context.make_array(aryty)(self.context, self.builder, self.args[k])
        return cgutils.get_item_pointer(self.context, self.builder, aryty, ary, list(index),
                                        wraparound=False)

    def line(self, k, row, c0, n):
        col = self.builder.add(c0, ir.Constant(self.intp, n * self.vty.count))
        return self.builder.bitcast(self.item(k, row, col), self.vty.as_pointer())

    def load_line(self, k, row, c0, n):
        return self.builder.load(self.line(k, row, c0, n), align=self.size)

    def column(self, k):
        """``indices[k]`` as an intp."""
        return self.context.cast(self.builder, self.builder.load(self.item(self.indices, k)),
                                 self.sig.args[self.indices].dtype, types.intp)

    def by_lines(self, left, emit):
        """Emit ``emit(n)`` for the largest ``n`` of 8, 4, 2, 1 that is at
        most ``left`` (at least 1 taken): the accumulators of a block are
        registers fixed at compile time, so each size is its own loop.
        Returns ``n`` as an intp value."""
        b = self.builder
        merge = b.append_basic_block("lines.merge")
        done = []
        for n in (8, 4, 2, 1):
            if n > 1:
                take, other = b.append_basic_block(f"lines.{n}"), b.append_basic_block()
                b.cbranch(b.icmp_signed(">=", left, ir.Constant(self.intp, n)), take, other)
                b.position_at_end(take)
            emit(n)
            done.append((ir.Constant(self.intp, n), b.block))
            b.branch(merge)
            if n > 1:
                b.position_at_end(other)
        b.position_at_end(merge)
        count = b.phi(self.intp)
        for n, block in done:
            count.add_incoming(n, block)
        return count

    def prefetch_rows(self, src, k, c0, n_lines):
        """Prefetch the block's lines of row ``indices[k + _AHEAD]`` of
        argument ``src`` (clamped to the last nonzero)."""
        b = self.builder
        nnz = cgutils.unpack_tuple(b, self.context.make_array(self.sig.args[self.indices])(
            self.context, b, self.args[self.indices]).shape, 1)[0]
        ahead = b.add(k, ir.Constant(self.intp, _AHEAD))
        ahead = b.select(b.icmp_signed("<", ahead, nnz), ahead,
                         b.sub(nnz, ir.Constant(self.intp, 1)))
        row = self.column(ahead)
        for n in range(n_lines):
            prefetch_line(b, self.line(src, row, c0, n))

    def open(self, j0, k_end, name):
        """Start the loop over ``k`` in ``[j0, k_end)`` (none if empty);
        returns ``(k, entry block)``, the builder inside the loop."""
        b = self.builder
        entry = b.block
        self.loop = b.append_basic_block(name + ".loop")
        self.done = b.append_basic_block(name + ".done")
        b.cbranch(b.icmp_signed("<", j0, k_end), self.loop, self.done)
        b.position_at_end(self.loop)
        return b.phi(self.intp), entry

    def close(self, k, j0, entry, k_end):
        """End the loop at ``k_end``; returns its last block, the builder
        after the loop."""
        b = self.builder
        k_next = b.add(k, ir.Constant(self.intp, 1))
        tail = b.block
        k.add_incoming(j0, entry)
        k.add_incoming(k_next, tail)
        b.cbranch(b.icmp_signed("<", k_next, k_end), self.loop, self.done)
        b.position_at_end(self.done)
        return tail


# ---------------------------------------------------------------------------
# Whole-row kernels: chunks of whole rows, balanced on rows + nonzeros


@cpu_kernel
def _row_range(t, n_chunks, indptr):
    nrows = indptr.size - 1
    nnz = indptr[nrows]
    total = nrows + nnz
    return (_merge_path(t * total // n_chunks, indptr, nrows, nnz),
            _merge_path((t + 1) * total // n_chunks, indptr, nrows, nnz))


@cpu_kernel(parallel=True)
def _row_softmax(data, indptr, out, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            a = indptr[r]
            b = indptr[r + 1]
            if a == b:
                continue
            m = data[a]
            for k in range(a + 1, b):
                # NaN wins the max so that it propagates to the whole row
                # (a select, not a short-circuit branch per nonzero)
                v = data[k]
                m = v if (v > m) | (v != v) else m
            s = out.dtype.type(0)
            for k in range(a, b):
                # x - max <= 0: the vectorizable exp_nonpos (np.exp here is a
                # libm call per nonzero, and keeps the loop scalar)
                e = exp_nonpos(data[k] - m)
                out[k] = e
                s += e
            inv = out.dtype.type(1) / s
            for k in range(a, b):
                out[k] *= inv


def row_softmax(data, indptr, out):
    _row_softmax(data, indptr, out, _n_chunks(indptr.size + data.size))
    return out


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _row_softmax_backward(y, g, indptr, out, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            s = out.dtype.type(0)
            for k in range(indptr[r], indptr[r + 1]):
                s += y[k] * g[k]
            for k in range(indptr[r], indptr[r + 1]):
                out[k] = y[k] * (g[k] - s)


def row_softmax_backward(y, g, indptr, out):
    _row_softmax_backward(y, g, indptr, out, _n_chunks(indptr.size + y.size))
    return out


@cpu_kernel(parallel=True)
def _scale(data, indices, indptr, rs, cs, use_r, use_c, out, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            f = rs[r] if use_r else rs.dtype.type(1)
            for k in range(indptr[r], indptr[r + 1]):
                v = data[k] * f
                out[k] = v * cs[indices[k]] if use_c else v


def scale(data, indices, indptr, row_scale, col_scale, out):
    """``out[k] = data[k] * row_scale[row] * col_scale[col]``; either scale
    may be None."""
    one = np.ones(1, out.dtype)
    _scale(data, indices, indptr, one if row_scale is None else row_scale,
           one if col_scale is None else col_scale, row_scale is not None,
           col_scale is not None, out, _n_chunks(indptr.size + data.size))
    return out


@cpu_kernel(parallel=True)
def _to_dense(data, indices, indptr, out, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            out[r, :] = 0
            for k in range(indptr[r], indptr[r + 1]):
                out[r, indices[k]] += data[k]


def to_dense(data, indices, indptr, out):
    _to_dense(data, indices, indptr, out, _n_chunks(out.size // 8 + data.size))
    return out


@cpu_kernel(parallel=True)
def _expand_rows(indptr, rows, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            rows[indptr[r]:indptr[r + 1]] = r


def expand_rows(indptr, rows):
    """The row of each nonzero (the COO row array)."""
    _expand_rows(indptr, rows, _n_chunks(indptr.size + rows.size))
    return rows


@cpu_kernel(parallel=True)
def _permute(src, perm, out, scatter):
    for i in prange(perm.size):
        if scatter:
            out[perm[i]] = src[i]
        else:
            out[i] = src[perm[i]]


def gather(src, perm, out):
    """``out[i] = src[perm[i]]``."""
    _permute(src, perm, out, False)
    return out


def scatter(src, perm, out):
    """``out[perm[i]] = src[i]`` (the inverse of :func:`gather` for a permutation)."""
    _permute(src, perm, out, True)
    return out


# ---------------------------------------------------------------------------
# Parallel stable counting sort: transpose and COO -> CSR


@cpu_kernel(parallel=True)
def _counting_sort(keys, n_keys, ptr, perm, n_chunks):
    n = keys.size
    hist = np.zeros((n_chunks, n_keys + 1), ptr.dtype)
    for t in prange(n_chunks):
        for k in range(t * n // n_chunks, (t + 1) * n // n_chunks):
            hist[t, keys[k] + 1] += 1
    # column totals, then each chunk's first slot per key: chunk order keeps
    # the sort stable
    for c in prange(n_keys + 1):
        s = 0
        for t in range(n_chunks):
            v = hist[t, c]
            hist[t, c] = s
            s += v
        ptr[c] = s
    for c in range(n_keys):
        ptr[c + 1] += ptr[c]
    for t in prange(n_chunks):
        for k in range(t * n // n_chunks, (t + 1) * n // n_chunks):
            key = keys[k]
            pos = ptr[key] + hist[t, key + 1]
            hist[t, key + 1] += 1
            perm[pos] = k


def counting_sort(keys, n_keys, ptr, perm):
    """Stable sort of ``keys`` (values in ``[0, n_keys)``): fills ``ptr``
    (``n_keys + 1``, the CSR pointer of the keys) and ``perm`` (source
    position of each sorted item). Chunks keep one histogram each, so the
    count of chunks is kept to the thread count."""
    n_chunks = int(max(1, min(numba.get_num_threads(), keys.size // 65536)))
    _counting_sort(keys, n_keys, ptr, perm, n_chunks)
    return ptr, perm


# ---------------------------------------------------------------------------
# Canonical form: columns sorted within rows, duplicates summed


_stable_argsort = register_jitable(stable_argsort)
_canonical_count = register_jitable(canonical_count)
_canonical_fill_row = register_jitable(canonical_fill_row)


@cpu_kernel(parallel=True)
def _canonical_order(indices, indptr, order, counts, merge, n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        longest = 0
        for r in range(r0, r1):
            longest = max(longest, indptr[r + 1] - indptr[r])
        scratch = np.empty(longest, order.dtype)
        for r in range(r0, r1):
            a = indptr[r]
            b = indptr[r + 1]
            _stable_argsort(indices, a, b, order, scratch, 0)
            counts[r + 1] = _canonical_count(indices, a, b, order, merge)


@cpu_kernel(parallel=True)
def _canonical_fill(data, indices, indptr, order, merge, new_ptr, new_data, new_indices,
                    n_chunks):
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, indptr)
        for r in range(r0, r1):
            _canonical_fill_row(r, data, indices, indptr, order, merge, new_ptr, new_data,
                                new_indices)


def canonicalize(data, indices, indptr, merge):
    """Columns sorted within each row (stable); with ``merge`` duplicates
    summed. Returns new ``(data, indices, indptr)``."""
    n_chunks = _n_chunks(indptr.size + data.size)
    order = np.empty(data.size, np.int64)
    counts = np.zeros(indptr.size, indptr.dtype)
    _canonical_order(indices, indptr, order, counts, merge, n_chunks)
    new_ptr = np.cumsum(counts).astype(indptr.dtype)
    nnz = int(new_ptr[-1])
    new_data = np.empty(nnz, data.dtype)
    new_indices = np.empty(nnz, indices.dtype)
    _canonical_fill(data, indices, indptr, order, merge, new_ptr, new_data, new_indices, n_chunks)
    return new_data, new_indices, new_ptr


def check_structure(indices, indptr, n_cols):
    """``(r, k, row)``: the first ``r`` with ``indptr[r + 1] < indptr[r]``,
    the first ``k`` with ``indices[k]`` outside ``[0, n_cols)`` and the row
    holding it (as ``indptr`` says); -1 for none."""
    drops = np.flatnonzero(indptr[1:] < indptr[:-1])
    bad = np.flatnonzero((indices < 0) | (indices >= n_cols))
    if not bad.size:
        return (int(drops[0]) if drops.size else -1), -1, -1
    k = int(bad[0])
    return ((int(drops[0]) if drops.size else -1), k,
            int(np.searchsorted(indptr, k, side="right") - 1))


def from_dense(a, index_dtype):
    """``(data, indices, indptr)`` of the nonzero entries of a 2-D array
    (NaN counts as nonzero), row by row, columns increasing."""
    rows, cols = np.nonzero(a)
    ptr = np.zeros(a.shape[0] + 1, index_dtype)
    np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=ptr[1:])
    return a[rows, cols], cols.astype(index_dtype), ptr


def inv_sqrt(x, out):
    """``out = 1 / sqrt(x)`` where ``x > 0``, else 0 (GCN degree scaling)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        np.copyto(out, np.where(x > 0, 1.0 / np.sqrt(x), 0.0))
    return out


def dequantize(data, scale, out):
    """``out = float32(data) * float32(scale)`` for int8 values."""
    np.multiply(data.astype(np.float32), np.float32(scale), out=out)
    return out


def is_canonical(indices, indptr):
    """True when every row's columns are strictly increasing (sorted, no
    duplicates)."""
    if indices.size < 2:
        return True
    steps = np.diff(indices.astype(np.int64)) > 0
    row_starts = indptr[1:-1]
    row_starts = row_starts[(row_starts > 0) & (row_starts < indices.size)]
    steps[row_starts - 1] = True  # a new row may start anywhere
    return bool(steps.all())


def row_lengths(indptr, out):
    """``out[r] = indptr[r + 1] - indptr[r]`` (out int64)."""
    np.subtract(indptr[1:], indptr[:-1], out=out)
    return out


# ---------------------------------------------------------------------------
# C = alpha * A + beta * B, both canonical: a merge of sorted rows


_merge_rows = register_jitable(merge_rows)


@cpu_kernel(parallel=True)
def _add_rows(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, alpha, beta,
              ptr, data, ind, fill, n_chunks):
    # one loop for both passes: counting (fill=False), then writing
    for t in prange(n_chunks):
        r0, r1 = _row_range(t, n_chunks, a_ptr)
        for r in range(r0, r1):
            n = _merge_rows(a_data, a_ind, a_ptr[r], a_ptr[r + 1], b_data, b_ind, b_ptr[r],
                            b_ptr[r + 1], alpha, beta, data, ind, ptr[r], fill)
            if not fill:
                ptr[r + 1] = n


def add(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, alpha, beta):
    """``alpha * A + beta * B`` of two canonical CSR matrices of one shape."""
    n_chunks = _n_chunks(a_ptr.size + a_data.size + b_data.size)
    ptr = np.zeros(a_ptr.size, a_ptr.dtype)
    dt = a_data.dtype.type
    _add_rows(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
              ptr, a_data[:0], a_ind[:0], False, n_chunks)
    np.cumsum(ptr, out=ptr)
    data = np.empty(int(ptr[-1]), a_data.dtype)
    ind = np.empty(int(ptr[-1]), a_ind.dtype)
    _add_rows(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
              ptr, data, ind, True, n_chunks)
    return data, ind, ptr
