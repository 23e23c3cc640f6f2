"""CPU kernels of scaled_dot_product_attention: a tiled, online-softmax
("flash") forward and a recomputing backward.

Forward. Work is split into tasks (batch*head ``b``, tile of BQ queries),
run by ``prange`` over chunks of interleaved tasks (causal tiles differ in
cost; interleaving balances them). Everything is computed *transposed*,
queries along the vector lanes:

* ``St = K_tile @ (scale * Q_tile)^T`` (BK keys x BQ queries): the GEMM
  register-tile micro-kernel of :mod:`nbops.cpu.linalg` (8 x 32 float32,
  8 x 16 float64, 16 zmm accumulators, FMAs), with K packed once per call
  into MR-key slivers ``Kp[b, sliver, d, i]`` and the scaled Q tile into
  NR-query slivers ``Qp[jr, d, j]``.
* Online softmax down the key axis of ``St``: per query lane a running
  maximum ``m`` and sum ``l``, each key row one vector max, one vector
  ``exp`` (the branch-free :func:`nbops.cpu._approx.exp_nonpos`: every
  argument here is a score minus a maximum, never positive) and one add;
  the correction ``alpha = exp(m_old - m_new)`` is a vector too.
* ``Ot = alpha * Ot + V_tile^T @ P^T`` (Dv x BQ), the same micro-kernel with
  V packed per key tile ``Vp[b, tile, dv sliver, key, i]`` and ``St``
  itself as the packed right operand.

Extra memory: the packed K and V (the size of K and V) and per thread
O(BQ * (D + Dv + BK)); never the L x S matrix. Causal (top-left aligned:
query i sees keys j <= i) stops at the tile holding key ``q_last`` and
masks inside that tile only. A row whose every key is masked keeps
``m = -inf`` and ``l = 0``; it is written as zeros (PyTorch's
``_safe_softmax``), and its log-sum-exp as ``-inf``.

Backward (``backward``): the flash-attention formulas with recomputation,
``prange`` over batch*head: per query row the log-sum-exp ``lse`` (a
statistics-only run of the forward) and ``Di = dO . O``; per key block
and query row ``P = exp(S - lse)``, ``dV += P dO``, ``dS = P (dO.V - Di)``,
``dK += dS Q``, ``dQ += dS K``: O(1) extra memory per task.

Operands arrive as flat buffers plus element strides and per-batch element
offsets (as the GEMM's), so transposed, sliced and broadcast inputs are read
in place. The mask, when present, is an additive float mask in the same form.
"""

import math

import numpy as np
from numba import get_num_threads, prange
from numba.extending import register_jitable

from .._codegen import bind, per_dtype
from .._jit import FASTMATH_REDUCE, cpu_kernel
from .._tunables import ATTENTION_TASKS_PER_THREAD as TASKS_PER_THREAD
from . import linalg as _linalg
from ._approx import exp_nonpos
from ._regtile import prefer_wide_vectors as _prefer_wide_vectors

__all__ = ["forward", "backward", "bool_to_additive"]


