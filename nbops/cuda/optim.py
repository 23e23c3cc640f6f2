"""CUDA kernels of the optimizers: the per-element updates of
:mod:`nbops._scalars` as device functions, in grid-stride loops over the
flat parameter. Launchers have the CPU signatures.
"""

from numba import cuda

from .. import _scalars
from .._codegen import twins
from ._launch import grid_1d

__all__ = ["sgd_step", "adam_step"]


_D = twins({name: getattr(_scalars, name) for name in ("sgd_update", "adam_update")},
           cuda.jit(device=True), dict(vars(_scalars)))
_sgd_update, _adam_update = _D["sgd_update"], _D["adam_update"]


@cuda.jit
def _sgd(p, g, buf, s):
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        _sgd_update(i, p, g, buf, s)


@cuda.jit
def _adam(p, g, m, v, s):
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        _adam_update(i, p, g, m, v, s)


def sgd_step(p, g, buf, s):
    if p.size:
        _sgd[grid_1d(p.size)](p, g, buf, s)


def adam_step(p, g, m, v, s):
    if p.size:
        _adam[grid_1d(p.size)](p, g, m, v, s)
