"""CPU kernels of the activations, generated from :mod:`nbops._formulas`.

Every activation gets kernels for forward and backward, each in a flat form
(C-contiguous arrays as 1-D, one ``prange`` over elements: LLVM vectorizes it
at memory speed; plus a serial twin for small arrays), a 2-D strided form
for views (``prange`` over rows), and, for the formulas of plain arithmetic
(no transcendental function: relu, leaky_relu, hardswish and the backward
kernels that take the saved output), a streamed flat form for outputs of
``_memory.STREAM_BYTES`` or more: each thread computes blocks of
``STREAM_BLOCK`` elements into a buffer in L1 and writes them out with
non-temporal line stores, so no output line is read before it is written
(a third less memory traffic).

Why not stream every formula: the streamed kernel alternates a compute
phase (the block into L1) with a store phase (the block out to memory), and
the non-temporal stores of a block stall once the write-combining buffers
are full, so the two phases do not overlap. That is free when the compute
phase is short, and costs more than the saved traffic when it is not
(docs/benchmarks.md, activations: which kernels stream).
They differ only in the scalar formula, so one generator builds them all.

Where :mod:`nbops.cpu._piecewise` has a vector run for an activation
(softplus) and the target has AVX-512, float64 arrays go through one more
pair of flat kernels: whole vectors by the run's table, the last few
elements by the formula (about 1.5x the formula's kernel; docs/benchmarks.md).

In place (``out=x``, or a backward's ``out=g`` / ``out=v``), the flat
kernel would run its scalar loop: ``x`` and ``out`` are two arrays to LLVM,
and its runtime overlap test before the vector loop fails when they are the
same memory (in-place gelu ran several times slower than out of place). So each
operator has an in-place pair too, indexing the one array it reads and
writes; streamed and vector-run kernels need none (they write from a buffer
or from registers).

Every kernel here is compiled with LLVM's SLP vectorizer off: the loop
vectorizer does their work, and SLP, packing a scalar loop's independent
multiplies into short vectors, kept them from fusing with their adds (a
scalar gelu then differed from the vector loop in the last bit of 188 of
4096 float32 results).

Launchers, one per operator, have the signature ``name(x, out, p, c)`` for
forward kernels and ``name(g, v, out, p, c)`` for backward kernels, with
``p``/``c`` the typed parameters and constants of :mod:`nbops._formulas`.
"""

from collections import namedtuple
from types import FunctionType, ModuleType

import numpy as np
from numba import get_num_threads, prange
from numba.extending import register_jitable

from .. import _formulas, _layout
from .._jit import FASTMATH_REDUCE, cpu_kernel, serial_and_parallel
from .._tunables import RUN_BLOCK, SERIAL_BELOW, STREAM_BLOCK
from . import _approx
from ._memory import LINE, stream_rows, streams
from . import _piecewise
from ._piecewise import vector_run

__all__ = list(_formulas.FORWARD + _formulas.BACKWARD) + ["swish_backward_both"]

#: An operator's kernels: flat (serial, parallel), flat in place (a pair),
#: streamed (None for transcendental formulas), 2-D strided, and the
#: vector-run pair of ``_piecewise`` (None where it has none).
_Kernels = namedtuple("_Kernels", "serial parallel in_place streamed strided runs",
                      defaults=(None,))


def _unary_kernels(name, f):
    def flat(x, out, p, c):
        for i in prange(x.size):
            out[i] = f(x[i], p, c)

    def strided(x, out, p, c):
        for r in prange(x.shape[0]):
            for j in range(x.shape[1]):
                out[r, j] = f(x[r, j], p, c)

    def in_place(x, y, p, c, first):
        # out=x: one array read and written, so LLVM needs no overlap test
        # (``y`` is x again, unused; the binary kernels' signature)
        for i in prange(x.size):
            x[i] = f(x[i], p, c)

    kernels = _Kernels(*serial_and_parallel(flat, name + "_flat", slp=False),
                       serial_and_parallel(in_place, name + "_inplace", slp=False),
                       None if transcendental(f) else _streamed(name, _first_of_two(name, f)),
                       _named(strided, name + "_2d"))
    if name in _piecewise.KINDS and _piecewise.host_available():
        return kernels._replace(runs=_run_kernels(name, f))
    return kernels


