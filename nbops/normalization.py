"""Normalization: ``batch_norm``, ``layer_norm`` and ``rms_norm``, on CPU and CUDA.

Semantics are PyTorch's (``torch.nn.functional.batch_norm``,
``layer_norm``, ``rms_norm``). Inputs are float32 or float64 arrays on one
device; weights, biases and running statistics have the input's dtype and
device. Non-contiguous inputs are copied to C order first (the kernels
walk rows and channel planes with unit stride).

Numerics: none of the kernels forms ``E[x^2] - E[x]^2``, so an offset of
1e4 (float32) or 1e8 (float64) on unit-variance data costs no accuracy in
the statistics. On the CPU, layer and RMS norm take two passes over each
row while it is in cache (a mean, then the deviations from it with the
corrected two-pass formula); the sums run in blocks of 256 elements in
the input's dtype (full-width vectors) whose totals accumulate in float64.
Batch norm computes each (sample, channel) plane's mean and M2 that way
and folds the planes with Chan's parallel merge. On CUDA each thread keeps
float64 sums (layer norm) or a Welford accumulator (batch norm), merged in
a shared-memory tree (Chan's formula for Welford states). The
normalisation itself runs in the input's dtype: the mean rounded to it
moves float32 outputs by at most half an ulp of the mean over the
standard deviation, the size of the input's own rounding. Kernels:
``nbops/cpu/normalization.py`` and ``nbops/cuda/normalization.py``.
Backward rules are attached for autograd (training-mode batch norm
differentiates through the batch statistics).
"""

import functools
import math
import numbers

import numpy as np

from . import _checks, _dispatch, _layout, _spec
from ._dispatch import CPU, operator
from .tensor import contiguous_array as _contiguous

__all__ = ["batch_norm", "layer_norm", "rms_norm"]

_ENTRIES = ("norm_rows", "norm_rows_backward", "batch_norm_stats", "batch_norm_invstd",
            "batch_norm_forward", "batch_norm_train", "batch_norm_backward")
FAMILY = _spec.mirror("normalization")
_kernel = FAMILY.kernel


# Backward rules (defined before the declarations that name them)


def _layer_norm_rule(ctx, grad):
    x, ns, weight, bias, eps = ctx.inputs[:5]
    dx, dw, db = _rows_grads(x, grad, ns, weight, eps, True)
    return dx, None, dw if weight is not None else None, db if bias is not None else None, \
        None, None


def _rms_norm_rule(ctx, grad):
    x, ns, weight, eps = ctx.inputs[:4]
    if eps is None:
        eps = float(np.finfo(x.dtype).eps)
    dx, dw, _ = _rows_grads(x, grad, ns, weight, eps, False)
    return dx, None, dw if weight is not None else None, None, None


def _batch_norm_rule(ctx, grad):
    x, running_mean, running_var, weight, bias, training, momentum, eps = ctx.inputs[:8]
    dev = _dispatch.device_of_array(x)
    shape = tuple(x.shape)
    n, c = shape[0], shape[1]
    s = math.prod(shape[2:]) if len(shape) > 2 else 1
    dx = _checks.empty(shape, x.dtype, dev)
    dw = _checks.empty((c,), x.dtype, dev)
    db = _checks.empty((c,), x.dtype, dev)
    x3 = _as3(_contiguous(x), (n, c, s))
    # the batch statistics are recomputed (one read of x), not updated again
    mean, invstd = _channel_stats(dev, x3, running_mean, running_var, training, 0.0,
                                  float(eps), False)
    w, _ = _affine(weight, None, c, x.dtype, dev)
    _kernel("batch_norm_backward", dev)(x3, _as3(_contiguous(grad), (n, c, s)), mean, invstd,
                                        w, bool(training), _as3(dx, (n, c, s)), dw, db)
    return (dx, None, None, dw if weight is not None else None,
            db if bias is not None else None, None, None, None, None)


# ---------------------------------------------------------------------------
# Declarations. batch_norm's samples are pure calls (evaluation, or training
# without running statistics): the in-place update of running statistics is
# checked by tests/test_normalization.py.

_TOL = {_spec.F32: (2e-5, 2e-5), _spec.F64: (1e-10, 1e-10)}


