"""Export nbops.nn models to ONNX.

:func:`export` walks a model's layers (a :class:`~nbops.nn.Sequential` of
known layers, or one known layer) and emits one ONNX subgraph per layer,
running each layer on the example input as it goes, so that every shape in
the graph (a Flatten's, an attention's heads) comes from the values the
model really computes. The result passes ``onnx.checker`` and runs in
nbops.onnx and in onnxruntime.

Layers: Linear, Conv1d, Conv2d, FusedConv (a folded conv-bn[-relu] from
:func:`nbops.nn.fuse_modules`), BatchNorm1d/2d (eval), ReLU, GELU (exact and
tanh), SiLU, Sigmoid, Tanh, Swish, Hardtanh and ReLU6 (Clip), Dropout and
Identity (eval: nothing),
MaxPool1d/2d, AvgPool1d/2d, AdaptiveAvgPool1d/2d (global, or a divisible
output size), Flatten, Softmax, LogSoftmax, LayerNorm, RMSNorm,
MultiheadAttention (self-attention over a batch-first 3-D input),
TransformerEncoderLayer, and a statically quantized model
(``nbops.quant.convert``'s QuantizedSequential) as QuantizeLinear /
DequantizeLinear around float Conv and Gemm nodes (QDQ). A model whose forward is custom Python (a Module
subclass other than Sequential) cannot be walked and is refused by name.
"""

import math

import numpy as np

__all__ = ["export", "DEFAULT_OPSET"]

#: LayerNormalization needs 17; onnxruntime of 2023 and later runs 17.
DEFAULT_OPSET = 17
MIN_OPSET = 13  # Softmax on one axis, Split's sizes as an input


def export(module, example_inputs, path=None, opset=None, *, input_name="input",
           output_name="output", dynamic_batch=True):
    """Writes ``module`` (in eval mode) as an ONNX model.

    Parameters
    ----------
    module : nbops.nn.Module
        A Sequential of supported layers, or one supported layer (see the
        module docstring). Its training flag is restored afterwards.
    example_inputs : array or 1-tuple of arrays
        A NumPy array of the model's input (float32 or float64); the model
        runs on it once, layer by layer, to fix the graph's shapes.
    path : str or path-like, optional
        Where to write the model; ``None`` returns it without writing.
    opset : int, optional
        The ai.onnx opset, ``13`` or later (default :data:`DEFAULT_OPSET`).
    input_name, output_name : str
        The graph's input and output names.
    dynamic_batch : bool
        Declare the first axis as the symbolic dimension ``"batch"``.

    Returns
    -------
    onnx.ModelProto, checked by ``onnx.checker.check_model``.

    Raises
    ------
    TypeError for a layer it cannot export (named with its position) or an
    input that is not a NumPy float array; ValueError for an opset under 13
    or a layer option the ONNX form cannot express at that opset.

    >>> import numpy as np, nbops
    >>> from nbops import nn
    >>> m = nn.Sequential(nn.Linear(4, 3, rng=0), nn.ReLU())
    >>> proto = nbops.onnx.export(m, np.ones((2, 4), np.float32))
    >>> [n.op_type for n in proto.graph.node]
    ['Gemm', 'Relu']
    """
    import onnx

    from .. import autograd

    opset = DEFAULT_OPSET if opset is None else opset
    if isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET:
        raise ValueError(f"export: opset must be an int >= {MIN_OPSET}, got {opset!r}")
    if isinstance(example_inputs, (tuple, list)):
        if len(example_inputs) != 1:
            raise TypeError("export: the walked models take one input, got "
                            f"{len(example_inputs)} example inputs")
        (x,) = example_inputs
    else:
        x = example_inputs
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        raise TypeError("export: 'example_inputs' must be a float32 or float64 NumPy array, "
                        f"got {type(x).__name__}"
                        + (f" of {x.dtype}" if isinstance(x, np.ndarray) else ""))
    g = _Graph(opset, x.dtype)
    was_training = module.training
    module.eval()
    try:
        with autograd.no_grad():
            name, value = _emit(g, module, input_name, np.ascontiguousarray(x), "model")
    finally:
        module.train(was_training)
    g.rename(name, output_name)
    elem = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)

    def info(n, shape):
        dims = ["batch" if dynamic_batch and i == 0 else int(d) for i, d in enumerate(shape)]
        return onnx.helper.make_tensor_value_info(n, elem, dims)

    graph = onnx.helper.make_graph(g.nodes, type(module).__name__,
                                   [info(input_name, x.shape)],
                                   [info(output_name, np.shape(value))], g.initializers)
    model = onnx.helper.make_model(graph, producer_name="nbops",
                                   opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)  # readable by onnxruntime 1.16+
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, str(path))
    return model


