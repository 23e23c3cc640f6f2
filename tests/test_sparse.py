"""CSR sparse: what the op table (test_ops.py, with the specs of
nbops/sparse/__init__.py and the references ref_* here) cannot say: the
CSRMatrix type (construction, validation, conversions, structure
operations on both devices), the matrix-level functions against
scipy.sparse on matrices with empty rows, one dense row holding most of the
nonzeros, an empty matrix, duplicates and unsorted columns, long rows split
across chunks, aligned copies and streamed outputs, composite gradients
(transposes, graph attention) and gradients on the device, GraphConv
against dense NumPy, and the errors of the matrix-level functions."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

import nbops
from helpers import check_bench_case, host, to_dev
from nbops import sparse
from nbops.autograd import gradcheck

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}
INDEX = [np.int32, np.int64]
VALUES = [np.float32, np.float64]


def random_csr(m, n, density, dtype=np.float64, index=np.int64, seed=0, kind="uniform"):
    """A scipy CSR matrix: ``uniform`` random, ``skewed`` (one row holds most
    of the nonzeros, the others are sparse with empty rows), or ``messy``
    (unsorted columns and duplicates, not canonical)."""
    rng = np.random.default_rng(seed)
    if kind == "messy":
        nnz = int(m * n * density) + 3
        rows = rng.integers(0, m, nnz)
        cols = rng.integers(0, n, nnz)
        order = np.argsort(rows, kind="stable")
        rows, cols = rows[order], cols[order]
        ptr = np.zeros(m + 1, index)
        np.cumsum(np.bincount(rows, minlength=m), out=ptr[1:])
        S = sp.csr_array((rng.standard_normal(nnz).astype(dtype), cols.astype(index), ptr),
                         shape=(m, n))
        assert not S.has_canonical_format
        return S
    S = sp.random_array((m, n), density=density, format="lil", dtype=dtype, rng=rng)
    if kind == "skewed" and m > 2:
        S[m // 2, :] = rng.standard_normal(n).astype(dtype)
        S[::3, :] = 0
        S[m // 2, :] = rng.standard_normal(n).astype(dtype)
    S = S.tocsr()
    return sp.csr_array((S.data.astype(dtype), S.indices.astype(index),
                         S.indptr.astype(index)), shape=(m, n))


CASES = [  # (m, n, density, kind)
    (0, 0, 0.0, "uniform"), (0, 7, 0.0, "uniform"), (6, 0, 0.0, "uniform"),
    (5, 4, 0.0, "uniform"), (1, 1, 1.0, "uniform"), (37, 29, 0.1, "uniform"),
    (300, 170, 0.02, "skewed"), (41, 23, 0.15, "messy"),
]
CASE_IDS = [f"{m}x{n}-{k}" for m, n, _, k in CASES]
CUDA_CASES = [(0, 3, 0.0, "uniform"), (9, 7, 0.3, "skewed"), (11, 6, 0.3, "messy")]


def _close(got, want, dtype):
    np.testing.assert_allclose(host(got), want, **TOL[dtype])


def _mat(S, device="cpu"):
    A = sparse.from_scipy(S)
    return A.to_device() if device == "cuda" else A


def _cases(device):
    return CASES if device == "cpu" else CUDA_CASES


# ---------------------------------------------------------------------------
# References of the op table (arrays as float64: index arrays cast back)


def _ix(a):
    return np.asarray(a).astype(np.int64)


def _rows_of(indptr):
    indptr = _ix(indptr)
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr))


def ref_mv_values(data, indices, indptr, shape, x, scale=1.0):
    y = np.zeros(shape[0])
    np.add.at(y, _rows_of(indptr), data * x[_ix(indices)])
    return scale * y


def ref_mm_values(data, indices, indptr, shape, B, scale=1.0):
    C = np.zeros((shape[0], B.shape[1]))
    np.add.at(C, _rows_of(indptr), data[:, None] * B[_ix(indices)])
    return scale * C


def ref_sddmm_values(indices, indptr, shape, X, Y):
    return np.einsum("kd,kd->k", X[_rows_of(indptr)], Y[_ix(indices)])


def ref_softmax_values(data, indices, indptr, shape):
    out = np.empty_like(data)
    ptr = _ix(indptr)
    for a, b in zip(ptr[:-1], ptr[1:]):
        if b > a:
            e = np.exp(data[a:b] - data[a:b].max())
            out[a:b] = e / e.sum()
    return out


def ref_softmax_values_backward(y, grad, indptr):
    rows = _rows_of(indptr)
    s = np.zeros(len(indptr) - 1)
    np.add.at(s, rows, y * grad)
    return y * (grad - s[rows])


def ref_scale_values(data, indices, indptr, shape, row_scale=None, col_scale=None):
    out = data.copy()
    if row_scale is not None:
        out *= row_scale[_rows_of(indptr)]
    if col_scale is not None:
        out *= col_scale[_ix(indices)]
    return out


def ref_gather(values, perm):
    return values[_ix(perm)]


def ref_scatter(values, perm):
    out = np.empty_like(values)
    out[_ix(perm)] = values
    return out


# ---------------------------------------------------------------------------
# Matrix-level functions against scipy


@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("dtype", VALUES)
def test_mv_mm_against_scipy(dtype, index, device):
    """mv, mm and A.T @ G of CSRMatrix objects built by from_scipy (the
    kernels' widths and special patterns are the op table's)."""
    rng = np.random.default_rng(1)
    for seed, (m, n, dens, kind) in enumerate(_cases(device)):
        S = random_csr(m, n, dens, dtype, index, seed, kind)
        A = _mat(S, device)
        assert A.index_dtype == index and A.dtype == dtype
        x = rng.standard_normal(n).astype(dtype)
        y = sparse.mv(A, to_dev(x, device))
        assert y.shape == (m,) and y.dtype == dtype
        _close(y, S @ x, dtype)
        for width in ((3, 70) if device == "cpu" else (5,)):
            B = rng.standard_normal((n, width)).astype(dtype)
            _close(sparse.mm(A, to_dev(B, device)), S @ B, dtype)
            # A.T @ B through the cached transposed structure
            G = rng.standard_normal((m, width)).astype(dtype)
            _close(A.T @ to_dev(G, device), S.T @ G, dtype)
        assert A.T is A.T


@pytest.mark.parametrize("index,dtype", [(np.int32, np.float64), (np.int64, np.float32)])
def test_sddmm_softmax_scale_against_reference(dtype, index, device):
    """sddmm, softmax, scale_rows and scale_columns of CSRMatrix objects
    (their value-level operators are the op table's)."""
    rng = np.random.default_rng(2)
    for seed, (m, n, dens, kind) in enumerate(_cases(device)):
        S = random_csr(m, n, dens, dtype, index, seed, kind)
        A = _mat(S, device)
        rows = np.repeat(np.arange(m), np.diff(S.indptr))
        X = rng.standard_normal((m, 6)).astype(dtype)
        Y = rng.standard_normal((n, 6)).astype(dtype)
        got = sparse.sddmm(A, to_dev(X, device), to_dev(Y, device))
        assert got.shape == A.shape and got.indices is A.indices
        _close(got.data, np.einsum("kd,kd->k", X[rows], Y[S.indices]), dtype)
        # softmax per row over the stored entries (duplicates count separately)
        P = sparse.softmax(A)
        want = np.empty(S.nnz)
        for r in range(m):
            v = S.data[S.indptr[r]:S.indptr[r + 1]].astype(np.float64)
            want[S.indptr[r]:S.indptr[r + 1]] = np.exp(v - v.max()) / np.exp(v - v.max()).sum() \
                if v.size else v
        _close(P.data, want, dtype)
        rs = rng.standard_normal(m).astype(dtype)
        cs = rng.standard_normal(n).astype(dtype)
        _close(sparse.scale_rows(A, to_dev(rs, device)).to_dense(),
               (sp.diags_array(rs) @ S).toarray() if m else np.zeros((m, n)), dtype)
        _close(sparse.scale_columns(A, to_dev(cs, device)).to_dense(),
               (S @ sp.diags_array(cs)).toarray() if n else np.zeros((m, n)), dtype)


@pytest.mark.parametrize("index", INDEX)
def test_structure_ops_against_scipy(index, device):
    for seed, (m, n, dens, kind) in enumerate(_cases(device)):
        S = random_csr(m, n, dens, np.float64, index, seed, kind)
        A = _mat(S, device)
        np.testing.assert_array_equal(host(A.to_dense()), S.toarray())
        T = A.T
        assert T.shape == (n, m) and T.device == device and T.index_dtype == index
        np.testing.assert_array_equal(host(T.to_dense()), S.T.toarray())
        np.testing.assert_array_equal(host(A.row_lengths()), np.diff(S.indptr))
        C = A.sum_duplicates()
        assert C.has_canonical_format and C.index_dtype == index
        Sc = S.copy()
        Sc.sum_duplicates()
        np.testing.assert_array_equal(host(C.indptr), Sc.indptr)
        np.testing.assert_array_equal(host(C.indices), Sc.indices)
        np.testing.assert_allclose(host(raw_data(C)), Sc.data, rtol=1e-14)
        s = A.sort_indices()
        assert s.nnz == A.nnz
        for r in range(m):
            cols = host(s.indices)[S.indptr[r]:S.indptr[r + 1]]
            assert np.all(np.diff(cols) >= 0)
        np.testing.assert_array_equal(host(s.to_dense()), S.toarray())
        D = sparse.add(A, A.sort_indices(), 2.0, -0.5)
        assert D.has_canonical_format
        np.testing.assert_allclose(host(D.to_dense()), 1.5 * S.toarray(), atol=1e-12)
        assert A.has_canonical_format == (kind != "messy")


def raw_data(A):
    return A.data


def _structure_cases(index):
    """Host CSRMatrices whose structure operations the CUDA kernels must
    reproduce exactly: unsorted columns with duplicates and empty rows, a row
    long enough for the merge passes of the row sort (runs of 16), a row
    count and a column count above THREADS**2 of the simulator (a scan of
    three levels), a canonical matrix, and empty ones."""
    rng = np.random.default_rng(12)

    def build(m, n, lengths, sort=False):
        ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(index)
        cols = rng.integers(0, max(n, 1), int(ptr[-1]))
        if sort:  # strictly increasing columns in every row
            cols = np.concatenate([np.sort(rng.choice(n, k, replace=False)) for k in lengths])
        return sparse.CSRMatrix(rng.standard_normal(cols.size), cols.astype(index), ptr, (m, n))

    messy = rng.integers(0, 6, 11)
    messy[[2, 7]] = 0
    return {"messy": build(11, 6, messy),
            "long-row": build(4, 9, [3, 70, 0, 21]),
            "wide": build(3, 1100, [40, 0, 25]),
            "tall": build(1100, 3, rng.integers(0, 3, 1100) * (rng.random(1100) < 0.1)),
            "canonical": build(7, 12, [3, 0, 5, 12, 1, 0, 2], sort=True),
            "no-entries": build(5, 4, [0] * 5), "0x0": build(0, 0, []),
            "0x7": build(0, 7, [])}


def _refuse(*args, **kwargs):
    raise AssertionError("a host copy or a CPU kernel was used for a device matrix")


def _refuse_host_paths(mp, uploads=True):
    """Make every device-to-host copy (and with ``uploads`` every upload)
    and every CPU sparse kernel raise, within ``mp`` (a monkeypatch context)."""
    from numba import cuda

    from nbops import _dispatch

    mp.setattr(_dispatch, "to_host", _refuse)
    mp.setattr(type(cuda.device_array(1)), "copy_to_host", _refuse)
    if uploads:
        mp.setattr(_dispatch, "to_device", _refuse)
        mp.setattr(cuda, "to_device", _refuse)
    for key in [k for k in _dispatch._KERNELS if k[0].startswith("sparse.") and k[1] == "cpu"]:
        mp.setitem(_dispatch._KERNELS, key, _refuse)


def _same_csr(got, want):
    assert got.device == "cuda" and got.shape == want.shape
    for name in ("data", "indices", "indptr"):
        g, w = getattr(got, name), getattr(want, name)
        assert nbops._dispatch.is_device_array(g), name
        g = host(g)
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("index", INDEX)
def test_structure_ops_stay_on_the_device(index, monkeypatch):
    """Transpose, sort_indices, sum_duplicates, the canonical-format test,
    row lengths, add, validation on construction and from_dense run as CUDA
    kernels: with every host copy, upload and CPU sparse kernel refused,
    their results equal the CPU's exactly."""
    for name, A in _structure_cases(index).items():
        D = A.to_device()
        with monkeypatch.context() as mp:
            _refuse_host_paths(mp)
            got = dict(T=D.T, TT=D.T.T, sorted=D.sort_indices(), summed=D.sum_duplicates(),
                       added=sparse.add(D, D, 1.0, 0.5),
                       checked=sparse.CSRMatrix(D.data, D.indices, D.indptr, D.shape),
                       dense=sparse.from_dense(D.to_dense(), index_dtype=index))
            canonical = D.has_canonical_format
            lengths = D.row_lengths()
            assert nbops._dispatch.is_device_array(lengths)
        want = dict(T=A.T, TT=A.T.T, sorted=A.sort_indices(), summed=A.sum_duplicates(),
                    added=sparse.add(A, A, 1.0, 0.5), checked=A,
                    dense=sparse.from_dense(A.to_dense(), index_dtype=index))
        for op in got:
            _same_csr(got[op], want[op])
        assert canonical == A.has_canonical_format == (name not in ("messy", "long-row",
                                                                      "wide", "tall"))
        np.testing.assert_array_equal(host(lengths), np.diff(A.indptr))
        assert host(lengths).dtype == np.int64
        # the CPU results are scipy's
        S = A.to_scipy()
        np.testing.assert_array_equal(want["T"].to_dense(), S.T.toarray())
        np.testing.assert_array_equal(want["sorted"].to_dense(), S.toarray())
        assert want["summed"].has_canonical_format


def test_cuda_prefix_sum_across_tiles():
    """The device scan behind the structure kernels, for sizes that end
    inside the first tile, just past it, and past THREADS**2 (three levels)."""
    from nbops.cuda._launch import THREADS
    from nbops.sparse import cuda as sparse_cuda

    rng = np.random.default_rng(13)
    for n in (1, 2, THREADS, THREADS + 1, 3 * THREADS + 1, THREADS * THREADS + 1):
        for dtype in INDEX:
            x = rng.integers(0, 50, n).astype(dtype)
            got = host(sparse_cuda._inclusive_scan(to_dev(x, "cuda")))
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, np.cumsum(x))


