"""asv suites of nbops.linalg: matmul, batched matmul and linear beside
NumPy's matmul (OpenBLAS) in the same run, for both CPU routes of nbops
(``impl="nbops"``, its own packed kernel, and ``impl="blas"``, NumPy's BLAS
called from a kernel with the epilogue fused). GFLOP/s = 2 m n k / time.
Tuning is off (``NBOPS_AUTOTUNE=0``) so that each route runs a fixed
config; ``tools/bench_gemm.py`` prints GFLOP/s and ratios directly."""

import os

import numpy as np

os.environ.setdefault("NBOPS_AUTOTUNE", "0")


def _rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _warm(fn):
    fn()  # compile (or load from the cache) outside the measurement


class Square:
    """C = A @ B, square n x n."""

    params = [[256, 1024, 2048], ["float32", "float64"]]
    param_names = ["n", "dtype"]

    def setup(self, n, dtype):
        import nbops

        self.nbops = nbops
        self.a, self.b = _rand((n, n), dtype), _rand((n, n), dtype, 1)
        self.c = np.empty((n, n), dtype)
        _warm(lambda: nbops.matmul(self.a, self.b, out=self.c, impl="nbops"))
        _warm(lambda: nbops.matmul(self.a, self.b, out=self.c, impl="blas"))

    def time_numpy(self, n, dtype):
        np.matmul(self.a, self.b, out=self.c)

    def time_nbops(self, n, dtype):
        self.nbops.matmul(self.a, self.b, out=self.c, impl="nbops")

    def time_nbops_blas(self, n, dtype):
        self.nbops.matmul(self.a, self.b, out=self.c, impl="blas")

    def time_nbops_transposed_a(self, n, dtype):
        # A read through its strides by the packing step, no copy
        self.nbops.matmul(self.a.T, self.b, out=self.c, impl="nbops")


class Linear:
    """y = x @ W.T (+ b, activation) at layer shapes: batch x 4096 against
    out_features x 4096 weights; "gelu" is the fused epilogue."""

    params = [[64, 256], [4096, 1024], ["none", "gelu"], ["float32"]]
    param_names = ["batch", "out_features", "activation", "dtype"]

    def setup(self, batch, out_f, activation, dtype):
        import nbops

        self.nbops = nbops
        self.x, self.w = _rand((batch, 4096), dtype), _rand((out_f, 4096), dtype, 1)
        self.bias = _rand(out_f, dtype, 2)
        self.y = np.empty((batch, out_f), dtype)
        self.act = None if activation == "none" else activation
        for impl in ("nbops", "blas"):
            _warm(lambda: nbops.linear(self.x, self.w, self.bias, self.act, out=self.y,
                                       impl=impl))
        _warm(lambda: nbops.gelu(self.y, out=self.y))

    def time_numpy(self, batch, out_f, activation, dtype):
        np.matmul(self.x, self.w.T, out=self.y)
        self.y += self.bias

    def time_nbops(self, batch, out_f, activation, dtype):
        self.nbops.linear(self.x, self.w, self.bias, self.act, out=self.y, impl="nbops")

    def time_nbops_blas(self, batch, out_f, activation, dtype):
        self.nbops.linear(self.x, self.w, self.bias, self.act, out=self.y, impl="blas")

    def time_nbops_unfused(self, batch, out_f, activation, dtype):
        # matmul, then bias and the activation as separate passes
        nb = self.nbops
        nb.matmul(self.x, self.w.T, out=self.y, impl="nbops")
        self.y += self.bias
        if self.act is not None:
            nb.gelu(self.y, out=self.y)


