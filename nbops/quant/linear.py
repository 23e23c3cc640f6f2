"""Int8 products with int32 accumulation: ONNX MatMulInteger, QLinearMatMul,
QLinearConv, and quantized (static and dynamic) fully connected layers.

Every operator here reduces to one integer GEMM per device,

    acc[i, j] = sum_k (a[i, k] - za[i]) * (b[k, j] - zb[j])      (int32)

followed by an epilogue applied to each output tile while it is in
registers or L1: ``+ bias`` (int32, scale ``s_a * s_b[j]``, zero point 0,
as ONNX and QNNPACK define it), then either the int32 result
(:func:`matmul_integer`), a requantization to int8/uint8 with a fixed-point
multiplier (``requant="fixed"``, the default; gemmlowp/TFLite rounding, see
:mod:`nbops.quant._requant`) or in float64 (``requant="float"``: ONNX's
reference formula ``round_half_even(acc * (s_a * s_b / s_out)) + z_out``,
the scale product taken in float32), or a dequantization to float32
(``(acc + bias) * s_a * s_b[j]``, when no output scale is given).

CPU (``nbops/quant/cpu_gemm.py``): weights are packed once
(:func:`pack_weight`) into ``[n/32][k/4][32][4]`` signed bytes, activations
per call into ``[m/8][k/4][8][4]`` unsigned bytes, and an 8 x 32 register
tile of AVX-512 VNNI ``vpdpbusd`` accumulates them (a portable kernel
elsewhere). CUDA (``nbops/quant/cuda_gemm.py``): shared-memory tiles with
int32 accumulation. :func:`conv2d` is an implicit GEMM: the input is
unfolded (im2col) straight into the packed layout, one image and group at a
time, with the input's zero point in the padding.

Accumulator bound: the int32 accumulator is exact when
``k * max|a - za| * max|b - zb| < 2**31`` (for uint8 activations with int8
weights ``k * 255 * 128 < 2**31``, i.e. ``k <= 65793``); longer reductions
raise ``ValueError`` rather than wrap silently.
"""

import numbers

import numpy as np

from .. import _checks, _dispatch, _layout, _spec
from .. import conv as _conv
from .._dispatch import CPU, operator
from . import _requant
from .qtensor import QTYPES, QTensor

__all__ = ["matmul_integer", "matmul", "linear", "linear_dynamic", "conv2d", "pack_weight",
           "PackedWeight", "ACC_LIMIT"]

# the int8 GEMM's modules pair as quant/cpu_gemm.py and quant/cuda_gemm.py
FAMILY = _spec.Family("quant_gemm", "nbops.quant.cpu_gemm", "nbops.quant.cuda_gemm")
# the packers have no CUDA twin: registered on the CPU only, outside the specs
_dispatch.register_kernels(FAMILY, ("pack_a", "pack_b"), (CPU,))

#: Exclusive bound on ``k * max|a - za| * max|b - zb|`` (int32 accumulation).
ACC_LIMIT = 2**31

_QDTYPES = tuple(QTYPES)
_REQUANT = ("fixed", "float")
_MODE = {"int32": 0, "fixed": 1, "float": 2, "dequant": 3}


# ---------------------------------------------------------------------------
# Declarations
#
# The op table runs every operator here: int32 results compare exactly,
# QTensor results as values bit for bit with equal parameters, float32
# results against references that do the kernels' float32 arithmetic
# (tests/test_quant_gemm.py). The samples do not depend on the dtype asked
# for: these operators take no float array (linear_dynamic takes float32
# only), so they declare float32 alone. Their out= (matmul_integer's, int32)
# is tested in test_quant_gemm.py: the op table's out= checks pass float64
# arrays. Every sample is small enough for the simulated CUDA rows but one
# of each list, larger than the CPU's 8 x 32 register tile along m or n.

U8, I8 = np.uint8, np.int8


def _ints(rng, shape, dtype):
    """Integers over the whole range of ``dtype`` (0-d stays an array)."""
    lo, hi = QTYPES[np.dtype(dtype)]
    return np.asarray(rng.integers(lo, hi + 1, shape), dtype)


def _matmul_integer_samples(dtype):
    """Both operand types in every pairing, per-row and per-column zero
    points (int arrays), batch axes that broadcast, 1-D operands on either
    side, an empty reduction, and the extremes: both ends of the ranges
    against zero points at the other end."""
    rng = np.random.default_rng(7)
    cases = (((4, 9), (9, 6), U8, I8, 0, 0), ((2, 3, 5), (5, 7), U8, U8, "rows", "cols"),
             ((3, 1, 2, 4), (2, 4, 3), I8, I8, -7, 3), ((17,), (17, 6), I8, U8, 12, "cols"),
             ((4, 6), (6,), U8, I8, "rows", -128), ((5, 0), (0, 3), U8, I8, 1, 2),
             ((9, 37), (37, 40), U8, I8, 131, -5))
    out = []
    for sa, sb, da, db, za, zb in cases:
        a, b = _ints(rng, sa, da), _ints(rng, sb, db)
        m = sa[-2] if len(sa) > 1 else 1
        n = sb[-1] if len(sb) > 1 else 1
        za = _ints(rng, (m,), da).astype(np.int32) if za == "rows" else za
        zb = _ints(rng, (n,), db).astype(np.int32) if zb == "cols" else zb
        out.append(_spec.Sample((a, b), dict(a_zero_point=za, b_zero_point=zb),
                                f"{sa}{np.dtype(da).name}@{sb}{np.dtype(db).name}"))
    a = np.array([[255, 0, 255, 0], [0, 255, 0, 255]], U8)
    b = np.array([[-128, 127, 127], [127, -128, 127], [-128, -128, -128], [127, 127, 127]], I8)
    out.append(_spec.Sample((a, b), dict(a_zero_point=np.array([0, 255], np.int32),
                                         b_zero_point=np.array([127, -128, 0], np.int32)),
                            "edge"))
    return out


