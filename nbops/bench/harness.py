"""Timing, bandwidth and error measurement shared by ``bench``, ``demo``
and the asv suites.

A :class:`Case` says what to run (the nbops call and its NumPy/SciPy
baseline, both writing into a pre-allocated ``out``), how to make inputs
of about ``n`` elements, and what it moves (bytes) or computes (FLOPs).
:func:`run_case` turns it into a :class:`Result`: median times of both sides,
measured interleaved, achieved GB/s, the fraction of a parallel copy's
bandwidth at the same size and dtype, and the largest error of the nbops
result against a float64 reference computed from the same inputs.

Cases are found in the modules of :mod:`nbops.bench` (each module is a
family and lists its cases in ``CASES``); :func:`register` adds more at run
time. Nothing here knows about any particular operator.
"""

import fnmatch
import importlib
import math
import pkgutil
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
from numba import prange

from .. import _dispatch, _spec

from .._jit import cpu_kernel
from ..autotune import WARM_UP

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
DTYPES = {"float32": F32, "float64": F64}

#: Element counts of ``bench --quick`` and of a full ``bench`` (2**20 = 1M).
QUICK_SIZES = (1 << 20, 1 << 24)
FULL_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)


@dataclass(frozen=True)
class Case:
    """One benchmarked operation.

    ``setup(n, dtype, rng)`` returns a tuple of NumPy inputs of about ``n``
    elements; ``run(*inputs, out=out)`` calls nbops and ``baseline(*inputs,
    out=out)`` does the same math with NumPy/SciPy, both writing into
    ``out`` where they can (it is allocated once, outside the timing, from
    ``out_like``). ``reference(*inputs_as_float64)`` gives the float64
    answer the error is measured against; by default the baseline evaluated
    in float64. Results may be arrays or tuples of arrays and scalars.
    """

    name: str
    setup: Callable
    run: Callable
    baseline: Callable
    reference: Optional[Callable] = None
    #: ``out_like(inputs) -> (shape, dtype)``; default: like ``inputs[0]``.
    out_like: Optional[Callable] = None
    #: ``nbytes(inputs, out) -> int``, bytes read and written once; default:
    #: every input and the output once.
    nbytes: Optional[Callable] = None
    #: ``flops(inputs) -> int`` for compute-bound cases (reports GFLOP/s).
    flops: Optional[Callable] = None
    #: Names that must exist in ``nbops`` for the case to run.
    requires: tuple = ()
    dtypes: tuple = (F32, F64)
    #: Largest acceptable error (see :func:`max_error`) for float32, float64.
    tol: tuple = (1e-5, 1e-12)
    baseline_name: str = "numpy"
    #: Least sleep before each timed block: ``BLAS_PAUSE`` where the baseline
    #: runs BLAS, whose thread pool keeps spinning after a call for longer
    #: than the default pause and slows whatever is timed next.
    pause: float = 0.0
    family: str = field(default="", compare=False)

    def tolerance(self, dtype):
        return self.tol[0] if np.dtype(dtype) == F32 else self.tol[1]

    def missing(self):
        """The names in ``requires`` that nbops does not have (yet)."""
        import nbops

        return [r for r in self.requires if not hasattr(nbops, r)]


