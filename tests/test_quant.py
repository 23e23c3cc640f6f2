"""nbops.quant: QTensor, quantize/dequantize, observers, elementwise and
pooling operators, and the model-level API.

References are NumPy transcriptions of the formulas (ONNX QuantizeLinear /
DequantizeLinear, PyTorch's observer formulas, gemmlowp's fixed-point
requantization), written here independently of the kernels; onnxruntime is
the external check of QuantizeLinear. CUDA runs on tiny shapes (simulator
without a GPU). The int8 GEMM family has its own file (test_quant_gemm.py).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nbops
from nbops import quant as Q
from nbops.pooling import _out_size
from nbops.quant import observers as O
from nbops.quant._requant import quantize_multiplier
from helpers import host, to_dev

RANGES = {np.int8: (-128, 127), np.uint8: (0, 255)}


def onnx_quantize(x, scale, zp, dtype, axis=None):
    """ONNX QuantizeLinear, written from the spec: saturate(rint(x / s) + zp),
    the division in x's precision (the scale has x's type; per-channel
    scales are float32 first, as a QTensor stores them)."""
    s = np.asarray(scale, np.float32 if axis is not None else x.dtype).astype(x.dtype)
    z = np.asarray(zp, np.int64)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    with np.errstate(invalid="ignore"):
        v = np.rint(x / s) + z
        v = np.where(np.isnan(v), z, v)  # nbops' documented choice for NaN
    return np.clip(v, *RANGES[dtype]).astype(dtype)


def ref_dequantize(q, dtype=np.float32):
    """ONNX DequantizeLinear in float64, the op table's reference:
    ``(q - zero_point) * scale`` with the scale as the op applies it (cast
    to ``dtype``; per-channel scales are float32). The product is exact in
    float64 for float32, rounded once as the op's for float64."""
    v = np.asarray(q.values, np.float64)
    if q.axis is None:
        return np.asarray((v - q.zero_point) * np.float64(np.dtype(dtype).type(q.scale)))
    shape = [1] * q.ndim
    shape[q.axis] = -1
    scale = q.scale.astype(dtype).astype(np.float64).reshape(shape)
    return (v - q.zero_point.reshape(shape)) * scale


def _precision(scale):
    """x's float type in a quantizer sample, whose arrays reach an op table
    reference as float64: the sample gives the scale(s) in x's type."""
    d = np.asarray(scale).dtype
    return d if d.kind == "f" else np.dtype(np.float64)


def ref_quantize_per_tensor(x, scale, zero_point, dtype):
    """The op table's reference: :func:`onnx_quantize` in x's precision."""
    x = x.astype(_precision(scale))
    values = np.asarray(onnx_quantize(x, scale, zero_point, np.dtype(dtype).type))
    return Q.QTensor(values, scale, zero_point)


def ref_quantize_per_channel(x, scales, zero_points, axis, dtype):
    """The op table's reference: :func:`onnx_quantize` per channel in x's
    precision (int arrays arrive as float64: cast back)."""
    x = x.astype(_precision(scales))
    zps = np.asarray(zero_points).astype(np.int64)
    return Q.QTensor(onnx_quantize(x, scales, zps, np.dtype(dtype).type, axis), scales, zps,
                     axis=axis)


def special_values(dtype):
    """Ties at every half step, saturation both ways, signed zeros, NaN."""
    ties = np.arange(-6, 6) + 0.5
    return np.concatenate([ties, [0.0, -0.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 127.49,
                                  127.5, 128.5, -128.5, -129.5, 255.5, 256.5]]).astype(dtype)


# ---------------------------------------------------------------------------
# QTensor


def test_qtensor_attributes_and_repr():
    q = Q.QTensor(np.array([[1, 2, 3]], np.int8), 0.25, -3)
    assert (q.shape, q.dtype, q.device, q.axis, q.ndim, q.size) == ((1, 3), np.int8, "cpu",
                                                                    None, 2, 3)
    assert q.q_scale() == 0.25 and q.q_zero_point() == -3 and q.int_repr() is q.values
    assert "scale=0.25" in repr(q) and "int8" in repr(q)
    np.testing.assert_array_equal(q.dequantize(), [[1.0, 1.25, 1.5]])
    with pytest.raises(ValueError, match="per tensor"):
        q.q_per_channel_scales()
    p = Q.QTensor(np.zeros((2, 3), np.uint8), np.array([0.5, 1.0, 2.0]), [0, 1, 255], axis=-1)
    assert p.axis == 1 and p.scale.dtype == np.float32 and p.zero_point.dtype == np.int32
    np.testing.assert_array_equal(p.q_per_channel_zero_points(), [0, 1, 255])
    assert p.q_per_channel_axis() == 1 and "axis=1" in repr(p)
    with pytest.raises(ValueError, match="per channel"):
        p.q_scale()
    np.testing.assert_array_equal(p.dequantize(np.float64), [[0, -1, -510]] * 2)


def test_qtensor_device_transfer():
    q = Q.QTensor(np.arange(-3, 3, dtype=np.int8), 0.5, 1)
    d = q.to_device()
    assert d.device == "cuda" and d.to_device() is d and d.q_scale() == 0.5
    h = d.to_host()
    assert h.device == "cpu" and h.to_host() is h
    np.testing.assert_array_equal(h.values, q.values)
    np.testing.assert_array_equal(host(d.dequantize()), q.dequantize())