def _matmul_samples(dtype):
    """QLinearMatMul per tensor and per column, both operand and output
    types (qa's by default), batch axes, 1-D operands, an empty reduction,
    an output scale that saturates, both requantizations."""
    rng = np.random.default_rng(8)

    def q(shape, dt, zp, scale=None, axis=None):
        if axis is not None:
            n = shape[axis]
            return QTensor(_ints(rng, shape, dt), rng.uniform(0.002, 0.02, n),
                           _ints(rng, (n,), dt) // 4 + (0 if dt == I8 else 96), axis)
        return QTensor(_ints(rng, shape, dt), 0.05 if scale is None else scale, zp)

    cases = ((q((5, 8), U8, 131), q((8, 6), I8, 0, 0.01), 0.08, -5, I8),
             (q((2, 3, 7), U8, 3), q((7, 5), I8, 0, axis=1), 0.05, 100, None),
             (q((7,), I8, -20), q((7, 4), I8, 0, axis=1), 0.02, 0, I8),
             (q((3, 6), I8, 5), q((6,), U8, 128, 0.2), 0.3, 128, U8),
             (q((2, 1, 3, 4), U8, 0), q((3, 4, 2), I8, -1, 0.03), 0.4, 0, None),
             (q((3, 0), U8, 7), q((0, 4), I8, 0, 0.5), 0.1, 12, None),
             (q((4, 5), I8, 0), q((5, 3), I8, 0, 0.5), 1e-4, 0, I8),
             (q((11, 21), U8, 140), q((21, 19), I8, 0, axis=1), 0.08, -5, I8))
    return [_spec.Sample((qa, qb, so, zo), dict(out_dtype=odt, requant=requant),
                         f"{qa.shape}@{qb.shape}{'' if qb.axis is None else 'per-column'},"
                         f"{requant}")
            for qa, qb, so, zo, odt in cases for requant in ("fixed", "float")]


def _weight(rng, shape, dt, per_channel):
    """A quantized weight, per output channel (axis 0) or per tensor."""
    oc = shape[0]
    if per_channel:
        return QTensor(_ints(rng, shape, dt), rng.uniform(0.001, 0.01, oc),
                       _ints(rng, (oc,), dt) // 8 + (0 if dt == I8 else 100), axis=0)
    return QTensor(_ints(rng, shape, dt), 0.004, -3 if dt == I8 else 128)


def _bias(rng, n):
    return rng.integers(-5000, 5000, n).astype(np.int32)


def _linear_samples(dtype):
    """Both input and weight types, per-channel and per-tensor weights, with
    and without an int32 bias, requantized both ways to either type or
    dequantized to float32, 1-D and 3-D inputs."""
    rng = np.random.default_rng(9)
    out = []
    for xs, dx, dw, per_channel, with_bias, odt in (
            ((3, 3, 8), U8, I8, True, True, U8), ((4, 10), I8, I8, False, True, I8),
            ((2, 12), U8, U8, True, False, I8), ((8,), I8, I8, True, True, None),
            ((3, 3, 8), I8, I8, True, False, None), ((9, 45), U8, I8, True, True, U8)):
        k = xs[-1]
        n = 5 if k == 8 else 35 if k == 45 else 6
        x = QTensor(_ints(rng, xs, dx), 0.03, 7 if dx == I8 else 140)
        w = _weight(rng, (n, k), dw, per_channel)
        args = (x, w, _bias(rng, n)) if with_bias else (x, w)
        label = f"{xs}{np.dtype(dx).name},w{'per-channel' if per_channel else ''}"
        if odt is None:
            out.append(_spec.Sample(args, {}, label + ",float32"))
            continue
        zo = -9 if odt == I8 else 77
        for requant in ("fixed", "float"):
            out.append(_spec.Sample(args, dict(out_scale=0.06, out_zero_point=zo,
                                               out_dtype=odt, requant=requant),
                                    f"{label},{np.dtype(odt).name},{requant}"))
    return out


def _linear_dynamic_samples(dtype):
    """Per-channel and per-tensor int8 weights, with and without a float32
    bias, inputs of both signs, of one sign (the range extended to 0), all
    zero (unit scale), 1-D and 3-D."""
    rng = np.random.default_rng(10)
    out = []
    for xs, lo, hi, per_channel, with_bias in (
            ((2, 5, 8), -2.0, 3.0, True, True), ((4, 12), -1.0, 1.0, False, False),
            ((3, 8), 0.5, 4.0, True, False), ((8,), -3.0, -0.25, True, True),
            ((2, 8), 0.0, 0.0, False, True), ((16, 64), -2.0, 2.0, True, True)):
        k = xs[-1]
        n = 6 if k < 64 else 24
        x = rng.uniform(lo, hi, xs).astype(np.float32)
        w = _weight(rng, (n, k), I8, per_channel)
        args = (x, w, rng.standard_normal(n).astype(np.float32)) if with_bias else (x, w)
        out.append(_spec.Sample(args, {}, f"{xs}[{lo},{hi}],bias={with_bias}"))
    return out


def _conv2d_samples(dtype):
    """Per-channel and per-tensor weights, both input types, padding,
    strides and dilations given as pairs, grouped and depthwise, with and
    without a bias, dequantized to float32 or requantized both ways."""
    rng = np.random.default_rng(11)
    out = []
    for xs, ws, kw, dx, per_channel, with_bias, odt in (
            ((1, 3, 5, 6), (4, 3, 3, 3), dict(padding=1), U8, True, True, U8),
            ((2, 4, 4, 3), (6, 2, 3, 3), dict(stride=(2, 1), padding=1, dilation=(1, 2),
                                              groups=2), U8, True, True, U8),
            ((1, 4, 4, 4), (4, 1, 3, 3), dict(groups=4), I8, True, False, I8),
            ((1, 8, 4, 4), (9, 8, 1, 1), dict(stride=2), I8, False, True, U8),
            ((2, 6, 10, 13), (12, 6, 3, 3), dict(padding=1), I8, True, True, I8)):
        qx = QTensor(_ints(rng, xs, dx), 0.04, 130 if dx == U8 else -6)
        qw = _weight(rng, ws, I8, per_channel)
        args = (qx, qw, _bias(rng, ws[0])) if with_bias else (qx, qw)
        label = f"{xs}*{ws}{kw}"
        out.append(_spec.Sample(args, dict(kw), label + ",float32"))
        for requant in ("fixed", "float"):
            out.append(_spec.Sample(args, dict(kw, out_scale=0.1,
                                               out_zero_point=100 if odt == U8 else -3,
                                               out_dtype=odt, requant=requant),
                                    f"{label},{np.dtype(odt).name},{requant}"))
    return out


def _lazy_bad(make):
    """``bad(dtype)`` of the ``(args, kwargs, error, match)`` calls that
    ``make()`` gives, built only when the tests ask."""
    def bad(dtype):
        return [_spec.Bad(*c) for c in make()]
    return bad


def _operands():
    """uint8 A (4, 8), int8 B (8, 3), and QTensors: x (2, 8) uint8 and a
    linear weight (3, 8) int8."""
    return (np.zeros((4, 8), np.uint8), np.zeros((8, 3), np.int8),
            QTensor(np.zeros((2, 8), np.uint8), 0.1, 0),
            QTensor(np.zeros((3, 8), np.int8), 0.1, 0))


def _matmul_integer_bad():
    a, b, qx, _ = _operands()
    return [
        ((a.astype(np.float32), b), {}, TypeError, "'a' must be a uint8"),
        ((a, b.astype(np.int32)), {}, TypeError, "'b' must be a uint8"),
        ((qx, b), {}, TypeError, "QTensor"),
        ((a, b[:5]), {}, ValueError, "inner dimensions"),
        ((np.zeros(()), b), {}, TypeError, "'a' must be a uint8"),
        ((np.zeros((), np.uint8), b), {}, ValueError, "at least 1 dimension"),
        ((np.zeros((2, 4, 8), np.uint8), np.zeros((3, 8, 3), np.int8)), {}, ValueError,
         "do not broadcast"),
        ((a, b), dict(a_zero_point=256), ValueError, "a_zero_point"),
        ((a, b), dict(b_zero_point=-129), ValueError, "b_zero_point"),
        ((a, b), dict(b_zero_point=np.zeros(4, np.int8)), ValueError, "one per column"),
        ((a, b), dict(a_zero_point=0.5), TypeError, "a_zero_point"),
        ((a, b), dict(a_zero_point=True), TypeError, "got bool"),
        ((a, b), dict(out=np.empty((4, 3), np.float32)), TypeError, "'out' must be int32"),
        ((np.zeros((1, 70000), np.uint8), np.zeros((70000, 1), np.int8)), {}, ValueError,
         "overflow the int32 accumulator")]


def _matmul_bad():
    a, b, qx, qw = _operands()
    qb = QTensor(b, 0.1, 0)
    return [
        ((a, qw, 0.1, 0), {}, TypeError, "'qa' must be a QTensor"),
        ((qx, b, 0.1, 0), {}, TypeError, "'qb' must be a QTensor"),
        ((qx, QTensor(b, np.ones(8), np.zeros(8), axis=0), 0.1, 0), {}, ValueError,
         "per column"),
        ((QTensor(np.zeros((2, 8), np.uint8), [0.1, 0.2], [0, 0], axis=0), qb, 0.1, 0), {},
         ValueError, "'qa' must be quantized per tensor"),
        ((qx, qb, 0.0, 0), {}, ValueError, "out_scale"),
        ((qx, qb, 0.1, 300), {}, ValueError, "out_zero_point"),
        ((qx, qb, 0.1, 0.5), {}, TypeError, "'out_zero_point' must be an int"),
        ((qx, qb, 0.1, 0), dict(out_dtype=np.int16), TypeError, "out_dtype"),
        ((qx, qb, 0.1, 0), dict(requant="round"), ValueError, "requant"),
        ((qx, qw, 0.1, 0), {}, ValueError, "inner dimensions")]


def _linear_bad():
    _, _, qx, qw = _operands()
    return [
        ((np.zeros((2, 8), np.float32), qw), {}, TypeError, "'x' must be a QTensor"),
        ((qx, np.zeros((3, 8), np.float32)), {}, TypeError, "'w' must be a QTensor"),
        ((qx, QTensor(np.zeros((3, 7), np.int8), 0.1, 0)), {}, ValueError, "input features"),
        ((qx, QTensor(np.zeros((3, 8, 1), np.int8), 0.1, 0)), {}, ValueError, "must be 2-D"),
        ((qx, QTensor(np.zeros((3, 8), np.int8), np.ones(8), np.zeros(8), axis=1)), {},
         ValueError, "axis 0"),
        ((qx, qw, [1, 2, 3]), {}, TypeError, "'bias' must be an int32 array"),
        ((qx, qw), dict(out_scale=0.1), ValueError, "both"),
        ((qx, qw), dict(out_dtype=np.int8), ValueError, "'out_dtype' needs"),
        ((qx, qw), dict(out_scale=0.1, out_zero_point=0, requant="round"), ValueError,
         "requant"),
        ((qx, qw, np.zeros(3, np.float32)), {}, TypeError, "'bias' must be int32"),
        ((qx, qw, np.zeros(4, np.int32)), {}, ValueError, "'bias' must have shape")]


def _linear_dynamic_bad():
    _, _, qx, qw = _operands()
    x = np.zeros((2, 8), np.float32)
    return [
        ((qx, qw), {}, TypeError, "float32"),
        ((np.zeros((2, 8), np.int8), qw), {}, TypeError, "must be a float32 array"),
        ((np.zeros((2, 8)), qw), {}, TypeError, "float32"),
        ((x, np.zeros((3, 8), np.int8)), {}, TypeError, "'w' must be a QTensor"),
        ((np.zeros((2, 7), np.float32), qw), {}, ValueError, "input features"),
        ((np.full((2, 8), np.nan, np.float32), qw), {}, ValueError, "non-finite")]


def _conv2d_bad():
    _, _, qx, qw = _operands()

    def x(*shape):
        return QTensor(np.zeros(shape, np.uint8), 0.1, 0)

    def w(*shape):
        return QTensor(np.zeros(shape, np.int8), 0.1, 0)

    return [
        ((qx, qw), {}, ValueError, "4-D"),
        ((np.zeros((1, 3, 4, 4), np.uint8), w(4, 3, 3, 3)), {}, TypeError,
         "'qx' must be a QTensor"),
        ((x(1, 3, 4, 4), w(4, 2, 3, 3)), {}, ValueError, "groups"),
        ((x(1, 2, 2, 2), w(4, 2, 3, 3)), {}, ValueError,
         "of 'qw' spans 3 .* padded input of 'qx' is only 2"),
        ((x(1, 2, 4, 4), w(4, 2, 3, 3)), dict(padding="same"), TypeError,
         "'padding' must be an int or a tuple of 2 ints"),
        ((x(1, 2, 4, 4), w(4, 2, 3, 3)), dict(stride=0), ValueError, "stride"),
        ((x(1, 2, 4, 4), w(4, 2, 3, 3)), dict(groups=0), ValueError, "'groups'"),
        ((x(1, 4, 4, 4), w(3, 2, 3, 3)), dict(groups=2), ValueError, "not divisible"),
        ((x(1, 2, 4, 4), w(4, 2, 3, 3)), dict(out_scale=0.1), ValueError, "both")]


def _gemm_spec(name, kernels, bad, **fields):
    return _spec.OpSpec(f"quant.{name}", FAMILY, kernels, bad=_lazy_bad(bad), **fields)


def _bench(name, baseline, setup, reference, **options):
    """A :class:`nbops._spec.Bench` of ``nbops.bench.quant``'s functions
    (``out_like`` and ``flops`` named by attribute too)."""
    def at(attr):
        return f"nbops.bench.quant:{attr}"

    for key in ("out_like", "flops"):
        if key in options:
            options[key] = at(options[key])
    return _spec.Bench(at(baseline), name, at(setup), reference=at(reference),
                       options=dict(dtypes=(_spec.F32,), tol=(1e-6, 1e-6), **options))


def _ref(name):
    return f"test_quant_gemm:ref_op_{name}"


F32 = (_spec.F32,)
#: float32 results that are one rounding of a float32 product, as in the reference
_EXACT = {_spec.F32: (0.0, 0.0)}

# matmul_integer's operands may have any strides on both devices; linear's
# and conv2d's bias, and linear_dynamic's x and bias, must be C-contiguous
# on CUDA (strided=()).
SPECS = {s.name: s for s in (
    _gemm_spec("matmul_integer", ("gemm_op",), _matmul_integer_bad,
               reference=_ref("matmul_integer"), samples=_matmul_integer_samples, dtypes=F32,
               out=False,
               bench=(_bench("quant_matmul_integer", "numpy_int32", "square_ints", "ref_gemm",
                             out_like="gemm_out", flops="gemm_ops",
                             baseline_name="numpy int32 matmul"),)),
    _gemm_spec("matmul", ("gemm_op",), _matmul_bad, reference=_ref("matmul"),
               samples=_matmul_samples, dtypes=F32, out=False),
    _gemm_spec("linear", ("gemm_op",), _linear_bad, reference=_ref("linear"),
               samples=_linear_samples, dtypes=F32, tol=_EXACT, out=False, strided=()),
    # the CPU kernel fuses the scale's product and the float bias's sum (one
    # FMA), the simulator does not, a GPU may: the default float32 tolerance
    _gemm_spec("linear_dynamic", ("gemm_op",), _linear_dynamic_bad,
               reference=_ref("linear_dynamic"), samples=_linear_dynamic_samples, dtypes=F32,
               out=False, strided=()),
    _gemm_spec("conv2d", ("conv2d_op",), _conv2d_bad, reference=_ref("conv2d"),
               samples=_conv2d_samples, dtypes=F32, tol=_EXACT, out=False, strided=()),
)}


@operator(SPECS["quant.matmul_integer"])
def matmul_integer(a, b, a_zero_point=0, b_zero_point=0, out=None):
    """ONNX MatMulInteger: ``(a - a_zero_point) @ (b - b_zero_point)`` in int32.

    Parameters
    ----------
    a : array (..., m, k), uint8 or int8, CPU or CUDA
    b : array (..., k, n), uint8 or int8, same device
        Batch axes broadcast as in ``np.matmul``; a 1-D ``a`` is a row and a
        1-D ``b`` a column, their unit axes dropped from the result.
    a_zero_point : int, or int array of shape (m,) (one per row of ``a``)
    b_zero_point : int, or int array of shape (n,) (one per column of ``b``)
        Within the range of the operand's type.
    out : int32 array, optional

    Returns
    -------
    int32 array of shape ``broadcast(batch) + (m, n)``.

    Raises
    ------
    TypeError
        An operand that is not uint8/int8 (float data must be quantized
        first), a QTensor (pass ``.values``), mixed devices, a float zero point.
    ValueError
        Inner dimensions that differ, batch axes that do not broadcast, a
        zero point outside its type's range or of the wrong length, a
        reduction long enough to overflow int32 (see ``ACC_LIMIT``).

    Example
    -------
    >>> a = np.array([[1, 2], [3, 4]], np.uint8); b = np.array([[1, -1], [2, 0]], np.int8)
    >>> nbops.quant.matmul_integer(a, b, a_zero_point=1)
    array([[ 2,  0],
           [ 8, -2]], dtype=int32)
    """
    op = "quant.matmul_integer"
    _int8_array(op, "a", a)
    _int8_array(op, "b", b)
    dev = _dispatch.resolve_device(op, a=a, b=b, out=out)
    a2, b2, batch, m, k, n = _matmul_shapes(op, a, b)
    za = _zero_points(op, "a_zero_point", a_zero_point, a.dtype, m, "rows of 'a'")
    zb = _zero_points(op, "b_zero_point", b_zero_point, b.dtype, n, "columns of 'b'")
    _check_acc(op, k, a.dtype, za, b.dtype, zb)
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    out = _checks.output(op, out, shape, np.int32, dev, {"a": a, "b": b})
    nb = int(np.prod(batch)) if batch else 1
    out3 = _view3(out, nb, m, n)
    epi = _epilogue("int32", None, None, None, 0, 0, None, m, n)
    _product(dev, a2, za, _BOperand.raw(b2, batch), zb, batch, out3, m, n, k, epi)
    return out


@operator(SPECS["quant.matmul"])
def matmul(qa, qb, out_scale, out_zero_point, out_dtype=None, requant="fixed"):
    """ONNX QLinearMatMul on QTensors, requantized to ``out_scale`` /
    ``out_zero_point``.

    Parameters
    ----------
    qa : QTensor (..., m, k), uint8 or int8, per tensor
    qb : QTensor (..., k, n), uint8 or int8, per tensor or per column
        (``axis`` = its last axis); batch axes broadcast as in ``np.matmul``.
    out_scale : float > 0
    out_zero_point : int within ``out_dtype``'s range
    out_dtype : numpy.uint8 or numpy.int8, optional
        Default: ``qa``'s dtype.
    requant : {"fixed", "float"}
        Fixed-point multiplier and shift (integer-only engines), or float64
        ``round_half_even`` (ONNX's reference); see the module docstring.

    Returns
    -------
    QTensor of shape ``broadcast(batch) + (m, n)``, ``out_dtype``, with
    ``out_scale``/``out_zero_point``, on the operands' device.

    Raises
    ------
    TypeError
        Operands that are not QTensors (float arrays must be quantized
        first), mixed devices, a bad ``out_dtype``.
    ValueError
        ``qa`` quantized per channel, ``qb`` per channel along another axis
        than its last, inner dimensions that differ, a bad output scale or
        zero point, an int32 overflow risk, an unknown ``requant``.

    Example
    -------
    >>> qa = QTensor(np.array([[10, 20]], np.uint8), 0.1, 0)
    >>> qb = QTensor(np.array([[1], [2]], np.int8), 0.5, 0)
    >>> nbops.quant.matmul(qa, qb, out_scale=0.25, out_zero_point=0).values
    array([[10]], dtype=uint8)
    """
    op = "quant.matmul"
    _qtensor(op, "qa", qa)
    _qtensor(op, "qb", qb)
    if qa.axis is not None:
        raise ValueError(f"{op}: argument 'qa' must be quantized per tensor, got per-channel "
                         f"parameters along axis {qa.axis}")
    if qb.axis is not None and qb.axis != qb.ndim - 1:
        raise ValueError(f"{op}: argument 'qb' may be quantized per column (axis "
                         f"{qb.ndim - 1}), got axis {qb.axis}")
    if qb.axis is not None and qb.ndim == 1:
        # a 1-D qb is one column: its only axis is the reduction's
        raise ValueError(f"{op}: a 1-D 'qb' is a single column; its parameters along axis 0 "
                         f"would scale the reduction axis k, not columns: quantize it per "
                         f"tensor or pass it as shape ({qb.shape[0]}, 1)")
    dev = _dispatch.resolve_device(op, qa=qa.values, qb=qb.values)
    a2, b2, batch, m, k, n = _matmul_shapes(op, qa.values, qb.values)
    za = np.full(m, qa.zero_point, np.int32)
    zb = _per(qb.zero_point, n, np.int32)
    _check_acc(op, k, qa.dtype, za, qb.dtype, zb)
    odt, s_out, z_out = _out_params(op, out_scale, out_zero_point, out_dtype, qa.dtype)
    _choice(op, "requant", requant, _REQUANT)
    shape = batch + ((m,) if qa.ndim > 1 else ()) + ((n,) if qb.ndim > 1 else ())
    out = _checks.empty(shape, odt, dev, op)
    nb = int(np.prod(batch)) if batch else 1
    scales = np.float32(qa.scale) * _per(qb.scale, n, np.float32)
    epi = _epilogue(requant, scales, None, s_out, z_out, odt, None, m, n)
    _product(dev, a2, za, _BOperand.raw(b2, batch), zb, batch, _view3(_bytes(out), nb, m, n),
             m, n, k, epi)
    return QTensor(out, s_out, z_out)


@operator(SPECS["quant.linear"])
def linear(x, w, bias=None, out_scale=None, out_zero_point=None, out_dtype=None,
           requant="fixed"):
    """Quantized fully connected layer ``x @ w.T + bias``, requantized or
    dequantized in the GEMM's epilogue.

    Parameters
    ----------
    x : QTensor (..., in_features), uint8 or int8, per tensor
    w : QTensor (out_features, in_features), int8 (or uint8), per tensor or
        per output channel (axis 0); or a :class:`PackedWeight` from
        :func:`pack_weight` (packed once, reused by every call).
    bias : int32 array (out_features,), optional
        In units of ``x.scale * w.scale[j]`` with zero point 0 (ONNX,
        QNNPACK); ``linear_dynamic`` takes a float bias.
    out_scale, out_zero_point : float, int, optional
        Given: the result is a QTensor of ``out_dtype`` (default ``x``'s).
        Omitted: the result is the dequantized float32 array
        ``(acc + bias) * x.scale * w.scale[j]``.
    out_dtype : numpy.uint8 or numpy.int8, optional
    requant : {"fixed", "float"}
        As :func:`matmul`.

    Returns
    -------
    QTensor (..., out_features), or float32 array when ``out_scale`` is None.

    Raises
    ------
    TypeError
        ``x``/``w`` not QTensors (float where int8 is required), a float
        ``bias``, mixed devices, a bad ``out_dtype``.
    ValueError
        ``x`` per channel, ``w`` not 2-D or per channel along axis 1,
        in_features mismatch, ``bias`` of the wrong shape, only one of
        ``out_scale``/``out_zero_point``, a bad output scale or zero point,
        an int32 overflow risk.

    Example
    -------
    >>> x = QTensor(np.array([[130, 126]], np.uint8), 0.5, 128)
    >>> w = QTensor(np.array([[2, 4], [1, 1]], np.int8), np.array([0.1, 0.2]), np.zeros(2), axis=0)
    >>> nbops.quant.linear(x, w)
    array([[-0.2,  0. ]], dtype=float32)
    """
    op = "quant.linear"
    _qtensor(op, "x", x)
    if x.axis is not None:
        raise ValueError(f"{op}: argument 'x' must be quantized per tensor, got per-channel "
                         f"parameters along axis {x.axis}")
    pw = w if isinstance(w, PackedWeight) else _packable(op, "w", w, 2)
    dev = _dispatch.resolve_device(op, x=x.values, w=pw.qweight.values,
                                   bias=bias if _is_array(bias) else None)
    if pw.device != dev and isinstance(w, PackedWeight):
        raise TypeError(f"{op}: the packed weight is on {pw.device} but 'x' is on {dev}")
    n, k = pw.shape[0], pw.shape[1]
    if len(pw.shape) != 2:
        raise ValueError(f"{op}: argument 'w' must be 2-D (out_features, in_features), got "
                         f"shape {pw.shape}")
    if x.ndim == 0 or tuple(x.shape)[-1] != k:
        raise ValueError(f"{op}: 'x' has shape {tuple(x.shape)} but 'w' expects {k} input "
                         f"features (shape {pw.shape})")
    bias = _int_bias(op, bias, n, dev)
    qw = pw.qweight
    zb = pw.zp
    m = int(np.prod(tuple(x.shape)[:-1], dtype=np.int64))
    za = np.full(m, x.zero_point, np.int32)
    _check_acc(op, k, x.dtype, za, qw.dtype, zb)
    scales = np.float32(x.scale) * _per(qw.scale, n, np.float32)
    lead = tuple(x.shape)[:-1]
    if out_scale is None and out_zero_point is None:
        if out_dtype is not None:
            raise ValueError(f"{op}: 'out_dtype' needs 'out_scale' and 'out_zero_point'")
        out = _checks.empty(lead + (n,), np.float32, dev, op)
        epi = _epilogue("dequant", scales, None, None, 0, 0, bias, m, n)
        res = out
    else:
        odt, s_out, z_out = _out_params(op, out_scale, out_zero_point, out_dtype, x.dtype)
        _choice(op, "requant", requant, _REQUANT)
        out = _checks.empty(lead + (n,), odt, dev, op)
        epi = _epilogue(requant, scales, None, s_out, z_out, odt, bias, m, n)
        res = QTensor(out, s_out, z_out)
        out = _bytes(out)
    a2 = _rows(x.values, m, k)
    _product(dev, a2, za, pw.operand(), zb, (), _view3(out, 1, m, n), m, n, k, epi)
    return res


@operator(SPECS["quant.linear_dynamic"])
def linear_dynamic(x, w, bias=None):
    """Dynamically quantized linear layer (PyTorch's ``nn.quantized.dynamic.Linear``):
    ``x`` is quantized on the fly to uint8, per tensor, over its own range
    (extended to include 0), multiplied by the int8 weight, and the int32
    result is dequantized to float32 with the float bias added, in the
    GEMM's epilogue.

    Parameters
    ----------
    x : float32 array (..., in_features), CPU or CUDA
        On CUDA its range is read on the host.
    w : PackedWeight or QTensor (out_features, in_features), int8
    bias : float32 array (out_features,), optional

    Returns
    -------
    float32 array (..., out_features).

    Raises
    ------
    TypeError
        ``x`` not float32 (a QTensor or int8 array where float is needed),
        ``w`` not a quantized weight, a non-float32 bias, mixed devices.
    ValueError
        Non-finite values in ``x``, in_features mismatch, bias of the wrong
        shape.

    Example
    -------
    >>> w = nbops.quant.pack_weight(QTensor(np.array([[64, -64]], np.int8), 1 / 64, 0))
    >>> nbops.quant.linear_dynamic(np.array([[1.0, 0.5]], np.float32), w)
    array([[0.5019608]], dtype=float32)
    """
    op = "quant.linear_dynamic"
    if isinstance(x, QTensor) or (hasattr(x, "dtype") and x.dtype in _QDTYPES):
        raise TypeError(f"{op}: argument 'x' must be a float32 array (it is quantized on the "
                        f"fly), got {_checks.describe(x.values if isinstance(x, QTensor) else x)}"
                        "; use quant.linear for quantized inputs")
    x = _checks.array(op, "x", x, (np.dtype(np.float32),))
    pw = w if isinstance(w, PackedWeight) else _packable(op, "w", w, 2)
    dev = _dispatch.resolve_device(op, x=x, w=pw.qweight.values, bias=bias)
    n, k = pw.shape
    if x.ndim == 0 or tuple(x.shape)[-1] != k:
        raise ValueError(f"{op}: 'x' has shape {tuple(x.shape)} but 'w' expects {k} input "
                         f"features (shape {pw.shape})")
    if bias is not None:
        bias = _checks.array(op, "bias", bias, (np.dtype(np.float32),))
        if tuple(bias.shape) != (n,):
            raise ValueError(f"{op}: argument 'bias' must have shape ({n},), got "
                             f"{tuple(bias.shape)}")
    host = x if dev == CPU else _dispatch.to_host(x)
    lo = min(float(host.min()), 0.0) if host.size else 0.0
    hi = max(float(host.max()), 0.0) if host.size else 0.0
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"{op}: argument 'x' holds non-finite values; its range cannot be "
                         "quantized")
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = int(min(255, max(0, round(-lo / scale))))
    from . import quantize_per_tensor

    qx = quantize_per_tensor(x, scale, zp, np.uint8)
    m = int(np.prod(tuple(x.shape)[:-1], dtype=np.int64))
    za = np.full(m, zp, np.int32)
    _check_acc(op, k, np.dtype(np.uint8), za, pw.qweight.dtype, pw.zp)
    scales = np.float32(qx.scale) * _per(pw.qweight.scale, n, np.float32)
    out = _checks.empty(tuple(x.shape)[:-1] + (n,), np.float32, dev, op)
    epi = _epilogue("dequant", scales, bias, None, 0, 0, None, m, n)
    _product(dev, _rows(qx.values, m, k), za, pw.operand(), pw.zp, (), _view3(out, 1, m, n),
             m, n, k, epi)
    return out


@operator(SPECS["quant.conv2d"])
def conv2d(qx, qw, bias=None, stride=1, padding=0, dilation=1, groups=1, out_scale=None,
           out_zero_point=None, out_dtype=None, requant="fixed"):
    """ONNX QLinearConv (NCHW): int8 convolution with int32 accumulation,
    requantized (or dequantized) in the GEMM's epilogue.

    Parameters
    ----------
    qx : QTensor (N, C, H, W), uint8 or int8, per tensor
    qw : QTensor (OC, C / groups, kh, kw), int8 (or uint8), per tensor or
        per output channel (axis 0); or a :class:`PackedWeight` of one
        (packed for the same ``groups``).
    bias : int32 array (OC,), optional; scale ``qx.scale * qw.scale[oc]``
    stride, padding, dilation : int or pair of ints
        Padding takes the input's zero point (real 0).
    groups : int dividing C and OC
    out_scale, out_zero_point, out_dtype, requant
        As :func:`linear`: a QTensor result, or float32 when omitted.

    Returns
    -------
    QTensor (N, OC, OH, OW), or a float32 array.

    Raises
    ------
    TypeError
        Non-QTensor input or weight, a float bias, mixed devices, a
        non-int stride, padding (conv2d's strings included), dilation or
        groups.
    ValueError
        Wrong ranks, channels that do not match ``groups``, a kernel larger
        than the padded input, bad stride/padding/dilation, a per-tensor
        ``qx`` requirement violated, bad output parameters, int32 overflow
        risk.

    Example
    -------
    >>> qx = QTensor(np.full((1, 1, 3, 3), 2, np.uint8), 1.0, 0)
    >>> qw = QTensor(np.ones((1, 1, 2, 2), np.int8), 1.0, 0)
    >>> nbops.quant.conv2d(qx, qw, out_scale=1.0, out_zero_point=0).values[0, 0]
    array([[8, 8],
           [8, 8]], dtype=uint8)
    """
    op = "quant.conv2d"
    _qtensor(op, "qx", qx)
    if qx.axis is not None:
        raise ValueError(f"{op}: argument 'qx' must be quantized per tensor, got per-channel "
                         f"parameters along axis {qx.axis}")
    if qx.ndim != 4:
        raise ValueError(f"{op}: argument 'qx' must be 4-D (N, C, H, W), got shape "
                         f"{tuple(qx.shape)}")
    g = _checks.int_arg(op, "groups", groups, low=1)
    pw = qw if isinstance(qw, PackedWeight) else _packable(op, "qw", qw, 4, groups=g)
    if len(pw.shape) != 4:
        raise ValueError(f"{op}: argument 'qw' must be 4-D (OC, C/groups, kh, kw), got shape "
                         f"{pw.shape}")
    if pw.groups != g:
        raise ValueError(f"{op}: the packed weight was packed for groups={pw.groups}, "
                         f"got groups={g}")
    dev = _dispatch.resolve_device(op, qx=qx.values, qw=pw.qweight.values,
                                   bias=bias if _is_array(bias) else None)
    if pw.device != dev:
        raise TypeError(f"{op}: the packed weight is on {pw.device} but 'qx' is on {dev}")
    if isinstance(padding, str):  # conv2d's 'same'/'valid' are not offered here
        _checks.int_tuple(op, "padding", padding, 2)
    geo, out_shape = _conv._geometry(op, 2, qx, pw.qweight, stride, padding, dilation, g,
                                     names=("qx", "qw"))
    oc, oh, ow = geo.co, geo.oh, geo.ow
    bias = _int_bias(op, bias, oc, dev)
    qwt = pw.qweight
    k = (geo.c // g) * geo.kh * geo.kw
    _check_acc(op, k, qwt.dtype, pw.zp, qx.dtype, np.full(1, qx.zero_point, np.int32))
    scales = np.float32(qx.scale) * _per(qwt.scale, oc, np.float32)
    if out_scale is None and out_zero_point is None:
        if out_dtype is not None:
            raise ValueError(f"{op}: 'out_dtype' needs 'out_scale' and 'out_zero_point'")
        out = _checks.empty(out_shape, np.float32, dev, op)
        epi = _epilogue("dequant", scales, None, None, 0, 0, bias, oc, oh * ow, per_row=True)
        res = out
    else:
        odt, s_out, z_out = _out_params(op, out_scale, out_zero_point, out_dtype, qx.dtype)
        _choice(op, "requant", requant, _REQUANT)
        out = _checks.empty(out_shape, odt, dev, op)
        epi = _epilogue(requant, scales, None, s_out, z_out, odt, bias, oc, oh * ow,
                        per_row=True)
        res = QTensor(out, s_out, z_out)
        out = _bytes(out)
    if out.size:
        xv = _contiguous(op, "qx", qx.values, dev)
        FAMILY.kernel("conv2d_op", dev)(
            _bytes(xv), _flip(qx.dtype), qx.zero_point, pw,
            ((geo.sh, geo.sw), (geo.ph, geo.pw), (geo.dh, geo.dw)), (oh, ow), out, epi)
    return res


# ---------------------------------------------------------------------------
# Packed weights


class PackedWeight:
    """An int8 weight prepared once for the int8 GEMM (:func:`pack_weight`).

    On the CPU it holds the weight in the micro-kernel's layout (``[n/32]
    [k/4][32][4]`` signed bytes for a linear weight, ``[oc/8][k/4][8][4]``
    unsigned bytes per group for a conv weight) with the column/row sums the
    zero-point corrections need; on CUDA it holds the device values.

    Attributes
    ----------
    qweight : the QTensor it was made from
    shape, groups, device
    """

    __slots__ = ("qweight", "groups", "device", "words", "sums", "zp")

    def __init__(self, qweight, groups=1):
        self.qweight = qweight
        self.groups = int(groups)
        self.device = _dispatch.device_of_array(qweight.values)
        oc = int(qweight.shape[0])
        self.zp = _per(qweight.zero_point, oc, np.int32)
        self.words = self.sums = None
        if self.device == CPU:
            self._pack()

    @property
    def shape(self):
        return tuple(int(v) for v in self.qweight.shape)

    def _pack(self):
        q = self.qweight
        v = np.ascontiguousarray(q.values).view(np.uint8)
        oc = self.shape[0]
        k = int(np.prod(self.shape[1:]))
        if len(self.shape) == 2:
            # B = w.T (k x n): element strides (1, k)
            flip = 0 if q.dtype == np.dtype(np.int8) else 0x80
            self.words, self.sums = FAMILY.kernel("pack_b", CPU)(
                v.reshape(-1), 0, 1, k, k, oc, flip)
        else:
            flip = 0x80 if q.dtype == np.dtype(np.int8) else 0
            ocg = oc // self.groups
            packs = [FAMILY.kernel("pack_a", CPU)(
                v.reshape(-1), gi * ocg * k, k, 1, ocg, k, flip)
                for gi in range(self.groups)]
            self.words = [p[0] for p in packs]
            self.sums = [p[1] for p in packs]

    def operand(self):
        return _BOperand.of_weight(self)

    def __repr__(self):
        q = self.qweight
        per = "per-channel" if q.axis is not None else "per-tensor"
        return (f"PackedWeight(shape={self.shape}, {q.dtype}, {per}, groups={self.groups}, "
                f"device={self.device})")


def pack_weight(qw, groups=1):
    """Pack a quantized weight once for :func:`linear`, :func:`linear_dynamic`
    (2-D ``(out_features, in_features)``) or :func:`conv2d` (4-D ``(OC,
    C/groups, kh, kw)``, packed for ``groups``); layers keep the result and
    pass it on every call.

    Parameters
    ----------
    qw : QTensor, int8 (or uint8), per tensor or per channel along axis 0
    groups : int, conv weights only

    Returns
    -------
    PackedWeight

    Raises
    ------
    TypeError
        ``qw`` is not a QTensor (float weights must be quantized first).
    ValueError
        Not 2-D or 4-D, per channel along another axis than 0, or
        ``groups`` not dividing the output channels.

    Example
    -------
    >>> pw = nbops.quant.pack_weight(QTensor(np.ones((4, 3), np.int8), 0.1, 0))
    >>> pw.shape
    (4, 3)
    """
    op = "quant.pack_weight"
    _qtensor(op, "qw", qw)
    if qw.ndim not in (2, 4):
        raise ValueError(f"{op}: argument 'qw' must be 2-D (linear) or 4-D (conv), got shape "
                         f"{tuple(qw.shape)}")
    return _packable(op, "qw", qw, qw.ndim, groups=_checks.int_arg(op, "groups", groups, low=1))


def _packable(op, name, qw, ndim, groups=1):
    _qtensor(op, name, qw)
    if qw.ndim != ndim:
        want = "(out_features, in_features)" if ndim == 2 else "(OC, C/groups, kh, kw)"
        raise ValueError(f"{op}: argument '{name}' must be {ndim}-D {want}, got shape "
                         f"{tuple(qw.shape)}")
    if qw.axis not in (None, 0):
        raise ValueError(f"{op}: argument '{name}' may be quantized per output channel "
                         f"(axis 0) only, got axis {qw.axis}")
    if ndim == 4 and int(qw.shape[0]) % groups:
        raise ValueError(f"{op}: {qw.shape[0]} output channels are not divisible by "
                         f"groups={groups}")
    return PackedWeight(qw, groups)


class _BOperand:
    """The B side of a product as the device kernels take it: raw bytes
    (``b8`` flat uint8 view, per-batch element offsets, element strides,
    flip) and, on the CPU, packed slivers when a PackedWeight supplies them."""

    __slots__ = ("b8", "offb", "sbk", "sbn", "flip", "packed")

    def __init__(self, b8, offb, sbk, sbn, flip, packed):
        self.b8, self.offb, self.sbk, self.sbn, self.flip = b8, offb, sbk, sbn, flip
        self.packed = packed

    @classmethod
    def raw(cls, b, batch):
        buf, offb, sbk, sbn = _operand(b, batch)
        return cls(buf, offb, sbk, sbn, 0x80 if b.dtype == np.dtype(np.uint8) else 0, None)

    @classmethod
    def of_weight(cls, pw):
        raw = cls.raw(_swap(pw.qweight.values), ())
        raw.packed = (pw.words, pw.sums) if pw.device == CPU else None
        return raw


# ---------------------------------------------------------------------------
# Helpers


def _product(dev, a, za, bop, zb, batch, out3, m, n, k, epi):
    """``out3[b] = epilogue((A_b - za) @ (B_b - zb))`` through the device's
    kernel; ``a`` (..., m, k) broadcast over ``batch``."""
    if out3.size == 0:
        return
    abuf, offa, sam, sak = _operand(a, batch if batch else ())
    flip_a = _flip(a.dtype)
    za2 = (za + (128 if flip_a else 0)).astype(np.int32)
    zb2 = np.asarray(zb, np.int32) - (128 if bop.flip else 0)
    FAMILY.kernel("gemm_op", dev)(abuf, offa, sam, sak, flip_a, za2, bop,
                                  zb2.astype(np.int32), out3, m, n, k, epi)


def _epilogue(kind, scales, fbias, s_out, z_out, odt, bias, m, n, per_row=False):
    """The epilogue arguments of the kernels: ``(mode, bias, mult, shift,
    ozp, qmin, qmax, fscale, fbias, per_row)``."""
    e32 = np.empty(0, np.int32)
    mult = shift = e32
    fscale = np.empty(0, np.float64)
    qmin = qmax = 0
    if kind in ("fixed", "float"):
        qmin, qmax = QTYPES[np.dtype(odt)]
        real = (scales / np.float32(s_out)).astype(np.float32)
        if kind == "fixed":
            mult, shift = _requant.quantize_multipliers(real)
        else:
            fscale = real.astype(np.float64)
    elif kind == "dequant":
        fscale = scales.astype(np.float64)
    bias = e32 if bias is None else bias
    fb = np.empty(0, np.float32) if fbias is None else fbias
    return (_MODE[kind], bias, mult, shift, int(z_out), int(qmin), int(qmax), fscale, fb,
            bool(per_row))


def _int8_array(op, name, x):
    if isinstance(x, QTensor):
        raise TypeError(f"{op}: argument '{name}' is a QTensor; pass its integer values "
                        f"('{name}.values') and zero point, or use quant.matmul")
    if not (isinstance(x, np.ndarray) or _dispatch.is_device_array(x)):
        raise TypeError(f"{op}: argument '{name}' must be a uint8 or int8 array, got "
                        f"{_checks.describe(x)}")
    if x.dtype not in _QDTYPES:
        hint = (" (quantize float data first, e.g. with quant.quantize_per_tensor)"
                if x.dtype.kind == "f" else "")
        raise TypeError(f"{op}: argument '{name}' must be a uint8 or int8 array, got "
                        f"{x.dtype}{hint}")


def _qtensor(op, name, q):
    if not isinstance(q, QTensor):
        hint = ""
        dtype = getattr(q, "dtype", None)
        if dtype is not None:
            hint = ("; quantize float data with quant.quantize_per_tensor or "
                    "quantize_per_channel" if np.dtype(dtype).kind == "f"
                    else "; wrap integer values in QTensor(values, scale, zero_point)")
        raise TypeError(f"{op}: argument '{name}' must be a QTensor, got "
                        f"{_checks.describe(q)}{hint}")


def _zero_points(op, name, zp, dtype, length, what):
    """Scalar or per-row/column zero points as an int32 array of ``length``."""
    qmin, qmax = QTYPES[np.dtype(dtype)]
    if _dispatch.is_device_array(zp):
        zp = _dispatch.to_host(zp)
    if isinstance(zp, (bool, np.bool_)):
        raise TypeError(f"{op}: argument '{name}' must be an int or an int array, got bool")
    arr = np.asarray(zp)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: argument '{name}' must be an int or an int array, got "
                        f"{_checks.describe(zp)}")
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != length):
        raise ValueError(f"{op}: argument '{name}' must be a scalar or have shape "
                         f"({length},), one per {what}; got shape {arr.shape}")
    if arr.size and (arr.min() < qmin or arr.max() > qmax):
        bad = arr.reshape(-1)[int(np.argmax((arr.reshape(-1) < qmin) |
                                            (arr.reshape(-1) > qmax)))]
        raise ValueError(f"{op}: argument '{name}' must lie in [{qmin}, {qmax}] for "
                         f"{np.dtype(dtype).name} data, got {bad}")
    return np.broadcast_to(arr.astype(np.int32), (length,)).copy()


