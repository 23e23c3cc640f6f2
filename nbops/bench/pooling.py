"""Benchmark cases of the pooling operators, and the issue's shape beside a
copy, NumPy and onnxruntime.

``CASES`` (for ``python -m nbops bench`` and asv) pool ResNet's stem
output: (N, 64, 112, 112) planes, N from the harness' element count ``n``
(small ``n`` shrinks the planes). Baselines are the NumPy formulations a
careful user writes: the padded input's ``sliding_window_view`` reduced
with ``max``/``mean`` into ``out``.

:func:`compare` measures max pool 3x3/2 pad 1 and average pool 3x3/2 pad 1
on [8, 64, 112, 112] float32 beside a parallel copy, NumPy and (when
installed) onnxruntime's MaxPool/AveragePool with a preallocated output
(I/O binding), interleaved in one run. A pool must move its input once and
its output once; "of copy" compares that rate with the copy's. Run it as
``NUMBA_NUM_THREADS=2 python -m nbops.bench.pooling``.
"""

import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import nbops

from .harness import fmt_time, parallel_copy, spec_cases, time_interleaved

CHANNELS, PLANE = 64, (112, 112)
# the window of the specs' bench entries (nbops/pooling.py), for the baselines
K, S, P = 3, 2, 1


def setup_planes(n, dtype, rng):
    """``(x,)``: (N, 64, 112, 112) planes of about ``n`` elements (smaller
    square planes below one image)."""
    hw = PLANE[0] * PLANE[1]
    if n >= CHANNELS * hw:
        shape = (n // (CHANNELS * hw), CHANNELS) + PLANE
    else:
        side = max(K, int((n / CHANNELS) ** 0.5))
        shape = (1, CHANNELS, side, side)
    return (rng.standard_normal(shape).astype(dtype),)


def out_shape(inputs):
    """``(shape, dtype)`` of the pooled ``inputs[0]``."""
    x = inputs[0]
    o = [(s + 2 * P - K) // S + 1 for s in x.shape[2:]]
    return (x.shape[0], x.shape[1], *o), x.dtype


_out_shape = out_shape  # the name benchmarks/bench_pooling.py uses


def _windows(x, fill):
    padded = np.pad(x, ((0, 0), (0, 0), (P, P), (P, P)), constant_values=fill)
    return sliding_window_view(padded, (K, K), axis=(2, 3))[:, :, ::S, ::S]


def max_pool_numpy(x, out):
    return np.max(_windows(x, -np.inf), axis=(-2, -1), out=out)


def avg_pool_numpy(x, out):
    # count_include_pad=True: zero padding counts in the mean
    return np.mean(_windows(x, 0), axis=(-2, -1), out=out)


# one case per Bench entry of the specs (nbops/pooling.py)
CASES = spec_cases([nbops.get_operator(n).spec for n in ("max_pool2d", "avg_pool2d")], None)


# ---------------------------------------------------------------------------
# The shape beside copy, NumPy and onnxruntime

SHAPE = (8, 64, 112, 112)
OPS = {
    "max_pool2d": (lambda x, out: nbops.max_pool2d(x, K, S, P, out=out), max_pool_numpy,
                   "MaxPool"),
    "avg_pool2d": (lambda x, out: nbops.avg_pool2d(x, K, S, P, out=out), avg_pool_numpy,
                   "AveragePool"),
}


def onnx_node_call(op_type, x, out, threads=2, opset=17, **attrs):
    """A function running one ONNX node ``op_type(X) -> Y`` in onnxruntime
    into ``out`` (I/O binding: no allocation per call), or None when onnx or
    onnxruntime are not installed (they are benchmark extras)."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    elem = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.DOUBLE
    graph = helper.make_graph(
        [helper.make_node(op_type, ["X"], ["Y"], **attrs)], op_type,
        [helper.make_tensor_value_info("X", elem, list(x.shape))],
        [helper.make_tensor_value_info("Y", elem, list(out.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    io.bind_cpu_input("X", x)
    io.bind_output("Y", "cpu", 0, x.dtype, list(out.shape), out.ctypes.data)

    def run():
        sess.run_with_iobinding(io)
        return out

    return run


def calls(name, x, out, copy_out):
    """``{"nbops", "numpy", "copy", "onnxruntime"}`` functions (the last
    only when installed); the copy moves x into ``copy_out``."""
    mine, numpy_side, onnx_op = OPS[name]
    fns = {"nbops": lambda: mine(x, out), "numpy": lambda: numpy_side(x, out)}
    flat_in, flat_out = x.reshape(-1), copy_out.reshape(-1)
    fns["copy"] = lambda: parallel_copy(flat_in, flat_out)
    ort = onnx_node_call(onnx_op, x, out, kernel_shape=[K, K], strides=[S, S],
                         pads=[P, P, P, P])
    if ort is not None:
        fns["onnxruntime"] = ort
    return fns


def compare(names=tuple(OPS), rounds=7, write=print):
    """Measure the named pools on :data:`SHAPE`; returns ``{name: {side:
    seconds}}`` and writes each side's time, GB/s, fraction of the copy's
    rate and time relative to nbops."""
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    out = np.empty(out_shape((x,))[0], np.float32)
    copy_out = np.empty_like(x)
    results = {}
    write(f"{'op':<12} {'side':<12} {'median':>9} {'GB/s':>6} {'of copy':>8} {'vs nbops':>9}")
    for name in names:
        fns = calls(name, x, out, copy_out)
        for f in fns.values():
            f()
        time.sleep(0.2)
        sides = list(fns)
        times = dict(zip(sides, time_interleaved([fns[s] for s in sides], rounds=rounds,
                                                 pause=0.1)))
        results[name] = times
        moved = {s: x.nbytes + out.nbytes for s in sides}
        moved["copy"] = 2 * x.nbytes
        copy_rate = moved["copy"] / times["copy"]
        for side in sides:
            rate = moved[side] / times[side]
            write(f"{name:<12} {side:<12} {fmt_time(times[side]):>9} {rate * 1e-9:6.1f} "
                  f"{rate / copy_rate:8.0%} {times[side] / times['nbops']:8.2f}x")
    return results


if __name__ == "__main__":
    compare()