def forward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
            mbuf, offm, smr, smc, causal, scale, out, lse, L, S, D, Dv, BQ=64, BK=64):
    """``out[b] = softmax(scale * Q_b K_b^T + mask_b) V_b`` for each batch b.

    ``out`` is C-contiguous (N, L, Dv); ``lse`` is (N, L) or empty: when it
    has elements, only the per-row log-sum-exp is computed (the backward's
    statistics pass) and ``out`` is left alone. ``mbuf`` is empty for no
    mask. BQ must be a multiple of the register tile's NR, BK of its MR.
    """
    N = offq.shape[0]
    if N == 0 or L == 0:
        return out
    if S == 0 or Dv == 0:
        if lse.size:
            lse[:] = -np.inf
        else:
            out[:] = 0
        return out
    dt = np.dtype(out.dtype)
    mr, nr = _linalg.TILES[dt]
    BQ = max(nr, (int(BQ) + nr - 1) // nr * nr)
    BK = max(mr, (int(BK) + mr - 1) // mr * mr)
    threads = get_num_threads()
    cst = (dt.type(0), dt.type(-np.inf), dt.type(scale))
    _drivers(dt)(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
                 mbuf, offm, smr, smc, bool(causal), out.reshape(-1), lse.reshape(-1),
                 L, S, D, Dv, BQ, BK, threads, cst)
    return out


def backward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
             mbuf, offm, smr, smc, causal, scale, out, grad, dq, dk, dv, L, S, D, Dv,
             BQ=64, BK=64):
    """Gradients of :func:`forward` with respect to q, k and v, written to
    the C-contiguous ``dq`` (N, L, D), ``dk`` (N, S, D), ``dv`` (N, S, Dv),
    from the forward's output ``out`` and its gradient ``grad`` (both
    C-contiguous (N, L, Dv)). Nothing of size L x S is stored."""
    N = offq.shape[0]
    dq[:] = 0
    dk[:] = 0
    dv[:] = 0
    if N == 0 or L == 0 or S == 0:
        return dq, dk, dv
    lse = np.empty((N, L), out.dtype)
    forward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
            mbuf, offm, smr, smc, causal, scale, out, lse, L, S, D, Dv, BQ, BK)
    dt = np.dtype(out.dtype)
    _backward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
              mbuf, offm, smr, smc, bool(causal), out, grad, lse, dq, dk, dv,
              L, S, D, Dv, max(1, int(BK)), (dt.type(0), dt.type(-np.inf), dt.type(scale)))
    return dq, dk, dv


def bool_to_additive(mask, out):
    """``out = where(mask, 0, -inf)`` over two flat arrays of one size."""
    if out.size:
        _bool_to_additive(mask, out)
    return out


@cpu_kernel(parallel=True)
def _bool_to_additive(mask, out):
    for i in prange(out.size):
        out[i] = 0 if mask[i] else -np.inf


# ---------------------------------------------------------------------------
# Forward: templates bound per register tile (MR, NR, micro-kernel as frozen
# globals, as nbops.cpu.linalg does: closures would break the disk cache)

MR = NR = 0
_micro = _online = None


@register_jitable
def _pack_k(kbuf, o, skr, skc, S, D, mr, kp, z):
    """kp[sl, d, i] = K[sl*mr + i, d]; keys past S are zero."""
    for sl in range(kp.shape[0]):
        for d in range(D):
            for i in range(mr):
                s = sl * mr + i
                kp[sl, d, i] = kbuf[o + s * skr + d * skc] if s < S else z


@register_jitable
def _pack_v(vbuf, o, svr, svc, S, Dv, mr, BK, vp, z):
    """vp[t, ds, s, i] = V[t*BK + s, ds*mr + i]; outside V is zero."""
    for t in range(vp.shape[0]):
        for ds in range(vp.shape[1]):
            for s in range(BK):
                for i in range(mr):
                    r = t * BK + s
                    c = ds * mr + i
                    vp[t, ds, s, i] = vbuf[o + r * svr + c * svc] if r < S and c < Dv else z


def _online_t(blk, kv, s0, qbase, L, causal, has_mask, mbuf, mo, smr, smc,
              m, l, al, mu, acc, cst):
    # One key tile of the online softmax for NR query lanes: blk (kv x NR)
    # holds the scores and leaves holding P; m, l, al (the correction
    # factor), mu (the shift used) and acc are the lanes' state.
    _prefer_wide_vectors()
    zero, ninf = cst[0], cst[1]
    # the lane count as a runtime value (it is NR): a constant trip count is
    # unrolled before vectorization, and LLVM, unable to rule out that the
    # lane arrays alias the block, then keeps every lane scalar; a counted
    # loop is vectorized with one runtime overlap check
    nr = blk.shape[1]
    if has_mask:
        for s in range(kv):
            row = blk[s]
            for j in range(nr):
                q = min(qbase + j, L - 1)
                row[j] += mbuf[mo + q * smr + (s0 + s) * smc]
    if causal and s0 + kv - 1 > qbase:
        for s in range(kv):
            row = blk[s]
            for j in range(nr):
                row[j] = row[j] if s0 + s <= qbase + j else ninf
    for j in range(nr):
        acc[j] = m[j]
    for s in range(kv):
        row = blk[s]
        for j in range(nr):
            acc[j] = row[j] if row[j] > acc[j] else acc[j]
    for j in range(nr):
        mn = acc[j]
        # a lane with no visible key yet shifts by 0: exp(-inf - 0) = 0, not NaN
        u = mn if mn > ninf else zero
        al[j] = exp_nonpos(m[j] - u)
        m[j] = mn
        mu[j] = u
        acc[j] = zero
    for s in range(kv):
        row = blk[s]
        for j in range(nr):
            p = exp_nonpos(row[j] - mu[j])
            row[j] = p
            acc[j] += p
    for j in range(nr):
        l[j] = l[j] * al[j] + acc[j]


