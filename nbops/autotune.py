"""Autotuning: pick the fastest of several kernel configurations per shape.

``@autotune(configs=[...], key=[...])`` wraps a function that takes its
configuration as keyword arguments. The first time a key (the values of the
named arguments, rounded up to powers of two, plus the dtype of the first
array argument) is seen, every config is run on the real arguments (one
warm-up each, ``WARM_UP`` seconds more of them all, then ``repeat`` or more
rounds that time every config once; a config's median counts); the fastest is kept
in memory and in a JSON file in the user's cache directory, and reused
afterwards, also by later processes (unless other processes took more than
``LOAD_LIMIT`` of the CPUs while it was timed: that choice serves the
running process only). Example::

    from nbops.autotune import autotune

    @autotune(configs=[{"MC": 64, "KC": 256}, {"MC": 96, "KC": 128}],
              key=["m", "n", "k"], default={"MC": 64, "KC": 256})
    def run(a, b, out, m, n, k, MC, KC):
        ...

    run(a, b, out, m=512, n=512, k=512)   # tunes once, then reuses

Where some configs cannot run some calls (an algorithm with an
applicability rule), the caller passes ``applies=`` (a predicate over
configs) to :meth:`Autotuner.config_for`: only the configs it accepts are
timed and chosen, an entry that timed more of them serves, and one that
misses a candidate is tuned again (the convolution's planner does so).

The module itself is callable, so ``nbops.autotune(configs=..., key=...)``
is the same decorator.

Settings
--------
``NBOPS_AUTOTUNE=0``
    No timing: every call uses the tuner's documented ``default`` config
    (the first config when none is given). CI runs this way.
``NBOPS_CACHE_DIR``
    Where the cache lives; else ``$XDG_CACHE_HOME/nbops``, else
    ``~/.cache/nbops``. One file per device (CPU model or GPU name) and
    nbops version: ``autotune-<device>-<version>.json``. A file that cannot
    be parsed, or that names another device, version or format, is ignored
    with a :class:`AutotuneCacheWarning` (and replaced at the next save),
    never an error; so is an entry whose config is not among the tuner's.

``python -m nbops tune`` (:func:`tune_main`) pre-tunes common shapes.
"""

import argparse
import contextlib
import functools
import inspect
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import types
import warnings

__all__ = ["autotune", "Autotuner", "AutotuneCacheWarning", "enabled", "cache_dir",
           "cache_path", "device_name", "register_tuning", "tune_main"]

#: Cache file format. 4: more timed rounds for cheap tunings (``ROUND_BUDGET``)
#: and new convolution algorithms (strided ones on input phases, 1x1 read in
#: place) that format 3 choices never timed. 3: tunings that other processes disturbed are no
#: longer stored (``LOAD_LIMIT``); format 2 files may hold such, and are
#: re-tuned. 2: configs timed round by round after a warm-up, and new routes
#: among them (the GEMM's matrix-vector route, the convolution's BLAS route
#: off NumPy's thread pool); format 1 files held choices timed one config
#: block at a time, some under load.
FORMAT = 4

#: Seconds of untimed runs before a tuning's timed rounds (and, in the
#: benchmark harness, after each pause): work right after an idle spell
#: runs slower on a virtual CPU (docs/benchmarks.md, Method).
WARM_UP = 0.02

#: Timed rounds continue past ``repeat`` while they have taken less than
#: ``ROUND_BUDGET`` seconds, up to ``MAX_ROUNDS``: five single calls decided
#: near ties by noise (docs/benchmarks.md, figures behind the source's
#: choices). Small shapes are cheap to time more often.
ROUND_BUDGET = 0.25
MAX_ROUNDS = 31


#: Share of the machine's CPU time (all CPUs over the tuning's duration)
#: that other processes, or the hypervisor (steal), may take while a tuning
#: runs for its result to be stored on disk; above it the choice serves the
#: running process only, and the next one tunes again: a tuning timed beside
#: a busy process once stored the slower algorithm for good
#: (docs/benchmarks.md, figures behind the source's choices).
LOAD_LIMIT = 0.25


_log = logging.getLogger("nbops.autotune")


class _LoadWatch:
    """CPU time used on the machine by everything but this process, from
    its creation to :meth:`others` (Linux ``/proc/stat``; elsewhere None)."""

    def __init__(self):
        self.busy0, self.own0, self.wall0 = _machine_busy(), time.process_time(), \
            time.perf_counter()

    def others(self):
        """The others' share of all CPUs' time since creation, or None."""
        busy = _machine_busy()
        if busy is None or self.busy0 is None:
            return None
        wall = time.perf_counter() - self.wall0
        other = (busy[0] - self.busy0[0]) - (time.process_time() - self.own0)
        # the clock ticks (1/100 s) leave a few ticks of slack either way
        return max(0.0, other - 0.03) / (wall * busy[1]) if wall > 0 else None


