"""nn: Module API (PyTorch state names, buffers, npz round trip, modes), layers
against NumPy references, losses on mixed devices (the op table, driven by
the specs in nbops/nn/losses.py, checks them against the references here),
and training: an MLP with a learnable Swish reaches 95% with Adam on the CPU,
and the same model takes steps on CUDA."""

import numpy as np
import pytest

import nbops
from helpers import host, to_dev
from nbops import nn
from nbops.autograd import Tensor, gradcheck

rng = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def _default_gemm_config(monkeypatch):
    # tiny GEMMs here: timing the autotuner's candidates would dominate the run
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")


def mlp(dtype=np.float32, sizes=(4, 8, 3)):
    n_in, hidden, n_out = sizes
    return nn.Sequential(nn.Linear(n_in, hidden, dtype=dtype, rng=0), nn.Swish(dtype=dtype),
                         nn.Linear(hidden, n_out, dtype=dtype, rng=1))


# ---------------------------------------------------------------------------
# Module


def test_state_dict_uses_pytorch_names():
    model = mlp()
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.beta", "2.weight", "2.bias"]
    assert model[0].weight.shape == (8, 4) and model[0].bias.shape == (8,)
    assert [n for n, _ in model.named_children()] == ["0", "1", "2"]
    assert len(list(model.parameters())) == 5 and len(model) == 3
    assert [type(m).__name__ for m in model.modules()] == ["Sequential", "Linear", "Swish",
                                                          "Linear"]
    assert "Linear(in_features=4, out_features=8, bias=True)" in repr(model)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 2, bias=False, rng=0)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(2, 1, rng=1))
        self.shared = self.encoder          # the same module twice: parameters once

    def forward(self, x):
        return self.head(self.encoder(x))


def test_nested_names_and_shared_modules():
    assert list(Net().state_dict()) == ["encoder.weight", "head.1.weight", "head.1.bias"]


def test_module_misuse():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(2))

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) before"):
        Bad()
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)
    with pytest.raises(TypeError, match="item 1 must be a Module"):
        nn.Sequential(nn.ReLU(), 3)
    with pytest.raises(ValueError, match="Linear: argument 'in_features' must be >= 1"):
        nn.Linear(0, 2)
    with pytest.raises(TypeError, match="Linear: argument 'out_features' must be an int"):
        nn.Linear(2, 2.0)
    with pytest.raises(TypeError, match="MultiheadAttention: argument 'kdim' must be an int"):
        nn.MultiheadAttention(8, 2, kdim=True)
    with pytest.raises(TypeError, match="BatchNorm2d: argument 'num_features' must be an int"):
        nn.BatchNorm2d(True)
    with pytest.raises(TypeError, match="LayerNorm: argument 'normalized_shape' must be an int"):
        nn.LayerNorm((4, 2.0))
    with pytest.raises(TypeError, match="float32 or float64"):
        nn.Linear(2, 2, dtype=np.int32)
    with pytest.raises(TypeError, match="unexpected arguments"):
        nn.GELU(approx="tanh")


def test_load_state_dict_from_exported_arrays_and_npz(tmp_path):
    src, dst = mlp(), mlp()
    for p in dst.parameters():
        with nbops.no_grad():
            p *= 0.0
    # as exported from PyTorch: float64 lists/arrays keyed by name
    exported = {k: np.asarray(v, np.float64).tolist() for k, v in src.state_dict().items()}
    dst.load_state_dict(exported)
    for k, v in dst.state_dict().items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, src.state_dict()[k])
    other = mlp()
    other.load_state_dict(src.state_dict())
    assert other[0].weight.data is not src[0].weight.data      # copied, not shared
    path = tmp_path / "weights.npz"
    src.save(path)
    fresh = mlp()
    fresh[0].weight.data = np.zeros((8, 4), np.float32)
    fresh.load(path)
    np.testing.assert_array_equal(fresh[0].weight.data, src[0].weight.data)


def test_load_state_dict_errors_change_nothing():
    model = mlp()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    state = dict(model.state_dict())
    with pytest.raises(KeyError, match=r"missing keys \['2.bias'\], unexpected keys \['x'\]"):
        model.load_state_dict({**{k: v for k, v in state.items() if k != "2.bias"}, "x": 1})
    bad = {**state, "0.weight": np.zeros((4, 8))}
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(4, 8\).*\(8, 4\)"):
        model.load_state_dict(bad)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    missing, unexpected = model.load_state_dict({"0.bias": np.ones(8)}, strict=False)
    assert "0.weight" in missing and unexpected == []


