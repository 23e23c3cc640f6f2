"""nbops.onnx.export: every supported layer written, checked by onnx, and run
back through nbops.onnx and onnxruntime with the model's own outputs."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import nbops  # noqa: E402
from nbops import nn  # noqa: E402
from nbops.onnx import InferenceSession, export  # noqa: E402


def _trained_bn(c, rng):
    bn = nn.BatchNorm2d(c)
    bn.running_mean[...] = rng.standard_normal(c).astype(np.float32)
    bn.running_var[...] = rng.uniform(0.5, 2.0, c).astype(np.float32)
    bn.weight.data[...] = rng.uniform(0.5, 1.5, c).astype(np.float32)
    bn.bias.data[...] = rng.standard_normal(c).astype(np.float32)
    return bn


def _cnn(rng):
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, rng=rng), _trained_bn(4, rng), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, padding="same", rng=rng), nn.SiLU(),
        nn.AvgPool2d(2, stride=1, padding=1, count_include_pad=False),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5, rng=rng), nn.GELU(),
        nn.Dropout(0.3), nn.Linear(5, 3, rng=rng), nn.LogSoftmax(-1))


CASES = {
    "cnn": (_cnn, (2, 1, 9, 9)),
    "fused_cnn": (lambda rng: nn.fuse_modules(_cnn(rng).eval()), (2, 1, 9, 9)),
    "conv1d": (lambda rng: nn.Sequential(
        nn.Conv1d(3, 4, 3, stride=2, dilation=1, padding=1, rng=rng), nn.Tanh(),
        nn.MaxPool1d(2, ceil_mode=True), nn.Flatten(), nn.Sigmoid()), (2, 3, 11)),
    "mlp": (lambda rng: nn.Sequential(
        nn.Linear(6, 8, rng=rng), nn.Swish(beta=1.5), nn.Linear(8, 8, rng=rng),
        nn.GELU(approximate="tanh"), nn.Linear(8, 4, rng=rng), nn.Softmax(-1)), (3, 6)),
    "clip": (lambda rng: nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, rng=rng), nn.ReLU6(), nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5, rng=rng), nn.Hardtanh(-0.2, np.inf), nn.Linear(5, 3, rng=rng),
        nn.Hardtanh(-0.1, 0.1)), (2, 1, 6, 6)),
    "transformer": (lambda rng: nn.Sequential(
        nn.Linear(8, 16, rng=rng),
        nn.TransformerEncoderLayer(16, 4, dim_feedforward=24, rng=rng),
        nn.TransformerEncoderLayer(16, 2, dim_feedforward=8, activation="gelu",
                                   norm_first=True, rng=rng),
        nn.LayerNorm(16), nn.RMSNorm(16), nn.Flatten(), nn.Linear(16 * 5, 3, rng=rng)),
        (2, 5, 8)),
}


def _model(case):
    build, shape = CASES[case]
    rng = np.random.default_rng(7)
    model = build(rng)
    model.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    with nbops.no_grad():
        ref = np.asarray(getattr(model(x), "data", model(x)))
    return model, x, ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_runs_back_in_nbops_and_onnxruntime(case, tmp_path):
    model, x, ref = _model(case)
    path = tmp_path / f"{case}.onnx"
    proto = export(model, x, path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert model.training is False and proto.graph.input[0].name == "input"
    got = InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    # the batch axis is symbolic: another batch size runs through the same file
    x3 = np.concatenate([x, x[:1]])
    with nbops.no_grad():
        ref3 = np.asarray(getattr(model(x3), "data", model(x3)))
    np.testing.assert_allclose(InferenceSession(str(path)).run(None, {"input": x3})[0], ref3,
                               rtol=1e-4, atol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], ref, rtol=1e-4, atol=1e-5)


def test_export_keeps_the_training_flag_and_returns_a_proto_without_path():
    model = nn.Sequential(nn.Linear(4, 2, rng=0), nn.ReLU())
    proto = export(model, np.ones((1, 4), np.float32))
    assert model.training is True
    assert [n.op_type for n in proto.graph.node] == ["Gemm", "Relu"]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_hardtanh_exports_as_clip_that_fuses_back():
    # ReLU6 and Hardtanh as Clip (an infinite bound left out), which the
    # session puts back into the conv and the GEMMs
    model, x, ref = _model("clip")
    proto = export(model, x)
    clips = [n for n in proto.graph.node if n.op_type == "Clip"]
    assert [len(n.input) for n in clips] == [3, 2, 3]
    sess = InferenceSession(proto)
    assert [n.op_type for n in sess.plan.nodes] == ["FusedConv", "Flatten", "FusedLinear",
                                                    "FusedLinear"]
    acts = [n.attrs["activation"] for n in sess.plan.nodes if "activation" in n.attrs]
    f32 = lambda v: float(np.float32(v))  # noqa: E731  (the bounds are float32 constants)
    assert acts == [("hardtanh", 0.0, 6.0), ("hardtanh", f32(-0.2), np.inf),
                    ("hardtanh", f32(-0.1), f32(0.1))]
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], ref, rtol=1e-4, atol=1e-5)
    assert np.abs(ref).max() == np.float32(0.1)  # a bound was reached


def test_export_opsets():
    model, x, ref = _model("mlp")
    for opset in (13, 17, 20):
        proto = export(model, x, opset=opset)
        assert proto.opset_import[0].version == opset
        got = InferenceSession(proto).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert "Gelu" in {n.op_type for n in export(model, x, opset=20).graph.node}


def test_export_errors():
    x = np.ones((1, 4), np.float32)

    class Custom(nn.Module):
        def forward(self, t):
            return t

    with pytest.raises(TypeError, match=r"layer model\.1 \(Custom\) cannot be exported"):
        export(nn.Sequential(nn.Linear(4, 4), Custom()), x)
    with pytest.raises(ValueError, match="opset must be an int >= 13"):
        export(nn.Linear(4, 2), x, opset=11)
    with pytest.raises(TypeError, match="float32 or float64 NumPy array"):
        export(nn.Linear(4, 2), [[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(TypeError, match="one input"):
        export(nn.Linear(4, 2), (x, x))
    with pytest.raises(ValueError, match="return_indices"):
        export(nn.MaxPool2d(2, return_indices=True), np.ones((1, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="opset >= 17"):
        export(nn.LayerNorm(4), x, opset=13)
    with pytest.raises(ValueError, match="running statistics"):
        export(nn.BatchNorm2d(1, track_running_stats=False), np.ones((1, 1, 2, 2), np.float32))


def test_export_static_quantized_model_as_qdq(tmp_path):
    from nbops import quant

    rng = np.random.default_rng(3)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=rng), _trained_bn(4, rng),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 6, 3, rng=rng), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3, rng=rng))
    model.eval()
    observed = quant.prepare(model)
    for _ in range(4):
        observed(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
    qmodel = quant.convert(observed)
    x = rng.standard_normal((5, 1, 8, 8)).astype(np.float32)
    ref = qmodel(x)
    path = tmp_path / "q.onnx"
    proto = export(qmodel, x, path)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Conv") == 2 and "Gemm" in ops and "QuantizeLinear" in ops
    # a few quanta of the last layer's output scale: requantization rounds in
    # fixed point in nbops and in float in the QDQ form, layer after layer
    quantum = qmodel.layers[-1][4][0]
    got = InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, ref, atol=3.01 * quantum, rtol=0)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"input": x})[0], ref, atol=3.01 * quantum,
                               rtol=0)
