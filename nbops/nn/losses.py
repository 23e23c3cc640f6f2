"""Loss functions: operators with backward rules, on both devices.

``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"`` as in
PyTorch; reduced losses are 0-d arrays on the inputs' device. With tensors
the losses join the autograd tape like any operator.
"""

import numpy as np

from .. import _checks, _dispatch, _formulas, _spec, arith
from .._dispatch import operator

__all__ = ["mse_loss", "cross_entropy", "binary_cross_entropy_with_logits"]

FAMILY = _spec.subpackage("nn")
_dispatch.register_kernels(FAMILY, ("cross_entropy", "cross_entropy_backward",
                                    "bce_with_logits", "bce_with_logits_backward"))

_REDUCTIONS = ("mean", "sum", "none")
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _reduce(losses, reduction):
    if reduction == "none":
        return losses
    return arith.mean(losses) if reduction == "mean" else arith.sum(losses)


def _upstream(g, reduction, count):
    """The upstream gradient of a reduced loss spread over the elements,
    (``count`` of them), as an array that broadcasts to their shape."""
    if reduction == "none":
        return g
    return arith.mul(g, 1.0 / count) if reduction == "mean" and count else g


def _pair(op, input, target, reduction, input_name="input"):
    """Checks of a loss of two arrays; ``(device, input, target)``, the
    arrays as :func:`nbops._checks.array` returns them."""
    input = _checks.array(op, input_name, input)
    target = _checks.array(op, "target", target)
    _checks.same_dtype(op, **{input_name: input, "target": target})
    _checks.same_shape(op, **{input_name: input, "target": target})
    _checks.choice(op, "reduction", reduction, _REDUCTIONS)
    return _dispatch.resolve_device(op, **{input_name: input, "target": target}), input, target


@operator("mse_loss")
def mse_loss(input, target, reduction="mean"):
    """Mean squared error ``(input - target)^2``, reduced.

    ``input``, ``target``: float32/float64 arrays of one shape, dtype and
    device. Differentiable in both. Raises TypeError (dtype, device),
    ValueError (shapes differ, unknown ``reduction``).

    >>> nbops.nn.mse_loss(np.array([1.0, 2.0]), np.array([0.0, 0.0]))
    array(2.5)
    """
    _, input, target = _pair("mse_loss", input, target, reduction)
    d = arith.sub(input, target)
    return _reduce(arith.mul(d, d, out=d), reduction)


def _mse_rule(ctx, g):
    input, target = ctx.inputs[:2]
    d = arith.sub(input, target)
    up = _upstream(g, ctx.kwargs["reduction"], d.size)
    gi = arith.mul(arith.mul(d, 2.0, out=d), up)
    return gi, (arith.neg(gi) if ctx.needs_input_grad[1] else None)


@operator("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(logits, target, reduction="mean"):
    """Binary cross-entropy of ``sigmoid(logits)`` against ``target`` in [0, 1],
    computed stably as ``max(x, 0) - x t + log(1 + exp(-|x|))``.

    ``logits``, ``target``: float32/float64 arrays of one shape, dtype and
    device. Differentiable in both. Errors as :func:`mse_loss`.

    >>> nbops.nn.binary_cross_entropy_with_logits(np.array([0.0]), np.array([1.0]))
    array(0.69314718)
    """
    dev, logits, target = _pair("binary_cross_entropy_with_logits", logits, target, reduction,
                                "logits")
    out = _checks.empty(logits.shape, logits.dtype, dev)
    FAMILY.kernel("bce_with_logits", dev)(
        logits, target, out, _formulas.params(logits.dtype), _formulas.consts(logits.dtype))
    return _reduce(out, reduction)


def _bce_rule(ctx, g):
    x, t = ctx.inputs[:2]
    dev = _dispatch.device_of_array(x)
    d = _checks.empty(x.shape, x.dtype, dev)
    FAMILY.kernel("bce_with_logits_backward", dev)(
        x, t, d, _formulas.params(x.dtype), _formulas.consts(x.dtype))
    up = _upstream(g, ctx.kwargs["reduction"], d.size)
    gx = arith.mul(d, up, out=d)
    return gx, (arith.neg(arith.mul(x, up)) if ctx.needs_input_grad[1] else None)


@operator("cross_entropy")
def cross_entropy(logits, target, reduction="mean"):
    """Cross-entropy of class scores against class indices:
    ``logsumexp(logits[i]) - logits[i, target[i]]`` per sample (a stable
    log-softmax: the row maximum is subtracted first), then reduced.

    Parameters
    ----------
    logits : float32/float64 array (N, C), either device
    target : int32/int64 array (N,) of class indices in [0, C), same device
    reduction : {"mean", "sum", "none"}

    Differentiable in ``logits``. Raises TypeError for bad dtypes or mixed
    devices, ValueError for bad shapes, an unknown ``reduction`` or a target
    outside [0, C) (checked on the host: a device target is copied back).

    >>> nbops.nn.cross_entropy(np.array([[0.0, 0.0]]), np.array([1]))
    array(0.69314718)
    """
    op = "cross_entropy"
    logits = _checks.array(op, "logits", logits)
    target = _checks.array(op, "target", target, _INDEX_DTYPES)
    _checks.choice(op, "reduction", reduction, _REDUCTIONS)
    if logits.ndim != 2 or target.ndim != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"{op}: expected logits (N, C) and target (N,), got "
                         f"{tuple(logits.shape)} and {tuple(target.shape)}")
    if logits.shape[1] == 0:
        raise ValueError(f"{op}: logits must have at least one class, got shape "
                         f"{tuple(logits.shape)}")
    dev = _dispatch.resolve_device(op, logits=logits, target=target)
    host_t = np.asarray(_dispatch.to_host(target))
    if host_t.size and (host_t.min() < 0 or host_t.max() >= logits.shape[1]):
        bad = int(host_t[(host_t < 0) | (host_t >= logits.shape[1])][0])
        raise ValueError(f"{op}: target holds class {bad}, outside [0, {logits.shape[1]})")
    out = _checks.empty((logits.shape[0],), logits.dtype, dev)
    FAMILY.kernel("cross_entropy", dev)(logits, target, out)
    return _reduce(out, reduction)


def _ce_rule(ctx, g):
    x, t = ctx.inputs[:2]
    dev = _dispatch.device_of_array(x)
    n = x.shape[0]
    grow = arith.expand(_upstream(g, ctx.kwargs["reduction"], n), (n,))
    out = _checks.empty(x.shape, x.dtype, dev)
    return (FAMILY.kernel("cross_entropy_backward", dev)(x, t, grow, out),)


mse_loss.backward = _mse_rule
binary_cross_entropy_with_logits.backward = _bce_rule
cross_entropy.backward = _ce_rule
