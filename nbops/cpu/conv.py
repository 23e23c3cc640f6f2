"""CPU kernels of conv1d / conv2d and the fused conv + batch norm + relu.

Every convolution is ``out[n, co] = act(sum_k W'[co, k] col[k, p] + b[co])``
with ``k = (ci, kh, kw)`` over one group's input channels and ``p = (oh,
ow)``; ``W' = W * wscale[co]`` when a per-channel scale is given (batch
norm folded in) and ``act`` is 0 (none) or 1 (relu). Four algorithms; which
one runs is decided by the front's plan (:func:`nbops.conv.plan_conv`: the
table ``nbops.conv.ALGORITHMS`` holds their applicability rules), and
:func:`conv2d` runs the one a plan names:

* ``igemm`` (implicit GEMM, the default for every grouping with more than
  one input channel per group, 1x1 included): nbops' own packed GEMM of
  :mod:`nbops.cpu.linalg`. The weights are packed once per call into the
  micro-kernel's A slivers (scaled on the way, which is how batch norm is
  folded at no cost); the im2col matrix is never built: each task packs
  the KC x NC block of it that it needs straight into the B slivers
  (``bpack[jr, p, j]``) from the input, zero padding included, then runs the
  register-tile micro-kernel over it. A 1x1 stride-1 convolution without
  padding is the GEMM ``W @ x[n]`` on the input's planes as they lie: the
  micro-kernel reads its whole slivers in place (at the plane's row stride, the next
  sliver prefetched) and only a partial last one is packed. The epilogue
  (bias per output channel, residual, relu) runs on each MR x NR tile
  straight after its last k slice, while the tile is in L1: the output is
  written once.
* ``direct`` (stride 1, an autotuner candidate): each image's planes are
  copied once into zero-padded planes of row pitch Wp; then the GEMM of
  the weights (CO x K, K = (ci, kh, kw)) with the "im2col" matrix whose row
  k is the padded plane of ci shifted by ``kh * dh * Wp + kw * dw`` runs
  with register tiles that read those rows where they lie (a table of K
  row offsets, no packing at all), over the output at pitch Wp; the
  epilogue drops the padding columns. For 3x3 64->64 at 56x56 (M = 64 is
  too short for packing im2col panels to pay) ahead of the best other
  algorithm (docs/benchmarks.md, convolution); the autotuner keeps the others where
  they win (large C at small maps, 1x1). Strided convolutions run it
  too, on the input dealt into sh x sw phases that become channels, each
  tap a row of the phase it reads (``_direct_phases``: no tap added, a
  3x3/2 window is four stride-1 windows of 4, 2, 2 and 1 taps).
* ``blas``: im2col of one image (all of it, in parallel), the GEMM's BLAS
  route on it (SciPy's BLAS, one single-threaded call per band of the
  output inside Numba's threads), then the epilogue; an autotuner
  candidate that wins on some shapes.
* ``depthwise`` (one input channel per group: depthwise, with or without a
  channel multiplier): direct kernels. At strides 1 and 2 each input plane
  is copied into a zero-padded scratch plane and the stride-1 result is
  computed over all of it, every tap one long unit-stride loop
  (``_depthwise_padded``; a 3x3 window is one pass of nine FMAs per
  element), then the strided outputs are picked from it; larger strides
  ``prange`` over output planes and add each tap's ``w * x[row]`` to a row
  held in L1 (``_depthwise``).

The input ``x`` is C-contiguous NCHW seen flat; ``geo`` is the tuple
``(C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO)``; the batch
size is ``x.size // (C*H*W)``. ``im2col`` and ``col2im`` (the backward
pass's patch matrix and its adjoint) use the same geometry.
"""

import functools

import numpy as np
from numba import get_num_threads, prange
from numba.extending import register_jitable

from .. import _formulas
from .._codegen import bind, per_dtype
from .._jit import cpu_kernel
from .._tunables import CONV_TASKS_PER_THREAD as TASKS_PER_THREAD, DIRECT_STEP_BYTES
from .._tunables import DIRECT_TASKS_PER_THREAD, DIRECT_TILES_PER_TASK
from . import linalg as _linalg
from ._memory import prefetch as _prefetch
from ._regtile import fma_tile

__all__ = ["conv2d", "im2col", "col2im", "bn_scale_shift", "fold_weights"]
#: Entry points with no CUDA twin: none (the algorithms are CPU choices).
CPU_ONLY = ()


#: Inner loops index with unsigned integers: Numba guards signed indices
#: against negative values element by element, and with that guard LLVM
#: left the loops scalar (read in the assembly: vfmadd231ss, no zmm).
U = np.uint64


