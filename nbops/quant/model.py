"""Model-level quantization: dynamic (weights only) and static (calibrated).

* :func:`quantize_dynamic` swaps every :class:`nbops.nn.Linear` for a
  :class:`DynamicQuantizedLinear`: int8 weights quantized per output channel
  (symmetric) and packed once; each call quantizes the activations to uint8
  over their own range and returns float32 (PyTorch's
  ``quantize_dynamic``, ONNX Runtime's dynamic MatMulInteger path).
* :func:`prepare` / calibration / :func:`convert`: post-training static
  quantization of a :class:`nbops.nn.Sequential` (nested ones allowed) of
  Conv2d, BatchNorm2d, Linear, ReLU, MaxPool2d, AdaptiveAvgPool2d and
  Flatten. :func:`prepare` folds each Conv2d+BatchNorm2d(+ReLU) with
  :func:`nbops.nn.fuse_modules` (evaluation-mode statistics), fuses a
  ReLU after a Linear into it, and places activation observers at the
  input and after every Conv2d/Linear; running float batches through the
  prepared model records ranges; :func:`convert` quantizes weights per
  output channel (int8, symmetric), biases to int32 in units of
  ``s_in * s_w``, and returns a model that quantizes its input to uint8
  once, runs every layer on QTensors (:func:`nbops.quant.conv2d`,
  :func:`nbops.quant.linear` with requantization in the GEMM epilogue,
  :func:`nbops.quant.relu`, :func:`nbops.quant.max_pool2d`,
  :func:`nbops.quant.adaptive_avg_pool2d`) and dequantizes its output.

Quantized models run on one device, fixed when they are made: dynamically
quantized layers on the device of the float weights, statically quantized
models on ``convert(..., device=)`` (CPU by default); an input on another
device is a ``TypeError``.
"""

import copy

import numpy as np

from .. import _dispatch
from ..nn.module import Module, Sequential
from . import observers as _obs
from .qtensor import QTensor

__all__ = ["quantize_dynamic", "prepare", "convert", "QConfig", "default_qconfig",
           "DynamicQuantizedLinear", "ObservedSequential", "QuantizedSequential"]


class QConfig:
    """Which observers calibration uses: ``activation()`` and ``weight()``
    are factories of fresh observers.

    Parameters
    ----------
    activation : callable returning a per-tensor observer (uint8 data)
    weight : callable returning a per-channel observer along axis 0 (int8)

    Example
    -------
    >>> from nbops.quant import MinMaxObserver, PerChannelMinMaxObserver, QConfig
    >>> qc = QConfig(activation=lambda: MinMaxObserver(dtype=np.uint8),
    ...              weight=lambda: PerChannelMinMaxObserver(dtype=np.int8))
    """

    def __init__(self, activation, weight):
        if not (callable(activation) and callable(weight)):
            raise TypeError("QConfig: 'activation' and 'weight' must be callables returning "
                            "observers")
        self.activation, self.weight = activation, weight


def default_qconfig():
    """Histogram observers (uint8, affine) for activations, symmetric int8
    per-channel min/max for weights (PyTorch's x86 defaults without
    ``reduce_range``: the VNNI kernels accumulate in int32, with no 16-bit
    intermediate that could saturate)."""
    return QConfig(activation=lambda: _obs.HistogramObserver(dtype=np.uint8),
                   weight=lambda: _obs.PerChannelMinMaxObserver(
                       ch_axis=0, dtype=np.int8, qscheme="per_channel_symmetric"))


# ---------------------------------------------------------------------------
# Dynamic quantization


def quantize_dynamic(model, inplace=False):
    """Replace every :class:`nbops.nn.Linear` of ``model`` by a dynamically
    quantized :class:`DynamicQuantizedLinear`.

    Parameters
    ----------
    model : nbops.nn.Module (a Linear itself, or any module containing them)
    inplace : bool, modify ``model`` instead of a deep copy

    Returns
    -------
    The quantized module (float32 in, float32 out).

    Raises
    ------
    TypeError
        ``model`` is not an nbops.nn.Module.

    Example
    -------
    >>> model = nbops.nn.Sequential(nbops.nn.Linear(16, 8, rng=0), nbops.nn.ReLU())
    >>> qmodel = nbops.quant.quantize_dynamic(model)
    >>> qmodel(np.ones((2, 16), np.float32)).shape
    (2, 8)
    """
    from ..nn.layers import Linear

    _need_module("quantize_dynamic", model)
    if isinstance(model, Linear):
        return DynamicQuantizedLinear.from_float(model)
    # devices before copying: a deep copy need not keep arrays on the GPU
    devices = [_weight_device(c) for _, _, c in _walk(model) if isinstance(c, Linear)]
    if not inplace:
        model = copy.deepcopy(model)
    found = [(p, n, c) for p, n, c in _walk(model) if isinstance(c, Linear)]
    for (parent, name, child), device in zip(found, devices):
        # in place in the ordered dict: a Sequential runs its children in order
        parent._modules[name] = new = DynamicQuantizedLinear.from_float(child, device=device)
        object.__setattr__(parent, name, new)
    return model