def _check_acc(op, k, adt, za, bdt, zb):
    """Raise unless ``k * max|a - za| * max|b - zb| < ACC_LIMIT``."""
    def span(dt, z):
        lo, hi = QTYPES[np.dtype(dt)]
        z = np.asarray(z, np.int64)
        return int(max((hi - z).max(), (z - lo).max())) if z.size else max(hi, -lo)
    worst = k * span(adt, za) * span(bdt, zb)
    if worst >= ACC_LIMIT:
        raise ValueError(f"{op}: the reduction over k={k} may overflow the int32 "
                         f"accumulator (k * max|a - za| * max|b - zb| = {worst} >= 2**31); "
                         f"split the reduction into chunks of at most "
                         f"{(ACC_LIMIT - 1) // max(1, worst // max(k, 1))} and add the "
                         "partial int32 results in int64")


def _out_params(op, scale, zero_point, dtype, default):
    if scale is None or zero_point is None:
        raise ValueError(f"{op}: give both 'out_scale' and 'out_zero_point' (or neither, "
                         "for a float32 result)")
    if dtype is None:
        dtype = default
    try:
        odt = np.dtype(dtype)
    except TypeError:
        odt = None
    if odt not in QTYPES:
        raise TypeError(f"{op}: argument 'out_dtype' must be numpy.uint8 or numpy.int8, got "
                        f"{dtype!r}")
    s = _checks.scalar(op, "out_scale", scale, low=0, low_open=True)
    if isinstance(zero_point, (bool, np.bool_)) or not isinstance(zero_point, numbers.Integral):
        raise TypeError(f"{op}: argument 'out_zero_point' must be an int, got "
                        f"{_checks.describe(zero_point)}")
    lo, hi = QTYPES[odt]
    if not lo <= int(zero_point) <= hi:
        raise ValueError(f"{op}: argument 'out_zero_point' must lie in [{lo}, {hi}] for "
                         f"{odt.name}, got {int(zero_point)}")
    return odt, s, int(zero_point)


