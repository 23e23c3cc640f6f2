"""CPU kernels of batch norm, layer norm and RMS norm.

Two families, each one parametrised kernel set:

* **rows** (layer norm, RMS norm): ``x`` as a C-contiguous (rows, d)
  matrix, one row per ``prange`` item. A row (3 KiB at d = 768 float32)
  stays in L1 while it is read three times: a first mean, the deviations
  from it (their sum corrects the mean, their squares give the variance:
  the corrected two-pass algorithm, exact for any offset, unlike
  ``E[x^2] - E[x]^2``), and the normalised write in x's dtype. RMS norm is
  the same kernel with ``centered`` False (mean taken as 0, no mean term in
  the gradient). Sums run in blocks of SUM_BLOCK elements in x's dtype
  (full-width vectors) whose totals accumulate in float64.
* **channels** (batch norm): ``x`` as a C-contiguous (n, c, s) array (L
  for 3-D input, H*W for 4-D). Every (sample range, channel) block takes
  each of its (sample, channel) planes' mean and M2 as a row above, in
  cache, and folds them into a running (count, mean, M2) with Chan's
  parallel-variance merge; the blocks' partials are then merged the same
  way per channel. Normalisation and the gradient are per-plane loops with
  per-channel coefficients. 2-D input (s = 1) has **column** kernels:
  rows outer, the channel loop innermost (vectorized across channels),
  two passes per block of rows while the block is in cache.

Entry points take preallocated outputs and return nothing interesting;
weights and biases always come as arrays (ones and zeros stand in for
missing ones), so each kernel has one signature per dtype.
"""

import math

import numba
import numpy as np
from numba import njit, prange

from .._jit import FASTMATH, FASTMATH_REDUCE, serial_and_parallel
from .._tunables import NORM_MIN_BLOCK as MIN_BLOCK, NORM_SUM_BLOCK as SUM_BLOCK, SERIAL_BELOW

__all__ = ["norm_rows", "norm_rows_backward", "batch_norm_stats", "batch_norm_invstd",
           "batch_norm_forward", "batch_norm_train", "batch_norm_backward"]


def _twins(fastmath):
    """Compile the decorated function as ``(serial, parallel)`` kernels."""
    return lambda fn: serial_and_parallel(fn, fn.__name__.lstrip("_"), fastmath=fastmath)


def _pick(twins, size):
    return twins[0] if size < SERIAL_BELOW else twins[1]


# ---------------------------------------------------------------------------
# Rows: layer norm and RMS norm


def norm_rows(x, w, b, eps, centered, out):
    """``out[r] = (x[r] - mean_r) * rstd_r * w + b`` for a (rows, d) ``x``;
    ``mean_r`` is 0 when not ``centered`` (RMS norm)."""
    if x.shape[0] and x.shape[1]:
        _pick(_rows_forward, x.size)(x, w, b, float(eps), bool(centered), out,
                                     _row_chunks(x, 4))
    return out


def norm_rows_backward(x, g, w, eps, centered, dx, dw, db):
    """Gradients of :func:`norm_rows` for upstream ``g``: ``dx`` (rows, d),
    and the column sums ``dw`` = sum_r g * xhat, ``db`` = sum_r g (d,)."""
    rows, d = x.shape
    if rows == 0 or d == 0:
        dw[:] = 0
        db[:] = 0
        return dx
    chunks = _row_chunks(x, 2)
    pw = np.zeros((chunks, d))
    pb = np.zeros((chunks, d))
    _pick(_rows_backward, x.size)(x, g, w, float(eps), bool(centered), dx, pw, pb)
    dw[:] = pw.sum(axis=0)
    db[:] = pb.sum(axis=0)
    return dx


def _row_chunks(x, per_thread):
    # contiguous runs of rows for the row kernels: one for the serial twin,
    # else a few per thread
    if x.size < SERIAL_BELOW:
        return 1
    return max(1, min(x.shape[0], per_thread * numba.get_num_threads()))


@njit(inline="always")
def _row_stats(xr, eps, centered):
    # IR-inlined into each kernel, which compiles it with its own fastmath
    # flags (reassoc: vector partial sums)
    return _stats_from_sum(xr, _sum(xr) if centered else 0.0, eps, centered)


