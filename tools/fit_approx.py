"""Fit the polynomial coefficients used by ``nbops/cpu/_approx.py``.

Usage::

    python tools/fit_approx.py            # every fit, prints a Python block
    python tools/fit_approx.py erfc64     # one fit (names below)
    python tools/fit_approx.py --list

Needs ``mpmath`` (a development tool only: nbops itself and its tests do not).
The output is deterministic (fixed nodes, fixed iteration counts, no random
numbers): the printed block is pasted between the ``BEGIN/END generated``
markers of ``_approx.py``.

Method
------
Each fit is a weighted minimax polynomial ``p`` of given degree in a variable
``v`` on ``[lo, hi]``, minimising ``max |w(v) * (p(v) - f(v))|``, where ``w``
turns the difference into the error that matters for the final result
(relative error of the function, or absolute error where the result is
``1 - small``). It is computed with Lawson's algorithm (iteratively
reweighted least squares, which converges to the minimax solution) on 20 to
25 Chebyshev points per coefficient, in a Chebyshev basis for conditioning.
The least-squares corrections are solved in float64 against residuals
evaluated with mpmath at 34 digits (mixed-precision iterative refinement), so
the coefficients are accurate far beyond float64 before they are rounded.
The result is converted to monomial coefficients in ``v`` (Horner form).
Then the coefficients are rounded to the target type one at a time, constant
term first, refitting the remaining ones (monomial basis, same method) after
each rounding: this recovers most of what plain rounding loses (for the
float32 erfc, 2.0e-8 -> 7.8e-9); the better of the two results is kept. The printed error is that of the rounded
coefficients, evaluated exactly,
on a grid 8 times denser than the fit's nodes. Rounding errors of the
evaluation itself are not included: ``tests/test_approx.py`` measures the
end-to-end error.

The fits
--------
``exp32/exp64``  q(r) = (expm1(r) - r) / r^2 on |r| <= 0.35 (just over
    ln2/2, the reduced range plus rounding slack), weight r^2/|expm1(r)|:
    the relative error of expm1(r) = r + r^2 q(r); exp uses 1 + that.
``log32/log64``  P(z), z = s^2, s = f/(2+f), f in [sqrt(1/2)-1, sqrt(2)-1]:
    log1p(f) = 2 atanh(s) = 2s + s*R with R = z*P(z) (fdlibm's form), weight
    z/2: the relative error of log1p(f).
``erfa32/erfa64``  y(s) = erf(x)/x - 1, s = x^2, |x| <= 0.84375: erf(x) =
    x + x*y; absolute error of y ~ relative error of erf.
``erfb32``  Q(z) = log(erfc(z)) on [0.84375, 3.95], weight erfc(z): float32
    erf(z) = 1 - exp(Q(z)) needs erfc to an absolute 2^-26.
``erfb64``  P(v), v = 2t - 1, t = 3/(3+z), z in [0.84375, 5.95]: erfc(z) =
    exp(-z^2) t P(v), weight erfc(z) (absolute error, for float64
    erf = 1 - erfc).
``erfc32/erfc64``  P(v), v = 2t - 1, t = 3/(3+z), z in [0, 10.1] / [0, 27.3]
    (past the underflow to zero): erfc(z) = exp(-z^2) t P(v), relative
    error. The variable v (in [-0.8, 1]) rather than t keeps the monomial
    coefficients small, so evaluation rounding is not amplified. (A rational
    N(z)/D(z) in the exact z, all coefficients positive, needs fewer
    operations in float32, but Horner's rounding errors then add up at large
    z: 5.5 ulp against 3.)
``l1pe32/l1pe64``  Q(e) with log1p(e) = e + e^2 Q(e), e = exp(-|x|) in [0, 1]:
    log(1 + exp(x)) without a division; relative error of log1p(e).
``ndtr32/ndtr64``  rational P(a)/Q(a), degrees 4/5 and 10/11, all
    coefficients positive, Q(0) = 1: Phi(-a) = exp(-a^2/2) P(a)/Q(a) on
    [0, 14.5] / [0, 38.6] (past the underflow of x Phi(x)); relative error.
    One division, no rounded intermediate variable to amplify (unlike t
    above), and the normal CDF is fitted in x itself, so x/sqrt(2) is never
    rounded. Fitted by :func:`rational_minimax`.
``softplus64`` (a table, for ``nbops/cpu/_piecewise.py``)  g(a) =
    log1p(exp(-a)) on the 16 intervals [j, j+1), j = 0..15: one polynomial
    of degree 14 in t = a - (j + 1/2) per interval, relative error, each
    fitted by :func:`minimax` (Chebyshev interpolation gives 1.3e-17 at
    j = 0, degree 14; degree 13 only 1.9e-16). Centred, so that Horner's
    partial sums stay within e^(1/2) of the value (1 at j = 0). Run by
    name only (``python tools/fit_approx.py softplus64``).
"""

