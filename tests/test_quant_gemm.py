"""The int8 GEMM family of nbops.quant (matmul_integer, matmul, linear,
linear_dynamic, conv2d, pack_weight) and the requantization arithmetic.

References are NumPy int64 implementations of the ONNX formulas
(MatMulInteger, QLinearMatMul, QLinearConv) and of gemmlowp's fixed-point
requantization, written here from their definitions; integer results must
match bit for bit on both devices. Shapes are small and cross the CPU's
8 x 32 register tile and k-groups of four, and the simulator's 8 x 8 tiles.
"""

import importlib

import numpy as np
import pytest

from helpers import host, to_dev
from nbops.quant import QTensor
from nbops.quant import _requant as R

Q = importlib.import_module("nbops.quant.linear")
G = importlib.import_module("nbops.quant.cpu_gemm")

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------
# NumPy references


def ref_requant_fixed(acc, mult, shift, zp, qmin, qmax):
    """gemmlowp: SaturatingRoundingDoublingHighMul then RoundingDivideByPOT,
    vectorized in int64 (TFLite's MultiplyByQuantizedMultiplier)."""
    acc = np.asarray(acc, np.int64)
    mult = np.asarray(mult, np.int64)
    shift = np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    x = np.clip(acc << left, I32_MIN, I32_MAX)
    ab = x * mult
    t = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    hi = np.where(t >= 0, t >> 31, -((-t) >> 31))
    hi = np.where((x == I32_MIN) & (mult == I32_MIN), I32_MAX, hi)
    mask = (np.int64(1) << right) - 1
    rem = hi & mask
    thr = (mask >> 1) + (hi < 0)
    v = (hi >> right) + (rem > thr)
    return np.clip(v + zp, qmin, qmax)


def ref_requant_float(acc, real, zp, qmin, qmax):
    return np.clip(np.rint(np.asarray(acc, np.float64) * real) + zp, qmin, qmax)


def ref_matmul_integer(a, b, za, zb):
    za = np.asarray(za, np.int64)
    zb = np.asarray(zb, np.int64)
    a2 = a.astype(np.int64) - (za[:, None] if za.ndim else za)
    return np.matmul(a2, b.astype(np.int64) - zb)


