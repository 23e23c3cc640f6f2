"""batch_norm, layer_norm, rms_norm and their nn modules beyond the op table
(tests/test_ops.py, driven by the specs in nbops/normalization.py): the
running statistics' update in training, gradchecks in every mode, the CUDA
backward against the CPU's, the parallel kernels, the modules. Large offsets (1e4 in float32, 1e8 in
float64, unit variance) check that the statistics are computed stably:
``E[x^2] - E[x]^2`` loses every digit of the variance there.
"""

import numpy as np
import pytest

import nbops
from nbops import nn
from nbops.autograd import Tensor, gradcheck
import reference
from helpers import host, to_dev


# ---------------------------------------------------------------------------
# References


ref_batch_norm = reference.batch_norm_with_stats


def ref_layer_norm(x, ns, w, b, eps, centered=True):
    return reference._rows_norm(x, ns, w, b, eps, centered)


# ---------------------------------------------------------------------------
# Cases: (shape, training, affine, running stats given)

BN_CASES = [
    ((5, 3), True, True, True),
    ((4, 3, 7), False, True, True),
    ((2, 3, 4, 5), True, False, True),
    ((3, 2, 3, 3), False, False, True),
    ((2, 4, 6), True, True, False),        # training without running statistics
    ((1, 2, 1, 2), True, True, True),      # two values per channel
]
BN_IDS = [f"{'x'.join(map(str, s))}-{'train' if t else 'eval'}-{'affine' if a else 'plain'}"
          f"{'' if r else '-nostats'}" for s, t, a, r in BN_CASES]

def _rand(rng, shape, dtype=np.float64, loc=0.0):
    return (loc + rng.standard_normal(shape)).astype(dtype)


def _bn_inputs(rng, shape, affine, stats, dtype=np.float64):
    c = shape[1]
    x = _rand(rng, shape, dtype, loc=2.0)
    rm = _rand(rng, c, dtype) if stats else None
    rv = (0.5 + rng.random(c)).astype(dtype) if stats else None
    w = _rand(rng, c, dtype) if affine else None
    b = _rand(rng, c, dtype) if affine else None
    return x, rm, rv, w, b


# ---------------------------------------------------------------------------
# Forward against the references, both devices


