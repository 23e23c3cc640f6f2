"""Benchmark cases of the tensor ops: materialising a transpose, joining
along the last axis, and packing a strided view, each on about ``n``
elements arranged as a near-square matrix. The cases are the specs' Bench
entries (nbops/tensor.py); the setups and NumPy baselines live here.
"""

import math

import numpy as np

import nbops

from .harness import spec_cases


def _matrix(n, dtype, rng):
    rows = max(1, math.isqrt(n))
    return rng.standard_normal((rows, max(1, n // rows))).astype(dtype)


def setup_matrix(n, dtype, rng):
    return (_matrix(n, dtype, rng),)


def setup_halves(n, dtype, rng):
    # cat's one input is the list of the arrays it joins
    m = _matrix(n, dtype, rng)
    half = m.shape[1] // 2
    return ([np.ascontiguousarray(m[:, :half]), np.ascontiguousarray(m[:, half:])],)


def setup_strided(n, dtype, rng):
    # every other column of a matrix twice as wide: a view no reshape can fix
    m = _matrix(2 * n, dtype, rng)
    return (m[:, ::2],)


def transposed_like(inputs):
    return inputs[0].shape[::-1], inputs[0].dtype


def concatenated_like(inputs):
    a, b = inputs[0]
    return (a.shape[0], a.shape[1] + b.shape[1]), a.dtype


def copy_transposed(x, out):
    np.copyto(out, x.T)
    return out


def concatenate_columns(arrays, out):
    return np.concatenate(arrays, axis=1, out=out)


def copy_into(x, out):
    np.copyto(out, x)
    return out


# one case per Bench entry of the specs (nbops/tensor.py)
CASES = spec_cases([nbops.get_operator(name).spec for name in ("transpose", "cat", "contiguous")],
                   None)
