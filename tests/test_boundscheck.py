"""Kernels run with Numba's bounds checks on.

Numba does not check indices in compiled code: a wrong index reads or
writes memory silently. ``NUMBA_BOUNDSCHECK=1`` compiles every kernel with
checks (an IndexError instead), but it must be set before numba compiles
anything, and machine code compiled with it must not land in the tree's
cache. So the test here runs one subprocess with the variable set and a
cache directory of its own (``NBOPS_BOUNDSCHECK_CACHE``, default
``/tmp/nbops-bc``), which runs (after a check that bounds checks are on):

* the CSR kernels on malformed-but-valid matrices (no rows, no columns, no
  nonzeros, every nonzero in the first or the last row, repeated columns,
  one full row), against per-entry references;
* the fuzz table's rows of a curated set of families (small shapes that
  cross every block edge, strided and zero-stride views, 0 and 1 sizes),
  the quantized ones among them: the int8 GEMM (packed and raw operands,
  the 8 x 32 tile's partial edges, k not a multiple of four) and QLinearConv.
  The neuron backward rows are left out: their finite differences make them
  nine minutes bounds-checked, past the subprocess's limit in CI.

A first run compiles those kernels again with checks (about two CPU
minutes); later runs load them from that cache. The whole kernel suite
under bounds checks was run once by hand: docs/reliability.md.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: fuzz families run bounds-checked in CI (kernels with index arithmetic of
#: their own: windows, rows, CSR pointers, and the int8 GEMM family's packing,
#: tiles and im2col; the float GEMM and conv are in the one-off run)
FAMILIES = ("sparse", "pooling", "softmax", "normalization", "tensor", "neuromorphic",
            "quant")

#: the subprocess: the checks below, then the fuzz rows of FAMILIES
_CHILD = f"""
import sys
import pytest
import test_boundscheck as t
t.bounds_checks_are_on()
for index_dtype in ("int32", "int64"):
    t.csr_kernels_on_edge_matrices(index_dtype)
print("edge matrices: ok", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "test_fuzz.py", "-k",
                      "test_fuzz and not _backward and "
                      "({' or '.join(f + '-' for f in FAMILIES)})"]))
"""


def test_kernels_stay_in_bounds():
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NBOPS_AUTOTUNE="0",
               NUMBA_CACHE_DIR=os.environ.get("NBOPS_BOUNDSCHECK_CACHE", "/tmp/nbops-bc"))
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "edge matrices: ok" in proc.stdout and " passed" in proc.stdout, proc.stdout


def bounds_checks_are_on():
    """The subprocess really checks: an index one past the end raises."""
    from numba import njit

    @njit
    def read(a, i):
        return a[i]

    try:
        read(np.zeros(3), 3)
    except IndexError:
        return
    raise AssertionError("NUMBA_BOUNDSCHECK=1 did not turn bounds checks on")


def _matrices():
    """(name, data, indices, indptr, shape) of edge-case CSR matrices."""
    r = np.random.default_rng(7)
    out = [("no rows", [], [], [0], (0, 3)),
           ("no columns", [], [], [0, 0, 0], (2, 0)),
           ("no nonzeros", [], [], [0] * 5, (4, 5))]
    for where in ("first", "last"):
        n = 9
        ptr = [0, n, n, n, n] if where == "first" else [0, 0, 0, 0, n]
        out.append((f"every nonzero in the {where} row", r.standard_normal(n),
                    r.integers(0, 6, n), ptr, (4, 6)))
    out.append(("repeated columns", r.standard_normal(6), [2, 2, 0, 2, 1, 1],
                [0, 4, 4, 6], (3, 3)))
    out.append(("one full row, last column last", r.standard_normal(18),
                list(range(17)) + [16], [0, 0, 17, 18], (3, 17)))
    return out


def csr_kernels_on_edge_matrices(index_dtype):
    """Every CSR kernel on each matrix of :func:`_matrices`, against
    per-entry references."""
    import nbops.sparse as S

    r = np.random.default_rng(3)
    for name, data, ind, ptr, shape in _matrices():
        data = np.asarray(data, np.float64)
        ind, ptr = np.asarray(ind, index_dtype), np.asarray(ptr, index_dtype)
        A = S.CSRMatrix(data, ind, ptr, shape)
        rows = np.repeat(np.arange(shape[0]), np.diff(ptr))
        dense = np.zeros(shape)
        np.add.at(dense, (rows, ind), data)
        x = r.standard_normal(shape[1])
        B = r.standard_normal((shape[1], 17))
        X, Y = r.standard_normal((shape[0], 9)), r.standard_normal((shape[1], 9))
        np.testing.assert_allclose(S.mv(A, x), dense @ x, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(S.mm(A, B), dense @ B, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(S.to_dense(A), dense, err_msg=name)
        np.testing.assert_allclose(S.to_dense(A.T), dense.T, err_msg=name)
        np.testing.assert_allclose(S.to_dense(S.add(A, A, 1.0, 2.0)), 3 * dense, atol=1e-12,
                                   err_msg=name)
        np.testing.assert_allclose(S.to_dense(S.scale_rows(A, np.arange(shape[0]) + 1.0)),
                                   dense * (np.arange(shape[0]) + 1.0)[:, None], err_msg=name)
        np.testing.assert_allclose(S.to_dense(S.scale_columns(A, np.arange(shape[1]) + 1.0)),
                                   dense * (np.arange(shape[1]) + 1.0), err_msg=name)
        sd = S.sddmm(A, X, Y)
        np.testing.assert_allclose(sd.data, np.einsum("ij,ij->i", X[rows], Y[ind]),
                                   atol=1e-12, err_msg=name)
        sm = S.softmax(A).data
        for i in range(shape[0]):
            seg = data[ptr[i]:ptr[i + 1]]
            if seg.size:
                e = np.exp(seg - seg.max())
                np.testing.assert_allclose(sm[ptr[i]:ptr[i + 1]], e / e.sum(), err_msg=name)
        if shape[0] == shape[1] and shape[0]:
            S.gcn_norm(A)   # square: normalisation walks rows and columns