def test_add_union_of_patterns(device):
    S1 = random_csr(13, 9, 0.2, seed=1)
    S2 = random_csr(13, 9, 0.2, seed=2, kind="messy")
    S2 = sp.csr_array((S2.data, S2.indices.astype(np.int64), S2.indptr.astype(np.int64)),
                      shape=S2.shape)
    got = sparse.add(_mat(S1, device), _mat(S2, device), 1.0, 3.0)
    want = (S1 + 3.0 * S2).tocsr()
    want.sum_duplicates()
    np.testing.assert_allclose(host(got.to_dense()), want.toarray(), atol=1e-12)
    assert got.nnz == want.nnz  # explicit zeros from cancellation are kept, none here


def test_from_coo_sums_duplicates_and_sorts():
    rng = np.random.default_rng(3)
    for index in INDEX:
        ij = rng.integers(0, 6, (2, 40)).astype(index)
        v = rng.standard_normal(40)
        A = sparse.from_coo(ij, v, (6, 7))
        want = sp.coo_array((v, (ij[0], ij[1])), shape=(6, 7)).tocsr()
        want.sum_duplicates()
        assert A.has_canonical_format and A.index_dtype == index
        np.testing.assert_array_equal(A.indptr, want.indptr)
        np.testing.assert_array_equal(A.indices, want.indices)
        np.testing.assert_allclose(A.data, want.data, rtol=1e-14)
    E = sparse.from_coo(np.zeros((2, 0), np.int64), np.zeros(0), (3, 4))
    assert E.nnz == 0 and E.to_dense().shape == (3, 4)
    assert sparse.from_coo(ij, v, (6, 7), index_dtype=np.int32).index_dtype == np.int32


