"""Dense linear algebra: ``matmul``, ``bmm`` and ``linear``, on CPU and CUDA.

All three reach one GEMM kernel per device, ``out[b] = act(A_b @ B_b + bias)``:
on the CPU a packed, cache-blocked kernel with a register-tile micro-kernel
(``nbops/cpu/linalg.py``), or NumPy's BLAS where the autotuner measured it
faster; on CUDA a shared-memory tiled kernel with a register tile per
thread (``nbops/cuda/linalg.py``). Operands are passed to the kernels as
their memory plus element strides and per-batch offsets, so transposed,
sliced and broadcast operands are read in place by the packing step, never
copied first (the BLAS route copies an operand that is neither C- nor
F-contiguous, since BLAS needs one of those).

Dtypes: float32 and float64, never mixed (``float32 @ float64`` is a
``TypeError`` naming both; cast explicitly). Accumulation is in the
operands' dtype, as BLAS does. The CPU block sizes come from
:mod:`nbops.autotune` (``NBOPS_AUTOTUNE=0``: the default config
``DEFAULT_CONFIG``). Backward rules are attached for autograd.
"""

import math
from typing import NamedTuple

import numpy as np

from . import _checks, _dispatch, _formulas, _layout, _runtime, _spec
from . import autotune as _autotune
from ._tunables import (GEMM_SMALL_MAX, GEMM_TASKS_PER_THREAD, GEMV_MAX_ROWS, GEMV_MIN_COLUMNS,
                        GEMV_TASKS_PER_THREAD, STREAM_MAX_ROWS)
from ._dispatch import CPU, CUDA, operator

__all__ = ["matmul", "bmm", "linear", "ACTIVATIONS", "DEFAULT_CONFIG", "GEMM_CONFIGS",
           "GEMM_ROUTES", "GemmPlan", "plan_gemm"]

FAMILY = _spec.mirror("linalg")
# gemm_blas has no CUDA twin: register it on the CPU only, before the specs
# (whose registration of it would name a CUDA module)
_dispatch.register_kernels(FAMILY, ("gemm_blas",), (CPU,))

#: Epilogue activations of :func:`linear`, in the kernels' code order
#: (``nbops.cpu.linalg.EPILOGUES`` without "none"), with the default
#: parameters used when the activation is given by name alone.
ACTIVATIONS = {name: () for name in _formulas.FORWARD}
ACTIVATIONS.update(leaky_relu=(0.01,), swish=(1.0,), softplus=(1.0, 20.0), elu=(1.0,),
                   hardtanh=(-1.0, 1.0))
_ACT_CODES = {name: i + 1 for i, name in enumerate(_formulas.FORWARD)}

IMPLS = ("auto", "nbops", "blas")

#: The CPU config used when tuning is off (``NBOPS_AUTOTUNE=0``): nbops'
#: own kernel, MC x KC panels of A (64 x 256: 64 KiB of float32 in L2),
#: KC x NC panels of B (256 x 2048: 2 MiB, in L3); the small-product route
#: up to SMALL and the streamed-weight route with STREAM = 64 columns of C
#: per task (:data:`GEMM_ROUTES`, :func:`plan_gemm`).
DEFAULT_CONFIG = {"impl": "nbops", "MC": 64, "KC": 256, "NC": 2048, "SMALL": GEMM_SMALL_MAX,
                  "STREAM": 64}

#: Candidates the autotuner times on the CPU: block sizes of nbops' packed
#: kernel around the default (small-product and streamed-weight routes off,
#: SMALL=0 and no STREAM), a wider small-product bound, the streamed-weight
#: route's k slices and column blocks, and NumPy's BLAS.
GEMM_CONFIGS = [
    DEFAULT_CONFIG,
    {"impl": "nbops", "MC": 64, "KC": 512, "NC": 2048, "SMALL": 128, "STREAM": 64},
    {"impl": "nbops", "MC": 64, "KC": 256, "NC": 2048, "SMALL": 128, "STREAM": 128},
    {"impl": "nbops", "MC": 64, "KC": 256, "NC": 2048, "SMALL": 0},
    {"impl": "nbops", "MC": 64, "KC": 256, "NC": 2048, "SMALL": 256},
    {"impl": "nbops", "MC": 96, "KC": 256, "NC": 2048, "SMALL": 0},
    {"impl": "nbops", "MC": 128, "KC": 256, "NC": 4096, "SMALL": 0},
    {"impl": "nbops", "MC": 64, "KC": 384, "NC": 1024, "SMALL": 0},
    {"impl": "nbops", "MC": 48, "KC": 512, "NC": 1024, "SMALL": 0},
    {"impl": "nbops", "MC": 128, "KC": 128, "NC": 4096, "SMALL": 0},
    {"impl": "blas", "MC": 0, "KC": 0, "NC": 0, "SMALL": 0},
]


@_autotune.autotune(configs=GEMM_CONFIGS, key=["m", "n", "k", "batch", "wt"],
                    default=DEFAULT_CONFIG, name="nbops.gemm")
