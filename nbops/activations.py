"""Activation functions and their backward passes, on CPU and CUDA.

Every function takes a float32 or float64 array of any shape and rank, on
the CPU (``numpy.ndarray``) or on a GPU (any ``__cuda_array_interface__``
array), contiguous or strided, and returns a new C-contiguous array on the
same device, or writes into ``out=`` (which may be the input itself, for an
in-place update). The formulas live in :mod:`nbops._formulas`; the kernels
in ``nbops/cpu/activations.py`` and ``nbops/cuda/activations.py``.

Accuracy: on the CPU the transcendental functions are vectorized
approximations (:mod:`nbops.cpu._approx`) within a few ulp of the float64
reference; on CUDA they are CUDA's math library. Semantics follow PyTorch:
NaN propagates through every function, relu'(0) = 0, sigmoid never
overflows. Differences from PyTorch are listed in each docstring.

Backward functions take the upstream gradient first, then the saved value:
the input ``x`` for every op except ``sigmoid_backward`` and
``tanh_backward``, which take the forward *output* ``y`` (as PyTorch's do).
"""

import numbers

import numpy as np

from . import _checks, _dispatch, _formulas, _spec
from ._dispatch import operator

__all__ = [
    "relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "swish", "softplus", "elu",
    "hardswish", "hardtanh", "relu_backward", "leaky_relu_backward", "sigmoid_backward",
    "tanh_backward", "gelu_backward", "silu_backward", "swish_backward",
    "softplus_backward", "elu_backward", "hardswish_backward", "hardtanh_backward",
]

_CONSTS = {}


def _consts(dtype):
    c = _CONSTS.get(dtype)
    if c is None:
        c = _CONSTS[dtype] = _formulas.consts(dtype)
    return c


def _run_unary(op, kernel_name, x, out, p0=0.0, p1=0.0):
    x = _checks.array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    out = _checks.output(op, out, x.shape, x.dtype, dev, {"x": x}, allow_inplace=("x",))
    return FAMILY.kernel(kernel_name, dev)(
        x, out, _formulas.params(x.dtype, p0, p1), _consts(x.dtype))


def _run_backward(op, kernel_name, grad_output, saved, saved_name, out, p0=0.0, p1=0.0):
    dev, out, p, c, grad_output, saved = _prepare_backward(op, grad_output, saved, saved_name,
                                                           out, p0, p1)
    return FAMILY.kernel(kernel_name, dev)(grad_output, saved, out, p, c)


def _prepare_backward(op, grad_output, saved, saved_name, out, p0=0.0, p1=0.0):
    grad_output = _checks.array(op, "grad_output", grad_output)
    saved = _checks.array(op, saved_name, saved)
    _checks.same_dtype(op, grad_output=grad_output, **{saved_name: saved})
    _checks.same_shape(op, grad_output=grad_output, **{saved_name: saved})
    dev = _dispatch.resolve_device(op, grad_output=grad_output, out=out, **{saved_name: saved})
    out = _checks.output(op, out, saved.shape, saved.dtype, dev,
                         {"grad_output": grad_output, saved_name: saved},
                         allow_inplace=("grad_output", saved_name))
    return (dev, out, _formulas.params(saved.dtype, p0, p1), _consts(saved.dtype),
            grad_output, saved)


def _scalar_value(op, name, value, **limits):
    """A scalar parameter given as a number or a one-element array (as an
    autograd tensor's data is)."""
    if hasattr(value, "shape") and not isinstance(value, numbers.Number):
        if int(np.prod(value.shape)) != 1:
            raise ValueError(f"{op}: argument '{name}' must be a scalar or a one-element "
                             f"array, got shape {tuple(value.shape)}")
        value = float(np.asarray(_dispatch.to_host(value)).reshape(-1)[0])
    return _checks.scalar(op, name, value, **limits)