class DynamicQuantizedLinear(Module):
    """``y = x @ W.T + b`` with W int8 (per output channel, symmetric) and x
    quantized per call to uint8 over its range; float32 in and out
    (:func:`nbops.quant.linear_dynamic`). Made by :meth:`from_float`."""

    def __init__(self, packed, bias, in_features, out_features):
        super().__init__()
        self.packed, self.bias = packed, bias
        self.in_features, self.out_features = in_features, out_features

    @property
    def device(self):
        return self.packed.device

    @classmethod
    def from_float(cls, linear, qconfig=None, device=None):
        """Quantize the weight of an :class:`nbops.nn.Linear` (observed by
        ``qconfig.weight()``, default symmetric per-channel int8) and pack it
        on ``device`` (default: where the Linear's weight is)."""
        w, b = _host_f32(linear.weight), _host_f32(linear.bias)
        qw = _quantize_weight(w, (qconfig or default_qconfig()).weight)
        device = device or _weight_device(linear)
        packed, bias = _packed_for(qw, b, 1, device)
        return cls(packed, bias, w.shape[1], w.shape[0])

    def forward(self, x):
        from . import linear_dynamic

        x = _float_data("DynamicQuantizedLinear", x, self.device)
        return linear_dynamic(x, self.packed, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                "dtype=int8, qscheme=per_channel_symmetric")


# ---------------------------------------------------------------------------
# Static quantization


def prepare(model, qconfig=None, inplace=False):
    """Fold, fuse and insert observers for post-training static quantization.

    Parameters
    ----------
    model : nbops.nn.Sequential of Conv2d, BatchNorm2d (after a Conv2d),
        Linear, ReLU, MaxPool2d, AdaptiveAvgPool2d, Flatten (nested
        Sequentials are flattened; FusedConv layers of ``nn.fuse_modules``
        are accepted too). Batch norms are folded with their running
        statistics, on a copy in evaluation mode.
    qconfig : QConfig, optional (:func:`default_qconfig`)
    inplace : bool, ignored: the model is copied (folding changes weights);
        kept for PyTorch's signature.

    Returns
    -------
    ObservedSequential: a float model that records activation ranges when
    called. Run calibration batches through it, then :func:`convert` it.

    Raises
    ------
    TypeError
        ``model`` is not a Sequential, or holds a layer static quantization
        does not support (its name is given).
    ValueError
        A BatchNorm2d that does not follow a Conv2d, or channel counts that
        do not match.

    Example
    -------
    >>> model = nbops.nn.Sequential(nbops.nn.Linear(4, 3, rng=0), nbops.nn.ReLU())
    >>> observed = nbops.quant.prepare(model)
    >>> _ = observed(np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32))
    >>> qmodel = nbops.quant.convert(observed)
    """
    del inplace
    if not isinstance(model, Sequential):
        raise TypeError(f"prepare: static quantization takes an nbops.nn.Sequential, got "
                        f"{type(model).__name__} (build the model as a Sequential, or use "
                        "quantize_dynamic)")
    qconfig = qconfig or default_qconfig()
    if not isinstance(qconfig, QConfig):
        raise TypeError(f"prepare: 'qconfig' must be a QConfig, got {type(qconfig).__name__}")
    from ..nn.conv import fuse_modules

    # folding conv + batch norm (+ relu) is the conv layers' own job; on a copy,
    # in evaluation mode (running statistics), so the user's model is unchanged
    model = fuse_modules(copy.deepcopy(model).eval())
    return ObservedSequential(_fuse(_leaves(model)), qconfig)


def convert(observed, device="cpu"):
    """Quantize a calibrated :class:`ObservedSequential` (from :func:`prepare`).

    Parameters
    ----------
    observed : ObservedSequential, calibrated
    device : "cpu" (default) or "cuda": where the quantized model's weights
        are packed and its inputs must live

    Returns
    -------
    QuantizedSequential: float32 in (quantized once to uint8 with the input
    observer's parameters), int8 weights, uint8 activations, float32 out.

    Raises
    ------
    TypeError
        ``observed`` does not come from :func:`prepare`.
    ValueError
        It has not seen any calibration data.

    Example
    -------
    >>> model = nbops.nn.Sequential(nbops.nn.Linear(4, 3, rng=0))
    >>> observed = nbops.quant.prepare(model)
    >>> _ = observed(np.ones((2, 4), np.float32))
    >>> nbops.quant.convert(observed)(np.ones((2, 4), np.float32)).dtype
    dtype('float32')
    """
    if not isinstance(observed, ObservedSequential):
        raise TypeError(f"convert: expected the ObservedSequential returned by prepare(), got "
                        f"{type(observed).__name__}")
    if observed.batches == 0:
        raise ValueError("convert: the model has not been calibrated; call it on sample "
                         "batches after prepare() and before convert()")
    if device not in _dispatch.DEVICES:
        raise ValueError(f"convert: 'device' must be 'cpu' or 'cuda', got {device!r}")
    return QuantizedSequential(observed, device)


