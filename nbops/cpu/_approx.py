"""Branch-free, vectorizable transcendental functions for Numba CPU kernels.

Numba's ``math.exp``/``math.erf``/``math.log1p``/``math.tanh`` are scalar
libm calls in these llvmlite builds (no SVML): inside a ``prange`` loop they
stop LLVM's loop vectorizer and run about 40x slower than a polynomial. The
functions here are written so that the loop calling them vectorizes: argument
reduction by rounding (the 1.5*2^23 / 1.5*2^52 "magic number" trick), powers
of two built from their bits, polynomials in Horner form, selects
(``a if c else b``, lowered to blends) instead of data-dependent branches, no
libm call, and every helper forced inline (see :func:`_inline`).

Use them in ``@njit`` CPU kernels like the ``math`` functions::

    from nbops.cpu._approx import exp, erf
    @njit(parallel=True, cache=True, fastmath={"contract", "nsz", "arcp", "afn"})
    def sigmoid_kernel(x, out):
        for i in prange(x.size):
            out[i] = ...exp(-abs(x[i]))...

Accuracy
--------
Max error in ulps of the correctly rounded result, whole range of the type.
float32: every one of the 2^32 inputs checked against float64 libm. float64:
4 million samples per function (log-uniform magnitudes and uniform over the
domain) against 64-bit-mantissa references. ``tests/test_approx.py``
enforces the bounds in brackets.

=========  ===================  ===================  ========================
function   float32              float64              divisions / polynomial
=========  ===================  ===================  ========================
exp        0.98 (1.0)           0.96 (1.0)           0 / degree 7, 12
expm1      1.32 (1.5)           1.77 (2.0)           0 / degree 7, 12
log1p      1.39 (1.5)           1.26 (1.5)           1 / degree 2, 6 in s^2
erf        1.16 (1.5)           1.24 (1.5)           0, 1 / 5+6, 10+12 (+exp)
erfc       3.40 (3.5)           3.30 (3.5)           1 / 9, 22 (+exp)
tanh       2.30 (2.5)           2.45 (2.5)           1 / as expm1
=========  ===================  ===================  ========================

Results in the subnormal range are within 1 (exp) or 2 (erfc) subnormal
ulps, through the gradual underflow down to 0.

Special values (tested): NaN in gives NaN out (whatever its payload and
sign); exp(-inf) = 0, exp(inf) = expm1(inf) = inf, expm1(-inf) = -1,
erf(+-inf) = +-1, erfc(inf) = 0, erfc(-inf) = 2, tanh(+-inf) = +-1,
log1p(inf) = inf, log1p(-1) = -inf, log1p(x < -1) = NaN; expm1, log1p, erf
and tanh keep the sign of -0.0 (and of tiny arguments; erf and tanh are odd
to the bit); exp and expm1 overflow to inf exactly where the correctly
rounded function does (past 88.7228 / 709.7827).

Type rules
----------
* Each function takes one float32 or float64 scalar and returns the same
  type, computing entirely in that type: float32 constants are float32
  module globals (in Numba ``float32 * 0.5`` is float64, which halves the
  vector width). Any other argument type is a ``TypingError``. Note that a
  float32 value combined with a Python float literal is float64 and takes
  the (slower) float64 version.
* Called from Python (not jitted), e.g. in the CUDA simulator, the functions
  evaluate with :mod:`math` under the same IEEE conventions (overflow gives
  inf, ``log1p(-1)`` gives -inf, no exceptions) and return the argument's
  type. The jitted versions are registered for the CPU target only: CUDA
  kernels use :mod:`math` (libdevice) directly.

For callers
-----------
* The code assumes round-to-nearest and uses no fastmath flag but
  ``contract``, and is written for hardware FMA (x86-64-v3 and later; on a
  CPU without it, untested, erfc would lose its rounding correction). The
  calling kernel's flags do
  not reach these functions' instructions (they are inlined by LLVM, not by
  Numba), so callers may use ``{"contract", "nsz", "arcp", "afn"}`` or add
  ``reassoc``. They must not use ``nnan``/``ninf`` (or ``fastmath=True``),
  which let LLVM assume away the NaN/inf handling around the call.
* Speed, 2 threads, ``out[i] = f(x[i])`` against a parallel copy in the same
  run: see ``tools/bench_approx.py``. The loops vectorize with 256-bit
  (ymm) registers, LLVM's preference for this CPU; float64 erf/erfc, the
  heaviest, are then compute-bound. Numba built with the target feature
  ``-prefer-256-bit`` (e.g. ``NUMBA_CPU_FEATURES`` = the host's features
  plus ``,-prefer-256-bit``) emits zmm code instead.
* Caching: a ``cache=True`` kernel calling these functions is cached with
  their code inlined, and Numba checks only the kernel's own source file for
  changes: after editing this module, clear the callers' caches
  (``__pycache__/*.nbi``, ``*.nbc``). The helpers themselves are not cached
  on disk: a function loaded from Numba's cache is machine code that LLVM
  cannot inline, and a call left in a loop stops its vectorization.

Coefficients come from ``tools/fit_approx.py`` (weighted minimax fits with
mpmath, rounded coefficient by coefficient); each block below states its
range and approximation error.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import errors
from numba.extending import intrinsic, overload

__all__ = ["exp", "expm1", "log1p", "erf", "erfc", "tanh"]

# error_model="numpy": the default "python" model puts a zero test and a
# branch before every division, which stops vectorization. "contract" only:
# FMAs make the reductions below exact and the polynomials cheaper, while
# the magic-number rounding, the exact splits and the zero/NaN handling rely
# on every other operation being rounded as written.
# No cache=True here: a function loaded from Numba's disk cache is linked
# as machine code, which LLVM cannot inline into the caller's loop. The
# caller's own cache holds the inlined code.
_jit = njit(nogil=True, error_model="numpy", fastmath={"contract"})

_f32 = np.float32
_i32 = np.int32


def _coefs(t, values):
    return tuple(t(v) for v in values)


# --- bit casts ----------------------------------------------------------------

@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of a float32 (as int32) or float64 (as int64)."""
    if not isinstance(x, types.Float):
        return None
    ity = types.int32 if x.bitwidth == 32 else types.int64

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(ity))

    return ity(x), codegen