def _int_bias(op, bias, n, dev):
    if bias is None:
        return None
    if not _is_array(bias):
        raise TypeError(f"{op}: argument 'bias' must be an int32 array, got "
                        f"{_checks.describe(bias)}")
    if bias.dtype != np.dtype(np.int32):
        hint = (" (quantize a float bias as round(bias / (x.scale * w.scale)), or use "
                "quant.linear_dynamic)" if bias.dtype.kind == "f" else "")
        raise TypeError(f"{op}: argument 'bias' must be int32, got {bias.dtype}{hint}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: argument 'bias' must have shape ({n},), got "
                         f"{tuple(bias.shape)}")
    return _contiguous(op, "bias", bias, dev)


def _is_array(x):
    return isinstance(x, np.ndarray) or _dispatch.is_device_array(x)


def _per(v, n, dtype):
    """A per-tensor or per-channel parameter as an array of ``n``."""
    return np.broadcast_to(np.asarray(v, dtype), (n,)).copy()


def _flip(dtype):
    # int8 data enters the unsigned A side as a + 128: XOR of the sign bit
    return 0x80 if np.dtype(dtype) == np.dtype(np.int8) else 0


def _bytes(x):
    """The uint8 view of an int8/uint8 array (same memory)."""
    if x.dtype == np.dtype(np.uint8):
        return x
    return _layout.strided_view(x, tuple(x.shape), tuple(x.strides), 0, dtype=np.uint8)