@pytest.mark.parametrize("shape,training,affine,stats", BN_CASES, ids=BN_IDS)
def test_batch_norm_matches_reference(device, shape, training, affine, stats):
    rng = np.random.default_rng(len(shape) * 10 + shape[1])
    x, rm, rv, w, b = _bn_inputs(rng, shape, affine, stats)
    want, want_rm, want_rv = ref_batch_norm(x, rm, rv, w, b, training, 0.3, 1e-3)
    d_rm, d_rv = to_dev(rm, device), to_dev(rv, device)
    y = nbops.batch_norm(to_dev(x, device), d_rm, d_rv, to_dev(w, device), to_dev(b, device),
                         training=training, momentum=0.3, eps=1e-3)
    np.testing.assert_allclose(host(y), want, rtol=1e-10, atol=1e-10)
    if stats:  # updated in place in training (unbiased variance), untouched in eval
        np.testing.assert_allclose(host(d_rm), want_rm, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(host(d_rv), want_rv, rtol=1e-12, atol=1e-12)


def test_rms_norm_default_eps_is_machine_epsilon():
    x = np.array([[1e-5, -2e-5, 3e-5]], np.float32)
    want = ref_layer_norm(x, (3,), None, None, float(np.finfo(np.float32).eps), False)
    np.testing.assert_allclose(nbops.rms_norm(x, 3), want, rtol=1e-5)


# ---------------------------------------------------------------------------
# Stability: large offsets, small variance


@pytest.mark.parametrize("dtype,offset", [(np.float32, 1e4), (np.float64, 1e8)])
def test_batch_statistics_are_stable_under_offsets(device, dtype, offset):
    rng = np.random.default_rng(3)
    x = (offset + rng.standard_normal((4, 2, 3, 5))).astype(dtype)
    rm, rv = np.zeros(2, dtype), np.zeros(2, dtype)
    d_rm, d_rv = to_dev(rm, device), to_dev(rv, device)
    y = nbops.batch_norm(to_dev(x, device), d_rm, d_rv, training=True, momentum=1.0, eps=0.0)
    xd = x.astype(np.float64)  # the exact values the kernel saw
    want_mean = xd.mean(axis=(0, 2, 3))
    want_var = xd.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(host(d_rm), want_mean, rtol=1e-7 if dtype == np.float32 else 1e-15)
    # a variance near 1 beside a mean of 1e4 (float32) or 1e8 (float64):
    # E[x^2] - E[x]^2 would have no correct digit left
    np.testing.assert_allclose(host(d_rv), want_var, rtol=1e-5 if dtype == np.float32 else 1e-9)
    want = ref_batch_norm(xd, None, None, None, None, True, 0.1, 0.0)[0]
    atol = 2e-3 if dtype == np.float32 else 1e-7  # the input's own rounding at 1e4 / 1e8
    np.testing.assert_allclose(host(y), want, atol=atol)


@pytest.mark.parametrize("dtype,offset", [(np.float32, 1e4), (np.float64, 1e8)])
def test_layer_norm_is_stable_under_offsets(device, dtype, offset):
    rng = np.random.default_rng(4)
    x = (offset + rng.standard_normal((3, 50))).astype(dtype)
    y = nbops.layer_norm(to_dev(x, device), 50, eps=0.0)
    want = ref_layer_norm(x.astype(np.float64), (50,), None, None, 0.0)
    atol = 2e-3 if dtype == np.float32 else 1e-7
    np.testing.assert_allclose(host(y), want, atol=atol)
    assert np.abs(host(y).astype(np.float64).std(axis=1) - 1).max() < 1e-3


# ---------------------------------------------------------------------------
# Backward: gradcheck on the CPU, CUDA against the CPU


def _stat(value, n, device):
    return to_dev(np.full(n, float(value)), device)


# (name, fn(x, weight, bias, device), x shape, parameter shape)
GRAD_CASES = [
    ("bn-train-2d", lambda x, w, b, d: nbops.batch_norm(x, None, None, w, b, training=True),
     (6, 3), (3,)),
    ("bn-train-3d", lambda x, w, b, d: nbops.batch_norm(x, None, None, w, b, training=True,
                                                        eps=0.1), (3, 2, 4), (2,)),
    ("bn-train-4d", lambda x, w, b, d: nbops.batch_norm(x, _stat(0, 2, d), _stat(1, 2, d), w, b,
                                                        training=True), (2, 2, 3, 2), (2,)),
    ("bn-eval-4d", lambda x, w, b, d: nbops.batch_norm(x, _stat(0.5, 2, d), _stat(2, 2, d), w, b),
     (2, 2, 2, 3), (2,)),
    ("layer_norm", lambda x, w, b, d: nbops.layer_norm(x, (3, 4), w, b), (2, 3, 4), (3, 4)),
    ("rms_norm", lambda x, w, b, d: nbops.rms_norm(x, 5, w) + b, (3, 5), (5,)),
    # rows across several of CUDA's weight-gradient chunks (4 rows each simulated)
    ("layer_norm-9-rows", lambda x, w, b, d: nbops.layer_norm(x, 3, w, b), (9, 3), (3,)),
]
GRAD_IDS = [c[0] for c in GRAD_CASES]


@pytest.mark.parametrize("name,fn,xshape,pshape", GRAD_CASES, ids=GRAD_IDS)
def test_gradcheck(name, fn, xshape, pshape):
    rng = np.random.default_rng(5)
    x = Tensor(_rand(rng, xshape, loc=1.0), requires_grad=True)
    w = Tensor(_rand(rng, pshape), requires_grad=True)
    b = Tensor(_rand(rng, pshape), requires_grad=True)
    assert gradcheck(lambda *t: fn(*t, "cpu"), [x, w, b], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name,fn,xshape,pshape", GRAD_CASES[1:], ids=GRAD_IDS[1:])
def test_cuda_backward_matches_cpu(name, fn, xshape, pshape):
    rng = np.random.default_rng(6)
    arrays = [_rand(rng, xshape, loc=1.0), _rand(rng, pshape), _rand(rng, pshape)]
    g = _rand(rng, xshape)
    grads = []
    for device in ("cpu", "cuda"):
        ts = [Tensor(to_dev(a, device), requires_grad=True) for a in arrays]
        fn(*ts, device).backward(to_dev(g, device))
        grads.append([host(t.grad) for t in ts])
    for got, want in zip(grads[1], grads[0]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_training_backward_goes_through_the_batch_statistics():
    rng = np.random.default_rng(7)
    x = Tensor(_rand(rng, (4, 3)), requires_grad=True)
    y = nbops.batch_norm(x, None, None, training=True, eps=0.0)
    (y * y).sum().backward()
    # d/dx sum(xhat^2) is 0: with eps = 0, sum(xhat^2) is the count per
    # channel whatever x is (the batch statistics' dependence on x cancels)
    np.testing.assert_allclose(x.grad, 0.0, atol=1e-10)


# ---------------------------------------------------------------------------
# out=, strided inputs, empty inputs


def test_out_and_strided_input():
    rng = np.random.default_rng(8)
    base = _rand(rng, (6, 4, 10))
    x = base[::2, :, ::2]                       # not contiguous
    out = np.empty(x.shape)
    r = nbops.layer_norm(x, 5, out=out)
    assert r is out
    np.testing.assert_allclose(out, ref_layer_norm(x, (5,), None, None, 1e-5), atol=1e-12)
    xt = base.transpose(1, 0, 2)                # (4, 6, 10): channels 6
    rm, rv = np.zeros(6), np.ones(6)
    y = nbops.batch_norm(xt, rm, rv, training=True)
    np.testing.assert_allclose(y, ref_batch_norm(xt, None, None, None, None, True, 0.1,
                                                 1e-5)[0], atol=1e-12)


def test_large_inputs_run_the_parallel_kernels():
    # above the serial threshold (32K elements): the prange twins, with
    # several row chunks and channel splits
    from nbops.cpu import normalization as kernels

    rng = np.random.default_rng(13)
    x = _rand(rng, (64, 600), loc=5.0)
    w, b, g = _rand(rng, 600), _rand(rng, 600), _rand(rng, (64, 600))
    assert x.size >= kernels.SERIAL_BELOW
    np.testing.assert_allclose(nbops.layer_norm(x, 600, w, b),
                               ref_layer_norm(x, (600,), w, b, 1e-5), atol=1e-11)
    xt = Tensor(x, requires_grad=True)
    nbops.layer_norm(xt, 600, w, b).backward(g)
    xh = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    gy = g * w
    want = (gy - gy.mean(1, keepdims=True) - xh * (gy * xh).mean(1, keepdims=True)) \
        / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(xt.grad, want, atol=1e-10)
    x = _rand(rng, (40, 3, 300), loc=-7.0)
    rm, rv = np.zeros(3), np.ones(3)
    y = nbops.batch_norm(x, rm, rv, training=True, momentum=0.5)
    want, want_rm, want_rv = ref_batch_norm(x, np.zeros(3), np.ones(3), None, None, True, 0.5,
                                            1e-5)
    np.testing.assert_allclose(y, want, atol=1e-11)
    np.testing.assert_allclose(rv, want_rv, rtol=1e-12)
    xt = Tensor(x, requires_grad=True)
    g = _rand(rng, x.shape)
    nbops.batch_norm(xt, None, None, training=True).backward(g)
    xh = (x - x.mean((0, 2), keepdims=True)) / np.sqrt(x.var((0, 2), keepdims=True) + 1e-5)
    want = (g - g.mean((0, 2), keepdims=True) - xh * (g * xh).mean((0, 2), keepdims=True)) \
        / np.sqrt(x.var((0, 2), keepdims=True) + 1e-5)
    np.testing.assert_allclose(xt.grad, want, atol=1e-10)
    x = _rand(rng, (2000, 20), loc=3.0)  # 2-D: the column kernels
    rm, rv = np.zeros(20), np.ones(20)
    want, want_rm, want_rv = ref_batch_norm(x, rm.copy(), rv.copy(), None, None, True, 0.1, 1e-5)
    np.testing.assert_allclose(nbops.batch_norm(x, rm, rv, training=True), want, atol=1e-11)
    np.testing.assert_allclose(rv, want_rv, rtol=1e-12)
    xt = Tensor(x, requires_grad=True)
    g = _rand(rng, x.shape)
    nbops.batch_norm(xt, None, None, training=True).backward(g)
    xh = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    want = (g - g.mean(0) - xh * (g * xh).mean(0)) / np.sqrt(x.var(0) + 1e-5)
    np.testing.assert_allclose(xt.grad, want, atol=1e-10)


def test_empty_inputs():
    assert nbops.layer_norm(np.empty((0, 4)), 4).shape == (0, 4)
    assert nbops.rms_norm(np.empty((2, 0)), 0).shape == (2, 0)
    y = nbops.batch_norm(np.empty((0, 3, 2)), np.zeros(3), np.ones(3))
    assert y.shape == (0, 3, 2)


# ---------------------------------------------------------------------------
# Errors (the rest are the specs' bad inputs, in the op table)


def test_batch_norm_mixed_devices():
    pytest.importorskip("numba.cuda")
    c3 = np.zeros(3)
    with pytest.raises(TypeError, match="different devices"):
        nbops.batch_norm(np.zeros((2, 3, 4, 4)), to_dev(c3, "cuda"), c3 + 1)


# ---------------------------------------------------------------------------
# nn modules


def test_batchnorm2d_module_tracks_running_statistics():
    rng = np.random.default_rng(9)
    bn = nn.BatchNorm2d(3, momentum=0.2, dtype=np.float64)
    assert (bn.weight.shape, bn.bias.shape, bn.running_mean.shape) == ((3,), (3,), (3,))
    rm, rv = np.zeros(3), np.ones(3)
    for step in range(2):
        x = _rand(rng, (2, 3, 4, 4), loc=step)
        with nbops.no_grad():
            y = bn(x)
        want, rm, rv = ref_batch_norm(x, rm, rv, None, None, True, 0.2, 1e-5)
        np.testing.assert_allclose(y, want, atol=1e-12)
    np.testing.assert_allclose(bn.running_mean, rm, atol=1e-14)
    np.testing.assert_allclose(bn.running_var, rv, atol=1e-14)
    assert int(bn.num_batches_tracked) == 2
    bn.eval()
    with nbops.no_grad():
        y = bn(x)
    np.testing.assert_allclose(y, ref_batch_norm(x, rm, rv, None, None, False, 0, 1e-5)[0],
                               atol=1e-12)
    assert int(bn.num_batches_tracked) == 2


def test_batchnorm1d_cumulative_average_and_state_dict():
    rng = np.random.default_rng(10)
    bn = nn.BatchNorm1d(2, momentum=None, dtype=np.float64)
    xs = [_rand(rng, (5, 2, 3), loc=k) for k in range(3)]
    with nbops.no_grad():
        for x in xs:
            bn(x)
    # momentum=None: the plain average of the batches' statistics
    np.testing.assert_allclose(bn.running_mean, np.mean([x.mean(axis=(0, 2)) for x in xs], 0),
                               atol=1e-14)
    np.testing.assert_allclose(bn.running_var,
                               np.mean([x.var(axis=(0, 2), ddof=1) for x in xs], 0), atol=1e-14)
    state = bn.state_dict()
    assert list(state) == ["weight", "bias", "running_mean", "running_var",
                           "num_batches_tracked"]
    other = nn.BatchNorm1d(2, dtype=np.float64)
    other.load_state_dict({k: np.array(v) for k, v in state.items()})
    np.testing.assert_array_equal(other.running_var, bn.running_var)
    assert other.running_var is not state["running_var"]
    with pytest.raises(ValueError, match="expected a 2-D or 3-D input"):
        bn(np.zeros((1, 2, 3, 4)))


def test_batchnorm_buffers_follow_the_model_to_its_device(device):
    # to() on the parent moves the running statistics; training updates them
    # on the device and the counter stays an int64 0-d array there
    rng = np.random.default_rng(13)
    model = nn.Sequential(nn.BatchNorm2d(2, momentum=None, dtype=np.float64)).to(device)
    bn = model[0]
    xs = [_rand(rng, (2, 2, 1, 2), loc=k) for k in range(2)]
    with nbops.no_grad():
        for x in xs:
            model(to_dev(x, device))
    assert all(isinstance(b, np.ndarray) == (device == "cpu") for b in model.buffers())
    count = host(bn.num_batches_tracked)
    assert count.dtype == np.int64 and count.shape == () and int(count) == 2
    rm = np.mean([x.mean(axis=(0, 2, 3)) for x in xs], 0)
    rv = np.mean([x.var(axis=(0, 2, 3), ddof=1) for x in xs], 0)
    np.testing.assert_allclose(host(bn.running_mean), rm, atol=1e-14)
    np.testing.assert_allclose(host(bn.running_var), rv, atol=1e-14)
    cpu = nn.Sequential(nn.BatchNorm2d(2, dtype=np.float64))
    cpu.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(cpu[0].running_var, host(bn.running_var))
    assert int(cpu[0].num_batches_tracked) == 2
    model.eval()
    with nbops.no_grad():
        y = model(to_dev(xs[0], device))
    np.testing.assert_allclose(host(y), ref_batch_norm(xs[0], rm, rv, None, None, False, 0,
                                                       1e-5)[0], atol=1e-12)
    bn.reset_running_stats()
    assert isinstance(bn.running_mean, np.ndarray) == (device == "cpu")
    np.testing.assert_array_equal(host(bn.running_mean), 0.0)
    np.testing.assert_array_equal(host(bn.running_var), 1.0)
    assert int(host(bn.num_batches_tracked)) == 0


def test_batchnorm_without_tracking_uses_batch_statistics():
    bn = nn.BatchNorm2d(2, affine=False, track_running_stats=False, dtype=np.float64).eval()
    x = _rand(np.random.default_rng(11), (3, 2, 2, 2))
    assert bn.running_mean is None and bn.weight is None
    # registered as None, as PyTorch does: neither saved nor expected
    assert bn.num_batches_tracked is None and list(bn.named_buffers()) == []
    assert list(bn.state_dict()) == []
    assert bn.load_state_dict({"running_mean": np.zeros(2)}, strict=False) == (
        [], ["running_mean"])
    np.testing.assert_allclose(bn(x), ref_batch_norm(x, None, None, None, None, True, 0,
                                                     1e-5)[0], atol=1e-12)


def test_norm_modules_train():
    rng = np.random.default_rng(12)
    model = nn.Sequential(nn.LayerNorm(6, dtype=np.float64),
                          nn.RMSNorm(6, eps=1e-6, dtype=np.float64),
                          nn.BatchNorm1d(6, dtype=np.float64))
    x = Tensor(_rand(rng, (4, 6)), requires_grad=True)
    g = _rand(rng, (4, 6))
    (model(x) * g).sum().backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert set(grads) == {"0.weight", "0.bias", "1.weight", "2.weight", "2.bias"}
    assert all(np.abs(v).max() > 1e-3 for k, v in grads.items() if k != "1.weight")
    # batch norm undoes any per-feature scale before it: RMSNorm's weight gets
    # only what eps (1e-5 beside variances near 1) leaves
    np.testing.assert_allclose(grads["1.weight"], 0.0, atol=1e-4)
    assert np.abs(x.grad).max() > 1e-3
    np.testing.assert_allclose(grads["2.bias"], g.sum(axis=0))
    with nbops.no_grad():  # the batch norm's input, to check its weight's gradient
        h = model[1](model[0](x.data))
    xh = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-5)
    np.testing.assert_allclose(grads["2.weight"], (g * xh).sum(axis=0), atol=1e-10)
    ln = nn.LayerNorm((2, 3), elementwise_affine=False)
    assert ln.weight is None and list(ln.state_dict()) == []
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(0)
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchNorm2d(3, momentum=2.0)