class LinearGelu:
    """The fused gelu epilogue against nbops' matmul followed by nbops.gelu
    (the issue's criterion), at shapes where the activation is a sizeable
    share of the work (k 64-256; at k = 4096 it is about 1% and the two
    tie). The unfused pair is timed four ways: ``time_unfused`` writes the
    gelu into a second preallocated array (nbops.gelu's semantics: a new
    result), ``time_unfused_in_place`` overwrites the product (the least
    traffic two passes can have), ``time_unfused_allocating`` is
    ``nbops.gelu(nbops.matmul(x, w.T))`` as usually written (against
    ``time_fused_allocating``), ``time_unfused_bias`` adds a layer's bias
    in between (``nbops.add``, in place; against ``time_fused_bias``)."""

    params = [[(512, 4096, 256), (8192, 1024, 128), (4096, 4096, 64)], ["float32"]]
    param_names = ["batch_out_k", "dtype"]

    def setup(self, shape, dtype):
        import nbops

        batch, out_f, k = shape
        self.nbops = nbops
        self.x = _rand((batch, k), dtype)
        self.w = (_rand((out_f, k), dtype, 1) / np.sqrt(k)).astype(dtype)
        self.bias = _rand(out_f, dtype, 2)
        self.c, self.d = np.empty((batch, out_f), dtype), np.empty((batch, out_f), dtype)
        _warm(lambda: self.time_fused_bias(shape, dtype))
        _warm(lambda: self.time_unfused_bias(shape, dtype))

    def time_fused(self, shape, dtype):
        self.nbops.linear(self.x, self.w, activation="gelu", out=self.d, impl="nbops")

    def time_unfused(self, shape, dtype):
        nb = self.nbops
        nb.gelu(nb.matmul(self.x, self.w.T, out=self.c, impl="nbops"), out=self.d)

    def time_unfused_in_place(self, shape, dtype):
        nb = self.nbops
        nb.gelu(nb.matmul(self.x, self.w.T, out=self.c, impl="nbops"), out=self.c)

    def time_fused_allocating(self, shape, dtype):
        self.nbops.linear(self.x, self.w, activation="gelu", impl="nbops")

    def time_unfused_allocating(self, shape, dtype):
        self.nbops.gelu(self.nbops.matmul(self.x, self.w.T, impl="nbops"))

    def time_fused_bias(self, shape, dtype):
        self.nbops.linear(self.x, self.w, self.bias, "gelu", out=self.c, impl="nbops")

    def time_unfused_bias(self, shape, dtype):
        nb = self.nbops
        y = nb.matmul(self.x, self.w.T, out=self.c, impl="nbops")
        nb.add(y, self.bias, out=y)
        nb.gelu(y, out=y)


class SmallBatched:
    """Stacks of small products: batch x (n x n) @ (n x n). The default
    config sends them to the non-packing small-product route;
    ``time_nbops_packed`` runs the packed kernel on the same stack
    (``SMALL=0``). Target: nbops at least 2x ``numpy.matmul`` at 2 threads."""

    params = [[(4096, 32), (512, 64)], ["float32", "float64"]]
    param_names = ["batch_n", "dtype"]

    def setup(self, batch_n, dtype):
        import nbops
        from nbops import _formulas, linalg
        from nbops.cpu import linalg as cpu

        batch, n = batch_n
        self.nbops = nbops
        self.a, self.b = _rand((batch, n, n), dtype), _rand((batch, n, n), dtype, 1)
        self.c = np.empty((batch, n, n), dtype)
        abuf, offa, sam, sak = linalg._operand("matmul", "a", self.a, (batch,))
        bbuf, offb, sbk, sbn = linalg._operand("matmul", "b", self.b, (batch,))
        args = (abuf, offa, sam, sak, bbuf, offb, sbk, sbn, self.c, n, n, n,
                np.empty(0, dtype), 0, _formulas.params(dtype), _formulas.consts(dtype))
        plan = linalg.plan_gemm(batch, n, n, n, sak, sbk, sbn,
                                dict(linalg.DEFAULT_CONFIG, SMALL=0, STREAM=0))
        self.packed = lambda: cpu.gemm(*args, plan)
        _warm(lambda: nbops.matmul(self.a, self.b, out=self.c, impl="nbops"))
        _warm(self.packed)

    def time_numpy(self, batch_n, dtype):
        np.matmul(self.a, self.b, out=self.c)

    def time_nbops(self, batch_n, dtype):
        self.nbops.matmul(self.a, self.b, out=self.c, impl="nbops")

    def time_nbops_packed(self, batch_n, dtype):
        self.packed()


def timeraw_first_matmul():
    """Import plus a first float32 matmul: after the first run the kernels
    load from Numba's cache (a cold compile takes tens of seconds)."""
    return ("import os; os.environ['NBOPS_AUTOTUNE'] = '0'\n"
            "import numpy as np, nbops\n"
            "a = np.ones((64, 64), np.float32); nbops.matmul(a, a, impl='nbops')")
