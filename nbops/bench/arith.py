"""Benchmark cases of the arithmetic operators (declared in the specs of
nbops/arith.py): the same math with NumPy ufuncs into a pre-allocated
output, which is what a NumPy user writes."""

import numpy as np

import nbops

from .harness import spec_cases


def setup_pair(n, dtype, rng):
    """Two operands of one shape."""
    return rng.standard_normal(n, dtype=dtype), rng.standard_normal(n, dtype=dtype)


def setup_row(n, dtype, rng):
    """A matrix and a row broadcast over it (a bias or a scale)."""
    cols = 1024
    rows = max(1, n // cols)
    return (rng.standard_normal((rows, cols), dtype=dtype),
            rng.standard_normal(cols, dtype=dtype))


def setup_x(n, dtype, rng):
    return (rng.standard_normal(n, dtype=dtype),)


def setup_rows(n, dtype, rng):
    """A matrix summed along its rows (``axis=-1``)."""
    return (rng.standard_normal((max(1, n // 256), 256), dtype=dtype),)


def add(a, b, out):
    return np.add(a, b, out=out)


def mul_row(a, b, out):
    return np.multiply(a, b, out=out)


def exp(x, out):
    return np.exp(x, out=out)


def sum_rows(x, out):
    return np.sum(x, axis=-1, out=out)


def rows_out(inputs):
    return inputs[0].shape[:-1], inputs[0].dtype


CASES = spec_cases(nbops.arith.SPECS.values(), None)
