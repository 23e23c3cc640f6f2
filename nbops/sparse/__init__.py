"""CSR sparse matrices and their operators, on the CPU and CUDA.

For graph neural networks, pruned weights and sparse attention:
:class:`CSRMatrix` (validated, int32/int64 indices, float32/float64 values
or int8 values with a scale) and

* ``mv(A, x)``, ``mm(A, B)`` (also ``A @ x``, ``A.T @ B`` through the cached
  transposed structure), ``sddmm(A, X, Y)`` (``X[i] . Y[j]`` on A's
  pattern), ``softmax(A)`` over each row's stored values, ``add(A, B)``,
  ``scale_rows``/``scale_columns`` and ``gcn_norm``;
* their value-level operators (``mm_values(data, indices, indptr, shape,
  B)`` ...), whose first argument is the differentiable values array: with
  ``nbops.Tensor`` values or dense operands every operator records its
  backward (the gradient on the values of ``mm`` is an SDDMM on the pattern,
  the gradient on B a product with the transpose). Each is declared by an
  :class:`nbops._spec.OpSpec` in ``SPECS`` (kernels, backward rule,
  samples, bad inputs, benchmark cases), which the op table and the bench
  read.

CPU kernels split work into equal shares of rows + nonzeros (merge path), so
power-law row lengths keep every thread busy; CUDA kernels give each row a
group of threads sized to the average row length (see ``sparse/cpu.py`` and
``sparse/cuda.py``). Column order and duplicates within rows are accepted
everywhere (duplicates add up; softmax treats them as separate entries);
``add`` brings non-canonical inputs to canonical form first. Structure
operations (transpose, canonical form, validation, ``from_dense``) run on
the matrix's device too, through the same registry, with equal results.

Example
-------
>>> import numpy as np
>>> from nbops import sparse
>>> A = sparse.CSRMatrix.from_coo(np.array([[0, 1, 1], [2, 0, 0]]),
...                               np.array([1.0, 2.0, 3.0]), (2, 3))
>>> sparse.mv(A, np.ones(3))
array([1., 5.])
"""

import numpy as np

from .. import _checks, _dispatch, _spec
from .._dispatch import operator
from .csr import FAMILY, CSRMatrix, _kernel, is_tensor, raw, transpose_plan, validate

__all__ = ["CSRMatrix", "from_coo", "from_dense", "from_scipy", "mv", "mm", "matmul",
           "sddmm", "softmax", "add", "scale_rows", "scale_columns", "gcn_norm",
           "to_dense", "mv_values", "mm_values", "sddmm_values", "softmax_values",
           "softmax_values_backward", "scale_values", "gather", "scatter"]

from_coo = CSRMatrix.from_coo
from_dense = CSRMatrix.from_dense
from_scipy = CSRMatrix.from_scipy


def _dense(op, name, x, ndim, device):
    x = _checks.array(op, name, x)
    if x.ndim != ndim:
        raise ValueError(f"{op}: '{name}' must be {ndim}-D, got shape {tuple(x.shape)}")
    # kernels read rows of dense operands: contiguous rows are one stream
    return np.ascontiguousarray(x) if device == _dispatch.CPU else x


def _pattern(op, data, indices, indptr, shape, scale=None, **dense):
    """Cheap checks of a values-level call (types, lengths, devices; the
    contents were checked when the CSRMatrix was built). Returns
    ``(shape, scale, device, data, indices, indptr)``, the arrays as
    :func:`nbops._checks.array` returns them."""
    shape, scale, data, indices, indptr = validate(
        op, data, indices, indptr, shape,
        scale if data is not None and getattr(data, "dtype", None) == np.int8 else None)
    dev = _dispatch.resolve_device(op, data=data, indices=indices, indptr=indptr, **dense)
    return shape, scale, dev, data, indices, indptr


def _same_values_dtype(op, data, **dense):
    if data.dtype != np.int8:
        _checks.same_dtype(op, data=data, **dense)


def _matrix(op, name, A):
    if not isinstance(A, CSRMatrix):
        raise TypeError(f"{op}: '{name}' must be a CSRMatrix, got {_checks.describe(A)}")
    return A


# ---------------------------------------------------------------------------
# Declarations: samples, bad inputs, backward rules and specs of the
# value-level operators


def _pattern_arrays(rng, m, n, per_row, index, messy=False, long_row=False):
    """Column indices and row pointers of a random m x n pattern: up to
    ``per_row`` sorted distinct columns per row, every third row empty;
    ``messy``: unsorted columns with duplicates; ``long_row``: row 1 holds
    every column (merge-path chunks then split it)."""
    lengths = rng.integers(0, min(per_row, n) + 1, m) if n else np.zeros(m, np.int64)
    lengths[::3] = 0
    if long_row and m > 1:
        lengths[1] = n
    if messy:
        cols = [rng.integers(0, n, k) for k in lengths]
    else:
        cols = [np.sort(rng.choice(n, k, replace=False)) for k in lengths]
    indices = np.concatenate(cols + [np.zeros(0, np.int64)]).astype(index)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(index)
    return indices, indptr


