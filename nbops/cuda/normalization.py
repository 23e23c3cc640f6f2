"""CUDA kernels of batch norm, layer norm and RMS norm.

Reductions run one block per row (layer/RMS norm) or per channel (batch
norm), blocks walking rows or channels with a grid-stride loop; each thread
accumulates its strided share in float64 and the block combines the shares
with a shared-memory tree. Layer norm takes two passes over its row (mean,
then squared deviations from it); batch norm keeps a Welford (count, mean,
M2) per thread and merges them pairwise with Chan's formula, so neither
forms ``E[x^2] - E[x]^2``. Elementwise steps (normalise, input gradient)
are grid-stride loops with per-channel coefficients. Loads are widened with
``float64()`` before they meet an accumulator (the simulator would otherwise
keep float32 arithmetic: NumPy treats the Python-float accumulator as weak).
Entry points have the CPU module's signatures; launch sizes come from :mod:`nbops.cuda._launch`.
"""

import math

import numpy as np
from numba import cuda, float64

from .. import _tunables
from ._launch import SIMULATED, THREADS, grid_1d

__all__ = ["norm_rows", "norm_rows_backward", "batch_norm_stats", "batch_norm_invstd",
           "batch_norm_forward", "batch_norm_train", "batch_norm_backward"]

# every reduction kernel runs blocks of exactly THREADS (a power of two)
# threads: its shared arrays are sized by it at compile time
_T = THREADS


#: Rows per partial sum of the weight and bias gradients: one thread per
#: (row chunk, column) keeps the grid full when rows are many and columns few.
ROW_CHUNK = 4 if SIMULATED else _tunables.CUDA_NORM_ROW_CHUNK


def _blocks(n):
    """Launch with one block per item (row or channel), capped by the helper."""
    return grid_1d(max(n, 1) * _T, _T)


# ---------------------------------------------------------------------------
# Rows: layer norm and RMS norm


def norm_rows(x, w, b, eps, centered, out):
    rows, d = x.shape
    if rows and d:
        _rows_forward[_blocks(rows)](x, w, b, float(eps), bool(centered), out)
    return out