@pytest.mark.parametrize("args, err, match", [
    ((np.zeros(3, np.float32), 1.0, 0), TypeError, "int8 or uint8, got float32"),
    ((np.zeros(3, np.int32), 1.0, 0), TypeError, "int8 or uint8, got int32"),
    (([1, 2], 1.0, 0), TypeError, "'values' must be"),
    ((np.zeros(3, np.int8), 0.0, 0), ValueError, "positive and finite"),
    ((np.zeros(3, np.int8), -1.0, 0), ValueError, "positive and finite"),
    ((np.zeros(3, np.int8), np.nan, 0), ValueError, "positive and finite"),
    ((np.zeros(3, np.int8), np.inf, 0), ValueError, "positive and finite"),
    ((np.zeros(3, np.int8), "1", 0), TypeError, "'scale' must be a positive float"),
    ((np.zeros(3, np.int8), [1.0, 2.0, 3.0], 0), TypeError, "pass axis="),
    ((np.zeros(3, np.int8), 1.0, 128), ValueError, r"\[-128, 127\] for int8, got 128"),
    ((np.zeros(3, np.uint8), 1.0, -1), ValueError, r"\[0, 255\] for uint8, got -1"),
    ((np.zeros(3, np.uint8), 1.0, 0.5), TypeError, "'zero_point' must be an int"),
    ((np.zeros((2, 3), np.int8), [1.0, 2.0], [0, 0], 1), ValueError, r"shape \(3,\)"),
    ((np.zeros((2, 3), np.int8), [1.0, 2.0], [0, 0, 0], 0), ValueError, r"shape \(2,\)"),
    ((np.zeros((2, 3), np.int8), [1.0, -2.0], [0, 0], 0), ValueError, "channel 1"),
    ((np.zeros((2, 3), np.int8), [1.0, 2.0], [0, 200], 0), ValueError, "got 200 at channel 1"),
    ((np.zeros((2, 3), np.int8), 1.0, 0, 0), TypeError, "scalar"),
    ((np.zeros((2, 3), np.int8), [1.0, 2.0], [0, 0], 2), ValueError, "out of range"),
])
def test_qtensor_validation(args, err, match):
    with pytest.raises(err, match=match):
        Q.QTensor(*args)


# ---------------------------------------------------------------------------
# quantize / dequantize


@pytest.mark.parametrize("xdtype, qdtype", [(np.float32, np.int8), (np.float32, np.uint8),
                                            (np.float64, np.int8), (np.float64, np.uint8)])
def test_quantize_per_tensor_matches_onnx(xdtype, qdtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([special_values(xdtype), rng.normal(0, 40, 1000).astype(xdtype)])
    for scale, zp in [(1.0, 0), (0.5, 3), (0.1, RANGES[qdtype][0] + 10), (3.7, 100)]:
        zp = int(np.clip(zp, *RANGES[qdtype]))
        q = Q.quantize_per_tensor(x, scale, zp, qdtype)
        assert q.dtype == qdtype and q.q_scale() == scale and q.q_zero_point() == zp
        np.testing.assert_array_equal(q.values, onnx_quantize(x, scale, zp, qdtype))


def test_quantize_ties_and_saturation_explicitly():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -128.5, 1e9, -1e9, np.nan],
                 np.float32)
    np.testing.assert_array_equal(Q.quantize_per_tensor(x, 1.0, 0, np.int8).values,
                                  [0, 2, 2, 0, -2, -2, 126, 127, -128, 127, -128, 0])
    np.testing.assert_array_equal(Q.quantize_per_tensor(x, 1.0, 128, np.uint8).values,
                                  [128, 130, 130, 128, 126, 126, 254, 255, 0, 255, 0, 128])