def _batch_norm_samples(dtype):
    rng = np.random.default_rng(0)

    def r(*shape, loc=0.0):
        return (loc + rng.standard_normal(shape)).astype(dtype)

    def stats(c):
        return r(c), (0.5 + rng.random(c)).astype(dtype)

    return [
        _spec.Sample((r(4, 3, 7, loc=2.0), *stats(3), r(3), r(3)), dict(eps=1e-3), "eval"),
        _spec.Sample((r(3, 2, 3, 3), *stats(2)), {}, "eval-plain"),
        _spec.Sample((r(2, 4, 6), None, None, r(4), r(4)), dict(training=True), "train"),
        _spec.Sample((r(5, 3), None, None), dict(training=True), "train-2d"),
        _spec.Sample((r(1, 2, 1, 2), None, None), dict(training=True), "two-per-channel"),
    ]


def _rows_samples(centered):
    def samples(dtype):
        rng = np.random.default_rng(1)

        def r(*shape, loc=0.0):
            return (loc + rng.standard_normal(shape)).astype(dtype)

        eps = dict(eps=1e-5 if centered else 1e-6)
        affine = (lambda ns: (r(*ns), r(*ns))) if centered else (lambda ns: (r(*ns),))
        plain = (None, None) if centered else (None,)
        return [
            _spec.Sample((r(3, 4, 7, loc=-3.0), (4, 7), *affine((4, 7))), eps, "3d-affine"),
            _spec.Sample((r(5, 33), (33,), *plain), eps, "plain"),
            _spec.Sample((r(2, 1), 1, *affine((1,))), eps, "one-per-row"),
            _spec.Sample((r(2, 3, 40), (40,), *affine((40,))), eps, "rows-of-40"),
            _spec.Sample((r(0, 5), (5,), *plain), eps, "empty"),
        ]

    return samples


_BN_BASE = dict(x=np.zeros((2, 3, 4, 4)), running_mean=np.zeros(3), running_var=np.ones(3))
_BN_BAD = _spec.overrides(_BN_BASE, ("x", "running_mean", "running_var"), (
    (dict(x=np.zeros((2, 3), np.int32)), TypeError, "'x' must be a float32 or float64"),
    (dict(x=np.zeros(3)), ValueError, "must be 2-D"),
    (dict(x=np.zeros((1, 2, 3, 4, 5))), ValueError, "must be 2-D"),
    (dict(running_mean=np.zeros(4)), ValueError, r"'running_mean' must have shape \(3,\)"),
    (dict(running_var=np.ones((3, 1))), ValueError, "'running_var' must have shape"),
    (dict(weight=np.ones(2)), ValueError, "'weight' must have shape"),
    (dict(bias=np.ones(5)), ValueError, "'bias' must have shape"),
    (dict(running_mean=np.zeros(3, np.float32)), TypeError, "cast one of them"),
    (dict(running_mean=None), ValueError, "'running_mean' is None"),
    (dict(eps=-1e-5), ValueError, "'eps' must be >= 0"),
    (dict(eps=float("nan")), ValueError, "'eps' must be finite"),
    (dict(momentum=1.5, training=True), ValueError, "'momentum' must be <= 1"),
    (dict(momentum=None, training=True), TypeError, "cumulative average"),
    (dict(training="yes"), TypeError, "'training' must be a bool"),
    (dict(x=np.zeros((1, 3)), training=True), ValueError, "more than 1 value per channel"),
    (dict(running_var=np.ones(6)[::2], training=True), ValueError, "must be contiguous")))
_ROW_BASE = dict(x=np.zeros((2, 3, 4, 4)), normalized_shape=4)
_ROW_POSITIONAL = ("x", "normalized_shape")
_LN_BAD = _spec.overrides(_ROW_BASE, _ROW_POSITIONAL, (
    (dict(normalized_shape=(5,)), ValueError, "suffix"),
    (dict(normalized_shape=(3, 4)), ValueError, "suffix"),
    (dict(normalized_shape=()), ValueError, "non-empty suffix"),
    (dict(normalized_shape=(1, 2, 3, 4, 4)), ValueError, "suffix"),
    (dict(normalized_shape="4"), TypeError, "sequence of ints"),
    (dict(weight=np.ones(3)), ValueError, "'weight' must have shape"),
    (dict(bias=np.ones((4, 1))), ValueError, "'bias' must have shape"),
    (dict(weight=np.ones(4, np.float32)), TypeError, "cast one of them"),
    (dict(eps=-1.0), ValueError, "'eps' must be >= 0"),
    (dict(x=np.zeros((2, 4), np.int64)), TypeError, "float32 or float64")))