def norm_rows_backward(x, g, w, eps, centered, dx, dw, db):
    rows, d = x.shape
    stats = cuda.device_array((2, max(rows, 1)), np.float64)
    if rows and d:
        _rows_backward[_blocks(rows)](x, g, w, float(eps), bool(centered), dx, stats)
    if d:
        chunks = max(1, -(-rows // ROW_CHUNK))
        part = cuda.device_array((2, chunks, d), np.float64)
        _rows_param_partials[grid_1d(chunks * d)](x, g, stats, part)
        _sum_partials[grid_1d(d)](part, dw, db)
    return dx


@cuda.jit(device=True)
def _block_sum(sh, v):
    """Sum of ``v`` over the block's threads, returned to every thread."""
    t = cuda.threadIdx.x
    sh[t] = v
    cuda.syncthreads()
    h = _T // 2
    while h > 0:
        if t < h:
            sh[t] += sh[t + h]
        cuda.syncthreads()
        h //= 2
    total = sh[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _row_stats(sh, x, r, eps, centered):
    t = cuda.threadIdx.x
    d = x.shape[1]
    mean = 0.0
    if centered:
        s = 0.0
        for j in range(t, d, _T):
            s += float64(x[r, j])
        mean = _block_sum(sh, s) / d
    q = 0.0
    for j in range(t, d, _T):
        e = float64(x[r, j]) - mean
        q += e * e
    return mean, 1.0 / math.sqrt(_block_sum(sh, q) / d + eps)


@cuda.jit
def _rows_forward(x, w, b, eps, centered, out):
    sh = cuda.shared.array(_T, float64)
    rows, d = x.shape
    t = cuda.threadIdx.x
    for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
        mean, rstd = _row_stats(sh, x, r, eps, centered)
        for j in range(t, d, _T):
            out[r, j] = (x[r, j] - mean) * rstd * w[j] + b[j]


@cuda.jit
def _rows_backward(x, g, w, eps, centered, dx, stats):
    sh = cuda.shared.array(_T, float64)
    rows, d = x.shape
    t = cuda.threadIdx.x
    for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
        mean, rstd = _row_stats(sh, x, r, eps, centered)
        sg = 0.0
        sgx = 0.0
        for j in range(t, d, _T):
            gy = float64(g[r, j]) * w[j]
            sg += gy
            sgx += gy * (float64(x[r, j]) - mean) * rstd
        sg = _block_sum(sh, sg)
        sgx = _block_sum(sh, sgx)
        a = sg / d if centered else 0.0
        k = sgx / d
        for j in range(t, d, _T):
            dx[r, j] = rstd * (g[r, j] * w[j] - a - (x[r, j] - mean) * rstd * k)
        if t == 0:
            stats[0, r] = mean
            stats[1, r] = rstd


@cuda.jit
def _rows_param_partials(x, g, stats, part):
    # thread k: column k % d of row chunk k // d; neighbouring threads read
    # neighbouring columns (coalesced)
    rows, d = x.shape
    chunks = part.shape[1]
    for k in range(cuda.grid(1), chunks * d, cuda.gridsize(1)):
        c = k // d
        j = k - c * d
        sw = 0.0
        sb = 0.0
        for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK)):
            gv = float64(g[r, j])
            sw += gv * (x[r, j] - stats[0, r]) * stats[1, r]
            sb += gv
        part[0, c, j] = sw
        part[1, c, j] = sb


@cuda.jit
def _sum_partials(part, dw, db):
    chunks, d = part.shape[1], part.shape[2]
    for j in range(cuda.grid(1), d, cuda.gridsize(1)):
        sw = 0.0
        sb = 0.0
        for c in range(chunks):
            sw += part[0, c, j]
            sb += part[1, c, j]
        dw[j] = sw
        db[j] = sb


# ---------------------------------------------------------------------------
# Channels: batch norm


def batch_norm_stats(x, eps, mean, invstd, running_mean, running_var, momentum, update):
    c = x.shape[1]
    _channel_stats[_blocks(c)](x, float(eps), mean, invstd, running_mean, running_var,
                               float(momentum), bool(update))


def batch_norm_invstd(var, eps, invstd):
    _invstd[grid_1d(var.shape[0])](var, float(eps), invstd)


def batch_norm_forward(x, mean, invstd, weight, bias, out):
    if x.size:
        _channel_affine[grid_1d(x.size)](x, mean, invstd, weight, bias, out)
    return out


def batch_norm_train(x, eps, weight, bias, mean, invstd, running_mean, running_var, momentum,
                     update, out):
    batch_norm_stats(x, eps, mean, invstd, running_mean, running_var, momentum, update)
    return batch_norm_forward(x, mean, invstd, weight, bias, out)


def batch_norm_backward(x, g, mean, invstd, weight, training, dx, dweight, dbias):
    c = x.shape[1]
    coef = cuda.device_array((3, c), np.float64)
    _channel_grad_sums[_blocks(c)](x, g, mean, invstd, weight, bool(training), coef,
                                   dweight, dbias)
    if x.size:
        _channel_dx[grid_1d(x.size)](x, g, mean, coef, dx)
    return dx


@cuda.jit
def _channel_stats(x, eps, mean, invstd, rmean, rvar, momentum, update):
    sc = cuda.shared.array(_T, float64)
    sm = cuda.shared.array(_T, float64)
    sq = cuda.shared.array(_T, float64)
    n, c, s = x.shape
    total = n * s
    t = cuda.threadIdx.x
    for ch in range(cuda.blockIdx.x, c, cuda.gridDim.x):
        cnt = 0.0
        mu = 0.0
        m2 = 0.0
        for k in range(t, total, _T):  # Welford over this thread's share
            i = k // s
            v = float64(x[i, ch, k - i * s])
            cnt += 1.0
            dl = v - mu
            mu += dl / cnt
            m2 += dl * (v - mu)
        sc[t] = cnt
        sm[t] = mu
        sq[t] = m2
        cuda.syncthreads()
        h = _T // 2
        while h > 0:
            if t < h and sc[t + h] > 0.0:  # Chan's pairwise merge
                na = sc[t]
                nb = sc[t + h]
                nt = na + nb
                dl = sm[t + h] - sm[t]
                sm[t] = sm[t] + dl * (nb / nt)
                sq[t] = sq[t] + sq[t + h] + dl * dl * (na * nb / nt)
                sc[t] = nt
            cuda.syncthreads()
            h //= 2
        if t == 0:
            var = sq[0] / sc[0]
            mean[ch] = sm[0]
            invstd[ch] = 1.0 / math.sqrt(var + eps)
            if update:
                rmean[ch] = (1.0 - momentum) * rmean[ch] + momentum * sm[0]
                rvar[ch] = (1.0 - momentum) * rvar[ch] + momentum * (var * total / (total - 1))
        cuda.syncthreads()


@cuda.jit
def _invstd(var, eps, invstd):
    for i in range(cuda.grid(1), var.shape[0], cuda.gridsize(1)):
        invstd[i] = 1.0 / math.sqrt(var[i] + eps)


@cuda.jit
def _channel_affine(x, mean, invstd, w, b, out):
    n, c, s = x.shape
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = k // (c * s)
        rest = k - i * c * s
        ch = rest // s
        j = rest - ch * s
        out[i, ch, j] = (x[i, ch, j] - mean[ch]) * (invstd[ch] * w[ch]) + b[ch]


@cuda.jit
def _channel_grad_sums(x, g, mean, invstd, w, training, coef, dweight, dbias):
    sh = cuda.shared.array(_T, float64)
    n, c, s = x.shape
    total = n * s
    t = cuda.threadIdx.x
    for ch in range(cuda.blockIdx.x, c, cuda.gridDim.x):
        m = float64(mean[ch])
        a = 0.0
        b = 0.0
        for k in range(t, total, _T):
            i = k // s
            j = k - i * s
            gv = float64(g[i, ch, j])
            a += gv
            b += gv * (x[i, ch, j] - m)
        a = _block_sum(sh, a)
        b = _block_sum(sh, b)
        if t == 0:
            inv = float64(invstd[ch])
            alpha = w[ch] * inv
            coef[0, ch] = alpha
            coef[1, ch] = -alpha * inv * inv * b / total if training else 0.0
            coef[2, ch] = -alpha * a / total if training else 0.0
            dweight[ch] = b * inv
            dbias[ch] = a


@cuda.jit
def _channel_dx(x, g, mean, coef, dx):
    # dx = g alpha + (x - mean) beta + gamma, the coefficients per channel
    n, c, s = x.shape
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        i = k // (c * s)
        rest = k - i * c * s
        ch = rest // s
        j = rest - ch * s
        dx[i, ch, j] = (g[i, ch, j] * coef[0, ch] + (x[i, ch, j] - mean[ch]) * coef[1, ch]
                        + coef[2, ch])
