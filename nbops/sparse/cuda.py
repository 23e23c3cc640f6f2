"""CUDA kernels of the CSR operators (:mod:`nbops.sparse`).

* SpMV, row softmax: a *group* of ``g`` threads per row (``g`` a power of
  two from 1 to 32 sized to the average row length, so short rows do not
  leave most of a warp idle), lanes striding over the row's nonzeros and
  reducing through shared memory (the simulator has no warp shuffles).
* SpMM: one thread per (row, dense column), consecutive threads on
  consecutive columns, so every read of B and write of C is coalesced; the
  row's values and column indices are broadcast reads.
* SDDMM: a group per nonzero, lanes over the feature dimension.
* Structure stays on the device: a prefix sum over tiles of a block
  (shared memory, then the tile totals scanned the same way), a stable
  counting sort for the transpose (atomic counts per key, scan, atomic
  scatter, then each key's items sorted by source position, so the order
  is deterministic and equal to the CPU's), the row of each nonzero, the
  canonical form (one thread per row: a stable merge sort of the row's
  columns, then the merged copy), content validation (atomic minima of
  the first bad positions) and the CSR of a dense array. Results equal the
  CPU kernels' exactly. Launchers that size an output by its contents
  read back one scalar (the new nnz), validation two; nothing else comes
  to the host. One thread sorts a whole row: a row holding most of the
  nonzeros is sorted serially (O(L log L)).

Group loops run the same trip count in every thread of a block (rows past
the end compute nothing), so the ``syncthreads`` inside the reductions are
reached by all threads.
"""

import functools
import math

import numpy as np
from numba import cuda, from_dtype, int64

from .._scalars import canonical_count, canonical_fill_row, merge_rows, stable_argsort
from ..cuda._launch import THREADS, grid_1d

__all__ = ["spmv", "spmm", "sddmm", "row_softmax", "row_softmax_backward", "scale",
           "to_dense", "gather", "scatter", "add", "expand_rows", "counting_sort",
           "canonicalize", "is_canonical", "row_lengths", "check_structure", "from_dense",
           "inv_sqrt", "dequantize", "group_size"]


def group_size(avg):
    """Threads per row: the power of two at or above the average row length,
    1 to 32."""
    g = 1
    while g < min(avg, 32):
        g *= 2
    return min(g, THREADS)


@cuda.jit(device=True)
def _row_of(indptr, k):
    # the row holding nonzero k: last r with indptr[r] <= k
    lo = 0
    hi = indptr.size - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if indptr[mid] <= k:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(device=True)
def _group_layout(g):
    """``(thread, lane, group in block, first item, grid stride)`` for
    groups of ``g`` threads, each taking one item (row or nonzero) at a time;
    every thread of a block runs the same number of iterations."""
    tid = cuda.threadIdx.x
    per_block = cuda.blockDim.x // g
    return tid, tid % g, tid // g, cuda.blockIdx.x * per_block, cuda.gridDim.x * per_block


