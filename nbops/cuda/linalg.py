"""CUDA kernel of matmul / bmm / linear: shared-memory tiled GEMM.

Each block computes a BM x BN tile of one batch matrix of C; per k step it
stages a BM x BK tile of A and a BK x BN tile of B in shared memory and
each of its (BN/RN) x (BM/RM) threads accumulates an RM x RN register tile
(rows ``ty + i*TY``, columns ``tx + j*TX``: neighbouring threads own
neighbouring columns, so the stores of C coalesce). Staging walks each
tile along whichever axis is unit-stride in memory, so row-major and
transposed operands both load coalesced. Every load and store is bounds
checked: any m, n, k (0 included). The batch runs through the grid's third
dimension (grid-stride, so any batch count fits). The epilogue (bias, then
an activation chosen by code, ``nbops._formulas.EPILOGUES``) is applied to the
register tile before it is stored.

Operands have the CPU kernel's form: flat buffers, element strides and
per-batch element offsets.
"""

import math

import numpy as np
from numba import cuda, float32, float64

from .._codegen import generated
from .._formulas import epilogue_source
from ._launch import SIMULATED
from .activations import _DEVICE

__all__ = ["gemm"]

#: Tile sizes. The simulator runs one OS thread per CUDA thread: tiny
#: tiles there (and tests cross their edges with small matrices).
BM, BN, BK, RM, RN = (8, 8, 4, 2, 2) if SIMULATED else (64, 64, 16, 4, 4)
TX, TY = BN // RN, BM // RM
#: Most blocks along the batch axis; the kernel strides over the rest.
MAX_GRID_Z = 4 if SIMULATED else 65535

_apply_epilogue = cuda.jit(device=True)(
    generated(epilogue_source(), "apply_epilogue", dict(_DEVICE), __name__))


@cuda.jit(device=True)
def _stage(tile, buf, off, s_outer, s_k, outer0, outer_n, width, k0, k, tid, zero):
    """tile[kk, o] = operand[outer0 + o, k0 + kk] (zero outside), loaded by
    the whole block; consecutive threads take consecutive k when k is the
    unit-stride axis (row-major A, transposed B), else consecutive o, so
    global loads coalesce either way."""
    k_fastest = s_k == 1 and s_outer != 1
    for e in range(tid, width * BK, TX * TY):
        if k_fastest:
            o = e // BK
            kk = e - o * BK
        else:
            kk = e // width
            o = e - kk * width
        r = outer0 + o
        kx = k0 + kk
        tile[kk, o] = buf[off + r * s_outer + kx * s_k] if r < outer_n and kx < k else zero


def _make_kernel(nbtype):
    @cuda.jit
    def gemm_kernel(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, bias, act,
                    prm, cst):
        a_tile = cuda.shared.array((BK, BM), nbtype)
        b_tile = cuda.shared.array((BK, BN), nbtype)
        acc = cuda.local.array((RM, RN), nbtype)
        a_reg = cuda.local.array(RM, nbtype)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * TX + tx
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        zero = cst.zero
        for bi in range(cuda.blockIdx.z, out.shape[0], cuda.gridDim.z):
            oa = offa[bi]
            ob = offb[bi]
            for i in range(RM):
                for j in range(RN):
                    acc[i, j] = zero
            for k0 in range(0, k, BK):
                _stage(a_tile, abuf, oa, sam, sak, row0, m, BM, k0, k, tid, zero)
                _stage(b_tile, bbuf, ob, sbn, sbk, col0, n, BN, k0, k, tid, zero)
                cuda.syncthreads()
                for kk in range(BK):
                    for i in range(RM):
                        a_reg[i] = a_tile[kk, ty + i * TY]
                    for j in range(RN):
                        bv = b_tile[kk, tx + j * TX]
                        for i in range(RM):
                            acc[i, j] += a_reg[i] * bv
                cuda.syncthreads()
            for i in range(RM):
                r = row0 + ty + i * TY
                if r < m:
                    for j in range(RN):
                        c = col0 + tx + j * TX
                        if c < n:
                            v = acc[i, j]
                            if bias.size > 0:
                                v += bias[c]
                            out[bi, r, c] = _apply_epilogue(v, act, prm, cst)

    return gemm_kernel


_KERNELS = {np.dtype(np.float32): _make_kernel(float32),
            np.dtype(np.float64): _make_kernel(float64)}


def gemm(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, bias, act, prm, cst):
    """``out[b] = epilogue(A_b @ B_b + bias)``; arguments as the CPU kernel's
    (``offa``/``offb`` are host arrays, copied to the device here)."""
    if out.size == 0:
        return out
    blocks = (math.ceil(n / BN), math.ceil(m / BM), min(out.shape[0], MAX_GRID_Z))
    _KERNELS[np.dtype(out.dtype)][blocks, (TX, TY)](
        abuf, cuda.to_device(offa), sam, sak, bbuf, cuda.to_device(offb), sbk, sbn, out,
        m, n, k, bias, act, prm, cst)
    return out