def test_conversions(device):
    d = np.array([[0, 1.5, 0], [0, 0, 0], [np.nan, 0, -2]], np.float32)
    A = sparse.from_dense(to_dev(d, device))
    assert A.device == device and A.nnz == 3
    np.testing.assert_array_equal(host(A.to_dense()), d)
    S = A.to_scipy()
    assert S.format == "csr" and S.nnz == 3
    H = A.to_host()
    if device == "cpu":
        assert H is A and np.shares_memory(S.data, A.data)
        B = sparse.from_scipy(S)
        assert np.shares_memory(B.data, S.data) and np.shares_memory(B.indices, S.indices)
    else:
        assert H.device == "cpu" and H.to_device().device == "cuda"
    coo = sp.coo_array(([1.0, 2.0], ([0, 1], [1, 0])), shape=(2, 2))
    np.testing.assert_array_equal(sparse.from_scipy(coo).to_dense(), coo.toarray())
    out = to_dev(np.full((3, 3), 7, np.float32), device)
    assert sparse.to_dense(A, out=out) is out
    assert "3x3" in repr(A) and "nnz=3" in repr(A)


def test_int8_values_with_scale():
    rng = np.random.default_rng(4)
    S = random_csr(10, 8, 0.4, seed=4)
    q = rng.integers(-127, 128, S.nnz).astype(np.int8)
    A = sparse.CSRMatrix(q, S.indices, S.indptr, S.shape, scale=0.05)
    W = sp.csr_array((q.astype(np.float64) * 0.05, S.indices, S.indptr), shape=S.shape)
    # the int8 kernels are the op table's; here the scale the matrix carries
    B = rng.standard_normal((8, 37)).astype(np.float32)
    _close(A @ B, W @ B, np.float32)
    _close(A.to_dense(), W.toarray(), np.float32)
    _close(A.to_scipy().toarray(), W.toarray(), np.float32)


