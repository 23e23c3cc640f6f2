"""Warm-up: compile the kernels a script will use, once, into Numba's disk cache.

Every nbops kernel is compiled with ``cache=True``: the first call of a
signature compiles it (seconds for large kernels) and writes it to the
cache; later processes load it (milliseconds). Warming up makes that first
call happen ahead of time, e.g. while building a container image::

    python -m nbops warmup --ops relu gelu matmul --dtypes float32
    python -m nbops warmup                      # every registered op, float32 + float64
    python -m nbops warmup --from-profile trace.json --jobs 2

or from Python, including fused expressions::

    nbops.warmup(ops=["relu", my_fused_fn], dtypes=["float32"])

Each op is called in the layouts its kernels distinguish: 1-D contiguous,
2-D contiguous and 2-D strided (a column slice), tiny and large (128K
elements, above the size where ops switch to their multi-threaded
kernels; not on a simulated CUDA device, which compiles nothing), with its
parameter variants that select other kernels (``gelu(approximate="tanh")``).
Layouts an op rejects (matmul of two vectors of the wrong length, say) are
skipped and reported; only an op for which no layout works is an error.
``--from-profile`` reads a Chrome trace written by :mod:`nbops.profiler`
and warms exactly the ops it shows, in the dtypes it records, and replays
the recorded input shapes (with the ops' default keywords) for ops whose
inputs are all arrays: conv2d, pooling or attention reject the generic
layouts, and a trace made with ``record_shapes=True`` still warms them.

Parallel warm-up
    The command line compiles in worker processes (``--jobs``, default one
    per core; ``nbops.warmup(jobs=N)`` from Python), each a fresh
    ``python -c`` process running :func:`_worker`. The work is split into *families*:
    an op's family keys are its front module (``nbops.conv``) and the
    kernel modules that module names for its kernels (the
    ``"nbops.cpu.conv:attr"`` strings of the registry); ops sharing a key
    are one family, so ops whose kernels live in one module (relu and
    relu_backward, the softmax pair, linear/matmul/bmm) compile on one
    worker, in order, and no kernel module is in two families.
    Families are scheduled longest first, from a table of measured cold
    compile seconds (:data:`COLD_SECONDS`).

    Families still share kernels below that level: conv's and attention's
    kernels compile GEMM micro-kernels into themselves, and most fronts
    call ``contiguous``, whose strided copy is one kernel for all. Numba's
    cache writers race (two processes update one index file and one of
    them loses its entry, or both name a new entry's data file alike), so
    each worker *claims* a kernel before it compiles one: an exclusive file
    lock per cache index (``fcntl.flock`` on a file in a directory the
    parent makes), held while Numba looks in the cache, compiles and saves.
    A worker reaching a kernel that another is compiling waits, then loads
    it from the cache; so no two processes write one cache entry at once
    and no cached kernel is compiled twice (helpers without a disk cache
    are compiled into each caller anyway). The wait shows in each
    family's line.
    Where ``fcntl`` is missing (Windows) the warm-up runs in one process.

CUDA warm-up, fused functions and operators defined with
:func:`nbops.register_op` run in the calling process, after the workers.
The cache lives beside the kernel modules (``__pycache__``) or in
``$NUMBA_CACHE_DIR``: warm up with the same setting the script will run
with. Measured first-call latencies are in ``tools/bench_fusion.py
--startup``; the parallel warm-up's figures in docs/startup.md.
"""

import inspect
import os
import re
import sys
import time

import numpy as np

from . import _checks, _dispatch

__all__ = ["warmup"]

#: Keyword variants that select a different kernel; every op also runs once
#: with its defaults.
VARIANTS = {
    "gelu": [{"approximate": "tanh"}],
    "gelu_backward": [{"approximate": "tanh"}],
}

_DTYPES = ("float32", "float64")
#: Elements of the "large" layouts: above every serial/parallel threshold.
LARGE = 1 << 17

