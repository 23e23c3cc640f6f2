"""CUDA kernels of the int8 GEMM family: shared-memory tiles, int32
accumulation, the CPU kernels' epilogue.

Each block computes a BM x BN tile of one product; per k step it stages a
BK x BM tile of ``a - za`` and a BK x BN tile of ``b - zb`` in shared memory
(as int32: the zero points are subtracted once, while staging) and each of
its threads accumulates an RM x RN register tile in int32 (rows
``ty + i*TY``, columns ``tx + j*TX``, so stores coalesce). Numba CUDA
exposes no ``dp4a``/``__dp4a`` intrinsic (numba-cuda 0.30 has none, and no
inline PTX), so the products are plain 32-bit integer multiply-adds on
zero-point-corrected values; a dp4a version would pack four bytes per
register and needs the corrections applied through row/column sums as on
the CPU.

Operands arrive as the CPU entry points take them: flat uint8 views with
element strides and per-batch offsets, XOR flips that map int8 data to the
unsigned A side / uint8 data to the signed B side, and zero points already
shifted to match (``za + 128`` for int8 A, ``zb - 128`` for uint8 B), so
the stored values are exactly the CPU's. :func:`conv2d_op` is the same
kernel with an implicit-GEMM (im2col) loader for B: the weights are A,
``(image, group)`` pairs run through the grid's third axis.

The epilogue (``MODES`` of the CPU module: int32, fixed-point requant,
float requant, dequant to float32) calls the scalar formulas of
:mod:`nbops.quant._requant` compiled as device functions.
"""

import math

import numpy as np
from numba import cuda, int32

from .. import _layout
from ..cuda._launch import SIMULATED
from . import _requant

__all__ = ["gemm_op", "conv2d_op"]

#: Tile sizes; tiny in the simulator (one OS thread per CUDA thread).
BM, BN, BK, RM, RN = (8, 8, 4, 2, 2) if SIMULATED else (64, 64, 16, 4, 4)
TX, TY = BN // RN, BM // RM
MAX_GRID_Z = 4 if SIMULATED else 65535

_D = _requant.device_functions()
_requantize = _D["requantize"]
_requantize_float = _D["requantize_float"]


@cuda.jit(device=True)
def _load_matrix(bbuf, ob, kx, c, geo):
    # geo = (sbk, sbn): B[kx, c] of a strided matrix
    return bbuf[ob + kx * geo[0] + c * geo[1]]


@cuda.jit(device=True)
def _load_im2col(bbuf, ob, kx, c, geo):
    # geo = (H, W, kh, kw, st_h, st_w, pad_h, pad_w, dil_h, dil_w, OW, pad byte):
    # B[kx, c] = x[channel, oh*st - pad + i*dil, ow*st - pad + j*dil]
    khw = geo[2] * geo[3]
    ch = kx // khw
    rem = kx - ch * khw
    i = rem // geo[3]
    j = rem - i * geo[3]
    oh = c // geo[10]
    ow = c - oh * geo[10]
    h = oh * geo[4] - geo[6] + i * geo[8]
    w = ow * geo[5] - geo[7] + j * geo[9]
    if 0 <= h < geo[0] and 0 <= w < geo[1]:
        return bbuf[ob + (ch * geo[0] + h) * geo[1] + w]
    return geo[11]


