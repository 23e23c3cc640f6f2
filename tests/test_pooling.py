"""Pooling operators against NumPy references written from the definitions
(explicit loops over windows), on both devices, with gradchecks and every
error path."""

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
# Configurations: (input shape, kernel, stride, padding, dilation, ceil_mode)

MAX_CONFIGS = [
    ((2, 3, 9, 11), 3, 2, 1, 1, False),          # ResNet's stem pool, odd sizes
    ((2, 3, 9, 11), 3, 2, 1, 1, True),
    ((1, 2, 8, 8), 2, None, 0, 1, False),        # batch 1, stride = kernel
    ((1, 2, 7, 7), 2, None, 0, 1, True),         # ceil adds a partial window
    ((2, 1, 10, 13), (3, 2), (2, 1), (1, 0), (2, 1), True),
    ((3, 7, 6), 3, 3, 1, 2, True),               # 3-D (C, H, W) input, dilation
    ((1, 2, 5, 5), 5, 1, 2, 1, False),           # window as large as the padded input
    ((2, 2, 6, 9), (1, 4), (1, 3), (0, 2), 1, True),
    ((1, 1, 4, 4), 2, 3, 1, 1, True),            # last window starts in the padding: dropped
]

AVG_CONFIGS = [
    # (shape, kernel, stride, padding, ceil, count_include_pad, divisor_override)
    ((2, 3, 9, 11), 3, 2, 1, False, True, None),
    ((2, 3, 9, 11), 3, 2, 1, True, False, None),
    ((1, 2, 7, 7), 2, None, 0, True, True, None),
    ((2, 1, 10, 13), (3, 2), (2, 1), (1, 0), True, True, None),
    ((3, 5, 6), 3, 2, 1, False, True, 4),
    ((1, 2, 5, 8), (2, 4), (3, 3), (1, 2), True, False, None),
]


def _rand(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# Every configuration in float64; float32 (one more compiled kernel per
# configuration) in test_float32 below.
@pytest.mark.parametrize("cfg", MAX_CONFIGS, ids=lambda c: str(c))
def test_max_pool2d_matches_reference(cfg):
    shape, k, s, p, d, ceil = cfg
    x = _rand(shape)
    ref, ridx = ref_max_pool2d(x, k, s, p, d, ceil)
    y = nbops.max_pool2d(x, k, s, p, d, ceil)
    assert y.dtype == np.float64 and y.shape == ref.shape
    np.testing.assert_array_equal(y, ref)
    y2, idx = nbops.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    np.testing.assert_array_equal(y2, ref)
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ridx)


@pytest.mark.parametrize("cfg", AVG_CONFIGS, ids=lambda c: str(c))
def test_avg_pool2d_matches_reference(cfg):
    shape, k, s, p, ceil, inc, div = cfg
    x = _rand(shape)
    ref = ref_avg_pool2d(x, k, s, p, ceil, inc, div)
    y = nbops.avg_pool2d(x, k, s, p, ceil, inc, div)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("hw,out", [((7, 9), (3, 4)), ((5, 5), (5, 5)), ((3, 4), (5, 7)),
                                    ((6, 6), (1, 1)), ((7, 5), (2, None))])
def test_adaptive_avg_pool2d_matches_reference(hw, out):
    x = _rand((2, 3) + hw)
    y = nbops.adaptive_avg_pool2d(x, out)
    full = tuple(hw[i] if o is None else o for i, o in enumerate(out))
    np.testing.assert_allclose(y, ref_adaptive_avg_pool2d(x, *full), rtol=1e-13)


def test_float32():
    x = _rand((2, 3, 9, 11), np.float32)
    x[1, 2, 4, 4] = np.nan
    for k, s, p, ceil in ((3, 2, 1, False), (3, 2, 1, True)):
        ref, ridx = ref_max_pool2d(x, k, s, p, 1, ceil)
        y, idx = nbops.max_pool2d(x, k, s, p, 1, ceil, return_indices=True)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(nbops.max_pool2d(x, k, s, p, 1, ceil), ref)
        np.testing.assert_array_equal(y, ref)
        np.testing.assert_array_equal(idx, ridx)
        for inc in (True, False):
            y = nbops.avg_pool2d(x, k, s, p, ceil, inc)
            assert y.dtype == np.float32
            np.testing.assert_allclose(y, ref_avg_pool2d(x, k, s, p, ceil, inc), rtol=1e-6,
                                       atol=1e-6)
    y = nbops.adaptive_avg_pool2d(x, (4, 3))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ref_adaptive_avg_pool2d(x, 4, 3), rtol=1e-6, atol=1e-6)


def test_pooling_on_cuda_matches_cpu(device):
    # tiny shapes: the simulator runs one Python thread per CUDA thread
    x = _rand((1, 2, 5, 7))
    x[0, 1, 2, 3] = np.nan
    calls = [
        lambda t: nbops.max_pool2d(t, 3, 2, 1, ceil_mode=True),
        lambda t: nbops.max_pool2d(t, (2, 3), 1, (1, 1), (2, 1), return_indices=True),
        lambda t: nbops.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda t: nbops.avg_pool2d(t, 2, divisor_override=3),
        lambda t: nbops.adaptive_avg_pool2d(t, (2, 3)),
        lambda t: nbops.global_avg_pool2d(t, keepdim=True),
        lambda t: nbops.max_pool1d(t[0], 3, 2, 1),
        lambda t: nbops.avg_pool1d(t[0], 2, 1, 1, count_include_pad=False),
        lambda t: nbops.adaptive_avg_pool1d(t[0], 3),
    ]
    for call in calls:
        want = call(x)
        got = host(call(to_dev(x, device)))
        if isinstance(want, tuple):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


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


