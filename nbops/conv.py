"""Convolutions: ``conv1d`` and ``conv2d``, batch norm folding and the fused
``conv_bn_relu`` / ``conv_bn`` / ``conv_relu``, on CPU and CUDA.

Layouts are PyTorch's: input NCHW (NCL), weight (out_channels,
in_channels / groups, kH, kW) ((out, in / groups, k)). Every variant is one
kernel call ``out = act(conv(x, weight * wscale) + bias)`` with a
per-output-channel weight scale and bias, which is how batch norm is
folded: ``wscale = gamma / sqrt(var + eps)``, ``bias' = (bias - mean) *
wscale + beta``; the scale is applied while the weights are packed and the
bias and relu by the GEMM's epilogue, so the fused op writes its output
once and reads nothing more than a plain convolution.

CPU algorithms (:mod:`nbops.cpu.conv`): an implicit GEMM on nbops' packed
GEMM micro-kernel (1x1 and larger kernels alike; the im2col matrix is
packed block by block, never built), im2col + NumPy's BLAS, a direct
convolution on padded planes (stride 1, or on the input dealt into stride
phases), and direct depthwise kernels for one input channel per group.
The first three are autotuner candidates where they apply
(``NBOPS_AUTOTUNE=0``: ``DEFAULT_CONFIG``, the implicit GEMM); depthwise
has one algorithm per stride range. CUDA (:mod:`nbops.cuda.conv`): a
direct kernel with the block's weights staged in shared memory.

The plan: every call is planned here, never in a kernel. The call's
:class:`ConvGeometry` and dtype go through one table of algorithms with
their applicability rules (:data:`ALGORITHMS`); the autotuner times and
chooses only among the configs whose algorithm applies, and
:func:`plan_conv` turns its choice into a :class:`ConvPlan` (algorithm,
the rule that admits it, blocks, the geometry the kernel runs), which the
CPU kernel entry runs as given.

Packing once: :func:`conv_pack` validates a convolution for one input
shape, dtype and device, folds its batch norm and bias, makes its weights
C-contiguous in the kernel's layout and, on the first call, makes its
plan (the autotuner's choice) and keeps it: a :class:`PackedConv`. Every front
(``conv2d``, ``conv1d``, ``conv_relu``, ``conv_bn``, ``conv_bn_relu``)
takes one in place of ``weight`` and then only checks ``x``, ``out`` and
``residual`` before the kernel runs (an ONNX session packs each Conv once
at plan time). The implicit GEMM still packs its A panels from those
weights inside each call: the kernel has no entry taking them packed.

Backward (autograd): the input gradient is ``col2im(W^T @ grad)``, the
weight gradient ``grad @ im2col(x)^T`` summed over the batch, the bias
gradient the sum of ``grad`` over batch and pixels; products run on
:func:`nbops.matmul`, so both devices share the rule.
"""

import functools
from typing import NamedTuple

import numpy as np

from . import _checks, _dispatch, _spec, arith, tensor
from . import autotune as _autotune
from ._dispatch import CPU, CUDA, operator
from .linalg import _DTYPE_NAMES, matmul

__all__ = ["conv1d", "conv2d", "fold_batch_norm", "conv_bn_relu", "conv_bn", "conv_relu",
           "conv_pack", "PackedConv", "DEFAULT_CONFIG", "CONV_CONFIGS"]

FAMILY = _spec.mirror("conv")
# the direct kernel's register tiles (MR, NR) per dtype: its rule needs NR; a
# CPU-only constant, not a kernel any spec names (the specs register those)
_dispatch.register_kernels(FAMILY, ("DIRECT_TILES",), (CPU,))

#: CPU config used when tuning is off: implicit GEMM over blocks of 256
#: output pixels x 256 k (a 32 KiB float32 B panel per NR sliver group).
DEFAULT_CONFIG = {"algo": "igemm", "NC": 256, "KC": 256}

#: Configs the autotuner may time for CPU convolutions with more than one
#: input channel per group; for one call it times those whose algorithm
#: applies (:data:`ALGORITHMS`, :func:`plan_conv`): "direct" only where the
#: direct convolution runs, on the input or on its phases.
CONV_CONFIGS = [
    DEFAULT_CONFIG,
    {"algo": "igemm", "NC": 512, "KC": 256},
    {"algo": "igemm", "NC": 128, "KC": 256},
    {"algo": "igemm", "NC": 256, "KC": 512},
    {"algo": "igemm", "NC": 1024, "KC": 128},
    {"algo": "blas", "NC": 0, "KC": 0},
    {"algo": "direct", "NC": 0, "KC": 0},
]


@_autotune.autotune(configs=CONV_CONFIGS, key=["n", "c", "hw", "co", "kk", "stride", "groups"],
                    default=DEFAULT_CONFIG, name="nbops.conv2d")
def _cpu_conv(args, geo, n, c, hw, co, kk, stride, groups, dtype, algo, NC, KC):
    # one run of the plan of config (algo, NC, KC); the tuner is only handed
    # configs whose algorithm applies (_plan_for), so planning never refuses
    plan = _plan(geo, args[4].dtype, CPU, algo, NC, KC)
    return FAMILY.kernel("conv2d", CPU)(*args, plan=plan)


_ACTS = {None: 0, "relu": 1}


# ---------------------------------------------------------------------------
# Backward rules: one gradient per forward parameter


def _swap(x):
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return tensor.transpose(x, axes) if not isinstance(x, np.ndarray) else x.transpose(axes)


def _conv_grads(x, w, grad, geo, spatial, need_x, need_w, need_b):
    """``(gx, gw, gb)`` of ``out = conv(x, w) + b`` given ``grad`` of out
    (None for gradients not needed)."""
    c, groups, co = geo.c, geo.groups, geo.co
    n = int(x.shape[0])
    mg, k, p = co // groups, (c // groups) * geo.kh * geo.kw, geo.oh * geo.ow
    dev = _dispatch.device_of_array(grad)
    g4 = _reshape(tensor.contiguous(grad), (n, groups, mg, p))
    gx = gw = gb = None
    if need_x:
        wm = _reshape(tensor.contiguous(w), (groups, mg, k))
        cols = matmul(_swap(wm), g4)  # (N, G, k, P)
        gx = _checks.empty((n, c, geo.h, geo.w), x.dtype, dev)
        FAMILY.kernel("col2im", dev)(cols, tuple(geo), gx)
        gx = _reshape(gx, tuple(x.shape))
    if need_w:
        cols = _checks.empty((n, groups, k, p), x.dtype, dev)
        FAMILY.kernel("im2col", dev)(_as4d(tensor.contiguous(x), spatial), tuple(geo),
                                     cols)
        gw = arith.sum(matmul(g4, _swap(cols)), axis=0)  # (G, mg, k)
        gw = _reshape(gw, tuple(w.shape))
    if need_b:
        gb = arith.sum(_reshape(g4, (n, co, p)), axis=(0, 2))
    return gx, gw, gb


def _unpacked(op, w):
    if type(w) is PackedConv:
        raise TypeError(f"{op}: no gradient through a packed weight (nbops.conv_pack is for "
                        f"inference); pass the weight array to differentiate")


def _conv_rule(spatial):
    def rule(ctx, grad):
        x, w, b = ctx.inputs[:3]
        _unpacked("conv2d" if spatial == 2 else "conv1d", w)
        geo, _ = _geometry("backward", spatial, x, w, *ctx.inputs[3:7])
        gx, gw, gb = _conv_grads(x, w, grad, geo, spatial, ctx.needs_input_grad[0],
                                 ctx.needs_input_grad[1], b is not None)
        return _with_residual(ctx, (gx, gw, gb), grad)
    return rule


def _with_residual(ctx, grads, gz):
    """One gradient per input: ``grads`` first, None for the rest but the
    residual (the last parameter), whose gradient is ``gz``: the output's
    gradient through the activation."""
    rest = [None] * (len(ctx.inputs) - len(grads))
    if ctx.inputs[-1] is not None:
        rest[-1] = gz
    return tuple(grads) + tuple(rest)


def _relu_grad(grad, y):
    from . import activations

    return activations.relu_backward(grad, y)


def _conv_relu_rule(ctx, grad):
    x, w, b = ctx.inputs[:3]
    _unpacked("conv_relu", w)
    spatial = _spatial_of(w)
    geo, _ = _geometry("backward", spatial, x, w, *ctx.inputs[3:7])
    gz = _relu_grad(grad, ctx.output)
    gx, gw, gb = _conv_grads(x, w, gz, geo, spatial, ctx.needs_input_grad[0],
                             ctx.needs_input_grad[1], b is not None)
    return _with_residual(ctx, (gx, gw, gb), gz)


