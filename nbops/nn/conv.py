"""Convolution layers (Conv1d, Conv2d), the fused inference layer
:class:`FusedConv` and :func:`fuse_modules`, which folds
Conv + BatchNorm (+ ReLU) of an evaluation-mode model into fused layers.

Parameter names and initialisation are PyTorch's: ``weight`` (out_channels,
in_channels / groups, *kernel_size) and ``bias`` (out_channels,), both
uniform in +-1/sqrt(fan_in) with fan_in = in_channels / groups * prod(kernel).
"""

import math

import numpy as np

from .. import _checks, _dispatch, conv
from .layers import ReLU, _dtype, _operands, _rng
from .module import Module, Parameter, Sequential

__all__ = ["Conv1d", "Conv2d", "FusedConv", "Identity", "fuse_modules"]


class _ConvNd(Module):
    _spatial = 2
    _fn = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", dtype=np.float32,
                 rng=None):
        super().__init__()
        name = type(self).__name__
        in_channels = _checks.int_arg(name, "in_channels", in_channels, low=1)
        out_channels = _checks.int_arg(name, "out_channels", out_channels, low=1)
        groups = _checks.int_arg(name, "groups", groups, low=1)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must both be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f"{name}: padding_mode must be 'zeros', got {padding_mode!r}")
        ks = _checks.int_tuple(name, "kernel_size", kernel_size, self._spatial, low=1)
        dtype = _dtype(name, dtype)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = ks
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups = groups
        rng = _rng(rng)
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in)
        shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(rng.uniform(-bound, bound, shape).astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, out_channels).astype(dtype)) \
            if bias else None

    def forward(self, x):
        weight, bias = _operands(x, self.weight, self.bias)
        return type(self)._fn(x, weight, bias, stride=self.stride, padding=self.padding,
                              dilation=self.dilation, groups=self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")


class Conv2d(_ConvNd):
    """:func:`nbops.conv2d` as a layer: ``Conv2d(in_channels, out_channels,
    kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
    padding_mode="zeros", dtype=float32, rng=None)``; input (N, C, H, W).
    Raises TypeError for non-int sizes, ValueError for sizes below 1 (or a
    ``kernel_size`` tuple of the wrong length), channels not divisible by
    ``groups``, another padding mode; the call raises as :func:`nbops.conv2d`.

    >>> layer = nbops.nn.Conv2d(3, 8, 3, padding=1, rng=0)
    >>> with nbops.no_grad():
    ...     layer(np.ones((1, 3, 5, 5), np.float32)).shape
    (1, 8, 5, 5)
    """

    _spatial = 2
    _fn = staticmethod(conv.conv2d)


class Conv1d(_ConvNd):
    """:func:`nbops.conv1d` as a layer, arguments as :class:`Conv2d` with
    int ``kernel_size``/``stride``/``padding``/``dilation``; input (N, C, L).

    >>> layer = nbops.nn.Conv1d(2, 4, 3, rng=0)
    >>> with nbops.no_grad():
    ...     layer(np.ones((1, 2, 10), np.float32)).shape
    (1, 4, 8)
    """

    _spatial = 1
    _fn = staticmethod(conv.conv1d)


class Identity(Module):
    """Returns its input; stands where :func:`fuse_modules` removed a layer."""

    def forward(self, x):
        return x


class FusedConv(Module):
    """A convolution with an evaluation-mode batch norm folded into its
    ``weight`` and ``bias`` and, with ``relu=True``, the relu in its
    epilogue: one :func:`nbops.conv_relu` / :func:`nbops.conv2d` kernel per
    call. Built by :func:`fuse_modules` (or ``FusedConv(conv, bn, relu)``
    with a Conv1d/Conv2d and an optional BatchNorm1d/2d in eval mode).
    """

    def __init__(self, conv_layer, bn=None, relu=False):
        super().__init__()
        if not isinstance(conv_layer, _ConvNd):
            raise TypeError(f"FusedConv: expected a Conv1d or Conv2d, got "
                            f"{type(conv_layer).__name__}")
        weight = conv_layer.weight.data
        bias = None if conv_layer.bias is None else conv_layer.bias.data
        if bn is not None:
            if bn.running_mean is None:
                raise ValueError("FusedConv: the batch norm keeps no running statistics "
                                 "(track_running_stats=False); it cannot be folded")
            dev = _dispatch.device_of_array(weight)
            ones = np.ones(bn.num_features, weight.dtype)
            gamma = bn.weight.data if bn.weight is not None else (
                ones if dev == _dispatch.CPU else _dispatch.to_device(ones))
            beta = bn.bias.data if bn.bias is not None else (
                ones * 0 if dev == _dispatch.CPU else _dispatch.to_device(ones * 0))
            weight, bias = conv.fold_batch_norm(weight, bias, bn.running_mean,
                                                bn.running_var, gamma, beta, eps=bn.eps)
        self._spatial = conv_layer._spatial
        self.stride, self.padding = conv_layer.stride, conv_layer.padding
        self.dilation, self.groups = conv_layer.dilation, conv_layer.groups
        self.relu = bool(relu)
        self.weight = Parameter(weight)
        self.bias = None if bias is None else Parameter(bias)
        self.train(conv_layer.training)

    def forward(self, x, residual=None, relu=None):
        """The fused convolution of ``x``; ``residual`` (the output's shape)
        is added in the same kernel, before the relu; ``relu`` (True/False)
        overrides the layer's own for this call: a residual block whose relu
        follows the sum calls its last (conv-bn) layer with
        ``residual=shortcut, relu=True``."""
        weight, bias = _operands(x, self.weight, self.bias)
        kw = dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                  groups=self.groups, residual=residual)
        if self.relu if relu is None else relu:
            return conv.conv_relu(x, weight, bias, **kw)
        fn = conv.conv2d if self._spatial == 2 else conv.conv1d
        return fn(x, weight, bias, **kw)

    def extra_repr(self):
        return (f"weight={tuple(self.weight.shape)}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"relu={self.relu}")


def fuse_modules(model, groups=None):
    """Fold Conv + BatchNorm (+ ReLU) of an evaluation-mode model into
    :class:`FusedConv` layers, in place; returns the model.

    Without ``groups``, every :class:`~nbops.nn.Sequential` is scanned for
    runs Conv2d -> BatchNorm2d -> ReLU, Conv2d -> BatchNorm2d and
    Conv2d -> ReLU (likewise Conv1d with BatchNorm1d); each run becomes one
    fused layer (the Sequential's later layers are renumbered). Modules
    that are not Sequentials are left alone there, since their forward may
    apply their children in any order (ResNet applies its last relu after
    the residual sum): name their runs in ``groups``, a list of lists of
    dotted child names such as ``[["conv1", "bn1", "relu1"]]``; the first
    is replaced by the fused layer, the others by :class:`Identity`.

    The model must be in evaluation mode (``model.eval()``): training-mode
    batch norm uses batch statistics, which cannot be folded. The fused
    model's outputs equal the unfused model's within float32 rounding.

    Raises
    ------
    ValueError
        The model is in training mode, a named group is not
        Conv [, BatchNorm] [, ReLU], or a batch norm keeps no running
        statistics.

    Example
    -------
    >>> m = nbops.nn.Sequential(nbops.nn.Conv2d(3, 8, 3, rng=0),
    ...                         nbops.nn.BatchNorm2d(8), nbops.nn.ReLU()).eval()
    >>> nbops.nn.fuse_modules(m)[0]
    FusedConv(weight=(8, 3, 3, 3), stride=1, padding=0, dilation=1, groups=1, relu=True)
    """
    if any(m.training for m in model.modules()):
        raise ValueError("fuse_modules: the model is in training mode; call model.eval() "
                         "first (training-mode batch norm cannot be folded)")
    if groups is not None:
        for names in groups:
            _fuse_named(model, list(names))
        return model
    for m in list(model.modules()):
        if isinstance(m, Sequential):
            _fuse_sequential(m)
    return model


def _bn_kind(m, spatial):
    from .normalization import BatchNorm1d, BatchNorm2d

    return isinstance(m, BatchNorm2d if spatial == 2 else BatchNorm1d)


def _fuse_sequential(seq):
    items = list(seq._modules.values())
    fused = []
    i = 0
    while i < len(items):
        m = items[i]
        if isinstance(m, _ConvNd):
            bn = items[i + 1] if i + 1 < len(items) and _bn_kind(items[i + 1], m._spatial) \
                and items[i + 1].running_mean is not None else None
            j = i + 1 + (bn is not None)
            relu = j < len(items) and type(items[j]) is ReLU
            if bn is not None or relu:
                fused.append(FusedConv(m, bn, relu))
                i = j + relu
                continue
        fused.append(m)
        i += 1
    if len(fused) != len(items):
        for name in list(seq._modules):
            delattr(seq, name)
        for k, m in enumerate(fused):
            setattr(seq, str(k), m)


def _fuse_named(model, names):
    mods = [_get(model, n) for n in names]
    ok = 2 <= len(mods) <= 3 and isinstance(mods[0], _ConvNd)
    bn = mods[1] if ok and _bn_kind(mods[1], mods[0]._spatial) else None
    rest = mods[1 + (bn is not None):] if ok else mods
    relu = len(rest) == 1 and type(rest[0]) is ReLU
    if not ok or not (len(rest) == 0 or relu):
        raise ValueError(f"fuse_modules: group {names} must name a Conv1d/Conv2d, then "
                         f"an optional BatchNorm of the same rank, then an optional ReLU; "
                         f"got {[type(m).__name__ for m in mods]}")
    _set(model, names[0], FusedConv(mods[0], bn, relu))
    for n in names[1:]:
        _set(model, n, Identity().eval())


def _get(model, dotted):
    m = model
    for part in dotted.split("."):
        if part not in m._modules:
            raise ValueError(f"fuse_modules: no submodule named {dotted!r}")
        m = m._modules[part]
    return m


def _set(model, dotted, value):
    *parents, last = dotted.split(".")
    m = model
    for part in parents:
        m = m._modules[part]
    setattr(m, last, value)
