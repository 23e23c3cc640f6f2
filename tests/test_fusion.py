"""nbops.fuse: results against NumPy on both devices, broadcasting, strided
views, reductions along every axis, scalars, every supported function, out=,
caching, debug mode and the error paths.

Compile time dominates this file on the CPU (one parallel kernel per
expression, mode and stride pattern): tests share expressions where they can.
"""

import functools
import inspect
import os
import sys

import numpy as np
import pytest
import scipy.special

import nbops as nb
from nbops import testing as checks
from helpers import host as _host
from helpers import to_dev

TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}
# reductions sum float32 values in float64 on our side and pairwise in float32 in NumPy
RTOL_SUM = {np.float32: 1e-5, np.float64: 1e-12}

rng = np.random.default_rng(1)


@pytest.fixture(autouse=True)
def parallel_kernels(monkeypatch):
    """Run the multi-threaded CPU kernels (what large inputs use) on the tests'
    small shapes; test_small_inputs_run_on_the_calling_thread covers the rest."""
    from nbops.cpu import fusion as kernels

    monkeypatch.setattr(kernels, "SERIAL_BELOW", 0)


def host(y):
    return np.asarray(y) if isinstance(y, np.generic) else _host(y)


def arr(shape, dtype=np.float32, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape).astype(dtype)


def _expr(x, y):
    return x * y - x / (y + 3.0)


EXPR = nb.fuse(_expr)


def _views(kind):
    """(x, y) pairs of broadcast / strided layouts, as NumPy arrays."""
    if kind == "contiguous":
        return arr(101), arr(101)
    if kind == "outer":
        return arr((3, 1)), arr((1, 37))
    if kind == "rows":
        return arr(37), arr((3, 37))
    if kind == "transposed":
        return arr((37, 3)).T, arr((3, 37))
    if kind == "reversed":
        return arr(64)[::-2], arr(32)
    if kind == "zero-d":
        return np.array(1.5, np.float32), arr(5)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["contiguous", "outer", "rows", "transposed", "reversed",
                                  "zero-d"])
def test_broadcast_and_strides(device, kind):
    x, y = _views(kind)
    got = EXPR(to_dev(x, device), to_dev(y, device))
    want = _expr(x, y)
    assert got.shape == want.shape
    np.testing.assert_allclose(host(got), want, **TOL[np.float32])


def test_float64_and_out(device):
    x, y = arr((3, 1), np.float64), arr((1, 37), np.float64)
    out = to_dev(np.empty((3, 37)), device)
    got = EXPR(to_dev(x, device), to_dev(y, device), out=out)
    assert got is out
    np.testing.assert_allclose(host(out), _expr(x, y), **TOL[np.float64])