@dataclass
class Result:
    """What :func:`run_case` measured (times in seconds, ``None`` if not run)."""

    case: str
    family: str
    n: int
    dtype: str
    device: str = "cpu"
    t_nbops: Optional[float] = None
    t_baseline: Optional[float] = None
    nbytes: Optional[int] = None
    flops: Optional[int] = None
    copy_gbps: Optional[float] = None
    #: GFLOP/s of :func:`fma_peak` with all threads (compute-bound cases)
    peak_gflops: Optional[float] = None
    #: median over rounds of (GB/s / the copy's GB/s in the same round),
    #: where the copy was timed interleaved with the case
    paired_copy_fraction: Optional[float] = None
    err: Optional[float] = None
    tol: Optional[float] = None
    note: str = ""

    @property
    def ratio(self):
        """Baseline time over nbops time: above 1 means nbops is faster."""
        return _div(self.t_baseline, self.t_nbops)

    @property
    def gbps(self):
        return _div(self.nbytes, self.t_nbops, 1e-9)

    @property
    def baseline_gbps(self):
        return _div(self.nbytes, self.t_baseline, 1e-9)

    @property
    def copy_fraction(self):
        if self.paired_copy_fraction is not None:
            return self.paired_copy_fraction
        return _div(self.gbps, self.copy_gbps)

    @property
    def gflops(self):
        return _div(self.flops, self.t_nbops, 1e-9)

    @property
    def peak_fraction(self):
        """GFLOP/s over the FMA peak measured in the same run."""
        return _div(self.gflops, self.peak_gflops)

    @property
    def passed(self):
        return self.err is not None and self.tol is not None and self.err <= self.tol

    def as_dict(self):
        d = dict(vars(self))
        for k in ("ratio", "gbps", "baseline_gbps", "copy_fraction", "gflops", "peak_fraction",
                  "passed"):
            d[k] = getattr(self, k)
        return d


def _div(a, b, scale=1.0):
    if a is None or not b:
        return None
    return a / b * scale


# ---------------------------------------------------------------------------
# The registry: one module of nbops.bench per family


_NOT_FAMILIES = {"harness", "demo"}
_cases = None
_demos = None
_broken = {}


def _load():
    global _cases, _demos
    if _cases is not None:
        return
    import nbops.bench as pkg

    cases, demos = {}, []
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.startswith("_") or mod.name in _NOT_FAMILIES:
            continue
        try:
            module = importlib.import_module(f"{pkg.__name__}.{mod.name}")
        except Exception as exc:  # one family's bug must not hide the others
            _broken[mod.name] = f"{type(exc).__name__}: {exc}"
            continue
        for case in getattr(module, "CASES", ()):
            _add(cases, case, mod.name)
        demos.extend((mod.name, d) for d in getattr(module, "DEMOS", ()))
    _cases, _demos = cases, demos


def _add(cases, case, family):
    if case.name in cases:
        raise ValueError(f"bench: two cases are named {case.name!r} "
                         f"(families {cases[case.name].family!r} and {family!r})")
    object.__setattr__(case, "family", case.family or family)
    cases[case.name] = case


def spec_cases(specs, default_setup):
    """The :class:`Case` of every :class:`nbops._spec.Bench` entry of
    ``specs`` (operator specs), in order: the operator called with the
    entry's keyword arguments and ``out=``, against its baseline.
    ``default_setup(spec)`` gives the ``"module:attr"`` of the setup of an
    entry that names none."""
    import nbops

    out = []
    for spec in specs:
        op = nbops.get_operator(spec.name)
        for b in spec.bench:
            options = {k: _dispatch.resolve(v) if k in _CALLABLE_OPTIONS else v
                       for k, v in b.options.items()}
            out.append(Case(
                b.name or spec.name, _dispatch.resolve(b.setup or default_setup(spec)),
                _call_with(op, b.kwargs, spec.out), _dispatch.resolve(b.baseline),
                _dispatch.resolve(b.reference) if b.reference else None, **options))
    return out


# Case fields that a spec names by "module:attr" (specs hold data, not code)
_CALLABLE_OPTIONS = ("out_like", "nbytes", "flops", "pause")


def _call_with(op, kwargs, takes_out=True):
    if takes_out:
        return lambda *inputs, out: op(*inputs, **kwargs, out=out)
    # an op without out= allocates its result: part of what is timed
    return lambda *inputs, out: op(*inputs, **kwargs)


def register(case, family="user"):
    """Add a :class:`Case` at run time (for operators made with
    ``nbops.register_op``); it then shows in ``bench`` and ``demo``."""
    _load()
    _add(_cases, case, family)
    return case


def unregister(name):
    """Remove the case called ``name`` (if any)."""
    _load()
    _cases.pop(name, None)


def cases():
    """Every case by name, in family order then definition order."""
    _load()
    return dict(_cases)


def broken():
    """Families whose module failed to import: ``{family: error text}``."""
    _load()
    return dict(_broken)


def demos():
    """Extra demo steps: ``(family, step)`` pairs, see :mod:`nbops.bench.demo`."""
    _load()
    return list(_demos)