class _Graph:
    """Nodes and initializers under construction, with unique names."""

    def __init__(self, opset, dtype):
        self.opset, self.dtype = opset, np.dtype(dtype)
        self.nodes, self.initializers = [], []
        self._count = 0

    def fresh(self, hint):
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, array, hint, dtype=None):
        import onnx

        name = self.fresh(hint)
        arr = np.asarray(array, dtype=self.dtype if dtype is None else dtype)
        self.initializers.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def ints(self, values, hint):
        return self.const(np.asarray(values, np.int64), hint, np.int64)

    def node(self, op, inputs, hint, n_out=1, **attrs):
        import onnx

        outs = [self.fresh(f"{hint}_{op.lower()}") for _ in range(n_out)]
        self.nodes.append(onnx.helper.make_node(op, list(inputs), outs,
                                                name=self.fresh(hint), **attrs))
        return outs[0] if n_out == 1 else outs

    def rename(self, old, new):
        for n in self.nodes:
            n.output[:] = [new if o == old else o for o in n.output]
            n.input[:] = [new if i == old else i for i in n.input]
        if not any(new in n.output for n in self.nodes):  # an empty model: x -> Identity
            self.node_named("Identity", [old], new)

    def node_named(self, op, inputs, out):
        import onnx

        self.nodes.append(onnx.helper.make_node(op, inputs, [out], name=self.fresh(op)))


def _emit(g, m, x, value, where):
    """Emits ``m`` applied to the graph value ``x`` (whose example value is
    ``value``); returns the output's name and example value."""
    from .. import nn

    if type(m) is nn.Sequential:
        for i, child in enumerate(m):
            x, value = _emit(g, child, x, value, f"{where}.{i}")
        return x, value
    emit = _EMITTERS.get(type(m).__name__)
    if emit is None or type(m).__module__.split(".")[0] != "nbops":
        raise TypeError(f"export: layer {where} ({type(m).__name__}) cannot be exported: "
                        "supported are Sequential and "
                        f"{', '.join(sorted(_EMITTERS))}")
    y = m(value, value, value) if type(m).__name__ == "MultiheadAttention" else m(value)
    y = y[0] if isinstance(y, tuple) else y
    y = np.asarray(getattr(y, "data", y))
    return emit(g, m, x, value, where), y


def _data(p):
    return None if p is None else np.asarray(getattr(p, "data", p))


# --- layers -----------------------------------------------------------------

def _linear(g, m, x, value, where, weight=None, bias=None):
    w = _data(m.weight) if weight is None else weight
    b = _data(m.bias) if bias is None and weight is None else bias
    if np.ndim(value) == 2:
        ins = [x, g.const(w, "weight")] + ([g.const(b, "bias")] if b is not None else [])
        return g.node("Gemm", ins, where, transB=1)
    y = g.node("MatMul", [x, g.const(np.ascontiguousarray(w.T), "weight_t")], where)
    return y if b is None else g.node("Add", [y, g.const(b, "bias")], where)


def _conv(g, m, x, value, where):
    w, b = _data(m.weight), _data(m.bias)
    ins = [x, g.const(w, "weight")] + ([g.const(b, "bias")] if b is not None else [])
    y = g.node("Conv", ins, where, **_conv_attrs(m, w.shape))
    return g.node("Relu", [y], where) if getattr(m, "relu", False) else y


def _conv_attrs(m, wshape):
    spatial = len(wshape) - 2
    dilation = _tuple(m.dilation, spatial)
    return dict(kernel_shape=list(wshape[2:]), strides=_tuple(m.stride, spatial),
                dilations=dilation, group=int(m.groups),
                pads=_pads(m.padding, wshape[2:], dilation))


