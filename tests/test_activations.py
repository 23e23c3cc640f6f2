"""Activations: what the op table (tests/test_ops.py, driven by the specs
in nbops/activations.py) cannot say: accuracy over dense sweeps, the sign
of zero results, special-value contracts that differ from the reference's
formula, the streaming and in-place kernel paths."""

from dataclasses import dataclass, field

import numpy as np
import pytest

import nbops
from nbops import _formulas
from nbops.activations import SPECS
import reference as ref
from helpers import host, to_dev


@dataclass
class Act:
    """One activation with one set of parameters, from its spec."""

    name: str
    params: dict = field(default_factory=dict)
    saved: str = "x"
    range: float = 8.0

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


ACTS = [Act(name, dict(kw), "y" if spec.save == ("output",) else "x", spec.samples.span)
        for name, spec in SPECS.items() if not name.endswith("_backward")
        for kw in spec.samples.variants]
IDS = [a.id for a in ACTS]

TOL = {np.float32: dict(rtol=4e-6, atol=1e-6), np.float64: dict(rtol=1e-13, atol=1e-14)}
DTYPES = [np.float32, np.float64]
EDGE = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 1e-40, 1e4,
                 -1e4, 88.0, -88.0, 1e30, -1e30, 3.0, -3.0, 2.5, -2.5, 20.0, 10.0])


def _close(actual, expected, dtype, **extra):
    tol = dict(TOL[dtype])
    tol.update(extra)
    np.testing.assert_allclose(host(actual).astype(np.float64), expected, equal_nan=True, **tol)


def _first(result):
    return result[0] if isinstance(result, tuple) else result


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


SIGNED = [a for a in ACTS if a.name in ("relu", "tanh", "leaky_relu", "gelu", "silu", "swish",
                                        "elu")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", SIGNED, ids=[a.id for a in SIGNED])
def test_sign_of_zero_results(act, dtype, device):
    """-0.0 and +0.0 agree with the reference's sign where a nonzero input
    gives zero (the op table compares values, blind to the sign of zero)."""
    x = EDGE.astype(dtype)
    with np.errstate(all="ignore"):
        y = host(act.forward(to_dev(x, device)))
        expected = act.ref(x)
    zero = (expected == 0) & ~np.isnan(expected) & (x != 0)
    assert np.array_equal(np.signbit(y[zero]), np.signbit(expected[zero]))


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
