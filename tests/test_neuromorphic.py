"""Spiking neurons: every model against a direct NumPy transcription of its
equations (the seed article's loop for LIF), the streaming step against the
sequence kernel, the surrogate backward against finite differences of a
smoothed forward, encoders' statistics, CPU and simulated CUDA, the error
paths, and a small spiking network that learns."""

import importlib

import numpy as np
import pytest
from scipy import special

import nbops
import nbops.neuromorphic as nm
from helpers import check_bench_case, host, to_dev

lifmod = importlib.import_module("nbops.neuromorphic.lif")

# ---------------------------------------------------------------------------
# References


def seed_loop(spikes, decay, threshold):
    """The seed article's neuromorphic_operator, in NumPy (plus the final membrane)."""
    membrane_potential = np.zeros_like(spikes[0])
    output = []
    for t in range(len(spikes)):
        membrane_potential = membrane_potential * decay + spikes[t]
        spike_out = (membrane_potential > threshold).astype(spikes.dtype)
        membrane_potential -= spike_out * threshold
        output.append(spike_out)
    return np.stack(output), membrane_potential


def _membrane(model, v, b, x_t, beta, thr, p2, p3, active, zero):
    """One step's membrane before the spike: ``(u, threshold, b)`` (b the
    synaptic current or the adaptation, as the model has it)."""
    if model == "lif":
        return v * beta + np.where(active, x_t, zero), thr, b
    if model == "synaptic":
        b = b * p2 + x_t
        return v * beta + b, thr, b
    return v * beta + x_t, thr + p3 * b, b      # alif: the threshold adapts


def ref_run(model, x, beta, thr, p2=0.0, p3=0.0, reset="subtract", v0=None, b0=None,
            refractory=0, spike=None, detach=True):
    """Each model's equations step by step, in x's dtype.

    ``spike(t, z, h)`` replaces the spike's value (for the smoothed forward of
    the gradient checks); the reset then uses the plain spike when
    ``detach``. Returns spikes, pre-reset membranes, final v, final b and the
    plain spikes and z = u - theta of every step.
    """
    dt = x.dtype.type
    beta, thr, p2, p3 = (np.asarray(v, x.dtype) if np.ndim(v) else dt(v)
                         for v in (beta, thr, p2, p3))
    v = np.zeros(x.shape[1:], x.dtype) if v0 is None else v0.astype(x.dtype)
    b = np.zeros(x.shape[1:], x.dtype) if b0 is None else b0.astype(x.dtype)
    r = np.zeros(x.shape[1:], np.int64)
    spikes, trace, plain, zs = [], [], [], []
    for t in range(x.shape[0]):
        active = r == 0 if model == "lif" else np.ones(x.shape[1:], bool)
        u, theta, b = _membrane(model, v, b, x[t], beta, thr, p2, p3, active, dt(0))
        h = (u > theta) & active
        s = h.astype(x.dtype) if spike is None else np.where(active, spike(t, u - theta, h), 0)
        sr = h.astype(x.dtype) if (spike is None or detach) else s
        if reset == "subtract":
            v = u - sr * theta
        elif reset == "zero":
            v = u * (1 - sr)
        else:
            v = u
        if model == "lif":
            r = np.where(h, refractory, np.maximum(r - 1, 0))
        elif model == "alif":
            b = b * p2 + s
        spikes.append(s)
        trace.append(u)
        plain.append(h)
        zs.append(u - theta)
    return np.stack(spikes), np.stack(trace), v, b, np.stack(plain), np.stack(zs)


# The op table's references (tests/test_ops.py, by the names in the specs
# of nbops/neuromorphic): each takes its operator's arguments (arrays as
# float64) and returns what the operator returns. The surrogate keywords
# shape only the backward.


def ref_lif(inputs, beta, threshold=1.0, reset="subtract", v0=None, *, refractory=0,
            trace=False, spike_dtype=None, **surrogate):
    s, tr, v, _, _, _ = ref_run("lif", inputs, beta, threshold, reset=reset, v0=v0,
                                refractory=refractory)
    return (s, v, tr) if trace else (s, v)


def ref_if_neuron(inputs, threshold=1.0, reset="subtract", v0=None, **kwargs):
    return ref_lif(inputs, 1.0, threshold, reset, v0, **kwargs)


def ref_synaptic(inputs, alpha, beta, threshold=1.0, reset="subtract", syn0=None, v0=None, *,
                 trace=False, spike_dtype=None, **surrogate):
    s, tr, v, syn, _, _ = ref_run("synaptic", inputs, beta, threshold, alpha, reset=reset,
                                  v0=v0, b0=syn0)
    return (s, syn, v, tr) if trace else (s, syn, v)