_RMS_BAD = _spec.overrides(_ROW_BASE, _ROW_POSITIONAL, (
    (dict(normalized_shape=(4, 4, 4)), ValueError, "suffix"),
    (dict(weight=np.ones(5)), ValueError, "'weight' must have shape"),
    (dict(x=np.zeros((2, 4), np.int64)), TypeError, "float32 or float64")))


def _bench(name, setup, reference="", **kwargs):
    return _spec.Bench(f"nbops.bench.normalization:{name}_numpy", name,
                       f"nbops.bench.normalization:{setup}", dict(kwargs, eps=1e-5), reference,
                       options=dict(tol=(2e-5, 1e-12)))


SPECS = {s.name: s for s in (
    _spec.OpSpec("batch_norm", FAMILY, _ENTRIES[2:], backward=_batch_norm_rule,
                 samples=_batch_norm_samples, bad=_BN_BAD, grad=_spec.Grad((0, 3, 4)),
                 tol=_TOL, bench=(
                     _bench("batch_norm_eval", "setup_channels"),
                     _bench("batch_norm_train", "setup_channels",
                            "nbops.bench.normalization:batch_norm_train_reference",
                            training=True))),
    _spec.OpSpec("layer_norm", FAMILY, _ENTRIES[:2], backward=_layer_norm_rule,
                 samples=_rows_samples(True), bad=_LN_BAD, grad=_spec.Grad((0, 2, 3)),
                 tol=_TOL, bench=(_bench("layer_norm", "setup_rows"),)),
    _spec.OpSpec("rms_norm", FAMILY, _ENTRIES[:2], backward=_rms_norm_rule,
                 samples=_rows_samples(False), bad=_RMS_BAD, grad=_spec.Grad((0, 2)),
                 tol=_TOL, bench=(_bench("rms_norm", "setup_rms_rows"),)),
)}


# ---------------------------------------------------------------------------
# Public operators