def _task_t(b, qt, qbuf, offq, sqr, sqc, kp, vp, mbuf, offm, smr, smc, causal, outf, lsef,
            L, S, D, Dv, Dvp, BQ, BK, qp, st, ot, m, l, al, mu, acc, cst):
    zero, ninf, scale = cst[0], cst[1], cst[2]
    q0 = qt * BQ
    nq = min(BQ, L - q0)
    nqs = (nq + NR - 1) // NR
    stats = lsef.size > 0
    # runtime values, not literals: a literal argument would compile a
    # second specialisation of the shared GEMM micro-kernel
    ldc = NR + 0 * D
    first = D >= 0
    # the micro-kernel reads B as rows of a flat buffer: Q's slivers (D x NR
    # each) and the score block's (BK x NR), row stride NR
    qpf = qp.reshape(-1)
    oq = offq[b]
    for jr in range(nqs):
        for d in range(D):
            for j in range(NR):
                qi = q0 + jr * NR + j
                qp[jr, d, j] = qbuf[oq + qi * sqr + d * sqc] * scale if qi < L else zero
    for i in range(nqs * NR):
        m[i] = ninf
        l[i] = zero
    if not stats:
        for i in range(nqs * Dvp * NR):
            ot[i] = zero
    st3 = st.reshape((BQ // NR, BK, NR))
    kend = min(S, q0 + nq) if causal else S
    has_mask = mbuf.size > 0
    mo = offm[b] if has_mask else 0
    for kt in range((kend + BK - 1) // BK):
        s0 = kt * BK
        kv = min(BK, kend - s0)
        for ks in range((kv + MR - 1) // MR):
            ksl = kp[b, (s0 // MR) + ks]
            for jr in range(nqs):
                _micro(D, ksl, qpf, jr * D * NR, ldc, st, jr * BK * NR + ks * MR * NR, ldc, first)
        for jr in range(nqs):
            a = jr * NR
            _online(st3[jr], kv, s0, q0 + a, L, causal, has_mask, mbuf, mo, smr, smc,
                    m[a:a + NR], l[a:a + NR], al[a:a + NR], mu[a:a + NR], acc, cst)
        if stats:
            continue
        # the lane count from the block's shape, a runtime value (see _online_t)
        nrt = st3.shape[2]
        for jr in range(nqs):
            alpha = al[jr * NR:jr * NR + NR]
            for d in range(Dvp):
                row = ot[(jr * Dvp + d) * NR:(jr * Dvp + d) * NR + NR]
                for j in range(nrt):
                    row[j] *= alpha[j]
        for ds in range(Dvp // MR):
            vsl = vp[b, kt, ds]
            for jr in range(nqs):
                _micro(kv, vsl, st, jr * BK * NR, ldc, ot, jr * Dvp * NR + ds * MR * NR, ldc,
                       not first)
    if stats:
        for i in range(nq):
            lsef[b * L + q0 + i] = m[i] + math.log(l[i]) if l[i] > zero else ninf
        return
    for i in range(nq):
        inv = 1 / l[i] if l[i] > zero else zero
        jr = i // NR
        j = i - jr * NR
        base = (b * L + q0 + i) * Dv
        for d in range(Dv):
            outf[base + d] = ot[(jr * Dvp + d) * NR + j] * inv


def _driver_t(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
              mbuf, offm, smr, smc, causal, outf, lsef, L, S, D, Dv, BQ, BK, nthreads, cst):
    N = offq.shape[0]
    dt = outf.dtype
    nkt = (S + BK - 1) // BK
    Dvp = (Dv + MR - 1) // MR * MR
    kp = np.empty((N, nkt * BK // MR, D, MR), dt)
    stats = lsef.size > 0
    vp = np.empty((N, nkt if not stats else 0, Dvp // MR, BK, MR), dt)
    for b in prange(N):
        _pack_k(kbuf, offk[b], skr, skc, S, D, MR, kp[b], cst[0])
        if not stats:
            _pack_v(vbuf, offv[b], svr, svc, S, Dv, MR, BK, vp[b], cst[0])
    nqt = (L + BQ - 1) // BQ
    ntask = N * nqt
    nchunks = min(ntask, TASKS_PER_THREAD * nthreads)
    for c in prange(nchunks):
        qp = np.empty((BQ // NR, D, NR), dt)
        st = np.empty(BQ * BK, dt)
        ot = np.empty(BQ * Dvp, dt)
        m = np.empty(BQ, dt)
        l = np.empty(BQ, dt)
        al = np.empty(BQ, dt)
        mu = np.empty(BQ, dt)
        acc = np.empty(NR, dt)
        for t in range(c, ntask, nchunks):
            _task(t // nqt, t % nqt, qbuf, offq, sqr, sqc, kp, vp, mbuf, offm, smr, smc,
                  causal, outf, lsef, L, S, D, Dv, Dvp, BQ, BK, qp, st, ot, m, l, al, mu,
                  acc, cst)


@per_dtype
def _drivers(dt):
    """The forward driver for ``dt``'s register tile, built on first use."""
    mr, nr, scope = _linalg.tile_scope(globals(), dt)
    scope["_online"] = cpu_kernel(bind(_online_t, scope, f"attn_online_{mr}x{nr}"))
    scope["_task"] = register_jitable(bind(_task_t, scope, f"attn_task_{mr}x{nr}"))
    return cpu_kernel(bind(_driver_t, scope, f"attn_fwd_{mr}x{nr}"), parallel=True)


# ---------------------------------------------------------------------------
# Backward


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _backward(qbuf, offq, sqr, sqc, kbuf, offk, skr, skc, vbuf, offv, svr, svc,
              mbuf, offm, smr, smc, causal, out, grad, lse, dq, dk, dv,
              L, S, D, Dv, BK, cst):
    zero, ninf, scale = cst[0], cst[1], cst[2]
    N = offq.shape[0]
    has_mask = mbuf.size > 0
    for b in prange(N):
        di = np.empty(L, out.dtype)
        lu = np.empty(L, out.dtype)
        for q in range(L):
            acc = zero
            for d in range(Dv):
                acc += grad[b, q, d] * out[b, q, d]
            di[q] = acc
            # a fully masked row has lse = -inf and P = 0: shift by 0, not -inf
            lu[q] = lse[b, q] if lse[b, q] > ninf else zero
        oq, ok, ov = offq[b], offk[b], offv[b]
        mo = offm[b] if has_mask else 0
        for s0 in range(0, S, BK):
            s1 = min(S, s0 + BK)
            for q in range(s0 if causal else 0, L):
                qo = oq + q * sqr
                send = min(s1, q + 1) if causal else s1
                for s in range(s0, send):
                    ko = ok + s * skr
                    vo = ov + s * svr
                    sc = zero
                    for d in range(D):
                        sc += qbuf[qo + d * sqc] * kbuf[ko + d * skc]
                    sc *= scale
                    if has_mask:
                        sc += mbuf[mo + q * smr + s * smc]
                    p = exp_nonpos(sc - lu[q])
                    dp = zero
                    for d in range(Dv):
                        dp += grad[b, q, d] * vbuf[vo + d * svc]
                    for d in range(Dv):
                        dv[b, s, d] += p * grad[b, q, d]
                    ds = p * (dp - di[q]) * scale
                    for d in range(D):
                        dk[b, s, d] += ds * qbuf[qo + d * sqc]
                        dq[b, q, d] += ds * kbuf[ko + d * skc]