#: (label, rows, cols, columns per row, index dtype, options) of the sample
#: patterns: int32 and int64 indices, empty rows, unsorted columns with
#: duplicates, no entries, empty matrices, and a long row (too large for the
#: simulated CUDA checks)
_PATTERNS = (
    ("9x7", 9, 7, 4, np.int64, {}),
    ("6x5-int32-unsorted-dups", 6, 5, 4, np.int32, dict(messy=True)),
    ("1x1", 1, 1, 1, np.int32, {}),
    ("no-entries", 4, 3, 0, np.int64, {}),
    ("0x0", 0, 0, 0, np.int64, {}),
    ("0x3", 0, 3, 0, np.int32, {}),
    ("3x0", 3, 0, 0, np.int64, {}),
    ("30x200-long-row", 30, 200, 5, np.int64, dict(long_row=True)),
)


def _csr_samples(dtype, seed, values=True):
    """``(label, rng, data, indices, indptr, shape)`` per sample pattern
    (``data`` None unless ``values``)."""
    rng = np.random.default_rng(seed)
    for label, m, n, per_row, index, options in _PATTERNS:
        indices, indptr = _pattern_arrays(rng, m, n, per_row, index, **options)
        data = rng.standard_normal(indices.size).astype(dtype) if values else None
        yield label, rng, data, indices, indptr, (m, n)


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _mv_samples(dtype):
    """x against every pattern, and int8 values with a scale."""
    out = [_spec.Sample((data, ind, ptr, shape, _normal(rng, shape[1], dtype)), {}, label)
           for label, rng, data, ind, ptr, shape in _csr_samples(dtype, 0)]
    # smaller than the float samples, so that the gradient check, which
    # takes the largest, does not get it: int8 values are not differentiable
    rng = np.random.default_rng(1)
    ind, ptr = _pattern_arrays(rng, 5, 4, 3, np.int32)
    q = rng.integers(-127, 128, ind.size).astype(np.int8)
    out.append(_spec.Sample((q, ind, ptr, (5, 4), _normal(rng, 4, dtype)), dict(scale=0.05),
                            "int8-scale"))
    return out


#: widths of B beyond those every pattern gets: each block of 8, 4, 2 and 1
#: float32 cache lines of the CPU kernels and the columns left after them
_WIDE = (16, 40, 70, 136, 250)


def _mm_samples(dtype):
    """B of widths 1 and 5 against every pattern, the wide widths against
    one, and int8 values with a scale."""
    out = []
    for label, rng, data, ind, ptr, shape in _csr_samples(dtype, 2):
        for width in (5, 1) + (_WIDE if label == "9x7" else ()):
            B = _normal(rng, (shape[1], width), dtype)
            out.append(_spec.Sample((data, ind, ptr, shape, B), {}, f"{label},B{B.shape}"))
    rng = np.random.default_rng(3)
    ind, ptr = _pattern_arrays(rng, 8, 6, 4, np.int32)
    q = rng.integers(-127, 128, ind.size).astype(np.int8)
    for width in (3, 37):
        out.append(_spec.Sample((q, ind, ptr, (8, 6), _normal(rng, (6, width), dtype)),
                                dict(scale=0.05), f"int8-scale,B(6, {width})"))
    return out


def _sddmm_samples(dtype):
    """Factors of width 6 and 1 for every pattern, the wide widths for one."""
    out = []
    for label, rng, _, ind, ptr, shape in _csr_samples(dtype, 4, values=False):
        for d in (6, 1) + (_WIDE if label == "9x7" else ()):
            out.append(_spec.Sample((ind, ptr, shape, _normal(rng, (shape[0], d), dtype),
                                     _normal(rng, (shape[1], d), dtype)), {}, f"{label},d={d}"))
    return out


def _softmax_samples(dtype):
    """Every pattern, values of about 1e3 apart, and a row holding NaN, a
    row of 1000 and 1001, a row with -inf."""
    out = [_spec.Sample((data, ind, ptr, shape), {}, label)
           for label, _, data, ind, ptr, shape in _csr_samples(dtype, 5)]
    # smaller than the 9x7 sample, so that the gradient check takes that one
    # (the largest) rather than saturated rows
    rng = np.random.default_rng(6)
    ind, ptr = _pattern_arrays(rng, 6, 5, 4, np.int64)
    out.append(_spec.Sample((_normal(rng, ind.size, dtype) * 1000, ind, ptr, (6, 5)), {},
                            "spread-1e3"))
    out.append(_spec.Sample((np.array([1000.0, 1001.0, np.nan, 1.0, -np.inf, 0.0], dtype),
                             np.array([0, 1, 0, 1, 0, 1]), np.array([0, 2, 4, 6]), (3, 2)),
                            {}, "nan-inf-large"))
    return out


