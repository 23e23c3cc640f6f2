"""asv suites of nbops.activations: every activation and its backward
beside the same math in NumPy/SciPy (``time_nbops_out`` / ``time_numpy_out``:
read the ratio off the two), memory use with allocated outputs, and the
cost of ``import nbops`` plus a first call in a fresh interpreter."""

import math

import numpy as np

from . import common


class Activations(common.CaseSuite):
    """Forward and backward ops, 1M and 16M elements, float32 and float64."""

    params = common.case_params("activations")


class GeluMemory:
    """Peak memory of gelu when the output is allocated: nbops writes one
    array, the NumPy formula makes temporaries of the input's size."""

    params = [[1 << 24], ["float32"]]
    param_names = ["size", "dtype"]

    def setup(self, n, dtype):
        import nbops

        self.x = np.random.default_rng(0).standard_normal(n).astype(dtype)
        nbops.gelu(self.x[:16])  # compile (or load) outside the measurement

    def peakmem_nbops_gelu(self, n, dtype):
        import nbops

        nbops.gelu(self.x)

    def peakmem_numpy_gelu(self, n, dtype):
        from scipy import special

        x = self.x
        x * 0.5 * (1 + special.erf(x / math.sqrt(2)))


def timeraw_import_nbops():
    """``import nbops`` in a fresh interpreter (compiles nothing)."""
    return "import nbops"


def timeraw_import_and_first_relu():
    """Import plus a first call: the kernel comes from the on-disk cache
    (after the first run of the suite), so this is the start-up cost a
    script pays."""
    return "import numpy as np, nbops\nnbops.relu(np.ones(16, np.float32))"
