"""CPU kernels of the losses in :mod:`nbops.nn.losses`.

Cross-entropy works row by row (one ``prange`` iteration per sample): the
row's maximum, ``log(sum(exp(x - max)))`` and the target's logit give the
loss, and the backward recomputes the softmax rather than storing it. The
row functions are the plain Python of :mod:`nbops._scalars`, which
:mod:`nbops.nn.cuda` compiles again as device functions, so both devices
share one formula: ``approx`` is :mod:`nbops.cpu._approx` here (exponentials
that vectorize; ``math.exp`` is a libm call per logit) and a module of
:mod:`math` twins there.

Binary cross-entropy with logits is elementwise; its kernels come from the
activations' generators (flat and 2-D strided).
"""

from numba import prange
from numba.extending import register_jitable

from .._jit import FASTMATH_REDUCE, serial_and_parallel
from .._scalars import bce_grad_term, bce_term, row_grad, row_loss, row_max, row_sum_exp
from .._tunables import SERIAL_BELOW as PARALLEL_MIN
from ..cpu.activations import _binary_kernels, _launcher

__all__ = ["cross_entropy", "cross_entropy_backward", "bce_with_logits",
           "bce_with_logits_backward"]


for _f in (row_max, row_sum_exp, row_loss, row_grad, bce_term, bce_grad_term):
    register_jitable(_f)
del _f


def _ce_rows(x, t, out, zero):
    for i in prange(x.shape[0]):
        out[i] = row_loss(x, t, i, zero)


def _ce_grad_rows(x, t, grow, out, zero):
    for i in prange(x.shape[0]):
        row_grad(x, t, grow, out, i, zero)


# reassoc: the row sums of exponentials vectorize (float32 sums of terms in
# [0, 1]; the order changes the result by rounding only)
_ce_kernels = serial_and_parallel(_ce_rows, "cross_entropy", fastmath=FASTMATH_REDUCE)
_ce_grad_kernels = serial_and_parallel(_ce_grad_rows, "cross_entropy_backward",
                                       fastmath=FASTMATH_REDUCE)


def cross_entropy(x, t, out):
    """Per-sample losses ``out[i] = logsumexp(x[i]) - x[i, t[i]]``."""
    _ce_kernels[x.size >= PARALLEL_MIN](x, t, out, x.dtype.type(0))
    return out


def cross_entropy_backward(x, t, grow, out):
    """``out = grow[:, None] * (softmax(x) - onehot(t))``."""
    _ce_grad_kernels[x.size >= PARALLEL_MIN](x, t, grow, out, x.dtype.type(0))
    return out


bce_with_logits = _launcher("bce_with_logits", _binary_kernels("bce_with_logits", bce_term))
bce_with_logits_backward = _launcher(
    "bce_with_logits_backward", _binary_kernels("bce_with_logits_backward", bce_grad_term))