@functools.lru_cache(maxsize=None)
def _group_kernels(dtype):
    """SpMV, SDDMM and row softmax for one value dtype (the shared-memory
    scratch is typed at compile time)."""
    nb_t = from_dtype(np.dtype(dtype))
    val_t = np.dtype(dtype).type

    @cuda.jit(device=True)
    def reduce(sm, tid, lane, g, v, take_max):
        sm[tid] = v
        cuda.syncthreads()
        off = g // 2
        while off > 0:
            if lane < off:
                o = sm[tid + off]
                if take_max:
                    if o > sm[tid] or o != o:
                        sm[tid] = o
                else:
                    sm[tid] += o
            cuda.syncthreads()
            off //= 2
        r = sm[tid - lane]
        cuda.syncthreads()
        return r

    @cuda.jit
    def spmv(data, indices, indptr, x, y, scale, g):
        sm = cuda.shared.array(THREADS, nb_t)
        tid, lane, grp, first, stride = _group_layout(g)
        for base in range(first, y.size, stride):
            r = base + grp
            acc = val_t(0)
            if r < y.size:
                for k in range(indptr[r] + lane, indptr[r + 1], g):
                    acc += data[k] * x[indices[k]]
            s = reduce(sm, tid, lane, g, acc, False)
            if r < y.size and lane == 0:
                y[r] = s * scale

    @cuda.jit
    def sddmm(indices, indptr, X, Y, out, g):
        sm = cuda.shared.array(THREADS, nb_t)
        tid, lane, grp, first, stride = _group_layout(g)
        for base in range(first, out.size, stride):
            k = base + grp
            acc = val_t(0)
            if k < out.size:
                r = _row_of(indptr, k)
                col = indices[k]
                for c in range(lane, X.shape[1], g):
                    acc += X[r, c] * Y[col, c]
            s = reduce(sm, tid, lane, g, acc, False)
            if k < out.size and lane == 0:
                out[k] = s

    @cuda.jit
    def softmax(data, grad, indptr, out, g, backward):
        # forward: out = softmax(data) per row; backward (data = the forward
        # output y): out = y * (grad - sum_row(y * grad))
        sm = cuda.shared.array(THREADS, nb_t)
        tid, lane, grp, first, stride = _group_layout(g)
        nrows = indptr.size - 1
        for base in range(first, nrows, stride):
            r = base + grp
            a = indptr[r] if r < nrows else 0
            b = indptr[r + 1] if r < nrows else 0
            s = val_t(0)
            if backward:
                for k in range(a + lane, b, g):
                    s += data[k] * grad[k]
                s = reduce(sm, tid, lane, g, s, False)
                for k in range(a + lane, b, g):
                    out[k] = data[k] * (grad[k] - s)
            else:
                m = data[a] if a < b else val_t(0)
                for k in range(a + lane, b, g):
                    if data[k] > m or data[k] != data[k]:
                        m = data[k]
                m = reduce(sm, tid, lane, g, m, True)
                for k in range(a + lane, b, g):
                    e = val_t(math.exp(data[k] - m))
                    out[k] = e
                    s += e
                s = reduce(sm, tid, lane, g, s, False)
                for k in range(a + lane, b, g):
                    out[k] /= s

    return spmv, sddmm, softmax


def _groups(n_groups, g):
    blocks, threads = grid_1d(n_groups * g)
    return blocks, threads


def spmv(data, indices, indptr, x, y, scale):
    if y.size == 0:
        return y
    g = group_size(data.size / y.size)
    kern = _group_kernels(y.dtype)[0]
    kern[_groups(y.size, g)](data, indices, indptr, x, y, y.dtype.type(scale), g)
    return y


def sddmm(indices, indptr, X, Y, out):
    if out.size == 0:
        return out
    g = group_size(X.shape[1])
    _group_kernels(out.dtype)[1][_groups(out.size, g)](indices, indptr, X, Y, out, g)
    return out


def _row_softmax(data, grad, indptr, out, backward):
    nrows = indptr.size - 1
    if nrows == 0 or data.size == 0:
        return out
    g = group_size(data.size / nrows)
    _group_kernels(out.dtype)[2][_groups(nrows, g)](data, grad, indptr, out, g, backward)
    return out


def row_softmax(data, indptr, out):
    return _row_softmax(data, data, indptr, out, False)


def row_softmax_backward(y, grad, indptr, out):
    return _row_softmax(y, grad, indptr, out, True)


@cuda.jit
def _spmm(data, indices, indptr, B, C, scale):
    c0, r0 = cuda.grid(2)
    sc, sr = cuda.gridsize(2)
    for r in range(r0, C.shape[0], sr):
        for c in range(c0, C.shape[1], sc):
            acc = scale - scale
            for k in range(indptr[r], indptr[r + 1]):
                acc += data[k] * B[indices[k], c]
            C[r, c] = acc * scale


