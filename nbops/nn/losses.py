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


# ---------------------------------------------------------------------------
# Backward rules


def _mse_rule(ctx, g):
    input, target = ctx.inputs[:2]
    d = arith.sub(input, target)
    up = _upstream(g, ctx.kwargs["reduction"], d.size)
    gi = arith.mul(arith.mul(d, 2.0, out=d), up)
    return gi, (arith.neg(gi) if ctx.needs_input_grad[1] else None)


def _bce_rule(ctx, g):
    x, t = ctx.inputs[:2]
    dev = _dispatch.device_of_array(x)
    d = _checks.empty(x.shape, x.dtype, dev)
    FAMILY.kernel("bce_with_logits_backward", dev)(
        x, t, d, _formulas.params(x.dtype), _formulas.consts(x.dtype))
    up = _upstream(g, ctx.kwargs["reduction"], d.size)
    gx = arith.mul(d, up, out=d)
    return gx, (arith.neg(arith.mul(x, up)) if ctx.needs_input_grad[1] else None)


def _ce_rule(ctx, g):
    x, t = ctx.inputs[:2]
    dev = _dispatch.device_of_array(x)
    n = x.shape[0]
    grow = arith.expand(_upstream(g, ctx.kwargs["reduction"], n), (n,))
    out = _checks.empty(x.shape, x.dtype, dev)
    return (FAMILY.kernel("cross_entropy_backward", dev)(x, t, grow, out),)


# ---------------------------------------------------------------------------
# Declarations: every reduction over shapes from 0-d and empty to a few
# hundred elements, then the special values (reduction "none", so that one
# NaN does not hide the others); bce's target is a probability, cross
# entropy's an array of class indices (int64, int32 in the edge sample).

_TOL = {_spec.F32: (1e-5, 1e-6), _spec.F64: (1e-12, 1e-13)}
_SHAPES = ((), (0,), (1,), (7,), (5, 19), (2, 3, 4))
# edge values whose squares stay finite in float32 (1e30 squared overflows
# there, a float64 reference's does not)
_FINITE_EDGE = np.array([v for v in _spec.EDGE_VALUES if abs(v) <= 1e4])


def _pair_samples(target_range):
    """``samples(dtype)`` of a loss of two same-shape arrays: normal inputs,
    targets normal or uniform in ``target_range``."""
    def samples(dtype):
        rng = np.random.default_rng(0)

        def target(shape):
            if target_range is None:
                return np.asarray(rng.standard_normal(shape) * 2, dtype)  # 0-d stays an array
            return rng.uniform(*target_range, shape).astype(dtype)

        out = [_spec.Sample((np.asarray(rng.standard_normal(shape) * 3, dtype), target(shape)),
                            dict(reduction=red), f"{shape},{red}")
               for shape in _SHAPES for red in _REDUCTIONS]
        e = np.array(_spec.EDGE_VALUES, dtype)
        out.append(_spec.Sample((e, target(e.shape)), dict(reduction="none"), "edge"))
        # no NaN or inf: the reduced losses stay finite
        f = _FINITE_EDGE.astype(dtype)
        out += [_spec.Sample((f, target(f.shape)), dict(reduction=red), f"finite edge,{red}")
                for red in ("mean", "sum")]
        return out

    return samples


def _cross_entropy_samples(dtype):
    rng = np.random.default_rng(0)
    out = []
    for n, c in ((1, 1), (4, 5), (6, 3), (3, 40), (0, 3), (2, 300)):
        logits = (rng.standard_normal((n, c)) * 3).astype(dtype)
        target = rng.integers(0, c, n)
        out += [_spec.Sample((logits, target), dict(reduction=red), f"({n}, {c}),{red}")
                for red in _REDUCTIONS]
    # large magnitudes (stable only with the row maximum taken out), -inf
    # scores (a masked class), an int32 target
    e = np.array([[1e4, -1e4, 0.0], [-1e4, 1e4, 3.0], [-np.inf, 0.0, 1.0], [88.0, -88.0, 1e-30],
                  [1e30, -1e30, 0.0]], dtype)
    out.append(_spec.Sample((e, np.array([0, 0, 2, 1, 2], np.int32)), dict(reduction="none"),
                            "edge"))
    return out


_BAD_REDUCTION = (dict(reduction="avg"), ValueError, "'reduction' must be one of")


def _cross_entropy_bad(dtype):
    x = np.zeros((2, 3), dtype)
    t = np.array([0, 2])
    calls = [((x.astype(d), t), {}, TypeError, "argument 'logits' must be a float32 or float64")
             for d in _spec.NOT_FLOAT]
    calls += [
        ((x.tolist(), t), {}, TypeError, "argument 'logits' must be a numpy.ndarray"),
        ((x, t.tolist()), {}, TypeError, "argument 'target' must be a numpy.ndarray"),
        ((x, np.array([0.0, 1.0])), {}, TypeError, "argument 'target' must be a int32 or int64"),
        ((x, np.array([0, 1], np.uint8)), {}, TypeError, "'target' must be a int32 or int64"),
        ((x, np.array([0, 3])), {}, ValueError, r"target holds class 3, outside \[0, 3\)"),
        ((x, np.array([-1, 0])), {}, ValueError, r"target holds class -1, outside \[0, 3\)"),
        ((x, np.array([0])), {}, ValueError, r"expected logits \(N, C\) and target \(N,\)"),
        ((x, np.array([[0, 1]])), {}, ValueError, r"expected logits \(N, C\) and target"),
        ((x[0], np.array([0])), {}, ValueError, r"expected logits \(N, C\) and target"),
        ((np.zeros((2, 0), dtype), t), {}, ValueError, "at least one class"),
        ((x, t), dict(reduction="avg"), ValueError, "'reduction' must be one of"),
        ((x, t), dict(reduction=None), ValueError, "'reduction' must be one of")]
    return [_spec.Bad(*c) for c in calls]


def _loss_spec(name, kernels, rule, names, samples, bad=None, wrt=(0, 1)):
    return _spec.OpSpec(
        name, FAMILY, kernels, backward=rule, reference=f"test_nn:ref_{name}",
        samples=samples, bad=bad or _spec.float_only(2, names, (_BAD_REDUCTION,)),
        grad=_spec.Grad(wrt), tol=_TOL, out=False)


SPECS = {s.name: s for s in (
    _loss_spec("mse_loss", (), _mse_rule, ("input", "target"), _pair_samples(None)),
    _loss_spec("binary_cross_entropy_with_logits",
               ("bce_with_logits", "bce_with_logits_backward"), _bce_rule, ("logits", "target"),
               _pair_samples((0.0, 1.0))),
    _loss_spec("cross_entropy", ("cross_entropy", "cross_entropy_backward"), _ce_rule,
               ("logits", "target"), _cross_entropy_samples, _cross_entropy_bad, wrt=(0,)),
)}


# ---------------------------------------------------------------------------
# Operators


@operator(SPECS["mse_loss"])
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


@operator(SPECS["binary_cross_entropy_with_logits"])
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


@operator(SPECS["cross_entropy"])
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
