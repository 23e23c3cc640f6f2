"""asv suites of nbops.normalization: batch norm, layer norm and RMS norm
beside their NumPy formulas at the harness sizes, and the issues' fixed
shapes (layer norm over [32, 512, 768], batch norm on [8, 64, 56, 56] in
evaluation and training) beside a parallel copy of the same bytes, NumPy
and onnxruntime (skipped where it is not installed). Read the copy
fraction as ``time_issue_shape(op, "copy") / time_issue_shape(op, "nbops")``.
Run with 2 threads (``NUMBA_NUM_THREADS=2``) on an otherwise idle machine.
"""

import numpy as np

from . import common


class Normalization(common.CaseSuite):
    """layer_norm, rms_norm, batch_norm (eval and train), 1M and 16M elements."""

    params = common.case_params("normalization")


class IssueShapes:
    """The shapes issues 5 and 6 set targets for, every side in one suite."""

    params = [["layer_norm", "batch_norm_eval", "batch_norm_train"],
              ["nbops", "numpy", "copy", "onnxruntime"]]
    param_names = ["op", "side"]
    timeout = 300

    def setup(self, name, side):
        try:
            from nbops.bench import normalization as cases
        except ImportError as exc:
            raise NotImplementedError(f"nbops.bench.normalization is not there: {exc}") from None
        args = cases.inputs(name)
        self.out = np.empty_like(args[0])
        fns = cases.calls(name, args, self.out)
        if side not in fns:
            raise NotImplementedError(f"{side} cannot run {name} here")
        self.fn = fns[side]
        self.fn()  # compile, or load from the cache, outside the timing

    def time_issue_shape(self, name, side):
        self.fn()


class LayerNormMemory:
    """Peak memory with an allocated output: nbops writes one array, the
    NumPy formula makes temporaries of the input's size."""

    params = [[(32, 512, 768)]]
    param_names = ["shape"]

    def setup(self, shape):
        import nbops

        self.x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        nbops.layer_norm(self.x[:1], shape[-1])

    def peakmem_nbops_layer_norm(self, shape):
        import nbops

        nbops.layer_norm(self.x, shape[-1])

    def peakmem_numpy_layer_norm(self, shape):
        x = self.x
        (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
