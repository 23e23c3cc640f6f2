"""Float ONNX operators on nbops kernels: the op table's declarations.

Each operator is declared once per opset range whose semantics it covers
(:func:`nbops.onnx._registry.onnx_op`). Elementwise operators are generated
from the tables :data:`UNARY` and :data:`BINARY`.

Compute runs on nbops' kernels for float32/float64 (conv2d with its fused
epilogue and residual, linear with activation epilogues, matmul, pooling,
batch/layer/rms norm, softmax, attention, activations, add/sub/mul/div/pow,
exp/log/neg, sum/mean, cat/split/transpose/reshape). NumPy runs what nbops
has no kernel for, and every integer or bool case: Sqrt, Abs, Erf (SciPy's
``erf``), PRelu, HardSigmoid, Clip, Selu's scale, LRN, ConvTranspose,
ReduceMax, pooling with asymmetric padding, 3-D windows, dilated average
windows or ceil mode, Equal, Where, Gather, Slice, Pad, Expand, Cast,
Squeeze/Unsqueeze, Shape, ConstantOfShape, the mean/inverse-std outputs of
LayerNormalization, and Attention's softcap, qk output modes and cache.
On a CUDA session those NumPy handlers copy their inputs to the host and
their results back (named ``_host`` below), which is correct and slow.
"""

import math

import numpy as np

import nbops

from ._planner import NBOPS_DOMAIN
from ._registry import UnsupportedModelError, onnx_op

FLOAT = ("float32", "float64")
_FL = (np.float32, np.float64)

# ---------------------------------------------------------------------------
# Helpers


def _on_device(x):
    return x is not None and not isinstance(x, (np.ndarray, np.generic)) and \
        hasattr(x, "__cuda_array_interface__")


def _host(fn):
    """A NumPy handler on any session: device inputs copied to the host, the
    results copied back to the device."""

    def run(node, *args, **kw):
        dev = any(_on_device(a) for a in args)
        if not dev:
            return fn(node, *args, **kw)
        res = fn(node, *[nbops.to_host(a) if _on_device(a) else a for a in args], **kw)
        many = isinstance(res, tuple)
        res = tuple(_to_dev(r) for r in (res if many else (res,)))
        return res if many else res[0]

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def _to_dev(r):
    if r is None or not isinstance(r, np.ndarray) or r.dtype.kind not in "fc":
        return r  # indices, shapes and masks stay host values
    return nbops.to_device(np.ascontiguousarray(r))


def _float(*xs):
    """Whether nbops' float kernels run these (same float dtype)."""
    dt = None
    for x in xs:
        if x is None:
            continue
        if x.dtype not in _FL or (dt is not None and x.dtype != dt):
            return False
        dt = x.dtype
    return True


def _ints(x):
    """A constant int tensor input (shape, axes, pads) as a list of ints."""
    if x is None:
        return None
    if _on_device(x):
        x = nbops.to_host(x)
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _refuse(node, what):
    raise UnsupportedModelError(
        f"nbops.onnx: node {node.name!r} op {node.op_type} at opset {node.opset}: {what} "
        f"is not supported")


def _axis(axis, ndim):
    return axis + ndim if axis < 0 else axis


# ---------------------------------------------------------------------------
# Elementwise: generated from tables


def _np_unary(f):
    return lambda x, a: f(x)


def _selu(x, a):
    alpha = a.get("alpha", 1.67326319217681884765625)
    gamma = a.get("gamma", 1.05070102214813232421875)
    return nbops.mul(nbops.elu(x, alpha), x.dtype.type(gamma))


def _selu_np(x, a):
    alpha = a.get("alpha", 1.67326319217681884765625)
    gamma = a.get("gamma", 1.05070102214813232421875)
    return (gamma * np.where(x > 0, x, alpha * np.expm1(x))).astype(x.dtype)


def _hard_sigmoid(x, a):
    alpha, beta = a.get("alpha", 0.2), a.get("beta", 0.5)
    return np.clip(x * x.dtype.type(alpha) + x.dtype.type(beta), 0, 1).astype(x.dtype)


def _erf(x):
    from scipy.special import erf

    return erf(x).astype(x.dtype)


def _elu_np(x, a):
    alpha = a.get("alpha", 1.0)
    return np.where(x > 0, x, alpha * np.expm1(x)).astype(x.dtype)


def _softplus_np(x):
    return np.logaddexp(x, 0).astype(x.dtype)


#: op type -> (since, nbops form f(x, attrs) for float32/64 or None,
#: NumPy form f(x, attrs) for every other dtype or None (float only)).
UNARY = {
    "Relu": (6, lambda x, a: nbops.relu(x), _np_unary(lambda x: np.maximum(x, x.dtype.type(0)))),
    "LeakyRelu": (6, lambda x, a: nbops.leaky_relu(x, a.get("alpha", 0.01)), None),
    "Sigmoid": (6, lambda x, a: nbops.sigmoid(x), None),
    "Tanh": (6, lambda x, a: nbops.tanh(x), None),
    "Elu": (6, lambda x, a: nbops.elu(x, a.get("alpha", 1.0)), None),
    "Selu": (6, _selu, None),
    "Softplus": (1, lambda x, a: nbops.softplus(x), None),
    "HardSwish": (14, lambda x, a: nbops.hardswish(x), None),
    "HardSigmoid": (6, None, _hard_sigmoid),
    "Exp": (6, lambda x, a: nbops.exp(x), None),
    "Log": (6, lambda x, a: nbops.log(x), None),
    "Neg": (6, lambda x, a: nbops.neg(x), _np_unary(np.negative)),
    "Sqrt": (6, None, _np_unary(lambda x: np.sqrt(x).astype(x.dtype))),
    "Abs": (6, None, _np_unary(np.abs)),
    "Erf": (9, None, _np_unary(_erf)),
}

#: NumPy forms of the float-only ops, for float16 and device-free fallbacks
#: (float16 has no nbops kernel).
_UNARY_NP_FLOAT = {
    "LeakyRelu": lambda x, a: np.where(x < 0, x * x.dtype.type(a.get("alpha", 0.01)), x),
    "Sigmoid": lambda x, a: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "Tanh": lambda x, a: np.tanh(x),
    "Elu": _elu_np,
    "Selu": _selu_np,
    "Softplus": lambda x, a: _softplus_np(x),
    "HardSwish": lambda x, a: (x * np.clip(x / 6 + 0.5, 0, 1)).astype(x.dtype),
    "Exp": lambda x, a: np.exp(x),
    "Log": lambda x, a: np.log(x),
}


