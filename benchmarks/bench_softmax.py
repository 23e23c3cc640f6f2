"""asv suites of nbops.softmax: the harness cases (rows of 512 and the
middle axis of (N, 64, 512), beside NumPy's stable formula into ``out``),
and the issue's [16, 8, 512, 512] float32 over the last axis, timed for
nbops, NumPy, onnxruntime (Softmax/LogSoftmax, preallocated output; skipped
when not installed) and a parallel copy of the same bytes (read + write
once each, as softmax must). ``python -m nbops.bench.softmax`` prints the
ratios directly."""

import numpy as np

from . import common


class Softmax(common.CaseSuite):
    """softmax, log_softmax and softmax over a middle axis."""

    params = common.case_params("softmax")


class AttentionScores:
    """The issue's shape, one side per benchmark (read the ratios)."""

    params = [["softmax", "log_softmax"], ["nbops", "numpy", "onnxruntime", "copy"]]
    param_names = ["op", "side"]
    timeout = 300

    def setup(self, op, side):
        try:
            from nbops.bench import softmax as bench
            from nbops.bench.harness import parallel_copy
            from nbops.bench.pooling import onnx_node_call
        except ImportError as exc:
            raise NotImplementedError(f"nbops.bench.softmax is not there: {exc}") from None
        x = (3 * np.random.default_rng(0).standard_normal(bench.SHAPE)).astype(np.float32)
        out = np.empty_like(x)
        mine, numpy_side, onnx_op = bench.OPS[op]
        if side == "nbops":
            self.fn = lambda: mine(x, out=out)
        elif side == "numpy":
            self.fn = lambda: numpy_side(x, out)
        elif side == "copy":
            self.fn = lambda: parallel_copy(x.reshape(-1), out.reshape(-1))
        else:
            self.fn = onnx_node_call(onnx_op, x, out, opset=13, axis=-1)
            if self.fn is None:
                raise NotImplementedError("onnxruntime is not installed")
        self.fn()  # compile, or load from the cache, outside the timing

    def time_softmax(self, op, side):
        self.fn()
