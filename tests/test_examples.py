"""The example scripts run end to end (in this process, so the CUDA parts use
the simulator that conftest.py switched on where there is no GPU)."""

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(autouse=True)
def _default_gemm_config(monkeypatch):
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")


def _import_example(name, monkeypatch):
    # imported as a module, not run by path: its cache=True kernels record
    # their module's name, and a later process (another xdist worker) must be
    # able to import it again to load them from the disk cache
    import importlib

    monkeypatch.syspath_prepend(str(EXAMPLES))
    return vars(importlib.import_module(name))


def test_custom_op_example_passes_gradcheck_on_both_devices(capsys, monkeypatch):
    module = _import_example("custom_op", monkeypatch)
    assert module["main"]() == ["cpu", "cuda"]
    assert "gradcheck passed on cpu, cuda" in capsys.readouterr().out


def test_custom_op_gradcheck_catches_a_wrong_backward(monkeypatch):
    import numpy as np

    import nbops
    from nbops.autograd import GradcheckError, Tensor, gradcheck

    module = _import_example("custom_op", monkeypatch)
    wrong = nbops.register_op("softsign_wrong", cpu=module["softsign_cpu"],
                              backward=lambda ctx, g: (g,))
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(wrong, [Tensor(np.linspace(-2, 2, 5), requires_grad=True)])


def test_train_mlp_example(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train_mlp.py", "--steps", "5", "--n", "64"])
    runpy.run_path(str(EXAMPLES / "train_mlp.py"), run_name="__main__")
    assert "train_mlp: 5 steps on cpu" in capsys.readouterr().out


def test_train_mlp_example_on_cuda(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train_mlp.py", "--steps", "1", "--n", "16",
                                      "--hidden", "4", "--device", "cuda"])
    runpy.run_path(str(EXAMPLES / "train_mlp.py"), run_name="__main__")
    assert "train_mlp: 1 steps on cuda" in capsys.readouterr().out


def test_resnet50_bottleneck_inference_and_training_paths(monkeypatch):
    # examples/resnet50.py: a bottleneck at a small size; under no_grad the
    # residual add and relu run as one fused kernel, which must match the
    # two ops of the autograd path, and fuse_modules must not change it
    import numpy as np

    import nbops
    from nbops import nn

    module = _import_example("resnet50", monkeypatch)
    block = module["Bottleneck"](16, 8, 2, np.random.default_rng(0)).eval()
    x = np.random.default_rng(1).standard_normal((2, 16, 9, 9)).astype(np.float32)
    with nbops.no_grad():
        fused_add = block(x)
    y = block(nbops.Tensor(x, requires_grad=True))
    np.testing.assert_allclose(fused_add, y.data, rtol=1e-6, atol=1e-6)
    assert fused_add.shape == (2, 32, 5, 5) and (fused_add >= 0).all()
    with nbops.no_grad():
        nn.fuse_modules(block)
        np.testing.assert_allclose(block(x), fused_add, rtol=1e-5, atol=1e-5)