def ref_alif(inputs, beta, threshold=1.0, adapt_decay=0.95, adapt_scale=0.2, reset="subtract",
             v0=None, a0=None, *, trace=False, spike_dtype=None, **surrogate):
    s, tr, v, a, _, _ = ref_run("alif", inputs, beta, threshold, adapt_decay, adapt_scale,
                                reset, v0=v0, b0=a0)
    return (s, v, a, tr) if trace else (s, v, a)


# The random encoder's generator, written in NumPy from its definition in
# nbops/neuromorphic/encoding.py (as tests/fuzz_table.py's): element (t, j)
# of a [T, M] train draws hash(hash(i_lo ^ hash(i_hi ^ key)) ^ key) / 2**32
# for counter i = t M + j, with Wellons' lowbias32 hash and key =
# hash(seed_lo) ^ seed_hi; a spike where the draw is below its probability.

_U32 = np.uint64(0xFFFFFFFF)


def _lowbias32(x):
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & _U32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & _U32
    return x ^ (x >> np.uint64(16))


def _counter_uniform(seed, counters):
    key = _lowbias32(np.uint64(seed & 0xFFFFFFFF)) ^ np.uint64(seed >> 32)
    i = counters.astype(np.uint64)
    h = _lowbias32((i & _U32) ^ _lowbias32((i >> np.uint64(32)) ^ key))
    return _lowbias32(h ^ key).astype(np.float64) / 2.0 ** 32


def ref_rate(x, num_steps, gain=1.0, *, mode="bernoulli", seed=0, dtype=np.uint8):
    lam = x.reshape(-1) * gain
    lam = np.where(lam > 0, lam, 0.0)            # NaN and negative never spike
    p = -np.expm1(-lam) if mode == "poisson" else np.minimum(lam, 1.0)
    counters = np.arange(num_steps * p.size).reshape(num_steps, p.size)
    return (_counter_uniform(seed, counters) < p).reshape((num_steps,) + x.shape) * 1.0


def ref_latency(x, num_steps, *, tau=5.0, threshold=0.01, linear=False, dtype=np.uint8):
    """One spike per neuron at round(tau log(x / (x - threshold))) (or the
    linear ramp), none for x <= threshold or a step past the end."""
    if linear:
        t = (1.0 - np.minimum(x, 1.0)) * (num_steps - 1)
    else:
        t = tau * np.log(x / (x - threshold))
    step = np.where((x > threshold) & (t < num_steps), np.floor(t + 0.5), num_steps)
    return (np.arange(num_steps).reshape((-1,) + (1,) * x.ndim) == step) * 1.0


def ref_delta(x, threshold=0.1, *, padding=False, off_spike=False, dtype=None):
    prev = np.concatenate([x[:1] if padding else np.zeros_like(x[:1]), x[:-1]])
    diff = x - prev
    s = (diff >= threshold) * 1.0
    return s - (diff <= -threshold) if off_spike else s


def ref_spike_count(spikes):
    return spikes.sum(axis=0)


def ref_first_spike_time(spikes):
    fired = spikes != 0
    return np.where(fired.any(axis=0), fired.argmax(axis=0), len(spikes)).astype(np.int32)


def ref_lif_step(x, state=None, params=nm.LIFParameters(), spike_dtype=None, inplace=False):
    """One step of ``ref_lif``; the state (a keyword argument's arrays are
    not converted by the op table) in float64."""
    v0 = None if state is None else np.asarray(state.v, np.float64)
    beta, threshold, reset = (np.asarray(p, np.float64) if isinstance(p, np.ndarray) else p
                              for p in params)
    s, v = ref_lif(np.asarray(x, np.float64)[None], beta, threshold, reset, v0)
    return s[0], nm.LIFState(v)


# Surrogate derivatives d s / d z, from their documented formulas (the
# gradients of ANTIDERIVATIVE below); each is 0 at z = -inf, where a
# refractory neuron sits (its threshold is +inf)
SURROGATE_DERIVATIVE = {
    "fast_sigmoid": lambda z, k: 1 / (k * np.abs(z) + 1) ** 2,
    "sigmoid": lambda z, k: k * special.expit(k * z) * (1 - special.expit(k * z)),
    "atan": lambda z, k: k / 2 / (1 + (np.pi / 2 * k * z) ** 2),
    "triangle": lambda z, k: np.maximum(1 - np.abs(z) / k, 0) / k,
    "straight_through": lambda z, k: np.isfinite(z) * 1.0,
}


