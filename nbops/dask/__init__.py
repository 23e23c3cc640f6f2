"""nbops over Dask arrays: lazy Dask arrays in, lazy Dask arrays out.

Every function here takes Dask arrays, builds a graph whose tasks call the
ordinary nbops operators on NumPy (or device) chunks, and returns a Dask
array; nothing runs until ``.compute()``. Requires the ``nbops[dask]`` extra
(dask[array], distributed).

Why a separate namespace and not Dask arrays accepted by ``nbops.conv2d``
itself: the public ops are eager and return the array they computed; a Dask
argument would silently change the return type, the cost model (nothing
runs) and the error timing, and every op's checks would need a Dask path.
Here each function says which axes may be chunked, validates its arguments
when the graph is built (on an empty chunk, so errors come before any
work), and refuses a chunking it cannot honour with the rechunk to do -- as
dask-image does for ``scipy.ndimage``.

==========================  ===================================================
:func:`elementwise`         any nbops elementwise op or ``nbops.fuse`` kernel,
                            blockwise with broadcasting; ``relu``, ``gelu``,
                            ``add``... are the same for one op
:func:`conv2d`              batch chunks; H/W chunks through an overlap of the
                            kernel's reach for stride-1 "same" convolutions
:func:`max_pool2d`, :func:`avg_pool2d`, :func:`batch_norm` (eval),
:func:`layer_norm`, :func:`softmax`, :func:`scaled_dot_product_attention`
                            chunked along the axes the op is independent over
:func:`linear`, :func:`matmul`  blockwise contraction, K concatenated per task
:func:`csr_mm`, :func:`csr_mv`  CSR rows split by nnz, dense operand broadcast
:func:`quant_linear`, :func:`quant_conv2d`  int8 chunks of a fixed scale
:func:`spiking`             neurons in parallel, time chunks as a chain that
                            carries the membrane state (bit-identical)
:func:`map_model`           an ``nn.Module`` or ONNX session over a batch axis
:func:`setup`               the worker plugin (threads per task)
==========================  ===================================================

Constants (weights, models, sparse row blocks) enter the graph once, as one
key each: a worker fetches a key once and keeps it for every task of that
computation that needs it, so a weight crosses the network once per worker,
not once per chunk.

Threads: nbops' CPU kernels run on Numba's own pool (OpenMP, TBB or
workqueue). Each task sets its Numba thread count to the machine's cores
divided by the Dask threads of all the workers on that machine (asked of the
scheduler once per worker process), at least 1: one worker process with one
Dask thread per machine (``dask worker --nthreads 1``, the recommended setup
for large chunks) gives nbops all the cores; ``LocalCluster(n_workers=2,
threads_per_worker=1)`` on 2 cores gives each task 1; ``k`` threads in one
process give each ``cores // k``. The cores are never oversubscribed. Numba's
thread count is per Python thread, which is why every task sets it. With the workqueue
layer, which aborts on concurrent parallel calls, more than one Dask thread
per process is refused with an error saying what to change.
:func:`setup` pins the threads per task instead and checks the layer on
every worker up front.

Devices: chunks exposing ``__cuda_array_interface__`` (CuPy, Numba device
arrays) run the CUDA kernels, since each task calls the public op, which
dispatches on its arguments; constants must then be device arrays too.
"""

import functools
import itertools

import numpy as np

from . import _tasks

__all__ = ["elementwise", "conv2d", "max_pool2d", "avg_pool2d", "batch_norm", "layer_norm",
           "softmax", "scaled_dot_product_attention", "linear", "matmul", "csr_mm",
           "csr_mv", "quant_linear", "quant_conv2d", "spiking", "map_model", "setup",
           "NbopsWorkerPlugin"]


def _da():
    try:
        import dask.array as da
    except ImportError as e:  # pragma: no cover - the extra is missing
        raise ImportError("nbops.dask needs the nbops[dask] extra: "
                          "pip install 'nbops[dask]'") from e
    return da


# ---------------------------------------------------------------------------
# Shared helpers


def _is_dask(x):
    return isinstance(x, _da().Array)


def _dask_array(op, name, x):
    if not _is_dask(x):
        raise TypeError(f"nbops.dask.{op}: argument '{name}' must be a dask.array.Array, got "
                        f"{type(x).__name__}; wrap it with dask.array.from_array(x, "
                        "chunks=...)")
    return x


def _const(x):
    """A constant (weight, model, array) as one key of the graph, fetched
    once per worker; numbers, strings and None stay inline."""
    if x is None or isinstance(x, (bool, int, float, str, tuple)):
        return x
    import dask

    return dask.delayed(x, pure=False, traverse=False)