def _softmax_backward_samples(dtype):
    """Row softmaxes of every pattern's values and a gradient."""
    out = []
    for label, rng, data, _, ptr, _ in _csr_samples(dtype, 7):
        y = np.empty(data.size)
        for a, b in zip(ptr[:-1], ptr[1:]):
            e = np.exp(data[a:b] - data[a:b].max()) if b > a else data[a:b]
            y[a:b] = e / e.sum() if b > a else e
        out.append(_spec.Sample((y.astype(dtype), _normal(rng, data.size, dtype), ptr), {},
                                label))
    return out


def _scale_samples(dtype):
    """Row and column scales, each alone (by keyword) and neither."""
    out = []
    for label, rng, data, ind, ptr, shape in _csr_samples(dtype, 8):
        rs, cs = _normal(rng, shape[0], dtype), _normal(rng, shape[1], dtype)
        out += [_spec.Sample((data, ind, ptr, shape, rs, cs), {}, f"{label},both"),
                _spec.Sample((data, ind, ptr, shape), dict(row_scale=rs), f"{label},rows"),
                _spec.Sample((data, ind, ptr, shape), dict(col_scale=cs), f"{label},cols")]
    out.append(_spec.Sample(out[0].args[:4], {}, "no-scales"))
    return out


def _permutation_samples(dtype):
    rng = np.random.default_rng(9)
    return [_spec.Sample((_normal(rng, n, dtype), rng.permutation(n)), {}, f"n={n}")
            for n in (0, 1, 7, 100, 300)]


def _f(*shape, dtype=np.float64):
    return np.ones(shape, dtype)


#: a 4 x 3 pattern with empty row 1, and its pieces by name
_IND, _PTR = np.array([0, 2, 1, 0, 2]), np.array([0, 2, 2, 3, 5])
_A = dict(data=_f(5), indices=_IND, indptr=_PTR, shape=(4, 3))
#: pattern errors every values-level operator raises (its CSR arrays
#: checked by the same function; the contents are not checked)
_PATTERN_BAD = (
    (dict(shape=(4,)), TypeError, "'shape' must be a pair of ints"),
    (dict(shape=(4, -3)), ValueError, "'shape' must be non-negative"),
    (dict(indices=_IND.astype(np.float64)), TypeError, "'indices' must be a int32 or int64"),
    (dict(indices=_IND.astype(np.int32)), TypeError, "'indices' is int32 but 'indptr' is int64"),
    (dict(indices=_IND[:4]), ValueError, "'indices' has 4 entries but 'data' has 5"),
    (dict(indptr=_PTR[:4]), ValueError, r"'indptr' must have rows \+ 1 = 5 entries, got 4"),
    (dict(indptr=_PTR.reshape(5, 1)), ValueError, "'indptr' must be 1-D"),
    (dict(indices=list(_IND)), TypeError, "'indices' must be a numpy.ndarray"),
)
_VALUES_BAD = (
    (dict(data=_f(5, dtype=np.int16)), TypeError, "'data' must be a float32, float64 or int8"),
    (dict(data=_f(5, 1)), ValueError, "'data' must be 1-D"),
    (dict(data="abc"), TypeError, "'data' must be a numpy.ndarray"),
    (dict(data=_f(5, dtype=np.int8), scale=0.0), ValueError, "'scale' must be > 0"),
)


def _pattern_bad(names, good, changes):
    """Bad calls of an operator whose positional arguments are ``names``:
    ``good`` with each change of ``changes`` ((updates, error, match)); an
    update not among ``names`` is a keyword argument."""
    out = []
    for change, error, match in changes:
        kw = {**good, **change}
        out.append(_spec.Bad(tuple(kw.pop(n) for n in names), kw, error, match))
    return out


_TIMES_NAMES = ("data", "indices", "indptr", "shape")


def _mv_bad(dtype):
    good = {**_A, "x": _f(3)}
    return _pattern_bad(_TIMES_NAMES + ("x",), good, _PATTERN_BAD + _VALUES_BAD + (
        (dict(x=_f(4)), ValueError, r"'x' must have 3 entries \(A is 4 x 3\), got shape"),
        (dict(x=_f(3, 1)), ValueError, "'x' must be 1-D"),
        (dict(x=_f(3, dtype=np.float32)), TypeError,
         "'data' is float64 but 'x' is float32; cast one"),
        (dict(x=_f(3, dtype=np.int64)), TypeError, "'x' must be a float32 or float64"),
        (dict(x=[1.0] * 3), TypeError, "'x' must be a numpy.ndarray")))


def _mm_bad(dtype):
    good = {**_A, "B": _f(3, 2)}
    return _pattern_bad(_TIMES_NAMES + ("B",), good, _PATTERN_BAD + _VALUES_BAD + (
        (dict(B=_f(4, 2)), ValueError, r"'B' must have 3 rows \(A is 4 x 3\)"),
        (dict(B=_f(3)), ValueError, "'B' must be 2-D"),
        (dict(B=_f(3, 2, 1)), ValueError, "'B' must be 2-D"),
        (dict(B=_f(3, 2, dtype=np.float32)), TypeError, "'data' is float64 but 'B' is float32"),
        (dict(B=_f(3, 2, dtype=np.bool_)), TypeError, "'B' must be a float32 or float64"),
        (dict(B=_f(3, 2), out=_f(4, 3)), ValueError, r"'out' must have shape \(4, 2\)")))


