"""Start-up: what ``import nbops`` loads, and the fast load path of cached
kernels (:mod:`nbops._fastload`) against Numba's normal path."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbops import _fastload


def _run(code, env_extra=None, cwd=None):
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_scipy_linalg():
    # (no kernel module either: tests/test_layout.py)
    loaded = _run("""
        import json, sys
        import nbops
        print(json.dumps([m for m in sys.modules if m.startswith("scipy.linalg")]))
    """)
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


# --- nbops beside NumPy's BLAS (nbops/_coexist.py) --------------------------
# Whether a thread pool spins is read from the CPU time a process burns while
# its main thread sleeps right after a call: a spinning worker burns it, a
# sleeping one does not (OpenBLAS's default spin is ~0.1 s; nbops' 2**14 cycles).
SPIN_PROBE = """
    import json, os, sys, time
    import numpy as np
    import nbops

    a = np.ones((512, 512), np.float32)
    g = np.ones(1 << 20, np.float32)

    def burned(call, tries=4):
        out = []
        for _ in range(tries):
            call()
            c0 = time.process_time()
            time.sleep(0.2)
            out.append(time.process_time() - c0)
        return max(out)

    def report():
        return {"blas": burned(lambda: a @ a), "nbops": burned(lambda: nbops.gelu(g)),
                "state": nbops.get_blas_coexistence(),
                "gomp": os.environ.get("GOMP_SPINCOUNT")}

    first = report()
    toggled = None
    if len(sys.argv) > 1:
        nbops.set_blas_coexistence(sys.argv[1] == "on")
        toggled = report()
    print(json.dumps({"first": first, "toggled": toggled}))
"""
# at most this much CPU burned in 0.2 s of sleep: no spinning. A spinning pool
# burns ~0.1 s; 3 ms was inside process_time's noise on a loaded 2-core CI
# machine (3.7 ms seen with the pool quiet), 20 ms keeps a 5x margin.
QUIET_CPU_S = 0.02


def _spin_probe(env_extra, toggle=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT",
                        "NBOPS_BLAS_COEXIST", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    args = [sys.executable, "-c", textwrap.dedent(SPIN_PROBE)] + ([toggle] if toggle else [])
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.cpu_count() < 2, reason="thread pools need two cores to spin beside")
def test_blas_coexistence_is_applied_at_import():
    r = _spin_probe({})["first"]
    state = r["state"]
    assert state["enabled"] is True
    assert any("openblas" in p for p in state["openblas"]), state
    assert set(state["openblas"].values()) == {14}
    from nbops._coexist import OPENMP_SPINCOUNT

    assert r["gomp"] == state["openmp"] == OPENMP_SPINCOUNT
    assert r["blas"] < QUIET_CPU_S, f"OpenBLAS kept spinning: {r}"
    assert r["nbops"] < QUIET_CPU_S, f"nbops' OpenMP pool kept spinning: {r}"


@pytest.mark.skipif(os.cpu_count() < 2, reason="thread pools need two cores to spin beside")
def test_blas_coexistence_off_leaves_openblas_spinning():
    r = _spin_probe({"NBOPS_BLAS_COEXIST": "0"})["first"]
    assert r["state"] == {"enabled": False, "openblas": {}, "openmp": None}
    assert r["gomp"] is None
    assert r["blas"] > QUIET_CPU_S, f"OpenBLAS's default spin not seen: {r}"


@pytest.mark.skipif(os.cpu_count() < 2, reason="thread pools need two cores to spin beside")
def test_set_blas_coexistence_at_run_time():
    off = _spin_probe({}, toggle="off")["toggled"]
    assert off["state"]["enabled"] is False
    assert set(off["state"]["openblas"].values()) == {28}   # OpenBLAS's default restored
    assert off["blas"] > QUIET_CPU_S, off
    on = _spin_probe({"NBOPS_BLAS_COEXIST": "0"}, toggle="on")["toggled"]
    assert set(on["state"]["openblas"].values()) == {14}
    assert on["blas"] < QUIET_CPU_S, on
    # libgomp was loaded (by the first gelu) before the switch: nbops says so
    assert "libgomp was loaded" in on["state"]["openmp"]


def test_blas_coexistence_respects_the_users_settings():
    r = _run("""
        import json, os
        os.environ["GOMP_SPINCOUNT"] = "12345"
        import nbops
        print(json.dumps([os.environ["GOMP_SPINCOUNT"], nbops.get_blas_coexistence()["openmp"]]))
    """)
    assert r[0] == "12345"
    assert "left as the user set it" in r[1]
    import nbops

    with pytest.raises(TypeError, match="set_blas_coexistence: enabled must be a bool"):
        nbops.set_blas_coexistence("yes")