def ref_conv(x, zx, w, zw, stride, pad, dil, groups):
    """QLinearConv's integer part: sum (x - zx) (w - zw) with zero padding of
    x - zx (i.e. padding by the zero point)."""
    n, c, hgt, wid = x.shape
    oc, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
    oh = (hgt + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wid + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    wz = w.astype(np.int64) - np.broadcast_to(np.asarray(zw, np.int64), (oc,))[:, None, None,
                                                                              None]
    out = np.zeros((n, oc, oh, ow), np.int64)
    ocg = oc // groups
    for o in range(oc):
        g = o // ocg
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dil[0], j * dil[1]
                patch = xp[:, g * cg:(g + 1) * cg, h0:h0 + stride[0] * (oh - 1) + 1:stride[0],
                           w0:w0 + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, o] += np.einsum("nchw,c->nhw", patch, wz[o, :, i, j])
    return out


def _real(s_in, s_w, s_out):
    # the scale product in float32, as ONNX's reference computes it
    return (np.float32(s_in) * np.asarray(s_w, np.float32) / np.float32(s_out)).astype(
        np.float32).astype(np.float64)


def _requant_ref(acc, real, zp, dtype, requant):
    qmin, qmax = (-128, 127) if np.dtype(dtype) == np.int8 else (0, 255)
    if requant == "float":
        return ref_requant_float(acc, real, zp, qmin, qmax)
    mult, shift = R.quantize_multipliers(real)
    shape = np.shape(real)
    return ref_requant_fixed(acc, mult.reshape(shape), shift.reshape(shape), zp, qmin, qmax)


# The op table's references (nbops/quant/linear.py names them): each op's
# arguments as the table passes them (int arrays as float64: cast back),
# its result as the op returns it.


def _ints64(v):
    return np.asarray(v).astype(np.int64)


def _unpromoted(acc, a_ndim, b_ndim):
    """``acc`` of the 2-D-promoted operands without the unit axes of a 1-D
    ``a`` (a row) or ``b`` (a column), as ``np.matmul`` drops them."""
    if a_ndim == 1:
        acc = acc[..., 0, :]
    if b_ndim == 1:
        acc = acc[..., 0]
    return acc


def ref_op_matmul_integer(a, b, a_zero_point=0, b_zero_point=0):
    a, b = _ints64(a), _ints64(b)
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = ref_matmul_integer(a2, b2, _ints64(a_zero_point), _ints64(b_zero_point))
    return _unpromoted(acc, a.ndim, b.ndim).astype(np.int32)


def ref_op_matmul(qa, qb, out_scale, out_zero_point, out_dtype=None, requant="fixed"):
    odt = np.dtype(qa.dtype if out_dtype is None else out_dtype)
    a, b = qa.values, qb.values
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = ref_matmul_integer(a2, b2, qa.zero_point, qb.zero_point)
    sb = np.broadcast_to(np.asarray(qb.scale, np.float32), (b2.shape[-1],))
    v = _requant_ref(acc, _real(qa.scale, sb, out_scale), out_zero_point, odt, requant)
    return QTensor(np.asarray(_unpromoted(v, a.ndim, b.ndim)).astype(odt), out_scale,
                   out_zero_point)


def _finish(acc, bias, s_in, qw, out_scale, out_zero_point, out_dtype, default, requant,
            channel_axis):
    """linear's and conv2d's epilogue on the int64 ``acc``: ``+ bias``, then
    float32 ``acc * (s_in * s_w)`` (no output scale) or requantized."""
    oc = qw.shape[0]
    where = [1] * acc.ndim
    where[channel_axis] = oc
    if bias is not None:
        acc = acc + _ints64(bias).reshape(where)
    sw = np.broadcast_to(np.asarray(qw.scale, np.float32), (oc,))
    if out_scale is None:
        return acc.astype(np.float32) * (np.float32(s_in) * sw).reshape(where)
    odt = np.dtype(default if out_dtype is None else out_dtype)
    v = _requant_ref(acc, _real(s_in, sw, out_scale).reshape(where), out_zero_point, odt,
                     requant)
    return QTensor(v.astype(odt), out_scale, out_zero_point)


def ref_op_linear(x, w, bias=None, out_scale=None, out_zero_point=None, out_dtype=None,
                  requant="fixed"):
    n, k = w.shape
    acc = ref_matmul_integer(x.values.reshape(-1, k), w.values.T, x.zero_point, w.zero_point)
    return _finish(acc.reshape(x.shape[:-1] + (n,)), bias, x.scale, w, out_scale,
                   out_zero_point, out_dtype, x.dtype, requant, -1)


def ref_op_linear_dynamic(x, w, bias=None):
    """x quantized to uint8 over its range extended to 0 (the division in
    float32, as quantize_per_tensor's), then ``acc * (s_x * s_w) + bias`` in
    float32."""
    x = x.astype(np.float32)
    lo = min(float(x.min()), 0.0) if x.size else 0.0
    hi = max(float(x.max()), 0.0) if x.size else 0.0
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = int(min(255, max(0, round(-lo / scale))))
    xq = np.clip(np.rint(x / np.float32(scale)).astype(np.float64) + zp, 0, 255)
    n, k = w.shape
    acc = ref_matmul_integer(xq.astype(np.int64).reshape(-1, k), w.values.T, zp, w.zero_point)
    sw = np.broadcast_to(np.asarray(w.scale, np.float32), (n,))
    out = acc.astype(np.float32) * (np.float32(scale) * sw)
    if bias is not None:
        out = out + bias.astype(np.float32)
    return out.reshape(x.shape[:-1] + (n,))


def ref_op_conv2d(qx, qw, bias=None, stride=1, padding=0, dilation=1, groups=1,
                  out_scale=None, out_zero_point=None, out_dtype=None, requant="fixed"):
    pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
    acc = ref_conv(qx.values, qx.zero_point, qw.values, qw.zero_point, pair(stride),
                   pair(padding), pair(dilation), groups)
    return _finish(acc, bias, qx.scale, qw, out_scale, out_zero_point, out_dtype, qx.dtype,
                   requant, 1)


def _ints(shape, dtype):
    lo, hi = (-128, 128) if np.dtype(dtype) == np.int8 else (0, 256)
    return RNG.integers(lo, hi, shape).astype(dtype)


def _qt(values, scale, zp, device, axis=None):
    return QTensor(to_dev(values, device), scale, zp, axis=axis)


# ---------------------------------------------------------------------------
# Fixed-point arithmetic


def test_quantize_multiplier_normalised_and_close():
    reals = np.concatenate([np.exp(RNG.uniform(np.log(1e-9), np.log(1000.0), 500)),
                            [0.5, 1.0, 0.75, 2.0**-31, 1 - 2.0**-40]])
    for real in reals:
        m, shift = R.quantize_multiplier(real)
        assert isinstance(m, np.int32) and 2**30 <= int(m) < 2**31
        assert abs(int(m) * 2.0**(shift - 31) - real) <= real * 2.0**-30
    assert R.quantize_multiplier(0.0) == (0, 0)
    assert R.quantize_multiplier(2.0**-40) == (0, 0)  # scales every int32 to 0


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), 2.0**31])
def test_quantize_multiplier_rejects(bad):
    with pytest.raises(ValueError, match="multiplier"):
        R.quantize_multiplier(bad)


