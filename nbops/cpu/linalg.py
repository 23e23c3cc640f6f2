"""CPU kernels of matmul / bmm / linear: a packed, cache-blocked GEMM.

The structure is the classic one (Goto; BLIS): for each NC-wide column panel
of B and each KC-deep slice of k, the B panel is packed into NR-wide slivers
(``bpack[jr, p, j]``), each MC-tall row block of A into MR-tall slivers
(``apack[ir, p, i]``), and a register-tile micro-kernel multiplies one A
sliver by one B sliver into an MR x NR tile of C. Packing reads A and B
through element strides, so transposed, sliced and broadcast operands are
consumed where they lie; partial slivers are zero-padded, so the
micro-kernel always runs full tiles and edge tiles go through a small
scratch tile.

The micro-kernel (``_micro_t``, shared with the implicit-GEMM convolution
and attention) runs the register tile of :mod:`nbops.cpu._regtile`, written
in LLVM IR as vectors: per k step (float32 8x32) 2 vector loads of B's row,
8 broadcasts of A and 16 ``vfmadd231ps zmm``, no spills, B's rows read at
a runtime row stride. ``tools/bench_gemm.py --asm`` prints the mix.

Operands arrive as flat buffers plus element strides and per-batch element
offsets (``offa[b]``, ``offb[b]``): one compiled signature per dtype covers
every stride pattern and NumPy's batch broadcasting. The output is the
C-contiguous ``(batch, m, n)`` result seen flat.

The epilogue (``+ bias``, then an activation of :mod:`nbops._formulas`
chosen by its code in ``EPILOGUES``) runs after the micro-kernel stored
its last k slice, over ``EPILOGUE_COLS`` columns of the block at a time
(all its rows, in L2): long rows vectorize as the activations' flat kernels
do, where per 8 x 32 tile gelu cost 1.5x as much.
The BLAS route (``gemm_blas``, ``nbops.cpu._blas``) calls SciPy's OpenBLAS
on bands of C, one per Numba thread, with BLAS on one thread inside each,
and applies the same epilogue to each band while it is in cache.

Parallelism: ``gemm`` runs one of five drivers, the one its plan names
(:func:`nbops.linalg.plan_gemm` holds every route rule). ``_tiles`` (few large
products) packs each B panel in parallel, then runs ``prange`` over
(row block x column chunk) tasks, chunking columns when there are too few
row blocks to feed every thread. ``_batched`` (many products) runs
``prange`` over the batch, one whole product per task. ``_gemv`` (up to 16
rows) and ``_stream`` (a linear layer's ``x @ W.T`` of up to 512 rows)
never copy the weight: ``_stream`` computes ``C^T = W @
x^T`` with the small-product tile reading W's rows where they lie and x^T
copied once into slivers, well ahead of the packed driver, which copies all
of W every call (docs/benchmarks.md, GEMM).

Small products (m, n, k all at most the config's
``SMALL``, default 128, and at least one product per thread) skip packing
altogether: ``_small`` runs ``prange`` over chunks of the batch and
computes each product with register tiles that read A and B where they lie
(``_small_tile_t``: A broadcast from its rows through both strides, one row
segment of B per k step as whole vectors; 8 x 32 and 8 x 16 for float32,
8 x 16 and 8 x 8 for float64). Edge
tiles are moved back to end at the last row or column and recompute a few
values instead of going through a scratch tile; the epilogue runs once
per product after its tiles. Products of 4-16 KiB of operands prefetch
the next one (``PREFETCH_PRODUCT_BYTES``). Copies happen only where a
tile cannot read in place: B with non-unit column stride (copied
row-major), C narrower than one vector (B padded, one scratch tile),
fewer than MR rows (A padded). Measurements: docs/benchmarks.md, GEMM.

The epilogue tile is one kernel per dtype shared by all drivers (compiled
once); it is always called with runtime values, since a literal argument
would compile another specialisation.
"""

import functools

import numpy as np
from numba import get_num_threads, prange
from numba.extending import register_jitable

from .. import _formulas
from .._codegen import bind, generated, per_dtype
from .._formulas import EPILOGUES, epilogue_source
from .._jit import FASTMATH_REDUCE, cpu_kernel
from .._runtime import _blas_threads
from .._tunables import BLAS_BLOCK_BYTES, EPILOGUE_COLS
from .._tunables import GEMM_TASKS_PER_THREAD as TASKS_PER_THREAD
from .._tunables import PREFETCH_PRODUCT_BYTES, PREFETCH_ROWS, STREAM_TASKS_PER_THREAD
from . import activations as _activations  # noqa: F401  (makes the formulas jittable)
from ._memory import LINE
from ._memory import prefetch as _prefetch
from ._regtile import fma_tile