def test_train_eval_and_dropout():
    drop = nn.Dropout(0.5, rng=0)
    model = nn.Sequential(nn.ReLU(), drop)
    x = np.ones((200, 10), np.float32)
    y = model(x)
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.3 < (y == 0).mean() < 0.7
    assert model.eval() is model and not drop.training
    assert model(x) is not None and np.array_equal(model(x), x)
    model.train()
    assert drop.training
    assert np.all(nn.Dropout(1.0)(x) == 0)
    with pytest.raises(ValueError, match="'p' must be <= 1"):
        nn.Dropout(1.5)


def test_dropout_gradient_uses_the_mask(device):
    x = Tensor(to_dev(np.ones((4, 5)), device), requires_grad=True)
    y = nn.Dropout(0.5, rng=1)(x)
    y.sum().backward()
    np.testing.assert_array_equal(host(x.grad), host(y.data))


def test_linear_and_activations_match_references(device):
    model = mlp(np.float64).to(device)
    x = rng.standard_normal((5, 4))
    w1, b1, beta, w2, b2 = (host(v) for v in model.state_dict().values())
    h = x @ w1.T + b1
    h = h / (1 + np.exp(-beta[0] * h))
    with nbops.no_grad():
        out = model(to_dev(x, device))           # arrays in, arrays out
    assert not isinstance(out, Tensor)
    np.testing.assert_allclose(host(out), h @ w2.T + b2, rtol=1e-10)
    assert isinstance(model(to_dev(x, device)), Tensor)   # records while grads are on
    for module, ref in ((nn.ReLU(), np.maximum(x, 0)), (nn.Tanh(), np.tanh(x)),
                        (nn.Sigmoid(), 1 / (1 + np.exp(-x))),
                        (nn.SiLU(), x / (1 + np.exp(-x))),
                        (nn.Hardtanh(), np.clip(x, -1, 1)),
                        (nn.Hardtanh(-0.5, 0.25), np.clip(x, -0.5, 0.25)),
                        (nn.ReLU6(), np.clip(x, 0, 6))):
        np.testing.assert_allclose(host(module(to_dev(x, device))), ref, rtol=1e-10)
    big = np.array([-7.0, 3.0, 7.0, np.nan])
    np.testing.assert_array_equal(host(nn.ReLU6()(to_dev(big, device))), [0, 3, 6, np.nan])
    assert "approximate='tanh'" in repr(nn.GELU(approximate="tanh"))
    assert repr(nn.Hardtanh(-2, 3)) == "Hardtanh(min_val=-2.0, max_val=3.0)"
    assert repr(nn.ReLU6()) == "ReLU6()"
    with pytest.raises(ValueError, match=r"Hardtanh: argument 'min_val' \(1.0\) must be <="):
        nn.Hardtanh(1.0, 0.0)


def test_swish_beta_gradient_and_fixed_beta(device):
    act = nn.Swish(beta=0.7, dtype=np.float64).to(device)
    x = Tensor(to_dev(rng.standard_normal((3, 4)), device), requires_grad=True)
    assert gradcheck(lambda t, b: nbops.swish(t, b), [x, act.beta])
    act(x).sum().backward()
    assert host(act.beta.grad).shape == (1,) and host(act.beta.grad)[0] != 0
    fixed = nn.Swish(beta=2.0, learnable=False)
    assert list(fixed.parameters()) == [] and "beta=2" in repr(fixed)


def test_gradcheck_through_a_model(device):
    model = mlp(np.float64, sizes=(2, 3, 3)).to(device)
    x = to_dev(rng.standard_normal((3, 2)), device)
    target = to_dev(np.array([0, 2, 1]), device)

    def loss(w1, b1, beta, w2, b2):
        # the model written functionally, so gradcheck can perturb each parameter
        h = nbops.swish(nbops.linear(x, w1, b1), beta)
        return nn.cross_entropy(nbops.linear(h, w2, b2), target)

    assert gradcheck(loss, list(model.parameters()))

# ---------------------------------------------------------------------------
# Buffers