def conv2d(x, w, wscale, bias, out, geo, act, res, plan):
    """``out = act(conv(x, w * wscale) + bias + res)`` (shapes in the module
    docstring) by the algorithm that ``plan`` names: a
    :class:`nbops.conv.ConvPlan` made for this geometry and dtype by the
    front, where the rules that choose it live; here it is only checked
    (ValueError for a plan of another geometry or dtype, or one naming no
    CPU algorithm). ``wscale`` and ``bias`` are per output channel or
    empty, ``res`` (a residual added before the activation) is ``out``'s
    shape seen flat, or empty."""
    if out.size == 0:
        return out
    if plan.geometry != geo or plan.dtype != out.dtype:
        raise ValueError(f"conv2d: a plan for geometry {tuple(plan.geometry)} in "
                         f"{plan.dtype} was given a call of {tuple(geo)} in {out.dtype}")
    algo = plan.algorithm
    if plan.subsample:
        # a strided 1x1 without padding: its pixels, copied out once (a
        # quarter of the input at stride 2), are a stride-1 convolution
        x = _subsampled(x, geo)
        geo = plan.kernel_geometry
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    # read-only per-channel operands (an ONNX model's initializers) would
    # compile each kernel they reach a second time (the implicit GEMM's
    # driver: 6 s cold); copies of them cost next to nothing
    bias, wscale = _writable(bias), _writable(wscale)
    xf, wf, of = x.reshape(-1), w.reshape(-1), out.reshape(-1)
    if algo == "depthwise_padded" or algo == "depthwise":
        wf = _writable(wf)  # a few taps per channel, as bias
        # the depthwise kernels have no residual in their epilogues: one
        # more pass adds it (MobileNet's residuals follow 1x1 convolutions)
        dw_act = 0 if res.size else act
        if algo == "depthwise_padded":
            planes = of.size // (OH * OW)
            Hp, Wp = _padded(geo)
            _depthwise_padded(xf, wf, wscale, bias, of, geo, dw_act, Hp, Wp,
                              max(1, min(planes, 4 * get_num_threads())))
        else:
            _depthwise(xf, wf, wscale, bias, of, geo, dw_act)
        if res.size:
            _add_residual(of, res, act)
    elif algo == "direct":
        _direct(x, w, wscale, bias, out, geo, act, res)
    elif algo == "direct_phases":
        _direct_phases(x, w, wscale, bias, out, geo, plan.phases, act, res)
    elif algo == "blas":
        _blas_route(x, w, wscale, bias, out, geo, act, res)
    elif algo == "igemm":
        _igemm(xf, wf, wscale, bias, of, geo, act, res, plan.NC, plan.KC)
    else:
        raise ValueError(f"conv2d: the plan names {algo!r}, not a CPU convolution algorithm")
    return out


def _writable(a):
    """``a``, or a writable copy of it where it is read-only."""
    return a if a.flags.writeable else a.copy()


@cpu_kernel(parallel=True)
def _add_residual(of, res, act):
    zero = of.dtype.type(0)
    for i in prange(of.size):
        v = of[i] + res[i]
        of[i] = v if act == 0 or not v < zero else zero


def _subsampled(x, geo):
    """The input pixels a 1x1 convolution without padding reads at strides
    (sh, sw), as a C-contiguous (n, C, OH, OW) array: phase (0, 0) of each
    plane, copied in parallel (NumPy's strided copy was a seventh of the
    convolution's time; docs/benchmarks.md)."""
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n = x.size // (C * H * W)
    sub = np.empty((n, C, OH, OW), x.dtype)
    _deal_phases(x.reshape(-1), sub.reshape(-1), n * C, H, W, 0, 0, sh, sw, 1, 1, OH, OW)
    return sub


# ---------------------------------------------------------------------------
# Implicit GEMM


