"""ResNet-50 inference from nbops.nn modules, fused with fuse_modules, beside
onnxruntime running the same network and weights.

The layout is torchvision's (v1.5: the stride sits on each bottleneck's 3x3
convolution): a 7x7/2 stem with batch norm, relu and a 3x3/2 max pool,
four stages of 3, 4, 6 and 3 bottlenecks (1x1 reduce, 3x3, 1x1 expand,
each followed by batch norm; a 1x1 projection with batch norm where the
shape changes), global average pooling, flatten and a 1000-way linear
layer. Each bottleneck keeps its three conv-bn(-relu) runs in a
``Sequential``, so ``nn.fuse_modules`` folds every batch norm into its
convolution and puts the relu in the convolution's epilogue: 53 fused
convolution kernels, no batch norm pass left; the fused bottleneck adds
its shortcut in its last convolution's epilogue too (``residual=``), so
no residual pass is left either.

Weights are random (PyTorch's default initialisation, random batch-norm
statistics). Run::

    NUMBA_NUM_THREADS=2 python examples/resnet50.py [--batch 1] [--runs 10]

It prints the latency of the unfused and the fused model, onnxruntime's
latency on the same graph (when onnx and onnxruntime are installed) and
the largest difference between the outputs.
"""

import argparse
import statistics
import time

import numpy as np

import nbops
from nbops import nn

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, stride


class Bottleneck(nn.Module):
    """relu(branch(x) + shortcut(x)), branch = 1x1 -> 3x3 (stride) -> 1x1 x4."""

    def __init__(self, inplanes, planes, stride, rng):
        super().__init__()
        out = planes * 4
        self.branch = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, bias=False, rng=rng), _bn(planes, rng), nn.ReLU(),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False, rng=rng),
            _bn(planes, rng), nn.ReLU(),
            nn.Conv2d(planes, out, 1, bias=False, rng=rng), _bn(out, rng))
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False, rng=rng), _bn(out, rng))
        self.relu = nn.ReLU()

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        last = self.branch[len(self.branch) - 1]
        if isinstance(last, nn.FusedConv):
            # fused: the residual sum and the relu in the last convolution's
            # epilogue (one pass less over the block's output)
            for i in range(len(self.branch) - 1):
                x = self.branch[i](x)
            return last(x, residual=shortcut, relu=True)
        if nbops.is_grad_enabled():
            return self.relu(nbops.add(self.branch(x), shortcut))
        # inference: the residual add and the relu as one pass, no temporary
        return _add_relu(self.branch(x), shortcut)


#: ``relu(a + b)`` in one kernel (nbops.fuse has no backward: used under no_grad)
_add_relu = nbops.fuse(lambda a, b: nbops.relu(a + b), name="add_relu")


def _bn(c, rng):
    bn = nn.BatchNorm2d(c)
    bn.running_mean[:] = 0.1 * rng.standard_normal(c)
    bn.running_var[:] = rng.uniform(0.5, 1.5, c)
    bn.weight.data[:] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[:] = 0.1 * rng.standard_normal(c)
    return bn


def resnet50(seed=0):
    """A ResNet-50 of nbops.nn modules in evaluation mode, random weights."""
    rng = np.random.default_rng(seed)
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False, rng=rng), _bn(64, rng),
              nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)]
    inplanes = 64
    for planes, blocks, stride in STAGES:
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1, rng))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000, rng=rng)]
    return nn.Sequential(*layers).eval()


# ---------------------------------------------------------------------------
# The same network as an ONNX graph (unfused: onnxruntime fuses it itself)