def test_quantize_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    x = np.concatenate([special_values(np.float32), rng.normal(0, 30, 500).astype(np.float32)])
    x = x[~np.isnan(x)]  # ONNX leaves NaN unspecified (ORT gives 0, nbops the zero point)
    for qdtype, ttype, zp in [(np.uint8, TensorProto.UINT8, 128), (np.int8, TensorProto.INT8, -5)]:
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
        graph = helper.make_graph(
            [node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
            [helper.make_tensor_value_info("y", ttype, [x.size])],
            [helper.make_tensor("s", TensorProto.FLOAT, [], [0.37]),
             helper.make_tensor("z", ttype, [], [zp])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(Q.quantize_per_tensor(x, 0.37, zp, qdtype).values, want)


def test_quantize_and_dequantize_on_device(device):
    # 3 * 32 + 1 elements: crosses the simulator's blocks and leaves a partial one
    x = np.concatenate([special_values(np.float32),
                        np.linspace(-20, 20, 97 - 28, dtype=np.float32)])
    q = Q.quantize_per_tensor(to_dev(x, device), 0.25, 7, np.int8)
    assert q.device == device
    np.testing.assert_array_equal(host(q.values), onnx_quantize(x, 0.25, 7, np.int8))
    want = (onnx_quantize(x, 0.25, 7, np.int8).astype(np.float32) - 7) * np.float32(0.25)
    np.testing.assert_array_equal(host(Q.dequantize(q)), want)
    w = np.linspace(-3, 3, 2 * 3 * 5).reshape(2, 3, 5)
    scales, zps = [0.02, 0.05, 0.1], [0, 10, 255]
    p = Q.quantize_per_channel(to_dev(w, device), scales, zps, 1, np.uint8)
    np.testing.assert_array_equal(host(p.values), onnx_quantize(w, scales, zps, np.uint8, 1))
    deq = (host(p.values).astype(np.float64) - np.array(zps)[:, None]) \
        * np.array(scales, np.float32).astype(np.float64)[:, None]
    np.testing.assert_array_equal(host(p.dequantize(np.float64)), deq)


@pytest.mark.parametrize("shape, axis", [((4, 6), 0), ((4, 6), -1), ((2, 3, 5), 1), ((5,), 0),
                                         ((3, 0), 0), ((0, 3), 1)])
def test_quantize_per_channel_matches_onnx(shape, axis):
    rng = np.random.default_rng(2)
    x = rng.normal(0, 5, shape).astype(np.float32)
    c = shape[axis]
    scales = rng.uniform(0.01, 0.5, c)
    zps = rng.integers(-20, 20, c)
    q = Q.quantize_per_channel(x, scales, zps, axis, np.int8)
    assert q.axis == axis % len(shape)
    np.testing.assert_array_equal(q.values, onnx_quantize(x, scales, zps, np.int8, axis))
    d = Q.dequantize(q)
    shp = [1] * len(shape)
    shp[axis] = -1
    want = (q.values.astype(np.int32) - zps.reshape(shp)).astype(np.float32) \
        * scales.astype(np.float32).reshape(shp)
    np.testing.assert_array_equal(d, want)


def test_quantize_strided_input_and_out():
    x = np.linspace(-2, 2, 40, dtype=np.float32).reshape(5, 8)[:, ::2]
    out = np.empty((5, 4), np.uint8)
    q = Q.quantize_per_tensor(x, 0.1, 20, np.uint8, out=out)
    assert q.values is out
    np.testing.assert_array_equal(out, onnx_quantize(x, 0.1, 20, np.uint8))
    d = np.empty((5, 4), np.float64)
    assert Q.dequantize(q, np.float64, out=d) is d


def test_quantizers_write_out(device):
    # the op table's out= checks pass float arrays: the quantizers' int8/uint8
    # out= is checked here, on both devices
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    xd = to_dev(x, device)
    out = to_dev(np.empty((4, 6), np.int8), device)
    q = Q.quantize_per_tensor(xd, 0.05, -3, np.int8, out=out)
    assert q.values is out
    np.testing.assert_array_equal(host(out), onnx_quantize(x, 0.05, -3, np.int8))
    scales, zps = [0.1, 0.2, 0.3, 0.4], [0, 10, 128, 255]
    out = to_dev(np.empty((4, 6), np.uint8), device)
    p = Q.quantize_per_channel(xd, scales, zps, 0, np.uint8, out=out)
    assert p.values is out
    np.testing.assert_array_equal(host(out), onnx_quantize(x, scales, zps, np.uint8, 0))
    with pytest.raises(ValueError, match="quant.quantize_per_channel: argument 'out' must "
                                         "have shape"):
        Q.quantize_per_channel(xd, scales, zps, 0, np.uint8,
                               out=to_dev(np.empty((6, 4), np.uint8), device))
    with pytest.raises(TypeError, match="quant.quantize_per_tensor: argument 'out' must be "
                                        "uint8, got int8"):
        Q.quantize_per_tensor(xd, 0.05, 3, np.uint8, out=to_dev(np.empty((4, 6), np.int8),
                                                                 device))
    with pytest.raises(TypeError, match="quant.quantize_per_tensor: arguments are on "
                                        "different devices"):
        Q.quantize_per_tensor(xd, 0.05, 3, np.uint8,
                              out=to_dev(np.empty((4, 6), np.uint8),
                                         "cuda" if device == "cpu" else "cpu"))


@given(st.integers(0, 2**31), st.floats(1e-4, 1e3), st.sampled_from([np.int8, np.uint8]),
       st.integers(1, 300))
def test_round_trips(seed, scale, qdtype, n):
    rng = np.random.default_rng(seed)
    qmin, qmax = RANGES[qdtype]
    zp = int(rng.integers(qmin, qmax + 1))
    values = rng.integers(qmin, qmax + 1, n).astype(qdtype)
    q = Q.QTensor(values, scale, zp)
    # integers -> reals -> integers is the identity
    np.testing.assert_array_equal(Q.quantize_per_tensor(q.dequantize(), scale, zp, qdtype)
                                  .values, values)
    # reals inside the representable range come back within half a step
    x = rng.uniform((qmin - zp) * scale, (qmax - zp) * scale, n).astype(np.float32)
    err = np.abs(Q.quantize_per_tensor(x, scale, zp, qdtype).dequantize() - x)
    assert err.max() <= 0.5 * scale * (1 + 1e-5) + 1e-6 * np.abs(x).max()


# ---------------------------------------------------------------------------
# Observers


def torch_qparams(lo, hi, qmin, qmax, symmetric, uint8):
    """PyTorch's _calculate_qparams, transcribed (float32 throughout)."""
    f = np.float32
    eps = np.finfo(np.float32).eps
    lo, hi = min(f(lo), f(0)), max(f(hi), f(0))
    if symmetric:
        scale = max(f(max(-lo, hi) / f((qmax - qmin) / 2)), eps)
        return float(scale), 128 if uint8 else 0
    scale = max(f((hi - lo) / f(qmax - qmin)), eps)
    zp = qmin - int(np.rint(f(lo / f(scale))))
    return float(np.float32(scale)), int(np.clip(zp, qmin, qmax))


@pytest.mark.parametrize("qdtype", [np.int8, np.uint8])
@pytest.mark.parametrize("scheme", ["per_tensor_affine", "per_tensor_symmetric"])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_minmax_observer_formula(qdtype, scheme, reduce_range):
    obs = O.MinMaxObserver(dtype=qdtype, qscheme=scheme, reduce_range=reduce_range)
    qmin, qmax = RANGES[qdtype]
    if reduce_range:
        qmin, qmax = (-64, 63) if qdtype == np.int8 else (0, 127)
    assert (obs.quant_min, obs.quant_max) == (qmin, qmax)
    rng = np.random.default_rng(3)
    batches = [rng.normal(1, 2, 50).astype(np.float32) for _ in range(3)]
    for b in batches:
        assert obs(b) is b
    lo = min(b.min() for b in batches)
    hi = max(b.max() for b in batches)
    assert obs.calculate_qparams() == torch_qparams(lo, hi, qmin, qmax,
                                                    scheme.endswith("symmetric"),
                                                    qdtype == np.uint8)


@pytest.mark.parametrize("data, want", [
    (np.zeros(4), (float(np.finfo(np.float32).eps), 0)),        # all zero
    (np.full(4, 2.0), (2.0 / 255, 0)),                          # positive constant
    (np.full(4, -1.0), (1.0 / 255, 255)),                       # negative constant
    (np.array([np.nan, 1.0, np.inf]), (1.0 / 255, 0)),          # non-finite skipped
])
def test_observer_degenerate_cases(data, want):
    for cls in (O.MinMaxObserver, O.MovingAverageMinMaxObserver, O.HistogramObserver):
        obs = cls(dtype=np.uint8)
        obs(data)
        scale, zp = obs.calculate_qparams()
        assert np.isfinite(scale) and scale > 0
        assert zp == want[1] and scale == pytest.approx(want[0], rel=1e-6), cls


def test_observers_take_device_arrays_and_tensors():
    x = np.array([-1.0, 0.5, 3.0], np.float32)
    for data in (nbops.to_device(x), nbops.Tensor(x)):
        obs = O.MinMaxObserver()
        assert obs(data) is data
        assert obs.calculate_qparams() == torch_qparams(-1.0, 3.0, 0, 255, False, True)


def test_observer_never_observed_warns_with_defaults():
    for obs in (O.MinMaxObserver(), O.HistogramObserver(), O.PerChannelMinMaxObserver()):
        with pytest.warns(RuntimeWarning, match="no data observed"):
            scale, zp = obs.calculate_qparams()
        assert np.all(np.asarray(scale) == 1.0) and np.all(np.asarray(zp) == 0)


def test_moving_average_observer():
    obs = O.MovingAverageMinMaxObserver(averaging_constant=0.25, dtype=np.int8)
    obs(np.array([-1.0, 1.0], np.float32))
    obs(np.array([-5.0, 3.0], np.float32))
    assert obs.min_val == np.float32(-2.0) and obs.max_val == np.float32(1.5)
    assert obs.calculate_qparams() == torch_qparams(-2.0, 1.5, -128, 127, False, False)


def test_per_channel_observer():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    for scheme in ("per_channel_symmetric", "per_channel_affine"):
        obs = O.PerChannelMinMaxObserver(ch_axis=1, dtype=np.int8, qscheme=scheme)
        obs(a)
        obs(b)
        scales, zps = obs.calculate_qparams()
        assert scales.shape == (4,) and scales.dtype == np.float32 and zps.dtype == np.int32
        both = np.concatenate([a, b])
        for c in range(4):
            want = torch_qparams(both[:, c].min(), both[:, c].max(), -128, 127,
                                 scheme.endswith("symmetric"), False)
            assert (float(scales[c]), int(zps[c])) == want
        q = Q.quantize_per_channel(both.astype(np.float32), scales, zps, 1, np.int8)
        assert np.abs(q.dequantize() - both).max() <= scales.max() * 0.51
    with pytest.raises(ValueError, match="channels"):
        obs(np.zeros((3, 5, 5)))


def torch_histogram_search(hist, min_val, max_val, dst_nbins=256):
    """PyTorch's _non_linear_param_search, loops and all (slow, literal)."""
    bins = hist.size
    width = (max_val - min_val) / bins
    total = hist.sum()
    csum = np.cumsum(hist)

    def error(start, end):
        dst_width = width * (end - start + 1) / dst_nbins
        if dst_width == 0.0:
            return 0.0
        norm = 0.0
        for i in range(bins):
            b0 = (i - start) * width
            b1 = b0 + width
            db = min(max(np.floor(b0 / dst_width), 0), dst_nbins - 1)
            de = min(max(np.floor(b1 / dst_width), 0), dst_nbins - 1)
            dens = hist[i] / width
            g = lambda lo, hi: dens * (hi ** 3 - lo ** 3) / 3  # noqa: E731
            norm += g(b0 - (db + 0.5) * dst_width, dst_width / 2)
            norm += (de - db - 1) * g(-dst_width / 2, dst_width / 2)
            norm += g(-dst_width / 2, b1 - (de * dst_width + dst_width / 2))
        return norm

    alpha, beta, start, end, norm_min = 0.0, 1.0, 0, bins - 1, np.inf
    while alpha < beta:
        na, nb = alpha + 1e-5, beta - 1e-5
        l, r = start, end
        while l < end and csum[l] <= na * total:
            l += 1
        while r > start and csum[r] >= nb * total:
            r -= 1
        ns, ne = start, end
        if (l - start) > (end - r):
            ns, alpha = l, na
        else:
            ne, beta = r, nb
        if ns == start and ne == end:
            continue
        norm = error(ns, ne)
        if norm > norm_min:
            break
        norm_min, start, end = norm, ns, ne
    return min_val + width * start, min_val + width * (end + 1)


def test_histogram_observer_matches_pytorch_search():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.laplace(size=200000), [25.0, -18.0]]).astype(np.float32)
    obs = O.HistogramObserver(bins=64, dtype=np.uint8)
    obs(x)
    assert obs.histogram.sum() == x.size
    lo, hi = torch_histogram_search(obs.histogram, float(obs.min_val), float(obs.max_val))
    assert obs._non_linear_param_search() == pytest.approx((lo, hi), rel=1e-6)
    assert obs.calculate_qparams() == torch_qparams(lo, hi, 0, 255, False, True)
    assert lo > x.min() and hi < x.max()  # the outliers are clipped


def test_histogram_observer_merges_ranges():
    obs = O.HistogramObserver(bins=8)
    obs(np.array([0.0, 1.0, 2.0, 3.0]))
    obs(np.array([4.0, 7.0]))  # widens the range: old counts are spread over new bins
    assert obs.min_val == 0 and obs.max_val == 7 and obs.histogram.sum() == pytest.approx(6)
    # old bin [0.75, 1.125) (the value 1) is spread over new bins [0, 0.875) and
    # [0.875, 1.75) in proportion to the overlap: 1/3 and 2/3
    np.testing.assert_allclose(obs.histogram, [1 + 1 / 3, 2 / 3, 1, 1, 1, 0, 0, 1])
    with pytest.raises(ValueError, match="bins"):
        O.HistogramObserver(bins=1)


@pytest.mark.parametrize("call, err, match", [
    (lambda: O.MinMaxObserver(dtype=np.int16), TypeError, "int8 or numpy.uint8"),
    (lambda: O.MinMaxObserver(qscheme="per_channel_affine"), ValueError, "qscheme"),
    (lambda: O.PerChannelMinMaxObserver(qscheme="per_tensor_affine"), ValueError, "qscheme"),
    (lambda: O.MovingAverageMinMaxObserver(averaging_constant=0), ValueError, "averaging"),
    (lambda: O.MinMaxObserver()(np.zeros(3, np.int8)), TypeError, "float array"),
    (lambda: O.MinMaxObserver()(np.array([np.nan])), ValueError, "no finite"),
    (lambda: O.PerChannelMinMaxObserver(ch_axis=3)(np.zeros((2, 2))), ValueError, "ch_axis"),
])
def test_observer_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ---------------------------------------------------------------------------
# add, add_relu, relu


def gemmlowp_requantize(x, m, shift, zp, lo, hi):
    """gemmlowp's MultiplyByQuantizedMultiplier on int64 NumPy arrays:
    SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT."""
    x = np.asarray(x, np.int64)
    if shift > 0:
        x = np.clip(x << shift, -2**31, 2**31 - 1)
    ab = x * np.int64(m)
    t = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(t >= 0, t >> 31, -((-t) >> 31))
    e = max(-shift, 0)
    mask = (1 << e) - 1
    rem = high & mask
    thr = (mask >> 1) + (high < 0)
    v = (high >> e) + (rem > thr) + zp
    return np.clip(v, lo, hi)


def add_reference(qa, qb, so, zo, relu, fixed):
    a = qa.values.astype(np.int64) - qa.zero_point
    b = qb.values.astype(np.int64) - qb.zero_point
    qmin, qmax = RANGES[qa.dtype.type]
    lo = max(qmin, zo) if relu else qmin
    if not fixed:
        v = np.rint(a * (qa.scale / so) + b * (qb.scale / so)) + zo
        return np.clip(v, lo, qmax).astype(qa.dtype)
    tm = 2 * max(qa.scale, qb.scale)
    ma, sa = quantize_multiplier(qa.scale / tm)
    mb, sb = quantize_multiplier(qb.scale / tm)
    mo, sho = quantize_multiplier(tm / (2**20 * so))
    big = np.iinfo(np.int32)
    total = (gemmlowp_requantize(a << 20, ma, sa, 0, big.min, big.max)
             + gemmlowp_requantize(b << 20, mb, sb, 0, big.min, big.max))
    return gemmlowp_requantize(total, mo, sho, zo, lo, qmax).astype(qa.dtype)


def ref_add(qa, qb, scale, zero_point, requant="fixed"):
    """The op table's reference: :func:`add_reference` as a QTensor."""
    return Q.QTensor(np.asarray(add_reference(qa, qb, scale, zero_point, False,
                                              requant == "fixed")), scale, zero_point)


def ref_add_relu(qa, qb, scale, zero_point, requant="fixed"):
    return Q.QTensor(np.asarray(add_reference(qa, qb, scale, zero_point, True,
                                              requant == "fixed")), scale, zero_point)


def ref_relu(q):
    return Q.QTensor(np.asarray(np.maximum(q.values, q.values.dtype.type(q.zero_point))),
                     q.scale, q.zero_point)


def _pair_of_qtensors(n, qdtype, rng, device="cpu"):
    qmin, qmax = RANGES[qdtype]
    a = Q.QTensor(to_dev(rng.integers(qmin, qmax + 1, n).astype(qdtype), device), 0.037,
                  int(rng.integers(qmin, qmax + 1)))
    b = Q.QTensor(to_dev(rng.integers(qmin, qmax + 1, n).astype(qdtype), device), 0.0113,
                  int(rng.integers(qmin, qmax + 1)))
    return a, b


@pytest.mark.parametrize("qdtype", [np.int8, np.uint8])
def test_add_matches_integer_reference(qdtype):
    rng = np.random.default_rng(6)
    qa, qb = _pair_of_qtensors(3000, qdtype, rng)
    real = qa.dequantize(np.float64) + qb.dequantize(np.float64)
    for so, zo in [(0.05, 3), (0.021, RANGES[qdtype][0] + 40), (1.3, 0)]:
        for fn, relu in ((Q.add, False), (Q.add_relu, True)):
            outs = {}
            for requant in ("fixed", "float"):
                out = fn(qa, qb, so, zo, requant=requant)
                assert out.q_scale() == so and out.q_zero_point() == zo and out.dtype == qdtype
                np.testing.assert_array_equal(
                    out.values, add_reference(qa, qb, so, zo, relu, requant == "fixed"))
                outs[requant] = out.values.astype(np.int64)
            # both paths within one step of the exact real result (where not saturated)
            ideal = np.rint((np.maximum(real, 0) if relu else real) / so) + zo
            inside = (ideal > RANGES[qdtype][0]) & (ideal < RANGES[qdtype][1])
            for v in outs.values():
                assert np.abs(v - ideal)[inside].max() <= 1
            assert np.abs(outs["fixed"] - outs["float"]).max() <= 1


def test_add_relu_and_relu_on_device(device):
    rng = np.random.default_rng(7)
    qa, qb = _pair_of_qtensors(97, np.int8, rng, device)
    ha, hb = qa.to_host(), qb.to_host()
    for requant in ("fixed", "float"):
        for fn, relu in ((Q.add, False), (Q.add_relu, True)):
            out = fn(qa, qb, 0.03, -7, requant=requant)
            assert out.device == device
            np.testing.assert_array_equal(host(out.values),
                                          add_reference(ha, hb, 0.03, -7, relu,
                                                        requant == "fixed"))
    r = Q.relu(qa)
    assert r.device == device and r.q_scale() == qa.scale
    np.testing.assert_array_equal(host(r.values), np.maximum(ha.values, ha.zero_point))


# ---------------------------------------------------------------------------
# Pooling


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def max_pool_reference(x, k, s, p, d, ceil_mode):
    """Each window's max over the positions inside the input; ``k, s, p, d``
    ints or (height, width) pairs."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pair(k), _pair(s), _pair(p), _pair(d)
    n, c, h, w = x.shape
    oh = _out_size(h, kh, sh, ph, dh, ceil_mode)
    ow = _out_size(w, kw, sw, pw, dw, ceil_mode)
    out = np.empty((n, c, oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            ys = [i * sh - ph + u * dh for u in range(kh)]
            zs = [j * sw - pw + v * dw for v in range(kw)]
            ys = [y for y in ys if 0 <= y < h]
            zs = [z for z in zs if 0 <= z < w]
            out[:, :, i, j] = x[:, :, ys][:, :, :, zs].max(axis=(2, 3))
    return out


def test_pool_output_size_matches_pytorch_formula():
    # torch.nn.MaxPool2d's sizes, including ceil_mode's last-window rule
    assert _out_size(7, 3, 2, 1, 1, False) == 4
    assert _out_size(6, 3, 2, 0, 1, True) == 3
    assert _out_size(5, 2, 2, 0, 1, True) == 3
    assert _out_size(4, 2, 2, 1, 1, True) == 3
    assert _out_size(5, 3, 1, 1, 2, False) == 3
    # a window longer than the padded input: no output, ceil_mode or not
    assert _out_size(2, 3, 2, 0, 1, True) == _out_size(2, 3, 2, 0, 1, False) == 0


@pytest.mark.parametrize("k, s, p, d, ceil_mode", [(2, 2, 0, 1, False), (3, 2, 1, 1, False),
                                                   (3, 2, 1, 1, True), (2, 1, 1, 2, False)])
def test_max_pool2d(device, k, s, p, d, ceil_mode):
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (1, 2, 7, 6)).astype(np.uint8)
    q = Q.QTensor(to_dev(x, device), 0.2, 100)
    out = Q.max_pool2d(q, k, s, p, d, ceil_mode)
    assert out.device == device and out.q_scale() == 0.2 and out.q_zero_point() == 100
    np.testing.assert_array_equal(host(out.values), max_pool_reference(x, k, s, p, d, ceil_mode))


def avg_pool_reference(q, oh, ow, so, zo, fixed):
    x = q.values.astype(np.int64)
    n, c, h, w = x.shape
    qmin, qmax = RANGES[q.dtype.type]
    out = np.empty((n, c, oh, ow), np.int64)
    for i in range(oh):
        y0, y1 = (i * h) // oh, -(-(i + 1) * h // oh)
        for j in range(ow):
            z0, z1 = (j * w) // ow, -(-(j + 1) * w // ow)
            cnt = (y1 - y0) * (z1 - z0)
            acc = x[:, :, y0:y1, z0:z1].sum(axis=(2, 3)) - cnt * q.zero_point
            real = q.scale / (so * cnt)
            if fixed:
                m, sh = quantize_multiplier(real)
                out[:, :, i, j] = gemmlowp_requantize(acc, m, sh, zo, qmin, qmax)
            else:
                out[:, :, i, j] = np.clip(np.rint(acc * real) + zo, qmin, qmax)
    return out.astype(q.dtype)


def ref_max_pool2d(q, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    stride = kernel_size if stride is None else stride
    return Q.QTensor(max_pool_reference(q.values, kernel_size, stride, padding, dilation,
                                        ceil_mode), q.scale, q.zero_point)


def ref_adaptive_avg_pool2d(q, output_size, scale=None, zero_point=None, requant="fixed"):
    """The op table's reference: :func:`avg_pool_reference` as a QTensor, to
    q's own parameters by default."""
    so = q.scale if scale is None else scale
    zo = q.zero_point if zero_point is None else zero_point
    oh, ow = _pair(output_size)
    return Q.QTensor(avg_pool_reference(q, oh, ow, so, zo, requant == "fixed"), so, zo)


def ref_global_avg_pool2d(q, scale=None, zero_point=None, requant="fixed"):
    return ref_adaptive_avg_pool2d(q, 1, scale, zero_point, requant)


@pytest.mark.parametrize("output_size", [1, (2, 3), (3, 2)])
def test_adaptive_avg_pool2d(device, output_size):
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (2, 3, 5, 7)).astype(np.int8)
    q = Q.QTensor(to_dev(x, device), 0.05, -4)
    hq = q.to_host()
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    for requant in ("fixed", "float"):
        for so, zo in [(None, None), (0.02, 10)]:
            out = Q.adaptive_avg_pool2d(q, output_size, so, zo, requant=requant)
            so_, zo_ = (0.05, -4) if so is None else (so, zo)
            assert out.shape == (2, 3, oh, ow) and out.q_scale() == so_
            np.testing.assert_array_equal(
                host(out.values), avg_pool_reference(hq, oh, ow, so_, zo_, requant == "fixed"))
    g = Q.global_avg_pool2d(q)
    np.testing.assert_array_equal(host(g.values), avg_pool_reference(hq, 1, 1, 0.05, -4, True))
    # within one step of the float mean
    mean = hq.dequantize(np.float64).mean(axis=(2, 3), keepdims=True)
    assert np.abs(host(g.dequantize(np.float64)) - mean).max() <= 0.05 * 0.5 + 1e-12


