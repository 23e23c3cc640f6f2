"""Scalar formulas of the elementwise operators, written once for both devices.

Each forward ``f(x, p, c)`` maps one element; each backward
``df(g, v, p, c)`` maps an upstream gradient ``g`` and the saved value ``v``
(the input x, or the output y where the docstring of the op says so). ``p``
is a 2-tuple of the op's parameters and ``c`` a :class:`Consts` of typed
constants, both in the array's dtype: in Numba ``float32 * 0.5`` is float64,
which would halve the vector width and change the rounding.

Transcendental functions are reached through the module global ``m``. On
the CPU it is :mod:`nbops.cpu._approx` (branch-free polynomial
approximations that vectorize; Numba's libm calls do not); the CUDA kernel
module compiles these same functions with ``m`` rebound to :mod:`math`
(CUDA's own libdevice functions). Written as selects so NaN propagates:
``a if not x < 0 else b`` keeps a NaN ``x`` on the ``a`` side.
"""

import functools
import math
import types
from collections import namedtuple

import numpy as np



class _LazyApprox(types.ModuleType):
    # ``m`` stands for nbops.cpu._approx (a kernel module), imported on the
    # first attribute Numba resolves while typing a formula, so that
    # ``import nbops`` loads no kernel module. Numba types a module global by
    # getattr on the object, which reaches this __getattr__.
    def __getattr__(self, name):
        from .cpu import _approx

        value = getattr(_approx, name)
        setattr(self, name, value)
        return value


m = _LazyApprox("nbops.cpu._approx")  # rebound to math for CUDA

Consts = namedtuple("Consts", [
    "zero", "half", "one", "two", "three", "sixth", "third",
    "inv_sqrt2",       # 1/sqrt(2), Phi(x) = erfc(-x/sqrt(2))/2
    "inv_sqrt_2pi",    # 1/sqrt(2 pi), the normal density's factor
    "gelu_k",          # sqrt(2/pi), tanh-GELU
    "gelu_a",          # 0.044715, tanh-GELU
    "gelu_big",        # |x| past which tanh-GELU's derivative is its limit
])


def consts(dtype):
    """The :class:`Consts` for ``dtype`` (float32 or float64)."""
    return _consts(np.dtype(dtype))


@functools.lru_cache(maxsize=None)
def _consts(dtype):
    # built once per dtype: twelve NumPy scalars cost ~6 us, every kernel call needs them
    t = dtype.type
    return Consts(*(t(v) for v in (
        0.0, 0.5, 1.0, 2.0, 3.0, 1.0 / 6.0, 1.0 / 3.0, 0.7071067811865476,
        0.3989422804014327, 0.7978845608028654, 0.044715, 1e4)))


def params(dtype, p0=0.0, p1=0.0):
    """The op parameters as a 2-tuple of ``dtype`` scalars."""
    if p0 == 0.0 and p1 == 0.0 and math.copysign(1.0, p0) + math.copysign(1.0, p1) == 2.0:
        # the parameterless ops (not -0.0): no scalar construction per call
        return _no_params(np.dtype(dtype))
    t = np.dtype(dtype).type
    return (t(p0), t(p1))


@functools.lru_cache(maxsize=None)
def _no_params(dtype):
    return (dtype.type(0.0), dtype.type(0.0))


# Through these helpers, not ``m`` directly: the approximations they call
# exist on the CPU only, and the CUDA kernel module replaces the helpers
# with twins built from :mod:`math` (nbops.cuda.activations).

def _ndtr(x, c):
    """The normal CDF Phi(x), relative accuracy in both tails."""
    return m.ndtr(x)


def _ndtr_pdf(x, c):
    """Phi(x) and the normal density from one exponential."""
    return m.ndtr_pdf(x)


def _log1pexp(z, c):
    """log(1 + e^z) without overflow or cancellation."""
    return m.log1pexp(z)


def _sigmoid(x, c):
    # exp(-|x|) never overflows; the two branches are sigma(x) and 1 - sigma(x)
    e = m.exp(-abs(x))
    s = c.one / (c.one + e)
    return s if not x < c.zero else e * s


# --- forward ---------------------------------------------------------------

def relu(x, p, c):
    return x if not x < c.zero else c.zero


def leaky_relu(x, p, c):
    return x if not x < c.zero else x * p[0]


def sigmoid(x, p, c):
    return _sigmoid(x, c)


def tanh(x, p, c):
    return m.tanh(x)


def gelu(x, p, c):
    # x * Phi(x), Phi accurate in the far negative tail
    return x * _ndtr(x, c)


def gelu_tanh(x, p, c):
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u): no cancellation for u << 0
    u = c.gelu_k * (x + c.gelu_a * x * x * x)
    return x * _sigmoid(c.two * u, c)


def silu(x, p, c):
    return x * _sigmoid(x, c)