def _sddmm_bad(dtype):
    good = {k: v for k, v in _A.items() if k != "data"}
    good.update(X=_f(4, 2), Y=_f(3, 2))
    pattern = tuple(c for c in _PATTERN_BAD if "'data'" not in c[2])
    return _pattern_bad(("indices", "indptr", "shape", "X", "Y"), good, pattern + (
        (dict(Y=_f(3, 3)), ValueError, r"X must be \(4, d\) and Y \(3, d\) for a 4 x 3 "
                                       r"pattern, got \(4, 2\) and \(3, 3\)"),
        (dict(X=_f(5, 2)), ValueError, "X must be"),
        (dict(Y=_f(3, 2, dtype=np.float32)), TypeError, "'X' is float64 but 'Y' is float32"),
        (dict(X=_f(4)), ValueError, "'X' must be 2-D"),
        (dict(X=_f(4, 2, dtype=np.int32)), TypeError, "'X' must be a float32 or float64")))


def _softmax_bad(dtype):
    return _pattern_bad(_TIMES_NAMES, dict(_A), _PATTERN_BAD + _VALUES_BAD[:3])


def _softmax_backward_bad(dtype):
    good = dict(y=_f(5), grad=_f(5), indptr=_PTR)
    return _pattern_bad(("y", "grad", "indptr"), good, (
        (dict(grad=_f(5, dtype=np.float32)), TypeError, "'y' is float64 but 'grad' is float32"),
        (dict(grad=_f(4)), ValueError, r"'grad' must have the shape of 'y' \(5,\)"),
        (dict(y=_f(5, dtype=np.int64)), TypeError, "'y' must be a float32 or float64"),
        (dict(indptr=_PTR.astype(np.float64)), TypeError, "'indptr' must be a int32 or int64"),
        (dict(grad=[1.0] * 5), TypeError, "'grad' must be a numpy.ndarray")))


def _scale_bad(dtype):
    good = {**_A, "row_scale": _f(4), "col_scale": _f(3)}
    return _pattern_bad(_TIMES_NAMES, good, _PATTERN_BAD + _VALUES_BAD[:3] + (
        (dict(row_scale=_f(3)), ValueError, "'row_scale' must have 4 entries, got 3"),
        (dict(col_scale=_f(4)), ValueError, "'col_scale' must have 3 entries, got 4"),
        (dict(col_scale=_f(3, 1)), ValueError, "'col_scale' must be 1-D"),
        (dict(row_scale=_f(4, dtype=np.float32)), TypeError,
         "'data' is float64 but 'row_scale' is float32")))


def _permutation_bad(dtype):
    return _pattern_bad(("values", "perm"), dict(values=_f(3), perm=np.arange(3)), (
        (dict(perm=np.arange(4)), ValueError, "'values' and 'perm' must be 1-D of one length"),
        (dict(values=_f(3, 1)), ValueError, "must be 1-D of one length"),
        (dict(perm=np.arange(3, dtype=np.int32)), TypeError, "'perm' must be a int64"),
        (dict(values=_f(3, dtype=np.int64)), TypeError, "'values' must be a float32 or float64"),
        (dict(values=[1.0] * 3), TypeError, "'values' must be a numpy.ndarray")))


def _transposed(data, indices, indptr, shape):
    """Values and structure of A^T (the structure cached per pattern)."""
    tind, tptr, perm = transpose_plan(indices, indptr, shape)
    return (None if data is None else gather(data, perm)), tind, tptr, (shape[1], shape[0])


def _mv_rule(ctx, g):
    data, indices, indptr, shape, x, scale = ctx.inputs[:6]
    need = ctx.needs_input_grad
    gd = gx = None
    if need[0]:
        m, n = shape
        gd = sddmm_values(indices, indptr, shape, g.reshape(m, 1), x.reshape(n, 1))
    if need[4]:
        gx = mv_values(*_transposed(data, indices, indptr, shape), g, scale)
    return gd, None, None, None, gx


def _mm_rule(ctx, g):
    data, indices, indptr, shape, B, scale = ctx.inputs[:6]
    need = ctx.needs_input_grad
    gd = sddmm_values(indices, indptr, shape, g, B) if need[0] else None
    gB = mm_values(*_transposed(data, indices, indptr, shape), g, scale) if need[4] else None
    return gd, None, None, None, gB


def _sddmm_rule(ctx, g):
    indices, indptr, shape, X, Y = ctx.inputs[:5]
    need = ctx.needs_input_grad
    gX = mm_values(g, indices, indptr, shape, Y) if need[3] else None
    gY = mm_values(*_transposed(g, indices, indptr, shape), X) if need[4] else None
    return None, None, None, gX, gY


