"""Demo steps that are not one op beside a baseline: a training step of a
small MLP through autograd (gradients checked against the same network
differentiated by hand in NumPy, float64), and the profiler recording the
ops of a block."""

import time

import numpy as np

import nbops

from .harness import max_error


def _mlp_grads_numpy(x, t, w1, b1, w2, b2):
    """Loss and gradients of mse(relu(x W1^T + b1) W2^T + b2, t), by hand."""
    h = x @ w1.T + b1
    a = np.maximum(h, 0)
    p = a @ w2.T + b2
    dp = 2 * (p - t) / p.size
    da = dp @ w2
    dh = da * (h > 0)
    return np.mean((p - t) ** 2), (dh.T @ x, dh.sum(0), dp.T @ a, dp.sum(0))


def training_step(device, quick):
    """Forward, backward and an SGD update of Linear-ReLU-Linear with an MSE
    loss; the error is that of the first step's gradients and loss."""
    rng = np.random.default_rng(0)
    batch = 16 if device == "cuda" and nbops._dispatch.cuda_simulated() else (64 if quick
                                                                              else 512)
    x = rng.standard_normal((batch, 32)).astype(np.float32)
    t = rng.standard_normal((batch, 1)).astype(np.float32)
    l1 = nbops.nn.Linear(32, 16, rng=1)
    l2 = nbops.nn.Linear(16, 1, rng=2)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    wide = [np.asarray(p.data, np.float64) for p in params]
    if device == "cuda":
        l1.to("cuda")
        l2.to("cuda")
        x, t = nbops.to_device(x), nbops.to_device(t)
    opt = nbops.optim.SGD(params, lr=0.05)
    losses, steps = [], 5
    for i in range(steps):
        if i == 1:  # the first step compiles (or loads) the kernels
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = nbops.nn.mse_loss(l2(nbops.relu(l1(x))), t)
        loss.backward()
        if i == 0:
            grads = tuple(nbops.to_host(p.grad) for p in params)
            first = float(np.asarray(nbops.to_host(loss.data)))
        losses.append(float(np.asarray(nbops.to_host(loss.data))))
        opt.step()
    seconds = (time.perf_counter() - t0) / (steps - 1)
    ref_loss, ref_grads = _mlp_grads_numpy(np.asarray(nbops.to_host(x), np.float64),
                                           np.asarray(nbops.to_host(t), np.float64), *wide)
    err = max(max_error(grads, ref_grads), max_error(np.array(first), np.array(ref_loss)))
    if not losses[-1] < losses[0]:
        raise AssertionError(f"SGD did not lower the loss: {losses}")
    return {"name": "mlp_sgd_step", "err": err, "tol": 1e-4, "seconds": seconds,
            "note": f"per step; loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps"}


def profiler_block(device, quick):
    """The profiler sees each op of a block once, and the block's result is
    unchanged by being profiled."""
    from nbops import profiler

    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    xd = nbops.to_device(x) if device == "cuda" else x
    t0 = time.perf_counter()
    with profiler.profile(record_shapes=True) as prof:
        y = nbops.relu(nbops.gelu(xd))
    seconds = time.perf_counter() - t0
    counts = {a.key: a.count for a in prof.key_averages()}
    if counts.get("gelu") != 1 or counts.get("relu") != 1:
        raise AssertionError(f"profiler recorded {counts}, expected gelu and relu once")
    ref = np.maximum(0.5 * x * (1 + _erf(x / np.sqrt(2.0))), 0)
    return {"name": "profiler", "err": max_error(y, ref), "tol": 1e-5, "seconds": seconds,
            "note": f"recorded {sorted(counts)}"}


def _erf(x):
    from scipy import special

    return special.erf(np.asarray(x, np.float64))


DEMOS = [training_step, profiler_block]
