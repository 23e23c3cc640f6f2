"""Benchmark cases of matrix multiplication (declared in the specs of
nbops/linalg.py): square matrices of about ``n`` elements each (side
``sqrt(n)``, at most 2048 so that a quick run stays quick) and stacks of
32 x 32 products, reported in GFLOP/s (``2 m k n``) against NumPy's BLAS.
"""

import math

import numpy as np

import nbops

from .harness import spec_cases

MAX_SIDE = 2048


def setup_square(n, dtype, rng):
    side = max(1, min(MAX_SIDE, math.isqrt(n)))
    return tuple(rng.standard_normal((side, side)).astype(dtype) for _ in range(2))


def square_out(inputs):
    a, b = inputs
    return (a.shape[0], b.shape[1]), a.dtype


def flops(inputs):
    a, b = inputs
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


# errors of a k-term dot product grow with k: tolerances are relative to
# (1 + |ref|) and sized for k up to 2048 in float32
def matmul_numpy(a, b, out):
    return np.matmul(a, b, out=out)


def linear_gelu_numpy(x, w, out):
    """linear(x, w, activation="gelu"), whose gelu runs in the GEMM's epilogue."""
    from scipy import special

    z = np.matmul(x, w.T, out=out)
    np.multiply(0.5 * z, special.erfc(-z / math.sqrt(2.0)), out=out)
    return out


# --- stacks of small products (the non-packing small-product route) --------

def setup_small(n, dtype, rng):
    # about n elements per operand as a stack of 32 x 32 matrices
    batch = max(1, n // 1024)
    return tuple(rng.standard_normal((batch, 32, 32)).astype(dtype) for _ in range(2))


def small_out(inputs):
    a, b = inputs
    return a.shape, a.dtype


def small_flops(inputs):
    a, b = inputs
    return 2 * a.shape[0] * 32 ** 3


# one case per Bench entry of the specs (nbops/linalg.py)
CASES = spec_cases(nbops.linalg.SPECS.values(), None)