def test_requantize_scalar_matches_int64_reference():
    n = 4000
    acc = RNG.integers(I32_MIN, I32_MAX, n, endpoint=True)
    acc[:200] = RNG.integers(-3000, 3000, 200)
    acc[200:204] = [I32_MIN, I32_MAX, 0, -1]
    reals = np.exp(RNG.uniform(np.log(1e-10), np.log(50.0), n))
    reals[:100] = 2.0 ** -RNG.integers(1, 12, 100)  # exact halves: rounding ties
    mult, shift = R.quantize_multipliers(reals)
    mult[204] = I32_MIN  # the saturating case of the doubling high multiply
    acc[204] = I32_MIN
    shift[204] = 0
    want = ref_requant_fixed(acc, mult, shift, -3, -128, 127)
    got = [R.requantize(int(a), int(m), int(s), -3, -128, 127)
           for a, m, s in zip(acc, mult, shift)]
    np.testing.assert_array_equal(got, want)
    # and the fixed-point result is the float one within one step
    near = np.abs(acc * reals) < 100
    flt = ref_requant_float(acc, reals, -3, -128, 127)
    assert np.abs(want - flt)[near].max() <= 1


# ---------------------------------------------------------------------------
# MatMulInteger

MATMUL_INTEGER = [
    # a shape, b shape, a dtype, b dtype, a zero point, b zero point
    ((9, 37), (37, 40), np.uint8, np.int8, 0, 0),
    ((2, 13, 7), (7, 33), np.uint8, np.uint8, "rows", "cols"),
    ((3, 1, 5, 10), (2, 10, 9), np.int8, np.int8, -7, 3),
    ((17,), (17, 6), np.int8, np.uint8, 12, "cols"),
    ((4, 6), (6,), np.uint8, np.int8, "rows", -128),
    ((5, 0), (0, 3), np.uint8, np.int8, 1, 2),
]


