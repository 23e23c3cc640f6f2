"""asv suites of the int8 GEMM family (nbops.quant): matmul_integer, linear
and conv2d beside, in the same run, nbops' own float32 GEMM/conv on the same
shapes, NumPy's integer matmul (``np.matmul`` on int32-widened inputs; NumPy
has no integer BLAS) and, where installed, onnxruntime's MatMulInteger /
ConvInteger as a peer. GOPS = 2 m n k / time (``track_gops_*`` report it).
Targets (2 threads): int8 >= 2x nbops float32 and >= 20x NumPy int32 for
the GEMMs; >= 1.5x nbops float32 conv2d on the ResNet-50 shapes.
"""

import os
import time

import numpy as np

os.environ.setdefault("NBOPS_AUTOTUNE", "0")

#: (m, k, n) products: the square 1024^3 and linear layers (batch x 4096 by 4096 x 4096).
GEMM_SHAPES = [(1024, 1024, 1024), (64, 4096, 4096), (256, 4096, 4096)]
#: The ResNet-50 convolutions of the CNN issue at batch 1 and 8:
#: (batch, C, OC, H=W, kernel, stride, padding).
CONV_SHAPES = [(b,) + s for b in (1, 8) for s in [
    (64, 64, 56, 3, 1, 1), (256, 64, 56, 1, 1, 0), (256, 256, 14, 3, 1, 1), (3, 64, 224, 7, 2, 3)]]


def _quant():
    import nbops.quant as q

    return q


