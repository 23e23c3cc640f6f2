"""nbops.onnx on models with real, varied weights.

* tests/data/digits_cnn.onnx and tiny_transformer.onnx: trained on the
  digits and exported by torch (tools/make_onnx_models.py), with torch's
  outputs for 16 digits stored beside them (.npz); compared with those and
  with onnxruntime at batch 16 and batch 1 (the batch is symbolic).
* The onnx wheel's light models with their ConstantOfShape weights replaced
  by seeded random ones (nbops.onnx._twins), against onnxruntime:
  ShuffleNet always (SqueezeNet's twin runs in tests/test_onnx_session.py);
  the larger graphs only with NBOPS_LONG=1 (minutes each on 2 cores).
"""

import glob
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from nbops.onnx import InferenceSession  # noqa: E402
from nbops.onnx._twins import random_weight_twin  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:  # the peers extra
    ort = None

DATA = os.path.join(os.path.dirname(__file__), "data")
LONG = os.environ.get("NBOPS_LONG") == "1"


def _ort_run(model, feeds):
    path = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("name", ["digits_cnn", "tiny_transformer"])
def test_trained_model_matches_torch_reference(name):
    ref = np.load(os.path.join(DATA, name + ".npz"))
    x, y = ref["x"], ref["y"]
    sess = InferenceSession(os.path.join(DATA, name + ".onnx"))
    (got,) = sess.run(None, {"x": x})
    assert y.std() > 0.1  # trained weights: varied logits, not a constant
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-4)
    # a second shape through the symbolic batch: its own plan, same values
    (one,) = sess.run(None, {"x": x[3:4]})
    np.testing.assert_allclose(one, y[3:4], rtol=1e-4, atol=1e-4)
    # trained to classify the digits: the logits pick the stored labels' classes
    assert (got.argmax(1) == y.argmax(1)).all()


@pytest.mark.skipif(ort is None, reason="onnxruntime (the peers extra) is not installed")
@pytest.mark.parametrize("name", ["digits_cnn", "tiny_transformer"])
def test_trained_model_matches_onnxruntime(name):
    x = np.load(os.path.join(DATA, name + ".npz"))["x"]
    path = os.path.join(DATA, name + ".onnx")
    (got,) = InferenceSession(path).run(None, {"x": x})
    (ref,) = _ort_run(path, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _light(name):
    found = glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                                   "light", f"light_{name}.onnx"))
    assert found, f"light_{name}.onnx ships in the onnx wheel"
    return onnx.load(found[0])


_LONG_ONLY = pytest.mark.skipif(not LONG, reason="large graph: set NBOPS_LONG=1")


@pytest.mark.skipif(ort is None, reason="onnxruntime (the peers extra) is not installed")
@pytest.mark.parametrize("name", [
    "shufflenet",
    pytest.param("resnet50", marks=_LONG_ONLY), pytest.param("densenet121", marks=_LONG_ONLY),
    pytest.param("inception_v1", marks=_LONG_ONLY),
    pytest.param("inception_v2", marks=_LONG_ONLY), pytest.param("vgg19", marks=_LONG_ONLY),
    pytest.param("bvlc_alexnet", marks=_LONG_ONLY), pytest.param("zfnet512", marks=_LONG_ONLY)])
def test_random_weight_light_model_matches_onnxruntime(name):
    twin = random_weight_twin(_light(name), seed=11)
    sess = InferenceSession(twin)
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    (got,) = sess.run(None, {inp.name: x})
    (ref,) = _ort_run(twin, {inp.name: x})
    assert ref.std() > 1e-4  # varied outputs, unlike the constant weights'
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
