"""asv suites of nbops.sparse beside scipy.sparse: SpMV, SpMM (64 dense
columns), SDDMM (64-wide factors), the transpose and row softmax, on a
uniform random matrix and a power-law one (Zipf row lengths) of the same
nnz, float32 values and int32 indices. Read the ratio off ``time_nbops_*``
and ``time_scipy_*`` of one run; ``tools/bench_sparse.py`` prints the
ratios and GB/s directly."""

import numpy as np
import scipy.sparse as sp

NNZ_PER_ROW = 16
WIDTH = 64


def uniform(m, n, per_row, rng):
    """Every row holds ``per_row`` random columns (sorted)."""
    ind = rng.integers(0, n, (m, per_row), dtype=np.int32)
    ind.sort(axis=1)
    ptr = np.arange(m + 1, dtype=np.int32) * per_row
    return sp.csr_array((rng.standard_normal(m * per_row, np.float32), ind.reshape(-1), ptr),
                        shape=(m, n))


def powerlaw(m, n, nnz, rng, a=2.0):
    """Zipf(a) row lengths capped at 5% of the columns, rescaled to exactly
    ``nnz``, rows shuffled; columns uniform (so x is touched as in
    :func:`uniform` and only the row skew differs)."""
    lengths = np.minimum(rng.zipf(a, m), n // 20).astype(np.float64)
    lengths = np.floor(lengths * (nnz / lengths.sum())).astype(np.int64)
    short = nnz - int(lengths.sum())
    if short:
        lengths[np.argsort(lengths)[-short:]] += 1
    rng.shuffle(lengths)
    ptr = np.zeros(m + 1, np.int64)
    np.cumsum(lengths, out=ptr[1:])
    ind = rng.integers(0, n, nnz, dtype=np.int32)
    return sp.csr_array((rng.standard_normal(nnz, np.float32), ind, ptr.astype(np.int32)),
                        shape=(m, n))


def matrix(kind, rows, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return uniform(rows, rows, NNZ_PER_ROW, rng)
    return powerlaw(rows, rows, rows * NNZ_PER_ROW, rng)


class _Suite:
    params = [["uniform", "powerlaw"], [100_000, 1_000_000]]
    param_names = ["matrix", "rows"]
    timeout = 600

    def setup(self, kind, rows):
        from nbops import sparse

        self.S = matrix(kind, rows)
        self.A = sparse.from_scipy(self.S, check=False)
        self.rng = np.random.default_rng(1)
        self.prepare(rows)

    def prepare(self, rows):
        pass


class SpMV(_Suite):
    def prepare(self, rows):
        from nbops import sparse

        self.x = self.rng.standard_normal(rows, np.float32)
        self.y = np.empty(rows, np.float32)
        sparse.mv(self.A, self.x, out=self.y)  # compile or load outside the timing

    def time_nbops_mv(self, kind, rows):
        from nbops import sparse

        sparse.mv(self.A, self.x, out=self.y)

    def time_scipy_mv(self, kind, rows):
        self.S @ self.x


class SpMM(_Suite):
    def prepare(self, rows):
        from nbops import sparse

        self.B = self.rng.standard_normal((rows, WIDTH), np.float32)
        # nbops' own allocation (cache-line aligned, so streamed when large),
        # reused as out=
        self.C = sparse.mm(self.A, self.B)

    def time_nbops_mm(self, kind, rows):
        from nbops import sparse

        sparse.mm(self.A, self.B, out=self.C)

    def time_scipy_mm(self, kind, rows):
        self.S @ self.B


class SDDMM(_Suite):
    """No scipy equivalent; the dense reference gathers both factors."""

    def prepare(self, rows):
        from nbops import sparse

        self.X = self.rng.standard_normal((rows, WIDTH), np.float32)
        self.Y = self.rng.standard_normal((rows, WIDTH), np.float32)
        self.out = np.empty(self.A.nnz, np.float32)
        self.rows_of = np.repeat(np.arange(rows), np.diff(self.S.indptr))
        self.run_nbops()

    def run_nbops(self):
        from nbops import sparse

        sparse.sddmm_values(self.A.indices, self.A.indptr, self.A.shape, self.X, self.Y,
                            out=self.out)

    def time_nbops_sddmm(self, kind, rows):
        self.run_nbops()

    def time_numpy_sddmm(self, kind, rows):
        np.einsum("kd,kd->k", self.X[self.rows_of], self.Y[self.S.indices])


class Structure(_Suite):
    """Transpose (a fresh pattern each time: the cache is bypassed) and
    row softmax."""

    def prepare(self, rows):
        from nbops import sparse

        sparse.softmax(self.A)
        self.fresh().T

    def fresh(self):
        from nbops import sparse

        return sparse.CSRMatrix(self.S.data, self.S.indices.copy(), self.S.indptr.copy(),
                                self.S.shape, check=False)

    def time_nbops_transpose(self, kind, rows):
        self.fresh().T

    def time_scipy_transpose(self, kind, rows):
        self.S.T.tocsr()

    def time_nbops_softmax(self, kind, rows):
        from nbops import sparse

        sparse.softmax(self.A)