def test_large_rows_split_across_chunks():
    """One row holding nearly all nonzeros is split between threads (carries)."""
    m, n = 50, 40_000
    rng = np.random.default_rng(5)
    S = sp.lil_array((m, n), dtype=np.float64)
    S[7, :] = rng.standard_normal(n)
    S[8, :100] = 1.0
    S = S.tocsr()
    A = sparse.from_scipy(S)
    x = rng.standard_normal(n)
    np.testing.assert_allclose(sparse.mv(A, x), S @ x, rtol=1e-10)
    rows = np.repeat(np.arange(m), np.diff(S.indptr))
    for width in (3, 70):
        B = rng.standard_normal((n, width))
        np.testing.assert_allclose(sparse.mm(A, B), S @ B, rtol=1e-10)
        X = rng.standard_normal((m, width))
        np.testing.assert_allclose(sparse.sddmm(A, X, B).data,
                                   np.einsum("kd,kd->k", X[rows], B[S.indices]), rtol=1e-10)
    np.testing.assert_allclose(A.T.to_dense(), S.T.toarray())


@pytest.mark.parametrize("aligned", [True, False])
def test_mm_streamed_output(aligned):
    """Outputs of STREAM_BYTES or more starting on a cache line are written
    with non-temporal stores (carried partial rows with ordinary ones);
    others, e.g. NumPy's own allocations passed as out=, are not."""
    from nbops._checks import empty
    from nbops.cpu._memory import STREAM_BYTES

    width = 64
    m = STREAM_BYTES // (4 * width) + 3
    S = random_csr(m, 300, 0.02, np.float32, seed=9)
    A = sparse.from_scipy(S)
    B = np.random.default_rng(9).standard_normal((300, width)).astype(np.float32)
    if aligned:
        out = empty((m, width), np.float32, "cpu")
    else:
        buf = np.empty(m * width + 16, np.float32)
        skip = (16 - buf.ctypes.data) % 64 // 4
        out = buf[skip:skip + m * width].reshape(m, width)
    assert out.ctypes.data % 64 == (0 if aligned else 16)
    assert sparse.mm(A, B, out=out) is out
    _close(out, S @ B, np.float32)


