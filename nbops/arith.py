"""Elementwise arithmetic and reductions on both devices, with backward rules.

These are the operators behind :class:`nbops.Tensor` arithmetic (NumPy
arrays have it already; Numba device arrays do not): broadcasting ``add``,
``sub``, ``mul``, ``div``, ``pow``, unary ``neg``, ``exp``, ``log``,
``sum``/``mean`` over axes, and the pair that moves gradients across
broadcasting: ``expand`` (materialised broadcast) and ``sum_to`` (its
adjoint, summing a gradient back to an operand's shape).

Operands are float32/float64 arrays of one dtype on one device, or real
Python/NumPy scalars (cast to the array's dtype, as PyTorch does with
Python numbers: ``x32 * 2.0`` stays float32). Results are new C-contiguous
arrays on the operands' device, or ``out=``.

Accuracy: elementwise results are IEEE results of the dtype. Sums on the
CPU are NumPy's (pairwise summation along the fastest axis); on CUDA every
output element accumulates in float64.
"""

import numbers

import numpy as np

from . import _checks, _dispatch, _spec
from ._dispatch import operator

__all__ = ["add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sum", "mean",
           "expand", "sum_to", "zeros", "permute_view", "index_view",
           "assign"]

FAMILY = _spec.mirror("arith")
_dispatch.register_kernels(FAMILY, ("add", "sub", "mul", "div", "pow", "neg", "exp", "log",
                                    "sum", "mean", "copy", "assign"))
# helpers' kernels: private names, so no user op can collide with them


