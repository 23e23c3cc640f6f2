"""Plain NumPy references, written from the math in float64: obviously
correct, slow is fine. Special values follow PyTorch's formulas."""

import numpy as np
from scipy import special

SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)
GELU_A = 0.044715


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _sigmoid(z):
    return special.expit(z)


def relu(x):
    x = _f64(x)
    return np.where(x < 0, 0.0, x)


def leaky_relu(x, negative_slope=0.01):
    x = _f64(x)
    return np.where(x > 0, x, x * negative_slope)


def sigmoid(x):
    return _sigmoid(_f64(x))


def tanh(x):
    return np.tanh(_f64(x))


def gelu(x, approximate="none"):
    x = _f64(x)
    with np.errstate(all="ignore"):
        if approximate == "none":
            return 0.5 * x * special.erfc(-x / np.sqrt(2.0))
        u = SQRT_2_OVER_PI * (x + GELU_A * x ** 3)
        return x * _sigmoid(2.0 * u)


def silu(x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return x * _sigmoid(x)


def swish(x, beta=1.0):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return x * _sigmoid(beta * x)


def softplus(x, beta=1.0, threshold=20.0):
    x = _f64(x)
    with np.errstate(all="ignore"):
        z = beta * x
        return np.where(z > threshold, x, np.logaddexp(0.0, z) / beta)


def elu(x, alpha=1.0):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return np.where(x > 0, x, alpha * np.expm1(x))


def hardswish(x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return np.where(x <= -3, 0.0, np.where(x >= 3, x, x * (x + 3) / 6))


def hardtanh(x, min_val=-1.0, max_val=1.0):
    # NaN stays NaN (np.clip keeps it)
    return np.clip(_f64(x), min_val, max_val)


# --- derivatives (times the upstream gradient g) -----------------------------

def relu_backward(g, x):
    return _f64(g) * (_f64(x) > 0)


def leaky_relu_backward(g, x, negative_slope=0.01):
    return _f64(g) * np.where(_f64(x) > 0, 1.0, negative_slope)


def sigmoid_backward(g, y):
    y = _f64(y)
    return _f64(g) * y * (1 - y)


def tanh_backward(g, y):
    dtype = np.asarray(y).dtype
    y = _f64(y)
    yy = y * y
    if dtype == np.float32:
        # float32's y * y overflows past |y| ~ 1.8e19 (outside tanh's range),
        # so g = 0 gives 0 * -inf = NaN there, as in PyTorch: keep that
        yy = np.where(yy > np.finfo(np.float32).max, np.inf, yy)
    return _f64(g) * (1 - yy)


def gelu_backward(g, x, approximate="none"):
    x = _f64(x)
    with np.errstate(all="ignore"):
        if approximate == "none":
            d = 0.5 * special.erfc(-x / np.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
        else:
            s = _sigmoid(2.0 * SQRT_2_OVER_PI * (x + GELU_A * x ** 3))
            d = s + 2 * x * s * (1 - s) * SQRT_2_OVER_PI * (1 + 3 * GELU_A * x * x)
            d = np.where(np.abs(x) >= 1e4, np.where(x > 0, 1.0, 0.0), d)
        return _f64(g) * d


def silu_backward(g, x):
    x = _f64(x)
    with np.errstate(all="ignore"):
        s = _sigmoid(x)
        return _f64(g) * s * (1 + x * (1 - s))


def swish_backward(g, x, beta=1.0):
    x, g = _f64(x), _f64(g)
    with np.errstate(all="ignore"):
        s = _sigmoid(beta * x)
        return g * s * (1 + beta * x * (1 - s)), float(np.sum(g * x * x * s * (1 - s)))


def softplus_backward(g, x, beta=1.0, threshold=20.0):
    x = _f64(x)
    with np.errstate(all="ignore"):
        z = beta * x
        return _f64(g) * np.where(z > threshold, 1.0, _sigmoid(z))


def elu_backward(g, x, alpha=1.0):
    x = _f64(x)
    with np.errstate(all="ignore"):
        return _f64(g) * np.where(x > 0, 1.0, alpha * np.exp(x))


def hardswish_backward(g, x):
    x = _f64(x)
    return _f64(g) * np.where(x < -3, 0.0, np.where(x <= 3, x / 3 + 0.5, 1.0))


def hardtanh_backward(g, x, min_val=-1.0, max_val=1.0):
    # selects: g strictly inside the bounds, 0 elsewhere (a NaN or inf g too)
    x = _f64(x)
    return np.where((x > min_val) & (x < max_val), _f64(g), 0.0)