#: Expected cold compile seconds of a family, by family key: the families
#: the generic layouts exercise as measured (float32, one process, 2-core
#: EPYC under load, docs/startup.md); conv and the int8 GEMM, reached only
#: through traced shapes, from the issue's compile report. A family costs
#: the largest of its keys' figures, else one second per op. Only the order
#: matters: the longest families start first.
COLD_SECONDS = {
    "nbops.cpu.activations": 120.0, "nbops.cpu.linalg": 110.0,
    "nbops.quant.cpu_gemm": 80.0, "nbops.neuromorphic.cpu": 50.0, "nbops.cpu.conv": 45.0,
    "nbops.cpu.attention": 30.0, "nbops.cpu.softmax": 22.0, "nbops.cpu.tensor": 8.0,
    "nbops.nn.cpu": 6.0, "nbops.cpu.pooling": 5.0,
}


def warmup(ops=None, dtypes=_DTYPES, devices=("cpu",), verbose=False, jobs=1):
    """Compile (or load) the kernels of ``ops`` for ``dtypes`` on ``devices``.

    Parameters
    ----------
    ops : iterable of str, Operator or Fused, optional
        Operator names (``"relu"``), operators, or functions made by
        :func:`nbops.fuse`; default every registered operator.
    dtypes : iterable of {"float32", "float64"}
    devices : iterable of {"cpu", "cuda"}
        "cuda" needs a GPU (or the simulator, where nothing is compiled).
    verbose : bool
        Print one line per op (per family with ``jobs > 1``).
    jobs : int
        Worker processes for the built-in operators' CPU kernels (see the
        module docstring); 1 (default) compiles in this process.

    Returns
    -------
    dict
        ``{op name: {"ok": [(dtype, device, layout), ...], "skipped":
        [(dtype, device, layout, reason), ...], "seconds": float}}``.

    Raises
    ------
    ValueError
        An unknown op name, dtype or device, ``jobs < 1``, an op that ran in
        no layout, or (``jobs > 1``) a family whose worker failed.
    TypeError
        ``ops`` holds something that is not a name, Operator or Fused.

    Example
    -------
    >>> report = nbops.warmup(ops=["relu"], dtypes=["float32"])
    >>> report["relu"]["ok"][0]
    ('float32', 'cpu', '1-D')
    """
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    devices = [devices] if isinstance(devices, str) else list(devices)
    for d in dtypes:
        _checks.choice("warmup", "dtypes", d, _DTYPES)
    for d in devices:
        _checks.choice("warmup", "devices", d, _dispatch.DEVICES)
    if "cuda" in devices and not _dispatch.cuda_available():
        raise ValueError("warmup: devices includes 'cuda' but no GPU (or simulator) is "
                         "available")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"warmup: argument 'jobs' must be an int >= 1, got {jobs!r}")
    if isinstance(ops, str):
        ops = [ops]
    explicit = ops is not None
    resolved = [_resolve(op) for op in (ops if explicit else _dispatch.registered_ops())]
    report = {}
    if jobs > 1:
        parallel = [name for name, fn, _ in resolved if _in_worker(fn, devices)]
        families = kernel_families(parallel)
        if len(families) > 1:
            requests = [_Request(name, dtypes, devices) for name in parallel]
            result = run_families(families, requests, jobs, progress=verbose,
                                  explicit=explicit)
            if result.errors:
                raise ValueError("warmup: " + "; ".join(result.errors))
            report.update(result.report)
            resolved = [r for r in resolved if r[0] not in report]
    for name, fn, arity in resolved:
        report[name] = _warm_op(name, fn, arity, dtypes, devices)
        if verbose:
            _print_op(name, report[name])
        if explicit and not report[name]["ok"]:
            raise ValueError(_no_layout(name, report[name]))
    return report