def _softmax_rule(ctx, g):
    return softmax_values_backward(ctx.output, g, ctx.inputs[2]), None, None, None


def _scale_rule(ctx, g):
    data, indices, indptr, shape, rs, cs = ctx.inputs[:6]
    return scale_values(g, indices, indptr, shape, rs, cs), None, None, None, None, None



# sums of up to 250 products: float64 errors grow with the length
_TOL = {_spec.F32: (2e-5, 2e-5), _spec.F64: (1e-12, 1e-12)}


def _bench(name, setup, baseline, out_like, baseline_name):
    module = "nbops.bench.sparse"
    options = dict(out_like=f"{module}:{out_like}", baseline_name=baseline_name,
                   tol=(1e-5, 1e-12))
    if name != "sparse_mv":
        options["flops"] = f"{module}:product_flops"
    return _spec.Bench(f"{module}:{baseline}", name, f"{module}:{setup}", options=options)


def _spec_of(name, kernel, samples, bad, **fields):
    return _spec.OpSpec(f"sparse.{name}", FAMILY, (kernel,), samples=samples, bad=bad,
                        reference=f"test_sparse:ref_{name}", tol=_TOL, **fields)


SPECS = {s.name: s for s in (
    _spec_of("mv_values", "spmv", _mv_samples, _mv_bad, backward=_mv_rule,
             grad=_spec.Grad((0, 4)),
             bench=(_bench("sparse_mv", "setup_mv", "spmv_scipy", "rows_out",
                           "scipy.sparse"),)),
    _spec_of("mm_values", "spmm", _mm_samples, _mm_bad, backward=_mm_rule,
             grad=_spec.Grad((0, 4)),
             bench=(_bench("sparse_mm", "setup_mm", "spmm_scipy", "rows_out",
                           "scipy.sparse"),)),
    _spec_of("sddmm_values", "sddmm", _sddmm_samples, _sddmm_bad, backward=_sddmm_rule,
             grad=_spec.Grad((3, 4)),
             bench=(_bench("sparse_sddmm", "setup_sddmm", "sddmm_numpy", "sddmm_out",
                           "numpy gather + dot"),)),
    _spec_of("softmax_values", "row_softmax", _softmax_samples, _softmax_bad,
             backward=_softmax_rule, save=("output",), grad=_spec.Grad((0,)), out=False),
    _spec_of("softmax_values_backward", "row_softmax_backward", _softmax_backward_samples,
             _softmax_backward_bad, out=False),
    _spec_of("scale_values", "scale", _scale_samples, _scale_bad, backward=_scale_rule,
             grad=_spec.Grad((0,)), out=False),
    _spec_of("gather", "gather", _permutation_samples, _permutation_bad,
             backward=lambda ctx, g: (scatter(g, ctx.inputs[1]), None),
             grad=_spec.Grad((0,)), out=False),
    _spec_of("scatter", "scatter", _permutation_samples, _permutation_bad,
             backward=lambda ctx, g: (gather(g, ctx.inputs[1]), None),
             grad=_spec.Grad((0,)), out=False),
)}


# ---------------------------------------------------------------------------
# Value-level operators: the differentiable core


def _times_dense(op, kernel_name, dense_name, data, indices, indptr, shape, dense, scale,
                 out):
    """Front of SpMV (1-D ``dense``) and SpMM (2-D)."""
    shape, scale, dev, data, indices, indptr = _pattern(op, data, indices, indptr, shape, scale,
                                                        **{dense_name: dense, "out": out})
    vector = getattr(dense, "ndim", 0) == 1
    dense = _dense(op, dense_name, dense, 1 if vector else 2, dev)
    _same_values_dtype(op, data, **{dense_name: dense})
    if dense.shape[0] != shape[1]:
        raise ValueError(f"{op}: '{dense_name}' must have {shape[1]} "
                         f"{'entries' if vector else 'rows'} (A is {shape[0]} x {shape[1]}), "
                         f"got shape {tuple(dense.shape)}")
    out = _checks.output(op, out, (shape[0],) + tuple(dense.shape[1:]), dense.dtype, dev,
                         {dense_name: dense, "data": data})
    return _kernel(kernel_name, dev)(data, indices, indptr, dense, out, scale)


@operator(SPECS["sparse.mv_values"])
def mv_values(data, indices, indptr, shape, x, scale=1.0, out=None):
    """``y = scale * A @ x`` for the CSR arrays of A (see :func:`mv`).

    ``data`` (nnz,) float32/float64 (the dtype of ``x``) or int8 with
    ``scale``; ``x`` (cols,); returns y (rows,) of x's dtype on their device.
    Differentiable in ``data`` and ``x``.
    """
    if getattr(x, "ndim", 1) != 1:
        raise ValueError(f"sparse.mv_values: 'x' must be 1-D, got shape {tuple(x.shape)}")
    return _times_dense("sparse.mv_values", "spmv", "x", data, indices, indptr, shape, x,
                        scale, out)