def select(patterns=None):
    """The cases whose name or family matches one of ``patterns`` (shell
    globs); all cases when ``patterns`` is empty. Raises ``ValueError``
    naming the pattern that matched nothing."""
    allc = cases()
    if not patterns:
        return list(allc.values())
    chosen = []
    for pat in patterns:
        hits = [c for c in allc.values()
                if fnmatch.fnmatchcase(c.name, pat) or c.family == pat]
        if not hits:
            raise ValueError(f"bench: no case matches {pat!r}; cases: {', '.join(allc)}")
        chosen.extend(c for c in hits if c not in chosen)
    return chosen


def parse_size(text):
    """``"4096"``, ``"64K"``, ``"16M"`` (binary multiples) to an int > 0."""
    s = str(text).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        n = int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise ValueError(f"size must be a number of elements like 4096, 64K or 16M, "
                         f"got {text!r}") from None
    if n < 1:
        raise ValueError(f"size must be at least 1 element, got {text!r}")
    return n


def size_label(n):
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


# ---------------------------------------------------------------------------
# Measuring


@cpu_kernel(parallel=True)
def parallel_copy(x, out):
    """``out[...] = x`` for C-contiguous arrays of one size, seen flat, over
    all threads: the bandwidth that a memory-bound kernel can hope for.
    (It indexed its arguments as 1-D: a 4-D pair crashed the process.)"""
    if x.size != out.size:
        raise ValueError("parallel_copy: 'x' and 'out' must have the same size")
    src = x.reshape(x.size)
    dst = out.reshape(out.size)
    for i in prange(src.size):
        dst[i] = src[i]


def _sync_for(device):
    if device == "cpu":
        return None
    from numba import cuda

    return cuda.synchronize


#: Seconds OpenBLAS's idle threads keep spinning after a call, slowing what
#: is timed next (docs/benchmarks.md, thread pools).
BLAS_PAUSE = 0.3


def warm_up(f, sync=None, seconds=WARM_UP):
    """Call ``f`` (at least once) until ``seconds`` have passed. After each
    pause the harness runs ``WARM_UP`` seconds of untimed calls (the
    autotuner's setting, see there): a block timed straight after a sleep
    measures a virtual CPU waking up, not the kernel (docs/benchmarks.md,
    Method)."""
    end = time.perf_counter() + seconds
    while True:
        f()
        if sync is not None:
            sync()
        if time.perf_counter() >= end:
            return


def time_interleaved(fns, rounds=5, pause=0.05, min_block=0.02, sync=None, samples=False):
    """Median seconds per call of each function in ``fns`` (with
    ``samples=True``, each function's list of per-round times instead).

    Each function runs once to calibrate, then in every round each runs a
    block of calls lasting about ``min_block`` seconds, the order reversed on
    alternate rounds so that drift hits all alike, with ``pause`` seconds of
    sleep before each block (thread pools that spin after a call would
    otherwise steal cores from the next library), followed by ``WARM_UP``
    seconds of untimed calls of the same function (see there).
    """
    sync = sync or (lambda: None)
    blocks = []
    for f in fns:
        t0 = time.perf_counter()
        f()
        sync()
        t = time.perf_counter() - t0
        blocks.append(max(1, min(1000, math.ceil(min_block / max(t, 1e-7)))))
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            f, k = fns[i], blocks[i]
            if pause:
                time.sleep(pause)
                warm_up(f, sync)
            t0 = time.perf_counter()
            for _ in range(k):
                f()
            sync()
            times[i].append((time.perf_counter() - t0) / k)
    return times if samples else [statistics.median(s) for s in times]


def measure_copy(n, dtype, rounds=5, pause=0.05):
    """GB/s of :func:`parallel_copy` on ``n`` elements (bytes read + written)."""
    copy, nbytes = copy_call(n, dtype)
    (t,) = time_interleaved([copy], rounds, pause)
    return nbytes / t * 1e-9


def copy_call(n, dtype):
    """``(f, bytes)``: a call of :func:`parallel_copy` on ``n`` elements of
    ``dtype`` (its arrays allocated and touched once, here) and the bytes it
    reads and writes."""
    x = np.ones(n, dtype)
    out = np.empty_like(x)
    parallel_copy(x, out)
    return (lambda: parallel_copy(x, out)), 2 * x.nbytes