def _require_whole(op, name, x, axes, why):
    """Refuse a chunked axis that the op needs in one piece, naming it and
    the rechunk that fixes it."""
    for ax in axes:
        if len(x.chunks[ax]) > 1:
            raise ValueError(
                f"nbops.dask.{op}: argument '{name}' is chunked along axis {ax} "
                f"({len(x.chunks[ax])} chunks: {x.chunks[ax][:4]}...) but {why}; rechunk it: "
                f"{name}.rechunk({{{ax}: -1}})")


def _empty_like_chunk(x, keep):
    """A host array shaped like ``x`` with every axis in ``keep`` whole and
    no elements: the probe that checks arguments and gives the output's
    shape and dtype without computing anything."""
    # some ops refuse an empty non-batch axis: only the first free axis is
    # emptied, the others keep their first chunk's size
    free = [ax for ax in range(x.ndim) if ax not in keep]
    return np.empty(tuple(n if ax in keep else 0 if ax == free[0] else x.chunks[ax][0]
                          for ax, n in enumerate(x.shape)), x.dtype)


def _host_meta(obj):
    """Constants as the probe sees them: device arrays copied to the host
    once (the probe runs on the host; workers get the originals)."""
    if hasattr(obj, "__cuda_array_interface__") and hasattr(obj, "copy_to_host"):
        return obj.copy_to_host()
    return obj


def _map_batches(op, fn, arrays, consts, whole, out_chunks=None):
    """The one blockwise wrapper behind the per-op functions.

    ``fn(*blocks, *consts)`` runs per block. ``arrays`` are Dask arrays of
    one ndim with aligned chunks; ``whole[i]`` lists the axes of
    ``arrays[i]`` that must be one chunk. The output keeps the first
    array's chunks along its other axes and takes the probe's full size on
    the whole ones, unless ``out_chunks`` is given.
    """
    da = _da()
    for i, (x, w) in enumerate(zip(arrays, whole)):
        _require_whole(op, f"arg{i}" if i else "x", x, w, "the op needs that axis whole")
    batch = [ax for ax in range(arrays[0].ndim) if ax not in whole[0]]
    probe = fn(*(_empty_like_chunk(x, w) for x, w in zip(arrays, whole)),
               *(_host_meta(c) for c in consts))
    if out_chunks is None:
        if probe.ndim != arrays[0].ndim:
            raise ValueError(f"nbops.dask.{op}: the op changed the number of axes "
                             f"({arrays[0].ndim} -> {probe.ndim}); it cannot run blockwise")
        out_chunks = tuple(arrays[0].chunks[ax] if ax in batch else (probe.shape[ax],)
                           for ax in range(probe.ndim))
    return da.map_blocks(_tasks.call, fn, *arrays, *(_const(c) for c in consts),
                         chunks=out_chunks, dtype=probe.dtype,
                         meta=np.empty((0,) * probe.ndim, probe.dtype),
                         token=f"nbops-{op}")


def _token(*args):
    """A key for a graph layer: Dask caches results by key, so two layers
    must never share one."""
    from dask.base import tokenize

    return tokenize(*args)


def _bind(fn, **kwargs):
    return functools.partial(fn, **kwargs) if kwargs else fn


# ---------------------------------------------------------------------------
# Elementwise


def elementwise(fn, *arrays, **kwargs):
    """Apply an elementwise nbops op (or an ``nbops.fuse`` kernel) blockwise.

    Parameters
    ----------
    fn : callable
        ``nbops.relu``, ``nbops.add``, a :class:`nbops.fusion.Fused` without
        a reduction, ...: anything elementwise over broadcast arguments.
    *arrays : dask arrays (float32/float64) or Python numbers
        Broadcast as in NumPy; chunks are unified by Dask.
    **kwargs
        Passed to ``fn`` (``approximate="tanh"``...).

    Returns
    -------
    dask.array.Array of the broadcast shape, chunked as Dask unifies them.

    Raises
    ------
    ValueError
        A fused kernel with a reduction (a reduction is not blockwise).
    TypeError
        No Dask array among the arguments; and whatever ``fn`` raises on an
        empty chunk of the arguments (wrong dtype...), at graph build.

    Example
    -------
    >>> x = dask.array.from_array(np.linspace(-1, 1, 8, dtype=np.float32), chunks=3)
    >>> nbops.dask.elementwise(nbops.gelu, x, approximate="tanh").compute()
    """
    da = _da()
    if getattr(fn, "reduce", None) is not None:
        raise ValueError(f"nbops.dask.elementwise: {getattr(fn, 'name', fn)!r} fuses a "
                         f"{fn.reduce!r} reduction, which is not blockwise; fuse the "
                         "elementwise part and reduce the Dask array (.sum(), .max())")
    if not any(_is_dask(a) for a in arrays):
        raise TypeError("nbops.dask.elementwise: no argument is a dask.array.Array")
    fn = _bind(fn, **kwargs)
    probe = fn(*(np.empty((0,) * a.ndim, a.dtype) if _is_dask(a) else a for a in arrays))
    # blockwise over index letters aligned from the right (NumPy's
    # broadcasting): Dask unifies the chunks of shared axes, and a length-1
    # axis broadcasts against any chunking
    ndim = max(a.ndim for a in arrays if _is_dask(a))
    letters = "abcdefghijklmnop"[:ndim]
    args = []
    for a in arrays:
        args += [a, letters[ndim - a.ndim:]] if _is_dask(a) else [a, None]
    _, unified = da.core.unify_chunks(*args)  # blockwise alone misaligned them
    it = iter(unified)
    args = [next(it) if _is_dask(a) else a for a in arrays]
    args = [v for a in args for v in (a, letters[ndim - a.ndim:] if _is_dask(a) else None)]
    return da.blockwise(_tasks.call, letters, fn, None, *args, dtype=probe.dtype,
                        meta=np.empty((0,) * np.ndim(probe), probe.dtype),
                        name="nbops-elementwise-" + _token(fn, *args))