def _fold_chain(w, b, mean, var, gamma, eps, scale, gwf, gbf):
    """Gradients of ``(W, b, mean, var, gamma, beta)`` from those of the folded
    ``W' = W s`` and ``b' = (b - mean) s + beta``, ``s = gamma / sqrt(var + eps)``."""
    co = int(w.shape[0])
    dev = _dispatch.device_of_array(w)
    gw = _checks.empty(tuple(w.shape), w.dtype, dev)
    FAMILY.kernel("fold_weights", dev)(
        _reshape(tensor.contiguous(gwf), (co, -1)), scale, _reshape(gw, (co, -1)))
    centred = arith.neg(mean) if b is None else arith.sub(b, mean)
    gs = arith.add(arith.sum(arith.mul(_reshape(tensor.contiguous(gwf), (co, -1)),
                                       _reshape(tensor.contiguous(w), (co, -1))), axis=1),
                   arith.mul(gbf, centred))
    inv_std = arith.pow(arith.add(var, float(eps)), -0.5)
    ggamma = arith.mul(gs, inv_std)
    gvar = arith.mul(arith.mul(gs, scale), arith.mul(arith.mul(inv_std, inv_std), -0.5))
    gb = arith.mul(gbf, scale) if b is not None else None
    gmean = arith.neg(arith.mul(gbf, scale))
    return gw, gb, gmean, gvar, ggamma, gbf


def _conv_bn_rule(relu):
    def rule(ctx, grad):
        x, w, b, mean, var, gamma, beta, eps = ctx.inputs[:8]
        _unpacked("conv_bn_relu" if relu else "conv_bn", w)
        spatial = _spatial_of(w)
        geo, _ = _geometry("backward", spatial, x, w, *ctx.inputs[8:12])
        dev = _dispatch.device_of_array(x)
        gz = _relu_grad(grad, ctx.output) if relu else grad
        stats = {"bias": b, "bn_mean": mean, "bn_var": var, "bn_weight": gamma,
                 "bn_bias": beta}
        scale, _ = _scale_shift(dev, x.dtype, int(w.shape[0]), stats, eps)
        wf, _ = fold_batch_norm(w, b, mean, var, gamma, beta, eps)
        gx, gwf, gbf = _conv_grads(x, wf, gz, geo, spatial, ctx.needs_input_grad[0], True,
                                   True)
        rest = _fold_chain(w, b, mean, var, gamma, eps, scale, gwf, gbf)
        return _with_residual(ctx, (gx,) + rest, gz)
    return rule


def _fold_rule(ctx, gwf, gbf):
    w, b, mean, var, gamma, beta, eps = ctx.inputs
    co = int(w.shape[0])
    dev = _dispatch.device_of_array(w)
    if gwf is None:
        gwf = arith.mul(w, 0.0)
    if gbf is None:
        gbf = arith.mul(mean, 0.0)
    stats = {"bias": b, "bn_mean": mean, "bn_var": var, "bn_weight": gamma, "bn_bias": beta}
    scale, _ = _scale_shift(dev, w.dtype, co, stats, eps)
    return _fold_chain(w, b, mean, var, gamma, eps, scale, gwf, gbf) + (None,)


# ---------------------------------------------------------------------------
# Declarations (the helpers the rules call are defined below, and looked up
# when a rule runs)


def _sampler(seed, cases):
    """``samples(dtype)`` of a conv front: one sample per ``(label, x shape,
    weight shape, bias, kwargs)`` in ``cases`` (``bias`` a bool; a kwargs
    entry ``residual`` is the residual's shape, ``nan`` and ``residual_nan``
    an index of ``x`` or of the residual set to NaN). With ``bn`` the
    batch-norm statistics follow the bias, and ``eps`` is 1e-3 unless given."""
    def samples(dtype, bn=False):
        rng = np.random.default_rng(seed)

        def r(shape):
            return rng.standard_normal(shape).astype(dtype)

        out = []
        for label, xs, ws, bias, kw in cases:
            kw = dict(kw)
            x, w = r(xs), (r(ws) / np.sqrt(max(1, np.prod(ws[1:])))).astype(dtype)
            if "nan" in kw:
                x[kw.pop("nan")] = np.nan
            if "residual" in kw:
                kw["residual"] = r(kw["residual"])
            if "residual_nan" in kw:
                kw["residual"][kw.pop("residual_nan")] = np.nan
            args = (x, w, r(ws[0]) if bias else None)
            if bn:
                args += _bn_stats(rng, ws[0], dtype)
                kw.setdefault("eps", 1e-3)
            out.append(_spec.Sample(args, kw, label))
        return out

    return samples


def _bn_stats(rng, co, dtype):
    """``(bn_mean, bn_var, bn_weight, bn_bias)`` of ``co`` channels, the
    variances in [0.5, 2)."""
    return (rng.standard_normal(co).astype(dtype), rng.uniform(0.5, 2.0, co).astype(dtype),
            rng.standard_normal(co).astype(dtype), rng.standard_normal(co).astype(dtype))


# (label, x, weight, bias, kwargs): the first is each op's main sample (the
# largest whose arrays all fit the CUDA simulator's 128 elements; C == CO and
# the output of the input's size, so the table's out= checks see overlap);
# samples with an array over 128 elements run on the CPU only
_CONV2D = (
    ("3x3-pad1", (1, 3, 6, 6), (3, 3, 3, 3), True, dict(padding=1)),
    ("1x1-groups", (1, 4, 5, 5), (6, 2, 1, 1), True, dict(groups=2)),
    ("1x1-strided-padded", (1, 3, 5, 7), (4, 3, 1, 1), True, dict(stride=2, padding=1)),
    ("depthwise", (1, 4, 6, 5), (4, 1, 3, 3), True, dict(padding=1, groups=4)),
    ("depthwise-x2-stride2", (1, 3, 7, 6), (6, 1, 3, 3), True,
     dict(stride=2, padding=1, groups=3)),
    ("pairs-even-kernel", (1, 2, 5, 9), (4, 2, 2, 4), True,
     dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1))),
    ("same-asymmetric-no-bias", (1, 3, 6, 6), (2, 3, 3, 2), False,
     dict(padding="same", dilation=(1, 2))),
    ("valid", (1, 3, 4, 5), (2, 3, 3, 3), True, dict(padding="valid")),
    ("batch2-strided-groups", (2, 4, 4, 4), (2, 2, 3, 3), True, dict(stride=2, groups=2)),
    ("dilated-padded", (1, 2, 7, 7), (2, 2, 3, 3), True, dict(padding=1, dilation=2)),
    ("residual", (1, 2, 5, 5), (3, 2, 3, 3), True, dict(padding=1, residual=(1, 3, 5, 5))),
    ("nan", (1, 2, 6, 6), (2, 2, 3, 3), True, dict(nan=(0, 1, 2, 3))),
    ("empty-batch", (0, 3, 5, 5), (2, 3, 3, 3), True, dict(padding=1)),
    ("strided-groups", (2, 4, 9, 8), (6, 2, 3, 3), True, dict(stride=2, groups=2)),
    ("dilated", (1, 4, 8, 9), (8, 4, 3, 3), True, dict(padding=2, dilation=2)),
    ("stem-7x7s2", (1, 3, 11, 10), (4, 3, 7, 7), True, dict(stride=2, padding=3)),
    ("co-past-a-tile", (1, 9, 5, 4), (17, 9, 2, 2), True, dict(padding=1)),
    ("column-stride-3", (2, 3, 9, 11), (5, 3, 5, 3), True,
     dict(stride=(1, 3), padding=2, dilation=(1, 2))),
    ("1x1-in-place", (2, 20, 7, 9), (18, 10, 1, 1), True, dict(groups=2)),
    ("1x1-subsampled", (2, 8, 9, 11), (6, 4, 1, 1), True, dict(stride=(2, 3), groups=2)),
)
_CONV1D = (
    ("k3-pad1-groups", (2, 4, 14), (4, 2, 3), True, dict(padding=1, groups=2)),
    ("strided-groups", (2, 4, 11), (6, 2, 3), True, dict(stride=2, padding=1, groups=2)),
    ("depthwise-same", (1, 3, 9), (3, 1, 5), True, dict(padding="same", groups=3)),
    ("dilated-no-bias", (1, 2, 7), (4, 2, 2), False, dict(dilation=3)),
    ("valid", (1, 2, 6), (2, 2, 3), True, dict(padding="valid")),
    ("1x1", (1, 3, 8), (5, 3, 1), True, {}),
    ("residual", (2, 4, 9), (6, 2, 3), False,
     dict(stride=2, padding=1, groups=2, residual=(2, 6, 5))),
    ("empty-batch", (0, 2, 5), (3, 2, 3), True, {}),
    ("long", (2, 4, 50), (6, 4, 5), True, dict(padding=2)),
)
# relu: the main samples' pre-activations (seed 2 here, seed 4 of conv_bn_relu)
# are all at least 5e-3 from the kink, far beyond the steps of the gradient
# check's central differences, which then never straddle it
_CONV_RELU = (
    ("3x3-pad1", (1, 3, 6, 6), (3, 3, 3, 3), True, dict(padding=1)),
    ("1x1-groups", (1, 4, 5, 5), (6, 2, 1, 1), True, dict(groups=2)),
    ("depthwise-residual", (1, 4, 6, 5), (4, 1, 3, 3), True,
     dict(padding=1, groups=4, residual=(1, 4, 6, 5))),
    ("strided-groups-residual-nan", (1, 4, 5, 5), (4, 2, 3, 3), True,
     dict(stride=2, groups=2, residual=(1, 4, 2, 2), residual_nan=(0, 1, 0, 1))),
    ("1d", (2, 4, 9), (6, 2, 3), True, dict(stride=2, padding=1, groups=2)),
    ("nan", (1, 2, 6, 6), (2, 2, 3, 3), False, dict(nan=(0, 1, 2, 3))),
    ("empty-batch", (0, 3, 5, 5), (2, 3, 3, 3), True, dict(padding=1)),
    ("stem-7x7s2", (1, 3, 11, 10), (4, 3, 7, 7), True, dict(stride=2, padding=3)),
)
_CONV_BN = (
    ("3x3-pad1", (1, 3, 6, 6), (3, 3, 3, 3), True, dict(padding=1)),
    ("1x1-groups-no-bias", (1, 4, 5, 5), (6, 2, 1, 1), False, dict(groups=2)),
    ("depthwise-x2", (1, 3, 6, 6), (6, 1, 3, 3), True, dict(padding=1, groups=3)),
    ("residual-eps", (1, 2, 5, 5), (3, 2, 3, 3), True,
     dict(padding="same", residual=(1, 3, 5, 5), eps=1e-5)),
    ("1d", (2, 4, 9), (6, 4, 3), False, dict(padding=1)),
    ("empty-batch", (0, 3, 5, 5), (2, 3, 3, 3), True, dict(padding=1)),
    ("strided-groups", (2, 4, 9, 8), (6, 2, 3, 3), True, dict(stride=2, groups=2)),
)


