"""asv suites of nbops.conv: conv2d (3x3, 1x1, depthwise 3x3) beside NumPy's
im2col + BLAS at the harness sizes, and the issue's fixed shapes (ResNet-50
layers at batch 1 and 8, MobileNet depthwise layers, conv + bn + relu fused
against three nbops ops) beside NumPy and onnxruntime (skipped where it is
not installed). Read a ratio as ``time_issue_shape(shape, "numpy") /
time_issue_shape(shape, "nbops")``. Run with 2 threads
(``NUMBA_NUM_THREADS=2``) on an otherwise idle machine.
"""

import os

import numpy as np

from . import common

os.environ.setdefault("NBOPS_AUTOTUNE", "0")


class Conv(common.CaseSuite):
    """conv2d 3x3, 1x1 and depthwise 3x3 at 1M and 16M-element budgets."""

    params = common.case_params("conv")


def _shape_names():
    try:
        from nbops.bench import conv as cases
    except ImportError:
        return []
    return list(cases.SHAPES)


class IssueShapes:
    """The shapes issue 5 sets targets for, every side in one suite."""

    params = [_shape_names(), ["nbops", "numpy", "onnxruntime", "nbops 3 ops"]]
    param_names = ["shape", "side"]
    timeout = 600

    def setup(self, name, side):
        try:
            from nbops.bench import conv as cases
        except ImportError as exc:
            raise NotImplementedError(f"nbops.bench.conv is not there: {exc}") from None
        args = cases.inputs(name)
        self.out = np.empty(cases.out_shape(name), np.float32)
        fns = cases.calls(name, args, self.out)
        if side not in fns:
            raise NotImplementedError(f"{side} does not run {name}")
        self.fn = fns[side]
        self.fn()  # compile, or load from the cache, outside the timing

    def time_issue_shape(self, name, side):
        self.fn()