@operator(SPECS["sparse.mm_values"])
def mm_values(data, indices, indptr, shape, B, scale=1.0, out=None):
    """``C = scale * A @ B`` for the CSR arrays of A (see :func:`mm`).

    ``B`` (cols, n) float32/float64, any n; returns C (rows, n). Differentiable
    in ``data`` (an SDDMM of the upstream gradient and B on A's pattern) and
    in ``B`` (A^T times the gradient, through the cached transposed structure).
    """
    if getattr(B, "ndim", 2) != 2:
        raise ValueError(f"sparse.mm_values: 'B' must be 2-D, got shape {tuple(B.shape)}")
    return _times_dense("sparse.mm_values", "spmm", "B", data, indices, indptr, shape, B,
                        scale, out)


@operator(SPECS["sparse.sddmm_values"])
def sddmm_values(indices, indptr, shape, X, Y, out=None):
    """``out[k] = X[i] . Y[j]`` for every stored position k = (i, j) of a CSR
    pattern: X (rows, d), Y (cols, d), one float dtype; returns (nnz,).
    Differentiable in X and Y."""
    op = "sparse.sddmm_values"
    shape, _, dev, _, indices, indptr = _pattern(op, None, indices, indptr, shape, X=X, Y=Y,
                                                 out=out)
    X = _dense(op, "X", X, 2, dev)
    Y = _dense(op, "Y", Y, 2, dev)
    _checks.same_dtype(op, X=X, Y=Y)
    if X.shape[0] != shape[0] or Y.shape[0] != shape[1] or X.shape[1] != Y.shape[1]:
        raise ValueError(f"{op}: X must be ({shape[0]}, d) and Y ({shape[1]}, d) for a "
                         f"{shape[0]} x {shape[1]} pattern, got {tuple(X.shape)} and "
                         f"{tuple(Y.shape)}")
    out = _checks.output(op, out, (indices.shape[0],), X.dtype, dev, {"X": X, "Y": Y})
    return _kernel("sddmm", dev)(indices, indptr, X, Y, out)


@operator(SPECS["sparse.softmax_values"])
def softmax_values(data, indices, indptr, shape):
    """Softmax over each row's stored values (empty rows stay empty; the
    row max is subtracted first, NaN propagates to its row). Returns (nnz,).
    Differentiable in ``data``."""
    op = "sparse.softmax_values"
    _, _, dev, data, indices, indptr = _pattern(op, data, indices, indptr, shape)
    data = _checks.array(op, "data", data)
    out = _checks.empty(data.shape, data.dtype, dev)
    return _kernel("row_softmax", dev)(data, indptr, out)


@operator(SPECS["sparse.softmax_values_backward"])
def softmax_values_backward(y, grad, indptr):
    """Gradient of :func:`softmax_values`: ``y * (grad - sum_row(grad * y))``
    from its output ``y``; all three on one device, y and grad (nnz,)."""
    op = "sparse.softmax_values_backward"
    y = _checks.array(op, "y", y)
    grad = _checks.array(op, "grad", grad)
    indptr = _checks.array(op, "indptr", indptr, (np.dtype(np.int32), np.dtype(np.int64)))
    _checks.same_dtype(op, y=y, grad=grad)
    _checks.same_shape(op, y=y, grad=grad)
    dev = _dispatch.resolve_device(op, y=y, grad=grad, indptr=indptr)
    out = _checks.empty(y.shape, y.dtype, dev)
    return _kernel("row_softmax_backward", dev)(y, grad, indptr, out)


@operator(SPECS["sparse.scale_values"])
def scale_values(data, indices, indptr, shape, row_scale=None, col_scale=None):
    """``data[k] * row_scale[i] * col_scale[j]`` at every stored (i, j);
    either scale may be None. Scales are 1-D of length rows / cols and of
    data's dtype. Differentiable in ``data`` (not in the scales)."""
    op = "sparse.scale_values"
    shape, _, dev, data, indices, indptr = _pattern(op, data, indices, indptr, shape,
                                                    row_scale=row_scale, col_scale=col_scale)
    data = _checks.array(op, "data", data)
    scales = {"row_scale": row_scale, "col_scale": col_scale}
    for name, s, n in (("row_scale", row_scale, shape[0]), ("col_scale", col_scale, shape[1])):
        if s is not None:
            s = scales[name] = _dense(op, name, s, 1, dev)
            _checks.same_dtype(op, data=data, **{name: s})
            if s.shape[0] != n:
                raise ValueError(f"{op}: '{name}' must have {n} entries, got {s.shape[0]}")
    out = _checks.empty(data.shape, data.dtype, dev)
    return _kernel("scale", dev)(data, indices, indptr, scales["row_scale"],
                                 scales["col_scale"], out)


