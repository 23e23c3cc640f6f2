"""CUDA kernels of scaled_dot_product_attention: forward with online softmax,
backward by recomputation.

Forward: one block per (tile of TQ queries, batch*head), one thread per
query row, holding its scaled query and its output accumulator in local
memory (head dimensions up to MAXD). Keys and values stream through shared
memory TK rows at a time, loaded by the whole block; each thread scores
its row against the tile, updates its running maximum and sum and rescales
its accumulator once per tile. Causal blocks stop after the tile holding
their last query's diagonal key. A row whose every key is masked is
written as zeros (PyTorch's ``_safe_softmax``); its log-sum-exp is -inf.
With a non-empty ``lse`` the kernel only computes the per-row
log-sum-exp (the backward's statistics pass).

Backward: one block per (tile of TK keys, batch*head), one thread per key
row with its k and v rows and its dK, dV accumulators in local memory;
queries, their output gradients, log-sum-exp and ``Di = dO . O`` stream
through shared memory TQ rows at a time. ``dQ`` gathers contributions from
every key block through atomic adds. Nothing of size L x S is stored.

Operands have the CPU kernels' form: flat buffers, element strides and
per-batch element offsets (host arrays, copied to the device here).
"""

import math

import numpy as np
from numba import cuda, float32, float64

from ._launch import SIMULATED, grid_1d

__all__ = ["forward", "backward", "bool_to_additive"]

#: Largest head dimension (per-thread local arrays are this long).
MAXD = 256
#: Query rows per block (threads of the forward) and per staged tile of the
#: backward; key rows per staged tile of the forward and per block (threads)
#: of the backward. Shared tiles are TK x MAXD: 16 KiB (float64) at TK = 4.
TQ, TK = (4, 4) if SIMULATED else (64, 8)
#: Threads of the backward (one per key row), rows of its staged query tile.
TS, TQB = (4, 4) if SIMULATED else (64, 8)
#: Most blocks along the batch axis; kernels stride over the rest.
MAX_GRID_Y = 3 if SIMULATED else 65535


def _make_forward(nbtype):
    @cuda.jit
    def attention_forward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
                          mbuf, offm, smr, smc, causal, out, lse, L, S, D, Dv, cst):
        ks = cuda.shared.array((TK, MAXD), nbtype)
        vs = cuda.shared.array((TK, MAXD), nbtype)
        qr = cuda.local.array(MAXD, nbtype)
        acc = cuda.local.array(MAXD, nbtype)
        sc = cuda.local.array(TK, nbtype)
        zero, ninf, scale = cst[0], cst[1], cst[2]
        t = cuda.threadIdx.x
        q0 = cuda.blockIdx.x * TQ
        q = q0 + t
        active = q < L
        stats = lse.size > 0
        has_mask = mbuf.size > 0
        kend = min(S, q0 + TQ) if causal else S  # the same for the whole block
        for b in range(cuda.blockIdx.y, offq.shape[0], cuda.gridDim.y):
            if active:
                for d in range(D):
                    qr[d] = qbuf[offq[b] + q * sqr + d * sqc] * scale
                for d in range(Dv):
                    acc[d] = zero
            m = ninf
            l = zero
            for s0 in range(0, kend, TK):
                for e in range(t, TK * D, TQ):
                    r = e // D
                    c = e - r * D
                    ks[r, c] = kbuf[offk[b] + (s0 + r) * skr + c * skc] if s0 + r < S else zero
                if not stats:
                    for e in range(t, TK * Dv, TQ):
                        r = e // Dv
                        c = e - r * Dv
                        vs[r, c] = vbuf[offv[b] + (s0 + r) * svr + c * svc] \
                            if s0 + r < S else zero
                cuda.syncthreads()
                if active:
                    kv = min(TK, kend - s0)
                    mt = m
                    for j in range(kv):
                        x = zero
                        for d in range(D):
                            x += qr[d] * ks[j, d]
                        if has_mask:
                            x += mbuf[offm[b] + q * smr + (s0 + j) * smc]
                        if causal and s0 + j > q:
                            x = ninf
                        sc[j] = x
                        mt = max(mt, x)
                    # no visible key yet: shift by 0 so that exp(-inf) = 0, not NaN
                    u = mt if mt > ninf else zero
                    alpha = math.exp(m - u)
                    l *= alpha
                    if not stats:
                        for d in range(Dv):
                            acc[d] *= alpha
                    for j in range(kv):
                        p = math.exp(sc[j] - u)
                        l += p
                        if not stats:
                            for d in range(Dv):
                                acc[d] += p * vs[j, d]
                    m = mt
                cuda.syncthreads()
            if active:
                if stats:
                    lse[b * L + q] = m + math.log(l) if l > zero else ninf
                else:
                    inv = 1 / l if l > zero else zero
                    for d in range(Dv):
                        out[b, q, d] = acc[d] * inv

    return attention_forward


