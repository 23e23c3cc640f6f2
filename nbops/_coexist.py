"""Keep OpenBLAS's idle threads from spinning on the cores nbops computes on.

After every multi-threaded call OpenBLAS's worker threads busy-wait for
``2**OPENBLAS_THREAD_TIMEOUT`` cycles (default 2**28, about 0.1 s) before
they sleep. In a NumPy pipeline where nbops' parallel kernels follow
``numpy.matmul``, those spinning threads hold the cores nbops' pool needs:
an nbops ``linear`` after a ``matmul`` ran up to ~100x its isolated time on
2 cores (tools/bench_startup.py --coexist; docs/startup.md). OpenBLAS reads
the timeout only when its pool starts, and NumPy starts it on import, so
setting the variable in nbops is too late; instead nbops restarts the pool
of each loaded OpenBLAS (the library's exported ``blas_thread_shutdown_``
and ``blas_thread_init``) with a timeout of ``2**COEXIST_TIMEOUT`` cycles,
a few microseconds. NumPy's calls then wake the sleeping workers, which
costs less than the spin saved (both directions within 1.3x of isolated).

Applied at ``import nbops`` to every OpenBLAS already loaded, and to the
SciPy copy when nbops loads it. Off with ``NBOPS_BLAS_COEXIST=0`` in the
environment, or ``nbops.set_blas_coexistence(False)`` at run time (which
restores OpenBLAS's default spin, or the user's ``OPENBLAS_THREAD_TIMEOUT``).
Restarting a pool while another thread is inside that OpenBLAS would break
that call: nbops does it at import and on request only.

The other direction: Numba's OpenMP workers spin after each nbops kernel
(libgomp's default spin count) and slow NumPy's next BLAS call. libgomp
reads ``GOMP_SPINCOUNT`` once, when it loads, which Numba does at nbops'
first parallel kernel; so ``import nbops`` sets ``GOMP_SPINCOUNT`` to
``OPENMP_SPINCOUNT`` in the process environment when libgomp is not loaded
yet and the user set neither it nor ``OMP_WAIT_POLICY`` (child processes
inherit it). Back-to-back nbops calls still find the workers awake.
"""

import ctypes
import os

# 2**14 cycles ~ 6 us: shorter than any nbops op that runs in parallel, long
# enough for back-to-back BLAS calls to find the workers awake.
COEXIST_TIMEOUT = 14
OPENBLAS_DEFAULT_TIMEOUT = 28
# ~30000 pause loops (about half a millisecond): longer than the Python between
# two nbops calls and than a small BLAS call, far shorter than libgomp's default
# 300000 (tools/bench_startup.py --only coexist; docs/startup.md).
OPENMP_SPINCOUNT = "30000"
_SYMBOLS = ("openblas_read_env", "openblas_thread_timeout", "blas_thread_shutdown_",
            "blas_thread_init")

# libraries: path -> timeout exponent applied; openmp: the GOMP_SPINCOUNT nbops
# set, or why it set none
state = {"enabled": None, "libraries": {}, "openmp": None}