def test_scalar_arguments_take_the_array_dtype(device):
    f = nb.fuse(lambda x, a: x * a + 1)
    x = arr(50)
    got = f(to_dev(x, device), 0.1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(host(got), x * np.float32(0.1) + 1, **TOL[np.float32])
    np.testing.assert_allclose(host(f(to_dev(x, device), -3)), x * -3 + 1, **TOL[np.float32])


def test_empty_and_size_one(device):
    for shape in [(0,), (1,), (4, 0)]:
        x = arr(shape)
        got = EXPR(to_dev(x, device), to_dev(x, device))
        assert got.shape == shape
        np.testing.assert_allclose(host(got), _expr(x, x), **TOL[np.float32])
    s = nb.fuse(lambda x, y: x * y + 1, reduce="sum")
    assert s(to_dev(arr(0), device), to_dev(arr(0), device)) == 0.0
    assert np.isnan(nb.fuse(lambda x: x, reduce="mean")(to_dev(arr(0), device)))


# --- reductions --------------------------------------------------------------

def _red(x, y):
    return x * y + 1.0


REDS = {(r, a): nb.fuse(_red, reduce=r, axis=a) for r in ("sum", "mean", "max")
        for a in (None, 0, 1, 2, -1)}


@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_reductions_along_each_axis(device, reduce, axis):
    x, y = arr((2, 3, 37)), arr((3, 1))
    got = REDS[reduce, axis](to_dev(x, device), to_dev(y, device))
    want = getattr(np, reduce)(_red(x.astype(np.float64), y.astype(np.float64)), axis=axis)
    if axis is None:
        assert np.ndim(got) == 0 and got.dtype == np.float32
    else:
        assert got.shape == want.shape and got.dtype == np.float32
    tol = 1e-6 if reduce == "max" else RTOL_SUM[np.float32]
    np.testing.assert_allclose(host(got), want, rtol=tol, atol=tol)


def test_reduction_float64_big_sum_and_out(device):
    # chunked across threads; enough elements that every chunk is used
    x, y = arr(50_001, np.float64), arr(50_001, np.float64)
    got = REDS["sum", None](to_dev(x, device), to_dev(y, device))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.sum(x * y + 1.0), rtol=1e-12)
    out = to_dev(np.empty((3,), np.float32), device)
    x3, y3 = arr((2, 3, 37)), arr((3, 1))
    assert REDS["sum", 2](to_dev(x3, device), to_dev(y3, device)).shape == (2, 3)
    r = nb.fuse(_red, reduce="mean", axis=0)(to_dev(x3[:, :, 0], device),
                                            to_dev(y3[:, 0], device), out=out)
    assert r is out
    np.testing.assert_allclose(host(out), _red(x3[:, :, 0], y3[:, 0]).mean(0), rtol=1e-6)


def test_reductions_propagate_nan(device):
    # the shapes of test_reductions_along_each_axis: its kernels, no new compilation
    x, y = arr((2, 3, 37)), arr((3, 1))
    x[1, 1, 7] = np.nan
    for r in ("sum", "max"):
        assert np.isnan(REDS[r, None](to_dev(x, device), to_dev(y, device)))
        got = host(REDS[r, 0](to_dev(x, device), to_dev(y, device)))
        assert np.isnan(got[1, 7]) and np.isfinite(np.delete(got.reshape(-1), 37 + 7)).all()


# --- every supported function ------------------------------------------------

def _all_math(x, y):
    # valid for fuse's symbols and for NumPy arrays alike: the reference is itself
    a = np.where(x > y, np.exp(x), np.log(np.abs(y) + 1.0))
    b = np.tanh(x) * np.sqrt(np.abs(x)) + scipy.special.erf(y)
    c = np.maximum(x, y) - np.minimum(x, 0.5) + abs(-x) ** 3 + x ** 2
    d = (x >= y) * 2.0 + (x <= 0.1) - (x < y) + (x == y) + (x != 0.0)
    e = np.where(y, x, 1.0) + np.negative(y) ** 2 / 4 + np.power(np.abs(x) + 1, 0.5)
    g = np.divide(np.add(x, 3.0), np.subtract(4.0, np.multiply(y, y))) + (x + 2.0) ** (y / 2)
    return a + b + c + d + e + g - (1.0 - y) * +x + 2.0 ** y - 1 / (y + 3.0) ** -1


def test_every_math_function(device):
    x, y = arr(97, np.float64, -1, 1), arr(97, np.float64, -1, 1)
    x[:4] = [0.0, 0.5, -0.5, 0.1]
    y[:4] = [0.0, 0.5, 0.3, 0.1]
    f = nb.fuse(_all_math)
    np.testing.assert_allclose(host(f(to_dev(x, device), to_dev(y, device))), _all_math(x, y),
                               rtol=1e-6, atol=1e-6)


def test_maximum_minimum_propagate_nan(device):
    f = nb.fuse(lambda x, y: np.maximum(x, y) + np.minimum(y, x))
    x = np.array([1.0, np.nan, 2.0, np.nan])
    y = np.array([np.nan, 1.0, 0.0, np.nan])
    np.testing.assert_array_equal(host(f(to_dev(x, device), to_dev(y, device))),
                                  np.maximum(x, y) + np.minimum(y, x))


