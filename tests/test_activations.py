"""Activations: one table, a few parametrised tests run every row through
forward-vs-reference, edge values, out= and in-place, strided input,
backward vs the analytic reference and vs finite differences, both devices,
and the error paths."""

from dataclasses import dataclass, field

import numpy as np
import pytest

import nbops
from nbops import _formulas
import reference as ref
from helpers import host, to_dev


@dataclass
class Act:
    name: str
    params: dict = field(default_factory=dict)   # forward/backward keyword arguments
    saved: str = "x"                              # what the backward takes: input or output
    bad_params: list = field(default_factory=list)  # (kwargs, exception)
    range: float = 8.0                            # typical input magnitude
    kinks: tuple = ()                             # where finite differences must not look

    @property
    def id(self):
        return self.name + "".join(f"-{k}={v}" for k, v in self.params.items())

    def forward(self, x, **kw):
        return getattr(nbops, self.name)(x, **self.params, **kw)

    def backward(self, g, v, **kw):
        return getattr(nbops, self.name + "_backward")(g, v, **self.params, **kw)

    def ref(self, x):
        return getattr(ref, self.name)(x, **self.params)

    def ref_backward(self, g, x):
        saved = self.ref(x) if self.saved == "y" else x
        return getattr(ref, self.name + "_backward")(g, saved, **self.params)


ACTS = [
    Act("relu"),
    Act("leaky_relu", {"negative_slope": 0.2},
        bad_params=[({"negative_slope": -0.1}, ValueError), ({"negative_slope": "a"}, TypeError),
                    ({"negative_slope": float("nan")}, ValueError)]),
    Act("sigmoid", saved="y", range=20.0),
    Act("tanh", saved="y"),
    Act("gelu"),
    Act("gelu", {"approximate": "tanh"},
        bad_params=[({"approximate": "erf"}, ValueError)]),
    Act("silu"),
    Act("swish", {"beta": 1.7}, bad_params=[({"beta": float("inf")}, ValueError)]),
    Act("softplus", {"beta": 2.0, "threshold": 10.0},
        bad_params=[({"beta": 0.0}, ValueError), ({"beta": -1.0}, ValueError)]),
    Act("softplus"),
    Act("elu", {"alpha": 0.7}, bad_params=[({"alpha": -1.0}, ValueError)]),
    Act("hardswish"),
    Act("hardtanh", kinks=(-1.0, 1.0),
        bad_params=[({"min_val": 2.0}, ValueError), ({"max_val": float("nan")}, ValueError),
                    ({"min_val": "a"}, TypeError), ({"max_val": None}, TypeError)]),
    Act("hardtanh", {"min_val": 0.0, "max_val": 6.0}, kinks=(0.0, 6.0),
        bad_params=[({"max_val": -1.0}, ValueError)]),
    Act("hardtanh", {"min_val": -np.inf, "max_val": 0.5}, kinks=(0.5,)),
]
IDS = [a.id for a in ACTS]

# Tolerances against the float64 reference: a few ulp of the result, plus an
# absolute floor for values that cross zero (relative error is meaningless there).
TOL = {np.float32: dict(rtol=4e-6, atol=1e-6), np.float64: dict(rtol=1e-13, atol=1e-14)}
DTYPES = [np.float32, np.float64]
SHAPES = [(0,), (1,), (7,), (97,), (3 * 32 + 1,), (5, 19), (2, 3, 4, 5)]
CUDA_SHAPES = [(0,), (1,), (3 * 32 + 1,), (3, 5, 7)]
EDGE = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 1e-40, 1e4,
                 -1e4, 88.0, -88.0, 1e30, -1e30, 3.0, -3.0, 2.5, -2.5, 20.0, 10.0])


def _input(shape, dtype, act, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * act.range / 3).astype(dtype)


def _close(actual, expected, dtype, **extra):
    tol = dict(TOL[dtype])
    tol.update(extra)
    np.testing.assert_allclose(host(actual).astype(np.float64), expected, equal_nan=True, **tol)