def swish(x, p, c):
    return x * _sigmoid(p[0] * x, c)


def softplus(x, p, c):
    # p = (beta, threshold)
    z = p[0] * x
    soft = _log1pexp(z, c) / p[0]
    return x if z > p[1] else soft


def elu(x, p, c):
    return x if x > c.zero else p[0] * m.expm1(x)


def hardswish(x, p, c):
    inner = x if x >= c.three else x * (x + c.three) * c.sixth
    return c.zero if x <= -c.three else inner


def hardtanh(x, p, c):
    # p = (min_val, max_val); two selects, so a NaN x falls through both
    lo = x if not x < p[0] else p[0]
    return lo if not lo > p[1] else p[1]


# --- backward: df(grad, saved, p, c) -----------------------------------------

def relu_backward(g, x, p, c):
    # The zero side reads g too (|g| * 0, 0 again where g is inf or NaN):
    # read on one side only, g's load became a slower masked load
    # (vmovups {k}{z}; docs/benchmarks.md, activations).
    z = abs(g) * c.zero
    return g if x > c.zero else (z if z == z else c.zero)


def leaky_relu_backward(g, x, p, c):
    return g if x > c.zero else g * p[0]


def sigmoid_backward(g, y, p, c):
    return g * y * (c.one - y)


def tanh_backward(g, y, p, c):
    return g * (c.one - y * y)


def gelu_backward(g, x, p, c):
    cdf, pdf = _ndtr_pdf(x, c)
    return g * (cdf + x * pdf)


def gelu_tanh_backward(g, x, p, c):
    # with s = sigmoid(2u): 1 + tanh u = 2s and 1 - tanh^2 u = 4 s (1 - s)
    s = _sigmoid(c.two * c.gelu_k * (x + c.gelu_a * x * x * x), c)
    d = s + c.two * x * s * (c.one - s) * c.gelu_k * (c.one + c.three * c.gelu_a * x * x)
    # past |x| = 1e4 the slope is exactly 0 or 1, and x^3 would overflow into inf * 0
    return g * (d if not abs(x) >= c.gelu_big else (c.one if x > c.zero else c.zero))


def silu_backward(g, x, p, c):
    s = _sigmoid(x, c)
    return g * s * (c.one + x * (c.one - s))


def swish_backward(g, x, p, c):
    s = _sigmoid(p[0] * x, c)
    return g * s * (c.one + p[0] * x * (c.one - s))


def swish_beta_term(g, x, p, c):
    """d swish / d beta times g, summed over elements by the kernel."""
    s = _sigmoid(p[0] * x, c)
    return g * x * x * s * (c.one - s)


def softplus_backward(g, x, p, c):
    z = p[0] * x
    return g if z > p[1] else g * _sigmoid(z, c)


def elu_backward(g, x, p, c):
    return g if x > c.zero else g * p[0] * m.exp(x)


def hardswish_backward(g, x, p, c):
    inner = g * (x * c.third + c.half) if x <= c.three else g
    return c.zero if x < -c.three else inner


def hardtanh_backward(g, x, p, c):
    # g strictly inside (min_val, max_val), else +0.0 whatever g is (inf, NaN
    # too); the zero side reads g as relu_backward's does, for the same reason
    z = abs(g) * c.zero
    zero = z if z == z else c.zero
    inner = g if x < p[1] else zero
    return inner if x > p[0] else zero


#: forward name -> backward name; the kernel modules build one kernel of each.
FORWARD = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu",
           "swish", "softplus", "elu", "hardswish", "hardtanh")
BACKWARD = tuple(f + "_backward" for f in FORWARD)


#: Activation names a GEMM or convolution epilogue knows, in code order
#: (code 0 is "none").
EPILOGUES = ("none",) + FORWARD


def epilogue_source(fn_name="apply_epilogue"):
    """Source of ``apply_epilogue(v, act, p, c)``: an if-chain over the
    activation codes calling the formulas by name. Each device's GEMM module
    compiles it against its own formulas (``nbops._codegen.generated``)."""
    lines = [f"def {fn_name}(v, act, p, c):"]
    for code, name in enumerate(EPILOGUES[1:], start=1):
        lines.append(f"    {'if' if code == 1 else 'elif'} act == {code}:")
        lines.append(f"        return {name}(v, p, c)")
    lines.append("    return v")
    return "\n".join(lines) + "\n"


def functions():
    """Every scalar function defined here, by name (helpers included), for
    the kernel modules to compile."""
    return {name: obj for name, obj in globals().items()
            if callable(obj) and getattr(obj, "__module__", None) == __name__
            and name not in ("consts", "_consts", "params", "_no_params", "functions",
                             "Consts", "epilogue_source")
            and not isinstance(obj, type)}  # not the lazy stand-in's class
