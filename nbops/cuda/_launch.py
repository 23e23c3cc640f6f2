"""Launch configuration for every CUDA kernel: the one place that picks
block and grid sizes.

Numba's simulator runs one OS thread per CUDA thread, so under
``NUMBA_ENABLE_CUDASIM=1`` blocks shrink to 32 threads and grids to a few
blocks; grid-stride loops keep every size correct (and tests then cross
block boundaries with tiny arrays, e.g. ``3 * THREADS + 1`` elements).
"""

import math

from numba import config, cuda

from .. import _tunables

SIMULATED = bool(config.ENABLE_CUDASIM)

#: Threads per block of 1-D elementwise kernels (nbops/_tunables.py).
THREADS = 32 if SIMULATED else _tunables.CUDA_THREADS
#: Tile edge of 2-D tiled kernels (transpose): TILE x TILE elements per block.
TILE = 8 if SIMULATED else _tunables.CUDA_TILE
#: Rows of threads per 2-D tile block (each thread handles TILE / TILE_ROWS elements).
TILE_ROWS = 4 if SIMULATED else _tunables.CUDA_TILE_ROWS


def _max_blocks():
    if SIMULATED:
        return 4
    try:
        sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    except Exception:  # no context yet: a safe upper bound
        sms = 132
    return sms * 32


_MAX_BLOCKS = None


def grid_1d(n, threads=None):
    """``(blocks, threads)`` for a grid-stride loop over ``n`` items."""
    global _MAX_BLOCKS
    if _MAX_BLOCKS is None:
        _MAX_BLOCKS = _max_blocks()
    threads = threads or THREADS
    return max(1, min(math.ceil(n / threads), _MAX_BLOCKS)), threads


def grid_tiles(rows, cols):
    """``(blocks, threads)`` 2-D launch covering a rows x cols matrix in
    TILE x TILE tiles, blocks of TILE x TILE_ROWS threads."""
    return ((math.ceil(cols / TILE), math.ceil(rows / TILE)), (TILE, TILE_ROWS))


def grid_tiles_3d(rows, cols, batch):
    """``(blocks, threads)`` for a batch of rows x cols matrices in TILE x TILE
    tiles (grid z over the batch). Grid axes y and z are capped (CUDA allows
    65535; the simulator gets 2 x 2 x 2 blocks), so kernels walk tiles and
    batch entries with grid-stride loops."""
    (gx, gy), threads = grid_tiles(rows, cols)
    cap_x, cap_yz = (2, 2) if SIMULATED else (2**31 - 1, 65535)
    return (min(gx, cap_x), min(gy, cap_yz), max(1, min(batch, cap_yz))), threads