def _machine_busy():
    """``(seconds, cpus)``: CPU seconds spent busy (user, nice, system, irq,
    softirq, steal) on all CPUs since boot, and the CPU count; None where
    ``/proc/stat`` cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
        cpus = sum(1 for line in lines if re.match(r"cpu\d", line))
        busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
        return busy / os.sysconf("SC_CLK_TCK"), max(cpus, 1)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class AutotuneCacheWarning(UserWarning):
    """The autotune cache file was unreadable or foreign and was ignored."""


def enabled():
    """False when ``NBOPS_AUTOTUNE`` is ``0``/``false``/``off``."""
    return os.environ.get("NBOPS_AUTOTUNE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir():
    """The directory holding the autotune cache files."""
    d = os.environ.get("NBOPS_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "nbops")
    return d


@functools.lru_cache(maxsize=None)
def _cpu_model():
    # read once: every autotuned call builds its cache key from it
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_name(gpu=False):
    """The CPU model, or with ``gpu=True`` the current GPU's name."""
    if gpu:
        from . import _dispatch

        dev = _dispatch.ensure_cuda().get_current_device()
        name = dev.name
        return name.decode() if isinstance(name, bytes) else str(name)
    return _cpu_model()


def _version():
    from . import __version__

    return __version__


def cache_path(device=None):
    """Path of the cache file for ``device`` (default: this CPU)."""
    device = device or device_name()
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", device).strip("-")[:80] or "device"
    return os.path.join(cache_dir(), f"autotune-{slug}-{_version()}.json")


_file_lock = threading.Lock()


def _load(path, device):
    """Entries of the cache file at ``path``; {} (with a warning) if the file
    is missing, unreadable or foreign."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as e:
        warnings.warn(f"nbops.autotune: ignoring unreadable cache file {path} ({e})",
                      AutotuneCacheWarning, stacklevel=4)
        return {}
    expected = {"format": FORMAT, "device": device, "nbops": _version()}
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or any(
            data.get(k) != v for k, v in expected.items()):
        got = {k: data.get(k) for k in expected} if isinstance(data, dict) else type(data).__name__
        warnings.warn(f"nbops.autotune: ignoring cache file {path}: written for {got}, "
                      f"expected {expected}", AutotuneCacheWarning, stacklevel=4)
        return {}
    return data["entries"]


def _save(path, device, key, entry):
    """Merge one entry into the cache file, atomically (temp file + rename),
    under a lock that other processes take too, so that two tuning at once
    keep each other's entries (read-merge-write would otherwise lose one)."""
    with _file_lock:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with _process_lock(path + ".lock"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", AutotuneCacheWarning)
                    entries = _load(path, device)
                entries[key] = entry
                data = {"format": FORMAT, "device": device, "nbops": _version(),
                        "entries": entries}
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, path)
        except OSError as e:  # a read-only home must not break computation
            warnings.warn(f"nbops.autotune: could not write {path} ({e})",
                          AutotuneCacheWarning, stacklevel=4)


@contextlib.contextmanager
def _process_lock(path):
    # an exclusive flock on a side file (none where fcntl is missing: Windows)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _bucket(v):
    """Round a positive int up to a power of two (0 and 1 stay)."""
    return v if v <= 1 else 1 << (int(v) - 1).bit_length()


