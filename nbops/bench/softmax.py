"""Benchmark cases of softmax and log_softmax, and the issue's shape beside
a copy, NumPy and onnxruntime.

``CASES`` (for ``python -m nbops bench`` and asv) normalise rows of 512
(attention scores of a 512-token sequence), ``n // 512`` of them, plus
softmax over the middle axis of (n / 32768, 64, 512) to time the
column-block kernel. Baselines are the stable formulas in NumPy into
``out`` (max, subtract, exp, sum, divide), as a careful user writes them.

:func:`compare` measures the issue's [16, 8, 512, 512] float32 over the
last axis beside a parallel copy of the same bytes, NumPy and (when
installed) onnxruntime's Softmax/LogSoftmax with a preallocated output,
interleaved in one run. Run it as
``NUMBA_NUM_THREADS=2 python -m nbops.bench.softmax``.
"""

import time

import numpy as np

import nbops

from .harness import fmt_time, parallel_copy, spec_cases, time_interleaved
from .pooling import onnx_node_call

ROW = 512


def setup_rows(n, dtype, rng):
    d = min(ROW, n)
    return ((3 * rng.standard_normal((max(1, n // d), d))).astype(dtype),)


def setup_middle(n, dtype, rng):
    return ((3 * rng.standard_normal((max(1, n // (64 * ROW)), 64, ROW))).astype(dtype),)


def softmax_numpy(x, out, axis=-1):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out


def log_softmax_numpy(x, out, axis=-1):
    np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))
    return out


def softmax_numpy_axis1(x, out):
    return softmax_numpy(x, out, 1)


# one case per Bench entry of the specs (nbops/softmax.py)
CASES = spec_cases([nbops.get_operator(n).spec for n in ("softmax", "log_softmax")], None)


# ---------------------------------------------------------------------------
# The shape beside copy, NumPy and onnxruntime

SHAPE = (16, 8, 512, 512)
OPS = {
    "softmax": (nbops.softmax, softmax_numpy, "Softmax"),
    "log_softmax": (nbops.log_softmax, log_softmax_numpy, "LogSoftmax"),
}


def compare(names=tuple(OPS), rounds=11, write=print):
    """Measure the named ops on :data:`SHAPE` (last axis); returns ``{name:
    {side: seconds}}`` and writes time, GB/s (read x + write y), fraction
    of the copy's rate and time relative to nbops."""
    x = (3 * np.random.default_rng(0).standard_normal(SHAPE)).astype(np.float32)
    out = np.empty_like(x)
    results = {}
    write(f"{'op':<12} {'side':<12} {'median':>9} {'GB/s':>6} {'of copy':>8} {'vs nbops':>9}")
    for name in names:
        mine, numpy_side, onnx_op = OPS[name]
        fns = {"nbops": lambda: mine(x, out=out), "numpy": lambda: numpy_side(x, out),
               "copy": lambda: parallel_copy(x.reshape(-1), out.reshape(-1))}
        ort = onnx_node_call(onnx_op, x, out, opset=13, axis=-1)
        if ort is not None:
            fns["onnxruntime"] = ort
        for f in fns.values():
            f()
        time.sleep(0.2)
        sides = list(fns)
        times = dict(zip(sides, time_interleaved([fns[s] for s in sides], rounds=rounds,
                                                 pause=0.1)))
        results[name] = times
        nbytes = 2 * x.nbytes
        for side in sides:
            t = times[side]
            write(f"{name:<12} {side:<12} {fmt_time(t):>9} {nbytes / t * 1e-9:6.1f} "
                  f"{times['copy'] / t:8.0%} {t / times['nbops']:8.2f}x")
    return results


if __name__ == "__main__":
    compare()