def _ort_session(graph_nodes, inputs, outputs, initializers=()):
    """An onnxruntime session for a one-node graph, or NotImplementedError."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import helper
    except ImportError:
        raise NotImplementedError("onnxruntime/onnx not installed") from None
    graph = helper.make_graph(graph_nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]), onnx


def _median_time(fn, rounds=5):
    fn()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


class MatmulInteger:
    """C (int32) = A (uint8, m x k) @ B (int8, k x n), B unpacked (packed per call)."""

    params = [GEMM_SHAPES]
    param_names = ["mkn"]

    def setup(self, mkn):
        import nbops

        m, k, n = mkn
        rng = np.random.default_rng(0)
        self.q = _quant()
        self.nbops = nbops
        self.a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        self.b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        self.af, self.bf = self.a.astype(np.float32), self.b.astype(np.float32)
        self.c = np.empty((m, n), np.int32)
        self.cf = np.empty((m, n), np.float32)
        self.q.matmul_integer(self.a, self.b, out=self.c)
        nbops.matmul(self.af, self.bf, out=self.cf)
        self.ops = 2 * m * k * n
        self.ort = None

    def time_int8(self, mkn):
        self.q.matmul_integer(self.a, self.b, out=self.c)

    def time_float32_nbops(self, mkn):
        self.nbops.matmul(self.af, self.bf, out=self.cf)

    def time_int32_numpy(self, mkn):
        np.matmul(self.a.astype(np.int32), self.b.astype(np.int32), out=self.c)

    def time_onnxruntime(self, mkn):
        if self.ort is None:
            from onnx import TensorProto, helper

            m, k, n = mkn
            self.ort, _ = _ort_session(
                [helper.make_node("MatMulInteger", ["A", "B"], ["C"])],
                [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k]),
                 helper.make_tensor_value_info("B", TensorProto.INT8, [k, n])],
                [helper.make_tensor_value_info("C", TensorProto.INT32, [m, n])])
        self.ort.run(None, {"A": self.a, "B": self.b})

    def track_gops_int8(self, mkn):
        return self.ops / _median_time(lambda: self.time_int8(mkn)) / 1e9

    def track_gops_float32_nbops(self, mkn):
        return self.ops / _median_time(lambda: self.time_float32_nbops(mkn)) / 1e9

    track_gops_int8.unit = track_gops_float32_nbops.unit = "GOPS"


class Linear:
    """y = x @ W.T: int8 linear (weight packed once, as a layer holds it),
    dequantized float32 output or requantized uint8, against float32 nbops.linear."""

    params = [[64, 256]]
    param_names = ["batch"]

    def setup(self, batch):
        import nbops

        q = self.q = _quant()
        self.nbops = nbops
        rng = np.random.default_rng(1)
        x = rng.integers(0, 256, (batch, 4096), dtype=np.uint8)
        w = rng.integers(-128, 128, (4096, 4096), dtype=np.int8)
        self.qx = q.QTensor(x, 0.02, 128)
        self.pw = q.pack_weight(q.QTensor(w, np.full(4096, 0.001), np.zeros(4096), axis=0))
        self.xf, self.wf = x.astype(np.float32), w.astype(np.float32)
        self.yf = np.empty((batch, 4096), np.float32)
        self.xi, self.wi = x.astype(np.int32), w.astype(np.int32)
        self.time_int8_dequant(batch)
        self.time_int8_requant(batch)
        nbops.linear(self.xf, self.wf, out=self.yf)
        self.ops = 2 * batch * 4096 * 4096

    def time_int8_dequant(self, batch):
        self.q.linear(self.qx, self.pw)

    def time_int8_requant(self, batch):
        self.q.linear(self.qx, self.pw, out_scale=0.5, out_zero_point=128)

    def time_float32_nbops(self, batch):
        self.nbops.linear(self.xf, self.wf, out=self.yf)

    def time_int32_numpy(self, batch):
        np.matmul(self.xi, self.wi.T)

    def track_gops_int8_requant(self, batch):
        return self.ops / _median_time(lambda: self.time_int8_requant(batch)) / 1e9

    track_gops_int8_requant.unit = "GOPS"


class Conv2d:
    """QLinearConv-style int8 conv (ResNet-50 shapes, batch 1 and 8),
    requantized to uint8, against float32 nbops.conv2d (and onnxruntime
    ConvInteger)."""

    params = [CONV_SHAPES]
    param_names = ["shape"]

    def setup(self, shape):
        import nbops

        batch, c, oc, hgt, ksz, stride, pad = shape
        q = self.q = _quant()
        self.nbops = nbops
        rng = np.random.default_rng(2)
        x = rng.integers(0, 256, (batch, c, hgt, hgt), dtype=np.uint8)
        w = rng.integers(-128, 128, (oc, c, ksz, ksz), dtype=np.int8)
        self.x, self.w, self.pad, self.stride = x, w, pad, stride
        self.qx = q.QTensor(x, 0.02, 128)
        self.pw = q.pack_weight(q.QTensor(w, np.full(oc, 0.001), np.zeros(oc), axis=0))
        self.xf, self.wf = x.astype(np.float32), w.astype(np.float32)
        self.time_int8(shape)
        self.time_float32_nbops(shape)
        self.ort = None
        oh = (hgt + 2 * pad - ksz) // stride + 1
        self.ops = 2 * batch * oc * c * ksz * ksz * oh * oh

    def time_int8(self, shape):
        self.q.conv2d(self.qx, self.pw, stride=self.stride, padding=self.pad, out_scale=0.5,
                      out_zero_point=128)

    def time_float32_nbops(self, shape):
        self.nbops.conv2d(self.xf, self.wf, stride=self.stride, padding=self.pad)

    def time_onnxruntime(self, shape):
        if self.ort is None:
            from onnx import TensorProto, helper, numpy_helper

            batch, c, oc, hgt, ksz, stride, pad = shape
            self.ort, _ = _ort_session(
                [helper.make_node("ConvInteger", ["X", "W"], ["Y"], pads=[pad] * 4,
                                  strides=[stride] * 2)],
                [helper.make_tensor_value_info("X", TensorProto.UINT8, [batch, c, hgt, hgt])],
                [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
                [numpy_helper.from_array(self.w.view(np.uint8) ^ np.uint8(0x80), "W")])
        self.ort.run(None, {"X": self.x})

    def track_gops_int8(self, shape):
        return self.ops / _median_time(lambda: self.time_int8(shape)) / 1e9

    track_gops_int8.unit = "GOPS"
