"""The CSR matrix type: validated on construction, on the CPU or a GPU.

Structure operations (transpose, canonical form, the canonical-format test,
row lengths, content validation, conversion from dense and from COO) reach
their kernels through the registry (``"sparse.<kernel>"``) like every other
operator, so a matrix on the GPU stays there; a transposed structure is
built once per pattern and cached. Launchers that size an output by its
contents read back one scalar. ``from_coo`` takes host arrays only.
"""

import weakref

import numpy as np

from .. import _checks, _dispatch, _spec

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int8))
_INT32_MAX = np.iinfo(np.int32).max


def raw(x):
    """The array behind an autograd tensor (or ``x`` itself)."""
    return x.data if type(x) is not np.ndarray and getattr(x, "__nbops_tensor__", False) else x


def is_tensor(x):
    return type(x) is not np.ndarray and getattr(x, "__nbops_tensor__", False)


def _host(x):
    return np.asarray(_dispatch.to_host(x))


FAMILY = _spec.subpackage("sparse")
# the kernels of the structure operations and matrix-level functions; those
# of the value-level operators are registered from their specs (nbops.sparse)
_dispatch.register_kernels(FAMILY, (
    "to_dense", "add", "expand_rows", "counting_sort", "canonicalize", "is_canonical",
    "row_lengths", "check_structure", "from_dense", "inv_sqrt", "dequantize"))


def _kernel(name, device):
    return FAMILY.kernel(name, device)


def _as_array(op, name, x):
    if isinstance(x, np.ndarray) or _dispatch.is_device_array(x):
        return x
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(f"{op}: argument '{name}' must be an array, got {_checks.describe(x)}")


def _shape(op, shape):
    if not isinstance(shape, (tuple, list)) or len(shape) != 2 or any(
            isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer))
            for n in shape):
        raise TypeError(f"{op}: 'shape' must be a pair of ints (rows, cols), got {shape!r}")
    if shape[0] < 0 or shape[1] < 0:
        raise ValueError(f"{op}: 'shape' must be non-negative, got {tuple(shape)}")
    return int(shape[0]), int(shape[1])


def validate(op, data, indices, indptr, shape, scale):
    """Check the types, dtypes, lengths and devices of CSR arrays (``data``
    may be None for a bare pattern); returns ``(shape, scale, data,
    indices, indptr)``, the arrays as :func:`nbops._checks.array` returns
    them (an autograd tensor's ``data`` as it came)."""
    shape = _shape(op, shape)
    indices = _checks.array(op, "indices", indices, INDEX_DTYPES)
    indptr = _checks.array(op, "indptr", indptr, INDEX_DTYPES)
    vals = indices if data is None else _checks.array(op, "data", raw(data), VALUE_DTYPES)
    if data is not None and not is_tensor(data):
        data = vals
    for name, a in (("data", vals), ("indices", indices), ("indptr", indptr)):
        if a.ndim != 1:
            raise ValueError(f"{op}: '{name}' must be 1-D, got shape {tuple(a.shape)}")
    if indices.dtype != indptr.dtype:
        raise TypeError(f"{op}: 'indices' is {indices.dtype} but 'indptr' is {indptr.dtype}; "
                        "use one index dtype")
    _dispatch.resolve_device(op, data=vals, indices=indices, indptr=indptr)
    if data is None:
        scale = 1.0
    elif vals.dtype == np.int8:
        if scale is None:
            raise ValueError(f"{op}: int8 values need a 'scale' (value = scale * data)")
        scale = _checks.scalar(op, "scale", scale, low=0.0, low_open=True)
    elif scale is not None:
        raise ValueError(f"{op}: 'scale' is only for int8 values, got {vals.dtype} data")
    else:
        scale = 1.0
    nnz = vals.shape[0]
    if indices.shape[0] != nnz:
        raise ValueError(f"{op}: 'indices' has {indices.shape[0]} entries but 'data' has {nnz}")
    if indptr.shape[0] != shape[0] + 1:
        raise ValueError(f"{op}: 'indptr' must have rows + 1 = {shape[0] + 1} entries, "
                         f"got {indptr.shape[0]}")
    if indices.dtype == np.int32 and max(nnz, *shape) > _INT32_MAX:
        raise ValueError(f"{op}: int32 indices cannot address {nnz} nonzeros in a "
                         f"{shape[0]} x {shape[1]} matrix; use int64 indices")
    return shape, scale, data, indices, indptr


