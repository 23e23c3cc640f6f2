"""The BLAS route of the CPU GEMM: SciPy's OpenBLAS ``?gemm``, called from a
parallel Numba kernel, one single-threaded call per block of C.

Imported only when the autotuner picks the BLAS route (or ``impl="blas"``):
making Numba's BLAS binding imports ``scipy.linalg.cython_blas``.

Why not ``np.dot`` on row blocks (the first version): BLAS takes leading
dimensions and transpose flags, so a transposed or sliced operand with one
unit stride is passed as it lies, never copied; and C can be split over
its columns, where each call then packs a slice of B instead of all of it
(B is the larger operand of a linear layer's product): column halves ran
level with NumPy's own threaded BLAS, row halves behind it
(docs/benchmarks.md).
"""

import numpy as np
from numba import prange, types
from numba.np.linalg import _BLAS

from .._codegen import bind
from .._jit import serial_and_parallel
from .._tunables import BLAS_SERIAL_FLOPS as SERIAL_FLOPS
from .linalg import _epilogue_tile

# numba_xxgemm(kind, transa, transb, m, n, k, *alpha, *a, lda, *b, ldb, *beta, *c, ldc):
# Numba's C helper over scipy.linalg.cython_blas, Fortran (column-major) order.
# It is a symbol of Numba's own helper library, so kernels calling it cache.
_xxgemm32 = _BLAS().numba_xxgemm(types.float32)
_xxgemm64 = _BLAS().numba_xxgemm(types.float64)

_N, _T = ord("n"), ord("t")


def gemm_blocks(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, split_cols,
                blocks, bias, act, prm, cst):
    """``out[i] = act(A_i @ B_i + bias)`` for every batch ``i``, C split into
    ``blocks`` bands of columns (``split_cols``) or rows, one BLAS call per
    band spread over Numba's threads, each band finished by the GEMM
    epilogue while it is in cache. ``out`` is a C-contiguous
    (batch, m, n) array. Returns False, computing nothing, when an operand
    has no layout BLAS takes (see :func:`blas_layout`)."""
    la = blas_layout(m, k, sam, sak)
    lb = blas_layout(k, n, sbk, sbn)
    if la is None or lb is None:
        return False
    if 2 * m * n * k * offa.size < SERIAL_FLOPS:
        blocks = 1
    kernel = _KERNELS[(out.dtype == np.float32, blocks > 1)]
    kernel(abuf, offa, sam, *la, bbuf, offb, sbn, *lb, out.reshape(-1), m, n, k,
           split_cols, blocks, bias, act, prm, cst)
    return True


def blas_layout(rows, cols, srow, scol):
    """``(trans, ld)`` passing a row-major ``rows x cols`` operand with these
    element strides to column-major BLAS, or None if it has none.

    Row-major X is column-major X^T: an operand with unit column stride goes
    as it is ('n', ld = row stride), one with unit row stride transposed
    ('t', ld = column stride). BLAS wants ld >= the leading extent, and a
    stride along an axis of length 1 is arbitrary, so it is replaced."""
    if scol == 1 and (srow >= cols or rows == 1):
        return _N, srow if rows > 1 else max(cols, 1)
    if srow == 1 and (scol >= rows or cols == 1):
        return _T, scol if cols > 1 else max(rows, 1)
    return None


def _blocks_template(abuf, offa, sam, ta, lda, bbuf, offb, sbn, tb, ldb, outf, m, n, k,
                     split_cols, blocks, bias, act, prm, cst):
    # Row-major C = A B is column-major C^T = B^T A^T: BLAS's "A" is our B.
    nbatch = offa.size
    for task in prange(nbatch * blocks):
        i = task // blocks
        blk = task - i * blocks
        alpha = np.ones(1, outf.dtype)
        beta = np.zeros(1, outf.dtype)
        if split_cols:
            r0, r1 = 0, m
            c0, c1 = blk * n // blocks, (blk + 1) * n // blocks
        else:
            r0, r1 = blk * m // blocks, (blk + 1) * m // blocks
            c0, c1 = 0, n
        if r1 > r0 and c1 > c0:
            coff = i * m * n + r0 * n + c0
            XXGEMM(KIND, tb, ta, c1 - c0, r1 - r0, k, alpha.ctypes,
                   bbuf[offb[i] + c0 * sbn:].ctypes, ldb,
                   abuf[offa[i] + r0 * sam:].ctypes, lda, beta.ctypes,
                   outf[coff:].ctypes, n)
            if act != 0 or bias.size > 0:
                _epilogue_tile(outf, coff, n, r1 - r0, c1 - c0, bias, c0, act, prm, cst)


def _instances(xxgemm, kind, suffix):
    """(serial, parallel) kernels of the template for one BLAS kind."""
    scope = dict(globals(), XXGEMM=xxgemm, KIND=ord(kind))
    fn = bind(_blocks_template, scope, "gemm_blocks_" + suffix)
    return serial_and_parallel(fn, "gemm_blocks_" + suffix)


_KERNELS = {}
for _is32, _args in ((True, (_xxgemm32, "s", "f32")), (False, (_xxgemm64, "d", "f64"))):
    _KERNELS[(_is32, False)], _KERNELS[(_is32, True)] = _instances(*_args)
del _is32, _args