def _from_bits_intrinsic(width, fty, llty):
    @intrinsic
    def from_bits(typingctx, i):
        if not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = args[0]
            ity = ir.IntType(width)
            # Numba widens integer arithmetic to int64: narrow it back here
            # (LLVM keeps the vector lanes 32-bit for float32)
            if v.type.width > width:
                v = builder.trunc(v, ity)
            elif v.type.width < width:
                v = builder.sext(v, ity)
            return builder.bitcast(v, llty)

        return fty(i), codegen

    return from_bits


_f32_from_bits = _from_bits_intrinsic(32, types.float32, ir.FloatType())
_f64_from_bits = _from_bits_intrinsic(64, types.float64, ir.DoubleType())


@intrinsic
def _inline(typingctx):
    """Mark the function being compiled ``alwaysinline`` for LLVM.

    A call left in a loop stops its vectorization, and LLVM's cost model
    declines to inline the larger float64 functions (erfc's degree-22
    polynomial) into a loop body that already calls a few others. Numba's
    own ``inline="always"`` is no substitute: it inlines at the Numba IR
    level, where the code would take the *caller's* fastmath flags (a
    ``reassoc`` would undo the rounding tricks) and error model (a zero test
    per division). LLVM inlining keeps each instruction's own flags."""
    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()

    return types.none(), codegen