def _conv_bn_samples(seed):
    base = _sampler(seed, _CONV_BN)
    return lambda dtype: base(dtype, bn=True)


def _fold_samples(dtype):
    rng = np.random.default_rng(6)
    out = []
    for label, ws, bias in (("4d", (4, 3, 2, 2), True), ("3d-no-bias", (3, 2, 5), False),
                            ("2d", (5, 7), True), ("one-channel", (1, 1, 1, 1), True)):
        co = ws[0]
        args = (rng.standard_normal(ws).astype(dtype),
                rng.standard_normal(co).astype(dtype) if bias else None)
        out.append(_spec.Sample(args + _bn_stats(rng, co, dtype), dict(eps=1e-3), label))
    return out


def _z(*shape, dtype=np.float64):
    return np.zeros(shape, dtype)


_X4, _W4, _C6 = _z(1, 4, 5, 5), _z(6, 2, 3, 3), np.ones(6)
#: (x, weight, kwargs, error, match) of every 4-D front
_GEOMETRY_BAD = (
    (_X4, _W4[0], {}, ValueError, "argument 'weight' must be 4-D"),
    (_X4[0], _W4, {}, ValueError, "argument 'x' must be 4-D"),
    (_X4, _W4, dict(groups=3), ValueError, "input channels 4 of 'x' are not divisible"),
    (_z(1, 6, 5, 5), _z(4, 2, 3, 3), dict(groups=3), ValueError,
     "output channels 4 of 'weight' are not divisible"),
    (_X4, _W4, {}, ValueError, r"expects 2 input channels .* 'x' has 4"),
    (_X4, _W4, dict(groups=2, stride=0), ValueError, "'stride' must be >= 1"),
    (_X4, _W4, dict(groups=2, stride=(1, -1)), ValueError, "'stride' must be >= 1"),
    (_X4, _W4, dict(groups=2, dilation=0), ValueError, "'dilation' must be >= 1"),
    (_X4, _W4, dict(groups=2, padding=-1), ValueError, "'padding' must be >= 0"),
    (_X4, _W4, dict(groups=2, padding="full"), ValueError, "'padding' must be an int"),
    (_X4, _W4, dict(groups=2, padding="same", stride=2), ValueError,
     "padding='same' needs stride 1"),
    (_X4, _W4, dict(groups=2, dilation=3), ValueError,
     r"kernel height of 'weight' spans 7 .* padded input of 'x' is only 5"),
    (_X4, _z(6, 2, 3, 8), dict(groups=2, padding=(0, 1)), ValueError,
     "kernel width of 'weight' spans 8"),
    (_X4, _W4, dict(groups=2, stride=1.5), TypeError, "'stride' must be an int"),
    (_X4.astype(np.float32), _W4, dict(groups=2), TypeError, "'x' is float32 but 'weight'"),
    (_X4.astype(np.int64), _W4, dict(groups=2), TypeError, "'x' must be a float32"),
    (_X4, _W4, dict(groups=2, residual=_z(1, 6, 3, 4)), ValueError,
     r"argument 'residual' must have the output's shape \(1, 6, 3, 3\), got \(1, 6, 3, 4\)"),
    (_X4, _W4, dict(groups=2, residual=_z(1, 6, 3, 3, dtype=np.float32)), TypeError,
     "'x' is float64 but 'residual' is float32"),
    (_X4, _z(6, 2, 3, 3, 1), dict(groups=2), ValueError, "argument 'weight' must be 4-D"),
)
_CONV2D_BAD = tuple(_spec.Bad((x, w), kw, e, m) for x, w, kw, e, m in _GEOMETRY_BAD) + (
    _spec.Bad((_X4, _W4, _z(5)), dict(groups=2), ValueError, r"'bias' must have shape \(6,\)"),
)
_CONV1D_BAD = (
    _spec.Bad((_z(1, 2, 5), _z(2, 2, 1, 1)), {}, ValueError, "argument 'weight' must be 3-D"),
    _spec.Bad((_z(1, 2, 5), _z(2, 2, 6)), {}, ValueError, "kernel of 'weight' spans 6"),
    _spec.Bad((_z(2, 5), _z(2, 2, 3)), {}, ValueError, "argument 'x' must be 3-D"),
    _spec.Bad((_z(1, 4, 5), _z(2, 2, 3)), dict(groups=2, stride=(1, 1)), ValueError,
              r"'stride' must be an int or a tuple of 1 ints, got \(1, 1\)"),
    _spec.Bad((_z(1, 2, 5), _z(2, 2, 3), _z(3)), {}, ValueError,
              r"'bias' must have shape \(2,\)"),
    _spec.Bad((_z(1, 2, 5, dtype=np.float32), _z(2, 2, 3)), {}, TypeError,
              "'x' is float32 but 'weight'"),
)
_BN_BAD = tuple(_spec.Bad((x, w, None, _C6, _C6, _C6, _C6), kw, e, m)
                for x, w, kw, e, m in _GEOMETRY_BAD[4:] if w.shape == _W4.shape) + (
    _spec.Bad((_X4, _W4, None, _C6, np.ones(5), _C6, _C6), dict(groups=2), ValueError,
              r"argument 'bn_var' must have shape \(6,\)"),
    _spec.Bad((_X4, _W4, None, _C6, _C6, _C6, _C6), dict(groups=2, eps=0.0), ValueError,
              "argument 'eps' must be > 0"),
    _spec.Bad((_X4, _W4), dict(groups=2), TypeError, "argument 'bn_mean' must be"),
    _spec.Bad((_X4, _W4, None, _C6, _C6, _C6, _C6.astype(np.float32)), dict(groups=2),
              TypeError, "'weight' is float64 but 'bn_bias' is float32"),
    _spec.Bad((_X4, _z(6, 2, 3, 3, 1), None, _C6, _C6, _C6, _C6), dict(groups=2), ValueError,
              "argument 'weight' must be 4-D .* or 3-D"),
)
_FOLD_BAD = (
    _spec.Bad((_W4, None, np.ones(3), _C6, _C6, _C6), {}, ValueError,
              r"argument 'bn_mean' must have shape \(6,\)"),
    _spec.Bad((_W4, _z(5), _C6, _C6, _C6, _C6), {}, ValueError,
              r"argument 'bias' must have shape \(6,\)"),
    _spec.Bad((_z(6), None, _C6, _C6, _C6, _C6), {}, ValueError,
              "argument 'weight' must have at least 2 dimensions"),
    _spec.Bad((_W4, None, _C6, _C6, _C6, _C6), dict(eps=-1.0), ValueError,
              "argument 'eps' must be > 0"),
    _spec.Bad((_W4.astype(np.float32), None, _C6, _C6, _C6, _C6), {}, TypeError,
              "'weight' is float32 but 'bn_mean' is float64"),
    _spec.Bad((_W4.astype(np.int64), None, _C6, _C6, _C6, _C6), {}, TypeError,
              "argument 'weight' must be a float32"),
)
# sums of up to 147 products (the 7x7 stem), scaled by batch norm
_TOL = {_spec.F32: (2e-5, 2e-5), _spec.F64: (1e-11, 1e-11)}
_KERNELS = ("conv2d", "im2col", "col2im")
_BN_KERNELS = _KERNELS + ("bn_scale_shift", "fold_weights")
_BN_GRAD = _spec.Grad((0, 1, 2, 3, 4, 5, 6))
_BLAS_PAUSE = "nbops.bench.harness:BLAS_PAUSE"


def _bench(name, setup, baseline, kwargs, **options):
    base = dict(out_like="nbops.bench.conv:out_like", flops="nbops.bench.conv:flops",
                tol=(1e-4, 1e-12), baseline_name="numpy im2col + BLAS")
    return _spec.Bench(f"nbops.bench.conv:{baseline}", name, f"nbops.bench.conv:{setup}",
                       kwargs, options={**base, **options})


