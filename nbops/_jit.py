"""How nbops compiles its CPU kernels.

``cpu_kernel`` is ``numba.njit`` with the project's settings:

* ``cache=True`` and ``nogil=True`` always;
* ``error_model="numpy"``: IEEE division, no ZeroDivisionError;
* a fastmath flag set that keeps IEEE special values: ``contract`` (FMA),
  ``nsz``, ``arcp`` and ``afn``, but never ``nnan``/``ninf`` (they fold
  ``isnan`` to False and let NaN inputs vanish) nor, by default,
  ``reassoc`` (it turns register-tiled loops into spilling reductions);
* LLVM's SLP vectorizer switched on while *our* kernels compile, and on
  request (``hoist_checks=False``) LLVM's hoisting of the loop
  vectorizer's runtime alias checks switched off.

Numba ships with the SLP vectorizer off (``NUMBA_SLP_VECTORIZE=0``), and
register-tiled kernels run an order of magnitude slower without it. A
library cannot ask its users to set an environment variable before they
import numba, and flipping ``numba.config.SLP_VECTORIZE`` for the whole
process would change how the user's own functions compile. Numba reads the
setting each time it builds a pass manager, i.e. during compilation, and
every compilation of a dispatcher (first call, a call from another jitted
function, or a cache load) goes through ``Dispatcher.compile``; so each
kernel's ``compile`` is wrapped to switch SLP on for its own duration only.
``tests/test_jit.py`` proves it by reading the assembly.

The alias checks: an inner loop that writes one array while reading others
runs vectorized only after a runtime test that they do not overlap. LLVM
(``-hoist-runtime-checks``, on by default) moves that test out of an
enclosing loop, widening each range to every outer iteration; for Numba's
array views (row ``t`` of a 2-D array, strides known only at run time)
the widened test fails whatever the arrays, and the loop runs scalar on
every call (several times slower; docs/benchmarks.md). With
``hoist_checks=False`` the wrapper sets the LLVM option to false for the
kernel's compilation, under Numba's compiler lock, and back to LLVM's
default after it (a user's own compilations are left as they
were, unless they had changed that option themselves). Opt-in: the
checks then run once per outer iteration, which cost the small-matrix
GEMM kernels more than it saved, while the spiking backward (per-neuron
accumulators written while rows of ``[T, n]`` buffers are read) gained
(docs/benchmarks.md).

Numba's on-disk cache checks only the source file of the function it
caches, not the modules that function calls into; a kernel built from
:mod:`nbops._formulas`, :mod:`nbops._scalars`, :mod:`nbops.cpu._approx`,
:mod:`nbops.cpu._memory`, the tables of :mod:`nbops.cpu._piecewise`, the
neuron equations of :mod:`nbops.neuromorphic.lif` or the constants of
:mod:`nbops._tunables` would keep running stale machine code after one of
them changed. ``cpu_kernel`` therefore adds a digest of those shared
sources (and of this file) to each kernel's cache key."""

import hashlib
import pathlib
import warnings

import llvmlite.binding as llvm
from numba import config, njit
from numba.core.compiler_lock import global_compiler_lock
from numba.core.errors import NumbaIRAssumptionWarning

from . import _fastload
from ._codegen import bind

#: Flags for elementwise and register-tiled kernels (no nnan/ninf, no reassoc).
FASTMATH = frozenset({"contract", "nsz", "arcp", "afn"})
#: Adds reassoc: for reductions whose order does not matter to the result's
#: stated tolerance (lets LLVM vectorize a sum).
FASTMATH_REDUCE = FASTMATH | {"reassoc"}

def cpu_kernel(fn=None, *, parallel=False, fastmath=FASTMATH, slp=True, hoist_checks=True,
               **options):
    """Decorate a CPU kernel: ``numba.njit`` with cache, nogil, safe fastmath
    flags and (for this kernel's compilation only) the SLP vectorizer.

    Usable bare (``@cpu_kernel``) or with options
    (``@cpu_kernel(parallel=True)``); extra options go to ``numba.njit``.
    """

    # IEEE division (x / 0 is inf or nan, as in NumPy) rather than Python's
    # ZeroDivisionError, whose per-division test also gets in the vectorizer's way
    options.setdefault("error_model", "numpy")

    def deco(f):
        disp = njit(cache=True, nogil=True, parallel=parallel,
                    fastmath=set(fastmath), **options)(f)
        _compile_with_settings(disp, slp, hoist_checks)
        _key_on_shared_sources(disp)
        _fastload.install(disp)
        return disp

    return deco(fn) if fn is not None else deco


#: Sources that kernels in other files compile into themselves.
SHARED_SOURCES = ("_jit.py", "_codegen.py", "_tunables.py", "_formulas.py", "_scalars.py",
                  "cpu/_regtile.py",
                  "cpu/_approx.py", "cpu/_memory.py", "cpu/_piecewise.py", "neuromorphic/lif.py",
                  "cpu/linalg.py")
_digest = None


def _shared_digest():
    global _digest
    if _digest is None:
        root = pathlib.Path(__file__).parent
        h = hashlib.sha256()
        for rel in SHARED_SOURCES:
            path = root / rel
            h.update(path.read_bytes() if path.exists() else b"")
        _digest = h.hexdigest()
    return _digest


def _key_on_shared_sources(disp):
    cache = getattr(disp, "_cache", None)
    index_key = getattr(cache, "_index_key", None)
    if index_key is None:  # caching unavailable (e.g. no writable directory)
        return

    def keyed(sig, codegen):
        sig_, magic, hashes = index_key(sig, codegen)
        return sig_, magic, hashes + (_shared_digest(),)

    cache._index_key = keyed


def _compile_with_settings(disp, slp, hoist_checks=True):
    compile_ = disp.compile

    def compile(sig):
        # under Numba's compiler lock: no other compilation sees the settings
        with global_compiler_lock, warnings.catch_warnings():
            # Formulas inlined at IR level with selects trip Numba's pedantic
            # scope check (NumbaIRAssumptionWarning); the code they compile to
            # is what the tests check. Silenced for our compilations only.
            warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
            saved = config.SLP_VECTORIZE
            if slp:
                config.SLP_VECTORIZE = 1
            if not hoist_checks:
                llvm.set_option("", "-hoist-runtime-checks=false")
            try:
                return compile_(sig)
            finally:
                if not hoist_checks:
                    llvm.set_option("", "-hoist-runtime-checks=true")
                config.SLP_VECTORIZE = saved

    disp.compile = compile


def serial_and_parallel(fn, name, **options):
    """``(serial, parallel)``: two CPU kernels compiled from one function
    (``prange`` runs as ``range`` in the serial one), so that a launcher can
    keep small inputs off the thread pool, whose wake-up and barrier cost
    more than a short loop. ``name`` gives each its own on-disk cache entry.
    """
    return tuple(cpu_kernel(bind(fn, fn.__globals__, f"{name}_{kind}"), parallel=parallel,
                            **options)
                 for parallel, kind in ((False, "serial"), (True, "parallel")))
