"""CUDA kernels of the CSR operators (:mod:`nbops.sparse`).

* SpMV, row softmax: a *group* of ``g`` threads per row (``g`` a power of
  two from 1 to 32 sized to the average row length, so short rows do not
  leave most of a warp idle), lanes striding over the row's nonzeros and
  reducing through shared memory (the simulator has no warp shuffles).
* SpMM: one thread per (row, dense column), consecutive threads on
  consecutive columns, so every read of B and write of C is coalesced; the
  row's values and column indices are broadcast reads.
* SDDMM: a group per nonzero, lanes over the feature dimension.
* Structure (transpose, canonical form, COO) is built on the host by the
  public module; only ``add`` has device kernels here.

Group loops run the same trip count in every thread of a block (rows past
the end compute nothing), so the ``syncthreads`` inside the reductions are
reached by all threads.
"""

import functools
import math

import numpy as np
from numba import cuda, from_dtype

from .._scalars import merge_rows
from ..cuda._launch import THREADS, grid_1d

__all__ = ["spmv", "spmm", "sddmm", "row_softmax", "row_softmax_backward", "scale",
           "to_dense", "gather", "scatter", "add", "group_size"]


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
    """Counts each row's merged length on the device, scans the counts on
    the host, then merges."""
    nrows = a_ptr.size - 1
    dt = a_data.dtype.type
    ptr = cuda.to_device(np.zeros(nrows + 1, a_ptr.dtype))
    launch = grid_1d(max(nrows, 1))
    if nrows:
        _add_rows[launch](a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
                          ptr, a_data[:1], a_ind[:1], False)
    host_ptr = np.cumsum(ptr.copy_to_host()).astype(a_ptr.dtype)
    nnz = int(host_ptr[-1])
    data = cuda.device_array(nnz, a_data.dtype)
    ind = cuda.device_array(nnz, a_ind.dtype)
    ptr = cuda.to_device(host_ptr)
    if nnz:
        _add_rows[launch](a_data, a_ind, a_ptr, b_data, b_ind, b_ptr, dt(alpha), dt(beta),
                          ptr, data, ind, True)
    return data, ind, ptr