def _warm_op(name, fn, arity, dtypes, devices, inputs=()):
    """One op's report: every layout, dtype, device and variant, then the
    recorded ``inputs`` (``[[(shape, dtype), ...], ...]``) of a trace."""
    t0 = time.perf_counter()
    simulated = "cuda" in devices and _dispatch.cuda_simulated()
    ok, skipped = [], []
    for device in devices:
        for dtype in dtypes:
            for layout, args in _layouts(arity, dtype):
                if device == "cuda" and simulated and "large" in layout:
                    # the simulator compiles nothing and runs each CUDA
                    # thread in Python: minutes for nothing cached
                    continue
                _call(fn, name, args, device, (dtype, device, layout), ok, skipped)
        for spec in inputs:
            layout = "traced " + ", ".join(f"{dt}{list(shape)}" for shape, dt in spec)
            args = tuple(_traced_array(shape, dt) for shape, dt in spec)
            _call(fn, name, args, device, (spec[0][1], device, layout), ok, skipped)
    return {"ok": ok, "skipped": skipped, "seconds": time.perf_counter() - t0}


def _call(fn, name, args, device, where, ok, skipped):
    if device == "cuda":
        args = tuple(_to_device(a) for a in args)
    for kwargs in [{}] + VARIANTS.get(name, []):
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # any rejection: try the next layout
            skipped.append((*where, f"{type(exc).__name__}: {exc}"))
        else:
            if kwargs == {}:
                ok.append(where)


def _no_layout(name, rep):
    reasons = "; ".join(sorted({s[3] for s in rep["skipped"]}))[:500]
    return f"warmup: {name} ran in no layout: {reasons}"


def _print_op(name, rep):
    print(f"{name:24s} {rep['seconds']:7.2f} s  {len(rep['ok'])} ok, "
          f"{len(rep['skipped'])} skipped", file=sys.stderr)