#: Elements per thread of :func:`fma_peak`'s working row (4-8 KiB: in L1).
FMA_ROW = 1024


@cpu_kernel(parallel=True)
def fma_peak(x, reps, a, b):
    """``reps`` passes of 8 multiply-adds on every element of each row of
    ``x`` (one row per thread): the arithmetic limit of a compute-bound
    kernel. Four independent chains per vector keep both FMA pipes busy
    (one chain waits on the FMA latency); the row stays in L1."""
    for t in prange(x.shape[0]):
        row = x[t]
        q = row.size // 4
        for r in range(reps):
            for j in range(q):
                v0 = row[j]
                v1 = row[j + q]
                v2 = row[j + 2 * q]
                v3 = row[j + 3 * q]
                for _ in range(8):
                    v0 = v0 * a + b
                    v1 = v1 * a + b
                    v2 = v2 * a + b
                    v3 = v3 * a + b
                row[j] = v0
                row[j + q] = v1
                row[j + 2 * q] = v2
                row[j + 3 * q] = v3


def measure_fma_peak(dtype, rounds=5, pause=0.05, threads=None):
    """GFLOP/s of :func:`fma_peak` in ``dtype`` on ``threads`` rows (default:
    nbops' thread count): the fastest of ``rounds`` calls of about 10 ms."""
    import nbops

    dtype = np.dtype(dtype)
    nt = threads or nbops.get_num_threads()
    x = np.zeros((nt, FMA_ROW), dtype)
    a, b = dtype.type(0.999999), dtype.type(1e-6)
    fma_peak(x, 1, a, b)  # compiles
    reps = 64
    while True:  # double until a call takes 10 ms
        t0 = time.perf_counter()
        fma_peak(x, reps, a, b)
        if time.perf_counter() - t0 >= 0.01 or reps >= 1 << 24:
            break
        reps *= 2
    # the fastest round: a peak, which other processes can only lower
    (ts,) = time_interleaved([lambda: fma_peak(x, reps, a, b)], rounds, pause, min_block=0.0,
                             samples=True)
    t = min(ts)
    return 2 * 8 * FMA_ROW * nt * reps / t * 1e-9


def max_error(y, ref):
    """Largest ``|y - ref| / (1 + |ref|)`` over all elements (absolute error
    near zero, relative error for large values), with NaN matching NaN and
    equal infinities exact; ``inf`` on a shape mismatch or a NaN on one side
    only. Tuples are compared item by item."""
    if isinstance(ref, tuple):
        if not isinstance(y, tuple) or len(y) != len(ref):
            return math.inf
        return max((max_error(a, b) for a, b in zip(y, ref)), default=0.0)
    y = np.array(_host(y), dtype=F64, ndmin=1)
    r = np.array(ref, dtype=F64, ndmin=1)
    if y.shape != r.shape:
        return math.inf
    if y.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(y - r) / (1.0 + np.abs(r))
    d[(y == r) | (np.isnan(y) & np.isnan(r))] = 0.0
    return float(np.nan_to_num(d, nan=math.inf).max())


def _host(y):
    if isinstance(y, (np.ndarray, float, int, np.generic)):
        return y
    import nbops

    return nbops.to_host(y)


def _out_like(case, inputs):
    if case.out_like is not None:
        shape, dtype = case.out_like(inputs)
    else:
        shape, dtype = inputs[0].shape, inputs[0].dtype
    return np.empty(shape, dtype)


def _nbytes(case, inputs, out):
    if case.nbytes is not None:
        return int(case.nbytes(inputs, out))
    return int(sum(a.nbytes for a in _spec.arrays_in(inputs)) + out.nbytes)


def reference(case, inputs):
    """The float64 answer for ``inputs``."""
    wide = tuple(_spec.map_arrays(lambda a: np.asarray(a, F64), a) for a in inputs)
    if case.reference is not None:
        return case.reference(*wide)
    return case.baseline(*wide, out=_out_like(case, wide))