def _quantized_sequential(g, m, x, value, where):
    """A statically quantized model as QDQ: QuantizeLinear/DequantizeLinear
    pairs around float Conv/Gemm nodes whose weights are DequantizeLinear of
    the int8 weights (per channel) and the int32 biases, so that a runtime
    that recognises the pattern runs it in int8 (nbops.onnx and onnxruntime
    do). Requantization rounds in float there, in fixed point in nbops: the
    outputs may differ by one quantum of a layer's output scale."""
    def quant(t, qp):
        return g.node("QuantizeLinear", [t, g.const(qp[0], "scale", np.float32),
                                         g.const(qp[1], "zero_point", np.uint8)], where)

    def dequant(t, qp):
        return g.node("DequantizeLinear", [t, g.const(qp[0], "scale", np.float32),
                                           g.const(qp[1], "zero_point", np.uint8)], where)

    qp = m.input_qparams
    q = quant(x, qp)
    for kind, mod, packed, bias, out_q, relu in m.layers:
        if kind in ("conv", "linear"):
            qw = packed.qweight
            w_scale = np.asarray(qw.scale, np.float32).reshape(-1)
            wf = g.node("DequantizeLinear", [
                g.const(np.asarray(qw.values), "qweight", np.int8),
                g.const(w_scale, "w_scale", np.float32),
                g.const(np.asarray(qw.zero_point).reshape(-1), "w_zero_point", np.int8)],
                where, axis=0)
            ins = [dequant(q, qp), wf]
            if bias is not None:
                ins.append(g.node("DequantizeLinear", [
                    g.const(np.asarray(bias), "qbias", np.int32),
                    g.const(np.float32(qp[0]) * w_scale, "b_scale", np.float32),
                    g.const(np.zeros(len(w_scale)), "b_zero_point", np.int32)], where, axis=0))
            y = (g.node("Conv", ins, where, **_conv_attrs(mod, qw.shape)) if kind == "conv"
                 else g.node("Gemm", ins, where, transB=1))
            if relu:
                y = g.node("Relu", [y], where)
            q, qp = quant(y, out_q), out_q
            continue
        if kind == "flatten":
            if mod.end_dim != -1:
                raise ValueError(f"export: layer {where} flattens up to axis {mod.end_dim}: "
                                 "only Flatten(start_dim, -1) is exported in a quantized model")
            q = g.node("Flatten", [q], where, axis=int(mod.start_dim))
            continue
        # relu and pooling commute with the affine dequantization (max: exactly)
        f = dequant(q, qp)
        if kind == "relu":
            f = g.node("Relu", [f], where)
        elif kind == "maxpool":
            f = _pool("MaxPool")(g, mod, f, np.empty((1, 1, 1, 1)), where)
        elif kind == "avgpool":
            if any(o != 1 for o in _tuple(mod.kwargs["output_size"], 2)):
                raise ValueError(f"export: layer {where} (quantized AdaptiveAvgPool2d) is "
                                 "exported for output size 1 only")
            f = g.node("GlobalAveragePool", [f], where)
        else:
            raise TypeError(f"export: layer {where} (quantized {kind}) cannot be exported")
        q = quant(f, qp)
    return dequant(q, qp)


def _batch_norm(g, m, x, value, where):
    if m.running_mean is None:
        raise ValueError(f"export: layer {where} ({type(m).__name__}) has no running "
                         "statistics (track_running_stats=False): ONNX's BatchNormalization "
                         "needs them")
    c = m.num_features
    ones, zeros = np.ones(c), np.zeros(c)
    scale = _data(m.weight) if m.weight is not None else ones
    shift = _data(m.bias) if m.bias is not None else zeros
    ins = [x, g.const(scale, "bn_scale"), g.const(shift, "bn_bias"),
           g.const(_data(m.running_mean), "bn_mean"), g.const(_data(m.running_var), "bn_var")]
    return g.node("BatchNormalization", ins, where, epsilon=float(m.eps))


def _unary(op):
    return lambda g, m, x, value, where: g.node(op, [x], where)


def _gelu(g, m, x, value, where):
    approximate = m.kwargs.get("approximate", "none")
    if g.opset >= 20:
        return g.node("Gelu", [x], where, approximate=approximate)
    half = g.const(0.5, "half")
    one = g.const(1.0, "one")
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = g.node("Mul", [g.node("Mul", [x, x], where), x], where)
        inner = g.node("Add", [x, g.node("Mul", [x3, g.const(0.044715, "c")], where)], where)
        t = g.node("Tanh", [g.node("Mul", [inner, g.const(math.sqrt(2 / math.pi), "c")],
                                   where)], where)
    else:  # 0.5 x (1 + erf(x / sqrt 2))
        t = g.node("Erf", [g.node("Mul", [x, g.const(1 / math.sqrt(2), "c")], where)], where)
    return g.node("Mul", [g.node("Mul", [x, half], where), g.node("Add", [t, one], where)],
                  where)


def _silu(g, m, x, value, where):
    return g.node("Mul", [x, g.node("Sigmoid", [x], where)], where)


