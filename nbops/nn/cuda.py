"""CUDA kernels of the losses in :mod:`nbops.nn.losses`: the row functions
and elementwise terms of :mod:`nbops._scalars`, compiled as device functions.
Cross-entropy runs one thread per sample (grid-stride over rows); class
counts are small next to batch sizes. Launchers have the CPU signatures.
"""

import math
import types

from numba import cuda

from .. import _scalars
from .._codegen import twins
from ..cuda._launch import grid_1d
from ..cuda.activations import _binary_kernels, _launcher

__all__ = ["cross_entropy", "cross_entropy_backward", "bce_with_logits",
           "bce_with_logits_backward"]


#: The :mod:`math` twins of the CPU row functions' ``approx`` functions.
_APPROX = types.ModuleType("nbops.nn.cuda_approx")
_APPROX.exp_nonpos = math.exp
_APPROX.log1p = math.log1p


def _device_functions():
    # copies sharing one globals dict where each helper name is its device twin
    names = ("row_max", "row_sum_exp", "row_loss", "row_grad", "bce_term", "bce_grad_term")
    return twins({name: getattr(_scalars, name) for name in names}, cuda.jit(device=True),
                 dict(vars(_scalars), approx=_APPROX))


_D = _device_functions()
_row_loss, _row_grad = _D["row_loss"], _D["row_grad"]


@cuda.jit
def _ce_rows(x, t, out, zero):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = _row_loss(x, t, i, zero)


@cuda.jit
def _ce_grad_rows(x, t, grow, out, zero):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        _row_grad(x, t, grow, out, i, zero)


def cross_entropy(x, t, out):
    if x.shape[0]:
        _ce_rows[grid_1d(x.shape[0])](x, t, out, x.dtype.type(0))
    return out


def cross_entropy_backward(x, t, grow, out):
    if x.shape[0]:
        _ce_grad_rows[grid_1d(x.shape[0])](x, t, grow, out, x.dtype.type(0))
    return out


bce_with_logits = _launcher("bce_with_logits", _binary_kernels(_D["bce_term"]))
bce_with_logits_backward = _launcher("bce_with_logits_backward",
                                     _binary_kernels(_D["bce_grad_term"]))
