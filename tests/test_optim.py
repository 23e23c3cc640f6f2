"""Optimizers against NumPy references of PyTorch's update rules, several
steps, float32 and float64, both devices, serial and parallel kernels;
argument errors."""

import numpy as np
import pytest

import nbops
from helpers import host, to_dev
from nbops import nn
from nbops.cpu import optim as cpu_optim
from nbops.optim import SGD, Adam, AdamW

rng = np.random.default_rng(3)


def reference_sgd(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                  nesterov=False):
    p, buf = p.copy(), None
    for g in grads:
        d = g + weight_decay * p
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def reference_adam(p, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                   decoupled=False):
    p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, 1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps
        p = p - lr / (1 - b1 ** t) * m / denom
    return p


CASES = [
    (SGD, dict(lr=0.1), reference_sgd),
    (SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), reference_sgd),
    (SGD, dict(lr=0.05, momentum=0.8, nesterov=True), reference_sgd),
    (Adam, dict(lr=0.01), reference_adam),
    (Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), reference_adam),
    (AdamW, dict(lr=0.01, weight_decay=0.1),
     lambda p, g, **kw: reference_adam(p, g, decoupled=True, **kw)),
]


@pytest.mark.parametrize("cls,kwargs,reference", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_reference(cls, kwargs, reference, dtype, device):
    shape = (5, 7)
    p0 = rng.standard_normal(shape).astype(dtype)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(4)]
    param = nn.Parameter(to_dev(p0.copy(), device))   # updated in place
    opt = cls([param], **kwargs)
    for g in grads:
        param.grad = to_dev(g, device)
        opt.step()
    expected = reference(p0.astype(np.float64), [g.astype(np.float64) for g in grads],
                         **kwargs)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(host(param.data), expected, rtol=tol, atol=tol)
    assert param._version == len(grads)


def test_parallel_kernel_matches_the_serial_one(monkeypatch):
    p0 = rng.standard_normal(3000).astype(np.float32)
    g = rng.standard_normal(3000).astype(np.float32)
    out = []
    for threshold in (1, 10 ** 9):
        monkeypatch.setattr(cpu_optim, "PARALLEL_MIN", threshold)
        param = nn.Parameter(p0.copy())
        opt = Adam([param], lr=0.01)
        param.grad = g
        opt.step()
        out.append(param.data)
    np.testing.assert_array_equal(out[0], out[1])


def test_zero_grad_skip_and_strided_gradient():
    a, b = nn.Parameter(np.ones((2, 3))), nn.Parameter(np.ones(3))
    opt = SGD([a, b], lr=1.0)
    a.grad = np.arange(6.0).reshape(3, 2).T           # a transposed (strided) gradient
    opt.step()                                         # b has no gradient: untouched
    np.testing.assert_array_equal(a.data, 1 - np.arange(6.0).reshape(3, 2).T)
    np.testing.assert_array_equal(b.data, np.ones(3))
    opt.zero_grad()
    assert a.grad is None and b.grad is None


def test_training_step_through_autograd(device):
    layer = nn.Linear(3, 2, dtype=np.float64, rng=0).to(device)
    x = to_dev(rng.standard_normal((4, 3)), device)
    opt = SGD(layer.parameters(), lr=0.1)
    before = host(layer.weight.data).copy()
    loss = nn.mse_loss(layer(x), to_dev(np.zeros((4, 2)), device))
    loss.backward()
    grad = host(layer.weight.grad)
    opt.step()
    np.testing.assert_allclose(host(layer.weight.data), before - 0.1 * grad)


def test_errors():
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="parameter 0 must be a Tensor that requires grad"):
        Adam([np.ones(2)])
    with pytest.raises(ValueError, match="'lr' must be >= 0"):
        SGD([p], lr=-1)
    with pytest.raises(ValueError, match="nesterov needs momentum"):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="betas must be a pair"):
        AdamW([p], betas=0.9)
    with pytest.raises(ValueError, match="'eps' must be >= 0"):
        Adam([p], eps=-1e-8)
    opt = SGD([p], lr=0.1)
    p.grad = np.ones(3)
    with pytest.raises(ValueError, match=r"parameter 0 \(\(2,\) on cpu\) has a gradient of "
                                         r"shape \(3,\)"):
        opt.step()
    p.grad = nbops.to_device(np.ones(2))
    with pytest.raises(ValueError, match="on cuda"):
        opt.step()
    with pytest.raises(ValueError, match="C-contiguous"):
        SGD([nn.Parameter(np.ones((3, 2)).T)], lr=0.1)