def _swish(g, m, x, value, where):
    beta = m.beta if isinstance(m.beta, float) else float(_data(m.beta).reshape(-1)[0])
    bx = g.node("Mul", [x, g.const(beta, "beta")], where)
    return g.node("Mul", [x, g.node("Sigmoid", [bx], where)], where)


def _hardtanh(g, m, x, value, where):
    # Clip's bounds are inputs from opset 11; an infinite one is left out
    bounds = [g.const(v, k) if math.isfinite(v) else ""
              for k, v in (("min", m.kwargs["min_val"]), ("max", m.kwargs["max_val"]))]
    while bounds and not bounds[-1]:
        bounds.pop()
    return g.node("Clip", [x] + bounds, where)


def _identity(g, m, x, value, where):
    return x


def _pool(op):
    def emit(g, m, x, value, where):
        kw = m.kwargs
        spatial = np.ndim(value) - 2
        k = _tuple(kw["kernel_size"], spatial)
        attrs = dict(kernel_shape=k,
                     strides=_tuple(k if kw.get("stride") is None else kw["stride"], spatial),
                     pads=_pads(kw.get("padding", 0), k, (1,) * spatial),
                     ceil_mode=int(bool(kw.get("ceil_mode", False))))
        if op == "MaxPool":
            if kw.get("return_indices"):
                raise ValueError(f"export: layer {where} (MaxPool) returns indices: export "
                                 "the pooled values only (return_indices=False)")
            attrs["dilations"] = _tuple(kw.get("dilation", 1), spatial)
        else:
            if kw.get("divisor_override") is not None:
                raise ValueError(f"export: layer {where} (AvgPool) has divisor_override, "
                                 "which ONNX's AveragePool cannot express")
            attrs["count_include_pad"] = int(bool(kw.get("count_include_pad", True)))
        return g.node(op, [x], where, **attrs)

    return emit


def _adaptive_avg(g, m, x, value, where):
    shape = np.shape(value)[2:]
    out = _tuple(m.kwargs["output_size"], len(shape))
    out = tuple(s if o is None else o for s, o in zip(shape, out))
    if all(o == 1 for o in out):
        return g.node("GlobalAveragePool", [x], where)
    if any(s % o for s, o in zip(shape, out)):
        raise ValueError(f"export: layer {where} (AdaptiveAvgPool) maps {shape} to {out}: "
                         "only output sizes dividing the input's are exported (as AveragePool)")
    k = [s // o for s, o in zip(shape, out)]
    return g.node("AveragePool", [x], where, kernel_shape=k, strides=k)


def _flatten(g, m, x, value, where):
    nd = max(np.ndim(value), 1)
    s, e = m.start_dim % nd, m.end_dim % nd
    if e == nd - 1:
        return g.node("Flatten", [x], where, axis=s) if s > 0 else g.node(
            "Reshape", [x, g.ints([-1], "shape")], where)
    shape = np.shape(value)
    target = [0] * s + [-1] + [int(d) for d in shape[e + 1:]]  # 0 copies the input's axis
    return g.node("Reshape", [x, g.ints(target, "shape")], where)


def _softmax(op):
    return lambda g, m, x, value, where: g.node(op, [x], where, axis=int(m.kwargs["axis"]))


def _layer_norm(g, m, x, value, where, module=None):
    m = module or m
    axis = -len(m.normalized_shape)
    scale = _data(m.weight) if m.weight is not None else np.ones(m.normalized_shape)
    ins = [x, g.const(scale, "ln_scale")] + (
        [g.const(_data(m.bias), "ln_bias")] if getattr(m, "bias", None) is not None else [])
    if g.opset < 17:
        raise ValueError(f"export: layer {where} (LayerNorm) needs opset >= 17 "
                         f"(LayerNormalization), got {g.opset}")
    return g.node("LayerNormalization", ins, where, axis=axis, epsilon=float(m.eps))


def _rms_norm(g, m, x, value, where):
    axes = list(range(-len(m.normalized_shape), 0))
    eps = float(np.finfo(g.dtype).eps) if m.eps is None else m.eps
    sq = g.node("Mul", [x, x], where)
    if g.opset >= 18:
        ms = g.node("ReduceMean", [sq, g.ints(axes, "axes")], where, keepdims=1)
    else:
        ms = g.node("ReduceMean", [sq], where, axes=axes, keepdims=1)
    r = g.node("Sqrt", [g.node("Add", [ms, g.const(eps, "eps")], where)], where)
    y = g.node("Div", [x, r], where)
    return y if m.weight is None else g.node("Mul", [y, g.const(_data(m.weight), "w")], where)


def _attention(g, m, x, value, where):
    """Self-attention of a batch-first (B, L, E) input, as MatMul/Softmax."""
    if np.ndim(value) != 3 or not m.batch_first or not m._qkv_same_embed_dim:
        raise ValueError(f"export: layer {where} (MultiheadAttention) is exported as "
                         "self-attention over a batch-first (B, L, E) input with one "
                         "in-projection")
    E, H, hd = m.embed_dim, m.num_heads, m.head_dim
    qkv = _linear(g, m, x, value, where, weight=_data(m.in_proj_weight),
                  bias=_data(m.in_proj_bias))
    q, k, v = g.node("Split", [qkv, g.ints([E, E, E], "split")], where, n_out=3, axis=-1)
    heads = g.ints([0, 0, H, hd], "heads")
    q, k, v = (g.node("Transpose", [g.node("Reshape", [t, heads], where)], where,
                      perm=perm) for t, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]),
                                                 (v, [0, 2, 1, 3])))
    s = g.node("Mul", [g.node("MatMul", [q, k], where), g.const(1 / math.sqrt(hd), "scale")],
               where)
    o = g.node("MatMul", [g.node("Softmax", [s], where, axis=-1), v], where)
    o = g.node("Reshape", [g.node("Transpose", [o], where, perm=[0, 2, 1, 3]),
                           g.ints([0, 0, E], "merge")], where)
    return _linear(g, m.out_proj, o, np.empty((1, 1, E)), where)


