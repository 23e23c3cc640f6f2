"""Requantization: int32 accumulators to int8/uint8 outputs, written once for
both devices.

Integer-only engines (gemmlowp, TFLite, XNNPACK, onnxruntime's fixed-point
path) replace the float rescale ``acc * (s_in * s_w / s_out)`` by a 32-bit
fixed-point multiplier and a power-of-two shift computed once on the host:

    real = M * 2**-31 * 2**shift,   M in [2**30, 2**31),

(:func:`quantize_multiplier`), and apply it per element with gemmlowp's two
rounding steps (:func:`requantize`):

1. ``SaturatingRoundingDoublingHighMul(x, M)``: the high 32 bits of
   ``2 * x * M``, rounded half away from zero (``x == M == INT32_MIN``
   saturates to INT32_MAX);
2. ``RoundingDivideByPOT(v, -shift)``: an arithmetic right shift rounding
   half away from zero;

then ``+ zero_point`` and saturation to ``[qmin, qmax]``. For ``shift > 0``
(a multiplier of 1 or more, rare) ``x`` is first shifted left by ``shift``,
saturating to the int32 range. The two roundings are kept as two steps: a
single 64-bit ``(x * M + 2**(30-shift)) >> (31-shift)`` rounds once and
differs from gemmlowp by one unit on some ties, so it is not used.

:func:`requantize_float` is the documented alternative (``requant="float"``):
``round_half_even(acc * scale) + zero_point`` in float64, which is the ONNX
reference's QLinearMatMul/QLinearConv formula when ``scale`` is the float32
product ``s_in * s_w / s_out``.

The scalar functions below are plain Python integer arithmetic on int64
values. They are registered with ``register_jitable`` (inlined into CPU
kernels) and compiled again as CUDA device functions by
:func:`device_functions`; called from Python they are the host reference
(Python integers do not overflow, and each step below stays within int64,
so host and kernels agree bit for bit).
"""

import math

import numpy as np
from numba.extending import register_jitable

from .._codegen import twins

__all__ = ["quantize_multiplier", "quantize_multipliers", "requantize", "requantize_float",
           "device_functions", "INT32_MIN", "INT32_MAX"]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def quantize_multiplier(real_multiplier):
    """``(M, shift)`` with ``real_multiplier ~= M * 2**-31 * 2**shift``.

    ``M`` is an ``np.int32`` in ``[2**30, 2**31)`` (TFLite's
    ``QuantizeMultiplier``: ``frexp``, then ``round(q * 2**31)`` half away
    from zero, renormalised when it rounds up to ``2**31``), ``shift`` a
    Python int in ``[-31, 30]``. Zero, and multipliers below ``2**-32``
    (which scale every int32 accumulator to 0 anyway), give ``(0, 0)``.

    Raises
    ------
    ValueError
        A negative, NaN or infinite multiplier, or one of ``2**30`` or more
        (``shift`` would exceed 30).

    Example
    -------
    >>> quantize_multiplier(0.5)
    (np.int32(1073741824), 0)
    """
    real = float(real_multiplier)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"quantize_multiplier: the real multiplier must be finite and >= 0, "
                         f"got {real}")
    if real == 0.0:
        return np.int32(0), 0
    q, shift = math.frexp(real)  # real = q * 2**shift, q in [0.5, 1)
    fixed = int(math.floor(q * 2.0**31 + 0.5))
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return np.int32(0), 0
    if shift > 30:
        raise ValueError(f"quantize_multiplier: multiplier {real} is too large for a "
                         "fixed-point requantization (must be < 2**30)")
    return np.int32(fixed), int(shift)


def quantize_multipliers(reals):
    """Per-channel :func:`quantize_multiplier`: ``(M, shift)`` as int32
    arrays of ``reals``' length."""
    reals = np.asarray(reals, np.float64).reshape(-1)
    bad = ~np.isfinite(reals) | (reals < 0) | (reals >= 2.0**30)
    if bad.any():
        quantize_multiplier(reals[np.argmax(bad)])  # raises, naming the value
    # the scalar function's steps, vectorized (frexp, round half up, renormalise)
    q, shift = np.frexp(reals)
    fixed = np.floor(q * 2.0**31 + 0.5).astype(np.int64)
    up = fixed == 1 << 31
    fixed = np.where(up, fixed // 2, fixed)
    shift = np.where(up, shift + 1, shift)
    tiny = shift < -31
    return (np.where(tiny, 0, fixed).astype(np.int32),
            np.where(tiny, 0, shift).astype(np.int32))


# --- scalar formulas (host, njit and CUDA) ------------------------------------

def saturating_rounding_doubling_high_mul(a, b):
    """gemmlowp's ``SaturatingRoundingDoublingHighMul`` on int32 values held
    in int64: ``(a * b + nudge) / 2**31`` truncated toward zero, where the
    nudge (2**30, or 1 - 2**30 for a negative product) makes it round half
    away from zero; ``a == b == INT32_MIN`` saturates to INT32_MAX."""
    ab = a * b
    t = ab + ((1 << 30) if ab >= 0 else (1 - (1 << 30)))
    # C's division truncates, an arithmetic shift floors: bias negative t
    q = (t + (((1 << 31) - 1) if t < 0 else 0)) >> 31
    return INT32_MAX if (a == INT32_MIN) & (b == INT32_MIN) else q


def rounding_divide_by_pot(x, exponent):
    """gemmlowp's ``RoundingDivideByPOT``: ``x / 2**exponent`` rounded half
    away from zero, for ``0 <= exponent <= 31``."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def requantize(acc, multiplier, shift, zero_point, qmin, qmax):
    """``clamp(MultiplyByQuantizedMultiplier(acc, M, shift) + zero_point,
    qmin, qmax)`` for one int32 accumulator (TFLite's fixed-point
    requantization; see the module docstring). Written with selects only
    (no branches), so that loops over it vectorize."""
    # int() is int64 in kernels and an unbounded int on the host: no int32
    # wraparound in the products below, whatever the arguments' widths
    x = int(acc)
    shift = int(shift)
    left = max(shift, 0)
    x = min(max(x << left, INT32_MIN), INT32_MAX)
    v = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x, int(multiplier)),
                               max(-shift, 0))
    return min(max(v + zero_point, qmin), qmax)


def requantize_float(acc, scale, zero_point, qmin, qmax):
    """``clamp(round_half_even(acc * scale) + zero_point, qmin, qmax)`` in
    float64 (the float path, ``requant="float"``)."""
    v = round(float(acc) * scale) + int(zero_point)  # round(): half to even
    return qmax if v > qmax else (qmin if v < qmin else v)


_SCALARS = (saturating_rounding_doubling_high_mul, rounding_divide_by_pot, requantize,
            requantize_float)

for _f in _SCALARS:
    register_jitable(inline="always")(_f)


def device_functions():
    """A namespace in which every scalar formula above is a CUDA device
    function (compiled from the same code, helpers resolving to their device
    twins). Imports numba.cuda: call it from CUDA kernel modules only."""
    from numba import cuda

    return twins({fn.__name__: fn for fn in _SCALARS}, cuda.jit(device=True), dict(globals()))