# BEGIN generated by tools/fit_approx.py (constant term first)
# exp32: expm1(r) = r + r^2 q(r), |r| <= 0.35; relative error of expm1(r)
#   degree 5 in r; max weighted error of the rounded coefficients 4.73e-10; Horner sum/value <= 1.26
_EXP32 = _coefs(np.float32, (0.5, 0.1666666567325592, 0.041666481643915176, 0.008333542384207249, 0.0013933568261563778, 0.0001976606872631237))
# exp64: expm1(r) = r + r^2 q(r), |r| <= 0.35; relative error of expm1(r)
#   degree 10 in r; max weighted error of the rounded coefficients 3.06e-19; Horner sum/value <= 1.26
_EXP64 = _coefs(float, (0.5, 0.16666666666666677, 0.041666666666666574, 0.008333333333321175, 0.0013888888888943744, 0.00019841269887743433, 2.4801587198669343e-05, 2.7557242202837373e-06, 2.7557384089717537e-07, 2.5109848324508754e-08, 2.088066192973195e-09))
# log32: log1p(f) = 2s + s z P(z), z = s^2 <= 0.0295; relative error
#   degree 2 in z; max weighted error of the rounded coefficients 8.22e-10; Horner sum/value <= 1.00
_LOG32 = _coefs(np.float32, (0.6666677594184875, 0.39977553486824036, 0.29872140288352966))
# log64: log1p(f) = 2s + s z P(z), z = s^2 <= 0.0295; relative error
#   degree 6 in z; max weighted error of the rounded coefficients 1.26e-18; Horner sum/value <= 1.00
_LOG64 = _coefs(float, (0.6666666666666735, 0.3999999999940865, 0.2857142874395199, 0.22222198392994935, 0.1818357460569187, 0.15313766069604284, 0.14798996570107803))
# erfa32: erf(x) = x + x y(x^2), |x| <= 0.84375; absolute error of y
#   degree 5 in s; max weighted error of the rounded coefficients 6.56e-09; Horner sum/value <= 90171.13
_ERFA32 = _coefs(np.float32, (0.12837916612625122, -0.37612593173980713, 0.11282917857170105, -0.026809923350811005, 0.005062668118625879, -0.0006380036938935518))
# erfa64: erf(x) = x + x y(x^2), |x| <= 0.84375; absolute error of y
#   degree 10 in s; max weighted error of the rounded coefficients 1.61e-17; Horner sum/value <= 90322.98
_ERFA64 = _coefs(float, (0.12837916709551256, -0.37612638903183276, 0.1128379167092936, -0.026866170639649335, 0.005223977565446563, -0.0008548323185197809, 0.00012055179553295309, -1.4921698406997448e-05, 1.6396338925180086e-06, -1.567794817120565e-07, 1.0619777927230614e-08))
# erfb32: erfc(z) = exp(Q(z)), z in [0.84375, 3.95]; absolute error of erfc
#   degree 6 in z; max weighted error of the rounded coefficients 2.03e-09; Horner sum/value <= 1.71
_ERFB32 = _coefs(np.float32, (-0.0001078346831491217, -1.1280450820922852, -0.636549711227417, -0.1044953390955925, 0.022502558305859566, -0.0031132777221500874, 0.00020316618611104786))
# erfb64: erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0.84375, 5.95]; absolute error of erfc
#   degree 12 in v; max weighted error of the rounded coefficients 7.15e-19; Horner sum/value <= 1.72
_ERFB64 = _coefs(float, (0.35800230236277125, 0.294464817723941, 0.1967427856907768, 0.10348908726043902, 0.039842590124573245, 0.008942370384272938, -0.0004038331074153714, -0.0010128111813778318, -0.00017806115336139618, 8.177217954690621e-05, 5.177079032123921e-05, -2.584565399117649e-05, 3.049103296434778e-06))
# erfc32: erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0, 10.1]; relative error
#   degree 9 in v; max weighted error of the rounded coefficients 7.81e-09; Horner sum/value <= 2.45
_ERFC32 = _coefs(np.float32, (0.35800230503082275, 0.2944648265838623, 0.19674260914325714, 0.10348876565694809, 0.03984455764293671, 0.008945586159825325, -0.00041347643127664924, -0.0010231310734525323, -0.0001569987362017855, 0.0001049487545969896))
# erfc64: erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0, 27.3]; relative error
#   degree 22 in v; max weighted error of the rounded coefficients 3.29e-17; Horner sum/value <= 3.81
_ERFC64 = _coefs(float, (0.3580023023627799, 0.2944648177232945, 0.1967427857013665, 0.10348908730019112, 0.03984258709581095, 0.008942411541442563, -0.00040413887685004056, -0.0010113539997731768, -0.00018276988399890573, 9.225927722100803e-05, 3.585373789618761e-05, -1.0132693106481638e-05, -5.823137393056437e-06, 1.5829539735308588e-06, 9.207662719649305e-07, -3.3258899000623864e-07, -1.3424321945247843e-07, 7.705681206471335e-08, 1.3565203429537848e-08, -1.5830548156396126e-08, 6.38661276925274e-10, 2.003718123628974e-09, -4.707638506232339e-10))
# END generated


# --- float32 ------------------------------------------------------------------

_F32_ZERO = _f32(0.0)
_F32_HALF = _f32(0.5)
_F32_ONE = _f32(1.0)
_F32_TWO = _f32(2.0)
_F32_NAN = _f32(np.nan)
_F32_INF = _f32(np.inf)
_F32_LOG2E = _f32(1.4426950408889634)
# 1.5 * 2^23: adding it rounds |y| < 2^22 to an integer, held in the low bits
_F32_SHIFT = _f32(12582912.0)
_F32_SHIFT_BITS = _i32(0x4B400000)
# ln2 split so that n * _F32_LN2_HI is exact for |n| < 2^9 (15 bits)
_F32_LN2_HI = _f32(0.693145751953125)
_F32_LN2_LO = _f32(1.428606765330187e-06)
# exp(88.7228394) overflows; exp(-103.972) < 2^-150 rounds to 0
_F32_EXP_HI = _f32(89.0)
_F32_EXP_LO = _f32(-104.0)
# expm1(x) rounds to -1 below -17.33
_F32_EXPM1_LO = _f32(-30.0)
_F32_SQRT_HALF_BITS = _i32(0x3F3504F3)            # bits of sqrt(1/2)
_F32_ONE_MINUS_SQRT_HALF_BITS = _i32(0x3F800000 - 0x3F3504F3)
_F32_ERF_A = _f32(0.84375)
_F32_ERF_ZMAX = _f32(3.95)    # erf(z) rounds to 1 past 3.917
_F32_ERFC_ZMAX = _f32(10.1)   # erfc(z) rounds to 0 past 10.06
_F32_ERFC_K = _f32(3.0)
_F32_ERFC_INV_K = _f32(1.0 / 3.0)
_F32_TWO_OVER_SQRTPI = _f32(1.1283791670955126)
_F32_TANH_SMALL = _f32(0.625)
_F32_SPLIT_MASK = _i32(-4096)  # keeps 12 significant bits: zh*zh is exact
_F32_SIGN = _i32(-0x80000000)