def _doc(formula, example, notes=""):
    """Docstring of a forward activation from its formula and example."""

    def deco(fn):
        fn.__doc__ = f"""{formula}

    Parameters
    ----------
    x : ndarray or device array, float32 or float64, any shape
        Contiguous or strided; not modified (unless ``out=x``).
    out : array, optional
        C-contiguous array of x's shape, dtype and device to write into;
        ``out=x`` updates in place. Must not otherwise overlap ``x``.
{notes}
    Returns
    -------
    array of x's shape and dtype, on x's device.

    Raises
    ------
    TypeError
        x is not a float32/float64 array, ``out`` has the wrong dtype or
        device, or the arguments are on different devices.
    ValueError
        ``out`` has the wrong shape, is not C-contiguous or partially
        overlaps ``x``; a parameter is out of range.

    Example
    -------
    {example}
    """
        return fn

    return deco


def _doc_backward(forward, saved="x"):
    def deco(fn):
        fn.__doc__ = f"""Gradient of :func:`{forward}` with respect to its input.

    ``grad_output`` and ``{saved}`` (the forward {"output" if saved == "y" else "input"})
    are float32/float64 arrays of one shape, dtype and device; returns
    ``grad_output * d{forward}/dx`` as a new array (or into ``out=``, which
    may be ``grad_output`` itself). Parameters must match the forward call.
    Raises TypeError/ValueError as the forward does, and ValueError when the
    shapes of ``grad_output`` and ``{saved}`` differ.

    Example
    -------
    >>> g = nbops.{fn.__name__}(np.ones(3, np.float32), np.array([-1., 0., 2.], np.float32))
    """
        return fn

    return deco


# ---------------------------------------------------------------------------
# Declarations: one spec per forward op and one per backward op, from a row
# per activation (parameters with their test variants and bad values, what
# the backward saves, kinks of the derivative, typical input magnitude).

FAMILY = _spec.mirror("activations")


def _grad_of(backward, saved, param_names):
    """Autograd rule of a forward op from its backward op (looked up by
    name when the rule runs: the backward ops are defined below)."""
    def rule(ctx, grad):
        value = ctx.output if saved == "y" else ctx.inputs[0]
        fn = globals()[backward]
        return (fn(grad, value, **{k: ctx.kwargs[k] for k in param_names}),)

    return rule


def _swish_rule(ctx, grad):
    gx, gbeta = swish_backward(grad, ctx.inputs[0], ctx.kwargs["beta"])
    return gx, gbeta


_NAN, _INF = float("nan"), float("inf")
_SLOPE_BAD = ((dict(negative_slope=-0.1), ValueError, "negative_slope"),
              (dict(negative_slope="a"), TypeError, "negative_slope"),
              (dict(negative_slope=_NAN), ValueError, "negative_slope"))
_BOUNDS_BAD = ((dict(min_val=2.0), ValueError, r"'min_val' \(2.0\) must be <= 'max_val'"),
               (dict(max_val=_NAN), ValueError, "'max_val' must not be NaN"),
               (dict(min_val="a"), TypeError, "'min_val' must be a real number"),
               (dict(max_val=None), TypeError, "max_val"),
               (dict(min_val=0.0, max_val=-1.0), ValueError, "min_val"))