def spmm(data, indices, indptr, B, C, scale):
    if C.size == 0:
        return C
    tx = min(THREADS, 32)
    ty = THREADS // tx
    n = C.shape[1]
    blocks = (max(1, min((n + tx - 1) // tx, 64)),
              max(1, min((C.shape[0] + ty - 1) // ty, grid_1d(C.shape[0] * 64)[0])))
    _spmm[blocks, (tx, ty)](data, indices, indptr, B, C, C.dtype.type(scale))
    return C


@cuda.jit
def _scale(data, indices, indptr, rs, cs, use_r, use_c, out):
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        v = data[k]
        if use_r:
            v *= rs[_row_of(indptr, k)]
        if use_c:
            v *= cs[indices[k]]
        out[k] = v


def scale(data, indices, indptr, row_scale, col_scale, out):
    if out.size == 0:
        return out
    one = cuda.to_device(np.ones(1, out.dtype))
    _scale[grid_1d(out.size)](data, indices, indptr, one if row_scale is None else row_scale,
                              one if col_scale is None else col_scale,
                              row_scale is not None, col_scale is not None, out)
    return out


@cuda.jit
def _to_dense(data, indices, indptr, out):
    # one thread per row keeps duplicate entries' sums deterministic
    for r in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        for c in range(out.shape[1]):
            out[r, c] = 0
        for k in range(indptr[r], indptr[r + 1]):
            out[r, indices[k]] += data[k]


def to_dense(data, indices, indptr, out):
    if out.shape[0]:
        _to_dense[grid_1d(out.shape[0])](data, indices, indptr, out)
    return out


@cuda.jit
def _permute(src, perm, out, scatter):
    for i in range(cuda.grid(1), perm.size, cuda.gridsize(1)):
        if scatter:
            out[perm[i]] = src[i]
        else:
            out[i] = src[perm[i]]


def gather(src, perm, out):
    if perm.size:
        _permute[grid_1d(perm.size)](src, perm, out, False)
    return out


def scatter(src, perm, out):
    if perm.size:
        _permute[grid_1d(perm.size)](src, perm, out, True)
    return out


_merge_rows = cuda.jit(device=True)(merge_rows)


@cuda.jit
def _add_rows(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, alpha, beta, ptr, data, ind, fill):
    for r in range(cuda.grid(1), a_ptr.size - 1, cuda.gridsize(1)):
        n = _merge_rows(a_data, a_ind, a_ptr[r], a_ptr[r + 1], b_data, b_ind, b_ptr[r],
                        b_ptr[r + 1], alpha, beta, data, ind, ptr[r], fill)
        if not fill:
            ptr[r + 1] = n


def add(a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, alpha, beta):
    """Counts each row's merged length, scans the counts (both on the
    device), reads back the total, then merges."""
    nrows = a_ptr.size - 1
    dt = a_data.dtype.type
    ptr = _zeros(nrows + 1, a_ptr.dtype)
    launch = grid_1d(max(nrows, 1))
    if nrows:
        _add_rows[launch](a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
                          ptr, a_data[:1], a_ind[:1], False)
    _inclusive_scan(ptr)
    nnz = int(ptr[nrows])
    data = cuda.device_array(nnz, a_data.dtype)
    ind = cuda.device_array(nnz, a_ind.dtype)
    if nnz:
        _add_rows[launch](a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
                          ptr, data, ind, True)
    return data, ind, ptr


# ---------------------------------------------------------------------------
# Structure: prefix sums, stable counting sort (transpose), canonical form


@cuda.jit
def _fill(x, v):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = v


def _zeros(n, dtype):
    x = cuda.device_array(n, dtype)
    if n:
        _fill[grid_1d(n)](x, 0)
    return x


@cuda.jit
def _scan_tiles(x, sums):
    # inclusive scan of each THREADS-long tile of x (Hillis-Steele in shared
    # memory, int64 whatever x's dtype); tile totals go to sums. The tile
    # loop does not depend on the thread, so every syncthreads is reached.
    sm = cuda.shared.array(THREADS, int64)
    tid = cuda.threadIdx.x
    for tile in range(cuda.blockIdx.x, sums.size, cuda.gridDim.x):
        i = tile * THREADS + tid
        sm[tid] = x[i] if i < x.size else 0
        cuda.syncthreads()
        off = 1
        while off < THREADS:
            v = sm[tid - off] if tid >= off else 0
            cuda.syncthreads()
            sm[tid] += v
            cuda.syncthreads()
            off *= 2
        if i < x.size:
            x[i] = sm[tid]
        if tid == THREADS - 1:
            sums[tile] = sm[tid]
        cuda.syncthreads()


@cuda.jit
def _add_tile_offsets(x, sums):
    for i in range(cuda.grid(1) + THREADS, x.size, cuda.gridsize(1)):
        x[i] += sums[i // THREADS - 1]


def _inclusive_scan(x):
    """In-place inclusive prefix sum of a 1-D integer device array: tiles of
    one block each, then their totals scanned recursively and added back."""
    n = x.size
    if n < 2:
        return x
    sums = cuda.device_array((n + THREADS - 1) // THREADS, np.int64)
    _scan_tiles[grid_1d(n)](x, sums)
    if sums.size > 1:
        _inclusive_scan(sums)
        _add_tile_offsets[grid_1d(n)](x, sums)
    return x


@cuda.jit
def _expand_rows(indptr, rows):
    # one thread per nonzero (a binary search each) balances long rows
    for k in range(cuda.grid(1), rows.size, cuda.gridsize(1)):
        rows[k] = _row_of(indptr, k)


def expand_rows(indptr, rows):
    """The row of each nonzero (the COO row array), into ``rows``."""
    if rows.size:
        _expand_rows[grid_1d(rows.size)](indptr, rows)
    return rows


_argsort = cuda.jit(device=True)(stable_argsort)
_canonical_count = cuda.jit(device=True)(canonical_count)
_canonical_fill_row = cuda.jit(device=True)(canonical_fill_row)


@cuda.jit
def _count_keys(keys, ptr):
    for k in range(cuda.grid(1), keys.size, cuda.gridsize(1)):
        cuda.atomic.add(ptr, keys[k] + 1, 1)


@cuda.jit
def _scatter_keys(keys, ptr, taken, slot):
    # each item takes a free place of its key (in no fixed order)
    for k in range(cuda.grid(1), keys.size, cuda.gridsize(1)):
        key = keys[k]
        slot[ptr[key] + cuda.atomic.add(taken, key, 1)] = k


@cuda.jit
def _sort_slots(slot, ptr, order, scratch, perm):
    # one thread per key: its items by source position, as a stable sort has them
    for c in range(cuda.grid(1), ptr.size - 1, cuda.gridsize(1)):
        a = ptr[c]
        b = ptr[c + 1]
        _argsort(slot, a, b, order, scratch, a)
        for i in range(a, b):
            perm[i] = slot[order[i]]


def counting_sort(keys, n_keys, ptr, perm):
    """Stable sort of ``keys`` (values in ``[0, n_keys)``): fills ``ptr``
    (``n_keys + 1``, the CSR pointer of the keys) and ``perm`` (source
    position of each sorted item), equal to the CPU kernel's. Temporaries:
    three int64 arrays of ``keys.size``."""
    n = keys.size
    _fill[grid_1d(ptr.size)](ptr, 0)
    if n:
        _count_keys[grid_1d(n)](keys, ptr)
    _inclusive_scan(ptr)
    if n:
        slot = cuda.device_array(n, np.int64)
        order = cuda.device_array(n, np.int64)
        scratch = cuda.device_array(n, np.int64)
        _scatter_keys[grid_1d(n)](keys, ptr, _zeros(n_keys, ptr.dtype), slot)
        _sort_slots[grid_1d(n_keys)](slot, ptr, order, scratch, perm)
    return ptr, perm


@cuda.jit
def _canonical_order(indices, indptr, order, scratch, counts, merge):
    for r in range(cuda.grid(1), indptr.size - 1, cuda.gridsize(1)):
        a = indptr[r]
        b = indptr[r + 1]
        _argsort(indices, a, b, order, scratch, a)
        counts[r + 1] = _canonical_count(indices, a, b, order, merge)
        if r == 0:
            counts[0] = 0


@cuda.jit
def _canonical_fill(data, indices, indptr, order, merge, new_ptr, new_data, new_indices):
    # one thread per row, in sorted order: duplicates add up as on the CPU
    for r in range(cuda.grid(1), indptr.size - 1, cuda.gridsize(1)):
        _canonical_fill_row(r, data, indices, indptr, order, merge, new_ptr, new_data,
                            new_indices)


def canonicalize(data, indices, indptr, merge):
    """Columns sorted within each row (stable); with ``merge`` duplicates
    summed (in sorted order, as on the CPU). Returns new device arrays
    ``(data, indices, indptr)``; with ``merge`` the new nnz is read back to
    size them."""
    nrows = indptr.size - 1
    nnz = indices.size
    ptr = cuda.device_array(nrows + 1, indptr.dtype)
    order = cuda.device_array(max(nnz, 1), np.int64)
    scratch = cuda.device_array(max(nnz, 1), np.int64)
    if nrows:
        _canonical_order[grid_1d(nrows)](indices, indptr, order, scratch, ptr, merge)
    else:
        _fill[grid_1d(1)](ptr, 0)
    _inclusive_scan(ptr)
    new_nnz = int(ptr[nrows]) if merge else nnz
    new_data = cuda.device_array(new_nnz, data.dtype)
    new_indices = cuda.device_array(new_nnz, indices.dtype)
    if new_nnz:
        _canonical_fill[grid_1d(nrows)](data, indices, indptr, order, merge, ptr, new_data,
                                        new_indices)
    return new_data, new_indices, ptr


@cuda.jit
def _find_unsorted(indices, indptr, flag):
    # flag[0] = 1 when some nonzero does not follow a smaller column of its row
    for k in range(cuda.grid(1) + 1, indices.size, cuda.gridsize(1)):
        if indices[k] <= indices[k - 1] and indptr[_row_of(indptr, k)] != k:
            flag[0] = 1


def is_canonical(indices, indptr):
    """True when every row's columns are strictly increasing (one flag read
    back)."""
    if indices.size < 2:
        return True
    flag = _zeros(1, np.int32)
    _find_unsorted[grid_1d(indices.size)](indices, indptr, flag)
    return not flag[0]


@cuda.jit
def _row_lengths(indptr, out):
    for r in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[r] = indptr[r + 1] - indptr[r]


def row_lengths(indptr, out):
    """``out[r] = indptr[r + 1] - indptr[r]`` (out int64)."""
    if out.size:
        _row_lengths[grid_1d(out.size)](indptr, out)
    return out


@cuda.jit
def _first_bad(indices, indptr, n_cols, found):
    # found[0]: first row whose pointer decreases; found[1]: first column
    # index out of range (atomic minima, left at their start when none)
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for r in range(start, indptr.size - 1, step):
        if indptr[r + 1] < indptr[r]:
            cuda.atomic.min(found, 0, r)
    for k in range(start, indices.size, step):
        if indices[k] < 0 or indices[k] >= n_cols:
            cuda.atomic.min(found, 1, k)


def check_structure(indices, indptr, n_cols):
    """See :func:`nbops.sparse.cpu.check_structure`; two scalars read back
    (the row of a bad index, on that error path only, from a host copy)."""
    none = np.iinfo(np.int64).max
    found = cuda.device_array(2, np.int64)
    _fill[grid_1d(2)](found, none)
    _first_bad[grid_1d(max(indices.size, indptr.size))](indices, indptr, n_cols, found)
    r, k = int(found[0]), int(found[1])
    r = -1 if r == none else r
    if k == none:
        return r, -1, -1
    return r, k, int(np.searchsorted(indptr.copy_to_host(), k, side="right") - 1)


@cuda.jit
def _count_nonzero(a, ptr):
    # one thread per row: ptr[r + 1] = entries of row r that are not zero (NaN is not)
    for r in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        c = 0
        for j in range(a.shape[1]):
            if a[r, j] != 0:
                c += 1
        ptr[r + 1] = c
        if r == 0:
            ptr[0] = 0


@cuda.jit
def _take_nonzero(a, ptr, data, indices):
    for r in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        p = ptr[r]
        for j in range(a.shape[1]):
            if a[r, j] != 0:
                data[p] = a[r, j]
                indices[p] = j
                p += 1


def from_dense(a, index_dtype):
    """See :func:`nbops.sparse.cpu.from_dense`: counts per row, a device
    scan, then the copy; the nnz is read back to size the arrays."""
    rows = a.shape[0]
    ptr = cuda.device_array(rows + 1, index_dtype)
    if rows:
        _count_nonzero[grid_1d(rows)](a, ptr)
    else:
        _fill[grid_1d(1)](ptr, 0)
    _inclusive_scan(ptr)
    nnz = int(ptr[rows])
    data = cuda.device_array(nnz, a.dtype)
    indices = cuda.device_array(nnz, index_dtype)
    if nnz:
        _take_nonzero[grid_1d(rows)](a, ptr, data, indices)
    return data, indices, ptr


@cuda.jit
def _inv_sqrt(x, one, out):
    # one: 1 in x's dtype, so float32 divides in float32 as NumPy does
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = x[i]
        if v > 0:
            out[i] = one / math.sqrt(v)
        else:
            out[i] = 0


def inv_sqrt(x, out):
    """See :func:`nbops.sparse.cpu.inv_sqrt`."""
    if x.size:
        _inv_sqrt[grid_1d(x.size)](x, x.dtype.type(1), out)
    return out


@cuda.jit
def _dequantize(data, scale, out):
    for i in range(cuda.grid(1), data.size, cuda.gridsize(1)):
        out[i] = np.float32(data[i]) * scale


def dequantize(data, scale, out):
    """See :func:`nbops.sparse.cpu.dequantize`."""
    if data.size:
        _dequantize[grid_1d(data.size)](data, np.float32(scale), out)
    return out
