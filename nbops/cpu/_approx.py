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
exp_nonpos 0.98 (1.0)           0.97 (1.0)           as exp; normal results only
expm1      1.32 (1.5)           1.77 (2.0)           0 / degree 7, 12
log1p      1.39 (1.5)           1.26 (1.5)           1 / degree 2, 6 in s^2
erf        1.16 (1.5)           1.24 (1.5)           0, 1 / 5+6, 10+12 (+exp)
erfc       3.44 (3.5)           3.30 (3.5)           1 / 9, 22 (+exp)
tanh       2.30 (2.5)           2.45 (2.5)           1 / as expm1
ndtr       5.74 (6.0)           8.30 (9.0)           1 / 4+5, 10+11 (+exp)
 density   2.09 (2.5)           2.13 (2.5)           (second result of ndtr_pdf)
log1pexp   2.12 (2.5)           2.03 (2.5)           0 / 10, 21 (+exp)
=========  ===================  ===================  ========================

ndtr's bound is looser than erfc's: its rational's two Horner chains (all
terms positive, so no cancellation, but a rounding per step) are what
buys the speed (``gelu`` at memory bandwidth in float32). float32 ndtr,
density and log1pexp were checked on every float32 of magnitude
1e-6 to 15 (ndtr, density) and 1e-9 to 105 (log1pexp), the rest of
their range sampled.

Results in the subnormal range are within 1 (exp) or 2 (erfc) subnormal
ulps, through the gradual underflow down to 0; ndtr within its bound.
exp_nonpos flushes them to 0 instead (float32 checked on 40 million inputs
spread over its normal range, float64 on 2 million).