import sys

import numpy as np

try:
    import mpmath as mp
except ImportError:  # pragma: no cover - development tool
    sys.exit("tools/fit_approx.py needs mpmath (pip install mpmath)")

mp.mp.dps = 34


def _cheb_points(lo, hi, n):
    # Chebyshev points of the second kind (ends included), ascending
    return [(lo + hi) / 2 - (hi - lo) / 2 * mp.cos(mp.pi * k / (n - 1)) for k in range(n)]


def _clenshaw(c, x):
    b1 = b2 = mp.mpf(0)
    for ck in reversed(c[1:]):
        b1, b2 = 2 * x * b1 - b2 + ck, b1
    return x * b1 - b2 + c[0]


def _cheb_to_monomial(c, a, b):
    """Coefficients in v of sum c_k T_k(a v + b)."""
    def mul(p, q):
        r = [mp.mpf(0)] * (len(p) + len(q) - 1)
        for i, pi in enumerate(p):
            for j, qj in enumerate(q):
                r[i + j] += pi * qj
        return r

    T = [[mp.mpf(1)], [b, a]]
    for _ in range(2, len(c)):
        t2 = mul([2 * b, 2 * a], T[-1])
        prev = T[-2] + [mp.mpf(0)] * (len(t2) - len(T[-2]))
        T.append([x - y for x, y in zip(t2, prev)])
    mono = [mp.mpf(0)] * len(c)
    for ck, Tk in zip(c, T):
        for i, t in enumerate(Tk):
            mono[i] += ck * t
    return mono


def _lawson(vs, fv, wv, cols, fixed, c, iters, u=None):
    """Lawson iterations for the free coefficients ``c`` of the columns
    ``cols`` (float64 matrix of the basis at the nodes), with ``fixed(c, k)``
    giving the polynomial's value at node k in mpmath."""
    n = len(vs)
    scale = np.abs(cols).max(axis=0)
    cols = cols / scale
    u = np.full(n, 1.0 / n) if u is None else u
    for it in range(iters):
        for _ in range(3 if it == 0 else 1):
            res = np.array([float(fv[k] - fixed(c, k)) for k in range(n)])
            sw = np.sqrt(u) * wv
            d = np.linalg.lstsq(cols * sw[:, None], res * sw, rcond=None)[0] / scale
            c = [ci + mp.mpf(float(di)) for ci, di in zip(c, d)]
        err = np.abs(np.array([float(fv[k] - fixed(c, k)) for k in range(n)])) * wv
        u = u * (err + 1e-300)
        u /= u.sum()
    return c, u


