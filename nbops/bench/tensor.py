"""Benchmark cases of the tensor ops: materialising a transpose, joining
along the last axis, and packing a strided view, each on about ``n``
elements arranged as a near-square matrix. They are skipped with a note
until ``nbops.transpose``, ``nbops.cat`` and ``nbops.contiguous`` exist.
"""

import math

import numpy as np

import nbops

from .harness import Case


def _matrix(n, dtype, rng):
    rows = max(1, math.isqrt(n))
    return rng.standard_normal((rows, max(1, n // rows))).astype(dtype)


def _transpose_setup(n, dtype, rng):
    return (_matrix(n, dtype, rng),)


def _cat_setup(n, dtype, rng):
    m = _matrix(n, dtype, rng)
    half = m.shape[1] // 2
    return np.ascontiguousarray(m[:, :half]), np.ascontiguousarray(m[:, half:])


def _strided_setup(n, dtype, rng):
    # every other column of a matrix twice as wide: a view no reshape can fix
    m = _matrix(2 * n, dtype, rng)
    return (m[:, ::2],)


def _transposed_shape(inputs):
    return inputs[0].shape[::-1], inputs[0].dtype


def _cat_shape(inputs):
    a, b = inputs
    return (a.shape[0], a.shape[1] + b.shape[1]), a.dtype


def _copy_transposed(x, out):
    np.copyto(out, x.T)
    return out


CASES = [
    Case("transpose", _transpose_setup,
         lambda x, out: nbops.transpose(x, out=out), _copy_transposed,
         out_like=_transposed_shape, requires=("transpose",), tol=(0.0, 0.0)),
    Case("cat", _cat_setup,
         lambda a, b, out: nbops.cat([a, b], axis=1, out=out),
         lambda a, b, out: np.concatenate([a, b], axis=1, out=out),
         out_like=_cat_shape, requires=("cat",), tol=(0.0, 0.0)),
    # contiguous() takes no out=: its allocation is part of what is timed
    Case("contiguous", _strided_setup,
         lambda x, out: nbops.contiguous(x),
         lambda x, out: np.copyto(out, x) or out,
         requires=("contiguous",), tol=(0.0, 0.0)),
]