def run_case(case, n, dtype, *, device="cpu", rounds=5, pause=0.05, copy_gbps=None,
             rng=None, time_it=True, copy=None):
    """Measure ``case`` on about ``n`` elements of ``dtype``; never raises for
    a failing case (the exception is reported in ``Result.note``).

    ``copy``, a ``(call, bytes)`` pair of :func:`copy_call`, is timed in the
    same interleaved rounds as a memory-bound case on the CPU, and the
    fraction of its bandwidth is the median of the per-round fractions: a
    virtual machine's bandwidth swings within a minute, and a copy measured
    once would move every fraction with it (docs/benchmarks.md, Method)."""
    dtype = np.dtype(dtype)
    res = Result(case.name, case.family, n, dtype.name, device, copy_gbps=copy_gbps,
                 tol=case.tolerance(dtype))
    missing = case.missing()
    if missing:
        res.note = f"skipped: nbops.{missing[0]} does not exist yet"
        return res
    try:
        rng = rng if rng is not None else np.random.default_rng(0)
        inputs = tuple(case.setup(n, dtype, rng))
        out_b = _out_like(case, inputs)
        res.n = int(out_b.size)
        res.nbytes = _nbytes(case, inputs, out_b)
        res.flops = int(case.flops(inputs)) if case.flops is not None else None
        nb_inputs, out_n = inputs, _out_like(case, inputs)
        if device != "cpu":
            import nbops

            nb_inputs = tuple(_spec.map_arrays(nbops.to_device, a) for a in inputs)
            out_n = nbops.to_device(out_n)
        with np.errstate(all="ignore"):
            y = case.run(*nb_inputs, out=out_n)  # compiles on first use
            case.baseline(*inputs, out=out_b)
            res.err = max_error(y, reference(case, inputs))
            if time_it:
                fns = [lambda: case.run(*nb_inputs, out=out_n),
                       lambda: case.baseline(*inputs, out=out_b)]
                paired = copy is not None and device == "cpu" and res.flops is None
                if paired:
                    fns.append(copy[0])
                times = time_interleaved(fns, rounds, max(pause, case.pause),
                                         sync=_sync_for(device), samples=True)
                res.t_nbops, res.t_baseline = (statistics.median(t) for t in times[:2])
                if paired:
                    res.copy_gbps = copy[1] / statistics.median(times[2]) * 1e-9
                    res.paired_copy_fraction = statistics.median(
                        res.nbytes * tc / (copy[1] * tn) for tn, tc in zip(times[0], times[2]))
    except Exception as exc:  # one broken case must not end the whole run
        res.note = f"error: {type(exc).__name__}: {exc}"
    return res


# ---------------------------------------------------------------------------
# Reporting

def fmt_time(t):
    """Seconds as a short text with a unit ('1.23 ms')."""
    if t is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


#: (title, width, value of a Result as text); numbers right-aligned.
COLUMNS = (
    ("op", -20, lambda r: r.case),
    ("size", 6, lambda r: size_label(r.n)),
    ("dtype", 8, lambda r: r.dtype),
    ("nbops", 10, lambda r: fmt_time(r.t_nbops)),
    ("baseline", 10, lambda r: fmt_time(r.t_baseline)),
    ("speedup", 8, lambda r: _fmt(r.ratio, ".2f") + ("x" if r.ratio else "")),
    ("GB/s", 7, lambda r: "-" if r.flops else _fmt(r.gbps, ".1f")),
    ("of copy", 8, lambda r: "-" if r.flops else _fmt(r.copy_fraction, ".0%")),
    ("GFLOP/s", 8, lambda r: _fmt(r.gflops, ".1f")),
    ("max err", 8, lambda r: _fmt(r.err, ".1e")),
)


def _cell(text, width):
    return text.ljust(-width) if width < 0 else text.rjust(width)


def _line(texts):
    return "  ".join(_cell(t, w) for t, (_, w, _) in zip(texts, COLUMNS)).rstrip()


def table_header():
    head = _line([t for t, _, _ in COLUMNS])
    return head + "\n" + "-" * len(head)


