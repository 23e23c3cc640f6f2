"""Int8 quantization: quantized tensors, calibration and int8 operators.

A :class:`QTensor` holds int8 or uint8 values with the affine map back to
reals, ``x = (q - zero_point) * scale``, per tensor or per channel along an
axis. Semantics follow ONNX (QuantizeLinear, DequantizeLinear, MatMulInteger,
QLinearMatMul, QLinearConv) and PyTorch's quantized tensors, so that a model
quantized elsewhere reproduces exactly.

* :func:`quantize_per_tensor`, :func:`quantize_per_channel`,
  :func:`dequantize`: ONNX QuantizeLinear / DequantizeLinear, bit for bit
  (division by the scale in the input's precision, round half to even,
  saturation to the type's range).
* Observers (:mod:`nbops.quant.observers`) record value ranges on
  calibration data and give (scale, zero_point) by PyTorch's formulas.
* Operators on QTensors, CPU and CUDA: :func:`add`, :func:`add_relu`,
  :func:`relu`, :func:`max_pool2d`, :func:`adaptive_avg_pool2d`,
  :func:`global_avg_pool2d`, and the int8 GEMM family from
  :mod:`nbops.quant.linear` (``matmul_integer``, ``matmul``, ``linear``,
  ``conv2d``).
* Models (:mod:`nbops.quant.model`): :func:`quantize_dynamic`, and
  :func:`prepare` / calibration / :func:`convert` for static quantization.

Requantization (``requant=``): operators that change scale rescale their
integer sums either the way integer-only inference engines do,
``"fixed"`` (default: a 32-bit fixed-point multiplier and a power-of-two
shift computed once on the host, gemmlowp's rounding; see
:mod:`nbops.quant._requant`), or ``"float"`` (``round_half_even(acc * real)``
in float64, the ONNX reference formula). The two agree within one
quantization step and usually exactly.

Kernels live in ``quant/cpu.py`` and ``quant/cuda.py`` beside this module.
"""

import numpy as np

from .. import _checks, _dispatch, _spec
from .. import pooling as _pooling
from .._dispatch import CPU, operator
from ._requant import quantize_multiplier
from .qtensor import QTYPES, QTensor, qrange
from .qtensor import _check_channel_scales, _check_channel_zero_points
from .qtensor import _check_scalar_scale, _check_scalar_zero_point

__all__ = [
    "QTensor", "qrange", "quantize_per_tensor", "quantize_per_channel", "dequantize",
    "add", "add_relu", "relu", "max_pool2d", "adaptive_avg_pool2d", "global_avg_pool2d",
    "REQUANT_MODES",
    # int8 GEMM family (nbops/quant/linear.py)
    "matmul_integer", "matmul", "linear", "linear_dynamic", "conv2d", "pack_weight",
    "PackedWeight", "quantize_multiplier",
    # observers
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "HistogramObserver",
    # models
    "quantize_dynamic", "prepare", "convert", "QConfig", "default_qconfig",
]

FAMILY = _spec.subpackage("quant")

#: Values of the ``requant=`` argument.
REQUANT_MODES = ("fixed", "float")

_FLOATS = _checks.FLOAT_DTYPES
_QDTYPES = tuple(QTYPES)


# ---------------------------------------------------------------------------
# Declarations
#
# Every operator has samples: QTensor arguments go to the device whole
# (QTensor.to_device), QTensor results compare as values bit for bit with
# equal parameters, and the references (tests/test_quant.py) are the
# integer-exact ones its accuracy tests use. Operators that take no float
# array (all but the quantizers and dequantize) declare float32 only: their
# samples do not depend on the dtype, and run once.

#: quantizer inputs: ties at every half step, saturation both ways around
#: the int8 and uint8 ranges, signed zeros, huge values, infinities, NaN
_QUANTIZE_EDGE = tuple(np.arange(-6, 6) + 0.5) + (
    0.0, -0.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 127.49, 127.5, 128.5, -128.5, -129.5,
    255.5, 256.5)


def _random_q(rng, shape, qdtype, scale, zero_point, axis=None):
    """A QTensor of values drawn over the whole range of ``qdtype``."""
    lo, hi = QTYPES[np.dtype(qdtype)]
    values = np.asarray(rng.integers(lo, hi + 1, shape), qdtype)  # 0-d stays an array
    return QTensor(values, scale, zero_point, axis)


def _near_ties(scale, dtype):
    """128 values ``(k + 1/2) * scale`` rounded to ``dtype``: their quotients
    by ``scale`` round to either side of the tie depending on the precision
    of the division (and of the scale)."""
    return ((np.arange(-64, 64) + 0.5) * float(scale)).astype(dtype)


def _quantize_per_tensor_samples(dtype):
    """Every rank (empty and 0-d too) and both types, values that saturate
    at either end, values whose quotients lie within rounding of a tie
    (where the division's precision decides), then the edge values at
    scales 1 and 0.5 (exact divisions: the ties stay ties). The scale is
    given in x's type, as ONNX's QuantizeLinear takes it (the reference
    divides in its type)."""
    rng = np.random.default_rng(1)
    t = np.dtype(dtype).type
    out = []
    for shape, qdtype, scale, zp in (((0,), np.int8, 0.5, 0), ((), np.uint8, 0.1, 128),
                                     ((1,), np.int8, 0.25, -3), ((97,), np.int8, 0.037, -5),
                                     ((5, 19), np.uint8, 0.07, 200),
                                     ((2, 3, 4, 5), np.int8, 0.013, 127),
                                     ((1000,), np.uint8, 0.041, 17)):
        x = np.asarray(rng.standard_normal(shape) * 3, dtype)
        out.append(_spec.Sample((x, t(scale), zp, qdtype), {},
                                f"{shape}{np.dtype(qdtype).name}"))
    out.append(_spec.Sample((_near_ties(0.1, dtype), t(0.1), 0, np.int8), {}, "near-ties"))
    edge = np.array(_QUANTIZE_EDGE, dtype)
    for qdtype, scale, zp in ((np.int8, 1.0, 0), (np.uint8, 1.0, 128), (np.int8, 0.5, -128),
                              (np.uint8, 0.5, 255)):
        out.append(_spec.Sample((edge, t(scale), zp, qdtype), {},
                                f"edge-{np.dtype(qdtype).name}-{scale}"))
    return out


