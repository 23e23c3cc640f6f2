"""CUDA kernels of the tensor operators: the strided copy of
``nbops/cpu/tensor.py``, with the CPU launcher's signature.

* ``_gather``: a grid-stride loop over destination elements (C order), each
  thread turning its index into a source and a destination offset; adjacent
  threads touch adjacent destination elements, so the stores coalesce.
* ``_tiles``: the classic shared-memory transpose. A block of
  ``TILE x TILE_ROWS`` threads reads a ``TILE x TILE`` tile with threads
  running along the source's contiguous axis (coalesced loads), and writes
  it with threads running along the destination's contiguous axis
  (coalesced stores); the tile row has ``TILE + 1`` entries so that reading
  a column touches ``TILE`` different banks. Grid axes x/y walk the tiles,
  z the batch (the axes other than the two being swapped), all grid-stride.

The buffers arrive as flat arrays of an unsigned type of the element's width
(see the CPU module), so shared-memory tiles come in four widths only.
"""

import numba
from numba import cuda

from .._scalars import offsets
from ._launch import TILE, TILE_ROWS, grid_1d, grid_tiles_3d

__all__ = ["strided_copy"]


def strided_copy(dst, doff, dstr, src, soff, sstr, shape, axis):
    """Copy ``src`` into ``dst`` following a plan of nbops.tensor (see the
    CPU launcher for the meaning of the arguments)."""
    shape = tuple(int(n) for n in shape)
    dstr = tuple(int(s) for s in dstr)
    sstr = tuple(int(s) for s in sstr)
    size = 1
    for n in shape:
        size *= n
    if axis < 0:
        _gather[grid_1d(size)](dst, doff, dstr, src, soff, sstr, shape, size)
        return dst
    last = len(shape) - 1
    batch = size // (shape[axis] * shape[last])
    blocks, threads = grid_tiles_3d(shape[axis], shape[last], batch)
    _tile_kernel(src.dtype)[blocks, threads](dst, doff, dstr, src, soff, sstr, shape, axis,
                                             batch)
    return dst


_offsets = cuda.jit(device=True)(offsets)


@cuda.jit
def _gather(dst, doff, dstr, src, soff, sstr, shape, size):
    skip = len(shape)
    for e in range(cuda.grid(1), size, cuda.gridsize(1)):
        do, so = _offsets(e, shape, dstr, sstr, doff, soff, skip, skip)
        dst[do] = src[so]


_TILE_KERNELS = {}


def _tile_kernel(dtype):
    kern = _TILE_KERNELS.get(dtype)
    if kern is None:
        kern = _TILE_KERNELS[dtype] = _make_tile_kernel(numba.from_dtype(dtype))
    return kern


def _make_tile_kernel(element):
    @cuda.jit
    def tiles(dst, doff, dstr, src, soff, sstr, shape, k, batch):
        tile = cuda.shared.array((TILE, TILE + 1), element)
        last = len(shape) - 1
        nk = shape[k]
        nl = shape[last]
        tk = (nk + TILE - 1) // TILE
        tl = (nl + TILE - 1) // TILE
        dk = dstr[k]
        sl = sstr[last]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        # Loop bounds depend on block indices only, so every thread of a
        # block reaches the same barriers.
        for b in range(cuda.blockIdx.z, batch, cuda.gridDim.z):
            do, so = _offsets(b, shape, dstr, sstr, doff, soff, k, last)
            for ti in range(cuda.blockIdx.y, tk, cuda.gridDim.y):
                for tj in range(cuda.blockIdx.x, tl, cuda.gridDim.x):
                    i0 = ti * TILE
                    j0 = tj * TILE
                    i = i0 + tx
                    for r in range(0, TILE, TILE_ROWS):
                        j = j0 + ty + r
                        if i < nk and j < nl:
                            tile[ty + r, tx] = src[so + i + j * sl]
                    cuda.syncthreads()
                    j = j0 + tx
                    for r in range(0, TILE, TILE_ROWS):
                        i = i0 + ty + r
                        if i < nk and j < nl:
                            dst[do + i * dk + j] = tile[tx, ty + r]
                    cuda.syncthreads()

    return tiles
