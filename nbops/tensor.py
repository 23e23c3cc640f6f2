"""Tensor operators that move data: transpose/permute, cat, split, reshape,
contiguous; on CPU and CUDA, with backward rules.

Dtypes: these operators only move bytes, so they accept bool, every integer
type, float16/32/64 and complex64/128 (NumPy kinds ``b``, ``i``, ``u``,
``f``, ``c``); results keep the input's dtype and nothing is ever cast. Any
rank, including 0-d where the operation has a meaning, and any strides
(negative, zero, or not a multiple of the itemsize).

What comes back:

* :func:`transpose`, :func:`permute` and :func:`cat` always return a new
  C-contiguous array (or fill ``out=``).
* :func:`split` returns views of its input, :func:`reshape` a view when the
  input's strides allow one and otherwise a C-contiguous copy, and
  :func:`contiguous` the input itself when it is already C-contiguous; on a
  GPU the views are Numba device arrays over the same memory.

Every copy is one kernel, ``strided_copy`` (``nbops/cpu/tensor.py``,
``nbops/cuda/tensor.py``), driven by a plan made here: adjacent axes that
both sides traverse alike are merged, and a copy whose source is contiguous
along another axis than the destination becomes a tiled transpose.
"""

import math
import numbers
from collections import namedtuple

import numpy as np

from . import _checks, _dispatch, _layout, _spec
from ._dispatch import operator

__all__ = ["transpose", "permute", "cat", "split", "reshape", "contiguous"]

FAMILY = _spec.mirror("tensor")
_KERNEL = FAMILY.key("strided_copy")

#: Dtypes these operators accept: everything that is a plain number.
DTYPES = tuple(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128))

# The kernels move elements as unsigned integers of the element's width.
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---------------------------------------------------------------------------
# The copy plan shared by every operator


Plan = namedtuple("Plan", "shape dst_strides src_strides axis")


