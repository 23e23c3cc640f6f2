"""Benchmark cases of the CSR operators (:mod:`nbops.sparse`) beside
scipy.sparse and NumPy.

``CASES`` (for ``python -m nbops bench`` and the demo) build a square
matrix with ``PER_ROW`` random columns in every row, int32 indices, values
of the case's dtype, its size from the harness' element count ``n``: SpMV
has ``n`` nonzeros, SpMM and SDDMM have dense operands of ``n`` elements
(``WIDTH`` columns). The baselines are what a user without nbops writes:
``scipy.sparse.csr_array(...) @ x`` (single-threaded, its result copied
into ``out``: scipy has no output argument) and, for SDDMM, which scipy
lacks, NumPy's gather of both factors' rows and a row-wise dot product.

The issue's comparison on 1M x 1M matrices, uniform and power-law, with
GB/s of useful traffic against a copy, is ``tools/bench_sparse.py`` (asv:
``benchmarks/bench_sparse.py``).
"""

import numpy as np

import nbops

from .harness import Case

PER_ROW = 16
WIDTH = 64


def _matrix(m, dtype, rng):
    """Values, column indices and row pointers of an m x m CSR matrix."""
    indices = rng.integers(0, m, m * PER_ROW, dtype=np.int32)
    indptr = np.arange(m + 1, dtype=np.int32) * PER_ROW
    return rng.standard_normal(indices.size).astype(dtype), indices, indptr


def _setup_mv(n, dtype, rng):
    m = max(8, n // PER_ROW)
    return _matrix(m, dtype, rng) + (rng.standard_normal(m).astype(dtype),)


def _setup_mm(n, dtype, rng):
    m = max(8, n // WIDTH)
    return _matrix(m, dtype, rng) + (rng.standard_normal((m, WIDTH)).astype(dtype),)


def _setup_sddmm(n, dtype, rng):
    m = max(8, n // WIDTH)
    _, indices, indptr = _matrix(m, dtype, rng)
    return (indices, indptr) + tuple(rng.standard_normal((m, WIDTH)).astype(dtype)
                                     for _ in range(2))


def _index(a):
    # the harness evaluates references on float64 copies of every input
    return a if a.dtype.kind in "iu" else a.astype(np.int64)


def _scipy(data, indices, indptr, cols):
    import scipy.sparse as sp

    return sp.csr_array((data, _index(indices), _index(indptr)),
                        shape=(indptr.shape[0] - 1, cols))


def _shape(indptr, dense):
    return (indptr.shape[0] - 1, dense.shape[0])


def spmv_nbops(data, indices, indptr, x, out):
    return nbops.sparse.mv_values(data, indices, indptr, _shape(indptr, x), x, out=out)


def spmv_scipy(data, indices, indptr, x, out):
    out[...] = _scipy(data, indices, indptr, x.shape[0]) @ x
    return out


def spmm_nbops(data, indices, indptr, B, out):
    return nbops.sparse.mm_values(data, indices, indptr, _shape(indptr, B), B, out=out)


def spmm_scipy(data, indices, indptr, B, out):
    out[...] = _scipy(data, indices, indptr, B.shape[0]) @ B
    return out


def sddmm_nbops(indices, indptr, X, Y, out):
    return nbops.sparse.sddmm_values(indices, indptr, _shape(indptr, Y), X, Y, out=out)


def sddmm_numpy(indices, indptr, X, Y, out):
    indices, indptr = _index(indices), _index(indptr)
    rows = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return np.einsum("ij,ij->i", X[rows], Y[indices], out=out)


def _rows_out(inputs):
    return (inputs[2].shape[0] - 1,) + inputs[3].shape[1:], inputs[3].dtype


def _sddmm_out(inputs):
    return (inputs[0].shape[0],), inputs[2].dtype


def _product_flops(inputs):
    return 2 * inputs[0].shape[0] * WIDTH


CASES = [
    Case("sparse_mv", _setup_mv, spmv_nbops, spmv_scipy, out_like=_rows_out,
         baseline_name="scipy.sparse", tol=(1e-5, 1e-12)),
    Case("sparse_mm", _setup_mm, spmm_nbops, spmm_scipy, out_like=_rows_out,
         flops=_product_flops, baseline_name="scipy.sparse", tol=(1e-5, 1e-12)),
    Case("sparse_sddmm", _setup_sddmm, sddmm_nbops, sddmm_numpy, out_like=_sddmm_out,
         flops=_product_flops, baseline_name="numpy gather + dot", tol=(1e-5, 1e-12)),
]