def check_structure(op, indices, indptr, shape):
    """The O(nnz) checks of the contents, by the registered kernel of the
    arrays' device (a device reads back a few scalars)."""
    nnz = indices.shape[0]
    first, last = int(indptr[0]), int(indptr[indptr.shape[0] - 1])
    if first != 0:
        raise ValueError(f"{op}: indptr[0] must be 0, got {first}")
    r, k, row = _kernel("check_structure", _dispatch.device_of_array(indices))(
        indices, indptr, shape[1])
    if r >= 0:
        raise ValueError(f"{op}: indptr must be non-decreasing, but indptr[{r}] = "
                         f"{int(indptr[r])} > indptr[{r + 1}] = {int(indptr[r + 1])} (row {r})")
    if last != nnz:
        raise ValueError(f"{op}: indptr[-1] must equal nnz = {nnz}, got {last}")
    if k >= 0:
        raise ValueError(f"{op}: indices[{k}] = {int(indices[k])} (row {row}) is out of range "
                         f"[0, {shape[1]})")


def is_canonical(indices, indptr):
    """True when every row's columns are strictly increasing (sorted, no
    duplicates), computed on the arrays' device."""
    return _kernel("is_canonical", _dispatch.device_of_array(indices))(indices, indptr)


class CSRMatrix:
    """A sparse matrix in compressed sparse row form, on the CPU or a GPU.

    Parameters
    ----------
    data : array (nnz,), float32, float64 or int8; or an ``nbops.Tensor``
        The stored values; a Tensor that requires grad makes the values
        differentiable through every operator of :mod:`nbops.sparse`.
    indices : array (nnz,), int32 or int64
        Column of each value.
    indptr : array (rows + 1,), the dtype of ``indices``
        Row ``r`` holds ``data[indptr[r]:indptr[r + 1]]``.
    shape : (rows, cols)
    scale : float, only (and required) for int8 data
        Each value is ``scale * data[k]`` (pruned, quantized weights).
    check : bool, default True
        Validate the contents: ``indptr`` starts at 0, never decreases and
        ends at nnz; every column index is in ``[0, cols)``. O(nnz), on the
        arrays' device. ``check=False`` trusts the caller (types,
        dtypes and lengths are still checked: they cost nothing).

    Arrays are kept as given (no copy), on the device they live on; all
    three must be on one device. Column order within a row and duplicate
    columns are allowed: every operator accepts them (duplicates add up),
    ``add`` canonicalises its inputs first; :meth:`sum_duplicates` and
    :meth:`sort_indices` return the canonical form.

    Raises
    ------
    TypeError
        A wrong type or dtype, differing index dtypes, mixed devices.
    ValueError
        Lengths that disagree, int32 indices too small for nnz or the shape,
        and (with ``check``) the first bad position of ``indptr`` or
        ``indices``.

    Example
    -------
    >>> A = CSRMatrix(np.array([1., 2., 3.]), np.array([0, 2, 1]),
    ...               np.array([0, 2, 3]), (2, 3))
    >>> A.to_dense()
    array([[1., 0., 2.],
           [0., 3., 0.]])
    """

    __array_ufunc__ = None  # ndarray @ CSRMatrix defers to __rmatmul__

    def __init__(self, data, indices, indptr, shape, *, scale=None, check=True):
        op = "CSRMatrix"
        if not is_tensor(data):
            data = _as_array(op, "data", data)
        indices = _as_array(op, "indices", indices)
        indptr = _as_array(op, "indptr", indptr)
        self.shape, self.scale, data, indices, indptr = validate(op, data, indices, indptr,
                                                                 shape, scale)
        if check:
            check_structure(op, indices, indptr, self.shape)
        self.data = data
        self.indices = indices
        self.indptr = indptr
        self._t = None
        self._canonical = None

    # -- description -------------------------------------------------------
    ndim = 2

    @property
    def nnz(self):
        return int(self.indices.shape[0])

    @property
    def dtype(self):
        """dtype of the stored values (int8 for quantized matrices)."""
        return raw(self.data).dtype

    @property
    def index_dtype(self):
        return self.indices.dtype

    @property
    def device(self):
        """``"cpu"`` or ``"cuda"``."""
        return _dispatch.device_of_array(self.indices)

    @property
    def has_canonical_format(self):
        """Columns strictly increasing within every row (checked once)."""
        if self._canonical is None:
            self._canonical = is_canonical(self.indices, self.indptr)
        return self._canonical

    def row_lengths(self):
        """Stored entries per row, an int64 array on the matrix's device."""
        out = _checks.empty((self.shape[0],), np.int64, self.device)
        return _kernel("row_lengths", self.device)(self.indptr, out)

    def __repr__(self):
        return (f"<CSRMatrix {self.shape[0]}x{self.shape[1]}, nnz={self.nnz}, "
                f"{self.dtype}/{self.index_dtype}, {self.device}>")

    def _like(self, data, indices=None, indptr=None, shape=None, scale=None):
        m = CSRMatrix.__new__(CSRMatrix)
        m.data = data
        m.indices = self.indices if indices is None else indices
        m.indptr = self.indptr if indptr is None else indptr
        m.shape = self.shape if shape is None else shape
        m.scale = self.scale if scale is None else scale
        m._t = None
        m._canonical = self._canonical if indices is None else None
        return m

    def with_data(self, data):
        """The same pattern with new values (an array or Tensor of nnz
        values on this device)."""
        vals = raw(data)
        vals = _checks.array("CSRMatrix.with_data", "data", vals, VALUE_DTYPES[:2])
        data = data if is_tensor(data) else vals
        if tuple(vals.shape) != (self.nnz,):
            raise ValueError(f"CSRMatrix.with_data: 'data' must have shape ({self.nnz},), "
                             f"got {tuple(vals.shape)}")
        _dispatch.resolve_device("CSRMatrix.with_data", data=vals, indices=self.indices)
        return self._like(data, scale=1.0)

    # -- conversions -------------------------------------------------------
    @classmethod
    def from_coo(cls, indices, values, shape, index_dtype=None):
        """CSR from coordinates, as ``torch.sparse_coo_tensor(indices, values,
        shape)``: ``indices`` is a (2, nnz) integer array of (row, col) pairs.
        Duplicates are summed and columns sorted within each row. The index
        dtype is ``indices``' (int32 or int64) unless given. Host arrays only.

        Raises TypeError for wrong dtypes or device arrays, ValueError for a
        wrong shape or an out-of-range coordinate (naming the first).
        """
        op = "CSRMatrix.from_coo"
        indices = _as_array(op, "indices", indices)
        values = _as_array(op, "values", values)
        for name, a in (("indices", indices), ("values", values)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{op}: '{name}' must be a host array; call nbops.to_host "
                                "first and .to_device() on the result")
        indices = _checks.array(op, "indices", indices, INDEX_DTYPES)
        values = _checks.array(op, "values", values, VALUE_DTYPES[:2])
        shape = _shape(op, shape)
        if indices.ndim != 2 or indices.shape[0] != 2:
            raise ValueError(f"{op}: 'indices' must have shape (2, nnz), got {indices.shape}")
        if values.shape != (indices.shape[1],):
            raise ValueError(f"{op}: 'values' must have shape ({indices.shape[1]},), "
                             f"got {values.shape}")
        idt = np.dtype(index_dtype or indices.dtype)
        if idt not in INDEX_DTYPES:
            raise TypeError(f"{op}: 'index_dtype' must be int32 or int64, got {idt}")
        if idt == np.int32 and max(indices.shape[1], *shape) > _INT32_MAX:
            raise ValueError(f"{op}: int32 indices cannot address {indices.shape[1]} "
                             f"entries in a {shape[0]} x {shape[1]} matrix; use int64")
        for axis, name in ((0, "row"), (1, "column")):
            bad = np.flatnonzero((indices[axis] < 0) | (indices[axis] >= shape[axis]))
            if bad.size:
                k = int(bad[0])
                raise ValueError(f"{op}: entry {k} has {name} {indices[axis, k]}, out of "
                                 f"range [0, {shape[axis]})")
        rows = np.ascontiguousarray(indices[0], dtype=idt)
        cols = np.ascontiguousarray(indices[1], dtype=idt)
        ptr = np.empty(shape[0] + 1, idt)
        perm = np.empty(rows.size, np.int64)
        _kernel("counting_sort", _dispatch.CPU)(rows, shape[0], ptr, perm)
        data, ind, ptr = _kernel("canonicalize", _dispatch.CPU)(values[perm], cols[perm], ptr,
                                                                True)
        m = cls(data, ind, ptr, shape, check=False)
        m._canonical = True
        return m

    @classmethod
    def from_dense(cls, a, index_dtype=np.int64):
        """CSR of the nonzero entries of a 2-D float array (NaN counts as
        nonzero, -0.0 does not), canonical, on ``a``'s device; ``index_dtype``
        int32 or int64."""
        op = "CSRMatrix.from_dense"
        a = _checks.array(op, "a", a)
        if a.ndim != 2:
            raise ValueError(f"{op}: 'a' must be 2-D, got shape {tuple(a.shape)}")
        idt = np.dtype(index_dtype)
        if idt not in INDEX_DTYPES:
            raise TypeError(f"{op}: 'index_dtype' must be int32 or int64, got {idt}")
        data, ind, ptr = _kernel("from_dense", _dispatch.device_of_array(a))(a, idt)
        m = cls(data, ind, ptr, tuple(a.shape), check=False)
        m._canonical = True
        return m

    @classmethod
    def from_scipy(cls, m, check=True):
        """From any ``scipy.sparse`` matrix or array; CSR input with
        supported dtypes is wrapped without a copy (other formats go through
        ``tocsr()``; the index arrays are cast to one dtype if they differ)."""
        import scipy.sparse as sp

        if not sp.issparse(m):
            raise TypeError(f"CSRMatrix.from_scipy: expected a scipy.sparse matrix, got "
                            f"{type(m).__name__}")
        m = m.tocsr()
        ind, ptr = m.indices, m.indptr
        if ind.dtype != ptr.dtype:
            wide = np.promote_types(ind.dtype, ptr.dtype)
            ind, ptr = ind.astype(wide), ptr.astype(wide)
        out = cls(m.data, ind, ptr, m.shape, check=check)
        if m.has_canonical_format:
            out._canonical = True
        return out

    def to_scipy(self):
        """A ``scipy.sparse.csr_array`` sharing this matrix's host arrays
        (no copy for host float matrices; int8 values are dequantized)."""
        import scipy.sparse as sp

        m = self.to_host()
        data = raw(m.data)
        if data.dtype == np.int8:
            data = data.astype(np.float32) * np.float32(m.scale)
        return sp.csr_array((data, m.indices, m.indptr), shape=m.shape, copy=False)

    def to_dense(self, out=None):
        """The dense (rows, cols) array on the matrix's device; duplicates
        add up. int8 values are dequantized to float32."""
        from .. import sparse as _ops

        return _ops.to_dense(self, out)

    # -- devices -----------------------------------------------------------
    def to_device(self):
        """This matrix on the GPU (self if it is there already)."""
        if self.device == _dispatch.CUDA:
            return self
        data = self.data.to("cuda") if is_tensor(self.data) else _dispatch.to_device(self.data)
        return self._like(data, _dispatch.to_device(self.indices),
                          _dispatch.to_device(self.indptr))

    def to_host(self):
        """This matrix on the CPU (self if it is there already)."""
        if self.device == _dispatch.CPU:
            return self
        data = self.data.to("cpu") if is_tensor(self.data) else _host(self.data)
        return self._like(data, _host(self.indices), _host(self.indptr))

    # -- structure ---------------------------------------------------------
    def transpose(self):
        """The CSR matrix of the transpose, on this matrix's device, columns
        sorted within rows (duplicates kept, in their order). Built by a
        stable counting sort (the same result on both devices); the
        structure is cached, so ``A.T`` is cheap after the first call."""
        if self._t is None:
            tind, tptr, perm = transpose_plan(self.indices, self.indptr, self.shape)
            from .. import sparse as _ops

            data = _ops.gather(self.data, perm)
            t = self._like(data, tind, tptr, (self.shape[1], self.shape[0]))
            t._t = self
            if not is_tensor(self.data):
                self._t = t
            return t
        return self._t

    T = property(transpose)

    def sort_indices(self):
        """A copy with columns sorted (stably) within each row, on this
        matrix's device; values and index dtype kept (a Tensor's values
        are copied detached)."""
        return self._canonical_copy(False)

    def sum_duplicates(self):
        """A copy in canonical form (columns sorted, duplicates summed in
        their stored order), on this matrix's device, index dtype kept.

        Example
        -------
        >>> A = CSRMatrix(np.array([1., 2., 3.]), np.array([2, 0, 2]),
        ...               np.array([0, 3]), (1, 3)).sum_duplicates()
        >>> A.indices, A.data
        (array([0, 2]), array([2., 4.]))
        """
        return self._canonical_copy(True)

    def _canonical_copy(self, merge):
        data, ind, ptr = _kernel("canonicalize", self.device)(raw(self.data), self.indices,
                                                              self.indptr, merge)
        out = self._like(data, ind, ptr)
        out._canonical = True if merge else None
        return out

    def __matmul__(self, other):
        from .. import sparse as _ops

        return _ops.matmul(self, other)