def _igemm(xf, wf, wscale, bias, of, geo, act, res, NC, KC):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n_img = xf.size // (C * H * W)
    mr, nr = _linalg.TILES[of.dtype]
    mg, k, p = CO // G, (C // G) * KH * KW, OH * OW
    kc = max(1, min(KC, k))
    nk = (k + kc - 1) // kc
    nir = (mg + mr - 1) // mr
    apk = np.empty((G, nk, nir, kc, mr), of.dtype)
    _pack_weights(wf, wscale, apk, mg, k)
    threads = get_num_threads()
    # column chunks: about NC pixels each, their count a multiple of the
    # thread count while the tasks are few (7 chunks on 2 threads idle one
    # of them an eighth of the time), whole NR slivers
    nj = max(1, -(-p // NC))
    if n_img * G * nj < 8 * threads:
        nj = -(-(n_img * G * nj) // threads) * threads // (n_img * G) or 1
    ncol = -(-p // nj)
    ncol = -(-ncol // nr) * nr
    nj = -(-p // ncol)
    # too few pixel chunks (small late layers at batch 1): split the
    # output channels too, each task re-packing its own B block
    mch = 1
    if n_img * G * nj < TASKS_PER_THREAD * threads:
        mch = min(nir, -(-TASKS_PER_THREAD * threads // (n_img * G * nj)))
    nchunks = min(n_img * G * nj * mch, threads)
    wq = 0
    if sw > 1 and KW > 1:
        xf, wq = _column_phases(xf, W, sw), -(-W // sw)
    _igemm_drivers(of.dtype)(xf, apk, bias, of, geo, ncol, nj, mch, act, of.dtype.type(0),
                             nchunks, wq, _rows_in_place(geo), res)


@register_jitable
def _rows_in_place(geo):
    """Whether the im2col matrix's rows are the input's planes themselves
    (1x1, stride 1, no padding): then the micro-kernel reads whole NR-wide
    slivers where they lie and only a partial last sliver is packed (each is
    used by MC / MR row tiles only, so packing was a large share of the
    work; docs/benchmarks.md)."""
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    return KH == 1 and KW == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0


def _column_phases(xf, W, sw):
    """The input with each row's columns dealt into ``sw`` phases: row r,
    phase f, position q holds column ``q * sw + f`` (zero past the row).
    A strided window row then reads one phase at unit stride: the packing
    of the 7x7 stride-2 stem gathered every element at stride 2."""
    rows = xf.size // W
    wq = -(-W // sw)
    out = np.zeros((rows, sw, wq), xf.dtype)
    x2 = xf.reshape(rows, W)
    for f in range(sw):
        cols = x2[:, f::sw]
        out[:, f, :cols.shape[1]] = cols
    return out.reshape(-1)


@cpu_kernel(parallel=True)
def _pack_weights(wf, wscale, apk, mg, k):
    # apk[g, q, ir, p, i] = W[g*mg + ir*MR + i, q*KC + p] * wscale[...]; zero
    # padded. Each weight row is read once, in order (a late ResNet layer's
    # 2.4M weights per call: reading 8 rows at a time column by column had
    # made packing cost as much as the convolution)
    ng, nk, nir, kc, mr = apk.shape
    zero = apk.dtype.type(0)
    one = apk.dtype.type(1)
    scaled = wscale.size > 0
    for t in prange(ng * nir):
        g = t // nir
        ir = t - g * nir
        for i in range(mr):
            r = ir * mr + i
            co = g * mg + r
            s = (wscale[co] if scaled else one) if r < mg else zero
            src = U(co * k) if r < mg else U(0)
            for q in range(nk):
                k0 = q * kc
                n = max(0, min(kc, k - k0)) if r < mg else 0
                u0 = U(k0)
                for pp in range(U(n)):
                    apk[g, q, ir, pp, i] = wf[src + u0 + pp] * s
                for pp in range(n, kc):
                    apk[g, q, ir, pp, i] = zero


@register_jitable
def _epilogue_rows(of, coff, ld, rows, cols, bias, row0, act, zero, res):
    """``act(C + bias[row] + R)`` over a rows x cols tile of C at ``coff``;
    the residual R (empty: none) is laid out as C."""
    has_bias = bias.size > 0
    for i in range(rows):
        r0 = U(coff + i * ld)
        b = bias[row0 + i] if has_bias else zero
        if res.size > 0:
            for j in range(U(cols)):
                v = of[r0 + j] + b + res[r0 + j]
                of[r0 + j] = v if act == 0 or not v < zero else zero
        elif act == 1:
            for j in range(U(cols)):
                v = of[r0 + j] + b
                of[r0 + j] = v if not v < zero else zero
        elif has_bias:
            for j in range(U(cols)):
                of[r0 + j] += b


@register_jitable(inline="always")
def _window_row(dst, d0, xf, src, lo, hi, seg, sw, zero):
    """One output row of a window: ``dst[d0 + t]`` for t in [0, seg) is
    ``xf[src + t * sw]`` for t in [lo, hi) and zero (padding) elsewhere.
    Unsigned offsets (``src`` may wrap below zero; the sums come out right)
    and a unit-stride branch: the short rows of late layers (14 pixels)
    copied with signed, wraparound-checked indices took several times as
    long (docs/benchmarks.md)."""
    for t in range(U(lo)):
        dst[d0 + t] = zero
    if sw == 1:
        for t in range(U(lo), U(hi)):
            dst[d0 + t] = xf[src + t]
    else:
        usw = U(sw)
        for t in range(U(lo), U(hi)):
            dst[d0 + t] = xf[src + t * usw]
    for t in range(U(hi), U(seg)):
        dst[d0 + t] = zero


@register_jitable
def _segment_bounds(i0, seg, step, size):
    """``(lo, hi)``: the t in [0, seg) with ``0 <= i0 + t*step < size`` form
    [lo, hi) (step > 0)."""
    lo = 0 if i0 >= 0 else min(seg, (-i0 + step - 1) // step)
    hi = (size - 1 - i0) // step + 1 if size - 1 - i0 >= 0 else 0
    return lo, max(lo, min(seg, hi))


# Templates bound per register tile (MR, NR, the micro-kernel as globals,
# as nbops.cpu.linalg does: globals keep Numba's on-disk cache valid).
MR = NR = 0
_micro = _pack_cols = None


def _pack_cols_t(xf, xoff, geo, pc, kc, jc, nc, bpack, line, zero, wq, in_place):
    # bpack[jr, p, j] = col[pc + p, jc + jr*NR + j] of one image and group,
    # read from the input (zero where the window hangs over the padding);
    # ``in_place`` (see _rows_in_place): the partial last sliver only.
    # Each k row is first gathered into ``line`` as runs of input rows in
    # address order (long unit-stride loops: vector copies, prefetcher
    # friendly), then dealt out to the slivers in fixed NR-wide copies.
    # Writing the slivers straight from the runs cut them into pieces of
    # variable length at sliver edges, which did not vectorize (4x slower).
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    kk_ = KH * KW
    oh0 = jc // OW
    ow0 = jc - oh0 * OW
    nnr = (nc + NR - 1) // NR
    if _rows_in_place(geo):
        # 1x1, stride 1, no padding: k row p is channel pc + p, and the
        # block's pixels are one contiguous run of it
        for p in range(kc):
            src = xoff + (pc + p) * H * W + jc
            for jr in range(nc // NR if in_place else 0, nc // NR):
                s0 = U(src + jr * NR)
                for i in range(U(NR)):
                    bpack[jr, p, i] = xf[s0 + i]
            for t in range((nc // NR) * NR, nnr * NR):
                bpack[t // NR, p, t % NR] = xf[src + t] if t < nc else zero
        return
    for p in range(kc):
        k = pc + p
        ci = k // kk_
        r = k - ci * kk_
        kh = r // KW
        kw = r - kh * KW
        row = sw * wq if wq > 0 else W
        base = xoff + ci * H * row
        j = 0
        oh = oh0
        ow = ow0
        while j < nc:
            seg = min(nc - j, OW - ow)
            ih = oh * sh - ph + kh * dh
            uj = U(j)
            if ih < 0 or ih >= H:
                for t in range(U(seg)):
                    line[uj + t] = zero
            else:
                iw0 = ow * sw - pw + kw * dw
                lo, hi = _segment_bounds(iw0, seg, sw, W)
                if wq > 0:
                    # column iw0 + t sw is phase f, position q0 + t
                    f = iw0 % sw
                    q0 = (iw0 - f) // sw
                    _window_row(line, uj, xf, U(base + ih * row + f * wq + q0), lo, hi, seg,
                                1, zero)
                else:
                    _window_row(line, uj, xf, U(base + ih * W + iw0), lo, hi, seg, sw, zero)
            j += seg
            oh += 1
            ow = 0
        for t in range(nc, nnr * NR):
            line[t] = zero
        for jr in range(nnr):
            l0 = U(jr * NR)
            for i in range(U(NR)):
                bpack[jr, p, i] = line[l0 + i]


def _igemm_t(xf, apk, bias, of, geo, ncol, nj, mch, act, zero, nchunks, wq, in_place, res):
    # wq > 0: xf holds the input's columns in sw phases of wq (_column_phases);
    # in_place: whole slivers are read from the input (_rows_in_place)
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    plane = H * (sw * wq if wq > 0 else W)
    n_img = xf.size // (C * plane)
    cg, mg = C // G, CO // G
    k = cg * KH * KW
    p_all = OH * OW
    nk, nir, kcap = apk.shape[1], apk.shape[2], apk.shape[3]
    # B's rows for the micro-kernel: a packed sliver (row stride NR) or the
    # input's planes (row stride plane); a runtime NR, not a literal (a
    # literal would compile a specialisation of the micro-kernel of its own)
    nr_ = apk.shape[4] // MR * NR
    per_m = (nir + mch - 1) // mch
    nnr_max = (min(ncol, p_all) + NR - 1) // NR
    ntasks = n_img * G * nj * mch
    # prange splits statically: one chunk of consecutive tasks per thread,
    # its panels allocated once (a fresh 200 KiB panel per task was an mmap
    # and page faults each time)
    for c in prange(nchunks):
        bpack = np.empty((nnr_max, kcap, NR), of.dtype)
        bf = bpack.reshape(-1)
        line = np.empty(nnr_max * NR, of.dtype)
        scratch = np.empty(MR * NR, of.dtype)
        for t in range(c * ntasks // nchunks, (c + 1) * ntasks // nchunks):
            mi = t % mch
            rest = t // mch
            jb = rest % nj
            rest = rest // nj
            g = rest % G
            n = rest // G
            ir0 = mi * per_m
            ir1 = min(nir, ir0 + per_m)
            jc = jb * ncol
            nc = min(ncol, p_all - jc)
            if ir0 < ir1 and nc > 0:
                s_ld = scratch.size // MR
                s_off = 0 * s_ld
                xoff = (n * C + g * cg) * plane
                c_base = (n * CO + g * mg) * p_all + jc
                for q in range(nk):
                    pc = q * kcap
                    kc = min(kcap, k - pc)
                    first = q == 0
                    _pack_cols(xf, xoff, geo, pc, kc, jc, nc, bpack, line, zero, wq,
                               in_place)
                    for jr in range((nc + NR - 1) // NR):
                        cols = min(NR, nc - jr * NR)
                        b_rows = in_place and cols == NR
                        b0 = xoff + pc * plane + jc + jr * NR
                        for ir in range(ir0, ir1):
                            if b_rows:
                                # the next sliver's kc rows (one or two
                                # lines each, at a plane's distance: no
                                # hardware prefetcher follows hundreds of
                                # such streams), a share before each tile
                                p0 = (ir - ir0) * kc // (ir1 - ir0)
                                for pp in range(p0, (ir - ir0 + 1) * kc // (ir1 - ir0)):
                                    _prefetch(xf, b0 + NR + pp * plane, 0)
                                    _prefetch(xf, b0 + 2 * NR - 1 + pp * plane, 0)
                            rows = min(MR, mg - ir * MR)
                            coff = c_base + ir * MR * p_all + jr * NR
                            bb, bo, bs = (xf, b0, plane) if b_rows else \
                                (bf, jr * kcap * NR, nr_)
                            if rows == MR and cols == NR:
                                _micro(kc, apk[g, q, ir], bb, bo, bs, of, coff, p_all, first)
                            else:
                                _micro(kc, apk[g, q, ir], bb, bo, bs, scratch, s_off, s_ld,
                                       s_ld > 0)
                                _linalg.store_edge_tile(of, coff, p_all, scratch, NR, rows,
                                                        cols, first)
                            if q == nk - 1:
                                _epilogue_rows(of, coff, p_all, rows, cols, bias,
                                               g * mg + ir * MR, act, zero, res)


@per_dtype
def _igemm_drivers(dtype):
    """The implicit-GEMM driver for ``dtype``'s register tile, built on first use."""
    mr, nr, scope = _linalg.tile_scope(globals(), dtype)
    scope["_pack_cols"] = register_jitable(bind(_pack_cols_t, scope, f"conv_pack_cols_{nr}"))
    return cpu_kernel(bind(_igemm_t, scope, f"conv_igemm_{mr}x{nr}"), parallel=True)


# ---------------------------------------------------------------------------
# Direct convolution on padded planes (stride 1)

#: Register tiles (MR x NR) of the direct convolution per dtype.
DIRECT_TILES = {np.dtype(np.float32): (8, 32), np.dtype(np.float64): (8, 16)}


def _padded(geo):
    """(Hp, Wp): the padded plane holding every position a window reads
    ("same" padding of an even window pads one more at the bottom and
    right than at the top and left)."""
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    return (max(H + 2 * ph, (OH - 1) * sh + (KH - 1) * dh + 1),
            max(W + 2 * pw, (OW - 1) * sw + (KW - 1) * dw + 1))


def _direct(x, w, wscale, bias, out, geo, act, res, phases=None):
    # phases: (geo_s, boff) of _direct_phases: the planes are the input's
    # phases (geometry geo_s, stride 1), the K rows at offsets boff in them
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    pgeo, boff = phases if phases is not None else (geo, None)
    Cp, KWp, dwp = pgeo[0], pgeo[4], pgeo[10]
    dtype = out.dtype
    mr, nr = DIRECT_TILES[dtype]
    Hp, Wp = _padded(pgeo)
    plane = Hp * Wp
    span = OH * Wp
    cg, mg = Cp // G, CO // G
    if boff is None:
        boff = _row_offsets(cg, KH, KW, plane, dh * Wp, dw)
    k = boff.size
    n_img = x.size // (C * H * W)
    # weights (G, rows, k), folded scale applied, at least MR rows per group
    # (zero rows past mg: the tiles read MR rows and store mg of them)
    rows = max(mg, mr)
    wk = _group_weights(w, wscale, G, mg, k)
    if rows > mg or not wk.flags.c_contiguous:
        a = np.zeros((G, rows, k), dtype)
        a[:, :mg] = wk
        wk = a
    # images in steps whose padded planes and output fit DIRECT_STEP_BYTES:
    # three parallel launches a step, not three an image
    per_img = (Cp * plane + CO * span) * dtype.itemsize
    step = max(1, min(n_img, DIRECT_STEP_BYTES // per_img))
    # no padding and a one-column window (1x1): the planes are the input's
    # own and the output's pitch is Wp, so the kernel reads x and writes out
    # where they lie (a 1x1 1024->256 at 14x14: two copies less, 10%)
    in_place = phases is None and KW == 1 and Hp == H and Wp == W == OW
    # the last tile's rows read up to (KW - 1) * dw past the last plane
    xpad = None if in_place else np.zeros(step * Cp * plane + (KWp - 1) * dwp, dtype)
    cbuf = None if in_place else np.empty(step * CO * span, dtype)
    ntile = (span + nr - 1) // nr
    nq = -(-ntile // DIRECT_TILES_PER_TASK)
    xf, of = x.reshape(n_img, -1), out.reshape(n_img, -1)
    rf = res.reshape(n_img, -1) if res.size else res
    kern = _direct_driver(dtype)
    for n0 in range(0, n_img, step):
        m = min(step, n_img - n0)
        # blocks of output channels too where runs of tiles alone leave
        # threads idle (a 14 x 14 map is 7 tiles: one task per image)
        nb = max(1, min(-(-mg // mr),
                        -(-DIRECT_TASKS_PER_THREAD * get_num_threads() // (m * G * nq))))
        xs, os_ = xf[n0:n0 + m].reshape(-1), of[n0:n0 + m].reshape(-1)
        if phases is not None:
            _deal_phases(xs, xpad, m * C, H, W, ph, pw, sh, sw, sh, sw, Hp, Wp)
        elif not in_place:
            _pad_planes(xs, xpad, m * C, H, W, ph, pw, Wp, plane)
        kern(wk.reshape(-1), rows, mg, k, xs if in_place else xpad, cg * plane, boff,
             os_ if in_place else cbuf, span, ntile, nq, nb, G, m)
        if not in_place or act or bias.size or res.size:
            _direct_epilogue(os_ if in_place else cbuf, span, os_, m * CO, CO, OH, OW, Wp,
                             bias, act, rf[n0:n0 + m].reshape(-1) if res.size else res)
    return out


def _direct_phases(x, w, wscale, bias, out, geo, geo_s, act, res):
    """A strided convolution as a stride-1 one: the padded input is dealt
    into sh x sw phases (phase (a, b) of channel c is channel
    ``(c sh + a) sw + b``, its position (u, v) holding padded input
    ``(sh u + a, sw v + b)``), and tap (kh, kw) of channel c reads the
    phase of ``(kh dh, kw dw)`` shifted by ``(kh dh // sh, kw dw // sw)``:
    the direct convolution's table of row offsets says so, and the weights
    stay as they are, every tap computed once (a 3x3/2 window is a 2x2, two
    2x1 and a 1x1 window over the four phases). The 7x7/2 stem and the 3x3/2
    layers run at the direct kernel's rate instead of the implicit GEMM's
    strided packing. ``geo_s``: the plan's ``phases``. The phases are
    dealt straight into the padded planes (``_deal_phases``, in parallel;
    NumPy's pad and 6-D transpose had taken half the time;
    docs/benchmarks.md)."""
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    _, hs, ws = geo_s[:3]
    boff = _phase_offsets(C // G, KH, KW, sh, sw, dh, dw, hs, ws)
    return _direct(x, w, wscale, bias, out, geo, act, res, (geo_s, boff))


@functools.lru_cache(maxsize=64)
def _phase_offsets(cg, KH, KW, sh, sw, dh, dw, hs, ws):
    """Offsets of the K = (ci, kh, kw) rows of a strided convolution in its
    input's phases (``_direct_phases``), in the weights' order."""
    ci = np.arange(cg, dtype=np.int64)[:, None, None]
    vh = np.arange(KH, dtype=np.int64)[None, :, None] * dh
    vw = np.arange(KW, dtype=np.int64)[None, None, :] * dw
    phase = (ci * sh + vh % sh) * sw + vw % sw
    return (phase * (hs * ws) + (vh // sh) * ws + vw // sw).reshape(-1)


@functools.lru_cache(maxsize=64)
def _row_offsets(cg, KH, KW, plane, row, col):
    """Offsets of the K rows of the shifted-plane matrix, (ci, kh, kw) in
    the weights' order: ``ci * plane + kh * row + kw * col`` (kept: the
    kernels only read them)."""
    return (np.arange(cg, dtype=np.int64)[:, None, None] * plane
            + np.arange(KH, dtype=np.int64)[None, :, None] * row
            + np.arange(KW, dtype=np.int64)[None, None, :] * col).reshape(-1)


@cpu_kernel(parallel=True)
def _deal_phases(xf, dst, C, H, W, ph, pw, sh, sw, na, nb, hs, ws):
    # plane c of xf (H x W, padded by ph, pw) dealt into its first na x nb
    # phases of sh x sw: dst plane (c na + a) nb + b, position (u, v), is
    # padded input (sh u + a, sw v + b). Positions over the padding are not
    # written (dst's zeros, as in _pad_planes).
    plane = hs * ws
    for t in prange(C * na * nb):
        c = t // (na * nb)
        a = (t // nb) % na
        b = t % nb
        u0 = (ph - a + sh - 1) // sh if ph > a else 0
        v0 = (pw - b + sw - 1) // sw if pw > b else 0
        v1 = min(ws, (W - 1 + pw - b) // sw + 1) if W - 1 + pw >= b else 0
        for u in range(u0, hs):
            ih = sh * u + a - ph
            if ih >= H:
                break
            s0 = U(c * H * W + ih * W + sw * v0 + b - pw)
            d0 = U(t * plane + u * ws + v0)
            usw = U(sw)
            for j in range(U(max(0, v1 - v0))):
                dst[d0 + j] = xf[s0 + j * usw]


@cpu_kernel(parallel=True)
def _pad_planes(xf, xpad, C, H, W, ph, pw, Wp, plane):
    # C planes (of all the step's images) into the padded planes; interior
    # only: the padding stays the zeros it was allocated with
    for c in prange(C):
        _into_plane(xpad, c * plane + ph * Wp + pw, Wp, xf, c * H * W, H, W)


@register_jitable(inline="always")
def _into_plane(pad, d0, Wp, xf, s0, H, W):
    """The H x W plane at ``xf[s0:]`` into ``pad`` from ``d0`` on, rows
    ``Wp`` apart (the interior of a padded plane)."""
    for ih in range(H):
        d = U(d0 + ih * Wp)
        s = U(s0 + ih * W)
        for iw in range(U(W)):
            pad[d + iw] = xf[s + iw]


@cpu_kernel(parallel=True)
def _direct_epilogue(cbuf, span, of, planes, CO, OH, OW, Wp, bias, act, res):
    # the OW valid columns of each row at pitch Wp, plus bias (and the
    # residual, laid out as the output), relu, for the step's planes =
    # images * CO output planes
    zero = of.dtype.type(0)
    for co in prange(planes):
        b = bias[co % CO] if bias.size > 0 else zero
        for oh in range(OH):
            a0 = U(co * span + oh * Wp)
            o0 = U((co * OH + oh) * OW)
            if res.size > 0:
                for ow in range(U(OW)):
                    v = cbuf[a0 + ow] + b + res[o0 + ow]
                    of[o0 + ow] = v if act == 0 or not v < zero else zero
            elif act == 1:
                for ow in range(U(OW)):
                    v = cbuf[a0 + ow] + b
                    of[o0 + ow] = v if not v < zero else zero
            else:
                for ow in range(U(OW)):
                    of[o0 + ow] = cbuf[a0 + ow] + b


def _direct_t(wk, rows, mg, k, xpad, gplane, boff, cbuf, span, ntile, nq, nb, groups, nimg):
    # task = (image, group, block of output channels, run of
    # DIRECT_TILES_PER_TASK output tiles). Channel blocks are whole MR-row
    # slivers but the last, which ends at mg and is moved back to hold MR
    # rows where mg allows; the last tile of the span is moved back to end
    # there. Both recompute a few values already stored, bit-identical,
    # instead of going through a scratch tile.
    slivers = -(-mg // MR)
    per = -(-slivers // nb) * MR                # rows per channel block
    for t in prange(nimg * groups * nb * nq):
        n = t // (groups * nb * nq)
        r = t - n * groups * nb * nq
        g = r // (nb * nq)
        r = r - g * nb * nq
        b = r // nq
        j0 = (r - b * nq) * DIRECT_TILES_PER_TASK
        r0 = b * per
        r1 = min(mg, r0 + per)
        if r0 >= r1:
            continue
        if r1 - r0 < MR:
            r0 = max(0, r1 - MR)
        for j in range(j0, min(j0 + DIRECT_TILES_PER_TASK, ntile)):
            q0 = min(j * NR, span - NR)
            _rows(wk, (g * rows + r0) * k, k, r1 - r0, xpad, (n * groups + g) * gplane, boff,
                  q0, k, cbuf, ((n * groups + g) * mg + r0) * span, span)


def _direct_rows_t(abuf, a0, sam, m, bbuf, b0, boff, q0, k, outf, c0, ldc):
    # an NR-wide column block (output columns q0..q0+NR at pitch ldc) of the
    # product of the weights (m rows at a0, row stride sam, unit k stride;
    # MR readable rows) with the matrix whose row p is bbuf[b0 + boff[p]:]
    # [q0:q0 + NR], in MR x NR register tiles down the m rows (the last
    # moved back to end at row m; only rows < m stored when m < MR)
    i0 = 0
    while i0 < m:
        i0 = max(0, min(i0, m - MR))
        _tile(k, abuf, a0 + i0 * sam, 1, sam, bbuf, b0 + q0, boff, outf, c0 + i0 * ldc + q0,
              ldc, m - i0, False)
        i0 += MR


@per_dtype
def _direct_driver(dtype):
    """The direct-convolution driver for ``dtype``'s tile, built on first use."""
    mr, nr = DIRECT_TILES[dtype]
    scope = dict(globals())
    scope.update(MR=mr, NR=nr, _rows=cpu_kernel(bind(
        _direct_rows_t, dict(globals(), MR=mr, _tile=fma_tile(mr, nr)), f"direct_rows_{mr}x{nr}")))
    return cpu_kernel(bind(_direct_t, scope, f"conv_direct_{mr}x{nr}"), parallel=True)


# ---------------------------------------------------------------------------
# Depthwise (one input channel per group)


@cpu_kernel(parallel=True)
def _depthwise_padded(xf, wf, wscale, bias, of, geo, act, Hp, Wp, nchunk):
    # Each plane goes into a zero-padded scratch plane of row pitch Wp, and
    # the stride-1 result is computed at that pitch over the rows the
    # strided output needs (padding columns and, at stride 2, the skipped
    # rows and columns computed and dropped): every tap is one unit-stride
    # loop over the whole span. Row by row the loops were OW long (28-112
    # in MobileNet), and LLVM leaves loops under 64 iterations scalar: two to
    # three times slower despite 4x the arithmetic (docs/benchmarks.md).
    # The taps add in the order of _depthwise (kh, then kw): float32 results
    # came out bit-identical to it on every shape tried, float64 ones differ
    # in the last bits where the two kernels' loops round their multiply-adds
    # differently (4.8e-15 relative, more where taps cancel); and where a
    # window's padding meets an infinite or NaN weight, w * 0 is added here
    # and skipped there (NaN here; see conv2d's docstring).
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n_img = xf.size // (C * H * W)
    mult = CO // C
    zero = of.dtype.type(0)
    # (Hp, Wp: the padded plane, see _padded)
    span = ((OH - 1) * sh + 1) * Wp
    planes = n_img * CO
    for c in prange(nchunk):
        # (KW - 1) * dw spare zeros: the last row's dropped columns read past
        # the padded plane
        pad = np.zeros(Hp * Wp + (KW - 1) * dw, of.dtype)
        acc = np.empty(span, of.dtype)
        for t in range(c * planes // nchunk, (c + 1) * planes // nchunk):
            n = t // CO
            co = t - n * CO
            xb = (n * C + co // mult) * H * W
            wb = co * KH * KW
            s = wscale[co] if wscale.size > 0 else of.dtype.type(1)
            b = bias[co] if bias.size > 0 else zero
            _into_plane(pad, ph * Wp + pw, Wp, xf, xb, H, W)
            if KH == 3 and KW == 3:
                _taps_3x3(acc, pad, span, wf, wb, s, b, U(dh * Wp), U(dw))
            else:
                for q in range(U(span)):
                    acc[q] = b
                for kh in range(KH):
                    for kw in range(KW):
                        wv = wf[wb + kh * KW + kw] * s
                        off = U(kh * dh * Wp + kw * dw)
                        for q in range(U(span)):
                            acc[q] += wv * pad[off + q]
            ob = t * OH * OW
            usw = U(sw)
            for oh in range(OH):
                a0 = U(oh * sh * Wp)
                o0 = U(ob + oh * OW)
                if act == 1:
                    for ow in range(U(OW)):
                        v = acc[a0 + ow * usw]
                        of[o0 + ow] = v if not v < zero else zero
                else:
                    for ow in range(U(OW)):
                        of[o0 + ow] = acc[a0 + ow * usw]


@register_jitable(inline="always")
def _taps_3x3(acc, pad, span, wf, wb, s, b, row, col):
    """``acc[q] = b + sum of w[kh, kw] * s * pad[q + kh * row + kw * col]``
    added in (kh, kw) order, in one pass (nine FMAs per element, no
    accumulator traffic between taps)."""
    w0 = wf[wb] * s
    w1 = wf[wb + 1] * s
    w2 = wf[wb + 2] * s
    w3 = wf[wb + 3] * s
    w4 = wf[wb + 4] * s
    w5 = wf[wb + 5] * s
    w6 = wf[wb + 6] * s
    w7 = wf[wb + 7] * s
    w8 = wf[wb + 8] * s
    r2 = row + row
    c2 = col + col
    for q in range(U(span)):
        a = b
        a += w0 * pad[q]
        a += w1 * pad[q + col]
        a += w2 * pad[q + c2]
        a += w3 * pad[row + q]
        a += w4 * pad[row + q + col]
        a += w5 * pad[row + q + c2]
        a += w6 * pad[r2 + q]
        a += w7 * pad[r2 + q + col]
        a += w8 * pad[r2 + q + c2]
        acc[q] = a


@cpu_kernel(parallel=True)
def _depthwise(xf, wf, wscale, bias, of, geo, act):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n_img = xf.size // (C * H * W)
    mult = CO // C
    zero = of.dtype.type(0)
    for t in prange(n_img * CO):
        n = t // CO
        co = t - n * CO
        xb = (n * C + co // mult) * H * W
        ob = t * OH * OW
        wb = co * KH * KW
        s = wscale[co] if wscale.size > 0 else of.dtype.type(1)
        b = bias[co] if bias.size > 0 else zero
        usw = U(sw)
        for oh in range(OH):
            r0 = U(ob + oh * OW)
            for ow in range(U(OW)):
                of[r0 + ow] = b
            for kh in range(KH):
                ih = oh * sh - ph + kh * dh
                if ih >= 0 and ih < H:
                    for kw in range(KW):
                        wv = wf[wb + kh * KW + kw] * s
                        iw0 = kw * dw - pw
                        lo, hi = _segment_bounds(iw0, OW, sw, W)
                        # unsigned: no per-element negative-index fix-up, so
                        # LLVM vectorizes the row (signed: scalar FMAs)
                        src = U(xb + ih * W + iw0)
                        if sw == 1:
                            for ow in range(U(lo), U(hi)):
                                of[r0 + ow] += wv * xf[src + ow]
                        else:
                            for ow in range(U(lo), U(hi)):
                                of[r0 + ow] += wv * xf[src + ow * usw]
            if act == 1:
                for ow in range(U(OW)):
                    v = of[r0 + ow]
                    of[r0 + ow] = v if not v < zero else zero


# ---------------------------------------------------------------------------
# im2col / col2im (backward pass, BLAS route)


def im2col(x, geo, col):
    """``col[n, g, k, p]`` = the input under tap k of output pixel p (zero in
    the padding), for every image n and group g; ``col`` is C-contiguous
    (N, G, Cg*KH*KW, OH*OW)."""
    _im2col(x.reshape(-1), geo, col.reshape(-1))
    return col


@cpu_kernel(parallel=True)
def _im2col(xf, geo, colf):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n_img = xf.size // (C * H * W)
    kk_ = KH * KW
    p_all = OH * OW
    zero = colf.dtype.type(0)
    # (n, channel, tap) rows: each is one k row of its image and group
    for t in prange(n_img * C * kk_):
        r = t % kk_
        nc_ = t // kk_
        kh = r // KW
        kw = r - kh * KW
        base = nc_ * H * W
        dst = t * p_all
        iw0 = kw * dw - pw
        lo, hi = _segment_bounds(iw0, OW, sw, W)
        for oh in range(OH):
            ih = oh * sh - ph + kh * dh
            d0 = U(dst + oh * OW)
            if ih < 0 or ih >= H:
                for ow in range(U(OW)):
                    colf[d0 + ow] = zero
            else:
                _window_row(colf, d0, xf, U(base + ih * W + iw0), lo, hi, OW, sw, zero)


def col2im(col, geo, gx):
    """The adjoint of :func:`im2col`: ``gx`` (N, C, H, W) = the sum of every
    ``col`` entry into the input element it was read from."""
    _col2im(col.reshape(-1), geo, gx.reshape(-1))
    return gx


@cpu_kernel(parallel=True)
def _col2im(colf, geo, gxf):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    n_img = gxf.size // (C * H * W)
    kk_ = KH * KW
    p_all = OH * OW
    zero = gxf.dtype.type(0)
    # one input plane per task: its taps are the only writers (no races)
    for t in prange(n_img * C):
        base = t * H * W
        for i in range(H * W):
            gxf[base + i] = zero
        for r in range(kk_):
            kh = r // KW
            kw = r - kh * KW
            src0 = (t * kk_ + r) * p_all
            iw0 = kw * dw - pw
            lo, hi = _segment_bounds(iw0, OW, sw, W)
            for oh in range(OH):
                ih = oh * sh - ph + kh * dh
                if ih >= 0 and ih < H:
                    dst = base + ih * W + iw0
                    src = src0 + oh * OW
                    for ow in range(lo, hi):
                        gxf[dst + ow * sw] += colf[src + ow]


def _group_weights(w, wscale, G, mg, k):
    """The weights as (G, mg, k) matrices, each output channel's row times
    its ``wscale`` (batch norm folded in) when one is given."""
    wm = w.reshape(G, mg, k)
    return wm * wscale.reshape(G, mg, 1) if wscale.size else wm


def _blas_route(x, w, wscale, bias, out, geo, act, res):
    C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, G, CO = geo
    mg, k, p = CO // G, (C // G) * KH * KW, OH * OW
    wm = _group_weights(w, wscale, G, mg, k)
    pointwise = KH == 1 and KW == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
    col = np.empty((1, G, k, p), x.dtype)
    zero = out.dtype.type(0)
    wflat = np.ascontiguousarray(wm).reshape(-1)
    # every group's product through the GEMM's BLAS route (SciPy's BLAS on
    # one thread per band inside Numba's threads): NumPy's np.dot ran its
    # own thread pool, which spun against Numba's between the im2col and
    # epilogue kernels (docs/benchmarks.md)
    offa = np.arange(G, dtype=np.int64) * (mg * k)
    offb = np.arange(G, dtype=np.int64) * (k * p)
    none = np.empty(0, out.dtype)
    prm, cst = _formulas.params(out.dtype), _formulas.consts(out.dtype)
    for n in range(x.shape[0]):
        if pointwise:  # the patch matrix is the image itself
            col = x[n:n + 1].reshape(1, G, k, p)
        else:
            im2col(x[n:n + 1], geo, col)
        _linalg.gemm_blas(wflat, offa, k, 1, col.reshape(-1), offb, p, 1,
                          out[n].reshape(G, mg, p), mg, p, k, none, 0, prm, cst)
        if act or bias.size or res.size:
            _epilogue_all(out[n].reshape(-1), p, CO, bias, act, zero,
                          res[n * CO * p:(n + 1) * CO * p] if res.size else res)


@cpu_kernel(parallel=True)
def _epilogue_all(of, p, rows, bias, act, zero, res):
    for r in prange(rows):
        _epilogue_rows(of, r * p, p, 1, p, bias, r, act, zero, res)


# ---------------------------------------------------------------------------
# Batch norm folding


@cpu_kernel
def bn_scale_shift(bias, mean, var, gamma, beta, eps, scale, shift):
    """``scale = gamma / sqrt(var + eps)``, ``shift = (bias - mean) * scale +
    beta`` (``bias`` may be empty: zero); float64 arithmetic for the
    square root, as the reference formula."""
    for c in range(scale.size):
        s = gamma[c] / np.sqrt(np.float64(var[c]) + eps)
        b = bias[c] if bias.size > 0 else 0.0
        scale[c] = s
        shift[c] = (b - np.float64(mean[c])) * s + beta[c]


@cpu_kernel(parallel=True)
def fold_weights(w, scale, out):
    """``out[co, ...] = w[co, ...] * scale[co]`` on (CO, rest) views."""
    for co in prange(w.shape[0]):
        s = scale[co]
        for i in range(w.shape[1]):
            out[co, i] = w[co, i] * s