def test_operators_are_documented():
    for name in ("quantize_per_tensor", "quantize_per_channel", "dequantize", "add", "add_relu",
                 "relu", "max_pool2d", "adaptive_avg_pool2d", "global_avg_pool2d"):
        doc = getattr(Q, name).__doc__
        assert "Example" in doc and "Raises" in doc, name


# ---------------------------------------------------------------------------
# Models


def _array(y):
    return np.asarray(getattr(y, "data", y))


def test_quantize_dynamic_swaps_linears_in_order():
    rng = np.random.default_rng(10)
    model = nbops.nn.Sequential(nbops.nn.Linear(24, 40, rng=0), nbops.nn.ReLU(),
                                nbops.nn.Sequential(nbops.nn.Linear(40, 5, rng=1)))
    qmodel = Q.quantize_dynamic(model)
    assert isinstance(model[0], nbops.nn.Linear)  # the original is untouched
    kinds = [type(m).__name__ for m in qmodel.modules()]
    assert kinds.count("DynamicQuantizedLinear") == 2 and "Linear" not in kinds
    assert list(qmodel._modules) == ["0", "1", "2"]
    x = rng.normal(size=(33, 24)).astype(np.float32)
    want, got = _array(model(x)), qmodel(x)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() < 0.03 * np.abs(want).max()
    single = Q.quantize_dynamic(nbops.nn.Linear(24, 3, rng=2))
    assert isinstance(single, Q.model.DynamicQuantizedLinear) and single.device == "cpu"
    on_gpu = Q.quantize_dynamic(nbops.nn.Sequential(nbops.nn.Linear(24, 3, rng=2)).to("cuda"))
    assert on_gpu[0].device == "cuda"
    np.testing.assert_allclose(host(on_gpu(nbops.to_device(x[:4]))), single(x[:4]), rtol=1e-6,
                               atol=1e-6)
    with pytest.raises(TypeError, match="input is on cpu"):
        on_gpu(x)
    with pytest.raises(TypeError, match="nbops.nn.Module"):
        Q.quantize_dynamic(lambda v: v)