# ---------------------------------------------------------------------------
# Transposed structures, cached per (indices, indptr) pair

_PLANS = {}


def transpose_plan(indices, indptr, shape):
    """``(t_indices, t_indptr, perm)`` of the transpose of a pattern, on the
    pattern's device: ``t_data = data[perm]`` (``perm`` int64, the index
    arrays of the pattern's dtype). Built by the registered kernels (row of
    each nonzero, stable counting sort of the columns, gather), so equal on
    both devices. Cached while both index arrays are alive, so autograd's
    repeated ``A^T @ G`` builds it once."""
    key = (id(indices), id(indptr), shape)
    hit = _PLANS.get(key)
    if hit is not None and hit[0]() is indices and hit[1]() is indptr:
        return hit[2]
    dev = _dispatch.device_of_array(indices)
    nnz = indices.shape[0]
    rows = _checks.empty((nnz,), indices.dtype, dev)
    _kernel("expand_rows", dev)(indptr, rows)
    tptr = _checks.empty((shape[1] + 1,), indices.dtype, dev)
    perm = _checks.empty((nnz,), np.int64, dev)
    _kernel("counting_sort", dev)(indices, shape[1], tptr, perm)
    plan = (_kernel("gather", dev)(rows, perm, _checks.empty((nnz,), indices.dtype, dev)),
            tptr, perm)
    try:
        refs = (weakref.ref(indices, lambda _: _PLANS.pop(key, None)),
                weakref.ref(indptr, lambda _: _PLANS.pop(key, None)))
    except TypeError:  # arrays that take no weak references are not cached
        return plan
    _PLANS[key] = (*refs, plan)
    return plan