# Each call runs on symbols inside fuse and on arrays as its own reference.
ACT_CALLS = [
    lambda x: nb.relu(x), lambda x: nb.leaky_relu(x, 0.2), lambda x: nb.sigmoid(x),
    lambda x: nb.tanh(x), lambda x: nb.gelu(x), lambda x: nb.gelu(x, approximate="tanh"),
    lambda x: nb.silu(x), lambda x: nb.swish(x, beta=1.5),
    lambda x: nb.softplus(x, beta=2.0, threshold=3.0), lambda x: nb.elu(x, alpha=0.5),
    lambda x: nb.hardswish(x), lambda x: nb.hardtanh(x, -1.5, 2.5),
]
BACK_CALLS = [
    lambda g, x: nb.relu_backward(g, x), lambda g, x: nb.gelu_backward(g, x),
    lambda g, x: nb.gelu_backward(g, x, approximate="tanh"),
    lambda g, x: nb.silu_backward(g, x), lambda g, x: nb.elu_backward(g, x, alpha=0.5),
    lambda g, x: nb.sigmoid_backward(g, nb.sigmoid(x)),
    lambda g, x: nb.softplus_backward(g, x, 2.0), lambda g, x: nb.leaky_relu_backward(g, x),
    lambda g, x: nb.tanh_backward(g, x), lambda g, x: nb.hardswish_backward(g, x),
    lambda g, x: nb.hardtanh_backward(g, x, -1.0, 2.0),
]
# Every activation goes through one code path (a formula call with its
# parameters); the CPU kernels, whose compile time grows with each formula
# inlined, check a subset covering 0, 1 and 2 parameters, gelu's variant and
# backward formulas, the simulator all of them.
CPU_ACTS, CPU_BACKS = [1, 5, 8, 9], [1, 2, 5]


def _sum_of(calls):
    return lambda *a: functools.reduce(lambda acc, f: acc + f(*a), calls[1:], calls[0](*a))


@pytest.mark.parametrize("calls, subset", [(ACT_CALLS, CPU_ACTS), (BACK_CALLS, CPU_BACKS)],
                         ids=["forward", "backward"])
def test_activations_in_expressions(device, calls, subset):
    if device == "cpu":
        calls = [calls[i] for i in subset]
    x = arr(67, np.float32, -4, 4)
    x[:3] = [-5.0, 0.0, 5.0]
    args = (arr(67, np.float32), x)[-len(inspect.signature(calls[0]).parameters):]
    want = _sum_of(calls)(*args)
    got = nb.fuse(_sum_of(calls))(*(to_dev(a, device) for a in args))
    np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-5)


