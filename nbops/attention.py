"""Attention: ``scaled_dot_product_attention`` (fused, tiled, online softmax)
and the sinusoidal ``positional_encoding``, on CPU and CUDA.

The attention never builds the L x S score matrix. Keys are visited tile by
tile while each query row keeps a running maximum and a running sum (the
"flash attention" formulation), so extra memory is O(L) per batch*head
beside packed copies of K and V; the backward recomputes the scores tile
by tile from q, k, v, the output and a per-row log-sum-exp. CPU tile sizes
come from :mod:`nbops.autotune` (``NBOPS_AUTOTUNE=0``: ``DEFAULT_CONFIG``).
Kernels: ``nbops/cpu/attention.py`` and ``nbops/cuda/attention.py``.
"""

import math

import numpy as np

from . import _checks, _dispatch, _layout, _spec
from . import autotune as _autotune
from ._dispatch import CPU, CUDA, operator
from .linalg import _operand, _sum_to

__all__ = ["scaled_dot_product_attention", "positional_encoding", "DEFAULT_CONFIG",
           "ATTENTION_CONFIGS", "MAX_HEAD_DIM_CUDA"]

FAMILY = _spec.mirror("attention")


def _samples(dtype):
    """Batches that broadcast, L != S, D != Dv, causal, bool and additive
    masks with a fully masked row, length 1, and scores of about 1e4."""
    rng = np.random.default_rng(0)

    def r(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    def mask(shape, additive):
        keep = rng.random(shape) > 0.35
        keep[..., 0, :] = False
        return np.where(keep, r(*shape), -np.inf).astype(dtype) if additive else keep

    return [
        _spec.Sample((r(2, 3, 4), r(2, 5, 4), r(2, 5, 2)), {}, "L!=S,D!=Dv"),
        _spec.Sample((r(2, 5, 3), r(1, 5, 3), r(5, 3)), dict(causal=True), "causal-broadcast"),
        _spec.Sample((r(1, 6, 4), r(2, 5, 4), r(1, 5, 3)), dict(mask=mask((6, 5), False)),
                     "bool-mask"),
        _spec.Sample((r(2, 4, 4), r(2, 6, 4), r(2, 6, 4)), dict(mask=mask((2, 1, 6), True)),
                     "additive-mask"),
        _spec.Sample((r(1, 3), r(1, 3), r(1, 2)), dict(causal=True), "length-1"),
        _spec.Sample((r(2, 4, 8, scale=100.0), r(2, 6, 8), r(2, 6, 8)), {}, "scores-1e4"),
        _spec.Sample((r(2, 37, 8), r(37, 8), r(37, 8)), dict(causal=True, scale=0.5),
                     "tile-edges"),
    ]


_BAD = _spec.overrides(
    dict(q=np.zeros((2, 4, 4)), k=np.zeros((2, 5, 4)), v=np.zeros((2, 5, 3))), ("q", "k", "v"), (
        (dict(k=np.zeros((2, 5, 3))), ValueError, "head dimensions differ"),
        (dict(v=np.zeros((2, 6, 4))), ValueError, "key and value lengths differ"),
        (dict(mask=np.ones((3, 5), bool)), ValueError, "'mask' of shape"),
        (dict(mask=np.ones((4, 5), np.int32)), TypeError, "'mask' must be bool"),
        (dict(mask=np.zeros((4, 5), np.float32)), TypeError, "'mask' must be bool"),
        (dict(q=np.zeros((3, 4, 4))), ValueError, "do not broadcast"),
        (dict(q=np.zeros(4)), ValueError, "'q' must have at least 2"),
        (dict(k=np.zeros((2, 5, 4), np.float32)), TypeError, "'q' is float64 but 'k'"),
        (dict(causal=1), TypeError, "'causal' must be a bool"),
        (dict(scale=0.0), ValueError, "'scale' must be nonzero")))


def _attention_rule(ctx, grad):
    return _attention_backward(ctx, grad)


SPEC = _spec.OpSpec(
    "scaled_dot_product_attention", FAMILY, ("forward", "backward", "bool_to_additive"),
    backward=_attention_rule, reference="test_attention:reference", samples=_samples,
    bad=_BAD, grad=_spec.Grad((0, 1, 2)),
    tol={_spec.F32: (2e-5, 2e-5), _spec.F64: (1e-11, 1e-12)},
    bench=(_spec.Bench(
        "nbops.bench.attention:attention_numpy", "attention", "nbops.bench.attention:setup",
        reference="nbops.bench.attention:reference",
        options=dict(flops="nbops.bench.attention:case_flops", dtypes=(_spec.F32,),
                     tol=(1e-5, 1e-12), baseline_name="numpy (matmul, softmax, matmul)",
                     pause="nbops.bench.harness:BLAS_PAUSE")),))

#: CPU tiles when tuning is off: 64 queries (two float32 register-tile
#: widths) by 128 keys. Per thread that is a 32 KiB score block, a
#: 16 KiB Q tile and a 16 KiB output accumulator at D = 64: L2-resident;
#: the fastest of the candidates below or level with them at L = 1024
#: (docs/benchmarks.md, figures behind the source's choices).
DEFAULT_CONFIG = {"BQ": 64, "BK": 128}

#: Candidates the autotuner times on the CPU.
ATTENTION_CONFIGS = [
    DEFAULT_CONFIG,
    {"BQ": 64, "BK": 64},
    {"BQ": 64, "BK": 256},
    {"BQ": 32, "BK": 128},
    {"BQ": 128, "BK": 128},
]

#: Largest head dimension (D and Dv) the CUDA kernel takes: it keeps one
#: query row and its accumulator per thread in registers/local memory.
MAX_HEAD_DIM_CUDA = 256


@_autotune.autotune(configs=ATTENTION_CONFIGS, key=["L", "S", "D", "N"],
                    default=DEFAULT_CONFIG, name="nbops.attention")
def _cpu_forward(args, L, S, D, N, dtype, BQ, BK):
    return FAMILY.kernel("forward", CPU)(*args, BQ=BQ, BK=BK)


def _shp(x):
    return tuple(x.shape)


@operator(SPEC)
def scaled_dot_product_attention(q, k, v, mask=None, causal=False, scale=None, out=None):
    """Fused attention ``softmax(q @ k^T * scale + mask) @ v``, as PyTorch's
    ``scaled_dot_product_attention``, without the L x S score matrix.

    Parameters
    ----------
    q : array (..., L, D), float32 or float64
        Queries. Leading (batch, head) axes of q, k, v and the mask
        broadcast as in NumPy; any strides are read in place.
    k : array (..., S, D), same dtype and device
        Keys: the head dimension D must equal q's; S may differ from L.
    v : array (..., S, Dv), same dtype and device
        Values: as many rows as k; Dv may differ from D.
    mask : array, optional
        Broadcastable to (..., L, S). Boolean: True where the query may
        attend the key (PyTorch's convention). Float (q's dtype): added to
        the scaled scores (``-inf`` masks a key).
    causal : bool
        Query i sees keys j <= i only (PyTorch's ``is_causal``: a lower
        triangle aligned to the top left, also when L != S). Combines with
        ``mask``. Key tiles wholly above the diagonal are skipped.
    scale : float, optional
        Factor of the scores; default ``1 / sqrt(D)``.
    out : array (..., L, Dv), optional
        C-contiguous, q's dtype and device, not overlapping the inputs.

    Returns
    -------
    array (batch..., L, Dv) on the inputs' device, batch the broadcast of
    the inputs' leading axes.

    Notes
    -----
    A query row whose every key is masked (all False, all ``-inf``) gives a
    row of zeros and zero gradients, as PyTorch since 2.5
    (``_safe_softmax``); older PyTorch returned NaN there. Scores are
    shifted by the running row maximum, so magnitudes like 1e4 do not
    overflow. Accumulation is in the inputs' dtype; the CPU exponential is
    the vectorized ``nbops.cpu._approx.exp`` (error <= 1 ulp). CPU heads
    may be of any size; the CUDA kernel takes D, Dv <= 256.

    Extra memory: packed copies of k and v, plus O(tile) per thread (CPU)
    or per block (CUDA). The backward (autograd) recomputes the scores
    tile by tile from q, k, v, the output and a per-row log-sum-exp; the
    mask gets no gradient.

    Raises
    ------
    TypeError
        Non-float q/k/v, mixed dtypes or devices, a mask that is neither
        boolean nor of q's dtype, bad ``out`` dtype, non-bool ``causal``,
        non-real ``scale``.
    ValueError
        Inputs of fewer than 2 dimensions, head dimensions of q and k that
        differ, k and v of different lengths, leading axes or a mask that do
        not broadcast, a non-finite or zero scale, a head dimension over 256
        on CUDA, a bad ``out``.

    Example
    -------
    >>> q = np.ones((2, 4, 3, 8), np.float32)                # batch, heads, L, D
    >>> k = v = np.ones((2, 4, 5, 8), np.float32)
    >>> nbops.scaled_dot_product_attention(q, k, v, causal=True).shape
    (2, 4, 3, 8)
    """
    op = "scaled_dot_product_attention"
    batch, L, S, D, Dv, dev, q, k, v, mask = _check(op, q, k, v, mask, causal, out)
    scale = _scale(op, scale, D)
    out = _checks.output(op, out, batch + (L, Dv), q.dtype, dev,
                         {"q": q, "k": k, "v": v, "mask": mask})
    N = int(np.prod(batch)) if batch else 1
    args = _kernel_args(op, dev, q, k, v, mask, batch, L, S, causal, scale)
    out3 = _layout.strided_view(out, (N, L, Dv), (L * Dv * out.itemsize, Dv * out.itemsize,
                                                  out.itemsize))
    empty = _checks.empty((0,), q.dtype, dev)
    if dev == CUDA:
        FAMILY.kernel("forward", CUDA)(*args, out3, empty, L, S, D, Dv)
    else:
        _cpu_forward.run(((*args, out3, empty, L, S, D, Dv),),
                         dict(L=L, S=S, D=D, N=N, dtype=np.dtype(q.dtype).name), gpu=False)
    return out


def positional_encoding(max_len, d_model, dtype=np.float32):
    """Sinusoidal positional encodings of "Attention Is All You Need".

    ``PE[pos, 2i] = sin(pos / 10000^(2i / d_model))`` and
    ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))``; an odd
    ``d_model`` ends with a sine column. Computed in float64, then cast.

    Parameters
    ----------
    max_len : int >= 0
        Number of positions (rows).
    d_model : int >= 1
        Embedding width (columns).
    dtype : float32 (default) or float64

    Returns
    -------
    numpy.ndarray (max_len, d_model) on the CPU (``nbops.to_device`` moves
    it), to be added to token embeddings of shape (..., max_len, d_model).

    Raises
    ------
    TypeError
        Non-integer sizes, a dtype other than float32/float64.
    ValueError
        Negative ``max_len``, ``d_model`` < 1.

    Example
    -------
    >>> pe = nbops.positional_encoding(50, 16)
    >>> pe.shape, float(pe[0, 0]), float(pe[0, 1])
    ((50, 16), 0.0, 1.0)
    """
    op = "positional_encoding"
    for name, value, low in (("max_len", max_len, 0), ("d_model", d_model, 1)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{op}: argument '{name}' must be an int, "
                            f"got {_checks.describe(value)}")
        if value < low:
            raise ValueError(f"{op}: argument '{name}' must be >= {low}, got {value}")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        dtype = repr(dtype)      # not a dtype at all: refused below by name
    if dtype not in _checks.FLOAT_DTYPES:
        raise TypeError(f"{op}: argument 'dtype' must be float32 or float64, got {dtype}")
    _checks.allocation(op, (max_len, d_model), np.float64)
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    i2 = np.arange(0, d_model, 2, dtype=np.float64)
    angle = pos / np.power(10000.0, i2 / d_model)
    pe = np.empty((max_len, d_model), np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, :d_model // 2])
    return pe.astype(dtype)


# ---------------------------------------------------------------------------
# Checks and kernel arguments


def _check(op, q, k, v, mask, causal, out):
    """Checks of an attention call; ``(batch, L, S, D, Dv, device, q, k, v,
    mask)``, the arrays as :func:`nbops._checks.array` returns them."""
    q, k, v = (_checks.array(op, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    _checks.same_dtype(op, q=q, k=k, v=v)
    if mask is not None:
        if not (isinstance(mask, np.ndarray) or _dispatch.is_device_array(mask)):
            raise TypeError(f"{op}: argument 'mask' must be an array or None, "
                            f"got {_checks.describe(mask)}")
        if isinstance(mask, np.ndarray) and not mask.dtype.isnative:
            mask = _checks.array(op, "mask", mask, (np.dtype(np.bool_), q.dtype))
        if mask.dtype != np.bool_ and mask.dtype != q.dtype:
            raise TypeError(f"{op}: argument 'mask' must be bool (True = may attend) or "
                            f"{q.dtype} (added to the scores), got {mask.dtype}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{op}: argument 'causal' must be a bool, "
                        f"got {_checks.describe(causal)}")
    dev = _dispatch.resolve_device(op, q=q, k=k, v=v, mask=mask, out=out)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise ValueError(f"{op}: argument '{name}' must have at least 2 dimensions "
                             f"(..., length, head_dim), got shape {_shp(x)}")
    L, D = _shp(q)[-2:]
    S, Dk = _shp(k)[-2:]
    Sv, Dv = _shp(v)[-2:]
    if Dk != D:
        raise ValueError(f"{op}: head dimensions differ: 'q' has {D} (shape {_shp(q)}) "
                         f"but 'k' has {Dk} (shape {_shp(k)})")
    if Sv != S:
        raise ValueError(f"{op}: key and value lengths differ: 'k' has {S} rows "
                         f"(shape {_shp(k)}) but 'v' has {Sv} (shape {_shp(v)})")
    try:
        batch = tuple(np.broadcast_shapes(_shp(q)[:-2], _shp(k)[:-2], _shp(v)[:-2]))
    except ValueError:
        raise ValueError(f"{op}: leading axes of 'q' {_shp(q)[:-2]}, 'k' {_shp(k)[:-2]} "
                         f"and 'v' {_shp(v)[:-2]} do not broadcast") from None
    if mask is not None:
        full = batch + (L, S)
        try:
            ok = np.broadcast_shapes(_shp(mask), full) == full
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{op}: argument 'mask' of shape {_shp(mask)} cannot broadcast "
                             f"to the scores' shape {full} (batch..., L, S)")
    if dev == CUDA and max(D, Dv) > MAX_HEAD_DIM_CUDA:
        raise ValueError(f"{op}: the CUDA kernel takes head dimensions up to "
                         f"{MAX_HEAD_DIM_CUDA}, got D={D}, Dv={Dv}")
    return batch, L, S, D, Dv, dev, q, k, v, mask


def _scale(op, scale, D):
    if scale is None:
        return 1.0 / math.sqrt(D) if D > 0 else 1.0
    value = _checks.scalar(op, "scale", scale)
    if value == 0:
        raise ValueError(f"{op}: argument 'scale' must be nonzero, got {value}")
    return value


def _broadcast_view(x, shape):
    """``x`` seen with ``shape`` (NumPy broadcasting; zero strides)."""
    nd = len(shape)
    xs, st = (1,) * (nd - x.ndim) + _shp(x), (0,) * (nd - x.ndim) + tuple(x.strides)
    st = tuple(0 if n == 1 and t != 1 else s for n, t, s in zip(xs, shape, st))
    if isinstance(x, np.ndarray):
        return np.lib.stride_tricks.as_strided(x, shape, st)
    return _layout.strided_view(x, shape, st, 0)


def _additive_mask(op, dev, mask, dtype):
    """A float mask: booleans become 0 (attend) / -inf (masked)."""
    if mask.dtype != np.bool_:
        return mask
    src = mask
    if dev == CPU:
        src = np.ascontiguousarray(mask)
    elif not _layout.is_c_contiguous(src):  # rare: a strided boolean device mask
        src = _dispatch.to_device(np.ascontiguousarray(_dispatch.to_host(src)))
    fm = _checks.empty(_shp(mask), dtype, dev)
    FAMILY.kernel("bool_to_additive", dev)(src.reshape(-1), fm.reshape(-1))
    return fm


def _kernel_args(op, dev, q, k, v, mask, batch, L, S, causal, scale):
    """``(qbuf, offq, sqr, sqc, kbuf, ..., mbuf, offm, smr, smc, causal,
    scale)``: each operand as memory, per-batch offsets and element strides."""
    args = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        args += list(_operand(op, name, x, batch))
    N = int(np.prod(batch)) if batch else 1
    if mask is None:
        args += [_checks.empty((0,), q.dtype, dev), np.zeros(N, np.int64), 0, 0]
    else:
        fm = _additive_mask(op, dev, mask, np.dtype(q.dtype))
        args += list(_operand(op, "mask", _broadcast_view(fm, batch + (L, S)), batch))
    return args + [bool(causal), float(scale)]


# ---------------------------------------------------------------------------
# Backward (autograd): recomputation, the flash-attention formulas


def _contiguous(x, shape, dev):
    if dev == CPU:
        return np.ascontiguousarray(np.asarray(x).reshape(shape))
    if not _layout.is_c_contiguous(x):
        x = _dispatch.to_device(np.ascontiguousarray(_dispatch.to_host(x)))
    return x.reshape(shape)


def _attention_backward(ctx, grad):
    q, k, v, mask, causal, scale = ctx.inputs[:6]
    op = "scaled_dot_product_attention"
    batch, L, S, D, Dv, dev, q, k, v, mask = _check(op, q, k, v, mask, causal, None)
    scale = _scale(op, scale, D)
    N = int(np.prod(batch)) if batch else 1
    args = _kernel_args(op, dev, q, k, v, mask, batch, L, S, causal, scale)
    o3 = _contiguous(ctx.output, (N, L, Dv), dev)
    g3 = _contiguous(grad, (N, L, Dv), dev)
    dq = _checks.empty((N, L, D), q.dtype, dev)
    dk = _checks.empty((N, S, D), q.dtype, dev)
    dv = _checks.empty((N, S, Dv), q.dtype, dev)
    kw = _backward_tiles(L, S, D, N, q.dtype) if dev == CPU else {}
    FAMILY.kernel("backward", dev)(*args, o3, g3, dq, dk, dv, L, S, D, Dv, **kw)
    grads = []
    for g, x, rows, cols in ((dq, q, L, D), (dk, k, S, D), (dv, v, S, Dv)):
        g = g.reshape(batch + (rows, cols))
        grads.append(_sum_to(g, _shp(x)))
    return (*grads, None, None, None, None)


def _backward_tiles(L, S, D, N, dtype):
    """The tiles the forward used (its statistics pass reruns it)."""
    try:
        return _cpu_forward.config_for((), dict(L=L, S=S, D=D, N=N,
                                                dtype=np.dtype(dtype).name), gpu=False)
    except Exception:  # tuned in another process and forgotten: the default
        return DEFAULT_CONFIG



# ---------------------------------------------------------------------------
# Pre-tuning shapes for ``python -m nbops tune``

#: (batch*heads, L, D) tuned by ``python -m nbops tune``; the first group
#: also with ``--quick``.
TUNE_SHAPES = ([(32, 512, 64), (32, 1024, 64)], [(32, 2048, 64), (16, 1024, 128)])


def _tune_attention(dtype, quick):
    rng = np.random.default_rng(0)
    for n, L, D in TUNE_SHAPES[0] + ([] if quick else TUNE_SHAPES[1]):
        q, k, v = (rng.standard_normal((n, L, D)).astype(dtype) for _ in range(3))
        scaled_dot_product_attention(q, k, v)


_autotune.register_tuning(
    "attention", _tune_attention,
    lambda: f"attention query/key tile sizes, {sum(map(len, TUNE_SHAPES))} shapes")
