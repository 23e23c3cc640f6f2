"""nbops.onnx.InferenceSession: the planner's rewrites against unfused
references, onnxruntime's surface, dynamic shapes, bad input, a CUDA session
(simulator) and a random-weight twin of a light model against onnxruntime.

Small graphs built with onnx.helper, random weights (seeded); the reference
is onnxruntime where installed, else the same graph with the planner's
passes turned off.
"""

import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nbops  # noqa: E402
from nbops.onnx import InferenceSession, UnsupportedModelError  # noqa: E402
from nbops.onnx import _planner  # noqa: E402
from nbops.onnx._twins import random_weight_twin  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:  # the peers extra
    ort = None

RNG = np.random.default_rng(7)
F = TensorProto.FLOAT


def _w(*shape, scale=0.3):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="nbops-tests")
    m.ir_version = 8
    return m


def _resnet_block(batch="N"):
    """Conv-BN-Relu, Conv-BN, + shortcut, Relu, maxpool, GAP, Gemm, Relu, Softmax."""
    c = 8
    inits = {"w1": _w(c, 4, 3, 3), "b1": _w(c), "w2": _w(c, c, 3, 3), "ws": _w(c, 4, 1, 1),
             "g": np.abs(_w(c)) + 0.5, "be": _w(c), "mu": _w(c), "var": np.abs(_w(c)) + 0.5,
             "fw": _w(5, c), "fb": _w(5)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"],
                         name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Conv", ["x", "ws"], ["sc"], name="short"),
        helper.make_node("Add", ["c2", "sc"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["f"], name="flat"),
        helper.make_node("Dropout", ["f"], ["d"], name="drop"),
        helper.make_node("Gemm", ["d", "fw", "fb"], ["fc"], transB=1, name="fc"),
        helper.make_node("Relu", ["fc"], ["fr"], name="relu3"),
        helper.make_node("Softmax", ["fr"], ["y"], axis=1, name="softmax"),
    ]
    x = helper.make_tensor_value_info("x", F, [batch, 4, "H", "W"])
    y = helper.make_tensor_value_info("y", F, [batch, 5])
    return _model(nodes, [x], [y], inits)


def _unplanned(model, feeds):
    """The model run with no rewriting pass: the reference of the fusions."""
    saved = list(_planner.PASSES)
    try:
        _planner.PASSES[:] = [p for p in saved if p[1] == "fold"]
        return InferenceSession(model).run(None, feeds)
    finally:
        _planner.PASSES[:] = saved


def _reference(model, feeds):
    if ort is not None:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"]).run(None, feeds)
    return _unplanned(model, feeds)


def test_fusions_match_the_reference_and_are_in_the_plan():
    m = _resnet_block()
    sess = InferenceSession(m)
    text = str(sess.plan)
    assert "BatchNormalization 'bn1' folded into Conv 'conv1'" in text
    assert "Conv 'conv1' + Relu 'relu1' -> FusedConv" in text
    assert "Add 'add' into FusedConv" in text and "+ Relu 'relu2'" in text
    assert "Gemm 'fc' + Relu 'relu3' -> FusedLinear" in text
    assert "Dropout 'drop' removed" in text
    assert sess.plan.nodes_before == 14 and sess.plan.nodes_after == 8
    x = RNG.standard_normal((2, 4, 9, 10)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    (ref,) = _reference(m, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-6)
    (unfused,) = _unplanned(m, {"x": x})
    np.testing.assert_allclose(y, unfused, rtol=1e-4, atol=1e-6)


def test_surface_and_dynamic_shapes():
    m = _resnet_block()
    sess = InferenceSession(m, threads=1)
    (i,), (o,) = sess.get_inputs(), sess.get_outputs()
    assert (i.name, i.shape, i.type) == ("x", ["N", 4, "H", "W"], "tensor(float)")
    assert (o.name, o.shape, o.type) == ("y", ["N", 5], "tensor(float)")
    assert sess.get_modelmeta().producer_name == "nbops-tests"
    for shape in [(1, 4, 8, 8), (3, 4, 6, 12), (1, 4, 8, 8)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        (y,) = sess.run(["y"], {"x": x})
        assert y.shape == (shape[0], 5)
        np.testing.assert_allclose(y, _unplanned(m, {"x": x})[0], rtol=1e-4, atol=1e-6)
    assert len(sess._plans) == 2  # one plan per input-shape set, cached
    assert sess.peak_memory > 0


def test_shape_arithmetic_folds_per_input_shape():
    # Reshape(x, Concat(Shape(x)[0:1], [-1])): the target is folded for each
    # input shape, so no Shape node runs
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["tgt"], axis=0),
        helper.make_node("Reshape", ["x", "tgt"], ["y"]),
    ]
    inits = {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64)}
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, 4])],
               [helper.make_tensor_value_info("y", F, [None, None])], inits)
    sess = InferenceSession(m)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, x.reshape(2, -1))
    plan = next(iter(sess._plans.values()))
    assert [n.op_type for n in plan.steps] == ["Reshape"]