def test_hardtanh_with_an_infinite_bound_in_expressions(device):
    # one bound infinite (no bound on that side), NaN kept
    f = nb.fuse(lambda x: nb.hardtanh(x, -np.inf, 0.5) * 2.0)
    x = np.array([-np.inf, -3.0, 0.25, 0.75, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(host(f(to_dev(x, device))), np.clip(x, -np.inf, 0.5) * 2)


def test_nbops_arithmetic_ops_trace_as_operators(device):
    f = nb.fuse(lambda x, y: nb.sub(nb.mul(nb.add(x, y), y), nb.div(nb.exp(x), 2.0))
                + nb.neg(nb.log(nb.pow(y, 2.0))))
    g = nb.fuse(lambda x, y: (x + y) * y - np.exp(x) / 2.0 + -np.log(y ** 2.0))
    x, y = arr(33, np.float64), arr(33, np.float64, 0.5, 2.0)
    assert f.expression(x, y) == g.expression(x, y)
    np.testing.assert_allclose(host(f(to_dev(x, device), to_dev(y, device))),
                               (x + y) * y - np.exp(x) / 2.0 - np.log(y ** 2.0), rtol=1e-6)


def test_comparison_result_is_bool(device):
    f = nb.fuse(lambda x, y: x > y)
    x, y = arr(30), arr(30)
    got = f(to_dev(x, device), to_dev(y, device))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(host(got), x > y)


# --- caching, naming, profiling and debug hooks -------------------------------

def test_kernels_are_cached_per_pattern_and_written_to_the_cache_dir():
    from nbops.cpu import fusion as kernels

    f = nb.fuse(lambda x, y: x * y - y / (x + 3.0))
    x = arr(10)

    def files():
        return {sys.modules[k[1].py_func.__module__].__file__
                for p, k in kernels._KERNELS.values() if p is f.trace(("a", "a"))[1]}

    f(x, x)
    (first,) = files()
    assert first.startswith(os.path.join(kernels.cache_dir(), "fusion"))
    assert os.path.exists(first)
    f(x + 1, x)          # same pattern: no new kernel
    assert files() == {first}
    f(x[::2], x[:5])     # strided pattern: a second kernel, in its own file
    assert len(files()) == 2
    assert f.expression(x, x) == "((x0 * x1) - (x1 / (x0 + 3)))"
    assert "fuse[<lambda>]" in repr(f)


def test_small_inputs_run_on_the_calling_thread(monkeypatch):
    from nbops.cpu import fusion as kernels

    monkeypatch.setattr(kernels, "SERIAL_BELOW", 1 << 16)
    x, y = arr((3, 1)), arr((1, 37))
    np.testing.assert_allclose(EXPR(x, y), _expr(x, y), **TOL[np.float32])
    (serial, parallel), = [k for p, k in kernels._KERNELS.values()
                           if p is EXPR.trace(("a", "a"))[1] and k[0].signatures]
    assert serial.signatures   # the serial form ran (and compiled) for 111 elements


def test_named_and_decorator_forms():
    @nb.fuse(reduce="sum", name="sq_sum")
    def sq(x):
        return x * x

    x = arr(10)
    np.testing.assert_allclose(sq(x), np.sum(x * x), rtol=1e-6)
    assert sq.name == "sq_sum" and sq.__name__ == "sq"


def test_debug_mode_names_node_and_index(device):
    f = nb.fuse(lambda x, y: np.log(x) * y + 1.0, name="logmul")
    x = np.array([1.0, 2.0, -1.0, 3.0])
    nb.set_debug(True)
    try:
        with pytest.raises(FloatingPointError, match=r"logmul: log\(x0\) produced NaN at "
                                                     r"index \(2,\)"):
            f(to_dev(x, device), to_dev(x, device))
        # a NaN that came in is not blamed on the kernel
        f(to_dev(np.array([np.nan, 1.0]), device), to_dev(np.ones(2), device))
    finally:
        nb.set_debug(False)
    assert np.isnan(host(f(to_dev(x, device), to_dev(x, device)))[2])


def test_debug_mode_names_backward_ops(device):
    # backward passes are operators: the foundation's check names them too
    big = to_dev(np.array([0.5, 1e30], np.float32), device)
    nb.set_debug(True)
    try:
        with pytest.raises(FloatingPointError, match=r"sigmoid_backward: output 0 has Inf at "
                                                     r"index \(1,\)"):
            nb.sigmoid_backward(big, big)
    finally:
        nb.set_debug(False)


# --- errors ----------------------------------------------------------------------

W = np.ones(3, np.float32)


@pytest.mark.parametrize("fn, match", [
    (lambda x: np.sin(x), r"unsupported construct: np.sin"),
    (lambda x: x if x > 0 else -x, r"Python control flow"),
    (lambda x: x[0] + 1, r"indexing"),
    (lambda x: x + W, r"array captured from outside"),
    (lambda x: np.sum(x), r"np.sum \(use fuse\(\.\.\., reduce="),
    (lambda x: np.add.reduce(x), r"np.add.reduce"),
    (lambda x: x // 2, r"'//'"),
    (lambda x: x.astype(np.float64), r"'.astype'"),
    (lambda x: np.exp(x, dtype=np.float64), r"keyword arguments \['dtype'\]"),
    (lambda x: nb.transpose(x) if hasattr(nb, "transpose") else nb.register_op, r"."),
    (lambda x: nb.leaky_relu(x, x), r"array-valued parameter 'negative_slope'"),
    (lambda x: nb.relu(x, out=x), r"out= inside a fused expression"),
    (lambda x: (x, x), r"returned a tuple"),
    (lambda x: np.where(x > 0, x), r"three arguments"),
    (lambda x: float(x), r"conversion of an array value"),
    (lambda x: "a", r"str operand"),
])
def test_unsupported_constructs_are_named(fn, match):
    with pytest.raises(TypeError, match=match):
        nb.fuse(fn)(np.ones(3, np.float32))


def test_activation_parameters_are_checked_while_tracing():
    with pytest.raises(ValueError, match="softplus: argument 'beta' must be > 0"):
        nb.fuse(lambda x: nb.softplus(x, beta=0.0))(np.ones(3))
    with pytest.raises(ValueError, match="gelu: argument 'approximate' must be one of"):
        nb.fuse(lambda x: nb.gelu(x, approximate="fast"))(np.ones(3))
    with pytest.raises(ValueError, match=r"hardtanh: argument 'min_val' \(1.0\) must be <= "):
        nb.fuse(lambda x: nb.hardtanh(x, 1.0, 0.0))(np.ones(3))
    with pytest.raises(TypeError, match=r"array-valued parameter 'max_val'"):
        nb.fuse(lambda x: nb.hardtanh(x, 0.0, x))(np.ones(3))
    with pytest.raises(TypeError, match=r"unsupported construct: nbops.swish_backward"):
        nb.fuse(lambda g, x: nb.swish_backward(g, x))(np.ones(3), np.ones(3))


def test_argument_errors():
    f = nb.fuse(lambda x, y: x + y)
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"'args\[0\]' is float32 but 'args\[1\]' is float64"):
        f(x, np.ones(3))
    with pytest.raises(TypeError, match="must be a float32 or float64 array, got int64"):
        f(x, np.ones(3, np.int64))
    with pytest.raises(ValueError, match=r"cannot be broadcast together: args\[0\] \(3,\), "
                                         r"args\[1\] \(4,\)"):
        f(x, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="at least one argument must be an array"):
        f(1.0, 2.0)
    with pytest.raises(TypeError, match="argument 1 must be an array or a real number"):
        f(x, "2")
    with pytest.raises(TypeError, match="no arguments"):
        f()
    with pytest.raises(ValueError, match=r"'out' must have shape \(3,\)"):
        f(x, x, out=np.empty(4, np.float32))
    with pytest.raises(ValueError, match="'out' overlaps input"):
        f(x, x, out=x)
    with pytest.raises(ValueError, match=r"'axis' is 3, out of range"):
        nb.fuse(lambda x: x, reduce="sum", axis=3)(np.ones((2, 2)))
    with pytest.raises(ValueError, match="max of an empty extent"):
        nb.fuse(lambda x: x, reduce="max")(np.ones(0))
    with pytest.raises(ValueError, match="axis=0 given but the arguments are scalars"):
        nb.fuse(lambda x: x, reduce="sum", axis=0)(np.array(1.0))


def test_fuse_argument_errors():
    # the bad calls of fuse's spec (nbops/fusion.py): fuse takes a function,
    # not arrays, so it has no samples and the op table does not run them
    checks.check_bad_inputs("fuse", "cpu")


def test_mixed_devices_are_refused():
    pytest.importorskip("numba.cuda")
    f = nb.fuse(lambda x, y: x + y)
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match="different devices"):
        f(x, to_dev(x, "cuda"))
