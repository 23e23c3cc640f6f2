"""Tests of ``nbops.cpu._approx``: accuracy in ulps over the whole range of
float32 and float64, IEEE special values, signed zeros, overflow/underflow
thresholds, vectorization (no libm call in the loop) and on-disk caching.

References: float32 results are compared with float64 NumPy/SciPy values
(errors of ~1e-16 are invisible at float32's 6e-8). float64 results are
compared with 64-bit-mantissa (x86 long double) values: ``np.exp`` & co. on
``np.longdouble``, and for erf/erfc the functions below (a positive-term
series and the Matta-Reichel formula, 6e-19 relative error, checked against
mpmath by ``test_reference_erf_erfc`` where mpmath is installed).
"""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.special as sp
from numba import config, njit, prange, types
from numba.core.errors import TypingError

from nbops._codegen import generated
from nbops._jit import cpu_kernel
from nbops.cpu import _approx
from nbops.cpu._approx import (erf, erfc, exp, exp_nonpos, expm1, log1p, log1pexp, ndtr,
                               ndtr_pdf, tanh)

NAMES = ["exp", "expm1", "log1p", "erf", "erfc", "tanh", "ndtr", "log1pexp"]
FASTMATH = {"contract", "nsz", "arcp", "afn"}

# Max error in ulps the module documents (and these tests enforce), per
# dtype. Measured: float32 over all 2^32 inputs, exp 0.98, expm1 1.32,
# log1p 1.39, erf 1.16, erfc 3.44, tanh 2.30; ndtr 5.74, log1pexp 2.12 and
# ndtr_pdf's density ("pdf") 2.09 over every float32 of magnitude 1e-6..15
# (log1pexp 1e-9..105). float64 over 4M samples per function, exp 0.96, expm1
# 1.77, log1p 1.26, erf 1.24, erfc 3.30, tanh 2.45, ndtr 8.30, log1pexp 2.03,
# density 2.13.
BOUND = {
    np.float32: {"exp": 1.0, "expm1": 1.5, "log1p": 1.5, "erf": 1.5, "erfc": 3.5, "tanh": 2.5,
                 "ndtr": 6.0, "log1pexp": 2.5, "pdf": 2.5},
    np.float64: {"exp": 1.0, "expm1": 2.0, "log1p": 1.5, "erf": 1.5, "erfc": 3.5, "tanh": 2.5,
                 "ndtr": 9.0, "log1pexp": 2.5, "pdf": 2.5},
}

LD = np.longdouble
LD_OK = np.finfo(LD).nmant >= 63          # x86 80-bit long double


# What each evaluated name computes, ``v`` the element; "pdf" and "pdf_cdf"
# are the two results of ndtr_pdf (the CDF must equal ndtr's, checked).
_EXPRESSIONS = {name: f"{name}(v)" for name in NAMES}
_EXPRESSIONS.update(pdf="ndtr_pdf(v)[1]", pdf_cdf="ndtr_pdf(v)[0]", exp_nonpos="exp_nonpos(v)")


def _eval_source():
    # one compiled function for all (compile time), one loop per function;
    # the loops vectorize like the prange loops of real kernels (asserted
    # in test_vectorized)
    lines = ["def _eval(fid, x, out):"]
    for k, expr in enumerate(_EXPRESSIONS.values()):
        lines += [f"    {'if' if k == 0 else 'elif'} fid == {k}:",
                  "        for i in range(x.size):",
                  "            v = x[i]",
                  f"            out[i] = {expr}"]
    return "\n".join(lines) + "\n"


# cpu_kernel, not njit(cache=True): its cache key includes _approx.py, so
# that an edit there recompiles this rather than loading old code
_eval = cpu_kernel(fastmath=FASTMATH)(generated(
    _eval_source(), "_eval", {f.__name__: f for f in (exp, exp_nonpos, expm1, log1p, erf, erfc,
                                                      tanh, ndtr, log1pexp, ndtr_pdf)},
    __name__))


def run(name, x):
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _eval(list(_EXPRESSIONS).index(name), x, out)
    return out


