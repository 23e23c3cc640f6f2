"""Benchmark cases of conv2d, the depthwise kernel and the fused
conv + batch norm + relu, and the issue's fixed shapes beside NumPy and
onnxruntime.

The NumPy baseline is the fastest honest NumPy formulation of a
convolution: im2col through ``sliding_window_view`` (one copy, made by the
reshape) and one ``matmul`` on BLAS; depthwise convolutions as
``einsum`` over the same windows (a per-channel product has no GEMM).

:func:`compare` measures ResNet-50's layer shapes at batch 1 and 8 (3x3
64->64 at 56x56, 1x1 256->64 at 56x56, 3x3 256->256 at 14x14, the 7x7
stride-2 stem), MobileNet depthwise shapes, and conv + bn + relu fused
against nbops' three separate ops, each beside NumPy and (when installed)
onnxruntime with a preallocated output (I/O binding), interleaved in one
run. Run it as ``NUMBA_NUM_THREADS=2 python -m nbops.bench.conv``.
"""

import time

import numpy as np

import nbops

from .harness import fmt_time, spec_cases, time_interleaved

EPS = 1e-5

#: name -> (N, C, H, W, CO, k, stride, padding, groups)
SHAPES = {
    "3x3_64_56_b1": (1, 64, 56, 56, 64, 3, 1, 1, 1),
    "1x1_256_56_b1": (1, 256, 56, 56, 64, 1, 1, 0, 1),
    "3x3_256_14_b1": (1, 256, 14, 14, 256, 3, 1, 1, 1),
    "stem_7x7s2_b1": (1, 3, 224, 224, 64, 7, 2, 3, 1),
    "3x3_64_56_b8": (8, 64, 56, 56, 64, 3, 1, 1, 1),
    "1x1_256_56_b8": (8, 256, 56, 56, 64, 1, 1, 0, 1),
    "3x3_256_14_b8": (8, 256, 14, 14, 256, 3, 1, 1, 1),
    "stem_7x7s2_b8": (8, 3, 224, 224, 64, 7, 2, 3, 1),
    "dw3x3_32_112": (1, 32, 112, 112, 32, 3, 1, 1, 32),
    "dw3x3_144_56": (1, 144, 56, 56, 144, 3, 1, 1, 144),
    "dw3x3s2_144_56": (1, 144, 56, 56, 144, 3, 2, 1, 144),
    "cbr_3x3_64_56_b8": (8, 64, 56, 56, 64, 3, 1, 1, 1),
    "cbr_1x1_256_56_b1": (1, 256, 56, 56, 64, 1, 1, 0, 1),
    "cbr_dw3x3_144_56": (1, 144, 56, 56, 144, 3, 1, 1, 144),
    "cbr_dw3x3_32_112": (1, 32, 112, 112, 32, 3, 1, 1, 32),
}


# ---------------------------------------------------------------------------
# NumPy baselines


def conv2d_numpy(x, w, stride, padding, groups, out=None):
    """im2col (``sliding_window_view`` + one copy) and a BLAS matmul per
    group; depthwise (one input channel per group) as ``einsum``."""
    n, c, _, _ = x.shape
    co, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding))) if padding else x
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]  # (N, C, OH, OW, kh, kw)
    oh, ow = win.shape[2:4]
    if out is None:
        out = np.empty((n, co, oh, ow), x.dtype)
    if cg == 1 and groups == c and co == c:
        np.einsum("ncyxij,cij->ncyx", win, w[:, 0], out=out, optimize=True)
        return out
    mg = co // groups
    for g in range(groups):
        cols = win[:, g * cg:(g + 1) * cg].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, -1)
        res = cols @ w[g * mg:(g + 1) * mg].reshape(mg, -1).T
        out[:, g * mg:(g + 1) * mg] = res.reshape(n, oh, ow, mg).transpose(0, 3, 1, 2)
    return out


def conv_bn_relu_numpy(x, w, mean, var, gamma, beta, stride, padding, out, groups=1):
    conv2d_numpy(x, w, stride, padding, groups, out)
    sh = (1, -1, 1, 1)
    out -= mean.reshape(sh)
    out *= (gamma / np.sqrt(var + EPS)).reshape(sh)
    out += beta.reshape(sh)
    np.maximum(out, 0, out=out)
    return out


# ---------------------------------------------------------------------------
# Harness cases (python -m nbops bench, asv): sizes from the element count;
# the cases are the Bench entries of conv2d's spec (nbops/conv.py), which
# name the setups, baselines and options below


def _side(n, c):
    return max(8, min(112, int((n / c) ** 0.5)))


def _setup_dense(k):
    def setup(n, dtype, rng):
        s = _side(n, 64)
        x = rng.standard_normal((1, 64, s, s)).astype(dtype)
        w = (rng.standard_normal((64, 64, k, k)) / (8 * k)).astype(dtype)
        return x, w
    return setup


setup_3x3 = _setup_dense(3)
setup_1x1 = _setup_dense(1)


def setup_depthwise(n, dtype, rng):
    s = _side(n, 32)
    return (rng.standard_normal((1, 32, s, s)).astype(dtype),
            rng.standard_normal((32, 1, 3, 3)).astype(dtype))


def conv2d_3x3_numpy(x, w, out):
    return conv2d_numpy(x, w, 1, 1, 1, out)


def conv2d_1x1_numpy(x, w, out):
    return conv2d_numpy(x, w, 1, 0, 1, out)