def _cpu_gemm(args, m, n, k, batch, wt, dtype, impl, MC, KC, NC, SMALL=None, STREAM=0):
    # wt: B has contiguous columns (x @ W.T), where the streamed-weight
    # route applies: tuned apart from the same sizes with a row-major B
    if SMALL is None:  # a config written before the small-product route existed
        SMALL = DEFAULT_CONFIG["SMALL"]
    sak, sbk, sbn = args[3], args[6], args[7]
    plan = plan_gemm(batch, m, n, k, sak, sbk, sbn, dict(impl=impl, MC=MC, KC=KC, NC=NC,
                                                         SMALL=SMALL, STREAM=STREAM))
    return FAMILY.kernel("gemm", CPU)(*args, plan)


# ---------------------------------------------------------------------------
# The CPU GEMM's plan: which driver of nbops.cpu.linalg runs a call


class GemmPlan(NamedTuple):
    """How one CPU GEMM call runs (:func:`plan_gemm`): ``route`` names the
    driver (a key of :data:`GEMM_ROUTES`), ``rule`` why it applies,
    ``threads`` the threads it splits over, ``MC``/``KC``/``NC`` the packed
    drivers' cache blocks (``KC`` also the streamed driver's k slices) and
    ``tasks`` the GEMV route's column blocks or the streamed route's columns
    per task."""

    route: str
    rule: str
    threads: int
    MC: int = 0
    KC: int = 0
    NC: int = 0
    tasks: int = 0


#: The routes in the order :func:`plan_gemm` tries them: the first whose
#: rule holds runs the call. The limits are tunables (``nbops._tunables``,
#: each with its benchmark); ``SMALL``/``STREAM`` come from the config.
GEMM_ROUTES = {
    "blas": "the config's impl is 'blas': NumPy/SciPy's BLAS on bands of C",
    "empty": "C has no elements",
    "fill": "k == 0: C = act(bias)",
    "gemv": f"one product of at most {GEMV_MAX_ROWS} rows, A's rows and B's rows or "
            "columns contiguous: B read once, never copied",
    "stream": f"one product of at most {STREAM_MAX_ROWS} rows, B's columns contiguous (x @ "
              "W.T), n >= 8, the config's STREAM > 0: W's rows streamed where they lie",
    "small": "m, n, k all at most the config's SMALL, at least one product per thread: "
             "register tiles reading A and B in place, no packing",
    "batched": "many products (at least GEMM_TASKS_PER_THREAD per thread, or one per "
               "thread of at most MC rows): one packed product per task",
    "tiles": "otherwise: packed panels, tasks over row blocks x column chunks",
}


