"""CPU kernels of :mod:`nbops.fusion`: generated parallel loops.

One kernel is generated per expression, reduction mode, number of collapsed
dimensions and *inner stride class* of each operand (0: broadcast, hoisted
out of the inner loop; 1: contiguous, a unit-stride load LLVM vectorizes;
s: any other stride). All kernels share one loop shape: ``prange`` over
(outer index x chunk of the innermost axis), then a unit-step inner loop.

* map: ``out[...] = expr``;
* "all": each chunk accumulates (sums in float64) into ``partials[q]``,
  combined here afterwards;
* "inner" (the reduced axis is the innermost): the same, one partial per
  (output element, chunk);
* "outer" (the reduced axis is not the innermost): each chunk of the
  innermost axis loops over the reduced axis and accumulates into its own
  slice of a buffer the size of the output: no two chunks share an element,
  so no atomics and no per-thread copies.

Transcendentals come from :mod:`nbops.cpu._approx` (vectorizable), the
activations from :mod:`nbops._formulas` (registered jitable by
``nbops.cpu.activations``).
"""

import math

import numba
import numpy as np
from numba.extending import register_jitable

from .. import _formulas
from .._codegen import cache_dir, source_module  # noqa: F401  (cache_dir: tests)
from . import _approx
from . import activations as _activations  # noqa: F401  (registers the formulas)

__all__ = ["run"]

exp = _approx.exp
tanh = _approx.tanh
erf = _approx.erf
log = getattr(_approx, "log", math.log)
sqrt = math.sqrt


@register_jitable
def maximum(a, b):
    # NaN in either operand propagates, as np.maximum
    return a if (a > b) | (a != a) else b


@register_jitable
def minimum(a, b):
    return a if (a < b) | (a != a) else b


for _name, _f in _formulas.functions().items():
    globals()["act_" + _name] = _f
del _name, _f

#: Innermost-axis elements per chunk for maps and reductions along it: large
#: enough that the loop overhead vanishes, small enough to balance threads.
MIN_CHUNK = 4096
#: Chunk of the innermost axis when a non-innermost axis is reduced: its
#: float64 accumulators (16 KiB) stay in L1 across the reduced axis.
OUTER_CHUNK = 2048

#: Elements below which a call runs on the calling thread, where waking the
#: pool costs more than the loop: measured with ``x * y + 1`` on 2 threads,
#: serial and parallel were even at 32K elements (about 100 us, map and sum)
#: and parallel won from 128K (150 vs 225 us); a loaded machine adds stalls
#: of milliseconds to parallel calls of any size.
SERIAL_BELOW = 1 << 16

_KERNELS = {}


def _mode(reduce, plan):
    if reduce is None:
        return "map"
    if plan.axis is None:
        return "all" if all(s == 0 for s in plan.out_strides) else "map"
    return "inner" if plan.axis == len(plan.shape) - 1 else "outer"


def _stride_class(s):
    return "0" if s == 0 else ("1" if s == 1 else "s")


def _source(prog, mode, reduce, ndim, axis, classes):
    """Python source of one kernel (see the module docstring)."""
    D, L = ndim, ndim - 1
    outer = [d for d in range(L) if not (mode == "outer" and d == axis)]
    nops = len(classes)
    args = ", ".join(f"a{i}" for i in range(nops))
    head = ["def kernel(out, SH, ST, OF, OS, NCH, K, C, INIT" + (f", {args}" if args else "")
            + "):"]
    body = [f"nL = SH[{L}]",
            "nO = " + (" * ".join(f"SH[{d}]" for d in outer) if outer else "1"),
            "for q in prange(nO * NCH):",
            "    t = q // NCH",
            "    k = q - t * NCH",
            "    jlo = (k * nL) // NCH",
            "    jhi = ((k + 1) * nL) // NCH"]
    ind = "    "
    for d in reversed(outer):
        body += [f"    i{d} = t % SH[{d}]", f"    t = t // SH[{d}]"]

    for a in range(nops):
        body.append(f"    b{a} = " + " + ".join([f"OF[{a}]"] + [f"i{d} * ST[{a * D + d}]"
                                                             for d in outer]))
    if mode == "outer":
        body.append("    ob = " + (" + ".join(f"i{d} * OS[{d}]" for d in outer) or "0"))
    elif mode == "map":
        body.append("    ob = q // NCH * nL")
    base = "b"
    if mode == "outer":
        body.append(f"    for r in range(SH[{axis}]):")
        ind = "        "
        for a in range(nops):
            body.append(f"{ind}c{a} = b{a} + r * ST[{a * D + axis}]")
        base = "c"
    elif mode in ("all", "inner"):
        body.append("    acc = 0.0" if reduce != "max" else "    acc = INIT")
    loads = []
    for a, cls in enumerate(classes):
        if cls == "0":
            body.append(f"{ind}x{a} = a{a}[{base}{a}]")
        else:
            idx = "j" if cls == "1" else f"j * ST[{a * D + L}]"
            # unsigned: a signed index gets a negative-wraparound select per
            # element, and LLVM then vectorizes the loads as gathers (several
            # times slower); every index here is in bounds and >= 0
            loads.append(f"x{a} = a{a}[uint64({base}{a} + {idx})]")
    inner = ind + "    "
    body.append(f"{ind}for j in range(jlo, jhi):")
    body += [inner + s for s in loads + prog.lines]
    if mode == "map":
        body.append(f"{inner}out[uint64(ob + j)] = {prog.result}")
    else:
        body += [inner + s for s in prog.accumulate(
            reduce, "out[uint64(ob + j)]" if mode == "outer" else "acc")]
    if mode in ("all", "inner"):
        body.append("    out[q] = acc")
    names = sorted(prog.names)
    lines = ["# generated by nbops.cpu.fusion: one fused kernel; do not edit",
             "from numba import prange",
             "from numpy import uint64",
             "from nbops._jit import FASTMATH, FASTMATH_REDUCE, serial_and_parallel"]
    if names:
        lines.append(f"from nbops.cpu.fusion import {', '.join(names)}")
    flags = "FASTMATH" if mode == "map" else "FASTMATH_REDUCE"
    lines += ["", ""] + head + ["    " + s for s in body]
    lines += ["", "", f"serial, parallel = serial_and_parallel(kernel, 'kernel', fastmath={flags})"]
    return "\n".join(lines) + "\n"