def ref_bptt(model, gs, x, beta, thr, p2=0.0, p3=0.0, reset="subtract", v0=None, b0=None,
             ga=None, gb=None, gtrace=None, refractory=0, surrogate="fast_sigmoid", k=None,
             detach=True):
    """Backpropagation through time of ``ref_run``'s equations (float64),
    with the spike's derivative replaced by the surrogate's, by the chain
    rule step by step: the upstream gradients are ``gs`` (spikes), ``ga``
    and ``gb`` (final v and second state) and ``gtrace`` (pre-reset
    membranes). Returns the gradients of the inputs, per-neuron beta and
    threshold, and of the initial v and second state."""
    step = x.shape[1:]
    beta, thr, p2, p3 = (np.broadcast_to(np.asarray(p, np.float64), step)
                         for p in (beta, thr, p2, p3))
    zeros = np.zeros(step)
    v = zeros if v0 is None else v0
    b = zeros if b0 is None else b0
    r = np.zeros(step, np.int64)
    hist = []                   # (v before the step, u, theta, spike, active)
    for t in range(x.shape[0]):
        active = r == 0 if model == "lif" else np.ones(step, bool)
        u, theta, b = _membrane(model, v, b, x[t], beta, thr, p2, p3, active, 0.0)
        if model == "lif":
            theta = np.where(active, thr, np.inf)
        h = u > theta
        hist.append((v, u, theta, h, active))
        v = np.where(h, u - theta, u) if reset == "subtract" else \
            np.where(h, 0.0, u) if reset == "zero" else u
        if model == "lif":
            r = np.where(h, refractory, np.maximum(r - 1, 0))
        elif model == "alif":
            b = b * p2 + h
    deriv = SURROGATE_DERIVATIVE[surrogate]
    ga = zeros if ga is None else ga
    gb = zeros if gb is None or model == "lif" else gb
    gx = np.zeros(x.shape)
    gbeta, gthr = zeros.copy(), zeros.copy()
    for t in reversed(range(x.shape[0])):
        vprev, u, theta, h, active = hist[t]
        sig = deriv(u - theta, k)
        # the spike's gradient: upstream, the adaptation's (ALIF), and the
        # reset's unless detached (d v' / d s = -theta, -u or 0)
        g_s = gs[t] + (gb if model == "alif" else 0.0)
        if not detach:
            g_s = g_s - ga * (theta if reset == "subtract" else u if reset == "zero" else 0.0)
        dvdu = np.where(h, 0.0, 1.0) if reset == "zero" else 1.0
        gu = g_s * sig + ga * dvdu + (0.0 if gtrace is None else gtrace[t])
        gtheta = -(g_s * sig) - (np.where(h, ga, 0.0) if reset == "subtract" else 0.0)
        if model == "lif":
            gx[t] = np.where(active, gu, 0.0)
        elif model == "synaptic":
            gx[t] = gu + gb
            gb = p2 * gx[t]
        else:
            gx[t] = gu
            gb = p2 * gb + p3 * gtheta
        ga = beta * gu
        gbeta = gbeta + gu * vprev
        gthr = gthr + gtheta
    return gx, gbeta, gthr, ga, gb


def _summed_to(g, param):
    """A per-neuron gradient summed to its parameter's shape, as the
    backward ops return it: a float for a number."""
    if not isinstance(param, np.ndarray):
        return float(g.sum())
    lead = g.ndim - param.ndim
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(param.shape)
                                      if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(param.shape)


def _surrogate_args(surrogate, given):
    """``(name, parameter)`` of a surrogate given by name (its keyword in
    ``given`` or its default) or as a ``(name, value)`` pair."""
    if isinstance(surrogate, tuple):
        return surrogate
    value = next((v for v in given.values() if v is not None), None)
    return surrogate, nm.SURROGATES[surrogate][2] if value is None else value


def _f64(a):
    return None if a is None else np.asarray(a, np.float64)


def ref_lif_backward(grad_spikes, inputs, beta, threshold=1.0, reset="subtract", v0=None, *,
                     grad_v=None, grad_trace=None, refractory=0, surrogate="fast_sigmoid",
                     slope=None, alpha=None, width=None, detach_reset=True):
    name, k = _surrogate_args(surrogate, dict(slope=slope, alpha=alpha, width=width))
    gx, gb, gt, gv0, _ = ref_bptt("lif", grad_spikes, inputs, beta, threshold, reset=reset,
                                  v0=_f64(v0), ga=_f64(grad_v), gtrace=_f64(grad_trace),
                                  refractory=refractory, surrogate=name, k=k,
                                  detach=detach_reset)
    return {"inputs": gx, "beta": _summed_to(gb, beta),
            "threshold": _summed_to(gt, threshold), "v0": gv0}


def ref_if_neuron_backward(grad_spikes, inputs, threshold=1.0, reset="subtract", v0=None,
                           **kwargs):
    g = ref_lif_backward(grad_spikes, inputs, 1.0, threshold, reset, v0, **kwargs)
    del g["beta"]
    return g


def ref_synaptic_backward(grad_spikes, inputs, alpha, beta, threshold=1.0, reset="subtract",
                          syn0=None, v0=None, *, grad_syn=None, grad_v=None, grad_trace=None,
                          surrogate="fast_sigmoid", slope=None, width=None,
                          detach_reset=True):
    name, k = _surrogate_args(surrogate, dict(slope=slope, width=width))
    gx, gb, gt, gv0, gs0 = ref_bptt("synaptic", grad_spikes, inputs, beta, threshold, alpha,
                                    reset=reset, v0=_f64(v0), b0=_f64(syn0), ga=_f64(grad_v),
                                    gb=_f64(grad_syn), gtrace=_f64(grad_trace), surrogate=name,
                                    k=k, detach=detach_reset)
    return {"inputs": gx, "beta": _summed_to(gb, beta), "threshold": _summed_to(gt, threshold),
            "syn0": gs0, "v0": gv0}


