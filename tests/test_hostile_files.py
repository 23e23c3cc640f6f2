"""Files nbops reads, damaged: truncated at every length class and with
bytes flipped. Each must give a clean fallback or a clear error, never a
crash, a hang or a wrong result.

* The autotune cache (nbops/autotune.py): a damaged file is ignored with
  an AutotuneCacheWarning (or a damaged entry re-tuned); the tuned call
  still returns the right value and rewrites a valid file.
* ONNX model files (nbops.onnx.InferenceSession): loading and running a
  damaged model either works (a flipped weight is still a model) or raises
  ValueError (UnsupportedModelError and protobuf's DecodeError, wrapped,
  included) or TypeError. The models load in a subprocess with a timeout,
  so that a crash in native code (protobuf, onnx's checker, a kernel) or a
  hang fails the test instead of taking pytest down.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from nbops import autotune as at

#: damaged copies per file (in-process, each a JSON parse and a lookup)
MUTATIONS = 120


def _mutations(blob, count, seed=0):
    """Truncations (every length below 64 bytes, then spread over the rest)
    and copies with 1 to 4 bytes flipped (random bits, or a byte replaced
    by one of JSON's structural characters)."""
    r = np.random.default_rng(seed)
    cuts = sorted(set(list(range(min(64, len(blob)))) + list(
        r.integers(0, len(blob), count // 3))))
    for n in cuts:
        yield f"truncated to {n} bytes", blob[:n]
    for _ in range(count - len(cuts)):
        b = bytearray(blob)
        for _ in range(r.integers(1, 5)):
            i = int(r.integers(0, len(b)))
            b[i] = (b[i] ^ (1 << int(r.integers(0, 8)))) if r.random() < 0.6 else \
                int(r.choice(list(b'{}[]",:0-e.9 \x00\xff')))
        yield "bytes flipped", bytes(b)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NBOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NBOPS_AUTOTUNE", "1")
    monkeypatch.setattr(at, "_machine_busy", lambda: None)
    return tmp_path


CONFIGS = [{"step": 1}, {"step": 2}, {"step": 3}]


def _tuner():
    """A fresh tuner (nothing in memory: it reads the file), whose every
    config computes the same value."""
    @at.autotune(configs=CONFIGS, key=["n"], default={"step": 1}, name="test.hostile",
                 repeat=1, warmup=0)
    def count(x, n, step):
        return x * n + 0 * step

    return count


def test_damaged_autotune_cache_falls_back(cache_dir):
    x = np.ones(3)
    for n in (2, 3, 5):
        _tuner()(x, n=n)            # a valid cache file with three entries
    path = at.cache_path(at.device_name())
    blob = open(path, "rb").read()
    assert set(json.loads(blob)["entries"]) and len(blob) > 200
    seen = set()
    for what, damaged in _mutations(blob, MUTATIONS):
        with open(path, "wb") as f:
            f.write(damaged)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", at.AutotuneCacheWarning)
            for n in (2, 3, 5):
                np.testing.assert_array_equal(_tuner()(x, n=n), x * n, err_msg=what)
        rewritten = json.loads(open(path, "rb").read())   # still (or again) valid JSON
        assert isinstance(rewritten.get("entries"), dict), what
        seen.add(what.split(" ")[0])
    assert seen == {"truncated", "bytes"}


def _onnx_model():
    """A small model touching the loader's many parts: initializers, Conv,
    BatchNormalization (folded), Relu, MaxPool, Reshape of a constant shape,
    Gemm, Softmax, attributes of every kind, a dynamic batch axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(0)
    f32 = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w", f32(4, 2, 3, 3)), ("b", f32(4)), ("g", f32(4)), ("beta", f32(4)),
        ("mean", f32(4)), ("var", np.abs(f32(4)) + 0.5), ("shape", np.array([0, -1])),
        ("fw", f32(5, 36)), ("fb", f32(5)))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"],
                         epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], transB=1),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


#: the subprocess: loads and runs each damaged model, one line per outcome
_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from nbops.onnx import InferenceSession
    path = sys.argv[1]
    x = np.random.default_rng(1).standard_normal((2, 2, 6, 6)).astype(np.float32)
    for i, line in enumerate(sys.stdin):
        with open(path, "wb") as f:
            f.write(bytes.fromhex(line.strip()))
        print("start", i, flush=True)
        try:
            s = InferenceSession(path)
            ys = s.run(None, {s.get_inputs()[0].name: x} if s.get_inputs() else {})
            what = "ran"
        except (ValueError, TypeError) as e:
            what = "refused"
        except Exception as e:  # anything else: a defect, reported by the parent
            what = "raised " + type(e).__name__ + ": " + str(e)[:300]
        print("done", i, json.dumps(what), flush=True)
""")


def test_damaged_onnx_models_are_refused_cleanly(tmp_path):
    blob = _onnx_model()
    damaged = list(_mutations(blob, ONNX_MUTATIONS, seed=1))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "model.onnx")],
        input="".join(b.hex() + "\n" for _, b in damaged), capture_output=True, text=True,
        timeout=600, env=dict(os.environ, NBOPS_AUTOTUNE="0"), cwd=Path(__file__).parent)
    done = [ln.split(" ", 2) for ln in proc.stdout.splitlines() if ln.startswith("done ")]
    started = [ln for ln in proc.stdout.splitlines() if ln.startswith("start ")]
    if proc.returncode != 0 or len(done) != len(damaged):
        i = len(done)
        pytest.fail(f"the loader died (exit {proc.returncode}) on damaged model {i} "
                    f"({damaged[i][0] if i < len(damaged) else '?'}), after {len(started)} "
                    f"starts: {proc.stderr[-2000:]}")
    outcomes = [json.loads(w) for _, _, w in done]
    bad = [(damaged[i][0], w) for i, w in enumerate(outcomes) if w not in ("ran", "refused")]
    assert not bad, bad[:5]
    assert outcomes.count("refused") > len(outcomes) // 2   # the damage was seen
    assert outcomes[0] == "refused"                          # zero bytes: no model


ONNX_MUTATIONS = 1000