def plan_copy(shape, dst_strides, src_strides, itemsize):
    """How to copy between two layouts of ``shape`` (byte strides).

    Returns ``(plan, word)``: a :class:`Plan` in elements of ``word`` bytes,
    where axes traversed alike by both sides are merged and ``axis`` is the
    axis along which the source is contiguous when the destination is
    contiguous along the last axis instead (a tiled transpose), else -1.
    ``word`` is the itemsize when it is 1, 2, 4 or 8 bytes and divides every
    stride; otherwise the largest of those that divides the itemsize and the
    strides, and the element's words become one more axis (complex128 moves
    as pairs of 8-byte words, a float32 field of a packed record as bytes).
    """
    shape, dst_strides, src_strides = tuple(shape), tuple(dst_strides), tuple(src_strides)
    word = next(w for w in (8, 4, 2, 1)
                if w <= itemsize and all(s % w == 0 for s in dst_strides + src_strides
                                         + (itemsize,)))
    if word != itemsize:
        shape += (itemsize // word,)
        dst_strides, src_strides = dst_strides + (word,), src_strides + (word,)
    cshape, (dst_s, src_s) = _layout.collapse(shape, dst_strides, src_strides)
    dst_s = tuple(s // word for s in dst_s)
    src_s = tuple(s // word for s in src_s)
    axis = -1
    if dst_s[-1] == 1 and src_s[-1] != 1 and 1 in src_s:
        axis = src_s.index(1)
    return Plan(cshape, dst_s, src_s, axis), word


def _flat(x, offset, shape, strides, word):
    """A 1-D buffer of ``word``-byte unsigned integers over the memory that a
    layout of ``x`` (starting ``offset`` bytes in) spans, and the index in it
    of the layout's first element."""
    lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    hi = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
    buf = _layout.strided_view(x, ((hi - lo) // word + 1,), (word,), offset + lo,
                               dtype=_WORDS[word])
    return buf, -lo // word


def _copy(device, dst, src, shape, src_strides, dst_offset=0):
    """Copy the layout ``(shape, src_strides)`` of ``src`` into the
    C-contiguous-rowed region of ``dst`` starting ``dst_offset`` bytes in
    (``dst``'s own strides)."""
    if math.prod(shape) == 0:
        return dst
    itemsize = src.dtype.itemsize
    plan, word = plan_copy(shape, dst.strides, src_strides, itemsize)
    byte_shape = plan.shape
    dbuf, doff = _flat(dst, dst_offset, byte_shape, [s * word for s in plan.dst_strides], word)
    sbuf, soff = _flat(src, 0, byte_shape, [s * word for s in plan.src_strides], word)
    _dispatch.kernel(_KERNEL, device)(dbuf, doff, plan.dst_strides, sbuf, soff,
                                      plan.src_strides, plan.shape, plan.axis)
    return dst


# ---------------------------------------------------------------------------
# Argument checks


def _array(op, name, x):
    return _checks.array(op, name, x, DTYPES)


def _int_sequence(op, name, value):
    """A list of Python ints from a tuple/list/1-D integer array."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{op}: argument '{name}' must be a sequence of ints, "
                        f"got {_checks.describe(value)}")
    # plain ints pass without building the error message's argument name
    return [v if type(v) is int else _checks.int_arg(op, f"{name}[{i}]", v)
            for i, v in enumerate(value)]


def _permutation(op, name, axes, ndim):
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    axes = _int_sequence(op, name, axes)
    if len(axes) != ndim:
        raise ValueError(f"{op}: argument '{name}' must list all {ndim} axes of the array, "
                         f"got {len(axes)}: {tuple(axes)}")
    perm = tuple(a % ndim if -ndim <= a < ndim else _checks.axis(op, f"{name}[{i}]", a, ndim)
                 for i, a in enumerate(axes))
    seen = set()
    for a, p in zip(axes, perm):
        if p in seen:
            raise ValueError(f"{op}: argument '{name}' repeats axis {a} in {tuple(axes)}")
        seen.add(p)
    return perm


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _c_strides(shape, itemsize):
    return _layout._c_strides(tuple(shape), itemsize)


# ---------------------------------------------------------------------------
# Backward rules


def _transpose_rule(ctx, grad):
    x = ctx.inputs[0]
    perm = _permutation("transpose", "axes", ctx.kwargs["axes"], x.ndim)
    return transpose(grad, _inverse(perm)), None, None


def _permute_rule(ctx, grad):
    x = ctx.inputs[0]
    perm = _permutation("permute", "dims", ctx.kwargs["dims"], x.ndim)
    return permute(grad, _inverse(perm)), None, None


def _cat_rule(ctx, grad):
    arrays, axis = ctx.inputs[0], ctx.kwargs["axis"]
    ax = axis % arrays[0].ndim
    return list(split(grad, [a.shape[ax] for a in arrays], ax)), None, None


def _split_rule(ctx, *grads):
    x, axis = ctx.inputs[0], ctx.kwargs["axis"]
    ax = axis % x.ndim
    dev = _dispatch.device_of_array(x)
    pieces = []
    for g, view in zip(grads, ctx.output):
        if g is None:
            g = np.zeros(tuple(view.shape), x.dtype)
            if dev == _dispatch.CUDA:
                g = _dispatch.to_device(g)
        pieces.append(g)
    return cat(pieces, ax), None, None


def _reshape_rule(ctx, grad):
    return reshape(grad, tuple(ctx.inputs[0].shape)), None


def _contiguous_rule(ctx, grad):
    return (grad,)


# ---------------------------------------------------------------------------
# Declarations: samples are float arrays (the op table runs float32 and
# float64; every dtype moves alike, see tests/test_tensor.py), the special
# values as one (2, 11) array; the largest sample of each op that fits the
# CUDA simulator is square where the op allows it, so that the shared out=
# checks (layout, read-only, overlap) run on it.

_EXACT = {d: (0.0, 0.0) for d in DTYPES}
_EDGE = np.array(_spec.EDGE_VALUES).reshape(2, 11)


def _one_array_samples(cases, edge):
    """``samples(dtype)``: an array of each ``shape`` followed by ``args``
    and ``kwargs`` for each ``(shape, args, kwargs)`` in ``cases``, then the
    special values with each ``(args, kwargs)`` in ``edge``."""
    def samples(dtype):
        rng = np.random.default_rng(0)
        out = [_spec.Sample((rng.standard_normal(shape).astype(dtype),) + args, dict(kw),
                            f"{shape}{args}{kw}") for shape, args, kw in cases]
        out += [_spec.Sample((_EDGE.astype(dtype),) + args, dict(kw), "edge")
                for args, kw in edge]
        return out

    return samples


_TRANSPOSE_SAMPLES = _one_array_samples(
    (((), (), {}), ((5,), (), {}), ((0,), (), {}), ((11, 11), (), {}),
     ((8, 15), ((1, 0),), {}), ((1, 9), (), {}), ((9, 1), (), {}), ((0, 4), (), {}),
     ((3, 0), ((1, 0),), {}), ((2, 5, 9), ((0, 2, 1),), {}), ((9, 3, 4), ((2, 1, 0),), {}),
     ((3, 4, 5), ((1, 2, 0),), {}), ((3, 4, 5), ((2, 0, 1),), {}),
     ((3, 4, 5), ((1, 0, 2),), {}), ((2, 3, 4, 5), ((3, 1, 0, 2),), {}),
     ((2, 1, 3, 4), ((-1, -2, 0, 1),), {}), ((2, 3, 1, 2, 3), ((4, 0, 3, 1, 2),), {}),
     ((2, 3, 2, 2, 3), (), {}), ((3, 4), (), dict(axes=[1, 0]))),
    (((), {}), (((0, 1),), {})))
_PERMUTE_SAMPLES = _one_array_samples(
    (((2, 3, 4, 5), ((0, 1, 2, 3),), {}), ((2, 3, 4, 5), ((3, 2, 1, 0),), {}),
     ((2, 3, 4, 5), ((1, 3, 0, 2),), {}), ((2, 3, 4, 5), ([-1, 0, -2, 1],), {}),
     ((), ((),), {}), ((0, 3), ((1, 0),), {}), ((5,), ((0,),), {}),
     ((11, 11), ((1, 0),), {}), ((3, 4, 5), (), dict(dims=(2, 0, 1)))),
    ((((1, 0),), {}),))
_RESHAPE_SAMPLES = _one_array_samples(
    (((2, 3, 4), ((6, 4),), {}), ((2, 3, 4), ((-1,),), {}), ((2, 3, 4), (24,), {}),
     ((2, 3, 4), ((4, -1, 2),), {}), ((24,), ((2, 1, 3, 1, 4),), {}), ((1,), ((),), {}),
     ((), ((1, 1),), {}), ((0, 3), ((3, 0),), {}), ((0, 3), ((0,),), {}),
     ((2, 3), ([3, 2],), {}), ((10, 12), ((4, 30),), {}), ((10, 12), (), dict(shape=(-1,)))),
    ((((11, 2),), {}),))
_SPLIT_SAMPLES = _one_array_samples(
    (((10,), (3,), {}), ((10,), ([2, 0, 8],), {}), ((4, 7), (7, 1), {}), ((4, 7), ([4],), {}),
     ((3, 4, 5), ([1, 3, 1], -1), {}), ((3, 4, 5), (2,), dict(axis=1)), ((0, 3), (2,), {}),
     ((6, 2), (1, 0), {}), ((11, 11), ((3, 8),), dict(axis=1))),
    (((2,), {}), (([5, 6],), dict(axis=1))))


def _contiguous_samples(dtype):
    # C-contiguous inputs come back as they are; views (steps, reversed
    # axes, transposes, offsets) as C-contiguous copies
    rng = np.random.default_rng(0)

    def draw(*shape):
        return rng.standard_normal(shape).astype(dtype)

    arrays = (draw(), draw(0), draw(7), draw(11, 11), draw(12, 10)[::2], draw(10, 12).T,
              draw(5, 6)[:, ::-1], draw(3, 4, 5)[1:, :, ::2], draw(6, 0)[::2],
              np.asfortranarray(draw(2, 3, 4)), _EDGE.astype(dtype)[:, ::-2])
    return [_spec.Sample((a,), {}, f"{a.shape}{a.strides}") for a in arrays]


def _cat_samples(dtype):
    rng = np.random.default_rng(0)

    def draw(*shape):
        return rng.standard_normal(shape).astype(dtype)

    edge = _EDGE.astype(dtype)
    cases = (([draw(2, 3), draw(4, 3)], 0),
             ([draw(3, 4, 5), draw(3, 0, 5), draw(3, 2, 5)], 1),
             ([draw(3, 4, 5), draw(3, 4, 1), draw(3, 4, 2)], -1),
             ([draw(2, 3, 4), draw(2, 3, 5)], 2), ([draw(7)], 0),
             ((draw(0), draw(5), draw(0)), 0),  # a tuple, empty pieces
             ([draw(0, 3), draw(0, 3)], 1),
             ([draw(4, 6)[:, ::-2], draw(3, 4).T], 0),  # strided pieces
             ([edge, edge[:, ::-1]], 1), ([edge, edge], 0))
    return [_spec.Sample((arrays,), dict(axis=axis),
                         f"{[tuple(a.shape) for a in arrays]},axis={axis}")
            for arrays, axis in cases]


def _bad(calls):
    """``bad(dtype)`` from ``calls(x, other) -> [(args, kwargs, error, match)]``
    on a (2, 3) array ``x`` of ``dtype`` and one of another float dtype."""
    def bad(dtype):
        x = np.ones((2, 3), dtype)
        other = np.ones((2, 3), np.float64 if np.dtype(dtype) == _spec.F32 else np.float32)
        return [_spec.Bad(*c) for c in calls(x, other)]

    return bad


def _not_an_array(x, other):
    return [(([[1.0, 2.0]],), {}, TypeError, "argument 'x' must be a numpy.ndarray"),
            ((3.0,), {}, TypeError, "argument 'x' must be a numpy.ndarray"),
            ((x.astype(object),), {}, TypeError, "argument 'x' must be a bool"),
            ((x.astype("U1"),), {}, TypeError, "argument 'x' must be a bool")]


def _axes_errors(name):
    def calls(x, other):
        return [(args + ((0, 1),), {}, error, match)
                for args, _, error, match in _not_an_array(x, other)] + [
            ((x, (0, 0)), {}, ValueError, f"argument '{name}' repeats axis 0"),
            ((x, (0, 2)), {}, ValueError, rf"'{name}\[1\]' is 2, out of range"),
            ((x, (0, -3)), {}, ValueError, "out of range"),
            ((x, (0,)), {}, ValueError, "must list all 2 axes"),
            ((x, 1), {}, TypeError, f"'{name}' must be a sequence of ints"),
            ((x, (0, 1.0)), {}, TypeError, rf"'{name}\[1\]' must be an int")]

    return calls


def _permute_errors(x, other):
    return _axes_errors("dims")(x, other) + [
        ((x, None), {}, TypeError, "'dims' must be a sequence of ints, got None")]


def _cat_errors(x, other):
    return [
        ((x,), {}, TypeError, "'arrays' must be a list or tuple"),
        (([],), {}, ValueError, "at least one array"),
        (([x, "a"],), {}, TypeError, r"'arrays\[1\]' must be a numpy.ndarray"),
        (([x, x.astype(object)],), {}, TypeError, r"'arrays\[1\]' must be a bool"),
        (([x, x, other],), {}, TypeError,
         rf"arrays\[2\] is {other.dtype} but arrays\[0\] is {x.dtype}; cast explicitly"),
        (([x, x[0]],), {}, ValueError, r"arrays\[1\] has 1 dimension\(s\) but arrays\[0\] has 2"),
        (([x, np.ones((2, 4), x.dtype)],), {}, ValueError,
         r"arrays\[1\] has shape \(2, 4\).*but axis 0 \(axis 1 differs\)"),
        (([x, x],), dict(axis=2), ValueError, "'axis' is 2, out of range"),
        (([x, x],), dict(axis=1.0), TypeError, "'axis' must be an int"),
        (([np.ones((), x.dtype)],), {}, ValueError, "0-d")]


def _split_errors(x, other):
    return [(args + (2,), {}, error, match) for args, _, error, match in _not_an_array(x, other)
            ] + [
        ((x, 0), {}, ValueError, "the number of sections must be >= 1, got 0"),
        ((x, [1, 2]), {}, ValueError, r"sizes \(1, 2\) add up to 3, but the axis has 2"),
        ((x, [3, -1]), {}, ValueError, "sizes must be >= 0"),
        ((x, 1.5), {}, TypeError, "'sizes_or_sections' must be a sequence of ints"),
        ((x, [1, "a"]), {}, TypeError, r"'sizes_or_sections\[1\]' must be an int"),
        ((x, True), {}, TypeError, "'sizes_or_sections' must be a sequence"),
        ((x, 2), dict(axis=-3), ValueError, "'axis' is -3, out of range"),
        ((x, 2), dict(axis=0.0), TypeError, "'axis' must be an int"),
        ((np.ones((), x.dtype), 1), {}, ValueError, "'x' is 0-d")]


def _reshape_errors(x, other):
    return [(args + (6,), {}, error, match) for args, _, error, match in _not_an_array(x, other)
            ] + [
        ((x, (4, 2)), {}, ValueError, r"\(6 elements\) into shape \(4, 2\) \(8 elements\)"),
        ((x, (-1, -1)), {}, ValueError, "only one dimension can be -1"),
        ((x, (-1, 4)), {}, ValueError, "cannot infer the -1"),
        ((np.ones((0, 2), x.dtype), (0, -1)), {}, ValueError, "cannot infer the -1"),
        ((x, (-2, -3)), {}, ValueError, "dimensions must be >= 0"),
        ((x, "6"), {}, TypeError, "'shape' must be a sequence of ints"),
        ((x, (6.0,)), {}, TypeError, r"'shape\[0\]' must be an int")]


def _bench(name, baseline, setup, kwargs=None, **options):
    return (_spec.Bench(f"nbops.bench.tensor:{baseline}", name, f"nbops.bench.tensor:{setup}",
                        dict(kwargs or {}),
                        options=dict(options, requires=(name,), tol=(0.0, 0.0))),)


def _tensor_spec(name, kernels, rule, samples, bad, grad=True, out=False, save=("inputs",),
                 bench=()):
    return _spec.OpSpec(name, FAMILY, kernels, backward=rule, save=save, dtypes=DTYPES,
                        reference=f"test_tensor:ref_{name}", samples=samples, bad=_bad(bad),
                        grad=_spec.Grad((0,)) if grad else None, tol=_EXACT, out=out,
                        bench=bench)


_COPY = ("strided_copy",)
SPECS = {s.name: s for s in (
    _tensor_spec("transpose", _COPY, _transpose_rule, _TRANSPOSE_SAMPLES, _axes_errors("axes"),
                 out=True, bench=_bench("transpose", "copy_transposed", "setup_matrix",
                                        out_like="nbops.bench.tensor:transposed_like")),
    _tensor_spec("permute", _COPY, _permute_rule, _PERMUTE_SAMPLES, _permute_errors, out=True),
    _tensor_spec("cat", _COPY, _cat_rule, _cat_samples, _cat_errors, out=True,
                 bench=_bench("cat", "concatenate_columns", "setup_halves", dict(axis=1),
                              out_like="nbops.bench.tensor:concatenated_like")),
    _tensor_spec("split", (), _split_rule, _SPLIT_SAMPLES, _split_errors,
                 save=("inputs", "output")),
    _tensor_spec("reshape", _COPY, _reshape_rule, _RESHAPE_SAMPLES, _reshape_errors),
    _tensor_spec("contiguous", _COPY, _contiguous_rule, _contiguous_samples, _not_an_array,
                 bench=_bench("contiguous", "copy_into", "setup_strided")),
)}


# ---------------------------------------------------------------------------
# transpose / permute


def _permute_into(op, x, perm, out):
    dev = _dispatch.resolve_device(op, x=x, out=out)
    shape = tuple(x.shape[p] for p in perm)
    out = _checks.output(op, out, shape, x.dtype, dev, {"x": x})
    return _copy(dev, out, x, shape, [x.strides[p] for p in perm])


@operator(SPECS["transpose"])
def transpose(x, axes=None, out=None):
    """Permute the axes of ``x`` into a new C-contiguous array.

    The result equals ``np.ascontiguousarray(np.transpose(x, axes))`` but is
    always a new array (or ``out``), also when no data would move. On the
    CPU a transpose of two axes runs as cache-blocked tiles spread over the
    threads; on CUDA as shared-memory tiles with coalesced loads and stores.

    Parameters
    ----------
    x : ndarray or device array, any dtype of :data:`DTYPES`, any shape
        Contiguous or strided (negative strides included); not modified.
    axes : sequence of ints, optional
        A permutation of ``range(x.ndim)`` (negative axes count from the
        end); result axis ``i`` is ``x``'s axis ``axes[i]``. Default: the
        axes reversed (the matrix transpose for 2-D ``x``).
    out : array, optional
        C-contiguous array of the result's shape, ``x``'s dtype and device,
        not overlapping ``x``.

    Returns
    -------
    array of shape ``[x.shape[a] for a in axes]``, ``x``'s dtype and device.

    Raises
    ------
    TypeError
        ``x`` is not an array of a supported dtype; ``axes`` is not a
        sequence of ints; ``out`` has the wrong dtype or device.
    ValueError
        ``axes`` has the wrong length, an axis out of range or a repeated
        axis; ``out`` has the wrong shape, is not C-contiguous or overlaps
        ``x``.

    Example
    -------
    >>> nbops.transpose(np.arange(6).reshape(2, 3))
    array([[0, 3],
           [1, 4],
           [2, 5]])
    """
    x = _array("transpose", "x", x)
    perm = _permutation("transpose", "axes", axes, x.ndim)
    return _permute_into("transpose", x, perm, out)


@operator(SPECS["permute"])
def permute(x, dims, out=None):
    """PyTorch's name for :func:`transpose` with explicit axes: a new
    C-contiguous array whose axis ``i`` is ``x``'s axis ``dims[i]``.

    Unlike ``torch.permute`` the result is materialised, not a view. Shapes,
    dtypes and devices as :func:`transpose`; ``dims`` is required.

    Raises
    ------
    TypeError, ValueError
        As :func:`transpose`, naming ``dims`` where it names ``axes``; and
        TypeError when ``dims`` is None.

    Example
    -------
    >>> nbops.permute(np.zeros((2, 3, 4)), (2, 0, 1)).shape
    (4, 2, 3)
    """
    x = _array("permute", "x", x)
    if dims is None:
        raise TypeError("permute: argument 'dims' must be a sequence of ints, got None")
    perm = _permutation("permute", "dims", dims, x.ndim)
    return _permute_into("permute", x, perm, out)


# ---------------------------------------------------------------------------
# cat / split


@operator(SPECS["cat"])
def cat(arrays, axis=0, out=None):
    """Concatenate arrays along an existing axis into a new C-contiguous
    array (``np.concatenate``, ``torch.cat``).

    Parameters
    ----------
    arrays : list or tuple of arrays
        At least one; all of one dtype (no promotion), one device and one
        rank >= 1, with equal sizes on every axis but ``axis``; any
        strides. Empty arrays (size 0 along ``axis``) are allowed.
    axis : int, default 0
        Negative counts from the end.
    out : array, optional
        C-contiguous array of the result's shape, dtype and device, not
        overlapping any input.

    Returns
    -------
    array whose ``axis`` is the sum of the inputs' sizes along it.

    Raises
    ------
    TypeError
        ``arrays`` is not a list/tuple, an element is not an array of a
        supported dtype, dtypes differ (naming the first array that
        differs, e.g. ``arrays[2]``), arrays are on different devices,
        ``out`` has the wrong dtype or device.
    ValueError
        ``arrays`` is empty, holds 0-d arrays, ranks or shapes differ
        (naming the array and the axis), ``axis`` is out of range, ``out``
        has the wrong shape, is not C-contiguous or overlaps an input.

    Example
    -------
    >>> nbops.cat([np.zeros((1, 2)), np.ones((2, 2))], axis=0).shape
    (3, 2)
    """
    op = "cat"
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{op}: argument 'arrays' must be a list or tuple of arrays, "
                        f"got {_checks.describe(arrays)}")
    if not arrays:
        raise ValueError(f"{op}: argument 'arrays' must hold at least one array, got none")
    named = {f"arrays[{i}]": _array(op, f"arrays[{i}]", a) for i, a in enumerate(arrays)}
    dev = _dispatch.resolve_device(op, out=out, **named)
    arrays = list(named.values())
    first = arrays[0]
    if first.ndim == 0:
        raise ValueError(f"{op}: arrays[0] is 0-d; only arrays of rank >= 1 can be "
                         "concatenated")
    ax = _checks.axis(op, "axis", axis, first.ndim)
    for i, a in enumerate(arrays[1:], 1):
        if a.dtype != first.dtype:
            raise TypeError(f"{op}: arrays[{i}] is {a.dtype} but arrays[0] is {first.dtype}; "
                            "cast explicitly")
        if a.ndim != first.ndim:
            raise ValueError(f"{op}: arrays[{i}] has {a.ndim} dimension(s) but arrays[0] has "
                             f"{first.ndim}")
        for k in range(first.ndim):
            if k != ax and a.shape[k] != first.shape[k]:
                raise ValueError(
                    f"{op}: arrays[{i}] has shape {tuple(a.shape)}, arrays[0] has "
                    f"{tuple(first.shape)}: sizes must match on every axis but axis {ax} "
                    f"(axis {k} differs)")
    shape = list(first.shape)
    shape[ax] = sum(a.shape[ax] for a in arrays)
    out = _checks.output(op, out, shape, first.dtype, dev, named)
    start = 0
    for a in arrays:
        _copy(dev, out, a, a.shape, a.strides, start * out.strides[ax])
        start += a.shape[ax]
    return out


def _split_sizes(op, sizes_or_sections, n):
    if isinstance(sizes_or_sections, numbers.Integral) and not isinstance(
            sizes_or_sections, (bool, np.bool_)):
        sections = int(sizes_or_sections)
        if sections < 1:
            raise ValueError(f"{op}: the number of sections must be >= 1, got {sections}")
        q, r = divmod(n, sections)
        return [q + 1] * r + [q] * (sections - r)
    sizes = _int_sequence(op, "sizes_or_sections", sizes_or_sections)
    if any(s < 0 for s in sizes):
        raise ValueError(f"{op}: sizes must be >= 0, got {tuple(sizes)}")
    if sum(sizes) != n:
        raise ValueError(f"{op}: sizes {tuple(sizes)} add up to {sum(sizes)}, but the axis "
                         f"has {n} element(s)")
    return sizes


def _slice_view(x, axis, start, size):
    """``x`` restricted to ``start:start + size`` along ``axis``, as a view."""
    if isinstance(x, np.ndarray):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + size)
        return x[tuple(index)]
    shape = list(x.shape)
    shape[axis] = size
    return _layout.strided_view(x, shape, x.strides, start * x.strides[axis] if size else 0)


@operator(SPECS["split"])
def split(x, sizes_or_sections, axis=0):
    """Split ``x`` along ``axis`` into a tuple of views.

    ``sizes_or_sections`` is either

    * a list/tuple of sizes (PyTorch's ``torch.split`` with a list): pieces
      of exactly those sizes, which must be >= 0 and add up to
      ``x.shape[axis]``; or
    * an int ``n`` >= 1: exactly ``n`` pieces whose sizes differ by at most
      one, the larger ones first (``np.array_split``; NumPy and PyTorch
      disagree here: ``torch.split(x, n)`` means pieces *of size* ``n`` and
      ``torch.chunk`` may return fewer than ``n`` pieces).

    The pieces are views of ``x`` (writing to them writes to ``x``); on a GPU,
    Numba device arrays over ``x``'s memory. An ``x`` in non-native byte
    order is converted first (one copy): the pieces are views of the copy.

    Parameters
    ----------
    x : ndarray or device array of rank >= 1, any dtype of :data:`DTYPES`
    sizes_or_sections : int or sequence of ints
    axis : int, default 0

    Returns
    -------
    tuple of arrays, ``x``'s dtype and device.

    Raises
    ------
    TypeError
        ``x`` is not an array of a supported dtype; ``sizes_or_sections``
        is neither an int nor a sequence of ints; ``axis`` is not an int.
    ValueError
        ``x`` is 0-d, ``axis`` is out of range, sections < 1, a negative
        size, or sizes that do not add up to ``x.shape[axis]``.

    Example
    -------
    >>> [p.tolist() for p in nbops.split(np.arange(5), [2, 3])]
    [[0, 1], [2, 3, 4]]
    >>> [p.tolist() for p in nbops.split(np.arange(5), 2)]
    [[0, 1, 2], [3, 4]]
    """
    op = "split"
    x = _array(op, "x", x)
    _dispatch.resolve_device(op, x=x)
    if x.ndim == 0:
        raise ValueError(f"{op}: argument 'x' is 0-d; only arrays of rank >= 1 can be split")
    ax = _checks.axis(op, "axis", axis, x.ndim)
    sizes = _split_sizes(op, sizes_or_sections, x.shape[ax])
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]]).tolist()
    return tuple(_slice_view(x, ax, s, n) for s, n in zip(starts, sizes))


# ---------------------------------------------------------------------------
# reshape / contiguous


def _target_shape(op, shape, size, old_shape):
    if isinstance(shape, numbers.Integral) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    dims = _int_sequence(op, "shape", shape)
    unknown = [i for i, d in enumerate(dims) if d == -1]
    if len(unknown) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got shape {tuple(dims)}")
    if any(d < -1 for d in dims):
        raise ValueError(f"{op}: dimensions must be >= 0 (or one -1), got shape {tuple(dims)}")
    known = math.prod(d for d in dims if d != -1)
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"{op}: cannot infer the -1 in {tuple(dims)} for an array of "
                             f"shape {tuple(old_shape)} ({size} elements)")
        dims[unknown[0]] = size // known
    elif known != size:
        raise ValueError(f"{op}: cannot reshape an array of shape {tuple(old_shape)} "
                         f"({size} elements) into shape {tuple(dims)} ({known} elements)")
    return tuple(dims)


def view_strides(old_shape, old_strides, new_shape, itemsize):
    """Byte strides that view ``(old_shape, old_strides)`` as ``new_shape``
    without moving data, or None when no view exists (PyTorch's rule: each
    group of old axes that is contiguous within itself maps onto a group of
    new axes with the same number of elements)."""
    if math.prod(old_shape) <= 1:
        return _c_strides(new_shape, itemsize)
    # size-1 axes carry no layout: drop them from the old side
    old = [(n, s) for n, s in zip(old_shape, old_strides) if n != 1]
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_stride = old[-1][1]
    tensor_numel = 1
    view_numel = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_numel *= old[d][0]
        if d == 0 or old[d - 1][1] != tensor_numel * chunk_stride:
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_stride = old[d - 1][1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


@operator(SPECS["reshape"])
def reshape(x, shape):
    """``x`` with a new shape: a view when ``x``'s strides allow one (always
    for C-contiguous ``x``), otherwise a C-contiguous copy, as
    ``torch.reshape``; always a native copy of an ``x`` in non-native byte
    order.

    Parameters
    ----------
    x : ndarray or device array, any dtype of :data:`DTYPES`, any shape
    shape : int or sequence of ints
        The new shape, with as many elements as ``x``; one entry may be -1
        and is then inferred.

    Returns
    -------
    array of ``shape``, ``x``'s dtype and device (a Numba device array over
    ``x``'s memory for a device view).

    Raises
    ------
    TypeError
        ``x`` is not an array of a supported dtype; ``shape`` is not an int
        or a sequence of ints.
    ValueError
        More than one -1, a dimension < -1, a -1 that cannot be inferred
        (``x`` has no elements, or the size does not divide), or a shape
        with a different number of elements.

    Example
    -------
    >>> nbops.reshape(np.arange(6), (2, -1))
    array([[0, 1, 2],
           [3, 4, 5]])
    """
    op = "reshape"
    x = _array(op, "x", x)
    dev = _dispatch.resolve_device(op, x=x)
    new_shape = _target_shape(op, shape, math.prod(x.shape), x.shape)
    strides = None
    if not _layout.is_c_contiguous(x):
        strides = view_strides(tuple(x.shape), tuple(x.strides), new_shape, x.dtype.itemsize)
        if strides is None:
            x = _contiguous_copy(x, dev)
    if isinstance(x, np.ndarray):
        if strides is None:  # contiguous: NumPy's own view, cheaper than as_strided
            return x.reshape(new_shape)
        return np.lib.stride_tricks.as_strided(x, new_shape, strides,
                                               writeable=x.flags.writeable)
    return _layout.strided_view(x, new_shape, strides or _c_strides(new_shape,
                                                                    x.dtype.itemsize))


def _contiguous_copy(x, dev):
    out = _checks.empty(tuple(x.shape), x.dtype, dev)
    return _copy(dev, out, x, x.shape, x.strides)


@operator(SPECS["contiguous"])
def contiguous(x):
    """``x`` itself if it is C-contiguous, else a C-contiguous copy on the
    same device (``torch.Tensor.contiguous``, ``np.ascontiguousarray``).

    Parameters
    ----------
    x : ndarray or device array, any dtype of :data:`DTYPES`, any shape and
        strides (negative and zero strides included).

    Returns
    -------
    ``x``, or a new C-contiguous array of ``x``'s shape, dtype and device.

    Raises
    ------
    TypeError
        ``x`` is not an array of a supported dtype.

    Example
    -------
    >>> a = np.arange(6).reshape(2, 3)
    >>> nbops.contiguous(a) is a, nbops.contiguous(a.T).flags.c_contiguous
    (True, True)
    """
    x = _array("contiguous", "x", x)
    dev = _dispatch.resolve_device("contiguous", x=x)
    if _layout.is_c_contiguous(x):
        return x
    return _contiguous_copy(x, dev)


def contiguous_array(x):
    """:func:`contiguous` for nbops' own front ends, on arrays they have
    checked: ``x`` itself where it is C-contiguous without going through
    the dispatcher (a batch-1 network makes dozens of these calls per
    layer; the dispatch cost conv2d 15 us a call), else ``contiguous(x)``."""
    return x if _layout.is_c_contiguous(x) else contiguous(x)