# --- layers as plain steps ------------------------------------------------------

class _Step:
    """One float layer of a prepared model. ``kind``: conv, linear, relu,
    maxpool, avgpool, flatten; ``weight``/``bias`` for conv and linear
    (after folding), ``relu`` when a ReLU was fused in, ``module`` the
    original layer (for its settings)."""

    __slots__ = ("kind", "module", "weight", "bias", "relu", "observer")

    def __init__(self, kind, module, weight=None, bias=None):
        self.kind, self.module, self.weight, self.bias = kind, module, weight, bias
        self.relu, self.observer = False, None


def _kinds():
    from .. import nn
    from ..nn import conv

    return [(nn.Linear, "linear"), (nn.ReLU, "relu"), (nn.MaxPool2d, "maxpool"),
            (nn.AdaptiveAvgPool2d, "avgpool"), (nn.Flatten, "flatten"),
            (nn.BatchNorm2d, "bn"), (conv.Conv2d, "conv"), (conv.FusedConv, "conv"),
            (conv.Identity, "skip")]


def _leaves(model):
    out = []
    for m in model:
        if isinstance(m, Sequential):
            out.extend(_leaves(m))
        else:
            out.append(m)
    return out


def _fuse(layers):
    """Steps from the layers of a model that ``nn.fuse_modules`` has folded:
    conv (Conv2d or FusedConv, whose weights hold the batch norm), linear,
    and the parameter-free layers; a ReLU after a conv or linear is fused
    into it."""
    kinds = _kinds()
    steps = []
    for i, m in enumerate(layers):
        kind = next((k for cls, k in kinds if type(m) is cls), None)
        if kind is None or (kind == "conv" and m._spatial != 2):
            raise TypeError(f"prepare: layer {i} ({type(m).__name__}) is not supported by "
                            "static quantization (Conv2d, BatchNorm2d, Linear, ReLU, "
                            "MaxPool2d, AdaptiveAvgPool2d, Flatten)")
        prev = steps[-1] if steps else None
        if kind == "bn":
            raise ValueError(f"prepare: BatchNorm2d at layer {i} must directly follow a "
                             "Conv2d, to be folded into it")
        if kind == "skip":
            continue
        if kind == "relu" and prev is not None and prev.kind in ("conv", "linear") \
                and not prev.relu:
            prev.relu = True
        elif kind in ("conv", "linear"):
            step = _Step(kind, m, _host_f32(m.weight), _host_f32(m.bias))
            step.relu = bool(getattr(m, "relu", False))  # a FusedConv's epilogue relu
            steps.append(step)
        else:
            steps.append(_Step(kind, m))
    return steps


def _float_forward(step, x):
    """The float computation of one step (folded weights, fused relu)."""
    import nbops

    if step.kind == "conv":
        m = step.module
        y = nbops.conv2d(x, step.weight, step.bias, stride=m.stride, padding=m.padding,
                         dilation=m.dilation, groups=m.groups)
    elif step.kind == "linear":
        y = nbops.linear(x, step.weight, step.bias)
    elif step.kind == "relu":
        return nbops.relu(x)
    else:
        return step.module(x)
    return nbops.relu(y) if step.relu else y


class ObservedSequential(Module):
    """A prepared float model: folded layers with observers (see :func:`prepare`).
    Calling it runs the float model (NumPy float32 input) and records ranges."""

    def __init__(self, steps, qconfig):
        super().__init__()
        self.steps, self.qconfig = steps, qconfig
        self.input_observer = qconfig.activation()
        for s in steps:
            if s.kind in ("conv", "linear"):
                s.observer = qconfig.activation()
        self.batches = 0

    def forward(self, x):
        x = _float_data("ObservedSequential", x)
        self.input_observer(x)
        for s in self.steps:
            x = _float_forward(s, x)
            if s.observer is not None:
                s.observer(x)
        self.batches += 1
        return x

    def extra_repr(self):
        return " -> ".join(s.kind + ("+relu" if s.relu else "") for s in self.steps)