def plan_gemm(nbatch, m, n, k, sak, sbk, sbn, config=None, threads=None):
    """The :class:`GemmPlan` of a CPU GEMM: ``nbatch`` products of an m x k
    A (element strides ``sak`` along k) by a k x n B (strides ``sbk``,
    ``sbn``) under ``config`` (a :data:`GEMM_CONFIGS` entry; default
    :data:`DEFAULT_CONFIG`) on ``threads`` threads (default: nbops'
    setting). Every route decision of the CPU GEMM is made here.

    Example::

        >>> nbops.linalg.plan_gemm(1, 4, 1000, 512, 1, 1, 512).route
        'gemv'
    """
    cfg = config or DEFAULT_CONFIG
    if threads is None:
        threads = _runtime.get_num_threads()
    MC, KC, NC = int(cfg["MC"]), int(cfg["KC"]), int(cfg["NC"])
    small, stream = int(cfg.get("SMALL", DEFAULT_CONFIG["SMALL"])), int(cfg.get("STREAM", 0))

    def plan(route, **blocks):
        return GemmPlan(route, GEMM_ROUTES[route], threads, **blocks)

    if cfg["impl"] == "blas":
        return plan("blas")
    if nbatch * m * n == 0:
        return plan("empty")
    if k == 0:
        return plan("fill")
    if nbatch == 1 and m <= GEMV_MAX_ROWS and sak == 1 and (sbk == 1 or sbn == 1):
        return plan("gemv", tasks=max(1, min(threads * GEMV_TASKS_PER_THREAD,
                                             n // GEMV_MIN_COLUMNS)))
    if stream > 0 and nbatch == 1 and sbk == 1 and n >= 8 and m <= STREAM_MAX_ROWS:
        return plan("stream", KC=KC, tasks=stream)
    if small > 0 and max(m, n, k) <= small and nbatch >= threads:
        return plan("small")
    many = nbatch >= GEMM_TASKS_PER_THREAD * threads or (nbatch >= threads and m <= MC)
    return plan("batched" if many else "tiles", MC=MC, KC=KC, NC=NC)


# ---------------------------------------------------------------------------
# Operand preparation (no data moves: views, strides, offsets)


def _shp(x):
    # device arrays' shapes may not be tuples (the simulator's reject x.shape[-1])
    return tuple(x.shape)


def _std(x):
    return tuple(x.strides)


def _view(x, shape, strides):
    """``x``'s memory as a view of the given shape and byte strides."""
    return _layout.strided_view(x, tuple(shape), tuple(strides), 0)


def _elem_strides(op, name, x):
    strides = tuple(x.strides)
    if any(s % x.itemsize for s in strides):
        raise ValueError(f"{op}: argument '{name}' has strides {strides} that are not "
                         f"multiples of its item size {x.itemsize}")
    return [s // x.itemsize for s in strides]


def _operand(op, name, x, batch_shape):
    """``(buffer, offsets, row_stride, col_stride)`` of the matrix stack ``x``
    (shape ``(..., r, c)``) broadcast over ``batch_shape``: a flat view of
    the memory ``x`` spans and each batch matrix's element offset in it."""
    if isinstance(x, np.ndarray) and x.size and x.flags.writeable:
        # the common cases, a plain matrix (C or F order) or a C-contiguous
        # stack: a reshape and cached offsets, not an __array_interface__
        # round trip and fresh offset arrays (~30 us of a small product)
        if not batch_shape and x.ndim == 2:
            if x.flags.c_contiguous:
                return x.reshape(-1), _ONE_OFFSET, x.shape[1], 1
            if x.flags.f_contiguous:
                return x.T.reshape(-1), _ONE_OFFSET, 1, x.shape[0]
        elif x.flags.c_contiguous and (x.ndim == 2 or x.shape[:-2] == batch_shape):
            step = 0 if x.ndim == 2 else x.shape[-2] * x.shape[-1]
            return x.reshape(-1), _batch_offsets(batch_shape, step), x.shape[-1], 1
    st = _elem_strides(op, name, x)
    shape = tuple(x.shape)
    lo = sum(s * (d - 1) for s, d in zip(st, shape) if s < 0 and d > 0)
    hi = sum(s * (d - 1) for s, d in zip(st, shape) if s > 0 and d > 0)
    span = hi - lo + 1 if x.size else 0
    buf = _layout.strided_view(x, (span,), (x.itemsize,), lo * x.itemsize,
                               read_only_input=True)
    own = np.full((), -lo, np.int64)
    for d, s in zip(shape[:-2], st[:-2]):
        own = own[..., None] + np.arange(d, dtype=np.int64) * s
    if own.shape == tuple(batch_shape):
        return buf, own.reshape(-1), st[-2], st[-1]
    # a fresh writable array: read-only offsets would compile a second signature
    offsets = np.array(np.broadcast_to(own, batch_shape).reshape(-1), np.int64)
    return buf, offsets, st[-2], st[-1]


_OFFSETS = {}


def _batch_offsets(batch_shape, step):
    """``arange(prod(batch_shape)) * step`` as int64, kept for the next call
    (the kernels only read it; writable, as the other offsets, so that no
    second signature compiles)."""
    nb = math.prod(batch_shape)
    key = (nb, step)
    offsets = _OFFSETS.get(key)
    if offsets is None:
        if len(_OFFSETS) >= 64:
            _OFFSETS.clear()
        offsets = _OFFSETS[key] = np.arange(nb, dtype=np.int64) * step
    return offsets


def _out3(out, nb, m, n):
    """The C-contiguous ``out`` as an (nb, m, n) view (a reshape for NumPy)."""
    if isinstance(out, np.ndarray):
        return out.reshape(nb, m, n)
    return _view(out, (nb, m, n), (m * n * out.itemsize, n * out.itemsize, out.itemsize))


def _rows(x):
    """``x`` (..., c) as a 2-D (rows, c) view when its leading axes merge into
    one stride, else None."""
    if x.ndim == 2:
        return x
    cshape, (cst,) = _layout.collapse(tuple(_shp(x)[:-1]) or (1,), tuple(_std(x)[:-1]) or (0,))
    if len(cshape) != 1:
        return None
    return _view(x, (math.prod(_shp(x)[:-1]), _shp(x)[-1]), (cst[0], _std(x)[-1]))


def _swap(x):
    """Transposed view of the last two axes (no copy, either device)."""
    st = list(x.strides)
    shape = list(x.shape)
    st[-1], st[-2] = st[-2], st[-1]
    shape[-1], shape[-2] = shape[-2], shape[-1]
    return x.swapaxes(-1, -2) if isinstance(x, np.ndarray) else _view(x, shape, st)


def _with_unit_axis(x, axis):
    """View of ``x`` with a length-1 axis inserted at ``axis`` (0 or -1)."""
    shape, st = list(x.shape), list(x.strides)
    if axis == 0:
        return _view(x, [1] + shape, [0] + st)
    return _view(x, shape + [1], st + [0])


def _epilogue(op, activation, dtype):
    """``(code, params)`` of an activation given as None, a name, or a tuple
    ``(name, *params)``."""
    if activation is None:
        return 0, _formulas.params(dtype)
    name, params = activation, None
    if isinstance(activation, tuple) and activation and isinstance(activation[0], str):
        name, params = activation[0], activation[1:]
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"{op}: argument 'activation' must be None, one of "
                         f"{', '.join(repr(a) for a in ACTIVATIONS)} or a tuple "
                         f"(name, *params), got {activation!r}")
    defaults = ACTIVATIONS[name]
    if params is None or not params:
        params = defaults
    if len(params) != len(defaults):
        raise ValueError(f"{op}: activation {name!r} takes {len(defaults)} parameter(s), "
                         f"got {len(params)}")
    if name == "hardtanh":  # bounds may be infinite (ONNX's Clip with one of them)
        values = _checks.bounds(op, "activation[1]", params[0], "activation[2]", params[1])
    else:
        values = [_checks.scalar(op, f"activation[{i + 1}]", v) for i, v in enumerate(params)]
    if name == "softplus" and values[0] <= 0:
        raise ValueError(f"{op}: softplus beta must be > 0, got {values[0]}")
    if name in ("leaky_relu", "elu") and values[0] < 0:
        raise ValueError(f"{op}: {name} parameter must be >= 0, got {values[0]}")
    return _ACT_CODES[name], _formulas.params(dtype, *values)


def _gemm(op, dev, a, b, out3, bias, act, prm, impl):
    """Run ``out3 = act(a @ b + bias)``: ``a`` (..., m, k) and ``b`` (..., k, n)
    broadcast over ``out3``'s batch (its first axis, flattened from
    ``batch_shape``)."""
    m, k = _shp(a)[-2], _shp(a)[-1]
    n = _shp(b)[-1]
    batch_shape = () if a.ndim == 2 and b.ndim == 2 else tuple(
        np.broadcast_shapes(tuple(_shp(a)[:-2]), tuple(_shp(b)[:-2])))
    abuf, offa, sam, sak = _operand(op, "a", a, batch_shape)
    bbuf, offb, sbk, sbn = _operand(op, "b", b, batch_shape)
    if bias is None:
        bias = _NO_BIAS[np.dtype(a.dtype)] if dev == CPU else _checks.empty((0,), a.dtype, dev)
    args = (abuf, offa, sam, sak, bbuf, offb, sbk, sbn, out3, m, n, k, bias, act, prm,
            _formulas.consts(a.dtype))
    if dev == CUDA:
        if impl == "blas":
            raise ValueError(f"{op}: impl='blas' runs on the CPU only; use 'auto' or "
                             "'nbops' for device arrays")
        return FAMILY.kernel("gemm", CUDA)(*args)
    only = None if impl == "auto" else {"impl": impl}
    dtype = _DTYPE_NAMES.get(a.dtype) or np.dtype(a.dtype).name
    return _cpu_gemm.run((args,), dict(m=m, n=n, k=k, batch=_shp(out3)[0],
                                       wt=bool(sbk == 1 and n > 1), dtype=dtype),
                         only=only, gpu=False)


#: Autotuner keys of the dtypes (numpy's ``dtype.name`` takes microseconds).
_DTYPE_NAMES = {np.dtype(t): np.dtype(t).name for t in (np.float32, np.float64)}
#: The empty bias the CPU kernels get for "no bias" (never written).
_NO_BIAS = {np.dtype(t): np.empty(0, t) for t in (np.float32, np.float64)}
#: The batch offsets of a single matrix (never written).
_ONE_OFFSET = np.zeros(1, np.int64)


def _flat_out(op, out, shape, dtype, dev, inputs):
    out = _checks.output(op, out, shape, dtype, dev, inputs)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1] if shape else 1)
    batch = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return out, (batch, m, n)


def _check_pair(op, a, b, out, impl):
    a = _checks.array(op, "a", a)
    b = _checks.array(op, "b", b)
    _checks.same_dtype(op, a=a, b=b)
    _checks.choice(op, "impl", impl, IMPLS)
    return _dispatch.resolve_device(op, a=a, b=b, out=out), a, b


# ---------------------------------------------------------------------------
# Declarations (the backward rules, defined below, are looked up when a
# rule runs)


def _bmm_rule(ctx, grad):
    return _matmul_rule(ctx, grad)[:2] + (None, None)


def _pairs(*shapes, impl=None, nan=False):
    """``samples(dtype)`` of two-operand products, one per shape pair."""
    def samples(dtype):
        rng = np.random.default_rng(0)
        out = []
        for sa, sb in shapes:
            a = rng.standard_normal(sa).astype(dtype)
            b = rng.standard_normal(sb).astype(dtype)
            out.append(_spec.Sample((a, b), {}, f"{sa}@{sb}"))
        if impl:
            a, b = (rng.standard_normal(s).astype(dtype) for s in ((13, 17), (17, 11)))
            out += [_spec.Sample((a, b), dict(impl=i), i) for i in impl]
        if nan:
            a = rng.standard_normal((3, 4)).astype(dtype)
            a[1, 2] = np.nan
            out.append(_spec.Sample((a, rng.standard_normal((4, 5)).astype(dtype)), {},
                                    "nan-row"))
        return out

    return samples


def _linear_samples(dtype):
    rng = np.random.default_rng(1)

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    out = [_spec.Sample((r(2, 3, 4), r(5, 4), r(5)), dict(activation="gelu"), "3d-gelu-bias")]
    for act in (None, "relu", "gelu_tanh", "sigmoid", "tanh", ("leaky_relu", 0.2), "silu",
                ("swish", 1.5), ("softplus", 2.0, 10.0), ("elu", 0.7), "hardswish",
                ("hardtanh", -0.5, 0.5)):
        out.append(_spec.Sample((r(3, 4), r(5, 4), r(5)), dict(activation=act), f"{act}"))
    out += [_spec.Sample((r(6, 4), r(3, 4)), {}, "no-bias"),
            _spec.Sample((r(4), r(3, 4), r(3)), {}, "1d-x"),
            _spec.Sample((r(0, 4), r(3, 4), r(3)), {}, "empty")]
    return out


def _f(*shape, dtype=np.float64):
    return np.ones(shape, dtype)


_MATMUL_BAD = (
    _spec.Bad((_f(3, 4, dtype=np.float32), _f(4, 2)), {}, TypeError,
              "'a' is float32 but 'b' is float64"),
    _spec.Bad((_f(3, 4), _f(3, 2)), {}, ValueError, r"inner dimensions differ.*\(3, 4\)"),
    _spec.Bad((_f(2, 3, 4), _f(3, 4, 2)), {}, ValueError, "batch axes.*do not broadcast"),
    _spec.Bad((_f(), _f(3)), {}, ValueError, "0-d"),
    _spec.Bad((_f(2, 2, dtype=np.int64), _f(2, 2, dtype=np.int64)), {}, TypeError,
              "'a' must be a float32 or float64"),
    _spec.Bad(([[1.0]], _f(1, 1)), {}, TypeError, "numpy.ndarray or a device array"),
    _spec.Bad((_f(2, 2), _f(2, 2)), dict(impl="mkl"), ValueError, "'impl' must be one of"))
_BMM_BAD = (
    _spec.Bad((_f(2, 3), _f(3, 2)), {}, ValueError, "must be 3-D"),
    _spec.Bad((_f(2, 3, 4), _f(1, 4, 2)), {}, ValueError,
              "batch sizes differ: 'a' has 2, 'b' has 1"),
    _spec.Bad((_f(2, 3, 4), _f(2, 3, 2)), {}, ValueError, "inner dimensions differ"),
    _spec.Bad((_f(2, 3, 4), _f(2, 4, 2, dtype=np.float32)), {}, TypeError,
              "'a' is float64 but 'b' is float32"))
_X, _W = _f(2, 3), _f(4, 3)
_LINEAR_BAD = tuple(_spec.Bad(args, kwargs, error, match) for args, kwargs, error, match in (
    ((_X, _W, _f(3)), {}, ValueError, r"'bias' must have shape \(4,\).*got \(3,\)"),
    ((_X, _f(4, 5)), {}, ValueError, "'x' has 3 features .* 'weight' expects 5"),
    ((_X, _f(1, 4, 3)), {}, ValueError, "'weight' must be 2-D"),
    ((_f(), _W), {}, ValueError, "'x' must have at least 1 dimension"),
    ((_X, _W, _f(4, dtype=np.float32)), {}, TypeError, "'x' is float64 but 'bias' is float32"),
    ((_f(2, 3, dtype=np.float32), _W), {}, TypeError, "'x' is float32 but 'weight' is float64"),
    ((_X, _W), dict(activation="mish"), ValueError, "'activation' must be None, one of"),
    ((_X, _W), dict(activation=3), ValueError, "'activation' must be None"),
    ((_X, _W), dict(activation=("elu", 1.0, 2.0)), ValueError, "takes 1 parameter"),
    ((_X, _W), dict(activation=("softplus", 0.0, 20.0)), ValueError,
     "softplus beta must be > 0"),
    ((_X, _W), dict(activation=("leaky_relu", -1.0)), ValueError,
     "leaky_relu parameter must be >= 0"),
    ((_X, _W), dict(activation=("elu", "big")), TypeError, "must be a real number"),
    ((_X, _W), dict(activation=("hardtanh", 2.0, 1.0)), ValueError,
     r"argument 'activation\[1\]' \(2.0\) must be <= 'activation\[2\]' \(1.0\)"),
    ((_X, _W), dict(activation=("hardtanh", 0.0, float("nan"))), ValueError,
     r"argument 'activation\[2\]' must not be NaN"),
    ((_X, _W, _f(8)[::2]), {}, ValueError, "'bias' must be contiguous")))
# sums of k products: errors grow with k (at most 17 here)
_TOL = {_spec.F32: (2e-5, 2e-5), _spec.F64: (1e-12, 1e-12)}


def _bench(name, setup="setup_square", baseline=None, kwargs=None, **options):
    base = dict(out_like="nbops.bench.linalg:square_out", flops="nbops.bench.linalg:flops",
                tol=(1e-4, 1e-12), baseline_name="numpy (BLAS)",
                pause="nbops.bench.harness:BLAS_PAUSE")
    return _spec.Bench(f"nbops.bench.linalg:{baseline or 'matmul_numpy'}", name,
                       f"nbops.bench.linalg:{setup}", kwargs or {},
                       options={**base, **options})


SPECS = {s.name: s for s in (
    _spec.OpSpec(
        "matmul", FAMILY, ("gemm",), backward=lambda ctx, g: _matmul_rule(ctx, g),
        samples=_pairs(((4, 3), (3, 5)), ((2, 4, 3), (3, 5)), ((3,), (3, 5)), ((4, 3), (3,)),
                       ((3,), (3,)), ((2, 1, 4, 3), (3, 5)), ((1, 1), (1, 1)),
                       ((0, 3), (3, 4)), ((3, 0), (0, 4)), ((7, 5), (5, 1)),
                       impl=("nbops", "blas"), nan=True),
        bad=lambda dtype: _MATMUL_BAD, grad=_spec.Grad((0, 1)), tol=_TOL,
        bench=(_bench("matmul"), _bench("matmul_blas_route", kwargs=dict(impl="blas")),
               _bench("matmul_small_batched", "setup_small",
                      out_like="nbops.bench.linalg:small_out",
                      flops="nbops.bench.linalg:small_flops",
                      baseline_name="numpy (BLAS per product)"))),
    _spec.OpSpec(
        "bmm", FAMILY, ("gemm",), backward=_bmm_rule,
        samples=_pairs(((2, 4, 3), (2, 3, 5)), ((1, 1, 1), (1, 1, 1)), ((3, 0, 2), (3, 2, 4)),
                       ((2, 3, 0), (2, 0, 2))),
        bad=lambda dtype: _BMM_BAD, grad=_spec.Grad((0, 1)), tol=_TOL),
    _spec.OpSpec(
        "linear", FAMILY, ("gemm",), backward=lambda ctx, g: _linear_rule(ctx, g),
        samples=_linear_samples, bad=lambda dtype: _LINEAR_BAD, grad=_spec.Grad((0, 1, 2)),
        tol=_TOL, strided=(0, 1),
        bench=(_bench("linear_gelu", baseline="linear_gelu_numpy",
                      kwargs=dict(activation="gelu"), tol=(1e-4, 1e-10),
                      baseline_name="numpy + scipy erfc"),)),
)}


# ---------------------------------------------------------------------------
# Public operators


@operator(SPECS["matmul"])
def matmul(a, b, out=None, impl="auto"):
    """Matrix product with NumPy's ``matmul`` semantics.

    Parameters
    ----------
    a, b : arrays, float32 or float64 (the same), on one device
        ``a`` (..., m, k) and ``b`` (..., k, n); the leading (batch) axes
        broadcast as in NumPy. A 1-D ``a`` is a row vector (k,), a 1-D
        ``b`` a column vector (k,); their unit axis is removed from the
        result. Any strides (transposes, slices, broadcast views) are read
        in place.
    out : array, optional
        C-contiguous array of the result's shape, dtype and device, not
        overlapping ``a`` or ``b``.
    impl : {"auto", "nbops", "blas"}
        CPU route: the autotuner's choice, nbops' own kernel, or NumPy's
        BLAS (CPU only). Ignored for device arrays except that "blas" is
        an error there.

    Returns
    -------
    array of shape ``broadcast(_shp(a)[:-2], _shp(b)[:-2]) + (m, n)`` (unit
    axes of 1-D operands removed), on the operands' device.

    Raises
    ------
    TypeError
        Non-float arrays, ``a`` and ``b`` of different dtypes, mixed
        devices, ``out`` of the wrong dtype or device.
    ValueError
        0-d operands, inner dimensions that differ, batch axes that do not
        broadcast, a bad ``out`` or ``impl``.

    Example
    -------
    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> nbops.matmul(a, a.T)
    array([[ 5., 14.],
           [14., 50.]], dtype=float32)
    """
    op = "matmul"
    dev, a, b = _check_pair(op, a, b, out, impl)
    for name, x in (("a", a), ("b", b)):
        if x.ndim == 0:
            raise ValueError(f"{op}: argument '{name}' must have at least 1 dimension, "
                             "got a 0-d array (use multiplication for scalars)")
    a2 = _with_unit_axis(a, 0) if a.ndim == 1 else a
    b2 = _with_unit_axis(b, -1) if b.ndim == 1 else b
    if _shp(a2)[-1] != _shp(b2)[-2]:
        raise ValueError(f"{op}: inner dimensions differ: 'a' has shape {tuple(a.shape)} "
                         f"(k={_shp(a2)[-1]}) but 'b' has shape {tuple(b.shape)} "
                         f"(k={_shp(b2)[-2]})")
    try:
        batch = tuple(np.broadcast_shapes(tuple(_shp(a2)[:-2]), tuple(_shp(b2)[:-2])))
    except ValueError:
        raise ValueError(f"{op}: batch axes of 'a' {tuple(_shp(a)[:-2])} and 'b' "
                         f"{tuple(_shp(b)[:-2])} do not broadcast") from None
    m, n = _shp(a2)[-2], _shp(b2)[-1]
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    out = _checks.output(op, out, shape, a.dtype, dev, {"a": a, "b": b})
    nb = math.prod(batch) if batch else 1
    out3 = _out3(out, nb, m, n)
    _gemm(op, dev, a2, b2, out3, None, 0, _formulas.params(a.dtype), impl)
    return out


@operator(SPECS["bmm"])
def bmm(a, b, out=None, impl="auto"):
    """Batched matrix product of two stacks of one batch size (no broadcasting,
    as ``torch.bmm``).

    ``a`` (batch, m, k) and ``b`` (batch, k, n), float32 or float64 (the
    same), any strides, one device; returns (batch, m, n) (or writes
    ``out``). ``impl`` as :func:`matmul`. Raises ``ValueError`` unless both
    are 3-D with equal batch sizes and matching inner dimensions, and
    ``TypeError`` as :func:`matmul`.

    Example
    -------
    >>> x = np.ones((4, 2, 3), np.float32)
    >>> nbops.bmm(x, x.transpose(0, 2, 1)).shape
    (4, 2, 2)
    """
    op = "bmm"
    dev, a, b = _check_pair(op, a, b, out, impl)
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError(f"{op}: 'a' and 'b' must be 3-D (batch, rows, cols), got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if _shp(a)[0] != _shp(b)[0]:
        raise ValueError(f"{op}: batch sizes differ: 'a' has {_shp(a)[0]}, 'b' has "
                         f"{_shp(b)[0]} (use matmul to broadcast)")
    if _shp(a)[2] != _shp(b)[1]:
        raise ValueError(f"{op}: inner dimensions differ: 'a' has shape {tuple(a.shape)} "
                         f"but 'b' has shape {tuple(b.shape)}")
    out = _checks.output(op, out, (_shp(a)[0], _shp(a)[1], _shp(b)[2]), a.dtype, dev,
                         {"a": a, "b": b})
    _gemm(op, dev, a, b, out, None, 0, _formulas.params(a.dtype), impl)
    return out


@operator(SPECS["linear"])
def linear(x, weight, bias=None, activation=None, out=None, impl="auto"):
    """Fully connected layer ``activation(x @ weight.T + bias)``, fused.

    Parameters
    ----------
    x : array (..., in_features), float32 or float64, any strides
    weight : array (out_features, in_features), same dtype and device
        Read in place through its strides (no transposed copy is made).
    bias : array (out_features,), optional
    activation : None, str or tuple
        An activation applied by the GEMM's epilogue on each output tile
        while it is in cache: one of ``ACTIVATIONS`` ("relu",
        "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "silu",
        "swish", "softplus", "elu", "hardswish", "hardtanh"), with PyTorch's
        default parameters, or ``(name, *params)`` such as
        ``("leaky_relu", 0.2)`` or ``("hardtanh", 0.0, 6.0)`` (relu6).
    out : array (..., out_features), optional
        C-contiguous, the result's dtype and device, no overlap with inputs.
    impl : {"auto", "nbops", "blas"}
        As :func:`matmul`.

    Returns
    -------
    array (..., out_features) on the inputs' device.

    Raises
    ------
    TypeError
        Non-float arrays, mixed dtypes or devices, bad ``out`` dtype.
    ValueError
        ``x`` 0-d, ``weight`` not 2-D, in_features mismatch, ``bias`` not
        of shape (out_features,), unknown activation or bad parameters,
        bad ``out`` or ``impl``.

    Example
    -------
    >>> x = np.ones((2, 3), np.float32); w = np.ones((4, 3), np.float32)
    >>> nbops.linear(x, w, np.full(4, -4, np.float32), activation="relu")
    array([[0., 0., 0., 0.],
           [0., 0., 0., 0.]], dtype=float32)
    """
    op = "linear"
    x = _checks.array(op, "x", x)
    weight = _checks.array(op, "weight", weight)
    if bias is not None:
        bias = _checks.array(op, "bias", bias)
    _checks.same_dtype(op, x=x, weight=weight, bias=bias)
    _checks.choice(op, "impl", impl, IMPLS)
    dev = _dispatch.resolve_device(op, x=x, weight=weight, bias=bias, out=out)
    if x.ndim == 0:
        raise ValueError(f"{op}: argument 'x' must have at least 1 dimension, got a 0-d array")
    if weight.ndim != 2:
        raise ValueError(f"{op}: argument 'weight' must be 2-D (out_features, in_features), "
                         f"got shape {tuple(weight.shape)}")
    if _shp(x)[-1] != _shp(weight)[1]:
        raise ValueError(f"{op}: 'x' has {_shp(x)[-1]} features (shape {tuple(x.shape)}) but "
                         f"'weight' expects {_shp(weight)[1]} (shape {tuple(weight.shape)})")
    n = _shp(weight)[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: argument 'bias' must have shape ({n},) to match 'weight' "
                         f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
    act, prm = _epilogue(op, activation, x.dtype)
    shape = tuple(_shp(x)[:-1]) + (n,)
    out = _checks.output(op, out, shape, x.dtype, dev, {"x": x, "weight": weight, "bias": bias})
    if bias is not None and not _layout.is_c_contiguous(bias):
        raise ValueError(f"{op}: argument 'bias' must be contiguous, got strides "
                         f"{tuple(bias.strides)}")
    rows = _rows(x)
    a = rows if rows is not None else (x if x.ndim > 1 else _with_unit_axis(x, 0))
    m = _shp(a)[-2]
    nb = math.prod(_shp(a)[:-2]) if a.ndim > 2 else 1
    out3 = _out3(out, nb, m, n)
    _gemm(op, dev, a, _swap(weight), out3, bias, act, prm, impl)
    return out


# ---------------------------------------------------------------------------
# Backward rules (autograd): one gradient per forward parameter


def _sum_to(x, shape):
    """Sum the broadcast axes of ``x`` away so that it has ``shape``. On
    CUDA the (rare) reduction over broadcast batch axes runs on the host."""
    if tuple(x.shape) == tuple(shape):
        return x
    on_device = not isinstance(x, np.ndarray)
    h = _dispatch.to_host(x)
    lead = h.ndim - len(shape)
    h = h.sum(axis=tuple(range(lead))) if lead else h
    axes = tuple(i for i, (s, t) in enumerate(zip(h.shape, shape)) if t == 1 and s != 1)
    h = np.ascontiguousarray(h.sum(axis=axes, keepdims=True) if axes else h)
    return _dispatch.to_device(h) if on_device else h


def _reshape(x, shape):
    """``x.reshape(shape)`` for NumPy arrays, Numba device arrays and other
    ``__cuda_array_interface__`` objects without a ``reshape``."""
    if isinstance(x, np.ndarray):
        return x.reshape(shape)
    return _dispatch.ensure_cuda().as_cuda_array(x).reshape(shape) \
        if not hasattr(x, "reshape") else x.reshape(shape)


def _matmul_rule(ctx, grad):
    a, b = ctx.inputs[0], ctx.inputs[1]
    a2 = _with_unit_axis(a, 0) if a.ndim == 1 else a
    b2 = _with_unit_axis(b, -1) if b.ndim == 1 else b
    batch = tuple(np.broadcast_shapes(tuple(_shp(a2)[:-2]), tuple(_shp(b2)[:-2])))
    g = _reshape(grad, batch + (_shp(a2)[-2], _shp(b2)[-1]))
    need_a, need_b = ctx.needs_input_grad[:2]
    ga = gb = None
    if need_b and b2.ndim == 2 and _rows(a2) is not None and batch:
        # weight-like b: one GEMM over all rows instead of a batch sum
        gb = matmul(_swap(_rows(a2)), _rows(g))
    if need_b and gb is None:
        gb = _sum_to(matmul(_swap(a2), g), b2.shape)
    if need_a:
        ga = _reshape(_sum_to(matmul(g, _swap(b2)), a2.shape), a.shape)
    return ga, (_reshape(gb, b.shape) if need_b else None), None, None


def _column_sums(g2):
    if isinstance(g2, np.ndarray):
        return g2.sum(axis=0)
    ones = _dispatch.to_device(np.ones(_shp(g2)[0], g2.dtype))
    return matmul(ones, g2)


def _act_grad(activation, grad, x, weight, bias, y):
    """Gradient with respect to the activation's input (pre-activation z)."""
    from . import activations as acts

    name = activation if isinstance(activation, str) else activation[0]
    params = tuple(activation[1:]) if isinstance(activation, tuple) else ()
    params = params or ACTIVATIONS[name]
    if name in ("relu", "leaky_relu", "sigmoid", "tanh", "hardtanh"):
        # these derivatives are functions of the output (y > 0 iff z > 0)
        return getattr(acts, name + "_backward")(grad, y, *params)
    z = linear(x, weight, bias)  # recomputed: the fused forward never stored it
    if name == "gelu_tanh":
        return acts.gelu_backward(grad, z, approximate="tanh")
    if name == "swish":
        return acts.swish_backward(grad, z, *params)[0]
    return getattr(acts, name + "_backward")(grad, z, *params)


def _linear_rule(ctx, grad):
    x, weight, bias, activation = ctx.inputs[:4]
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    gz = grad if activation is None else _act_grad(activation, grad, x, weight, bias,
                                                   ctx.output)
    gx = gw = gb = None
    if need_x:  # skipped for a network's input: the largest product of the step
        gx = matmul(gz, weight)
        if _shp(gx) != _shp(x):
            gx = _reshape(gx, x.shape)
    x2, gz2 = _rows(x), _rows(gz)
    if need_w and x2 is not None and gz2 is not None:
        gw = matmul(_swap(gz2), x2)  # all rows in one product
    elif need_w:  # leading axes that do not merge: one product per batch, summed
        gw = _sum_to(matmul(_swap(gz), x), _shp(weight))
    if need_b and bias is not None:
        gb = _column_sums(gz2) if gz2 is not None else _sum_to(gz, _shp(bias))
    return gx, gw, gb, None, None, None




# ---------------------------------------------------------------------------
# Pre-tuning shapes for ``python -m nbops tune``

#: (batch, m, n, k) shapes tuned by ``python -m nbops tune``; the first
#: group also with ``--quick``.
TUNE_SHAPES = (
    [(1, 64, 64, 64), (1, 128, 128, 128), (1, 256, 256, 256), (4096, 32, 32, 32),
     (512, 64, 64, 64)],
    [(1, 512, 512, 512), (1, 1024, 1024, 1024), (1, 2048, 2048, 2048),
     (1, 64, 4096, 4096), (1, 256, 4096, 4096), (1, 64, 1024, 4096), (1, 256, 1024, 4096)],
)


def _tune_gemm(dtype, quick):
    rng = np.random.default_rng(0)
    shapes = TUNE_SHAPES[0] + ([] if quick else TUNE_SHAPES[1])
    for batch, m, n, k in shapes:
        lead = (batch,) if batch > 1 else ()
        a = rng.standard_normal(lead + (m, k)).astype(dtype)
        b = rng.standard_normal(lead + (k, n)).astype(dtype)
        matmul(a, b)
        if batch == 1:  # and as a linear layer, tuned apart (B = W.T)
            linear(a, np.ascontiguousarray(b.T))


_autotune.register_tuning(
    "gemm", _tune_gemm,
    lambda: f"matmul/linear block sizes and BLAS routing, {sum(map(len, TUNE_SHAPES))} shapes")
