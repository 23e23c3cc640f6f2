"""The fuzz table: one row per public operator, driven by tests/test_fuzz.py.

A row says how to draw one call of its operator (shapes including 0 and 1,
parameters inside and outside their ranges), the NumPy reference of a valid
call (from tests/reference.py and the references of the op's own test
file), and the tolerance. The test then varies what every row shares:
dtype (supported or not), strides (negative, sliced, broadcast zero-stride
views, F order), byte order, NumPy scalars for 0-d inputs, special values
(NaN, +-Inf, -0.0, subnormals, huge), and ``out=`` (fresh, aliasing an
input, overlapping, the wrong dtype or layout, read-only).

Until the operators carry their own declarations (the architecture issue),
this table is where they are declared for fuzzing.
"""

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import nbops
import nbops.neuromorphic as nm
import nbops.quant as Q
import nbops.sparse as S
import reference as ref
from test_attention import reference as ref_attention
from test_conv import ref_bn, ref_conv1d, ref_conv2d
from test_normalization import ref_batch_norm, ref_layer_norm
from test_pooling import ref_adaptive_avg_pool2d, ref_avg_pool2d, ref_max_pool2d
from test_quant import avg_pool_reference
from test_quant_gemm import _real, _requant_ref, ref_conv, ref_matmul_integer
from test_neuromorphic import (ANTIDERIVATIVE, SURROGATE_PARAM, _counter_uniform,
                               _smooth_loss, ref_run)
from test_softmax import ref as ref_softmax

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
FLOATS = (F32, F64)
#: dtypes every float op must refuse with a TypeError naming it
BAD_DTYPES = (np.dtype(np.int64), np.dtype(np.float16), np.dtype(np.complex64),
              np.dtype(np.bool_))
#: sizes of one axis: 0 and 1, and sizes either side of the kernels' blocks
SIZES = (0, 1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17)