@pytest.mark.parametrize("case", MATMUL_INTEGER, ids=lambda c: f"{c[0]}x{c[1]}")
def test_matmul_integer(device, case):
    sa, sb, da, db, za, zb = case
    a, b = _ints(sa, da), _ints(sb, db)
    m = sa[-2] if len(sa) > 1 else 1
    n = sb[-1] if len(sb) > 1 else 1
    if za == "rows":
        za = _ints((m,), da)
    if zb == "cols":
        zb = _ints((n,), db)
    got = Q.matmul_integer(to_dev(a, device), to_dev(b, device), za, zb)
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    want = ref_matmul_integer(a2, b2, za, zb)
    if a.ndim == 1:
        want = want[..., 0, :]
    if b.ndim == 1:
        want = want[..., 0]
    assert host(got).dtype == np.int32
    np.testing.assert_array_equal(host(got), want)


def test_matmul_integer_out(device):
    # the op table's out= checks pass float arrays: the int32 out= is checked here
    a, b = _ints((5, 9), np.uint8), _ints((9, 4), np.int8)
    ad, bd = to_dev(a, device), to_dev(b, device)
    out = to_dev(np.empty((5, 4), np.int32), device)
    assert Q.matmul_integer(ad, bd, 3, -2, out=out) is out
    np.testing.assert_array_equal(host(out), ref_matmul_integer(a, b, 3, -2))
    with pytest.raises(ValueError, match="quant.matmul_integer: argument 'out' must have "
                                         "shape"):
        Q.matmul_integer(ad, bd, out=to_dev(np.empty((4, 5), np.int32), device))
    with pytest.raises(TypeError, match="quant.matmul_integer: argument 'out' must be int32, "
                                        "got float32"):
        Q.matmul_integer(ad, bd, out=to_dev(np.empty((5, 4), np.float32), device))
    with pytest.raises(TypeError, match="quant.matmul_integer: arguments are on different "
                                        "devices"):
        Q.matmul_integer(ad, bd, out=to_dev(np.empty((5, 4), np.int32),
                                            "cuda" if device == "cpu" else "cpu"))


def test_matmul_integer_strided_operands():
    a = _ints((20, 30), np.uint8)[::2, 1::2]  # 10 x 15, both strides non-unit
    b = _ints((15, 12), np.int8).T.copy().T  # column-major
    np.testing.assert_array_equal(Q.matmul_integer(a, b, 3, -2),
                                  ref_matmul_integer(a, b, 3, -2))


# ---------------------------------------------------------------------------
# QLinearMatMul, linear, conv2d: requantized outputs bit for bit

@pytest.mark.parametrize("requant", ["fixed", "float"])
def test_qlinear_matmul(device, requant):
    a, b = _ints((2, 11, 21), np.uint8), _ints((21, 19), np.int8)
    sb = RNG.uniform(0.002, 0.02, 19)
    qa = _qt(a, 0.05, 131, device)
    qb = _qt(b, sb, np.zeros(19, np.int32), device, axis=1)
    got = Q.matmul(qa, qb, out_scale=0.08, out_zero_point=-5, out_dtype=np.int8,
                   requant=requant)
    acc = ref_matmul_integer(a, b, 131, 0)
    want = _requant_ref(acc, _real(0.05, qb.scale, 0.08), -5, np.int8, requant)
    assert isinstance(got, QTensor) and got.dtype == np.int8
    assert (got.scale, got.zero_point) == (0.08, -5)
    np.testing.assert_array_equal(host(got.values), want)


LINEAR = [
    # x dtype, w dtype, per-channel weights, bias, out dtype (None: float)
    (np.uint8, np.int8, True, True, np.uint8),
    (np.int8, np.int8, False, True, np.int8),
    (np.uint8, np.uint8, True, False, np.int8),
    (np.int8, np.int8, True, True, None),
]


@pytest.mark.parametrize("case,requant", [
    (c, rq) for c in LINEAR for rq in (("fixed", "float") if c[4] else ("none",))], ids=str)
