"""Neuron models as scalar step equations, written once for both devices.

A model is a pure step ``step(x, a, b, p, c) -> (s, u, theta, a', b')``:
input current ``x``, state ``a`` (always the membrane ``v``) and ``b`` (the
model's second variable), parameters ``p = (beta, threshold, p2, p3)``
already picked for this neuron, and typed constants ``c`` (:class:`Consts`).
It returns the spike ``s`` (bool), the membrane before reset ``u``, the
threshold the spike was decided against ``theta`` (``+inf`` while a LIF
neuron is refractory: it cannot fire and its input is ignored) and the new
state. The seed article's loop is the LIF row with reset by subtraction::

    v = v * beta + x;  s = v > threshold;  v -= s * threshold

Order of decay and reset: nbops (like the seed, and norse) decays, adds the
input, fires and resets *in the same step*, so the subtracted threshold then
decays with the membrane from the next step on. snnTorch's ``Leaky`` decides
the reset from the previous step's membrane and subtracts it *after* the
decay: ``mem_t = beta * mem_{t-1} + x_t - s_{t-1} * threshold``; its recorded
``mem`` is therefore our pre-reset ``u`` and its reset is not decayed. Both
give the same spikes when ``beta = 1`` (IF); for ``beta < 1`` snnTorch's
neuron sits ``(1 - beta) * threshold`` lower after each spike. snnTorch
detaches the reset from the graph by default (``detach_reset=True`` here).

Each model also has an adjoint ``adj(gs, gu_ext, u, theta, vprev, s, sig, ga,
gb, p, c) -> (gx, ga', gb', dbeta, dthreshold)`` that steps the gradients of
the state one step back in time (backpropagation through time), with ``sig``
the surrogate derivative at ``u - theta``.

Surrogates are rows of one table, ``SURROGATES``: name -> (derivative
function, parameter name, default). Every derivative is zero at ``z = +-inf``
(straight-through included) so a refractory step passes no gradient to its
spike.
"""

import math
from collections import namedtuple

import numpy as np

# the exponential of the sigmoid surrogate: nbops' vectorizable one on the
# CPU (a libm call in the loop would keep the backward scalar); the CUDA
# kernel module rebinds ``m`` to :mod:`math`
from .._codegen import twins
from .._formulas import m  # lazy: import nbops loads no kernel module

#: Parameters of the streaming LIF form (:func:`nbops.neuromorphic.lif_step`).
LIFParameters = namedtuple("LIFParameters", ["beta", "threshold", "reset"],
                           defaults=(0.9, 1.0, "subtract"))
LIFParameters.__doc__ = """LIF parameters: decay ``beta`` in [0, 1] (scalar or
per-neuron array), ``threshold`` > 0 (scalar or array), ``reset`` one of
"subtract", "zero", "none"."""

#: State of the streaming LIF form: the membrane ``v`` after reset.
LIFState = namedtuple("LIFState", ["v"])
LIFState.__doc__ = "LIF state: the membrane ``v`` (after reset), shaped like one time step."

RESETS = ("subtract", "zero", "none")

Consts = namedtuple("Consts", [
    "zero", "one", "half", "inf", "pi_half",
    "reset",    # int: index into RESETS
    "detach",   # bool: the reset passes no gradient (snnTorch's default)
    "refr",     # refractory steps after a spike, as a float of the dtype
])


def keeps_second_state(model, refractory):
    """Whether ``model`` carries its second state ``b`` over time: the
    synaptic current, the adaptation, or a LIF's refractory count (only
    with a refractory period; without one a LIF has no second state)."""
    return model != "lif" or refractory > 0


def consts(dtype, reset="subtract", detach=True, refractory=0):
    """The :class:`Consts` for ``dtype`` and a reset mode."""
    t = np.dtype(dtype).type
    return Consts(t(0.0), t(1.0), t(0.5), t(np.inf), t(math.pi / 2),
                  RESETS.index(reset), bool(detach), t(refractory))