def _layouts(n_arrays, dtype):
    """Argument tuples for one op: 1-D, 2-D contiguous, 2-D strided views."""
    rng = np.random.default_rng(0)

    def make(shape):
        return rng.uniform(0.5, 1.5, shape).astype(dtype)

    yield "1-D", tuple(make(33) for _ in range(n_arrays))
    yield "2-D", tuple(make((8, 8)) for _ in range(n_arrays))
    yield "2-D strided", tuple(make((8, 16))[:, ::2] for _ in range(n_arrays))
    # large enough for the multi-threaded kernels of ops that keep small
    # inputs on the calling thread (nbops.fuse, optimizers, ...)
    yield "1-D large", tuple(make(LARGE) for _ in range(n_arrays))
    yield "2-D large strided", tuple(make((LARGE // 512, 1024))[:, ::2]
                                     for _ in range(n_arrays))


def _traced_array(shape, dtype):
    # values in [0.5, 1.5) for floats (logs, divisions, norms stay finite);
    # zeros for integers, valid as indices and labels
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.random.default_rng(0).uniform(0.5, 1.5, shape).astype(dtype)
    return np.zeros(shape, dtype)


def _arity(fn):
    """Number of required positional parameters (the arrays)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in sig.parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty) or 1


def _resolve(op):
    """``(name, callable, arity)`` for an op name, an Operator or a fused function."""
    from .fusion import Fused

    if isinstance(op, str):
        try:
            operator = _dispatch.get_operator(op)
        except KeyError:
            raise ValueError(f"warmup: no operator named {op!r}; see "
                             "nbops.registered_ops()") from None
        return op, operator, _arity(operator.front)
    if isinstance(op, Fused):
        return op.name, op, _arity(op.fn)
    if isinstance(op, _dispatch.Operator):
        return op.name, op, _arity(op.front)
    raise TypeError(f"warmup: ops must hold operator names, operators or fused functions, "
                    f"got {_checks.describe(op)}")


def _in_worker(fn, devices):
    """Whether a worker process can warm ``fn``: a built-in operator (a fresh
    process knows it by name), CPU only, and file locks to claim kernels."""
    return (isinstance(fn, _dispatch.Operator) and fn.__module__.startswith("nbops.")
            and _dispatch._OPERATORS.get(fn.name) is fn and list(devices) == ["cpu"]
            and _can_claim())


def _to_device(a):
    # strided host views keep their strides on the device, as users' views do
    cuda = _dispatch.ensure_cuda()
    if a.flags.c_contiguous:
        return cuda.to_device(a)
    from ._layout import strided_view

    base = cuda.to_device(np.ascontiguousarray(a.base))
    off = a.__array_interface__["data"][0] - a.base.__array_interface__["data"][0]
    return strided_view(base, a.shape, a.strides, off)


# ---------------------------------------------------------------------------
# Families: which ops compile together on one worker


class _Request:
    """One op to warm: its dtypes, devices and the inputs a trace recorded."""

    def __init__(self, op, dtypes, devices=("cpu",), inputs=()):
        self.op, self.dtypes, self.devices = op, list(dtypes), list(devices)
        self.inputs = [[(tuple(shape), dt) for shape, dt in spec] for spec in inputs]

    def as_json(self):
        return {"op": self.op, "dtypes": self.dtypes, "devices": self.devices,
                "inputs": self.inputs}


def kernel_families(names):
    """Partition built-in operator names into families, longest first.

    An op's keys are its front module and its kernel family's modules
    (:func:`family_keys`); ops sharing a key are one family (the
    connected components). Returns a list of ``(ops, keys, cost)`` tuples:
    ``ops`` in the order given, ``keys`` a frozenset, ``cost`` the expected
    cold seconds (:data:`COLD_SECONDS`), sorted by decreasing cost.

    Example
    -------
    >>> [f[0] for f in kernel_families(["relu", "softmax", "relu_backward"])]
    [('relu', 'relu_backward'), ('softmax',)]
    """
    keys = {name: family_keys(name) for name in names}
    parent = {}

    def root(k):
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    for name in names:
        first, *rest = sorted(keys[name])
        for k in rest:
            parent[root(k)] = root(first)
    families = {}
    for name in names:
        families.setdefault(root(min(keys[name])), []).append(name)
    out = []
    for ops in families.values():
        ks = frozenset().union(*(keys[n] for n in ops))
        cost = max([COLD_SECONDS[k] for k in ks if k in COLD_SECONDS] or [float(len(ops))])
        out.append((tuple(ops), ks, cost))
    return sorted(out, key=lambda f: -f[2])


def family_keys(name):
    """The family keys of built-in op ``name``: its front module and the
    kernel modules (CPU and CUDA) of its spec's kernel family."""
    op = _dispatch.get_operator(name)
    family = op.spec.family
    modules = () if family is None else (family.cpu, family.cuda)
    return frozenset({op.front.__module__} | {m for m in modules if m})


# ---------------------------------------------------------------------------
# Running families in worker processes


class FamilyRun:
    """What :func:`run_families` returns: ``report`` (as :func:`warmup`'s),
    ``families`` (one dict per family: ``ops``, ``seconds``, ``cpu_s`` (its
    worker's CPU time), ``worker`` (pid), ``compiled`` kernels, ``compile_s``,
    ``wait_s`` spent waiting for other workers' claims, ``error``), ``errors``
    (one line per failed family) and
    ``seconds`` (wall time), ``duplicates`` (``{kernel: [families]}`` for a
    kernel compiled by more than one family: none while claims work)."""

    def __init__(self):
        self.report, self.families, self.errors, self.seconds = {}, [], [], 0.0
        self.duplicates = {}


def run_families(families, requests, jobs, progress=True, explicit=True):
    """Warm ``families`` (from :func:`kernel_families`) in ``jobs`` worker
    processes, longest first; ``requests`` (:class:`_Request`) say how to
    warm each op. ``progress`` shows a bar (tqdm, when installed) or a line
    per finished family on stderr. An op that runs in no layout is an error
    of its family when ``explicit``. Returns a :class:`FamilyRun`."""
    import queue
    import tempfile
    import threading

    by_op = {r.op: r for r in requests}
    todo = queue.Queue()
    for i, (ops, _, _) in enumerate(families):
        todo.put((i, [by_op[op].as_json() for op in ops]))
    done = queue.Queue()
    run = FamilyRun()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nbops-warmup-") as claims:
        workers = [threading.Thread(target=_drive_worker, args=(todo, done, claims, explicit),
                                    daemon=True)
                   for _ in range(min(jobs, len(families)))]
        for w in workers:
            w.start()
        bar = _Progress(len(families), progress)
        for _ in families:
            fam = done.get()
            fam["ops"] = list(families[fam["family"]][0])
            run.families.append(fam)
            for op, rep in fam.get("report", {}).items():
                run.report[op] = {k: [tuple(x) for x in v] if k != "seconds" else v
                                  for k, v in rep.items()}
            if fam["error"]:
                run.errors.append(f"family {', '.join(fam['ops'])}: {fam['error']}")
            bar.update(fam)
        bar.close()
        for w in workers:
            w.join()
    run.seconds = time.perf_counter() - t0
    compiled_by = {}
    for fam in run.families:
        for kernel in set(fam["compiled"]):
            compiled_by.setdefault(kernel, []).append(", ".join(fam["ops"]))
    run.duplicates = {k: v for k, v in compiled_by.items() if len(v) > 1}
    return run


def _drive_worker(todo, done, claims, explicit):
    """A thread of the parent: feeds families to one worker process and
    reads its replies; a worker that dies fails its family and is replaced."""
    import json
    import queue
    import subprocess
    import tempfile

    proc = log = None
    while True:
        try:
            i, jobs = todo.get_nowait()
        except queue.Empty:
            break
        if proc is None:
            log = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen([sys.executable, "-c", _WORKER, claims],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=log, text=True)
        t0 = time.perf_counter()
        line = ""
        try:
            proc.stdin.write(json.dumps({"family": i, "jobs": jobs, "explicit": explicit})
                             + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:
            pass
        if line:
            done.put(json.loads(line))
            continue
        proc.wait()
        log.seek(0)
        tail = log.read()[-1500:].strip()
        done.put({"family": i, "seconds": time.perf_counter() - t0, "cpu_s": 0.0,
                  "worker": proc.pid, "compiled": [], "compile_s": 0.0, "wait_s": 0.0,
                  "error": f"worker exited with status {proc.returncode}: {tail}"})
        proc = None
    if proc is not None:
        proc.stdin.close()
        proc.wait()


class _Progress:
    """A tqdm bar over families when tqdm is installed, else a line per
    finished family (the table of all families follows at the end)."""

    def __init__(self, total, show):
        self.show, self.bar, self.total, self.count = show, None, total, 0
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="family", file=sys.stderr)

    def update(self, fam):
        self.count += 1
        if self.bar is not None:
            self.bar.set_postfix_str(", ".join(fam["ops"])[:40])
            self.bar.update()
        elif self.show:
            print(f"[{self.count}/{self.total}] {_family_line(fam)}", file=sys.stderr)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _family_line(fam):
    ops = ", ".join(fam["ops"])
    ops = ops if len(ops) < 60 else ops[:57] + "..."
    state = "FAILED" if fam["error"] else f"{len(fam['compiled'])} compiled"
    return (f"{fam['seconds']:7.1f} s (cpu {fam['cpu_s']:6.1f} s)  {state:>12}  waited "
            f"{fam['wait_s']:5.1f} s  [{len(fam['ops'])} op(s)] {ops}")


# ---------------------------------------------------------------------------
# The worker process

#: Its command: ``python -c _WORKER CLAIM_DIR``; imports nbops (no kernel
#: module) and claims kernels before any is defined.
_WORKER = "import sys; from nbops.warmup import _worker; _worker(sys.argv[1])"


def _worker(claim_dir):
    """Serve families read as JSON lines on stdin, one JSON reply line each,
    on a copy of stdout (anything the ops print goes to stderr)."""
    import json
    import traceback

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    claims = _Claims(claim_dir)
    claims.install()
    compiled = _CompileLog(claims.key)
    from numba.core import event

    event.Listener.register(_CompileLog)  # a virtual subclass: numba is not imported at load
    event.register("numba:compile", compiled)
    for line in sys.stdin:
        msg = json.loads(line)
        t0, cpu0, wait0 = time.perf_counter(), time.process_time(), claims.wait_s
        compiled.reset()
        reply = {"family": msg["family"], "report": {}, "error": None}
        try:
            for job in msg["jobs"]:
                name, fn, arity = _resolve(job["op"])
                rep = _warm_op(name, fn, arity, job["dtypes"], job["devices"],
                               [[(tuple(s), d) for s, d in spec] for spec in job["inputs"]])
                reply["report"][name] = rep
                if msg["explicit"] and not rep["ok"]:
                    raise ValueError(_no_layout(name, rep))
        except Exception as exc:  # reported by family; the worker serves the next one
            reply["error"] = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, ValueError):
                reply["error"] += "\n" + traceback.format_exc(limit=-3)
        reply.update(seconds=time.perf_counter() - t0, cpu_s=time.process_time() - cpu0,
                     worker=os.getpid(), compiled=compiled.kernels,
                     compile_s=compiled.seconds, wait_s=claims.wait_s - wait0)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class _CompileLog:
    """A numba:compile listener: the kernels with a disk cache (module.qualname
    and argument types) this worker compiled, and the outermost compilations'
    seconds. ``cached(dispatcher)`` is false for kernels without a disk cache
    (helpers compiled into their callers): those are compiled by every
    process that needs them and never written."""

    def __init__(self, cached):
        self.cached = cached
        self.reset()

    def reset(self):
        self.kernels, self.seconds, self._depth, self._t0 = [], 0.0, 0, 0.0

    def notify(self, ev):
        if ev.is_start:
            if self._depth == 0:
                self._t0 = time.perf_counter()
            self._depth += 1
            return
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._t0
        if self.cached(ev.data["dispatcher"]) is None:
            return
        fn = ev.data["dispatcher"].py_func
        self.kernels.append(f"{fn.__module__}.{fn.__qualname__}"
                            f"({', '.join(str(a) for a in ev.data['args'])})")


#: A kernel module: nbops.cpu / nbops.cuda and what is in them, a domain
#: package's cpu*/cuda* modules (nbops.quant.cpu_gemm...), generated ones.
KERNEL_MODULE = re.compile(r"^(nbops\.(\w+\.)?(cpu|cuda)(_\w+)?(\.|$)|_nbops_)")
_installed = None


def claim_kernels(folder):
    """Make this process claim each kernel (an exclusive file lock in
    ``folder``, see *Parallel warm-up*) before compiling it, so that it and
    other processes claiming in the same folder never compile one cache
    entry twice nor write it at once; the demo's second process uses it.
    Returns False, and changes nothing, where claims cannot work: no
    ``fcntl``, or a kernel module imported already (its kernels captured
    Numba's compile before the claim could wrap it). Called again, it moves
    the claims to ``folder``."""
    global _installed
    if _installed is not None:
        _installed.folder = folder
        return True
    if not _can_claim() or any(KERNEL_MODULE.match(m) for m in list(sys.modules)):
        return False
    _installed = _Claims(folder)
    _installed.install()
    return True


def _can_claim():
    """Whether kernels can be claimed across processes here (file locks and
    the Numba internal the claim wraps)."""
    try:
        import fcntl  # noqa: F401
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return False
    return callable(getattr(Dispatcher, "compile", None))


class _Claims:
    """Cross-process claims on kernels, one exclusive ``flock`` per cache
    index (a kernel's entry in Numba's cache), held while Numba looks in the
    cache, compiles and saves: a worker reaching a kernel another worker is
    compiling waits for it, then loads it. Re-entrant within the process."""

    def __init__(self, folder):
        self.folder, self.held, self.wait_s = folder, {}, 0.0

    def install(self):
        from numba.core import sigutils
        from numba.core.dispatcher import Dispatcher

        # before any nbops kernel module is imported: nbops' compile wrappers
        # (nbops._jit) capture Dispatcher.compile when a kernel is defined
        original = Dispatcher.compile
        claims = self

        def compile(disp, sig):
            path = claims.key(disp)
            if path is None or tuple(sigutils.normalize_signature(sig)[0]) in disp.overloads:
                return original(disp, sig)  # no disk cache, or compiled here already
            with claims.claim(path):
                return original(disp, sig)

        Dispatcher.compile = compile

    def key(self, disp):
        """The claim file of a dispatcher, or None when it has no disk cache."""
        import hashlib

        index = getattr(getattr(getattr(disp, "_cache", None), "_cache_file", None),
                        "_index_path", None)
        if index is None:
            return None
        return os.path.join(self.folder, hashlib.sha1(index.encode()).hexdigest()[:24])

    def claim(self, path):
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def held():
            if path in self.held:  # compiling it already (a recursive kernel)
                yield
                return
            with open(path, "a") as f:
                t0 = time.perf_counter()
                fcntl.flock(f, fcntl.LOCK_EX)
                self.wait_s += time.perf_counter() - t0
                self.held[path] = f
                try:
                    yield
                finally:
                    del self.held[path]
                    fcntl.flock(f, fcntl.LOCK_UN)

        return held()


# ---------------------------------------------------------------------------
# Traces of nbops.profiler


def ops_from_profile(path):
    """The operator calls of a Chrome trace written by
    :meth:`nbops.profiler.profile.export_chrome_trace`.

    Returns ``(ops, unknown)``: ``ops`` maps each registered operator the
    trace shows (its op events, nested ones included) to ``{"dtypes": [...],
    "devices": [...], "inputs": [[(shape, dtype), ...], ...]}``, where
    ``dtypes`` are the float dtypes of its recorded inputs (empty without
    ``record_shapes=True``) and ``inputs`` the distinct recorded calls whose
    arguments were all arrays; ``unknown`` lists op names that are not
    registered here (fused functions, ops registered by the traced script).

    Raises ``ValueError`` naming the file: missing or unreadable, not JSON,
    not a trace, or no nbops operator in it.
    """
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read trace {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"trace {path!r} is not JSON: {exc}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"trace {path!r} is not a Chrome trace (no 'traceEvents' list)")
    ops, unknown = {}, []
    for ev in events:
        if not (isinstance(ev, dict) and ev.get("cat") == "cpu_op"
                and isinstance(ev.get("name"), str)):
            continue
        name, args = ev["name"], ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if name not in _dispatch._OPERATORS:
            if name not in unknown:
                unknown.append(name)
            continue
        entry = ops.setdefault(name, {"dtypes": [], "devices": [], "inputs": []})
        device = args.get("device", "cpu")
        if device in _dispatch.DEVICES and device not in entry["devices"]:
            entry["devices"].append(device)
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        for t in types:
            if t in _DTYPES and t not in entry["dtypes"]:
                entry["dtypes"].append(t)
        if types and len(dims) == len(types) and all(_is_dtype(t) for t in types):
            spec = [(tuple(d), t) for d, t in zip(dims, types)]
            if spec not in entry["inputs"]:
                entry["inputs"].append(spec)
    if not ops:
        raise ValueError(f"trace {path!r} shows no registered nbops operator"
                         + (f" (only {', '.join(unknown)})" if unknown else ""))
    return ops, unknown


def _is_dtype(name):
    try:
        return np.dtype(name).kind in "fiub"
    except TypeError:
        return False


# ---------------------------------------------------------------------------
# Command line


def main(argv=None):
    """``python -m nbops warmup`` (also ``python -m nbops.warmup``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nbops warmup",
                                description="compile nbops kernels into the disk cache")
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p):
    """The warmup options, for ``python -m nbops``'s sub-command parser."""
    p.add_argument("--ops", nargs="+", metavar="NAME",
                   help="operator names (default: every registered operator)")
    p.add_argument("--dtypes", nargs="+", choices=_DTYPES, default=None,
                   help="default: float32 and float64 (with --from-profile: the dtypes "
                        "the trace records for each op)")
    p.add_argument("--devices", nargs="+", choices=_dispatch.DEVICES, default=None,
                   help="default: cpu (with --from-profile: the devices the trace shows)")
    p.add_argument("--from-profile", metavar="TRACE.json",
                   help="warm the ops (dtypes, input shapes) of a trace written by "
                        "nbops.profiler's export_chrome_trace")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args):
    """Run the warm-up for parsed arguments: exit status 0, 1 when a family
    failed, or 2 on a bad request (unknown op, unreadable trace, ...)."""
    t0 = time.perf_counter()
    try:
        requests, local = _requests(args)
    except (ValueError, TypeError) as exc:
        print(f"nbops warmup: {exc}", file=sys.stderr)
        return 2
    jobs = args.jobs or _cores()
    families = kernel_families([r.op for r in requests])
    if jobs > 1 and len(families) > 1:
        result = run_families(families, requests, jobs, progress=not args.quiet,
                              explicit=args.ops is not None or args.from_profile is not None)
        report, errors = result.report, result.errors
        for fam in result.families:
            if fam["error"]:
                print(f"nbops warmup: family {', '.join(fam['ops'])} failed: {fam['error']}",
                      file=sys.stderr)
        n_workers = min(jobs, len(families))
        for kernel, fams in result.duplicates.items():
            print(f"nbops warmup: {kernel} was compiled by several families "
                  f"({'; '.join(fams)})", file=sys.stderr)
    else:
        local = requests + local
        report, errors, n_workers = {}, [], 1
    for req in local:
        name, fn, arity = _resolve(req.op)
        report[name] = _warm_op(name, fn, arity, req.dtypes, req.devices, req.inputs)
        if not args.quiet:
            _print_op(name, report[name])
        if (args.ops is not None or args.from_profile) and not report[name]["ok"]:
            print(f"nbops {_no_layout(name, report[name])}", file=sys.stderr)
            errors.append(name)
    n_ok = sum(len(r["ok"]) for r in report.values())
    print(f"nbops warmup: {len(report)} op(s), {n_ok} kernel call(s) compiled or loaded in "
          f"{time.perf_counter() - t0:.1f} s ({len(families)} family(ies), {n_workers} "
          f"worker(s))")
    if n_workers > 1 and not args.quiet:
        print("  per family: seconds (its worker's CPU seconds), kernels compiled, seconds "
              "waiting for other workers")
        for fam in sorted(result.families, key=lambda f: -f["seconds"]):
            print("  " + _family_line(fam))
    return 1 if errors else 0


def _requests(args):
    """``(parallel, local)`` :class:`_Request` lists for parsed arguments; the
    local ones (CUDA, or no file locks here) run in this process."""
    dtypes = args.dtypes or list(_DTYPES)
    devices = args.devices or ["cpu"]
    for d in devices:
        if d == "cuda" and not _dispatch.cuda_available():
            raise ValueError("devices includes 'cuda' but no GPU (or simulator) is available")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    wanted = {}
    if args.from_profile is not None:
        traced, unknown = ops_from_profile(args.from_profile)
        if unknown:
            print(f"nbops warmup: not registered operators, not warmed (fused functions: "
                  f"nbops.warmup(ops=[f]) from the script): {', '.join(unknown)}",
                  file=sys.stderr)
        for name, t in traced.items():
            devs = [d for d in t["devices"] if args.devices is None or d in args.devices]
            wanted[name] = _Request(name, args.dtypes or t["dtypes"] or dtypes,
                                    devs or devices, t["inputs"])
    for name in args.ops or ([] if args.from_profile else _dispatch.registered_ops()):
        _resolve(name)
        wanted.setdefault(name, _Request(name, dtypes, devices))
    parallel, local = [], []
    for req in wanted.values():
        fn = _dispatch.get_operator(req.op)
        (parallel if _in_worker(fn, req.devices) else local).append(req)
    return parallel, local


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
