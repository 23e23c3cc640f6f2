"""Profiler: which operators ran, on which device, with which shapes, for how long.

>>> import numpy as np, nbops as nb
>>> x = np.ones((64, 64), np.float32)
>>> with nb.profiler.profile(record_shapes=True) as prof:
...     with nb.profiler.record_function("block"):
...         y = nb.relu(nb.gelu(x))
>>> print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
>>> prof.export_chrome_trace("trace.json")   # chrome://tracing or ui.perfetto.dev

What is recorded
    Every call of a registered operator (built-in, user-defined through
    ``nbops.register_op``, fused through ``nbops.fuse``) made inside the
    block: name, device, input shapes and dtypes (``record_shapes=True``),
    wall time, and nested ranges opened by :func:`record_function`.
    Operators called by other operators nest under them; *self* time is an
    event's time minus that of the events nested in it.

Compilation
    Numba compiles a kernel on the first call of each signature (or loads
    it from the on-disk cache). The profiler listens to Numba's compiler
    events: time spent compiling or loading inside an op is subtracted from
    the op's time, reported as ``compile_time_total`` (and the call counted
    in ``compile_count``), and drawn as its own ``compile: <op>`` slice in
    the trace.

CUDA and synchronisation
    Kernels run asynchronously, so an op's CPU time on CUDA is what it costs
    the host: checks, allocation and the launch (as in PyTorch's profiler).
    Its device time comes from two CUDA events recorded on the default
    stream (where nbops launches) around the call. Nothing synchronises
    inside the block, so profiling does not serialise the program; the
    profiler synchronises once on the last event when the block exits and
    reads every elapsed time then. In Numba's CUDA simulator, whose events
    carry no time and whose kernels run synchronously on the host, the
    device time is the op's wall time.

Cost
    Outside a profile block nothing is recorded and operators pay one flag
    test (``_Hooks.active``). Inside, recording costs about 1-3 microseconds
    per call on the CPU (``benchmarks/bench_fusion.py``).
"""

import contextlib
import json
import os
import sys
import threading
import time

import numpy as np

from . import _dispatch

__all__ = ["profile", "record_function", "EventList", "FunctionEventAvg"]

_now = time.perf_counter_ns
_get_ident = threading.get_ident
_on_device = _dispatch.is_device_array


class _Event:
    """A finished event, made from the tuple recorded during the block."""

    __slots__ = ("name", "kind", "device", "start", "end", "compile_ns", "child_ns",
                 "shapes", "dtypes", "depth", "tid", "compiles", "cuda")

    def __init__(self, rec):
        (self.name, self.kind, self.device, self.start, self.end, self.compile_ns,
         self.child_ns, shapes, dtypes, self.depth, self.tid, c0, c1, self.cuda) = rec
        self.compiles = (c0, c1)
        self.shapes = tuple(tuple(s) if s is not None else None for s in shapes)
        self.dtypes = tuple(str(d) for d in dtypes)

    def total_ns(self):
        return self.end - self.start - self.compile_ns


class _CompileTimer:
    """A Numba event listener summing the time of outermost compilations
    (and cache loads) and keeping their intervals."""

    def __init__(self):
        self.depth = 0
        self.total = 0
        self.intervals = []
        self._t0 = 0

    def on_start(self, event):
        if self.depth == 0:
            self._t0 = _now()
        self.depth += 1

    def on_end(self, event):
        self.depth -= 1
        if self.depth == 0:
            t1 = _now()
            self.total += t1 - self._t0
            self.intervals.append((self._t0, t1))

    def notify(self, event):  # numba's Listener protocol
        if event.is_start:
            self.on_start(event)
        elif event.is_end:
            self.on_end(event)


_EVENT_MODULES = ("numba.core.event", "numba.cuda.core.event")
#: Trace thread id of the CUDA device-time track (host threads count from 1).
_CUDA_TID = 0x7FFF