class Autotuner:
    """A function tuned over ``configs``; see the module docstring.

    Parameters
    ----------
    fn : callable
        Called as ``fn(*args, **kwargs, **config)``.
    configs : list of dict
        Candidate configurations (JSON-serialisable values).
    key : list of str
        Names of ``fn``'s arguments (ints) whose values select a tuning; the
        dtype (an argument named ``dtype``, else the first array's) is
        always part of the key.
    default : dict, optional
        The config used when tuning is off; the first config if None.
    name : str, optional
        Name in the cache file (default: ``fn``'s qualified name).
    warmup, repeat : int
        Untimed and timed runs per config.
    bucket : bool
        Round key values up to powers of two, so that nearby shapes share
        one tuning.
    """

    def __init__(self, fn, configs, key, default=None, name=None, warmup=1, repeat=5,
                 bucket=True):
        configs = [dict(c) for c in configs]
        if not configs:
            raise ValueError("autotune: configs must not be empty")
        if default is not None and dict(default) not in configs:
            configs.append(dict(default))
        self.fn = fn
        self.configs = configs
        self.key = list(key)
        self.default = dict(default) if default is not None else configs[0]
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"
        self.warmup = int(warmup)
        self.repeat = max(1, int(repeat))
        self.bucket = bucket
        self._signature = inspect.signature(fn)
        self._memory = {}      # (device, key) -> entry
        self._chosen = {}      # (gpu, dtype, key values, only) -> config, see config_for
        self._loaded = {}      # device -> entries read from disk
        self._masks = {}       # applies rule -> (configs, mask, candidates), see _candidates
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    # -- keys ---------------------------------------------------------------

    def key_of(self, args, kwargs):
        """The cache key string for a call."""
        if "dtype" in kwargs and all(k in kwargs for k in self.key):
            bound = kwargs  # the usual call: binding costs ~20 us, more than a small kernel
        else:
            bound = self._signature.bind_partial(*args, **kwargs).arguments
        parts = [self.name]
        dtype = bound.get("dtype") or next(
            (v.dtype for v in bound.values() if hasattr(v, "dtype") and hasattr(v, "shape")),
            None)
        parts.append(str(dtype))
        for k in self.key:
            if k not in bound:
                raise TypeError(f"autotune: {self.name}: key argument {k!r} was not passed")
            v = bound[k]
            if self.bucket and isinstance(v, int) and not isinstance(v, bool):
                v = _bucket(v)
            parts.append(f"{k}={v}")
        return "|".join(parts)

    def _device(self, args, kwargs):
        from . import _dispatch

        gpu = any(_dispatch.is_device_array(v) for v in list(args) + list(kwargs.values()))
        return device_name(gpu=gpu)

    # -- lookup -------------------------------------------------------------

    def _valid(self, entry):
        return (isinstance(entry, dict) and entry.get("config") in self.configs
                and isinstance(entry.get("times"), list)
                and all(isinstance(t, (list, tuple)) and len(t) == 2 and isinstance(t[0], dict)
                        and (t[1] is None or isinstance(t[1], (int, float)))
                        for t in entry["times"]))

    def _other_candidates(self, entry, candidates=None):
        """Whether a stored (valid) entry cannot serve a call whose
        candidates are ``candidates`` (None: all of this tuner's configs):
        it timed a config this tuner no longer has, or misses one of the
        candidates (a config added since, or one that did not apply to the
        shape it was tuned on); its choice is then made again rather than
        trusted. An entry that timed more than the candidates (tuned on a
        shape of the same key where more configs applied) serves: the
        choice is made among the candidates."""
        timed = [config for config, _ in entry["times"]]
        wanted = self.configs if candidates is None else candidates
        return any(c not in self.configs for c in timed) or any(c not in timed for c in wanted)

    def lookup(self, key, device, candidates=None):
        """The stored entry for ``key`` on ``device`` (memory, then disk)
        that can serve ``candidates`` (see :meth:`_other_candidates`), or None."""
        entry = self._memory.get((device, key))
        if entry is None:
            if device not in self._loaded:
                self._loaded[device] = _load(cache_path(device), device)
            entry = self._loaded[device].get(key)
            if entry is None:
                return None
            if not self._valid(entry):  # warns, then tunes again
                warnings.warn(f"nbops.autotune: ignoring malformed cache entry {key!r} in "
                              f"{cache_path(device)}", AutotuneCacheWarning, stacklevel=3)
                return None
        if self._other_candidates(entry, candidates):
            # tuned before the candidates changed, or on a shape of this key
            # where one of this call's candidates did not apply: tune again
            return None
        self._memory[(device, key)] = entry
        return entry

    @staticmethod
    def best_of(entry, only=None, candidates=None):
        """The fastest config in ``entry`` matching all items of ``only``
        and, where ``candidates`` (a list of configs) is given, among them."""
        best = None
        for config, seconds in entry["times"]:
            if only and any(config.get(k) != v for k, v in only.items()):
                continue
            if candidates is not None and config not in candidates:
                continue
            if seconds is not None and (best is None or seconds < best[1]):
                best = (config, seconds)
        return None if best is None else best[0]

    # -- tuning -------------------------------------------------------------

    def _call(self, args, kwargs, config):
        self.fn(*args, **kwargs, **config)

    def tune(self, args, kwargs, key=None, device=None, candidates=None):
        """Time every config (or every one of ``candidates``, a list of
        configs: those that apply to this call) on these arguments; store
        and return the entry, which holds the timings of those alone.

        Every config first runs ``warmup`` times (compiling it) and then
        for at least ``WARM_UP`` seconds (see there); then ``repeat`` rounds
        time each config once, in alternating order, so that a burst of
        load from elsewhere hits all configs alike instead of the one being
        timed in its block (blocks per config once stored a time 8x too
        long, and the wrong choice with it), and more
        rounds follow while they have taken under ``ROUND_BUDGET`` seconds
        (up to ``MAX_ROUNDS``). The median of a config's rounds counts;
        rounds stop early once they have taken 2 s and at least 3 (large
        shapes).
        """
        key = key or self.key_of(args, kwargs)
        device = device or self._device(args, kwargs)
        configs = self.configs if candidates is None else list(candidates)
        if not configs:
            raise ValueError(f"autotune: {self.name}: no candidate config to time")
        load = _LoadWatch()
        samples, errors = {}, []
        for i, config in enumerate(configs):
            try:
                for _ in range(self.warmup):
                    self._call(args, kwargs, config)
                samples[i] = []
            except Exception as e:  # a config that cannot run this shape loses
                errors.append(e)
        if samples:
            end = time.perf_counter() + WARM_UP
            while time.perf_counter() < end:
                for i in samples:
                    self._call(args, kwargs, configs[i])
                    if time.perf_counter() >= end:
                        break
        order = list(samples)
        spent = 0.0
        for r in range(max(self.repeat, MAX_ROUNDS)):
            if r >= self.repeat and spent > ROUND_BUDGET:
                break
            for i in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                self._call(args, kwargs, configs[i])
                samples[i].append(time.perf_counter() - t0)
                spent += samples[i][-1]
            if spent > 2.0 and r >= 2:
                break
        times = [[config, statistics.median(samples[i]) if i in samples else None]
                 for i, config in enumerate(configs)]
        if all(t is None for _, t in times):
            raise errors[0]
        entry = {"config": self.best_of({"times": times}), "times": times}
        self._chosen.clear()
        self._memory[(device, key)] = entry
        self._loaded.setdefault(device, {})[key] = entry
        others = load.others()
        if others is None or others <= LOAD_LIMIT:
            _save(cache_path(device), device, key, entry)
        else:
            _log.info("autotune: %s %s timed while other processes used %.0f%% of the CPUs; "
                      "kept for this process only", self.name, key, 100 * others)
        return entry

    def config_for(self, args, kwargs, only=None, gpu=None, applies=None):
        """The config a call uses: the default when tuning is off, else the
        best stored (tuning first if the key is new) among those matching
        ``only``.

        ``applies``, a function of a config returning whether it can run
        this call (an operator's applicability rules, see
        :func:`nbops.conv.plan_conv`), limits the candidates: only configs
        it accepts are timed or chosen. With tuning off the default is used
        where it applies (and matches ``only``), else the first config that
        does; ValueError where none does.
        """
        if not enabled():
            cfg = self.default
            if (only and any(cfg.get(k) != v for k, v in only.items())
                    or applies is not None and not applies(cfg)):
                cfg = next((c for c in self.configs
                            if all(c.get(k) == v for k, v in (only or {}).items())
                            and (applies is None or applies(c))), None)
                if cfg is None:
                    raise ValueError(f"autotune: {self.name}: no config matches {only} and "
                                     f"applies to this call")
            return cfg
        mask, candidates = self._candidates(applies)
        memo = None
        if gpu is not None and "dtype" in kwargs:
            # a caller that knows the device: a key tuple instead of a key
            # string, the device scan and the entry search (~15 us per call)
            try:
                memo = (gpu, kwargs["dtype"], tuple(kwargs[k] for k in self.key),
                        tuple(only.items()) if only else (), mask)
                cfg = self._chosen.get(memo)
            except (KeyError, TypeError):  # a key argument missing or unhashable
                memo = cfg = None
            if cfg is not None:
                return cfg
        key = self.key_of(args, kwargs)
        device = device_name(gpu=gpu) if gpu is not None else self._device(args, kwargs)
        if candidates is not None and not candidates:
            raise ValueError(f"autotune: {self.name}: no config applies to this call")
        entry = self.lookup(key, device, candidates) or \
            self.tune(args, kwargs, key, device, candidates)
        cfg = self.best_of(entry, only, candidates)
        if cfg is None and only:
            # the configs asked for failed (or went untimed) when this key was
            # tuned, perhaps for a passing reason: run the first of them, whose
            # own error then says why if it fails again
            cfg = next((c for c in (self.configs if candidates is None else candidates)
                        if all(c.get(k) == v for k, v in only.items())), None)
        if cfg is None:
            raise ValueError(f"autotune: {self.name}: no config matches {only}")
        if memo is not None:
            self._chosen[memo] = cfg
        return cfg

    def _candidates(self, applies):
        """``(mask, candidates)``: which configs ``applies`` accepts, as
        flags over :attr:`configs` and as a list (``((), None)`` without a
        rule); remembered per rule object, so that a caller passing one
        rule per shape pays its calls once (~0.5 us each)."""
        if applies is None:
            return (), None
        hit = self._masks.get(applies)
        if hit is None or hit[0] is not self.configs:
            if len(self._masks) >= 4096:
                self._masks.clear()
            mask = tuple(bool(applies(c)) for c in self.configs)
            hit = self._masks[applies] = (
                self.configs, mask, [c for c, ok in zip(self.configs, mask) if ok])
        return hit[1], hit[2]

    def run(self, args, kwargs, only=None, gpu=None, applies=None):
        """Call the function with the chosen config (see :meth:`config_for`);
        ``gpu`` (True/False), where the caller knows it, saves looking for
        device arrays among the arguments."""
        return self.fn(*args, **kwargs, **self.config_for(args, kwargs, only, gpu, applies))

    def __call__(self, *args, **kwargs):
        return self.run(args, kwargs)

    def clear(self):
        """Forget the tunings held in memory (the disk cache stays)."""
        self._memory.clear()
        self._loaded.clear()
        self._chosen.clear()
        self._masks.clear()


