"""Benchmark case of matrix multiplication: square matrices of about ``n``
elements each (side ``sqrt(n)``, at most 2048 so that a quick run stays
quick), reported in GFLOP/s (``2 m k n``) against NumPy's BLAS. Skipped with
a note until ``nbops.matmul`` exists.
"""

import math

import numpy as np

import nbops

from .harness import BLAS_PAUSE, Case

MAX_SIDE = 2048


def _setup(n, dtype, rng):
    side = max(1, min(MAX_SIDE, math.isqrt(n)))
    return tuple(rng.standard_normal((side, side)).astype(dtype) for _ in range(2))


def _shape(inputs):
    a, b = inputs
    return (a.shape[0], b.shape[1]), a.dtype


def _flops(inputs):
    a, b = inputs
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


CASES = [
    # errors of a k-term dot product grow with k: tolerances are relative
    # to (1 + |ref|) and sized for k up to 2048 in float32
    Case("matmul", _setup, lambda a, b, out: nbops.matmul(a, b, out=out),
         lambda a, b, out: np.matmul(a, b, out=out), out_like=_shape, flops=_flops,
         requires=("matmul",), tol=(1e-4, 1e-12), baseline_name="numpy (BLAS)",
         pause=BLAS_PAUSE),
]


# --- GEMM routes and the fused epilogue (added with nbops.linalg) -----------

def _gelu_numpy(z, out):
    from scipy import special

    np.multiply(0.5 * z, special.erfc(-z / math.sqrt(2.0)), out=out)
    return out


CASES += [
    Case("matmul_blas_route", _setup,
         lambda a, b, out: nbops.matmul(a, b, out=out, impl="blas"),
         lambda a, b, out: np.matmul(a, b, out=out), out_like=_shape, flops=_flops,
         requires=("matmul",), tol=(1e-4, 1e-12), baseline_name="numpy (BLAS)",
         pause=BLAS_PAUSE),
    # linear(x, w, activation="gelu"): the gelu runs in the GEMM's epilogue
    Case("linear_gelu", _setup,
         lambda x, w, out: nbops.linear(x, w, activation="gelu", out=out),
         lambda x, w, out: _gelu_numpy(np.matmul(x, w.T, out=out), out),
         out_like=_shape, flops=_flops, requires=("linear",), tol=(1e-4, 1e-10),
         baseline_name="numpy + scipy erfc", pause=BLAS_PAUSE),
]


# --- stacks of small products (the non-packing small-product route) --------

def _setup_small(n, dtype, rng):
    # about n elements per operand as a stack of 32 x 32 matrices
    batch = max(1, n // 1024)
    return tuple(rng.standard_normal((batch, 32, 32)).astype(dtype) for _ in range(2))


def _shape_small(inputs):
    a, b = inputs
    return a.shape, a.dtype


def _flops_small(inputs):
    a, b = inputs
    return 2 * a.shape[0] * 32 ** 3


CASES += [
    Case("matmul_small_batched", _setup_small,
         lambda a, b, out: nbops.matmul(a, b, out=out),
         lambda a, b, out: np.matmul(a, b, out=out), out_like=_shape_small,
         flops=_flops_small, requires=("matmul",), tol=(1e-4, 1e-12),
         baseline_name="numpy (BLAS per product)", pause=BLAS_PAUSE),
]