Special values (tested): NaN in gives NaN out (whatever its payload and
sign); exp(-inf) = 0, exp(inf) = expm1(inf) = inf, expm1(-inf) = -1,
erf(+-inf) = +-1, erfc(inf) = 0, erfc(-inf) = 2, tanh(+-inf) = +-1,
log1p(inf) = inf, log1p(-1) = -inf, log1p(x < -1) = NaN, ndtr(-inf) = 0,
ndtr(inf) = 1, log1pexp(-inf) = 0, log1pexp(inf) = inf; expm1, log1p, erf
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
  changes. nbops's kernels (:func:`nbops._jit.cpu_kernel`) add this file's
  digest to their cache key; other callers must clear their caches
  (``__pycache__/*.nbi``, ``*.nbc``) after this module changes. The helpers themselves are not cached
  on disk: a function loaded from Numba's cache is machine code that LLVM
  cannot inline, and a call left in a loop stops its vectorization.

Layout
------
Each algorithm is written once, as a template function in terms of a
per-type namespace (constants, coefficient tuples, bit conversions), and
:func:`_instantiate` jits it once per type with that namespace as its
globals. Two versions exist only where the float32 and float64 algorithms
really differ: erf's tail and the erfc polynomial's evaluation and rounding
correction. Polynomials go through :func:`_horner` (or :func:`_estrin`
where one element's dependency chain is what limits the loop), unrolled at
compile time for the length of their coefficient tuple.

Coefficients come from ``tools/fit_approx.py`` (weighted minimax fits with
mpmath, rounded coefficient by coefficient); each block below states its
range and approximation error.
"""

import contextlib
import math

import numpy as np
from llvmlite import ir
from numba import config, njit, types
from numba.core import cgutils, errors
from numba.core.compiler_lock import global_compiler_lock
from numba.extending import intrinsic, overload

from .._codegen import bind

__all__ = ["exp", "exp_nonpos", "expm1", "log1p", "erf", "erfc", "tanh", "ndtr", "ndtr_pdf",
           "log1pexp"]


# --- public functions ---------------------------------------------------------

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


def exp_nonpos(x):
    """e**x for x <= 0, as in softmax's ``exp(x - max)``: float32 or float64.

    Within 1 ulp (0.98 / 0.97 measured) where the result is normal;
    results below the smallest normal number (x < -87.34 / -708.40) are 0
    but for one rounding step of 2^n (x down to -87.68 / -708.74 may still
    give a value below the normal range); exp_nonpos(-inf) = 0, NaN -> NaN.
    For 0 < x < 88.3 / 709.4 the result is still within 1 ulp; beyond that
    it is undefined. Skipping the overflow and gradual underflow of
    :func:`exp` (2^n as one factor, built by one shift and one integer
    maximum) takes about 20% less time per element: softmax's exponential.
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


def ndtr(x):
    """The standard normal CDF Phi(x) = erfc(-x/sqrt(2))/2; float32 or
    float64 (same type out).

    Relative accuracy in both tails (see the table in the module docstring;
    NaN -> NaN, Phi(-inf) = 0, Phi(inf) = 1). Fitted in x itself, so no
    rounded x/sqrt(2) is amplified by the tail's steepness: Phi(-a) =
    exp(-a^2/2) P(a)/Q(a), a = |x|, with a^2/2 carried exactly into the
    exponent and a rational of degrees 4/5 (float32) or 10/11 (float64),
    positive coefficients; Phi(x) = 1 - Phi(-x) for x >= 0. One division, no
    other library call: the cheap core of ``gelu``.
    """
    return _python(_ndtr_math, x)


def ndtr_pdf(x):
    """``(ndtr(x), exp(-x^2/2)/sqrt(2 pi))``: the normal CDF and density
    from one exponential (``gelu``'s derivative needs both). Same type as x;
    the density is within about 1 ulp (relative) down to the subnormals."""
    return ndtr(x), _python(_normal_pdf_math, x)


def log1pexp(x):
    """log(1 + e**x) (softplus), never overflowing; float32 or float64.

    max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1], the log1p a polynomial
    e + e^2 Q(e) (degree 8 / 19) evaluated by Estrin's scheme: no
    division, relative accuracy for x -> -inf (where the result is e**x).
    Max error 2.12 / 2.03 ulp. NaN -> NaN,
    log1pexp(-inf) = 0, log1pexp(inf) = inf.
    """
    return _python(_log1pexp_math, x)


def _ndtr_math(x):
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _normal_pdf_math(x):
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _log1pexp_math(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x))) if x == x else x


def _python(f, x):
    """Evaluate ``f`` from :mod:`math` under IEEE conventions, in x's type."""
    try:
        y = f(float(x))
    except OverflowError:
        y = math.inf
    except ValueError:               # log1p at or below -1
        y = -math.inf if x == -1 else math.nan
    return type(x)(y) if isinstance(x, np.floating) else y


# --- templates ----------------------------------------------------------------
#
# Each algorithm is written once, below, against the names of a per-type
# namespace: constants in capitals (ONE, SHIFT, EXP_HI... see _FLOATS,
# _BIT_PATTERNS and _COUNTS), coefficient tuples (EXP, LOG, ERFA, ERFB,
# ERFC), the type's _from_bits/_int/_float, the parts that differ between
# the types (_erf_tail, _erfc_poly, _erfc_dt) and the other templates.
# _instantiate() makes one jitted copy of every template per type, whose
# globals are that type's namespace: the float32 copy computes entirely in
# float32 (np.float32 constants), the float64 one in float64, and each
# copy's calls go to the same type's copies. Templates are not callable
# from Python (their globals here do not hold those names).
#
# Every template starts with _inline(): LLVM inlines it into its caller, so
# that a loop calling a public function is one straight-line body it can
# vectorize.


def _pow2(n):
    """2**n for integer n in the normal exponent range ([-126, 127] /
    [-1022, 1023])."""
    _inline()
    return _from_bits((n + BIAS) << MANT)


def _expm1_poly(r):
    """expm1(r) for |r| <= 0.35 (approximation error 4.7e-10 / 3.1e-19
    relative)."""
    _inline()
    return (r * r) * _horner(EXP, r) + r


def _reduce(x):
    """x = n*ln2 + r with |r| <= 0.35 (x within the exp clamp range); n is
    held in the low bits of t (see _n, _scale, _halves)."""
    _inline()
    t = x * LOG2E + SHIFT
    nf = t - SHIFT
    r = x - nf * LN2_HI
    r = r - nf * LN2_LO
    return r, t


def _n(t):
    """The integer n of a reduction."""
    _inline()
    return _int(_bits(t) - SHIFT_BITS)


def _scale(t):
    """2^n of a reduction, n in the normal exponent range."""
    _inline()
    return _from_bits(_int(_bits(t) - (SHIFT_BITS - BIAS)) << MANT)


def _halves(t):
    """2^n of a reduction as two normal factors 2^(n//2) and 2^(n - n//2),
    for n in [-252, 254] / [-2044, 2046]: only the second multiplication by
    them rounds (into the subnormals or to inf). The exponent biases are
    folded into the constant: (n + 2 BIAS) >> 1 = n//2 + BIAS."""
    _inline()
    nb = _int(_bits(t) - (SHIFT_BITS - 2 * BIAS))
    n1 = nb >> 1
    return _from_bits(n1 << MANT), _from_bits((nb - n1) << MANT)


def _square(z, h):
    """z h (h = z or z/2) as an unevaluated sum hi + lo: hi rounded, lo its
    exact rounding error (one FMA; the Dekker split it replaces took four
    more operations, float32 gelu 12% of its time)."""
    _inline()
    hi = z * h
    return hi, _fma(z, h, -hi)


def _exp_sum(hi, lo):
    """exp(hi + lo), for hi exact to the reduction (as from _square) and
    small lo, as (expm1(r), s1, s2) with exp = (1 + expm1(r)) s1 s2: the
    caller folds its own factor into the one rounding of (1 + e) s1."""
    _inline()
    t = hi * LOG2E + SHIFT
    nf = t - SHIFT
    r = hi - nf * LN2_HI                # exact
    r = r + (lo - nf * LN2_LO)          # small terms first: one rounding
    s1, s2 = _halves(t)
    return _expm1_poly(r), s1, s2


def _exp(x):
    _inline()
    # NaN fails both comparisons and passes through
    x = EXP_HI if x > EXP_HI else x
    x = EXP_LO if x < EXP_LO else x
    r, t = _reduce(x)
    s1, s2 = _halves(t)
    # (1 + e) 2^n1 with one rounding, then the exact (or final) 2^n2
    e = _expm1_poly(r)
    return (e * s1 + s1) * s2


def _exp_nonpos(x):
    _inline()
    # NaN fails the comparison and passes through; exp's clamp keeps
    # n + BIAS above -2^8 / -2^11, where the shift below keeps it negative
    x = EXP_LO if x < EXP_LO else x
    # SHIFT + BIAS: the low bits of t hold n + BIAS, so 2^n is those bits
    # shifted into the exponent field (the rest shifts out); n + BIAS <= 0
    # (a result below the normal range, or a NaN's bits) is negative or 0
    # there, and the maximum with 0 makes the factor, so the result, 0
    t = x * LOG2E + SHIFT_BIASED
    nf = t - SHIFT_BIASED
    r = x - nf * LN2_HI
    r = r - nf * LN2_LO
    k = _int(_bits(t) << MANT)
    s = _from_bits(k if k > 0 else 0)
    e = _expm1_poly(r)
    return e * s + s


def _expm1(x):
    _inline()
    x = EXP_HI if x > EXP_HI else x
    x = EXPM1_LO if x < EXPM1_LO else x
    r, t = _reduce(x)
    e = _expm1_poly(r)
    n = _n(t)
    s1, s2 = _halves(t)
    # expm1(x) = 2^n (1 + e) - 1, rounded once:
    # n <= EXPM1_NBIG (the precision, 24 / 53): 2^n e + (2^n - 1), the
    # bracket exact (fma);
    # beyond: 2^n ((e - 2^-n) + 1) in halves (overflow), 2^-n capped at
    # 2^-EXPM1_NCAP (2^-60 / 2^-120) for _pow2's range: that small, it
    # vanishes beside the 1 anyway
    s = s1 * s2
    small = s * e + (s - ONE)
    m = n if n < EXPM1_NCAP else EXPM1_NCAP
    big = ((e - _pow2(-m)) * s1 + s1) * s2
    y = big if n > EXPM1_NBIG else small
    # the polynomial turns -0.0 into +0.0
    return x if x == ZERO else y


def _log1p(x):
    _inline()
    u = ONE + x
    # u - 1 is exact here, so c is the rounding error of 1 + x (to within
    # what matters once u >= 2^24 / 2^53)
    c = x - (u - ONE)
    # u = 2^k m, m in [sqrt(1/2), sqrt(2))
    b = _int(_bits(u) + ONE_MINUS_SQRT_HALF_BITS)
    k = (b >> MANT) - BIAS
    m = _from_bits((b & MANT_MASK) + SQRT_HALF_BITS)
    # f = m - 1 is exact; add the rounding error of u, scaled like m (2^-k
    # capped for _pow2's range: beyond, the term is negligible beside k ln2)
    kc = k if k < LOG1P_KCAP else LOG1P_KCAP
    f = (m - ONE) + c * _pow2(-kc)
    # log1p(f) = 2 atanh(s) = f - (hfsq - s (hfsq + R)) (fdlibm's form: the
    # leading f is exact, only the small correction carries rounding)
    s = f / (TWO + f)
    z = s * s
    R = _horner(LOG, z) * z
    hfsq = HALF * f * f
    kf = _float(k)
    y = kf * LN2_HI - ((hfsq - (s * (hfsq + R) + kf * LN2_LO)) - f)
    y = x if x == ZERO else y               # log1p(-0.0) = -0.0
    y = -INF if x == -ONE else y
    y = NAN if x < -ONE else y
    return y if x < INF else x              # inf and NaN pass through


def _erf(x):
    _inline()
    z = abs(x)
    # |x| < 0.84375: erf(x) = x + x y(x^2), one rounding in the fma
    small = x * _horner(ERFA, x * x) + x
    # |x| >= 0.84375: erf = 1 - erfc(z), erfc (at most 0.234 here) from
    # _erf_tail to an absolute error well below erf's ulp
    zc = ERF_ZMAX if z > ERF_ZMAX else z
    big = ONE - _erf_tail(zc)
    big = -big if x < ZERO else big
    return small if z < ERF_A else big


def _erfc(x):
    _inline()
    z = abs(x)
    z = ERFC_ZMAX if z > ERFC_ZMAX else z
    # erfc(z) = exp(-z^2) t P(2t - 1), t = 3/(3+z), for all z >= 0
    d = ERFC_K + z
    t = ERFC_K / d
    v = TWO * t - ONE
    p = _erfc_poly(v)
    # t carries two roundings (K + z, the division) that the steep
    # d log(tP)/d log(t) (up to 3.4) would amplify: first-order correction
    # with d(tP)/dt = (2/sqrt(pi) - 2 z tP) K / t^2 and the exact errors
    # d_err of K + z (Fast2Sum) and rem of the division (fma residual):
    # t's error is g/d, so the correction is corr g d/K (_erfc_dt gives
    # corr g, in float64 plus a term for the rounding of v)
    pt = p * t
    d_err = z - (d - ERFC_K)
    rem = ERFC_K - t * d
    g = rem - t * d_err
    corr = TWO_OVER_SQRTPI - (z + z) * pt
    pt = p * t + _erfc_dt(g, corr, d, t, v, pt) * (d * ERFC_INV_K)  # one rounding
    # exp(-z^2) from z^2 as an unevaluated sum: a rounded z^2 (up to 102 /
    # 745) would cost up to 2^-17 / 2^-43 relative error
    sh, sl = _square(z, z)
    q, s1, s2 = _exp_sum(-sh, -sl)
    w = pt * q + pt                     # pt exp(r) with one rounding
    y = (w * s1) * s2
    return TWO - y if x < ZERO else y


def _ndtr_tail(x):
    """Phi(-a) and exp(-a^2/2) for a = |x| (clamped where both underflow)."""
    _inline()
    a = abs(x)
    a = NDTR_AMAX if a > NDTR_AMAX else a
    # a/2 is exact but below the normal range, where a^2/2 vanishes anyway
    sh, sl = _square(a, HALF * a)
    q, s1, s2 = _exp_sum(-sh, -sl)
    rat = _horner(NDTR_P, a) / _horner(NDTR_Q, a)
    # rat exp(r) 2^n and exp(r) 2^n, each rounded once (then the exact or
    # final scaling by s2)
    return ((rat * q + rat) * s1) * s2, (q * s1 + s1) * s2


def _ndtr(x):
    _inline()
    y, e = _ndtr_tail(x)
    # NaN fails x < 0 and stays NaN in 1 - y
    return y if x < ZERO else ONE - y


def _ndtr_pdf(x):
    _inline()
    y, e = _ndtr_tail(x)
    return (y if x < ZERO else ONE - y), e * INV_SQRT_2PI


def _log1pexp(x):
    _inline()
    e = _exp(-abs(x))
    # Estrin, not Horner: the exp and this polynomial are one dependency
    # chain, and a loop of softplus was bound by its latency (13% faster;
    # max error 1.9 -> 2.1 ulp)
    lp = (e * e) * _estrin(L1PE, e) + e
    # NaN fails x > 0 and stays NaN through e
    return (x if x > ZERO else ZERO) + lp


def _tanh(x):
    _inline()
    z = abs(x)
    # One reduction of -2z gives both em = expm1(-2z) (accurate for small z)
    # and e = exp(-2z) (accurate for large z). z < 0.625:
    # tanh = -em / (2 + em), no cancellation; beyond: 1 - 2e / (1 + e),
    # whose error is relative to the small 1 - tanh. Never overflows.
    a = -TWO * z
    a = EXPM1_LO if a < EXPM1_LO else a
    r, t = _reduce(a)
    q = _expm1_poly(r)
    s = _scale(t)
    em = s * q + (s - ONE)
    e = s * q + s
    small = z < TANH_SMALL
    num = -em if small else e + e
    den = TWO + em if small else ONE + e
    y = num / den
    y = abs(y if small else ONE - y)
    # copysign(y, x) keeps -0.0 and passes NaN through
    return _from_bits(_bits(y) | (_bits(x) & SIGN))


# --- where the float32 and float64 algorithms differ --------------------------
# Bound to the names _erf_tail, _erfc_poly and _erfc_dt by _instantiate.

def _erf_tail_expq(z):
    """float32 erfc(z), z in [0.84375, 3.95], as exp(Q(z)): no division.
    Q's rounding errors are relative to erfc, so absolute ones of erf are
    tiny."""
    _inline()
    q = _horner(ERFB, z)
    r, t = _reduce(q)                   # q in [-17.7, -1.3]: n in [-26, -2]
    s = _scale(t)
    return _expm1_poly(r) * s + s


def _erf_tail_exp_tp(z):
    """float64 erfc(z), z in [0.84375, 5.95]: exp(-z^2) t P(2t - 1),
    t = 3/(3+z) (one division), to an absolute 3e-18; the rounding of z^2
    costs erfc at most 1.8e-17 absolute here."""
    _inline()
    t = ERFC_K / (ERFC_K + z)
    v = TWO * t - ONE
    p = _horner(ERFB, v)
    r, tn = _reduce(-(z * z))           # n in [-52, -1]
    p = p * t
    return (p * _expm1_poly(r) + p) * _scale(tn)


def _erfc_poly_horner(v):
    """float32 P(v) of erfc, degree 9."""
    _inline()
    return _horner(ERFC, v)


def _erfc_poly_split(v):
    """float64 P(v) of erfc, degree 22. Horner's chain of 22 dependent FMAs
    split in two of 10 run side by side: S3 = sum_{k>=3} c_k v^(k-3) =
    L(v) + v^10 H(v), then three more Horner steps. The extra rounding (of
    S3) is damped by v^3 and does not show in the error, unlike a split at
    c0."""
    _inline()
    c = ERFC
    v2 = v * v
    v4 = v2 * v2
    v10 = (v4 * v4) * v2
    h = _horner(c[13:], v)
    p = _horner(c[3:13], v)
    p = v10 * h + p
    p = p * v + c[2]
    p = p * v + c[1]
    p = p * v + c[0]
    return p


def _erfc_dt_t(g, corr, d, t, v, pt):
    """float32 correction term for the roundings of t only. 2t - 1 is exact
    down to t = 1/4 (z = 9): beyond, float32 erfc is near the subnormals and
    the float64 version's extra term does not pay."""
    _inline()
    return corr * g


def _erfc_dt_tv(g, corr, d, t, v, pt):
    """float64 correction term for the roundings of t, plus that of
    v = 2t - 1 below t = 1/4 (z > 9), ev, exact because -1 - v is wherever
    2t - 1 rounds."""
    _inline()
    ev = t * TWO + (-ONE - v)
    return corr * g + (corr * d - pt) * (HALF * ev)


# --- building blocks ----------------------------------------------------------

# error_model="numpy": the default "python" model puts a zero test and a
# branch before every division, which stops vectorization. "contract" only:
# FMAs make the reductions below exact and the polynomials cheaper, while
# the magic-number rounding, the exact splits and the zero/NaN handling rely
# on every other operation being rounded as written.
# No cache=True here: a function loaded from Numba's disk cache is linked
# as machine code, which LLVM cannot inline into the caller's loop. The
# caller's own cache holds the inlined code.
_OPTIONS = {"error_model": "numpy", "fastmath": {"contract"}}


def _jit(fn):
    """``njit`` for the helpers, compiled with LLVM's SLP vectorizer off.

    A helper is compiled when its first caller is, and would take that
    caller's setting: :func:`nbops._jit.cpu_kernel` switches SLP on. SLP can
    then pack a helper's independent operations (the two Horner chains of
    :func:`_erfc_poly_split`) into 2-wide vectors, and a loop whose body
    holds vector code is not vectorized: the float64 erfc loop ran scalar.
    Off here, the helpers' code is the same whoever compiles first, and the
    caller's loop vectorizer widens the inlined code."""
    disp = njit(nogil=True, **_OPTIONS)(fn)
    compile_ = disp.compile

    def compile(sig):
        # under Numba's compiler lock: no other compilation sees the setting
        with global_compiler_lock, _numba_config(SLP_VECTORIZE=0):
            return compile_(sig)

    disp.compile = compile
    return disp


@contextlib.contextmanager
def _numba_config(**settings):
    """Set ``numba.config`` attributes for the duration of a with block."""
    saved = {name: getattr(config, name) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


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


def _horner(c, x):
    """c[0] + c[1] x + ... + c[n] x^n for a tuple c, by Horner's rule.

    Jitted, it is unrolled for the tuple's length (one compilation per
    length and type): n dependent multiply-adds, each one FMA."""
    p = c[-1]
    for k in range(len(c) - 2, -1, -1):
        p = p * x + c[k]
    return p


@overload(_horner, target="cpu", jit_options=_OPTIONS)
def _horner_unrolled(c, x):
    if not isinstance(c, types.BaseTuple):
        return None
    n = len(c)
    steps = "".join(f"    p = p * x + c[{k}]\n" for k in range(n - 2, -1, -1))
    source = f"def horner(c, x):\n    _inline()\n    p = c[{n - 1}]\n{steps}    return p\n"
    scope = {"_inline": _inline}
    exec(compile(source, __file__, "exec"), scope)
    return scope["horner"]


def _estrin(c, x):
    """The polynomial of :func:`_horner`, by Estrin's scheme: pairs
    c[k] + c[k+1] x, then pairs of those with x^2, x^4, ...

    About log2(n) dependent steps instead of n, for a few more operations
    (the powers): for the long polynomials of loops bound by the latency of
    one element's chain rather than by throughput."""
    terms = list(c)
    p = x
    while len(terms) > 1:
        terms = [terms[k] + terms[k + 1] * p if k + 1 < len(terms) else terms[k]
                 for k in range(0, len(terms), 2)]
        p = p * p
    return terms[0]


@overload(_estrin, target="cpu", jit_options=_OPTIONS)
def _estrin_unrolled(c, x):
    if not isinstance(c, types.BaseTuple):
        return None
    lines, names, level, power = [], [f"c[{k}]" for k in range(len(c))], 0, "x"
    while len(names) > 1:
        nxt = []
        for k in range(0, len(names), 2):
            if k + 1 < len(names):
                name = f"t{level}_{k // 2}"
                lines.append(f"    {name} = {names[k + 1]} * {power} + {names[k]}")
                nxt.append(name)
            else:
                nxt.append(names[k])
        if len(nxt) > 1:
            lines.append(f"    x{level + 1} = {power} * {power}")
            power = f"x{level + 1}"
        names, level = nxt, level + 1
    source = "def estrin(c, x):\n    _inline()\n" + "\n".join(lines) + f"\n    return {names[0]}\n"
    scope = {"_inline": _inline}
    exec(compile(source, __file__, "exec"), scope)
    return scope["estrin"]


@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of a float32 (as int32) or float64 (as int64)."""
    if not isinstance(x, types.Float):
        return None
    ity = types.int32 if x.bitwidth == 32 else types.int64

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], context.get_value_type(ity))

    return ity(x), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """a b + c with one rounding (``llvm.fma``), for float32 or float64.

    Where the product a b is also needed rounded, ``a * b - p`` does not
    give its error: LLVM computes the product once for both and the
    difference is 0; this call cannot be merged so."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        llty = context.get_value_type(a)
        fnty = ir.FunctionType(llty, [llty] * 3)
        fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fma.f{a.bitwidth}")
        return builder.call(fn, list(args))

    return a(a, b, c), codegen


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


def _coefs(t, values):
    return tuple(t(v) for v in values)


# --- per-type constants -------------------------------------------------------
# name: (float32 value, float64 value). Floats become np.float32 / Python
# floats: in Numba ``float32 * 0.5`` is float64, which halves the vector
# width. Bit patterns become np.int32 / Python ints, counts Python ints.

_FLOATS = {
    "ZERO": (0.0, 0.0),
    "HALF": (0.5, 0.5),
    "ONE": (1.0, 1.0),
    "TWO": (2.0, 2.0),
    "NAN": (math.nan, math.nan),
    "INF": (math.inf, math.inf),
    "LOG2E": (1.4426950408889634, 1.4426950408889634),
    # 1.5 * 2^23 / 1.5 * 2^52: adding it rounds |y| < 2^22 / 2^51 to an
    # integer, held in the low bits
    "SHIFT": (12582912.0, 6755399441055744.0),
    # ln2 split so that n * LN2_HI is exact: for |n| < 2^9 (15 bits) /
    # |n| < 2^21 (fdlibm's split)
    "LN2_HI": (0.693145751953125, 6.93147180369123816490e-01),
    "LN2_LO": (1.428606765330187e-06, 1.90821492927058770002e-10),
    # exp(88.7228394) / exp(709.782712893384) overflows (is the largest
    # finite); exp(-103.972) < 2^-150 / exp(-745.1332) < 2^-1075 round to 0
    "EXP_HI": (89.0, 710.0),
    "EXP_LO": (-104.0, -746.0),
    "SHIFT_BIASED": (12582912.0 + 127, 6755399441055744.0 + 1023),
    # expm1(x) rounds to -1 below -17.33 / -37.43
    "EXPM1_LO": (-30.0, -60.0),
    "ERF_A": (0.84375, 0.84375),
    # erf(z) rounds to 1 past 3.917 / 5.92
    "ERF_ZMAX": (3.95, 5.95),
    # erfc(z) rounds to 0 past 10.06 / 27.23
    "ERFC_ZMAX": (10.1, 27.3),
    "ERFC_K": (3.0, 3.0),
    "ERFC_INV_K": (1.0 / 3.0, 1.0 / 3.0),
    "TWO_OVER_SQRTPI": (1.1283791670955126, 1.1283791670955126),
    "TANH_SMALL": (0.625, 0.625),
    "INV_SQRT_2PI": (0.3989422804014327, 0.3989422804014327),
    # x Phi(x) underflows to 0 below -14.5 / -38.6
    "NDTR_AMAX": (14.5, 38.6),
}

_BIT_PATTERNS = {
    "SHIFT_BITS": (0x4B400000, 0x4338000000000000),
    "SQRT_HALF_BITS": (0x3F3504F3, 0x3FE6A09E667F3BCD),  # bits of sqrt(1/2)
    "ONE_MINUS_SQRT_HALF_BITS": (0x3F800000 - 0x3F3504F3,
                                 0x3FF0000000000000 - 0x3FE6A09E667F3BCD),
    "SIGN": (-0x80000000, -(1 << 63)),
}

_COUNTS = {
    "MANT": (23, 52),
    "BIAS": (127, 1023),
    "MANT_MASK": (0x007FFFFF, 0x000FFFFFFFFFFFFF),
    "EXPM1_NBIG": (24, 53),
    "EXPM1_NCAP": (60, 120),
    "LOG1P_KCAP": (100, 1000),
}

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
# l1pe32: log1p(e) = e + e^2 Q(e), e = exp(-|x|) in [0, 1]; relative error
#   degree 8 in e; max weighted error of the rounded coefficients 5.26e-09; Horner sum/value <= 5.28
_L1PE32 = _coefs(np.float32, (-0.4999993145465851, 0.333304762840271, -0.2495824694633484, 0.1969374418258667, -0.15350839495658875, 0.10673139989376068, -0.0575936883687973, 0.020167997106909752, -0.003310557221993804))
# l1pe64: log1p(e) = e + e^2 Q(e), e = exp(-|x|) in [0, 1]; relative error
#   degree 19 in e; max weighted error of the rounded coefficients 9.50e-18; Horner sum/value <= 7.55
_L1PE64 = _coefs(float, (-0.4999999999999946, 0.333333333332352, -0.24999999993681335, 0.19999999791394235, -0.16666662499031504, 0.14285658897959416, -0.12499479589918423, 0.11107505747605607, -0.09981013494801493, 0.09013148143837071, -0.0808119617150593, 0.07035510373918147, -0.057501515965669825, 0.042299511874376756, -0.026743401582697637, 0.013838195458765327, -0.005542907704849577, 0.0015956708402111645, -0.00029174621119288307, 2.5328460886696224e-05))
# ndtr32: Phi(-a) = exp(-a^2/2) P(a)/Q(a), a in [0, 14.5]; relative error
#   degrees 4/5; max relative error of the rounded coefficients 2.40e-08
_NDTR32P = _coefs(np.float32, (0.5, 0.438297837972641, 0.18323679268360138, 0.04063365235924721, 0.004116331227123737))
_NDTR32Q = _coefs(np.float32, (1.0, 1.674480676651001, 1.2025110721588135, 0.4694749116897583, 0.10185990482568741, 0.01031799241900444))
# ndtr64: Phi(-a) = exp(-a^2/2) P(a)/Q(a), a in [0, 38.6]; relative error
#   degrees 10/11; max relative error of the rounded coefficients 4.01e-17
_NDTR64P = _coefs(float, (0.5, 0.7684139026892614, 0.5854779407236935, 0.28381416624804406, 0.09554572071353952, 0.023092187195038902, 0.004014806231943451, 0.0004883048457582544, 3.855131978355925e-05, 1.6318517434230281e-06, 1.6647671102165083e-08))
_NDTR64Q = _coefs(float, (1.0, 2.3347123661813844, 2.5337868323391644, 1.6879030635604086, 0.7668934701125137, 0.2493683583906375, 0.05909934818435745, 0.010160177154694663, 0.0012280891795131122, 9.667555770432287e-05, 4.090445720193427e-06, 4.1729523090895166e-08))
# END generated


# --- instances ----------------------------------------------------------------

_TEMPLATES = (_pow2, _expm1_poly, _reduce, _n, _scale, _halves, _square, _exp_sum,
              _exp, _exp_nonpos, _expm1, _log1p, _erf, _erfc, _tanh, _ndtr_tail, _ndtr,
              _ndtr_pdf, _log1pexp)


def _instantiate(width, coefs, **special):
    """Jit every template (and the type's ``special`` parts, under their
    template names) for float<width>, with globals = this module's plus the
    type's namespace: its column of the constant tables, ``coefs`` and its
    conversions. Returns the namespace (``_exp`` etc. are its entries)."""
    f32 = width == 32
    col = 0 if f32 else 1
    ftype, itype = (np.float32, np.int32) if f32 else (float, int)
    scope = dict(globals())
    scope.update({k: ftype(v[col]) for k, v in _FLOATS.items()})
    scope.update({k: itype(v[col]) for k, v in _BIT_PATTERNS.items()})
    scope.update({k: v[col] for k, v in _COUNTS.items()})
    scope.update(coefs)
    scope["_from_bits"] = _from_bits_intrinsic(
        width, types.float32 if f32 else types.float64,
        ir.FloatType() if f32 else ir.DoubleType())
    # Numba computes int32 - int32 in int64: truncating says it fits in 32
    # bits, so that LLVM keeps the later shifts in 32-bit vector lanes
    # (np.int64 of an int64 compiles to nothing)
    scope["_int"] = np.int32 if f32 else np.int64
    scope["_float"] = np.float32 if f32 else np.float64
    for name, template in [(t.__name__, t) for t in _TEMPLATES] + list(special.items()):
        f = bind(template, scope, f"{name}_f{width}")
        f.__doc__ = template.__doc__
        scope[name] = _jit(f)
    return scope


_F32 = _instantiate(32, dict(EXP=_EXP32, LOG=_LOG32, ERFA=_ERFA32, ERFB=_ERFB32, ERFC=_ERFC32,
                                 NDTR_P=_NDTR32P, NDTR_Q=_NDTR32Q, L1PE=_L1PE32),
                    _erf_tail=_erf_tail_expq, _erfc_poly=_erfc_poly_horner,
                    _erfc_dt=_erfc_dt_t)
_F64 = _instantiate(64, dict(EXP=_EXP64, LOG=_LOG64, ERFA=_ERFA64, ERFB=_ERFB64, ERFC=_ERFC64,
                                 NDTR_P=_NDTR64P, NDTR_Q=_NDTR64Q, L1PE=_L1PE64),
                    _erf_tail=_erf_tail_exp_tp, _erfc_poly=_erfc_poly_split,
                    _erfc_dt=_erfc_dt_tv)


def _register(public):
    # the jitted form of one public function (which itself evaluates with
    # :mod:`math` when called from Python)
    impl32 = _F32["_" + public.__name__]
    impl64 = _F64["_" + public.__name__]

    def f32(x):
        return impl32(x)

    def f64(x):
        return impl64(x)

    # inlined at Numba IR level: the caller calls impl32/impl64 itself, which
    # are compiled by _jit (SLP off); a wrapper of its own would be compiled
    # under the caller's setting. It holds no arithmetic to take the
    # caller's flags (see _inline).
    @overload(public, target="cpu", jit_options=_OPTIONS, inline="always")
    def typed(x):
        if x == types.float32:
            return f32
        if x == types.float64:
            return f64
        raise errors.TypingError(
            f"nbops.cpu._approx.{public.__name__}: expected a float32 or float64 "
            f"scalar, got {x}")


for _public in (exp, exp_nonpos, expm1, log1p, erf, erfc, tanh, ndtr, ndtr_pdf, log1pexp):
    _register(_public)
