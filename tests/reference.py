"""Plain NumPy references, written from the math in float64: obviously
correct, slow is fine. Special values follow PyTorch's formulas."""

import warnings

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


# --- arithmetic: NumPy's own, in float64 ------------------------------------

def _errstate(fn):
    def ref(*args, **kwargs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty axis
            return fn(*(_f64(a) if isinstance(a, np.ndarray) else a for a in args), **kwargs)
    ref.__name__ = fn.__name__
    return ref


add = _errstate(np.add)
sub = _errstate(np.subtract)
mul = _errstate(np.multiply)
div = _errstate(np.divide)
pow = _errstate(np.power)  # noqa: A001
neg = _errstate(np.negative)
exp = _errstate(np.exp)
log = _errstate(np.log)
sum = _errstate(np.sum)  # noqa: A001
mean = _errstate(np.mean)


def expand(x, shape):
    return np.broadcast_to(_f64(x), shape)


def sum_to(x, shape):
    x = _f64(x)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


# --- softmax: from the definition ------------------------------------------

def softmax(x, axis=-1, log=False):
    """exp(x - max) / sum, or its log (``log``), in float64."""
    x = _f64(x)
    if x.ndim == 0:  # one element: the formula along its only "axis"
        return softmax(x.reshape(1), 0, log).reshape(())
    m = np.max(x, axis=axis, keepdims=True) if x.size else x
    with np.errstate(invalid="ignore"):
        z = x - m
        s = np.sum(np.exp(z), axis=axis, keepdims=True)
        return z - np.log(s) if log else np.exp(z) / s


def log_softmax(x, axis=-1):
    return softmax(x, axis, log=True)


# --- normalization ----------------------------------------------------------

def _per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm_with_stats(x, rm, rv, w, b, training, momentum, eps):
    """``(y, new_running_mean, new_running_var)`` in float64."""
    x = _f64(x)
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        count = x.size // x.shape[1]
        if rm is not None:
            rm = (1 - momentum) * rm + momentum * mean
            rv = (1 - momentum) * rv + momentum * var * count / (count - 1)
    else:
        mean, var = _f64(rm), _f64(rv)
    y = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(var, x.ndim) + eps)
    if w is not None:
        y = y * _per_channel(_f64(w), x.ndim)
    if b is not None:
        y = y + _per_channel(_f64(b), x.ndim)
    return y, rm, rv


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    return batch_norm_with_stats(x, running_mean, running_var, weight, bias, training,
                                 momentum, eps)[0]


def _rows_norm(x, ns, w, b, eps, centered):
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    x = _f64(x)
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    with np.errstate(invalid="ignore"):
        mean = x.mean(axis=axes, keepdims=True) if centered else 0.0
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if w is not None:
        y = y * _f64(w)
    if b is not None:
        y = y + _f64(b)
    return y


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _rows_norm(x, normalized_shape, weight, bias, eps, True)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = float(np.finfo(np.asarray(x).dtype).eps)
    return _rows_norm(x, normalized_shape, weight, None, eps, False)


# --- linear algebra ---------------------------------------------------------

def matmul(a, b, impl="auto"):
    return np.matmul(_f64(a), _f64(b))


def bmm(a, b, impl="auto"):
    return np.matmul(_f64(a), _f64(b))


def linear(x, weight, bias=None, activation=None, impl="auto"):
    """``activation(x @ weight.T + bias)``; ``activation`` a name or a
    ``(name, *params)`` tuple, as nbops.linear takes it."""
    z = _f64(x) @ _f64(weight).T
    if bias is not None:
        z = z + _f64(bias)
    if activation is None:
        return z
    name, params = (activation, ()) if isinstance(activation, str) else (
        activation[0], tuple(activation[1:]))
    if name == "gelu_tanh":
        return gelu(z, "tanh")
    return globals()[name](z, *params)