@operator(SPECS["batch_norm"])
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, out=None):
    """Batch normalization over the channel axis 1 (PyTorch's
    ``F.batch_norm``).

    ``y = (x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c]``, where in
    training ``mean`` and ``var`` are the batch's (biased variance, over all
    axes but 1) and in evaluation the running statistics.

    Parameters
    ----------
    x : array (N, C), (N, C, L) or (N, C, H, W), float32 or float64
    running_mean, running_var : arrays (C,) or None
        Same dtype and device as ``x``, contiguous. In training they are
        updated in place (when given): ``running = (1 - momentum) * running
        + momentum * batch``, with the *unbiased* batch variance, as PyTorch.
        Required in evaluation.
    weight, bias : arrays (C,), optional
        The affine scale (default 1) and shift (default 0).
    training : bool
        Use (and record) batch statistics rather than the running ones.
    momentum : float in [0, 1]
        Weight of the batch in the running update (the nn modules turn
        PyTorch's ``momentum=None``, a cumulative average, into
        ``1 / num_batches_tracked``).
    eps : float >= 0
        Added to the variance.
    out : array of x's shape, optional
        C-contiguous, x's dtype and device, not overlapping the inputs.

    Returns
    -------
    array of x's shape, dtype and device.

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices, non-bool ``training``,
        non-real ``momentum``/``eps``, ``out`` of the wrong dtype or device.
    ValueError
        ``x`` not 2-, 3- or 4-D; a running statistic, weight or bias not of
        shape (C,); missing running statistics in evaluation; one value per
        channel in training; non-contiguous or read-only running statistics
        that training would update; ``momentum`` outside [0, 1]; negative
        or non-finite ``eps``; a bad ``out``.

    Example
    -------
    >>> x = np.array([[1.0, 10.0], [3.0, 30.0]])
    >>> rm, rv = np.zeros(2), np.ones(2)
    >>> nbops.batch_norm(x, rm, rv, training=True, eps=0.0)
    array([[-1., -1.],
           [ 1.,  1.]])
    >>> rm, rv
    (array([0.2, 2. ]), array([ 1.1, 20.9]))
    """
    op = "batch_norm"
    x = _checks.array(op, "x", x)
    written = training is True or training is np.True_
    if running_mean is not None:
        running_mean = _checks.array(op, "running_mean", running_mean, written=written)
    if running_var is not None:
        running_var = _checks.array(op, "running_var", running_var, written=written)
    if weight is not None:
        weight = _checks.array(op, "weight", weight)
    if bias is not None:
        bias = _checks.array(op, "bias", bias)
    _checks.same_dtype(op, x=x, running_mean=running_mean, running_var=running_var,
                       weight=weight, bias=bias)
    dev = _dispatch.resolve_device(op, x=x, running_mean=running_mean,
                                   running_var=running_var, weight=weight, bias=bias, out=out)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'training' must be a bool, got "
                        f"{_checks.describe(training)}")
    if momentum is None:
        raise TypeError(f"{op}: argument 'momentum' must be a real number in [0, 1]; the "
                        "cumulative average of momentum=None is the nn modules' "
                        "(BatchNorm1d/2d), which pass 1 / num_batches_tracked")
    momentum = _checks.scalar(op, "momentum", momentum, low=0.0, high=1.0)
    eps = _checks.scalar(op, "eps", eps, low=0.0)
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"{op}: argument 'x' must be 2-D (N, C), 3-D (N, C, L) or 4-D "
                         f"(N, C, H, W), got shape {tuple(x.shape)}")
    shape = tuple(x.shape)
    n, c = shape[0], shape[1]
    s = math.prod(shape[2:]) if x.ndim > 2 else 1
    for name, a in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if a is not None and tuple(a.shape) != (c,):
            raise ValueError(f"{op}: argument '{name}' must have shape ({c},), one value per "
                             f"channel of 'x' {shape}, got {tuple(a.shape)}")
    if not training and (running_mean is None or running_var is None):
        missing = "running_mean" if running_mean is None else "running_var"
        raise ValueError(f"{op}: argument '{missing}' is None, but evaluation "
                         "(training=False) normalises with the running statistics")
    if training and n * s <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got "
                         f"'x' of shape {shape}")
    update = training and running_mean is not None and running_var is not None
    if training and (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: give both 'running_mean' and 'running_var' or neither")
    if update:
        for name, a in (("running_mean", running_mean), ("running_var", running_var)):
            if not _layout.is_c_contiguous(a):
                raise ValueError(f"{op}: argument '{name}' is updated in place in training "
                                 f"and must be contiguous, got strides {tuple(a.strides)}")
            if isinstance(a, np.ndarray) and not a.flags.writeable:
                raise ValueError(f"{op}: argument '{name}' is updated in place in training "
                                 "but is read-only")
    out = _checks.output(op, out, shape, x.dtype, dev,
                         {"x": x, "running_mean": running_mean, "running_var": running_var,
                          "weight": weight, "bias": bias})
    if x.size == 0:
        return out
    x3 = _as3(_contiguous(x), (n, c, s))
    w, b = _affine(weight, bias, c, x.dtype, dev)
    if training:
        mean, invstd = (_checks.empty((c,), x.dtype, dev) for _ in range(2))
        empty = _checks.empty((0,), x.dtype, dev)
        _kernel("batch_norm_train", dev)(
            x3, eps, w, b, mean, invstd, running_mean if update else empty,
            running_var if update else empty, momentum, update, _as3(out, (n, c, s)))
        return out
    mean, invstd = _channel_stats(dev, x3, running_mean, running_var, False, momentum, eps,
                                  False)
    _kernel("batch_norm_forward", dev)(x3, mean, invstd, w, b, _as3(out, (n, c, s)))
    return out


@operator(SPECS["layer_norm"])
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, out=None):
    """Layer normalization over the trailing ``normalized_shape`` axes
    (PyTorch's ``F.layer_norm``).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and
    biased variance over the last ``len(normalized_shape)`` axes of each
    row; the affine is fused into the same pass.

    Parameters
    ----------
    x : array (..., *normalized_shape), float32 or float64, any strides
    normalized_shape : int or sequence of ints
        Must equal the trailing axes of ``x``.
    weight, bias : arrays of shape ``normalized_shape``, optional
        Same dtype and device as ``x`` (default 1 and 0).
    eps : float >= 0
    out : array of x's shape, optional
        C-contiguous, x's dtype and device, not overlapping the inputs.

    Returns
    -------
    array of x's shape, dtype and device.

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices, a ``normalized_shape``
        that is not ints, ``out`` of the wrong dtype or device.
    ValueError
        ``normalized_shape`` empty or not a suffix of ``x.shape``; weight or
        bias not of shape ``normalized_shape``; negative or non-finite
        ``eps``; a bad ``out``.

    Example
    -------
    >>> nbops.layer_norm(np.array([[1.0, 3.0], [0.0, 10.0]]), 2, eps=0.0)
    array([[-1.,  1.],
           [-1.,  1.]])
    """
    op = "layer_norm"
    rows, d, dev, x, weight, bias = _check_rows(op, x, normalized_shape, weight, bias, eps,
                                                out)
    out = _checks.output(op, out, tuple(x.shape), x.dtype, dev,
                         {"x": x, "weight": weight, "bias": bias})
    return _rows(op, dev, x, rows, d, weight, bias, float(eps), True, out)