@_jit
def _pow2_f32(n):
    """2**n for integer n in [-126, 127]."""
    _inline()
    return _f32_from_bits((n + 127) << 23)


@_jit
def _expm1_poly_f32(r):
    """expm1(r) for |r| <= 0.35 (approximation error 4.7e-10 relative)."""
    _inline()
    c = _EXP32
    q = c[5]
    q = q * r + c[4]
    q = q * r + c[3]
    q = q * r + c[2]
    q = q * r + c[1]
    q = q * r + c[0]
    return (r * r) * q + r


@_jit
def _reduce_f32(x):
    """x = n*ln2 + r with |r| <= 0.35 (x within the exp clamp range); n is
    held in the low bits of t (see _n_f32, _scale_f32, _halves_f32)."""
    _inline()
    t = x * _F32_LOG2E + _F32_SHIFT
    nf = t - _F32_SHIFT
    r = x - nf * _F32_LN2_HI
    r = r - nf * _F32_LN2_LO
    return r, t


@_jit
def _n_f32(t):
    """The integer n of a reduction."""
    _inline()
    # Numba computes int32 - int32 in int64: truncating says it fits in 32
    # bits, so that LLVM keeps the later shifts in 32-bit vector lanes
    return _i32(_bits(t) - _F32_SHIFT_BITS)


@_jit
def _scale_f32(t):
    """2^n of a reduction, n in [-126, 127]."""
    _inline()
    return _f32_from_bits(_i32(_bits(t) - (_F32_SHIFT_BITS - 127)) << 23)


@_jit
def _halves_f32(t):
    """2^n of a reduction as two normal factors 2^(n//2) and 2^(n - n//2),
    for n in [-252, 254]: only the second multiplication by them rounds (into
    the subnormals or to inf). The exponent biases are folded into the
    constant: (n + 254) >> 1 = n//2 + 127."""
    _inline()
    nb = _i32(_bits(t) - (_F32_SHIFT_BITS - 254))
    n1 = nb >> 1
    return _f32_from_bits(n1 << 23), _f32_from_bits((nb - n1) << 23)


@_jit
def _exp_f32(x):
    _inline()
    # NaN fails both comparisons and passes through
    x = _F32_EXP_HI if x > _F32_EXP_HI else x
    x = _F32_EXP_LO if x < _F32_EXP_LO else x
    r, t = _reduce_f32(x)
    s1, s2 = _halves_f32(t)
    # (1 + e) 2^n1 with one rounding, then the exact (or final) 2^n2
    e = _expm1_poly_f32(r)
    return (e * s1 + s1) * s2


@_jit
def _expm1_f32(x):
    _inline()
    x = _F32_EXP_HI if x > _F32_EXP_HI else x
    x = _F32_EXPM1_LO if x < _F32_EXPM1_LO else x
    r, t = _reduce_f32(x)
    e = _expm1_poly_f32(r)
    n = _n_f32(t)
    s1, s2 = _halves_f32(t)
    # expm1(x) = 2^n (1 + e) - 1, rounded once:
    # n <= 24: 2^n e + (2^n - 1), the bracket exact (fma);
    # n > 24: 2^n ((e - 2^-n) + 1) in halves (overflow), 2^-n capped at 2^-60
    s = s1 * s2
    small = s * e + (s - _F32_ONE)
    m = n if n < 60 else 60
    big = ((e - _pow2_f32(-m)) * s1 + s1) * s2
    y = big if n > 24 else small
    # the polynomial turns -0.0 into +0.0
    return x if x == _F32_ZERO else y


@_jit
def _log1p_f32(x):
    _inline()
    u = _F32_ONE + x
    # u - 1 is exact here, so c is the rounding error of 1 + x (to within
    # what matters once u >= 2^24)
    c = x - (u - _F32_ONE)
    # u = 2^k m, m in [sqrt(1/2), sqrt(2))
    b = _i32(_bits(u) + _F32_ONE_MINUS_SQRT_HALF_BITS)
    k = (b >> 23) - 127
    m = _f32_from_bits((b & 0x007FFFFF) + _F32_SQRT_HALF_BITS)
    # f = m - 1 is exact; add the rounding error of u, scaled like m
    kc = k if k < 100 else 100
    f = (m - _F32_ONE) + c * _pow2_f32(-kc)
    # log1p(f) = 2 atanh(s) = f - (hfsq - s (hfsq + R)) (fdlibm's form: the
    # leading f is exact, only the small correction carries rounding)
    s = f / (_F32_TWO + f)
    z = s * s
    cz = _LOG32
    R = z * (cz[0] + z * (cz[1] + z * cz[2]))
    hfsq = _F32_HALF * f * f
    kf = _f32(k)
    y = kf * _F32_LN2_HI - ((hfsq - (s * (hfsq + R) + kf * _F32_LN2_LO)) - f)
    y = x if x == _F32_ZERO else y          # log1p(-0.0) = -0.0
    y = -_F32_INF if x == -_F32_ONE else y
    y = _F32_NAN if x < -_F32_ONE else y
    return y if x < _F32_INF else x         # inf and NaN pass through