SPECS = {s.name: s for s in (
    _spec.OpSpec(
        "conv2d", FAMILY, _KERNELS, backward=_conv_rule(2),
        reference="test_conv:ref_conv2d_op", samples=_sampler(0, _CONV2D),
        bad=lambda dtype: _CONV2D_BAD, grad=_spec.Grad((0, 1, 2)), tol=_TOL,
        bench=(_bench("conv2d_3x3", "setup_3x3", "conv2d_3x3_numpy", dict(padding=1),
                      pause=_BLAS_PAUSE),
               _bench("conv2d_1x1", "setup_1x1", "conv2d_1x1_numpy", {}, pause=_BLAS_PAUSE),
               # einsum runs no BLAS: no pause
               _bench("conv2d_depthwise_3x3", "setup_depthwise", "conv2d_depthwise_numpy",
                      dict(padding=1, groups=32), baseline_name="numpy einsum"))),
    _spec.OpSpec(
        "conv1d", FAMILY, _KERNELS, backward=_conv_rule(1),
        reference="test_conv:ref_conv1d_op", samples=_sampler(1, _CONV1D),
        bad=lambda dtype: _CONV1D_BAD, grad=_spec.Grad((0, 1, 2)), tol=_TOL),
    _spec.OpSpec(
        "conv_relu", FAMILY, _KERNELS, backward=_conv_relu_rule, save=("inputs", "output"),
        reference="test_conv:ref_conv_relu", samples=_sampler(2, _CONV_RELU),
        # (not the first bad input: a 3-D weight makes conv_relu a 1-D convolution)
        bad=lambda dtype: _CONV2D_BAD[1:], grad=_spec.Grad((0, 1, 2)), tol=_TOL),
    _spec.OpSpec(
        "conv_bn", FAMILY, _BN_KERNELS, backward=_conv_bn_rule(False),
        save=("inputs", "output"), reference="test_conv:ref_conv_bn",
        samples=_conv_bn_samples(3), bad=lambda dtype: _BN_BAD, grad=_BN_GRAD, tol=_TOL),
    _spec.OpSpec(
        "conv_bn_relu", FAMILY, _BN_KERNELS, backward=_conv_bn_rule(True),
        save=("inputs", "output"), reference="test_conv:ref_conv_bn_relu",
        samples=_conv_bn_samples(4), bad=lambda dtype: _BN_BAD, grad=_BN_GRAD, tol=_TOL),
    _spec.OpSpec(
        "fold_batch_norm", FAMILY, ("bn_scale_shift", "fold_weights"), backward=_fold_rule,
        reference="test_conv:ref_fold_batch_norm", samples=_fold_samples,
        bad=lambda dtype: _FOLD_BAD, grad=_spec.Grad((0, 1, 2, 3, 4, 5)), tol=_TOL,
        out=False),
)}


# ---------------------------------------------------------------------------
# Public operators


@operator(SPECS["conv2d"])
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, out=None,
           residual=None):
    """2-D convolution (cross-correlation, as ``torch.nn.functional.conv2d``).

    Parameters
    ----------
    x : array (N, C, H, W), float32 or float64, CPU or CUDA
        Any strides (a non-contiguous input is copied once).
    weight : array (CO, C / groups, kH, kW), same dtype and device, or a
        :class:`PackedConv` from :func:`conv_pack` (packed for ``x``'s
        shape, dtype and device): then ``bias`` is None (it is in the
        pack), and stride, padding, dilation and groups are the pack's
        (any other than the defaults must equal them).
    bias : array (CO,), optional
    stride, dilation : int or pair of ints, each >= 1
    padding : int, pair of ints (>= 0), "valid" (no padding) or "same"
        (output size = input size, stride 1 only; for even effective kernel
        sizes the extra row/column is padded at the bottom/right, as
        PyTorch does).
    groups : int >= 1 dividing both C and CO. ``groups == C`` is a
        depthwise convolution (CO = C * multiplier), which runs its own
        kernel. (An infinite or NaN weight over the zero padding: the CPU
        kernels multiply it by the padding's zeros, which gives NaN, except
        the depthwise kernel at strides of 3 or more; that one and the CUDA
        kernels skip padded positions.)
    out : array (N, CO, OH, OW), optional
        C-contiguous, the result's dtype and device, not overlapping inputs.
    residual : array (N, CO, OH, OW), optional
        Added to the result in the kernel's epilogue (a residual
        connection's shortcut: no separate pass over the output); the
        fused activations of :func:`conv_relu` and :func:`conv_bn_relu`
        apply after it. Same dtype and device; must not overlap ``out``.

    Returns
    -------
    array (N, CO, OH, OW) with ``OH = (H + 2 ph - dh (kH - 1) - 1) // sh + 1``
    (likewise OW), on the inputs' device.

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices, bad ``out`` dtype,
        non-integer stride/padding/dilation/groups.
    ValueError
        ``x`` not 4-D, ``weight`` not 4-D, channels not divisible by
        ``groups`` or not matching ``weight``, ``bias`` not (CO,), stride or
        dilation < 1, negative padding, "same" with a stride, a kernel
        larger than the padded input, a bad ``out``, a ``residual`` not of
        the output's shape.

    Example
    -------
    >>> x = np.ones((1, 1, 3, 3), np.float32); w = np.ones((1, 1, 2, 2), np.float32)
    >>> nbops.conv2d(x, w)
    array([[[[4., 4.],
             [4., 4.]]]], dtype=float32)
    """
    if type(weight) is PackedConv:
        return _conv_packed("conv2d", weight, x, bias, (stride, padding, dilation, groups),
                            None, out, residual)
    return _conv("conv2d", 2, x, weight, bias, None, stride, padding, dilation, groups,
                 None, out, residual=residual)[0]


@operator(SPECS["conv1d"])
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, out=None,
           residual=None):
    """1-D convolution (``torch.nn.functional.conv1d``), on the 2-D kernels
    with a unit height.

    ``x`` (N, C, L), ``weight`` (CO, C / groups, K), ``bias`` (CO,);
    ``stride``, ``dilation`` ints >= 1, ``padding`` an int >= 0, "valid" or
    "same"; ``groups`` as :func:`conv2d`. float32 or float64, CPU or CUDA.
    Returns (N, CO, OL) or writes ``out``; ``residual`` (N, CO, OL) is added
    in the epilogue. ``weight`` may be a :class:`PackedConv` of a 3-D
    weight, as in :func:`conv2d`.

    Raises
    ------
    TypeError, ValueError
        As :func:`conv2d` (with 3-D ``x`` and ``weight``).

    Example
    -------
    >>> nbops.conv1d(np.arange(5.0).reshape(1, 1, 5), np.ones((1, 1, 2)))
    array([[[1., 3., 5., 7.]]])
    """
    if type(weight) is PackedConv:
        return _conv_packed("conv1d", weight, x, bias, (stride, padding, dilation, groups),
                            None, out, residual)
    return _conv("conv1d", 1, x, weight, bias, None, stride, padding, dilation, groups,
                 None, out, residual=residual)[0]


@operator(SPECS["conv_relu"])
def conv_relu(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, out=None,
              residual=None):
    """``relu(conv(x, weight) + bias [+ residual])`` in one kernel: the relu
    (after the residual, as a residual block's) runs in the convolution's
    epilogue on each output tile while it is in cache.

    Arguments, shapes and errors as :func:`conv2d` (4-D ``x``/``weight``)
    or :func:`conv1d` (3-D), chosen by ``weight``'s rank; ``weight`` may be
    a :class:`PackedConv`.

    Raises
    ------
    TypeError, ValueError
        As :func:`conv2d`.

    Example
    -------
    >>> x = np.ones((1, 1, 3, 3), np.float32); w = -np.ones((1, 1, 2, 2), np.float32)
    >>> float(nbops.conv_relu(x, w).max())
    0.0
    """
    if type(weight) is PackedConv:
        return _conv_packed("conv_relu", weight, x, bias, (stride, padding, dilation, groups),
                            "relu", out, residual)
    spatial = _spatial_of(weight)
    return _conv("conv_relu", spatial, x, weight, bias, None, stride, padding, dilation,
                 groups, "relu", out, residual=residual)[0]


@operator(SPECS["conv_bn"])
def conv_bn(x, weight, bias=None, bn_mean=None, bn_var=None, bn_weight=None, bn_bias=None,
            eps=1e-5, stride=1, padding=0, dilation=1, groups=1, out=None, residual=None):
    """Convolution followed by evaluation-mode batch norm, as one kernel:
    ``conv(x, W * s) + (bias - bn_mean) * s + bn_bias`` with
    ``s = bn_weight / sqrt(bn_var + eps)``, folded while the weights are
    packed and added in the epilogue.

    ``bias`` may be None; ``bn_mean``, ``bn_var``, ``bn_weight``,
    ``bn_bias`` are (CO,) arrays of ``x``'s dtype and device; ``eps`` > 0.
    Other arguments as :func:`conv2d` (or :func:`conv1d` for 3-D tensors);
    ``residual`` is added after the batch norm. ``weight`` may be a
    :class:`PackedConv` made with ``batch_norm=``: then ``bias`` and the
    statistics are left out (None), the pack holds them folded.

    Raises
    ------
    TypeError, ValueError
        As :func:`conv2d`, and batch-norm statistics missing, of the wrong
        length, or given with a packed weight (or a pack without a batch
        norm), or a non-positive ``eps``.

    Example
    -------
    >>> x = np.ones((1, 2, 3, 3)); w = np.ones((4, 2, 1, 1)); c = np.ones(4)
    >>> nbops.conv_bn(x, w, None, c, c, c, c, eps=0.0)[0, :, 0, 0]
    array([2., 2., 2., 2.])
    """
    return _conv_bn("conv_bn", x, weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps,
                    stride, padding, dilation, groups, None, out, residual)


