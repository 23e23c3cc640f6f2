"""The table-driven float64 softplus (nbops/cpu/_piecewise.py) against long
double references, on its own and through ``nbops.softplus``; where the
target has no AVX-512 the run does nothing, which is tested too."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import njit

import nbops
from nbops.cpu import _piecewise
from nbops.cpu._piecewise import LANES, TABLE_END, vector_run
from test_approx import LD_OK, f64_samples, ulp_errors

LD = np.longdouble
RUNS = _piecewise.host_available()
needs_runs = pytest.mark.skipif(not RUNS, reason="the CPU target has no AVX-512")
needs_ld = pytest.mark.skipif(not LD_OK, reason="needs x86 80-bit long double references")

#: max error in ulps, measured 1.47 (table) and 1.29 (past the table)
BOUND = 2.0


@njit(error_model="numpy")
def _run(x, out, beta, threshold):
    return vector_run("softplus", x, out, 0, x.size, beta, threshold, 1.0 / beta)


def reference(x, beta=1.0, threshold=20.0):
    # z rounded as the kernels round it (for |z| = 34, half an ulp of z is
    # 32 ulps of exp(-|z|))
    z = (x * beta).astype(LD)
    with np.errstate(all="ignore"):
        soft = (np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))) / LD(beta)
    return np.where(z > threshold, x.astype(LD), soft)


def run(x, beta=1.0, threshold=20.0):
    """The run over x padded to whole vectors (NaN in the padding)."""
    n = -(-x.size // LANES) * LANES
    xp = np.full(n, np.nan)
    xp[:x.size] = x
    out = np.full(n, -7.0)
    assert _run(xp, out, beta, threshold) == n
    return out[:x.size]


def worst(y, x, **params):
    err = ulp_errors(y, reference(x, **params), np.float64)
    i = int(np.argmax(err))
    return err[i], x[i]


def edges():
    """Every interval's ends and middle, and their neighbours, both signs."""
    e = np.arange(0, 2 * TABLE_END + 1) / 2
    e = np.concatenate([e, np.nextafter(e, -np.inf), np.nextafter(e, np.inf)])
    return np.concatenate([e, -e, [5e-324, 1e-300, 2.2e-308]])


@needs_runs
@needs_ld
@pytest.mark.parametrize("where", ["table", "edges", "far", "underflow"])
def test_accuracy(where):
    x = {"table": lambda: f64_samples(-TABLE_END, TABLE_END, 200_000, 1),
         "edges": edges,
         "far": lambda: np.concatenate([f64_samples(-760, -TABLE_END, 50_000, 2),
                                        np.random.default_rng(3).uniform(TABLE_END, 20, 5000)]),
         "underflow": lambda: np.linspace(-750, -700, 20_001)}[where]()
    err, at = worst(run(x), x)
    assert err <= BOUND, f"{err:.3f} ulp at x={at!r}"


@needs_runs
def test_special_values():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 20.0, 20.000001,
                  -745.2, -746.0, -800.0])
    y = run(x)
    assert np.isnan(y[:2]).all()
    assert y[2] == np.inf and y[3] == 0.0 and y[11] == 0.0 and y[12] == 0.0
    assert y[4] == y[5] == np.log(2.0)
    assert y[6] == 1e308 and y[7] == 0.0
    assert y[8] == np.float64(reference(x[8:9])[0])     # at the threshold: the formula
    assert y[9] == 20.000001                              # past it: x itself
    # the last subnormals before 0
    assert 0 <= y[10] <= 2 * 5e-324


@needs_runs
@needs_ld
@pytest.mark.parametrize("beta, threshold", [(2.0, 10.0), (0.5, 20.0), (-1.5, 5.0),
                                             (1.0, np.inf), (3.0, -1.0)])
def test_beta_and_threshold(beta, threshold):
    x = np.concatenate([np.random.default_rng(4).standard_normal(4000) * 12, edges()])
    y = run(x, beta, threshold)
    z = x * beta
    # the reference divides by beta where the kernel multiplies by 1/beta
    # (as the formula does): one more rounding
    err, at = worst(y, x, beta=beta, threshold=threshold)
    assert err <= BOUND + 1, f"{err:.3f} ulp at x={at!r}"
    assert np.array_equal(y[z > threshold], x[z > threshold])


def test_only_whole_vectors_and_other_dtypes():
    x = np.random.default_rng(5).standard_normal(29)
    out = np.full(29, -7.0)
    stop = _run(x, out, 1.0, 20.0)
    assert stop == (24 if RUNS else 0)
    assert (out[stop:] == -7.0).all()
    x32 = x.astype(np.float32)
    out32 = np.full(29, -7.0, np.float32)
    assert _run(x32, out32, 1.0, 20.0) == 0 and (out32 == -7.0).all()


@pytest.mark.parametrize("n", [1, 7, 8, 9, 4095, 4096, 4097, 40_000, 100_003])
@pytest.mark.parametrize("scale", [3.0, 30.0])
def test_softplus_through_the_op(n, scale):
    """Every length (vector and block remainders, serial and parallel
    kernels), data inside and far past the table, NaN and inf among it, in
    place and out of place: within the bound of either formula."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n) * scale
    x[rng.integers(0, n, max(n // 50, 1))] = rng.choice([np.nan, np.inf, -np.inf, 1e6, -1e6])
    y = nbops.softplus(x)
    if LD_OK:
        err = ulp_errors(y, reference(x), np.float64)
        assert err.max() <= 2.5, f"{err.max():.3f} ulp at x={x[np.argmax(err)]!r}"
    inplace = x.copy()
    nbops.softplus(inplace, out=inplace)
    assert np.array_equal(inplace, y, equal_nan=True)


def test_float32_and_strided_keep_the_formula():
    x = np.random.default_rng(6).standard_normal((64, 130)) * 4
    ref = np.logaddexp(0, x)
    np.testing.assert_allclose(nbops.softplus(x[:, ::2]), ref[:, ::2], rtol=4e-16, atol=0)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(nbops.softplus(x32), np.logaddexp(0, x32.astype(np.float64)),
                               rtol=3e-7, atol=0)


def test_a_target_without_avx512_keeps_the_formula(tmp_path):
    """NUMBA_CPU_NAME=generic (no AVX-512 in the target machine): no run
    kernels are built and softplus goes through the formula."""
    code = textwrap.dedent("""
        import numpy as np, nbops
        from nbops.cpu import _piecewise, activations
        assert not _piecewise.host_available()
        assert activations.softplus.kernels.runs is None
        x = np.random.default_rng(0).standard_normal(1000) * 10
        y = nbops.softplus(x)
        ref = np.where(x > 20, x, np.logaddexp(0, x))
        assert np.allclose(y, ref, rtol=4e-16, atol=0), "wrong values"
        print("ok")
    """)
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