def _offset_rows(shape, dtype, offset, rng):
    """A C-contiguous array starting ``offset`` bytes after a cache line."""
    size = int(np.prod(shape))
    buf = np.empty(size + 64, dtype)
    skip = (offset - buf.ctypes.data) % 64 // buf.itemsize
    a = buf[skip:skip + size].reshape(shape)
    a[...] = rng.standard_normal(shape)
    return a


def test_random_row_reads_from_a_line_aligned_copy():
    """A large dense operand whose rows straddle cache lines is copied to
    line-aligned rows when enough of its rows are read (SpMM's B, SDDMM's
    Y); the results are those of the original."""
    from nbops.sparse import cpu as sparse_cpu

    rng = np.random.default_rng(11)
    rows, width = (16 << 20) // 256 + 8, 64            # float32 rows of 4 lines
    B = _offset_rows((rows, width), np.float32, 16, rng)
    assert B.ctypes.data % 64 == 16
    copied = sparse_cpu.line_rows(B, reads=B.nbytes // 64)
    assert copied is not B and copied.ctypes.data % 64 == 0
    np.testing.assert_array_equal(copied, B)
    assert sparse_cpu.line_rows(B, reads=B.nbytes // 64 - 1) is B     # too few reads
    assert sparse_cpu.line_rows(copied, reads=10 ** 9) is copied       # aligned already
    assert sparse_cpu.line_rows(B[:, :60].copy(), reads=10 ** 9).shape == (rows, 60)

    S = random_csr(300, rows, 0.015, np.float32, np.int32, seed=11)
    assert S.nnz * 64 >= B.nbytes
    A = sparse.from_scipy(S)
    _close(sparse.mm(A, B), S @ B, np.float32)
    X = rng.standard_normal((300, width)).astype(np.float32)
    got = sparse.sddmm_values(A.indices, A.indptr, A.shape, X, B)
    row = np.repeat(np.arange(300), np.diff(A.indptr))
    want = np.einsum("ij,ij->i", X[row].astype(np.float64), B[A.indices].astype(np.float64))
    _close(got, want, np.float32)


# ---------------------------------------------------------------------------
# Gradients (float64 finite differences)


def _tensor(x):
    return nbops.Tensor(x, requires_grad=True)


def test_gradcheck_composites():
    """Gradients through what no single operator is: values behind a
    transpose (gather), and a graph attention layer (scores, softmax over
    each row, aggregation); each operator alone is the op table's."""
    S = random_csr(9, 7, 0.35, seed=6, kind="skewed")
    A = sparse.from_scipy(S)
    rng = np.random.default_rng(6)
    d = _tensor(A.data.copy())
    B = _tensor(rng.standard_normal((7, 3)))
    X = _tensor(rng.standard_normal((9, 4)))
    Y = _tensor(rng.standard_normal((7, 4)))
    G = _tensor(rng.standard_normal((9, 3)))
    assert gradcheck(lambda d, G: sparse.mm(A.with_data(d).T, G), [d, G])
    assert gradcheck(lambda X, Y, B: sparse.mm(sparse.softmax(sparse.sddmm(A, X, Y)), B),
                     [X, Y, B])


def test_gradcheck_cuda():
    S = random_csr(5, 4, 0.5, seed=7)
    A = sparse.from_scipy(S).to_device()
    rng = np.random.default_rng(7)
    d = _tensor(to_dev(S.data.copy(), "cuda"))
    B = _tensor(to_dev(rng.standard_normal((4, 2)), "cuda"))
    assert gradcheck(lambda d, B: sparse.mm(A.with_data(d), B), [d, B])
    X = _tensor(to_dev(rng.standard_normal((5, 2)), "cuda"))
    assert gradcheck(lambda d, X: sparse.softmax(
        sparse.sddmm(A, X, B.data)).data * d, [d, X])


def test_values_tensor_flows_through_csrmatrix():
    S = random_csr(6, 6, 0.4, seed=8)
    w = _tensor(S.data.copy())
    A = sparse.CSRMatrix(w, S.indices, S.indptr, S.shape)
    y = sparse.mv(A, np.ones(6))
    assert isinstance(y, nbops.Tensor)
    y.sum().backward()
    rows = np.repeat(np.arange(6), np.diff(S.indptr))
    np.testing.assert_allclose(w.grad, np.ones(S.nnz))
    assert rows.size == S.nnz
    assert A.to_device().to_host().shape == A.shape


# ---------------------------------------------------------------------------
# GraphConv


def test_graphconv_against_dense():
    from nbops.nn.graph import GraphConv

    S = random_csr(15, 15, 0.2, seed=9)
    S = ((S + S.T) != 0).astype(np.float64)
    adj = sparse.gcn_norm(sparse.from_scipy(sp.csr_array(S)))
    Ad = S.toarray() + np.eye(15)
    dinv = 1 / np.sqrt(Ad.sum(1))
    Ahat = dinv[:, None] * Ad * dinv[None, :]
    np.testing.assert_allclose(adj.to_dense(), Ahat, rtol=1e-12)
    layer = GraphConv(4, 3, dtype=np.float64, rng=0)
    x = _tensor(np.random.default_rng(9).standard_normal((15, 4)))
    y = layer(adj, x)
    W, b = layer.weight.data, layer.bias.data
    np.testing.assert_allclose(y.data, Ahat @ x.data @ W.T + b, rtol=1e-12)
    y.sum().backward()
    ones = np.ones((15, 3))
    np.testing.assert_allclose(x.grad, Ahat.T @ ones @ W, rtol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, (Ahat.T @ ones).T @ x.data, rtol=1e-12)
    np.testing.assert_allclose(layer.bias.grad, ones.sum(0))
    with nbops.no_grad():
        assert isinstance(layer(adj, x.data), np.ndarray)
    with pytest.raises(TypeError, match="CSRMatrix"):
        layer(Ahat, x)
    with pytest.raises(ValueError, match="adj"):
        layer(adj, x.data[:5])
    with pytest.raises(ValueError, match="GraphConv: argument 'in_features' must be >= 1"):
        GraphConv(0, 3)


# ---------------------------------------------------------------------------
# Errors

P = dict(data=np.ones(3), indices=np.array([0, 2, 1]), indptr=np.array([0, 2, 3]),
         shape=(2, 3))


def _build(**over):
    kw = {**P, **over}
    return sparse.CSRMatrix(kw["data"], kw["indices"], kw["indptr"], kw["shape"],
                            **{k: v for k, v in over.items() if k in ("scale", "check")})


@pytest.mark.parametrize("over,exc,match", [
    (dict(indptr=np.array([1, 2, 3])), ValueError, r"indptr\[0\] must be 0"),
    (dict(indptr=np.array([0, 3, 2, 3]), shape=(3, 3)), ValueError,
     r"indptr\[1\] = 3 > indptr\[2\] = 2 \(row 1\)"),
    (dict(indptr=np.array([0, 2, 2])), ValueError, r"indptr\[-1\] must equal nnz = 3"),
    (dict(indices=np.array([0, 3, 1])), ValueError, r"indices\[1\] = 3 \(row 0\)"),
    (dict(indices=np.array([0, 1, -1])), ValueError, r"indices\[2\] = -1 \(row 1\)"),
    (dict(indices=np.array([0, 1])), ValueError, "'indices' has 2 entries"),
    (dict(indptr=np.array([0, 3])), ValueError, "rows \\+ 1 = 3"),
    (dict(indices=np.array([0, 2, 1], np.int32)), TypeError, "one index dtype"),
    (dict(indices=np.array([0., 2., 1.])), TypeError, "'indices' must be a int32 or int64"),
    (dict(data=np.ones(3, np.int16)), TypeError, "'data'"),
    (dict(data=np.ones((3, 1))), ValueError, "'data' must be 1-D"),
    (dict(data="abc"), TypeError, "'data' must be an array"),
    (dict(shape=(2,)), TypeError, "pair of ints"),
    (dict(shape=(2, -3)), ValueError, "non-negative"),
    (dict(data=np.ones(3, np.int8)), ValueError, "need a 'scale'"),
    (dict(scale=0.5), ValueError, "only for int8"),
    (dict(data=np.ones(3, np.int8), scale=0.0), ValueError, "'scale' must be > 0"),
])
def test_construction_errors(over, exc, match):
    with pytest.raises(exc, match=match):
        _build(**over)


@pytest.mark.parametrize("dtype", VALUES)
def test_gcn_norm_and_int8_to_dense_stay_on_the_device(dtype, monkeypatch):
    """Degrees are inverted and int8 values dequantized on the device (the
    identity and the vector of ones are uploads of constants, allowed)."""
    S = random_csr(15, 15, 0.2, dtype, seed=9)
    S = sp.csr_array((S + S.T).astype(dtype))
    A = sparse.from_scipy(S)
    q = np.random.default_rng(14).integers(-127, 128, S.nnz).astype(np.int8)
    Q = sparse.CSRMatrix(q, S.indices, S.indptr, S.shape, scale=0.05)
    D, QD = A.to_device(), Q.to_device()
    with monkeypatch.context() as mp:
        _refuse_host_paths(mp, uploads=False)
        G = sparse.gcn_norm(D)
        dense = QD.to_dense()
        assert nbops._dispatch.is_device_array(dense)
    want = sparse.gcn_norm(A)
    for name in ("indices", "indptr"):
        np.testing.assert_array_equal(host(getattr(G, name)), getattr(want, name))
    assert G.dtype == dtype and G.device == "cuda"
    _close(G.data, want.data, dtype)
    got = host(dense)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, Q.to_dense())


@pytest.mark.parametrize("over,match", [
    (dict(indptr=np.array([1, 2, 3])), r"indptr\[0\] must be 0, got 1"),
    (dict(indptr=np.array([0, 3, 2, 3]), shape=(3, 3)),
     r"indptr\[1\] = 3 > indptr\[2\] = 2 \(row 1\)"),
    (dict(indptr=np.array([0, 2, 2])), r"indptr\[-1\] must equal nnz = 3, got 2"),
    (dict(indices=np.array([0, 3, 1])), r"indices\[1\] = 3 \(row 0\) is out of range"),
    (dict(indices=np.array([0, 1, -1], np.int32), indptr=np.array([0, 2, 3], np.int32)),
     r"indices\[2\] = -1 \(row 1\)"),
])
def test_structure_errors_on_the_device(over, match):
    kw = {**P, **over}
    with pytest.raises(ValueError, match=match):
        sparse.CSRMatrix(*(to_dev(kw[k], "cuda") for k in ("data", "indices", "indptr")),
                         kw["shape"])
    with pytest.raises(ValueError, match=match):
        sparse.CSRMatrix(kw["data"], kw["indices"], kw["indptr"], kw["shape"])


@st.composite
def _csr_arrays(draw):
    m = draw(st.integers(0, 6))
    n = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, 4), min_size=m, max_size=m))
    ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ind = np.array(draw(st.lists(st.integers(0, n - 1), min_size=int(ptr[-1]),
                                 max_size=int(ptr[-1]))), np.int64)
    return ind, ptr, (m, n)


