"""Benchmark cases of batch norm, layer norm and RMS norm, and the issue's
fixed shapes beside a copy, NumPy and onnxruntime.

``CASES`` (for ``python -m nbops bench`` and asv) size the inputs from the
harness' element count ``n``: layer and RMS norm over rows of 768 (a
Transformer's width), batch norm over (N, 64, 56, 56) (a ResNet stage;
small ``n`` shrinks the planes). Baselines are the formulas in NumPy,
written as a careful user would (statistics with ``mean``/``var``, the
normalisation in place into ``out``).

:func:`compare` measures the shapes the issues name, layer norm over
[32, 512, 768] and batch norm on [8, 64, 56, 56] in evaluation and in
training, each beside a parallel copy of the same bytes, NumPy and (when
installed) onnxruntime's LayerNormalization / BatchNormalization run with
a preallocated output (I/O binding), all interleaved in one run. Run it as
``python -m nbops.bench.normalization`` (2 threads: ``NUMBA_NUM_THREADS=2``).
"""

import time

import numpy as np

import nbops

from .harness import fmt_time, parallel_copy, spec_cases, time_interleaved

WIDTH = 768          # layer/RMS norm row length
CHANNELS, PLANE = 64, (56, 56)
EPS = 1e-5


# ---------------------------------------------------------------------------
# Inputs


