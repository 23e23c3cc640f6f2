"""Benchmark case of ``nbops.fuse``: a bias-add followed by GELU, fused into
one pass, against NumPy doing the add and then the GELU formula (a second
pass and temporaries). Skipped with a note until ``nbops.fuse`` exists."""

import functools

import nbops

from . import activations
from .harness import Case


@functools.lru_cache(maxsize=None)
def _fused():
    return nbops.fuse(lambda x, b: nbops.gelu(x + b), name="bias_gelu")


def _setup(n, dtype, rng):
    return (rng.standard_normal(n, dtype=dtype) * 3, rng.standard_normal(n, dtype=dtype))


def _baseline(x, b, out):
    return activations.gelu(x + b, out)


def _reference(x, b):
    return activations._gelu_ref(x + b)


CASES = [
    Case("fuse_bias_gelu", _setup, lambda x, b, out: _fused()(x, b, out=out), _baseline,
         _reference, requires=("fuse",)),
]