@operator(SPECS["conv_bn_relu"])
def conv_bn_relu(x, weight, bias=None, bn_mean=None, bn_var=None, bn_weight=None,
                 bn_bias=None, eps=1e-5, stride=1, padding=0, dilation=1, groups=1, out=None,
                 residual=None):
    """``relu(batch_norm(conv(x, weight, bias)))`` (batch norm in evaluation
    mode) as ONE convolution kernel: the folded weights
    ``weight * bn_weight / sqrt(bn_var + eps)`` are formed while they are
    packed, the folded bias and the relu applied in the epilogue on each
    output tile, and the output written once. Against conv2d, batch_norm and
    relu as three passes it saves two reads and two writes of the output.
    With ``residual``: ``relu(batch_norm(conv(x)) + residual)``, the end of
    a ResNet bottleneck, still one pass (the residual add and relu as a
    separate pass would read two tensors and write one more).

    Arguments as :func:`conv_bn` (``weight`` may be a :class:`PackedConv`
    made with ``batch_norm=``).

    Raises
    ------
    TypeError, ValueError
        As :func:`conv_bn`.

    Example
    -------
    >>> x = np.ones((1, 2, 3, 3)); w = -np.ones((4, 2, 1, 1)); c = np.ones(4)
    >>> nbops.conv_bn_relu(x, w, None, c, c, c, c)[0, :, 0, 0]
    array([0., 0., 0., 0.])
    """
    return _conv_bn("conv_bn_relu", x, weight, bias, bn_mean, bn_var, bn_weight, bn_bias,
                    eps, stride, padding, dilation, groups, "relu", out, residual)


@operator(SPECS["fold_batch_norm"])
def fold_batch_norm(weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps=1e-5):
    """Fold an evaluation-mode batch norm that follows a convolution into the
    convolution's parameters.

    Returns ``(weight', bias')`` with ``weight' = weight * s`` (per output
    channel) and ``bias' = (bias - bn_mean) * s + bn_bias``,
    ``s = bn_weight / sqrt(bn_var + eps)``, so that
    ``conv(x, weight', bias') == batch_norm(conv(x, weight, bias))``.

    Parameters
    ----------
    weight : array (CO, ...) (any rank >= 2), float32 or float64, CPU or CUDA
    bias : array (CO,) or None (zero)
    bn_mean, bn_var, bn_weight, bn_bias : arrays (CO,), same dtype and device
    eps : float > 0

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices.
    ValueError
        ``weight`` of rank < 2, statistics or ``bias`` not of length CO,
        ``eps`` not > 0.

    Example
    -------
    >>> w = np.ones((2, 1, 1, 1)); c = np.ones(2)
    >>> nbops.fold_batch_norm(w, None, 0 * c, c, 2 * c, c, eps=0.0)[1]
    array([1., 1.])
    """
    op = "fold_batch_norm"
    weight = _checks.array(op, "weight", weight)
    if weight.ndim < 2:
        raise ValueError(f"{op}: argument 'weight' must have at least 2 dimensions "
                         f"(out_channels, ...), got shape {tuple(weight.shape)}")
    co = int(weight.shape[0])
    dev, stats = _bn_args(op, weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps, co)
    scale, shift = _scale_shift(dev, weight.dtype, co, stats, eps)
    w = tensor.contiguous(weight)
    folded = _checks.empty(tuple(weight.shape), weight.dtype, dev)
    FAMILY.kernel("fold_weights", dev)(_reshape(w, (co, -1)), scale,
                                       _reshape(folded, (co, -1)))
    return folded, shift