def kernel_for(prog, reduce, plan):
    """The compiled kernel of ``prog`` for this call's mode and stride classes."""
    mode = _mode(reduce, plan)
    L = len(plan.shape) - 1
    classes = tuple(_stride_class(o.strides[L]) for o in plan.operands)
    key = (id(prog), mode, reduce if mode != "map" else None, len(plan.shape),
           plan.axis, classes)
    hit = _KERNELS.get(key)
    if hit is not None and hit[0] is prog:
        return mode, hit[1]
    src = _source(prog, mode, reduce, len(plan.shape), plan.axis, classes)
    mod = source_module(src, "cpu")
    kern = (mod.serial, mod.parallel)
    _KERNELS[key] = (prog, kern)
    return mode, kern


def _chunks(mode, plan):
    n_last = plan.shape[-1]
    if mode == "outer":
        return max(1, -(-n_last // OUTER_CHUNK))
    n_outer = int(np.prod(plan.shape[:-1], dtype=np.int64))
    target = 4 * numba.get_num_threads()
    return int(max(1, min(-(-target // n_outer), n_last // MIN_CHUNK)))


def run(prog, reduce, plan, size, out, dtype, K):
    """Evaluate ``prog`` over ``plan`` into ``out`` (map, axis reduction) or
    return the reduced scalar (``out`` None or 0-d); sums in float64."""
    if size == 0:
        return _empty(reduce, plan, out, dtype)
    mode, (serial, parallel) = kernel_for(prog, reduce, plan)
    kern = parallel if size >= SERIAL_BELOW else serial
    nch = _chunks(mode, plan)
    shape = plan.shape
    n_outer = int(np.prod([n for d, n in enumerate(shape[:-1]) if d != plan.axis or
                           mode != "outer"], dtype=np.int64))
    st = tuple(int(s) for o in plan.operands for s in o.strides) or (0,)
    of = tuple(int(o.offset) for o in plan.operands) or (0,)
    init = np.dtype(dtype).type(-np.inf)
    consts = _formulas.consts(dtype)
    bases = [o.base for o in plan.operands]
    sh = tuple(int(n) for n in shape)
    os_ = tuple(int(s) for s in plan.out_strides)
    if mode == "map":
        kern(out.reshape(-1), sh, st, of, os_, nch, K, consts, init, *bases)
        return out
    if mode == "outer":
        acc = np.zeros(out.size, np.float64) if reduce != "max" else \
            np.full(out.size, init, dtype)
        kern(acc, sh, st, of, os_, nch, K, consts, init, *bases)
        if reduce == "mean":
            acc /= shape[plan.axis]
        out[...] = acc.reshape(out.shape)
        return out
    partials = np.empty(n_outer * nch, np.float64 if reduce != "max" else dtype)
    kern(partials, sh, st, of, os_, nch, K, consts, init, *bases)
    parts = partials.reshape(n_outer, nch) if mode == "inner" else partials.reshape(1, -1)
    if reduce == "max":
        vals = parts.max(axis=1)
    else:
        vals = parts.sum(axis=1)
        if reduce == "mean":
            vals /= size if mode == "all" else shape[plan.axis]
    if mode == "all":
        value = np.dtype(dtype).type(vals[0])
        if out is not None:
            out[...] = value
            return out
        return value
    out[...] = vals.reshape(out.shape)
    return out


def _empty(reduce, plan, out, dtype):
    """Results over an empty iteration space (max of nothing is refused earlier)."""
    fill = {None: None, "sum": 0.0, "mean": np.nan, "max": None}[reduce]
    if out is None:
        return np.dtype(dtype).type(fill)
    if fill is not None and out.size:
        out[...] = fill
    return out
