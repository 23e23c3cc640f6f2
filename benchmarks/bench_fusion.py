"""asv suites of nbops.fuse and nbops.profiler.

* ``Fusion``: the fusion cases of ``python -m nbops bench`` (fuse_sum3,
  fuse_chain5, fuse_bias_gelu) beside their NumPy baselines;
* ``FusedSum``: ``(x + y) * z`` summed, fused, beside NumPy's three passes
  and a parallel kernel that only reads the three inputs (``time_read3``, the
  bandwidth bound): issue-10 targets at 16M float32 on 2 threads are >= 3x
  NumPy and >= 0.7 of ``time_read3``'s bandwidth;
* ``FusedChain``: a five-op chain into ``out=`` beside NumPy (target >= 4x);
* ``FusedAxis``: a fused sum along each axis of a 4096^2 matrix;
* ``ProfilerOverhead``: 1000 calls of a tiny op outside a profile block,
  inside one, and inside one with ``record_shapes=True`` (target: under 5 us
  per call more than outside).
"""

import numpy as np

from . import common


def _nbops():
    try:
        import nbops
    except ImportError as exc:
        raise NotImplementedError(f"nbops is not there: {exc}") from None
    if not hasattr(nbops, "fuse"):
        raise NotImplementedError("nbops.fuse does not exist")
    return nbops


class Fusion(common.CaseSuite):
    """The fusion cases of ``python -m nbops bench`` (1M and 16M elements)."""

    params = common.case_params("fusion")


_READ3 = None


def _read3():
    global _READ3
    if _READ3 is None:
        from numba import njit, prange

        @njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
        def read3(x, y, z):
            acc = 0.0
            for i in prange(x.size):
                acc += x[i] + y[i] + z[i]
            return acc

        _READ3 = read3
    return _READ3


def _inputs(n, dtype, k):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(n).astype(dtype) for _ in range(k)]


class FusedSum:
    params = [[1 << 20, 1 << 24], ["float32", "float64"]]
    param_names = ["n", "dtype"]

    def setup(self, n, dtype):
        nb = _nbops()
        self.x, self.y, self.z = _inputs(n, dtype, 3)
        self.fused = nb.fuse(lambda x, y, z: (x + y) * z, reduce="sum")
        self.read3 = _read3()
        self.fused(self.x, self.y, self.z)   # compile or load from the cache
        self.read3(self.x, self.y, self.z)

    def time_fused(self, n, dtype):
        self.fused(self.x, self.y, self.z)

    def time_numpy(self, n, dtype):
        ((self.x + self.y) * self.z).sum()

    def time_read3(self, n, dtype):
        self.read3(self.x, self.y, self.z)


class FusedChain:
    params = [[1 << 20, 1 << 24], ["float32", "float64"]]
    param_names = ["n", "dtype"]

    def setup(self, n, dtype):
        nb = _nbops()
        self.x, self.y = _inputs(n, dtype, 2)
        self.out = np.empty_like(self.x)
        self.fused = nb.fuse(lambda x, y: np.maximum(x * y + 1.0, 0.0) * 0.5 - x)
        self.fused(self.x, self.y, out=self.out)

    def time_fused_out(self, n, dtype):
        self.fused(self.x, self.y, out=self.out)

    def time_fused(self, n, dtype):
        self.fused(self.x, self.y)

    def time_numpy(self, n, dtype):
        np.maximum(self.x * self.y + 1.0, 0.0) * 0.5 - self.x


class FusedAxis:
    params = [[0, 1], ["float32"]]
    param_names = ["axis", "dtype"]

    def setup(self, axis, dtype):
        nb = _nbops()
        self.x, self.y = (a.reshape(4096, 4096) for a in _inputs(1 << 24, dtype, 2))
        self.fused = nb.fuse(lambda x, y: x * y, reduce="sum", axis=axis)
        self.fused(self.x, self.y)

    def time_fused(self, axis, dtype):
        self.fused(self.x, self.y)

    def time_numpy(self, axis, dtype):
        (self.x * self.y).sum(axis=axis)


class ProfilerOverhead:
    """Per-call cost of recording: divide by 1000 calls."""

    params = [["off", "on", "on+shapes"]]
    param_names = ["profiler"]

    def setup(self, mode):
        nb = _nbops()
        from nbops import profiler

        self.op = nb.register_op("bench_identity", cpu=lambda x: x)
        self.x = np.ones(8, np.float32)
        self.prof = None if mode == "off" else profiler.profile(record_shapes=mode != "off"
                                                                and "shapes" in mode)
        if self.prof is not None:
            self.prof.__enter__()

    def teardown(self, mode):
        if self.prof is not None:
            self.prof.__exit__(None, None, None)

    def time_1000_calls(self, mode):
        op, x = self.op, self.x
        for _ in range(1000):
            op(x)