def to_onnx(model, batch):
    """An ONNX ModelProto of ``model`` (the unfused one built by :func:`resnet50`)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}{count[0]}"

    def const(a):
        n = name("w")
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), n))
        return n

    def conv(m, x):
        k = m.kernel_size
        p = m.padding if isinstance(m.padding, int) else m.padding[0]
        s = m.stride if isinstance(m.stride, int) else m.stride[0]
        y = name("c")
        nodes.append(helper.make_node("Conv", [x, const(m.weight.data)], [y],
                                      kernel_shape=list(k), strides=[s, s], pads=[p] * 4))
        return y

    def bn(m, x):
        y = name("b")
        nodes.append(helper.make_node(
            "BatchNormalization", [x, const(m.weight.data), const(m.bias.data),
                                   const(m.running_mean), const(m.running_var)], [y],
            epsilon=m.eps))
        return y

    def op(kind, x, *more, **attrs):
        y = name("t")
        nodes.append(helper.make_node(kind, [x, *more], [y], **attrs))
        return y

    def run(m, x):
        if isinstance(m, nn.Sequential):
            for c in m:
                x = run(c, x)
            return x
        if isinstance(m, Bottleneck):
            sc = x if m.downsample is None else run(m.downsample, x)
            return op("Relu", op("Add", run(m.branch, x), sc))
        kind = type(m).__name__
        if kind == "Conv2d":
            return conv(m, x)
        if kind == "BatchNorm2d":
            return bn(m, x)
        if kind == "ReLU":
            return op("Relu", x)
        if kind == "MaxPool2d":
            return op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        if kind == "AdaptiveAvgPool2d":
            return op("GlobalAveragePool", x)
        if kind == "Flatten":
            return op("Flatten", x, axis=1)
        if kind == "Linear":
            return op("Gemm", x, const(m.weight.data), const(m.bias.data), transB=1)
        raise TypeError(f"to_onnx: no ONNX form for {kind}")

    y = run(model, "x")
    graph = helper.make_graph(
        nodes, "resnet50", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         [batch, 3, 224, 224])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [batch, 1000])], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx_model.ir_version = 8
    return onnx_model, y


def _latency(fn, runs):
    fn()  # compile (or load from the cache) and warm up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None,
                        help="nbops and onnxruntime threads (default: nbops' current)")
    args = parser.parse_args(argv)
    if args.threads:
        nbops.set_num_threads(args.threads)
    threads = nbops.get_num_threads()
    x = np.random.default_rng(1).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)

    model = resnet50()
    ort_run = None
    try:
        import onnxruntime as ort

        proto, _ = to_onnx(model, args.batch)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(proto.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        ort_run = lambda: sess.run(None, {"x": x})[0]  # noqa: E731
    except ImportError:
        pass

    with nbops.no_grad():
        t_unfused = _latency(lambda: model(x), max(3, args.runs // 2))
        y_unfused = model(x)
        nn.fuse_modules(model)
        fused = sum(type(m).__name__ == "FusedConv" for m in model.modules())
        t_fused = _latency(lambda: model(x), args.runs)
        y = model(x)

    print(f"ResNet-50, batch {args.batch}, 224x224, float32, {threads} thread(s)")
    print(f"  nbops unfused          {t_unfused * 1e3:8.1f} ms")
    print(f"  nbops fused ({fused} convs) {t_fused * 1e3:8.1f} ms")
    print(f"  fused vs unfused: max |diff| {np.abs(y - y_unfused).max():.2e} "
          f"(outputs up to {np.abs(y_unfused).max():.2e})")
    if ort_run is not None:
        # after nbops, not interleaved: onnxruntime's thread pool, run in
        # turn with nbops (even 0.3 s apart), left nbops 1.2-1.4x slower
        t_ort = _latency(ort_run, args.runs)
        y_ort = ort_run()
        print(f"  onnxruntime            {t_ort * 1e3:8.1f} ms   (nbops fused / ort: "
              f"{t_fused / t_ort:.2f}x)")
        print(f"  nbops vs onnxruntime: max |diff| {np.abs(y - y_ort).max():.2e}")
    else:
        print("  onnxruntime: not installed (pip install onnx onnxruntime to compare)")


if __name__ == "__main__":
    main()