def minimax(f, w, lo, hi, deg, dtype, per_coef=22, iters=40):
    """Weighted minimax polynomial of degree ``deg`` (monomial coefficients,
    constant first) for ``f`` on ``[lo, hi]`` with weight ``w``, whose
    coefficients are representable in ``dtype``.

    A plain minimax fit rounded to the target precision loses much of its
    accuracy (the rounding errors of the coefficients add up). So the
    coefficients are rounded one at a time, constant term first, and after
    each rounding the remaining ones are refitted (a greedy version of the
    lattice-reduction approach of Brisebarre and Chevillard)."""
    lo, hi = mp.mpf(lo), mp.mpf(hi)
    n = max(per_coef * (deg + 1), 300)
    vs = _cheb_points(lo, hi, n)
    fv = [f(v) for v in vs]
    wv = np.array([float(w(v)) for v in vs])
    # unconstrained fit in the Chebyshev basis (well conditioned)
    a, b = 2 / (hi - lo), -(hi + lo) / (hi - lo)
    xs = [a * v + b for v in vs]
    B = np.polynomial.chebyshev.chebvander(np.array([float(x) for x in xs]), deg)
    c, u = _lawson(vs, fv, wv, B, lambda c, k: _clenshaw(c, xs[k]),
                   [mp.mpf(0)] * (deg + 1), iters)
    mono = plain_mono = _cheb_to_monomial(c, a, b)
    rnd = lambda x: mp.mpf(float(np.dtype(dtype).type(float(x))))
    powers = [[v ** j for j in range(deg + 1)] for v in vs]
    V = np.array([[float(pj) for pj in row] for row in powers])
    done = []
    for k in range(deg + 1):
        done.append(rnd(mono[k]))
        if k == deg:
            break
        head = [sum(cj * powers[i][j] for j, cj in enumerate(done)) for i in range(n)]
        free, u = _lawson(
            vs, fv, wv, V[:, k + 1:],
            lambda c, i: head[i] + sum(cj * powers[i][k + 1 + j] for j, cj in enumerate(c)),
            mono[k + 1:], max(iters // 2, 10), u)
        mono = done + free
    greedy = [float(x) for x in done]
    # keep plain rounding where it happens to be better (the monomial refits
    # are ill-conditioned at high degree)
    plain = [float(rnd(x)) for x in plain_mono]
    err = lambda cs: max(abs(float(fv[i] - sum(mp.mpf(c) * powers[i][j] for j, c in enumerate(cs))))
                         * wv[i] for i in range(n))
    return greedy if err(greedy) <= err(plain) else plain


def rational_minimax(f, lo, hi, n, m, dtype, per_coef=12, iters=60):
    """Relative-error minimax rational ``P/Q`` (degrees ``n``/``m``,
    ``Q(0) = 1``) for ``f > 0`` on ``[lo, hi]``; returns the monomial
    coefficients of P and Q rounded to ``dtype``.

    Sanathanan-Koerner iterations (the linearised error ``(f Q' - P') /
    (f Q)`` with the previous Q) under Lawson's reweighting, which drives
    the weighted least-squares solution to the minimax one. As in
    :func:`minimax`, each correction is solved in float64 against residuals
    evaluated with mpmath, in a basis scaled to [0, 1], with no singular
    value cut-off (the default one stalls the refinement near 1e-13); the
    best iterate whose coefficients are all positive is kept (near the
    optimum, solutions with a cancelling sign pair in the leading terms fit
    about as well but evaluate worse)."""
    count = max(per_coef * (n + m + 2), 400)
    vs = _cheb_points(mp.mpf(lo), mp.mpf(hi), count)
    fv = [f(v) for v in vs]
    scale = mp.mpf(hi)
    powers = [[(v / scale) ** j for j in range(max(n, m) + 1)] for v in vs]
    V = np.array([[float(x) for x in row] for row in powers])
    p, q = [mp.mpf(0)] * (n + 1), [mp.mpf(1)] + [mp.mpf(0)] * m
    u, best = np.full(count, 1.0 / count), None
    for it in range(iters):
        pv = [mp.fsum(c * row[j] for j, c in enumerate(p)) for row in powers]
        qv = [mp.fsum(c * row[j] for j, c in enumerate(q)) for row in powers]
        res = np.array([float((fv[i] * qv[i] - pv[i]) / (fv[i] * qv[i])) for i in range(count)])
        err = float(np.max(np.abs(res)))
        # positive coefficients only: Horner's partial sums then never cancel
        if min(p[1:] + q) > 0 and (best is None or err < best[0]):
            best = (err, list(p), list(q))
        if it:
            u = u * (np.abs(res) + 1e-300)
            u /= u.sum()
        fq = np.array([float(fv[i] * qv[i]) for i in range(count)])
        qf = np.array([float(x) for x in qv])
        A = np.hstack([V[:, :n + 1] / fq[:, None], -V[:, 1:m + 1] / qf[:, None]])
        colmax = np.abs(A).max(axis=0)
        sw = np.sqrt(u)
        d = np.linalg.lstsq(A / colmax * sw[:, None], res * sw, rcond=1e-22)[0] / colmax
        p = [c + mp.mpf(float(x)) for c, x in zip(p, d[:n + 1])]
        q = [q[0]] + [c + mp.mpf(float(x)) for c, x in zip(q[1:], d[n + 1:])]
    if best is None:
        raise RuntimeError("no iterate with positive coefficients")
    _, p, q = best
    # round Q, then refit P (linear now) to the rounded Q before rounding it:
    # recovers much of what rounding Q costs (float32 3.2e-8 -> see output)
    q = [mp.mpf(c) * scale ** j for j, c in enumerate(rounded([c / scale ** j
                                                              for j, c in enumerate(q)], dtype))]
    qv = [mp.fsum(c * row[j] for j, c in enumerate(q)) for row in powers]
    fq = np.array([float(fv[i] * qv[i]) for i in range(count)])
    cols = V[:, :n + 1] / fq[:, None]
    colmax = np.abs(cols).max(axis=0)
    for _ in range(iters):
        pv = [mp.fsum(c * row[j] for j, c in enumerate(p)) for row in powers]
        res = np.array([float((fv[i] * qv[i] - pv[i]) / (fv[i] * qv[i])) for i in range(count)])
        u = u * (np.abs(res) + 1e-300)
        u /= u.sum()
        sw = np.sqrt(u)
        d = np.linalg.lstsq(cols / colmax * sw[:, None], res * sw, rcond=1e-22)[0] / colmax
        p = [c + mp.mpf(float(x)) for c, x in zip(p, d)]
    return (rounded([c / scale ** j for j, c in enumerate(p)], dtype),
            rounded([c / scale ** j for j, c in enumerate(q)], dtype))


def rounded(coefs, dtype):
    return [float(np.dtype(dtype).type(float(c))) for c in coefs]


def max_error(f, w, lo, hi, coefs, n):
    lo, hi = mp.mpf(lo), mp.mpf(hi)
    worst = 0.0
    for k in range(n + 1):
        v = lo + (hi - lo) * k / n
        p = mp.mpf(0)
        for cc in reversed(coefs):
            p = p * v + mp.mpf(cc)
        worst = max(worst, float(abs((p - f(v)) * w(v))))
    return worst


# --- the functions ----------------------------------------------------------

def _erfcx(z):
    return mp.erfc(z) * mp.exp(z * z)


def _q_exp(r):
    return (mp.expm1(r) - r) / r ** 2 if r != 0 else mp.mpf(1) / 2


def _w_exp(r):
    return r * r / abs(mp.expm1(r)) if r != 0 else mp.mpf(0)


_S_MAX = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)   # |s| for m in [sqrt(1/2), sqrt(2)]


def _p_log(z):
    if z == 0:
        return mp.mpf(2) / 3
    s = mp.sqrt(z)
    return (2 * mp.atanh(s) - 2 * s) / (s * z)


def _y_erf(s):
    if s == 0:
        return 2 / mp.sqrt(mp.pi) - 1
    x = mp.sqrt(s)
    return mp.erf(x) / x - 1


def _t_form(K):
    # P(v) with erfc(z) = exp(-z^2) * t * P(v), t = K/(K+z), v = 2t - 1, i.e.
    # z = K/t - K. P in v (centred on the interval) rather than in t keeps the
    # monomial coefficients small: Horner's partial sums stay near the value
    def f(v):
        t = (1 + v) / 2
        return _erfcx(K / t - K) / t
    return f


def _w_abs_t(K):
    # weight turning an error in P(v) into an absolute error of erfc(z)
    def w(v):
        t = (1 + v) / 2
        return mp.erfc(K / t - K) / _erfcx(K / t - K) * t
    return w


def _w_rel_t(K):
    return lambda v: 1 / _t_form(K)(v)


def _ndtr_scaled(a):
    # Phi(-a) exp(a^2/2) = erfcx(a/sqrt 2) / 2
    return mp.erfc(a / mp.sqrt(2)) * mp.exp(a * a / 2) / 2


def _q_l1pe(e):
    return (mp.log1p(e) - e) / e ** 2 if e != 0 else mp.mpf(-0.5)


def _w_l1pe(e):
    return e ** 2 / mp.log1p(e) if e != 0 else mp.mpf(0)


def _v(z):
    return 2 * K / (K + mp.mpf(z)) - 1


K = 3  # t = 3/(3+z)

# name: (dtype, f, weight, lo, hi, degree, variable, what)
FITS = {
    "exp32": (np.float32, _q_exp, _w_exp, -0.35, 0.35, 5, "r",
              "expm1(r) = r + r^2 q(r), |r| <= 0.35; relative error of expm1(r)"),
    "exp64": (np.float64, _q_exp, _w_exp, -0.35, 0.35, 10, "r",
              "expm1(r) = r + r^2 q(r), |r| <= 0.35; relative error of expm1(r)"),
    "log32": (np.float32, _p_log, lambda z: z / 2, 0, 0.0295, 2, "z",
              "log1p(f) = 2s + s z P(z), z = s^2 <= 0.0295; relative error"),
    "log64": (np.float64, _p_log, lambda z: z / 2, 0, 0.0295, 6, "z",
              "log1p(f) = 2s + s z P(z), z = s^2 <= 0.0295; relative error"),
    "erfa32": (np.float32, _y_erf, lambda s: 1, 0, 0.84375 ** 2, 5, "s",
               "erf(x) = x + x y(x^2), |x| <= 0.84375; absolute error of y"),
    "erfa64": (np.float64, _y_erf, lambda s: 1, 0, 0.84375 ** 2, 10, "s",
               "erf(x) = x + x y(x^2), |x| <= 0.84375; absolute error of y"),
    "erfb32": (np.float32, lambda z: mp.log(mp.erfc(z)), mp.erfc, 0.84375, 3.95, 6, "z",
               "erfc(z) = exp(Q(z)), z in [0.84375, 3.95]; absolute error of erfc"),
    "erfb64": (np.float64, _t_form(K), _w_abs_t(K), _v(5.95), _v(0.84375), 12, "v",
               "erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0.84375, 5.95]; "
               "absolute error of erfc"),
    "erfc32": (np.float32, _t_form(K), _w_rel_t(K), _v(10.1), 1, 9, "v",
               "erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0, 10.1]; relative error"),
    "erfc64": (np.float64, _t_form(K), _w_rel_t(K), _v(27.3), 1, 22, "v",
               "erfc(z) = exp(-z^2) t P(v), t = 3/(3+z), v = 2t-1, z in [0, 27.3]; relative error"),
    "l1pe32": (np.float32, _q_l1pe, _w_l1pe, 0, 1, 8, "e",
               "log1p(e) = e + e^2 Q(e), e = exp(-|x|) in [0, 1]; relative error"),
    "l1pe64": (np.float64, _q_l1pe, _w_l1pe, 0, 1, 19, "e",
               "log1p(e) = e + e^2 Q(e), e = exp(-|x|) in [0, 1]; relative error"),
}

# name: (dtype, f, lo, hi, degree of P, degree of Q, what); relative error
RATIONAL_FITS = {
    "ndtr32": (np.float32, _ndtr_scaled, 0, 14.5, 4, 5,
               "Phi(-a) = exp(-a^2/2) P(a)/Q(a), a in [0, 14.5]; relative error"),
    "ndtr64": (np.float64, _ndtr_scaled, 0, 38.6, 10, 11,
               "Phi(-a) = exp(-a^2/2) P(a)/Q(a), a in [0, 38.6]; relative error"),
}


def _softplus_piece(j):
    return lambda t: mp.log1p(mp.exp(-(j + mp.mpf(0.5) + t)))


# name: (dtype, f(j) -> f(t), intervals, degree, what); relative error, t in
# [-1/2, 1/2]; printed as one tuple of coefficients per interval
TABLE_FITS = {
    "softplus64": (np.float64, _softplus_piece, 16, 14,
                   "log1p(exp(-a)) on [j, j+1), j = 0..15, polynomial in t = a - j - 1/2; "
                   "relative error"),
}


def run_table(name):
    dtype, piece, count, deg, what = TABLE_FITS[name]
    rows, worst = [], 0.0
    for j in range(count):
        f = piece(j)
        w = lambda t, f=f: 1 / f(t)
        rows.append(minimax(f, w, -0.5, 0.5, deg, dtype, per_coef=12, iters=20))
        worst = max(worst, max_error(f, w, -0.5, 0.5, rows[-1], 1000))
    print(f"# {name}: {what}")
    print(f"#   degree {deg}; max relative error of the rounded coefficients {worst:.2e}")
    print(f"_{name.upper()} = (")
    for row in rows:
        print("    (" + ", ".join(repr(c) for c in row) + "),")
    print(")")
    sys.stdout.flush()


def _body(coefs, dtype):
    if dtype is np.float32:
        return "np.float32", ", ".join(repr(float(np.float32(c))) for c in coefs)
    return "float", ", ".join(repr(c) for c in coefs)


def run_rational(name):
    dtype, f, lo, hi, n, m, what = RATIONAL_FITS[name]
    p, q = rational_minimax(f, lo, hi, n, m, dtype)
    worst = 0.0
    for k in range(4001):
        a = mp.mpf(lo) + (mp.mpf(hi) - lo) * k / 4000
        pa = mp.fsum(mp.mpf(c) * a ** j for j, c in enumerate(p))
        qa = mp.fsum(mp.mpf(c) * a ** j for j, c in enumerate(q))
        worst = max(worst, float(abs(pa / qa / f(a) - 1)))
    print(f"# {name}: {what}")
    print(f"#   degrees {n}/{m}; max relative error of the rounded coefficients {worst:.2e}")
    for part, coefs in (("P", p), ("Q", q)):
        tname, body = _body(coefs, dtype)
        print(f"_{name.upper()}{part} = _coefs({tname}, ({body}))")
    sys.stdout.flush()


def run(name):
    if name in RATIONAL_FITS:
        return run_rational(name)
    if name in TABLE_FITS:
        return run_table(name)
    dtype, f, w, lo, hi, deg, var, what = FITS[name]
    coefs = minimax(f, w, lo, hi, deg, dtype)
    err = max_error(f, w, lo, hi, coefs, 8 * 22 * (deg + 1))
    # growth of Horner's partial sums relative to the value: the factor by
    # which evaluation rounding errors can be amplified (1 is ideal)
    vv = np.linspace(float(lo), float(hi), 2001)
    absum = sum(abs(c) * np.abs(vv) ** k for k, c in enumerate(coefs))
    val = np.abs(np.polynomial.polynomial.polyval(vv, coefs))
    amp = float(np.max(absum / val))
    tname, body = _body(coefs, dtype)
    print(f"# {name}: {what}")
    print(f"#   degree {deg} in {var}; max weighted error of the rounded coefficients "
          f"{err:.2e}; Horner sum/value <= {amp:.2f}")
    print(f"_{name.upper()} = _coefs({tname}, ({body}))")
    sys.stdout.flush()


def main(argv):
    if "--list" in argv:
        for k, v in {**FITS, **RATIONAL_FITS, **TABLE_FITS}.items():
            print(f"{k:8s} {v[-1]}")
        return
    names = [a for a in argv if not a.startswith("-")] or list(FITS) + list(RATIONAL_FITS)
    print("# BEGIN generated by tools/fit_approx.py (constant term first)")
    for n in names:
        run(n)
    print("# END generated")


if __name__ == "__main__":
    main(sys.argv[1:])