# --- forward steps ------------------------------------------------------------

def _reset_mode(c):
    # the reset mode and the detach flag are read through these two: the CPU
    # backward compiles copies of the equations in which they are constants
    # (runtime branches on them kept its loop scalar)
    return c.reset


def _detached(c):
    return c.detach


def _reset(u, s, theta, c):
    mode = _reset_mode(c)
    after = u - theta if mode == 0 else (c.zero if mode == 1 else u)
    return after if s else u


def lif(x, v, r, p, c):
    # b = r: refractory steps left; a refractory neuron only decays
    active = not r > c.zero
    theta = p[1] if active else c.inf
    u = v * p[0] + (x if active else c.zero)
    s = u > theta
    left = r - c.one if r > c.zero else c.zero
    return s, u, theta, _reset(u, s, theta, c), (c.refr if s else left)


def synaptic(x, v, syn, p, c):
    # p[2] = alpha, the synaptic current's decay
    syn2 = syn * p[2] + x
    u = v * p[0] + syn2
    s = u > p[1]
    return s, u, p[1], _reset(u, s, p[1], c), syn2


def alif(x, v, a, p, c):
    # p[2] = adaptation decay rho, p[3] = adaptation scale gamma
    theta = p[1] + p[3] * a
    u = v * p[0] + x
    s = u > theta
    return s, u, theta, _reset(u, s, theta, c), a * p[2] + (c.one if s else c.zero)


# --- adjoints (one step of BPTT) ----------------------------------------------

def _adj_core(gs, gu_ext, u, theta, s, sig, ga, c):
    # d v_after / d s (through the reset) and d v_after / d u
    mode = _reset_mode(c)
    rs = theta if mode == 0 else (u if mode == 1 else c.zero)
    gs_tot = gs if _detached(c) else gs - ga * rs
    dvdu = (c.zero if s else c.one) if mode == 1 else c.one
    gu = gs_tot * sig + ga * dvdu + gu_ext
    gtheta = -(gs_tot * sig) - (ga if (s and mode == 0) else c.zero)
    return gu, gtheta


def lif_adj(gs, gu_ext, u, theta, vprev, s, sig, ga, gb, p, c):
    gu, gth = _adj_core(gs, gu_ext, u, theta, s, sig, ga, c)
    gx = gu if theta < c.inf else c.zero
    return gx, p[0] * gu, c.zero, gu * vprev, gth


def synaptic_adj(gs, gu_ext, u, theta, vprev, s, sig, ga, gb, p, c):
    gu, gth = _adj_core(gs, gu_ext, u, theta, s, sig, ga, c)
    gsyn = gu + gb
    return gsyn, p[0] * gu, p[2] * gsyn, gu * vprev, gth


def alif_adj(gs, gu_ext, u, theta, vprev, s, sig, ga, gb, p, c):
    # the spike also feeds the adaptation: d a' / d s = 1
    gu, gth = _adj_core(gs + gb, gu_ext, u, theta, s, sig, ga, c)
    return gu, p[0] * gu, p[2] * gb + p[3] * gth, gu * vprev, gth


#: model name -> (step, adjoint, names of p[2], p[3] (None = unused), name of state b)
MODELS = {
    "lif": (lif, lif_adj, (None, None), "refractory"),
    "synaptic": (synaptic, synaptic_adj, ("alpha", None), "syn"),
    "alif": (alif, alif_adj, ("adapt_decay", "adapt_scale"), "a"),
}


# --- surrogate derivatives d s / d z at z = u - theta ---------------------------

def fast_sigmoid(z, k, c):
    d = c.one / (k * abs(z) + c.one)
    return d * d


def atan(z, k, c):
    w = c.pi_half * k * z
    return c.half * k / (c.one + w * w)


def sigmoid(z, k, c):
    e = m.exp(-abs(k * z))
    s = c.one / (c.one + e)
    return k * s * (c.one - s)


