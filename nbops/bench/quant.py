"""Benchmark cases of the int8 GEMM family (``nbops.quant``), in GOPS
(``2 m n k`` integer multiply-adds per second, shown in the GFLOP/s column).

Two baselines, each in its own case so that the ratio column reads directly:

* ``numpy int32``: ``np.matmul`` on int32-widened inputs (NumPy has no
  integer BLAS); the issue asks for at least 20x;
* ``nbops float32``: nbops' own float32 GEMM / conv on the same shapes; the
  issue asks for at least 2x (GEMM) and 1.5x (ResNet-50 convolutions).

Linear cases time a layer's call: the weight is packed once (as a layer
does) and cached here by the weight array's identity. Results are compared
with the exact integer product (dequantized with scale 1 for linear/conv).
"""

import importlib
import math

import numpy as np

import nbops

from .harness import Case, spec_cases

F32 = np.dtype(np.float32)

#: Side of the square matmul_integer case (the issue's 1024^3).
MAX_SIDE = 1024
#: (batch, in_features, out_features) of the linear-layer cases.
LINEAR_SHAPES = [(64, 4096, 4096), (256, 4096, 4096)]
#: The ResNet-50 convolutions of the CNN issue, at batch 1 and 8:
#: name -> (C, OC, H, kernel, stride, padding).
CONV_SHAPES = {
    "3x3_64_56": (64, 64, 56, 3, 1, 1),
    "1x1_256to64_56": (256, 64, 56, 1, 1, 0),
    "3x3_256_14": (256, 256, 14, 3, 1, 1),
    "7x7s2_stem": (3, 64, 224, 7, 2, 3),
}
CONV_BATCHES = (1, 8)

_PACKED = {}


def _q():
    # the module: nbops.quant.linear is the function of that name
    return importlib.import_module("nbops.quant.linear")


def _qtensor():
    from nbops.quant import QTensor

    return QTensor


def _packed(w):
    """The PackedWeight of the int8 weight array ``w`` (packed on first use)."""
    key = (id(w), w.shape)
    if key not in _PACKED:
        _PACKED.clear()
        _PACKED[key] = _q().pack_weight(_qtensor()(w, 1.0, 0))
    return _PACKED[key]


def _draw(rng, a_shape, b_shape):
    """uint8 A and int8 B of these shapes, and their float32 copies (the
    inputs of every case here)."""
    a = rng.integers(0, 256, a_shape, dtype=np.uint8)
    b = rng.integers(-128, 128, b_shape, dtype=np.int8)
    return a, b, a.astype(np.float32), b.astype(np.float32)


def _fixed(a_shape, b_shape):
    """A setup drawing operands of fixed shapes (whatever the size asked)."""
    return lambda size, dtype, rng: _draw(rng, a_shape, b_shape)


def _square(n, dtype, rng):
    side = max(4, min(MAX_SIDE, math.isqrt(n)))
    return _draw(rng, (side, side), (side, side))


def square_ints(n, dtype, rng):
    """The uint8 A and int8 B of :func:`_square` (matmul_integer's own
    arguments, without the float copies)."""
    return _square(n, dtype, rng)[:2]


def gemm_out(inputs):
    a, b = inputs[0], inputs[1]
    return (a.shape[0], b.shape[1]), np.int32


def gemm_ops(inputs):
    a, b = inputs[0], inputs[1]
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _mi(a, b, af, bf, out):
    return _q().matmul_integer(a, b, out=out)


def numpy_int32(a, b, *floats, out):
    # the float copies (inputs of the vs-float32 cases) are not read
    return np.matmul(a.astype(np.int32), b.astype(np.int32), out=out)


def _f32_gemm(a, b, af, bf, out):
    return nbops.matmul(af, bf)


def _linear_out(inputs):
    return (inputs[0].shape[0], inputs[1].shape[0]), np.float32


def _linear_ops(inputs):
    x, w = inputs[0], inputs[1]
    return 2 * x.shape[0] * x.shape[1] * w.shape[0]


def _int8_linear(x, w, xf, wf, out):
    # float32 output: the int32 sums dequantized (scale 1) in the epilogue
    return _q().linear(_qtensor()(x, 1.0, 0), _packed(w))


def _f32_linear(x, w, xf, wf, out):
    return nbops.linear(xf, wf, out=out)


def _numpy_linear(x, w, xf, wf, out):
    out[...] = np.matmul(x.astype(np.int32), w.astype(np.int32).T)
    return out


def _conv_case(name, batch, c, oc, hgt, ksz, stride, pad):
    """The Case of int8 conv2d against nbops' float32 conv2d at one shape."""
    oh = (hgt + 2 * pad - ksz) // stride + 1

    def int8(x, w, xf, wf, out):
        return _q().conv2d(_qtensor()(x, 1.0, 0), _packed(w), stride=stride, padding=pad)

    def f32(x, w, xf, wf, out):
        return nbops.conv2d(xf, wf, stride=stride, padding=pad, out=out)

    def reference(x, w, xf, wf):
        # float64 conv through the float path of nbops (exact at these magnitudes)
        return nbops.conv2d(x, w, stride=stride, padding=pad)

    setup = _fixed((batch, c, hgt, hgt), (oc, c, ksz, ksz))
    return Case(f"quant_conv2d_{name}" + (f"_b{batch}" if batch > 1 else ""), setup, int8,
                f32, reference=reference,
                out_like=lambda inputs: ((batch, oc, oh, oh), np.float32),
                flops=lambda inputs: 2 * batch * oc * c * ksz * ksz * oh * oh,
                requires=("conv2d",), baseline_name="nbops float32 conv2d", **_COMMON)


def ref_gemm(a, b, *floats):
    return a @ b


def _ref_linear(x, w, xf, wf):
    return x @ w.T


_COMMON = dict(dtypes=(F32,), tol=(1e-6, 1e-6))

# quant_matmul_integer comes from its spec (nbops/quant/linear.py); the
# cases below are plain: they time the int8 ops against nbops' float32 ones
# (float copies among the inputs) or layers on QTensors with a packed weight,
# not one operator on its own arguments
CASES = spec_cases([_q().SPECS["quant.matmul_integer"]], None) + [
    Case("quant_matmul_integer_vs_f32", _square, _mi, _f32_gemm, reference=ref_gemm,
         out_like=gemm_out, flops=gemm_ops, requires=("matmul",),
         baseline_name="nbops float32 matmul", **_COMMON),
]
for _b, _k, _n in LINEAR_SHAPES:
    # matmul_integer at the linear layers' shapes (B raw, packed per call)
    CASES.append(
        Case(f"quant_matmul_integer_b{_b}_vs_f32", _fixed((_b, _k), (_k, _n)), _mi, _f32_gemm,
             reference=ref_gemm, out_like=gemm_out, flops=gemm_ops, requires=("matmul",),
             baseline_name="nbops float32 matmul", **_COMMON))
    CASES += [
        Case(f"quant_linear_b{_b}", _fixed((_b, _k), (_n, _k)), _int8_linear, _f32_linear,
             reference=_ref_linear, out_like=_linear_out, flops=_linear_ops,
             requires=("linear",), baseline_name="nbops float32 linear", **_COMMON),
        Case(f"quant_linear_b{_b}_vs_numpy", _fixed((_b, _k), (_n, _k)), _int8_linear,
             _numpy_linear, reference=_ref_linear, out_like=_linear_out, flops=_linear_ops,
             baseline_name="numpy int32 matmul", **_COMMON),
    ]
CASES += [_conv_case(_name, _b, *_shape) for _b in CONV_BATCHES
          for _name, _shape in CONV_SHAPES.items()]
