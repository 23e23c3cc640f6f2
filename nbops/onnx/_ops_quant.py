"""Quantized ONNX operators on nbops.quant's int8 kernels: the op table's
declarations for QuantizeLinear, DequantizeLinear, MatMulInteger,
QLinearMatMul, QLinearConv, ConvInteger and com.microsoft's QLinearAdd.

Semantics are ONNX's reference ones: round half to even, saturation to the
output type, requantization in float (``requant="float"`` of
:mod:`nbops.quant`, not the fixed-point multipliers an integer-only engine
would use). The int8 kernels run the common forms: 2-D convolutions with
symmetric pads, uint8/int8 activations, per-tensor activation and per-tensor
or per-output-channel weight parameters (weights packed once per session
when they are constants). Every other form of these operators (1-D
convolutions, asymmetric pads, per-row zero points of a matmul's left
operand) runs exactly in integer-valued float64 arithmetic on nbops' float
kernels, slower. Types outside uint8/int8 (int16, 4-bit, float8, blocked
quantization) are refused at load time.
"""

import numpy as np

import nbops

from ._registry import UnsupportedModelError, onnx_op

_Q_TYPES = (np.uint8, np.int8)


def _refuse(node, what):
    raise UnsupportedModelError(f"nbops.onnx: node {node.name!r} ({node.op_type}, opset "
                                f"{node.opset}): {what} is not supported")


def _host(x):
    return None if x is None else np.asarray(nbops.to_host(x) if hasattr(
        x, "__cuda_array_interface__") else x)


def _params(scale, zero_point, default=np.uint8):
    """(scale as float32 array, zero point array of its type) of a Q/DQ pair."""
    s = np.asarray(_host(scale), np.float32)
    zp = np.zeros(s.shape, default) if zero_point is None else _host(zero_point)
    return s, zp


def _qtypes_prepare(*positions, data=()):
    """A prepare hook refusing, at load time, zero points (inputs at
    ``positions``) and quantized data (inputs at ``data``) of a type other
    than uint8/int8 (int32 allowed: biases), by the type shape inference or a
    constant gives, and blocked quantization."""

    def prepare(node, consts):
        if node.attrs.get("block_size", 0):
            _refuse(node, "blocked quantization (block_size)")
        if node.attrs.get("output_dtype", 0) not in (0, 2, 3):  # UINT8, INT8
            _refuse(node, f"output_dtype {node.attrs['output_dtype']}")
        for i in tuple(positions) + tuple(data):
            if i >= len(node.inputs) or not node.inputs[i]:
                continue
            c = consts[i] if i < len(consts) else None
            dt = c.dtype if c is not None else (
                node.input_dtypes[i] if i < len(node.input_dtypes) else None)
            if dt is not None and np.dtype(dt).type not in _Q_TYPES + (np.int32,):
                _refuse(node, f"{'a zero point' if i in positions else 'quantized data'} "
                              f"of type {np.dtype(dt)}")
        return None

    return prepare


def _axis_view(v, ndim, axis):
    """A per-axis parameter shaped to broadcast along ``axis`` of an ndim array."""
    if v.size <= 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = v.size
    return v.reshape(shape)


def _saturate(y, dtype):
    info = np.iinfo(dtype)
    return np.clip(y, info.min, info.max).astype(dtype)


@onnx_op("QuantizeLinear", since=10, prepare=_qtypes_prepare(2))
def onnx_quantize_linear(node, x, y_scale, y_zero_point=None, *, state):
    """``saturate(round(x / y_scale) + y_zero_point)``, per tensor or along
    ``axis`` (13+); uint8 unless the zero point says int8."""
    x = _host(x)
    s, zp = _params(y_scale, y_zero_point)
    dt = zp.dtype.type if y_zero_point is not None else (
        np.int8 if node.attrs.get("output_dtype") == 3 else np.uint8)
    if dt not in _Q_TYPES:
        _refuse(node, f"quantizing to {np.dtype(dt)}")
    axis = node.attrs.get("axis", 1)
    if x.dtype == np.float32 and s.size == 1:
        q = nbops.quant.quantize_per_tensor(np.ascontiguousarray(x), float(s.reshape(())),
                                            int(zp.reshape(())), dt)
        return q.values
    sv, zv = _axis_view(s, x.ndim, axis), _axis_view(zp.astype(np.int32), x.ndim, axis)
    return _saturate(np.rint(x / sv) + zv, dt)