def _permutation(op, name, values, perm):
    """Checks of gather/scatter; ``(device, out, values, perm)``."""
    values = _checks.array(op, name, values, (np.dtype(np.float32), np.dtype(np.float64)))
    perm = _checks.array(op, "perm", perm, (np.dtype(np.int64),))
    if values.ndim != 1 or tuple(perm.shape) != tuple(values.shape):
        raise ValueError(f"{op}: '{name}' and 'perm' must be 1-D of one length, got "
                         f"{tuple(values.shape)} and {tuple(perm.shape)}")
    dev = _dispatch.resolve_device(op, **{name: values, "perm": perm})
    return dev, _checks.empty(values.shape, values.dtype, dev), values, perm


@operator(SPECS["sparse.gather"])
def gather(values, perm):
    """``values[perm]`` for a permutation ``perm`` (int64) on either device
    (how ``A.T`` reorders values). Differentiable in ``values``."""
    dev, out, values, perm = _permutation("sparse.gather", "values", values, perm)
    return _kernel("gather", dev)(values, perm, out)


@operator(SPECS["sparse.scatter"])
def scatter(values, perm):
    """``out[perm] = values``, the inverse of :func:`gather`."""
    dev, out, values, perm = _permutation("sparse.scatter", "values", values, perm)
    return _kernel("scatter", dev)(values, perm, out)


# ---------------------------------------------------------------------------
# Matrix-level functions


def mv(A, x, out=None):
    """Sparse matrix times dense vector, ``A @ x``.

    Parameters
    ----------
    A : CSRMatrix (rows, cols), values float32/float64 (or int8 with a scale)
    x : array (cols,), the dtype of A's values (any float for int8 A), on
        A's device; an ``nbops.Tensor`` to differentiate.
    out : array (rows,), optional

    Returns an array (rows,) of x's dtype on A's device (a Tensor when A's
    values or x are tensors). Each row is summed in x's dtype.

    Raises TypeError (not a CSRMatrix, dtypes differ, mixed devices) or
    ValueError (len(x) != cols, bad ``out``).

    Example
    -------
    >>> y = sparse.mv(sparse.from_scipy(scipy.sparse.eye(3, format="csr")), np.ones(3))
    """
    _matrix("sparse.mv", "A", A)
    return mv_values(A.data, A.indices, A.indptr, A.shape, x, A.scale, out=out)


def mm(A, B, out=None):
    """Sparse matrix times dense matrix, ``A @ B``, for B of any width.

    ``A`` CSRMatrix (rows, cols); ``B`` (cols, n) of A's value dtype on A's
    device; returns (rows, n). ``A.T @ B`` (``mm(A.T, B)``) reuses the
    transposed structure cached on A. Errors as :func:`mv`.

    On the CPU, a B of 16 MiB or more whose rows do not start on 64-byte
    cache lines (NumPy's own large arrays start 16 bytes into one) is read
    from a temporary aligned copy when A reads its rows often enough: a
    row straddling lines costs an extra line per fetch (SpMM ran 1.3x
    faster from the copy). That needs B's size in extra memory during the
    call; arrays that nbops allocated, or any line-aligned B, are used as
    they are. :func:`sddmm` treats its Y alike.

    Example
    -------
    >>> C = sparse.mm(A, np.ones((A.shape[1], 64), np.float32))
    """
    _matrix("sparse.mm", "A", A)
    return mm_values(A.data, A.indices, A.indptr, A.shape, B, A.scale, out=out)


def matmul(A, other):
    """``A @ other``: :func:`mv` for a 1-D operand, :func:`mm` for a 2-D one."""
    _matrix("sparse.matmul", "A", A)
    ndim = getattr(other, "ndim", None)
    if ndim == 1:
        return mv(A, other)
    if ndim == 2:
        return mm(A, other)
    raise TypeError(f"sparse.matmul: the right operand must be a 1-D or 2-D array, got "
                    f"{_checks.describe(other)}")


def sddmm(A, X, Y):
    """Sampled dense-dense product: a CSRMatrix with A's pattern whose value
    at stored (i, j) is ``X[i] . Y[j]`` (A's own values are not used): the
    attention scores of a graph attention layer.

    X (rows, d) and Y (cols, d), one float dtype, on A's device. Raises
    TypeError / ValueError for wrong dtypes, devices or shapes.

    Example
    -------
    >>> S = sparse.sddmm(A, Q, K)        # scores on the edges of A
    >>> P = sparse.softmax(S)            # attention weights per row
    >>> out = sparse.mm(P, V)
    """
    _matrix("sparse.sddmm", "A", A)
    return A._like(sddmm_values(A.indices, A.indptr, A.shape, X, Y), scale=1.0)


def softmax(A):
    """Softmax over each row's stored values (a CSRMatrix of A's pattern).
    Duplicate entries count separately; empty rows stay empty."""
    _matrix("sparse.softmax", "A", A)
    return A._like(softmax_values(A.data, A.indices, A.indptr, A.shape))


def scale_rows(A, s):
    """``diag(s) @ A``: row i of A times ``s[i]``; s (rows,) of A's dtype."""
    _matrix("sparse.scale_rows", "A", A)
    _scale_vector("sparse.scale_rows", "row_scale", s, A.shape[0], A)
    return A._like(scale_values(A.data, A.indices, A.indptr, A.shape, row_scale=s))