class QuantizedSequential(Module):
    """A statically quantized model (see :func:`convert`): float32 in, float32
    out, uint8 activations and int8 weights inside, on one device."""

    def __init__(self, observed, device="cpu"):
        super().__init__()
        self.device = device
        self.input_qparams = observed.input_observer.calculate_qparams()
        self.layers = []
        scale_in = self.input_qparams[0]
        for s in observed.steps:
            if s.kind in ("conv", "linear"):
                qw = _quantize_weight(s.weight, observed.qconfig.weight)
                bias = None
                if s.bias is not None:
                    # int32 in units of s_in * s_w[oc], as ONNX and QNNPACK define it
                    units = np.float32(scale_in) * qw.scale
                    bias = np.clip(np.rint(s.bias / units), -2**31, 2**31 - 1).astype(np.int32)
                groups = s.module.groups if s.kind == "conv" else None
                packed, bias = _packed_for(qw, bias, groups, device)
                out_q = s.observer.calculate_qparams()
                self.layers.append((s.kind, s.module, packed, bias, out_q, s.relu))
                scale_in = out_q[0]
            else:
                self.layers.append((s.kind, s.module, None, None, None, False))

    def forward(self, x):
        from . import adaptive_avg_pool2d, conv2d, dequantize, linear, max_pool2d, \
            quantize_per_tensor, relu

        x = _float_data("QuantizedSequential", x, self.device)
        scale, zp = self.input_qparams
        q = quantize_per_tensor(x, scale, zp, np.uint8)
        for kind, m, packed, bias, out_q, fused_relu in self.layers:
            if kind == "conv":
                q = conv2d(q, packed, bias, stride=m.stride, padding=m.padding,
                           dilation=m.dilation, groups=m.groups, out_scale=out_q[0],
                           out_zero_point=out_q[1])
            elif kind == "linear":
                q = linear(q, packed, bias, out_scale=out_q[0], out_zero_point=out_q[1])
            elif kind == "relu":
                q = relu(q)
            elif kind == "maxpool":
                kw = m.kwargs
                if kw.get("return_indices"):
                    raise ValueError("QuantizedSequential: MaxPool2d(return_indices=True) has "
                                     "no quantized form")
                q = max_pool2d(q, kw["kernel_size"], kw["stride"], kw["padding"],
                               kw["dilation"], kw["ceil_mode"])
            elif kind == "avgpool":
                q = adaptive_avg_pool2d(q, m.kwargs["output_size"])
            elif kind == "flatten":
                q = q._with_values(_flatten(q.values, m.start_dim, m.end_dim))
            if fused_relu:
                q = relu(q)
        return dequantize(q)

    def extra_repr(self):
        return " -> ".join(k + ("+relu" if r else "") for k, *_, r in self.layers)


# ---------------------------------------------------------------------------
# Helpers


def _quantize_weight(w, weight_observer):
    from . import quantize_per_channel

    obs = weight_observer()
    obs(w)
    scales, zps = obs.calculate_qparams()
    return quantize_per_channel(w, scales, zps, 0, obs.dtype)


def _flatten(values, start, end):
    shape = tuple(values.shape)
    nd = len(shape)
    start, end = start % nd, end % nd
    new = shape[:start] + (int(np.prod(shape[start:end + 1], dtype=np.int64)),) + shape[end + 1:]
    return values.reshape(new)


def _host_f32(p):
    if p is None:
        return None
    data = getattr(p, "data", p) if getattr(p, "__nbops_tensor__", False) else p
    return np.ascontiguousarray(_dispatch.to_host(data), np.float32)


def _float_data(who, x, device=None):
    if isinstance(x, QTensor):
        raise TypeError(f"{who}: expected a float array, got a QTensor (the model quantizes "
                        "its input itself; pass x.dequantize())")
    data = getattr(x, "data", x) if getattr(x, "__nbops_tensor__", False) else x
    where = _dispatch.device_of_array(data)
    if device is not None and where is not None and where != device:
        raise TypeError(f"{who}: the input is on {where} but the quantized weights are packed "
                        f"on {device}; move the input (nbops.to_device / nbops.to_host) or "
                        f"quantize the model for {where}")
    return data


def _packed_for(qw, bias, groups, device):
    """``(PackedWeight, bias)`` on ``device`` (``groups`` None for a linear weight)."""
    from . import pack_weight

    if device == _dispatch.CUDA:
        qw = qw.to_device()
        bias = None if bias is None else _dispatch.to_device(bias)
    packed = pack_weight(qw) if groups is None else pack_weight(qw, groups)
    return packed, bias


def _weight_device(layer):
    return _dispatch.device_of_array(getattr(layer.weight, "data", layer.weight))


def _need_module(op, model):
    if not isinstance(model, Module):
        raise TypeError(f"{op}: expected an nbops.nn.Module, got {type(model).__name__}")


def _walk(module):
    """``(parent, name, child)`` for every descendant, parents first."""
    for name, child in list(module._modules.items()):
        yield module, name, child
        yield from _walk(child)