def _row(name, params=(), variants=({},), bad=(), saved="x", span=8.0, kinks=(),
         extra_kernels=(), bench=({},)):
    """The forward and backward specs of one activation."""
    bname = name + "_backward"
    y = saved == "y"
    rule = _swish_rule if name == "swish" else _grad_of(bname, saved, params)
    forward = _spec.OpSpec(
        name, FAMILY, kernels=(name,) + extra_kernels, backward=rule,
        save=("output",) if y else ("inputs",),
        samples=_spec.Elementwise(1, span, variants),
        bad=_spec.float_only(1, ("x",), bad), grad=_spec.Grad((0,), kinks), inplace=(0,),
        bench=tuple(_spec.Bench(f"nbops.bench.activations:{name}{b.get('suffix', '')}",
                                name=name + b.get("suffix", ""), kwargs=b.get("kwargs", {}),
                                reference=b.get("reference", ""))
                    for b in bench))
    # y-saving backward ops take the forward's output, a value in (0, 1) or (-1, 1)
    lows = {1: (0.0, 1.0) if name == "sigmoid" else (-1.0, 1.0)} if y else {}
    tol = {_spec.F32: (4e-6, 1e-6), _spec.F64: (1e-13, 1e-14)}
    edge = not y      # special values of y lie outside the forward's range
    if name == "swish":
        # grad_beta sums x^2 s (1 - s) over every element: float32 loses
        # digits to cancellation, and inf * 0 makes the reference NaN
        tol, edge, span = {_spec.F32: (1e-4, 1e-5), _spec.F64: (1e-10, 1e-12)}, False, 2.0
    backward = _spec.OpSpec(
        bname, FAMILY, kernels=(bname,) + tuple(k + "_backward" for k in extra_kernels)
        + (("swish_backward_both",) if name == "swish" else ()),
        samples=_spec.Elementwise(2, span, variants, edge, tuple(lows.items())),
        bad=_spec.float_only(2, ("grad_output", saved), bad), tol=tol, inplace=(0, 1),
        bench=tuple(_spec.Bench(f"nbops.bench.activations:{name}{b.get('suffix', '')}_backward",
                                name=f"{name}{b.get('suffix', '')}_backward",
                                setup="nbops.bench.activations:setup_"
                                + ("g_" + name if y else "g_x"),
                                kwargs=b.get("kwargs", {}),
                                reference=b.get("backward_reference", ""),
                                options=b.get("backward_options", {}))
                    for b in bench))
    return {name: forward, bname: backward}


SPECS = {}
for _r in (
        _row("relu", kinks=(0.0,)),
        _row("leaky_relu", ("negative_slope",), ({}, {"negative_slope": 0.2}), _SLOPE_BAD,
             kinks=(0.0,)),
        _row("sigmoid", saved="y", span=20.0),
        _row("tanh", saved="y"),
        _row("gelu", ("approximate",), ({}, {"approximate": "tanh"}),
             ((dict(approximate="erf"), ValueError, "approximate"),),
             extra_kernels=("gelu_tanh",),
             bench=({"reference": "nbops.bench.activations:gelu_ref",
                     "backward_reference": "nbops.bench.activations:gelu_backward_ref"},
                    {"suffix": "_tanh", "kwargs": {"approximate": "tanh"}})),
        _row("silu"),
        _row("swish", ("beta",), ({"beta": 1.7},), ((dict(beta=_INF), ValueError, "beta"),),
             bench=({"kwargs": {"beta": 1.5}, "backward_options": {"tol": (1e-4, 1e-10)}},)),
        _row("softplus", ("beta", "threshold"), ({}, {"beta": 2.0, "threshold": 10.0}),
             ((dict(beta=0.0), ValueError, "beta"), (dict(beta=-1.0), ValueError, "beta")),
             bench=({"reference": "nbops.bench.activations:softplus_ref",
                     "backward_reference": "nbops.bench.activations:softplus_backward_ref"},)),
        _row("elu", ("alpha",), ({}, {"alpha": 0.7}), ((dict(alpha=-1.0), ValueError, "alpha"),),
             kinks=(0.0,)),
        _row("hardswish", kinks=(-3.0, 3.0)),
        _row("hardtanh", ("min_val", "max_val"),
             ({}, {"min_val": 0.0, "max_val": 6.0}, {"min_val": -_INF, "max_val": 0.5}),
             _BOUNDS_BAD, kinks=(-1.0, 1.0, 0.0, 6.0, 0.5))):
    SPECS.update(_r)
del _r


# ---------------------------------------------------------------------------
# Forward operators


