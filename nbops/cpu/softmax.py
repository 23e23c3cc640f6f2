"""CPU kernels of softmax and log_softmax, forward and backward.

The input is seen as ``(outer, n, inner)`` with the softmax axis in the
middle (C-contiguous). Two layouts, one kernel pair each:

* ``inner == 1`` (the last axis): chunks of rows per ``prange`` iteration.
  A row is read from memory once for its maximum; the exponentials are
  summed (softmax also stores them in ``out``) and the final pass scales
  ``out`` (log_softmax stores ``x - max`` and subtracts ``log(sum)``) while
  the row is still in L1/L2. So each element is read from memory once and
  written once where a row fits in cache; the later passes run at cache
  speed. A one-pass online max-and-sum would need two exponentials per
  element instead of one. The exponential pass writes a per-thread row
  buffer, and the last pass writes ``out`` from it: outputs of
  ``_memory.STREAM_BYTES`` or more with non-temporal line stores
  (``_memory.stream_rows``: no read of each output line before it is
  written, 1.1-1.25x at [65536, 512] against the cached path, whatever
  the output's alignment), smaller ones with ordinary stores in the same
  loop as the next row's maximum (the next row's loads overlap this row's
  cached stores), the next row prefetched (``llvm.prefetch``) before the
  exponential pass so that its memory traffic overlaps this row's
  arithmetic (30% faster at [65536, 512] before streaming).
* ``inner > 1`` (any other axis): blocks of ``width`` adjacent columns are
  processed together, every loop running along the unit-stride inner axis
  with per-column running maxima and sums in small scratch vectors, so
  nothing is transposed; ``width`` is chosen so that ``n x width`` elements
  stay in L2 between the passes.

The flag ``log`` selects log_softmax in each kernel. Exponentials are
:func:`nbops.cpu._approx.exp_nonpos` (their arguments ``x - max`` are never
positive; 20% cheaper per element than the full-range ``exp``, results below
the normal range flushed to 0); sums accumulate in float64
(along rows: in the input's type within blocks of ``SUM_BLOCK`` elements,
spread over the vector lanes, then in float64 across blocks).
A row whose maximum is -inf (all -inf) gives NaN everywhere, as PyTorch.
"""

import math

import numpy as np
from numba import get_num_threads, prange
from numba.extending import register_jitable

from .._jit import FASTMATH_REDUCE, cpu_kernel
from .._tunables import SOFTMAX_BLOCK_BYTES as BLOCK_BYTES, SOFTMAX_PREFETCH as PREFETCH
from .._tunables import SOFTMAX_SUM_BLOCK as SUM_BLOCK
from ._approx import exp_nonpos
from ._memory import LINE, prefetch, stream_rows, streams

__all__ = ["softmax", "softmax_backward"]


def softmax(x3, out3, log):
    """``out3`` = softmax (or log_softmax) of ``x3`` (outer, n, inner) over axis 1."""
    outer, n, inner = x3.shape
    if inner == 1:
        x2 = x3.reshape(outer, n)
        _forward_rows(x2, x2.view(_KEYS[x2.dtype]), out3.reshape(outer, n), log,
                      _chunks(outer), streams(out3) and n * x2.itemsize >= 2 * LINE)
    else:
        _forward_cols(x3, out3, log, _width(n, inner, x3.itemsize))
    return out3


def softmax_backward(g3, y3, out3, log):
    """Input gradient from the upstream gradient ``g3`` and the forward output
    ``y3``: ``y * (g - sum(g * y))``, or ``g - exp(y) * sum(g)`` for log."""
    outer, n, inner = y3.shape
    if inner == 1:
        _backward_rows(g3.reshape(outer, n), y3.reshape(outer, n), out3.reshape(outer, n), log)
    else:
        _backward_cols(g3, y3, out3, log, _width(n, inner, y3.itemsize))
    return out3