def test_one_dimensional_pools_are_height_one_2d_pools():
    x = _rand((2, 3, 11))
    x4 = x[:, :, None, :]
    y, idx = nbops.max_pool1d(x, 3, 2, 1, 2, True, return_indices=True)
    ry, ridx = ref_max_pool2d(x4, (1, 3), (1, 2), (0, 1), (1, 2), True)
    np.testing.assert_array_equal(y, ry[:, :, 0])
    np.testing.assert_array_equal(idx, ridx[:, :, 0])
    np.testing.assert_allclose(nbops.avg_pool1d(x[0], 4, 3, 2, True, False),
                               ref_avg_pool2d(x4[0], (1, 4), (1, 3), (0, 2), True, False)[:, 0],
                               rtol=1e-13)
    np.testing.assert_allclose(nbops.adaptive_avg_pool1d(x, 4),
                               ref_adaptive_avg_pool2d(x4, 1, 4)[:, :, 0], rtol=1e-13)


def test_global_avg_pool2d():
    x = _rand((2, 3, 5, 7))
    np.testing.assert_allclose(nbops.global_avg_pool2d(x), x.mean(axis=(2, 3)), rtol=1e-13)
    assert nbops.global_avg_pool2d(x, keepdim=True).shape == (2, 3, 1, 1)
    assert nbops.global_avg_pool2d(x[0]).shape == (3,)


def test_out_strided_input_and_empty_batch():
    base = _rand((2, 3, 9, 16))
    x = base[:, :, :, ::2]  # a strided view
    out = np.empty((2, 3, 5, 4))
    assert nbops.max_pool2d(x, 3, 2, 1, out=out) is out
    np.testing.assert_array_equal(out, ref_max_pool2d(np.ascontiguousarray(x), 3, 2, 1)[0])
    assert nbops.avg_pool2d(x, 2, out=np.empty((2, 3, 4, 4))).shape == (2, 3, 4, 4)
    empty = np.zeros((0, 3, 6, 6))
    assert nbops.max_pool2d(empty, 2).shape == (0, 3, 3, 3)
    assert nbops.avg_pool2d(empty, 2).shape == (0, 3, 3, 3)
    assert nbops.adaptive_avg_pool2d(empty, 2).shape == (0, 3, 2, 2)


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

ERRORS = [
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4), np.int32), 2), TypeError, "'x'"),
    (lambda: nbops.max_pool2d(np.ones((4, 4)), 2), ValueError, "'x' must be 3-D or 4-D"),
    (lambda: nbops.max_pool1d(np.ones((1, 1, 1, 4)), 2), ValueError, "'x' must be 2-D or 3-D"),
    (lambda: nbops.max_pool2d(np.ones((1, 0, 4, 4)), 2), ValueError, "only the batch"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 5), ValueError,
     "'kernel_size' 5 .* larger than the padded input"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 3, dilation=2), ValueError,
     "'kernel_size' 3 \\(dilation 2, spanning 5\\) is larger"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 0), ValueError,
     "'kernel_size' must be >= 1"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, 0), ValueError,
     "'stride' must be >= 1"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, (1, -1)), ValueError,
     "'stride' must be >= 1"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, dilation=0), ValueError,
     "'dilation' must be >= 1"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, padding=-1), ValueError,
     "'padding' must be >= 0"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 3, padding=2), ValueError,
     "'padding' 2 must be at most half of kernel_size 3"),
    (lambda: nbops.avg_pool2d(np.ones((1, 1, 4, 4)), (2, 2), padding=(0, 2)), ValueError,
     "'padding' .* at most half"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2.0), TypeError,
     "'kernel_size' must be an int"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), (2, 2, 2)), ValueError,
     "'kernel_size' must be an int or a tuple of 2 ints"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, ceil_mode=1), TypeError, "'ceil_mode'"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, return_indices=None), TypeError,
     "'return_indices'"),
    (lambda: nbops.avg_pool2d(np.ones((1, 1, 4, 4)), 2, divisor_override=0), ValueError,
     "'divisor_override' must be >= 1"),
    (lambda: nbops.avg_pool2d(np.ones((1, 1, 4, 4)), 2, divisor_override=1.5), TypeError,
     "'divisor_override'"),
    (lambda: nbops.avg_pool2d(np.ones((1, 1, 4, 4)), 2, count_include_pad="yes"), TypeError,
     "'count_include_pad'"),
    (lambda: nbops.adaptive_avg_pool2d(np.ones((1, 1, 4, 4)), (0, 2)), ValueError,
     "'output_size' must be >= 1"),
    (lambda: nbops.adaptive_avg_pool1d(np.ones((1, 4)), -1), ValueError,
     "'output_size' must be >= 1"),
    (lambda: nbops.adaptive_avg_pool2d(np.ones((1, 1, 4, 4)), "a"), TypeError,
     "'output_size'"),
    (lambda: nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, out=np.ones((1, 1, 3, 3))), ValueError,
     "'out' must have shape \\(1, 1, 2, 2\\)"),
    (lambda: nbops.avg_pool2d(np.ones((1, 1, 4, 4)), 2, out=np.ones((1, 1, 2, 2), np.float32)),
     TypeError, "'out' must be float64"),
    (lambda: nbops.global_avg_pool2d(np.ones((1, 1, 4, 4)), keepdim=1), TypeError, "'keepdim'"),
]


@pytest.mark.parametrize("call,exc,match", ERRORS)
def test_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_mixed_devices_are_an_error():
    with pytest.raises(TypeError, match="'out' is on cuda but the inputs are on cpu"):
        nbops.max_pool2d(np.ones((1, 1, 4, 4)), 2, out=nbops.to_device(np.ones((1, 1, 2, 2))))


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