def _quantize_per_channel_samples(dtype):
    """Per channel along the first, a middle and the last axis (a negative
    axis too), 1-D, no channels and empty channels, then the edge values at
    exact scales. Scales are given in x's type and zero points as lists
    (quantization parameters stay on the host)."""
    rng = np.random.default_rng(2)
    t = np.dtype(dtype).type
    out = []
    for shape, axis, qdtype in (((4, 6), 0, np.uint8), ((4, 6), -1, np.int8),
                                ((2, 3, 5), 1, np.int8), ((5,), 0, np.uint8),
                                ((3, 0), 0, np.int8), ((0, 3), 1, np.uint8),
                                ((20, 30), 1, np.int8)):
        lo, hi = QTYPES[np.dtype(qdtype)]
        c = shape[axis]
        x = np.asarray(rng.standard_normal(shape) * 3, dtype)
        scales = [t(s) for s in rng.uniform(0.01, 0.5, c)]
        zps = [int(z) for z in rng.integers(lo, hi + 1, c)]
        out.append(_spec.Sample((x, scales, zps, axis, qdtype), {},
                                f"{shape}axis={axis}{np.dtype(qdtype).name}"))
    ties = np.stack([_near_ties(np.float32(0.1), dtype), _near_ties(np.float32(0.037), dtype)])
    out.append(_spec.Sample((ties[:, ::2].copy(), [t(0.1), t(0.037)], [0, 0], 0, np.int8), {},
                            "near-ties"))
    edge = np.array(_QUANTIZE_EDGE, dtype).reshape(2, 13)
    out.append(_spec.Sample((edge, [t(1.0), t(0.5)], [0, -3], 0, np.int8), {}, "edge-int8"))
    out.append(_spec.Sample((edge.T.copy(), [t(1.0), t(0.25)], [128, 0], 1, np.uint8), {},
                            "edge-uint8"))
    return out


#: shapes of the elementwise samples: empty, 0-d, one element, odd sizes,
#: several ranks, and one too large for the simulated CUDA rows
_Q_SHAPES = ((0,), (), (1,), (97,), (5, 19), (2, 3, 4, 5), (3000,))


