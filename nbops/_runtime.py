"""Process-wide settings: threads and debug mode."""

import os

from . import _dispatch


def set_num_threads(n):
    """Use ``n`` threads in CPU kernels (1 <= n <= the cores Numba found).

    Example: ``nbops.set_num_threads(1)`` for single-threaded timings.
    """
    import numba

    limit = numba.config.NUMBA_NUM_THREADS
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limit:
        raise ValueError(f"set_num_threads: n must be an int in [1, {limit}], got {n!r}")
    numba.set_num_threads(n)


def get_num_threads():
    """Number of threads CPU kernels use."""
    import numba

    return numba.get_num_threads()


def set_debug(enabled=True):
    """Turn debug mode on or off (also ``NBOPS_DEBUG=1`` at start-up).

    In debug mode every operator's output is checked for NaN/Inf values
    that its inputs did not have (raising ``FloatingPointError`` naming the
    operator and the first bad element), and each call's shapes, dtypes and
    value ranges are logged at DEBUG level on the ``"nbops"`` logger. The
    checks copy device arrays to the host: slow, meant for debugging.
    """
    _dispatch._Hooks.debug = bool(enabled)
    _dispatch._Hooks.refresh()


def get_debug():
    """Whether debug mode is on."""
    return _dispatch._Hooks.debug


if os.environ.get("NBOPS_DEBUG", "0") not in ("", "0", "false", "False"):
    set_debug(True)