@_jit
def _erf_f32(x):
    _inline()
    z = abs(x)
    # |x| < 0.84375: erf(x) = x + x y(x^2), one rounding in the fma
    s = x * x
    a = _ERFA32
    y = a[5]
    y = y * s + a[4]
    y = y * s + a[3]
    y = y * s + a[2]
    y = y * s + a[1]
    y = y * s + a[0]
    small = x * y + x
    # |x| >= 0.84375: erf = 1 - erfc, erfc(z) = exp(Q(z)); Q's rounding
    # errors are relative to erfc, so absolute ones of erf are tiny
    zc = _F32_ERF_ZMAX if z > _F32_ERF_ZMAX else z
    b = _ERFB32
    q = b[6]
    q = q * zc + b[5]
    q = q * zc + b[4]
    q = q * zc + b[3]
    q = q * zc + b[2]
    q = q * zc + b[1]
    q = q * zc + b[0]
    r, t = _reduce_f32(q)                 # q in [-17.7, -1.3]: n in [-26, -2]
    s = _scale_f32(t)
    big = _F32_ONE - (_expm1_poly_f32(r) * s + s)
    big = -big if x < _F32_ZERO else big
    return small if z < _F32_ERF_A else big


@_jit
def _erfc_f32(x):
    _inline()
    z = abs(x)
    z = _F32_ERFC_ZMAX if z > _F32_ERFC_ZMAX else z
    # erfc(z) = exp(-z^2) t P(2t - 1), t = 3/(3+z), for all z >= 0
    d = _F32_ERFC_K + z
    t = _F32_ERFC_K / d
    v = _F32_TWO * t - _F32_ONE
    c = _ERFC32
    p = c[9]
    p = p * v + c[8]
    p = p * v + c[7]
    p = p * v + c[6]
    p = p * v + c[5]
    p = p * v + c[4]
    p = p * v + c[3]
    p = p * v + c[2]
    p = p * v + c[1]
    p = p * v + c[0]
    # t carries two roundings (K + z, the division) that the steep
    # d log(tP)/d log(t) (up to 3.4) would amplify: first-order correction
    # with d(tP)/dt = (2/sqrt(pi) - 2 z tP) K / t^2 and the exact errors
    # d_err of K + z (Fast2Sum) and rem of the division (fma residual).
    # (2t - 1 is exact down to t = 1/4, z = 9: beyond, float32 erfc is near
    # the subnormals and the float64 version's extra term does not pay.)
    pt = p * t
    d_err = z - (d - _F32_ERFC_K)
    rem = _F32_ERFC_K - t * d
    g = rem - t * d_err
    corr = _F32_TWO_OVER_SQRTPI - (z + z) * pt
    pt = p * t + corr * g * (d * _F32_ERFC_INV_K)       # one rounding
    # exp(-z^2) with z^2 = zh^2 + zl (z + zh) as an unevaluated sum: a
    # rounded z^2 (up to 102) would cost up to 2^-17 relative error
    zh = _f32_from_bits(_bits(z) & _F32_SPLIT_MASK)
    zl = z - zh
    ah = -(zh * zh)
    al = -(zl * (z + zh))
    tt = (ah + al) * _F32_LOG2E + _F32_SHIFT
    nf = tt - _F32_SHIFT
    r = ah - nf * _F32_LN2_HI            # exact
    r = r + (al - nf * _F32_LN2_LO)      # small terms first: one rounding
    q = _expm1_poly_f32(r)
    w = pt * q + pt                     # pt exp(r) with one rounding
    s1, s2 = _halves_f32(tt)
    y = (w * s1) * s2
    return _F32_TWO - y if x < _F32_ZERO else y


@_jit
def _tanh_f32(x):
    _inline()
    z = abs(x)
    # One reduction of -2z gives both em = expm1(-2z) (accurate for small z)
    # and e = exp(-2z) (accurate for large z). z < 0.625:
    # tanh = -em / (2 + em), no cancellation; beyond: 1 - 2e / (1 + e),
    # whose error is relative to the small 1 - tanh. Never overflows.
    a = -_F32_TWO * z
    a = _F32_EXPM1_LO if a < _F32_EXPM1_LO else a
    r, t = _reduce_f32(a)
    q = _expm1_poly_f32(r)
    s = _scale_f32(t)
    em = s * q + (s - _F32_ONE)
    e = s * q + s
    small = z < _F32_TANH_SMALL
    num = -em if small else e + e
    den = _F32_TWO + em if small else _F32_ONE + e
    y = num / den
    y = abs(y if small else _F32_ONE - y)
    # copysign(y, x) keeps -0.0 and passes NaN through
    return _f32_from_bits(_bits(y) | (_bits(x) & _F32_SIGN))


# --- float64 ------------------------------------------------------------------