def autotune(configs, key, default=None, name=None, warmup=1, repeat=5, bucket=True):
    """Decorator making an :class:`Autotuner` of a function.

    Example::

        @autotune(configs=[{"MC": 96, "KC": 256}, {"MC": 64, "KC": 128}],
                  key=["m", "n", "k"])
        def gemm_kernel(a, b, out, m, n, k, MC, KC): ...
    """

    def deco(fn):
        return Autotuner(fn, configs, key, default=default, name=name, warmup=warmup,
                         repeat=repeat, bucket=bucket)

    return deco


# ---------------------------------------------------------------------------
# Pre-tuning: python -m nbops tune

_TUNINGS = {}


def register_tuning(name, run, describe):
    """Register a pre-tuning job for ``python -m nbops tune``:
    ``run(dtype, quick)`` tunes its shapes (for ``quick``, the small ones),
    ``describe()`` returns a one-line description. GEMM registers
    ``"gemm"``; conv and attention register theirs the same way."""
    _TUNINGS[name] = (run, describe)


def _known_tunings():
    from . import linalg  # noqa: F401  (registers the GEMM shapes)

    return _TUNINGS


def tune_main(argv=None):
    """``python -m nbops tune [--op NAME ...] [--dtype float32 ...] [--quick]
    [--list] [--clear]``: pre-tune common shapes and print where the cache
    is. Returns a process exit code."""
    tunings = _known_tunings()
    parser = argparse.ArgumentParser(prog="python -m nbops tune",
                                     description="Pre-tune nbops kernels for this machine.")
    parser.add_argument("--op", action="append", choices=sorted(tunings),
                        help="operator family to tune (default: all)")
    parser.add_argument("--dtype", action="append", choices=["float32", "float64"],
                        help="dtype to tune (default: float32)")
    parser.add_argument("--quick", action="store_true", help="only the small shapes")
    parser.add_argument("--list", action="store_true", help="list the tuning jobs and exit")
    parser.add_argument("--clear", action="store_true",
                        help="delete this machine's cache file first")
    ns = parser.parse_args(argv)
    if ns.list:
        for name, (_, describe) in sorted(tunings.items()):
            print(f"{name}: {describe()}")
        return 0
    path = cache_path()
    if ns.clear and os.path.exists(path):
        os.remove(path)
    if not enabled():
        print("NBOPS_AUTOTUNE=0 is set: nothing to tune", file=sys.stderr)
        return 1
    for name in ns.op or sorted(tunings):
        for dtype in ns.dtype or ["float32"]:
            t0 = time.perf_counter()
            tunings[name][0](dtype, ns.quick)
            print(f"tuned {name} {dtype} in {time.perf_counter() - t0:.1f} s")
    print(f"cache: {path}")
    return 0


class _CallableModule(types.ModuleType):
    """Lets ``nbops.autotune(...)`` be the decorator while ``nbops.autotune``
    stays this module (``nbops.autotune.tune_main``)."""

    def __call__(self, *args, **kwargs):
        return autotune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