def _encoder_layer(g, m, x, value, where):
    def sa(t):
        return _attention(g, m.self_attn, t, value, f"{where}.self_attn")

    def ff(t):
        h = _linear(g, m.linear1, t, value, f"{where}.linear1")
        act = _unary("Relu") if m.activation == "relu" else (
            lambda g_, m_, t_, v_, w_: _gelu(g_, _GeluNone, t_, v_, w_))
        h = act(g, None, h, value, f"{where}.activation")
        return _linear(g, m.linear2, h, value, f"{where}.linear2")

    def ln(t, norm):
        return _layer_norm(g, norm, t, value, f"{where}.norm")

    if m.norm_first:
        x = g.node("Add", [x, sa(ln(x, m.norm1))], where)
        return g.node("Add", [x, ff(ln(x, m.norm2))], where)
    x = ln(g.node("Add", [x, sa(x)], where), m.norm1)
    return ln(g.node("Add", [x, ff(x)], where), m.norm2)


class _GeluNone:
    kwargs = {"approximate": "none"}


def _tuple(v, n):
    return [int(v)] * n if np.isscalar(v) else [int(t) for t in v]


def _pads(padding, kernel, dilation):
    """ONNX ``pads`` (begins then ends) of nbops' padding: an int, a tuple,
    ``"valid"`` or ``"same"`` (stride 1: the extra pixel at the end)."""
    n = len(kernel)
    if padding == "valid":
        return [0] * (2 * n)
    if padding == "same":
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    lo = _tuple(padding, n)
    return lo + lo


_EMITTERS = {
    "Linear": _linear, "Conv1d": _conv, "Conv2d": _conv, "FusedConv": _conv,
    "BatchNorm1d": _batch_norm, "BatchNorm2d": _batch_norm,
    "ReLU": _unary("Relu"), "Sigmoid": _unary("Sigmoid"), "Tanh": _unary("Tanh"),
    "GELU": _gelu, "SiLU": _silu, "Swish": _swish, "Hardtanh": _hardtanh,
    "ReLU6": _hardtanh, "Dropout": _identity,
    "Identity": _identity,
    "MaxPool1d": _pool("MaxPool"), "MaxPool2d": _pool("MaxPool"),
    "AvgPool1d": _pool("AveragePool"), "AvgPool2d": _pool("AveragePool"),
    "AdaptiveAvgPool1d": _adaptive_avg, "AdaptiveAvgPool2d": _adaptive_avg,
    "Flatten": _flatten, "Softmax": _softmax("Softmax"), "LogSoftmax": _softmax("LogSoftmax"),
    "LayerNorm": _layer_norm, "RMSNorm": _rms_norm,
    "MultiheadAttention": _attention, "TransformerEncoderLayer": _encoder_layer,
    "QuantizedSequential": _quantized_sequential,
}