_F64_ONE = 1.0
_F64_LOG2E = 1.4426950408889634
_F64_SHIFT = 6755399441055744.0           # 1.5 * 2^52
_F64_SHIFT_BITS = 0x4338000000000000
# fdlibm's split: n * _F64_LN2_HI is exact for |n| < 2^21
_F64_LN2_HI = 6.93147180369123816490e-01
_F64_LN2_LO = 1.90821492927058770002e-10
# exp(709.782712893384) is the largest finite; exp(-745.1332) < 2^-1075
_F64_EXP_HI = 710.0
_F64_EXP_LO = -746.0
_F64_EXPM1_LO = -60.0                     # expm1 rounds to -1 below -37.43
_F64_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD
_F64_ONE_MINUS_SQRT_HALF_BITS = 0x3FF0000000000000 - 0x3FE6A09E667F3BCD
_F64_ERF_A = 0.84375
_F64_ERF_ZMAX = 5.95          # erf(z) rounds to 1 past 5.92
_F64_ERFC_ZMAX = 27.3         # erfc(z) rounds to 0 past 27.23
_F64_ERFC_K = 3.0
_F64_ERFC_INV_K = 1.0 / 3.0
_F64_TWO_OVER_SQRTPI = 1.1283791670955126
_F64_SPLIT_MASK = -(1 << 27)  # keeps 26 significant bits: zh*zh is exact
_F64_SIGN = -(1 << 63)


@_jit
def _pow2_f64(n):
    """2**n for integer n in [-1022, 1023]."""
    _inline()
    return _f64_from_bits((n + 1023) << 52)


@_jit
def _expm1_poly_f64(r):
    """expm1(r) for |r| <= 0.35 (approximation error 3.1e-19 relative)."""
    _inline()
    c = _EXP64
    q = c[10]
    q = q * r + c[9]
    q = q * r + c[8]
    q = q * r + c[7]
    q = q * r + c[6]
    q = q * r + c[5]
    q = q * r + c[4]
    q = q * r + c[3]
    q = q * r + c[2]
    q = q * r + c[1]
    q = q * r + c[0]
    return (r * r) * q + r


# _reduce_f64, _n_f64, _scale_f64, _halves_f64: the float32 helpers' twins
@_jit
def _reduce_f64(x):
    _inline()
    t = x * _F64_LOG2E + _F64_SHIFT
    nf = t - _F64_SHIFT
    r = x - nf * _F64_LN2_HI
    r = r - nf * _F64_LN2_LO
    return r, t


@_jit
def _n_f64(t):
    _inline()
    return _bits(t) - _F64_SHIFT_BITS


@_jit
def _scale_f64(t):
    _inline()
    return _f64_from_bits((_bits(t) - (_F64_SHIFT_BITS - 1023)) << 52)


@_jit
def _halves_f64(t):
    _inline()
    nb = _bits(t) - (_F64_SHIFT_BITS - 2046)
    n1 = nb >> 1
    return _f64_from_bits(n1 << 52), _f64_from_bits((nb - n1) << 52)


@_jit
def _exp_f64(x):
    _inline()
    x = _F64_EXP_HI if x > _F64_EXP_HI else x
    x = _F64_EXP_LO if x < _F64_EXP_LO else x
    r, t = _reduce_f64(x)
    s1, s2 = _halves_f64(t)
    e = _expm1_poly_f64(r)
    return (e * s1 + s1) * s2


@_jit
def _expm1_f64(x):
    _inline()
    x = _F64_EXP_HI if x > _F64_EXP_HI else x
    x = _F64_EXPM1_LO if x < _F64_EXPM1_LO else x
    r, t = _reduce_f64(x)
    e = _expm1_poly_f64(r)
    n = _n_f64(t)
    s1, s2 = _halves_f64(t)
    s = s1 * s2
    small = s * e + (s - _F64_ONE)
    m = n if n < 120 else 120
    big = ((e - _pow2_f64(-m)) * s1 + s1) * s2
    y = big if n > 53 else small
    return x if x == 0.0 else y


@_jit
def _log1p_f64(x):
    _inline()
    u = _F64_ONE + x
    c = x - (u - _F64_ONE)
    b = _bits(u) + _F64_ONE_MINUS_SQRT_HALF_BITS
    k = (b >> 52) - 1023
    m = _f64_from_bits((b & 0x000FFFFFFFFFFFFF) + _F64_SQRT_HALF_BITS)
    kc = k if k < 1000 else 1000
    f = (m - _F64_ONE) + c * _pow2_f64(-kc)
    s = f / (2.0 + f)
    z = s * s
    cz = _LOG64
    R = cz[6]
    R = R * z + cz[5]
    R = R * z + cz[4]
    R = R * z + cz[3]
    R = R * z + cz[2]
    R = R * z + cz[1]
    R = R * z + cz[0]
    R = R * z
    hfsq = 0.5 * f * f
    kf = float(k)
    y = kf * _F64_LN2_HI - ((hfsq - (s * (hfsq + R) + kf * _F64_LN2_LO)) - f)
    y = x if x == 0.0 else y
    y = -np.inf if x == -1.0 else y
    y = np.nan if x < -1.0 else y
    return y if x < np.inf else x


