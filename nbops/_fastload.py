"""A cheaper first load of nbops' cached CPU kernels.

Numba's ``Cache.load_overload`` calls ``BaseContext.refresh()`` before it
reads a cached kernel: that imports every lowering registry (numba.np.arraymath
among them, whose import-time BLAS check imports scipy.linalg) and costs most
of the first call of any cached function in a fresh process. A cached kernel
only needs the runtime its machine code links against (Numba's NRT, whose
symbols ``rtsys.initialize`` registers, and what the kernel's own
``reload_init`` functions set up, e.g. the parallel threading layer), so this
path initialises only that, checks that every symbol the object code leaves
undefined is then known to LLVM, and rebuilds the kernel.

Anything unexpected (a Numba version this was not checked against, an
internal missing or shaped differently, a non-ELF object, an undefined symbol
that only a full refresh provides, any exception) takes Numba's own path, so
the result is always what Numba would have loaded. ``NBOPS_FASTLOAD=0``
switches it off. See docs/startup.md.
"""

import os
import struct

import numba

#: Numba releases whose cache internals this module was checked against.
SUPPORTED = ("0.68.",)

#: Counters, for tests and the start-up benchmark.
stats = {"fast": 0, "fallback": 0}

_runtime_ready = False


def enabled():
    """Whether the fast path applies in this process (Numba version, env)."""
    if os.environ.get("NBOPS_FASTLOAD", "1") in ("0", "false", "False"):
        return False
    return numba.__version__.startswith(SUPPORTED)


def install(disp):
    """Give dispatcher ``disp``'s cache the fast load path (no-op when the
    cache is missing or the Numba version is not supported)."""
    cache = getattr(disp, "_cache", None)
    normal = getattr(cache, "load_overload", None)
    if normal is None or not hasattr(cache, "_cache_file") or not enabled():
        return

    def load_overload(sig, target_context):
        cres = None
        try:
            if enabled():
                cres = _fast(cache, sig, target_context)
        except Exception:  # noqa: BLE001  (any surprise: Numba's own path)
            cres = None
        if cres is not None:
            stats["fast"] += 1
            return cres
        if enabled():
            stats["fallback"] += 1
        return normal(sig, target_context)

    cache.load_overload = load_overload


def _fast(cache, sig, ctx):
    global _runtime_ready
    from numba.core import compiler
    from numba.core.runtime import rtsys
    import llvmlite.binding as ll

    if not getattr(cache, "_enabled", False):
        return None
    if not _runtime_ready:
        rtsys.initialize(ctx)
        _runtime_ready = True
    data = cache._cache_file.load(cache._index_key(sig, ctx.codegen()))
    # payload of CompileResult._reduce in Numba 0.68: (libdata, fndesc, env,
    # signature, objectmode, lifted, typeann, reload_init, referenced_envs)
    if not (isinstance(data, tuple) and len(data) == 9):
        return None
    libdata, reload_init = data[0], data[7]
    if not (isinstance(libdata, tuple) and len(libdata) == 3 and libdata[1] == "object"):
        return None
    if data[4]:  # object mode: leave to Numba
        return None
    for fn in reload_init or ():
        fn()
    obj = libdata[2][0]
    for name in undefined_symbols(obj):
        if not ll.address_of_symbol(name):
            return None  # a symbol only the full refresh registers
    return compiler.CompileResult._rebuild(ctx, *data)


def undefined_symbols(obj):
    """Names of the undefined global symbols of a 64-bit little-endian ELF
    object (bytes). Raises ValueError for anything else."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF object")
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize)
                for i in range(shnum)]
    names = []
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        off, size, entsize = sh[4], sh[5], sh[9]
        for pos in range(off + entsize, off + size, entsize):  # entry 0 is null
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, pos)
            if st_shndx == 0 and st_info >> 4 in (1, 2) and st_name:  # UNDEF, GLOBAL/WEAK
                end = obj.index(b"\0", str_off + st_name)
                names.append(obj[str_off + st_name:end].decode())
    return names