@operator(SPECS["rms_norm"])
def rms_norm(x, normalized_shape, weight=None, eps=None, out=None):
    """Root-mean-square normalization over the trailing ``normalized_shape``
    axes (PyTorch's ``F.rms_norm``): ``y = x / sqrt(mean(x^2) + eps) * weight``.

    Parameters
    ----------
    x : array (..., *normalized_shape), float32 or float64, any strides
    normalized_shape : int or sequence of ints
        Must equal the trailing axes of ``x``.
    weight : array of shape ``normalized_shape``, optional
    eps : float >= 0 or None
        None means the machine epsilon of x's dtype, as PyTorch.
    out : array of x's shape, optional

    Returns
    -------
    array of x's shape, dtype and device.

    Raises
    ------
    TypeError
        As :func:`layer_norm`.
    ValueError
        As :func:`layer_norm`.

    Example
    -------
    >>> nbops.rms_norm(np.array([[3.0, -4.0]]), 2, eps=0.0)
    array([[ 0.84852814, -1.13137085]])
    """
    op = "rms_norm"
    x = _checks.array(op, "x", x)
    if eps is None:
        eps = float(np.finfo(x.dtype).eps)
    rows, d, dev, x, weight, _ = _check_rows(op, x, normalized_shape, weight, None, eps, out)
    out = _checks.output(op, out, tuple(x.shape), x.dtype, dev, {"x": x, "weight": weight})
    return _rows(op, dev, x, rows, d, weight, None, float(eps), False, out)


# ---------------------------------------------------------------------------
# Helpers


def _as3(x, shape):
    """A C-contiguous array viewed with a new shape (no copy, either device)."""
    if isinstance(x, np.ndarray):
        return x.reshape(shape)
    strides, acc = [], x.dtype.itemsize
    for k in reversed(shape):
        strides.append(acc)
        acc *= max(k, 1)
    return _layout.strided_view(x, shape, tuple(reversed(strides)))


@functools.lru_cache(maxsize=32)
def _filled(value, n, dtype, dev):
    """An (n,) array of ``value``: the weight or bias standing in for None,
    kept so that device calls do not copy one to the GPU each time (kernels
    only read it; writeable, since read-only arrays compile other kernels)."""
    a = np.full(n, value, dtype)
    return a if dev == CPU else _dispatch.to_device(a)


def _affine(weight, bias, n, dtype, dev):
    """Contiguous (n,) weight and bias; ones and zeros stand in for None."""
    key = np.dtype(dtype).str
    w = _filled(1, n, key, dev) if weight is None else _as3(_contiguous(weight), (n,))
    b = _filled(0, n, key, dev) if bias is None else _as3(_contiguous(bias), (n,))
    return w, b


