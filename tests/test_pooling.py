"""Pooling beyond the op table (tests/test_ops.py, driven by the specs in
nbops/pooling.py, whose references are the functions named after the
operators here): argmax indices, special-value contracts, the stride-two
vector kernels at every width, gradchecks on both devices, overlapping
windows in the backward, the nn modules and the kernel cache keys."""

import numpy as np
import pytest

import nbops
from nbops import nn
from nbops.autograd import Tensor, gradcheck
from helpers import host, to_dev

# ---------------------------------------------------------------------------
# References: loops over output positions and window offsets


def _ref_size(size, k, s, p, d, ceil):
    span = d * (k - 1) + 1
    q, r = divmod(size + 2 * p - span, s)
    n = q + 1 + (1 if ceil and r else 0)
    # PyTorch: with ceil_mode the last window must start inside the input
    # or the left padding
    if ceil and (n - 1) * s >= size + p:
        n -= 1
    return n


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def ref_max_pool2d(x, k, s=None, p=0, d=1, ceil=False):
    """Values and flat indices; NaN wins, then the first maximum."""
    (kh, kw), (ph, pw), (dh, dw) = _pair(k), _pair(p), _pair(d)
    sh, sw = _pair(s if s is not None else k)
    *lead, h, w = x.shape
    oh_n, ow_n = _ref_size(h, kh, sh, ph, dh, ceil), _ref_size(w, kw, sw, pw, dw, ceil)
    val = np.full(tuple(lead) + (oh_n, ow_n), -np.inf, x.dtype)
    idx = np.zeros(val.shape, np.int64)
    first = np.ones(val.shape, bool)
    for oh in range(oh_n):
        for ow in range(ow_n):
            for i in range(kh):
                for j in range(kw):
                    ih, iw = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                    if not (0 <= ih < h and 0 <= iw < w):
                        continue
                    v = x[..., ih, iw]
                    cur = val[..., oh, ow]
                    take = (v > cur) | np.isnan(v)
                    # the index starts at the first in-bounds element
                    set_idx = take | first[..., oh, ow]
                    val[..., oh, ow] = np.where(take, v, cur)
                    idx[..., oh, ow] = np.where(set_idx, ih * w + iw, idx[..., oh, ow])
                    first[..., oh, ow] = False
    return val, idx


def ref_avg_pool2d(x, k, s=None, p=0, ceil=False, include_pad=True, divisor=None):
    (kh, kw), (ph, pw) = _pair(k), _pair(p)
    sh, sw = _pair(s if s is not None else k)
    *lead, h, w = x.shape
    oh_n, ow_n = _ref_size(h, kh, sh, ph, 1, ceil), _ref_size(w, kw, sw, pw, 1, ceil)
    out = np.zeros(tuple(lead) + (oh_n, ow_n))
    for oh in range(oh_n):
        for ow in range(ow_n):
            total, inside, padded = 0.0, 0, 0
            for i in range(kh):
                for j in range(kw):
                    ih, iw = oh * sh - ph + i, ow * sw - pw + j
                    if ih < h + ph and iw < w + pw:  # windows end at the right padding
                        padded += 1
                    if 0 <= ih < h and 0 <= iw < w:
                        total = total + x[..., ih, iw].astype(np.float64)
                        inside += 1
            div = divisor or (padded if include_pad else inside)
            out[..., oh, ow] = total / div
    return out.astype(x.dtype)


def ref_adaptive_avg_pool2d(x, oh_n, ow_n):
    *lead, h, w = x.shape
    out = np.zeros(tuple(lead) + (oh_n, ow_n))
    for oh in range(oh_n):
        h0, h1 = int(np.floor(oh * h / oh_n)), int(np.ceil((oh + 1) * h / oh_n))
        for ow in range(ow_n):
            w0, w1 = int(np.floor(ow * w / ow_n)), int(np.ceil((ow + 1) * w / ow_n))
            out[..., oh, ow] = x[..., h0:h1, w0:w1].astype(np.float64).mean(axis=(-1, -2))
    return out.astype(x.dtype)


# ---------------------------------------------------------------------------
# The op table's references (tests/test_ops.py): the operators' signatures.
# 1-D pools are the 2-D references over planes of height 1.


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    val, idx = ref_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    return (val, idx) if return_indices else val


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return ref_avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override)


