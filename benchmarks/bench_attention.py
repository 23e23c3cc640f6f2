"""asv suites of nbops.attention: the fused scaled_dot_product_attention
beside the NumPy formulation (matmul, stable softmax, matmul) at the issue's
shapes, B=4, H=8, D=64, float32, in time and in peak memory (``peakmem_``:
the process's peak RSS, inputs included; nbops grows linearly in L, NumPy's
L x L scores quadratically). 8.6 GFLOP at L=1024 (``4 B H L^2 D``).

L=4096 (a 2 GiB score matrix for NumPy) is skipped when
``NBOPS_BENCH_QUICK=1``. ``python -m nbops.bench.attention`` prints the
same sweep with GFLOP/s, ratios and extra peak memory.
"""

import os

import numpy as np

os.environ.setdefault("NBOPS_AUTOTUNE", "0")


class Attention:
    params = [[512, 1024, 2048, 4096], ["causal", "full"]]
    param_names = ["L", "mask"]
    timeout = 600

    def setup(self, L, mask):
        if L >= 4096 and os.environ.get("NBOPS_BENCH_QUICK", "0") not in ("", "0"):
            raise NotImplementedError("L=4096 skipped (NBOPS_BENCH_QUICK=1)")
        import nbops
        from nbops.bench.attention import B, D, H, attention_numpy

        self.nbops, self.numpy_impl = nbops, attention_numpy
        rng = np.random.default_rng(0)
        self.q, self.k, self.v = (rng.standard_normal((B, H, L, D)).astype(np.float32)
                                  for _ in range(3))
        self.out = np.zeros_like(self.q)
        self.causal = mask == "causal"
        # compile or load from the cache outside the measurement
        nbops.scaled_dot_product_attention(self.q[:1, :1, :16], self.k[:1, :1, :16],
                                           self.v[:1, :1, :16], causal=self.causal)

    def time_nbops(self, L, mask):
        self.nbops.scaled_dot_product_attention(self.q, self.k, self.v, causal=self.causal,
                                                out=self.out)

    def time_numpy(self, L, mask):
        if self.causal:
            raise NotImplementedError("the NumPy formulation is timed unmasked")
        self.numpy_impl(self.q, self.k, self.v, self.out)

    def peakmem_nbops(self, L, mask):
        self.time_nbops(L, mask)

    def peakmem_numpy(self, L, mask):
        self.numpy_impl(self.q, self.k, self.v, self.out)
