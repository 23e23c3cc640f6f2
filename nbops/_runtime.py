"""Process-wide settings: threads and debug mode."""

import contextlib
import ctypes
import functools
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


@contextlib.contextmanager
def _blas_threads(n):
    """Run the block with the BLAS behind Numba's ``np.dot`` on ``n`` threads.

    Numba's ``np.dot`` calls SciPy's OpenBLAS, whose own thread pool keeps
    spinning for a while after each call. Next to Numba's pool on the same
    cores the two pools fight over them (an MLP training step through the
    BLAS route ran 2.7x slower than through nbops' own GEMM on 2 cores), so
    the BLAS route runs BLAS on one thread per Numba worker instead. Where
    that OpenBLAS cannot be found (another BLAS), the block runs unchanged.
    The setting is process-wide, as OpenBLAS's is.
    """
    lib = _openblas()
    if lib is None:
        yield
        return
    get, set_ = lib
    old = get()
    if old != n:
        set_(n)
    try:
        yield
    finally:
        if old != n:
            set_(old)


@functools.lru_cache(maxsize=None)
def _openblas():
    """``(get, set)`` thread-count functions of the OpenBLAS SciPy loaded for
    scipy.linalg.cython_blas (not NumPy's own copy, a separate library with
    a separate pool), or None; looked up once."""
    try:
        import scipy.linalg.cython_blas  # noqa: F401  (loads the library)

        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except (ImportError, OSError):
        return None
    for path in sorted(p for p in paths if "scipy" in p and "numpy" not in p):
        from . import _coexist

        _coexist.apply_to(path)
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas", "openblas"):
            get = getattr(lib, f"{prefix}_get_num_threads", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads", None)
            if get is not None and set_ is not None:
                get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                return get, set_
    return None


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