def _make_kernel(load_b):
    @cuda.jit
    def kernel(abuf, offa, sam, sak, flip_a, za, bbuf, offb, geo, flip_b, zb, oi, ob, of,
               nb, m, n, k, mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, pr, pg):
        a_tile = cuda.shared.array((BK, BM), int32)
        b_tile = cuda.shared.array((BK, BN), int32)
        acc = cuda.local.array((RM, RN), int32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * TX + tx
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        for bi in range(cuda.blockIdx.z, nb, cuda.gridDim.z):
            oa = offa[bi]
            obb = offb[bi]
            zoff = (bi % pg) * m  # conv: the group's rows of the per-channel arrays
            for i in range(RM):
                for j in range(RN):
                    acc[i, j] = 0
            for k0 in range(0, k, BK):
                for e in range(tid, BM * BK, TX * TY):
                    o = e // BK
                    kk = e - o * BK
                    r = row0 + o
                    kx = k0 + kk
                    v = 0
                    if r < m and kx < k:
                        v = (int(abuf[oa + r * sam + kx * sak]) ^ flip_a) - za[zoff + r]
                    a_tile[kk, o] = v
                for e in range(tid, BN * BK, TX * TY):
                    kk = e // BN
                    o = e - kk * BN
                    c = col0 + o
                    kx = k0 + kk
                    v = 0
                    if c < n and kx < k:
                        byte = int(load_b(bbuf, obb, kx, c, geo)) ^ flip_b
                        v = byte - ((byte & 0x80) << 1) - int(zb[c])
                    b_tile[kk, o] = v
                cuda.syncthreads()
                for kk in range(BK):
                    for i in range(RM):
                        av = a_tile[kk, ty + i * TY]
                        for j in range(RN):
                            acc[i, j] += av * b_tile[kk, tx + j * TX]
                cuda.syncthreads()
            for i in range(RM):
                r = row0 + ty + i * TY
                if r < m:
                    for j in range(RN):
                        c = col0 + tx + j * TX
                        if c < n:
                            p = zoff + r if pr else c
                            v = acc[i, j]
                            if bias.size > 0:
                                v += bias[p]
                            if mode == 0:
                                oi[bi, r, c] = v
                            elif mode == 1:
                                # int8 results land in a uint8 view: store their bits
                                ob[bi, r, c] = _requantize(v, mult[p], shift[p], ozp, qmin,
                                                           qmax) & 0xFF
                            elif mode == 2:
                                ob[bi, r, c] = _requantize_float(v, fscale[p], ozp, qmin,
                                                                 qmax) & 0xFF
                            else:
                                f = np.float32(v) * np.float32(fscale[p])
                                if fbias.size > 0:
                                    f += fbias[p]
                                of[bi, r, c] = f

    return kernel


_GEMM = _make_kernel(_load_matrix)
_CONV = _make_kernel(_load_im2col)


def _outs(out3):
    """(int32, uint8, float32) output arguments: ``out3`` in its slot, empty
    device arrays in the others (one kernel signature per output type)."""
    res = []
    for t in (np.int32, np.uint8, np.float32):
        res.append(out3 if out3.dtype == np.dtype(t) else cuda.device_array((0, 0, 0), t))
    return res


def _dev(x, dtype):
    return cuda.to_device(np.ascontiguousarray(np.asarray(x, dtype)))


def _epi_args(epi):
    mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, per_row = epi
    return (mode, bias if not isinstance(bias, np.ndarray) else _dev(bias, np.int32),
            _dev(mult, np.int32), _dev(shift, np.int32), ozp, qmin, qmax,
            _dev(fscale, np.float64),
            fbias if not isinstance(fbias, np.ndarray) else _dev(fbias, np.float32),
            1 if per_row else 0)


def _launch(kernel, nb, m, n, args):
    blocks = (math.ceil(n / BN), math.ceil(m / BM), max(1, min(nb, MAX_GRID_Z)))
    kernel[blocks, (TX, TY)](*args)


def gemm_op(abuf, offa, sam, sak, flip_a, za, bop, zb, out3, m, n, k, epi):
    """``out3[b] = epilogue((A_b - za) @ (B_b - zb))``; the arguments of the
    CPU entry point (``bop.packed`` is ignored: B is read where it lies)."""
    nb = int(out3.shape[0])
    if out3.size == 0:
        return out3
    geo = _dev([bop.sbk, bop.sbn], np.int64)
    mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, pr = _epi_args(epi)
    _launch(_GEMM, nb, m, n, (
        abuf, _dev(offa, np.int64), sam, sak, flip_a, _dev(za, np.int32), bop.b8,
        _dev(bop.offb, np.int64), geo, bop.flip, _dev(zb, np.int32), *_outs(out3), nb, m, n,
        k, mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, pr, 1))
    return out3


def conv2d_op(x8, flip_x, xzp, pw, geom, ohw, out, epi):
    """QLinearConv as implicit GEMMs, one per (image, group) along the grid's
    third axis; the arguments of the CPU entry point."""
    st, pad, dil = geom
    oh, ow = ohw
    nimg, c, hgt, wid = (int(v) for v in x8.shape)
    oc, cg, kh, kw = pw.shape
    g = pw.groups
    ocg = oc // g
    k = cg * kh * kw
    npix = oh * ow
    w = pw.qweight.values
    w8 = w if w.dtype == np.dtype(np.uint8) else _layout.strided_view(
        w, tuple(w.shape), tuple(w.strides), 0, dtype=np.uint8)
    wflip = 0x80 if w.dtype == np.dtype(np.int8) else 0
    bflip = flip_x ^ 0x80
    za = pw.zp + (128 if wflip else 0)
    zb = np.full(npix, int(xzp) - (128 if bflip else 0), np.int32)
    nb = nimg * g
    offa = np.array([(i % g) * ocg * k for i in range(nb)], np.int64)
    offb = np.array([((i // g) * c + (i % g) * cg) * hgt * wid for i in range(nb)], np.int64)
    geo = _dev([hgt, wid, kh, kw, st[0], st[1], pad[0], pad[1], dil[0], dil[1], ow,
                int(xzp) & 0xFF], np.int64)
    out3 = out.reshape(nb, ocg, npix)
    mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, pr = _epi_args(epi)
    _launch(_CONV, nb, ocg, npix, (
        w8.reshape(-1), _dev(offa, np.int64), k, 1, wflip, _dev(za, np.int32),
        x8.reshape(-1), _dev(offb, np.int64), geo, bflip, _dev(zb, np.int32), *_outs(out3),
        nb, ocg, npix, k, mode, bias, mult, shift, ozp, qmin, qmax, fscale, fbias, pr, g))
    return out
