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
    """Unmasked attention, nbops beside the NumPy formulation."""

    params = [[512, 1024, 2048, 4096]]
    param_names = ["L"]
    timeout = 600
    causal = False

    def setup(self, L):
        if L >= 4096 and os.environ.get("NBOPS_BENCH_QUICK", "0") not in ("", "0"):
            raise NotImplementedError("L=4096 skipped (NBOPS_BENCH_QUICK=1)")
        import nbops
        from nbops.bench.attention import B, D, H, attention_numpy

        self.nbops, self.numpy_impl = nbops, attention_numpy
        rng = np.random.default_rng(0)
        self.q, self.k, self.v = (rng.standard_normal((B, H, L, D)).astype(np.float32)
                                  for _ in range(3))
        self.out = np.zeros_like(self.q)
        # compile or load from the cache outside the measurement
        nbops.scaled_dot_product_attention(self.q[:1, :1, :16], self.k[:1, :1, :16],
                                           self.v[:1, :1, :16], causal=self.causal)

    def time_nbops(self, L):
        self.nbops.scaled_dot_product_attention(self.q, self.k, self.v, causal=self.causal,
                                                out=self.out)

    def time_numpy(self, L):
        self.numpy_impl(self.q, self.k, self.v, self.out)

    def peakmem_nbops(self, L):
        self.time_nbops(L)

    def peakmem_numpy(self, L):
        self.time_numpy(L)


class AttentionCausal(Attention):
    """Causal attention (tiles above the diagonal skipped): about half the
    work of the unmasked case."""

    causal = True
    time_numpy = peakmem_numpy = None