@operator(SPECS["relu"])
@_doc("Rectified linear unit, ``max(x, 0)``; NaN stays NaN (as PyTorch).",
      ">>> nbops.relu(np.array([-1.0, 0.0, 2.0]))\n    array([0., 0., 2.])")
def relu(x, out=None):
    return _run_unary("relu", "relu", x, out)


@operator(SPECS["leaky_relu"])
@_doc("Leaky ReLU, ``x if x > 0 else negative_slope * x``.",
      ">>> nbops.leaky_relu(np.array([-1.0, 2.0]), 0.1)\n    array([-0.1,  2. ])",
      "    negative_slope : float, default 0.01\n"
      "        Finite and >= 0 (PyTorch also accepts negative slopes).\n")
def leaky_relu(x, negative_slope=0.01, out=None):
    s = _checks.scalar("leaky_relu", "negative_slope", negative_slope, low=0.0)
    return _run_unary("leaky_relu", "leaky_relu", x, out, s)


@operator(SPECS["sigmoid"])
@_doc("Logistic sigmoid ``1 / (1 + exp(-x))``, computed from ``exp(-|x|)`` so that it "
      "never overflows: any finite x gives a value in [0, 1], never NaN.",
      ">>> nbops.sigmoid(np.array([-1e4, 0.0, 1e4], np.float32))\n"
      "    array([0. , 0.5, 1. ], dtype=float32)")
def sigmoid(x, out=None):
    return _run_unary("sigmoid", "sigmoid", x, out)


@operator(SPECS["tanh"])
@_doc("Hyperbolic tangent, accurate for tiny |x| as well (through expm1).",
      ">>> nbops.tanh(np.array([0.0, 1.0]))\n    array([0.        , 0.76159416])")
def tanh(x, out=None):
    return _run_unary("tanh", "tanh", x, out)


@operator(SPECS["gelu"])
@_doc("Gaussian error linear unit ``x * Phi(x)``.\n\n"
      "    ``approximate=\"none\"`` is the exact form ``x Phi(x)`` (equal to\n"
      "    ``0.5 x (1 + erf(x / sqrt 2))``), with Phi accurate to a few ulp relative in the\n"
      "    negative tail too (CPU: :func:`nbops.cpu._approx.ndtr`, fitted in x so that no\n"
      "    rounded ``x / sqrt 2`` is amplified; CUDA: ``erfc``);\n"
      "    ``approximate=\"tanh\"`` is ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``,\n"
      "    evaluated as ``x * sigmoid(2 u)`` to avoid cancellation.",
      ">>> nbops.gelu(np.array([-1.0, 0.0, 1.0]))\n    array([-0.15865525,  0.        ,  0.84134475])",
      "    approximate : {\"none\", \"tanh\"}, default \"none\"\n")
def gelu(x, approximate="none", out=None):
    kernel = _gelu_kernel("gelu", approximate)
    return _run_unary("gelu", kernel, x, out)


@operator(SPECS["silu"])
@_doc("Sigmoid linear unit ``x * sigmoid(x)`` (swish with beta = 1).",
      ">>> nbops.silu(np.array([-1.0, 1.0]))\n    array([-0.26894142,  0.73105858])")
def silu(x, out=None):
    return _run_unary("silu", "silu", x, out)


@operator(SPECS["swish"])
@_doc("Swish ``x * sigmoid(beta * x)``; differentiable in x and in beta.",
      ">>> nbops.swish(np.array([-1.0, 1.0]), beta=2.0)\n    array([-0.11920292,  0.88079708])",
      "    beta : float or one-element array, default 1.0\n        Any finite value.\n")
def swish(x, beta=1.0, out=None):
    b = _scalar_value("swish", "beta", beta)
    return _run_unary("swish", "swish", x, out, b)


