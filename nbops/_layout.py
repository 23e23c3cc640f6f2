"""Array layout helpers shared by the launchers of both devices.

Elementwise kernels come in two forms: a flat one for C-contiguous arrays and
a 2-D one ``(rows, cols)`` with arbitrary strides for everything else. Any
strided array is first reduced to its fewest dimensions (adjacent axes merge
when their strides allow), so a transpose, a column slice or a step slice
usually becomes a single 2-D view; arrays that still need more than two
dimensions are walked over their leading indices, one 2-D block at a time.
"""

import numpy as np


def collapse(shape, *strides_list):
    """Merge adjacent axes that every array traverses as one.

    Returns ``(shape, [strides, ...])`` with size-1 axes dropped; the merged
    shape has at least one axis.
    """
    axes = [i for i, n in enumerate(shape) if n != 1]
    shp = [shape[i] for i in axes]
    sts = [[s[i] for i in axes] for s in strides_list]
    if not shp:
        return (1,), [(0,) for _ in strides_list]
    out_shape = [shp[-1]]
    out_strides = [[s[-1]] for s in sts]
    for i in range(len(shp) - 2, -1, -1):
        if all(s[i] == o[0] * out_shape[0] for s, o in zip(sts, out_strides)):
            out_shape[0] *= shp[i]
        else:
            out_shape.insert(0, shp[i])
            for s, o in zip(sts, out_strides):
                o.insert(0, s[i])
    return tuple(out_shape), [tuple(o) for o in out_strides]


def strided_view(x, shape, strides, offset=0, dtype=None, read_only_input=False):
    """A view of ``x``'s memory with the given shape and byte strides, starting
    ``offset`` bytes after ``x``'s first element. Works for NumPy arrays, the
    CUDA simulator's arrays and any object with ``__cuda_array_interface__``.
    ``dtype``, if given, reinterprets the bytes (the strides stay in bytes).

    ``read_only_input=True`` marks a NumPy view writable even where ``x`` is
    read-only (``np.broadcast_to`` views, say), for an input a kernel only
    reads: Numba types read-only arrays apart, and every GEMM driver would
    otherwise compile a second time for them (seconds each)."""
    if isinstance(x, np.ndarray):
        iface = x.__array_interface__
        if read_only_input and iface["data"][1]:
            iface = dict(iface, data=(iface["data"][0], False))
        return np.asarray(_Interface(iface, x, shape, strides, offset, dtype))
    ary = getattr(x, "_ary", None)
    if isinstance(ary, np.ndarray):  # numba's CUDA simulator wraps NumPy
        return type(x)(strided_view(ary, shape, strides, offset, dtype))
    from numba import cuda

    cai = x.__cuda_array_interface__
    view = _Interface(cai, x, shape, strides, offset, dtype).__array_interface__
    view["version"] = 3
    return cuda.from_cuda_array_interface(view, owner=x, sync=False)


class _Interface:
    """Carries an array interface with a new shape, strides and start; holds
    the owner so the memory outlives the view (as numpy's as_strided does)."""

    def __init__(self, interface, owner, shape, strides, offset, dtype=None):
        iface = {k: v for k, v in interface.items() if k not in ("mask", "descr")}
        ptr, readonly = iface["data"]
        iface.update(shape=tuple(shape), strides=tuple(strides), data=(ptr + offset, readonly))
        if dtype is not None:
            iface["typestr"] = np.dtype(dtype).str
        self.__array_interface__ = iface
        self.base = owner


def blocks_2d(shape, *arrays):
    """Split arrays of a common ``shape`` into matching 2-D strided views.

    Yields ``(flat_start, views)``: the C-order position of each block's first
    element and one 2-D view per array. Contiguous inputs give one block.
    """
    strides = [a.strides for a in arrays]
    cshape, cstrides = collapse(shape, *strides)
    if len(cshape) == 1:
        cshape = (1,) + cshape
        cstrides = [(0,) + s for s in cstrides]
    lead = cshape[:-2]
    block = cshape[-2:]
    block_size = block[0] * block[1]
    for k, idx in enumerate(np.ndindex(*lead) if lead else [()]):
        views = []
        for a, s in zip(arrays, cstrides):
            off = sum(i * st for i, st in zip(idx, s[:-2]))
            views.append(strided_view(a, block, s[-2:], off))
        yield k * block_size, views


def is_c_contiguous(x):
    if isinstance(x, np.ndarray):
        return x.flags.c_contiguous
    fn = getattr(x, "is_c_contiguous", None)
    if fn is not None:
        return fn()
    cai = x.__cuda_array_interface__
    return cai.get("strides") is None or tuple(cai["strides"]) == _c_strides(
        cai["shape"], np.dtype(cai["typestr"]).itemsize)


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def memory_range(x):
    """``(lo, hi)`` byte addresses spanned by ``x`` (hi exclusive)."""
    if isinstance(x, np.ndarray):
        lo, hi = np.byte_bounds(x) if hasattr(np, "byte_bounds") else \
            np.lib.array_utils.byte_bounds(x)
        return lo, hi
    ary = getattr(x, "_ary", None)
    if isinstance(ary, np.ndarray):
        return memory_range(ary)
    cai = x.__cuda_array_interface__
    ptr = cai["data"][0]
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides") or _c_strides(cai["shape"], itemsize)
    lo = ptr + sum(s * (n - 1) for s, n in zip(strides, cai["shape"]) if s < 0)
    hi = ptr + sum(s * (n - 1) for s, n in zip(strides, cai["shape"]) if s > 0) + itemsize
    return lo, hi


def same_layout(a, b):
    """True if ``a`` and ``b`` are the same elements of the same memory."""
    return (a.shape == b.shape and tuple(a.strides) == tuple(b.strides)
            and memory_range(a) == memory_range(b))


def overlaps(a, b):
    """True if the memory of ``a`` and ``b`` may overlap."""
    if a.size == 0 or b.size == 0:
        return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.may_share_memory(a, b)
    lo_a, hi_a = memory_range(a)
    lo_b, hi_b = memory_range(b)
    return lo_a < hi_b and lo_b < hi_a


def elementwise(inputs, out, run_flat, run_2d):
    """Drive an elementwise kernel over ``inputs`` into C-contiguous ``out``.

    Calls ``run_flat(flat_inputs, flat_out)`` once when every input is
    C-contiguous, else ``run_2d(views, out_block)`` for each 2-D block of
    :func:`blocks_2d`. Both devices' launchers use it.
    """
    if out.size == 0:
        return out
    if all(is_c_contiguous(a) for a in inputs):
        run_flat([a.reshape(-1) for a in inputs], out.reshape(-1))
        return out
    out_flat = out.reshape(-1)
    for start, views in blocks_2d(out.shape, *inputs):
        rows, cols = views[0].shape
        run_2d(views, out_flat[start:start + rows * cols].reshape(rows, cols))
    return out