def _first(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_forward_matches_reference(act, dtype, device):
    for shape in SHAPES if device == "cpu" else CUDA_SHAPES:
        x = _input(shape, dtype, act)
        y = act.forward(to_dev(x, device))
        assert y.shape == x.shape and y.dtype == x.dtype
        _close(y, act.ref(x), dtype)


def test_gelu_relative_accuracy_in_the_negative_tail():
    # CPU float32: x Phi(x) to a few ulp *relative*, down to x = -12.9
    # (Phi stays normal there), where an erfc of a rounded x/sqrt(2) was off by
    # up to 190 ulp; the float64 reference is exact enough (1e-14 relative)
    x = np.linspace(-12.9, 6.0, 400_001).astype(np.float32)
    y = nbops.gelu(x).astype(np.float64)
    want = ref.gelu(x)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    nz = want != 0
    assert np.max(np.abs(y[nz] - want[nz]) / ulp[nz]) <= 7.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_edge_values(act, dtype, device):
    x = EDGE.astype(dtype)
    with np.errstate(all="ignore"):
        y = host(act.forward(to_dev(x, device)))
        expected = act.ref(x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected), err_msg=f"NaN pattern, x={x}")
    _close(y, expected, dtype)
    # -0.0 and +0.0 agree with the reference's sign where the result is zero
    zero = (expected == 0) & ~np.isnan(expected)
    if act.name in ("relu", "tanh", "leaky_relu", "gelu", "silu", "swish", "elu"):
        assert np.array_equal(np.signbit(y[zero & (x != 0)]), np.signbit(expected[zero & (x != 0)]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_dense_sweep_accuracy(act, dtype):
    """Every function over a dense sweep of its useful range, CPU only (the
    CPU uses vectorized approximations; CUDA uses CUDA's libm)."""
    x = np.linspace(-act.range * 4, act.range * 4, 200_001).astype(dtype)
    _close(act.forward(x), act.ref(x), dtype)
    g = np.linspace(-2, 2, x.size).astype(dtype)
    v = act.forward(x) if act.saved == "y" else x
    _close(_first(act.backward(g, v)), _first(act.ref_backward(g, x)), dtype,
           atol=TOL[dtype]["atol"] * 4)


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_out_and_inplace(act, device):
    x = _input((4, 33), np.float64, act)
    expected = act.ref(x)
    out = to_dev(np.empty_like(x), device)
    y = act.forward(to_dev(x, device), out=out)
    assert y is out
    _close(out, expected, np.float64)
    xd = to_dev(x.copy(), device)
    y = act.forward(xd, out=xd)
    assert y is xd
    _close(xd, expected, np.float64)


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_strided_input(act, device):
    base = _input((6, 10, 8), np.float32, act)
    views = [base[:, ::2, 1:], base.transpose(2, 0, 1), base[::-1, 3], base[..., 5]]
    for v in views:
        y = act.forward(to_dev(v, device))
        assert y.shape == v.shape
        _close(y, act.ref(v), np.float32)
    assert np.array_equal(base, _input((6, 10, 8), np.float32, act)), "input modified"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_backward_matches_reference(act, dtype, device):
    shape = (3, 41)
    x = _input(shape, dtype, act)
    g = _input(shape, dtype, act, seed=1)
    v = act.ref(x).astype(dtype) if act.saved == "y" else x
    got = act.backward(to_dev(g, device), to_dev(v, device))
    # evaluated at the saved value as passed (the rounded output for y-saving ops)
    want = getattr(ref, act.name + "_backward")(g, v, **act.params)
    if act.name == "swish":
        _close(got[0], want[0], dtype)
        assert got[1] == pytest.approx(want[1], rel=1e-5 if dtype == np.float32 else 1e-12)
    else:
        _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_backward_edges(dtype, device):
    # zero (+0.0) wherever x <= 0, whatever g: inf, NaN, negative, -0.0;
    # g itself where x > 0 (NaN and inf included). Streamed sizes too.
    g = np.array([np.inf, -np.inf, np.nan, -3.0, -0.0, 2.0, np.nan, -np.inf, 1.0], dtype)
    x = np.array([-1.0, 0.0, -0.0, -2.0, 5.0, 1.0, 1.0, 3.0, np.nan], dtype)
    want = np.array([0, 0, 0, 0, -0.0, 2, np.nan, -np.inf, 0], dtype)
    for reps in (1, 300000):
        gg, xx = np.tile(g, reps), np.tile(x, reps)
        got = host(nbops.relu_backward(to_dev(gg, device), to_dev(xx, device)))
        np.testing.assert_array_equal(got, np.tile(want, reps))
        np.testing.assert_array_equal(np.signbit(got), np.signbit(np.tile(want, reps)))
        if device != "cpu":
            break


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hardtanh_edges(dtype, device):
    # forward: NaN stays NaN, infinities clip, the bounds themselves are kept;
    # backward: g strictly inside the bounds, else +0.0 whatever g is (NaN x too)
    x = np.array([np.nan, -np.inf, np.inf, -1.0, 1.0, -0.5, 0.5, -2.0, 2.0, 0.0], dtype)
    g = np.array([1.0, 2.0, 3.0, 4.0, 5.0, np.nan, -np.inf, np.nan, np.inf, -0.0], dtype)
    np.testing.assert_array_equal(host(nbops.hardtanh(to_dev(x, device))),
                                  np.array([np.nan, -1, 1, -1, 1, -0.5, 0.5, -1, 1, 0], dtype))
    want = np.array([0, 0, 0, 0, 0, np.nan, -np.inf, 0, 0, -0.0], dtype)
    got = host(nbops.hardtanh_backward(to_dev(g, device), to_dev(x, device)))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    # the output in place of the input gives the same gradient (linear's fused backward)
    y = nbops.hardtanh(to_dev(x, device))
    np.testing.assert_array_equal(host(nbops.hardtanh_backward(to_dev(g, device), y)), want)
    # equal bounds: a constant, and a zero gradient everywhere
    np.testing.assert_array_equal(host(nbops.hardtanh(to_dev(x[1:], device), 0.5, 0.5)),
                                  np.full(x.size - 1, 0.5, dtype))
    assert not np.any(host(nbops.hardtanh_backward(to_dev(g[1:], device),
                                                   to_dev(x[1:], device), 0.5, 0.5)))


def test_hardtanh_bound_errors_name_the_op():
    x = np.ones(3)
    with pytest.raises(ValueError, match=r"hardtanh: argument 'min_val' \(2.0\) must be <= "
                                         r"'max_val' \(1.0\)"):
        nbops.hardtanh(x, 2.0, 1.0)
    with pytest.raises(ValueError, match="hardtanh_backward: argument 'min_val' must not be NaN"):
        nbops.hardtanh_backward(x, x, float("nan"), 1.0)
    with pytest.raises(TypeError, match="hardtanh: argument 'max_val' must be a real number"):
        nbops.hardtanh(x, 0.0, "6")


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_backward_finite_differences(act):
    """The backward is the derivative of the forward (central differences, float64)."""
    x = _input((50,), np.float64, act)
    x = x[np.abs(np.abs(x) - 3) > 1e-3]  # hardswish's kinks
    x = x[np.abs(x) > 1e-3]              # relu's kink
    for k in act.kinks:
        x = x[np.abs(x - k) > 1e-3]
    g = np.ones_like(x)
    eps = 1e-6
    numeric = (act.forward(x + eps) - act.forward(x - eps)) / (2 * eps)
    v = act.forward(x) if act.saved == "y" else x
    np.testing.assert_allclose(_first(act.backward(g, v)), numeric, rtol=1e-6, atol=1e-7)
    if act.name == "swish":
        b = act.params["beta"]
        fd = (nbops.swish(x, b + eps).sum() - nbops.swish(x, b - eps).sum()) / (2 * eps)
        assert act.backward(g, x)[1] == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_backward_inplace_into_grad(act, device):
    x = _input((2, 9), np.float64, act)
    g = _input((2, 9), np.float64, act, seed=2)
    v = act.forward(x) if act.saved == "y" else x
    want = host(_first(act.backward(g, v)))
    gd = to_dev(g.copy(), device)
    res = _first(act.backward(gd, to_dev(v, device), out=gd))
    assert res is gd
    _close(gd, want, np.float64)


# --- errors ----------------------------------------------------------------

BAD_DTYPES = [np.arange(4), np.ones(3, bool), np.ones(3, np.complex128),
              np.array([1, "a"], object), np.ones(3, np.float16), np.ones(3, np.int8)]


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_errors(act, device):
    name = act.name
    for bad in BAD_DTYPES:
        with pytest.raises(TypeError, match=f"{name}: argument 'x' must be a float32 or float64"):
            act.forward(to_dev(bad, device) if bad.dtype != object else bad)
    with pytest.raises(TypeError, match=f"{name}: argument 'x' must be a numpy.ndarray"):
        act.forward([1.0, 2.0])
    x = to_dev(np.ones((3, 4), np.float32), device)
    with pytest.raises(ValueError, match=r"'out' must have shape \(3, 4\)"):
        act.forward(x, out=to_dev(np.ones((4, 3), np.float32), device))
    with pytest.raises(TypeError, match="'out' must be float32, got float64"):
        act.forward(x, out=to_dev(np.ones((3, 4)), device))
    other = "cuda" if device == "cpu" else "cpu"
    with pytest.raises(TypeError, match=r"different devices \(.*out on"):
        act.forward(x, out=to_dev(np.ones((3, 4), np.float32), other))
    if device == "cpu":
        buf = np.ones(10, np.float32)
        with pytest.raises(ValueError, match="'out' overlaps input 'x'"):
            act.forward(buf[:8], out=buf[2:])
        with pytest.raises(ValueError, match="C-contiguous"):
            act.forward(np.ones((3, 4), np.float32), out=np.ones((4, 3), np.float32).T)
        ro = np.ones(3, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            act.forward(np.ones(3, np.float32), out=ro)
    for kwargs, exc in act.bad_params:
        params = dict(act.params, **kwargs)
        with pytest.raises(exc, match=name):
            getattr(nbops, name)(x, **params)


@pytest.mark.parametrize("act", ACTS, ids=IDS)
def test_backward_errors(act):
    x = np.ones((3, 4))
    with pytest.raises(ValueError, match="must have the shape of 'grad_output'"):
        act.backward(np.ones(3), x)
    with pytest.raises(TypeError, match="'grad_output' is float32 but"):
        act.backward(np.ones((3, 4), np.float32), x)


def test_mixed_devices_named():
    x = np.ones(4)
    d = nbops.to_device(np.ones(4))
    with pytest.raises(TypeError, match=r"relu_backward: arguments are on different devices "
                                        r"\(.*grad_output.*cpu.*\)"):
        nbops.relu_backward(x, d)


def test_sigmoid_never_overflows():
    x = np.array([-1e4, -1e3, -100, 100, 1e3, 1e4], np.float32)
    with np.errstate(all="raise"):
        y = nbops.sigmoid(x)
    assert np.all(np.isfinite(y)) and y[0] == 0 and y[-1] == 1


def _streams(name):
    from nbops.cpu import activations as cpu

    return not cpu.transcendental(getattr(_formulas, name))


def test_only_arithmetic_formulas_stream():
    """The kernels of formulas that call a transcendental function (directly
    or through a helper such as _sigmoid) are compute-bound and never stream
    (nbops.cpu.activations' docstring); the others do."""
    from nbops.cpu import activations as cpu

    streaming = [n for n in _formulas.FORWARD + _formulas.BACKWARD if _streams(n)]
    assert streaming == ["relu", "leaky_relu", "hardswish", "hardtanh", "relu_backward",
                         "leaky_relu_backward", "sigmoid_backward", "tanh_backward",
                         "hardswish_backward", "hardtanh_backward"]
    assert cpu.gelu.kernels.streamed is None and cpu.relu.kernels.in_place is not None
    assert cpu._unary_kernels("gelu", _formulas.gelu).streamed is None
    assert cpu._binary_kernels("silu_backward", _formulas.silu_backward).streamed is None
    assert cpu._unary_kernels("relu", _formulas.relu).streamed is not None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [4096, 40000])
def test_in_place_is_bit_identical_to_out_of_place(dtype, n):
    """``out=x`` (and a backward's ``out=g`` or ``out=v``) runs the in-place
    kernels, whose vector loop and scalar remainder must round like the
    flat kernels'. (Before they existed, the flat kernel's overlap check
    sent in-place calls to its scalar loop, 7-11x slower for gelu; with
    LLVM's SLP vectorizer on, that scalar gelu lost FMAs and differed in the
    last bit.)"""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    for act in ACTS:
        want = act.forward(x)
        got = x.copy()
        act.forward(got, out=got)
        np.testing.assert_array_equal(got, want, err_msg=act.id)
        v = act.forward(x) if act.saved == "y" else x
        want = _first(act.backward(g, v))
        got = g.copy()
        np.testing.assert_array_equal(_first(act.backward(got, v, out=got)), want,
                                      err_msg=act.id + " backward, out=g")
        got = v.copy()
        np.testing.assert_array_equal(_first(act.backward(g, got, out=got)), want,
                                      err_msg=act.id + " backward, out=v")


STREAMING = [a for a in ACTS if _streams(a.name) or _streams(a.name + "_backward")]


@pytest.mark.parametrize("act", STREAMING, ids=lambda a: a.id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [4096, 2 * 2048 * 8 - 1, 2048 * 8 * 3 + 17])
def test_streamed_kernels_match_flat_kernels(monkeypatch, act, dtype, n):
    """Outputs of STREAM_BYTES or more go through the streamed kernels
    (blocks in L1, non-temporal line stores, partial lines carried between
    blocks) where the formula streams: the same bits as the flat kernels,
    for any output alignment and in place."""
    from nbops.cpu import _memory

    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * act.range).astype(dtype)
    x[::97] = -0.0                  # signed zeros must keep their sign
    g = rng.standard_normal(n).astype(dtype)
    v = act.forward(x) if act.saved == "y" else x
    flat_y, flat_g = act.forward(x), act.backward(g, v)
    monkeypatch.setattr(_memory, "STREAM_BYTES", 0)
    for offset in (0, 8, 40):
        raw = np.zeros(x.nbytes + 128, np.uint8)
        start = -raw.ctypes.data % 64 + offset
        out = raw[start:start + x.nbytes].view(dtype)
        np.testing.assert_array_equal(act.forward(x, out=out), flat_y)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(flat_y))
        got = act.backward(g, v, out=out)
        if isinstance(flat_g, tuple):     # swish: (grad x, grad beta)
            np.testing.assert_array_equal(got[0], flat_g[0])
            assert got[1] == flat_g[1]
        else:
            np.testing.assert_array_equal(got, flat_g)
    if _streams(act.name):
        inplace = x.copy()
        act.forward(inplace, out=inplace)
        np.testing.assert_array_equal(inplace, flat_y)
