"""CUDA kernels of the spiking neurons, from the same equations as the CPU's.

One thread per neuron (grid-stride), the time loop inside the thread: at each
step the threads of a warp read neighbouring inputs and write neighbouring
spikes, so every access is coalesced and the state stays in registers.

Backward through time recomputes the forward into scratch traces (``[T, M]``
in global memory: a thread cannot hold its whole history in registers), then
walks them in reverse. Launchers have the CPU module's signatures.
"""

import importlib
import math

import numpy as np
from numba import cuda

from ..cuda._launch import grid_1d

_lif = importlib.import_module(".lif", __package__)


def _device_functions():
    # the CPU's vectorizable approximations (``m``) are host code
    return _lif.compiled_copies(cuda.jit(device=True), m=math)


_DEVICE = _device_functions()


@cuda.jit(device=True)
def _pick(p, j):
    # p is [4, 1] (shared by every neuron) or [4, M]
    q = j if p.shape[1] > 1 else 0
    return (p[0, q], p[1, q], p[2, q], p[3, q])


def _forward_kernel(model):
    step = _DEVICE[model]

    @cuda.jit
    def fwd(x, a0, b0, p, c, spk, a_out, b_out, trace):
        n_t, m = x.shape
        for j in range(cuda.grid(1), m, cuda.gridsize(1)):
            a = a0[j]
            b = b0[j] if b0 is not None else c.zero
            q = _pick(p, j)
            for t in range(n_t):
                s, u, th, a, b = step(x[t, j], a, b, q, c)
                spk[t, j] = s
                if trace is not None:
                    trace[t, j] = u
            a_out[j] = a
            if b_out is not None:
                b_out[j] = b

    return fwd


def _backward_kernel(model, surrogate):
    step = _DEVICE[model]
    adj = _DEVICE[model + "_adj"]
    sg = _DEVICE[surrogate]

    @cuda.jit
    def bwd(x, a0, b0, p, c, sp, gs, gtrace, ga_t, gb_t, uu, tt, vp, gx, ga0, gb0, gbeta, gthr):
        n_t, m = x.shape
        for j in range(cuda.grid(1), m, cuda.gridsize(1)):
            a = a0[j]
            b = b0[j]
            q = _pick(p, j)
            for t in range(n_t):
                vp[t, j] = a
                s, u, th, a, b = step(x[t, j], a, b, q, c)
                uu[t, j] = u
                tt[t, j] = th
            ga = ga_t[j]
            gb = gb_t[j]
            acc_beta = c.zero
            acc_thr = c.zero
            for k in range(n_t):
                t = n_t - 1 - k
                u = uu[t, j]
                th = tt[t, j]
                gu_ext = gtrace[t, j] if gtrace is not None else c.zero
                g, ga, gb, db, dth = adj(gs[t, j], gu_ext, u, th, vp[t, j], u > th,
                                         sg(u - th, sp, c), ga, gb, q, c)
                gx[t, j] = g
                acc_beta += db
                acc_thr += dth
            ga0[j] = ga
            gb0[j] = gb
            gbeta[j] = acc_beta
            gthr[j] = acc_thr

    return bwd


_FORWARD = {}
_BACKWARD = {}


def forward(model, x, a0, b0, p, c, spk, a_out, b_out, trace, time_outer=False):
    """As :func:`nbops.neuromorphic.cpu.forward`, on device arrays."""
    n_t, m = x.shape
    if m == 0:
        return
    if model not in _FORWARD:
        _FORWARD[model] = _forward_kernel(model)
    blocks, threads = grid_1d(m)
    _FORWARD[model][blocks, threads](x, a0, b0, p, c, spk, a_out, b_out,
                                     trace)


def backward(model, surrogate, x, a0, b0, p, c, sp, gs, gtrace, ga_t, gb_t,
             gx, ga0, gb0, gbeta, gthr):
    """As :func:`nbops.neuromorphic.cpu.backward`, on device arrays."""
    n_t, m = x.shape
    if m == 0:
        return
    key = (model, surrogate)
    if key not in _BACKWARD:
        _BACKWARD[key] = _backward_kernel(model, surrogate)
    uu, tt, vp = (cuda.device_array((n_t, m), x.dtype) for _ in range(3))
    blocks, threads = grid_1d(m)
    _BACKWARD[key][blocks, threads](x, a0, b0, p, c, sp, gs, gtrace,
                                    ga_t, gb_t, uu, tt, vp, gx, ga0, gb0, gbeta, gthr)


# ---------------------------------------------------------------------------
# Encoders and decoders: one thread per neuron, time loop inside.

_uniform = _DEVICE["uniform"]
_rate_p = _DEVICE["rate_probability"]
_latency_t = _DEVICE["latency_time"]


@cuda.jit
def _rate(x, key, gain, poisson, out):
    n_t, m = out.shape
    for j in range(cuda.grid(1), m, cuda.gridsize(1)):
        p = _rate_p(x[j], gain, poisson)
        for t in range(n_t):
            out[t, j] = _uniform(key, t * m + j) < p


@cuda.jit
def _latency(x, tau, threshold, linear, out):
    n_t, m = out.shape
    for j in range(cuda.grid(1), m, cuda.gridsize(1)):
        ts = _latency_t(x[j], n_t, tau, threshold, linear)
        for t in range(n_t):
            out[t, j] = ts == t


@cuda.jit
def _delta(x, threshold, zero, padding, off, out):
    n_t, m = x.shape
    for j in range(cuda.grid(1), m, cuda.gridsize(1)):
        prev = x[0, j] if padding else zero
        for t in range(n_t):
            d = x[t, j] - prev
            out[t, j] = 1 if d >= threshold else (-1 if (off and d <= -threshold) else 0)
            prev = x[t, j]


@cuda.jit
def _count(spikes, out):
    n_t, m = spikes.shape
    for j in range(cuda.grid(1), m, cuda.gridsize(1)):
        acc = 0
        for t in range(n_t):
            acc += spikes[t, j]
        out[j] = acc


@cuda.jit
def _first(spikes, out):
    n_t, m = spikes.shape
    for j in range(cuda.grid(1), m, cuda.gridsize(1)):
        first = n_t
        for i in range(n_t):
            t = n_t - 1 - i
            first = t if spikes[t, j] != 0 else first
        out[j] = first


def _launch(kernel, m, *args):
    if m:
        blocks, threads = grid_1d(m)
        kernel[blocks, threads](*args)


def rate(x, key, gain, poisson, out):
    """As :func:`nbops.neuromorphic.cpu.rate` (the same spikes for one seed)."""
    _launch(_rate, out.shape[1] if out.size else 0, x, key, gain, poisson, out)


def latency(x, tau, threshold, linear, out):
    """As :func:`nbops.neuromorphic.cpu.latency`."""
    _launch(_latency, out.shape[1] if out.size else 0, x, tau, threshold, linear, out)


def delta(x, threshold, padding, off_spike, out):
    """As :func:`nbops.neuromorphic.cpu.delta`."""
    t = x.dtype.type
    _launch(_delta, x.shape[1] if x.size else 0, x, t(threshold), t(0), padding, off_spike,
            out)


def spike_count(spikes, out):
    """As :func:`nbops.neuromorphic.cpu.spike_count`."""
    _launch(_count, out.size, spikes, out)


def first_spike_time(spikes, out):
    """As :func:`nbops.neuromorphic.cpu.first_spike_time`."""
    _launch(_first, out.size, spikes, out)