@njit(inline="always")
def _stats_from_sum(xr, total, eps, centered):
    # (mean, 1 / std) of a row whose plain sum is ``total`` (ignored when
    # not centered): the deviations pass corrects that first mean
    t = xr.dtype.type
    d = xr.size
    c = t(total / d) if centered else t(0.0)
    s1, s2 = _deviations(xr, c)
    if not centered:
        return c, t(1.0 / math.sqrt(s2 / d + eps))
    mean = c + s1 / d
    return t(mean), t(1.0 / math.sqrt(max(s2 / d - (mean - c) ** 2, 0.0) + eps))


@njit(inline="always")
def _sum(v):
    """Sum of ``v``: blocks of SUM_BLOCK in v's dtype (vector lanes, short
    enough to stay accurate), block totals in float64. The blocks have a
    constant trip count: a ``min()`` bound cost 3-4x here."""
    n = v.size
    nb = n // SUM_BLOCK
    total = 0.0
    for k in range(nb):
        # a block slice indexed from 0: an index k * SUM_BLOCK + j is signed,
        # gets a wraparound select, and LLVM then loads through gathers
        blk = v[k * SUM_BLOCK:k * SUM_BLOCK + SUM_BLOCK]
        s = v.dtype.type(0.0)
        for j in range(SUM_BLOCK):
            s += blk[j]
        total += s
    tail = v[nb * SUM_BLOCK:]
    s = v.dtype.type(0.0)
    for j in range(tail.size):
        s += tail[j]
    return total + s


@njit(inline="always")
def _deviations(v, c):
    """``(sum(v - c), sum((v - c)^2))`` for ``c`` of v's dtype near the mean,
    blocked as :func:`_sum`. The first sum corrects the mean that ``c``
    approximates (the corrected two-pass algorithm): a float32 first pass at
    an offset of 1e4 leaves the mean a few 1e-4 off."""
    n = v.size
    nb = n // SUM_BLOCK
    t1 = 0.0
    t2 = 0.0
    for k in range(nb):
        blk = v[k * SUM_BLOCK:k * SUM_BLOCK + SUM_BLOCK]
        s1 = v.dtype.type(0.0)
        s2 = v.dtype.type(0.0)
        for j in range(SUM_BLOCK):
            e = blk[j] - c
            s1 += e
            s2 += e * e
        t1 += s1
        t2 += s2
    tail = v[nb * SUM_BLOCK:]
    s1 = v.dtype.type(0.0)
    s2 = v.dtype.type(0.0)
    for j in range(tail.size):
        e = tail[j] - c
        s1 += e
        s2 += e * e
    return t1 + s1, t2 + s2


@_twins(FASTMATH_REDUCE)
def _rows_forward(x, w, b, eps, centered, out, chunks):
    # chunks of consecutive rows: a row's first pass (its plain sum) runs
    # inside the previous row's write pass, so that the next row's loads
    # from memory overlap this row's stores (the output is written once
    # per row, after two passes over the row in L1)
    rows, d = x.shape
    for c in prange(chunks):
        r0 = c * rows // chunks
        r_end = (c + 1) * rows // chunks
        total = _sum(x[r0]) if centered and r0 < r_end else 0.0
        for r in range(r0, r_end):
            xr = x[r]
            mean, rstd = _stats_from_sum(xr, total, eps, centered)
            if centered:
                total = _write_and_sum(xr, mean, rstd, w, b, out[r],
                                       x[r + 1] if r + 1 < r_end else xr)
            else:
                o = out[r]
                for j in range(d):
                    o[j] = (xr[j] - mean) * rstd * w[j] + b[j]


@njit(inline="always")
def _write_and_sum(xr, mean, rstd, w, b, o, nxt):
    """``o = (xr - mean) * rstd * w + b`` and the sum of ``nxt`` (blocked as
    :func:`_sum`) in one loop."""
    n = xr.size
    nb = n // SUM_BLOCK
    total = 0.0
    for k in range(nb):
        lo = k * SUM_BLOCK
        xb = xr[lo:lo + SUM_BLOCK]
        ob = o[lo:lo + SUM_BLOCK]
        wb = w[lo:lo + SUM_BLOCK]
        bb = b[lo:lo + SUM_BLOCK]
        nb_ = nxt[lo:lo + SUM_BLOCK]
        s = xr.dtype.type(0.0)
        for j in range(SUM_BLOCK):
            ob[j] = (xb[j] - mean) * rstd * wb[j] + bb[j]
            s += nb_[j]
        total += s
    lo = nb * SUM_BLOCK
    xb, ob, wb, bb, nb_ = xr[lo:], o[lo:], w[lo:], b[lo:], nxt[lo:]
    s = xr.dtype.type(0.0)
    for j in range(n - lo):
        ob[j] = (xb[j] - mean) * rstd * wb[j] + bb[j]
        s += nb_[j]
    return total + s