__all__ = ["gemm", "gemm_blas"]
#: Entry points with no CUDA twin: the BLAS route exists on the CPU only.
CPU_ONLY = ("gemm_blas",)

#: Register tile (MR, NR) per dtype: 8 rows of two 512-bit vectors of C,
#: 16 accumulator registers (within a few percent of 16x16, which needs
#: twice the A broadcasts; docs/benchmarks.md, GEMM).
TILES = {np.dtype(np.float32): (8, 32), np.dtype(np.float64): (8, 16)}


_apply_epilogue = register_jitable(
    generated(epilogue_source(), "apply_epilogue", dict(vars(_formulas)), __name__))


def _micro_t(kc, ap, bbuf, boff, ldb, cbuf, coff, ldc, first):
    # C[tile] (+)= ap.T @ B: ap a (kc, MR) packed A sliver, B's row p at
    # bbuf[boff + p * ldb:][:NR], a packed B sliver (ldb = NR) or the input's
    # planes of a 1x1 convolution read where they lie (ldb the plane)
    _tile(kc, ap, 0, MR, 1, bbuf, boff, ldb, cbuf, coff, ldc, MR, not first)


@register_jitable
def _pack_a(abuf, off, sam, sak, mc, kc, mr, apack, zero):
    """apack[ir, p, i] = A[ir*mr + i, p] over the mc x kc block at ``off``;
    rows past mc are zero."""
    for ir in range((mc + mr - 1) // mr):
        rows = min(mr, mc - ir * mr)
        base = off + ir * mr * sam
        for p in range(kc):
            src = base + p * sak
            for i in range(rows):
                apack[ir, p, i] = abuf[src + i * sam]
            for i in range(rows, mr):
                apack[ir, p, i] = zero


@register_jitable
def _pack_b_sliver(bbuf, off, sbk, sbn, kc, nc, jr, nr, bpack, zero):
    """bpack[jr, p, j] = B[p, jr*nr + j] over the kc x nc panel at ``off``;
    columns past nc are zero."""
    src0 = off + jr * nr * sbn
    cols = min(nr, nc - jr * nr)
    sliver = bpack[jr]
    if sbk == 1 and sbn != 1:
        # B's columns contiguous (a linear layer's weight, B = W.T): read
        # each column in order and write it down the sliver; walking the
        # rows instead read every element from a different cache line
        # (linear at batch 64 against 4096 x 4096 ran at half NumPy's speed)
        for j in range(cols):
            src = src0 + j * sbn
            # the next column's run, requested now: a run of a few lines is
            # too short for the hardware prefetcher to pick up from memory
            for q in range(0, kc, LINE // bbuf.itemsize):
                _prefetch(bbuf, src + sbn + q, 0)
            for p in range(kc):
                sliver[p, j] = bbuf[src + p]
        for p in range(kc):
            for j in range(cols, nr):
                sliver[p, j] = zero
        return
    for p in range(kc):
        src = src0 + p * sbk
        # a row PREFETCH_ROWS ahead: rows of one or two lines each, too
        # short for the hardware prefetcher
        _prefetch(bbuf, src + PREFETCH_ROWS * sbk, 0)
        _prefetch(bbuf, src + PREFETCH_ROWS * sbk + (nr - 1) * sbn, 0)
        for j in range(cols):
            sliver[p, j] = bbuf[src + j * sbn]
        for j in range(cols, nr):
            sliver[p, j] = zero


def _epilogue_tile_source():
    """Source of ``epilogue_tile(outf, coff, ldc, rows, cols, bias, bcol, act,
    prm, cst)``: ``act(C + bias)`` over a rows x cols tile of C. The switch on
    the activation sits outside the loops, so each loop is one formula over
    unit-stride rows, which LLVM vectorizes (an if-chain per element would
    not be)."""
    lines = ["def epilogue_tile(outf, coff, ldc, rows, cols, bias, bcol, act, prm, cst):",
             "    has_bias = bias.size > 0"]
    for code, name in enumerate(EPILOGUES):
        call = "v" if code == 0 else f"{name}(v, prm, cst)"
        lines.append(f"    {'if' if code == 0 else 'elif'} act == {code}:")
        for cond, term in (("has_bias", " + brow[j]"), ("not has_bias", "")):
            lines += [f"        if {cond}:"]
            lines += ["            brow = bias[bcol:bcol + cols]"] if term else []
            lines += ["            for i in range(rows):",
                      "                row = outf[coff + i * ldc:coff + i * ldc + cols]",
                      "                for j in range(cols):",
                      f"                    v = row[j]{term}",
                      f"                    row[j] = {call}"]
    return "\n".join(lines) + "\n"


# a kernel of its own, not inlined at the Numba level: compiled (and cached)
# once per dtype and shared by every driver, which saves each driver most
# of its compile time. Callers pass runtime values, never literals (a
# literal 0 argument would compile another specialisation).
_epilogue_tile = cpu_kernel(
    generated(_epilogue_tile_source(), "epilogue_tile", dict(vars(_formulas)),
              __name__))


# The drivers below are templates: _make_drivers copies them per register
# tile with MR, NR and the micro-kernel bound as globals (Numba freezes
# globals as constants). Globals rather than closures keep the on-disk cache
# valid across processes: Numba keys a closure's cache entry on a pickle of
# its cells, which differs in every process for a dispatcher cell.
MR = NR = 0
_micro = _macro = None


@register_jitable(inline="always")
def store_edge_tile(dst, coff, ld, scratch, nr, rows, cols, first):
    """Store (``first``) or add the ``rows`` x ``cols`` corner of a register
    tile that the micro-kernel computed into ``scratch`` (row stride ``nr``)
    into ``dst`` at ``coff`` (row stride ``ld``): C's edge tiles."""
    for i in range(rows):
        for j in range(cols):
            if first:
                dst[coff + i * ld + j] = scratch[i * nr + j]
            else:
                dst[coff + i * ld + j] += scratch[i * nr + j]


def _macro_t(abuf, a_off, sam, sak, bpack, jr0, jr1, nc, outf, c_off, ldc, mc, kc,
             first, last, apack, scratch, bias, bcol, act, prm, cst):
    # C[mc x nc block] (+)= A[mc x kc] @ Bpanel[kc x slivers jr0..jr1)
    zero = cst.zero
    _pack_a(abuf, a_off, sam, sak, mc, kc, MR, apack, zero)
    epilogue = last and (act != 0 or bias.size > 0)
    # B's packed slivers as the micro-kernel reads them: sliver jr at
    # (jr kcap NR), row stride NR; runtime values, not literals: literal
    # arguments would compile a second specialisation of the micro-kernel
    bf = bpack.reshape(-1)
    bnr = bpack.shape[2]
    b_step = bpack.shape[1] * bnr
    s_off = 0 * bnr
    group = max(1, EPILOGUE_COLS // NR)
    for g0 in range(jr0, jr1, group):
        g1 = min(jr1, g0 + group)
        for jr in range(g0, g1):
            cols = min(NR, nc - jr * NR)
            for ir in range((mc + MR - 1) // MR):
                rows = min(MR, mc - ir * MR)
                coff = c_off + ir * MR * ldc + jr * NR
                if rows == MR and cols == NR:
                    _micro(kc, apack[ir], bf, jr * b_step, bnr, outf, coff, ldc, first)
                else:
                    _micro(kc, apack[ir], bf, jr * b_step, bnr, scratch, s_off, bnr, s_off == 0)
                    store_edge_tile(outf, coff, ldc, scratch, NR, rows, cols, first)
        if epilogue:
            col0 = g0 * NR
            _epilogue_tile(outf, c_off + col0, ldc, mc, min(nc, g1 * NR) - col0, bias,
                           bcol + col0, act, prm, cst)


@cpu_kernel
def _fill(outf, nbatch, m, n, bias, act, prm, cst):
    # k == 0: every C = act(0 + bias)
    for i in range(nbatch * m):
        for j in range(n):
            outf[i * n + j] = cst.zero
    z = 0 * n  # not a literal: see _epilogue_tile
    _epilogue_tile(outf, z, n, nbatch * m, n, bias, z, act, prm, cst)


@register_jitable
def _panel(q, n, k, NC, KC, nr):
    """Panel ``q`` of the (column panel, k slice) loop nest: (jc, nc, slivers
    of nc, pc, kc)."""
    nk = (k + KC - 1) // KC
    jc = (q // nk) * NC
    pc = (q % nk) * KC
    nc = min(NC, n - jc)
    return jc, nc, (nc + nr - 1) // nr, pc, min(KC, k - pc)


def _tiles_t(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, outf, nbatch, m, n, k,
             bias, act, prm, cst, MC, KC, NC, nthreads):
    zero = cst.zero
    kcap = max(1, min(KC, k))
    bpack = np.empty(((min(NC, n) + NR - 1) // NR, kcap, NR), outf.dtype)
    nmc = (m + MC - 1) // MC
    npanels = ((n + NC - 1) // NC) * ((k + KC - 1) // KC)
    for bi in range(nbatch):
        c0 = bi * m * n
        for q in range(npanels):
            jc, nc, nnr, pc, kc = _panel(q, n, k, NC, KC, NR)
            for jr in prange(nnr):
                _pack_b_sliver(bbuf, offb[bi] + pc * sbk + jc * sbn, sbk, sbn, kc, nc, jr,
                               NR, bpack, zero)
            # chunk columns when row blocks alone cannot feed the threads
            nj = max(1, min(nnr, (TASKS_PER_THREAD * nthreads + nmc - 1) // nmc))
            per = (nnr + nj - 1) // nj
            for t in prange(nmc * nj):
                ic = (t // nj) * MC
                jr0 = (t % nj) * per
                jr1 = min(nnr, jr0 + per)
                if jr0 < jr1:
                    apack = np.empty(((min(MC, m) + MR - 1) // MR, kcap, MR), outf.dtype)
                    scratch = np.empty(MR * NR, outf.dtype)
                    _macro(abuf, offa[bi] + ic * sam + pc * sak, sam, sak, bpack,
                           jr0, jr1, nc, outf, c0 + ic * n + jc, n, min(MC, m - ic),
                           kc, pc == 0, pc + kc == k, apack, scratch, bias, jc,
                           act, prm, cst)


def _batched_t(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, outf, nbatch, m, n, k,
               bias, act, prm, cst, MC, KC, NC, nthreads):
    # one chunk of whole products per task; buffers sized to the products
    # and allocated once per task (large fresh allocations are page faults)
    nchunks = min(nbatch, TASKS_PER_THREAD * nthreads)
    kcap = max(1, min(KC, k))
    npanels = ((n + NC - 1) // NC) * ((k + KC - 1) // KC)
    for t in prange(nchunks):
        bpack = np.empty(((min(NC, n) + NR - 1) // NR, kcap, NR), outf.dtype)
        apack = np.empty(((min(MC, m) + MR - 1) // MR, kcap, MR), outf.dtype)
        scratch = np.empty(MR * NR, outf.dtype)
        for bi in range(t * nbatch // nchunks, (t + 1) * nbatch // nchunks):
            c0 = bi * m * n
            for q in range(npanels):
                jc, nc, nnr, pc, kc = _panel(q, n, k, NC, KC, NR)
                for jr in range(nnr):
                    _pack_b_sliver(bbuf, offb[bi] + pc * sbk + jc * sbn, sbk, sbn, kc, nc,
                                   jr, NR, bpack, cst.zero)
                for ic in range(0, m, MC):
                    _macro(abuf, offa[bi] + ic * sam + pc * sak, sam, sak, bpack,
                           0, nnr, nc, outf, c0 + ic * n + jc, n, min(MC, m - ic),
                           kc, pc == 0, pc + kc == k, apack, scratch, bias, jc,
                           act, prm, cst)


def tile_scope(module_globals, dtype):
    """``(mr, nr, scope)``: ``dtype``'s register tile and a copy of a kernel
    module's globals with ``MR``, ``NR`` and the tile's micro-kernel
    ``_micro`` bound, in which that module's driver templates are
    specialised (here, in :mod:`nbops.cpu.conv` and :mod:`nbops.cpu.attention`)."""
    mr, nr = TILES[dtype]
    return mr, nr, dict(module_globals, MR=mr, NR=nr, _micro=micro(mr, nr))


def _make_drivers(dtype):
    """``(tiles, batched)`` for ``dtype``'s register tile."""
    mr, nr, scope = tile_scope(globals(), dtype)
    scope["_macro"] = register_jitable(bind(_macro_t, scope, f"gemm_macro_{mr}x{nr}"))
    tiles = cpu_kernel(bind(_tiles_t, scope, f"gemm_tiles_{mr}x{nr}"), parallel=True)
    batched = cpu_kernel(bind(_batched_t, scope, f"gemm_batched_{mr}x{nr}"), parallel=True)
    return tiles, batched


# ---------------------------------------------------------------------------
# Small products: no packing


def _small_tile_t(abuf, a0, sam, sak, rows, bbuf, b0, sbk, k, outf, c0, ldc, acc):
    # an MR x NR tile of C (+)= A @ B over k from A and B where they lie: A's
    # MR rows at a0 + i * sam (all readable), read through both strides; B's
    # rows at b0 + p * sbk with unit column stride. Only the first ``rows``
    # rows are stored, added where ``acc`` (the streamed driver's later k
    # slices). ``acc`` and the strides are runtime values at every call: a
    # literal would compile another specialisation for no speed.
    _tile(k, abuf, a0, sak, sam, bbuf, b0, sbk, outf, c0, ldc, rows, acc)




#: Register tiles of the small-product path per dtype: (MR, wide NR,
#: narrow NR); the narrow tile is one vector of C per row, the wide one two.
SMALL_TILES = {np.dtype(np.float32): (8, 32, 16), np.dtype(np.float64): (8, 16, 8)}
_wide_tile = _narrow_tile = None
SNR = SNN = 0


def _small_product_t(abuf, a0, sam, sak, bbuf, b0, sbk, outf, c0, m, n, k, ctile, bias,
                     act, prm, cst):
    # C (m x n at c0, row stride n) = epilogue(A @ B), m >= MR or A padded
    # to MR readable rows, B with unit column stride and at least SNN
    # readable columns. Column panels outside, row blocks inside: the k x NR
    # panel of B stays in L1 while A's rows stream past it. Tiles that would
    # cross the last row or column are moved back to end there: they
    # recompute a few rows or columns already stored (bit-identical values)
    # instead of going through a scratch tile; only a C narrower than one
    # vector (B then padded to SNN columns) goes through ``ctile``. The
    # epilogue runs once, after every tile is stored.
    rows = min(MR, m)
    store = m < 0  # False, not a literal: see tile()
    j0 = 0
    while j0 < n:
        wide = n - j0 >= SNR or (n >= SNR and n - j0 > SNN)
        j0 = max(0, min(j0, n - (SNR if wide else SNN)))
        i0 = 0
        while i0 < m:
            i0 = max(0, min(i0, m - MR))
            if wide:
                _wide_tile(abuf, a0 + i0 * sam, sam, sak, rows, bbuf, b0 + j0, sbk, k, outf,
                           c0 + i0 * n + j0, n, store)
            elif n >= SNN:
                _narrow_tile(abuf, a0 + i0 * sam, sam, sak, rows, bbuf, b0 + j0, sbk, k,
                             outf, c0 + i0 * n + j0, n, store)
            else:
                _narrow_tile(abuf, a0 + i0 * sam, sam, sak, rows, bbuf, b0, sbk, k, ctile,
                             0 * n, ctile.size // MR, store)
                for i in range(rows):
                    for j in range(n):
                        outf[c0 + (i0 + i) * n + j] = ctile[i * SNN + j]
            i0 += MR
        j0 += SNR if wide else SNN
    if act != 0 or bias.size > 0:
        _epilogue_tile(outf, c0, n, m, n, bias, 0 * n, act, prm, cst)


@register_jitable
def _prefetch_product(abuf, a0, sam, sak, m, k, bbuf, b0, sbk, sbn, n, outf, c0):
    """Prefetch the lines of an m x k A, a k x n B (through their strides)
    and a contiguous m x n C (see ``PREFETCH_PRODUCT_BYTES``)."""
    step = LINE // outf.itemsize
    for i in range(m):
        for p in range(0, k, step):
            _prefetch(abuf, a0 + i * sam + p * sak, 0)
    for p in range(k):
        for j in range(0, n, step):
            _prefetch(bbuf, b0 + p * sbk + j * sbn, 0)
    for q in range(0, m * n, step):
        _prefetch(outf, c0 + q, 0)


def _small_t(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, outf, nbatch, m, n, k, bias, act,
             prm, cst, nthreads):
    # whole products per task. Copied into per-task buffers (in L1/L2) only
    # where the tiles cannot read in place: a B whose columns are not
    # contiguous (row-major copy) or that is narrower than one vector
    # (padded with zero columns), and an A with fewer than MR rows (padded
    # with zero rows), so that tiles read only valid memory
    nchunks = min(nbatch, TASKS_PER_THREAD * nthreads)
    ldb = max(n, SNN)
    copy_b = sbn != 1 or n < SNN
    pad_a = m < MR
    for t in prange(nchunks):
        bcopy = np.zeros(k * ldb if copy_b else 0, outf.dtype)
        apad = np.zeros(MR * k if pad_a else 0, outf.dtype)
        ctile = np.empty(MR * SNN if n < SNN else 0, outf.dtype)
        b1 = (t + 1) * nbatch // nchunks
        lo, hi = PREFETCH_PRODUCT_BYTES
        ahead = lo <= (m + n) * k * outf.itemsize <= hi
        for bi in range(t * nbatch // nchunks, b1):
            if ahead and bi + 1 < b1:
                _prefetch_product(abuf, offa[bi + 1], sam, sak, m, k, bbuf, offb[bi + 1], sbk,
                                  sbn, n, outf, (bi + 1) * m * n)
            a_buf, a_off, a_sm, a_sk = abuf, offa[bi], sam, sak
            b_buf, b_off, b_sk = bbuf, offb[bi], sbk
            if pad_a:
                for i in range(m):
                    for p in range(k):
                        apad[i * k + p] = abuf[offa[bi] + i * sam + p * sak]
                a_buf, a_off, a_sm, a_sk = apad, 0, k, 1
            if copy_b:
                for p in range(k):
                    for j in range(n):
                        bcopy[p * ldb + j] = bbuf[offb[bi] + p * sbk + j * sbn]
                b_buf, b_off, b_sk = bcopy, 0, ldb
            _small_product(a_buf, a_off, a_sm, a_sk, b_buf, b_off, b_sk, outf, bi * m * n,
                           m, n, k, ctile, bias, act, prm, cst)


@functools.lru_cache(maxsize=None)
def tile(mr, nr):
    """The compiled MR x NR small-product tile (``_small_tile_t``): one
    dispatcher per shape, shared by the small-product and streamed-weight
    drivers."""
    return cpu_kernel(bind(_small_tile_t, dict(globals(), _tile=fma_tile(mr, nr)),
                           f"tile_{mr}x{nr}"))


def _make_small(mr, nr, nn):
    scope = dict(globals())
    for width, key in ((nr, "_wide_tile"), (nn, "_narrow_tile")):
        scope[key] = tile(mr, width)
    scope.update(MR=mr, SNR=nr, SNN=nn)
    scope["_small_product"] = register_jitable(
        bind(_small_product_t, scope, f"gemm_small_product_{mr}x{nr}"))
    return cpu_kernel(bind(_small_t, scope, f"gemm_small_{mr}x{nr}"), parallel=True)


@per_dtype
def small_driver(dtype):
    """The parallel small-product driver for ``dtype``, built on first use."""
    return _make_small(*SMALL_TILES[dtype])


# ---------------------------------------------------------------------------
# A linear layer's weight streamed where it lies: C^T = W @ A^T



_st_tile = None
SR = 0


def _stream_t(abuf, a0, sam, sak, bbuf, b0, sbn, outf, m, n, k, bias, act, prm, cst, KC, FB,
              nthreads):
    # C = epilogue(A @ B) with B[p, j] = W[j, p] = bbuf[b0 + j * sbn + p]:
    # computed as C^T = W @ A^T with the small-product register tile, whose
    # A operand is read where it lies (MR rows of W, one broadcast per row
    # and k step: the weight streams from memory once and is never copied)
    # and whose B operand is A^T, copied once into SR-wide slivers
    # (xt[s, p, j] = A[s SR + j, p], zero past m; in L2 for a KC slice).
    # A task owns FB columns of C (rows of W) and runs every k slice and
    # sliver over them, then moves its block of C^T into C, the epilogue
    # applied while it is in cache.
    zero = cst.zero
    ns = (m + SR - 1) // SR
    mp = ns * SR
    xt = np.empty((ns, k, SR), outf.dtype)
    for s in prange(ns):
        for j in range(SR):
            r = s * SR + j
            for p in range(k):
                xt[s, p, j] = abuf[a0 + r * sam + p * sak] if r < m else zero
    full = n // MR
    # W's last rows, fewer than MR, zero-padded (the tile reads MR rows)
    wpad = np.zeros(MR * k, outf.dtype)
    for i in range(n - full * MR):
        for p in range(k):
            wpad[i * k + p] = bbuf[b0 + (full * MR + i) * sbn + p]
    xf = xt.reshape(-1)
    ntile = (n + MR - 1) // MR
    ct = np.empty(ntile * MR * mp, outf.dtype)
    per = max(1, FB // MR)
    nblk = (ntile + per - 1) // per
    nchunks = min(nblk, STREAM_TASKS_PER_THREAD * nthreads)
    epilogue = act != 0 or bias.size > 0
    # the tile's strides and row count as runtime values (literals would
    # compile a specialisation of the tile of its own)
    one = k // k
    mr_ = one * MR
    sr_ = one * SR
    for c in prange(nchunks):
        for blk in range(c * nblk // nchunks, (c + 1) * nblk // nchunks):
            t0 = blk * per
            t1 = min(ntile, t0 + per)
            for kb in range(0, k, KC):
                kc = min(KC, k - kb)
                for s in range(ns):
                    for t in range(t0, t1):
                        wb, wo, ws = (bbuf, b0 + t * MR * sbn + kb, sbn) if t < full else \
                            (wpad, kb, k)
                        _st_tile(wb, wo, ws, one, mr_, xf, (s * k + kb) * SR, sr_, kc, ct,
                                 t * MR * mp + s * SR, mp, kb > 0)
            f0 = t0 * MR
            f1 = min(n, t1 * MR)
            for r in range(m):
                for f in range(f0, f1):
                    outf[r * n + f] = ct[f * mp + r]
            if epilogue:
                _epilogue_tile(outf, f0, n, m, f1 - f0, bias, f0, act, prm, cst)


def _make_stream(mr, nr):
    scope = dict(globals())
    scope.update(MR=mr, SR=nr, _st_tile=tile(mr, nr))
    return cpu_kernel(bind(_stream_t, scope, f"gemm_stream_{mr}x{nr}"), parallel=True)


@per_dtype
def stream_driver(dtype):
    """The streamed-weight driver for ``dtype``, built on first use."""
    return _make_stream(*SMALL_TILES[dtype][:2])


@functools.lru_cache(maxsize=None)
def micro(mr, nr):
    """The compiled MR x NR micro-kernel (``_micro_t``) on packed A slivers,
    shared by the packed drivers, :mod:`nbops.cpu.conv`'s implicit GEMM and
    :mod:`nbops.cpu.attention`."""
    return cpu_kernel(bind(_micro_t, dict(globals(), _tile=fma_tile(mr, nr), MR=mr),
                           f"micro_{mr}x{nr}"))


@per_dtype
def drivers(dtype):
    """``(tiles, batched)``: the two packed parallel drivers for ``dtype``,
    built on first use (their micro-kernel is ``micro(*TILES[dtype])``)."""
    return _make_drivers(dtype)


def gemm(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, bias, act, prm, cst, plan):
    """``out[b] = epilogue(A_b @ B_b + bias)`` for every batch index b, by
    the route ``plan`` names (:func:`nbops.linalg.plan_gemm` chose it and
    its blocks; nothing is decided here).

    ``abuf``/``bbuf`` are flat buffers of one dtype, A_b the m x k matrix at
    element ``offa[b]`` with strides (sam, sak), B_b the k x n matrix at
    ``offb[b]`` with strides (sbk, sbn); ``out`` is C-contiguous
    (batch, m, n); ``bias`` has n elements or none; ``act`` is an index
    into ``EPILOGUES``; ``prm``/``cst`` the activation's typed parameters
    and constants.
    """
    route, outf = plan.route, out.reshape(-1)
    if route == "empty":
        return out
    if route == "blas":
        return gemm_blas(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, bias, act,
                         prm, cst)
    if route == "fill":
        _fill(outf, out.shape[0], m, n, bias, act, prm, cst)
    elif route == "gemv":
        _gemv(abuf, offa[0], sam, bbuf, offb[0], sbk, sbn, outf, m, n, k, bias, act, prm, cst,
              plan.tasks)
    elif route == "stream":
        stream_driver(out.dtype)(abuf, offa[0], sam, sak, bbuf, offb[0], sbn, outf, m, n, k,
                                 bias, act, prm, cst, plan.KC, plan.tasks, plan.threads)
    elif route == "small":
        small_driver(out.dtype)(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, outf, out.shape[0],
                                m, n, k, bias, act, prm, cst, plan.threads)
    elif route in ("tiles", "batched"):
        drivers(out.dtype)[route == "batched"](
            abuf, offa, sam, sak, bbuf, offb, sbk, sbn, outf, out.shape[0], m, n, k, bias, act,
            prm, cst, plan.MC, plan.KC, plan.NC, plan.threads)
    else:
        raise ValueError(f"gemm: unknown route {route!r} in {plan}")
    return out


# ---------------------------------------------------------------------------
# Few rows of A (a linear layer at batch 1-16): matrix-vector products



@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _gemv(abuf, a0, sam, bbuf, b0, sbk, sbn, outf, m, n, k, bias, act, prm, cst, blocks):
    """``C = act(A @ B + bias)`` for an m x k A with unit column stride, C
    (m x n) split into ``blocks`` column blocks over the threads; B's
    columns (``sbk == 1``) or rows contiguous. B is read once."""
    for t in prange(blocks):
        # block edges on multiples of 16 columns: the row updates then run
        # in whole vectors, without a scalar remainder per row of B
        j0 = min(n, (t * n // blocks + 8) // 16 * 16)
        j1 = n if t == blocks - 1 else min(n, ((t + 1) * n // blocks + 8) // 16 * 16)
        if j1 <= j0:
            continue
        if sbk == 1:
            _column_dots(abuf, a0, sam, bbuf, b0, sbn, outf, m, n, k, j0, j1, cst.zero)
        else:
            _row_updates(abuf, a0, sam, bbuf, b0, sbk, outf, m, n, k, j0, j1, cst.zero)
        if act != 0 or bias.size > 0:
            _epilogue_tile(outf, j0, n, m, j1 - j0, bias, j0, act, prm, cst)


@register_jitable
def _column_dots(abuf, a0, sam, bbuf, b0, sbn, outf, m, n, k, j0, j1, zero):
    # C[:, j0:j1] as dot products of A's rows with B's columns (a linear
    # layer's weight rows), summed in vector lanes (reassociated), four
    # columns at a time: four independent sums per element of A loaded (1.5x
    # one column at a time, in L3); each column is reused from L1 by A's rows
    j4 = j0 + (j1 - j0) // 4 * 4
    for j in range(j0, j4, 4):
        c0 = bbuf[b0 + j * sbn:b0 + j * sbn + k]
        c1 = bbuf[b0 + (j + 1) * sbn:b0 + (j + 1) * sbn + k]
        c2 = bbuf[b0 + (j + 2) * sbn:b0 + (j + 2) * sbn + k]
        c3 = bbuf[b0 + (j + 3) * sbn:b0 + (j + 3) * sbn + k]
        for i in range(m):
            row = abuf[a0 + i * sam:a0 + i * sam + k]
            s0 = s1 = s2 = s3 = zero
            for p in range(k):
                a = row[p]
                s0 += a * c0[p]
                s1 += a * c1[p]
                s2 += a * c2[p]
                s3 += a * c3[p]
            outf[i * n + j] = s0
            outf[i * n + j + 1] = s1
            outf[i * n + j + 2] = s2
            outf[i * n + j + 3] = s3
    for j in range(j4, j1):
        col = bbuf[b0 + j * sbn:b0 + j * sbn + k]
        for i in range(m):
            row = abuf[a0 + i * sam:a0 + i * sam + k]
            acc = zero
            for p in range(k):
                acc += row[p] * col[p]
            outf[i * n + j] = acc


@register_jitable
def _row_updates(abuf, a0, sam, bbuf, b0, sbk, outf, m, n, k, j0, j1, zero):
    # C[:, j0:j1] accumulated in place (in L1) from B's rows, four rows of B
    # per pass over C (one load and store of C per four products), each row
    # segment reused from L1 by A's rows
    w = j1 - j0
    for i in range(m):
        outf[i * n + j0:i * n + j1] = zero
    k4 = k // 4 * 4
    for p in range(0, k4, 4):
        r0 = bbuf[b0 + p * sbk + j0:b0 + p * sbk + j1]
        r1 = bbuf[b0 + (p + 1) * sbk + j0:b0 + (p + 1) * sbk + j1]
        r2 = bbuf[b0 + (p + 2) * sbk + j0:b0 + (p + 2) * sbk + j1]
        r3 = bbuf[b0 + (p + 3) * sbk + j0:b0 + (p + 3) * sbk + j1]
        for i in range(m):
            x0 = abuf[a0 + i * sam + p]
            x1 = abuf[a0 + i * sam + p + 1]
            x2 = abuf[a0 + i * sam + p + 2]
            x3 = abuf[a0 + i * sam + p + 3]
            dst = outf[i * n + j0:i * n + j1]
            for j in range(w):
                dst[j] += (x0 * r0[j] + x1 * r1[j]) + (x2 * r2[j] + x3 * r3[j])
    for p in range(k4, k):
        src = bbuf[b0 + p * sbk + j0:b0 + p * sbk + j1]
        for i in range(m):
            a = abuf[a0 + i * sam + p]
            dst = outf[i * n + j0:i * n + j1]
            for j in range(w):
                dst[j] += a * src[j]


def _matrix(buf, off, rows, cols, srow, scol):
    """A C-contiguous copy of the ``rows x cols`` matrix at element ``off`` of
    ``buf`` with these element strides."""
    it = buf.itemsize
    return np.ascontiguousarray(
        np.lib.stride_tricks.as_strided(buf[off:], (rows, cols), (srow * it, scol * it)))


def gemm_blas(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k, bias, act, prm, cst):
    """:func:`gemm` through SciPy's OpenBLAS (``nbops.cpu._blas``).

    C is split into one band per Numba thread (more where a band would
    outgrow ``BLAS_BLOCK_BYTES`` and an epilogue has to run on it while it
    is in cache), over its columns when n >= m (each call then packs a
    slice of B, the larger operand) and over its rows otherwise; BLAS runs
    single-threaded inside each band: its own pool would spin next to
    Numba's and both would lose (``_blas_threads``). Operands go to BLAS as
    they lie when one of their strides is 1; otherwise they are copied to C
    order first (O(mk) next to the O(mnk) product).
    """
    if out.size == 0:
        return out
    if k == 0:
        _fill(out.reshape(-1), out.shape[0], m, n, bias, act, prm, cst)
        return out
    from . import _blas

    threads = get_num_threads()
    split_cols = n >= m
    blocks = threads
    if act != 0 or bias.size > 0:
        bands = -(-m * n * out.itemsize // BLAS_BLOCK_BYTES)
        blocks = -(-bands // threads) * threads
    blocks = max(1, min(blocks, n if split_cols else m))
    with _blas_threads(1):
        if _blas.gemm_blocks(abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out, m, n, k,
                             split_cols, blocks, bias, act, prm, cst):
            return out
        for i in range(out.shape[0]):  # an operand without a unit stride: copied
            a = _matrix(abuf, offa[i], m, k, sam, sak)
            b = _matrix(bbuf, offb[i], k, n, sbk, sbn)
            _blas.gemm_blocks(a.reshape(-1), _ONE, k, 1, b.reshape(-1), _ONE, n, 1,
                              out[i:i + 1], m, n, k, split_cols, blocks, bias, act, prm, cst)
    return out


_ONE = np.zeros(1, np.int64)
