"""CUDA kernels of the arithmetic operators (:mod:`nbops.arith`).

Elementwise ops reuse the grid-stride kernel generators of
:mod:`nbops.cuda.activations` (flat for contiguous arrays, 2-D for strided
views): broadcasting is a zero-stride view of each input with the output's
shape, which the shared layout driver splits into 2-D blocks. Launchers
have the CPU module's signatures.

Reductions copy the input into a contiguous ``(kept, reduced)`` matrix
(reduced axes last) and sum each row in float64: short rows with one thread
each, long rows with one block (threads stride over the row, then combine
in shared memory).
"""

import math

import numpy as np
from numba import cuda, float64

from .. import _formulas, _layout, _tunables
from ._launch import THREADS, grid_1d
from .activations import _binary_kernels, _launcher, _unary_kernels

__all__ = ["add", "sub", "mul", "div", "pow", "neg", "exp", "log", "copy", "assign",
           "sum", "mean"]


def _f_add(a, b, p, c):
    return a + b


def _f_sub(a, b, p, c):
    return a - b


def _f_mul(a, b, p, c):
    return a * b


def _f_div(a, b, p, c):
    return a / b


def _f_pow(a, b, p, c):
    return a ** b


def _f_neg(x, p, c):
    return -x


def _f_exp(x, p, c):
    return math.exp(x)


def _f_log(x, p, c):
    return math.log(x)


def _f_copy(x, p, c):
    return x


def _device(f):
    return cuda.jit(device=True)(f)


def _consts(dtype):
    return _formulas.params(dtype), _formulas.consts(dtype)


def _broadcast(x, shape):
    """A zero-stride view of ``x`` with ``shape`` (NumPy's broadcasting rules)."""
    if tuple(x.shape) == tuple(shape):
        return x
    lead = len(shape) - x.ndim
    strides = [0] * lead + [0 if n == 1 and m != 1 else s
                            for n, m, s in zip(x.shape, shape[lead:], x.strides)]
    return _layout.strided_view(x, shape, strides)


def _binary_launcher(name, f):
    run = _launcher(name, _binary_kernels(_device(f)))

    def launch(a, b, out):
        p, c = _consts(out.dtype)
        return run(_broadcast(a, out.shape), _broadcast(b, out.shape), out, p, c)

    launch.__name__ = launch.__qualname__ = name
    return launch


def _unary_launcher(name, f):
    run = _launcher(name, _unary_kernels(_device(f)))

    def launch(x, out):
        p, c = _consts(out.dtype)
        return run(_broadcast(x, out.shape), out, p, c)

    launch.__name__ = launch.__qualname__ = name
    return launch


add = _binary_launcher("add", _f_add)
sub = _binary_launcher("sub", _f_sub)
mul = _binary_launcher("mul", _f_mul)
div = _binary_launcher("div", _f_div)
pow = _binary_launcher("pow", _f_pow)
neg = _unary_launcher("neg", _f_neg)
exp = _unary_launcher("exp", _f_exp)
log = _unary_launcher("log", _f_log)
_copy_kernels = _unary_kernels(_device(_f_copy))
_copy = _launcher("copy", _copy_kernels)


def copy(x, out):
    """``out[...] = x`` for a strided or broadcast ``x`` into contiguous ``out``."""
    p, c = _consts(out.dtype)
    return _copy(_broadcast(x, out.shape), out, p, c)


def assign(src, dst):
    """``dst[...] = src`` into a possibly strided view ``dst``."""
    p, c = _consts(dst.dtype)
    strided = _copy_kernels[1]
    for _, (s, d) in _layout.blocks_2d(dst.shape, _broadcast(src, dst.shape), dst):
        if d.size:
            strided[grid_1d(d.size)](s, d, p, c)
    return dst


@cuda.jit
def _reduce_rows(x, out, scale):
    acc_sh = cuda.shared.array(THREADS, float64)
    tid = cuda.threadIdx.x
    for row in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        acc = 0.0
        for j in range(tid, x.shape[1], cuda.blockDim.x):
            acc += x[row, j]
        acc_sh[tid] = acc
        cuda.syncthreads()
        step = cuda.blockDim.x // 2
        while step > 0:
            if tid < step:
                acc_sh[tid] += acc_sh[tid + step]
            cuda.syncthreads()
            step //= 2
        if tid == 0:
            out[row] = acc_sh[0] * scale
        cuda.syncthreads()


@cuda.jit
def _reduce_short_rows(x, out, scale):
    # one thread per row: no shared memory or barriers for short rows
    for row in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        acc = 0.0
        for j in range(x.shape[1]):
            acc += x[row, j]
        out[row] = acc * scale


#: Rows up to this length are summed by one thread each (a block per row
#: would leave most of its threads idle).
SHORT_ROW = _tunables.CUDA_SHORT_ROW


def _reduce(x, axes, out, mean):
    kept = [i for i in range(x.ndim) if i not in axes]
    n_kept = int(np.prod([x.shape[i] for i in kept]))
    n_red = int(np.prod([x.shape[i] for i in axes]))
    if n_kept == 0:
        return out
    # reduced axes last, as one contiguous (kept, reduced) matrix
    order = kept + list(axes)
    perm = _layout.strided_view(x, [x.shape[i] for i in order], [x.strides[i] for i in order])
    rows = cuda.device_array((n_kept, n_red), x.dtype)
    if n_red:
        copy(perm, rows.reshape(tuple(perm.shape)) if perm.ndim else rows)
    scale = (1.0 / n_red if n_red else math.nan) if mean else 1.0
    if n_red <= SHORT_ROW:
        _reduce_short_rows[grid_1d(n_kept)](rows, out.reshape(n_kept), scale)
    else:
        blocks, _ = grid_1d(n_kept * THREADS)
        _reduce_rows[blocks, THREADS](rows, out.reshape(n_kept), scale)
    return out


def sum(x, axes, keepdims, out):
    return _reduce(x, axes, out, mean=False)


def mean(x, axes, keepdims, out):
    return _reduce(x, axes, out, mean=True)