def test_static_quantization_of_an_mlp():
    rng = np.random.default_rng(11)
    model = nbops.nn.Sequential(nbops.nn.Linear(16, 32, rng=0), nbops.nn.ReLU(),
                                nbops.nn.Linear(32, 4, rng=1))
    # min/max ranges: calibrating on x itself, nothing saturates
    qconfig = Q.QConfig(activation=lambda: O.MinMaxObserver(dtype=np.uint8),
                        weight=lambda: O.PerChannelMinMaxObserver(dtype=np.int8))
    observed = Q.prepare(model, qconfig)
    assert "linear+relu -> linear" in repr(observed)
    with pytest.raises(ValueError, match="not been calibrated"):
        Q.convert(observed)
    x = rng.normal(size=(200, 16)).astype(np.float32)
    for batch in np.split(x, 4):
        observed(batch)
    qmodel = Q.convert(observed)
    want, got = _array(model(x)), qmodel(x)
    # within a few output steps (each layer adds up to half a step, plus weight rounding)
    step = qmodel.layers[-1][4][0]
    assert np.abs(got - want).max() < 4 * step
    with pytest.raises(TypeError, match="QTensor"):
        qmodel(Q.quantize_per_tensor(x, 0.1, 0, np.uint8))
    with pytest.raises(TypeError, match="input is on cuda but the quantized weights"):
        qmodel(nbops.to_device(x))
    # the same model packed for CUDA gives the same integers
    cuda_model = Q.convert(observed, device="cuda")
    np.testing.assert_array_equal(host(cuda_model(nbops.to_device(x[:5]))), qmodel(x[:5]))
    with pytest.raises(ValueError, match="'device'"):
        Q.convert(observed, device="tpu")


