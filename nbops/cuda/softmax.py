"""CUDA kernels of softmax and log_softmax, forward and backward, on the
``(outer, n, inner)`` view of ``nbops/cpu/softmax.py``.

* ``inner == 1``: one block per row (grid-stride over rows). Threads stride
  along the row; the maximum and the sum are block reductions in shared
  memory (a tree over ``ROW_THREADS`` partial values). Three sweeps of the row:
  max, sum of exponentials, write.
* ``inner > 1``: one thread per column ``(o, j)``, walking the ``n``
  elements of its column; adjacent threads read adjacent addresses, so
  every sweep is coalesced.

Sums accumulate in float64; ``exp`` and ``log`` are CUDA's (libdevice).
"""

import math

from numba import cuda, float64

from ._launch import SIMULATED, THREADS, grid_1d

__all__ = ["softmax", "softmax_backward"]

#: Threads of a row block. The simulator runs each as a Python thread and
#: every barrier of the reductions switches between all of them: 8 there
#: (tests still cross block-width boundaries with rows of 20+ elements).
ROW_THREADS = 8 if SIMULATED else THREADS


def softmax(x3, out3, log):
    outer, n, inner = x3.shape
    if inner == 1:
        _forward_rows[_row_grid(outer)](x3, out3, log)
    else:
        _forward_cols[grid_1d(outer * inner)](x3, out3, log)
    return out3


def softmax_backward(g3, y3, out3, log):
    outer, n, inner = y3.shape
    if inner == 1:
        _backward_rows[_row_grid(outer)](g3, y3, out3, log)
    else:
        _backward_cols[grid_1d(outer * inner)](g3, y3, out3, log)
    return out3


def _row_grid(rows):
    blocks, _ = grid_1d(rows * ROW_THREADS, ROW_THREADS)
    return blocks, ROW_THREADS


@cuda.jit(device=True, inline=True)
def _block_reduce(buf, value, is_max):
    """Max (``is_max``) or sum of ``value`` over the block, in every thread."""
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    step = ROW_THREADS // 2
    while step > 0:
        if tid < step:
            a = buf[tid]
            b = buf[tid + step]
            buf[tid] = (a if a > b else b) if is_max else a + b
        cuda.syncthreads()
        step //= 2
    result = buf[0]
    cuda.syncthreads()  # buf is reused by the next reduction
    return result


@cuda.jit
def _forward_rows(x, out, log):
    buf = cuda.shared.array(ROW_THREADS, float64)
    n = x.shape[1]
    tid = cuda.threadIdx.x
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        m = -math.inf
        for j in range(tid, n, ROW_THREADS):
            v = x[r, j, 0]
            m = v if v > m else m
        m = _block_reduce(buf, m, True)
        s = 0.0
        for j in range(tid, n, ROW_THREADS):
            s += math.exp(x[r, j, 0] - m)
        s = _block_reduce(buf, s, False)
        c = math.log(s)
        inv = 1.0 / s
        for j in range(tid, n, ROW_THREADS):
            v = x[r, j, 0]
            out[r, j, 0] = (v - m) - c if log else math.exp(v - m) * inv


@cuda.jit
def _backward_rows(g, y, out, log):
    buf = cuda.shared.array(ROW_THREADS, float64)
    n = y.shape[1]
    tid = cuda.threadIdx.x
    for r in range(cuda.blockIdx.x, y.shape[0], cuda.gridDim.x):
        s = 0.0
        for j in range(tid, n, ROW_THREADS):
            s += g[r, j, 0] if log else g[r, j, 0] * y[r, j, 0]
        s = _block_reduce(buf, s, False)
        for j in range(tid, n, ROW_THREADS):
            gv = g[r, j, 0]
            yv = y[r, j, 0]
            out[r, j, 0] = gv - math.exp(yv) * s if log else yv * (gv - s)


@cuda.jit
def _forward_cols(x, out, log):
    n, inner = x.shape[1], x.shape[2]
    for k in range(cuda.grid(1), x.shape[0] * inner, cuda.gridsize(1)):
        o = k // inner
        j = k - o * inner
        m = -math.inf
        for i in range(n):
            v = x[o, i, j]
            m = v if v > m else m
        s = 0.0
        for i in range(n):
            s += math.exp(x[o, i, j] - m)
        c = math.log(s)
        inv = 1.0 / s
        for i in range(n):
            v = x[o, i, j]
            out[o, i, j] = (v - m) - c if log else math.exp(v - m) * inv


@cuda.jit
def _backward_cols(g, y, out, log):
    n, inner = y.shape[1], y.shape[2]
    for k in range(cuda.grid(1), y.shape[0] * inner, cuda.gridsize(1)):
        o = k // inner
        j = k - o * inner
        s = 0.0
        for i in range(n):
            s += g[o, i, j] if log else g[o, i, j] * y[o, i, j]
        for i in range(n):
            gv = g[o, i, j]
            yv = y[o, i, j]
            out[o, i, j] = gv - math.exp(yv) * s if log else yv * (gv - s)