def test_layer_norm_and_gelu_subgraphs_are_recognised():
    d = 16
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["xc"]),
        helper.make_node("Pow", ["xc", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["xc", "sd"], ["xn"]),
        helper.make_node("Mul", ["xn", "gamma"], ["xs"]),
        helper.make_node("Add", ["xs", "beta"], ["ln"]),
        helper.make_node("MatMul", ["ln", "w"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
        helper.make_node("Erf", ["hd"], ["he"]),
        helper.make_node("Add", ["he", "one"], ["h1"]),
        helper.make_node("Mul", ["h", "h1"], ["h2"]),
        helper.make_node("Mul", ["h2", "half"], ["y"]),
    ]
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
             "gamma": _w(d) + 1, "beta": _w(d), "w": _w(d, 24),
             "sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 5, d])],
               [helper.make_tensor_value_info("y", F, [2, 5, 24])], inits, opset=13)
    sess = InferenceSession(m)
    text = str(sess.plan)
    assert "-> LayerNorm" in text and "-> Gelu" in text
    assert [n.op_type for n in sess.plan.nodes] == ["LayerNorm", "FusedLinear"]
    x = RNG.standard_normal((2, 5, d)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _reference(m, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


def test_register_pass_runs_an_added_pass():
    seen = []

    def spy(graph):
        seen.append(len(graph.nodes))
        return ["spy looked"]

    _planner.register_pass(spy, order=45)
    try:
        sess = InferenceSession(_resnet_block())
    finally:
        _planner.PASSES[:] = [p for p in _planner.PASSES if p[1] != "spy"]
    assert seen and ("spy", "spy looked") in sess.plan.rewrites


def test_buffers_are_released_after_their_last_reader():
    # a chain of 6 Relus over 1 MiB: at most two intermediates live at once
    n = 6
    nodes = [helper.make_node("Sigmoid", ["x" if i == 0 else f"t{i}"], [f"t{i + 1}"])
             for i in range(n)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [256, 1024])],
               [helper.make_tensor_value_info(f"t{n}", F, [256, 1024])], {})
    sess = InferenceSession(m)
    sess.run(None, {"x": np.zeros((256, 1024), np.float32)})
    assert sess.peak_memory <= 2 * 256 * 1024 * 4


def test_per_channel_affine_folds_into_conv_and_batch_norm():
    # Caffe2's DenseNet: Conv, Mul, Add, Relu and BatchNormalization, Mul, Add;
    # a Mul varying along W is not per channel and stays
    c = 6
    inits = {"w": _w(c, 3, 3, 3), "s": _w(c, 1, 1), "t": _w(1, c, 1, 1),
             "g": np.abs(_w(c)) + 0.5, "be": _w(c), "mu": _w(c), "var": np.abs(_w(c)) + 0.5,
             "s2": _w(c, 1, 1), "t2": _w(c, 1, 1), "row": _w(1, 1, 1, 8)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Mul", ["c", "s"], ["m"], name="mul"),
        helper.make_node("Add", ["t", "m"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "g", "be", "mu", "var"], ["n"],
                         name="bn"),
        helper.make_node("Mul", ["n", "s2"], ["m2"], name="mul2"),
        helper.make_node("Add", ["m2", "t2"], ["a2"], name="add2"),
        helper.make_node("Mul", ["a2", "row"], ["y"], name="rowmul"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, 8, 8])],
               [helper.make_tensor_value_info("y", F, ["N", c, 8, 8])], inits)
    sess = InferenceSession(m)
    text = str(sess.plan)
    assert "FusedConv 'conv' + Mul 'mul' + Add 'add' + Relu 'relu' -> FusedConv" in text
    assert "BatchNormalization 'bn' + Mul 'mul2' + Add 'add2' -> BatchNormalization" in text
    assert [n.op_type for n in sess.plan.nodes] == ["FusedConv", "BatchNormalization", "Mul"]
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, _reference(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y, _unplanned(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def _clip(name, x, y, lo, hi, opset):
    """A Clip node and the initializers it needs: bounds as attributes before
    opset 11, as initializer inputs from 11 ('' for a missing one)."""
    if opset < 11:
        attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
        return helper.make_node("Clip", [x], [y], name=name, **attrs), {}
    inits = {f"{name}_{k}": np.array(v, np.float32) for k, v in (("lo", lo), ("hi", hi))
             if v is not None}
    ins = [x, f"{name}_lo" if lo is not None else "", f"{name}_hi" if hi is not None else ""]
    return helper.make_node("Clip", ins, [y], name=name), inits


def _act(sess, name):
    return next(n.attrs["activation"] for n in sess.plan.nodes if n.name == name)


@pytest.mark.parametrize("opset", [9, 13])
def test_conv_and_clip_fuse_into_the_conv(opset):
    # MobileNetV2's Conv + Clip(0, 6) (relu6), a residual Add + Clip with one
    # bound, and a Clip(0, no max) which is relu: each one FusedConv
    c = 6
    inits = {"w1": _w(c, 3, 3, 3, scale=2.0), "b1": _w(c), "w2": _w(c, c, 1, 1, scale=2.0),
             "w3": _w(c, c, 3, 3)}
    clip1, i1 = _clip("clip1", "c1", "r1", 0.0, 6.0, opset)
    clip2, i2 = _clip("clip2", "s", "r2", None, 1.5, opset)
    clip3, i3 = _clip("clip3", "c3", "y", 0.0, None, opset)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        clip1,
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        clip2,
        helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
        clip3,
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, 8, 8])],
               [helper.make_tensor_value_info("y", F, ["N", c, 8, 8])],
               {**inits, **i1, **i2, **i3}, opset=opset)
    sess = InferenceSession(m)
    text = str(sess.plan)
    assert "Conv 'conv1' + Clip 'clip1' -> FusedConv" in text
    assert "Add 'add' into FusedConv 'conv2' (residual=) + Clip 'clip2'" in text
    assert "Conv 'conv3' + Clip 'clip3' -> FusedConv" in text
    assert [n.op_type for n in sess.plan.nodes] == ["FusedConv"] * 3
    assert _act(sess, "conv1") == ("hardtanh", 0.0, 6.0)
    assert _act(sess, "conv2") == ("hardtanh", -np.inf, 1.5)
    assert _act(sess, "conv3") == "relu"
    x = (RNG.standard_normal((2, 3, 8, 8)) * 3).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    r1 = InferenceSession(_model(nodes[:2], m.graph.input, [helper.make_tensor_value_info(
        "r1", F, ["N", c, 8, 8])], {**inits, **i1}, opset=opset)).run(None, {"x": x})[0]
    assert r1.min() == 0.0 and r1.max() == 6.0  # both bounds were reached
    for ref in (_reference(m, {"x": x})[0], _unplanned(m, {"x": x})[0]):
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [9, 13])
def test_gemm_and_clip_fuse_into_the_linear_epilogue(opset):
    # Gemm + Clip, and MatMul + Add bias + Clip with a min only: FusedLinear
    # with ("hardtanh", lo, hi) in its epilogue
    inits = {"fw": _w(7, 5, scale=1.0), "fb": _w(7), "mw": _w(7, 4, scale=1.0), "mb": _w(4)}
    clip1, i1 = _clip("clip1", "fc", "h", -0.5, 0.75, opset)
    clip2, i2 = _clip("clip2", "a", "y", -0.25, None, opset)
    nodes = [
        helper.make_node("Gemm", ["x", "fw", "fb"], ["fc"], transB=1, name="fc"),
        clip1,
        helper.make_node("MatMul", ["h", "mw"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "mb"], ["a"], name="add"),
        clip2,
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 5])],
               [helper.make_tensor_value_info("y", F, ["N", 4])], {**inits, **i1, **i2},
               opset=opset)
    sess = InferenceSession(m)
    text = str(sess.plan)
    assert "Gemm 'fc' + Clip 'clip1' -> FusedLinear" in text
    assert "MatMul 'mm' + Add 'add' + Clip 'clip2' -> FusedLinear" in text
    assert [n.op_type for n in sess.plan.nodes] == ["FusedLinear"] * 2
    assert _act(sess, "fc") == ("hardtanh", -0.5, 0.75)
    assert _act(sess, "mm") == ("hardtanh", -0.25, np.inf)
    x = (RNG.standard_normal((9, 5)) * 2).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    h = np.clip(x.astype(np.float64) @ inits["fw"].T + inits["fb"], -0.5, 0.75)
    want = np.maximum(h @ inits["mw"] + inits["mb"], -0.25)
    assert h.min() == -0.5 and h.max() == 0.75 and want.min() == -0.25
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    for ref in (_reference(m, {"x": x})[0], _unplanned(m, {"x": x})[0]):
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_clip_with_bounds_that_are_not_constants_runs_on_its_own():
    # a bound fed at run time cannot go into an epilogue; nor can bounds
    # out of order (ONNX gives max there): the Clip stays a node of its own
    inits = {"fw": _w(6, 5, scale=1.0), "w": _w(6, 4), "lo": np.array(0.5, np.float32),
             "hi": np.array(-0.5, np.float32)}
    nodes = [
        helper.make_node("Gemm", ["x", "fw"], ["fc"], transB=1, name="fc"),
        helper.make_node("Clip", ["fc", "lo_in", ""], ["h"], name="clip1"),
        helper.make_node("MatMul", ["h", "w"], ["mm"], name="mm"),
        helper.make_node("Clip", ["mm", "lo", "hi"], ["y"], name="clip2"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 5]),
                       helper.make_tensor_value_info("lo_in", F, [])],
               [helper.make_tensor_value_info("y", F, ["N", 4])], inits, opset=13)
    sess = InferenceSession(m)
    assert [n.op_type for n in sess.plan.nodes] == ["FusedLinear", "Clip", "FusedLinear",
                                                    "Clip"]
    assert "Clip 'clip" not in str(sess.plan)
    feeds = {"x": RNG.standard_normal((3, 5)).astype(np.float32),
             "lo_in": np.array(-0.2, np.float32)}
    (y,) = sess.run(None, feeds)
    np.testing.assert_array_equal(y, np.full((3, 4), -0.5, np.float32))
    np.testing.assert_allclose(y, _reference(m, feeds)[0])


