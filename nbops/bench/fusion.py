"""Benchmark cases of ``nbops.fuse``: a bias-add followed by GELU, fused into
one pass, against NumPy doing the add and then the GELU formula (a second
pass and temporaries); a fused sum and a five-operation chain likewise."""

import functools

import numpy as np

import nbops

from . import activations
from .harness import Case


@functools.lru_cache(maxsize=None)
def _fused():
    return nbops.fuse(lambda x, b: nbops.gelu(x + b), name="bias_gelu")


@functools.lru_cache(maxsize=None)
def _fused_sum3():
    return nbops.fuse(lambda x, y, z: (x + y) * z, reduce="sum", name="sum3")


@functools.lru_cache(maxsize=None)
def _fused_chain5():
    return nbops.fuse(lambda x, y: np.maximum(x * y + 1.0, 0.0) * 0.5 - x, name="chain5")


def _setup3(n, dtype, rng):
    return tuple(rng.standard_normal(n, dtype=dtype) for _ in range(3))


def _sum3_baseline(x, y, z, out):
    out[...] = ((x + y) * z).sum()   # NumPy: three passes and two temporaries
    return out


def _chain5_baseline(x, y, out):
    return np.subtract(np.maximum(x * y + 1.0, 0.0) * 0.5, x, out=out)


def _setup(n, dtype, rng):
    return (rng.standard_normal(n, dtype=dtype) * 3, rng.standard_normal(n, dtype=dtype))


def _baseline(x, b, out):
    return activations.gelu(x + b, out)


def _reference(x, b):
    return activations.gelu_ref(x + b)


# plain cases, not from fuse's spec (nbops/fusion.py): each times a fused
# function that nbops.fuse made, not the fuse operator itself
CASES = [
    Case("fuse_bias_gelu", _setup, lambda x, b, out: _fused()(x, b, out=out), _baseline,
         _reference, requires=("fuse",)),
    # the issue-10 targets: >= 3x NumPy and >= 70% of a 3-input read (sum3),
    # >= 4x NumPy (chain5), float32 16M on 2 threads
    Case("fuse_sum3", _setup3, lambda x, y, z, out: _fused_sum3()(x, y, z, out=out),
         _sum3_baseline, out_like=lambda ins: ((), ins[0].dtype),
         nbytes=lambda ins, out: sum(a.nbytes for a in ins), requires=("fuse",)),
    Case("fuse_chain5", lambda n, dtype, rng: _setup3(n, dtype, rng)[:2],
         lambda x, y, out: _fused_chain5()(x, y, out=out), _chain5_baseline,
         requires=("fuse",)),
]