def adaptive_avg_pool2d(x, output_size):
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * 2
    return ref_adaptive_avg_pool2d(x, *(n if o is None else o
                                        for o, n in zip(sizes, x.shape[-2:])))


def global_avg_pool2d(x, keepdim=False):
    return x.astype(np.float64).mean(axis=(-2, -1), keepdims=keepdim)


def _one(v):
    """A 1-D pool's int or 1-tuple parameter as an int."""
    return v[0] if isinstance(v, (tuple, list)) else v


def _rows(result):
    """Drop the height-1 axis of a 2-D pool's result(s)."""
    if isinstance(result, tuple):
        return tuple(r[..., 0, :] for r in result)
    return result[..., 0, :]


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    stride = None if stride is None else (1, _one(stride))
    return _rows(max_pool2d(x[..., None, :], (1, _one(kernel_size)), stride,
                            (0, _one(padding)), (1, _one(dilation)), ceil_mode,
                            return_indices))


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    stride = None if stride is None else (1, _one(stride))
    return _rows(avg_pool2d(x[..., None, :], (1, _one(kernel_size)), stride,
                            (0, _one(padding)), ceil_mode, count_include_pad))


def adaptive_avg_pool1d(x, output_size):
    return _rows(ref_adaptive_avg_pool2d(x[..., None, :], 1, _one(output_size)))