class profile:
    """Record every operator call made inside a ``with`` block.

    Parameters
    ----------
    record_shapes : bool, default False
        Also record each call's input shapes and dtypes (a few hundred
        nanoseconds per call), enabling ``key_averages(group_by_input_shape=True)``.

    Only one profile block may be active at a time (``RuntimeError``
    otherwise). After the block, :meth:`key_averages`, :meth:`events`,
    :meth:`table` and :meth:`export_chrome_trace` read the recording.
    """

    def __init__(self, record_shapes=False):
        if not isinstance(record_shapes, (bool, np.bool_)):
            raise TypeError(f"profile: argument 'record_shapes' must be a bool, got "
                            f"{type(record_shapes).__name__}")
        self.record_shapes = bool(record_shapes)
        self._events = []
        self._stacks = {}
        self._timer = _CompileTimer()
        self._listening = []
        self._t0 = None
        self._cuda_ref = None     # (host ns, CUDA event) aligning the device timeline
        self._done = []
        self._active = False

    # -- the block -------------------------------------------------------------
    def __enter__(self):
        if _dispatch._Hooks.profiler is not None:
            raise RuntimeError("profile: another profile block is already active")
        self._listen()
        self._t0 = _now()
        self._active = True
        _dispatch._Hooks.profiler = self
        _dispatch._Hooks.refresh()
        return self

    def __exit__(self, *exc):
        _dispatch._Hooks.profiler = None
        _dispatch._Hooks.refresh()
        self._active = False
        self._t1 = _now()
        for mod, listener in self._listening:
            for kind in ("numba:compiler_lock",):
                mod.unregister(kind, listener)
        self._listening = []
        self._resolve_cuda()
        return False

    def _listen(self):
        """Listen to the compiler events of numba and (once imported) numba.cuda."""
        have = {id(m) for m, _ in self._listening}
        for name in _EVENT_MODULES:
            mod = sys.modules.get(name)
            if mod is not None and id(mod) not in have:
                mod.Listener.register(_CompileTimer)   # a virtual subclass: no import at load
                mod.register("numba:compiler_lock", self._timer)
                self._listening.append((mod, self._timer))

    # -- recording (called by every operator while the block is active) ---------
    # Kept lean: an event is one tuple appended when it closes (see _Event);
    # shapes and dtypes are kept as the arrays carry them, turned into text
    # when read; the stack holds one child-time counter per open event.
    def _begin(self, name, kind, args):
        tid = _get_ident()
        stack = self._stacks.get(tid)
        if stack is None:
            stack = self._stacks[tid] = []
        device = "cpu"
        for a in args:
            if type(a) is np.ndarray:
                break
            if _on_device(a):
                device = "cuda"
                break
        if self.record_shapes and args:
            shapes = tuple([a.shape if type(a) is np.ndarray else _shape(a) for a in args])
            dtypes = tuple([a.dtype if type(a) is np.ndarray else _dtype(a) for a in args])
        else:
            shapes = dtypes = ()
        timer = self._timer
        child = [0]
        stack.append(child)
        cuda = self._cuda_start() if device == "cuda" else None
        return [name, kind, device, _now(), timer.total, shapes, dtypes, stack, child, tid,
                len(timer.intervals), cuda]

    def _end(self, state):
        t1 = _now()
        name, kind, device, t0, c0, shapes, dtypes, stack, child, tid, n0, cuda = state
        if cuda is not None:
            cuda[1].record(0)
        timer = self._timer
        compile_ns = timer.total - c0
        stack.pop()
        if stack:
            stack[-1][0] += t1 - t0 - compile_ns
        self._events.append((name, kind, device, t0, t1, compile_ns, child[0], shapes, dtypes,
                             len(stack), tid, n0, len(timer.intervals), cuda))

    def record(self, op, args, kwargs, call):
        """Run ``call()`` (one operator call) and record it; the hook that
        ``nbops._dispatch`` calls for every operator while a block is active."""
        state = self._begin(op.name, "op", args)
        try:
            return call()
        finally:
            self._end(state)

    def _cuda_start(self):
        cuda = _dispatch.ensure_cuda()
        self._listen()
        if self._cuda_ref is None:
            ref = cuda.event()
            ref.record(0)
            self._cuda_ref = (_now(), ref)
        start, end = cuda.event(), cuda.event()
        start.record(0)
        return [start, end, None, None]   # the events, then (offset, elapsed) in us

    def _resolve_cuda(self):
        self._done = [_Event(e) for e in self._events]
        pending = [e for e in self._done if e.cuda is not None and e.cuda[2] is None]
        if not pending:
            return
        pending[-1].cuda[1].synchronize()   # one synchronisation for the whole block
        from ._dispatch import cuda_simulated

        simulated = cuda_simulated()
        ref_ns, ref = self._cuda_ref
        for e in pending:
            start, end = e.cuda[0], e.cuda[1]
            if simulated:
                e.cuda[2], e.cuda[3] = (e.start - ref_ns) / 1e3, e.total_ns() / 1e3
            else:
                e.cuda[2] = ref.elapsed_time(start) * 1e3 + (ref_ns - self._t0) / 1e3
                e.cuda[3] = start.elapsed_time(end) * 1e3

    # -- reading ------------------------------------------------------------------
    def events(self):
        """The recorded events in the order they finished, as dicts with
        ``name``, ``kind`` ("op" or "range"), ``device``, ``start_us`` (from the
        block's start), ``cpu_time_us``, ``self_cpu_time_us``, ``compiled`` (the
        call compiled or loaded a kernel), ``compile_time_us``,
        ``device_time_us`` (None off CUDA), ``depth``, ``input_shapes`` and
        ``input_dtypes``."""
        self._check_done("events")
        return [{
            "name": e.name, "kind": e.kind, "device": e.device,
            "start_us": (e.start - self._t0) / 1e3, "cpu_time_us": e.total_ns() / 1e3,
            "self_cpu_time_us": (e.total_ns() - e.child_ns) / 1e3,
            "compiled": bool(e.compile_ns), "compile_time_us": e.compile_ns / 1e3,
            "device_time_us": e.cuda[3] if e.cuda is not None else None,
            "depth": e.depth, "input_shapes": list(e.shapes), "input_dtypes": list(e.dtypes),
        } for e in self._done]

    def key_averages(self, group_by_input_shape=False):
        """Events grouped by name (and input shapes when
        ``group_by_input_shape=True``, which needs ``record_shapes=True``),
        as an :class:`EventList` of :class:`FunctionEventAvg`."""
        self._check_done("key_averages")
        if group_by_input_shape and not self.record_shapes:
            raise ValueError("key_averages: group_by_input_shape=True needs "
                             "profile(record_shapes=True)")
        groups = {}
        for e in self._done:
            key = (e.name, e.shapes) if group_by_input_shape else e.name
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = FunctionEventAvg(
                    e.name, e.shapes if group_by_input_shape else None)
            avg._add(e)
        return EventList(groups.values(), group_by_input_shape)

    def table(self, sort_by="self_cpu_time_total", row_limit=20, group_by_input_shape=False):
        """``key_averages(group_by_input_shape).table(sort_by, row_limit)``."""
        return self.key_averages(group_by_input_shape).table(sort_by=sort_by,
                                                             row_limit=row_limit)

    def export_chrome_trace(self, path):
        """Write the recording as Chrome trace-event JSON (``chrome://tracing``,
        ``ui.perfetto.dev``): one complete ("X") event per op and range on its
        thread, a ``compile: <op>`` slice per compilation, and a "CUDA" track
        with each CUDA op's device time."""
        self._check_done("export_chrome_trace")
        pid = os.getpid()
        out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                "args": {"name": "nbops"}}]
        tids = {}
        for e in self._done:
            tid = tids.setdefault(e.tid, len(tids) + 1)
            args = {"device": e.device, "compiled": bool(e.compile_ns),
                    "compile_us": round(e.compile_ns / 1e3, 3)}
            if e.shapes:
                args["Input Dims"] = [list(s) if s is not None else [] for s in e.shapes]
                args["Input type"] = [d or "" for d in e.dtypes]
            out.append({"name": e.name, "cat": "cpu_op" if e.kind == "op" else
                        "user_annotation", "ph": "X", "ts": (e.start - self._t0) / 1e3,
                        "dur": (e.end - e.start) / 1e3, "pid": pid, "tid": tid, "args": args})
            for c0, c1 in self._timer.intervals[e.compiles[0]:e.compiles[1]]:
                if e.kind == "op" and c0 >= e.start:
                    out.append({"name": f"compile: {e.name}", "cat": "compile", "ph": "X",
                                "ts": (c0 - self._t0) / 1e3, "dur": (c1 - c0) / 1e3,
                                "pid": pid, "tid": tid, "args": {}})
            if e.cuda is not None and e.cuda[3] is not None:
                out.append({"name": e.name, "cat": "kernel", "ph": "X", "ts": e.cuda[2],
                            "dur": e.cuda[3], "pid": pid, "tid": _CUDA_TID,
                            "args": {"cpu_op_ts": (e.start - self._t0) / 1e3}})
        names = {tid: f"thread {ident}" for ident, tid in tids.items()}
        if any(e.cuda is not None for e in self._done):
            names[_CUDA_TID] = "CUDA stream 0 (device time)"
        for tid, name in names.items():
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": name}})
        with open(path, "w") as f:
            json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f)
        return path

    def _check_done(self, what):
        if self._active:
            raise RuntimeError(f"profile.{what}: call it after the profile block has exited")
        if self._t0 is None:
            raise RuntimeError(f"profile.{what}: nothing recorded; use 'with profile() as prof:'")