def _make_unary(op, nb, npf):
    npf = npf or _UNARY_NP_FLOAT.get(op)

    def run(node, x):
        if nb is not None and _float(x) and (x.size or _on_device(x)):
            return nb(x, node.attrs)
        if _on_device(x):
            return _to_dev(npf(nbops.to_host(x), node.attrs))
        return npf(x, node.attrs)

    run.__name__ = f"onnx_{op.lower()}"
    run.__doc__ = f"ONNX {op}: nbops for float32/float64, NumPy otherwise."
    return run


for _op, (_since, _nb, _npf) in UNARY.items():
    onnx_op(_op, since=_since)(_make_unary(_op, _nb, _npf))


def _int_div(a, b):
    # ONNX's integer Div truncates toward zero (C semantics), not floor
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.trunc(np.true_divide(a, b)).astype(a.dtype)


def _np_pow(a, b):
    return np.power(a, b).astype(a.dtype)


#: op type -> (since, nbops function for two same-dtype floats, NumPy form).
BINARY = {
    "Add": (7, nbops.add, np.add),
    "Sub": (7, nbops.sub, np.subtract),
    "Mul": (7, nbops.mul, np.multiply),
    "Div": (7, nbops.div, lambda a, b: np.divide(a, b) if a.dtype.kind == "f" else
            _int_div(a, b)),
    "Pow": (7, nbops.pow, _np_pow),
}


def _make_binary(op, nb, npf):
    def run(node, a, b):
        if op == "Pow" and b.dtype != a.dtype:
            # from opset 12 the exponent may be of another type: it takes the
            # base's (the result has the base's type)
            b = b.astype(a.dtype) if not _on_device(b) else b
        if _float(a, b) and a.size and b.size:
            return nb(a, b)
        if _on_device(a) or _on_device(b):
            return _to_dev(npf(nbops.to_host(a) if _on_device(a) else a,
                               nbops.to_host(b) if _on_device(b) else b))
        return np.asarray(npf(a, b))

    run.__name__ = f"onnx_{op.lower()}"
    run.__doc__ = f"ONNX {op} with NumPy broadcasting: nbops for float32/float64."
    return run


for _op, (_since, _nb, _npf) in BINARY.items():
    onnx_op(_op, since=_since)(_make_binary(_op, _nb, _npf))


@onnx_op("Sum", since=8)
def onnx_sum(node, *xs):
    """Variadic broadcasting sum, pairwise on :func:`nbops.add`."""
    add = _make_binary("Add", nbops.add, np.add)
    acc = xs[0]
    for x in xs[1:]:
        acc = add(node, acc, x)
    return acc if len(xs) > 1 else (acc.copy() if isinstance(acc, np.ndarray) else acc)


@onnx_op("Equal", since=7)
@_host
def onnx_equal(node, a, b):
    return np.equal(a, b)


@onnx_op("Where", since=9)
@_host
def onnx_where(node, c, x, y):
    return np.where(c, x, y)


@onnx_op("PRelu", since=7)
@_host
def onnx_prelu(node, x, slope):
    return np.where(x < 0, x * slope, x).astype(x.dtype)


@onnx_op("Clip", since=6, until=10)
@_host
def onnx_clip6(node, x):
    lo = node.attrs.get("min", -np.inf)
    hi = node.attrs.get("max", np.inf)
    return np.minimum(np.maximum(x, x.dtype.type(lo)), x.dtype.type(hi))


@onnx_op("Clip", since=11)
@_host
def onnx_clip11(node, x, lo=None, hi=None):
    # NaN passes (maximum/minimum propagate it), as ONNX's reference does
    y = x
    if lo is not None:
        y = np.maximum(y, lo.astype(x.dtype))
    if hi is not None:
        y = np.minimum(y, hi.astype(x.dtype))
    return np.asarray(y, x.dtype) if y is not x else x.copy()


@onnx_op("Gelu", since=20)
@onnx_op("Gelu", domain=NBOPS_DOMAIN)
def onnx_gelu(node, x):
    """Gelu (exact or tanh form) on :func:`nbops.gelu`."""
    approx = node.attrs.get("approximate", "none")
    if _float(x) and (x.size or _on_device(x)):
        return nbops.gelu(x, approximate=approx)
    x64 = x.astype(np.float64)
    if approx == "tanh":
        y = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    else:
        from scipy.special import erf

        y = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# Softmax, reductions


def _softmax_fn(log):
    return nbops.log_softmax if log else nbops.softmax


def _make_softmax(log, new):
    def run(node, x):
        axis = node.attrs.get("axis", -1 if new else 1)
        axis = _axis(axis, x.ndim)
        fn = _softmax_fn(log)
        if x.size == 0:
            return x.copy()
        if new:
            return fn(x, axis=axis)
        # before opset 13 the input is seen as 2-D: [prod(:axis), prod(axis:)]
        shape = tuple(x.shape)
        rows = int(np.prod(shape[:axis], dtype=np.int64))
        y = fn(nbops.reshape(x, (rows, -1)) if _on_device(x) else x.reshape(rows, -1),
               axis=1)
        return nbops.reshape(y, shape) if _on_device(y) else y.reshape(shape)

    run.__name__ = ("onnx_log_softmax" if log else "onnx_softmax") + ("13" if new else "1")
    return run


for _log, _name in ((False, "Softmax"), (True, "LogSoftmax")):
    onnx_op(_name, since=1, until=12, dtypes=FLOAT)(_make_softmax(_log, False))
    onnx_op(_name, since=13, dtypes=FLOAT)(_make_softmax(_log, True))


#: op type -> (opset from which ``axes`` is an input, NumPy reduction).
REDUCE = {
    "ReduceSum": (13, np.sum),
    "ReduceMean": (18, np.mean),
    "ReduceMax": (18, np.max),
}


