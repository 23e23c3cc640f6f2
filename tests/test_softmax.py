"""softmax and log_softmax beyond the op table (tests/test_ops.py, driven by
the specs in nbops/softmax.py): special-value contracts, digits next to
large maxima, gradchecks on both devices, the backward formulas against
the Jacobian, the modules and the streamed-row path."""

import numpy as np
import pytest

import nbops
from nbops import nn
from nbops.autograd import Tensor, gradcheck
import reference
from helpers import to_dev


def ref(x, axis, log):
    return reference.softmax(x, axis, log)


OPS = {"softmax": (nbops.softmax, False), "log_softmax": (nbops.log_softmax, True)}


@pytest.mark.parametrize("op", list(OPS))
def test_special_values(op):
    fn, log = OPS[op]
    inf, nan = np.inf, np.nan
    x = np.array([[-inf, -inf, -inf, -inf],     # fully masked: NaN, as PyTorch
                  [1e4, 1e4 + 1, -inf, 0.0],    # large magnitudes, a masked entry
                  [1.0, nan, 2.0, 3.0],         # NaN spreads over its row
                  [inf, 1.0, 2.0, 3.0],         # so does +inf (inf - inf)
                  [1e30, -1e30, 0.0, 1e30]], np.float32)
    y = fn(x)
    assert np.isnan(y[0]).all() and np.isnan(y[2]).all() and np.isnan(y[3]).all()
    np.testing.assert_allclose(y[[1, 4]], ref(x[[1, 4]], -1, log), rtol=1e-6, atol=1e-6)
    assert y[1, 2] == (-inf if log else 0.0)
    # along another axis the same rows are columns
    yt = fn(np.ascontiguousarray(x.T), 0)
    np.testing.assert_array_equal(np.isnan(yt), np.isnan(y.T))
    np.testing.assert_allclose(yt.T[[1, 4]], y[[1, 4]], rtol=1e-6)


def test_log_softmax_keeps_digits_next_to_large_maxima():
    x = np.array([1e4, 1e4, -np.inf, 0.0], np.float32)
    # (x - max) - log(sum) in that order: max + log(sum) would round to 1e4 + 0.6934
    assert nbops.log_softmax(x)[0] == np.float32(-np.log(2.0))


def test_zero_dim_empty_out_and_strided():
    assert nbops.softmax(np.array(3.0)) == 1.0
    assert nbops.log_softmax(np.array(3.0)) == 0.0
    assert nbops.softmax(np.zeros((0, 4)), 1).shape == (0, 4)
    base = np.random.default_rng(1).standard_normal((6, 10))
    x = base[:, ::2]
    out = np.empty((6, 5))
    assert nbops.softmax(x, 1, out=out) is out
    np.testing.assert_allclose(out, ref(x, 1, False), rtol=1e-13)
    np.testing.assert_allclose(nbops.log_softmax(base.T, 0), ref(base.T, 0, True), rtol=1e-13)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("axis", [-1, 1])
def test_gradcheck(op, axis, device):
    fn, _ = OPS[op]
    # small: each element costs two launches, simulated thread by thread
    x = np.random.default_rng(3).standard_normal((1, 2, 3) if device == "cuda" else (2, 5, 3))
    assert gradcheck(lambda t: fn(t, axis), [Tensor(to_dev(x, device), requires_grad=True)])


def test_backward_formulas_against_the_jacobian():
    x = np.random.default_rng(4).standard_normal(6)
    g = np.random.default_rng(5).standard_normal(6)
    s = ref(x, 0, False)
    jac = np.diag(s) - np.outer(s, s)          # d softmax_i / d x_j
    t = Tensor(x, requires_grad=True)
    nbops.softmax(t).backward(g)
    np.testing.assert_allclose(t.grad, jac.T @ g, rtol=1e-13)
    t = Tensor(x, requires_grad=True)
    nbops.log_softmax(t).backward(g)
    np.testing.assert_allclose(t.grad, (np.eye(6) - s[None, :]).T @ g, rtol=1e-13)


def test_modules():
    x = np.random.default_rng(6).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(nn.Softmax(dim=1)(x), nbops.softmax(x, 1))
    np.testing.assert_array_equal(nn.LogSoftmax(-1)(x), nbops.log_softmax(x, -1))
    assert "axis=1" in repr(nn.Softmax(1))
    with pytest.raises(TypeError, match="Softmax: argument 'dim' must be an int"):
        nn.Softmax(None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [32, 47, 512, 1001])
@pytest.mark.parametrize("offset", [0, 16, 40])
def test_streamed_rows_match_cached_rows(monkeypatch, op, dtype, n, offset):
    """Outputs of STREAM_BYTES or more are written with non-temporal stores
    (rows of whole lines, partial lines carried to the next row): the same
    values as the cached path, for any output alignment."""
    from nbops.cpu import _memory

    fn, log = OPS[op]
    x = (np.random.default_rng(1).standard_normal((37, n)) * 4).astype(dtype)
    cached = fn(x)
    raw = np.zeros(x.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    out = raw[start:start + x.nbytes].view(dtype).reshape(x.shape)
    monkeypatch.setattr(_memory, "STREAM_BYTES", 0)
    streamed = fn(x, out=out)
    assert streamed is out or np.shares_memory(streamed, out)
    np.testing.assert_array_equal(out, cached)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, ref(x, -1, log), rtol=tol, atol=tol)
