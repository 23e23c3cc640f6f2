"""CPU launchers of the arithmetic operators (:mod:`nbops.arith`).

Broadcasting elementwise arithmetic and axis reductions are NumPy's own
ufuncs here: they already run at memory speed on contiguous data (SIMD
loops, pairwise float summation), so a Numba kernel would add compile time
and nothing else. Launchers write into the ``out`` array the front end
allocated and return it.
"""

import numpy as np

__all__ = ["add", "sub", "mul", "div", "pow", "neg", "exp", "log", "copy", "assign",
           "sum", "mean"]


def _binary(ufunc):
    def launch(a, b, out):
        ufunc(a, b, out=out)
        return out

    launch.__name__ = launch.__qualname__ = ufunc.__name__
    return launch


def _unary(ufunc):
    def launch(x, out):
        ufunc(x, out=out)
        return out

    launch.__name__ = launch.__qualname__ = ufunc.__name__
    return launch


add, sub, mul, div, pow = (_binary(u) for u in (
    np.add, np.subtract, np.multiply, np.true_divide, np.power))
neg, exp, log = (_unary(u) for u in (np.negative, np.exp, np.log))


def copy(x, out):
    """``out[...] = x`` (x may be a broadcast or strided view)."""
    np.copyto(out, x)
    return out


def assign(src, dst):
    """``dst[...] = src`` into a possibly strided view ``dst``."""
    np.copyto(dst, src)
    return dst


def _reduction(fn):
    def launch(x, axes, keepdims, out):
        fn(x, axis=axes, keepdims=keepdims, out=out)
        return out

    launch.__name__ = launch.__qualname__ = fn.__name__
    return launch


sum, mean = _reduction(np.sum), _reduction(np.mean)