@_twins(FASTMATH_REDUCE)
def _rows_backward(x, g, w, eps, centered, dx, pw, pb):
    rows, d = x.shape
    chunks = pw.shape[0]
    for c in prange(chunks):
        cw = pw[c]
        cb = pb[c]
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            xr = x[r]
            gr = g[r]
            dr = dx[r]
            mean, rstd = _row_stats(xr, eps, centered)
            sg = 0.0
            sgx = 0.0
            for j in range(d):
                xh = (xr[j] - mean) * rstd
                gy = gr[j] * w[j]
                sg += gy
                sgx += gy * xh
                cw[j] += gr[j] * xh
                cb[j] += gr[j]
            a = sg / d if centered else 0.0
            k = sgx / d
            for j in range(d):
                dr[j] = rstd * (gr[j] * w[j] - a - (xr[j] - mean) * rstd * k)


# ---------------------------------------------------------------------------
# Channels: batch norm


def _splits(n, c, s):
    """Sample ranges per channel in the reductions: enough blocks to keep
    every thread busy when channels are few, none smaller than MIN_BLOCK
    elements (unless a whole channel is smaller)."""
    if n * c * s < SERIAL_BELOW:
        return 1
    want = -(-8 * numba.get_num_threads() // max(c, 1))
    return max(1, min(n, want, max(1, n * s // MIN_BLOCK)))


def _column_splits(n, c):
    """Row blocks of a 2-D (n, c) batch norm's reductions: about 64K
    elements each (in L2 for the second pass), at least two per thread."""
    if n * c < SERIAL_BELOW:
        return 1
    return max(1, min(n, max(2 * numba.get_num_threads(), n * c // (1 << 16))))


def batch_norm_stats(x, eps, mean, invstd, running_mean, running_var, momentum, update):
    """Batch mean and ``1 / sqrt(var + eps)`` (biased variance) per channel of
    an (n, c, s) ``x``; when ``update``, also ``running = (1 - momentum) *
    running + momentum * batch`` with the unbiased variance, in place."""
    n, c, s = x.shape
    m64 = np.empty(c)
    v64 = np.empty(c)
    if s == 1:
        _pick(_column_stats, x.size)(x.reshape(n, c), _column_splits(n, c), m64, v64)
    else:
        _pick(_channel_stats, x.size)(x, _splits(n, c, s), m64, v64)
    _finish_stats(x, m64, v64, eps, mean, invstd, running_mean, running_var, momentum, update)


def batch_norm_train(x, eps, weight, bias, mean, invstd, running_mean, running_var, momentum,
                     update, out):
    """Training forward: :func:`batch_norm_stats`, then :func:`batch_norm_forward`
    with the batch statistics. (A kernel doing both per channel while the
    channel sits in L2 was slower, by its channel-order writes;
    docs/benchmarks.md.)"""
    batch_norm_stats(x, eps, mean, invstd, running_mean, running_var, momentum, update)
    return batch_norm_forward(x, mean, invstd, weight, bias, out)


def _finish_stats(x, m64, v64, eps, mean, invstd, running_mean, running_var, momentum, update):
    mean[:] = m64
    invstd[:] = 1.0 / np.sqrt(v64 + eps)
    if update:
        count = x.shape[0] * x.shape[2]
        unbiased = v64 * (count / (count - 1))
        running_mean[:] = (1.0 - momentum) * running_mean + momentum * m64
        running_var[:] = (1.0 - momentum) * running_var + momentum * unbiased


def batch_norm_invstd(var, eps, invstd):
    """``invstd = 1 / sqrt(var + eps)`` per channel (evaluation mode)."""
    invstd[:] = 1.0 / np.sqrt(var.astype(np.float64) + eps)


def batch_norm_forward(x, mean, invstd, weight, bias, out):
    """``out = (x - mean[c]) * invstd[c] * weight[c] + bias[c]``, (n, c, s)."""
    if x.size:
        scale = (invstd * weight).astype(x.dtype)
        if x.shape[2] == 1:
            n, c = x.shape[:2]
            _pick(_column_affine, x.size)(x.reshape(n, c), mean, scale, bias, out.reshape(n, c))
        else:
            _pick(_channel_affine, x.size)(x, mean, scale, bias, out)
    return out


def batch_norm_backward(x, g, mean, invstd, weight, training, dx, dweight, dbias):
    """Gradients of batch norm for upstream ``g`` (n, c, s): ``dx``, and the
    per-channel ``dweight`` = sum g * xhat and ``dbias`` = sum g. In
    training the statistics are the batch's (``mean``, ``invstd`` from
    :func:`batch_norm_stats`) and ``dx`` carries their dependence on x:
    ``dx = w invstd (g - mean(g) - xhat mean(g xhat))``; in evaluation they
    are constants and ``dx = w invstd g``."""
    n, c, s = x.shape
    if x.size == 0:
        dweight[:] = 0
        dbias[:] = 0
        return dx
    sg = np.empty(c)
    sgx = np.empty(c)
    if s == 1:
        _pick(_column_grad_sums, x.size)(x.reshape(n, c), g.reshape(n, c), mean,
                                         _column_splits(n, c), sg, sgx)
    else:
        _pick(_channel_grad_sums, x.size)(x, g, mean, _splits(n, c, s), sg, sgx)
    inv = invstd.astype(np.float64)
    w = weight.astype(np.float64)
    alpha = w * inv
    if training:
        count = n * s
        beta = -alpha * inv * inv * sgx / count
        gamma = -alpha * sg / count
    else:
        beta = np.zeros(c)
        gamma = np.zeros(c)
    dweight[:] = sgx * inv
    dbias[:] = sg
    t = x.dtype
    coefs = (mean, alpha.astype(t), beta.astype(t), gamma.astype(t))
    if s == 1:
        _pick(_column_dx, x.size)(x.reshape(n, c), g.reshape(n, c), *coefs, dx.reshape(n, c))
    else:
        _pick(_channel_dx, x.size)(x, g, *coefs, dx)
    return dx


@_twins(FASTMATH_REDUCE)
def _channel_stats(x, nsplit, mean, var):
    n, c, s = x.shape
    cnt = np.empty((nsplit, c))
    mu = np.empty((nsplit, c))
    m2 = np.empty((nsplit, c))
    for blk in prange(nsplit * c):
        k = blk // c
        ch = blk - k * c
        bc = 0.0
        bm = 0.0
        bq = 0.0
        for i in range(k * n // nsplit, (k + 1) * n // nsplit):
            pm, q = _plane_moments(x[i, ch])
            bc, bm, bq = _chan_merge(bc, bm, bq, float(s), pm, q)
        cnt[k, ch] = bc
        mu[k, ch] = bm
        m2[k, ch] = bq
    for ch in range(c):  # c x nsplit merges: less than a parallel region's start-up
        bc = 0.0
        bm = 0.0
        bq = 0.0
        for k in range(nsplit):
            bc, bm, bq = _chan_merge(bc, bm, bq, cnt[k, ch], mu[k, ch], m2[k, ch])
        mean[ch] = bm
        var[ch] = bq / bc


@njit(inline="always")
def _plane_moments(p):
    """``(mean, M2)`` of one plane in float64 (corrected two-pass)."""
    s = p.size
    pc = p.dtype.type(_sum(p) / s)
    s1, s2 = _deviations(p, pc)
    pm = pc + s1 / s
    return pm, max(s2 - s * (pm - pc) ** 2, 0.0)


@njit(inline="always")
def _chan_merge(na, ma, qa, nb, mb, qb):
    # Chan, Golub and LeVeque's pairwise update: (count, mean, M2) of the
    # union of two sets, without the cancellation of sum(x^2) - n mean^2
    if nb == 0.0:
        return na, ma, qa
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), qa + qb + delta * delta * (na * nb / n)


@_twins(FASTMATH)
def _channel_affine(x, mean, scale, bias, out):
    n, c, s = x.shape
    for p in prange(n * c):
        i = p // c
        ch = p - i * c
        m = mean[ch]
        k = scale[ch]
        b = bias[ch]
        xp = x[i, ch]
        op = out[i, ch]
        for j in range(s):
            op[j] = (xp[j] - m) * k + b


@_twins(FASTMATH_REDUCE)
def _channel_grad_sums(x, g, mean, nsplit, sg, sgx):
    n, c, s = x.shape
    pg = np.empty((nsplit, c))
    pgx = np.empty((nsplit, c))
    for blk in prange(nsplit * c):
        k = blk // c
        ch = blk - k * c
        m = mean[ch]
        a = 0.0
        b = 0.0
        for i in range(k * n // nsplit, (k + 1) * n // nsplit):
            xp = x[i, ch]
            gp = g[i, ch]
            for j in range(s):
                a += gp[j]
                b += gp[j] * (xp[j] - m)
        pg[k, ch] = a
        pgx[k, ch] = b
    for ch in range(c):
        a = 0.0
        b = 0.0
        for k in range(nsplit):
            a += pg[k, ch]
            b += pgx[k, ch]
        sg[ch] = a
        sgx[ch] = b


@_twins(FASTMATH)
def _channel_dx(x, g, mean, alpha, beta, gamma, dx):
    n, c, s = x.shape
    for p in prange(n * c):
        i = p // c
        ch = p - i * c
        m = mean[ch]
        a = alpha[ch]
        b = beta[ch]
        e = gamma[ch]
        xp = x[i, ch]
        gp = g[i, ch]
        dp = dx[i, ch]
        for j in range(s):
            dp[j] = gp[j] * a + (xp[j] - m) * b + e


# 2-D input (n, c): channels are the contiguous axis, so the loops run over
# rows with the channel loop innermost (vectorized across channels)


@_twins(FASTMATH_REDUCE)
def _column_stats(x, nsplit, mean, var):
    n, c = x.shape
    mu = np.zeros((nsplit, c))
    m2 = np.zeros((nsplit, c))
    cnt = np.empty(nsplit)
    for k in prange(nsplit):
        r0 = k * n // nsplit
        r1 = (k + 1) * n // nsplit
        bm = mu[k]
        bq = m2[k]
        for i in range(r0, r1):
            xi = x[i]
            for ch in range(c):
                bm[ch] += xi[ch]
        for ch in range(c):
            bm[ch] /= r1 - r0
        for i in range(r0, r1):  # the block is still in cache
            xi = x[i]
            for ch in range(c):
                e = xi[ch] - bm[ch]
                bq[ch] += e * e
        cnt[k] = r1 - r0
    for ch in range(c):
        bc = 0.0
        bm_ = 0.0
        bq_ = 0.0
        for k in range(nsplit):
            bc, bm_, bq_ = _chan_merge(bc, bm_, bq_, cnt[k], mu[k, ch], m2[k, ch])
        mean[ch] = bm_
        var[ch] = bq_ / bc


@_twins(FASTMATH)
def _column_affine(x, mean, scale, bias, out):
    n, c = x.shape
    for i in prange(n):
        xi = x[i]
        oi = out[i]
        for ch in range(c):
            oi[ch] = (xi[ch] - mean[ch]) * scale[ch] + bias[ch]


@_twins(FASTMATH_REDUCE)
def _column_grad_sums(x, g, mean, nsplit, sg, sgx):
    n, c = x.shape
    pg = np.zeros((nsplit, c))
    pgx = np.zeros((nsplit, c))
    for k in prange(nsplit):
        a = pg[k]
        b = pgx[k]
        for i in range(k * n // nsplit, (k + 1) * n // nsplit):
            xi = x[i]
            gi = g[i]
            for ch in range(c):
                a[ch] += gi[ch]
                b[ch] += gi[ch] * (xi[ch] - mean[ch])
    for ch in range(c):
        sg[ch] = 0.0
        sgx[ch] = 0.0
    for k in range(nsplit):
        for ch in range(c):
            sg[ch] += pg[k, ch]
            sgx[ch] += pgx[k, ch]


@_twins(FASTMATH)
def _column_dx(x, g, mean, alpha, beta, gamma, dx):
    n, c = x.shape
    for i in prange(n):
        xi = x[i]
        gi = g[i]
        di = dx[i]
        for ch in range(c):
            di[ch] = gi[ch] * alpha[ch] + (xi[ch] - mean[ch]) * beta[ch] + gamma[ch]