@given(_csr_arrays(), st.data())
def test_validation_property(arrays, data):
    """Valid arrays build and match scipy; one corrupted position raises a
    ValueError that names it."""
    ind, ptr, shape = arrays
    vals = np.arange(ind.size, dtype=np.float64) + 1
    A = sparse.CSRMatrix(vals, ind, ptr, shape)
    np.testing.assert_array_equal(
        A.to_dense(), sp.csr_array((vals, ind, ptr), shape=shape).toarray())
    if ind.size:
        k = data.draw(st.integers(0, ind.size - 1))
        bad = ind.copy()
        bad[k] = data.draw(st.sampled_from([-1, shape[1], shape[1] + 7]))
        with pytest.raises(ValueError, match=rf"indices\[{k}\] = {bad[k]} "):
            sparse.CSRMatrix(vals, bad, ptr, shape)
    if shape[0] >= 2 and ptr[1] > 0:
        bad = ptr.copy()
        bad[1] = ptr[2] + 1 if ptr[2] + 1 != ptr[1] else ptr[1] + 1
        with pytest.raises(ValueError, match="non-decreasing|indptr"):
            sparse.CSRMatrix(vals, ind, bad, shape)


def test_check_false_skips_content_checks_only():
    A = _build(indices=np.array([0, 9, 1]), check=False)
    assert A.nnz == 3
    with pytest.raises(ValueError, match="'indices' has 2"):
        _build(indices=np.array([0, 1]), check=False)