def setup_rows(n, dtype, rng):
    """``(x, normalized_shape, weight, bias)`` of layer norm over rows."""
    d = min(WIDTH, n)
    x = rng.standard_normal((max(1, n // d), d)).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(dtype)
    b = (0.1 * rng.standard_normal(d)).astype(dtype)
    return x, (d,), w, b


def setup_rms_rows(n, dtype, rng):
    """``(x, normalized_shape, weight)`` of RMS norm over rows."""
    return setup_rows(n, dtype, rng)[:3]


def setup_channels(n, dtype, rng):
    """``(x, running_mean, running_var, weight, bias)`` of batch norm."""
    hw = PLANE[0] * PLANE[1]
    c = min(CHANNELS, max(1, n // 4))
    if n >= CHANNELS * hw:
        shape = (n // (CHANNELS * hw), CHANNELS) + PLANE
    else:
        shape = (2, c, 1, max(1, n // (2 * c)))
    x = (1 + rng.standard_normal(shape)).astype(dtype)
    c = shape[1]
    rm = (0.1 * rng.standard_normal(c)).astype(dtype)
    rv = (1 + rng.random(c)).astype(dtype)
    w = (1 + 0.1 * rng.standard_normal(c)).astype(dtype)
    b = (0.1 * rng.standard_normal(c)).astype(dtype)
    return x, rm, rv, w, b


# ---------------------------------------------------------------------------
# NumPy baselines (into out)


def layer_norm_numpy(x, normalized_shape, w, b, out):
    mean = x.mean(axis=-1, keepdims=True)
    np.subtract(x, mean, out=out)
    var = np.mean(np.square(out), axis=-1, keepdims=True)
    out *= 1 / np.sqrt(var + EPS)
    out *= w
    out += b
    return out


def rms_norm_numpy(x, normalized_shape, w, out):
    ms = np.mean(np.square(x), axis=-1, keepdims=True)
    np.multiply(x, 1 / np.sqrt(ms + EPS), out=out)
    out *= w
    return out


def _per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm_eval_numpy(x, rm, rv, w, b, out):
    scale = w / np.sqrt(rv + EPS)
    np.subtract(x, _per_channel(rm, x.ndim), out=out)
    out *= _per_channel(scale, x.ndim)
    out += _per_channel(b, x.ndim)
    return out


def batch_norm_train_numpy(x, rm, rv, w, b, out):
    """Batch statistics, the running update and the normalisation."""
    axes = (0,) + tuple(range(2, x.ndim))
    mean = x.mean(axis=axes)
    np.subtract(x, _per_channel(mean, x.ndim), out=out)
    var = np.mean(np.square(out), axis=axes)
    count = x.size // x.shape[1]
    rm *= 0.9
    rm += 0.1 * mean
    rv *= 0.9
    rv += 0.1 * var * (count / (count - 1))
    out *= _per_channel(w / np.sqrt(var + EPS), x.ndim)
    out += _per_channel(b, x.ndim)
    return out


def batch_norm_train_reference(x, rm, rv, w, b):
    """The baseline on copies of the running statistics (it updates them)."""
    return batch_norm_train_numpy(x, rm.copy(), rv.copy(), w, b, np.empty_like(x))


def _copies(inputs):
    # training updates the running statistics in place: each side gets its own
    return tuple(a.copy() for a in inputs)


# one case per Bench entry of the specs (nbops/normalization.py)
CASES = spec_cases(nbops.normalization.SPECS.values(), None)


# ---------------------------------------------------------------------------
# The issues' shapes beside copy, NumPy and onnxruntime


#: name -> (shape, what): the shapes issues 5 and 6 set targets for.
SHAPES = {
    "layer_norm": ((32, 512, 768), "layer norm over the last axis"),
    "batch_norm_eval": ((8, 64, 56, 56), "batch norm, running statistics"),
    "batch_norm_train": ((8, 64, 56, 56), "batch norm, batch statistics"),
}


def inputs(name, dtype=np.float32, seed=0):
    """Float32 inputs of the named shape: ``(x, *parameters)``."""
    rng = np.random.default_rng(seed)
    shape = SHAPES[name][0]
    if name == "layer_norm":
        d = shape[-1]
        return ((rng.standard_normal(shape)).astype(dtype),
                (1 + 0.1 * rng.standard_normal(d)).astype(dtype),
                (0.1 * rng.standard_normal(d)).astype(dtype))
    c = shape[1]
    return ((1 + rng.standard_normal(shape)).astype(dtype),
            (0.1 * rng.standard_normal(c)).astype(dtype), (1 + rng.random(c)).astype(dtype),
            (1 + 0.1 * rng.standard_normal(c)).astype(dtype),
            (0.1 * rng.standard_normal(c)).astype(dtype))


def calls(name, args, out):
    """``{"nbops": f, "numpy": f, "copy": f, "onnxruntime": f}``, each writing
    ``out`` (onnxruntime only when it is installed and can build the op)."""
    x = args[0]
    if name == "layer_norm":
        x_, w, b = args
        fns = {"nbops": lambda: nbops.layer_norm(x_, tuple(x_.shape)[-1], w, b, eps=EPS,
                                                 out=out),
               "numpy": lambda: layer_norm_numpy(x_, w, b, out)}
    elif name == "batch_norm_eval":
        fns = {"nbops": lambda: nbops.batch_norm(*args, eps=EPS, out=out),
               "numpy": lambda: batch_norm_eval_numpy(*args, out)}
    else:
        mine, theirs = _copies(args), _copies(args)
        fns = {"nbops": lambda: nbops.batch_norm(*mine, training=True, eps=EPS, out=out),
               "numpy": lambda: batch_norm_train_numpy(*theirs, out)}
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    fns["copy"] = lambda: parallel_copy(flat_in, flat_out)
    ort = onnxruntime_call(name, args, out)
    if ort is not None:
        fns["onnxruntime"] = ort
    return fns


def onnxruntime_call(name, args, out, threads=2):
    """A function running the op in onnxruntime into ``out`` (I/O binding,
    no allocation per call), or None when onnx/onnxruntime are missing.
    Training-mode batch norm has no inference op: None."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    if name == "batch_norm_train":
        return None
    x = args[0]
    f32 = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.DOUBLE
    shape = list(x.shape)
    if name == "layer_norm":
        names = ["X", "W", "B"]
        node = helper.make_node("LayerNormalization", names, ["Y"], axis=-1, epsilon=EPS)
        opset = 17
    else:
        names = ["X", "W", "B", "M", "V"]
        args = (args[0], args[3], args[4], args[1], args[2])
        node = helper.make_node("BatchNormalization", names, ["Y"], epsilon=EPS)
        opset = 15
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(n, f32, list(a.shape)) for n, a in zip(names, args)],
        [helper.make_tensor_value_info("Y", f32, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for n, a in zip(names, args):
        io.bind_cpu_input(n, a)
    io.bind_output("Y", "cpu", 0, x.dtype, shape, out.ctypes.data)

    def run():
        sess.run_with_iobinding(io)
        return out

    return run


def compare(names=tuple(SHAPES), rounds=11, write=print):
    """Measure every named shape; returns ``{name: {side: seconds}}`` and
    writes a table with GB/s, the fraction of the copy's bandwidth and the
    speed relative to NumPy and onnxruntime."""
    results = {}
    write(f"{'op':<18} {'shape':<16} {'side':<12} {'median':>9} {'GB/s':>6} "
          f"{'of copy':>8} {'nbops x':>8}")
    for name in names:
        args = inputs(name)
        out = np.empty_like(args[0])
        fns = calls(name, args, out)
        for f in fns.values():  # compile / warm up outside the timing
            f()
        time.sleep(0.2)
        sides = list(fns)
        times = dict(zip(sides, time_interleaved([fns[s] for s in sides], rounds=rounds,
                                                 pause=0.1)))
        results[name] = times
        nbytes = 2 * args[0].nbytes  # read x once, write y once
        for side in sides:
            t = times[side]
            write(f"{name:<18} {'x'.join(map(str, args[0].shape)):<16} {side:<12} "
                  f"{fmt_time(t):>9} {nbytes / t * 1e-9:6.1f} {times['copy'] / t:8.0%} "
                  f"{t / times['nbops']:7.2f}x")
    return results


if __name__ == "__main__":
    compare()