def triangle(z, k, c):
    d = c.one - abs(z) / k
    return d / k if d > c.zero else c.zero


def straight_through(z, k, c):
    return c.one if abs(z) < c.inf else c.zero


#: name -> (derivative, parameter keyword, default): snnTorch's defaults.
SURROGATES = {
    "fast_sigmoid": (fast_sigmoid, "slope", 25.0),
    "sigmoid": (sigmoid, "slope", 25.0),
    "atan": (atan, "alpha", 2.0),
    "triangle": (triangle, "width", 1.0),
    "straight_through": (straight_through, None, 1.0),
}


def compiled_copies(compile_, suffix="", **names):
    """Copies of every scalar function here, each passed through
    ``compile_`` (``register_jitable``, ``cuda.jit(device=True)``), sharing
    one globals dict in which each name is its compiled twin, so helpers
    resolve to compiled code; ``names`` replace globals first (``m``,
    ``_reset_mode``...). ``suffix`` is added to each copy's name (cached CPU
    kernels must not share helper symbols). Returns that dict."""
    return twins({n: f for n, f in functions().items() if n not in names}, compile_,
                 dict(globals(), **names), suffix)


def functions():
    """Every scalar function here by name, for the kernel modules to compile."""
    return {name: obj for name, obj in globals().items()
            if callable(obj) and getattr(obj, "__module__", None) == __name__
            and name not in ("consts", "functions", "compiled_copies", "keeps_second_state", "Consts",
                             "LIFParameters", "LIFState")
            and not isinstance(obj, type)}


# --- encoder formulas -----------------------------------------------------------
# A counter-based generator: the uniform number of element ``i`` depends on
# the seed and ``i`` only, so a seeded encoding is the same on every device
# and thread count. Integer work stays below 2**64 (32-bit halves masked
# before each multiply): no overflow anywhere, the simulator included.

_M32 = np.uint64(0xFFFFFFFF)
_S15 = np.uint64(15)
_S16 = np.uint64(16)
_S32 = np.uint64(32)
_H1 = np.uint64(0x7FEB352D)
_H2 = np.uint64(0x846CA68B)
_INV32 = 1.0 / 4294967296.0


def hash32(x):
    # Wellons' lowbias32 on the low 32 bits of a uint64
    x = x ^ (x >> _S16)
    x = (x * _H1) & _M32
    x = x ^ (x >> _S15)
    x = (x * _H2) & _M32
    return x ^ (x >> _S16)


def uniform(key, i):
    """A float64 in [0, 1) for counter ``i`` (int) under ``key`` (uint64 < 2**32)."""
    n = np.uint64(i)
    h = hash32((n & _M32) ^ hash32((n >> _S32) ^ key))
    return np.float64(hash32(h ^ key)) * _INV32


def seed_key(seed):
    """The 32-bit key of an integer seed (host side)."""
    return np.uint64(int(hash32(np.uint64(seed & 0xFFFFFFFF)) ^ ((seed >> 32) & 0xFFFFFFFF)))


def rate_probability(x, gain, poisson):
    # Bernoulli: p = clip(gain x, 0, 1); Poisson: P(N >= 1), N ~ Poisson(gain x)
    lam = np.float64(x) * gain
    lam = lam if lam > 0.0 else 0.0
    if poisson:
        return -math.expm1(-lam)
    return lam if lam < 1.0 else 1.0


def latency_time(x, num_steps, tau, threshold, linear):
    """The step at which intensity ``x`` fires, or ``num_steps`` for never."""
    v = np.float64(x)
    if not v > threshold:
        return num_steps
    if linear:
        t = (1.0 - (v if v < 1.0 else 1.0)) * (num_steps - 1)
    else:
        t = tau * math.log(v / (v - threshold))
    return int(math.floor(t + 0.5)) if t < num_steps else num_steps