def test_batch_norm_and_relu_run_as_one_pass():
    # BatchNormalization -> Relu (its only reader) becomes ScaleShiftRelu; a
    # batch norm whose output is read twice stays as it is
    c = 5
    stats = lambda: [np.abs(_w(c)) + 0.5, _w(c), _w(c), np.abs(_w(c)) + 0.5]  # noqa: E731
    inits = dict(zip(["g", "be", "mu", "var"], stats()))
    inits.update(zip(["g2", "be2", "mu2", "var2"], stats()))
    nodes = [
        helper.make_node("BatchNormalization", ["x", "g", "be", "mu", "var"], ["n"],
                         epsilon=1e-3, name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "g2", "be2", "mu2", "var2"], ["n2"],
                         name="bn2"),
        helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r2", "n2"], ["y"], name="add"),
    ]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", c, "H", "W"])],
               [helper.make_tensor_value_info("y", F, ["N", c, "H", "W"])], inits)
    sess = InferenceSession(m)
    assert "BatchNormalization 'bn' + Relu 'relu' -> ScaleShiftRelu" in str(sess.plan)
    assert [n.op_type for n in sess.plan.nodes] == ["ScaleShiftRelu", "BatchNormalization",
                                                    "Relu", "Add"]
    x = RNG.standard_normal((2, c, 6, 7)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    (y,) = sess.run(None, {"x": x})
    for ref in (_reference(m, {"x": x})[0], _unplanned(m, {"x": x})[0]):
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def _conv_zoo(batch="N"):
    """Convolutions of every shape the Conv handler handles: asymmetric pads
    (padded explicitly), a dilated depthwise one at stride 2, a 1x1 with the
    residual Add and Relu fused, SAME_UPPER at stride 2 with groups."""
    inits = {"w1": _w(8, 4, 3, 3), "b1": _w(8), "w2": _w(8, 1, 3, 3), "w3": _w(8, 8, 1, 1),
             "b3": _w(8), "w4": _w(8, 2, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 1, 1, 0], name="asym"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, pads=[2, 2, 2, 2],
                         strides=[2, 2], dilations=[2, 2], name="dw"),
        helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"], name="pw"),
        helper.make_node("Add", ["c3", "c2"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["r3", "w4"], ["y"], group=4, strides=[2, 2],
                         auto_pad="SAME_UPPER", name="same"),
    ]
    x = helper.make_tensor_value_info("x", F, [batch, 4, "H", "W"])
    y = helper.make_tensor_value_info("y", F, [batch, 8, "OH", "OW"])
    return _model(nodes, [x], [y], inits)


def _conv1d_model():
    inits = {"w": _w(5, 3, 3), "b": _w(5)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 2], strides=[2],
                              name="c1d"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "L"])],
                  [helper.make_tensor_value_info("y", F, ["N", 5, "OL"])], inits)


