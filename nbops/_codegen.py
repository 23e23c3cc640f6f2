"""How kernel modules of both devices build kernels from shared text.

Device-neutral: it imports neither ``numba.cuda`` nor any kernel module, so
CPU and CUDA kernel modules alike take from it:

* :func:`generated` compiles generated source under a real file name;
  :func:`source_module` writes generated source to a file named by its
  hash and imports it, for kernels whose source exists only at run time;
* :func:`bind` specialises a template function: a copy whose globals are
  a given scope (tile sizes, helpers) under a name of its own;
* :func:`twins` compiles a family of scalar functions for one target
  (``register_jitable``, ``cuda.jit(device=True)``) in one shared scope,
  so that helpers they call resolve to their compiled twins too;
* :func:`per_dtype` memoises a builder of kernels per NumPy dtype.

Numba's on-disk cache finds a kernel by its source file and qualified name,
so every copy made here takes the name it is given as its qualname.
"""

import functools
import hashlib
import importlib.util
import os
import sys
import types

import numpy as np


def generated(source, name, scope, module):
    """Execute generated ``source`` in ``scope`` and return function ``name``.

    Compiled under the file of the module named ``module`` (the caller's
    ``__name__``), so that Numba's on-disk cache can locate it, and with that
    module's name as ``__name__`` (the cache rebuilds globals from it)."""
    scope.setdefault("__name__", module)
    exec(compile(source, sys.modules[module].__file__, "exec"), scope)
    fn = scope[name]
    fn.__qualname__ = name
    return fn


def cache_dir():
    """Where generated kernel sources live: ``$NBOPS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/nbops`` or ``~/.cache/nbops``."""
    base = os.environ.get("NBOPS_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "nbops")
    return base


def source_module(source, prefix):
    """Import generated ``source`` from a file named by its hash (written once),
    so that Numba's ``cache=True`` finds it again in a later process."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    modname = f"_nbops_{prefix}_{digest}"
    mod = sys.modules.get(modname)
    if mod is not None:
        return mod
    folder = os.path.join(cache_dir(), "fusion")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, modname + ".py")
    try:
        with open(path) as f:
            current = f.read()
    except OSError:
        current = None
    if current != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def bind(template, scope, name, defaults=True):
    """A copy of ``template`` named ``name`` whose global names resolve in
    ``scope``: how a kernel module specialises a template (tile sizes,
    helpers) into a kernel with its own on-disk cache entry. ``defaults``
    False leaves the template's default arguments behind."""
    fn = types.FunctionType(template.__code__, scope, name,
                            template.__defaults__ if defaults else None, template.__closure__)
    fn.__qualname__ = name
    return fn


def twins(functions, compile_, scope, suffix=""):
    """Compile each of ``functions`` (name -> function) with ``compile_``
    as a copy whose globals are ``scope``, and store it there under its
    name: a formula's helpers then resolve to their compiled twins, e.g. the
    CUDA device functions of formulas written once for both devices, with
    ``scope`` rebinding what differs (``m`` to :mod:`math`). ``suffix`` is
    added to each copy's name (cached CPU kernels must not share helper
    symbols). Returns ``scope``."""
    for name, fn in functions.items():
        scope[name] = compile_(bind(fn, scope, name + suffix))
    return scope


def per_dtype(build):
    """Memoise ``build(dtype)`` per NumPy dtype (``np.float32`` and
    ``np.dtype("float32")`` are one key): kernels are built on first use and
    once per process."""
    built = {}

    @functools.wraps(build)
    def get(dtype):
        key = np.dtype(dtype)
        made = built.get(key)
        if made is None:
            made = built[key] = build(key)
        return made

    get.built = built
    return get
