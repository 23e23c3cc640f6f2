"""CPU kernels of the tensor operators: one strided copy behind transpose,
permute, cat, contiguous and the copying reshape.

Every operator reduces to "copy an N-d strided source into an N-d strided
destination of the same shape". The public module plans that copy (merged
axes, element strides, which loop shape) and hands this launcher flat 1-D
buffers of unsigned integers of the element's width: the kernels move bits,
so one compilation per width (1, 2, 4, 8 bytes) serves every dtype.

Every index is cast to ``uint64``: the plan keeps offsets >= 0, and a signed
index makes Numba test each one for negative wrap-around, which costs the
tile kernel a third of its speed (docs/benchmarks.md).

Loop shapes:

* ``_flat``: both sides contiguous in one run, a plain ``prange`` copy.
* ``_rows``: the last axis is walked by the inner loop (unit stride on both
  sides vectorizes as a copy; any other stride is a gather/scatter); rows
  and, for few long rows, chunks of a row are spread over the threads.
* ``_tiles``: the source runs contiguously along axis ``k`` and the
  destination along the last axis (a transpose). Tiles of ``TILE x TILE``
  are read row by row into a thread-local buffer and written out row by
  row, so both sides stream runs of ``TILE`` elements; the strided access
  (a gather) stays in the buffer, which sits in L2 while the 256 lines of
  the column being gathered sit in L1. Axes other than ``k`` and the last
  are a batch.
"""

import math

import numpy as np
from numba import get_num_threads, prange, set_num_threads, uint64

from .._jit import cpu_kernel
from .._scalars import offsets
from .._tunables import COPY_CHUNK as CHUNK, COPY_SERIAL_BYTES as SERIAL_BYTES
from .._tunables import TRANSPOSE_PAD as PAD, TRANSPOSE_TILE as TILE

__all__ = ["strided_copy"]


def strided_copy(dst, doff, dstr, src, soff, sstr, shape, axis):
    """Copy ``src`` into ``dst`` following a plan of nbops.tensor.

    ``dst``/``src`` are 1-D C-contiguous buffers of one unsigned dtype;
    element ``(i0, .., in)`` lives at ``off + sum(i * stride)`` of each
    (``doff``/``dstr`` and ``soff``/``sstr``, in elements, offsets >= 0).
    ``shape`` is the merged shape; ``axis`` is -1 for a row copy, else the
    axis along which ``src`` has unit stride (``dst`` has it on the last
    axis): a tiled transpose.
    """
    # a read-only source gives every call the same kernel signature
    src = src.view()
    src.flags.writeable = False
    size = math.prod(shape)
    shape = np.asarray(shape, np.int64)
    dstr = np.asarray(dstr, np.int64)
    sstr = np.asarray(sstr, np.int64)
    threads = get_num_threads()
    if threads > 1 and size * dst.itemsize < SERIAL_BYTES:
        set_num_threads(1)  # per calling thread in Numba: safe for other threads
        try:
            _launch(dst, doff, dstr, src, soff, sstr, shape, axis, 1)
        finally:
            set_num_threads(threads)
    else:
        _launch(dst, doff, dstr, src, soff, sstr, shape, axis, threads)
    return dst


def _launch(dst, doff, dstr, src, soff, sstr, shape, axis, threads):
    if axis >= 0:
        _tiles(dst, doff, dstr, src, soff, sstr, shape, axis, 4 * threads)
    elif shape.size == 1 and dstr[0] == 1 and sstr[0] == 1:
        _flat(dst[doff:doff + shape[0]], src[soff:soff + shape[0]])
    else:
        n = shape[-1]
        rows = math.prod(shape[:-1].tolist())
        chunk = n if rows >= 64 else max(CHUNK, -(-n * rows // 64))
        _rows(dst, doff, dstr, src, soff, sstr, shape, min(chunk, n))


@cpu_kernel(parallel=True)
def _flat(dst, src):
    for i in prange(src.size):
        dst[i] = src[i]


_offsets = cpu_kernel(offsets)


@cpu_kernel(parallel=True)
def _rows(dst, doff, dstr, src, soff, sstr, shape, chunk):
    last = shape.size - 1
    n = shape[last]
    ds = dstr[last]
    ss = sstr[last]
    rows = 1
    for k in range(last):
        rows *= shape[k]
    pieces = (n + chunk - 1) // chunk
    for u in prange(rows * pieces):
        r = u // pieces
        j0 = (u - r * pieces) * chunk
        j1 = min(n, j0 + chunk)
        do, so = _offsets(r, shape, dstr, sstr, doff, soff, last, last)
        if ds == 1 and ss == 1:
            for j in range(j0, j1):
                dst[uint64(do + j)] = src[uint64(so + j)]
        elif ds == 1:  # the usual strided source: keep the stores contiguous
            for j in range(j0, j1):
                dst[uint64(do + j)] = src[uint64(so + j * ss)]
        else:
            for j in range(j0, j1):
                dst[uint64(do + j * ds)] = src[uint64(so + j * ss)]


@cpu_kernel(parallel=True)
def _tiles(dst, doff, dstr, src, soff, sstr, shape, k, items):
    last = shape.size - 1
    nk = shape[k]
    nl = shape[last]
    tk = (nk + TILE - 1) // TILE
    tl = (nl + TILE - 1) // TILE
    per = tk * tl
    batch = 1
    for a in range(shape.size):
        if a != k and a != last:
            batch *= shape[a]
    dk = dstr[k]
    sl = sstr[last]
    tiles = batch * per
    # One buffer per work item, each item a run of consecutive tiles (the
    # tiles of a band of destination rows, mostly); the launcher asks for a
    # few items per thread to even out the edges.
    items = min(tiles, items)
    for w in prange(items):
        buf = np.empty((TILE, TILE + PAD), dst.dtype)
        for u in range(w * tiles // items, (w + 1) * tiles // items):
            b = u // per
            t = u - b * per
            ti = t // tl
            i0 = ti * TILE
            j0 = (t - ti * tl) * TILE
            ni = min(TILE, nk - i0)
            nj = min(TILE, nl - j0)
            do, so = _offsets(b, shape, dstr, sstr, doff, soff, k, last)
            for jj in range(nj):
                s = so + (j0 + jj) * sl + i0
                for ii in range(ni):
                    buf[uint64(jj), uint64(ii)] = src[uint64(s + ii)]
            for ii in range(ni):
                d = do + (i0 + ii) * dk + j0
                for jj in range(nj):
                    dst[uint64(d + jj)] = buf[uint64(jj), uint64(ii)]
