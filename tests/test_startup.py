"""Start-up: what ``import nbops`` loads, and the fast load path of cached
kernels (:mod:`nbops._fastload`) against Numba's normal path."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbops import _fastload

KERNEL_PREFIXES = ("nbops.cpu.", "nbops.cuda", "nbops.quant.cpu", "nbops.quant.cuda",
                   "nbops.sparse.cpu", "nbops.sparse.cuda", "nbops.neuromorphic.cpu",
                   "nbops.neuromorphic.cuda")


def _run(code, env_extra=None, cwd=None):
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_kernel_module_nor_scipy_linalg():
    loaded = _run("""
        import json, sys
        import nbops
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(%r)
                                or m == "scipy.linalg")))
    """ % (KERNEL_PREFIXES,))
    assert loaded == []


KERNELS = '''
import numpy as np
from numba import prange, types
from nbops._jit import cpu_kernel

@cpu_kernel(parallel=True)
def scale(x, out):
    for i in prange(x.size):
        out[i] = 2.0 * x[i] + 1.0

@cpu_kernel
def strhash(s):
    return hash(s)

# an external function whose symbol the loading process registers only in
# the full refresh (as Numba's registry imports register theirs): a kernel
# that needs the full refresh
_twice = types.ExternalFunction("nbops_test_twice", types.int64(types.int64))

@cpu_kernel
def ext(n):
    return _twice(n)
'''

CALL = """
    import json, sys
    sys.path.insert(0, %r)
    import numpy as np
    import ctypes
    import llvmlite.binding as ll
    from numba.core import base
    twice = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lambda n: 2 * n)
    if %r:  # compiling: the symbol is there from the start
        ll.add_symbol("nbops_test_twice", ctypes.cast(twice, ctypes.c_void_p).value)
    else:
        refresh = base.BaseContext.refresh
        def refresh_registering(self):
            ll.add_symbol("nbops_test_twice", ctypes.cast(twice, ctypes.c_void_p).value)
            refresh(self)
        base.BaseContext.refresh = refresh_registering
    import fastload_kernels as k
    from nbops import _fastload
    %s
    x = np.linspace(-2, 2, 257).astype(np.float32)
    out = np.empty_like(x)
    k.scale(x, out)
    h = k.strhash("nbops start-up")
    print(json.dumps({"scale": out.tolist(), "hash": h, "py_hash": hash("nbops start-up"),
                      "ext": k.ext(21),
                      "stats": _fastload.stats, "hits": sum(k.scale.stats.cache_hits.values())
                      + sum(k.strhash.stats.cache_hits.values())
                      + sum(k.ext.stats.cache_hits.values())}))
"""


@pytest.fixture(scope="module")
def cached_kernels(tmp_path_factory):
    """A kernel module compiled once into its own cache directory."""
    root = tmp_path_factory.mktemp("fastload")
    (root / "fastload_kernels.py").write_text(KERNELS)
    env = {"NUMBA_CACHE_DIR": str(root / "cache")}
    first = _run(CALL % (str(root), True, ""), env)
    assert first["hits"] == 0  # compiled, not loaded
    return root, env, first


def test_fast_path_loads_and_matches_numba(cached_kernels):
    root, env, first = cached_kernels
    fast = _run(CALL % (str(root), False, ""), env)
    assert fast["hits"] == 3
    # scale and strhash load through the fast path; ext needs a symbol only
    # the full refresh registers, so it falls back to Numba's path and works
    assert fast["stats"] == {"fast": 2, "fallback": 1}
    assert fast["ext"] == 42
    assert fast["scale"] == first["scale"]
    assert fast["hash"] == fast["py_hash"]


def test_switched_off_and_unsupported_version_take_numbas_path(cached_kernels):
    root, env, first = cached_kernels
    off = _run(CALL % (str(root), False, ""), dict(env, NBOPS_FASTLOAD="0"))
    assert off["stats"] == {"fast": 0, "fallback": 0} and off["hits"] == 3
    other = _run(CALL % (str(root), False, "_fastload.SUPPORTED = ('0.0.',)"), env)
    assert other["stats"] == {"fast": 0, "fallback": 0} and other["hits"] == 3
    assert off["scale"] == other["scale"] == first["scale"]
    assert off["hash"] == off["py_hash"] and other["hash"] == other["py_hash"]
    assert off["ext"] == other["ext"] == 42


def test_broken_internal_falls_back(cached_kernels):
    root, env, first = cached_kernels
    # an object format the symbol check cannot read (or any error in the
    # fast path): every kernel loads through Numba's path
    broken = _run(CALL % (str(root), False, "_fastload.undefined_symbols = None"), env)
    assert broken["stats"] == {"fast": 0, "fallback": 3} and broken["hits"] == 3
    assert broken["scale"] == first["scale"] and broken["ext"] == 42


def test_undefined_symbols_refuses_non_elf():
    with pytest.raises(ValueError):
        _fastload.undefined_symbols(b"MZ not an ELF file")