@operator(SPECS["softplus"])
@_doc("Softplus ``log(1 + exp(beta x)) / beta``, linear (``x``) where ``beta x > threshold``, "
      "as PyTorch.",
      ">>> nbops.softplus(np.array([0.0, 30.0]))\n    array([ 0.69314718, 30.        ])",
      "    beta : float > 0, default 1.0\n    threshold : float, default 20.0\n")
def softplus(x, beta=1.0, threshold=20.0, out=None):
    b = _checks.scalar("softplus", "beta", beta, low=0.0, low_open=True)
    t = _checks.scalar("softplus", "threshold", threshold)
    return _run_unary("softplus", "softplus", x, out, b, t)


@operator(SPECS["elu"])
@_doc("Exponential linear unit ``x if x > 0 else alpha * (exp(x) - 1)`` (via expm1).",
      ">>> nbops.elu(np.array([-1.0, 2.0]))\n    array([-0.63212056,  2.        ])",
      "    alpha : float, default 1.0\n        Finite and >= 0.\n")
def elu(x, alpha=1.0, out=None):
    a = _checks.scalar("elu", "alpha", alpha, low=0.0)
    return _run_unary("elu", "elu", x, out, a)


@operator(SPECS["hardswish"])
@_doc("Hard swish ``x * relu6(x + 3) / 6`` (MobileNetV3).",
      ">>> nbops.hardswish(np.array([-4.0, 1.0, 4.0]))\n    array([-0.        ,  0.66666667,  4.        ])")
def hardswish(x, out=None):
    return _run_unary("hardswish", "hardswish", x, out)


@operator(SPECS["hardtanh"])
@_doc("Hard tanh, ``x`` clipped to ``[min_val, max_val]`` (PyTorch's name and defaults; "
      "ONNX's Clip, ``relu6`` with (0, 6)); NaN stays NaN.",
      ">>> nbops.hardtanh(np.array([-2.0, 0.5, 9.0]), 0.0, 6.0)\n    array([0. , 0.5, 6. ])",
      "    min_val, max_val : float, default -1.0 and 1.0\n"
      "        ``min_val <= max_val``; either may be infinite (no bound on that side),\n"
      "        neither NaN.\n")
def hardtanh(x, min_val=-1.0, max_val=1.0, out=None):
    lo, hi = _checks.bounds("hardtanh", "min_val", min_val, "max_val", max_val)
    return _run_unary("hardtanh", "hardtanh", x, out, lo, hi)


def _gelu_kernel(op, approximate):
    _checks.choice(op, "approximate", approximate, ("none", "tanh"))
    base = "gelu" if approximate == "none" else "gelu_tanh"
    return base + ("_backward" if op.endswith("_backward") else "")


# ---------------------------------------------------------------------------
# Backward operators


@operator(SPECS["relu_backward"])
@_doc_backward("relu")
def relu_backward(grad_output, x, out=None):
    return _run_backward("relu_backward", "relu_backward", grad_output, x, "x", out)


@operator(SPECS["leaky_relu_backward"])
@_doc_backward("leaky_relu")
def leaky_relu_backward(grad_output, x, negative_slope=0.01, out=None):
    s = _checks.scalar("leaky_relu_backward", "negative_slope", negative_slope, low=0.0)
    return _run_backward("leaky_relu_backward", "leaky_relu_backward", grad_output, x, "x",
                         out, s)


@operator(SPECS["sigmoid_backward"])
@_doc_backward("sigmoid", saved="y")
def sigmoid_backward(grad_output, y, out=None):
    return _run_backward("sigmoid_backward", "sigmoid_backward", grad_output, y, "y", out)


@operator(SPECS["tanh_backward"])
@_doc_backward("tanh", saved="y")
def tanh_backward(grad_output, y, out=None):
    return _run_backward("tanh_backward", "tanh_backward", grad_output, y, "y", out)