def _rand(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------
# Forward beyond the table


REFERENCES = {"max_pool2d": max_pool2d, "max_pool1d": max_pool1d}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", list(REFERENCES))
def test_max_pool_indices_match_reference(op, dtype, device):
    # the op table compares values (its outputs are of x's dtype); the int64
    # argmax of return_indices (NaN wins, then the first maximum) is checked
    # here on the same samples
    fn = nbops.get_operator(op)
    for s in fn.spec.samples(dtype):
        if device == "cuda" and s.args[0].size > 128:  # the simulator is slow
            continue
        args = (to_dev(s.args[0], device),) + s.args[1:]
        y, idx = fn(*args, **s.kwargs, return_indices=True)
        want, want_idx = REFERENCES[op](s.args[0].astype(np.float64), *s.args[1:], **s.kwargs,
                                        return_indices=True)
        assert host(idx).dtype == np.int64, s.label
        np.testing.assert_array_equal(host(idx), want_idx, err_msg=s.label)
        np.testing.assert_array_equal(host(y), want.astype(dtype), err_msg=s.label)


def test_max_pool_nan_and_inf():
    x = np.full((1, 1, 4, 4), -np.inf)
    x[0, 0, 0, 1] = np.nan
    x[0, 0, 3, 3] = 1.0
    y, idx = nbops.max_pool2d(x, 2, return_indices=True)
    assert np.isnan(y[0, 0, 0, 0]) and idx[0, 0, 0, 0] == 1
    # an all -inf window: -inf at the window's first element, as PyTorch
    assert y[0, 0, 0, 1] == -np.inf and idx[0, 0, 0, 1] == 2
    assert y[0, 0, 1, 1] == 1.0 and idx[0, 0, 1, 1] == 15
    np.testing.assert_array_equal(nbops.max_pool2d(x, 2), y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride_two_rows_of_every_width(dtype):
    # the vertical pass over each scratch row (w columns) and the stride-2
    # horizontal pass (max and average) run in vector blocks of 16 (float32)
    # or 8 (float64) elements with a masked last block: widths on both sides
    # of one, two and four blocks, NaN and infinities at random
    rng = np.random.default_rng(3)
    for w in (3, 4, 17, 30, 31, 32, 33, 34, 47, 63, 64, 65, 66, 80):
        x = rng.standard_normal((1, 2, 5, w)).astype(dtype)
        special = rng.integers(0, x.size, 6)
        x.reshape(-1)[special] = np.array([np.nan, np.inf, -np.inf, np.nan, 0.0, np.nan], dtype)
        for k, p in ((3, 1), (2, 0), (3, 0)):
            if w + 2 * p < k:
                continue
            ref, _ = ref_max_pool2d(x, k, 2, p, 1, False)
            y = nbops.max_pool2d(x, k, 2, p)
            np.testing.assert_array_equal(y, ref)
            for inc in (True, False):   # NaN and infinities through the mean
                np.testing.assert_allclose(nbops.avg_pool2d(x, k, 2, p, False, inc),
                                           ref_avg_pool2d(x, k, 2, p, False, inc),
                                           rtol=1e-6 if dtype == np.float32 else 1e-14,
                                           atol=1e-6 if dtype == np.float32 else 1e-14)
            finite = np.nan_to_num(x, nan=0.5, posinf=3.0, neginf=-3.0)
            for ceil, inc, div in ((False, True, None), (True, False, None), (False, True, 5)):
                y = nbops.avg_pool2d(finite, k, 2, p, ceil, inc, div)
                want = ref_avg_pool2d(finite, k, 2, p, ceil, inc, div)
                np.testing.assert_allclose(y, want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                           atol=1e-6 if dtype == np.float32 else 1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride_two_mean_is_the_rounded_quotient(dtype):
    # integer inputs: every window sum is exact, so each mean must be the
    # sum divided by its count exactly as a division rounds it (the kernel
    # multiplies by the reciprocal and corrects once; the product alone
    # differs for a third of the sums over 3, 6 or 9)
    x = np.random.default_rng(4).integers(-100, 101, (2, 3, 11, 40)).astype(dtype)
    for k, p, inc in ((3, 1, True), (3, 1, False), (2, 0, True)):
        y = nbops.avg_pool2d(x, k, 2, p, False, inc)
        xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (p, p), (p, p)))
        win = np.lib.stride_tricks.sliding_window_view
        sums = win(xp, (k, k), axis=(2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1))
        counts = (np.full_like(sums, k * k) if inc else
                  win(ones, (k, k), axis=(2, 3))[:, :, ::2, ::2].sum(axis=(-2, -1)))
        np.testing.assert_array_equal(y, sums / counts)


# ---------------------------------------------------------------------------
# Backward


GRAD_CALLS = {
    "max_pool2d": lambda t: nbops.max_pool2d(t, 3, 2, 1, ceil_mode=True),
    "max_pool2d_dilated": lambda t: nbops.max_pool2d(t, (2, 3), 1, (1, 1), (2, 1)),
    "max_pool2d_indices": lambda t: nbops.max_pool2d(t, 2, 1, return_indices=True)[0],
    "avg_pool2d": lambda t: nbops.avg_pool2d(t, 3, 2, 1, ceil_mode=True),
    "avg_pool2d_no_pad": lambda t: nbops.avg_pool2d(t, 3, 2, 1, True, False),
    "avg_pool2d_divisor": lambda t: nbops.avg_pool2d(t, 2, 1, divisor_override=3),
    "adaptive_avg_pool2d": lambda t: nbops.adaptive_avg_pool2d(t, (2, 3)),
    "global_avg_pool2d": lambda t: nbops.global_avg_pool2d(t),
    "max_pool1d": lambda t: nbops.max_pool1d(t[0], 3, 2, 1),
    "avg_pool1d": lambda t: nbops.avg_pool1d(t[0], 3, 2, 1, True),
    "adaptive_avg_pool1d": lambda t: nbops.adaptive_avg_pool1d(t[0], 3),
}


@pytest.mark.parametrize("name", list(GRAD_CALLS))
def test_gradcheck(name, device):
    # distinct values spaced far more than gradcheck's step: no ties in max
    x = np.random.default_rng(1).permutation(35).reshape(1, 1, 5, 7) * 0.1
    if name.endswith("1d"):
        x = x[0]
        call = GRAD_CALLS[name]
        fn = lambda t: call(t[None])  # noqa: E731
    else:
        fn = GRAD_CALLS[name]
    assert gradcheck(fn, [Tensor(to_dev(x, device), requires_grad=True)])


def test_max_pool_backward_adds_overlapping_windows():
    x = _rand((2, 3, 7, 8))
    g = _rand((2, 3, 6, 7), seed=3)
    t = Tensor(x, requires_grad=True)
    nbops.max_pool2d(t, 2, 1).backward(g)
    _, idx = ref_max_pool2d(x, 2, 1)
    want = np.zeros((6, 56))
    for pl in range(6):
        np.add.at(want[pl], idx.reshape(6, -1)[pl], g.reshape(6, -1)[pl])
    np.testing.assert_allclose(t.grad, want.reshape(x.shape), rtol=1e-13)


# ---------------------------------------------------------------------------
# Bad input

# ---------------------------------------------------------------------------
# nn modules


def test_modules():
    x = _rand((2, 3, 9, 9))
    np.testing.assert_array_equal(nn.MaxPool2d(3, 2, 1)(x), nbops.max_pool2d(x, 3, 2, 1))
    y, idx = nn.MaxPool2d(2, return_indices=True, ceil_mode=True)(x)
    assert y.shape == idx.shape == (2, 3, 5, 5)
    np.testing.assert_array_equal(nn.AvgPool2d(3, 2, 1, count_include_pad=False)(x),
                                  nbops.avg_pool2d(x, 3, 2, 1, count_include_pad=False))
    np.testing.assert_array_equal(nn.MaxPool1d(2)(x[0]), nbops.max_pool1d(x[0], 2))
    np.testing.assert_array_equal(nn.AvgPool1d(3, 1, 1)(x[0]), nbops.avg_pool1d(x[0], 3, 1, 1))
    np.testing.assert_array_equal(nn.AdaptiveAvgPool1d(4)(x[0]), nbops.adaptive_avg_pool1d(x[0], 4))
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    np.testing.assert_allclose(head(x), x.mean(axis=(2, 3)), rtol=1e-13)
    assert "kernel_size=3" in repr(nn.MaxPool2d(3))
    assert list(nn.MaxPool2d(3).parameters()) == []


def test_flatten():
    x = np.arange(120.0).reshape(2, 3, 4, 5)
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, -1)(x).shape == (120,)
    assert nn.Flatten(1, 2)(x).shape == (2, 12, 5)
    assert nn.Flatten(-2)(x).shape == (2, 3, 20)
    np.testing.assert_array_equal(nn.Flatten()(x), x.reshape(2, 60))
    t = Tensor(x, requires_grad=True)
    (nn.Flatten()(t) * 2.0).sum().backward()
    np.testing.assert_array_equal(t.grad, np.full(x.shape, 2.0))
    with pytest.raises(ValueError, match="start_dim 3 comes after end_dim 1"):
        nn.Flatten(3, 1)(x)
    with pytest.raises(ValueError, match="'end_dim' is 4, out of range"):
        nn.Flatten(1, 4)(x)
    with pytest.raises(TypeError, match="'start_dim' must be an int"):
        nn.Flatten(1.0)