class record_function(contextlib.ContextDecorator):
    """A named range in the profile: ``with record_function("attention"): ...``
    (or as a decorator). Ops called inside nest under it, so its self time is
    the Python work between them. Costs nothing when no profile is active.
    """

    def __init__(self, name):
        if not isinstance(name, str) or not name:
            raise TypeError(f"record_function: name must be a non-empty str, got {name!r}")
        self.name = name
        self._open = []

    def __enter__(self):
        prof = _dispatch._Hooks.profiler
        if isinstance(prof, profile):
            self._open.append((prof, prof._begin(self.name, "range", ())))
        else:
            self._open.append(None)
        return self

    def __exit__(self, *exc):
        entry = self._open.pop()
        if entry is not None:
            prof, state = entry
            prof._end(state)
        return False


def _shape(a):
    shape = getattr(a, "shape", None)
    return tuple(shape) if shape is not None else None


def _dtype(a):
    dtype = getattr(a, "dtype", None)
    return dtype if dtype is not None else type(a).__name__


class FunctionEventAvg:
    """Totals of one key: ``key`` (the op or range name), ``count``,
    ``cpu_time_total`` and ``self_cpu_time_total`` (microseconds, compile time
    excluded), ``device_time_total`` (alias ``cuda_time_total``; CUDA ops),
    ``compile_time_total`` and ``compile_count`` (calls that compiled or
    loaded a kernel), ``devices``, and ``input_shapes`` when grouped by shape."""

    def __init__(self, key, input_shapes=None):
        self.key = key
        self.input_shapes = [list(s) if s is not None else [] for s in input_shapes] \
            if input_shapes is not None else None
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.device_time_total = 0.0
        self.compile_time_total = 0.0
        self.compile_count = 0
        self.devices = set()

    def _add(self, e):
        self.count += 1
        total = e.total_ns()
        self.cpu_time_total += total / 1e3
        self.self_cpu_time_total += (total - e.child_ns) / 1e3
        if e.compile_ns:
            self.compile_time_total += e.compile_ns / 1e3
            self.compile_count += 1
        if e.cuda is not None and e.cuda[3] is not None:
            self.device_time_total += e.cuda[3]
        if e.kind == "op":
            self.devices.add(e.device)

    @property
    def cuda_time_total(self):
        return self.device_time_total

    @property
    def cpu_time(self):
        """Average CPU time per call (us)."""
        return self.cpu_time_total / self.count if self.count else 0.0

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key!r} count={self.count} "
                f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
                f"cpu_time_total={self.cpu_time_total:.3f}us>")


_SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "device_time_total",
              "cuda_time_total", "compile_time_total", "count", "cpu_time")


class EventList(list):
    """A list of :class:`FunctionEventAvg` with :meth:`table`."""

    def __init__(self, items=(), group_by_input_shape=False):
        super().__init__(items)
        self.group_by_input_shape = group_by_input_shape

    def table(self, sort_by="self_cpu_time_total", row_limit=20):
        """A text table like PyTorch's profiler: name, self CPU % and time,
        CPU total % and time, average, device time (when any op ran on
        CUDA), compile time (when anything compiled), calls, and input
        shapes when grouped by shape; sorted by ``sort_by`` (descending),
        at most ``row_limit`` rows (-1: all)."""
        if sort_by not in _SORT_KEYS:
            raise ValueError(f"table: argument 'sort_by' must be one of "
                             f"{', '.join(_SORT_KEYS)}, got {sort_by!r}")
        if isinstance(row_limit, bool) or not isinstance(row_limit, int):
            raise TypeError(f"table: argument 'row_limit' must be an int, got {row_limit!r}")
        rows = sorted(self, key=lambda a: getattr(a, sort_by), reverse=True)
        if row_limit >= 0:
            rows = rows[:row_limit]
        self_total = sum(a.self_cpu_time_total for a in self) or 1.0
        dev_total = sum(a.device_time_total for a in self)
        compile_total = sum(a.compile_time_total for a in self)
        cols = [("Name", lambda a: a.key, "<"),
                ("Self CPU %", lambda a: f"{100 * a.self_cpu_time_total / self_total:.2f}%", ">"),
                ("Self CPU", lambda a: _fmt(a.self_cpu_time_total), ">"),
                ("CPU total %", lambda a: f"{100 * a.cpu_time_total / self_total:.2f}%", ">"),
                ("CPU total", lambda a: _fmt(a.cpu_time_total), ">"),
                ("CPU time avg", lambda a: _fmt(a.cpu_time), ">")]
        if dev_total:
            cols += [("Device total", lambda a: _fmt(a.device_time_total), ">"),
                     ("Device %", lambda a: f"{100 * a.device_time_total / dev_total:.2f}%", ">")]
        if compile_total:
            cols += [("Compile", lambda a: _fmt(a.compile_time_total), ">"),
                     ("# compiled", lambda a: str(a.compile_count), ">")]
        cols.append(("# of Calls", lambda a: str(a.count), ">"))
        if self.group_by_input_shape:
            cols.append(("Input Shapes", lambda a: str(a.input_shapes), "<"))
        cells = [[f(a) for _, f, _ in cols] for a in rows]
        widths = [max([len(name)] + [len(r[i]) for r in cells]) for i, (name, _, _) in
                  enumerate(cols)]
        rule = "  ".join("-" * w for w in widths)

        def line(values):
            return "  ".join(f"{v:{al}{w}}" for v, (_, _, al), w in zip(values, cols, widths))

        parts = [rule, line([name for name, _, _ in cols]), rule] + [line(r) for r in cells]
        parts += [rule, f"Self CPU time total: {_fmt(sum(a.self_cpu_time_total for a in self))}"]
        if dev_total:
            parts.append(f"Self device time total: {_fmt(dev_total)}")
        if compile_total:
            parts.append(f"Compile time total (excluded above): {_fmt(compile_total)}")
        return "\n".join(parts)

    def __str__(self):
        return self.table()


def _fmt(us):
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"
