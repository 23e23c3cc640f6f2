"""Benchmark cases of the CSR operators (declared in the specs of
:mod:`nbops.sparse`) beside scipy.sparse and NumPy.

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

import nbops.sparse

from .harness import spec_cases

PER_ROW = 16
WIDTH = 64


def _matrix(m, dtype, rng):
    """Values, column indices and row pointers of an m x m CSR matrix."""
    indices = rng.integers(0, m, m * PER_ROW, dtype=np.int32)
    indptr = np.arange(m + 1, dtype=np.int32) * PER_ROW
    return rng.standard_normal(indices.size).astype(dtype), indices, indptr


# setups return the operators' positional arguments: the CSR arrays, the
# shape, the dense operands
def setup_mv(n, dtype, rng):
    m = max(8, n // PER_ROW)
    return _matrix(m, dtype, rng) + ((m, m), rng.standard_normal(m).astype(dtype))


def setup_mm(n, dtype, rng):
    m = max(8, n // WIDTH)
    return _matrix(m, dtype, rng) + ((m, m), rng.standard_normal((m, WIDTH)).astype(dtype))


def setup_sddmm(n, dtype, rng):
    m = max(8, n // WIDTH)
    _, indices, indptr = _matrix(m, dtype, rng)
    return (indices, indptr, (m, m)) + tuple(rng.standard_normal((m, WIDTH)).astype(dtype)
                                             for _ in range(2))


def _index(a):
    # the harness evaluates references on float64 copies of every input
    return a if a.dtype.kind in "iu" else a.astype(np.int64)


def _scipy(data, indices, indptr, shape):
    import scipy.sparse as sp

    return sp.csr_array((data, _index(indices), _index(indptr)), shape=shape)


def spmv_scipy(data, indices, indptr, shape, x, out):
    out[...] = _scipy(data, indices, indptr, shape) @ x
    return out


def spmm_scipy(data, indices, indptr, shape, B, out):
    out[...] = _scipy(data, indices, indptr, shape) @ B
    return out


def sddmm_numpy(indices, indptr, shape, X, Y, out):
    indices, indptr = _index(indices), _index(indptr)
    rows = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return np.einsum("ij,ij->i", X[rows], Y[indices], out=out)


def rows_out(inputs):
    return (inputs[3][0],) + inputs[4].shape[1:], inputs[4].dtype


def sddmm_out(inputs):
    return (inputs[0].shape[0],), inputs[3].dtype


def product_flops(inputs):
    return 2 * inputs[0].shape[0] * WIDTH


# one case per Bench entry of the specs (nbops/sparse/__init__.py)
CASES = spec_cases(nbops.sparse.SPECS.values(), None)