def table_row(res):
    """One aligned line; a skipped or failed case shows its note instead."""
    if res.note and res.t_nbops is None:
        return _line([f(res) for _, _, f in COLUMNS[:3]] + [res.note])
    return _line([f(res) for _, _, f in COLUMNS])


def copy_row(n, dtype, gbps):
    """The line of the reference copy kernel, against which 'of copy' is read."""
    return _line(["copy (prange)", size_label(n), np.dtype(dtype).name, "", "", "",
                  f"{gbps:.1f}", "100%"])


def peak_row(dtype, gflops):
    """The line of the FMA peak kernel, against which GFLOP/s is read."""
    return _line(["fma peak", "", np.dtype(dtype).name, "", "", "", "", "",
                  f"{gflops:.1f}"])


def run_bench(selected, sizes, dtypes, *, rounds=5, pause=0.05, write=print, peaks=None):
    """Measure every case in ``selected`` at every size and dtype, writing the
    table as it goes; returns ``(results, copies)`` where ``copies`` maps
    ``(n, dtype name)`` to the copy kernel's GB/s measured just before.
    A dict given as ``peaks`` receives the FMA peak (GFLOP/s, see
    :func:`measure_fma_peak`) per dtype name, measured once per dtype where
    a compute-bound case runs and set on its results."""
    results, copies = [], {}
    peaks = {} if peaks is None else peaks
    for family, error in broken().items():
        write(f"{family}: not loaded, {error}")
    for case in selected:
        missing = case.missing()
        if missing:
            write(f"{case.name}: skipped, nbops.{missing[0]} does not exist yet")
    selected = [c for c in selected if not c.missing()]
    write(table_header())
    for dtype in dtypes:
        dtype = np.dtype(dtype)
        for n in sizes:
            todo = [c for c in selected if dtype in c.dtypes]
            if not todo:
                continue
            copy = copy_call(n, dtype)
            copies[(n, dtype.name)] = gbps = measure_copy(n, dtype, rounds, pause)
            write(copy_row(n, dtype, gbps))
            if dtype.name not in peaks and any(c.flops is not None for c in todo):
                peaks[dtype.name] = measure_fma_peak(dtype, rounds, pause)
                write(peak_row(dtype, peaks[dtype.name]))
            for case in todo:
                res = run_case(case, n, dtype, rounds=rounds, pause=pause, copy_gbps=gbps,
                               copy=copy)
                if res.flops is not None:
                    res.peak_gflops = peaks.get(dtype.name)
                results.append(res)
                write(table_row(res))
    return results, copies


# ---------------------------------------------------------------------------
# Markdown: one line per case, for docs/benchmarks.md and the README


def _limit_text(r):
    if r.flops is not None:
        text = f"{_fmt(r.gflops, '.0f')} GFLOP/s"
        if r.peak_fraction is not None:
            text += f", {r.peak_fraction:.0%} of FMA peak"
        return text
    if r.copy_fraction is None:
        return "-"
    return f"{r.copy_fraction:.0%} of copy ({_fmt(r.gbps, '.1f')} GB/s)"


def markdown_table(results):
    """A Markdown table with one line per case and dtype (its largest size
    measured): times, the speed-up over the baseline, and the limit, i.e.
    the fraction of the paired copy's bandwidth (memory-bound cases) or of
    the FMA peak (cases that count FLOPs). Failed or skipped cases show
    their note."""
    largest = {}
    for r in results:
        key = (r.case, r.dtype)
        if key not in largest or r.n >= largest[key].n:
            largest[key] = r
    lines = ["| case | family | size | dtype | nbops | baseline | speed-up | limit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in largest.values():
        head = f"| {r.case} | {r.family} | {size_label(r.n)} | {r.dtype} | "
        if r.t_nbops is None:
            lines.append(head + f"{r.note or '-'} | | | |")
            continue
        case = cases().get(r.case)
        base = case.baseline_name if case is not None else "baseline"
        ratio = _fmt(r.ratio, ".2f") + ("x" if r.ratio else "")
        lines.append(head + f"{fmt_time(r.t_nbops)} | {fmt_time(r.t_baseline)} ({base}) | "
                     f"{ratio} | {_limit_text(r)} |")
    return "\n".join(lines)