def _make_reduce(op, axes_from, npf, new):
    def run(node, x, axes=None):
        keep = bool(node.attrs.get("keepdims", 1))
        ax = _ints(axes) if new else node.attrs.get("axes")
        if not ax:
            if node.attrs.get("noop_with_empty_axes", 0) and new:
                return x
            ax = list(range(x.ndim))
        ax = tuple(sorted(_axis(a, x.ndim) for a in ax))
        hostx = nbops.to_host(x) if _on_device(x) else x
        reduced = int(np.prod([x.shape[a] for a in ax], dtype=np.int64))
        if reduced == 0 or x.size == 0:
            shape = tuple(1 if i in ax else d for i, d in enumerate(x.shape)) if keep else \
                tuple(d for i, d in enumerate(x.shape) if i not in ax)
            if op == "ReduceSum":
                fill = 0
            elif op == "ReduceMax":
                fill = -np.inf if x.dtype.kind == "f" else False if x.dtype.kind == "b" \
                    else np.iinfo(x.dtype).min
            else:
                fill = np.nan
            return np.full(shape, fill, x.dtype)
        if op in ("ReduceSum", "ReduceMean") and _float(x):
            f = nbops.sum if op == "ReduceSum" else nbops.mean
            return f(x, axis=ax, keepdims=keep)
        y = np.asarray(npf(hostx, axis=ax, keepdims=keep)).astype(x.dtype)
        return _to_dev(y) if _on_device(x) else y

    run.__name__ = f"onnx_{op.lower()}"
    return run


for _op, (_from, _npf) in REDUCE.items():
    onnx_op(_op, since=1, until=_from - 1)(_make_reduce(_op, _from, _npf, False))
    onnx_op(_op, since=_from)(_make_reduce(_op, _from, _npf, True))


# ---------------------------------------------------------------------------
# Convolution