def _choice(op, name, value, options):
    _checks.choice(op, name, value, options)


def _contiguous(op, name, x, dev):
    if _layout.is_c_contiguous(x):
        return x
    if dev == CPU:
        return np.ascontiguousarray(x)
    raise ValueError(f"{op}: device array '{name}' must be C-contiguous, got strides "
                     f"{tuple(x.strides)}")


def _matmul_shapes(op, a, b):
    """(a2, b2, batch, m, k, n) of ``np.matmul(a, b)``, 1-D operands promoted."""
    for name, x in (("a", a), ("b", b)):
        if x.ndim == 0:
            raise ValueError(f"{op}: argument '{name}' must have at least 1 dimension, got "
                             "a 0-d array")
    a2 = _with_unit_axis(a, 0) if a.ndim == 1 else a
    b2 = _with_unit_axis(b, -1) if b.ndim == 1 else b
    sa, sb = tuple(a2.shape), tuple(b2.shape)
    if sa[-1] != sb[-2]:
        raise ValueError(f"{op}: inner dimensions differ: 'a' has shape {tuple(a.shape)} "
                         f"(k={sa[-1]}) but 'b' has shape {tuple(b.shape)} (k={sb[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:
        raise ValueError(f"{op}: batch axes of 'a' {sa[:-2]} and 'b' {sb[:-2]} do not "
                         "broadcast") from None
    return a2, b2, batch, sa[-2], sa[-1], sb[-1]


def _with_unit_axis(x, axis):
    shape, st = list(x.shape), list(x.strides)
    if axis == 0:
        return _layout.strided_view(x, tuple([1] + shape), tuple([0] + st), 0)
    return _layout.strided_view(x, tuple(shape + [1]), tuple(st + [0]), 0)


def _swap(x):
    shape, st = list(x.shape), list(x.strides)
    shape[-1], shape[-2] = shape[-2], shape[-1]
    st[-1], st[-2] = st[-2], st[-1]
    return _layout.strided_view(x, tuple(shape), tuple(st), 0)


def _rows(x, m, k):
    """``x`` (..., k) as an (m, k) matrix view (a copy on the CPU if its
    leading axes do not merge)."""
    if x.ndim == 2:
        return x
    if _layout.is_c_contiguous(x):
        return _layout.strided_view(x, (m, k), (k * x.itemsize, x.itemsize), 0)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(m, k)
    raise ValueError("quant.linear: device array 'x' must be C-contiguous")


def _view3(out, nb, m, n):
    it = out.itemsize
    return _layout.strided_view(out, (nb, m, n), (m * n * it, n * it, it), 0)


def _operand(x, batch):
    """``(uint8 flat buffer, per-batch element offsets, row stride, col
    stride)`` of the matrix stack ``x`` broadcast over ``batch``."""
    st = [s // x.itemsize for s in x.strides]
    shape = tuple(x.shape)
    lo = sum(s * (d - 1) for s, d in zip(st, shape) if s < 0 and d > 0)
    hi = sum(s * (d - 1) for s, d in zip(st, shape) if s > 0 and d > 0)
    span = hi - lo + 1 if x.size else 0
    buf = _layout.strided_view(x, (span,), (1,), lo, dtype=np.uint8)
    lead = shape[:-2]
    own = (np.tensordot(np.indices(lead, dtype=np.int64), np.asarray(st[:-2], np.int64),
                        axes=(0, 0)) if lead else np.zeros((), np.int64))
    offsets = np.array(np.broadcast_to(own - lo, batch).reshape(-1), np.int64)
    return buf, offsets, st[-2], st[-1]
