"""asv suites of nbops.pooling: the harness cases (``time_nbops_out`` beside
``time_numpy_out``, NumPy's ``sliding_window_view`` formulation), and the
issue's shape, max and average pool 3x3/2 pad 1 on [8, 64, 112, 112]
float32, timed for nbops, NumPy, onnxruntime (MaxPool/AveragePool with a
preallocated output; skipped when not installed) and a parallel copy of the
input. A pool moves its input and output once (32 MB here), the copy twice
the input (51 MB): read "of copy" as ``(32 / t_pool) / (51 / t_copy)``.
``python -m nbops.bench.pooling`` prints these figures directly."""

import numpy as np

from . import common


class Pooling(common.CaseSuite):
    """max_pool2d and avg_pool2d 3x3/2 pad 1 on (N, 64, 112, 112) planes."""

    params = common.case_params("pooling", dtypes=["float32"])


class ResNetStemPool:
    """The issue's shape, one side per benchmark (read the ratios)."""

    params = [["max_pool2d", "avg_pool2d"], ["nbops", "numpy", "onnxruntime", "copy"]]
    param_names = ["op", "side"]
    timeout = 300

    def setup(self, op, side):
        try:
            from nbops.bench import pooling
        except ImportError as exc:
            raise NotImplementedError(f"nbops.bench.pooling is not there: {exc}") from None
        x = np.random.default_rng(0).standard_normal(pooling.SHAPE).astype(np.float32)
        out = np.empty(pooling._out_shape((x,))[0], np.float32)
        fns = pooling.calls(op, x, out, np.empty_like(x))
        if side not in fns:
            raise NotImplementedError(f"{side} is not installed")
        self.fn = fns[side]
        self.fn()  # compile, or load from the cache, outside the timing

    def time_pool(self, op, side):
        self.fn()
