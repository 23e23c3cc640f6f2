"""CUDA kernels of the pooling operators: one thread per output element
(grid-stride), on the planes layout of ``nbops/cpu/pooling.py`` (input
``(P, H, W)``, output ``(P, OH, OW)``, both C-contiguous). The backward
kernels zero the input gradient, then add each output's share with atomics
(windows overlap when the stride is below the kernel). Average pools sum in
float64. Launchers have the CPU module's signatures.
"""

import math

import numpy as np
from numba import cuda

from ._launch import grid_1d

__all__ = ["max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
           "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"]


def max_pool2d(x, out, indices, kh, kw, sh, sw, ph, pw, dh, dw):
    if out.size == 0:
        return out
    want = indices is not None
    if not want:
        indices = cuda.device_array((1, 1, 1), np.int64)
    _max_pool[grid_1d(out.size)](x, out, indices, want, kh, kw, sh, sw, ph, pw, dh, dw)
    return out


def max_pool2d_backward(grad, indices, grad_x):
    _zero[grid_1d(grad_x.size)](grad_x.reshape(grad_x.size))
    if grad.size:
        _max_scatter[grid_1d(grad.size)](grad, indices, grad_x)
    return grad_x


def avg_pool2d(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    if out.size:
        _avg_pool[grid_1d(out.size)](x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor)
    return out


def avg_pool2d_backward(grad, grad_x, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    _zero[grid_1d(grad_x.size)](grad_x.reshape(grad_x.size))
    if grad.size:
        _avg_spread[grid_1d(grad.size)](grad, grad_x, kh, kw, sh, sw, ph, pw,
                                        include_pad, divisor)
    return grad_x


def adaptive_avg_pool2d(x, out):
    if out.size:
        _adaptive_avg[grid_1d(out.size)](x, out)
    return out


def adaptive_avg_pool2d_backward(grad, grad_x):
    _zero[grid_1d(grad_x.size)](grad_x.reshape(grad_x.size))
    if grad.size:
        _adaptive_spread[grid_1d(grad.size)](grad, grad_x)
    return grad_x


# ---------------------------------------------------------------------------
# Geometry (the CPU module's formulas, as device functions)


@cuda.jit(device=True, inline=True)
def _unravel(i, oh_n, ow_n):
    ow = i % ow_n
    t = i // ow_n
    return t // oh_n, t % oh_n, ow


@cuda.jit(device=True, inline=True)
def _avg_window(o, s, p, k, size):
    start = o * s - p
    end = min(start + k, size + p)
    return max(start, 0), min(end, size), end - start


@cuda.jit(device=True, inline=True)
def _avg_divisor(hcount, wcount, h0, h1, w0, w1, include_pad, divisor):
    if divisor > 0:
        return divisor
    if include_pad:
        return hcount * wcount
    return (h1 - h0) * (w1 - w0)


@cuda.jit(device=True, inline=True)
def _bin(o, out_size, size):
    return (o * size) // out_size, ((o + 1) * size + out_size - 1) // out_size


# ---------------------------------------------------------------------------
# Kernels


@cuda.jit
def _zero(flat):
    for i in range(cuda.grid(1), flat.size, cuda.gridsize(1)):
        flat[i] = 0


@cuda.jit
def _max_pool(x, out, indices, want, kh, kw, sh, sw, ph, pw, dh, dw):
    h, w = x.shape[1], x.shape[2]
    oh_n, ow_n = out.shape[1], out.shape[2]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        h0 = oh * sh - ph
        h1 = min(h0 + (kh - 1) * dh + 1, h)
        while h0 < 0:
            h0 += dh
        w0 = ow * sw - pw
        w1 = min(w0 + (kw - 1) * dw + 1, w)
        while w0 < 0:
            w0 += dw
        best = h0 * w + w0
        m = -math.inf
        for ih in range(h0, h1, dh):
            for iw in range(w0, w1, dw):
                v = x[p, ih, iw]
                if v > m or v != v:  # NaN wins, as in PyTorch
                    m = v
                    best = ih * w + iw
        out[p, oh, ow] = m
        if want:
            indices[p, oh, ow] = best


@cuda.jit
def _max_scatter(grad, indices, grad_x):
    w = grad_x.shape[2]
    oh_n, ow_n = grad.shape[1], grad.shape[2]
    for i in range(cuda.grid(1), grad.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        q = indices[p, oh, ow]
        cuda.atomic.add(grad_x, (p, q // w, q % w), grad[p, oh, ow])


@cuda.jit
def _avg_pool(x, out, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    h, w = x.shape[1], x.shape[2]
    oh_n, ow_n = out.shape[1], out.shape[2]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        h0, h1, hcount = _avg_window(oh, sh, ph, kh, h)
        w0, w1, wcount = _avg_window(ow, sw, pw, kw, w)
        s = 0.0
        for ih in range(h0, h1):
            for iw in range(w0, w1):
                s += x[p, ih, iw]
        d = _avg_divisor(hcount, wcount, h0, h1, w0, w1, include_pad, divisor)
        out[p, oh, ow] = s / d if d > 0 else 0


@cuda.jit
def _avg_spread(grad, grad_x, kh, kw, sh, sw, ph, pw, include_pad, divisor):
    h, w = grad_x.shape[1], grad_x.shape[2]
    oh_n, ow_n = grad.shape[1], grad.shape[2]
    for i in range(cuda.grid(1), grad.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        h0, h1, hcount = _avg_window(oh, sh, ph, kh, h)
        w0, w1, wcount = _avg_window(ow, sw, pw, kw, w)
        d = _avg_divisor(hcount, wcount, h0, h1, w0, w1, include_pad, divisor)
        if d > 0:
            g = grad[p, oh, ow] / d
            for ih in range(h0, h1):
                for iw in range(w0, w1):
                    cuda.atomic.add(grad_x, (p, ih, iw), g)


@cuda.jit
def _adaptive_avg(x, out):
    h, w = x.shape[1], x.shape[2]
    oh_n, ow_n = out.shape[1], out.shape[2]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        h0, h1 = _bin(oh, oh_n, h)
        w0, w1 = _bin(ow, ow_n, w)
        s = 0.0
        for ih in range(h0, h1):
            for iw in range(w0, w1):
                s += x[p, ih, iw]
        out[p, oh, ow] = s / ((h1 - h0) * (w1 - w0))


@cuda.jit
def _adaptive_spread(grad, grad_x):
    h, w = grad_x.shape[1], grad_x.shape[2]
    oh_n, ow_n = grad.shape[1], grad.shape[2]
    for i in range(cuda.grid(1), grad.size, cuda.gridsize(1)):
        p, oh, ow = _unravel(i, oh_n, ow_n)
        h0, h1 = _bin(oh, oh_n, h)
        w0, w1 = _bin(ow, ow_n, w)
        g = grad[p, oh, ow] / ((h1 - h0) * (w1 - w0))
        for ih in range(h0, h1):
            for iw in range(w0, w1):
                cuda.atomic.add(grad_x, (p, ih, iw), g)