class Stats(nn.Module):
    """Own buffers (one not persistent) beside children that hold a batch norm."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", np.full(3, 2.0, np.float32))
        self.features = nn.Sequential(nn.Conv2d(1, 3, 1, rng=0), nn.BatchNorm2d(3), nn.ReLU())
        self.register_buffer("cache", np.zeros(3, np.float32), persistent=False)
        self.head = nn.Linear(3, 2, rng=1)


# PyTorch's order: each module's parameters, then its persistent buffers,
# module by module depth first
STATS_KEYS = ["scale", "features.0.weight", "features.0.bias", "features.1.weight",
              "features.1.bias", "features.1.running_mean", "features.1.running_var",
              "features.1.num_batches_tracked", "head.weight", "head.bias"]


def test_buffer_registry_and_state_dict_order():
    m = Stats()
    assert list(m.state_dict()) == STATS_KEYS
    assert [n for n, _ in m.named_buffers()] == [
        "scale", "cache", "features.1.running_mean", "features.1.running_var",
        "features.1.num_batches_tracked"]
    assert [n for n, _ in m.named_buffers(prefix="net", recurse=False)] == ["net.scale",
                                                                           "net.cache"]
    assert list(m.features.buffers(recurse=False)) == []
    assert len(list(m.buffers())) == 5 and len(list(m.parameters())) == 6
    assert [n for n, _ in m.features.named_parameters(recurse=False)] == []
    count = m.state_dict()["features.1.num_batches_tracked"]
    assert count.dtype == np.int64 and count.shape == ()
    # assigning to the attribute replaces the buffer; None keeps the name registered
    new = np.ones(3, np.float32)
    m.scale = new
    assert dict(m.named_buffers())["scale"] is new and m.state_dict()["scale"] is new
    m.scale = None
    assert "scale" not in m.state_dict() and "scale" not in dict(m.named_buffers())
    m.scale = new
    assert list(m.state_dict()) == STATS_KEYS
    with pytest.raises(TypeError, match="Stats: buffer 'scale' must be a NumPy array, a "
                                        "device array or None, got float"):
        m.scale = 2.0
    with pytest.raises(TypeError, match=r"got Tensor \(pass its .data\)"):
        m.scale = Tensor(new)
    assert m.scale is new
    # a parameter or a submodule takes the name over, as in PyTorch
    m.scale = nn.Parameter(new)
    assert "scale" in dict(m.named_parameters()) and "scale" not in dict(m.named_buffers())
    m.cache = nn.ReLU()
    assert "cache" in dict(m.named_children()) and "cache" not in dict(m.named_buffers())
    # registering again changes persistence; del removes
    m.features[1].register_buffer("running_var", m.features[1].running_var, persistent=False)
    assert "features.1.running_var" not in m.state_dict()
    del m.features[1].num_batches_tracked
    assert not hasattr(m.features[1], "num_batches_tracked")
    assert "features.1.num_batches_tracked" not in dict(m.named_buffers())


def test_register_buffer_errors():
    class Early(nn.Module):
        def __init__(self):
            self.register_buffer("x", np.zeros(1))

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) before "
                                             "register_buffer"):
        Early()
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="Linear.register_buffer: name must be a str, got int"):
        lin.register_buffer(1, np.zeros(1))
    for name in ("", "a.b"):
        with pytest.raises(KeyError, match=f"non-empty and contain no '.', got '{name}'"):
            lin.register_buffer(name, np.zeros(1))
    for name, kind in (("weight", "a parameter"), ("training", "an attribute"),
                       ("forward", "an attribute")):
        with pytest.raises(KeyError, match=f"'{name}' is already {kind}"):
            lin.register_buffer(name, np.zeros(1))
    with pytest.raises(KeyError, match="'0' is already a submodule"):
        nn.Sequential(lin).register_buffer("0", np.zeros(1))
    with pytest.raises(TypeError, match="buffer 'x' must be a NumPy array.*got list"):
        lin.register_buffer("x", [1.0, 2.0])
    assert list(lin.named_buffers()) == []


def test_save_load_restores_running_stats(tmp_path):
    src = Stats()
    bn = src.features[1]
    bn.running_mean[:] = [0.5, -1.0, 2.0]
    bn.running_var[:] = [0.25, 4.0, 1.5]
    bn.num_batches_tracked += 7
    src.scale[:] = 3.0
    path = tmp_path / "stats.npz"
    src.save(path)
    with np.load(path) as f:
        assert sorted(f.files) == sorted(STATS_KEYS)       # "cache" is not persistent
    dst = Stats()
    dst.cache[:] = 5.0
    assert dst.load(path) == ([], [])
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, src.state_dict()[k])
        assert v.dtype == src.state_dict()[k].dtype
    assert dst.features[1].running_mean is not bn.running_mean      # copied
    assert int(dst.features[1].num_batches_tracked) == 7
    np.testing.assert_array_equal(dst.cache, 5.0)
    # as exported from PyTorch: float64 lists, the counter as a Python number
    exported = {k: np.asarray(v, np.float64).tolist() for k, v in src.state_dict().items()}
    exported["features.1.num_batches_tracked"] = 9
    fresh = Stats()
    fresh.load_state_dict(exported)
    assert fresh.features[1].running_var.dtype == np.float32
    np.testing.assert_array_equal(fresh.features[1].running_var, bn.running_var)
    count = fresh.features[1].num_batches_tracked
    assert count.dtype == np.int64 and count.shape == () and int(count) == 9


def test_load_state_dict_buffer_errors_change_nothing():
    m = Stats()
    before = {k: v.copy() for k, v in m.state_dict().items()}
    state = {k: v + 1 for k, v in m.state_dict().items()}
    with pytest.raises(KeyError, match=r"missing keys \['features.1.running_var'\], "
                                       r"unexpected keys \['cache'\]"):
        m.load_state_dict({**{k: v for k, v in state.items()
                              if k != "features.1.running_var"}, "cache": np.ones(3)})
    with pytest.raises(ValueError, match=r"'features.1.running_mean' has shape \(4,\), the "
                                         r"buffer has shape \(3,\)"):
        m.load_state_dict({**state, "features.1.running_mean": np.zeros(4)})
    with pytest.raises(ValueError, match=r"'features.1.num_batches_tracked' has shape \(1,\)"):
        m.load_state_dict({**state, "features.1.num_batches_tracked": [3]})
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    missing, unexpected = m.load_state_dict(
        {"features.1.running_mean": np.ones(3), "cache": np.ones(3)}, strict=False)
    assert unexpected == ["cache"] and "features.1.running_var" in missing
    np.testing.assert_array_equal(m.features[1].running_mean, 1.0)
    np.testing.assert_array_equal(m.cache, 0.0)


def test_to_moves_buffers(device):
    m = Stats()
    m.head.register_buffer("alias", m.scale)     # one array in two modules
    m.features[1].running_var[:] = 4.0
    assert m.to(device) is m
    on_host = device == "cpu"
    assert all(isinstance(b, np.ndarray) == on_host for b in m.buffers())
    assert all(isinstance(p.data, np.ndarray) == on_host for p in m.parameters())
    assert m.head.alias is m.scale and list(m.state_dict()) == STATS_KEYS
    np.testing.assert_array_equal(host(m.features[1].running_var), 4.0)
    # loading keeps each buffer on its device
    m.load_state_dict({k: host(v) for k, v in Stats().state_dict().items()})
    assert isinstance(m.features[1].running_var, np.ndarray) == on_host
    assert isinstance(m.features[1].num_batches_tracked, np.ndarray) == on_host
    np.testing.assert_array_equal(host(m.features[1].running_var), 1.0)
    m.to("cpu")
    assert all(isinstance(b, np.ndarray) for b in m.buffers())
    assert m.features[1].num_batches_tracked.dtype == np.int64
    with pytest.raises(ValueError, match="Module.to: device must be 'cpu' or 'cuda', got 'gpu'"):
        m.to("gpu")


def test_fuse_modules_reads_the_moved_running_stats(device):
    # fuse_modules folds the batch norm's buffers where to() put them
    model = nn.Sequential(nn.Conv2d(1, 2, 1, rng=0), nn.BatchNorm2d(2), nn.ReLU()).eval()
    model[1].running_mean[:] = [0.5, -0.5]
    model[1].running_var[:] = [2.0, 0.5]
    x = rng.standard_normal((1, 1, 2, 2)).astype(np.float32)
    with nbops.no_grad():
        want = model(x)
        nn.fuse_modules(model.to(device))
        got = host(model(to_dev(x, device)))
    assert type(model[0]).__name__ == "FusedConv" and len(model) == 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# Losses


# NumPy references of the op table (tests/test_ops.py; the specs in
# nbops/nn/losses.py name them "test_nn:ref_*"): arrays arrive as float64


def _reduced(losses, reduction):
    if reduction == "mean" and losses.size == 0:
        return np.array(np.nan)  # without NumPy's warning for an empty mean
    return {"mean": np.mean, "sum": np.sum, "none": np.asarray}[reduction](losses)


def ref_mse_loss(input, target, reduction="mean"):
    return _reduced((input - target) ** 2, reduction)


def ref_binary_cross_entropy_with_logits(logits, target, reduction="mean"):
    x = logits
    return _reduced(np.maximum(x, 0) - x * target + np.log1p(np.exp(-np.abs(x))), reduction)


def ref_cross_entropy(logits, target, reduction="mean"):
    target = target.astype(np.int64)
    m = logits.max(axis=1, keepdims=True) if logits.size else np.zeros((len(logits), 1))
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
    return _reduced(lse - logits[np.arange(len(logits)), target], reduction)


def test_loss_on_mixed_devices():
    # a table row moves all its arrays to one device
    x = np.zeros((2, 3))
    with pytest.raises(TypeError, match="mse_loss: arguments are on different devices"):
        nn.mse_loss(x, nbops.to_device(x))
    with pytest.raises(TypeError, match="cross_entropy: arguments are on different devices"):
        nn.cross_entropy(x, nbops.to_device(np.array([0, 1])))


# ---------------------------------------------------------------------------
# Training


def test_mlp_with_learnable_swish_trains_to_95_percent():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import train_mlp

    # A 2-64-4 model on 512 points is below the parallel break-even of every
    # kernel it runs: on a busy 2-core machine thread-pool barriers made 300
    # steps take 66 s on 2 threads and 2.4 s on one.
    threads = nbops.get_num_threads()
    nbops.set_num_threads(1)
    try:
        train_mlp.train(steps=1)              # compile outside the timed loop
        accuracy, beta, seconds = train_mlp.train(steps=300)
    finally:
        nbops.set_num_threads(threads)
    assert accuracy >= 0.95
    assert abs(beta - 1.0) > 0.05


def test_mlp_takes_steps_on_cuda():
    x = nbops.to_device(rng.standard_normal((16, 2)).astype(np.float32))
    y = nbops.to_device(rng.integers(0, 3, 16))
    model = nn.Sequential(nn.Linear(2, 4, rng=0), nn.Swish(), nn.Linear(4, 3, rng=1))
    model.to("cuda")
    opt = nbops.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert model[1].beta.device == "cuda" and model[1].beta.item() != 1.0


@pytest.mark.parametrize("act", [nn.ReLU, nn.Sigmoid, nn.Tanh, nn.SiLU,
                                 lambda: nn.Hardtanh(-0.3, 0.2), nn.ReLU6])
def test_sequential_fuses_linear_activation(monkeypatch, act):
    # Linear + ReLU/Sigmoid/Tanh/Hardtanh/ReLU6 in a Sequential is one product
    # with the activation in its epilogue; SiLU (whose derivative needs the
    # input) stays a module of its own. Same outputs and gradients either way.
    from nbops import linalg
    from nbops.nn import layers

    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 5))
    module = act()
    model = nn.Sequential(nn.Linear(5, 6, dtype=np.float64, rng=1), module,
                          nn.Linear(6, 2, dtype=np.float64, rng=2))
    calls = []
    real = linalg.linear
    monkeypatch.setattr(linalg, "linear",
                        lambda *a, **k: calls.append(k.get("activation")) or real(*a, **k))

    def run():
        model.zero_grad()
        y = model(x)
        (y * y).sum().backward()
        return host(y.data), [host(p.grad) for p in model.parameters()]

    fused = run()
    expected = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: None,
                nn.Hardtanh: ("hardtanh", -0.3, 0.2), nn.ReLU6: ("hardtanh", 0.0, 6.0)}
    assert calls[0] == expected[type(module)]
    monkeypatch.setattr(layers, "_EPILOGUE_ACTIVATIONS", {})
    plain = run()
    np.testing.assert_allclose(fused[0], plain[0], rtol=1e-12, atol=1e-12)
    for g, h in zip(fused[1], plain[1]):
        np.testing.assert_allclose(g, h, rtol=1e-10, atol=1e-12)