class Draw:
    """The drawing context of one case: hypothesis' ``data`` for the
    choices worth shrinking, a NumPy generator (seeded from it) for array
    contents, and ``valid``, cleared by every choice outside an argument's
    range (the call must then raise TypeError/ValueError naming the op)."""

    def __init__(self, data, p_bad=0.08):
        self.data = data
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
        self.valid = True
        self.p_bad = p_bad
        self.specials = False

    def int(self, lo, hi):
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.data.draw(st.sampled_from(list(options)))

    def flag(self, p=0.5):
        return self.rng.random() < p

    def bad(self):
        """True (and the case invalid) with a small probability: the row
        then draws the argument from its invalid values."""
        if self.rng.random() < self.p_bad:
            self.valid = False
            return True
        return False

    def param(self, good, bad):
        """One of ``good`` (a callable or a list), or, rarely, of ``bad``."""
        if bad and self.bad():
            return self.choice(bad)
        return good() if callable(good) else self.choice(good)

    def real(self, lo, hi, bad=()):
        return self.param(lambda: float(self.rng.uniform(lo, hi)), bad)

    def size(self, lo=0):
        return self.choice([s for s in SIZES if s >= lo])

    def shape(self, lo_nd, hi_nd, lo=0):
        return tuple(self.size(lo) for _ in range(self.int(lo_nd, hi_nd)))

    def array(self, shape, dtype, low=-3.0, high=3.0, specials=True, huge=True):
        """Uniform values in [low, high), with, in a third of the cases, some
        positions replaced by special values of ``dtype``."""
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        if dtype.kind == "b":
            return self.rng.random(shape) < 0.5
        if dtype.kind in "iu":
            return self.rng.integers(max(low, np.iinfo(dtype).min),
                                     min(high, np.iinfo(dtype).max) + 1, shape).astype(dtype)
        a = self.rng.uniform(low, high, n)
        if specials and dtype.kind == "f" and n and self.flag(1 / 3):
            self.specials = True
            fi = np.finfo(dtype)
            vals = [np.nan, np.inf, -np.inf, -0.0, 0.0, float(fi.smallest_subnormal),
                    -float(fi.smallest_subnormal) * 3]
            if huge:
                vals += [float(fi.max) / 4, -float(fi.max) / 8]
            k = self.rng.integers(1, max(2, n // 3))
            a[self.rng.integers(0, n, k)] = self.rng.choice(vals, k)
        return a.astype(dtype).reshape(shape)


@dataclass
class Case:
    """One drawn call: positional and keyword arguments (arrays among them
    get the shared layout variations unless listed in ``fixed``)."""

    args: list
    kwargs: dict = field(default_factory=dict)
    fixed: tuple = ()


@dataclass
class Row:
    """An operator as the fuzzer sees it.

    ``draw(d, dtype) -> Case``; ``ref(*args, **kwargs)`` gives the expected
    float64 result (an array, or a tuple of arrays) of a valid call, from
    the arguments as they were passed; ``rtol`` per dtype with
    ``atol = rtol * scale``; ``scale(*args, **kwargs)``, where given, bounds
    the rounding of sums (the reference on absolute values). ``out``:
    whether the op takes ``out=``; ``inplace``: the argument indices that
    ``out`` may be exactly. ``result(y)``: what of the op's return to
    compare (default all of it). ``name``: the op's name in its errors."""

    name: str
    family: str
    fn: object
    draw: object
    ref: object
    rtol: dict = field(default_factory=lambda: {F32: 2e-5, F64: 1e-12})
    scale: object = None
    out: bool = True
    inplace: tuple = ()
    dtypes: tuple = FLOATS
    bad_dtypes: tuple = BAD_DTYPES
    result: object = None
    layouts: bool = True
    ref_decides: bool = False


def _f64(x):
    return np.asarray(x, np.float64)


def _abs_args(args):
    return [np.abs(_f64(a)) if isinstance(a, (np.ndarray, np.generic)) and
            np.asarray(a).dtype.kind == "f" else a for a in args]


def _abs_scale(refn):
    """The reference on absolute values: the size of the sums it rounds."""
    def scale(*args, **kwargs):
        with np.errstate(all="ignore"):
            r = refn(*_abs_args(args), **kwargs)
        return r
    return scale


# ---------------------------------------------------------------------------
# Activations: elementwise, any shape; forward and backward


def _unary_draw(params=()):
    def draw(d, dtype):
        x = d.array(d.shape(0, 4), dtype, -8, 8)
        return Case([x], {name: gen(d) for name, gen in params})
    return draw


def _backward_draw(params=(), specials=True, span=8):
    def draw(d, dtype):
        shape = d.shape(0, 3)
        g = d.array(shape, dtype, -2, 2)
        if d.bad():      # shapes that differ
            shape = shape + (2,)
        x = d.array(shape, dtype, -span, span, specials=specials)
        return Case([g, x], {name: gen(d) for name, gen in params})
    return draw


def _slope(d):
    return d.real(0.0, 1.0, bad=(-0.5, np.nan, np.inf, "0.1", True))


def _beta(d):
    return d.real(0.1, 3.0, bad=(0.0, -1.0, np.nan))


def _swish_beta(d):
    return d.real(-2.0, 3.0, bad=(np.nan, np.inf, None))


def _threshold(d):
    return d.real(1.0, 30.0, bad=(np.nan, "20"))


def _alpha(d):
    return d.real(0.0, 2.0, bad=(-1.0, np.inf))


def _min_val(d):
    # valid draws stay <= every valid max_val; 7.0 is above all of them
    return d.real(-3.0, 0.0, bad=(np.nan, 7.0, "-1", True))


def _max_val(d):
    return d.real(0.0, 6.0, bad=(np.nan, -4.0, None))


def _approx(d):
    return d.param(["none", "tanh"], ["erf", None, 1])


ACTIVATIONS = [
    ("relu", ()), ("leaky_relu", (("negative_slope", _slope),)), ("sigmoid", ()),
    ("tanh", ()), ("gelu", (("approximate", _approx),)), ("silu", ()),
    ("swish", (("beta", _swish_beta),)),
    ("softplus", (("beta", _beta), ("threshold", _threshold))),
    ("elu", (("alpha", _alpha),)), ("hardswish", ()),
    ("hardtanh", (("min_val", _min_val), ("max_val", _max_val))),
]


# Gradients that select rather than scale: a NaN upstream gradient where the
# derivative is zero gives 0, as PyTorch's threshold_backward and
# hardswish_backward do (reference.py multiplies, and keeps the NaN)
BACKWARD_REFS = {
    "relu_backward": lambda g, x: np.where(_f64(x) > 0, _f64(g), 0.0),
    "hardswish_backward": lambda g, x: np.where(_f64(x) < -3, 0.0, ref.hardswish_backward(
        g, x)),
    "hardtanh_backward": ref.hardtanh_backward,  # selects already
}


def _activation_rows():
    rows = []
    for name, params in ACTIVATIONS:
        rows.append(Row(name, "activations", getattr(nbops, name), _unary_draw(params),
                        getattr(ref, name), rtol={F32: 3e-5, F64: 1e-11}, inplace=(0,)))
        bname = name + "_backward"
        refb = BACKWARD_REFS.get(bname) or getattr(ref, bname)
        if name == "swish":
            # (grad_x, grad_beta): grad_beta a sum over every element, whose
            # terms x^2 s (1 - s) are inf * 0 at infinite x (NaN in the
            # reference, 0 in the kernel's form): x without special values.
            # |beta x| <= 6: beyond, float32's 1 - s loses the sum's digits
            # (6% off at beta x = 16; docs/reliability.md, left open)
            rows.append(Row(bname, "activations", nbops.swish_backward,
                            _backward_draw(params, specials=False, span=2), refb,
                            rtol={F32: 1e-4, F64: 1e-10}, inplace=(0, 1),
                            scale=_abs_scale(refb)))
            continue
        rows.append(Row(bname, "activations", getattr(nbops, bname), _backward_draw(params),
                        refb, rtol={F32: 5e-5, F64: 1e-11}, inplace=(0, 1)))
    return rows


# ---------------------------------------------------------------------------
# Arithmetic: broadcasting binaries (scalars allowed), unaries, reductions


def _broadcast_pair(d, dtype):
    shape = d.shape(0, 3)
    other = list(shape)
    for i in range(len(other)):
        if d.flag(0.3):
            other[i] = 1
    other = tuple(other[d.int(0, len(other)):]) if other else ()
    if d.flag(0.1):  # shapes that may not broadcast (NumPy's rule decides)
        other = other + (d.choice([2, 3]),)
    a, b = d.array(shape, dtype, -4, 4), d.array(other, dtype, -4, 4)
    if d.flag(0.15):
        b = float(d.rng.uniform(-3, 3))
    elif d.flag(0.1):
        a = float(d.rng.uniform(-3, 3))
    if d.flag(0.5):
        a, b = b, a
    return Case([a, b])


def _reduce_draw(d, dtype):
    x = d.array(d.shape(0, 4), dtype, -4, 4, huge=False)
    nd = x.ndim
    axis = d.choice([None, "one", "tuple"])
    if axis == "one":
        axis = d.param(lambda: d.int(-nd, nd - 1) if nd else None, [nd + 1, -nd - 1, 1.0])
    elif axis == "tuple":
        axis = tuple(sorted({d.int(0, nd - 1) for _ in range(d.int(1, 2))})) if nd else None
        if axis and d.flag(0.3):
            axis = (axis[0] - nd,) + axis[1:]     # negative counts from the end
        if nd and d.bad():
            axis = (0, 0)
    kw = {"axis": axis, "keepdims": d.param([False, True], [1, None])}
    return Case([x], kw)


def _expand_draw(d, dtype):
    shape = tuple(d.choice([1, d.size()]) for _ in range(d.int(0, 3)))
    target = tuple(d.size() if n == 1 else n for n in shape)
    target = tuple(d.size() for _ in range(d.int(0, 2))) + target
    if d.flag(0.1):  # targets that may not broadcast (NumPy's rule decides)
        target = target[:-1] + (target[-1] + 1,) if target and target[-1] > 1 else (-1, 2)
    return Case([d.array(shape, dtype)], {"shape": target})


def _sum_to_draw(d, dtype):
    shape = tuple(d.choice([1, d.size()]) for _ in range(d.int(0, 3)))
    big = tuple(d.size() for _ in range(d.int(0, 2))) + tuple(
        d.size() if n == 1 else n for n in shape)
    if d.bad():
        shape = (7,) + shape
    return Case([d.array(big, dtype, huge=False)], {"shape": shape})


def _arith_rows():
    # the references are the op table's (tests/reference.py: NumPy in float64)
    rows = []
    for name in ("add", "sub", "mul", "div", "pow"):
        rows.append(Row(name, "arith", getattr(nbops, name), _broadcast_pair,
                        getattr(ref, name), rtol={F32: 2e-6, F64: 1e-15}, inplace=(0, 1),
                        ref_decides=True))
    for name in ("neg", "exp", "log"):
        rows.append(Row(name, "arith", getattr(nbops, name), _unary_draw(),
                        getattr(ref, name), rtol={F32: 2e-6, F64: 1e-15}, inplace=(0,)))
    for name in ("sum", "mean"):
        r = getattr(ref, name)
        rows.append(Row(name, "arith", getattr(nbops, name), _reduce_draw, r,
                        rtol={F32: 1e-5, F64: 1e-13}, scale=_abs_scale(r)))
    rows.append(Row("expand", "arith", nbops.expand, _expand_draw, ref.expand,
                    rtol={F32: 0, F64: 0}, ref_decides=True))
    rows.append(Row("sum_to", "arith", nbops.sum_to, _sum_to_draw, ref.sum_to, out=False,
                    rtol={F32: 1e-5, F64: 1e-13}, scale=_abs_scale(ref.sum_to)))
    return rows


# ---------------------------------------------------------------------------
# Tensor: data movement, any dtype


TENSOR_DTYPES = (F32, F64, np.dtype(np.int8), np.dtype(np.int64), np.dtype(np.bool_),
                 np.dtype(np.complex64))
TENSOR_BAD = (np.dtype("M8[s]"), np.dtype("U3"))


def _perm_draw(key):
    def draw(d, dtype):
        x = d.array(d.shape(0, 4), dtype)
        perm = list(d.rng.permutation(x.ndim))
        if key == "axes" and d.flag(0.2):
            perm = None
        elif d.bad():
            perm = perm[:-1] if perm else [0]
        elif perm and d.flag(0.3):
            perm[0] -= x.ndim
        return Case([x], {key: perm if perm is None else tuple(int(p) for p in perm)})
    return draw


def _perm_ref(x, axes=None, dims=None):
    return np.transpose(np.asarray(x), axes if dims is None else dims)


def _cat_draw(d, dtype):
    shape = list(d.shape(1, 3))
    ax = d.int(0, len(shape) - 1)
    arrays = []
    for _ in range(d.int(1, 3)):
        s = list(shape)
        s[ax] = d.size()
        arrays.append(d.array(tuple(s), dtype))
    if d.bad():
        bad = list(arrays[0].shape) + [1]
        arrays.append(d.array(tuple(bad), dtype))
    axis = d.param([ax, ax - len(shape)], [len(shape), 0.0])
    return Case([arrays], {"axis": axis})


def _split_draw(d, dtype):
    x = d.array(d.shape(1, 3), dtype)
    ax = d.int(0, x.ndim - 1)
    n = x.shape[ax]
    if d.flag():
        cuts = sorted(d.int(0, n) for _ in range(d.int(0, 3)))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
        sizes = d.param([sizes], [[n + 1], [-1, n + 1]])
    else:
        sizes = d.param(lambda: d.int(1, max(n, 1)), [0, -2, 1.5])
    return Case([x, sizes], {"axis": ax})


def _split_ref(x, sizes, axis=0):
    x = np.asarray(x)
    if isinstance(sizes, int):
        return tuple(np.array_split(x, sizes, axis=axis))
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _reshape_draw(d, dtype):
    x = d.array(d.shape(0, 3), dtype)
    n = x.size
    shape = [n]
    if n and d.flag():
        a = d.choice([k for k in range(1, n + 1) if n % k == 0])
        shape = [a, n // a]
    if d.flag(0.3):
        shape[d.int(0, len(shape) - 1)] = -1
    if d.bad():
        shape = shape + [2] if n % 2 else [n + 1]
    return Case([x], {"shape": tuple(shape)})


def _tensor_rows():
    common = dict(family="tensor", dtypes=TENSOR_DTYPES, bad_dtypes=TENSOR_BAD,
                  rtol={F32: 0, F64: 0})
    return [
        Row("transpose", fn=nbops.transpose, draw=_perm_draw("axes"), ref=_perm_ref, **common),
        Row("permute", fn=nbops.permute, draw=_perm_draw("dims"), ref=_perm_ref, **common),
        Row("cat", fn=nbops.cat, draw=_cat_draw,
            ref=lambda arrays, axis=0: np.concatenate([np.asarray(a) for a in arrays], axis),
            **common),
        Row("split", fn=nbops.split, draw=_split_draw, ref=_split_ref, out=False, **common),
        Row("reshape", fn=nbops.reshape, draw=_reshape_draw,
            ref=lambda x, shape: np.reshape(np.asarray(x), shape), out=False, **common),
        Row("contiguous", fn=nbops.contiguous, draw=lambda d, t: Case([d.array(
            d.shape(0, 4), t)]), ref=np.asarray, out=False, **common),
    ]


# ---------------------------------------------------------------------------
# Linear algebra


def _matmul_draw(d, dtype):
    m, k, n = d.size(), d.size(), d.size()
    batch = d.shape(0, 2)
    ashape = batch + (m, k) if d.flag(0.8) else (k,)
    bshape = (batch[d.int(0, len(batch)):] if d.flag() else ()) + (k, n) if d.flag(0.8) \
        else (k,)
    if d.flag(0.1):  # shapes that may not multiply (NumPy's rule decides)
        bshape = bshape[:-2] + (k + 1,) + bshape[-1:] if len(bshape) >= 2 else (k + 1,)
    return Case([d.array(ashape, dtype, huge=False), d.array(bshape, dtype, huge=False)],
                {"impl": d.param(["auto", "nbops", "blas"], ["gemm", None])})


def _matmul_ref(a, b, impl="auto"):
    with np.errstate(all="ignore"):
        return _f64(a) @ _f64(b)


def _bmm_draw(d, dtype):
    nb, m, k, n = d.size(), d.size(), d.size(), d.size()
    bshape = (nb, k, n) if not d.bad() else (nb + 1, k, n)
    return Case([d.array((nb, m, k), dtype, huge=False), d.array(bshape, dtype, huge=False)])


def _linear_draw(d, dtype):
    k, n = d.size(), d.size()
    x = d.array(d.shape(0, 2) + (k,), dtype, huge=False)
    w = d.array((n, k) if not d.bad() else (n, k + 1), dtype, huge=False)
    b = d.array((n,), dtype, huge=False) if d.flag() else None
    act = d.param([None, "relu", "gelu", "sigmoid", "tanh"], ["swish2", 3])
    # a strided bias is refused by design ("must be contiguous", test_linalg)
    return Case([x, w, b], {"activation": act}, fixed=(2,))


def _linear_ref(x, w, b=None, activation=None):
    with np.errstate(all="ignore"):
        y = _f64(x) @ _f64(w).T + (0 if b is None else _f64(b))
        return y if activation is None else getattr(ref, activation)(y)


def _linear_scale(x, w, b=None, activation=None):
    with np.errstate(all="ignore"):
        y = np.abs(_f64(x)) @ np.abs(_f64(w)).T + (0 if b is None else np.abs(_f64(b)))
        return y * 2 if activation is not None else y


def _linalg_rows():
    tol = {F32: 2e-5, F64: 1e-13}
    return [
        Row("matmul", "linalg", nbops.matmul, _matmul_draw, _matmul_ref, rtol=tol,
            scale=_abs_scale(_matmul_ref), ref_decides=True),
        Row("bmm", "linalg", nbops.bmm, _bmm_draw, _matmul_ref, rtol=tol,
            scale=_abs_scale(_matmul_ref)),
        Row("linear", "linalg", nbops.linear, _linear_draw, _linear_ref, rtol=tol,
            scale=_linear_scale),
    ]


# ---------------------------------------------------------------------------
# Normalization


def _bn_draw(d, dtype):
    shape = (d.size(1), d.size(1)) + d.shape(0, 2, lo=1)
    c = shape[1]
    x = d.array(shape, dtype, huge=False, specials=False)
    training = d.param([False, True], [1, None])
    rm = d.array((c,), dtype, specials=False)
    rv = d.array((c,), dtype, 0.1, 2.0, specials=False)
    w = d.array((c,), dtype, specials=False) if d.flag() else None
    b = d.array((c,), dtype, specials=False) if d.flag() else None
    if training is True and math.prod(shape) // c <= 1:
        d.valid = False
    kw = {"training": training, "momentum": d.real(0.0, 1.0, bad=(1.5, -0.1, None)),
          "eps": d.real(1e-6, 1e-2, bad=(-1.0, np.nan))}
    return Case([x, rm, rv, w, b], kw, fixed=(1, 2))


def _bn_ref(x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5):
    y, rm2, rv2 = ref_batch_norm(_f64(x), _f64(rm), _f64(rv), w, b, training, momentum, eps)
    return y


def _ln_draw(centered):
    def draw(d, dtype):
        shape = d.shape(1, 3)
        ns = shape[d.int(0, len(shape) - 1):]
        if d.bad():
            ns = tuple(n + 1 for n in ns)
        x = d.array(shape, dtype, huge=False, specials=False)
        w = d.array(ns, dtype, specials=False) if d.flag() else None
        kw = {"eps": d.real(1e-6, 1e-2, bad=(-1.0, np.inf))}
        if centered:
            kw["bias"] = d.array(ns, dtype, specials=False) if d.flag() else None
        return Case([x, ns, w], kw)
    return draw


def _norm_rows():
    tol = {F32: 2e-4, F64: 1e-10}
    return [
        Row("batch_norm", "normalization", nbops.batch_norm, _bn_draw, _bn_ref, rtol=tol),
        Row("layer_norm", "normalization", nbops.layer_norm, _ln_draw(True),
            lambda x, ns, w=None, bias=None, eps=1e-5: ref_layer_norm(x, ns, w, bias, eps),
            rtol=tol),
        Row("rms_norm", "normalization", nbops.rms_norm, _ln_draw(False),
            lambda x, ns, w=None, eps=1e-5: ref_layer_norm(x, ns, w, None, eps, False),
            rtol=tol),
    ]


# ---------------------------------------------------------------------------
# Pooling


def _window(d, size):
    k = d.param(lambda: d.int(1, max(1, min(size, 4))), [0, -1, 1.5])
    s = d.param([None, 1, 2, 3], [0, -2])
    p = d.param(lambda: d.int(0, k // 2) if isinstance(k, int) and k > 0 else 0,
                [k + 1 if isinstance(k, int) else 9, -1])
    return k, s, p


def _pool_draw(nd, kind):
    def draw(d, dtype):
        sp = tuple(d.choice([1, 2, 3, 5, 8, 9, 12]) for _ in range(nd))
        # (N, C, ...) or (C, ...): only N may be 0
        x = d.array((d.size(),) + (d.size(1),) + sp if d.flag(0.7) else (d.size(1),) + sp,
                    dtype, huge=False)
        k, s, p = _window(d, min(sp))
        kw = {"stride": s, "padding": p, "ceil_mode": d.param([False, True], [1])}
        if kind == "max":
            kw["dilation"] = d.param([1, 1, 2], [0])
            if kw["dilation"] == 2 and isinstance(k, int) and k > 0 and isinstance(p, int) \
                    and p >= 0 and 2 * (k - 1) + 1 > min(sp) + 2 * p:
                d.valid = False    # the dilated window spans more than the input
        else:
            kw["count_include_pad"] = d.flag()
            if nd == 2:
                kw["divisor_override"] = d.param([None, None, 2, 5], [0, -1])
        return Case([x, k], kw)
    return draw


def _as2d(refn, nd):
    def r(x, k, stride=None, padding=0, **kw):
        x = _f64(x)
        if nd == 1:
            x = x[..., None, :]
            k, stride, padding = (1, k), None if stride is None else (1, stride), (0, padding)
            kw = {key: ((1, v) if key == "dilation" else v) for key, v in kw.items()}
        y = refn(x, k, stride, padding, **kw)
        return y[..., 0, :] if nd == 1 else y
    return r


def _ref_max(x, k, s, p, dilation=1, ceil_mode=False):
    return ref_max_pool2d(x, k, s, p, dilation, ceil_mode)[0]


def _ref_avg(x, k, s, p, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return ref_avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override)


def _adaptive_draw(nd):
    def draw(d, dtype):
        sp = tuple(d.choice([1, 2, 3, 5, 7, 9]) for _ in range(nd))
        x = d.array((d.size(),) + (d.size(1),) + sp, dtype, huge=False)
        out = tuple(d.param(lambda: d.int(1, 6), [0, -1]) for _ in range(nd))
        return Case([x, out if nd == 2 else out[0]])
    return draw


def _adaptive_ref(x, out):
    x = _f64(x)
    if isinstance(out, int):
        return ref_adaptive_avg_pool2d(x[..., None, :], 1, out)[..., 0, :]
    return ref_adaptive_avg_pool2d(x, *out)


def _pool_rows():
    tol = {F32: 1e-5, F64: 1e-13}
    rows = []
    for nd in (1, 2):
        rows.append(Row(f"max_pool{nd}d", "pooling", getattr(nbops, f"max_pool{nd}d"),
                        _pool_draw(nd, "max"), _as2d(_ref_max, nd), rtol={F32: 0, F64: 0}))
        rows.append(Row(f"avg_pool{nd}d", "pooling", getattr(nbops, f"avg_pool{nd}d"),
                        _pool_draw(nd, "avg"), _as2d(_ref_avg, nd), rtol=tol))
        rows.append(Row(f"adaptive_avg_pool{nd}d", "pooling",
                        getattr(nbops, f"adaptive_avg_pool{nd}d"), _adaptive_draw(nd),
                        _adaptive_ref, rtol=tol))
    rows.append(Row("global_avg_pool2d", "pooling", nbops.global_avg_pool2d,
                    lambda d, t: Case([d.array((d.size(),) + (d.size(1),) + tuple(
                        d.size(1) for _ in range(2)), t, huge=False)],
                        {"keepdim": d.param([False, True], [None])}),
                    lambda x, keepdim=False: _f64(x).mean(axis=(-2, -1), keepdims=keepdim),
                    rtol={F32: 1e-5, F64: 1e-13}))
    return rows


# ---------------------------------------------------------------------------
# Softmax and attention


def _softmax_draw(d, dtype):
    x = d.array(d.shape(0, 3), dtype, -30, 30)
    nd = max(x.ndim, 1)
    return Case([x], {"axis": d.param(lambda: d.int(-nd, nd - 1), [nd, 0.5])})


def _attention_draw(d, dtype):
    batch = d.shape(0, 2, lo=1)
    L, S, D, Dv = d.size(1), d.size(1), d.size(1), d.size(1)
    kshape = batch + (S, D) if not d.bad() else batch + (S, D + 1)
    q = d.array(batch + (L, D), dtype, specials=False)
    k = d.array(kshape, dtype, specials=False)
    # no special values in v: a masked key's inf would be 0 * inf = NaN in
    # the reference's product, while the kernel (as any flash kernel) skips it
    v = d.array(batch + (S, Dv), dtype, specials=False)
    mask = None
    if d.flag(0.4):
        mask = d.array((L, S), np.bool_) if d.flag() else d.array((L, S), dtype, -2, 0,
                                                                   specials=False)
    kw = {"mask": mask, "causal": d.param([False, True], [1]),
          "scale": d.param([None, 0.5, 2.0], [0.0, np.nan])}
    return Case([q, k, v], kw)


def _attention_ref(q, k, v, mask=None, causal=False, scale=None):
    with np.errstate(all="ignore"):
        return ref_attention(q, k, v, None if mask is None else np.asarray(mask), causal,
                             scale)


def _softmax_ref(x, axis, log):
    if np.size(x) == 0:      # an empty axis: nothing to normalise
        return _f64(x)
    return ref_softmax(x, axis if np.ndim(x) else None, log)


def _pe_draw(d, dtype):
    return Case([d.param(lambda: d.int(0, 40), [-1, 2.0]),
                 d.param(lambda: 2 * d.int(1, 16), [0, -2, 2.0])],
                {"dtype": d.param([dtype], [np.int32, "f4x"])},
                fixed=(0, 1))


def _pe_ref(max_len, d_model, dtype):
    pos = np.arange(max_len)[:, None]
    div = np.exp(np.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * div), np.cos(pos * div)
    return pe


def _softmax_rows():
    tol = {F32: 2e-5, F64: 1e-12}
    return [
        Row("softmax", "softmax", nbops.softmax, _softmax_draw,
            lambda x, axis=-1: _softmax_ref(x, axis, False), rtol=tol),
        Row("log_softmax", "softmax", nbops.log_softmax, _softmax_draw,
            lambda x, axis=-1: _softmax_ref(x, axis, True), rtol=tol),
        Row("scaled_dot_product_attention", "attention", nbops.scaled_dot_product_attention,
            _attention_draw, _attention_ref, rtol={F32: 1e-4, F64: 1e-11},
            scale=lambda q, k, v, **kw: np.abs(_f64(v)).max(initial=1.0)),
        Row("positional_encoding", "attention", nbops.positional_encoding, _pe_draw, _pe_ref,
            out=False, rtol={F32: 1e-5, F64: 1e-11}, layouts=False),
    ]


# ---------------------------------------------------------------------------
# Convolution


def _conv_draw(nd, bn=False):
    def draw(d, dtype):
        groups = d.choice([1, 1, 2, 3])
        ci, co = groups * d.choice([1, 2, 3]), groups * d.choice([1, 2, 3])
        sp = tuple(d.choice([1, 2, 3, 5, 8, 9]) for _ in range(nd))
        ks = tuple(d.choice([1, 2, 3]) for _ in range(nd))
        x = d.array((d.size(),) + (ci,) + sp, dtype, huge=False)
        wci = ci // groups if not d.bad() else ci // groups + 1
        # finite weights: the kernels skip padding where the reference multiplies
        # it, 0 * inf = NaN (a border difference only infinite weights show)
        w = d.array((co, wci) + ks, dtype, huge=False, specials=False)
        kw = {"stride": d.param([1, 2, 3], [0, -1]),
              # a padding of 10**9 asks for an output the machine cannot hold
              # (unless the batch is empty: then the output is, correctly, empty)
              "padding": d.param([0, 1, 2], [-1, 10 ** 9 if x.shape[0] else -1]),
              "dilation": d.param([1, 2], [0]), "groups": groups}
        if any((k - 1) * kw["dilation"] + 1 > s + 2 * kw["padding"] for k, s in zip(
                ks, sp)) if isinstance(kw["padding"], int) and kw["padding"] >= 0 and \
                isinstance(kw["dilation"], int) and kw["dilation"] > 0 else False:
            d.valid = False
        if bn:
            stats = [d.array((co,), dtype, specials=False),
                     d.array((co,), dtype, 0.1, 2.0, specials=False),
                     d.array((co,), dtype, specials=False), d.array((co,), dtype,
                                                                     specials=False)]
            b = d.array((co,), dtype, specials=False) if d.flag() else None
            kw["eps"] = d.real(1e-6, 1e-2, bad=(0.0, -1.0))
            return Case([x, w, b] + stats, kw)
        kw["bias"] = d.array((co,), dtype, specials=False) if d.flag() else None
        return Case([x, w], kw)
    return draw


def _conv_ref(nd, relu=False, bn=False):
    def r(x, w, *rest, bias=None, stride=1, padding=0, dilation=1, groups=1, eps=1e-5):
        x, w = _f64(x), _f64(w)
        b = rest[0] if bn else bias
        b = None if b is None else _f64(b)
        with np.errstate(all="ignore"):
            if nd == 2:
                y = ref_conv2d(x, w, b, (stride,) * 2, (padding,) * 2, (dilation,) * 2, groups)
            else:
                y = ref_conv1d(x, w, b, stride, padding, dilation, groups)
            if bn:
                shape = (1, -1) + (1,) * nd
                m, v, g, be = (_f64(a).reshape(shape) for a in rest[1:5])
                y = (y - m) / np.sqrt(v + eps) * g + be
            return np.maximum(y, 0) if relu else y
    return r


def _conv_scale(nd, bn=False):
    def s(x, w, *rest, **kw):
        kw.pop("eps", None)
        kw["bias"] = None
        with np.errstate(all="ignore"):
            y = _conv_ref(nd)(np.abs(_f64(x)), np.abs(_f64(w)), **kw)
            if bn:
                shape = (1, -1) + (1,) * nd
                v, g = (_f64(a).reshape(shape) for a in rest[2:4])
                y = y * np.abs(g) / np.sqrt(v) + 10
            return y + 1
    return s


def _fold_draw(d, dtype):
    co = d.size(1)
    w = d.array((co, d.choice([1, 2, 3]), d.choice([1, 3]), d.choice([1, 3])), dtype,
                huge=False)
    b = d.array((co,), dtype, specials=False) if d.flag() else None
    n = co if not d.bad() else co + 1
    stats = [d.array((n,), dtype, specials=False), d.array((n,), dtype, 0.1, 2.0,
                                                           specials=False),
             d.array((n,), dtype, specials=False), d.array((n,), dtype, specials=False)]
    return Case([w, b] + stats, {"eps": d.real(1e-6, 1e-2, bad=(0.0, np.nan))})


def _fold_ref(w, b, m, v, g, be, eps=1e-5):
    w, m, v, g, be = (_f64(a) for a in (w, m, v, g, be))
    s = g / np.sqrt(v + eps)
    with np.errstate(all="ignore"):
        return (w * s.reshape((-1,) + (1,) * (w.ndim - 1)),
                (be + ((0 if b is None else _f64(b)) - m) * s))


def _conv_rows():
    tol = {F32: 3e-5, F64: 1e-12}
    return [
        Row("conv2d", "conv", nbops.conv2d, _conv_draw(2), _conv_ref(2), rtol=tol,
            scale=_conv_scale(2)),
        Row("conv1d", "conv", nbops.conv1d, _conv_draw(1), _conv_ref(1), rtol=tol,
            scale=_conv_scale(1)),
        Row("conv_relu", "conv", nbops.conv_relu, _conv_draw(2), _conv_ref(2, relu=True),
            rtol=tol, scale=_conv_scale(2)),
        Row("conv_bn", "conv", nbops.conv_bn, _conv_draw(2, bn=True), _conv_ref(2, bn=True),
            rtol=tol, scale=_conv_scale(2, bn=True)),
        Row("conv_bn_relu", "conv", nbops.conv_bn_relu, _conv_draw(2, bn=True),
            _conv_ref(2, relu=True, bn=True), rtol=tol, scale=_conv_scale(2, bn=True)),
        Row("fold_batch_norm", "conv", nbops.fold_batch_norm, _fold_draw, _fold_ref,
            out=False, rtol={F32: 1e-5, F64: 1e-12}),
    ]


# ---------------------------------------------------------------------------
# Quantization: float <-> int8/uint8 and int8 ops


QRANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def _qparams(d):
    # ("int8", a name NumPy reads, is int8: valid; "i8x" is no dtype at all)
    qd = d.param([np.int8, np.uint8], [np.int16, "i8x"])
    lo, hi = QRANGE.get(np.dtype(qd), (-128, 127)) if not isinstance(qd, str) else (-128, 127)
    scale = d.param(lambda: float(10 ** d.rng.uniform(-3, 1)), [0.0, -1.0, np.nan, np.inf])
    zp = d.param(lambda: d.int(lo, hi), [hi + 1, lo - 1, 0.5])
    return scale, zp, qd


def _quantize_ref(x, scale, zero_point, dtype):
    lo, hi = QRANGE[np.dtype(dtype)]
    xs = np.asarray(x)
    s = np.asarray(scale, np.float32).astype(xs.dtype)
    with np.errstate(all="ignore"):
        v = np.rint(xs / s) + np.asarray(zero_point, np.int64)
        v = np.where(np.isnan(v), zero_point, v)
    return np.clip(v, lo, hi)


def _qpt_draw(d, dtype):
    scale, zp, qd = _qparams(d)
    return Case([d.array(d.shape(0, 3), dtype, -200, 200), scale, zp, qd])


def _qpc_draw(d, dtype):
    x = d.array(d.shape(1, 3), dtype, -50, 50)
    axis = d.param(lambda: d.int(-x.ndim, x.ndim - 1), [x.ndim])
    c = x.shape[axis] if -x.ndim <= axis < x.ndim else 1
    qd = d.param([np.int8, np.uint8], [np.float32])
    lo, hi = QRANGE.get(np.dtype(qd), (-128, 127))
    scales = 10 ** d.rng.uniform(-2, 0.5, c)
    if c and d.bad():
        scales[0] = d.choice([0.0, -1.0, np.nan])
    zps = d.rng.integers(lo, hi + 1, c)
    return Case([x, scales, zps, axis, qd], fixed=(1, 2))


def _qpc_ref(x, scales, zps, axis, dtype):
    shape = [1] * np.ndim(x)
    shape[axis] = -1
    lo, hi = QRANGE[np.dtype(dtype)]
    xs = np.asarray(x)
    s = np.asarray(scales, np.float32).astype(xs.dtype).reshape(shape)
    with np.errstate(all="ignore"):
        v = np.rint(xs / s) + np.asarray(zps, np.int64).reshape(shape)
        v = np.where(np.isnan(v), np.asarray(zps).reshape(shape), v)
    return np.clip(v, lo, hi)


def _qtensor(d, shape, qd=np.int8):
    lo, hi = QRANGE[np.dtype(qd)]
    vals = d.rng.integers(lo, hi + 1, shape).astype(qd)
    return Q.QTensor(vals, float(10 ** d.rng.uniform(-2, 0)), int(d.rng.integers(lo, hi + 1)))


def _int_repr(y):
    return y.int_repr() if isinstance(y, Q.QTensor) else y


def _deq_draw(d, dtype):
    q = _qtensor(d, d.shape(0, 3), d.choice([np.int8, np.uint8]))
    return Case([q], {"dtype": d.param([dtype], [np.int32, "f4x"])})


def _deq_ref(q, dtype=np.float32):
    return (q.int_repr().astype(np.float64) - q.zero_point) * np.float64(
        np.asarray(q.scale, dtype))


def _qadd_draw(d, dtype):
    shape = d.shape(0, 3)
    qa, qb = _qtensor(d, shape), _qtensor(d, shape if not d.bad() else shape + (2,))
    scale = d.param(lambda: float(10 ** d.rng.uniform(-2, 0)), [0.0, -1.0])
    zp = d.param(lambda: d.int(-128, 127), [128])
    return Case([qa, qb, scale, zp])


def _qadd_ref(qa, qb, scale, zero_point, relu=False):
    a = (qa.int_repr().astype(np.float64) - qa.zero_point) * qa.scale
    b = (qb.int_repr().astype(np.float64) - qb.zero_point) * qb.scale
    r = a + b
    r = np.maximum(r, 0) if relu else r
    return np.clip(np.rint(r / scale) + zero_point, -128, 127)


def _qpool_draw(d, dtype):
    sp = (d.choice([1, 2, 3, 5, 8]), d.choice([1, 2, 3, 5, 8]))
    q = _qtensor(d, (d.size(), d.size(1)) + sp)
    k, s, p = _window(d, min(sp))
    return Case([q, k], {"stride": s, "padding": p})


def _qpool_ref(q, k, stride=None, padding=0):
    return ref_max_pool2d(q.int_repr().astype(np.float64), k, stride, padding)[0]


def _quant_rows():
    exact = {F32: 0, F64: 0}
    common = dict(family="quant", out=False, result=_int_repr, layouts=False)
    return [
        Row("quantize_per_tensor", fn=Q.quantize_per_tensor, draw=_qpt_draw,
            ref=_quantize_ref, rtol=exact, **dict(common, layouts=True)),
        Row("quantize_per_channel", fn=Q.quantize_per_channel, draw=_qpc_draw,
            ref=_qpc_ref, rtol=exact, **dict(common, layouts=True)),
        Row("dequantize", fn=Q.dequantize, draw=_deq_draw, ref=_deq_ref,
            rtol={F32: 1e-6, F64: 1e-6}, bad_dtypes=(), **common),
        Row("relu", fn=Q.relu, draw=lambda d, t: Case([_qtensor(d, d.shape(0, 3))]),
            ref=lambda q: np.maximum(q.int_repr(), q.zero_point), rtol=exact, bad_dtypes=(),
            dtypes=(F64,), **common),
        Row("add", fn=Q.add, draw=_qadd_draw, ref=_qadd_ref, rtol=exact, bad_dtypes=(),
            dtypes=(F64,), **common),
        Row("add_relu", fn=Q.add_relu, draw=_qadd_draw,
            ref=lambda *a: _qadd_ref(*a, relu=True), rtol=exact, bad_dtypes=(),
            dtypes=(F64,), **common),
        Row("max_pool2d", fn=Q.max_pool2d, draw=_qpool_draw, ref=_qpool_ref, rtol=exact,
            bad_dtypes=(), dtypes=(F64,), **common),
    ]


# ---------------------------------------------------------------------------
# Quantization: the int8 GEMM family (MatMulInteger, QLinearMatMul, linear,
# dynamic linear, QLinearConv; weights packed or not) and quantized average
# pooling. References: the int64 formulas of tests/test_quant_gemm.py and
# tests/test_quant.py; integer results bit for bit.

QTYPE_LIST = [np.int8, np.uint8]


def _ints(d, shape, qd):
    """Values of ``qd`` over its whole range (small ints for a type the op
    must refuse)."""
    lo, hi = QRANGE.get(np.dtype(qd), (-3, 3))
    return d.rng.integers(lo, hi + 1, shape).astype(qd)


def _zero_point(d, qd, n):
    """A zero point of ``qd``: an int or one per row/column (``n``); rarely
    outside the range, a float, a bool or of the wrong length."""
    lo, hi = QRANGE.get(np.dtype(qd), (-128, 127))
    if d.flag(0.3):
        good = lambda: d.rng.integers(lo, hi + 1, n)  # noqa: E731
    else:
        good = lambda: int(d.rng.integers(lo, hi + 1))  # noqa: E731
    return d.param(good, [hi + 1, lo - 1, 0.5, True, np.zeros(n + 1, np.int64)])


def _weight(d, shape, per_channel=None):
    """A QTensor weight, per tensor or per output channel (axis 0)."""
    qd = d.choice([np.int8, np.int8, np.uint8])
    lo, hi = QRANGE[np.dtype(qd)]
    v = _ints(d, shape, qd)
    if per_channel if per_channel is not None else d.flag(0.5):
        oc = shape[0]
        return Q.QTensor(v, 10 ** d.rng.uniform(-3, -1, oc), d.rng.integers(lo, hi + 1, oc),
                         axis=0)
    return Q.QTensor(v, float(10 ** d.rng.uniform(-3, -1)), int(d.rng.integers(lo, hi + 1)))


def _out_quant(d, default, float_result=True):
    """Output parameters: none (a float32 result), or a requantized QTensor's
    (out_scale, out_zero_point, out_dtype, requant); rarely bad ones."""
    if float_result and d.flag(0.4):
        # a float result; rarely an out_dtype without the parameters it needs
        return {"out_dtype": np.int8} if d.bad() else {}
    odt = d.param([None, np.int8, np.uint8], [np.int32, "f4x"])
    lo, hi = QRANGE.get(np.dtype(default if odt is None or odt == "f4x" else odt), (0, 0))
    kw = {"out_scale": d.param(lambda: float(10 ** d.rng.uniform(-3, 0)),
                               [0.0, -1.0, np.nan, np.inf]),
          "out_zero_point": d.param(lambda: d.int(lo, hi), [hi + 1, 0.5]),
          "out_dtype": odt, "requant": d.param(["fixed", "float"], ["round"])}
    if d.bad():
        del kw["out_zero_point"]           # one without the other
    return kw


def _int_bias(d, n):
    return d.param(lambda: d.rng.integers(-5000, 5001, n).astype(np.int32) if d.flag() else None,
                   [np.zeros(n, np.float32), np.zeros(n + 1, np.int32)])


def _matmul_shapes(d):
    """Shapes of ``a`` (..., m, k) and ``b`` (..., k, n) whose batch axes
    broadcast (NumPy's rule decides), 1-D now and then, rarely a k that differs."""
    m, k, n = d.size(), d.size(), _columns(d)
    batch = d.shape(0, 2, lo=1)
    bb = tuple(1 if d.flag(0.2) else s for s in batch[d.int(0, len(batch)):])
    sa = (k,) if d.flag(0.15) else batch + (m, k)
    sb = (k,) if d.flag(0.15) else bb + (k, n)
    if d.bad():
        sb = sb[:-2] + (k + 1,) + sb[-1:] if len(sb) > 1 else (k + 1,)
    return sa, sb


def _columns(d):
    """Output columns: mostly SIZES, now and then either side of the CPU
    kernel's 32-column tile."""
    return d.size() if d.flag(0.8) else d.choice([31, 32, 33])


def _integer_product(a, b, za, zb):
    """(a - za) @ (b - zb) in int64, 1-D operands as np.matmul treats them."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    acc = ref_matmul_integer(a2, b2, np.asarray(za), np.asarray(zb))
    if b.ndim == 1:
        acc = acc[..., 0]
    return acc[..., 0, :] if a.ndim == 1 and b.ndim > 1 else (
        acc[..., 0] if a.ndim == 1 else acc)


def _mmi_draw(d, dtype):
    sa, sb = _matmul_shapes(d)
    ta = d.param(QTYPE_LIST, [np.float32, np.int16])
    tb = d.param(QTYPE_LIST, [np.float32, np.int16])
    a, b = _ints(d, sa, ta), _ints(d, sb, tb)
    m = 1 if len(sa) == 1 else sa[-2]
    n = 1 if len(sb) == 1 else sb[-1]
    return Case([a, b], {"a_zero_point": _zero_point(d, ta, m),
                         "b_zero_point": _zero_point(d, tb, n)})


def _mmi_ref(a, b, a_zero_point=0, b_zero_point=0):
    np.broadcast_shapes(a.shape[:-2], b.shape[:-2])      # NumPy's rule: a ValueError
    return _integer_product(a, b, a_zero_point, b_zero_point)


def _qmm_draw(d, dtype):
    sa, sb = _matmul_shapes(d)
    ta, tb = d.choice(QTYPE_LIST), d.choice(QTYPE_LIST)
    (alo, ahi), (blo, bhi) = QRANGE[np.dtype(ta)], QRANGE[np.dtype(tb)]
    qa = Q.QTensor(_ints(d, sa, ta), float(10 ** d.rng.uniform(-2, 0)),
                   int(d.rng.integers(alo, ahi + 1)))
    n = sb[-1]
    if d.flag(0.5):   # per column: along b's last axis
        qb = Q.QTensor(_ints(d, sb, tb), 10 ** d.rng.uniform(-3, -1, n),
                       d.rng.integers(blo, bhi + 1, n), axis=len(sb) - 1)
        if len(sb) == 1:
            d.valid = False     # a 1-D b's last axis is k: no columns to scale
    else:
        qb = Q.QTensor(_ints(d, sb, tb), float(10 ** d.rng.uniform(-3, -1)),
                       int(d.rng.integers(blo, bhi + 1)))
    # QLinearMatMul always requantizes
    return Case([qa, qb], _out_quant(d, ta, float_result=False))


def _qmm_ref(qa, qb, out_scale, out_zero_point, out_dtype=None, requant="fixed"):
    a, b = qa.int_repr(), qb.int_repr()
    np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    n = b.shape[-1] if b.ndim > 1 else 1
    acc = _integer_product(a, b, qa.zero_point, np.broadcast_to(qb.zero_point, (n,)))
    real = _real(qa.scale, np.broadcast_to(qb.scale, (n,)), out_scale)
    return _requant_ref(acc, real if b.ndim > 1 else real[0], out_zero_point,
                        out_dtype or qa.dtype, requant)


def _maybe_packed(d, qw, groups=1):
    return Q.pack_weight(qw, groups) if d.flag(0.3) else qw


def _qlin_draw(d, dtype):
    k, n = d.size(), max(1, _columns(d))
    tx = d.choice(QTYPE_LIST)
    lo, hi = QRANGE[np.dtype(tx)]
    x = Q.QTensor(_ints(d, d.shape(0, 2) + (k if not d.bad() else k + 1,), tx),
                  float(10 ** d.rng.uniform(-2, 0)), int(d.rng.integers(lo, hi + 1)))
    w = _maybe_packed(d, _weight(d, (n, k)))
    kw = _out_quant(d, tx)
    kw["bias"] = _int_bias(d, n)
    return Case([x, w], kw)


def _dequant_scales(sx, w, n):
    """The float32 scale product of the dequantizing epilogue, per column."""
    return (np.float32(sx) * np.broadcast_to(np.asarray(w.scale, np.float32), (n,))).astype(
        np.float64)


def _qweight(w):
    return w.qweight if isinstance(w, Q.PackedWeight) else w


def _qlin_ref(x, w, bias=None, out_scale=None, out_zero_point=None, out_dtype=None,
              requant="fixed"):
    w = _qweight(w)
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError("in_features differ")
    acc = _integer_product(x.int_repr(), w.int_repr().T, x.zero_point,
                           np.broadcast_to(w.zero_point, (n,)))
    acc = acc + (0 if bias is None else bias.astype(np.int64))
    if out_scale is None:
        return acc * _dequant_scales(x.scale, w, n)
    real = _real(x.scale, np.broadcast_to(w.scale, (n,)), out_scale)
    return _requant_ref(acc, real, out_zero_point, out_dtype or x.dtype, requant)


def _qdyn_draw(d, dtype):
    k, n = d.size(), max(1, _columns(d))
    x = d.array(d.shape(0, 2) + (k if not d.bad() else k + 1,), dtype)
    w = _maybe_packed(d, _weight(d, (n, k)))
    b = d.param(lambda: d.array((n,), F32, specials=False) if d.flag() else None,
                [np.zeros(n, np.float64), np.zeros(n + 1, np.float32)])
    return Case([x, w], {"bias": b})


def _qdyn_ref(x, w, bias=None):
    """PyTorch's dynamic quantization of x (uint8 over its range and 0), the
    integer product, dequantized with the float bias added."""
    w = _qweight(w)
    n, k = w.shape
    x = np.asarray(x).astype(np.float32)
    if x.shape[-1] != k:
        raise ValueError("in_features differ")
    if not np.isfinite(x).all():
        raise ValueError("non-finite x")             # refused by the op
    lo = min(float(x.min()), 0.0) if x.size else 0.0
    hi = max(float(x.max()), 0.0) if x.size else 0.0
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = int(min(255, max(0, round(-lo / scale))))
    xq = _quantize_ref(x, scale, zp, np.uint8)
    acc = _integer_product(xq.astype(np.int64), w.int_repr().T, zp,
                           np.broadcast_to(w.zero_point, (n,)))
    return acc * _dequant_scales(scale, w, n) + (0 if bias is None else _f64(bias))


def _qdyn_scale(x, w, bias=None):
    return np.abs(_qdyn_ref(x, w)) + (0 if bias is None else np.abs(_f64(bias)))


def _qconv_draw(d, dtype):
    groups = d.choice([1, 1, 2, 3])
    ci, co = groups * d.choice([1, 2, 3]), groups * d.choice([1, 2, 3])
    sp = (d.choice([1, 2, 3, 5, 8, 9]), d.choice([1, 2, 3, 5, 8, 9]))
    ks = (d.choice([1, 2, 3]), d.choice([1, 2, 3]))
    tx = d.choice(QTYPE_LIST)
    lo, hi = QRANGE[np.dtype(tx)]
    x = Q.QTensor(_ints(d, (d.size(), ci) + sp, tx), float(10 ** d.rng.uniform(-2, 0)),
                  int(d.rng.integers(lo, hi + 1)))
    wci = ci // groups if not d.bad() else ci // groups + 1
    w = _maybe_packed(d, _weight(d, (co, wci) + ks), groups)
    kw = {"stride": d.param([1, 2, 3, (1, 2)], [0, -1]),
          "padding": d.param([0, 1, 2, (0, 1)], [-1, 10 ** 9 if x.shape[0] else -1]),
          "dilation": d.param([1, 2], [0]), "groups": groups}
    if d.valid and any((k - 1) * dil + 1 > s + 2 * p for k, s, p, dil in zip(
            ks, sp, _pair2(kw["padding"]), _pair2(kw["dilation"]))):
        d.valid = False       # the dilated kernel spans more than the padded input
    kw.update(_out_quant(d, tx))
    kw["bias"] = _int_bias(d, co)
    return Case([x, w], kw)


def _pair2(v):
    return v if isinstance(v, tuple) else (v, v)


def _qconv_ref(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, out_scale=None,
               out_zero_point=None, out_dtype=None, requant="fixed"):
    w = _qweight(w)
    oc = w.shape[0]
    acc = ref_conv(x.int_repr(), x.zero_point, w.int_repr(),
                   np.broadcast_to(w.zero_point, (oc,)), _pair2(stride), _pair2(padding),
                   _pair2(dilation), groups)
    if bias is not None:
        acc = acc + bias.astype(np.int64)[None, :, None, None]
    if out_scale is None:
        return acc * _dequant_scales(x.scale, w, oc)[None, :, None, None]
    real = _real(x.scale, np.broadcast_to(w.scale, (oc,)), out_scale)[None, :, None, None]
    return _requant_ref(acc, real, out_zero_point, out_dtype or x.dtype, requant)


def _qavg_draw(global_pool):
    def draw(d, dtype):
        size = None if global_pool else d.param(
            lambda: d.int(1, 6) if d.flag() else (d.int(1, 6), d.int(1, 6)),
            [0, -1, (2, 3, 4), 2.0, (10 ** 6, 10 ** 6)])
        # a refused huge output_size needs images: an empty batch would be valid
        n = d.size(1) if size == (10 ** 6, 10 ** 6) else d.size()
        sp = (d.param(lambda: d.choice([1, 2, 3, 5, 7, 9]), [0]), d.choice([1, 2, 3, 5, 7, 9]))
        q = _qtensor(d, (n, d.size(1)) + sp, d.choice(QTYPE_LIST))
        lo, hi = QRANGE[q.dtype]
        kw = {"requant": d.param(["fixed", "float"], ["round"])}
        if d.flag():
            kw["scale"] = d.param(lambda: float(10 ** d.rng.uniform(-2, 0)), [0.0, -1.0])
            kw["zero_point"] = d.param(lambda: d.int(lo, hi), [hi + 1])
        return Case([q] if global_pool else [q, size], kw)
    return draw


def _qavg_ref(q, output_size=1, scale=None, zero_point=None, requant="fixed"):
    oh, ow = _pair2(output_size)
    return avg_pool_reference(q.to_host(), oh, ow, q.scale if scale is None else scale,
                              q.zero_point if zero_point is None else zero_point,
                              requant == "fixed")


def _quant_gemm_rows():
    common = dict(family="quant", out=False, result=_int_repr, layouts=False, bad_dtypes=(),
                  dtypes=(F32,), rtol={F32: 1e-6})
    return [
        Row("matmul_integer", fn=Q.matmul_integer, draw=_mmi_draw, ref=_mmi_ref,
            ref_decides=True, **dict(common, out=True, layouts=True,
                                     dtypes=(np.dtype(np.int32),))),
        Row("matmul", fn=Q.matmul, draw=_qmm_draw, ref=_qmm_ref, ref_decides=True, **common),
        Row("linear", fn=Q.linear, draw=_qlin_draw, ref=_qlin_ref, ref_decides=True,
            **common),
        Row("linear_dynamic", fn=Q.linear_dynamic, draw=_qdyn_draw, ref=_qdyn_ref,
            ref_decides=True, scale=_qdyn_scale,
            **dict(common, layouts=True, bad_dtypes=(np.dtype(np.float64),) + BAD_DTYPES)),
        Row("conv2d", fn=Q.conv2d, draw=_qconv_draw, ref=_qconv_ref, **common),
        Row("adaptive_avg_pool2d", fn=Q.adaptive_avg_pool2d, draw=_qavg_draw(False),
            ref=_qavg_ref, **common),
        Row("global_avg_pool2d", fn=Q.global_avg_pool2d, draw=_qavg_draw(True),
            ref=_qavg_ref, **common),
    ]


# ---------------------------------------------------------------------------
# Sparse: CSR matrices with empty rows, a row holding every nonzero, unsorted
# and repeated columns (valid: rows need not be canonical)


def csr(d, dtype, rows=None, cols=None, idt=None):
    """A random CSRMatrix and its dense float64 equal (repeats summed)."""
    rows = d.size() if rows is None else rows
    cols = d.size(1) if cols is None else cols
    kind = d.choice(["random", "empty", "one_row", "repeats"])
    nnz = 0 if kind == "empty" or not rows else int(d.rng.integers(0, 3 * rows + 1))
    if kind == "one_row" and rows:
        counts = np.zeros(rows, np.int64)
        counts[d.rng.integers(0, rows)] = nnz
    else:
        counts = np.bincount(d.rng.integers(0, max(rows, 1), nnz), minlength=rows)[:rows]
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ind = d.rng.integers(0, cols, int(ptr[-1])).astype(np.int64)
    if kind != "repeats":
        for r in range(rows):  # distinct columns per row, in random order
            n = int(counts[r])
            if n > cols:
                ind[ptr[r]:ptr[r + 1]] = np.arange(n) % cols
            else:
                ind[ptr[r]:ptr[r + 1]] = d.rng.permutation(cols)[:n]
    idt = idt or d.choice([np.int32, np.int64])
    data = d.array((int(ptr[-1]),), dtype, huge=False)
    A = S.CSRMatrix(data, ind.astype(idt), ptr.astype(idt), (rows, cols))
    dense = np.zeros((rows, cols))
    np.add.at(dense, (np.repeat(np.arange(rows), counts), ind), _f64(data))
    return A, dense


def _sp_mv_draw(d, dtype):
    A, dense = csr(d, dtype)
    n = dense.shape[1] if not d.bad() else dense.shape[1] + 1
    return Case([A, d.array((n,), dtype, huge=False)], {"_dense": dense}, fixed=(0,))


def _sp_mm_draw(d, dtype):
    A, dense = csr(d, dtype)
    n = dense.shape[1] if not d.bad() else dense.shape[1] + 1
    return Case([A, d.array((n, d.size()), dtype, huge=False)], {"_dense": dense}, fixed=(0,))


def _sp_sddmm_draw(d, dtype):
    A, dense = csr(d, dtype)
    k = d.size()
    X = d.array((dense.shape[0], k), dtype, huge=False)
    Y = d.array((dense.shape[1], k if not d.bad() else k + 1), dtype, huge=False)
    return Case([A, X, Y], {"_dense": dense}, fixed=(0,))


def _pattern_values(A, values):
    """``values`` (one per stored position) as a dense matrix, repeats summed."""
    rows = np.repeat(np.arange(A.shape[0]), np.diff(nbops.to_host(A.indptr)))
    out = np.zeros(A.shape)
    np.add.at(out, (rows, nbops.to_host(A.indices)), values)
    return out


def _sp_values(y):
    """A CSRMatrix result as its stored values' dense sum, in their dtype."""
    if isinstance(y, S.CSRMatrix):
        data = nbops.to_host(y.data)
        return _pattern_values(y, _f64(data)).astype(data.dtype)
    return y


def _entries(A):
    """Row, column and value (float64) of every stored entry of A."""
    ptr, ind = nbops.to_host(A.indptr), nbops.to_host(A.indices)
    return (np.repeat(np.arange(A.shape[0]), np.diff(ptr)), ind,
            _f64(nbops.to_host(A.data)))


def _sp_times(A, B, _dense=None):
    """A @ B over the stored entries only (a dense product would turn the
    zeros between them into 0 * inf = NaN)."""
    r, c, v = _entries(A)
    B = _f64(B)
    out = np.zeros((A.shape[0],) + B.shape[1:])
    with np.errstate(all="ignore"):
        np.add.at(out, r, v.reshape((-1,) + (1,) * (B.ndim - 1)) * B[c])
    return out


def _sp_times_scale(A, B, _dense=None):
    r, c, v = _entries(A)
    B = np.abs(_f64(B))
    out = np.zeros((A.shape[0],) + B.shape[1:])
    with np.errstate(all="ignore"):
        np.add.at(out, r, np.abs(v).reshape((-1,) + (1,) * (B.ndim - 1)) * B[c])
    return out


def _sp_scale_ref(axis):
    def r(A, s, _dense=None):
        rows, cols, v = _entries(A)
        return _pattern_values(A, v * _f64(s)[rows if axis == 0 else cols])
    return r


def _sp_sddmm_ref(A, X, Y, _dense):
    ind = nbops.to_host(A.indices)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(nbops.to_host(A.indptr)))
    vals = np.einsum("ij,ij->i", _f64(X)[rows], _f64(Y)[ind]) if ind.size else np.zeros(0)
    return _pattern_values(A, vals)


def _sp_softmax_ref(A, _dense):
    data = _f64(nbops.to_host(A.data))
    ptr = nbops.to_host(A.indptr)
    out = np.empty_like(data)
    for r in range(A.shape[0]):
        seg = data[ptr[r]:ptr[r + 1]]
        if seg.size:
            with np.errstate(all="ignore"):
                e = np.exp(seg - seg.max())
                out[ptr[r]:ptr[r + 1]] = e / e.sum()
    return _pattern_values(A, out)


def _sp_add_draw(d, dtype):
    A, da = csr(d, dtype)
    B, db = csr(d, dtype, *(da.shape if not d.bad() else (da.shape[0] + 1, da.shape[1])),
                idt=A.index_dtype)
    return Case([A, B], {"alpha": d.real(-2, 2, bad=(np.nan,)), "beta": d.real(-2, 2),
                         "_dense": (da, db)}, fixed=(0, 1))


def _sp_scale_draw(axis):
    def draw(d, dtype):
        A, dense = csr(d, dtype)
        n = dense.shape[axis] if not d.bad() else dense.shape[axis] + 1
        return Case([A, d.array((n,), dtype, huge=False)], {"_dense": dense}, fixed=(0,))
    return draw


def _strip(fn):
    """Calls ``fn`` without the rows' private ``_dense`` keyword."""
    def call(*args, _dense=None, **kw):
        return fn(*args, **kw)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


def _sp_rows():
    tol = {F32: 2e-5, F64: 1e-12}
    common = dict(family="sparse", rtol=tol, out=False, result=_sp_values, bad_dtypes=())
    return [
        Row("mv", fn=_strip(S.mv), draw=_sp_mv_draw, ref=_sp_times, scale=_sp_times_scale,
            **common),
        Row("mm", fn=_strip(S.mm), draw=_sp_mm_draw, ref=_sp_times, scale=_sp_times_scale,
            **common),
        Row("sddmm", fn=_strip(S.sddmm), draw=_sp_sddmm_draw, ref=_sp_sddmm_ref,
            scale=lambda A, X, Y, _dense: _sp_sddmm_ref(A, np.abs(_f64(X)), np.abs(_f64(Y)),
                                                        _dense), **common),
        Row("softmax", fn=_strip(S.softmax), draw=lambda d, t: (lambda A: Case(
            [A[0]], {"_dense": A[1]}, fixed=(0,)))(csr(d, t)), ref=_sp_softmax_ref,
            **common),
        Row("add", fn=_strip(S.add), draw=_sp_add_draw,
            ref=lambda A, B, alpha=1.0, beta=1.0, _dense=None: alpha * _dense[0]
            + beta * _dense[1], **common),
        Row("scale_rows", fn=_strip(S.scale_rows), draw=_sp_scale_draw(0),
            ref=_sp_scale_ref(0), **common),
        Row("scale_columns", fn=_strip(S.scale_columns), draw=_sp_scale_draw(1),
            ref=_sp_scale_ref(1), **common),
        Row("to_dense", fn=_strip(S.to_dense), draw=lambda d, t: (lambda A: Case(
            [A[0]], {"_dense": A[1]}, fixed=(0,)))(csr(d, t)),
            ref=lambda A, _dense: _dense, **dict(common, out=False)),
        Row("from_dense", fn=lambda a: S.from_dense(a),
            draw=lambda d, t: Case([np.where(d.rng.random(s := (d.size(), d.size())) < 0.6,
                                             0, d.array(s, t, huge=False)).astype(t)]),
            ref=lambda a: _f64(a), **common),
    ]


# ---------------------------------------------------------------------------
# Neuromorphic: spiking neurons over time, encodings and decodings


def _lif_draw(d, dtype):
    T = d.size(1)
    x = d.array((T,) + d.shape(1, 2), dtype, -0.5, 1.5, specials=False)
    v0 = d.array(x.shape[1:], dtype, specials=False) if d.flag(0.3) else None
    return Case([x], {"beta": d.real(0.0, 1.0, bad=(1.5, -0.1, np.nan)),
                      "threshold": d.real(0.2, 2.0, bad=(0.0, -1.0)),
                      "reset": d.param(["subtract", "zero", "none"], ["sub"]), "v0": v0})


def _lif_ref(x, beta, threshold=1.0, reset="subtract", v0=None):
    x = np.asarray(x)
    s, _, v, *_ = ref_run("lif", x, beta, threshold, reset=reset,
                          v0=None if v0 is None else np.asarray(v0))
    return s, v


def _if_draw(d, dtype):
    T = d.size(1)
    x = d.array((T,) + d.shape(1, 2), dtype, -0.5, 1.5, specials=False)
    v0 = d.array(x.shape[1:], dtype, specials=False) if d.flag(0.3) else None
    return Case([x], {"threshold": d.real(0.2, 2.0, bad=(0.0, -1.0)),
                      "reset": d.param(["subtract", "zero", "none"], ["sub"]), "v0": v0})


def _if_ref(x, threshold=1.0, reset="subtract", v0=None):
    return _lif_ref(x, 1.0, threshold, reset, v0)


def _synaptic_draw(d, dtype):
    case = _lif_draw(d, dtype)
    case.kwargs["alpha"] = d.real(0.0, 1.0, bad=(1.5, -0.1, np.nan))
    case.kwargs["syn0"] = (d.array(case.args[0].shape[1:], dtype, specials=False)
                           if d.flag(0.3) else None)
    return case


def _synaptic_ref(x, alpha, beta, threshold=1.0, reset="subtract", syn0=None, v0=None):
    x = np.asarray(x)
    s, _, v, b, *_ = ref_run("synaptic", x, beta, threshold, alpha, reset=reset,
                             v0=None if v0 is None else np.asarray(v0),
                             b0=None if syn0 is None else np.asarray(syn0))
    return s, b, v


def _alif_draw(d, dtype):
    case = _lif_draw(d, dtype)
    case.kwargs["adapt_decay"] = d.real(0.0, 1.0, bad=(1.5, -0.1, np.nan))
    case.kwargs["adapt_scale"] = d.real(0.0, 1.0, bad=(-0.5, np.nan))
    case.kwargs["a0"] = (d.array(case.args[0].shape[1:], dtype, 0.0, 1.0, specials=False)
                         if d.flag(0.3) else None)
    return case


def _alif_ref(x, beta, threshold=1.0, adapt_decay=0.95, adapt_scale=0.2, reset="subtract",
              v0=None, a0=None):
    x = np.asarray(x)
    s, _, v, b, *_ = ref_run("alif", x, beta, threshold, adapt_decay, adapt_scale,
                             reset=reset, v0=None if v0 is None else np.asarray(v0),
                             b0=None if a0 is None else np.asarray(a0))
    return s, v, b


def _lif_step(x, v=None, beta=0.9, threshold=1.0, reset="subtract"):
    """lif_step with its state and parameters as the fuzzer draws them."""
    state = None if v is None else nm.LIFState(v)
    spikes, new = nm.lif_step(x, state, nm.LIFParameters(beta, threshold, reset))
    return spikes, new.v


def _lif_step_draw(d, dtype):
    x = d.array(d.shape(0, 3), dtype, -0.5, 1.5, specials=False)
    v = d.array(x.shape, dtype, specials=False) if d.flag(0.5) else None
    return Case([x] + ([v] if v is not None else []),
                {"beta": d.real(0.0, 1.0, bad=(1.5, -0.1, np.nan)),
                 "threshold": d.real(0.2, 2.0, bad=(0.0, -1.0)),
                 "reset": d.param(["subtract", "zero", "none"], ["sub"])})


def _lif_step_ref(x, v=None, beta=0.9, threshold=1.0, reset="subtract"):
    s, v1 = _lif_ref(np.asarray(x)[None], beta, threshold, reset, v)
    return s[0], v1


# The neurons' backward passes against finite differences of the smoothed
# forward (tests/test_neuromorphic.py's reference: the spike replaced by the
# surrogate's antiderivative around the drawn point), on small shapes.
_BPTT = {  # row name -> (op, model of ref_run, parameters drawn, state)
    "lif_backward": (nm.lif_backward, "lif", ("beta",), None),
    "if_neuron_backward": (nm.if_neuron_backward, "lif", (), None),
    "synaptic_backward": (nm.synaptic_backward, "synaptic", ("alpha", "beta"), "syn0"),
    "alif_backward": (nm.alif_backward, "alif", ("beta", "adapt_decay", "adapt_scale"), "a0"),
}


def _bptt_fn(name):
    op = _BPTT[name][0]

    def fn(grad_spikes, inputs, v0, grad_v, *state, **kwargs):
        state_kw = {_BPTT[name][3]: state[0]} if state else {}
        g = op(grad_spikes, inputs, v0=v0, grad_v=grad_v, **state_kw, **kwargs)
        return g["inputs"], g["v0"]
    fn.__name__ = name
    return fn


def _bptt_draw(name):
    params, state = _BPTT[name][2], _BPTT[name][3]

    def draw(d, dtype):
        shape = (d.int(1, 6),) + tuple(d.int(1, 4) for _ in range(d.int(1, 2)))
        x = d.array(shape, dtype, 0.0, 0.9, specials=False)
        arrays = [d.array(shape, dtype, -1.0, 1.0, specials=False), x,
                  d.array(shape[1:], dtype, 0.0, 0.5, specials=False),
                  d.array(shape[1:], dtype, -1.0, 1.0, specials=False)]
        if state:
            arrays.append(d.array(shape[1:], dtype, 0.0, 0.3, specials=False))
        kw = {p: d.real(0.3, 0.95, bad=(1.5, -0.1, np.nan)) if p != "adapt_scale"
              else d.real(0.0, 0.5, bad=(-0.5, np.nan)) for p in params}
        surrogate = d.param(list(ANTIDERIVATIVE), ["bogus"])
        k = SURROGATE_PARAM.get(surrogate)
        kw.update(threshold=d.real(0.4, 1.2, bad=(0.0, -1.0)),
                  reset=d.param(["subtract", "zero", "none"], ["sub"]),
                  surrogate=(surrogate, k) if k else surrogate, detach_reset=d.flag())
        return Case(arrays, kw)
    return draw


def _bptt_ref(name):
    model, params, state = _BPTT[name][1], _BPTT[name][2], _BPTT[name][3]

    def ref(grad_spikes, inputs, v0, grad_v, *st, threshold, reset, surrogate,
            detach_reset, **kw):
        sname, k = surrogate if isinstance(surrogate, tuple) else (surrogate, None)
        w0, w1 = _f64(grad_spikes), _f64(grad_v)
        x, v0 = _f64(inputs), _f64(v0)
        b0 = _f64(st[0]) if st else None
        beta = kw.get("beta", 1.0)
        p2 = kw.get("alpha", kw.get("adapt_decay", 0.0))
        p3 = kw.get("adapt_scale", 0.0)
        base = ref_run(model, x, beta, threshold, p2, p3, reset, v0, b0)[4:]
        w = [w0, w1, np.zeros_like(x), np.zeros_like(v0)]

        def loss(x=x, v0=v0):
            return _smooth_loss(model, sname, k, x, beta, threshold, p2, p3, reset, v0, b0,
                                detach_reset, w, base)
        eps = 1e-6
        grads = []
        for value, key in ((x, "x"), (v0, "v0")):
            g = np.zeros(value.shape)
            for i in np.ndindex(value.shape):
                hi, lo = value.copy(), value.copy()
                hi[i] += eps
                lo[i] -= eps
                g[i] = (loss(**{key: hi}) - loss(**{key: lo})) / (2 * eps)
            grads.append(g)
        return tuple(grads)
    return ref


def _delta_draw(d, dtype):
    x = d.array((d.size(1),) + d.shape(0, 2), dtype, -1, 1, specials=False)
    return Case([x], {"threshold": d.real(0.05, 0.5, bad=(0.0, -1.0, np.nan)),
                      "off_spike": d.flag()})


def _delta_ref(x, threshold=0.1, off_spike=False):
    x = _f64(x)
    diff = x - np.concatenate([np.zeros_like(x[:1]), x[:-1]])   # the first step against 0
    s = (diff >= threshold).astype(np.int8)
    if off_spike:
        s = s - (diff <= -threshold).astype(np.int8)
    return s


def _spikes_draw(d, dtype):
    return Case([(d.rng.random((d.size(1),) + d.shape(0, 2)) < 0.3).astype(dtype)])


def _first_spike_ref(s):
    s = np.asarray(s) != 0
    t = s.shape[0]
    return np.where(s.any(axis=0), s.argmax(axis=0), t)


# The random encoder's generator, written in NumPy from its definition in
# nbops/neuromorphic/encoding.py: element (t, j) of a [T, M] train draws
# hash(hash(i_lo ^ hash(i_hi ^ key)) ^ key) / 2**32 for counter i = t M + j,
# with Wellons' lowbias32 hash and key = hash(seed_lo) ^ seed_hi. Reproducing
# it exactly makes the row an exact reference: same seed, same spikes, each
# spike where the uniform falls below the neuron's probability.

# (the generator itself: tests/test_neuromorphic.py's _counter_uniform)


SPIKE_STORAGE = [np.uint8, np.bool_, np.float32, np.float64]


def _encoder_kw(d):
    # (None is NumPy's float64, as in np.zeros: accepted)
    return d.param(SPIKE_STORAGE, [np.int64, np.int8, "f4x"])


def _rate_draw(d, dtype):
    x = d.array(d.shape(0, 3), dtype, -0.5, 1.5)
    steps = d.param(lambda: d.size(1), [0, -1, 2.5, True])
    return Case([x, steps], {
        "gain": d.real(0.0, 2.0, bad=(-1.0, np.nan, "1")),
        "mode": d.param(["bernoulli", "poisson"], ["gauss", None]),
        "seed": d.param(lambda: int(d.rng.integers(0, 2 ** 63)) * d.choice([1, 2]),
                        [-1, 2 ** 64, 1.5, True]),
        "dtype": _encoder_kw(d)})


def _rate_ref(x, num_steps, gain=1.0, mode="bernoulli", seed=0, dtype=np.uint8):
    x = _f64(x)
    with np.errstate(all="ignore"):
        lam = x.reshape(-1) * gain
    lam = np.where(lam > 0, lam, 0.0)            # NaN and negative never spike
    p = -np.expm1(-lam) if mode == "poisson" else np.minimum(lam, 1.0)
    counters = np.arange(num_steps * p.size).reshape(num_steps, p.size)
    return (_counter_uniform(seed, counters) < p).reshape((num_steps,) + x.shape)


def _latency_draw(d, dtype):
    x = d.array(d.shape(0, 3), dtype, -0.2, 1.5)
    steps = d.param(lambda: d.size(1), [0, -3, 4.0])
    return Case([x, steps], {
        "tau": d.real(0.5, 8.0, bad=(0.0, -1.0, np.nan)),
        "threshold": d.real(0.0, 0.5, bad=(-0.1, np.nan)),
        "linear": d.param([False, True], [1, None]),
        "dtype": _encoder_kw(d)})


def _latency_ref(x, num_steps, tau=5.0, threshold=0.01, linear=False, dtype=np.uint8):
    """One spike per neuron at round(tau log(x / (x - threshold))) (or the
    linear ramp), none for x <= threshold or a step past the end."""
    x = _f64(x)
    with np.errstate(all="ignore"):
        if linear:
            t = (1.0 - np.minimum(x, 1.0)) * (num_steps - 1)
        else:
            t = tau * np.log(x / (x - threshold))
        step = np.where((x > threshold) & (t < num_steps), np.floor(t + 0.5), num_steps)
    return np.arange(num_steps).reshape((-1,) + (1,) * x.ndim) == step


def _encoder(fn):
    """Calls the encoder and checks the storage dtype it was asked for (the
    comparison itself sees 0/1 as uint8: a float spike train of a float64
    input may be float32)."""
    def call(*args, dtype=np.uint8, **kw):
        y = fn(*args, dtype=dtype, **kw)
        assert y.dtype == np.dtype(dtype), f"spikes of {y.dtype}, asked for {dtype}"
        assert y.dtype.isnative
        return y
    return call


def _spikes_as_uint8(y):
    y = np.asarray(y)
    assert np.isin(y, (0, 1)).all(), "spikes other than 0 and 1"
    return y.astype(np.uint8)


def _nm_rows():
    spike_dtypes = (np.dtype(np.uint8), np.dtype(np.bool_), F32, F64)
    return [
        Row("lif", "neuromorphic", nm.lif, _lif_draw, _lif_ref, out=False,
            rtol={F32: 0, F64: 0}),
        Row("if_neuron", "neuromorphic", nm.if_neuron, _if_draw, _if_ref, out=False,
            rtol={F32: 0, F64: 0}),
        Row("synaptic", "neuromorphic", nm.synaptic, _synaptic_draw, _synaptic_ref,
            out=False, rtol={F32: 0, F64: 0}),
        Row("alif", "neuromorphic", nm.alif, _alif_draw, _alif_ref, out=False,
            rtol={F32: 0, F64: 0}),
        Row("lif_step", "neuromorphic", _lif_step, _lif_step_draw, _lif_step_ref, out=False,
            rtol={F32: 0, F64: 0}),
        Row("delta", "neuromorphic", nm.delta, _delta_draw, _delta_ref, out=False,
            rtol={F32: 0, F64: 0}),
        *[Row(name, "neuromorphic", _bptt_fn(name), _bptt_draw(name), _bptt_ref(name),
              out=False, rtol={F32: 2e-3, F64: 1e-4}) for name in _BPTT],
        Row("spike_count", "neuromorphic", nm.spike_count, _spikes_draw,
            lambda s: (np.asarray(s) != 0).sum(axis=0), out=False, dtypes=spike_dtypes,
            bad_dtypes=(np.dtype(np.complex64),), rtol={F32: 0, F64: 0}),
        Row("first_spike_time", "neuromorphic", nm.first_spike_time, _spikes_draw,
            _first_spike_ref, out=False, dtypes=spike_dtypes,
            bad_dtypes=(np.dtype(np.complex64),), rtol={F32: 0, F64: 0}),
        Row("rate", "neuromorphic", _encoder(nm.rate), _rate_draw, _rate_ref, out=False,
            result=_spikes_as_uint8),
        Row("latency", "neuromorphic", _encoder(nm.latency), _latency_draw, _latency_ref,
            out=False, result=_spikes_as_uint8),
    ]


TABLE = (_activation_rows() + _arith_rows() + _tensor_rows() + _linalg_rows() + _norm_rows()
         + _pool_rows() + _softmax_rows() + _conv_rows() + _quant_rows()
         + _quant_gemm_rows() + _sp_rows()
         + _nm_rows())
FAMILIES = sorted({r.family for r in TABLE})