@pytest.mark.parametrize("call, err, match", [
    (lambda: Q.prepare(nbops.nn.Linear(2, 2)), TypeError, "Sequential"),
    (lambda: Q.prepare(nbops.nn.Sequential(nbops.nn.Linear(2, 2), nbops.nn.GELU())),
     TypeError, "layer 1 \\(GELU\\) is not supported"),
    (lambda: Q.prepare(nbops.nn.Sequential(nbops.nn.BatchNorm2d(2))), ValueError,
     "must directly follow a Conv2d"),
    (lambda: Q.prepare(nbops.nn.Sequential(nbops.nn.Linear(2, 2)), qconfig="x86"), TypeError,
     "QConfig"),
    (lambda: Q.convert(nbops.nn.Sequential(nbops.nn.Linear(2, 2))), TypeError,
     "ObservedSequential"),
])
def test_model_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def _cnn_and_data():
    """conv-bn-relu-maxpool-conv-relu-avgpool-linear on 8x8 images of 4
    classes (a fixed template each, plus noise). The weights are seeded; batch
    norm statistics are set from the data and the linear head is fitted by
    ridge regression on the float features, so that logits have real margins
    (and the weights moderate magnitudes)."""
    nn = nbops.nn
    rng = np.random.default_rng(12)
    templates = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)

    def batch(n):
        labels = rng.integers(0, 4, n)
        return (templates[labels] + rng.normal(0, 0.8, (n, 3, 8, 8))).astype(np.float32), labels

    conv1, bn = nn.Conv2d(3, 8, 3, padding=1, rng=0), nn.BatchNorm2d(8)
    body = nn.Sequential(conv1, bn, nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1, rng=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten())
    head = nn.Linear(64, 4, rng=2)
    fit_x, fit_y = batch(400)
    pre = _array(conv1(fit_x))
    bn.running_mean[:] = pre.mean(axis=(0, 2, 3)) + 0.1
    bn.running_var[:] = pre.var(axis=(0, 2, 3)) * 1.5
    bn.weight.data[:] = rng.uniform(0.5, 1.5, 8)
    bn.bias.data[:] = rng.normal(0, 0.2, 8)
    body.eval()
    feats = _array(body(fit_x))
    target = 2 * np.eye(4)[fit_y] - 1
    design = np.c_[feats, np.ones(len(feats))]
    coef = np.linalg.solve(design.T @ design + 10.0 * np.eye(design.shape[1]), design.T @ target)
    head.weight.data[:] = coef[:-1].T
    head.bias.data[:] = coef[-1]
    return nn.Sequential(body, head).eval(), batch


def test_static_quantized_cnn_agrees_with_float_model():
    model, batch = _cnn_and_data()
    observed = Q.prepare(model)
    assert repr(observed).count("conv+relu") == 2 and "maxpool" in repr(observed)
    for _ in range(4):
        observed(batch(32)[0])
    qmodel = Q.convert(observed)
    x, labels = batch(500)
    want = _array(model(x))
    got = qmodel(x)
    assert (want.argmax(1) == labels).mean() > 0.9  # the float model has learned something
    agree = (got.argmax(1) == want.argmax(1)).mean()
    assert agree >= 0.98, agree
    assert np.abs(got - want).mean() < 0.02 * np.abs(want).max()
    # the original model is untouched (fusion ran on a copy)
    assert type(model[0][1]).__name__ == "BatchNorm2d"