# --- references ----------------------------------------------------------------

_SQRTPI = LD("1.772453850905516027298167483341145182798")
_PI = LD("3.141592653589793238462643383279502884197")


def _exp_minus_square(x):
    """exp(-x^2) in long double with x^2 carried exactly (x float64)."""
    hi = (x.view(np.int64) & ~np.int64((1 << 27) - 1)).view(np.float64)
    hi, lo = hi.astype(LD), (x - hi).astype(LD)
    return np.exp(-hi * hi) * np.exp(-(2 * hi * lo + lo * lo))


def _erf_series(x):
    # erf(x) = 2/sqrt(pi) x exp(-x^2) sum (2x^2)^n / (1*3*...*(2n+1)):
    # positive terms, no cancellation; for |x| <= 2
    xl = x.astype(LD)
    t2 = 2 * xl * xl
    a = np.ones_like(xl)
    s = np.ones_like(xl)
    for n in range(1, 300):
        a = a * t2 / (2 * n + 1)
        s = s + a
        if np.all(a <= s * LD(1e-22)):
            break
    return 2 / _SQRTPI * xl * _exp_minus_square(x) * s


_H = LD("0.1")
_MR = [(np.exp(-(n * _H) ** 2), (n * _H) ** 2) for n in range(1, 80)]


def _erfc_mr(x):
    # Matta-Reichel: erfc(x) = 2xh/pi exp(-x^2) (1/(2x^2) + sum_n
    # exp(-n^2h^2)/(n^2h^2 + x^2)) + 2/(1 - exp(2 pi x/h)), error ~exp(-pi^2/h^2)
    xl = x.astype(LD)
    x2 = xl * xl
    s = 1 / (2 * x2)
    for c, nh2 in _MR:
        s = s + c / (nh2 + x2)
    with np.errstate(over="ignore"):
        corr = 2 / (1 - np.exp(2 * _PI * xl / _H))
    return 2 * xl * _H / _PI * _exp_minus_square(x) * s + corr


def _exp_minus_half_square(x):
    """exp(-x^2/2) in long double with x^2 carried exactly (x float64)."""
    hi = (x.view(np.int64) & ~np.int64((1 << 27) - 1)).view(np.float64)
    hi, lo = hi.astype(LD), (x - hi).astype(LD)
    return np.exp(-hi * hi / 2) * np.exp(-(2 * hi * lo + lo * lo) / 2)