@onnx_op("DequantizeLinear", since=10, prepare=_qtypes_prepare(2, data=(0,)))
def onnx_dequantize_linear(node, x, x_scale, x_zero_point=None, *, state):
    """``(x - x_zero_point) * x_scale`` in the scale's type (float32), per
    tensor or along ``axis`` (13+); int32 inputs (biases) with zero point 0."""
    x = _host(x)
    s, zp = _params(x_scale, x_zero_point, x.dtype)
    if x.dtype.type not in _Q_TYPES + (np.int32,):
        _refuse(node, f"dequantizing {x.dtype}")
    axis = node.attrs.get("axis", 1)
    sv, zv = _axis_view(s, x.ndim, axis), _axis_view(zp.astype(np.int32), x.ndim, axis)
    return ((x.astype(np.int32) - zv).astype(np.float32) * sv).astype(np.float32)


@onnx_op("MatMulInteger", since=10, prepare=_qtypes_prepare(2, 3, data=(0, 1)))
def onnx_matmul_integer(node, a, b, a_zero_point=None, b_zero_point=None, *, state):
    """:func:`nbops.quant.matmul_integer` (int32 result)."""
    a, b = _host(a), _host(b)
    za = 0 if a_zero_point is None else _zp_arg(_host(a_zero_point))
    zb = 0 if b_zero_point is None else _zp_arg(_host(b_zero_point))
    return nbops.quant.matmul_integer(np.ascontiguousarray(a), np.ascontiguousarray(b), za, zb)


@onnx_op("QLinearMatMul", since=10, prepare=_qtypes_prepare(2, 5, 7, data=(0, 3)))
def onnx_qlinear_matmul(node, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, *, state):
    """:func:`nbops.quant.matmul` with ONNX's float requantization; a
    per-row ``a`` runs in float64 integer arithmetic."""
    from nbops.quant import QTensor

    a, b = _host(a), _host(b)
    (sa, za), (sb, zb), (sy, zy) = (_params(a_scale, a_zp), _params(b_scale, b_zp),
                                    _params(y_scale, y_zp))
    if sa.size == 1 and za.size == 1:
        qa = QTensor(np.ascontiguousarray(a), float(sa.reshape(())), int(za.reshape(())))
        qb = (QTensor(np.ascontiguousarray(b), float(sb.reshape(())), int(zb.reshape(())))
              if sb.size == 1 else QTensor(np.ascontiguousarray(b), sb.reshape(-1),
                                           zb.reshape(-1), axis=b.ndim - 1))
        return nbops.quant.matmul(qa, qb, float(sy.reshape(())), int(zy.reshape(())),
                                  out_dtype=zy.dtype.type, requant="float").values
    acc = np.matmul(a.astype(np.float64) - za.reshape(-1, 1).astype(np.float64),
                    b.astype(np.float64) - zb.astype(np.float64))
    scale = sa.reshape(-1, 1).astype(np.float64) * sb.astype(np.float64) / float(sy.reshape(()))
    return _saturate(np.rint(acc * scale) + int(zy.reshape(())), zy.dtype.type)


@onnx_op("QLinearConv", since=10, prepare=_qtypes_prepare(2, 5, 7, data=(0, 3)))
def onnx_qlinear_conv(node, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None, *,
                      state):
    """:func:`nbops.quant.conv2d` (the VNNI int8 kernel) with ONNX's float
    requantization; other geometries in float64 integer arithmetic."""
    from nbops.quant import QTensor

    x, w = _host(x), _host(w)
    (sx, zx), (sw, zw), (sy, zy) = (_params(x_scale, x_zp), _params(w_scale, w_zp),
                                    _params(y_scale, y_zp))
    geo = _conv_geometry(node, x, w)
    if geo["symmetric"] and x.ndim == 4 and sx.size == 1:
        qx = QTensor(np.ascontiguousarray(x), float(sx.reshape(())), int(zx.reshape(())))
        qw = (QTensor(np.ascontiguousarray(w), float(sw.reshape(())), int(zw.reshape(())))
              if sw.size == 1 else QTensor(np.ascontiguousarray(w), sw.reshape(-1),
                                           zw.reshape(-1), axis=0))
        bias = None if b is None else np.ascontiguousarray(_host(b), np.int32)
        return nbops.quant.conv2d(qx, qw, bias, geo["stride"], geo["padding"], geo["dilation"],
                                  geo["group"], float(sy.reshape(())), int(zy.reshape(())),
                                  out_dtype=zy.dtype.type, requant="float").values
    acc = _integer_conv(x, zx, w, zw, geo)
    if b is not None:
        acc = acc + _host(b).astype(np.float64).reshape(1, -1, *([1] * (x.ndim - 2)))
    scale = (float(sx.reshape(())) * sw.astype(np.float64).reshape(
        1, -1, *([1] * (x.ndim - 2))) if sw.size > 1 else float(sx.reshape(())) *
        float(sw.reshape(()))) / float(sy.reshape(()))
    return _saturate(np.rint(acc * scale) + int(zy.reshape(())), zy.dtype.type)


