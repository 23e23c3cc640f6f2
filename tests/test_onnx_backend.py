"""The onnx package's own backend suite on nbops.onnx.backend.

Node cases: every case (generated in memory from onnx/backend/test/case/node)
whose graph uses only operators nbops.onnx declares, minus :data:`EXCLUDED`
(each with the reason; a test below checks that every excluded case really is
refused at load time, so the list cannot hide a wrong result). Models: the 9
"light" models that ship in the onnx wheel (ONNX_HOME points at a temporary
folder: nothing is downloaded). CPU only: the simulator would take hours
over the suite; tests/test_onnx_session.py runs a CUDA session at tiny sizes.
"""

import os
import re
import tempfile
import warnings

import pytest

onnx = pytest.importorskip("onnx")

os.environ["ONNX_HOME"] = tempfile.mkdtemp(prefix="nbops_onnx_home_")

import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

import nbops.onnx.backend as nbops_backend  # noqa: E402
from nbops.onnx import UnsupportedModelError  # noqa: E402
from nbops.onnx._registry import supported_ops  # noqa: E402

LIGHT_MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512"]

#: Node cases of supported operators that nbops.onnx refuses at load time,
#: as ``regex: reason``.
EXCLUDED = {
    r"^test_identity_(opt|sequence)$": "optional and sequence (non-tensor) graph values",
    r"^test_training_dropout": "Dropout in training mode (random masks)",
    r"^test_maxpool_2d_uint8$": "MaxPool on uint8 (float32/float64 only)",
    r"^test_maxpool_with_argmax": "MaxPool's Indices output",
    r"^test_batchnorm_.*training_mode": "BatchNormalization in training mode",
    r"^test_attention_.*window(?!_default)": "Attention sliding windows (opset 25)",
    r"^test_attention_.*(nonpad|padded_kv|ext_cache)": "Attention's nonpad_kv_seqlen input",
    r"^test_attention_.*(fp16|bf16|float16|softmax_precision)": "Attention on float16 and "
    "bfloat16 (float32/float64 only)",
    r"^test_cast_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|STRING|E8M0)": "Cast to or from "
    "sub-byte, 8-bit float and string types",
    r"^test_castlike_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|STRING|E8M0)": "the same Casts",
    r"^test_(de)?quantizelinear_(blocked|e4m3fn|e5m2|float4e2m1|u?int16|u?int4|u?int2)":
    "QuantizeLinear/DequantizeLinear of types other than uint8/int8 (int32 biases) and "
    "blocked quantization",
}


def _supported_case(case, ops):
    return {n.op_type for n in case.model.graph.node if n.domain in ("", "ai.onnx")} <= ops \
        and all(n.domain in ("", "ai.onnx") for n in case.model.graph.node)


def _excluded(name):
    return any(re.search(p, name) for p in EXCLUDED)


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the generators divide by zero on purpose
    _NODE_CASES = load_model_tests(kind="node")
_OPS = {op for (dom, op) in supported_ops() if dom == ""}
SELECTED = sorted(c.name for c in _NODE_CASES if _supported_case(c, _OPS) and
                  not _excluded(c.name))
EXCLUDED_CASES = sorted(c.name for c in _NODE_CASES if _supported_case(c, _OPS) and
                        _excluded(c.name))

_backend_test = onnx.backend.test.BackendTest(nbops_backend.NbopsBackend, __name__)
_WANTED = {f"{name}_cpu" for name in SELECTED} | {f"test_{m}_cpu" for m in LIGHT_MODELS}
for _cls in _backend_test.test_cases.values():
    # only the selected cases become tests (the runner would otherwise list
    # ~3,700 skipped ones)
    for _attr in [a for a in vars(_cls) if a.startswith("test_")]:
        if _attr not in _WANTED:
            delattr(_cls, _attr)
    if any(a.startswith("test_") for a in vars(_cls)):
        globals()[_cls.__name__] = _cls


def test_selection_covers_every_declared_operator():
    """Each float operator of the table has node cases that run."""
    ran = set()
    by_name = {c.name: c for c in _NODE_CASES}
    for name in SELECTED:
        ran |= {n.op_type for n in by_name[name].model.graph.node}
    missing = {"Conv", "Gemm", "MaxPool", "Softmax", "LayerNormalization", "Attention",
               "Reshape", "Concat", "BatchNormalization"} - ran
    assert not missing
    assert len(SELECTED) > 500


def test_light_models_are_in_the_wheel():
    names = {c.name for c in load_model_tests(kind="real")}
    assert {f"test_{m}" for m in LIGHT_MODELS} <= names


@pytest.mark.parametrize("name", EXCLUDED_CASES)
def test_excluded_cases_are_refused_at_load(name):
    """An excluded case is refused by name at load time, never run wrongly."""
    case = next(c for c in _NODE_CASES if c.name == name)
    with pytest.raises(UnsupportedModelError, match="nbops.onnx: (node|graph value) '"):
        nbops_backend.prepare(case.model)