def _weights_as_inputs(model):
    """The model with its initializers made graph inputs, and their values
    as feeds: no weight is a constant, so nothing is folded, fused or packed
    (the handlers' unpacked path)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    feeds = {}
    for init in m.graph.initializer:
        feeds[init.name] = numpy_helper.to_array(init)
        m.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                           list(init.dims)))
    del m.graph.initializer[:]
    return m, feeds


@pytest.mark.parametrize("make,shapes", [(_conv_zoo, [(1, 4, 9, 11), (2, 4, 7, 7)]),
                                         (_resnet_block, [(1, 4, 8, 8), (3, 4, 6, 12)]),
                                         (_conv1d_model, [(1, 3, 12), (2, 3, 9)])],
                         ids=["conv-zoo", "resnet-block", "conv1d"])
def test_packed_convolutions_match_the_unpacked_path(make, shapes):
    m = make()
    packed = InferenceSession(m)
    plain, weights = _weights_as_inputs(m)
    unpacked = InferenceSession(plain)
    assert "FusedConv" not in str(unpacked.plan)
    for shape in shapes:
        x = RNG.standard_normal(shape).astype(np.float32)
        for _ in range(2):  # the packs' first run and a later one
            (y,) = packed.run(None, {"x": x})
            (ref,) = unpacked.run(None, dict(weights, x=x))
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    if ort is not None:
        (want,) = _reference(m, {"x": x})
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_weights_are_packed_once_per_session_and_shape(monkeypatch):
    packs = []
    real = nbops.conv_pack

    def counting(*args, **kwargs):
        packs.append(kwargs["input_shape"])
        return real(*args, **kwargs)

    monkeypatch.setattr(nbops, "conv_pack", counting)
    sess = InferenceSession(_resnet_block())
    convs = sum(n.op_type == "FusedConv" for n in sess.plan.nodes)
    assert convs == 3
    a, b = (RNG.standard_normal(s).astype(np.float32) for s in [(1, 4, 8, 8), (2, 4, 6, 6)])
    for _ in range(3):
        sess.run(None, {"x": a})
    assert len(packs) == convs  # on the first run, not on the later ones
    sess.run(None, {"x": b})
    sess.run(None, {"x": a})
    sess.run(None, {"x": b})
    assert len(packs) == 2 * convs  # once more for the new input shape only
    assert packs.count((2, 4, 6, 6)) == 2  # the two convolutions that read x


# ---------------------------------------------------------------------------
# Bad input: clear errors before any kernel runs


def test_bad_files(tmp_path):
    good = _resnet_block().SerializeToString()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(good[: len(good) // 3])
    with pytest.raises(ValueError, match="malformed or truncated"):
        InferenceSession(str(trunc))
    with pytest.raises(ValueError, match="cannot parse"):
        InferenceSession(b"\xff\xfe not a protobuf \x00\x01")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        InferenceSession(str(empty))
    with pytest.raises(FileNotFoundError):
        InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(ValueError, match="device"):
        InferenceSession(good, device="tpu")


def test_unknown_domain_and_unsupported_op_named_at_load():
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="fancy")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2])],
                          [helper.make_tensor_value_info("y", F, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedModelError, match="'fancy'.*FancyOp.*com.example"):
        InferenceSession(m)
    node = helper.make_node("NonZero", ["x"], ["y"], name="nz")
    m = _model([node], [helper.make_tensor_value_info("x", F, [2])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])], {})
    with pytest.raises(UnsupportedModelError, match="node 'nz' op NonZero at opset 17"):
        InferenceSession(m)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c3d")
    m = _model([node], [helper.make_tensor_value_info("x", F, [1, 1, 3, 3, 3])],
               [helper.make_tensor_value_info("y", F, [None] * 5)], {"w": _w(1, 1, 2, 2, 2)})
    with pytest.raises(UnsupportedModelError, match="node 'c3d' op Conv at opset 17"):
        InferenceSession(m)
    node = helper.make_node("Relu", ["x"], ["y"], name="r16")
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])], {})
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm16")
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])], {})
    with pytest.raises(UnsupportedModelError, match="'sm16'.*float16"):
        InferenceSession(m)


def test_bad_feeds_and_output_names():
    sess = InferenceSession(_resnet_block())
    x = np.zeros((1, 4, 8, 8), np.float32)
    cases = [
        ({}, ValueError, "missing input 'x'"),
        ({"x": x, "z": x}, ValueError, "unknown input name 'z'"),
        ({"x": x.astype(np.float64)}, TypeError, "must be tensor\\(float\\)"),
        ({"x": x[0]}, ValueError, "must have rank 4"),
        ({"x": np.zeros((1, 3, 8, 8), np.float32)}, ValueError, "dimension 1 must be 4"),
        ({"x": "abc"}, TypeError, "must be a NumPy array"),
    ]
    for feeds, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            sess.run(None, feeds)
    with pytest.raises(ValueError, match="unknown output name 'nope'"):
        sess.run(["nope"], {"x": x})
    assert sess._plans == {}  # nothing was planned or run


# ---------------------------------------------------------------------------
# Devices, real weights


def test_cuda_session_matches_cpu():
    if not nbops.cuda_available():
        pytest.fail("CUDA (or its simulator) must be available")
    c = 2
    inits = {"w": _w(c, 2, 3, 3), "b": _w(c), "fw": _w(3, c * 4 * 4)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "x"], ["s"]),
        helper.make_node("Flatten", ["s"], ["f"]),
        helper.make_node("MatMul", ["f", "fw"], ["y"]),
    ]
    inits["fw"] = _w(c * 4 * 4, 3)
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])],
               [helper.make_tensor_value_info("y", F, [1, 3])], inits)
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    (y_cpu,) = InferenceSession(m).run(None, {"x": x})
    (y_dev,) = InferenceSession(m, device="cuda").run(None, {"x": x})
    assert isinstance(y_dev, np.ndarray)
    np.testing.assert_allclose(y_dev, y_cpu, rtol=1e-4, atol=1e-5)


def test_cuda_session_runs_fused_clips():
    # Conv + Clip (hardtanh in place after the device conv) and MatMul + Clip
    # (the device GEMM's epilogue), against the CPU session and NumPy
    if not nbops.cuda_available():
        pytest.fail("CUDA (or its simulator) must be available")
    inits = {"w": _w(2, 2, 3, 3, scale=1.0), "fw": _w(2 * 4 * 4, 3, scale=1.0)}
    clip1, i1 = _clip("clip1", "c", "r", 0.0, 0.5, 13)
    clip2, i2 = _clip("clip2", "mm", "y", -0.3, 0.3, 13)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             clip1, helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fw"], ["mm"], name="mm"), clip2]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])],
               [helper.make_tensor_value_info("y", F, [1, 3])], {**inits, **i1, **i2}, opset=13)
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    sess = InferenceSession(m, device="cuda")
    assert [n.op_type for n in sess.plan.nodes] == ["FusedConv", "Flatten", "FusedLinear"]
    (y_dev,) = sess.run(None, {"x": x})
    (y_cpu,) = InferenceSession(m).run(None, {"x": x})
    np.testing.assert_allclose(y_dev, y_cpu, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y_dev, _reference(m, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert np.abs(y_dev).max() == np.float32(0.3)  # a bound was reached


def _light(name):
    found = glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                                   "light", f"light_{name}.onnx"))
    assert found, f"light_{name}.onnx ships in the onnx wheel"
    return onnx.load(found[0])


@pytest.mark.skipif(ort is None, reason="onnxruntime (the peers extra) is not installed")
def test_random_weight_twin_of_a_light_model_matches_onnxruntime():
    twin = random_weight_twin(_light("squeezenet"), seed=3)
    sess = InferenceSession(twin)
    x = RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)
    name = sess.get_inputs()[0].name
    (y,) = sess.run(None, {name: x})
    (ref,) = _reference(twin, {name: x})
    assert ref.std() > 1e-4  # varied outputs, unlike the constant weights'
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-7)
