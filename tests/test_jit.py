"""nbops' CPU kernels compile with the SLP vectorizer on, whatever the
process-wide Numba setting, and leave that setting (and the user's own
functions) alone. Proven on the generated assembly."""

import re

import numpy as np
from numba import config, njit

from nbops import _jit


def _straight_line(a, b):
    # four independent scalar FMAs on neighbouring elements: only the SLP
    # vectorizer (not the loop vectorizer) can pack them into one vector op;
    # all loads come before the stores so that aliasing cannot stop it
    r0 = a[0] * a[4] + b[0]
    r1 = a[1] * a[5] + b[1]
    r2 = a[2] * a[6] + b[2]
    r3 = a[3] * a[7] + b[3]
    b[0] = r0
    b[1] = r1
    b[2] = r2
    b[3] = r3


def _packed_fma(asm):
    return re.search(r"vfmadd\w*pd\s+%ymm|vfmadd\w*pd\s+%zmm|vfmadd\w*pd\s+.*%ymm", asm) is not None


def _compile(disp):
    a = np.arange(8.0)
    b = np.ones(4)
    disp(a, b)
    return disp.inspect_asm(disp.signatures[0])


def test_slp_on_for_nbops_kernels_only():
    assert config.SLP_VECTORIZE == 0  # numba's default, and what the user gets
    ours = njit(cache=False, fastmath={"contract"})(_straight_line)
    _jit._compile_with_settings(ours, slp=True)
    theirs = njit(cache=False, fastmath={"contract"})(
        type(_straight_line)(_straight_line.__code__, globals(), "user_fn"))
    asm_ours = _compile(ours)
    asm_theirs = _compile(theirs)
    assert config.SLP_VECTORIZE == 0, "the setting must be restored after our compile"
    assert _packed_fma(asm_ours), "SLP did not vectorize the nbops kernel"
    assert not _packed_fma(asm_theirs), "the user's function must compile with numba's defaults"


def test_runtime_check_hoisting_off_while_nbops_compiles(monkeypatch):
    # LLVM's hoisting of the vectorizer's alias checks out of outer loops is
    # switched off, on request, for that kernel's compilation only (see
    # nbops._jit): set to false before Numba compiles and back to LLVM's
    # default after, also when the compilation fails, under Numba's
    # compiler lock; other kernels leave the option alone
    from numba.core.compiler_lock import global_compiler_lock

    calls = []

    def set_option(name, option):
        calls.append((option, global_compiler_lock.is_locked()))

    monkeypatch.setattr(_jit.llvm, "set_option", set_option)

    def rows_into(acc, m):
        for t in range(m.shape[0]):
            row = m[t]
            for i in range(acc.shape[0]):
                acc[i] += row[i]

    ours = njit(cache=False)(rows_into)
    _jit._compile_with_settings(ours, slp=False, hoist_checks=False)
    acc = np.zeros(5)
    ours(acc, np.ones((3, 5)))
    np.testing.assert_array_equal(acc, 3.0)
    assert calls == [("-hoist-runtime-checks=false", True), ("-hoist-runtime-checks=true", True)]
    calls.clear()
    try:
        ours(acc, "not an array")
    except Exception:
        pass
    assert [c[0] for c in calls] == ["-hoist-runtime-checks=false", "-hoist-runtime-checks=true"]
    calls.clear()
    default = njit(cache=False)(type(rows_into)(rows_into.__code__, {}, "rows_into_default"))
    _jit._compile_with_settings(default, slp=False)
    default(acc, np.ones((3, 5)))
    assert calls == []


def test_cpu_kernel_options():
    k = _jit.cpu_kernel(lambda x: x + 1)
    assert type(k._cache).__name__ == "FunctionCache"  # cache=True
    assert k.targetoptions["nogil"]
    flags = k.targetoptions["fastmath"]
    assert "nnan" not in str(flags) and "ninf" not in str(flags)


def _plus_one(x):
    return x + 1


def test_cache_key_covers_shared_sources():
    """Editing _formulas.py or cpu/_approx.py must invalidate cached kernels
    that inline them, although Numba checks only the kernel's own file."""
    k = _jit.cpu_kernel(_plus_one)
    k(1.0)
    sig = k.signatures[0]
    key = k._cache._index_key(sig, k.targetctx.codegen())
    assert key[-1][-1] == _jit._shared_digest()
    saved = _jit._digest
    try:
        _jit._digest = "edited"
        assert k._cache._index_key(sig, k.targetctx.codegen()) != key
    finally:
        _jit._digest = saved