def _make_backward(nbtype):
    @cuda.jit
    def attention_backward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
                           mbuf, offm, smr, smc, causal, grad, lse, di, dq, dk, dv,
                           L, S, D, Dv, cst):
        qs = cuda.shared.array((TQB, MAXD), nbtype)
        gs = cuda.shared.array((TQB, MAXD), nbtype)
        ls = cuda.shared.array(TQB, nbtype)
        ds_ = cuda.shared.array(TQB, nbtype)
        kr = cuda.local.array(MAXD, nbtype)
        vr = cuda.local.array(MAXD, nbtype)
        dka = cuda.local.array(MAXD, nbtype)
        dva = cuda.local.array(MAXD, nbtype)
        zero, ninf, scale = cst[0], cst[1], cst[2]
        t = cuda.threadIdx.x
        s0 = cuda.blockIdx.x * TS
        s = s0 + t
        active = s < S
        has_mask = mbuf.size > 0
        for b in range(cuda.blockIdx.y, offq.shape[0], cuda.gridDim.y):
            if active:
                for d in range(D):
                    kr[d] = kbuf[offk[b] + s * skr + d * skc]
                    dka[d] = zero
                for d in range(Dv):
                    vr[d] = vbuf[offv[b] + s * svr + d * svc]
                    dva[d] = zero
            for qb in range(s0 if causal else 0, L, TQB):
                for e in range(t, TQB * D, TS):
                    r = e // D
                    c = e - r * D
                    qs[r, c] = qbuf[offq[b] + (qb + r) * sqr + c * sqc] if qb + r < L else zero
                for e in range(t, TQB * Dv, TS):
                    r = e // Dv
                    c = e - r * Dv
                    gs[r, c] = grad[b, qb + r, c] if qb + r < L else zero
                for r in range(t, TQB, TS):
                    lq = lse[b, qb + r] if qb + r < L else zero
                    ls[r] = lq if lq > ninf else zero  # fully masked row: P = 0
                    ds_[r] = di[b, qb + r] if qb + r < L else zero
                cuda.syncthreads()
                if active:
                    for r in range(min(TQB, L - qb)):
                        q = qb + r
                        if causal and s > q:
                            continue
                        x = zero
                        for d in range(D):
                            x += qs[r, d] * kr[d]
                        x *= scale
                        if has_mask:
                            x += mbuf[offm[b] + q * smr + s * smc]
                        p = math.exp(x - ls[r])
                        dp = zero
                        for d in range(Dv):
                            dp += gs[r, d] * vr[d]
                            dva[d] += p * gs[r, d]
                        g = p * (dp - ds_[r]) * scale
                        for d in range(D):
                            dka[d] += g * qs[r, d]
                            cuda.atomic.add(dq, (b, q, d), g * kr[d])
                cuda.syncthreads()
            if active:
                for d in range(D):
                    dk[b, s, d] = dka[d]
                for d in range(Dv):
                    dv[b, s, d] = dva[d]

    return attention_backward


@cuda.jit
def _row_dots(a, b, out):
    # out[i] = a[i, :] . b[i, :] over rows of two (rows, n) arrays
    n = a.shape[1]
    for i in range(cuda.grid(1), a.shape[0], cuda.gridsize(1)):
        acc = 0.0  # float64 accumulation, whatever the dtype
        for j in range(n):
            acc += a[i, j] * b[i, j]
        out[i] = acc


@cuda.jit
def _zero(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = 0


@cuda.jit
def _bool_to_additive(mask, out):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = 0 if mask[i] else -math.inf


_FORWARD = {np.dtype(np.float32): _make_forward(float32),
            np.dtype(np.float64): _make_forward(float64)}
_BACKWARD = {np.dtype(np.float32): _make_backward(float32),
             np.dtype(np.float64): _make_backward(float64)}


def _cst(dtype, scale):
    t = np.dtype(dtype).type
    return (t(0), t(-np.inf), t(scale))


def forward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
            mbuf, offm, smr, smc, causal, scale, out, lse, L, S, D, Dv):
    """``out[b] = softmax(scale * Q_b K_b^T + mask_b) V_b`` (``out`` C-contiguous
    (N, L, Dv)); with a non-empty ``lse`` (N*L) only the log-sum-exp rows."""
    N = offq.shape[0]
    if N == 0 or L == 0:
        return out
    grid = (math.ceil(L / TQ), min(N, MAX_GRID_Y))
    _FORWARD[np.dtype(out.dtype)][grid, TQ](
        qbuf, cuda.to_device(offq), sqr, sqc, kbuf, cuda.to_device(offk), skr, skc,
        vbuf, cuda.to_device(offv), svr, svc, mbuf, cuda.to_device(offm), smr, smc,
        bool(causal), out, lse.reshape(-1), L, S, D, Dv, _cst(out.dtype, scale))
    return out


def backward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
             mbuf, offm, smr, smc, causal, scale, out, grad, dq, dk, dv, L, S, D, Dv):
    """Gradients of :func:`forward` with respect to q, k, v into the
    C-contiguous ``dq`` (N, L, D), ``dk`` (N, S, D), ``dv`` (N, S, Dv)."""
    N = offq.shape[0]
    for x in (dq, dk, dv):
        if x.size:
            _zero[grid_1d(x.size)](x.reshape(-1))
    if N == 0 or L == 0 or S == 0:
        return dq, dk, dv
    lse = cuda.device_array((N, L), out.dtype)
    forward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
            mbuf, offm, smr, smc, causal, scale, out, lse, L, S, D, Dv)
    di = cuda.device_array((N, L), out.dtype)
    _row_dots[grid_1d(N * L)](grad.reshape(N * L, Dv), out.reshape(N * L, Dv), di.reshape(-1))
    grid = (math.ceil(S / TS), min(N, MAX_GRID_Y))
    _BACKWARD[np.dtype(out.dtype)][grid, TS](
        qbuf, cuda.to_device(offq), sqr, sqc, kbuf, cuda.to_device(offk), skr, skc,
        vbuf, cuda.to_device(offv), svr, svc, mbuf, cuda.to_device(offm), smr, smc,
        bool(causal), grad, lse, di, dq, dk, dv, L, S, D, Dv, _cst(out.dtype, scale))
    return dq, dk, dv


def bool_to_additive(mask, out):
    """``out = where(mask, 0, -inf)`` over two flat arrays of one size."""
    if out.size:
        _bool_to_additive[grid_1d(out.size)](mask, out)
    return out
