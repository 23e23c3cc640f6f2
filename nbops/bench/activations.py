"""Benchmark cases of the activations: each forward and backward op beside
the same math written with NumPy/SciPy ufuncs into a pre-allocated output.

Inputs are ``3 * N(0, 1)`` (so the tails of sigmoid, gelu and softplus are
exercised) and, for backward ops, an upstream gradient ``N(0, 1)``; the
ops that save their output (sigmoid, tanh) get that output. Baselines are
chains of in-place ufuncs (``np.maximum(x, 0, out=o)``), which is how a
careful NumPy user writes them; their temporaries are part of their cost.
References are the baselines in float64, except where the formula loses
accuracy in float64 itself (gelu's negative tail: erfc is used there).
"""

import math

import numpy as np
from scipy import special

import nbops

from .harness import spec_cases

SLOPE = 0.01       # leaky_relu's default negative_slope
BETA = 1.5         # swish's beta in its spec's bench entry: not 1, unlike silu
INV_SQRT2 = 1 / math.sqrt(2)
INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
GELU_K = math.sqrt(2 / math.pi)
GELU_A = 0.044715


def setup_x(n, dtype, rng):
    """Inputs of a forward op."""
    return (rng.standard_normal(n, dtype=dtype) * 3,)


def setup_g_x(n, dtype, rng):
    """Inputs of a backward op that takes the forward's input."""
    return rng.standard_normal(n, dtype=dtype), setup_x(n, dtype, rng)[0]


def _g_y(forward):
    def setup(n, dtype, rng):
        g, v = setup_g_x(n, dtype, rng)
        return g, forward(v.astype(np.float64)).astype(dtype)
    return setup


#: inputs of the backward ops that take the forward's output
setup_g_sigmoid = _g_y(special.expit)
setup_g_tanh = _g_y(np.tanh)


def _sigmoid_into(z, out):
    """out = 1 / (1 + exp(-z)) in place (z may be out itself)."""
    np.negative(z, out=out)
    np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


# --- forward baselines ----------------------------------------------------

def relu(x, out):
    return np.maximum(x, 0, out=out)


def leaky_relu(x, out):
    np.multiply(x, SLOPE, out=out)
    return np.maximum(x, out, out=out)  # valid for slopes below 1


def sigmoid(x, out):
    return _sigmoid_into(x, out)


def tanh(x, out):
    return np.tanh(x, out=out)


def _half_x_one_plus(x, out):
    """out = 0.5 x (1 + out) in place: the outer form of both GELUs."""
    out += 1
    out *= x
    out *= 0.5
    return out


def gelu(x, out):
    np.multiply(x, INV_SQRT2, out=out)
    special.erf(out, out=out)
    return _half_x_one_plus(x, out)


def gelu_tanh(x, out):
    np.multiply(x, x, out=out)
    out *= GELU_A
    out += 1
    out *= x
    out *= GELU_K
    np.tanh(out, out=out)
    return _half_x_one_plus(x, out)


def silu(x, out):
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1
    return np.divide(x, out, out=out)


def swish(x, out):
    np.multiply(x, -BETA, out=out)
    np.exp(out, out=out)
    out += 1
    return np.divide(x, out, out=out)


def softplus(x, out):
    # beta=1; ignores the threshold (x > 20 gives x), which moves the result
    # by less than 2e-9 relative; the reference applies it
    return np.logaddexp(x, 0, out=out)


def elu(x, out):
    np.expm1(x, out=out)  # alpha=1
    np.copyto(out, x, where=x > 0)
    return out


def hardswish(x, out):
    np.add(x, 3, out=out)
    np.clip(out, 0, 6, out=out)
    out *= x
    out *= 1 / 6
    return out


def hardtanh(x, out):
    return np.clip(x, -1, 1, out=out)  # the default bounds


# --- backward baselines ---------------------------------------------------

def relu_backward(g, x, out):
    return np.multiply(g, x > 0, out=out)


def leaky_relu_backward(g, x, out):
    np.multiply(g, SLOPE, out=out)
    np.copyto(out, g, where=x > 0)
    return out


def sigmoid_backward(g, y, out):
    np.subtract(1, y, out=out)
    out *= y
    out *= g
    return out


def tanh_backward(g, y, out):
    np.multiply(y, y, out=out)
    np.subtract(1, out, out=out)
    out *= g
    return out


def gelu_backward(g, x, out):
    np.multiply(x, x, out=out)
    out *= -0.5
    np.exp(out, out=out)
    out *= INV_SQRT_2PI
    out *= x
    return _gelu_grad_tail(g, special.erf(x * INV_SQRT2), out)


def gelu_tanh_backward(g, x, out):
    x2 = x * x
    t = np.tanh(GELU_K * x * (1 + GELU_A * x2))
    # 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2)
    np.multiply(t, t, out=out)
    np.subtract(1, out, out=out)
    out *= x
    out *= 0.5 * GELU_K
    out *= 1 + 3 * GELU_A * x2
    return _gelu_grad_tail(g, t, out)


def _gelu_grad_tail(g, f, out):
    """out = g (0.5 (1 + f) + out), with f (erf or tanh, a temporary) reused;
    the common end of both GELU gradients."""
    f += 1
    f *= 0.5
    out += f
    out *= g
    return out


def silu_backward(g, x, out):
    s = _sigmoid_into(x, out)
    t = 1 - s
    t *= x
    t += 1
    t *= s
    return np.multiply(t, g, out=out)


def swish_backward(g, x, out):
    s = _sigmoid_into(BETA * x, out)
    t = 1 - s
    t *= s                               # s (1 - s)
    gbeta = float(np.sum(g * x * x * t, dtype=np.float64))
    t *= BETA * x
    t += s                               # s + beta x s (1 - s)
    return np.multiply(t, g, out=out), gbeta


def softplus_backward(g, x, out):
    _sigmoid_into(x, out)
    out *= g
    return out


def elu_backward(g, x, out):
    np.exp(x, out=out)
    out *= g
    np.copyto(out, g, where=x > 0)
    return out


def hardswish_backward(g, x, out):
    np.multiply(x, 1 / 3, out=out)
    out += 0.5
    out *= g
    np.copyto(out, g, where=x > 3)
    np.copyto(out, 0, where=x < -3)
    return out


def hardtanh_backward(g, x, out):
    np.multiply(g, (x > -1) & (x < 1), out=out)
    return out


# --- float64 references where the baseline's own formula is not enough ----

def gelu_ref(x):
    return 0.5 * x * special.erfc(-x * INV_SQRT2)


def gelu_backward_ref(g, x):
    return g * (0.5 * special.erfc(-x * INV_SQRT2) + x * INV_SQRT_2PI * np.exp(-0.5 * x * x))


def softplus_ref(x):
    return np.where(x > 20, x, np.logaddexp(x, 0))


def softplus_backward_ref(g, x):
    return np.where(x > 20, g, g * special.expit(x))


# --- the cases: one per Bench entry of the specs (nbops/activations.py) ----

CASES = spec_cases(nbops.activations.SPECS.values(),
                   lambda spec: "nbops.bench.activations:" + (
                       "setup_g_x" if spec.name.endswith("_backward") else "setup_x"))