def _channel_stats(dev, x3, running_mean, running_var, training, momentum, eps, update):
    """Per-channel ``(mean, invstd)`` that normalise ``x3``: the batch's
    (updating the running statistics when asked) or the running ones."""
    c = x3.shape[1]
    invstd = _checks.empty((c,), x3.dtype, dev)
    if training:
        mean = _checks.empty((c,), x3.dtype, dev)
        empty = _checks.empty((0,), x3.dtype, dev)
        _kernel("batch_norm_stats", dev)(
            x3, eps, mean, invstd, running_mean if update else empty,
            running_var if update else empty, momentum, update)
        return mean, invstd
    mean = _as3(_contiguous(running_mean), (c,))
    _kernel("batch_norm_invstd", dev)(_as3(_contiguous(running_var), (c,)), eps, invstd)
    return mean, invstd


def _normalized_shape(op, normalized_shape):
    if isinstance(normalized_shape, (numbers.Integral,)) and \
            not isinstance(normalized_shape, (bool, np.bool_)):
        return (int(normalized_shape),)
    try:
        dims = tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"{op}: argument 'normalized_shape' must be an int or a sequence of "
                        f"ints, got {_checks.describe(normalized_shape)}") from None
    if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral)
           for d in dims):
        raise TypeError(f"{op}: argument 'normalized_shape' must be an int or a sequence of "
                        f"ints, got {normalized_shape!r}")
    return tuple(int(d) for d in dims)


def _check_rows(op, x, normalized_shape, weight, bias, eps, out):
    """Checks shared by layer_norm and rms_norm; ``(rows, d, device, x,
    weight, bias)``, the arrays as :func:`nbops._checks.array` returns them."""
    x = _checks.array(op, "x", x)
    if weight is not None:
        weight = _checks.array(op, "weight", weight)
    if bias is not None:
        bias = _checks.array(op, "bias", bias)
    _checks.same_dtype(op, x=x, weight=weight, bias=bias)
    dev = _dispatch.resolve_device(op, x=x, weight=weight, bias=bias, out=out)
    ns = _normalized_shape(op, normalized_shape)
    _checks.scalar(op, "eps", eps, low=0.0)
    shape = tuple(x.shape)
    if not ns or len(ns) > len(shape) or shape[len(shape) - len(ns):] != ns:
        raise ValueError(f"{op}: argument 'normalized_shape' {ns} must be a non-empty suffix "
                         f"of the shape of 'x' {shape}")
    for name, a in (("weight", weight), ("bias", bias)):
        if a is not None and tuple(a.shape) != ns:
            raise ValueError(f"{op}: argument '{name}' must have shape normalized_shape = {ns}, "
                             f"got {tuple(a.shape)}")
    d = math.prod(ns)
    rows = math.prod(shape[:len(shape) - len(ns)])
    return rows, d, dev, x, weight, bias


def _rows(op, dev, x, rows, d, weight, bias, eps, centered, out):
    if rows * d == 0:
        return out
    w, b = _affine(weight, bias, d, x.dtype, dev)
    _kernel("norm_rows", dev)(_as3(_contiguous(x), (rows, d)), w, b, eps, centered,
                              _as3(out, (rows, d)))
    return out


# ---------------------------------------------------------------------------
# Backward rules (autograd): one gradient per forward parameter


def _rows_grads(x, grad, normalized_shape, weight, eps, centered):
    """``(dx, dweight, dbias)`` of layer norm (``centered``) or RMS norm."""
    dev = _dispatch.device_of_array(x)
    ns = _normalized_shape("layer_norm", normalized_shape)
    d = math.prod(ns)
    rows = math.prod(tuple(x.shape)) // d if d else 0
    dx = _checks.empty(tuple(x.shape), x.dtype, dev)
    dw = _checks.empty(ns, x.dtype, dev)
    db = _checks.empty(ns, x.dtype, dev)
    w, _ = _affine(weight, None, d, x.dtype, dev)
    _kernel("norm_rows_backward", dev)(
        _as3(_contiguous(x), (rows, d)), _as3(_contiguous(grad), (rows, d)), w, float(eps),
        centered, _as3(dx, (rows, d)), _as3(dw, (d,)), _as3(db, (d,)))
    return dx, dw, db