def _run_kernels(kind, f):
    """Flat kernels for float64 that go through ``_piecewise.vector_run``
    (the launcher picks them by dtype)."""
    def flat_run(x, out, p, c):
        inv = x.dtype.type(1.0) / p[0]
        n = x.size
        for b in prange((n + RUN_BLOCK - 1) // RUN_BLOCK):
            i0 = b * RUN_BLOCK
            i1 = min(i0 + RUN_BLOCK, n)
            # all whole vectors; the last block's remainder here
            for i in range(vector_run(kind, x, out, i0, i1, p[0], p[1], inv), i1):
                out[i] = f(x[i], p, c)

    return serial_and_parallel(flat_run, kind + "_run", slp=False)


def _first_of_two(name, f):
    # the unary formula in the binary kernels' signature: the streamed
    # kernel is written once, for two inputs (a unary launch passes x
    # twice; the unused loads are dropped). A module global with its own
    # name, so that the kernel's cache entry can refer to it across runs.
    def g(a, b, p, c):
        return f(a, p, c)

    g.__name__ = g.__qualname__ = f"_{name}_of_first"
    globals()[g.__name__] = g
    return register_jitable(inline="always")(g)


def _binary_kernels(name, f):
    def flat(a, b, out, p, c):
        for i in prange(a.size):
            out[i] = f(a[i], b[i], p, c)

    def strided(a, b, out, p, c):
        for r in prange(a.shape[0]):
            for j in range(a.shape[1]):
                out[r, j] = f(a[r, j], b[r, j], p, c)

    def in_place(io, other, p, c, first):
        # out=a (first) or out=b: the written input is the only array
        # indexed for both, so LLVM needs no overlap test between them
        if first:
            for i in prange(io.size):
                io[i] = f(io[i], other[i], p, c)
        else:
            for i in prange(io.size):
                io[i] = f(other[i], io[i], p, c)

    streamed = None if transcendental(f) else _streamed(name, f)
    return _Kernels(*serial_and_parallel(flat, name + "_flat", slp=False),
                    serial_and_parallel(in_place, name + "_inplace", slp=False), streamed,
                    _named(strided, name + "_2d"))


def transcendental(f):
    """Whether the scalar formula ``f`` calls a function of
    :mod:`nbops.cpu._approx`, itself or through the helpers it calls (found
    by the names its code reads from its module): such formulas are
    compute-bound enough that their kernels do not stream (module
    docstring)."""
    for name in f.__code__.co_names:
        obj = f.__globals__.get(name)
        # _formulas.m is a lazy stand-in module named after _approx
        is_approx = obj is _approx or (isinstance(obj, ModuleType)
                                       and obj.__name__ == _approx.__name__)
        if is_approx or (isinstance(obj, FunctionType) and obj is not f
                         and transcendental(obj)):
            return True
    return False


def _streamed(name, f):
    """The streamed flat kernel of a two-input formula ``f(a, b, p, c)``."""
    def streamed(a, b, out, p, c, nchunk):
        # constants (folded away), -0.0 keeping the sign of zeros: see stream_rows
        one, zero = out.dtype.type(1.0), out.dtype.type(-0.0)
        for ch in prange(nchunk):
            i0, i1 = _chunk(a.size, ch, nchunk)
            buf = np.empty(2 * STREAM_BLOCK, out.dtype)
            carry = np.empty(LINE // out.itemsize, out.dtype)
            b0 = i0
            while b0 < i1:
                w = _block(b0, i1)
                av = a[b0:b0 + w]
                bv = b[b0:b0 + w]
                for j in range(w):
                    buf[j] = f(av[j], bv[j], p, c)
                stream_rows(out, b0, buf[:w], one, zero, carry, b0 == i0, b0 + w == i1)
                b0 += w

    return _named(streamed, name + "_stream")


@register_jitable(inline="always")
def _chunk(n, ch, nchunk):
    """Elements [i0, i1) of chunk ``ch``: whole blocks, the remainder in the last."""
    blocks = n // STREAM_BLOCK
    i0 = ch * blocks // nchunk * STREAM_BLOCK
    i1 = n if ch == nchunk - 1 else (ch + 1) * blocks // nchunk * STREAM_BLOCK
    return i0, i1


@register_jitable(inline="always")
def _block(b0, i1):
    # the last block takes the remainder, so that every block is at least
    # STREAM_BLOCK long (stream_rows needs whole lines)
    rest = i1 - b0
    return rest if rest < 2 * STREAM_BLOCK else STREAM_BLOCK


def _named(fn, name):
    # a unique qualname gives each generated kernel its own on-disk cache entry
    fn.__name__ = fn.__qualname__ = name
    return cpu_kernel(fn, parallel=True, slp=False)


def _aliased(inputs, out):
    """The index of the input that *is* ``out`` (the front end allows no
    other overlap), or None."""
    return next((i for i, a in enumerate(inputs) if np.may_share_memory(a, out)), None)


def _launcher(name, kernels):
    k = kernels

    def launch(*args):
        *inputs, out, p, c = args
        small = out.size < SERIAL_BELOW
        if k.runs and out.dtype == np.float64:
            run = k.runs[0] if small else k.runs[1]

            def run_flat(ins, o):
                run(*ins, o, p, c)
        elif k.streamed is not None and streams(out):
            chunks = 4 * get_num_threads()

            def run_flat(ins, o):
                k.streamed(ins[0], ins[-1], o, p, c, chunks)
        elif (aliased := _aliased(inputs, out)) is not None:
            in_place = k.in_place[0] if small else k.in_place[1]

            def run_flat(ins, o):
                in_place(o, ins[1 - aliased] if len(ins) == 2 else o, p, c, aliased == 0)
        else:
            flat = k.serial if small else k.parallel

            def run_flat(ins, o):
                flat(*ins, o, p, c)
        return _layout.elementwise(inputs, out, run_flat, lambda ins, o: k.strided(*ins, o, p, c))

    launch.__name__ = launch.__qualname__ = name
    launch.kernels = kernels
    return launch


# register_jitable makes each formula (and the helpers they call) callable
# from jitted code under its own name; it returns the function unchanged.
# Inlined at Numba's IR level: LLVM's cost model declined to inline the larger
# formulas (gelu_backward: erfc and exp) into the loop, and a call left in
# the loop stops its vectorization (2% of copy bandwidth instead of ~70%).
for _f in _formulas.functions().values():
    register_jitable(inline="always")(_f)
for _name in _formulas.FORWARD:
    globals()[_name] = _launcher(_name, _unary_kernels(_name, getattr(_formulas, _name)))
for _name in _formulas.BACKWARD:
    globals()[_name] = _launcher(_name, _binary_kernels(_name, getattr(_formulas, _name)))
del _name, _f

_swish_grad = _formulas.swish_backward
_swish_beta = _formulas.swish_beta_term


def swish_backward_both(g, x, out, p, c):
    """Write swish's gradient for x into ``out`` and return, as a float, the
    sum over all elements of ``g * d swish(x, beta) / d beta``: one pass over
    memory for both. The sum accumulates in float64 (``reassoc`` lets it
    vectorize); strided inputs go block by block."""
    if x.size == 0:
        return 0.0
    if _layout.is_c_contiguous(g) and _layout.is_c_contiguous(x):
        return _swish_both_flat(g.reshape(-1), x.reshape(-1), out.reshape(-1), p, c)
    total, out_flat = 0.0, out.reshape(-1)
    for start, (gv, xv) in _layout.blocks_2d(x.shape, g, x):
        rows, cols = gv.shape
        total += _swish_both_2d(gv, xv, out_flat[start:start + rows * cols].reshape(rows, cols),
                                p, c)
    return total


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _swish_both_flat(g, x, out, p, c):
    acc = 0.0
    for i in prange(x.size):
        out[i] = _swish_grad(g[i], x[i], p, c)
        acc += _swish_beta(g[i], x[i], p, c)
    return acc


@cpu_kernel(parallel=True, fastmath=FASTMATH_REDUCE)
def _swish_both_2d(g, x, out, p, c):
    acc = 0.0
    for r in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[r, j] = _swish_grad(g[r, j], x[r, j], p, c)
            acc += _swish_beta(g[r, j], x[r, j], p, c)
    return acc