def set_blas_coexistence(enabled=True):
    """Make OpenBLAS's idle threads sleep at once (``True``) or spin as
    OpenBLAS does by default (``False``), for every OpenBLAS loaded now.

    nbops turns this on at import (unless ``NBOPS_BLAS_COEXIST=0``) so that
    nbops' parallel kernels right after NumPy's BLAS calls are not slowed by
    OpenBLAS threads spinning on the same cores. Call it again after
    importing a library that loads another OpenBLAS. Returns the paths of
    the libraries changed. Other BLAS libraries (MKL, BLIS, Accelerate) are
    left alone. Process-wide; do not call it while another thread is
    inside a BLAS call.

    The OpenMP spin count (module docstring) can be taken back only until
    nbops' first parallel kernel has loaded libgomp.

    Example: ``nbops.set_blas_coexistence(False)`` to restore the default.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_blas_coexistence: enabled must be a bool, got {enabled!r}")
    state["enabled"] = enabled
    _openmp_spin(enabled)
    exponent = COEXIST_TIMEOUT if enabled else _user_timeout()
    return [path for path in _loaded_openblas() if _restart_pool(path, exponent)]


def get_blas_coexistence():
    """What nbops changed: ``{"enabled": bool, "openblas": {path: timeout
    exponent of the restarted pool}, "openmp": the GOMP_SPINCOUNT nbops set
    or a sentence saying why none}``.

    Example: ``nbops.get_blas_coexistence()["openblas"]``.
    """
    return {"enabled": bool(state["enabled"]), "openblas": dict(state["libraries"]),
            "openmp": state["openmp"]}


def apply_at_import():
    """The import-time default: on unless ``NBOPS_BLAS_COEXIST=0``."""
    if os.environ.get("NBOPS_BLAS_COEXIST", "1") in ("0", "false", "False", "no"):
        state["enabled"] = False
        return []
    try:
        return set_blas_coexistence(True)
    except Exception:  # a process nbops cannot inspect keeps OpenBLAS's default
        return []


def apply_to(path):
    """Bring a library loaded after import to the process's setting."""
    if state["enabled"] and path not in state["libraries"]:
        _restart_pool(path, COEXIST_TIMEOUT)


def _openmp_spin(enabled):
    """Set (or take back) nbops' GOMP_SPINCOUNT while libgomp can still read it."""
    ours = state["openmp"] == OPENMP_SPINCOUNT
    if _libgomp_loaded():
        if not ours:
            state["openmp"] = "libgomp was loaded before nbops: its spin count is set"
        return
    if not enabled:
        if ours and os.environ.get("GOMP_SPINCOUNT") == OPENMP_SPINCOUNT:
            del os.environ["GOMP_SPINCOUNT"]
        state["openmp"] = None
        return
    if ours:
        return
    user = [v for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if v in os.environ]
    if user:
        state["openmp"] = f"left as the user set it ({', '.join(user)})"
        return
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    state["openmp"] = OPENMP_SPINCOUNT


def _libgomp_loaded():
    """Whether the libgomp Numba's OpenMP layer links (the system's
    ``libgomp.so.1``, not the renamed copies wheels such as scikit-learn's
    vendor) or that layer itself is already loaded."""
    try:
        with open("/proc/self/maps") as f:
            names = {os.path.basename(line.split()[-1]) for line in f}
    except OSError:
        return True  # cannot tell: do not touch the environment
    return any(n.startswith("libgomp.so") or n.startswith("omppool") for n in names)


def _user_timeout():
    try:
        value = int(os.environ.get("OPENBLAS_THREAD_TIMEOUT", ""))
    except ValueError:
        return OPENBLAS_DEFAULT_TIMEOUT
    return min(max(value, 4), 30)


def _loaded_openblas():
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in os.path.basename(p))


def _restart_pool(path, exponent):
    """Restart one OpenBLAS pool with a ``2**exponent``-cycle idle spin;
    False (and nothing changed) when the library lacks the entry points."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    if not all(hasattr(lib, name) for name in _SYMBOLS):
        return False
    threads = _thread_count_functions(lib)
    before = threads[0]() if threads else None
    saved = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(exponent)
    try:
        lib.openblas_read_env()
        lib.blas_thread_shutdown_()
        lib.blas_thread_init()
    finally:
        if saved is None:
            del os.environ["OPENBLAS_THREAD_TIMEOUT"]
        else:
            os.environ["OPENBLAS_THREAD_TIMEOUT"] = saved
        lib.openblas_read_env()  # the library's other settings as the user left them
    if threads and threads[0]() != before:
        threads[1](before)
    state["libraries"][path] = exponent
    return True


def _thread_count_functions(lib):
    for get, put in (("openblas_get_num_threads", "openblas_set_num_threads"),
                     ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                     ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
                     ("openblas_get_num_threads64_", "openblas_set_num_threads64_")):
        if hasattr(lib, get) and hasattr(lib, put):
            g, s = getattr(lib, get), getattr(lib, put)
            g.restype, s.argtypes = ctypes.c_int, [ctypes.c_int]
            return g, s
    return None
