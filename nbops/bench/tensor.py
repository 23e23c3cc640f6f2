"""Benchmark cases of the tensor ops: materialising a transpose, joining
along the last axis, and packing a strided view, each on about ``n``
elements arranged as a near-square matrix. The cases are the specs' Bench
entries (nbops/tensor.py); the setups and NumPy baselines live here.
"""

import dataclasses
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


def listed_nbytes(inputs, out):
    """Every array of the list read once and ``out`` written once."""
    return sum(a.nbytes for a in inputs[0]) + out.nbytes


def copy_transposed(x, out):
    np.copyto(out, x.T)
    return out


def concatenate_columns(arrays, out):
    return np.concatenate(arrays, axis=1, out=out)


def copy_into(x, out):
    np.copyto(out, x)
    return out


def _cases(name):
    spec = nbops.get_operator(name).spec
    cases = spec_cases([spec], None)
    if spec.out:
        return cases
    # contiguous() takes no out= (its allocation is part of what is timed),
    # while spec_cases calls every operator with out=
    op = nbops.get_operator(name)
    return [dataclasses.replace(c, run=lambda *inputs, out, _op=op, _kw=b.kwargs: _op(
        *inputs, **_kw)) for c, b in zip(cases, spec.bench)]


# one case per Bench entry of the specs (nbops/tensor.py)
CASES = [c for name in ("transpose", "cat", "contiguous") for c in _cases(name)]