def _is_scalar(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _broadcast_shape(op, **shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError:
        desc = ", ".join(f"'{n}' {tuple(s)}" for n, s in shapes.items())
        raise ValueError(f"{op}: shapes do not broadcast: {desc}") from None


def _operand(v, dtype, device):
    if not _is_scalar(v):
        return v
    if device == _dispatch.CPU:
        return dtype.type(v)
    return _dispatch.to_device(np.array(v, dtype))


def _binary(op, a, b, out):
    arrays = {n: v for n, v in (("a", a), ("b", b)) if not _is_scalar(v)}
    if not arrays:
        # two NumPy scalars compute as NumPy would: as 0-d arrays of their dtype
        arrays = {n: v for n, v in (("a", a), ("b", b)) if isinstance(v, np.generic)}
        if not arrays:
            raise TypeError(f"{op}: at least one of 'a', 'b' must be an array, got "
                            f"{_checks.describe(a)} and {_checks.describe(b)}")
    for name, v in arrays.items():
        arrays[name] = _checks.array(op, name, v)
    a, b = arrays.get("a", a), arrays.get("b", b)
    _checks.same_dtype(op, **arrays)
    dtype = next(iter(arrays.values())).dtype
    dev = _dispatch.resolve_device(op, out=out, **arrays)
    shape = _broadcast_shape(op, **{n: v.shape for n, v in arrays.items()})
    out = _checks.output(op, out, shape, dtype, dev, arrays, allow_inplace=tuple(arrays))
    return FAMILY.kernel(op, dev)(_operand(a, dtype, dev), _operand(b, dtype, dev), out)


def _unary(op, x, out, kernel_name=None):
    x = _checks.array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    out = _checks.output(op, out, x.shape, x.dtype, dev, {"x": x}, allow_inplace=("x",))
    return FAMILY.kernel(kernel_name or op, dev)(x, out)


def _axes(op, axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(sorted(_checks.axis(op, "axis", a, ndim) for a in items))
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: argument 'axis' repeats an axis: {axis!r}")
    return axes


def _reduce(op, x, axis, keepdims, out):
    x = _checks.array(op, "x", x)
    if not isinstance(keepdims, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'keepdims' must be a bool, got {_checks.describe(keepdims)}")
    axes = _axes(op, axis, x.ndim)
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else \
        tuple(n for i, n in enumerate(x.shape) if i not in axes)
    dev = _dispatch.resolve_device(op, x=x, out=out)
    out = _checks.output(op, out, shape, x.dtype, dev, {"x": x})
    return FAMILY.kernel(op, dev)(x, axes, bool(keepdims), out)


def _shape_arg(op, shape):
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise TypeError(f"{op}: argument 'shape' must be a tuple of non-negative ints, "
                        f"got {shape!r}")
    return tuple(int(n) for n in shape)


# ---------------------------------------------------------------------------
# Views and small helpers (no kernels of their own beyond a copy)


def zeros(shape, dtype, device):
    """A C-contiguous array of zeros on ``device`` ("cpu" or "cuda")."""
    if device == _dispatch.CPU:
        return np.zeros(shape, dtype)
    out = _checks.empty(shape, dtype, device)
    return FAMILY.kernel("copy", device)(_operand(0.0, np.dtype(dtype), device), out)


def permute_view(x, axes):
    """A view of ``x`` with its axes permuted (NumPy ``transpose``), on either
    device; no data moves."""
    from . import _layout

    axes = tuple(axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of the "
                         f"{x.ndim} axes of an array of shape {tuple(x.shape)}")
    if isinstance(x, np.ndarray):
        return x.transpose(axes)
    return _layout.strided_view(x, [x.shape[i] for i in axes], [x.strides[i] for i in axes])


def index_view(x, index):
    """``x[index]`` for basic indices (ints, slices, Ellipsis, None) as a view,
    on either device (Numba device arrays turn a full integer index into a
    scalar; this always returns an array)."""
    from . import _layout

    items = index if isinstance(index, tuple) else (index,)
    for it in items:
        if not (it is None or it is Ellipsis or isinstance(it, slice)
                or (isinstance(it, numbers.Integral) and not isinstance(it, bool))):
            raise TypeError(f"getitem: only ints, slices, Ellipsis and None index a "
                            f"tensor, got {_checks.describe(it)}")
    if isinstance(x, np.ndarray):
        view = x[index]
        return view if isinstance(view, np.ndarray) else np.asarray(view)
    # index a zero-size stand-in with x's shape and strides to learn the
    # view's geometry, then build the same view of the device memory
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, x.dtype), x.shape, x.strides)
    v = probe[index]
    offset = v.__array_interface__["data"][0] - probe.__array_interface__["data"][0]
    return _layout.strided_view(x, v.shape, v.strides, offset)


def assign(dst, src):
    """``dst[...] = src`` where ``dst`` may be a strided view (as from
    :func:`index_view`) and ``src`` broadcasts to it; same dtype and device."""
    _checks.same_dtype("assign", dst=dst, src=src)
    dev = _dispatch.resolve_device("assign", dst=dst, src=src)
    return FAMILY.kernel("assign", dev)(src, dst)


def _reshape_keep(g, x_shape, axes):
    """``g`` (a reduction's gradient) with the reduced axes back as size 1."""
    kept = tuple(1 if i in axes else n for i, n in enumerate(x_shape))
    from .tensor import reshape

    return reshape(g, kept) if kept else g


# ---------------------------------------------------------------------------
# Backward rules: (ctx, grad) -> one gradient per input, None for scalars.


def _grad_for(g, operand):
    return None if _is_scalar(operand) else sum_to(g, tuple(operand.shape))


def _needs(ctx, i):
    return ctx.needs_input_grad[i] and not _is_scalar(ctx.inputs[i])


def _add_rule(ctx, g):
    a, b = ctx.inputs[:2]
    return _grad_for(g, a), _grad_for(g, b)


def _sub_rule(ctx, g):
    a, b = ctx.inputs[:2]
    return _grad_for(g, a), (_grad_for(neg(g), b) if _needs(ctx, 1) else None)


def _mul_rule(ctx, g):
    a, b = ctx.inputs[:2]
    return (_grad_for(mul(g, b), a) if _needs(ctx, 0) else None,
            _grad_for(mul(g, a), b) if _needs(ctx, 1) else None)


def _div_rule(ctx, g):
    a, b = ctx.inputs[:2]
    ga = div(g, b)
    # d(a/b)/db = -(a/b)/b
    gb = neg(div(mul(g, ctx.output), b)) if _needs(ctx, 1) else None
    return _grad_for(ga, a), (_grad_for(gb, b) if gb is not None else None)


def _pow_rule(ctx, g):
    a, b = ctx.inputs[:2]
    ga = gb = None
    if _needs(ctx, 0):
        b_minus_1 = b - 1.0 if _is_scalar(b) else sub(b, 1.0)
        ga = _grad_for(mul(g, mul(b, pow(a, b_minus_1))), a)
    if _needs(ctx, 1):
        gb = _grad_for(mul(mul(g, ctx.output), log(a)), b)
    return ga, gb


def _reduce_rule(is_mean):
    def rule(ctx, g):
        x, axis = ctx.inputs[:2]
        axes = _axes("sum", axis, x.ndim)
        gx = expand(_reshape_keep(g, x.shape, axes), tuple(x.shape))
        count = int(np.prod([x.shape[i] for i in axes]))
        if is_mean and count:
            mul(gx, 1.0 / count, out=gx)
        return (gx,)

    return rule


# ---------------------------------------------------------------------------
# Declarations: the binary ops broadcast and take scalars, the unary ops are
# elementwise, the reductions take axes; expand and sum_to move gradients
# across broadcasting.

_BINARY_BAD = (_spec.Bad((1.0, 2.0), {}, TypeError, "at least one of 'a', 'b' must be an array"),)
_REDUCE_BAD = ((dict(axis=5), ValueError, "axis"), (dict(axis=(0, 0)), ValueError,
                                                    "repeats an axis"),
               (dict(keepdims=1), TypeError, "'keepdims' must be a bool"))
_EXACT = {_spec.F32: (0.0, 0.0), _spec.F64: (0.0, 0.0)}
_ROUNDED = {_spec.F32: (2e-6, 1e-30), _spec.F64: (1e-15, 1e-300)}
_SUMMED = {_spec.F32: (1e-5, 1e-4), _spec.F64: (1e-13, 1e-12)}


def _bench(name, setup, **options):
    return (_spec.Bench(f"nbops.bench.arith:{name}", name=name,
                        setup=f"nbops.bench.arith:{setup}", options=options),)


def _binary_spec(name, rule, ranges=(), save=("inputs",), bench=()):
    return _spec.OpSpec(
        name, FAMILY, (name,), backward=rule, save=save,
        samples=_spec.Broadcasting(ranges=ranges),
        bad=_spec.float_only(2, ("a", "b"), _BINARY_BAD, "broadcast"),
        grad=_spec.Grad((0, 1)), tol=_ROUNDED, inplace=(0, 1), bench=bench)


def _unary_spec(name, rule, ranges=(), save=("inputs",), bench=()):
    return _spec.OpSpec(
        name, FAMILY, (name,), backward=rule, save=save,
        samples=_spec.Elementwise(1, 4.0, ranges=ranges), bad=_spec.float_only(1, ("x",)),
        grad=_spec.Grad((0,)), tol=_ROUNDED, inplace=(0,), bench=bench)


def _reduce_spec(name, bench=()):
    return _spec.OpSpec(
        name, FAMILY, (name,), backward=_reduce_rule(name == "mean"),
        samples=_spec.Reduction(), bad=_spec.float_only(1, ("x",), _REDUCE_BAD),
        grad=_spec.Grad((0,)), tol=_SUMMED, bench=bench)


SPECS = {s.name: s for s in (
    _binary_spec("add", _add_rule, bench=_bench("add", "setup_pair")),
    _binary_spec("sub", _sub_rule),
    _binary_spec("mul", _mul_rule, bench=_bench("mul_row", "setup_row")),
    _binary_spec("div", _div_rule, ranges=((1, (0.5, 2.0)),), save=("inputs", "output")),
    _binary_spec("pow", _pow_rule, ranges=((0, (0.5, 2.0)),), save=("inputs", "output")),
    _unary_spec("neg", lambda ctx, g: (neg(g),)),
    _unary_spec("exp", lambda ctx, g: (mul(g, ctx.output),), save=("output",),
                bench=_bench("exp", "setup_x")),
    _unary_spec("log", lambda ctx, g: (div(g, ctx.inputs[0]),), ranges=((0, (0.5, 4.0)),)),
    _reduce_spec("sum", bench=(_spec.Bench(
        "nbops.bench.arith:sum_rows", "sum_rows", "nbops.bench.arith:setup_rows",
        dict(axis=-1), options=dict(out_like="nbops.bench.arith:rows_out", tol=(1e-5, 1e-12))),)),
    _reduce_spec("mean"),
    _spec.OpSpec("expand", FAMILY, ("copy",),
                 backward=lambda ctx, g: (sum_to(g, tuple(ctx.inputs[0].shape)),),
                 samples=_spec.Expansion(), grad=_spec.Grad((0,)), tol=_EXACT,
                 bad=_spec.float_only(1, ("x",), (
                     (dict(shape=(2, 7)), ValueError, "shapes do not broadcast"),
                     (dict(shape="3"), TypeError, "'shape' must be a tuple")),
                     defaults=dict(shape=(3, 4)))),
    _spec.OpSpec("sum_to", FAMILY, (),
                 backward=lambda ctx, g: (expand(g, tuple(ctx.inputs[0].shape)),),
                 samples=_spec.Expansion(reverse=True), grad=_spec.Grad((0,)), tol=_SUMMED,
                 out=False,
                 bad=_spec.float_only(1, ("x",), (
                     (dict(shape=(7, 3, 4)), ValueError, "does not broadcast"),),
                     defaults=dict(shape=(4,)))),
)}


# ---------------------------------------------------------------------------
# Operators


@operator(SPECS["add"])
def add(a, b, out=None):
    """``a + b`` with NumPy broadcasting.

    ``a``, ``b``: float32/float64 arrays of one dtype and device, or one of
    them a real scalar. Returns an array of the broadcast shape; ``out=`` may
    be ``a`` or ``b`` itself (in-place). Raises TypeError for non-float or
    mismatched dtypes and mixed devices, ValueError for shapes that do not
    broadcast.

    >>> nbops.add(np.ones((2, 3)), np.arange(3.0))
    array([[1., 2., 3.],
           [1., 2., 3.]])
    """
    return _binary("add", a, b, out)


@operator(SPECS["sub"])
def sub(a, b, out=None):
    """``a - b`` with broadcasting; arguments and errors as :func:`add`.

    >>> nbops.sub(1.0, np.array([0.5, 2.0]))
    array([ 0.5, -1. ])
    """
    return _binary("sub", a, b, out)


@operator(SPECS["mul"])
def mul(a, b, out=None):
    """``a * b`` with broadcasting; arguments and errors as :func:`add`.

    >>> nbops.mul(np.array([1.0, 2.0]), 3.0)
    array([3., 6.])
    """
    return _binary("mul", a, b, out)


@operator(SPECS["div"])
def div(a, b, out=None):
    """``a / b`` (true division, IEEE: x/0 is +-inf or NaN) with broadcasting;
    arguments and errors as :func:`add`.

    >>> nbops.div(np.array([1.0, 3.0]), 2.0)
    array([0.5, 1.5])
    """
    return _binary("div", a, b, out)


@operator(SPECS["pow"])
def pow(a, b, out=None):  # noqa: A001  (the operator's public name)
    """``a ** b`` with broadcasting (NaN for a negative base and a non-integer
    exponent); arguments and errors as :func:`add`.

    >>> nbops.pow(np.array([2.0, 3.0]), 2.0)
    array([4., 9.])
    """
    return _binary("pow", a, b, out)


@operator(SPECS["neg"])
def neg(x, out=None):
    """``-x`` for a float32/float64 array on either device; ``out=x`` allowed.

    >>> nbops.neg(np.array([1.0, -2.0]))
    array([-1.,  2.])
    """
    return _unary("neg", x, out)


@operator(SPECS["exp"])
def exp(x, out=None):
    """``exp(x)`` elementwise; arguments as :func:`neg`.

    >>> nbops.exp(np.array([0.0]))
    array([1.])
    """
    return _unary("exp", x, out)


@operator(SPECS["log"])
def log(x, out=None):
    """Natural logarithm elementwise (``-inf`` at 0, NaN below); arguments as
    :func:`neg`.

    >>> nbops.log(np.array([1.0]))
    array([0.])
    """
    return _unary("log", x, out)


@operator(SPECS["sum"])
def sum(x, axis=None, keepdims=False, out=None):  # noqa: A001
    """Sum of ``x`` over ``axis`` (None: all axes; an int or a tuple of ints,
    negative counting from the end).

    ``x``: float32/float64 array on either device. Returns an array (0-d for
    a full reduction), with the reduced axes kept as size 1 when
    ``keepdims``. Raises TypeError for a bad dtype or a non-bool
    ``keepdims``, ValueError for an axis out of range or repeated.

    >>> nbops.sum(np.ones((2, 3)), axis=0)
    array([2., 2., 2.])
    """
    return _reduce("sum", x, axis, keepdims, out)


@operator(SPECS["mean"])
def mean(x, axis=None, keepdims=False, out=None):
    """Mean of ``x`` over ``axis``; arguments as :func:`sum`. The mean over an
    empty axis is NaN.

    >>> nbops.mean(np.array([[1.0, 3.0]]), axis=1)
    array([2.])
    """
    return _reduce("mean", x, axis, keepdims, out)


@operator(SPECS["expand"])
def expand(x, shape, out=None):
    """``x`` broadcast to ``shape`` and materialised as a new C-contiguous
    array (NumPy's ``broadcast_to`` followed by a copy), on x's device.
    Raises ValueError when ``x`` does not broadcast to ``shape``.

    >>> nbops.expand(np.array([1.0, 2.0]), (2, 2))
    array([[1., 2.],
           [1., 2.]])
    """
    x = _checks.array("expand", "x", x)
    shape = _shape_arg("expand", shape)
    if _broadcast_shape("expand", x=x.shape, shape=shape) != shape:
        raise ValueError(f"expand: cannot broadcast 'x' of shape {tuple(x.shape)} to {shape}")
    dev = _dispatch.resolve_device("expand", x=x, out=out)
    out = _checks.output("expand", out, shape, x.dtype, dev, {"x": x})
    return FAMILY.kernel("copy", dev)(x, out) if out.size else out


@operator(SPECS["sum_to"])
def sum_to(x, shape):
    """Sum ``x`` down to ``shape``, the inverse of broadcasting: the gradient
    of an operand that was broadcast from ``shape`` to ``x.shape``. Returns
    ``x`` itself when the shapes are equal. Raises ValueError when ``shape``
    does not broadcast to ``x.shape``.

    >>> nbops.sum_to(np.ones((2, 3)), (3,))
    array([2., 2., 2.])
    """
    x = _checks.array("sum_to", "x", x)
    shape = _shape_arg("sum_to", shape)
    if tuple(x.shape) == shape:
        return x
    if len(shape) > x.ndim or _broadcast_shape("sum_to", x=x.shape, shape=shape) != tuple(x.shape):
        raise ValueError(f"sum_to: shape {shape} does not broadcast to the shape "
                         f"{tuple(x.shape)} of 'x'")
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and x.shape[lead + i] != 1)
    summed = sum(x, axis=axes, keepdims=True)
    return summed.reshape(shape)
