"""Benchmark cases of the elementwise quantized operators (``nbops.quant``)
against the NumPy a user would write, with in-place ufuncs into a
pre-allocated output, and against a parallel copy's bandwidth:

* quantize, ``np.clip(np.rint(x / s) + zp, 0, 255)`` (5 bytes per element);
* dequantize, ``(q - zp) * s`` (5 bytes per element);
* add of two uint8 tensors requantized to a third scale, the float formula
  ``clip(rint((a - za) * sa / so + (b - zb) * sb / so) + zo)`` in NumPy
  (3 bytes per element), nbops with ``requant="float"`` (the same formula,
  exact) and ``"fixed"`` (TFLite's integer-only formula: within one step).

The int8 GEMM family has its own cases in :mod:`nbops.bench.quant`.
Quantize and dequantize results are integers or exact products, so their
reference is the ONNX formula in float32 and the tolerance zero.
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


ADD_A, ADD_B, ADD_OUT = (0.037, 120), (0.0113, 130), (0.05, 128)


def _ab(n, dtype, rng):
    return (rng.integers(0, 256, n, dtype=np.uint8), rng.integers(0, 256, n, dtype=np.uint8))


def _add(requant):
    def run(a, b, out):
        from nbops import quant

        qa, qb = quant.QTensor(a, *ADD_A), quant.QTensor(b, *ADD_B)
        return quant.add(qa, qb, *ADD_OUT, requant=requant).values

    return run


def _add_numpy(a, b, out):
    v = (a.astype(np.float64) - ADD_A[1]) * (ADD_A[0] / ADD_OUT[0])
    v += (b.astype(np.float64) - ADD_B[1]) * (ADD_B[0] / ADD_OUT[0])
    np.rint(v, out=v)
    v += ADD_OUT[1]
    np.clip(v, 0, 255, out=v)
    np.copyto(out, v, casting="unsafe")
    return out


def _add_ref(a, b):
    out = np.empty(a.shape, np.uint8)
    return _add_numpy(a.astype(np.uint8), b.astype(np.uint8), out)


_ADD_OUT = dict(out_like=lambda inputs: (inputs[0].shape, np.uint8), dtypes=(F32,),
                reference=_add_ref, baseline_name="numpy float formula")

# Plain cases, not the specs' Bench entries: each wraps raw integers in
# QTensors or times the op with its result's values taken (the harness
# compares arrays), not one operator called on its own arguments.
CASES = [
    Case("quantize_per_tensor", _x, _quantize, _quantize_numpy, reference=_quantize_ref,
         out_like=lambda inputs: (inputs[0].shape, np.uint8), dtypes=(F32,), tol=(0.0, 0.0),
         baseline_name="numpy clip(rint(x/s)+zp)"),
    Case("dequantize", _q, _dequantize, _dequantize_numpy, reference=_dequantize_ref,
         out_like=lambda inputs: (inputs[0].shape, F32), dtypes=(F32,), tol=(0.0, 0.0),
         baseline_name="numpy (q-zp)*s"),
    Case("quant_add_float", _ab, _add("float"), _add_numpy, tol=(0.0, 0.0), **_ADD_OUT),
    # one step (1 / (1 + |ref|) <= 1 in max_error's measure) allowed to the fixed point
    Case("quant_add_fixed", _ab, _add("fixed"), _add_numpy, tol=(1.0, 1.0), **_ADD_OUT),
]