def ref_alif_backward(grad_spikes, inputs, beta, threshold=1.0, adapt_decay=0.95,
                      adapt_scale=0.2, reset="subtract", v0=None, a0=None, *, grad_v=None,
                      grad_a=None, grad_trace=None, surrogate="fast_sigmoid", slope=None,
                      alpha=None, width=None, detach_reset=True):
    name, k = _surrogate_args(surrogate, dict(slope=slope, alpha=alpha, width=width))
    gx, gb, gt, gv0, ga0 = ref_bptt("alif", grad_spikes, inputs, beta, threshold, adapt_decay,
                                    adapt_scale, reset, v0=_f64(v0), b0=_f64(a0),
                                    ga=_f64(grad_v), gb=_f64(grad_a), gtrace=_f64(grad_trace),
                                    surrogate=name, k=k, detach=detach_reset)
    return {"inputs": gx, "beta": _summed_to(gb, beta), "threshold": _summed_to(gt, threshold),
            "v0": gv0, "a0": ga0}


# Antiderivatives of the surrogates (written from their documented formulas)
# make a smooth stand-in for the spike: value H at the base point, slope the
# surrogate's derivative everywhere.
def _triangle(z, w):
    inner = z / w - z * np.abs(z) / (2 * w * w)
    return np.where(np.abs(z) < w, inner, np.sign(z) / 2)


ANTIDERIVATIVE = {
    "fast_sigmoid": lambda z, k: z / (1 + k * np.abs(z)),
    "sigmoid": lambda z, k: special.expit(k * z),
    "atan": lambda z, k: np.arctan(np.pi / 2 * k * z) / np.pi,
    "triangle": _triangle,
    "straight_through": lambda z, k: z,
}
SURROGATE_PARAM = {"fast_sigmoid": 4.0, "sigmoid": 3.0, "atan": 2.0, "triangle": 1.5,
                   "straight_through": None}

# model -> (public forward, keyword parameters, name of the second state, its grad kw)
MODELS = {
    "lif": (nm.lif, {"beta": 0.8}, None, None),
    "if": (nm.if_neuron, {}, None, None),
    "synaptic": (nm.synaptic, {"alpha": 0.7, "beta": 0.85}, "syn0", "grad_syn"),
    "alif": (nm.alif, {"beta": 0.85, "adapt_decay": 0.9, "adapt_scale": 0.3}, "a0", "grad_a"),
}


def _ref_args(model, kw):
    beta = kw.get("beta", 1.0)
    p2 = kw.get("alpha", kw.get("adapt_decay", 0.0))
    return ("lif" if model == "if" else model), beta, p2, kw.get("adapt_scale", 0.0)


def _inputs(shape, dtype, seed=0, scale=0.7):
    return (np.random.default_rng(seed).random(shape) * scale).astype(dtype)


# ---------------------------------------------------------------------------
# Forward


def test_seed_article_loop_bit_identical():
    x = _inputs((50, 4, 33), np.float32, scale=0.6)
    s, v = nm.lif(x, 0.9, 1.0)
    rs, rv = seed_loop(x, np.float32(0.9), np.float32(1.0))
    assert s.dtype == np.float32 and s.shape == x.shape
    assert np.array_equal(s, rs) and np.array_equal(v, rv)
    assert 0 < s.sum() < s.size