def conv_pack(weight, bias=None, *, input_shape, stride=1, padding=0, dilation=1, groups=1,
              batch_norm=None, eps=1e-5):
    """Prepare a convolution once for inputs of one shape: a
    :class:`PackedConv` that :func:`conv2d`, :func:`conv1d` and
    :func:`conv_relu` (and :func:`conv_bn` / :func:`conv_bn_relu` when it
    folds a batch norm) take in place of ``weight``.

    What does not depend on the input's values is done here, once: the
    argument checks and the geometry, the batch norm folded into weights
    and bias (as :func:`fold_batch_norm`), the weights made C-contiguous in
    the kernel's layout; the first call resolves the algorithm (the
    autotuner's choice for this shape) and keeps it. Each call then checks
    only ``x`` (shape, dtype, device), ``out`` and ``residual``. For
    inference: there is no gradient through a packed weight.

    Parameters
    ----------
    weight : array (CO, C / groups, kH, kW), or (CO, C / groups, k) for a
        1-D convolution; float32 or float64, CPU or CUDA
    bias : array (CO,), optional
    input_shape : tuple of ints
        The shape of the inputs the pack serves, (N, C, H, W) or (N, C, L).
    stride, padding, dilation, groups
        As :func:`conv2d` (:func:`conv1d`).
    batch_norm : (bn_mean, bn_var, bn_weight, bn_bias), optional
        An evaluation-mode batch norm after the convolution, folded in:
        arrays (CO,) of the weight's dtype and device.
    eps : float > 0
        The batch norm's epsilon.

    Returns
    -------
    PackedConv
        It keeps ``weight`` and ``bias`` themselves where they are
        C-contiguous and no batch norm is folded: pack again after changing
        them in place.

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices, an ``input_shape`` that
        is not a tuple of ints, a ``batch_norm`` that is not 4 arrays.
    ValueError
        As :func:`conv2d` for ``input_shape`` (rank, channels, a kernel
        larger than the padded input, bad parameters), and as
        :func:`conv_bn` for the statistics.

    Example
    -------
    >>> w = np.ones((1, 1, 2, 2), np.float32)
    >>> packed = nbops.conv_pack(w, input_shape=(1, 1, 3, 3))
    >>> float(nbops.conv2d(np.ones((1, 1, 3, 3), np.float32), packed).sum())
    16.0
    """
    op = "conv_pack"
    weight = _checks.array(op, "weight", weight)
    if weight.ndim not in (3, 4):
        raise ValueError(f"{op}: argument 'weight' must be 4-D (out_channels, "
                         f"in_channels/groups, kH, kW) or 3-D for 1-D convolutions, got "
                         f"shape {tuple(weight.shape)}")
    spatial = weight.ndim - 2
    if batch_norm is not None:
        if not isinstance(batch_norm, (tuple, list)) or len(batch_norm) != 4:
            raise TypeError(f"{op}: argument 'batch_norm' must be a tuple (bn_mean, bn_var, "
                            f"bn_weight, bn_bias), got {_checks.describe(batch_norm)}")
        weight, bias = fold_batch_norm(weight, bias, *batch_norm, eps=eps)
    elif bias is not None:
        bias = _checks.array(op, "bias", bias)
    _checks.same_dtype(op, weight=weight, bias=bias)
    dev = _dispatch.resolve_device(op, weight=weight, bias=bias)
    if not isinstance(input_shape, (tuple, list)):
        raise TypeError(f"{op}: argument 'input_shape' must be a tuple of ints, got "
                        f"{_checks.describe(input_shape)}")
    shape = tuple(_checks.int_arg(op, f"input_shape[{i}]", v, low=0)
                  for i, v in enumerate(input_shape))
    # a stand-in of the input's shape and no memory: the geometry reads no more
    probe = np.broadcast_to(np.empty((), weight.dtype), shape)
    geo, out_shape = _geometry(op, spatial, probe, weight, stride, padding, dilation, groups)
    if bias is not None and tuple(bias.shape) != (geo.co,):
        raise ValueError(f"{op}: argument 'bias' must have shape ({geo.co},) to match 'weight' "
                         f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
    return PackedConv(tensor.contiguous_array(weight),
                      None if bias is None else tensor.contiguous_array(bias),
                      shape, out_shape, geo, spatial, batch_norm is not None, dev,
                      (stride, padding, dilation, groups))


class PackedConv:
    """A convolution prepared by :func:`conv_pack` for one input shape,
    dtype and device; pass it as the ``weight`` of the conv fronts.

    Attributes (read them, do not set them): ``input_shape``,
    ``output_shape``, ``dtype``, ``device``, ``weight`` and ``bias`` (batch
    norm folded in where ``batch_norm`` is True), ``stride``, ``padding``
    (the leading pads), ``dilation``, ``groups``, ``batch_norm``, ``plan``
    (its :class:`ConvPlan`, from the first call on).
    """

    __slots__ = ("weight", "bias", "input_shape", "output_shape", "dtype", "device",
                 "batch_norm", "_geo", "_kgeo", "_spatial", "_args", "_w4", "_b", "_empty",
                 "_plan", "_kernel")

    def __init__(self, weight, bias, input_shape, output_shape, geo, spatial, batch_norm,
                 device, args):
        self.weight, self.bias = weight, bias
        self.input_shape, self.output_shape = input_shape, output_shape
        self.dtype, self.device, self.batch_norm = weight.dtype, device, batch_norm
        self._geo, self._spatial, self._args = geo, spatial, args
        self._kgeo = tuple(geo)  # the kernels' plain tuple, made once
        self._empty = _checks.empty((0,), weight.dtype, device)
        self._w4 = _as4d(weight, spatial)
        self._b = self._empty if bias is None else bias
        self._plan = self._kernel = None  # the plan, and the kernel with it bound, on first use

    @property
    def plan(self):
        """The :class:`ConvPlan` the pack runs, made on its first call (the
        autotuner's choice for its shape) and kept; None before."""
        return self._plan

    @property
    def stride(self):
        return (self._geo.sh, self._geo.sw)[2 - self._spatial:]

    @property
    def padding(self):
        return (self._geo.ph, self._geo.pw)[2 - self._spatial:]

    @property
    def dilation(self):
        return (self._geo.dh, self._geo.dw)[2 - self._spatial:]

    @property
    def groups(self):
        return self._geo.groups

    def __repr__(self):
        bn = ", batch norm folded" if self.batch_norm else ""
        return (f"PackedConv(weight {tuple(self.weight.shape)}, input {self.input_shape} -> "
                f"{self.output_shape}, stride {self.stride}, padding {self.padding}, "
                f"dilation {self.dilation}, groups {self.groups}, {self.dtype}, "
                f"{self.device}{bn})")


# ---------------------------------------------------------------------------
# Argument handling


def _spatial_of(weight):
    nd = getattr(weight, "ndim", 0)
    return 1 if nd == 3 else 2


class ConvGeometry(NamedTuple):
    """The checked geometry of one convolution (the plan its kernels run),
    built once per call pattern by :func:`_geometry`. A 1-D convolution is
    a 2-D one of unit height: ``h = kh = sh = dh = 1``, ``ph = 0``.

    ``c``, ``h``, ``w``: input channels, height and width; ``kh``, ``kw``:
    kernel height and width; ``sh``, ``sw``: strides; ``ph``, ``pw``: the
    leading (top, left) paddings (with ``padding="same"`` and an even
    kernel the extra row or column is at the bottom or right, and shows
    only in ``oh``, ``ow``); ``dh``, ``dw``: dilations; ``oh``, ``ow``:
    output height and width; ``groups``; ``co``: output channels.

    Kernels (:mod:`nbops.cpu.conv`, :mod:`nbops.cuda.conv`) take it as a
    plain tuple in this order, ``tuple(geo)``: a named tuple is another
    Numba type, and would compile every kernel a second time.
    """

    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int
    groups: int
    co: int

    def padded(self):
        """``(Hp, Wp)``: the zero-padded input plane that holds every
        position a window reads ("same" padding of an even window pads one
        more at the bottom and right than at the top and left); the direct
        kernels compute over it at row pitch ``Wp``."""
        return (max(self.h + 2 * self.ph, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1),
                max(self.w + 2 * self.pw, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1))


def _geometry(op, spatial, x, weight, stride, padding, dilation, groups, names=("x", "weight")):
    """Validated ``(geo, out_shape)``, ``geo`` a :class:`ConvGeometry`;
    ``x`` and ``weight`` need only ``shape`` and ``ndim`` (quant.conv2d
    passes QTensors), ``names`` are theirs in error messages. Remembered
    per call pattern (shapes, and parameters with their types): the checks
    took 15 us a call, a tenth of a depthwise convolution on a 144 x 56 x 56
    map."""
    return _GEOMETRIES.get(
        (op, spatial, tuple(x.shape), tuple(weight.shape))
        + _checks.typed_key(stride, padding, dilation, groups),
        lambda: _check_geometry(op, spatial, x, weight, stride, padding, dilation, groups,
                                names))


_GEOMETRIES = _checks.CheckedCache()


def _check_geometry(op, spatial, x, weight, stride, padding, dilation, groups,
                    names=("x", "weight")):
    xn, wn = names
    rank = spatial + 2
    layout = "(N, C, H, W)" if spatial == 2 else "(N, C, L)"
    wlayout = "(out_channels, in_channels/groups, kH, kW)" if spatial == 2 else \
        "(out_channels, in_channels/groups, k)"
    if x.ndim != rank:
        raise ValueError(f"{op}: argument '{xn}' must be {rank}-D {layout}, got shape "
                         f"{tuple(x.shape)}")
    if weight.ndim != rank:
        raise ValueError(f"{op}: argument '{wn}' must be {rank}-D {wlayout}, got shape "
                         f"{tuple(weight.shape)}")
    groups = _checks.int_arg(op, "groups", groups, low=1)
    n, c = int(x.shape[0]), int(x.shape[1])
    co, cg = int(weight.shape[0]), int(weight.shape[1])
    if c % groups:
        raise ValueError(f"{op}: input channels {c} of '{xn}' are not divisible by groups="
                         f"{groups}")
    if co % groups:
        raise ValueError(f"{op}: output channels {co} of '{wn}' are not divisible by "
                         f"groups={groups}")
    if cg * groups != c:
        raise ValueError(f"{op}: '{wn}' {tuple(weight.shape)} expects {cg * groups} input "
                         f"channels ({cg} per group x groups={groups}) but '{xn}' has {c}")
    # 1-D: a unit stride and dilation and no padding along the unit height
    unit = (1,) * (2 - spatial)
    stride = unit + _checks.int_tuple(op, "stride", stride, spatial, low=1)
    dilation = unit + _checks.int_tuple(op, "dilation", dilation, spatial, low=1)
    hw = tuple(int(s) for s in x.shape[2:]) if spatial == 2 else (1, int(x.shape[2]))
    kk = tuple(int(s) for s in weight.shape[2:]) if spatial == 2 else (1, int(weight.shape[2]))
    eff = tuple(d * (k - 1) + 1 for d, k in zip(dilation, kk))
    if isinstance(padding, str):
        if padding == "valid":
            pad_lo, pad_total = (0, 0), (0, 0)
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{op}: padding='same' needs stride 1, got stride "
                                 f"{stride[-spatial:]}")
            pad_total = tuple(e - 1 for e in eff)
            pad_lo = tuple(t // 2 for t in pad_total)
        else:
            raise ValueError(f"{op}: argument 'padding' must be an int, a tuple of ints, "
                             f"'same' or 'valid', got {padding!r}")
    else:
        pad_lo = (0,) * (2 - spatial) + _checks.int_tuple(op, "padding", padding, spatial,
                                                          low=0)
        pad_total = tuple(2 * p for p in pad_lo)
    for axis in range(2 - spatial, 2):
        if hw[axis] + pad_total[axis] < eff[axis]:
            what = "kernel" if spatial == 1 else ("kernel height", "kernel width")[axis]
            raise ValueError(
                f"{op}: {what} of '{wn}' spans {eff[axis]} (size {kk[axis]}, dilation "
                f"{dilation[axis]}) but the padded input of '{xn}' is only "
                f"{hw[axis] + pad_total[axis]} (size {hw[axis]} + padding {pad_total[axis]})")
    ohw = tuple((hw[a] + pad_total[a] - eff[a]) // stride[a] + 1 for a in range(2))
    geo = ConvGeometry(c, hw[0], hw[1], kk[0], kk[1], stride[0], stride[1], pad_lo[0],
                       pad_lo[1], dilation[0], dilation[1], ohw[0], ohw[1], groups, co)
    out_shape = (n, co) + (ohw if spatial == 2 else ohw[1:])
    return geo, out_shape


# ---------------------------------------------------------------------------
# The plan: which algorithm runs a convolution, and why


class ConvAlgorithm(NamedTuple):
    """One row of :data:`ALGORITHMS`.

    ``name``: what :attr:`ConvPlan.algorithm` says (the CPU kernel entry
    runs the function of that name); ``device``; ``config``: the autotuner
    config's ``"algo"`` that selects it, or None for an algorithm that is
    the only one where it applies (never tuned); ``rule``: its
    applicability rule in words; ``applies(geo, dtype)``: the rule, on the
    geometry the kernels run (:attr:`ConvPlan.kernel_geometry`).
    """

    name: str
    device: str
    config: object
    rule: str
    applies: object


def _subsamples(geo):
    """A strided 1x1 convolution without padding (more than one input
    channel per group) runs as a stride-1 one on the pixels it reads,
    copied out once: every algorithm's fastest path reads them (the implicit
    GEMM in place; docs/benchmarks.md)."""
    return (geo.kh == geo.kw == 1 and geo.ph == geo.pw == 0 and (geo.sh, geo.sw) != (1, 1)
            and geo.c > geo.groups)


def _kernel_geometry(geo, device):
    """The geometry the algorithm runs: ``geo``, or for a subsampled 1x1 the
    stride-1 1x1 over its output's pixels."""
    if device == CPU and _subsamples(geo):
        return ConvGeometry(geo.c, geo.oh, geo.ow, 1, 1, 1, 1, 0, 0, 1, 1, geo.oh, geo.ow,
                            geo.groups, geo.co)
    return geo


def _phases_geometry(geo):
    """The stride-1 geometry of a strided convolution on its padded input
    dealt into sh x sw phases (cpu/conv.py, ``_direct_phases``): phase
    (a, b) of channel c is channel ``(c sh + a) sw + b``, and a window of
    kh x kw taps at dilation (dh, dw) spans ``(kh - 1) dh // sh + 1`` x
    ``(kw - 1) dw // sw + 1`` positions of the phases."""
    g = geo
    khs, kws = (g.kh - 1) * g.dh // g.sh + 1, (g.kw - 1) * g.dw // g.sw + 1
    hs = max(-(-(g.h + 2 * g.ph) // g.sh), g.oh + khs - 1)
    ws = max(-(-(g.w + 2 * g.pw) // g.sw), g.ow + kws - 1)
    return ConvGeometry(g.c * g.sh * g.sw, hs, ws, khs, kws, 1, 1, 0, 0, 1, 1, g.oh, g.ow,
                        g.groups, g.co)


def _grouped(geo, dtype):
    return geo.c // geo.groups > 1


def _direct_rule(geo, dtype):
    # the kernel's last NR-wide tile is moved back to end at the span's end
    nr = FAMILY.kernel("DIRECT_TILES", CPU)[np.dtype(dtype)][1]
    return (geo.sh == 1 and geo.sw == 1 and geo.c // geo.groups > 1
            and geo.oh * geo.padded()[1] >= nr)


def _phases_rule(geo, dtype):
    return ((geo.sh, geo.sw) != (1, 1) and geo.c // geo.groups > 1
            and _direct_rule(_phases_geometry(geo), dtype))


#: Every convolution algorithm with its applicability rule; :func:`plan_conv`
#: takes the first row of the device that applies, among the rows of the
#: config's algorithm where a config is given. The CPU rows are exclusive
#: but for the autotuner's choice among igemm, blas and direct.
ALGORITHMS = (
    ConvAlgorithm("depthwise_padded", CPU, None,
                  "one input channel per group, strides at most 2",
                  lambda g, dt: g.c == g.groups and g.sh <= 2 and g.sw <= 2),
    ConvAlgorithm("depthwise", CPU, None,
                  "one input channel per group, a stride of 3 or more",
                  lambda g, dt: g.c == g.groups and (g.sh > 2 or g.sw > 2)),
    ConvAlgorithm("direct", CPU, "direct",
                  "stride 1, more than one input channel per group, and at least one "
                  "NR-wide tile of output at the padded row pitch (OH * Wp >= NR)",
                  _direct_rule),
    ConvAlgorithm("direct_phases", CPU, "direct",
                  "a stride of 2 or more, more than one input channel per group, and the "
                  "direct rule on the input dealt into stride phases",
                  _phases_rule),
    ConvAlgorithm("igemm", CPU, "igemm", "more than one input channel per group", _grouped),
    ConvAlgorithm("blas", CPU, "blas", "more than one input channel per group", _grouped),
    ConvAlgorithm("cuda_direct", CUDA, None, "every convolution on CUDA", lambda g, dt: True),
)


class ConvPlan(NamedTuple):
    """What one convolution runs, decided once by :func:`plan_conv`; the
    CPU kernel entry (:func:`nbops.cpu.conv.conv2d`) runs it and decides
    nothing.

    ``geometry``: the call's :class:`ConvGeometry`; ``dtype``; ``device``;
    ``algorithm``: a name from :data:`ALGORITHMS`; ``rule``: why it applies
    (its rule in words); ``NC``, ``KC``: the implicit GEMM's blocks (pixels,
    k depth; 0 for the others); ``kernel_geometry``: the plain tuple the
    algorithm runs (``tuple(geometry)``, or, where ``subsample``, the
    stride-1 1x1 on the output's pixels); ``subsample``: a strided 1x1
    without padding whose pixels are copied out first; ``phases``: for
    ``direct_phases``, the plain stride-1 geometry of the input dealt into
    phases, else None.
    """

    geometry: ConvGeometry
    dtype: np.dtype
    device: str
    algorithm: str
    rule: str
    NC: int
    KC: int
    kernel_geometry: tuple
    subsample: bool
    phases: object


def _applicable(geo, dtype, device):
    """The rows of :data:`ALGORITHMS` that apply, in order."""
    run = _kernel_geometry(geo, device)
    return tuple(a for a in ALGORITHMS if a.device == device and a.applies(run, dtype))


@functools.lru_cache(maxsize=1024)
def _tuned_algos(geo, dtype, device):
    """The autotuner config algorithms that apply to a convolution: empty
    where its algorithm is the only one (depthwise, CUDA)."""
    return frozenset(a.config for a in _applicable(geo, dtype, device) if a.config)


@functools.lru_cache(maxsize=1024)
def _config_rule(geo, dtype, device):
    """The autotuner's ``applies`` for a convolution: whether a config's
    algorithm applies to it; None where no algorithm is tuned. One object
    per geometry: the tuner remembers what it accepts."""
    tuned = _tuned_algos(geo, dtype, device)
    return (lambda config: config["algo"] in tuned) if tuned else None


@functools.lru_cache(maxsize=1024)
def _plan(geo, dtype, device, algo, NC, KC):
    """:func:`plan_conv` with the config as its items (hashable: remembered)."""
    dtype = np.dtype(dtype)
    rows = _applicable(geo, dtype, device)
    if algo is None:
        # the only algorithm, else the default config's
        algo = None if any(a.config is None for a in rows) or not rows else \
            DEFAULT_CONFIG["algo"]
        NC, KC = (DEFAULT_CONFIG["NC"], DEFAULT_CONFIG["KC"]) if algo else (0, 0)
    row = next((a for a in rows if a.config == algo), None)
    if row is None:
        known = {a.config for a in ALGORITHMS if a.device == device and a.config}
        fits = ", ".join(a.name for a in rows) or "none"
        if algo not in known:
            names = f"configs name {sorted(known)}" if known else "none is chosen by a config"
            raise ValueError(f"conv plan: no algorithm {algo!r} on {device} ({names}); "
                             f"applicable: {fits}")
        rules = "; ".join(f"{a.name}: {a.rule}" for a in ALGORITHMS if a.config == algo)
        raise ValueError(f"conv plan: algorithm {algo!r} does not apply to {geo} "
                         f"({dtype.name}, {device}); it needs {rules}. Applicable: {fits}")
    run = _kernel_geometry(geo, device)
    return ConvPlan(geo, dtype, device, row.name, row.rule,
                    int(NC) if row.name == "igemm" else 0, int(KC) if row.name == "igemm" else 0,
                    tuple(run), run is not geo,
                    tuple(_phases_geometry(run)) if row.name == "direct_phases" else None)


def plan_conv(geo, dtype, device=CPU, config=None):
    """The :class:`ConvPlan` of a convolution of geometry ``geo`` (a
    :class:`ConvGeometry`) in ``dtype`` (float32 or float64) on ``device``
    ("cpu" or "cuda").

    ``config`` is an autotuner config (``{"algo": ..., "NC": ..., "KC":
    ...}``, see :data:`CONV_CONFIGS`) naming the algorithm where more than
    one applies (CPU, more than one input channel per group); None: the
    only algorithm that applies, else :data:`DEFAULT_CONFIG`'s. ``"direct"``
    plans the direct convolution on the input (stride 1) or on its stride
    phases, whichever applies. The fronts plan through the autotuner,
    which only ever times and chooses configs that apply here.

    Raises
    ------
    ValueError
        ``config`` names an algorithm that does not apply to ``geo`` (the
        message gives its rule and the algorithms that apply), or none
        known on ``device``.

    Example
    -------
    >>> geo, _ = nbops.conv._geometry("conv2d", 2, np.empty((1, 8, 14, 14)),
    ...                               np.empty((8, 8, 3, 3)), 2, 1, 1, 1)
    >>> nbops.conv.plan_conv(geo, np.float32, "cpu", {"algo": "direct"}).algorithm
    'direct_phases'
    """
    if config is None:
        return _plan(geo, np.dtype(dtype), device, None, 0, 0)
    return _plan(geo, np.dtype(dtype), device, config["algo"], config.get("NC", 0),
                 config.get("KC", 0))


def _plan_for(dev, geo, args, n, dtype):
    """The plan of one call with arguments ``args``: the autotuner's choice
    among the configs that apply (it tunes here if the shape is new)."""
    applies = _config_rule(geo, dtype, dev)
    if applies is None:
        return _plan(geo, dtype, dev, None, 0, 0)
    cfg = _cpu_conv.config_for((args, geo), _tuning_key(geo, n, dtype), gpu=False,
                               applies=applies)
    return _plan(geo, dtype, dev, cfg["algo"], cfg["NC"], cfg["KC"])


def _reshape(x, shape):
    return x.reshape(shape) if isinstance(x, np.ndarray) else tensor.reshape(x, shape)


def _as4d(x, spatial):
    """A 3-D (N, C, L) array as (N, C, 1, L); 4-D arrays pass."""
    if spatial == 2:
        return x
    shape = tuple(x.shape)
    return _reshape(x, shape[:2] + (1,) + shape[2:])


def _conv(op, spatial, x, weight, bias, wscale, stride, padding, dilation, groups,
          activation, out, scale_arrays=None, residual=None):
    """Check, allocate and run one convolution kernel; returns ``(out, geo)``."""
    x = _checks.array(op, "x", x)
    weight = _checks.array(op, "weight", weight)
    if bias is not None:
        bias = _checks.array(op, "bias", bias)
    if residual is not None:
        residual = _checks.array(op, "residual", residual)
    _checks.same_dtype(op, x=x, weight=weight, bias=bias, residual=residual)
    dev = _dispatch.resolve_device(op, x=x, weight=weight, bias=bias, out=out,
                                   residual=residual, **(scale_arrays or {}))
    geo, out_shape = _geometry(op, spatial, x, weight, stride, padding, dilation, groups)
    if bias is not None and tuple(bias.shape) != (geo.co,):
        raise ValueError(f"{op}: argument 'bias' must have shape ({geo.co},) to match 'weight' "
                         f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != out_shape:
        raise ValueError(f"{op}: argument 'residual' must have the output's shape "
                         f"{out_shape}, got {tuple(residual.shape)}")
    out = _checks.output(op, out, out_shape, x.dtype, dev,
                         {"x": x, "weight": weight, "bias": bias, "residual": residual})
    empty = _checks.empty((0,), x.dtype, dev)
    xc = _as4d(tensor.contiguous_array(x), spatial)
    wc = _as4d(tensor.contiguous_array(weight), spatial)
    bc = empty if bias is None else tensor.contiguous_array(bias)
    sc = empty if wscale is None else wscale
    o4 = _as4d(out, spatial)
    rc = empty if residual is None else _reshape(tensor.contiguous_array(residual), (-1,))
    args = (xc, wc, sc, bc, o4, tuple(geo), _ACTS[activation], rc)
    if out.size == 0:
        return out, geo
    _launch(op, _kernel_for(dev, geo, args, int(x.shape[0]), x.dtype)[1], args, geo, out, dev)
    return out, geo


def _launch(op, run, args, geo, out, dev):
    """``run(*args)`` with the kernels' working memory (for the geometry
    ``geo``) counted first, and an allocation that fails inside them raised
    under the op's name."""
    _check_workspace(op, geo, out, dev)
    try:
        run(*args)
    except (MemoryError, SystemError) as exc:
        # inside compiled code a MemoryError surfaces as a SystemError caused by it
        if isinstance(exc, SystemError) and not isinstance(exc.__cause__, MemoryError):
            raise
        raise _checks.OutputTooLarge(
            f"{op}: the working memory of a convolution with output {tuple(out.shape)} "
            f"({out.dtype.name}) could not be allocated; check the arguments that set its "
            "size (padding, stride, dilation)") from exc


def _check_workspace(op, geo, out, dev):
    """The CPU kernels pad one image's input planes and stage one image's
    output at a time (cpu/conv.py): count them with the output against the
    machine's memory, where an over-committing OS would accept the buffers
    and kill the process once the kernel writes them."""
    if dev == CUDA:
        return
    padded_w = geo.w + 2 * geo.pw
    per_image = (geo.c * (geo.h + 2 * geo.ph) * padded_w
                 + geo.co * geo.oh * (padded_w + geo.ow))
    item = out.dtype.itemsize
    if per_image * item > (1 << 28):  # small workspaces need no check
        _checks.allocation(op, out.shape, out.dtype, dev, workspace=per_image * item)


def _tuning_key(geo, n, dtype):
    sh, sw = geo.sh, geo.sw
    # both strides in the key: (1, 2) must not share a tuning with (1, 1)
    return dict(n=n, c=geo.c, hw=geo.h * geo.w, co=geo.co, kk=geo.kh * geo.kw,
                stride=sh if sh == sw else f"{sh}x{sw}", groups=geo.groups,
                dtype=_DTYPE_NAMES.get(dtype) or np.dtype(dtype).name)


def _kernel_for(dev, geo, args, n, dtype):
    """``(plan, kernel)``: the plan of ``args`` (of geometry ``geo``, see
    :func:`_plan_for`) and conv.conv2d's kernel with it bound (CUDA's
    has a single algorithm and takes none)."""
    plan = _plan_for(dev, geo, args, n, dtype)
    kernel = FAMILY.kernel("conv2d", dev)
    return plan, (kernel if dev == CUDA else functools.partial(kernel, plan=plan))


_DEFAULT_GEOMETRY = (1, 0, 1, 1)


def _conv_packed(op, pack, x, bias, geometry, activation, out, residual):
    """One call of a :class:`PackedConv`: ``x``, ``out`` and ``residual``
    checked against the pack, then its kernel."""
    if bias is not None:
        raise ValueError(f"{op}: argument 'bias' must be None with a packed weight (the "
                         f"pack holds its bias)")
    x = _checks.array(op, "x", x)
    if x.dtype != pack.dtype:
        raise TypeError(f"{op}: 'x' is {x.dtype} but the weight was packed for {pack.dtype}")
    if tuple(x.shape) != pack.input_shape:
        raise ValueError(f"{op}: 'x' has shape {tuple(x.shape)} but the weight was packed for "
                         f"input shape {pack.input_shape} (pack it for this shape with "
                         f"nbops.conv_pack)")
    if geometry != _DEFAULT_GEOMETRY:
        # those given (not left at their defaults) must make the pack's geometry
        given = tuple(p if g is d else g for g, d, p in zip(geometry, _DEFAULT_GEOMETRY,
                                                            pack._args))
        try:
            same = _geometry(op, pack._spatial, x, pack.weight, *given)[0] == pack._geo
        except (TypeError, ValueError):
            same = False
        if not same:
            raise ValueError(f"{op}: stride/padding/dilation/groups {given} differ from the "
                             f"packed weight's ({pack!r}); leave them out")
    if residual is not None:
        residual = _checks.array(op, "residual", residual)
        _checks.same_dtype(op, x=x, residual=residual)
        if tuple(residual.shape) != pack.output_shape:
            raise ValueError(f"{op}: argument 'residual' must have the output's shape "
                             f"{pack.output_shape}, got {tuple(residual.shape)}")
    dev = _dispatch.resolve_device(op, x=x, out=out, residual=residual)
    if dev != pack.device:
        raise TypeError(f"{op}: 'x' is on {dev} but the weight was packed on {pack.device}")
    out = _checks.output(op, out, pack.output_shape, x.dtype, dev,
                         {"x": x, "weight": pack.weight, "bias": pack.bias,
                          "residual": residual})
    if out.size == 0:
        return out
    spatial = pack._spatial
    rc = pack._empty if residual is None else \
        _reshape(tensor.contiguous_array(residual), (-1,))
    args = (_as4d(tensor.contiguous_array(x), spatial), pack._w4, pack._empty, pack._b,
            _as4d(out, spatial), pack._kgeo, _ACTS[activation], rc)
    if pack._kernel is None:
        pack._plan, pack._kernel = _kernel_for(dev, pack._geo, args, int(x.shape[0]), x.dtype)
    _launch(op, pack._kernel, args, pack._geo, out, dev)
    return out


def _bn_args(op, ref, bias, bn_mean, bn_var, bn_weight, bn_bias, eps, co):
    stats = {"bias": bias, "bn_mean": bn_mean, "bn_var": bn_var, "bn_weight": bn_weight,
             "bn_bias": bn_bias}
    for name, v in stats.items():
        if v is None and name == "bias":
            continue
        v = stats[name] = _checks.array(op, name, v)
        if tuple(v.shape) != (co,):
            raise ValueError(f"{op}: argument '{name}' must have shape ({co},) (one value per "
                             f"output channel), got {tuple(v.shape)}")
    _checks.same_dtype(op, weight=ref, **stats)
    dev = _dispatch.resolve_device(op, weight=ref, **stats)
    _checks.scalar(op, "eps", eps, low=0.0, low_open=True)
    return dev, {k: (None if v is None else tensor.contiguous_array(v))
                 for k, v in stats.items()}


def _scale_shift(dev, dtype, co, stats, eps):
    scale = _checks.empty((co,), dtype, dev)
    shift = _checks.empty((co,), dtype, dev)
    bias = stats["bias"] if stats["bias"] is not None else _checks.empty((0,), dtype, dev)
    FAMILY.kernel("bn_scale_shift", dev)(
        bias, stats["bn_mean"], stats["bn_var"], stats["bn_weight"], stats["bn_bias"],
        float(eps), scale, shift)
    return scale, shift


def _conv_bn(op, x, weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps, stride, padding,
             dilation, groups, activation, out, residual):
    if type(weight) is PackedConv:
        given = [k for k, v in (("bias", bias), ("bn_mean", bn_mean), ("bn_var", bn_var),
                                ("bn_weight", bn_weight), ("bn_bias", bn_bias)) if v is not None]
        if given:
            raise ValueError(f"{op}: with a packed weight {', '.join(given)} must be left out "
                             f"(the pack holds its bias and batch norm folded)")
        if not weight.batch_norm:
            raise ValueError(f"{op}: the packed weight has no batch norm folded in (pack it "
                             f"with nbops.conv_pack(..., batch_norm=(bn_mean, bn_var, "
                             f"bn_weight, bn_bias)))")
        return _conv_packed(op, weight, x, None, (stride, padding, dilation, groups),
                            activation, out, residual)
    weight = _checks.array(op, "weight", weight)
    if weight.ndim not in (3, 4):
        raise ValueError(f"{op}: argument 'weight' must be 4-D (out_channels, "
                         f"in_channels/groups, kH, kW) or 3-D for 1-D convolutions, got "
                         f"shape {tuple(weight.shape)}")
    co = int(weight.shape[0])
    x = _checks.array(op, "x", x)
    _dispatch.resolve_device(op, x=x, weight=weight)
    dev, stats = _bn_args(op, weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps, co)
    scale, shift = _scale_shift(dev, weight.dtype, co, stats, eps)
    return _conv(op, _spatial_of(weight), x, weight, shift, scale, stride, padding, dilation,
                 groups, activation, out, residual=residual)[0]