@onnx_op("ConvInteger", since=10, prepare=_qtypes_prepare(2, 3, data=(0, 1)))
def onnx_conv_integer(node, x, w, x_zero_point=None, w_zero_point=None, *, state):
    """``conv(x - x_zero_point, w - w_zero_point)`` in int32, exactly (float64
    integer arithmetic on nbops' float convolution)."""
    x, w = _host(x), _host(w)
    zx = np.zeros((), x.dtype) if x_zero_point is None else _host(x_zero_point)
    zw = np.zeros((), w.dtype) if w_zero_point is None else _host(w_zero_point)
    return _integer_conv(x, zx, w, zw, _conv_geometry(node, x, w)).astype(np.int32)


@onnx_op("QLinearAdd", since=1, domain="com.microsoft")
def onnx_qlinear_add(node, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
    """com.microsoft QLinearAdd: ``quantize(dequantize(a) + dequantize(b))``
    with broadcasting, in float32 as onnxruntime computes it."""
    (sa, za), (sb, zb) = _params(a_scale, a_zp), _params(b_scale, b_zp)
    sc, zc = _params(c_scale, c_zp, _host(a).dtype)
    fa = (_host(a).astype(np.int32) - za.astype(np.int32)).astype(np.float32) * sa
    fb = (_host(b).astype(np.int32) - zb.astype(np.int32)).astype(np.float32) * sb
    return _saturate(np.rint((fa + fb) / sc) + zc.astype(np.int32), zc.dtype.type)


def _zp_arg(zp):
    return int(zp.reshape(())) if zp.size == 1 else zp.reshape(-1).astype(np.int32)


def _conv_geometry(node, x, w):
    a = node.attrs
    r = x.ndim - 2
    if r not in (1, 2):
        _refuse(node, f"a {r}-D convolution")
    k = list(w.shape[2:])
    stride = list(a.get("strides") or [1] * r)
    dil = list(a.get("dilations") or [1] * r)
    pads = list(a.get("pads") or [0] * (2 * r))
    auto = a.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * r)
        for i in range(r):
            out = -(-x.shape[2 + i] // stride[i])
            total = max(0, (out - 1) * stride[i] + (k[i] - 1) * dil[i] + 1 - x.shape[2 + i])
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads[i], pads[r + i] = lo, total - lo
    elif auto == "VALID":
        pads = [0] * (2 * r)
    return {"stride": tuple(stride), "dilation": tuple(dil), "group": int(a.get("group", 1)),
            "pads": pads, "padding": tuple(pads[:r]), "symmetric": pads[:r] == pads[r:]}


def _integer_conv(x, zx, w, zw, geo):
    """The int32-exact accumulator of a quantized convolution, as float64:
    integer-valued operands, so every partial sum is exact in any order."""
    r = x.ndim - 2
    xf = x.astype(np.float64) - np.asarray(zx, np.float64)
    wzp = np.asarray(zw, np.float64)
    wf = w.astype(np.float64) - (wzp.reshape(-1, *([1] * (w.ndim - 1))) if wzp.size > 1
                                 else wzp)
    pads = geo["pads"]
    xf = np.pad(xf, [(0, 0), (0, 0)] + [(pads[i], pads[r + i]) for i in range(r)])
    fn = nbops.conv2d if r == 2 else nbops.conv1d
    kw = dict(stride=geo["stride"] if r == 2 else geo["stride"][0],
              dilation=geo["dilation"] if r == 2 else geo["dilation"][0], groups=geo["group"])
    return fn(np.ascontiguousarray(xf), np.ascontiguousarray(wf), None, padding=0, **kw)