@operator(SPECS["gelu_backward"])
@_doc_backward("gelu")
def gelu_backward(grad_output, x, approximate="none", out=None):
    kernel = _gelu_kernel("gelu_backward", approximate)
    return _run_backward("gelu_backward", kernel, grad_output, x, "x", out)


@operator(SPECS["silu_backward"])
@_doc_backward("silu")
def silu_backward(grad_output, x, out=None):
    return _run_backward("silu_backward", "silu_backward", grad_output, x, "x", out)


@operator(SPECS["swish_backward"])
def swish_backward(grad_output, x, beta=1.0, out=None):
    """Gradients of :func:`swish` with respect to ``x`` and to ``beta``.

    Returns ``(grad_x, grad_beta)``: ``grad_x`` an array like ``x`` (or
    ``out``), ``grad_beta`` a Python float, the sum over all elements of
    ``grad_output * x^2 * s (1 - s)`` with ``s = sigmoid(beta x)``,
    accumulated in float64. Shapes and dtypes as :func:`silu_backward`.

    Raises
    ------
    TypeError, ValueError
        As :func:`silu_backward` does, and for a non-finite ``beta``.

    Example
    -------
    >>> gx, gb = nbops.swish_backward(np.ones(3), np.array([-1.0, 0.0, 2.0]), beta=1.5)
    """
    b = _scalar_value("swish_backward", "beta", beta)
    dev, out, p, c, grad_output, x = _prepare_backward("swish_backward", grad_output, x, "x",
                                                       out, b)
    # one pass over memory for both gradients
    gb = FAMILY.kernel("swish_backward_both", dev)(grad_output, x, out, p, c)
    return out, gb


@operator(SPECS["softplus_backward"])
@_doc_backward("softplus")
def softplus_backward(grad_output, x, beta=1.0, threshold=20.0, out=None):
    b = _checks.scalar("softplus_backward", "beta", beta, low=0.0, low_open=True)
    t = _checks.scalar("softplus_backward", "threshold", threshold)
    return _run_backward("softplus_backward", "softplus_backward", grad_output, x, "x",
                         out, b, t)


@operator(SPECS["elu_backward"])
@_doc_backward("elu")
def elu_backward(grad_output, x, alpha=1.0, out=None):
    a = _checks.scalar("elu_backward", "alpha", alpha, low=0.0)
    return _run_backward("elu_backward", "elu_backward", grad_output, x, "x", out, a)


@operator(SPECS["hardswish_backward"])
@_doc_backward("hardswish")
def hardswish_backward(grad_output, x, out=None):
    return _run_backward("hardswish_backward", "hardswish_backward", grad_output, x, "x", out)


@operator(SPECS["hardtanh_backward"])
def hardtanh_backward(grad_output, x, min_val=-1.0, max_val=1.0, out=None):
    """Gradient of :func:`hardtanh` with respect to its input:
    ``grad_output`` where ``min_val < x < max_val``, else +0.0 (whatever
    ``grad_output`` holds there, inf and NaN included, as PyTorch's
    ``hardtanh_backward``; a NaN ``x`` gives 0, as :func:`relu_backward`).

    ``grad_output`` and ``x`` are float32/float64 arrays of one shape, dtype
    and device. ``x`` may also be the forward's output ``y``: ``min_val < y <
    max_val`` exactly where ``min_val < x < max_val``. Returns a new array
    (or ``out=``, which may be ``grad_output`` or ``x``). Bounds as the
    forward call's. Raises TypeError/ValueError as :func:`hardtanh` does, and
    ValueError when the shapes of ``grad_output`` and ``x`` differ.

    Example
    -------
    >>> nbops.hardtanh_backward(np.ones(3), np.array([-2.0, 0.5, 1.0]))
    array([0., 1., 0.])
    """
    lo, hi = _checks.bounds("hardtanh_backward", "min_val", min_val, "max_val", max_val)
    return _run_backward("hardtanh_backward", "hardtanh_backward", grad_output, x, "x", out,
                         lo, hi)
