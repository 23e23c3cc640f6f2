"""CUDA kernels of conv1d / conv2d, the fused conv + batch norm + relu, and
the backward pass's im2col / col2im.

Forward: one block per (image, output channel) plane and tile of output
pixels (grid-stride over both, so any size fits the capped grid); the
plane's weights are staged through shared memory in chunks of ``WCHUNK``
taps, each read by every thread of the block, and each thread accumulates
one output pixel (neighbouring threads own neighbouring pixels, so input
reads and output stores coalesce along a row). The per-channel weight
scale (folded batch norm), the bias, a residual and the relu are applied
to the accumulator before the single store. ``geo`` is the CPU kernels' tuple
``(C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO)``.

Backward: ``im2col`` writes one patch-matrix element per thread;
``col2im`` gathers, for each input element, the patch entries that read it
(no atomics, deterministic sums).
"""

import numpy as np
from numba import cuda, float32, float64

from .. import _tunables
from ._launch import SIMULATED, grid_1d

__all__ = ["conv2d", "im2col", "col2im", "bn_scale_shift", "fold_weights"]

#: Output pixels per block (one per thread) and weight taps staged per chunk.
THREADS = 32 if SIMULATED else _tunables.CUDA_CONV_THREADS
WCHUNK = 16 if SIMULATED else _tunables.CUDA_CONV_WCHUNK
#: Grid caps: pixel tiles (x) and planes (y); kernels stride over the rest.
MAX_TILES, MAX_PLANES = (2, 4) if SIMULATED else (4096, 65535)


