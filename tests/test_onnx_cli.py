"""``python -m nbops run model.onnx`` (nbops/onnx/_cli.py) on a small
MatMul + Add + Relu model with a symbolic batch dimension."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from nbops.__main__ import main  # noqa: E402
from nbops.onnx._cli import latency_summary  # noqa: E402

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 10 - 0.5
B = np.array([0.1, -0.2, 0.3, -0.4], np.float32)


@pytest.fixture
def model_path(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_run_random_inputs_symbolic_dims_are_one(model_path, capsys):
    assert main(["run", str(model_path), "--repeat", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "input  x: (1, 3) float32" in out
    assert "output y: (1, 4) float32" in out
    assert "latency over 3 run(s): median" in out and "p10" in out and "p90" in out


def test_run_input_from_file(model_path, tmp_path, capsys):
    x = np.ones((5, 3), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model_path), "--input", f"x={tmp_path / 'x.npy'}",
                 "--repeat", "1"]) == 0
    assert "output y: (5, 4) float32" in capsys.readouterr().out


def test_run_profile_prints_per_op_table(model_path, capsys):
    assert main(["run", str(model_path), "--repeat", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("latency over"):]
    assert "# of Calls" in table
    # the planner fuses MatMul + Add + Relu into one nbops.linear call
    assert any(line.split()[:1] == ["linear"] for line in table.splitlines())


@pytest.mark.parametrize("args, message", [
    (["--input", "x"], "NAME=FILE.npy"),
    (["--input", "z=a.npy"], "not inputs of the model"),
    (["--repeat", "0"], "--repeat must be >= 1"),
])
def test_run_bad_options(model_path, capsys, args, message):
    assert main(["run", str(model_path)] + args) == 2
    assert message in capsys.readouterr().err


def test_run_missing_and_malformed_files(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.onnx")]) == 2
    assert "none.onnx" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["run", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("nbops run: ")


def test_latency_summary_percentiles():
    s = latency_summary([0.001 * k for k in range(1, 12)])  # 1..11 ms
    assert s["median"] == pytest.approx(6.0) and s["min"] == pytest.approx(1.0)
    assert s["p10"] == pytest.approx(2.0) and s["p90"] == pytest.approx(10.0)