def ndtr_ref64(x):
    """Phi(x) in long double for float64 x, with z = x/sqrt(2) never rounded
    to float64 (erfc_ref64(x/sqrt 2) would carry that rounding, amplified
    by 2 z^2 in the tail)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    z = a.astype(LD) / np.sqrt(LD(2))
    z2 = z * z
    out = np.empty(x.shape, LD)
    # |x| < 1: Phi(-a) = 1/2 - erf(z)/2 by the positive series of _erf_series
    small = a < 1
    t2, term = 2 * z2[small], np.ones(int(small.sum()), LD)
    ssum = term.copy()
    for n in range(1, 80):
        term = term * t2 / (2 * n + 1)
        ssum = ssum + term
    erf = 2 / _SQRTPI * z[small] * _exp_minus_half_square(a[small]) * ssum
    out[small] = (1 - erf) / 2
    # beyond: Matta-Reichel for erfc(z), exp(-z^2) from the exact x^2
    big = ~small
    zb, z2b = z[big], z2[big]
    ssum = 1 / (2 * z2b)
    for c, nh2 in _MR:
        ssum = ssum + c / (nh2 + z2b)
    with np.errstate(over="ignore"):
        corr = 2 / (1 - np.exp(2 * _PI * zb / _H))
    out[big] = (2 * zb * _H / _PI * _exp_minus_half_square(np.minimum(a[big], 40.0)) * ssum
                + corr) / 2
    return np.where(x > 0, 1 - out, out)


def erf_ref64(x):
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    out = np.empty(x.shape, LD)
    small = a <= 2
    out[small] = _erf_series(x[small])
    big = ~small
    out[big] = np.copysign(1 - _erfc_mr(np.minimum(a[big], 30.0)), x[big])
    return out


def erfc_ref64(x):
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    out = np.empty(x.shape, LD)
    small = a < 0.5
    out[small] = 1 - _erf_series(x[small])
    big = ~small
    # past 40 the result underflows to 0 (and the formula would overflow)
    r = _erfc_mr(np.minimum(a[big], 40.0))
    out[big] = np.where(x[big] < 0, 2 - r, r)
    return out


def ref(name, x):
    """Reference values: float64 for float32 x, long double for float64 x."""
    if x.dtype == np.float32:
        xd = x.astype(np.float64)
        f = {"exp": np.exp, "expm1": np.expm1, "log1p": np.log1p, "erf": sp.erf,
             "erfc": sp.erfc, "tanh": np.tanh, "ndtr": sp.ndtr,
             "log1pexp": lambda v: np.logaddexp(0.0, v),
             "pdf": lambda v: np.exp(-v * v / 2) / np.sqrt(2 * np.pi)}[name]
        with np.errstate(all="ignore"):
            return f(xd)
    if name == "ndtr":
        return ndtr_ref64(x)
    if name == "pdf":
        return _exp_minus_half_square(np.minimum(np.abs(x), 40.0)) / np.sqrt(2 * _PI)
    if name == "log1pexp":
        xl = x.astype(LD)
        with np.errstate(all="ignore"):
            return np.maximum(xl, 0) + np.log1p(np.exp(-np.abs(xl)))
    if name == "erf":
        return erf_ref64(x)
    if name == "erfc":
        return erfc_ref64(x)
    with np.errstate(all="ignore"):
        return getattr(np, name)(x.astype(LD))


def ulp_errors(y, r, dtype):
    """|y - r| in ulps of the reference r at dtype's precision (subnormal
    ulps below the normal range). Where r rounds to a non-finite dtype value,
    0 if y is exactly that value, else inf."""
    with np.errstate(over="ignore"):
        rd = r.astype(dtype)
    a = np.abs(rd)
    # ulp of r: the spacing at |rd|, halved where r rounded up to a power of two
    ulp = np.spacing(a)
    ity = np.int32 if dtype == np.float32 else np.int64
    mant = a.view(ity) & ity((1 << np.finfo(dtype).nmant) - 1)
    below = (mant == 0) & (np.abs(r) < a) & (a > np.finfo(dtype).tiny)
    ulp = np.where(below, ulp / 2, ulp).astype(r.dtype)
    with np.errstate(invalid="ignore"):
        err = np.abs(y.astype(r.dtype) - r) / ulp
    special = ~np.isfinite(rd)
    same = (y == rd) | (np.isnan(y) & np.isnan(rd))
    err = np.where(special, np.where(same, 0.0, np.inf), err)
    return np.where(np.isnan(err), np.inf, err)


def check(name, x, bound=None):
    dtype = x.dtype.type
    bound = BOUND[dtype][name] if bound is None else bound
    y = run(name, x)
    err = ulp_errors(y, ref(name, x), dtype)
    i = int(np.argmax(err))
    assert err[i] <= bound, (
        f"{name}[{np.dtype(dtype).name}]: {err[i]:.3f} ulp > {bound} at x={x[i]!r}: "
        f"got {y[i]!r}, expected {ref(name, x[i:i + 1])[0]!r}")
    return float(err[i])


# --- float32: dense sweeps -----------------------------------------------------------

def f32_range(lo, hi, count):
    """About ``count`` float32 values in [lo, hi], evenly spaced in bit
    pattern (so equally dense in every binade, subnormals included)."""
    def bits(v):
        return int(np.float32(v).view(np.int32))
    segs = []
    if hi > 0:
        segs.append((bits(max(lo, 0.0)), bits(hi), 1))
    if lo < 0:
        segs.append((bits(max(-hi, 0.0)), bits(-lo), -1))
    total = sum(b - a for a, b, _ in segs)
    step = max(1, total // count)
    step += 1 - step % 2           # odd: every low-bit pattern of the mantissa occurs
    parts = [sign * np.arange(a, b + 1, step, dtype=np.int64).astype(np.int32).view(np.float32)
             for a, b, sign in segs]
    return np.concatenate(parts)


def f32_binade(lo):
    """Every float32 in [lo, 2*lo) (lo a power of two)."""
    ia = np.float32(lo).view(np.int32)
    return np.arange(ia, ia + (1 << 23), dtype=np.int32).view(np.float32)


SWEEPS32 = {
    "exp": (-105.0, 90.0),
    "expm1": (-40.0, 90.0),
    "log1p": (-1.0, 3.4e38),
    "erf": (-6.0, 6.0),
    "erfc": (-6.0, 11.0),
    "tanh": (-12.0, 12.0),
    "ndtr": (-15.0, 10.0),
    "log1pexp": (-110.0, 100.0),
    "pdf": (-15.0, 15.0),
}

# where the largest errors sit (found by an exhaustive run over all float32):
# every float32 of these binades [b, 2b) (negative b: (2b, b]) is checked
BINADES32 = {
    "exp": [-16.0],
    "expm1": [0.25],
    "log1p": [0.25],
    "erf": [0.5],
    "erfc": [0.5, 8.0],
    "tanh": [0.5],
    "ndtr": [-8.0, -4.0, -1.0],
    "log1pexp": [2.0 ** -9],
    "pdf": [4.0],
}


@pytest.mark.parametrize("name", NAMES + ["pdf"])
def test_float32_dense(name):
    lo, hi = SWEEPS32[name]
    check(name, f32_range(lo, hi, 2_000_000))
    for b in BINADES32[name]:
        x = f32_binade(abs(b))
        check(name, x if b > 0 else -x)
    # and far outside the interesting range: every binade, both signs
    check(name, f32_range(-3.4e38, 3.4e38, 200_000))


# --- float64: random samples -------------------------------------------------------

DOMAINS64 = {
    "exp": (-750.0, 712.0),
    "expm1": (-60.0, 712.0),
    "log1p": (-1.0, 1e308),
    "erf": (-7.0, 7.0),
    "erfc": (-7.0, 28.0),
    "tanh": (-25.0, 25.0),
    "ndtr": (-40.0, 10.0),
    "log1pexp": (-800.0, 800.0),
    "pdf": (-40.0, 40.0),
}


def f64_samples(lo, hi, n, seed):
    """Log-uniform magnitudes from 1e-300 up to the domain's ends plus
    uniform samples across the domain, clipped to [lo, hi]."""
    rng = np.random.default_rng(seed)
    m = rng.uniform(np.log2(1e-300), np.log2(max(abs(lo), abs(hi))), n)
    x = np.ldexp(rng.uniform(1, 2, n), np.floor(m).astype(int))
    x = np.where(rng.random(n) < 0.5, -x, x)
    x = np.concatenate([x, 2 * rng.uniform(lo / 2, hi / 2, n)])
    return x[(x >= lo) & (x <= hi)]


@pytest.mark.skipif(not LD_OK, reason="needs x86 80-bit long double for the float64 references")
@pytest.mark.parametrize("name", NAMES + ["pdf"])
def test_float64_random(name):
    lo, hi = DOMAINS64[name]
    seed = (NAMES + ["pdf"]).index(name)
    check(name, f64_samples(lo, hi, 150_000, seed))
    # beyond the domain (saturation, overflow, NaN for log1p)
    check(name, f64_samples(-1e308, 1e308, 5_000, 100 + seed))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ndtr_pdf_shares_ndtr(dtype):
    # the CDF half of ndtr_pdf is ndtr to the bit; the density is checked
    # as "pdf" by the sweeps above
    x = f32_range(-40, 40, 200_001).astype(dtype)
    np.testing.assert_array_equal(run("pdf_cdf", x), run("ndtr", x))
    # Phi(x) + Phi(-x) = 1 to rounding, and the density is even
    np.testing.assert_array_equal(run("pdf", -x), run("pdf", x))
    np.testing.assert_allclose(run("ndtr", x) + run("ndtr", -x), 1.0,
                               atol=2 * np.finfo(dtype).eps)


def test_reference_erf_erfc():
    mp = pytest.importorskip("mpmath")
    if not LD_OK:
        pytest.skip("needs x86 80-bit long double")
    mp.mp.dps = 40
    x = np.concatenate([np.linspace(-6, 6, 97), np.geomspace(1e-300, 1, 20),
                        np.linspace(0.45, 27.2, 61)])
    for f, fr in ((erf_ref64, mp.erf), (erfc_ref64, mp.erfc)):
        got = f(x)
        for xi, gi in zip(x, got):
            want = fr(mp.mpf(float(xi)))
            assert abs(mp.mpf(str(gi)) - want) <= abs(want) * mp.mpf("2e-18"), (f.__name__, xi)


# --- special values, signed zeros, thresholds ------------------------------------

INF, NAN = np.inf, np.nan
SPECIAL = {
    # name: [(x, expected)]; compared bit for bit (any NaN matches NaN)
    "exp": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (NAN, NAN), (-NAN, NAN),
            (1000.0, INF), (-1000.0, 0.0), (1e30, INF), (-1e30, 0.0)],
    "expm1": [(0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -1.0), (NAN, NAN),
              (1000.0, INF), (-1000.0, -1.0), (1e-40, 1e-40), (-1e-40, -1e-40)],
    "log1p": [(0.0, 0.0), (-0.0, -0.0), (-1.0, -INF), (-1.5, NAN), (-INF, NAN), (INF, INF),
              (NAN, NAN), (-2.0, NAN), (1e-40, 1e-40), (-1e-40, -1e-40)],
    "erf": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (10.0, 1.0),
            (-10.0, -1.0), (1e-40, None), (-1e-40, None)],
    "erfc": [(0.0, 1.0), (-0.0, 1.0), (INF, 0.0), (-INF, 2.0), (NAN, NAN), (30.0, 0.0),
             (-30.0, 2.0), (1e30, 0.0), (-1e30, 2.0)],
    "tanh": [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN), (30.0, 1.0),
             (-30.0, -1.0), (1e-40, 1e-40), (-1e-40, -1e-40)],
    "ndtr": [(0.0, 0.5), (-0.0, 0.5), (INF, 1.0), (-INF, 0.0), (NAN, NAN), (40.0, 1.0),
             (-40.0, 0.0), (1e30, 1.0), (-1e30, 0.0), (1e-40, 0.5)],
    "log1pexp": [(INF, INF), (-INF, 0.0), (NAN, NAN), (1000.0, 1000.0), (-1000.0, 0.0),
                 (1e30, 1e30), (-1e30, 0.0), (0.0, None)],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", NAMES)
def test_special_values(name, dtype):
    cases = SPECIAL[name]
    x = np.array([c[0] for c in cases], dtype)
    want = np.array([np.nan if c[1] is None else c[1] for c in cases], dtype)
    got = run(name, x)
    known = np.array([c[1] is not None for c in cases])
    for xi, gi, wi, k in zip(x, got, want, known):
        if not k:
            continue
        if np.isnan(wi):
            assert np.isnan(gi), (name, xi, gi)
        else:
            assert gi.tobytes() == wi.tobytes(), (name, xi, gi, wi)
    # odd functions stay odd to the bit, and keep the sign of tiny arguments
    if name in ("erf", "tanh", "expm1", "log1p"):
        tiny = np.array([np.finfo(dtype).smallest_subnormal, np.finfo(dtype).tiny], dtype)
        for v in (tiny, -tiny):
            assert np.all(np.signbit(run(name, v)) == np.signbit(v)), (name, v)
    if name == "ndtr":
        # the density too: 0 at +-inf and far out, NaN for NaN
        x = np.array([INF, -INF, 40.0, -40.0, NAN], dtype)
        got = run("pdf", x)
        assert np.array_equal(got[:4], np.zeros(4, dtype)) and np.isnan(got[4])
    if name in ("erf", "tanh"):
        x = f32_range(-8, 8, 20_001).astype(dtype)
        np.testing.assert_array_equal(run(name, -x), -run(name, x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["exp", "expm1"])
def test_overflow_threshold(name, dtype):
    # the last finite result and the first inf are where the correctly
    # rounded function puts them
    t = np.log(np.finfo(dtype).max)
    base = np.array([t], dtype).view(np.int32 if dtype == np.float32 else np.int64)[0]
    bits = base + np.arange(-3000, 3000, dtype=base.dtype)
    x = bits.view(dtype)
    r = ref(name, x).astype(dtype) if dtype == np.float64 else \
        np.exp(x.astype(np.float64)).astype(dtype)
    y = run(name, x)
    np.testing.assert_array_equal(np.isinf(y), np.isinf(r))
    assert np.isinf(y).any() and not np.isinf(y).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["exp", "erfc", "ndtr"])
def test_gradual_underflow(name, dtype):
    # results all through the subnormal range to 0, each within 1 (exp) or 2
    # (erfc) subnormal ulps of the reference, and exactly 0 beyond; ndtr
    # within its normal-range bound (subnormal ulps are the ulps of the
    # smallest normal binade, where its relative error still shows)
    fi = np.finfo(dtype)
    lo_res = float(fi.smallest_subnormal) / 2
    if name == "exp":
        a, b = np.log(float(fi.smallest_subnormal)) - 2, np.log(float(fi.tiny)) + 1
    elif name == "ndtr":
        a, b = (-14.4, -12.9) if dtype == np.float32 else (-38.6, -37.4)
    else:
        a, b = 8.5 if dtype == np.float32 else 25.5, 10.2 if dtype == np.float32 else 27.4
    x = np.linspace(a, b, 200_001).astype(dtype)
    y = run(name, x)
    r = ref(name, x)
    sub = np.abs(r) < float(fi.tiny)
    assert sub.sum() > 1000
    err = np.abs(y[sub].astype(r.dtype) - r[sub]) / float(fi.smallest_subnormal)
    assert err.max() <= {"exp": 1.0, "erfc": 2.0}.get(name, BOUND[dtype][name])
    assert np.all(y[np.abs(r) < lo_res / 2] == 0)
    assert np.any((y > 0) & (y < fi.tiny))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_nonpos(dtype):
    # exp's accuracy wherever the result is normal (the documented domain
    # x <= 0, and on up to where 2^n stops being normal), exactly 0 below
    # the normal range but for the last rounding step, and the specials
    fi = np.finfo(dtype)
    lo = float(np.log(fi.tiny))
    hi = 88.3 if dtype == np.float32 else 709.4
    if dtype == np.float32:
        x = np.concatenate([f32_range(lo, hi, 2_000_000), -f32_binade(16.0)])
    else:
        x = f64_samples(lo, hi, 300_000, 7)
    y = run("exp_nonpos", x)
    err = ulp_errors(y, ref("exp", x), dtype)
    i = int(np.argmax(err))
    assert err[i] <= 1.0, (x[i], y[i], err[i])
    # below: results between 0 and the smallest normal, and 0 past the step
    # of 2^n into the subnormals (x < (-BIAS - 1/2) ln 2)
    under = np.linspace(lo - 30, lo, 100_000, endpoint=False).astype(dtype)
    y = run("exp_nonpos", under)
    assert np.all((y >= 0) & (y < fi.tiny))
    step = -(fi.maxexp - 1 + 0.5) * np.log(2)
    assert np.all(y[under < step - 1e-3] == 0)
    special = np.array([0.0, -0.0, -np.inf, -1e30, -fi.max, np.nan, -np.nan], dtype)
    got = run("exp_nonpos", special)
    np.testing.assert_array_equal(got[:5], [1, 1, 0, 0, 0])
    assert np.isnan(got[5:]).all()
    assert exp_nonpos(dtype(-1.5)) == dtype(np.exp(-1.5))   # Python fallback
    assert isinstance(exp_nonpos(dtype(-1.5)), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_payloads_and_signs(dtype):
    # NaN with every kind of payload (quiet, signalling, negative) stays NaN:
    # the clamps are written as selects that NaN falls through
    ity = np.int32 if dtype == np.float32 else np.int64
    if dtype == np.float32:
        pats = [0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0xFFC00000, 0xFF800001, 0x7FFFFFFF]
    else:
        pats = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FF7FFFFFFFFFFFF,
                0xFFF8000000000000, 0xFFF0000000000001, 0x7FFFFFFFFFFFFFFF]
    x = np.array(pats, dtype=np.uint64 if ity == np.int64 else np.uint32).view(dtype)
    assert np.isnan(x).all()
    for name in NAMES + ["pdf", "exp_nonpos"]:
        assert np.isnan(run(name, x)).all(), name


# --- types, Python fallback, compilation -------------------------------------------

@pytest.mark.parametrize("name", NAMES + ["ndtr_pdf", "exp_nonpos"])
def test_types(name):
    # float32 in, float32 out (computed in float32; ndtr_pdf: a pair);
    # float64 likewise; anything else is a typing error
    f = getattr(_approx, name)

    @njit
    def call(x):
        return f(x)

    call(np.float32(0.5))
    call(0.5)
    sigs = {s.args[0]: s.return_type for s in call.nopython_signatures}
    out = (lambda t: types.UniTuple(t, 2)) if name == "ndtr_pdf" else (lambda t: t)
    assert sigs == {types.float32: out(types.float32), types.float64: out(types.float64)}
    for bad in (1, 1j, True):
        with pytest.raises(TypingError):
            call(bad)


def test_ndtr_pdf_fallback():
    # un-jitted: math, the argument's type kept
    c32, d32 = ndtr_pdf(np.float32(0.3))
    assert isinstance(c32, np.float32) and isinstance(d32, np.float32)
    c, d = ndtr_pdf(-2.0)
    assert c == ndtr(-2.0) and abs(d - 0.05399096651318806) < 1e-17
    assert ndtr_pdf(np.inf) == (1.0, 0.0) and np.isnan(ndtr_pdf(np.nan)[1])


@pytest.mark.parametrize("name", NAMES)
def test_python_fallback(name):
    # un-jitted (CUDA simulator, debugging): math under IEEE conventions,
    # the argument's type kept, no exceptions
    f = getattr(_approx, name)
    x32 = np.float32(0.3)
    assert isinstance(f(x32), np.float32)
    assert isinstance(f(0.3), float)
    assert abs(f(0.3) - float(ref(name, np.array([0.3]))[0])) <= 1e-15
    for x, want in SPECIAL[name]:
        if want is None:
            continue
        got = f(x)
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == want and np.signbit(got) == np.signbit(want), (x, got, want)


def _gufunc_asm(kernel):
    """The assembly of the functions holding a prange kernel's loop (the
    gufunc and its wrapper, into which LLVM may have inlined it)."""
    asm = kernel.inspect_asm(kernel.signatures[0])
    bodies = []
    for m in re.finditer(r"^\s*\.type\s+([^,\s]+),@function", asm, re.M):
        fname = m.group(1)
        if "parfor_gufunc" in fname:
            start = asm.index("\n" + fname + ":", m.end())
            bodies.append(asm[start:asm.index(".Lfunc_end", start)])
    assert bodies, "no parfor gufunc in the assembly"
    return "\n".join(bodies)


def _math_calls(body):
    """Math functions or nbops helpers the loop's code refers to: libm
    (``expf``, ``erf``, ``log1p``...) or a non-inlined ``_approx`` function.
    Call targets are loaded with ``movabsq $symbol`` or called directly; the
    wrapper's exception path (``PyErr_*``, ``numba_gil_*``) is allowed."""
    syms = set(re.findall(r"\$([A-Za-z_][\w.$]*)", body))
    syms |= set(re.findall(r"^\s*call\w*\s+([A-Za-z_][\w.$@]*)", body, re.M))
    return {s for s in syms if "parfor_gufunc" not in s
            and re.search(r"(?i)exp|erf|log|tanh|approx", s)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vectorized(dtype):
    # A prange kernel over all the functions, compiled fresh: its loop body
    # must contain packed (ymm/zmm) FMAs and divisions, and no call to a
    # math function (libm or a helper left out of line).
    @njit(parallel=True, fastmath=FASTMATH, cache=False)
    def kernel(x, out):
        for i in prange(x.size):
            v = x[i]
            out[i] = (exp(v) + expm1(v) + log1p(v) + erf(v) + erfc(v) + tanh(v) + ndtr(v)
                      + log1pexp(v) + ndtr_pdf(v)[1] + exp_nonpos(-v))

    x = np.linspace(0, 1, 64).astype(dtype)
    # with the SLP vectorizer on, as nbops's cpu_kernel compiles: it must
    # not pack the helpers' code into short vectors (a loop holding vector
    # code is not vectorized; float64 erfc's split Horner once was)
    saved = config.SLP_VECTORIZE
    config.SLP_VECTORIZE = 1
    try:
        kernel(x, np.empty_like(x))
    finally:
        config.SLP_VECTORIZE = saved
    body = _gufunc_asm(kernel)
    suffix = "ps" if dtype == np.float32 else "pd"
    packed = re.findall(rf"vfn?m(?:add|sub)\d+{suffix}\s+[^\n]*%[yz]mm", body)
    assert len(packed) >= 40, len(packed)
    assert re.search(rf"vdiv{suffix}\s+[^\n]*%[yz]mm", body)
    assert not _math_calls(body), _math_calls(body)
    if dtype == np.float32:
        # computed in float32 throughout: a Python float in a template (in
        # Numba float32 * 2.0 is float64) shows as conversions and pd/sd
        # arithmetic, at half the vector width
        wide = re.findall(r"\bv(?:add|sub|mul|div|fn?m(?:add|sub)\d*|cvt\w+2)[ps]d\b", body)
        assert not wide, sorted(set(wide))


def test_cache_reused_in_second_process(tmp_path):
    # a cache=True kernel using the functions is written to disk by one
    # process and loaded, not recompiled, by the next
    mod = tmp_path / "approx_cache_user.py"
    mod.write_text(textwrap.dedent("""
        import numpy as np
        from numba import njit
        from nbops.cpu._approx import exp, erf

        @njit(cache=True, fastmath={"contract", "nsz", "arcp", "afn"})
        def kernel(x, out):
            for i in range(x.size):
                out[i] = exp(-abs(x[i])) + erf(x[i])

        x = np.linspace(-3, 3, 1001).astype(np.float32)
        out = np.empty_like(x)
        kernel(x, out)
        want = np.exp(-np.abs(x.astype(np.float64))) + [math.erf(v) for v in x.tolist()]
        assert np.abs(out - want).max() < 1e-6
        print("hits", sum(kernel.stats.cache_hits.values()),
              "misses", sum(kernel.stats.cache_misses.values()))
    """).replace("import numpy as np", "import math\nimport numpy as np", 1))
    root = os.path.dirname(os.path.dirname(os.path.abspath(_approx.__file__)))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(root), str(tmp_path)]))
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", "import approx_cache_user"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout.split())
    assert outs[0][1] == "0", outs      # first process: compiled
    assert outs[1][1] != "0", outs      # second: loaded from the cache


def test_estrin_matches_horner():
    # the generated Estrin evaluation, for every tuple length (odd and even
    # leftovers at each level), against Horner's rule
    from nbops.cpu._approx import _estrin, _horner

    @njit
    def both(c, x):
        return _estrin(c, x), _horner(c, x)

    for n in range(1, 14):
        c = tuple(float(k % 5 - 2) / (k + 1) for k in range(n))
        for x in (0.0, 0.3, -0.7, 1.9):
            e, h = both(c, x)
            assert abs(e - h) <= 1e-13 * max(1.0, abs(h)), (n, x, e, h)