def test_model_trains_through_pooling():
    x = Tensor(_rand((2, 2, 6, 6)), requires_grad=True)
    model = nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(3, 1, 1), nn.AdaptiveAvgPool2d(2),
                          nn.Flatten(), nn.LogSoftmax(dim=1))
    out = model(x)
    assert isinstance(out, Tensor) and out.shape == (2, 8)
    out.sum().backward()
    assert x.grad.shape == x.shape and np.isfinite(x.grad).all()


def test_remembered_geometry_still_rejects_bad_types():
    x = np.zeros((1, 1, 6, 6))
    nbops.max_pool2d(x, 2, 1)
    with pytest.raises(TypeError, match="stride"):
        nbops.max_pool2d(x, 2, True)      # equal to 1, hashed like 1: not the same call
    nbops.avg_pool2d(x, 2, 2)
    with pytest.raises(TypeError, match="kernel_size"):
        nbops.avg_pool2d(x, 2.0, 2)


def test_pool_kernel_cache_keys_are_the_same_in_every_process():
    # Numba keys its disk cache on the pickled closure of a kernel: an
    # intrinsic object held there pickled differently in each process, so
    # the pooling kernels compiled again at every start
    code = (
        "import hashlib, numpy as np, nbops\n"
        "from nbops.cpu import pooling as P\n"
        "x = np.zeros((1, 1, 8, 8), np.float32)\n"
        "nbops.max_pool2d(x, 3, 2, 1); nbops.avg_pool2d(x, 3, 2, 1)\n"
        "keys = [repr(d._cache._index_key(d.signatures[0], d.targetctx.codegen()))\n"
        "        for d in list(P._max_rows.values()) + list(P._avg_rows.values())]\n"
        "print(hashlib.sha256(''.join(keys).encode()).hexdigest())\n")
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)]
    assert runs[0] and runs[0] == runs[1]