def test_linear(device, case, requant):
    dx, dw, per_channel, with_bias, dout = case
    x, w = _ints((3, 3, 45), dx), _ints((35, 45), dw)
    zx = 7 if dx == np.int8 else 140
    if per_channel:
        sw = RNG.uniform(0.001, 0.01, 35)
        zw = _ints((35,), dw) // 8 + (0 if dw == np.int8 else 100)
        qw = _qt(w, sw, zw, device, axis=0)
    else:
        sw, zw = 0.004, (-3 if dw == np.int8 else 128)
        qw = _qt(w, sw, zw, device)
    bias = RNG.integers(-5000, 5000, 35).astype(np.int32) if with_bias else None
    qx = _qt(x, 0.03, zx, device)
    acc = ref_matmul_integer(x.reshape(9, 45), w.T, zx, zw).reshape(3, 3, 35)
    acc = acc + (bias if with_bias else 0)
    b = None if bias is None else to_dev(bias, device)
    if dout is None:
        got = host(Q.linear(qx, qw, b))
        want = acc.astype(np.float32) * (np.float32(0.03) * np.asarray(sw, np.float32))
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        return
    got = Q.linear(qx, Q.pack_weight(qw) if device == "cpu" else qw, b, out_scale=0.06,
                   out_zero_point=-9 if dout == np.int8 else 77, out_dtype=dout,
                   requant=requant)
    want = _requant_ref(acc, _real(0.03, np.broadcast_to(sw, (35,)), 0.06),
                        -9 if dout == np.int8 else 77, dout, requant)
    assert got.dtype == dout
    np.testing.assert_array_equal(host(got.values), want)


def test_linear_dequantized_within_one_step_of_float():
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    w = (RNG.standard_normal((24, 64)) * 0.1).astype(np.float32)
    sx = (x.max() - x.min()) / 255
    zx = int(round(-x.min() / sx))
    sw = np.abs(w).max(axis=1) / 127
    qx = QTensor(np.clip(np.rint(x / sx) + zx, 0, 255).astype(np.uint8), sx, zx)
    qw = QTensor(np.clip(np.rint(w / sw[:, None]), -127, 127).astype(np.int8), sw,
                 np.zeros(24, np.int32), axis=0)
    exact = qx.dequantize().astype(np.float64) @ qw.dequantize().astype(np.float64).T
    np.testing.assert_allclose(Q.linear(qx, qw), exact, rtol=1e-5, atol=1e-5)
    so = (exact.max() - exact.min()) / 255
    zo = int(round(-exact.min() / so))
    q = Q.linear(qx, qw, out_scale=so, out_zero_point=zo, out_dtype=np.uint8)
    assert np.abs(q.dequantize() - exact).max() <= so
    # and the whole pipeline stays within a few steps of the float product
    assert np.abs(Q.linear(qx, qw) - x @ w.T).max() < 64 * sx * sw.max() + sx + sw.max()


def test_linear_dynamic(device):
    x = RNG.standard_normal((2, 5, 40)).astype(np.float32)
    w = (RNG.standard_normal((21, 40)) * 0.2).astype(np.float32)
    bias = RNG.standard_normal(21).astype(np.float32)
    sw = np.abs(w).max(axis=1) / 127
    qw = _qt(np.rint(w / sw[:, None]).astype(np.int8), sw, np.zeros(21, np.int32), device,
             axis=0)
    pw = Q.pack_weight(qw)
    got = host(Q.linear_dynamic(to_dev(x, device), pw, to_dev(bias, device)))
    lo, hi = min(x.min(), 0), max(x.max(), 0)
    sx = np.float32((hi - lo) / 255)
    zx = int(round(-lo / sx))
    xq = np.clip(np.rint(x / sx) + zx, 0, 255)
    acc = (xq.reshape(10, 40) - zx) @ np.rint(w / sw[:, None]).T
    want = (acc * (sx * sw.astype(np.float32))).reshape(2, 5, 21) + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(got - (x @ w.T + bias)).max() < 0.1