def _make_forward(nbtype):
    @cuda.jit
    def conv_forward(x, w, wscale, bias, out, geo, act, res):
        C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
        wsh = cuda.shared.array(WCHUNK, nbtype)
        n_img = x.shape[0]
        cg = C // G
        mg = CO // G
        kk = KH * KW
        k_all = cg * kk
        p_all = OH * OW
        tx = cuda.threadIdx.x
        nt = cuda.blockDim.x
        zero = nbtype(0)
        one = nbtype(1)
        for plane in range(cuda.blockIdx.y, n_img * CO, cuda.gridDim.y):
            n = plane // CO
            co = plane - n * CO
            c0 = (co // mg) * cg
            s = wscale[co] if wscale.size > 0 else one
            b = bias[co] if bias.size > 0 else zero
            for p0 in range(cuda.blockIdx.x * nt, p_all, cuda.gridDim.x * nt):
                p = p0 + tx
                oh = p // OW
                ow = p - oh * OW
                acc = zero
                for k0 in range(0, k_all, WCHUNK):
                    kn = min(WCHUNK, k_all - k0)
                    cuda.syncthreads()  # the previous chunk is no longer read
                    for e in range(tx, kn, nt):
                        k = k0 + e
                        ci = k // kk
                        r = k - ci * kk
                        kh = r // KW
                        wsh[e] = w[co, ci, kh, r - kh * KW]
                    cuda.syncthreads()
                    if p < p_all:
                        for e in range(kn):
                            k = k0 + e
                            ci = k // kk
                            r = k - ci * kk
                            kh = r // KW
                            kw = r - kh * KW
                            ih = oh * sh - ph + kh * dh
                            iw = ow * sw - pw + kw * dw
                            if ih >= 0 and ih < H and iw >= 0 and iw < W:
                                acc += wsh[e] * x[n, c0 + ci, ih, iw]
                if p < p_all:
                    v = acc * s + b
                    if res.size > 0:
                        v += res[plane * p_all + p]
                    if act == 1 and v < zero:
                        v = zero
                    out[n, co, oh, ow] = v

    return conv_forward


_FORWARD = {np.dtype(np.float32): _make_forward(float32),
            np.dtype(np.float64): _make_forward(float64)}


def conv2d(x, w, wscale, bias, out, geo, act, res):
    """``out = act(conv(x, w * wscale) + bias + res)``; arguments as the CPU
    kernel's (4-D NCHW device arrays, ``wscale``/``bias`` per output
    channel or empty, ``res`` the output's shape seen flat or empty)."""
    if out.size == 0:
        return out
    p_all = geo[11] * geo[12]
    planes = int(x.shape[0]) * geo[14]
    tiles = min(MAX_TILES, -(-p_all // THREADS))
    _FORWARD[np.dtype(out.dtype)][(tiles, min(planes, MAX_PLANES)), THREADS](
        x, w, wscale, bias, out, geo, act, res)
    return out


@cuda.jit
def _im2col(x, geo, col):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    kk = KH * KW
    p_all = OH * OW
    hw = H * W
    zero = col[0] * 0
    start = cuda.grid(1)
    for i in range(start, col.size, cuda.gridsize(1)):
        p = i % p_all
        t = i // p_all  # (n * C + c) * kk + r, the CPU kernel's row order
        r = t % kk
        plane = t // kk
        oh = p // OW
        ow = p - oh * OW
        kh = r // KW
        ih = oh * sh - ph + kh * dh
        iw = ow * sw - pw + (r - kh * KW) * dw
        v = zero
        if ih >= 0 and ih < H and iw >= 0 and iw < W:
            v = x[plane * hw + ih * W + iw]
        col[i] = v


def im2col(x, geo, col):
    """``col`` (N, G, Cg*KH*KW, OH*OW) = the patch matrix of ``x`` (N, C, H, W)."""
    if col.size:
        blocks, threads = grid_1d(col.size)
        _im2col[blocks, threads](x.reshape(-1), geo, col.reshape(-1))
    return col


@cuda.jit
def _col2im(col, geo, gx):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    kk = KH * KW
    p_all = OH * OW
    hw = H * W
    start = cuda.grid(1)
    for i in range(start, gx.size, cuda.gridsize(1)):
        plane = i // hw
        rem = i - plane * hw
        ih = rem // W
        iw = rem - ih * W
        acc = col[0] * 0
        for kh in range(KH):
            th = ih + ph - kh * dh
            if th >= 0 and th % sh == 0 and th // sh < OH:
                oh = th // sh
                for kw in range(KW):
                    tw = iw + pw - kw * dw
                    if tw >= 0 and tw % sw == 0 and tw // sw < OW:
                        acc += col[(plane * kk + kh * KW + kw) * p_all + oh * OW + tw // sw]
        gx[i] = acc


def col2im(col, geo, gx):
    """``gx`` (N, C, H, W) = the adjoint of :func:`im2col` applied to ``col``."""
    if gx.size:
        blocks, threads = grid_1d(gx.size)
        _col2im[blocks, threads](col.reshape(-1), geo, gx.reshape(-1))
    return gx


@cuda.jit
def _bn_scale_shift(bias, mean, var, gamma, beta, eps, scale, shift):
    for c in range(cuda.grid(1), scale.size, cuda.gridsize(1)):
        s = gamma[c] / (var[c] + eps) ** 0.5
        b = bias[c] if bias.size > 0 else mean[c] * 0
        scale[c] = s
        shift[c] = (b - mean[c]) * s + beta[c]


def bn_scale_shift(bias, mean, var, gamma, beta, eps, scale, shift):
    """``scale = gamma / sqrt(var + eps)``, ``shift = (bias - mean) * scale + beta``."""
    if scale.size:
        blocks, threads = grid_1d(scale.size)
        _bn_scale_shift[blocks, threads](bias, mean, var, gamma, beta, eps, scale, shift)


@cuda.jit
def _fold_weights(w, scale, out):
    per = w.shape[1]
    for i in range(cuda.grid(1), w.size, cuda.gridsize(1)):
        co = i // per
        j = i - co * per
        out[co, j] = w[co, j] * scale[co]


def fold_weights(w, scale, out):
    """``out[co, :] = w[co, :] * scale[co]`` on (CO, rest) arrays."""
    if w.size:
        blocks, threads = grid_1d(w.size)
        _fold_weights[blocks, threads](w, scale, out)