def scale_columns(A, s):
    """``A @ diag(s)``: column j of A times ``s[j]``; s (cols,) of A's dtype."""
    _matrix("sparse.scale_columns", "A", A)
    _scale_vector("sparse.scale_columns", "col_scale", s, A.shape[1], A)
    return A._like(scale_values(A.data, A.indices, A.indptr, A.shape, col_scale=s))


def _scale_vector(op, role, s, n, A):
    """The checks scale_values makes of a scale vector, under the public
    op's name (its errors named sparse.scale_values)."""
    s = _checks.array(op, "s", raw(s))
    if s.ndim != 1 or s.shape[0] != n:
        raise ValueError(f"{op}: '{role}' must have {n} entries (argument 's', 1-D; A is "
                         f"{A.shape[0]} x {A.shape[1]}), got shape {tuple(s.shape)}")
    _checks.same_dtype(op, **{"A.data": raw(A.data), "s": s})


def add(A, B, alpha=1.0, beta=1.0):
    """``alpha * A + beta * B`` as a canonical CSRMatrix (union of the
    patterns, columns sorted). Inputs that are not canonical (unsorted or
    duplicate columns) are canonicalised first (on a copy).

    Both float32 or both float64, one index dtype, one shape, one device.
    Not differentiable: values that are tensors requiring grad raise
    TypeError. ValueError for different shapes, or when the result could
    exceed int32 indices.
    """
    op = "sparse.add"
    _matrix(op, "A", A)
    _matrix(op, "B", B)
    alpha = _checks.scalar(op, "alpha", alpha)
    beta = _checks.scalar(op, "beta", beta)
    for name, m in (("A", A), ("B", B)):
        if is_tensor(m.data) and m.data.requires_grad:
            raise TypeError(f"{op}: '{name}' has values that require grad; add is not "
                            "differentiable (detach them, or use mm/sddmm)")
        _checks.array(op, name + ".data", raw(m.data))
    if A.shape != B.shape:
        raise ValueError(f"{op}: shapes differ: A is {A.shape}, B is {B.shape}")
    _checks.same_dtype(op, **{"A.data": raw(A.data), "B.data": raw(B.data)})
    if A.index_dtype != B.index_dtype:
        raise TypeError(f"{op}: A has {A.index_dtype} indices but B has {B.index_dtype}")
    dev = _dispatch.resolve_device(op, A=A.indices, B=B.indices)
    if A.index_dtype == np.int32 and A.nnz + B.nnz > np.iinfo(np.int32).max:
        raise ValueError(f"{op}: the sum may hold {A.nnz + B.nnz} entries, beyond int32 "
                         "indices; convert to int64 first")
    A = A if A.has_canonical_format else A.sum_duplicates()
    B = B if B.has_canonical_format else B.sum_duplicates()
    data, ind, ptr = _kernel("add", dev)(raw(A.data), A.indices, A.indptr, raw(B.data),
                                         B.indices, B.indptr, alpha, beta)
    out = CSRMatrix(data, ind, ptr, A.shape, check=False)
    out._canonical = True
    return out


def gcn_norm(A, add_self_loops=True):
    """The GCN propagation matrix ``D^-1/2 (A + I) D^-1/2`` (Kipf and
    Welling), D the row sums of ``A + I``; rows summing to zero stay zero.
    A square CSRMatrix with float values; returns a canonical CSRMatrix."""
    op = "sparse.gcn_norm"
    _matrix(op, "A", A)
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"{op}: A must be square, got {A.shape}")
    if add_self_loops:
        n = A.shape[0]
        eye = CSRMatrix(np.ones(n, A.dtype), np.arange(n, dtype=A.index_dtype),
                        np.arange(n + 1, dtype=A.index_dtype), A.shape, check=False)
        A = add(A, eye.to_device() if A.device == _dispatch.CUDA else eye)
    deg = mv(A, _ones(A.shape[1], A.dtype, A.device))
    inv = _kernel("inv_sqrt", A.device)(deg, _checks.empty(deg.shape, deg.dtype, A.device))
    return A._like(scale_values(raw(A.data), A.indices, A.indptr, A.shape, inv, inv))


def _ones(n, dtype, device):
    x = np.ones(n, dtype)
    return x if device == _dispatch.CPU else _dispatch.to_device(x)


def to_dense(A, out=None):
    """The dense array of A on A's device (duplicates add up; int8 values
    dequantized to float32). ``out``: (rows, cols) C-contiguous, optional."""
    op = "sparse.to_dense"
    _matrix(op, "A", A)
    data = raw(A.data)
    if data.dtype == np.int8:
        data = _kernel("dequantize", A.device)(
            data, A.scale, _checks.empty(data.shape, np.float32, A.device))
    out = _checks.output(op, out, A.shape, data.dtype, A.device, {"A.data": data})
    return _kernel("to_dense", A.device)(data, A.indices, A.indptr, out)