@_jit
def _erf_f64(x):
    _inline()
    z = abs(x)
    s = x * x
    a = _ERFA64
    y = a[10]
    y = y * s + a[9]
    y = y * s + a[8]
    y = y * s + a[7]
    y = y * s + a[6]
    y = y * s + a[5]
    y = y * s + a[4]
    y = y * s + a[3]
    y = y * s + a[2]
    y = y * s + a[1]
    y = y * s + a[0]
    small = x * y + x
    # erfc(z) = exp(-z^2) t P(2t - 1), t = 3/(3+z), to an absolute 3e-18;
    # the rounding of z^2 costs erfc at most 1.8e-17 absolute here
    zc = _F64_ERF_ZMAX if z > _F64_ERF_ZMAX else z
    t = _F64_ERFC_K / (_F64_ERFC_K + zc)
    v = 2.0 * t - 1.0
    b = _ERFB64
    p = b[12]
    p = p * v + b[11]
    p = p * v + b[10]
    p = p * v + b[9]
    p = p * v + b[8]
    p = p * v + b[7]
    p = p * v + b[6]
    p = p * v + b[5]
    p = p * v + b[4]
    p = p * v + b[3]
    p = p * v + b[2]
    p = p * v + b[1]
    p = p * v + b[0]
    r, tn = _reduce_f64(-(zc * zc))       # n in [-52, -1]
    p = p * t
    big = _F64_ONE - (p * _expm1_poly_f64(r) + p) * _scale_f64(tn)
    big = -big if x < 0.0 else big
    return small if z < _F64_ERF_A else big


@_jit
def _erfc_f64(x):
    _inline()
    z = abs(x)
    z = _F64_ERFC_ZMAX if z > _F64_ERFC_ZMAX else z
    d = _F64_ERFC_K + z
    t = _F64_ERFC_K / d
    v = 2.0 * t - 1.0
    c = _ERFC64
    # Horner's chain of 22 dependent FMAs split in two of 10 run side by
    # side: S3 = sum_{k>=3} c_k v^(k-3) = L(v) + v^10 H(v), then three more
    # Horner steps. The extra rounding (of S3) is damped by v^3 and does not
    # show in the error, unlike a split at c0.
    v2 = v * v
    v4 = v2 * v2
    v10 = (v4 * v4) * v2
    h = c[22]
    h = h * v + c[21]
    h = h * v + c[20]
    h = h * v + c[19]
    h = h * v + c[18]
    h = h * v + c[17]
    h = h * v + c[16]
    h = h * v + c[15]
    h = h * v + c[14]
    h = h * v + c[13]
    p = c[12]
    p = p * v + c[11]
    p = p * v + c[10]
    p = p * v + c[9]
    p = p * v + c[8]
    p = p * v + c[7]
    p = p * v + c[6]
    p = p * v + c[5]
    p = p * v + c[4]
    p = p * v + c[3]
    p = v10 * h + p
    p = p * v + c[2]
    p = p * v + c[1]
    p = p * v + c[0]
    # first-order correction for the roundings of t as in the float32
    # version, plus that of v = 2t - 1 below t = 1/4 (z > 9), ev, exact
    # because -1 - v is wherever 2t - 1 rounds
    pt = p * t
    d_err = z - (d - _F64_ERFC_K)
    rem = _F64_ERFC_K - t * d
    g = rem - t * d_err
    ev = t * 2.0 + (-1.0 - v)
    corr = _F64_TWO_OVER_SQRTPI - (z + z) * pt
    cc = (corr * g + (corr * d - pt) * (0.5 * ev)) * (d * _F64_ERFC_INV_K)
    pt = p * t + cc
    zh = _f64_from_bits(_bits(z) & _F64_SPLIT_MASK)
    zl = z - zh
    ah = -(zh * zh)
    al = -(zl * (z + zh))
    tt = (ah + al) * _F64_LOG2E + _F64_SHIFT
    nf = tt - _F64_SHIFT
    r = ah - nf * _F64_LN2_HI
    r = r + (al - nf * _F64_LN2_LO)
    q = _expm1_poly_f64(r)
    w = pt * q + pt
    s1, s2 = _halves_f64(tt)
    y = (w * s1) * s2
    return 2.0 - y if x < 0.0 else y


@_jit
def _tanh_f64(x):
    _inline()
    z = abs(x)
    a = -2.0 * z
    a = _F64_EXPM1_LO if a < _F64_EXPM1_LO else a
    r, t = _reduce_f64(a)
    q = _expm1_poly_f64(r)
    s = _scale_f64(t)
    em = s * q + (s - _F64_ONE)
    e = s * q + s
    small = z < 0.625
    num = -em if small else e + e
    den = 2.0 + em if small else _F64_ONE + e
    y = num / den
    y = abs(y if small else _F64_ONE - y)
    return _f64_from_bits(_bits(y) | (_bits(x) & _F64_SIGN))