#: Integer type whose order on the IEEE bits gives the row maximum.
_KEYS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _chunks(rows):
    # a few chunks of rows per thread; each chunk owns a tiny scratch array
    return max(1, min(rows, 4 * get_num_threads()))


def _width(n, inner, itemsize):
    w = BLOCK_BYTES // max(1, n * itemsize)
    w = max(16, w - w % 16)
    return min(w, inner)


# ---------------------------------------------------------------------------
# inner == 1: rows


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _forward_rows(x, xi, out, log, nchunk, stream):
    rows, n = x.shape
    t = x.dtype.type
    it = xi.dtype.type
    sign = it(xi.itemsize * 8 - 1)
    low = it((1 << (xi.itemsize * 8 - 1)) - 1)
    lowest = it(-low - 1)
    step = 64 // x.itemsize
    for c in prange(nchunk):
        m_int = np.empty(1, xi.dtype)
        m_float = m_int.view(x.dtype)
        # the row's exponentials (or x - max), in L1 until the last pass
        buf = np.empty(n, x.dtype)
        carry = np.empty(LINE // x.itemsize, x.dtype)
        flat = out.reshape(out.size)
        r0 = c * rows // nchunk
        r_end = (c + 1) * rows // nchunk
        mk = _row_max_key(xi[r0], lowest, sign, low) if r0 < r_end else lowest
        for r in range(r0, r_end):
            m_int[0] = _key(mk, sign, low)
            m = m_float[0]
            if r + 1 < r_end and not stream:
                _prefetch_row(x[r + 1], step)
            src = x[r]
            dst = out[r]
            # Sums in the input's type over a row of up to SUM_BLOCK elements
            # (spread over the vector lanes: a few dozen terms each); longer
            # rows in blocks of that, added in float64. Widening every
            # float32 term to a float64 sum made the row kernel 1.2-1.3x
            # slower. One loop over the row when it fits one block: the
            # blocked loop nest ran 1.1-1.3x slower at 512 wide rows.
            if n <= SUM_BLOCK:
                s = float(_exp_pass(src, buf, m, log))
            else:
                s = 0.0
                for b0 in range(0, n, SUM_BLOCK):
                    w = min(SUM_BLOCK, n - b0)
                    s += _exp_pass(src[b0:b0 + w], buf[b0:b0 + w], m, log)
            scale = t(1.0) if log else t(1.0 / s)
            shift = -t(math.log(s)) if log else t(-0.0)
            if stream:
                # whole lines straight to memory (no read of the output
                # line first); the next row's maximum in a pass of its own
                stream_rows(flat, r * n, buf, scale, shift, carry, r == r0, r + 1 == r_end)
                if r + 1 < r_end:
                    mk = _row_max_key(xi[r + 1], lowest, sign, low)
            else:
                # the last pass and the next row's maximum in one loop: the
                # next row's loads overlap this row's cached stores
                # (docs/benchmarks.md; the last row re-reads itself)
                nxt = xi[r + 1] if r + 1 < r_end else xi[r]
                mk = lowest
                for j in range(n):
                    dst[j] = buf[j] * scale + shift
                    mk = max(mk, _key(nxt[j], sign, low))


@register_jitable(inline="always")
def _exp_pass(src, buf, m, log):
    """``buf = exp(src - m)`` (log_softmax: ``src - m``), returning the sum
    of the exponentials in the input's type."""
    part = src.dtype.type(0)
    if log:
        # x - max goes through memory: under reassoc LLVM could otherwise
        # fold (x - max) - log(sum) into x - (max + log(sum)), which rounds
        # log(sum) away next to a large max
        for j in range(src.shape[0]):
            d = src[j] - m
            buf[j] = d
            part += exp_nonpos(d)
    else:
        for j in range(src.shape[0]):
            e = exp_nonpos(src[j] - m)
            buf[j] = e
            part += e
    return part


@register_jitable(inline="always")
def _row_max_key(keys, lowest, sign, low):
    # The row maximum as a maximum of integer keys (IEEE order for every
    # non-NaN value): LLVM vectorizes an integer max reduction, but not a
    # float one without the no-NaN assumption (6x faster). A NaN may win or
    # lose here; either way it reaches the sum.
    mk = lowest
    for j in range(keys.shape[0]):
        mk = max(mk, _key(keys[j], sign, low))
    return mk


@register_jitable(inline="always")
def _key(k, sign, low):
    """The integer whose order is the IEEE order of the float with bits ``k``
    (negative floats' magnitude bits flipped); its own inverse."""
    return k ^ ((k >> sign) & low)


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _backward_rows(g, y, out, log):
    rows, n = y.shape
    t = y.dtype.type
    step = 64 // y.itemsize
    for r in prange(rows):
        gr = g[r]
        yr = y[r]
        dst = out[r]
        s = 0.0
        if r + 1 < rows:  # see _forward_rows
            _prefetch_row(g[r + 1], step)
            _prefetch_row(y[r + 1], step)
        if log:
            for j in range(n):
                s += gr[j]
            ts = t(s)
            for j in range(n):
                dst[j] = gr[j] - exp_nonpos(yr[j]) * ts
        else:
            for j in range(n):
                s += gr[j] * yr[j]
            ts = t(s)
            for j in range(n):
                dst[j] = yr[j] * (gr[j] - ts)


# ---------------------------------------------------------------------------
# inner > 1: blocks of columns


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _forward_cols(x, out, log, width):
    outer, n, inner = x.shape
    t = x.dtype.type
    nblk = (inner + width - 1) // width
    for item in prange(outer * nblk):
        o = item // nblk
        j0 = (item - o * nblk) * width
        cw = min(width, inner - j0)
        m = np.full(cw, -np.inf, x.dtype)
        s = np.zeros(cw, np.float64)
        for i in range(n):
            src = x[o, i, j0:j0 + cw]
            for j in range(cw):
                v = src[j]
                m[j] = v if v > m[j] else m[j]
        for i in range(n):
            src = x[o, i, j0:j0 + cw]
            dst = out[o, i, j0:j0 + cw]
            for j in range(cw):
                d = src[j] - m[j]
                e = exp_nonpos(d)
                s[j] += e
                dst[j] = d if log else e
        c = np.empty(cw, x.dtype)
        for j in range(cw):
            c[j] = t(math.log(s[j])) if log else t(1.0 / s[j])
        for i in range(n):
            dst = out[o, i, j0:j0 + cw]
            if log:
                for j in range(cw):
                    dst[j] -= c[j]
            else:
                for j in range(cw):
                    dst[j] *= c[j]


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _backward_cols(g, y, out, log, width):
    outer, n, inner = y.shape
    nblk = (inner + width - 1) // width
    for item in prange(outer * nblk):
        o = item // nblk
        j0 = (item - o * nblk) * width
        cw = min(width, inner - j0)
        s = np.zeros(cw, np.float64)
        for i in range(n):
            gr = g[o, i, j0:j0 + cw]
            yr = y[o, i, j0:j0 + cw]
            for j in range(cw):
                s[j] += gr[j] if log else gr[j] * yr[j]
        ts = s.astype(y.dtype)
        for i in range(n):
            gr = g[o, i, j0:j0 + cw]
            yr = y[o, i, j0:j0 + cw]
            dst = out[o, i, j0:j0 + cw]
            if log:
                for j in range(cw):
                    dst[j] = gr[j] - exp_nonpos(yr[j]) * ts[j]
            else:
                for j in range(cw):
                    dst[j] = yr[j] * (gr[j] - ts[j])


# ---------------------------------------------------------------------------
# Software prefetch


@register_jitable(inline="always")
def _prefetch_row(row, step):
    """One prefetch per cache line of the first PREFETCH elements of ``row``."""
    for j in range(0, min(row.shape[0], PREFETCH), step):
        prefetch(row, j, 0)