CONV = [
    # x shape, w shape, stride, padding, dilation, groups, x dtype
    ((1, 3, 9, 10), (5, 3, 3, 3), 1, 1, 1, 1, np.uint8),
    ((2, 4, 7, 6), (6, 2, 3, 3), (2, 1), 1, (1, 2), 2, np.uint8),
    ((1, 6, 5, 5), (6, 1, 3, 3), 1, 0, 1, 6, np.int8),
    ((1, 8, 4, 4), (9, 8, 1, 1), 2, 0, 1, 1, np.int8),
]


@pytest.mark.parametrize("requant", ["fixed", "float", None])
@pytest.mark.parametrize("case", CONV, ids=lambda c: f"{c[0]}*{c[1]}")
def test_qlinear_conv(device, case, requant):
    _check_qlinear_conv(device, case, requant)


def _check_qlinear_conv(device, case, requant):
    # QLinearConv with per-channel weights and an int32 bias against the
    # integer reference: float32 output, or requantized to uint8
    sx_shape, sw_shape, st, pad, dil, groups, dx = case
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    x, w = _ints(sx_shape, dx), _ints(sw_shape, np.int8)
    oc = sw_shape[0]
    zx = 130 if dx == np.uint8 else -6
    sw = RNG.uniform(0.002, 0.02, oc)
    zw = RNG.integers(-4, 5, oc)
    bias = RNG.integers(-3000, 3000, oc).astype(np.int32)
    qx, qw = _qt(x, 0.04, zx, device), _qt(w, sw, zw, device, axis=0)
    acc = ref_conv(x, zx, w, zw, pair(st), pair(pad), pair(dil), groups)
    acc = acc + bias[None, :, None, None]
    kw = dict(stride=st, padding=pad, dilation=dil, groups=groups)
    if requant is None:
        got = host(Q.conv2d(qx, qw, to_dev(bias, device), **kw))
        want = acc.astype(np.float32) * (np.float32(0.04) * sw.astype(np.float32))[
            None, :, None, None]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        return
    got = Q.conv2d(qx, qw, to_dev(bias, device), out_scale=0.1, out_zero_point=100,
                   out_dtype=np.uint8, requant=requant, **kw)
    real = _real(0.04, sw, 0.1)[None, :, None, None]
    want = _requant_ref(acc, real, 100, np.uint8, requant)
    np.testing.assert_array_equal(host(got.values), want)


# Shapes whose tiles are full (32 output pixels and 8 channels) as well as
# partial: the packer's direct path (a 1x1 sliver in one run), its gathered
# runs at strides 1, 2 (the stem's) and 3, a last group of fewer than four
# taps, and the epilogue's full-width row functions. CPU only: the CUDA
# simulator would take minutes on them.
CONV_FULL_TILES = [
    # x shape, w shape, stride, padding, dilation, groups, x dtype
    ((1, 8, 12, 12), (16, 8, 1, 1), 1, 0, 1, 1, np.uint8),
    ((1, 3, 19, 19), (8, 3, 7, 7), 2, 3, 1, 1, np.uint8),
    ((1, 5, 20, 20), (9, 5, 3, 3), 3, 1, 1, 1, np.int8),
    ((2, 6, 10, 13), (12, 6, 3, 3), 1, 1, 1, 1, np.int8),
]


@pytest.mark.parametrize("requant", ["fixed", "float", None])
@pytest.mark.parametrize("case", CONV_FULL_TILES, ids=lambda c: f"{c[0]}*{c[1]}")
def test_qlinear_conv_full_tiles(case, requant):
    _check_qlinear_conv("cpu", case, requant)