CASES = [
    ("lif", {}, "subtract", 0),
    ("lif", {}, "zero", 0),
    ("lif", {}, "none", 0),
    ("lif", {}, "subtract", 2),
    ("if", {}, "subtract", 0),
    ("synaptic", {}, "subtract", 0),
    ("synaptic", {}, "zero", 0),
    ("alif", {}, "subtract", 0),
    ("alif", {}, "none", 0),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("model,extra,reset,refr", CASES)
def test_models_round_as_the_equations_in_their_dtype(model, extra, reset, refr, dtype):
    """On the CPU (no FMA contraction) every model rounds as its equations
    written in the inputs' dtype, bit for bit, on inputs that are not exact
    in float32 (the op table compares with float64 on exact inputs)."""
    fn, kw, state_name, _ = MODELS[model]
    x = _inputs((9, 2, 3 * 32 + 1), dtype, seed=1)
    v0 = _inputs(x.shape[1:], dtype, seed=2, scale=0.5)
    kwargs = dict(kw, reset=reset, v0=v0, trace=True)
    if refr:
        kwargs["refractory"] = refr
    out = fn(x, **kwargs)
    m, beta, p2, p3 = _ref_args(model, kw)
    rs, rtr, rv, rb, _, _ = ref_run(m, x, beta, 1.0, p2, p3, reset, v0=v0, refractory=refr)
    assert np.array_equal(out[0], rs), "spikes differ"
    assert np.array_equal(out[-1], rtr)
    states = [rv] if state_name is None else [rb, rv] if model == "synaptic" else [rv, rb]
    for got, want in zip(out[1:-1], states):
        assert np.array_equal(got, want)
    assert 0 < rs.sum() < rs.size


def test_refractory_blocks_spikes():
    x = np.full((10, 1), 2.0)
    s, _ = nm.lif(x, 0.5, refractory=3)
    assert s[:, 0].tolist() == [1, 0, 0, 0, 1, 0, 0, 0, 1, 0]


@pytest.mark.parametrize("spike_dtype", [np.uint8, np.bool_])
def test_compact_spike_storage(device, spike_dtype):
    x = _inputs((5, 40), np.float32, seed=4, scale=0.9)
    s, v = host(nm.lif(to_dev(x, device), 0.9, spike_dtype=spike_dtype))
    ref, rv = seed_loop(x, np.float32(0.9), np.float32(1.0))
    assert s.dtype == spike_dtype and np.array_equal(s.astype(np.float32), ref)
    assert np.array_equal(v, rv)


def test_out_argument():
    x = _inputs((4, 8), np.float32)
    out = np.empty((4, 8), np.uint8)
    s, _ = nm.lif(x, 0.9, spike_dtype=np.uint8, out=out)
    assert s is out


@pytest.mark.parametrize("model", ["lif", "synaptic", "alif"])
def test_backward_out_argument_receives_the_input_gradient(model):
    x = _inputs((6, 40), np.float64, seed=8, scale=0.9)
    gs = np.random.default_rng(8).standard_normal(x.shape)
    back = {"lif": lambda **kw: nm.lif_backward(gs, x, 0.9, **kw),
            "synaptic": lambda **kw: nm.synaptic_backward(gs, x, 0.6, 0.9, **kw),
            "alif": lambda **kw: nm.alif_backward(gs, x, 0.9, **kw)}[model]
    out = np.full(x.shape, np.nan)
    g = back(out=out)
    assert g["inputs"] is out
    assert np.array_equal(out, back()["inputs"])


def test_continuing_a_sequence_matches_one_call(device):
    x = _inputs((12, 37), np.float64, seed=5)
    s = host(nm.synaptic(to_dev(x, device), 0.6, 0.9))
    s1, syn1, v1 = nm.synaptic(to_dev(x[:5], device), 0.6, 0.9)
    s2, syn2, v2 = host(nm.synaptic(to_dev(x[5:], device), 0.6, 0.9, syn0=syn1, v0=v1))
    assert np.array_equal(np.concatenate([host(s1), s2]), s[0])
    np.testing.assert_allclose(v2, s[2], rtol=1e-12)


def test_lif_step_is_the_sequence_kernel(device):
    x = _inputs((15, 4, 21), np.float32, seed=6, scale=0.8)
    params = nm.LIFParameters(beta=0.85, threshold=0.9, reset="zero")
    s, v = host(nm.lif(to_dev(x, device), 0.85, 0.9, "zero"))
    state, steps = None, []
    for t in range(x.shape[0]):
        spk, state = nm.lif_step(to_dev(x[t], device), state, params)
        steps.append(host(spk))
        assert isinstance(state, nm.LIFState)
    assert np.array_equal(np.stack(steps), s)
    assert np.array_equal(host(state.v), v)


def test_lif_step_in_place_with_out_is_the_sequence_kernel(device):
    x = _inputs((9, 3, 40), np.float32, seed=7, scale=0.8)
    params = nm.LIFParameters(beta=0.8, threshold=0.9)
    s, v = host(nm.lif(to_dev(x, device), 0.8, 0.9, spike_dtype=np.uint8))
    state = nm.LIFState(to_dev(np.zeros(x.shape[1:], np.float32), device))
    v_buf = state.v
    spikes = to_dev(np.empty(x.shape[1:], np.uint8), device)
    for t in range(x.shape[0]):
        spk, new = nm.lif_step(to_dev(x[t], device), state, params, np.uint8, out=spikes,
                               inplace=True)
        assert spk is spikes and new is state and new.v is v_buf
        assert np.array_equal(host(spk), s[t])
    assert np.array_equal(host(state.v), v)


# ---------------------------------------------------------------------------
# Backward through time: finite differences of the smoothed forward


def _smooth_loss(model, surrogate, k, x, beta, thr, p2, p3, reset, v0, b0, detach, w,
                 base):
    S = ANTIDERIVATIVE[surrogate]
    h0, z0 = base

    def spike(t, z, h):
        return h0[t] + S(z, k) - S(z0[t], k)

    s, tr, v, b, _, _ = ref_run(model, x, beta, thr, p2, p3, reset, v0, b0,
                                spike=spike, detach=detach)
    return (w[0] * s).sum() + (w[1] * v).sum() + (w[2] * tr).sum() + \
        ((w[3] * b).sum() if model != "lif" else 0.0)


GRAD_CASES = [
    ("lif", "fast_sigmoid", "subtract", True),
    ("lif", "sigmoid", "subtract", False),
    ("lif", "atan", "zero", True),
    ("lif", "atan", "zero", False),
    ("lif", "triangle", "none", True),
    ("lif", "straight_through", "subtract", True),
    ("if", "fast_sigmoid", "subtract", False),
    # the other models with one surrogate: each (model, surrogate) is its own kernel
    ("synaptic", "fast_sigmoid", "subtract", False),
    ("synaptic", "fast_sigmoid", "zero", True),
    ("alif", "fast_sigmoid", "subtract", False),
    ("alif", "fast_sigmoid", "subtract", True),
]


@pytest.mark.parametrize("model,surrogate,reset,detach", GRAD_CASES)
def test_backward_matches_finite_differences(model, surrogate, reset, detach):
    fn, kw, state_name, grad_state = MODELS[model]
    m, beta, p2, p3 = _ref_args(model, kw)
    rng = np.random.default_rng(7)
    x = rng.random((8, 2, 3)) * 0.9
    v0 = rng.random((2, 3)) * 0.5
    b0 = rng.random((2, 3)) * 0.3 if state_name else None
    w = [rng.standard_normal(x.shape), rng.standard_normal(v0.shape),
         rng.standard_normal(x.shape), rng.standard_normal(v0.shape)]
    k = SURROGATE_PARAM[surrogate]
    base = ref_run(m, x, beta, 1.0, p2, p3, reset, v0, b0)[4:]
    assert 0 < base[0].sum() < base[0].size

    def loss(x=x, beta=beta, thr=1.0, v0=v0, b0=b0):
        return _smooth_loss(m, surrogate, k, x, beta, thr, p2, p3, reset, v0, b0, detach, w,
                            base)

    back = {"lif": nm.lif_backward, "if": nm.if_neuron_backward,
            "synaptic": nm.synaptic_backward, "alif": nm.alif_backward}[model]
    extra = {state_name: b0, grad_state: w[3]} if state_name else {}
    g = back(w[0], x, **kw, reset=reset, v0=v0, grad_v=w[1], grad_trace=w[2],
             surrogate=(surrogate, k) if k else surrogate, detach_reset=detach, **extra)

    eps = 1e-6

    def numeric(name, value):
        value = np.asarray(value, np.float64)
        out = np.zeros(value.shape)
        for i in np.ndindex(value.shape or ()):
            hi, lo = value.copy(), value.copy()
            hi[i] += eps
            lo[i] -= eps
            out[i] = (loss(**{name: hi}) - loss(**{name: lo})) / (2 * eps)
        return out

    def close(a, n):
        np.testing.assert_allclose(a, n, rtol=1e-4, atol=1e-6)

    close(g["inputs"], numeric("x", x))
    close(g["v0"], numeric("v0", v0))
    close(g["threshold"], numeric("thr", 1.0))
    if model != "if":
        close(g["beta"], numeric("beta", beta))
    if state_name:
        close(g[state_name], numeric("b0", b0))
    assert np.abs(g["inputs"]).max() > 1e-3


def test_backward_per_neuron_parameters_reduce_to_their_shape():
    x = _inputs((6, 3, 4), np.float64, seed=8, scale=1.0)
    beta = np.full((4,), 0.8)
    thr = np.array([[0.9]])
    gs = np.ones_like(x)
    g = nm.lif_backward(gs, x, beta, thr)
    g_scalar = nm.lif_backward(gs, x, 0.8, 0.9)
    assert g["beta"].shape == (4,) and g["threshold"].shape == (1, 1)
    np.testing.assert_allclose(g["beta"].sum(), g_scalar["beta"], rtol=1e-12)
    np.testing.assert_allclose(g["threshold"].sum(), g_scalar["threshold"], rtol=1e-12)
    np.testing.assert_allclose(g["inputs"], g_scalar["inputs"], rtol=1e-12)


@pytest.mark.parametrize("model", ["lif", "synaptic", "alif"])
def test_backward_cuda_matches_cpu(model):
    fn, kw, state_name, grad_state = MODELS[model]
    back = {"lif": nm.lif_backward, "synaptic": nm.synaptic_backward,
            "alif": nm.alif_backward}[model]
    x = _inputs((5, 3 * 32 + 1), np.float64, seed=9, scale=0.9)
    gs = np.random.default_rng(1).standard_normal(x.shape)
    opts = dict(kw, surrogate="fast_sigmoid", slope=3.0, detach_reset=False)
    cpu = back(gs, x, **opts)
    dev = back(to_dev(gs, "cuda"), to_dev(x, "cuda"), **opts)
    for key in cpu:
        np.testing.assert_allclose(host(dev[key]), cpu[key], rtol=1e-10, atol=1e-12)


def test_refractory_backward_passes_no_input_gradient_while_refractory():
    x = np.full((6, 1), 2.0)
    g = nm.lif_backward(np.ones_like(x), x, 0.5, refractory=2, surrogate="straight_through")
    s, _ = nm.lif(x, 0.5, refractory=2)
    assert s[:, 0].tolist() == [1, 0, 0, 1, 0, 0]
    assert np.all(g["inputs"][s[:, 0] == 0] == 0) and np.all(g["inputs"][s[:, 0] == 1] != 0)


def test_autograd_uses_the_backward_kernel(device):
    x = _inputs((6, 2, 5), np.float64, seed=10)
    w = np.random.default_rng(2).standard_normal(x.shape)
    xt = nbops.Tensor(to_dev(x, device), requires_grad=True)
    beta = nbops.Tensor(to_dev(np.array([0.8]), device), requires_grad=True)
    s, v = nm.lif(xt, beta, surrogate="atan", alpha=3.0)
    loss = (s * nbops.Tensor(to_dev(w, device))).sum() + v.sum()
    loss.backward()
    g = nm.lif_backward(w, x, np.array([0.8]), grad_v=np.ones(x.shape[1:]), surrogate="atan",
                        alpha=3.0)
    np.testing.assert_allclose(host(xt.grad), g["inputs"], rtol=1e-12)
    np.testing.assert_allclose(host(beta.grad), g["beta"], rtol=1e-12)


# ---------------------------------------------------------------------------
# Encoders and decoders


def _within_binomial(count, n, p, z=5.0):
    sd = np.sqrt(n * p * (1 - p))
    return np.all(np.abs(count - n * p) <= z * sd + 1)


@pytest.mark.parametrize("mode", ["bernoulli", "poisson"])
def test_rate_statistics(mode):
    x = np.array([0.0, 0.05, 0.3, 0.5, 0.9, 1.0, 1.7, -1.0, np.nan], np.float32)
    n = 4000
    s = nm.rate(np.tile(x, (16, 1)), n, gain=0.8, mode=mode, seed=11)
    assert s.shape == (n, 16, 9) and s.dtype == np.uint8
    lam = np.nan_to_num(np.clip(x.astype(np.float64) * 0.8, 0, None))
    p = np.minimum(lam, 1.0) if mode == "bernoulli" else -np.expm1(-lam)
    counts = s.sum(axis=0)
    assert _within_binomial(counts, n, p)
    # pooled over the 16 copies: a tighter check, and no correlation between steps
    assert _within_binomial(counts.sum(axis=0), 16 * n, p)
    mid = s[:, :, 3].astype(float)
    lag = np.mean((mid[1:] - mid.mean()) * (mid[:-1] - mid.mean())) / mid.var()
    assert abs(lag) < 0.03


def test_rate_is_seeded_and_device_independent(device):
    x = _inputs((3, 35), np.float32, seed=12, scale=1.0)
    a = host(nm.rate(to_dev(x, device), 6, seed=5, dtype=np.bool_))
    assert a.dtype == np.bool_
    assert np.array_equal(a, nm.rate(x, 6, seed=5, dtype=np.bool_))
    assert not np.array_equal(nm.rate(x, 6, seed=5), nm.rate(x, 6, seed=6))


def test_first_spike_time_decodes_latency(device):
    x = np.array([1.0, 0.5, 0.2, 0.011, 0.005, 0.0])
    s = host(nm.latency(to_dev(x, device), 30, tau=5.0, threshold=0.01))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(x > 0.01, np.floor(5.0 * np.log(x / (x - 0.01)) + 0.5), 30)
    assert np.array_equal(host(nm.first_spike_time(to_dev(s, device))), t)
    lin = host(nm.latency(to_dev(x, device), 11, linear=True, dtype=np.float32))
    assert np.array_equal(host(nm.first_spike_time(lin)), [0, 5, 8, 10, 11, 11])


def test_delta(device):
    x = np.array([[0.2, 0.0], [0.5, 0.0], [0.55, -0.3], [0.0, 0.0]])
    on = host(nm.delta(to_dev(x, device), 0.1))
    assert on.dtype == np.uint8 and on.tolist() == [[1, 0], [1, 0], [0, 0], [0, 1]]
    both = host(nm.delta(to_dev(x, device), 0.1, off_spike=True, padding=True))
    assert both.dtype == np.int8 and both.tolist() == [[0, 0], [1, 0], [0, -1], [-1, 1]]


def test_decoders(device):
    s = (np.random.default_rng(13).random((9, 2, 35)) < 0.2)
    for dt in (np.uint8, np.bool_, np.float32):
        sd = to_dev(s.astype(dt), device)
        c = host(nm.spike_count(sd))
        assert np.array_equal(c, s.sum(axis=0))
        assert c.dtype == (np.float32 if dt == np.float32 else np.int32)
    first = np.where(s.any(axis=0), s.argmax(axis=0), 9)
    assert np.array_equal(host(nm.first_spike_time(to_dev(s.astype(np.uint8), device))), first)


# ---------------------------------------------------------------------------
# Errors

X = np.zeros((4, 3), np.float32)


def test_backward_out_must_not_overlap_the_inputs():
    with pytest.raises(ValueError, match="lif_backward: .*'out' overlaps input 'inputs'"):
        nm.lif_backward(X, X, 0.9, out=X)


def test_mixed_devices_are_an_error():
    with pytest.raises(TypeError, match="different devices"):
        nm.lif(X, 0.9, v0=to_dev(np.zeros(3, np.float32), "cuda"))


def test_inputs_are_not_modified():
    x = _inputs((5, 6), np.float32)
    v0 = _inputs((6,), np.float32, seed=1)
    keep = x.copy(), v0.copy()
    nm.lif(x, 0.9, v0=v0)
    nm.lif_backward(x, x, 0.9, v0=v0)
    assert np.array_equal(x, keep[0]) and np.array_equal(v0, keep[1])


# ---------------------------------------------------------------------------
# Layers and training


def test_layers_compose_with_linear():
    from nbops import nn

    net = nn.Sequential(nn.Linear(6, 10, rng=0), nn.LIF(beta=0.9),
                        nn.Linear(10, 3, rng=1), nn.Synaptic(alpha=0.8, beta=0.9),
                        nn.TimeDistributed(nn.Linear(3, 4, rng=2)), nn.ALIF(beta=0.9))
    x = _inputs((7, 5, 6), np.float32, scale=3.0)
    with nbops.no_grad():
        y = net(x)
    assert isinstance(y, np.ndarray) and y.shape == (7, 5, 4)
    # the first two layers by hand: one batched product, then the fused kernel
    w, b = net[0].weight.data, net[0].bias.data
    s, _ = nm.lif(x @ w.T + b, 0.9)
    with nbops.no_grad():
        np.testing.assert_array_equal(net[1](net[0](x)), s)


def test_learnable_parameters_get_gradients_and_stay_in_range():
    from nbops import nn

    layer = nn.LIF(beta=0.9, threshold=0.5, learn_beta=True, learn_threshold=True,
                   shape=(4,), surrogate=("fast_sigmoid", 5.0), dtype=np.float64)
    x = nbops.Tensor(_inputs((6, 3, 4), np.float64, scale=1.0), requires_grad=True)
    layer(x).sum().backward()
    assert layer.beta.grad.shape == (4,) and np.abs(layer.beta.grad).sum() > 0
    assert layer.threshold.grad.shape == (4,) and np.abs(layer.threshold.grad).sum() > 0
    layer.beta.data[:] = 1.5
    layer.threshold.data[:] = -1.0
    with nbops.no_grad():
        layer(x.data)
    assert np.all(layer.beta.data == 1.0) and np.all(layer.threshold.data > 0)


def test_spiking_network_learns():
    """Linear -> LIF -> Linear -> LIF on rate-coded inputs, trained with BPTT
    through the fused kernels, reaches >= 90% on a fixed synthetic task."""
    from nbops import nn, optim

    classes, features, hidden, steps = 4, 20, 64, 20
    rng = np.random.default_rng(0)
    protos = rng.random((classes, features))

    def data(n, seed):
        r = np.random.default_rng(seed)
        y = r.integers(0, classes, n)
        x = np.clip(protos[y] + 0.25 * r.standard_normal((n, features)), 0, 1)
        return x.astype(np.float32), y

    xtr, ytr = data(512, 1)
    xte, yte = data(256, 2)
    sur = ("fast_sigmoid", 5.0)
    net = nn.Sequential(nn.Linear(features, hidden, rng=0), nn.LIF(beta=0.9, surrogate=sur),
                        nn.Linear(hidden, classes, rng=1), nn.LIF(beta=0.9, surrogate=sur))
    opt = optim.Adam(net.parameters(), lr=2e-3)
    for epoch in range(4):
        for i in range(0, len(xtr), 64):
            spikes_in = nm.rate(xtr[i:i + 64], steps, seed=1000 * epoch + i, dtype=np.float32)
            counts = net(spikes_in).sum(axis=0)
            loss = nn.cross_entropy(counts, ytr[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with nbops.no_grad():
        counts = nm.spike_count(net(nm.rate(xte, steps, seed=99, dtype=np.float32)))
    accuracy = np.mean(np.asarray(counts).argmax(axis=1) == yte)
    assert accuracy >= 0.9, accuracy


@pytest.mark.parametrize("name", ["lif", "lif_backward"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bench_cases_check_out(name, dtype, device):
    check_bench_case(name, dtype, device, "neuromorphic")
