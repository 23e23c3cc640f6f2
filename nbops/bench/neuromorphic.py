"""Benchmark cases of the spiking neurons (:mod:`nbops.neuromorphic`)
beside the NumPy loop over time steps that the seed article writes.

``CASES`` (for ``python -m nbops bench`` and the demo) run LIF neurons
(``beta = 0.5``, threshold 1, reset by subtraction) over a time-major
``[STEPS, n / STEPS]`` input, forward and backward through time (the
fast-sigmoid surrogate, nbops' default). Inputs are multiples of 1/16 and
the decay a power of two, so the membrane is exact in float32 over
``STEPS`` steps and no spike depends on rounding: the float32 and float64
runs and their float64 reference fire alike.

The issue's shape (T=100 x [64, 4096]) beside a copy, the other neuron
models and snnTorch is ``tools/bench_neuromorphic.py`` (asv:
``benchmarks/bench_neuromorphic.py``).
"""

import numpy as np

import nbops
import nbops.neuromorphic

from .harness import Case, spec_cases

STEPS = 8
BETA = 0.5
THRESHOLD = 1.0
SLOPE = 25.0       # the fast-sigmoid surrogate's default slope


def setup(n, dtype, rng):
    shape = (STEPS, max(1, n // STEPS))
    x = (rng.integers(0, 16, shape) / 16).astype(dtype)
    return (x,)


def _setup_backward(n, dtype, rng):
    (x,) = setup(n, dtype, rng)
    return rng.standard_normal(x.shape).astype(dtype), x


def lif_numpy(x, out):
    v = np.zeros_like(x[0])
    for t in range(x.shape[0]):
        v *= x.dtype.type(BETA)
        v += x[t]
        np.greater(v, THRESHOLD, out=out[t])
        v -= out[t] * x.dtype.type(THRESHOLD)
    return out


def lif_reference(x):
    """What ``lif`` returns, ``(spikes, v)``, in float64: the baseline's
    loop keeping its final membrane."""
    spikes = np.empty_like(x)
    v = np.zeros_like(x[0])
    for t in range(x.shape[0]):
        v = v * BETA + x[t]
        spikes[t] = v > THRESHOLD
        v = v - spikes[t] * THRESHOLD
    return spikes, v


def lif_backward_nbops(grad_spikes, x, out):
    return nbops.neuromorphic.lif_backward(grad_spikes, x, BETA, THRESHOLD, out=out)["inputs"]


def lif_backward_numpy(grad_spikes, x, out):
    """BPTT: the forward keeping every membrane value, then the reverse
    sweep (reset detached from the graph, as nbops' default)."""
    dt = x.dtype.type
    u = np.empty_like(x)
    v = np.zeros_like(x[0])
    for t in range(x.shape[0]):
        u[t] = v * dt(BETA) + x[t]
        v = u[t] - (u[t] > THRESHOLD) * dt(THRESHOLD)
    grad_v = np.zeros_like(x[0])
    for t in range(x.shape[0] - 1, -1, -1):
        d = dt(1) / (dt(SLOPE) * np.abs(u[t] - dt(THRESHOLD)) + dt(1))
        out[t] = grad_spikes[t] * d * d + grad_v
        grad_v = dt(BETA) * out[t]
    return out


def _backward_out(inputs):
    return inputs[1].shape, inputs[1].dtype


def _backward_bytes(inputs, out):
    return sum(a.nbytes for a in inputs) + out.nbytes


# lif from its spec (nbops/neuromorphic/__init__.py); lif_backward returns a
# dict of gradients, of which the case times and checks the inputs' one
CASES = spec_cases([nbops.neuromorphic.SPECS["lif"]], None) + [
    Case("lif_backward", _setup_backward, lif_backward_nbops, lif_backward_numpy,
         out_like=_backward_out, nbytes=_backward_bytes, tol=(1e-5, 1e-12)),
]
