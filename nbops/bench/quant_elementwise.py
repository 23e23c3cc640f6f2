"""Benchmark cases of quantize / dequantize (``nbops.quant``) against the
NumPy a user would write, ``np.clip(np.rint(x / s) + zp, 0, 255)`` and
``(q - zp) * s`` with in-place ufuncs into a pre-allocated output, and
against a parallel copy's bandwidth (the ``copy`` column: quantize moves 5
bytes per float32 element, dequantize 5). Both are memory-bound single
passes; the int8 GEMM family has its own cases in :mod:`nbops.bench.quant`.

Results are integers (quantize) or exact products (dequantize), so the
reference is the ONNX formula in float32 and the tolerance is zero.
"""

import numpy as np

from .harness import Case

F32 = np.dtype(np.float32)
SCALE = 0.02
ZERO_POINT = 128


def _x(n, dtype, rng):
    return (rng.standard_normal(n, dtype=np.float32).astype(dtype) * 2,)


def _q(n, dtype, rng):
    return (rng.integers(0, 256, n, dtype=np.uint8),)


def _quantize(x, out):
    from nbops import quant

    return quant.quantize_per_tensor(x, SCALE, ZERO_POINT, np.uint8, out=out).values


def _quantize_numpy(x, out):
    tmp = np.divide(x, x.dtype.type(SCALE))
    np.rint(tmp, out=tmp)
    tmp += ZERO_POINT
    np.clip(tmp, 0, 255, out=tmp)
    np.copyto(out, tmp, casting="unsafe")
    return out


def _quantize_ref(x):
    x32 = x.astype(np.float32)
    return np.clip(np.rint(x32 / np.float32(SCALE)) + ZERO_POINT, 0, 255)


def _dequantize(q, out):
    from nbops import quant

    return quant.dequantize(quant.QTensor(q, SCALE, ZERO_POINT), out=out)


def _dequantize_numpy(q, out):
    np.subtract(q, ZERO_POINT, out=out, dtype=out.dtype)
    out *= out.dtype.type(SCALE)
    return out


def _dequantize_ref(q):
    return (q.astype(np.float32) - ZERO_POINT) * np.float32(SCALE)


CASES = [
    Case("quantize_per_tensor", _x, _quantize, _quantize_numpy, reference=_quantize_ref,
         out_like=lambda inputs: (inputs[0].shape, np.uint8), dtypes=(F32,), tol=(0.0, 0.0),
         baseline_name="numpy clip(rint(x/s)+zp)"),
    Case("dequantize", _q, _dequantize, _dequantize_numpy, reference=_dequantize_ref,
         out_like=lambda inputs: (inputs[0].shape, F32), dtypes=(F32,), tol=(0.0, 0.0),
         baseline_name="numpy (q-zp)*s"),
]