# --- public functions ---------------------------------------------------------

def _python(f, x):
    """Evaluate ``f`` from :mod:`math` under IEEE conventions, in x's type."""
    try:
        y = f(float(x))
    except OverflowError:
        y = math.inf
    except ValueError:               # log1p at or below -1
        y = -math.inf if x == -1 else math.nan
    return type(x)(y) if isinstance(x, np.floating) else y


def exp(x):
    """e**x, for a float32 or float64 x (result in the same type).

    Max error 0.98 ulp (float32, all inputs) / 0.96 ulp (float64). Overflows
    to inf past 88.72283 (float32) / 709.78271 (float64), exactly where the
    correctly rounded result does; below the normal range the result is
    subnormal (within 1 subnormal ulp) down to 0; exp(-inf) = 0,
    exp(inf) = inf, NaN -> NaN. No division: x = n ln2 + r, |r| <= ln2/2,
    a degree-7 / degree-12 polynomial, 2^n applied as two normal factors.
    """
    return _python(math.exp, x)


def expm1(x):
    """e**x - 1, accurate for small |x|; float32 or float64 (same type out).

    Max error 1.32 ulp (float32, all inputs) / 1.77 ulp (float64), relative
    also for tiny |x| (expm1(-0.0) = -0.0); -1 below -17.3 / -37.4 and at
    -inf; overflows to inf exactly where exp does. Same reduction as
    :func:`exp`, the "- 1" folded in with one rounding where possible.
    """
    return _python(math.expm1, x)


def log1p(x):
    """log(1 + x), accurate for small |x|; float32 or float64 (same type out).

    Max error 1.39 ulp (float32, all inputs) / 1.26 ulp (float64) for every
    x > -1, tiny and huge x included (the rounding error of 1 + x is carried
    into the reduced argument); log1p(-1) = -inf, log1p(x < -1) = NaN
    (-inf included), log1p(inf) = inf, log1p(-0.0) = -0.0. One division:
    1 + x = 2^k m, m in [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s) with
    s = (m-1)/(m+1), fdlibm's form.
    """
    return _python(math.log1p, x)


def erf(x):
    """The error function; float32 or float64 (same type out).

    Max error 1.16 ulp (float32, all inputs) / 1.24 ulp (float64). Odd to the
    bit (erf(-0.0) = -0.0, tiny x keep their sign), +-1 for large |x| and
    at +-inf. |x| < 0.84375: x + x y(x^2); beyond,
    1 - erfc(|x|) with erfc = exp(Q(z)) (float32, no division) or
    exp(-z^2) t P(2t - 1), t = 3/(3+z) (float64, one division).
    """
    return _python(math.erf, x)


def erfc(x):
    """The complementary error function 1 - erf(x), accurate in the tail;
    float32 or float64 (same type out).

    Max error 3.40 ulp (float32, all inputs) / 3.30 ulp (float64), relative,
    over the whole range: through the gradual underflow (within 2 subnormal
    ulps) to 0 past 10.06 (float32) / 27.23 (float64); erfc(-inf) = 2. One
    approximation for every |x|: exp(-z^2) t P(2t - 1), t = 3/(3+z), with
    z^2 carried as an exact sum of two numbers and a first-order correction
    for the rounding of t; erfc(-z) = 2 - erfc(z). One division.
    """
    return _python(math.erfc, x)


def tanh(x):
    """The hyperbolic tangent; float32 or float64 (same type out).

    Max error 2.30 ulp (float32, all inputs) / 2.45 ulp (float64), relative,
    tiny |x| included (tanh(x) = x to the bit there, -0.0 kept); odd to the
    bit; +-1 for large |x| and +-inf; never overflows. From one reduction of
    -2|x|: -expm1(-2|x|) / (2 + expm1(-2|x|)) below |x| = 0.625,
    1 - 2 e / (1 + e) with e = exp(-2|x|) above. One division.
    """
    return _python(math.tanh, x)


def _register(stub, impl32, impl64):
    def f32(x):
        _inline()
        return impl32(x)

    def f64(x):
        _inline()
        return impl64(x)

    @overload(stub, target="cpu", jit_options={"fastmath": {"contract"},
                                                "error_model": "numpy"})
    def typed(x):
        if x == types.float32:
            return f32
        if x == types.float64:
            return f64
        raise errors.TypingError(
            f"nbops.cpu._approx.{stub.__name__}: expected a float32 or float64 "
            f"scalar, got {x}")


_register(exp, _exp_f32, _exp_f64)
_register(expm1, _expm1_f32, _expm1_f64)
_register(log1p, _log1p_f32, _log1p_f64)
_register(erf, _erf_f32, _erf_f64)
_register(erfc, _erfc_f32, _erfc_f64)
_register(tanh, _tanh_f32, _tanh_f64)