def test_int32_overflow():
    big = np.broadcast_to(np.int32(0), (2 ** 31 + 1,))  # no memory behind it
    with pytest.raises(ValueError, match="int32 indices cannot address"):
        sparse.CSRMatrix(np.ones(0), np.zeros(0, np.int32), big, (2 ** 31, 1))
    with pytest.raises(ValueError, match="use int64"):
        sparse.from_coo(np.zeros((2, 1), np.int32), np.ones(1), (2 ** 31, 2))


def test_operator_errors(device):
    """Errors of the matrix-level functions (those of the value-level
    operators they call are the op table's)."""
    A = _mat(random_csr(4, 3, 0.5, seed=10), device)
    d = lambda x: to_dev(x, device)  # noqa: E731
    cases = [
        (lambda: sparse.mm(np.ones((4, 3)), d(np.ones((3, 2)))), TypeError, "CSRMatrix"),
        (lambda: A @ d(np.ones((3, 2, 1))), TypeError, "1-D or 2-D"),
        (lambda: sparse.scale_rows(A, d(np.ones(3))), ValueError, "'row_scale' must have 4"),
        (lambda: sparse.add(A, _mat(random_csr(4, 4, 0.5), device)), ValueError,
         "shapes differ"),
        (lambda: sparse.add(A, _mat(random_csr(4, 3, 0.5, index=np.int32), device)),
         TypeError, "but B has int32"),
        (lambda: sparse.add(A, A, alpha=float("nan")), ValueError, "'alpha'"),
        (lambda: sparse.gcn_norm(A), ValueError, "square"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def test_mixed_devices_and_host_only_paths():
    S = random_csr(4, 3, 0.5, seed=11)
    A = sparse.from_scipy(S)
    Ad = A.to_device()
    with pytest.raises(TypeError, match="different devices"):
        sparse.mv(A, to_dev(np.ones(3), "cuda"))
    with pytest.raises(TypeError, match="different devices"):
        sparse.mm(Ad, np.ones((3, 2)))
    with pytest.raises(TypeError, match="different devices"):
        sparse.add(A, Ad)
    with pytest.raises(TypeError, match="different devices"):
        sparse.CSRMatrix(to_dev(S.data, "cuda"), S.indices, S.indptr, S.shape)
    with pytest.raises(TypeError, match="host array"):
        sparse.from_coo(to_dev(np.zeros((2, 1), np.int64), "cuda"), np.ones(1), (2, 2))


def test_from_coo_and_conversion_errors():
    ij = np.array([[0, 1], [1, 5]])
    with pytest.raises(ValueError, match="entry 1 has column 5"):
        sparse.from_coo(ij, np.ones(2), (2, 3))
    with pytest.raises(ValueError, match="entry 0 has row -1"):
        sparse.from_coo(np.array([[-1], [0]]), np.ones(1), (2, 3))
    with pytest.raises(ValueError, match=r"shape \(2, nnz\)"):
        sparse.from_coo(np.zeros((3, 2), np.int64), np.ones(2), (2, 3))
    with pytest.raises(ValueError, match="'values' must have shape"):
        sparse.from_coo(ij[:, :1], np.ones(2), (2, 6))
    with pytest.raises(TypeError, match="index_dtype"):
        sparse.from_coo(ij, np.ones(2), (2, 6), index_dtype=np.int16)
    with pytest.raises(TypeError, match="scipy.sparse"):
        sparse.from_scipy(np.eye(2))
    with pytest.raises(ValueError, match="2-D"):
        sparse.from_dense(np.ones(3))
    with pytest.raises(TypeError, match="'index_dtype' must be int32 or int64, got int16"):
        sparse.from_dense(np.eye(2), index_dtype=np.int16)
    A = sparse.from_dense(np.eye(3))
    with pytest.raises(ValueError, match="shape"):
        A.with_data(np.ones(2))
    w = _tensor(np.ones(3))
    with pytest.raises(TypeError, match="not differentiable"):
        sparse.add(A.with_data(w), A)


@pytest.mark.parametrize("name", ["sparse_mv", "sparse_mm", "sparse_sddmm"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bench_cases_check_out(name, dtype, device):
    check_bench_case(name, dtype, device, "sparse")