def _elementwise_op(name):
    def op(*arrays, **kwargs):
        import nbops

        return elementwise(getattr(nbops, name), *arrays, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"``nbops.{name}`` blockwise over Dask arrays: "
                  f"``elementwise(nbops.{name}, *arrays, **kwargs)`` (see :func:`elementwise`).")
    return op


_ELEMENTWISE = ("relu", "leaky_relu", "sigmoid", "tanh", "gelu", "silu", "swish", "softplus",
                "elu", "hardswish", "hardtanh", "add", "sub", "mul", "div", "pow", "neg", "exp",
                "log")
for _name in _ELEMENTWISE:
    globals()[_name] = _elementwise_op(_name)
__all__ += list(_ELEMENTWISE)
del _name


# ---------------------------------------------------------------------------
# Batch-parallel operators


def _pairs(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``nbops.conv2d`` over a Dask array ``x`` (N, C, H, W).

    Chunks along N are free. C must be one chunk. H and W may be chunked
    for a stride-1 convolution whose padding is the kernel's reach
    (``dilation * (k - 1) / 2``, odd ``k``: "same"): each chunk gets that many
    neighbouring rows/columns (zeros at the image border) through Dask's
    overlap and is convolved without padding, which equals one call. Other
    spatial chunkings are refused with the rechunk to do.

    ``weight`` (OC, C/groups, kh, kw) and ``bias`` (OC,) are NumPy (or
    device) arrays, sent once per worker. Returns a Dask array
    (N, OC, H', W'). Errors are those of ``nbops.conv2d``, raised when the
    graph is built.

    Example
    -------
    >>> y = nbops.dask.conv2d(x, w, padding=1)   # x: dask (N, C, H, W)
    """
    from .. import conv2d as op

    x = _dask_array("conv2d", "x", x)
    spatial = [ax for ax in (2, 3) if len(x.chunks[ax]) > 1]
    if not spatial:
        return _map_batches("conv2d", _bind(op, stride=stride, padding=padding,
                                            dilation=dilation, groups=groups),
                            [x], [weight, bias], [(1, 2, 3)])
    kh, kw = np.shape(weight)[2:]
    reach = [d * (k - 1) // 2 for d, k in zip(_pairs(dilation), (kh, kw))]
    same = (_pairs(stride) == (1, 1) and all(k % 2 == 1 for k in (kh, kw))
            and _pairs(padding) == tuple(reach))
    if not same:
        ax = spatial[0]
        raise ValueError(
            f"nbops.dask.conv2d: argument 'x' is chunked along axis {ax} "
            f"({'HW'[ax - 2]}), which only a stride-1 'same' convolution (odd kernel, padding "
            f"= dilation * (k - 1) / 2 = {tuple(reach)}) can split; rechunk it: "
            f"x.rechunk({{2: -1, 3: -1}})")
    da = _da()
    depth = {2: reach[0], 3: reach[1]}
    xo = da.overlap.overlap(x, depth=depth, boundary={2: 0, 3: 0})
    oc = np.shape(weight)[0]
    out_chunks = (x.chunks[0], (oc,), x.chunks[2], x.chunks[3])
    _require_whole("conv2d", "x", x, (1,), "the op needs that axis whole")
    fn = _bind(op, stride=1, padding=0, dilation=dilation, groups=groups)
    probe_x = np.zeros((0, x.shape[1], 2 * reach[0] + 1, 2 * reach[1] + 1), x.dtype)
    probe = fn(probe_x, _host_meta(weight), _host_meta(bias))  # checks at build time
    return da.map_blocks(_tasks.call, fn, xo, _const(weight), _const(bias), chunks=out_chunks,
                         dtype=probe.dtype, meta=np.empty((0,) * 4, probe.dtype),
                         token="nbops-conv2d")


def _pool(name):
    def pool(x, kernel_size, stride=None, padding=0, **kwargs):
        import nbops

        x = _dask_array(name, "x", x)
        fn = _bind(getattr(nbops, name), kernel_size=kernel_size, stride=stride,
                   padding=padding, **kwargs)
        # windows cross chunk borders along H and W: those axes stay whole
        return _map_batches(name, fn, [x], [], [(2, 3)])

    pool.__name__ = pool.__qualname__ = name
    pool.__doc__ = (f"``nbops.{name}`` over a Dask array x (N, C, H, W), chunked along N and "
                    "C; H and W must be whole (refused with the rechunk otherwise). Keyword "
                    f"arguments as ``nbops.{name}``; returns a Dask array (N, C, H', W').")
    return pool


max_pool2d = _pool("max_pool2d")
avg_pool2d = _pool("avg_pool2d")


def batch_norm(x, running_mean, running_var, weight=None, bias=None, eps=1e-5):
    """``nbops.batch_norm`` in eval mode (running statistics) over a Dask
    array x (N, C, ...): chunked along every axis but C (the per-channel
    parameters are sent once per worker). Returns a Dask array of x's shape.

    Example: ``nbops.dask.batch_norm(x, mean, var, gamma, beta)``.
    """
    from .. import batch_norm as op

    x = _dask_array("batch_norm", "x", x)
    fn = _bind(op, training=False, eps=eps)
    return _map_batches("batch_norm", fn, [x], [running_mean, running_var, weight, bias],
                        [(1,)])


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``nbops.layer_norm`` over a Dask array: chunked along the leading
    axes, the normalized trailing axes whole. Returns a Dask array of x's
    shape. Example: ``nbops.dask.layer_norm(x, (64,), gamma, beta)``."""
    from .. import layer_norm as op

    x = _dask_array("layer_norm", "x", x)
    k = len(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else 1
    fn = _bind(op, normalized_shape=normalized_shape, eps=eps)
    return _map_batches("layer_norm", lambda b, w, bb: fn(b, weight=w, bias=bb),
                        [x], [weight, bias], [tuple(range(x.ndim - k, x.ndim))])


def softmax(x, axis=-1, log=False):
    """``nbops.softmax`` (``log_softmax`` with ``log=True``) over a Dask
    array, chunked along every axis but ``axis``. Returns a Dask array of
    x's shape. Example: ``nbops.dask.softmax(logits, axis=-1)``."""
    import nbops

    x = _dask_array("softmax", "x", x)
    ax = axis % x.ndim if -x.ndim <= axis < x.ndim else axis
    fn = _bind(nbops.log_softmax if log else nbops.softmax, axis=ax)
    return _map_batches("softmax", fn, [x], [], [(ax,)])


def scaled_dot_product_attention(q, k, v, mask=None, causal=False, scale=None):
    """``nbops.scaled_dot_product_attention`` over Dask arrays q (..., L, D),
    k (..., S, D), v (..., S, Dv) with the same leading axes (batch, heads),
    chunked alike along them; L, S and D whole. ``mask`` (L, S), if given, is
    a NumPy array shared by every chunk. Returns a Dask array (..., L, Dv).

    Example: ``nbops.dask.scaled_dot_product_attention(q, k, v, causal=True)``.
    """
    import nbops

    for name, a in (("q", q), ("k", k), ("v", v)):
        _dask_array("scaled_dot_product_attention", name, a)
        if a.ndim != q.ndim:
            raise ValueError("nbops.dask.scaled_dot_product_attention: q, k and v must have "
                             f"the same number of axes, got {q.ndim}, {k.ndim}, {v.ndim}")
    fn = _bind(nbops.scaled_dot_product_attention, causal=causal, scale=scale)
    last = (q.ndim - 2, q.ndim - 1)
    return _map_batches("scaled_dot_product_attention",
                        lambda a, b, c, m: fn(a, b, c, mask=m), [q, k, v], [mask],
                        [last] * 3)


# ---------------------------------------------------------------------------
# Contractions


def _contract(op, fn, a, b, bias, b_axes):
    """``fn(a_block, b_block, bias_block)`` by ``dask.array.blockwise``: a
    (..., M, K) with b indexed by ``b_axes`` (a string over "k", "n" and
    a's leading letters); K blocks are concatenated so each task runs one
    nbops kernel over the whole contraction (a result equal to one call,
    not a sum of partial products)."""
    da = _da()
    lead = "abcdefgh"[:a.ndim - 2]
    n = b.shape[b_axes.index("n")]
    new_axes = {}
    if _is_dask(b):  # chunks along N become the output's
        if bias is not None and not _is_dask(bias):
            bias = da.from_array(bias, chunks=(b.chunks[b_axes.index("n")],), name=False)
        args = [a, lead + "mk", b, b_axes]
        args += [bias, "n"] if bias is not None else [None, None]
    elif len(b_axes) > 2:  # batched: each task gets its slice of b's batch
        b = da.from_array(b, chunks=a.chunks[:-2] + (-1, -1), name=False)
        args = [a, lead + "mk", b, b_axes, _const(bias), None]
    else:  # one key each, fetched once per worker (NumPy or device arrays alike)
        args = [a, lead + "mk", _const(b), None, _const(bias), None]
        new_axes = {"n": n}
    probe_a = np.empty((0,) * (a.ndim - 2) + (0, a.shape[-1]), a.dtype)  # no rows
    bshape = b.shape if len(b.shape) == 2 else (0,) * (a.ndim - 2) + tuple(b.shape[-2:])
    probe = fn(probe_a, np.empty(bshape, b.dtype),  # arguments checked at graph build
               None if bias is None else np.empty(bias.shape, bias.dtype))
    # the K blocks reach the task as lists, joined there (a single block is
    # passed as it is: Dask's own concatenation copies device blocks to the host)
    b_k = b_axes.index("k") - len(b_axes) if _is_dask(b) or len(b_axes) > 2 else None
    return da.blockwise(_tasks.contract, lead + "mn", fn, None, b_k, None, *args,
                        new_axes=new_axes, dtype=probe.dtype,
                        meta=np.empty((0,) * a.ndim, probe.dtype),
                        name=f"nbops-{op}-" + _token(fn, *args))


def linear(x, weight, bias=None):
    """``nbops.linear`` (``x @ weight.T + bias``) over a Dask array x
    (..., K): chunks of x's leading axes and of weight's rows (N) give the
    output's chunks; K may be chunked in x (its blocks are concatenated in
    each task, which then runs one nbops GEMM). ``weight`` (N, K) and
    ``bias`` (N,) are NumPy arrays (one key each, fetched once per worker)
    or Dask arrays. Returns a Dask array (..., N).

    Example: ``nbops.dask.linear(x, w, b)`` with x dask (B, K), w (N, K).
    """
    import nbops

    x = _dask_array("linear", "x", x)
    if x.ndim < 2:
        raise ValueError("nbops.dask.linear: argument 'x' must have a batch axis, got "
                         f"shape {x.shape}")
    return _contract("linear", lambda a, w, b: nbops.linear(a, w, b), x, weight, bias, "nk")


def matmul(a, b):
    """``nbops.matmul`` of a Dask array a (..., M, K) by b (K, N), or by b
    (..., K, N) with a's leading axes: blockwise, K concatenated per task.
    Returns a Dask array (..., M, N). Example: ``nbops.dask.matmul(a, w)``."""
    import nbops

    a = _dask_array("matmul", "a", a)
    lead = "abcdefgh"[:a.ndim - 2]
    b_axes = "kn" if np.ndim(b) == 2 else lead + "kn"
    if np.ndim(b) not in (2, a.ndim):
        raise ValueError(f"nbops.dask.matmul: 'b' must be 2-D or have a's {a.ndim} axes, "
                         f"got shape {np.shape(b)}")
    return _contract("matmul", lambda x, y, _: nbops.matmul(x, y), a, b, None, b_axes)


# ---------------------------------------------------------------------------
# CSR sparse times dense


def _row_parts(indptr, parts):
    """Row boundaries splitting the stored values into ``parts`` nearly
    equal runs (rows are never split)."""
    rows, nnz = len(indptr) - 1, int(indptr[-1])
    targets = np.linspace(0, nnz, parts + 1)[1:-1]
    cuts = np.searchsorted(indptr, targets, side="left")
    return np.unique(np.concatenate([[0], np.clip(cuts, 0, rows), [rows]]))


def _default_parts():
    try:
        from distributed import default_client

        return max(1, sum(default_client().nthreads().values()))
    except (ImportError, ValueError):
        return _tasks._cores()


def _csr(op, kernel, A, dense, parts):
    da = _da()
    import dask
    from ..sparse import CSRMatrix

    if not isinstance(A, CSRMatrix):
        raise TypeError(f"nbops.dask.{op}: argument 'A' must be an nbops.sparse.CSRMatrix, "
                        f"got {type(A).__name__}")
    if dense.ndim != (1 if op == "csr_mv" else 2) or dense.shape[0] != A.shape[1]:
        raise ValueError(f"nbops.dask.{op}: the dense operand must have shape "
                         f"({A.shape[1]}{'' if op == 'csr_mv' else ', n'}), got {dense.shape}")
    parts = _default_parts() if parts is None else parts
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"nbops.dask.{op}: argument 'parts' must be an int >= 1, got "
                         f"{parts!r}")
    indptr = np.asarray(A.indptr)
    bounds = _row_parts(indptr, min(parts, max(1, A.shape[0])))
    # broadcast: one key that every worker fetches once
    dense = dense.rechunk(-1).to_delayed().reshape(-1)[0] if _is_dask(dense) else _const(dense)
    data, indices = np.asarray(A.data), np.asarray(A.indices)
    blocks = []
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        a, b = indptr[r0], indptr[r1]
        part = CSRMatrix(data[a:b], indices[a:b], indptr[r0:r1 + 1] - a,
                         (int(r1 - r0), A.shape[1]),
                         scale=A.scale if A.dtype == np.int8 else None, check=False)
        task = dask.delayed(_tasks.call, pure=False)(kernel, part, dense)
        blocks.append((task, int(r1 - r0)))
    return blocks


def csr_mm(A, B, parts=None):
    """``nbops.sparse.mm(A, B)`` with the CSR matrix ``A`` (M, K) split by
    rows into ``parts`` blocks of nearly equal nnz (default: the cluster's
    threads, else this machine's cores) and the dense ``B`` (K, N) (NumPy or
    Dask; one key, broadcast to the workers that need it). Returns a Dask
    array (M, N) chunked along rows by the split.

    Raises TypeError (A not a CSRMatrix), ValueError (shapes, bad
    ``parts``); the kernel's own checks run in the tasks.

    Example: ``nbops.dask.csr_mm(A, B, parts=4).compute()``.
    """
    from .. import sparse

    da = _da()
    blocks = _csr("csr_mm", sparse.mm, A, B, parts)
    dtype = np.result_type(B.dtype)
    return da.concatenate([da.from_delayed(t, shape=(s, B.shape[1]), dtype=dtype,
                                           meta=np.empty((0, 0), dtype)) for t, s in blocks])


def csr_mv(A, x, parts=None):
    """``nbops.sparse.mv(A, x)``: as :func:`csr_mm` with a vector x (K,).
    Returns a Dask array (M,). Example: ``nbops.dask.csr_mv(A, x).compute()``."""
    from .. import sparse

    da = _da()
    blocks = _csr("csr_mv", sparse.mv, A, x, parts)
    dtype = np.result_type(x.dtype)
    return da.concatenate([da.from_delayed(t, shape=(s,), dtype=dtype,
                                           meta=np.empty((0,), dtype)) for t, s in blocks])


# ---------------------------------------------------------------------------
# Quantized


def _quant(op, fn, q, scale, zero_point, consts, whole):
    q = _dask_array(op, "q", q)
    _require_whole(op, "q", q, whole, "the op needs that axis whole")
    da = _da()
    probe = _tasks.quantized(fn, scale, zero_point, _empty_like_chunk(q, whole),
                             *(_host_meta(c) for c in consts))
    chunks = tuple(q.chunks[ax] if ax not in whole else (probe.shape[ax],)
                   for ax in range(q.ndim))
    return da.map_blocks(_tasks.quantized, fn, scale, zero_point, q,
                         *(_const(c) for c in consts), chunks=chunks, dtype=probe.dtype,
                         meta=np.empty((0,) * q.ndim, probe.dtype), token=f"nbops-{op}")


def quant_linear(q, scale, zero_point, w, bias=None, **kwargs):
    """``nbops.quant.linear`` over a Dask array ``q`` (..., K) of uint8/int8
    values quantized per tensor with ``(scale, zero_point)``; chunked along
    the leading axes. ``w`` a QTensor or PackedWeight (sent once per
    worker); ``kwargs`` (``out_scale``, ``out_zero_point``, ``out_dtype``,
    ``requant``) as ``quant.linear``. Returns a Dask array: the integer
    values of the requantized result (scale ``out_scale``), or float32 when
    ``out_scale`` is omitted.

    Example: ``nbops.dask.quant_linear(q, 0.02, 128, qw, out_scale=0.05, out_zero_point=0)``.
    """
    from .. import quant

    fn = _bind(lambda x, ww, b, **kw: quant.linear(x, ww, b, **kw), **kwargs)
    return _quant("quant_linear", fn, q, scale, zero_point, [w, bias], (q.ndim - 1,))


def quant_conv2d(q, scale, zero_point, w, bias=None, **kwargs):
    """``nbops.quant.conv2d`` (QLinearConv) over a Dask array ``q``
    (N, C, H, W) of quantized values with ``(scale, zero_point)``, chunked
    along N. ``kwargs`` as ``quant.conv2d`` (stride, padding, out_scale...).
    Returns a Dask array as :func:`quant_linear`."""
    from .. import quant

    fn = _bind(lambda x, ww, b, **kw: quant.conv2d(x, ww, b, **kw), **kwargs)
    return _quant("quant_conv2d", fn, q, scale, zero_point, [w, bias], (1, 2, 3))


# ---------------------------------------------------------------------------
# Spiking neurons


_STATES = {"lif": ("v0",), "if_neuron": ("v0",), "synaptic": ("syn0", "v0"),
           "alif": ("v0", "a0")}


def _neuron_slice(value, step, sl):
    """A per-neuron parameter or state restricted to one neuron block."""
    if not (_is_dask(value) or isinstance(value, np.ndarray) and value.ndim):
        return value  # a number, a dtype, a name: the same for every block
    if _is_dask(value):
        return value[sl]
    return np.ascontiguousarray(np.broadcast_to(value, step)[sl])


def spiking(model, inputs, **kwargs):
    """A spiking model of :mod:`nbops.neuromorphic` over a Dask array
    ``inputs`` [T, ...] (time first).

    Neuron axes may be chunked freely: each neuron block runs on its own.
    The time axis may be chunked too: the chunks of one neuron block form a
    chain, each task starting from the state its predecessor ended in, so
    the result is bit-identical to one call over the whole sequence (the
    kernel steps neurons independently, and the state crosses the cut
    unchanged). ``lif``/``if_neuron`` with ``refractory > 0`` keep a
    refractory counter the model neither takes nor returns, so their time
    axis must be one chunk.

    Parameters
    ----------
    model : {"lif", "if_neuron", "synaptic", "alif"}
    inputs : dask array [T, ...], float32/float64
    **kwargs
        The model's arguments (``beta``, ``threshold``, ``reset``,
        ``trace``, ``spike_dtype``, initial states ``v0``/``syn0``/``a0``
        as NumPy or Dask arrays shaped like one step; per-neuron parameters
        as arrays broadcasting to one step).

    Returns
    -------
    tuple of Dask arrays, as the model: ``(spikes, *final_states)`` plus
    ``trace`` when asked; spikes and trace chunked as ``inputs``, states as
    its neuron axes.

    Raises
    ------
    ValueError
        Unknown model, refractory period with a chunked time axis; and the
        model's own errors, checked on one step when the graph is built.

    Example
    -------
    >>> x = dask.array.from_array(np.random.rand(100, 64).astype(np.float32), chunks=(25, 32))
    >>> spikes, v = nbops.dask.spiking("lif", x, beta=0.9)
    """
    import dask
    from .. import neuromorphic

    da = _da()
    if model not in _STATES:
        raise ValueError(f"nbops.dask.spiking: unknown model {model!r}; expected one of "
                         f"{sorted(_STATES)}")
    inputs = _dask_array("spiking", "inputs", inputs)
    fn = getattr(neuromorphic, model)
    names = _STATES[model]
    if kwargs.get("refractory", 0) and len(inputs.chunks[0]) > 1:
        raise ValueError(
            f"nbops.dask.spiking: {model} with refractory={kwargs['refractory']} keeps a "
            "refractory counter that it does not return, so time chunks cannot be chained; "
            "rechunk the time axis: inputs.rechunk({0: -1})")
    trace = bool(kwargs.get("trace", False))
    step = inputs.shape[1:]
    # checked now, on one step (zeros), with the given parameters and states
    probe_kw = {k: v for k, v in kwargs.items() if not _is_dask(v)}
    probe = fn(np.zeros((1,) + step, inputs.dtype), **probe_kw)
    spike_dtype, state_dtype = probe[0].dtype, probe[1].dtype
    xb = inputs.to_delayed()
    nblocks = xb.shape[1:]
    spikes = np.empty(xb.shape, object)
    traces = np.empty(xb.shape, object)
    finals = [np.empty(nblocks, object) for _ in names]
    starts = [np.cumsum((0,) + c) for c in inputs.chunks]
    for j in itertools.product(*(range(n) for n in nblocks)):
        sl = tuple(slice(starts[a + 1][i], starts[a + 1][i + 1]) for a, i in enumerate(j))
        bshape = tuple(inputs.chunks[a + 1][i] for a, i in enumerate(j))
        kw = {k: _neuron_slice(v, step, sl) for k, v in kwargs.items() if k not in names}
        kw["_state_names"] = names
        init = [_neuron_slice(kwargs.get(n), step, sl) for n in names]
        states = None if all(s is None for s in init) else [
            np.zeros(bshape, inputs.dtype) if s is None else s for s in init]
        for t in range(xb.shape[0]):
            out = dask.delayed(_tasks.spiking_chunk, nout=1 + len(names) + trace, pure=False)(
                fn, xb[(t,) + j], states, kw)
            tshape = (inputs.chunks[0][t],) + bshape
            spikes[(t,) + j] = da.from_delayed(out[0], tshape, dtype=spike_dtype,
                                               meta=np.empty((0,) * inputs.ndim, spike_dtype))
            if trace:
                traces[(t,) + j] = da.from_delayed(out[-1], tshape, dtype=state_dtype)
            states = [out[1 + i] for i in range(len(names))]
        for i in range(len(names)):
            finals[i][j] = da.from_delayed(states[i], bshape, dtype=state_dtype,
                                           meta=np.empty((0,) * len(bshape), state_dtype))
    result = [da.block(spikes.tolist())] + [da.block(f.tolist()) for f in finals]
    if trace:
        result.append(da.block(traces.tolist()))
    return tuple(result)


# ---------------------------------------------------------------------------
# Models


def map_model(model, x, batch_axis=0):
    """Run a model over the batch chunks of a Dask array.

    Parameters
    ----------
    model : nbops.nn.Module in eval mode, or an ONNX session
        A session is recognised by ``run(None, {name: x})`` and
        ``get_inputs()`` (``nbops.onnx.InferenceSession``; onnxruntime's
        has the same interface) and fed its first input. The model enters
        the graph as one key: each worker receives it once and reuses it
        for all its chunks.
    x : dask array
        Chunked along ``batch_axis`` only; every other axis whole.
    batch_axis : int
        The axis the model treats as batch; the output keeps it there.

    Returns
    -------
    dask.array.Array: the model's output per chunk, concatenated along
    ``batch_axis``.

    Raises
    ------
    ValueError
        A module in training mode (batch statistics would be per chunk),
        other axes chunked, an output without the batch axis.
    TypeError
        ``model`` neither a module nor a session; ``x`` not a Dask array.

    Example
    -------
    >>> net.eval()
    >>> y = nbops.dask.map_model(net, dask.array.from_array(images, chunks=(256, -1, -1, -1)))
    """
    da = _da()
    x = _dask_array("map_model", "x", x)
    is_session = hasattr(model, "run") and hasattr(model, "get_inputs")
    if not is_session:
        if not callable(model):
            raise TypeError("nbops.dask.map_model: argument 'model' must be an nbops.nn.Module "
                            f"or an ONNX session, got {type(model).__name__}")
        if getattr(model, "training", False):
            raise ValueError("nbops.dask.map_model: the module is in training mode; call "
                             "model.eval() first (batch statistics would be computed per "
                             "chunk)")
    ax = batch_axis % x.ndim
    _require_whole("map_model", "x", x, [a for a in range(x.ndim) if a != ax],
                   f"only the batch axis ({ax}) may be chunked")
    probe_shape = tuple(1 if a == ax else n for a, n in enumerate(x.shape))
    probe = _tasks.run_model(model, np.zeros(probe_shape, x.dtype))
    if probe.ndim <= ax or probe.shape[ax] != 1:
        raise ValueError(f"nbops.dask.map_model: the model's output for a batch of 1 has shape "
                         f"{probe.shape}, without the batch axis {ax}")
    chunks = tuple(x.chunks[ax] if a == ax else (n,) for a, n in enumerate(probe.shape))
    # every axis but the batch one is dropped, the output's others added:
    # the output may have another rank ((N, C, H, W) -> (N, classes))
    return da.map_blocks(_tasks.run_model, _const(model), x, chunks=chunks, dtype=probe.dtype,
                         drop_axis=[a for a in range(x.ndim) if a != ax],
                         new_axis=[a for a in range(probe.ndim) if a != ax],
                         meta=np.empty((0,) * probe.ndim, probe.dtype), token="nbops-model")


# ---------------------------------------------------------------------------
# Workers


def _plugin_class():
    from distributed import WorkerPlugin

    class NbopsWorkerPlugin(WorkerPlugin):
        """Checks Numba's threading layer on every worker and pins nbops'
        threads per task (None: the worker's cores over its Dask threads)."""

        name = "nbops"

        def __init__(self, threads_per_task=None):
            self.threads_per_task = threads_per_task

        def setup(self, worker):
            import numba

            _tasks.check_layer(worker.state.nthreads, f"worker {worker.address}")
            n = self.threads_per_task
            if n is not None and not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
                raise ValueError(f"nbops.dask.setup: threads_per_task={n} is outside "
                                 f"[1, {numba.config.NUMBA_NUM_THREADS}] on {worker.address}")
            _tasks._PINNED = n

    return NbopsWorkerPlugin


def __getattr__(name):
    if name == "NbopsWorkerPlugin":  # built lazily: distributed only when asked for
        return _plugin_class()
    raise AttributeError(name)


def setup(client, threads_per_task=None):
    """Register :class:`NbopsWorkerPlugin` on every worker of ``client``
    (and on workers that join later): each checks that Numba's threading
    layer tolerates its Dask threads, and tasks then use
    ``threads_per_task`` nbops threads (default: the worker's cores divided
    by its Dask threads, which every task applies even without the plugin).

    Raises the worker's RuntimeError (workqueue layer with several Dask
    threads) or ValueError (threads_per_task out of range).

    Example: ``nbops.dask.setup(Client(LocalCluster(n_workers=2, threads_per_worker=1)))``.
    """
    if threads_per_task is not None and (isinstance(threads_per_task, bool)
                                         or not isinstance(threads_per_task, int)):
        raise ValueError("nbops.dask.setup: threads_per_task must be an int or None, got "
                         f"{threads_per_task!r}")
    plugin = _plugin_class()(threads_per_task)
    result = client.register_plugin(plugin, name="nbops")
    for addr, r in (result or {}).items():
        if isinstance(r, dict) and r.get("status") == "error":
            raise RuntimeError(f"nbops.dask.setup: worker {addr}: {r.get('exception')}")
    return plugin