def _same_pads(auto_pad, size, k, s, d):
    """(begin, end) padding of SAME_UPPER / SAME_LOWER for one axis."""
    out = -(-size // s)
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _check_window(node, r, **attrs):
    """Window attributes (kernel_shape, strides, dilations; pads: two per
    axis, >= 0) must hold one value >= 1 per spatial axis: a damaged or
    hand-made model can hold others, which would index or divide past them."""
    for name, v in attrs.items():
        v = list(v)
        n, low = (2 * r, 0) if name == "pads" else (r, 1)
        if len(v) != n or any(int(e) < low for e in v):
            raise ValueError(f"nbops.onnx: node {node.name!r} op {node.op_type}: attribute "
                             f"{name!r} must hold {n} values >= {low}, got {v}")


def _conv_pads(attrs, spatial, ksize, strides, dils):
    """Per-axis (begin, end) pads of a Conv / pooling node for input sizes
    ``spatial``."""
    r = len(spatial)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return [_same_pads(auto, spatial[i], ksize[i], strides[i], dils[i]) for i in range(r)]
    if auto == "VALID":
        return [(0, 0)] * r
    pads = attrs.get("pads") or [0] * (2 * r)
    return [(int(pads[i]), int(pads[i + r])) for i in range(r)]


def _conv_prepare(node, consts):
    """A dict of the node's calls per input shape (see :func:`_conv_run`),
    whose convolutions are packed (:func:`nbops.conv_pack`) when the weight
    and bias are constants; None (nothing kept) when they are not."""
    w = consts[1] if len(consts) > 1 else None
    if w is not None and w.ndim not in (3, 4):
        _refuse(node, f"a {w.ndim - 2}-D convolution (weight shape {w.shape})")
    if w is None or (len(node.inputs) > 2 and node.inputs[2] and consts[2] is None):
        return None
    return {}


def _conv_run(node, x, w, b, residual, activation, state):
    """Runs the node through its call for this input (made on the first run
    of each shape and kept in ``state``: the attributes read, the pads and
    the output shape worked out and, for constant weights, the weights packed
    once per session)."""
    key = (x.shape, x.dtype, None if residual is None else residual.shape)
    call = None if state is None else state.get(key)
    if call is None:
        call = _conv_call(node, x, w, b, residual, activation, state is not None)
        if state is not None:
            state[key] = call
    return call(x, w, b, residual)


def _conv_call(node, x, w, b, residual, activation, packed):
    """``call(x, w, b, residual)`` running the node on inputs of ``x``'s
    shape and dtype (and ``residual``'s shape); ``packed``: ``w`` and ``b``
    are the node's constants, packed here and not read again."""
    a = node.attrs
    if x.ndim not in (3, 4) or w.ndim != x.ndim:
        _refuse(node, f"a convolution of a {x.ndim}-D input")
    r = x.ndim - 2
    strides = a.get("strides") or [1] * r
    dils = a.get("dilations") or [1] * r
    _check_window(node, r, strides=strides, dilations=dils, pads=a.get("pads") or [0] * (2 * r))
    pads = _conv_pads(a, x.shape[2:], list(w.shape[2:]), strides, dils)
    # asymmetric padding: zero-padded explicitly, then a valid convolution
    pad_width = None if all(p0 == p1 for p0, p1 in pads) else \
        [(0, 0), (0, 0)] + [tuple(p) for p in pads]
    kw = dict(stride=tuple(strides), padding=tuple(0 if pad_width else p0 for p0, _ in pads),
              dilation=tuple(dils), groups=int(a.get("group", 1)))
    in_shape = tuple(x.shape) if pad_width is None else \
        tuple(s + p0 + p1 for s, (p0, p1) in zip(x.shape, pad_width))
    out_shape = in_shape[:1] + (w.shape[0],) + tuple(
        (in_shape[2 + i] + 2 * kw["padding"][i] - dils[i] * (w.shape[2 + i] - 1) - 1)
        // strides[i] + 1 for i in range(r))
    fused_res = residual is not None and tuple(residual.shape) == out_shape and \
        residual.dtype == x.dtype
    relu = activation == "relu"
    # ("hardtanh", lo, hi), a fused Clip: the conv kernels' epilogue applies
    # relu only, so it runs on the output in place, in the same call
    clip = activation[1:] if isinstance(activation, tuple) else None
    fn = nbops.conv_relu if relu and (fused_res or residual is None) else \
        (nbops.conv2d if r == 2 else nbops.conv1d)
    if packed:
        pack = nbops.conv_pack(w, b, input_shape=in_shape, **kw)
        conv = lambda x, w, b, res: fn(x, pack, residual=res)  # noqa: E731
    else:
        conv = lambda x, w, b, res: fn(x, w, b, residual=res, **kw)  # noqa: E731
    if pad_width is None and (fused_res or residual is None) and clip is None and (
            fn is nbops.conv_relu or not relu):
        return conv  # the kernel does it all

    def call(x, w, b, residual):
        if pad_width is not None:
            x = _to_dev(np.pad(nbops.to_host(x), pad_width)) if _on_device(x) else \
                np.pad(x, pad_width)
        y = conv(x, w, b, residual if fused_res else None)
        if residual is not None and not fused_res:
            y = nbops.add(y, residual)
        if relu and fn is not nbops.conv_relu:
            y = nbops.relu(y)
        if clip is not None:
            y = nbops.hardtanh(y, *clip, out=y)  # y is this call's own array
        return y

    return call


@onnx_op("Conv", since=1, prepare=_conv_prepare, dtypes=FLOAT)
def onnx_conv(node, x, w, b=None, *, state):
    """Conv (1-D and 2-D, any pads/strides/dilations/groups/auto_pad) on
    :func:`nbops.conv2d`."""
    return _conv_run(node, x, w, b, None, None, state)


@onnx_op("FusedConv", domain=NBOPS_DOMAIN, prepare=_conv_prepare, dtypes=FLOAT)
def onnx_fused_conv(node, x, w, b=None, residual=None, *, state):
    """The planner's Conv [+ folded BN] [+ residual Add] [+ Relu or Clip]:
    one nbops convolution with its epilogue (``conv_relu``/``conv2d`` with
    ``residual=``); a Clip's ``hardtanh`` then runs on its output in place."""
    return _conv_run(node, x, w, b, residual, node.attrs.get("activation"), state)


@onnx_op("ConvTranspose", since=1, dtypes=FLOAT)
@_host
def onnx_conv_transpose(node, x, w, b=None):
    """ConvTranspose (any rank) in NumPy: ``W^T @ x`` per group, each tap's
    plane added at its strided offset, then cropped by the pads."""
    a = node.attrs
    r = x.ndim - 2
    n, c = x.shape[:2]
    g = int(a.get("group", 1))
    co_g = w.shape[1]
    ks = list(w.shape[2:])
    s = a.get("strides") or [1] * r
    d = a.get("dilations") or [1] * r
    op = a.get("output_padding") or [0] * r
    full = [(x.shape[2 + i] - 1) * s[i] + (ks[i] - 1) * d[i] + 1 + op[i] for i in range(r)]
    out_shape = a.get("output_shape")
    auto = a.get("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-r:] if out_shape is not None else \
            [x.shape[2 + i] * s[i] for i in range(r)]
        pads = []
        for i in range(r):
            total = full[i] - target[i]
            if auto == "SAME_UPPER":
                pads.append((total // 2, total - total // 2))
            else:
                pads.append((total - total // 2, total // 2))
    elif auto == "VALID":
        pads = [(0, 0)] * r
    else:
        p = a.get("pads") or [0] * (2 * r)
        pads = [(p[i], p[i + r]) for i in range(r)]
    y = np.zeros((n, co_g * g) + tuple(full), np.float64)
    cg = c // g
    for gi in range(g):
        xg = x[:, gi * cg:(gi + 1) * cg].astype(np.float64)
        wg = w[gi * cg:(gi + 1) * cg].astype(np.float64)
        # cols[n, co, taps..., pixels...]
        cols = np.tensordot(xg, wg, axes=([1], [0]))  # n, pix..., co, k...
        cols = np.moveaxis(cols, list(range(1, 1 + r)), list(range(2 + r, 2 + 2 * r)))
        for tap in np.ndindex(*ks):
            sl = tuple(slice(tap[i] * d[i], tap[i] * d[i] + (x.shape[2 + i] - 1) * s[i] + 1,
                             s[i]) for i in range(r))
            y[(slice(None), slice(gi * co_g, (gi + 1) * co_g)) + sl] += \
                cols[(slice(None), slice(None)) + tap]
    # negative pads (an output_shape past the full size) extend with zeros
    y = np.pad(y, [(0, 0), (0, 0)] + [(max(0, -p0), max(0, -p1)) for p0, p1 in pads])
    crop = tuple(slice(max(0, p0), y.shape[2 + i] - max(0, p1))
                 for i, (p0, p1) in enumerate(pads))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * r)
    return np.ascontiguousarray(y.astype(x.dtype))


# ---------------------------------------------------------------------------
# Normalization


def _bn_prepare(node, consts):
    if node.attrs.get("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        _refuse(node, "training mode (running statistics outputs)")
    if node.opset < 9 and not node.attrs.get("spatial", 1):
        _refuse(node, "spatial=0")
    return None


@onnx_op("BatchNormalization", since=7, dtypes=FLOAT, prepare=_bn_prepare)
def onnx_batch_norm(node, x, scale, bias, mean, var, *, state=None):
    """Inference-mode BatchNormalization on :func:`nbops.batch_norm`."""
    eps = float(node.attrs.get("epsilon", 1e-5))
    if _float(x, scale, bias, mean, var) and x.ndim >= 2 and x.size:
        return nbops.batch_norm(x, mean, var, scale, bias, eps=eps)
    sh = (1, -1) + (1,) * (x.ndim - 2)
    xh = nbops.to_host(x) if _on_device(x) else x
    y = (xh - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps) * scale.reshape(sh) + \
        bias.reshape(sh)
    return y.astype(x.dtype)


def _scale_shift_relu(x, s, t):
    return nbops.relu(x * s + t)


_SCALE_SHIFT_RELU = []  # the fused kernel, made on first use (nbops.fuse)


@onnx_op("ScaleShiftRelu", domain=NBOPS_DOMAIN, dtypes=FLOAT)
def onnx_scale_shift_relu(node, x, s, t):
    """The planner's inference-mode BatchNormalization + Relu: ``relu(x * s +
    t)`` with ``s``, ``t`` one value per channel (axis 1), in one pass of an
    :func:`nbops.fuse` kernel instead of a batch norm pass and a relu pass."""
    if not _SCALE_SHIFT_RELU:
        _SCALE_SHIFT_RELU.append(nbops.fuse(_scale_shift_relu))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if _on_device(s):
        s, t = nbops.reshape(s, shape), nbops.reshape(t, shape)
    else:
        s, t = s.reshape(shape), t.reshape(shape)
    return _SCALE_SHIFT_RELU[0](x, s, t)


def _norm_np(x, axis, eps, scale, bias, centered):
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True) if centered else 0.0
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True) if x.size else x64[..., :1]
    inv = 1.0 / np.sqrt(var + eps)
    y = (x64 - mean) * inv
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype), mean, inv


@onnx_op("LayerNormalization", since=17, dtypes=FLOAT)
def onnx_layer_norm(node, x, scale, bias=None):
    """LayerNormalization on :func:`nbops.layer_norm` (NumPy where the
    scale broadcasts or the Mean / InvStdDev outputs are read)."""
    axis = _axis(int(node.attrs.get("axis", -1)), x.ndim)
    eps = float(node.attrs.get("epsilon", 1e-5))
    tail = tuple(x.shape[axis:])
    extra = len([o for o in node.outputs if o]) > 1
    if not extra and _float(x, scale, bias) and tuple(scale.shape) == tail and \
            (bias is None or tuple(bias.shape) == tail) and x.size:
        return nbops.layer_norm(x, tail, scale, bias, eps=eps)
    y, mean, inv = _norm_np(nbops.to_host(x) if _on_device(x) else x, axis, eps,
                            scale, bias, True)
    outs = (y, np.asarray(mean, x.dtype), np.asarray(inv, x.dtype))
    return outs[:len(node.outputs)] if extra else outs[0]


@onnx_op("LayerNorm", domain=NBOPS_DOMAIN, dtypes=FLOAT)
def onnx_recognised_layer_norm(node, x, scale=None, bias=None):
    """A LayerNorm subgraph the planner recognised (trailing axes)."""
    axes = [_axis(a, x.ndim) for a in node.attrs["axes"]]
    eps = float(node.attrs["epsilon"])
    axis = min(axes)
    if axes != list(range(axis, x.ndim)):
        # normalized over non-trailing axes: the primitive formula
        xh = x.astype(np.float64)
        ax = tuple(axes)
        mu = xh.mean(axis=ax, keepdims=True)
        y = (xh - mu) / np.sqrt(((xh - mu) ** 2).mean(axis=ax, keepdims=True) + eps)
        if scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
        return y.astype(x.dtype)
    tail = tuple(x.shape[axis:])
    if _float(x, scale, bias) and (scale is None or tuple(scale.shape) == tail) and \
            (bias is None or tuple(bias.shape) == tail) and x.size:
        return nbops.layer_norm(x, tail, scale, bias, eps=eps)
    return _norm_np(nbops.to_host(x) if _on_device(x) else x, axis, eps, scale, bias, True)[0]


@onnx_op("RMSNormalization", since=23, dtypes=FLOAT)
def onnx_rms_norm(node, x, scale):
    """RMSNormalization on :func:`nbops.rms_norm`."""
    axis = _axis(int(node.attrs.get("axis", -1)), x.ndim)
    eps = float(node.attrs.get("epsilon", 1e-5))
    tail = tuple(x.shape[axis:])
    if _float(x, scale) and tuple(scale.shape) == tail and x.size:
        return nbops.rms_norm(x, tail, scale, eps=eps)
    return _norm_np(nbops.to_host(x) if _on_device(x) else x, axis, eps, scale, None, False)[0]


@onnx_op("LRN", since=1, dtypes=FLOAT)
@_host
def onnx_lrn(node, x):
    """Local response normalization across channels (NumPy)."""
    a = node.attrs
    size = int(a["size"])
    alpha, beta, bias = a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    sq = x.astype(np.float64) ** 2
    c = x.shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    pad = np.pad(sq, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    acc = np.zeros_like(sq)
    for i in range(size):
        acc += pad[:, i:i + c]
    return (x / (bias + alpha / size * acc) ** beta).astype(x.dtype)


# ---------------------------------------------------------------------------
# Pooling


def _pool_geometry(node, x):
    a = node.attrs
    r = x.ndim - 2
    ks = list(a["kernel_shape"])
    s = a.get("strides") or [1] * r
    d = a.get("dilations") or [1] * r
    _check_window(node, r, kernel_shape=ks, strides=s, dilations=d, pads=a.get("pads") or
                  [0] * (2 * r))
    pads = _conv_pads(a, x.shape[2:], ks, s, d)
    ceil = bool(a.get("ceil_mode", 0))
    out = []
    for i in range(r):
        ek = (ks[i] - 1) * d[i] + 1
        span = x.shape[2 + i] + pads[i][0] + pads[i][1] - ek
        if a.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-x.shape[2 + i] // s[i])
        elif ceil:
            o = -(-span // s[i]) + 1
            # the last window must start inside the input or the left pad
            if (o - 1) * s[i] >= x.shape[2 + i] + pads[i][0]:
                o -= 1
        else:
            o = span // s[i] + 1
        out.append(max(o, 0))
    return ks, s, d, pads, out


def _pool_np(x, kind, ks, s, d, pads, out, count_include_pad):
    """Generic N-d pooling over explicit padding (NumPy)."""
    r = len(ks)
    ext = [max(0, (out[i] - 1) * s[i] + (ks[i] - 1) * d[i] + 1 -
               (x.shape[2 + i] + pads[i][0] + pads[i][1])) for i in range(r)]
    widths = [(0, 0), (0, 0)] + [(pads[i][0], pads[i][1] + ext[i]) for i in range(r)]
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), widths, constant_values=fill)
    res = None
    cnt = None
    if kind == "avg":
        # divisor: the window's input positions, or also its explicit pads
        m = np.zeros(xp.shape[2:])
        inner = tuple(slice(pads[i][0], pads[i][0] + x.shape[2 + i]) if not count_include_pad
                      else slice(0, x.shape[2 + i] + pads[i][0] + pads[i][1])
                      for i in range(r))
        m[inner] = 1.0
    for tap in np.ndindex(*ks):
        sl = tuple(slice(tap[i] * d[i], tap[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i])
                   for i in range(r))
        v = xp[(slice(None), slice(None)) + sl]
        if kind == "max":
            res = v.copy() if res is None else np.fmax(res, v) if False else \
                np.where((v > res) | np.isnan(v), v, res)
        else:
            res = v.copy() if res is None else res + v
            mv = m[sl]
            cnt = mv.copy() if cnt is None else cnt + mv
    if kind == "avg":
        with np.errstate(invalid="ignore", divide="ignore"):
            res = res / cnt
    return res.astype(x.dtype)


def _pool_prepare(node, consts):
    if len([o for o in node.outputs if o]) > 1:
        _refuse(node, "the Indices output")
    return None


def _make_pool(kind):
    def run(node, x, *, state=None):
        a = node.attrs
        if len([o for o in node.outputs if o]) > 1:
            _refuse(node, "the Indices output")
        ks, s, d, pads, out = _pool_geometry(node, x)
        r = len(ks)
        cip = bool(a.get("count_include_pad", 0))
        sym = all(p0 == p1 and p0 <= ks[i] // 2 for i, (p0, p1) in enumerate(pads))
        fast = _float(x) and r in (1, 2) and sym and x.size and \
            not a.get("ceil_mode", 0) and (kind == "max" or all(v == 1 for v in d))
        if fast:
            pd = [p0 for p0, _ in pads]
            x4 = x if r == 2 else x.reshape(x.shape[:2] + (1,) + x.shape[2:])
            kk = tuple(ks) if r == 2 else (1, ks[0])
            ss = tuple(s) if r == 2 else (1, s[0])
            pp = tuple(pd) if r == 2 else (0, pd[0])
            if kind == "max":
                dd = tuple(d) if r == 2 else (1, d[0])
                y = nbops.max_pool2d(x4, kk, ss, pp, dd)
            else:
                y = nbops.avg_pool2d(x4, kk, ss, pp, count_include_pad=cip)
            if tuple(y.shape[2:]) == (tuple(out) if r == 2 else (1, out[0])):
                return y if r == 2 else y.reshape(y.shape[:2] + y.shape[3:])
        xh = nbops.to_host(x) if _on_device(x) else x
        y = _pool_np(xh, kind, ks, s, d, pads, out, cip)
        return _to_dev(y) if _on_device(x) else y

    run.__name__ = f"onnx_{kind}_pool"
    return run


onnx_op("MaxPool", since=1, dtypes=FLOAT, prepare=_pool_prepare)(_make_pool("max"))
onnx_op("AveragePool", since=1, dtypes=FLOAT, prepare=_pool_prepare)(_make_pool("avg"))


@onnx_op("GlobalAveragePool", since=1, dtypes=FLOAT)
def onnx_global_avg_pool(node, x):
    """Mean over the spatial axes (:func:`nbops.global_avg_pool2d` for 4-D)."""
    if x.ndim == 4 and _float(x) and x.size:
        return nbops.global_avg_pool2d(x, keepdim=True)
    xh = nbops.to_host(x) if _on_device(x) else x
    return xh.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)


@onnx_op("GlobalMaxPool", since=1, dtypes=FLOAT)
def onnx_global_max_pool(node, x):
    """Max over the spatial axes (a whole-plane :func:`nbops.max_pool2d` for 4-D)."""
    if x.ndim == 4 and _float(x) and x.size and x.shape[2] and x.shape[3]:
        return nbops.max_pool2d(x, (x.shape[2], x.shape[3]))
    xh = nbops.to_host(x) if _on_device(x) else x
    return xh.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# ---------------------------------------------------------------------------
# GEMM


@onnx_op("Gemm", since=7)
def onnx_gemm(node, a, b, c=None):
    """``alpha * A' @ B' + beta * C`` (:func:`nbops.matmul` for floats)."""
    at = node.attrs
    if at.get("transA", 0):
        a = a.T if not _on_device(a) else nbops.transpose(a)
    if at.get("transB", 0):
        b = b.T if not _on_device(b) else nbops.transpose(b)
    alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)
    if _float(a, b, c):
        y = nbops.matmul(a, b)
        if alpha != 1.0:
            y = nbops.mul(y, a.dtype.type(alpha))
        if c is not None and beta != 0.0:
            y = nbops.add(y, c if beta == 1.0 else nbops.mul(c, c.dtype.type(beta)))
        return y
    y = alpha * np.matmul(a, b)
    if c is not None:
        y = y + beta * c
    return np.asarray(y).astype(a.dtype)


@onnx_op("MatMul", since=1)
def onnx_matmul(node, a, b):
    """NumPy's matmul semantics on :func:`nbops.matmul` (floats, rank >= 2)."""
    if _float(a, b) and a.ndim >= 2 and b.ndim >= 2 and a.size and b.size:
        return nbops.matmul(a, b)
    if _on_device(a) or _on_device(b):
        return _to_dev(np.matmul(nbops.to_host(a), nbops.to_host(b)))
    return np.matmul(a, b)


@onnx_op("FusedLinear", domain=NBOPS_DOMAIN, dtypes=FLOAT)
def onnx_fused_linear(node, x, w, b=None):
    """The planner's Gemm / MatMul [+ bias Add] [+ activation]:
    :func:`nbops.linear` with its epilogue (weight stored (out, in))."""
    if x.ndim < 1 or (node.attrs.get("rank2") and x.ndim != 2) or not _float(x, w, b):
        _refuse(node, f"a linear layer on a {x.ndim}-D {x.dtype} input")
    if x.size == 0 or w.size == 0:
        y = np.zeros(x.shape[:-1] + (w.shape[0],), x.dtype)
        if b is not None:
            y += b
        return y
    return nbops.linear(x, w, b, activation=node.attrs.get("activation"))


# ---------------------------------------------------------------------------
# Shapes and indexing (NumPy; views where NumPy gives them)


@onnx_op("Identity", since=1)
def onnx_identity(node, x):
    return x


def _dropout_prepare(node, consts):
    # training mode draws random masks: refused unless the input is a
    # constant false
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = consts[2]
        if mode is None or bool(np.asarray(mode)):
            _refuse(node, "training_mode (not a constant false)")
    return None


@onnx_op("Dropout", since=7, prepare=_dropout_prepare)
def onnx_dropout(node, x, ratio=None, training_mode=None, *, state=None):
    """Inference Dropout: the identity (and an all-true mask)."""
    if training_mode is not None and bool(np.asarray(nbops.to_host(training_mode)
                                                     if _on_device(training_mode)
                                                     else training_mode)):
        _refuse(node, "training_mode=True")
    if len(node.outputs) > 1 and node.outputs[1]:
        mask_dtype = bool if node.opset >= 10 else x.dtype
        return x, np.ones(x.shape, mask_dtype)
    return x


@onnx_op("Constant", since=1)
def onnx_constant(node):
    a = node.attrs
    if "sparse_value" in a:
        _refuse(node, "sparse_value")
    for key, dtype in (("value", None), ("value_float", np.float32),
                       ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            v = a[key]
            return np.asarray(v) if dtype is None else np.asarray(v, dtype)
    _refuse(node, f"attributes {sorted(a)}")


@onnx_op("ConstantOfShape", since=9)
def onnx_constant_of_shape(node, shape):
    value = node.attrs.get("value")
    v = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(tuple(_ints(shape)), v[0], v.dtype)


@onnx_op("Shape", since=1)
def onnx_shape(node, x):
    shp = np.array(x.shape, np.int64)
    if node.opset >= 15:
        return shp[node.attrs.get("start", 0):node.attrs.get("end", None)]
    return shp


#: ONNX element types Cast handles (NumPy's own types, float16 and bfloat16;
#: not strings, 8-bit floats or sub-byte ints, whose saturation rules differ).
_CAST_TYPES = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16}


def _cast_prepare(node, consts):
    from ._planner import np_dtype

    to = int(node.attrs["to"])
    src = node.input_dtypes[0] if node.input_dtypes else None
    src_ok = src is None or any(np_dtype(t) == src for t in _CAST_TYPES)
    if to not in _CAST_TYPES or not src_ok:
        _refuse(node, f"a cast from {src} to ONNX type {to}")
    return np_dtype(to)


@onnx_op("Cast", since=6, prepare=_cast_prepare)
@_host
def onnx_cast(node, x, *, state):
    return x.astype(state)


def _reshape_any(x, shape):
    return nbops.reshape(x, shape) if _on_device(x) else x.reshape(shape)


@onnx_op("Reshape", since=5)
def onnx_reshape(node, x, shape):
    target = _ints(shape)
    allowzero = node.opset >= 14 and node.attrs.get("allowzero", 0)
    if not allowzero:
        target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
    return _reshape_any(x, tuple(target))


@onnx_op("Flatten", since=1)
def onnx_flatten(node, x):
    axis = _axis(int(node.attrs.get("axis", 1)), x.ndim)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    cols = int(np.prod(x.shape[axis:], dtype=np.int64))
    return _reshape_any(x, (rows, cols))


@onnx_op("Transpose", since=1)
def onnx_transpose(node, x):
    perm = node.attrs.get("perm")
    perm = tuple(perm) if perm is not None else tuple(reversed(range(x.ndim)))
    if _on_device(x):
        return nbops.transpose(x, perm)
    return x.transpose(perm)


def _make_squeeze(unsq, new):
    def run(node, x, axes=None):
        ax = _ints(axes) if new else node.attrs.get("axes")
        if unsq:
            rank = x.ndim + len(ax)
            ax = sorted(_axis(a, rank) for a in ax)
            shape = list(x.shape)
            for a in ax:
                shape.insert(a, 1)
        else:
            if not ax:
                ax = [i for i, d in enumerate(x.shape) if d == 1]
            ax = {_axis(a, x.ndim) for a in ax}
            shape = [d for i, d in enumerate(x.shape) if i not in ax]
        return _reshape_any(x, tuple(shape))

    run.__name__ = "onnx_unsqueeze" if unsq else "onnx_squeeze"
    return run


for _unsq, _name in ((False, "Squeeze"), (True, "Unsqueeze")):
    onnx_op(_name, since=1, until=12)(_make_squeeze(_unsq, False))
    onnx_op(_name, since=13)(_make_squeeze(_unsq, True))


@onnx_op("Concat", since=4)
def onnx_concat(node, *xs):
    axis = _axis(int(node.attrs["axis"]), xs[0].ndim)
    if _float(*xs) and all(x.dtype == xs[0].dtype for x in xs) and \
            any(_on_device(x) for x in xs):
        return nbops.cat(list(xs), axis=axis)
    return np.concatenate([nbops.to_host(x) if _on_device(x) else x for x in xs], axis=axis)


@onnx_op("Split", since=2)
def onnx_split(node, x, split=None):
    axis = _axis(int(node.attrs.get("axis", 0)), x.ndim)
    sizes = node.attrs.get("split") if node.opset < 13 else _ints(split)
    n_out = len(node.outputs)
    size = x.shape[axis]
    if not sizes:
        if node.opset >= 18 and "num_outputs" in node.attrs:
            n_out = int(node.attrs["num_outputs"])
            step = -(-size // n_out)
            sizes = [min(step, size - i * step) for i in range(n_out)]
        else:
            sizes = [size // n_out] * n_out
    if _on_device(x):
        return tuple(nbops.split(x, list(sizes), axis=axis))
    bounds = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, bounds, axis=axis))


@onnx_op("Slice", since=1, until=9)
def onnx_slice1(node, x):
    a = node.attrs
    return _slice(x, a["starts"], a["ends"], a.get("axes"), None)


@onnx_op("Slice", since=10)
def onnx_slice10(node, x, starts, ends, axes=None, steps=None):
    return _slice(x, _ints(starts), _ints(ends), _ints(axes), _ints(steps))


def _slice(x, starts, ends, axes, steps):
    # Python's slice clamps as ONNX does (negative starts/ends count from
    # the end; an end of -2**63 with a negative step runs to the start)
    if axes is None:
        axes = list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        index[_axis(ax, x.ndim)] = slice(st, en, sp)
    xh = nbops.to_host(x) if _on_device(x) else x
    y = xh[tuple(index)]
    return _to_dev(y) if _on_device(x) else y


@onnx_op("Gather", since=1)
@_host
def onnx_gather(node, x, indices):
    axis = _axis(int(node.attrs.get("axis", 0)), x.ndim)
    return np.take(x, indices.astype(np.int64), axis=axis)


@onnx_op("Expand", since=8)
@_host
def onnx_expand(node, x, shape):
    target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.ascontiguousarray(np.broadcast_to(x, target))


@onnx_op("Pad", since=2, until=10)
@_host
def onnx_pad2(node, x):
    a = node.attrs
    return _pad(node, x, a["pads"], a.get("value", 0.0), None, a.get("mode", "constant"))


@onnx_op("Pad", since=11)
@_host
def onnx_pad11(node, x, pads, value=None, axes=None):
    v = 0 if value is None or value.size == 0 else value.reshape(-1)[0]
    return _pad(node, x, _ints(pads), v, _ints(axes), node.attrs.get("mode", "constant"))


def _pad(node, x, pads, value, axes, mode):
    r = x.ndim
    axes = list(range(r)) if axes is None else [_axis(a, r) for a in axes]
    k = len(axes)
    width = [[0, 0] for _ in range(r)]
    for i, ax in enumerate(axes):
        width[ax] = [pads[i], pads[i + k]]
    # negative pads crop
    crop = tuple(slice(max(0, -b), x.shape[i] - max(0, -e)) for i, (b, e) in enumerate(width))
    x = x[crop]
    pos = [(max(0, b), max(0, e)) for b, e in width]
    if mode == "constant":
        return np.pad(x, pos, constant_values=x.dtype.type(value) if x.dtype.kind != "b"
                      else bool(value))
    if mode in ("reflect", "edge", "wrap"):
        return np.pad(x, pos, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])
    _refuse(node, f"mode {mode!r}")


# ---------------------------------------------------------------------------
# Attention (opset 23)


def _attention_prepare(node, consts):
    if len(node.inputs) > 6 and node.inputs[6]:
        _refuse(node, "the nonpad_kv_seqlen input")
    a = node.attrs
    for key in ("left_window_size", "right_window_size"):
        if a.get(key, -1) != -1:
            _refuse(node, f"attribute {key} (sliding windows)")
    unknown = set(a) - {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode",
                        "scale", "softcap", "softmax_precision", "left_window_size",
                        "right_window_size"}
    if unknown:
        _refuse(node, f"attribute(s) {sorted(unknown)}")
    if a.get("softmax_precision") not in (None, 1, 11):
        _refuse(node, f"softmax_precision={a.get('softmax_precision')}")
    return None


@onnx_op("Attention", since=23, prepare=_attention_prepare, dtypes=FLOAT)
def onnx_attention(node, q, k, v, mask=None, past_k=None, past_v=None, *rest, state=None):
    """Attention (opset 23): 3-D inputs split into heads, grouped KV heads
    repeated, the KV cache concatenated, bool or additive masks, causal
    (aligned to the cache's end), softcap and the qk-matmul output modes.
    The plain case runs :func:`nbops.scaled_dot_product_attention`; softcap
    and qk outputs the NumPy formula."""
    a = node.attrs
    three = q.ndim == 3
    if _on_device(q):
        q, k, v = nbops.to_host(q), nbops.to_host(k), nbops.to_host(v)
    b = q.shape[0]
    if three:
        qh, kvh = int(a["q_num_heads"]), int(a["kv_num_heads"])
        q = q.reshape(b, q.shape[1], qh, -1).transpose(0, 2, 1, 3)
        k = k.reshape(b, k.shape[1], kvh, -1).transpose(0, 2, 1, 3)
        v = v.reshape(b, v.shape[1], kvh, -1).transpose(0, 2, 1, 3)
    if past_k is not None:
        k = np.concatenate([past_k, k], axis=2)
        v = np.concatenate([past_v, v], axis=2)
    present_k, present_v = k, v
    qh, kvh = q.shape[1], k.shape[1]
    if qh != kvh:
        k = np.repeat(k, qh // kvh, axis=1)
        v = np.repeat(v, qh // kvh, axis=1)
    L, S, D = q.shape[2], k.shape[2], q.shape[3]
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    causal = bool(a.get("is_causal", 0))
    softcap = float(a.get("softcap", 0.0))
    mode = int(a.get("qk_matmul_output_mode", 0))
    want_qk = len(node.outputs) > 3 and node.outputs[3]
    bias = np.zeros((L, S), q.dtype)
    if causal:
        offset = 0 if past_k is None else past_k.shape[2]
        allowed = np.arange(S)[None, :] <= np.arange(L)[:, None] + offset
        bias = np.where(allowed, bias, q.dtype.type(-np.inf))
    if mask is not None:
        m = mask if mask.dtype != bool else np.where(mask, q.dtype.type(0),
                                                    q.dtype.type(-np.inf))
        if m.shape[-1] < S:
            m = np.pad(m, [(0, 0)] * (m.ndim - 1) + [(0, S - m.shape[-1])],
                       constant_values=-np.inf)
        bias = bias + m.astype(q.dtype)
    if not softcap and not want_qk and q.size and k.size:
        y = nbops.scaled_dot_product_attention(
            np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
            mask=np.ascontiguousarray(np.broadcast_to(bias, np.broadcast_shapes(
                bias.shape, (L, S)))) if (mask is not None or causal) else None,
            scale=scale)
        # rows with every key masked: zeros, as ONNX's reference
        if mask is not None or causal:
            dead = np.isneginf(np.max(np.broadcast_to(bias, q.shape[:2] + (L, S)), axis=-1))
            if dead.any():
                y = np.where(dead[..., None], 0, y).astype(q.dtype)
        qk = None
    else:
        q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
        # ONNX's order: scale, softcap, then the mask; qk output modes 0/1
        # read after the softcap, 2 after the mask, 3 after the softmax
        s1 = q64 @ np.swapaxes(k64, -1, -2) * scale
        if softcap > 0:
            s1 = softcap * np.tanh(s1 / softcap)
        s2 = s1 + bias
        mx = np.max(s2, axis=-1, keepdims=True)
        mx = np.where(np.isneginf(mx), 0, mx)
        e = np.exp(s2 - mx)
        tot = e.sum(axis=-1, keepdims=True)
        p = e / np.where(tot == 0, 1, tot)
        dead = np.isneginf(np.max(np.broadcast_to(bias, s2.shape), axis=-1, keepdims=True))
        p = np.where(dead, 0, p)
        y = (p @ v64).astype(q.dtype)
        qk = (s1, s1, s2, p)[mode].astype(q.dtype)
    if three:
        y = y.transpose(0, 2, 1, 3).reshape(b, L, -1)
    outs = (np.ascontiguousarray(y), present_k, present_v, qk)
    n = len(node.outputs)
    return outs[:n] if n > 1 else outs[0]