def test_conv_int32_epilogue_full_tiles():
    # the int32 mode (no requantization) of the conv kernel, on full tiles
    x, w = _ints((1, 8, 12, 12), np.uint8), _ints((16, 8, 3, 3), np.int8)
    qw = QTensor(w, 1.0, 3)
    pw = Q.pack_weight(qw)
    gemm = importlib.import_module("nbops.quant.cpu_gemm")
    out = np.empty((1, 16, 12, 12), np.int32)
    e32 = np.empty(0, np.int32)
    epi = (0, e32, e32, e32, 0, 0, 0, np.empty(0), np.empty(0, np.float32), True)
    gemm.conv2d_op(x, 0, 7, pw, ((1, 1), (1, 1), (1, 1)), (12, 12), out, epi)
    want = ref_conv(x, 7, w, np.full(16, 3), (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_array_equal(out, want)


def test_packed_conv_weight_is_reused():
    x, w = _ints((1, 4, 6, 6), np.uint8), _ints((8, 2, 3, 3), np.int8)
    qx, qw = QTensor(x, 0.1, 128), QTensor(w, 0.01, 0)
    pw = Q.pack_weight(qw, groups=2)
    a = Q.conv2d(qx, pw, groups=2, padding=1)
    np.testing.assert_array_equal(a, Q.conv2d(qx, qw, groups=2, padding=1))
    with pytest.raises(ValueError, match="groups=2"):
        Q.conv2d(qx, pw, groups=1)


# ---------------------------------------------------------------------------
# The CPU kernels themselves


def test_portable_micro_kernel_matches():
    # the fallback for CPUs without VNNI, run here on the same packed operands
    a, b = _ints((11, 23), np.uint8), _ints((23, 35), np.int8)
    apk, rs = G.pack_a(a.reshape(-1), 0, 23, 1, 11, 23, 0)
    bpk, cs = G.pack_b(b.view(np.uint8).reshape(-1), 0, 35, 1, 23, 35, 0)
    e = np.empty(0, np.int32)
    for kind in ("portable",) + (("vnni",) if G.has_vnni() else ()):
        out = np.empty((11, 35), np.int32)
        G.gemm(apk, rs, np.zeros(11, np.int32), bpk, cs, np.zeros(35, np.int32), 11, 35, 23,
               out, 0, e, e, e, 0, 0, 0, np.empty(0), np.empty(0, np.float32), kind=kind)
        np.testing.assert_array_equal(out, a.astype(np.int64) @ b)


@pytest.mark.skipif(not G.has_vnni(), reason="the host CPU has no AVX-512 VNNI")
def test_vnni_kernel_emits_vpdpbusd():
    from numba import njit

    micro = G._make_micro(G.MR, G.NR)  # a fresh, uncached copy: its assembly is readable

    @njit
    def call(kq, a, b, c):
        micro(kq, a, 0, b, 0, c)

    w = np.zeros(64 * G.NR, np.int32)
    c = np.zeros(G.MR * G.NR, np.int32)
    call(64, w, w, c)
    asm = call.inspect_asm(call.signatures[0])
    # one per zmm accumulator of the 8 x 32 tile, per (unrolled) k step
    assert asm.count("vpdpbusd\t%zmm") >= G.MR * G.NR // 16
    assert "vpmaddubsw" not in asm and "vpmulld" not in asm


# ---------------------------------------------------------------------------
# Errors of what is not an operator (the operators' bad calls are in their
# specs, run by the op table)

@pytest.mark.parametrize("call,exc,match", [
    (lambda: Q.pack_weight(np.zeros((3, 8), np.int8)), TypeError, "wrap integer values"),
    (lambda: Q.pack_weight(QTensor(np.zeros((3, 8, 2), np.int8), 0.1, 0)), ValueError,
     "2-D \\(linear\\) or 4-D"),
    (lambda: QTensor(np.zeros((3, 8), np.int8), np.ones(4), np.zeros(4), axis=0), ValueError,
     "one entry per channel"),
])
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_errors_name_the_operator_and_mixed_devices():
    from numba import cuda

    u8, s8 = np.zeros((4, 8), np.uint8), np.zeros((8, 3), np.int8)
    with pytest.raises(TypeError, match="quant.matmul_integer"):
        Q.matmul_integer(cuda.to_device(u8), s8)