def conv2d_depthwise_numpy(x, w, out):
    return conv2d_numpy(x, w, 1, 1, 32, out)


def out_like(inputs):
    x, w = inputs
    return (x.shape[0], w.shape[0], x.shape[2], x.shape[3]), x.dtype


def flops(inputs):
    x, w = inputs
    return 2 * x.shape[0] * x.shape[2] * x.shape[3] * w.size


# one case per Bench entry of the specs: conv2d_3x3, conv2d_1x1, conv2d_depthwise_3x3
CASES = spec_cases(nbops.conv.SPECS.values(), None)


# ---------------------------------------------------------------------------
# The shapes beside NumPy and onnxruntime


def inputs(name, dtype=np.float32, seed=0):
    """``(x, w, mean, var, gamma, beta)`` for the named shape."""
    n, c, h, wd, co, k, s, p, g = SHAPES[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(dtype)
    w = (rng.standard_normal((co, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(dtype)
    mean = (0.1 * rng.standard_normal(co)).astype(dtype)
    var = (1 + rng.random(co)).astype(dtype)
    gamma = (1 + 0.1 * rng.standard_normal(co)).astype(dtype)
    beta = (0.1 * rng.standard_normal(co)).astype(dtype)
    return x, w, mean, var, gamma, beta


def out_shape(name):
    n, c, h, wd, co, k, s, p, g = SHAPES[name]
    return (n, co, (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1)


def calls(name, args, out):
    """``{side: f}`` each writing ``out``: "nbops", "numpy", "onnxruntime"
    (when installed) and, for the fused shapes ("cbr_..."), "nbops 3 ops"
    (conv2d, batch_norm, relu as three calls)."""
    x, w, mean, var, gamma, beta = args
    _, _, _, _, _, _, s, p, g = SHAPES[name]
    if name.startswith("cbr_"):
        tmp = np.empty_like(out)
        fns = {"nbops": lambda: nbops.conv_bn_relu(x, w, None, mean, var, gamma, beta,
                                                   eps=EPS, stride=s, padding=p, groups=g,
                                                   out=out),
               "nbops 3 ops": lambda: nbops.relu(
                   nbops.batch_norm(nbops.conv2d(x, w, stride=s, padding=p, groups=g, out=tmp),
                                    mean, var, gamma, beta, eps=EPS, out=out), out=out),
               "numpy": lambda: conv_bn_relu_numpy(x, w, mean, var, gamma, beta, s, p, out, g)}
    else:
        fns = {"nbops": lambda: nbops.conv2d(x, w, stride=s, padding=p, groups=g, out=out),
               "numpy": lambda: conv2d_numpy(x, w, s, p, g, out)}
    ort = onnxruntime_call(name, args, out)
    if ort is not None:
        fns["onnxruntime"] = ort
    return fns


def onnxruntime_call(name, args, out, threads=2):
    """onnxruntime running the op into ``out`` (I/O binding), or None when
    onnx/onnxruntime are missing. The fused shapes run Conv,
    BatchNormalization and Relu, which onnxruntime fuses itself."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    x, w, mean, var, gamma, beta = args
    _, _, _, _, _, k, s, p, g = SHAPES[name]
    conv_out = "C" if name.startswith("cbr_") else "Y"
    nodes = [helper.make_node("Conv", ["X", "W"], [conv_out], kernel_shape=[k, k],
                              strides=[s, s], pads=[p, p, p, p], group=g)]
    inits = [numpy_helper.from_array(w, "W")]
    if name.startswith("cbr_"):
        nodes += [helper.make_node("BatchNormalization", ["C", "G", "B", "M", "V"], ["Z"],
                                   epsilon=EPS),
                  helper.make_node("Relu", ["Z"], ["Y"])]
        inits += [numpy_helper.from_array(a, n) for a, n in
                  ((gamma, "G"), (beta, "B"), (mean, "M"), (var, "V"))]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(out.shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    io.bind_cpu_input("X", x)
    io.bind_output("Y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)

    def run():
        sess.run_with_iobinding(io)
        return out

    return run


def compare(names=tuple(SHAPES), rounds=7, write=print):
    """Measure every named shape; returns ``{name: {side: seconds}}`` and
    writes a table of medians, GFLOP/s and each side's time relative to
    nbops (> 1: nbops is faster). The fused rows also give the output
    bytes that fusion saves: the three-op path writes the output and reads
    it back twice more (batch norm, relu), 4 extra passes over it."""
    results = {}
    write(f"{'shape':<18} {'side':<12} {'median':>9} {'GFLOP/s':>8} {'t / nbops':>9}")
    for name in names:
        args = inputs(name)
        out = np.empty(out_shape(name), np.float32)
        fns = calls(name, args, out)
        for f in fns.values():  # compile / warm up outside the timing
            f()
        time.sleep(0.2)
        sides = list(fns)
        times = dict(zip(sides, time_interleaved([fns[s] for s in sides], rounds=rounds,
                                                 pause=0.1)))
        results[name] = times
        flops = 2 * out.size * args[1][0].size
        for side in sides:
            t = times[side]
            write(f"{name:<18} {side:<12} {fmt_time(t):>9} {flops / t * 1e-9:8.1f} "
                  f"{t / times['nbops']:8.2f}x")
        if name.startswith("cbr_"):
            write(f"{'':<18} fused saves {4 * out.nbytes / 2**20:.1f} MiB of output traffic "
                  f"(2 reads + 2 writes of {out.nbytes / 2**20:.1f} MiB)")
    return results


if __name__ == "__main__":
    compare()