def _add_samples(dtype):
    """Both types over ``_Q_SHAPES``, each requantized both ways to a
    different output (scale, zero point); then extreme values against zero
    points at the other end of the range, with input scales far apart and an
    output scale that saturates both ways."""
    rng = np.random.default_rng(3)
    out = []
    for i, shape in enumerate(_Q_SHAPES):
        qdtype = (np.int8, np.uint8)[i % 2]
        lo, hi = QTYPES[np.dtype(qdtype)]
        qa = _random_q(rng, shape, qdtype, 0.037, int(rng.integers(lo, hi + 1)))
        qb = _random_q(rng, shape, qdtype, 0.0113, int(rng.integers(lo, hi + 1)))
        so, zo = ((0.05, 3), (0.021, lo + 40), (1.3, 0))[i % 3]
        for requant in ("fixed", "float"):
            out.append(_spec.Sample((qa, qb, so, zo), dict(requant=requant),
                                    f"{shape}{np.dtype(qdtype).name},{requant}"))
    for qdtype in (np.int8, np.uint8):
        lo, hi = QTYPES[np.dtype(qdtype)]
        ends = np.array([lo, hi, lo, hi, lo + 1, hi - 1, (lo + hi) // 2], qdtype)
        qa = QTensor(ends, 2.5, lo)
        qb = QTensor(ends[::-1].copy(), 0.002, hi)
        for so, zo in ((0.01, (lo + hi) // 2), (5.0, hi), (1e-3, lo)):
            for requant in ("fixed", "float"):
                out.append(_spec.Sample((qa, qb, so, zo), dict(requant=requant),
                                        f"edge-{np.dtype(qdtype).name},{so},{requant}"))
    return out


def _relu_samples(dtype):
    """Both types over ``_Q_SHAPES``, zero points at either end of the range
    and inside it."""
    rng = np.random.default_rng(4)
    out = []
    for i, shape in enumerate(_Q_SHAPES):
        qdtype = (np.int8, np.uint8)[i % 2]
        lo, hi = QTYPES[np.dtype(qdtype)]
        zp = (lo, hi, int(rng.integers(lo, hi + 1)))[i % 3]
        out.append(_spec.Sample((_random_q(rng, shape, qdtype, 0.1, zp),), {},
                                f"{shape}{np.dtype(qdtype).name},zp={zp}"))
    return out


def _max_pool2d_samples(dtype):
    """torch.nn.MaxPool2d's window rules: strides, padding, dilation and
    ceil_mode (a last window that starts in the input), the default stride,
    pairs of sizes, both types; one input too large for the CUDA rows."""
    rng = np.random.default_rng(5)
    small = _random_q(rng, (1, 2, 7, 6), np.uint8, 0.2, 100)
    signed = _random_q(rng, (2, 1, 5, 8), np.int8, 0.05, -7)
    large = _random_q(rng, (2, 3, 9, 11), np.int8, 0.3, 0)
    cases = ((small, 2, {}), (small, 3, dict(stride=2, padding=1)),
             (small, 3, dict(stride=2, padding=1, ceil_mode=True)),
             (small, 2, dict(stride=1, padding=1, dilation=2)),
             (signed, (2, 3), dict(stride=(1, 2), padding=(1, 0))),
             (signed, (3, 2), dict(stride=2, dilation=(2, 1), ceil_mode=True)),
             (signed, 1, {}), (large, 3, dict(stride=2, padding=1, ceil_mode=True)))
    return [_spec.Sample((q, k), kw, f"{q.shape}{q.dtype.name},k={k}{kw}")
            for q, k, kw in cases]


def _avg_pool_inputs():
    rng = np.random.default_rng(6)
    return (_random_q(rng, (1, 2, 5, 7), np.int8, 0.05, -4),
            _random_q(rng, (2, 1, 6, 4), np.uint8, 0.02, 131),
            QTensor(np.full((1, 1, 3, 5), 127, np.int8), 1.5, -128),
            _random_q(rng, (2, 3, 5, 7), np.int8, 0.05, 9))


def _adaptive_avg_pool2d_samples(dtype):
    """Windows of PyTorch's rule (overlapping and of several sizes, one per
    element, one over everything), q's own output parameters and others,
    both requantizations, both types; a saturating input; one input too
    large for the CUDA rows."""
    signed, unsigned, full, large = _avg_pool_inputs()
    cases = ((signed, 1, None, None), (signed, (2, 3), 0.02, 10), (signed, (3, 2), None, None),
             (signed, (5, 7), 0.1, 0), (unsigned, (4, 3), None, None),
             (unsigned, (5, 2), 0.011, 0), (full, (2, 2), 0.5, 0), (large, (2, 3), 0.02, 10))
    return [_spec.Sample((q, size, so, zo), dict(requant=requant),
                         f"{q.shape}{q.dtype.name}->{size},{so},{requant}")
            for q, size, so, zo in cases for requant in ("fixed", "float")]


def _global_avg_pool2d_samples(dtype):
    """q's own output parameters and others, both requantizations, both
    types, a saturating input, one input too large for the CUDA rows."""
    signed, unsigned, full, large = _avg_pool_inputs()
    cases = ((signed, {}), (signed, dict(scale=0.02, zero_point=10)), (unsigned, {}),
             (unsigned, dict(scale=0.003, zero_point=255)), (full, dict(scale=0.5)),
             (large, dict(zero_point=-100)))
    return [_spec.Sample((q,), dict(kw, requant=requant),
                         f"{q.shape}{q.dtype.name},{kw},{requant}")
            for q, kw in cases for requant in ("fixed", "float")]


def _dequantize_samples(dtype):
    """Per-tensor int8/uint8 of every rank (empty and 0-d too), per channel
    along the first and last axis, and the extremes: both ends of the range
    against a zero point at the other end, scales that overflow float32 and
    tiny ones."""
    rng = np.random.default_rng(0)

    def q(shape, qdtype, scale, zero_point, axis=None):
        return _random_q(rng, shape, qdtype, scale, zero_point, axis)

    cases = [(q((0,), np.int8, 0.5, 0), "empty"), (q((), np.uint8, 0.1, 128), "0-d"),
             (q((1,), np.int8, 0.25, -3), "(1,)"), (q((97,), np.int8, 0.037, -5), "(97,)"),
             (q((5, 19), np.uint8, 3.7, 255), "(5, 19)"),
             (q((2, 3, 4, 5), np.int8, 1e-3, 127), "(2, 3, 4, 5)"),
             (q((4, 6), np.uint8, rng.uniform(0.01, 2, 4), [0, 1, 128, 255], axis=0),
              "per-channel-axis0"),
             (q((2, 3, 5), np.int8, [0.02, 0.05, 0.1, 3.0, 1e-4], [-128, 0, 5, 127, -7],
                axis=-1), "per-channel-last"),
             (q((3, 0), np.int8, [1.0, 2.0, 3.0], [0, 1, 2], axis=0), "per-channel-empty"),
             (QTensor(np.array([-128, 127, 0, -1], np.int8), 1e37, 127), "overflow"),
             (QTensor(np.array([0, 255, 1, 254], np.uint8), 1e-30, 0), "tiny"),
             (QTensor(np.array([0, 255, 128], np.uint8), [1e37, 1e-30, 0.5], [255, 0, 128],
                      axis=0), "per-channel-extremes")]
    return [_spec.Sample((x,), dict(dtype=dtype), label) for x, label in cases]


def _qt(shape=(3,), dtype=np.int8, scale=0.1, zero_point=0, axis=None):
    return QTensor(np.zeros(shape, dtype), scale, zero_point, axis)


def _lazy_bad(make):
    """``bad(dtype)`` of the ``(args, kwargs, error, match)`` calls that
    ``make()`` gives, built only when the tests ask (one holds 8 MB)."""
    def bad(dtype):
        return [_spec.Bad(*c) for c in make()]
    return bad


def _quantize_per_tensor_bad():
    x = np.zeros(3)
    return [
        ((np.zeros(3, np.int8), 1.0, 0, np.int8), {}, TypeError,
         "float32 or float64 array, got int8"),
        ((_qt(), 1.0, 0, np.int8), {}, TypeError, "already a QTensor"),
        ((x, 1.0, 0, np.int16), {}, TypeError, "int8 or numpy.uint8"),
        ((x, 1.0, 0, None), {}, TypeError, "'dtype'"),
        ((x, 0.0, 0, np.int8), {}, ValueError, "'scale'"),
        ((x, 1.0, 300, np.uint8), {}, ValueError, "got 300"),
        ((x, 1.0, 0, np.int8), dict(out=np.empty(3, np.uint8)), TypeError,
         "'out' must be int8")]


def _quantize_per_channel_bad():
    x = np.zeros((2, 3))
    return [
        ((x, [1.0], [0], 0, np.int8), {}, ValueError, r"shape \(2,\)"),
        ((x, [1.0, 1.0], [0, 0], 2, np.int8), {}, ValueError, "out of range"),
        ((np.zeros(()), [1.0], [0], 0, np.int8), {}, ValueError, "at least one dimension"),
        ((x, [1.0, -1.0], [0, 0], 0, np.int8), {}, ValueError, "channel 1"),
        ((np.zeros((2, 3), np.int8), [1.0, 1.0], [0, 0], 0, np.int8), {}, TypeError,
         "float32 or float64 array")]


def _dequantize_bad():
    return [
        ((np.zeros(3, np.float32),), {}, TypeError, "must be a QTensor.*quantize"),
        ((np.zeros(3, np.int8),), {}, TypeError, "wrap raw integers"),
        ((_qt(), np.int32), {}, TypeError, "float32 or float64"),
        ((_qt(), "float16"), {}, TypeError, "float32 or float64")]


def _add_bad():
    a = _qt()
    return [
        ((a, a.dequantize(), 0.1, 0), {}, TypeError, "'qb' must be a QTensor"),
        ((a.values, a, 0.1, 0), {}, TypeError, "'qa' must be a QTensor"),
        ((a, QTensor(a.values.view(np.uint8), 0.1, 0), 0.1, 0), {}, TypeError,
         "int8 but 'qb' is uint8"),
        ((a, QTensor(a.values[:2], 0.1, 0), 0.1, 0), {}, ValueError, "one shape"),
        ((a, a, 0.0, 0), {}, ValueError, "'scale' must be positive"),
        ((a, a, 0.1, 128), {}, ValueError, "'zero_point'"),
        ((a, a, 0.1, 0), dict(requant="double"), ValueError, "'requant'"),
        ((_qt((3, 1), np.int8, [1.0, 1, 1], [0, 0, 0], 0), a, 0.1, 0), {}, ValueError,
         "per channel")]


def _relu_bad():
    return [((np.zeros(3, np.float32),), {}, TypeError, "quantize_per_tensor"),
            ((np.zeros(3, np.int8),), {}, TypeError, "wrap raw integers"),
            ((_qt((3, 1), np.int8, [1.0, 1, 1], [0, 0, 0], 0),), {}, ValueError,
             "per channel")]


def _pool_input():
    return _qt((1, 2, 4, 4))


def _max_pool2d_bad():
    q = _pool_input()
    return [
        ((_qt((2, 4, 4)), 2), {}, ValueError, "4-D"),
        ((q, 0), {}, ValueError, "'kernel_size' must be >= 1"),
        ((q, 2.0), {}, TypeError, "'kernel_size'"),
        ((q, 2), dict(padding=2), ValueError, "half the kernel"),
        ((q, 5), {}, ValueError, "does not fit"),
        ((q.dequantize(), 2), {}, TypeError, "must be a QTensor")]


def _adaptive_avg_pool2d_bad():
    q = _pool_input()
    return [
        ((q, 0), {}, ValueError, "'output_size' must be >= 1"),
        ((q, (1, 2, 3)), {}, ValueError, "tuple of 2 ints"),
        ((q, 1), dict(requant="round"), ValueError, "'requant'"),
        ((_qt((2, 4, 4)), 1), {}, ValueError, "4-D"),
        ((_qt((1, 1, 0, 2)), 1), {}, ValueError, "nothing to average")]


def _global_avg_pool2d_bad():
    return [
        ((_pool_input(),), dict(scale=-1.0), ValueError, "'scale'"),
        ((_pool_input(),), dict(zero_point=200), ValueError, "'zero_point'"),
        ((_qt((1, 1, 0, 2)),), {}, ValueError, "nothing to average"),
        # 2**23 elements of 8 bits could overflow the int32 sum: refused
        # before any kernel runs
        ((_qt((1, 1, 2048, 4096), np.uint8),), {}, ValueError, "overflow the int32 sum")]


def _quant_spec(name, kernels, bad, **fields):
    return _spec.OpSpec(f"quant.{name}", FAMILY, kernels, bad=_lazy_bad(bad), **fields)


def _ref(name):
    return f"test_quant:ref_{name}"


# The quantizers take out= for the QTensor's int8/uint8 values, and the
# op table's out= checks pass float64 arrays and want ``out`` itself back:
# their out= is tested in test_quant.py. Their results are QTensors, which
# the strided check cannot compare, and CUDA takes only C-contiguous x:
# no strided inputs. QTensor arguments are not strided-checked.
SPECS = {s.name: s for s in (
    _quant_spec("quantize_per_tensor", ("quantize",), _quantize_per_tensor_bad,
                reference=_ref("quantize_per_tensor"), samples=_quantize_per_tensor_samples,
                out=False, strided=()),
    _quant_spec("quantize_per_channel", ("quantize",), _quantize_per_channel_bad,
                reference=_ref("quantize_per_channel"),
                samples=_quantize_per_channel_samples, out=False, strided=()),
    _quant_spec("dequantize", ("dequantize",), _dequantize_bad,
                reference=_ref("dequantize"), samples=_dequantize_samples,
                # exact: the integer difference times the scale, rounded once
                tol={_spec.F32: (0.0, 0.0), _spec.F64: (0.0, 0.0)}),
    _quant_spec("add", ("add",), _add_bad, reference=_ref("add"), samples=_add_samples,
                dtypes=(_spec.F32,), out=False),
    _quant_spec("add_relu", ("add",), _add_bad, reference=_ref("add_relu"),
                samples=_add_samples, dtypes=(_spec.F32,), out=False),
    _quant_spec("relu", ("relu",), _relu_bad, reference=_ref("relu"), samples=_relu_samples,
                dtypes=(_spec.F32,), out=False),
    _quant_spec("max_pool2d", ("max_pool2d",), _max_pool2d_bad, reference=_ref("max_pool2d"),
                samples=_max_pool2d_samples, dtypes=(_spec.F32,), out=False),
    _quant_spec("adaptive_avg_pool2d", ("adaptive_avg_pool2d",), _adaptive_avg_pool2d_bad,
                reference=_ref("adaptive_avg_pool2d"), samples=_adaptive_avg_pool2d_samples,
                dtypes=(_spec.F32,), out=False),
    _quant_spec("global_avg_pool2d", ("adaptive_avg_pool2d",), _global_avg_pool2d_bad,
                reference=_ref("global_avg_pool2d"), samples=_global_avg_pool2d_samples,
                dtypes=(_spec.F32,), out=False),
)}


# ---------------------------------------------------------------------------
# Quantize / dequantize


@operator(SPECS["quant.quantize_per_tensor"])
def quantize_per_tensor(x, scale, zero_point, dtype, out=None):
    """Quantize a float array with one scale and zero point (ONNX QuantizeLinear).

    ``q = saturate(round_half_even(x / scale) + zero_point)``, the division
    done in x's precision (a float32 ``x`` divides by ``float32(scale)``),
    saturating to [-128, 127] (int8) or [0, 255] (uint8). NaN maps to the
    zero point. Bit for bit ONNX's QuantizeLinear.

    Parameters
    ----------
    x : ndarray or device array, float32 or float64, any shape
        Strided input is copied to a contiguous one first on the CPU; device
        arrays must be C-contiguous.
    scale : float > 0, finite
    zero_point : int within the range of ``dtype``
    dtype : numpy.int8 or numpy.uint8
    out : int8/uint8 C-contiguous array of x's shape on x's device, optional
        Receives the values (the returned QTensor wraps it).

    Returns
    -------
    QTensor, per tensor, on x's device.

    Raises
    ------
    TypeError
        x is not a float32/float64 array (a QTensor is already quantized),
        dtype is not int8/uint8, ``out`` has the wrong dtype or device.
    ValueError
        scale <= 0 or not finite, zero_point outside dtype's range, ``out``
        of the wrong shape.

    Example
    -------
    >>> q = nbops.quant.quantize_per_tensor(np.array([0.5, 1.5, -9.0], np.float32),
    ...                                     scale=1.0, zero_point=0, dtype=np.int8)
    >>> q.int_repr()                        # ties to even
    array([ 0,  2, -9], dtype=int8)
    """
    op = "quant.quantize_per_tensor"
    x = _float_input(op, "x", x)
    qdtype = _qdtype(op, dtype)
    qmin, qmax = QTYPES[qdtype]
    scale = _check_scalar_scale(op, "scale", scale)
    zero_point = _check_scalar_zero_point(op, "zero_point", zero_point, qmin, qmax, qdtype)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    x = _contiguous(op, "x", x, dev)
    out = _checks.output(op, out, x.shape, qdtype, dev, {"x": x})
    FAMILY.kernel("quantize", dev)(
        x, np.array([scale], x.dtype), np.array([zero_point], np.int32), qmin, qmax, out, 1)
    return QTensor(out, scale, zero_point)


@operator(SPECS["quant.quantize_per_channel"])
def quantize_per_channel(x, scales, zero_points, axis, dtype, out=None):
    """Quantize a float array with one scale and zero point per slice along
    ``axis`` (ONNX QuantizeLinear with a 1-D scale and ``axis``).

    ``q[..., c, ...] = saturate(round_half_even(x[..., c, ...] / scales[c])
    + zero_points[c])``. Scales are stored and applied as float32 (the ONNX
    scale type), cast to x's dtype for the division.

    Parameters
    ----------
    x : ndarray or device array, float32 or float64, at least 1-D
    scales : 1-D float array of length ``x.shape[axis]``, each > 0 and finite
    zero_points : 1-D int array of the same length, within ``dtype``'s range
    axis : int, the channel axis (negative counts from the end)
    dtype : numpy.int8 or numpy.uint8
    out : int8/uint8 C-contiguous array of x's shape on x's device, optional

    Returns
    -------
    QTensor, per channel along ``axis``, on x's device.

    Raises
    ------
    TypeError
        x is not a float32/float64 array, dtype is not int8/uint8, scales or
        zero points are scalars or of a non-numeric type.
    ValueError
        axis out of range, scales/zero_points not of length ``x.shape[axis]``,
        a scale <= 0 or not finite, a zero point outside the type's range.

    Example
    -------
    >>> w = np.array([[1.0, -2.0], [0.1, 0.3]], np.float32)
    >>> q = nbops.quant.quantize_per_channel(w, [0.02, 0.01], [0, 0], axis=0,
    ...                                      dtype=np.int8)
    >>> q.int_repr()
    array([[  50, -100],
           [  10,   30]], dtype=int8)
    """
    op = "quant.quantize_per_channel"
    x = _float_input(op, "x", x)
    qdtype = _qdtype(op, dtype)
    qmin, qmax = QTYPES[qdtype]
    if len(x.shape) == 0:
        raise ValueError(f"{op}: argument 'x' must have at least one dimension for "
                         "per-channel quantization, got a 0-d array")
    axis = _checks.axis(op, "axis", axis, len(x.shape))
    channels = x.shape[axis]
    scales = _check_channel_scales(op, "scales", scales, channels)
    zero_points = _check_channel_zero_points(op, "zero_points", zero_points, channels,
                                             qmin, qmax, qdtype)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    x = _contiguous(op, "x", x, dev)
    out = _checks.output(op, out, x.shape, qdtype, dev, {"x": x})
    if channels:
        FAMILY.kernel("quantize", dev)(
            x, scales.astype(x.dtype), zero_points, qmin, qmax, out, _inner(x.shape, axis))
    return QTensor(out, scales, zero_points, axis=axis)


@operator(SPECS["quant.dequantize"])
def dequantize(q, dtype=np.float32, out=None):
    """Real values of a quantized tensor (ONNX DequantizeLinear).

    ``x = (q - zero_point) * scale``: the difference is exact in int32, the
    product rounds once in ``dtype`` (the scale cast to ``dtype``), so the
    result is within half an ulp of the exact real and within one
    quantization step of whatever was quantized (unless it saturated).

    Parameters
    ----------
    q : QTensor, per tensor or per channel, on the CPU or a CUDA device
    dtype : numpy.float32 (default) or numpy.float64
    out : float array of q's shape, ``dtype`` and device, optional

    Returns
    -------
    ndarray or device array of q's shape, on q's device.

    Raises
    ------
    TypeError
        q is not a QTensor (a float array is not quantized; a raw int8 array
        has no scale: wrap it in ``QTensor(values, scale, zero_point)``),
        dtype is not float32/float64, ``out`` has the wrong dtype or device.
    ValueError
        ``out`` has the wrong shape or is not C-contiguous.

    Example
    -------
    >>> q = nbops.quant.QTensor(np.array([0, 10, 255], np.uint8), 0.5, 10)
    >>> nbops.quant.dequantize(q)
    array([ -5. ,   0. , 122.5], dtype=float32)
    """
    op = "quant.dequantize"
    q = _qtensor(op, "q", q)
    fdtype = np.dtype(dtype) if _is_dtype(dtype) else None
    # not `None in _FLOATS`: NumPy's dtype == None is float64 == float64
    if fdtype is None or fdtype not in _FLOATS:
        raise TypeError(f"{op}: argument 'dtype' must be float32 or float64, got {dtype!r}")
    # an out= on another device is named the way every operator names it
    dev = _dispatch.resolve_device(op, q=q.values, out=out)
    values = _contiguous(op, "q", q.values, dev)
    out = _checks.output(op, out, q.shape, fdtype, dev, {"q": values})
    if q.axis is None:
        scales, zps, inner = np.array([q.scale], fdtype), np.array([q.zero_point], np.int32), 1
    else:
        scales, zps, inner = q.scale.astype(fdtype), q.zero_point, _inner(q.shape, q.axis)
    if scales.size:
        FAMILY.kernel("dequantize", dev)(values, scales, zps, out, inner)
    return out


# ---------------------------------------------------------------------------
# Elementwise operators


@operator(SPECS["quant.add"])
def add(qa, qb, scale, zero_point, requant="fixed"):
    """Quantized ``a + b``, requantized to the output's (scale, zero_point).

    With real inputs ``a = (qa - za) * sa`` and ``b = (qb - zb) * sb``, the
    result is ``q = saturate(round((a + b) / scale) + zero_point)`` in
    integer arithmetic:

    * ``requant="fixed"`` (default), the integer-only formula of TFLite and
      XNNPACK: ``(qa - za)`` and ``(qb - zb)`` shifted left by 20 bits, each
      multiplied by ``s / (2 max(sa, sb))`` in fixed point, summed, and the
      sum requantized by ``2 max(sa, sb) / (2**20 scale)`` (gemmlowp
      rounding, :func:`nbops.quant._requant.requantize`);
    * ``requant="float"``: ``round_half_even((qa - za) * (sa / scale) +
      (qb - zb) * (sb / scale)) + zero_point`` in float64.

    Both are within one step of the exact real result.

    Parameters
    ----------
    qa, qb : QTensor, per tensor, same shape, same dtype (int8 or uint8), same device
    scale : float > 0, output scale
    zero_point : int in the dtype's range, output zero point
    requant : "fixed" or "float"

    Returns
    -------
    QTensor of qa's shape and dtype with the given (scale, zero_point).

    Raises
    ------
    TypeError
        qa or qb is not a QTensor (float arrays must be quantized first), the
        two have different dtypes, or are on different devices.
    ValueError
        Different shapes, a per-channel input, scale <= 0 or not finite,
        zero_point out of range, an unknown ``requant``.

    Example
    -------
    >>> qa = nbops.quant.quantize_per_tensor(np.array([1.0, -2.0], np.float32), 0.1, 0, np.int8)
    >>> qb = nbops.quant.quantize_per_tensor(np.array([0.5, 0.5], np.float32), 0.05, 0, np.int8)
    >>> nbops.quant.add(qa, qb, 0.1, 0).dequantize()
    array([ 1.5, -1.5], dtype=float32)
    """
    return _add("quant.add", qa, qb, scale, zero_point, requant, relu=False)


@operator(SPECS["quant.add_relu"])
def add_relu(qa, qb, scale, zero_point, requant="fixed"):
    """Quantized ``relu(a + b)``: :func:`add` with the lower clamp raised to
    the output zero point (real 0), in the same pass.

    Parameters, returns and errors as :func:`add`.

    Raises
    ------
    TypeError, ValueError
        As :func:`add`.

    Example
    -------
    >>> qa = nbops.quant.quantize_per_tensor(np.array([1.0, -2.0], np.float32), 0.1, 0, np.int8)
    >>> nbops.quant.add_relu(qa, qa, 0.1, 0).dequantize()
    array([2., 0.], dtype=float32)
    """
    return _add("quant.add_relu", qa, qb, scale, zero_point, requant, relu=True)


def _add(op, qa, qb, scale, zero_point, requant, relu):
    qa = _qtensor(op, "qa", qa, per_tensor=True)
    qb = _qtensor(op, "qb", qb, per_tensor=True)
    if qa.dtype != qb.dtype:
        raise TypeError(f"{op}: 'qa' is {qa.dtype} but 'qb' is {qb.dtype}; requantize one "
                        "of them so that both have one dtype")
    if qa.shape != qb.shape:
        raise ValueError(f"{op}: 'qa' and 'qb' must have one shape, got {qa.shape} and "
                         f"{qb.shape}")
    _checks.choice(op, "requant", requant, REQUANT_MODES)
    qmin, qmax = QTYPES[qa.dtype]
    so = _check_scalar_scale(op, "scale", scale)
    zo = _check_scalar_zero_point(op, "zero_point", zero_point, qmin, qmax, qa.dtype)
    dev = _dispatch.resolve_device(op, qa=qa.values, qb=qb.values)
    a = _contiguous(op, "qa", qa.values, dev)
    b = _contiguous(op, "qb", qb.values, dev)
    out = _checks.empty(qa.shape, qa.dtype, dev)
    sa, sb = qa.scale, qb.scale
    twice_max = 2.0 * max(sa, sb)
    ma, sha = quantize_multiplier(sa / twice_max)
    mb, shb = quantize_multiplier(sb / twice_max)
    mo, sho = quantize_multiplier(twice_max / ((1 << 20) * so))
    lo = max(qmin, zo) if relu else qmin
    iparams = np.array([qa.zero_point, qb.zero_point, zo, lo, qmax, ma, sha, mb, shb, mo, sho],
                       np.int64)
    fparams = np.array([sa / so, sb / so], np.float64)
    FAMILY.kernel("add", dev)(a, b, out, iparams, fparams, requant == "fixed")
    return QTensor(out, so, zo)


@operator(SPECS["quant.relu"])
def relu(q):
    """Quantized relu: ``max(q, zero_point)`` with q's own parameters (real 0
    is the zero point; no requantization).

    Parameters
    ----------
    q : QTensor, per tensor, int8 or uint8, any shape, CPU or CUDA

    Returns
    -------
    QTensor of q's shape, dtype, scale and zero point.

    Raises
    ------
    TypeError
        q is not a QTensor (for float arrays use ``nbops.relu``).
    ValueError
        q is quantized per channel.

    Example
    -------
    >>> q = nbops.quant.QTensor(np.array([3, 10, 20], np.uint8), 0.1, 10)
    >>> nbops.quant.relu(q).int_repr()
    array([10, 10, 20], dtype=uint8)
    """
    op = "quant.relu"
    q = _qtensor(op, "q", q, per_tensor=True)
    values = _contiguous(op, "q", q.values, q.device)
    out = _checks.empty(q.shape, q.dtype, q.device)
    FAMILY.kernel("relu", q.device)(values, q.zero_point, out)
    return q._with_values(out)


# ---------------------------------------------------------------------------
# Pooling


@operator(SPECS["quant.max_pool2d"])
def max_pool2d(q, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """2-D max pooling of a quantized NCHW tensor, on the integers directly
    (the affine map is increasing, so the max commutes with it); the output
    keeps q's scale and zero point. Same window rules as ``torch.nn.MaxPool2d``.

    Parameters
    ----------
    q : QTensor, per tensor, int8 or uint8, shape (N, C, H, W), CPU or CUDA
    kernel_size : int or (int, int), >= 1
    stride : int or (int, int), >= 1; defaults to kernel_size
    padding : int or (int, int), >= 0 and at most half the kernel size
    dilation : int or (int, int), >= 1
    ceil_mode : bool, round the output size up (a window must still start
        inside the input or its left padding)

    Returns
    -------
    QTensor of shape (N, C, OH, OW), q's dtype and parameters.

    Raises
    ------
    TypeError
        q is not a QTensor, a size is not an int.
    ValueError
        q is not 4-D or per channel, a size is out of range, the output
        would be empty.

    Example
    -------
    >>> q = nbops.quant.QTensor(np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4), 0.1, 0)
    >>> nbops.quant.max_pool2d(q, 2).int_repr()[0, 0]
    array([[ 5,  7],
           [13, 15]], dtype=int8)
    """
    op = "quant.max_pool2d"
    q = _qtensor(op, "q", q, per_tensor=True)
    _need_nchw(op, q)
    kh, kw = _checks.int_tuple(op, "kernel_size", kernel_size, 2, low=1)
    sh, sw = (kh, kw) if stride is None else _checks.int_tuple(op, "stride", stride, 2, low=1)
    ph, pw = _checks.int_tuple(op, "padding", padding, 2, low=0)
    dh, dw = _checks.int_tuple(op, "dilation", dilation, 2, low=1)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(f"{op}: 'padding' must be at most half the kernel size "
                         f"({kh // 2}, {kw // 2}), got ({ph}, {pw})")
    n, c, h, w = q.shape
    oh = _pooling._out_size(h, kh, sh, ph, dh, ceil_mode)
    ow = _pooling._out_size(w, kw, sw, pw, dw, ceil_mode)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: the window ({kh}x{kw}, dilation {dh}x{dw}) does not fit "
                         f"the padded input {h}x{w}")
    values = _contiguous(op, "q", q.values, q.device)
    out = _checks.empty((n, c, oh, ow), q.dtype, q.device, op)
    FAMILY.kernel("max_pool2d", q.device)(values, out, kh, kw, sh, sw, ph, pw, dh, dw)
    return q._with_values(out)


@operator(SPECS["quant.adaptive_avg_pool2d"])
def adaptive_avg_pool2d(q, output_size, scale=None, zero_point=None, requant="fixed"):
    """Adaptive average pooling of a quantized NCHW tensor (PyTorch's windows:
    rows ``floor(i H / OH)`` to ``ceil((i + 1) H / OH)``), summed in int32
    and requantized to (scale, zero_point), by default q's own.

    Each output is ``saturate(round((sum - n zq) * sq / (n scale)) +
    zero_point)`` for a window of n elements, with the fixed-point
    multiplier of ``sq / (n scale)`` (``requant="fixed"``, one per window
    size) or the float64 product (``"float"``). Windows must hold fewer
    than 2**23 elements (int32 sum of 8-bit values).

    Parameters
    ----------
    q : QTensor, per tensor, int8 or uint8, shape (N, C, H, W), CPU or CUDA
    output_size : int or (int, int), >= 1
    scale, zero_point : output parameters; default q's
    requant : "fixed" or "float"

    Returns
    -------
    QTensor of shape (N, C, OH, OW) and q's dtype.

    Raises
    ------
    TypeError
        q is not a QTensor, a size is not an int.
    ValueError
        q is not 4-D or per channel, a size < 1, an empty input, a window of
        2**23 elements or more, bad output parameters, unknown ``requant``.

    Example
    -------
    >>> q = nbops.quant.QTensor(np.arange(16, dtype=np.int8).reshape(1, 1, 4, 4), 0.1, 0)
    >>> nbops.quant.adaptive_avg_pool2d(q, 1).int_repr().ravel()   # 7.5 rounds away
    array([8], dtype=int8)
    """
    return _adaptive_avg("quant.adaptive_avg_pool2d", q, output_size, scale, zero_point,
                         requant)


@operator(SPECS["quant.global_avg_pool2d"])
def global_avg_pool2d(q, scale=None, zero_point=None, requant="fixed"):
    """Mean over H and W of a quantized NCHW tensor:
    ``adaptive_avg_pool2d(q, 1, scale, zero_point, requant)``, shape (N, C, 1, 1).

    Raises
    ------
    TypeError, ValueError
        As :func:`adaptive_avg_pool2d`.

    Example
    -------
    >>> q = nbops.quant.QTensor(np.full((2, 3, 5, 5), 7, np.uint8), 0.1, 2)
    >>> nbops.quant.global_avg_pool2d(q).int_repr().shape
    (2, 3, 1, 1)
    """
    return _adaptive_avg("quant.global_avg_pool2d", q, 1, scale, zero_point, requant)


def _adaptive_avg(op, q, output_size, scale, zero_point, requant):
    """Both average pools, their errors naming ``op``."""
    q = _qtensor(op, "q", q, per_tensor=True)
    _need_nchw(op, q)
    oh, ow = _checks.int_tuple(op, "output_size", output_size, 2, low=1)
    _checks.choice(op, "requant", requant, REQUANT_MODES)
    n, c, h, w = q.shape
    if h == 0 or w == 0:
        raise ValueError(f"{op}: the input's spatial size is {h}x{w}; nothing to average")
    qmin, qmax = QTYPES[q.dtype]
    so = q.scale if scale is None else _check_scalar_scale(op, "scale", scale)
    zo = q.zero_point if zero_point is None else _check_scalar_zero_point(
        op, "zero_point", zero_point, qmin, qmax, q.dtype)
    # the output is sized (and refused by name) before the per-window tables
    # below, which hold oh * ow entries whatever the batch
    out = _checks.empty((n, c, oh, ow), q.dtype, q.device, op)
    if out.size == 0:
        return QTensor(out, so, zo)
    i, j = np.arange(oh), np.arange(ow)
    rows = -((-(i + 1) * h) // oh) - (i * h) // oh
    cols = -((-(j + 1) * w) // ow) - (j * w) // ow
    counts = (rows[:, None] * cols[None, :]).reshape(-1)
    if counts.max() >= 1 << 23:
        raise ValueError(f"{op}: windows of {counts.max()} elements could overflow the int32 "
                         "sum (limit 2**23 - 1); pool in two stages")
    fscale = q.scale / (so * counts.astype(np.float64))
    mult, shift = _multipliers(fscale)
    values = _contiguous(op, "q", q.values, q.device)
    FAMILY.kernel("adaptive_avg_pool2d", q.device)(
        values, out, q.zero_point, zo, qmin, qmax, mult, shift, fscale, requant == "fixed")
    return QTensor(out, so, zo)


# ---------------------------------------------------------------------------
# The rest of the public API (imported last: these modules use the operators above)

from .linear import (  # noqa: E402
    PackedWeight, conv2d, linear, linear_dynamic, matmul, matmul_integer, pack_weight,
)
from .observers import (  # noqa: E402
    HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver,
)
from .model import QConfig, convert, default_qconfig, prepare, quantize_dynamic  # noqa: E402


# ---------------------------------------------------------------------------
# Helpers


def _multipliers(reals):
    # one Python call per distinct value (adaptive windows have at most four
    # sizes), not per window
    distinct, where = np.unique(reals, return_inverse=True)
    pairs = [quantize_multiplier(r) for r in distinct]
    return (np.array([m for m, _ in pairs], np.int32)[where],
            np.array([s for _, s in pairs], np.int32)[where])


def _is_dtype(d):
    try:
        np.dtype(d)
        return True
    except TypeError:
        return False


def _qdtype(op, dtype):
    d = np.dtype(dtype) if _is_dtype(dtype) and dtype is not None else None
    if d not in QTYPES:
        raise TypeError(f"{op}: argument 'dtype' must be numpy.int8 or numpy.uint8, "
                        f"got {dtype!r}")
    return d


def _float_input(op, name, x):
    if isinstance(x, QTensor):
        raise TypeError(f"{op}: argument '{name}' is already a QTensor; dequantize() it "
                        "first or pass the float array")
    if (isinstance(x, np.ndarray) or _dispatch.is_device_array(x)) and x.dtype in _QDTYPES:
        raise TypeError(f"{op}: argument '{name}' must be a float32 or float64 array, got "
                        f"{x.dtype} (integers are not quantized by scale; wrap quantized "
                        "values in QTensor(values, scale, zero_point))")
    return _checks.array(op, name, x)


def _qtensor(op, name, q, per_tensor=False):
    if not isinstance(q, QTensor):
        what = _checks.describe(q)
        hint = ""
        if getattr(q, "dtype", None) is not None:
            hint = ("; quantize float data with quantize_per_tensor()" if q.dtype.kind == "f"
                    else "; wrap raw integers in QTensor(values, scale, zero_point)")
        raise TypeError(f"{op}: argument '{name}' must be a QTensor, got {what}{hint}")
    if per_tensor and q.axis is not None:
        raise ValueError(f"{op}: argument '{name}' is quantized per channel (axis {q.axis}); "
                         "this operator needs per-tensor quantization")
    return q


def _contiguous(op, name, x, dev):
    if dev == CPU:
        # np.ascontiguousarray makes a 0-d array 1-d: the output took its shape
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)
    from .._layout import is_c_contiguous

    if not is_c_contiguous(x):
        raise ValueError(f"{op}: device array '{name}' must be C-contiguous, got strides "
                         f"{tuple(x.strides)}; copy it first")
    return x


def _inner(shape, axis):
    return int(np.prod(shape[axis + 1:], dtype=np.int64)) if axis + 1 < len(shape) else 1


def _need_nchw(op, q):
    if q.ndim != 4:
        raise ValueError(f"{op}: argument 'q' must be 4-D (N, C, H, W), got shape {q.shape}")
