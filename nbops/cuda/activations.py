"""CUDA kernels of the activations, generated from :mod:`nbops._formulas`.

The scalar formulas are the CPU's, compiled as device functions with their
transcendental namespace ``m`` rebound from :mod:`nbops.cpu._approx` to
:mod:`math` (CUDA's libdevice ``expf``/``erfcf``/... are fast on GPUs).
Kernels are grid-stride loops: a flat one for contiguous arrays and a 2-D
one for strided views. Launchers have the CPU module's signatures.
"""

import math

from numba import cuda

from .. import _formulas, _layout
from .._codegen import twins
from ._launch import grid_1d

__all__ = list(_formulas.FORWARD + _formulas.BACKWARD) + ["swish_backward_both"]


# The formulas' helpers that call CPU-only approximations, rebuilt from
# libdevice's functions (compiled like the formulas, in the same scope).

def _ndtr(x, c):
    return c.half * math.erfc(-x * c.inv_sqrt2)


def _ndtr_pdf(x, c):
    return _ndtr(x, c), c.inv_sqrt_2pi * math.exp(-c.half * x * x)


def _log1pexp(z, c):
    return (z if z > c.zero else c.zero) + math.log1p(math.exp(-abs(z)))


_MATH_TWINS = {"_ndtr": _ndtr, "_ndtr_pdf": _ndtr_pdf, "_log1pexp": _log1pexp}


def _device_functions():
    # Copies of every formula sharing one globals dict in which ``m`` is math
    # and each formula name is its device-function twin, so that helpers
    # called by a formula (``_sigmoid``) resolve to device code too.
    return twins({name: _MATH_TWINS.get(name, fn) for name, fn in _formulas.functions().items()},
                 cuda.jit(device=True), dict(vars(_formulas), m=math))


_DEVICE = _device_functions()


def _unary_kernels(f):
    @cuda.jit
    def flat(x, out, p, c):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            out[i] = f(x[i], p, c)

    @cuda.jit
    def strided(x, out, p, c):
        cols = x.shape[1]
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            r = i // cols
            j = i - r * cols
            out[r, j] = f(x[r, j], p, c)

    return flat, strided


def _binary_kernels(f):
    @cuda.jit
    def flat(a, b, out, p, c):
        for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
            out[i] = f(a[i], b[i], p, c)

    @cuda.jit
    def strided(a, b, out, p, c):
        cols = a.shape[1]
        for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
            r = i // cols
            j = i - r * cols
            out[r, j] = f(a[r, j], b[r, j], p, c)

    return flat, strided


def _launcher(name, kernels):
    flat, strided = kernels

    def launch(*args):
        *inputs, out, p, c = args
        return _layout.elementwise(
            inputs, out,
            lambda ins, o: flat[grid_1d(o.size)](*ins, o, p, c),
            lambda ins, o: strided[grid_1d(o.size)](*ins, o, p, c))

    launch.__name__ = launch.__qualname__ = name
    return launch


for _name in _formulas.FORWARD:
    globals()[_name] = _launcher(_name, _unary_kernels(_DEVICE[_name]))
for _name in _formulas.BACKWARD:
    globals()[_name] = _launcher(_name, _binary_kernels(_DEVICE[_name]))
del _name

_swish_beta = _DEVICE["swish_beta_term"]


def swish_backward_both(g, x, out, p, c):
    """Write swish's gradient for x into ``out``; return the sum over all
    elements of ``g * d swish(x, beta) / d beta`` as a float (two kernels,
    the sum first: ``out`` may be ``g`` or ``x``)."""
    gbeta = _swish_backward_beta(g, x, p, c)
    swish_backward(g, x, out, p, c)  # noqa: F821  (generated above)
    return gbeta


def _swish_backward_beta(g, x, p, c):
    """Sum over all elements of ``g * d swish(x, beta) / d beta``, as a float.

    Each thread accumulates its grid-stride share in float64, then adds it to
    the result with one atomic.
    """
    if x.size == 0:
        return 0.0
    import numpy as np

    result = cuda.to_device(np.zeros(1, np.float64))
    for _, (gv, xv) in _layout.blocks_2d(x.shape, g, x):
        blocks, threads = grid_1d(gv.size)
        _swish_beta_2d[blocks, threads](gv, xv, p, c, result)
    return float(result.copy_to_host()[0])


@cuda.jit
def _swish_beta_2d(g, x, p, c, result):
    cols = x.shape[1]
    acc = 0.0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        r = i // cols
        j = i - r * cols
        acc += _swish_beta(g[r, j], x[r, j], p, c)
    cuda.atomic.add(result, 0, acc)
