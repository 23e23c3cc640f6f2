"""Bandwidth of the vectorized transcendentals of ``nbops/cpu/_approx.py``.

Usage::

    python tools/bench_approx.py [--threads 2] [--repeats 21] [--f32 16M] [--f64 8M]
                                 [--functions exp,erf] [--libm] [--baseline OLD.py]

For each function and dtype, times ``out[i] = f(x[i])`` in a ``prange``
kernel beside a plain parallel copy kernel, in the same run: each round runs
the copy right before every function, so that the fraction of the copy's
bandwidth is the median of paired ratios, robust to a background process
and to the machine's state drifting between rounds. Inputs are
``randn * 3`` (``|randn| * 3`` for log1p), outputs are preallocated. Prints
medians, GB/s counting the bytes read and written once, and that fraction.
``--libm`` adds the same kernels calling :mod:`math` (scalar libm calls) for
comparison. ``--baseline`` loads another version of ``_approx.py`` (a copy
of the file before a change) and times its kernels too, each right after
the current one, adding the median of the paired time ratios baseline/current
(above 1: the current version is faster). Figures move 10-20% between runs
on a shared machine: compare the fractions, and rerun if the copy figure
itself looks off.
"""

import argparse
import importlib.util
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba  # noqa: E402
from numba import njit, prange  # noqa: E402

from nbops.cpu import _approx  # noqa: E402

FUNCTIONS = ["exp", "expm1", "log1p", "erf", "erfc", "tanh", "ndtr", "log1pexp"]
FASTMATH = {"contract", "nsz", "arcp", "afn"}


def _kernel(f):
    @njit(parallel=True, fastmath=FASTMATH)
    def kernel(x, out):
        for i in prange(x.size):
            out[i] = f(x[i])
    return kernel


@njit(parallel=True)
def copy(x, out):
    for i in prange(x.size):
        out[i] = x[i]


def _size(s):
    s = s.upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
    return int(s.rstrip("KM")) * mult


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--f32", default="16M", help="float32 elements (default 16M)")
    ap.add_argument("--f64", default="8M", help="float64 elements (default 8M)")
    ap.add_argument("--functions", default=",".join(FUNCTIONS))
    ap.add_argument("--libm", action="store_true", help="also time math.* (libm) kernels")
    ap.add_argument("--baseline", metavar="OLD.py",
                    help="another version of _approx.py to time beside this one")
    args = ap.parse_args(argv)
    baseline = _load(args.baseline) if args.baseline else None
    numba.set_num_threads(args.threads)
    names = args.functions.split(",")
    rng = np.random.default_rng(0)
    print(f"threads={args.threads} repeats={args.repeats} numba {numba.__version__}")
    for dtype, n in ((np.float32, _size(args.f32)), (np.float64, _size(args.f64))):
        x = (rng.standard_normal(n) * 3).astype(dtype)
        xpos = np.abs(x)
        out = np.empty_like(x)
        kernels = {"copy": (copy, x)}
        for name in names:
            kernels[name] = (_kernel(getattr(_approx, name)), xpos if name == "log1p" else x)
            if baseline is not None:
                kernels["base." + name] = (_kernel(getattr(baseline, name)),
                                           xpos if name == "log1p" else x)
            if args.libm:
                kernels["math." + name] = (_kernel(getattr(math, name)),
                                           xpos if name == "log1p" else x)
        t0 = time.perf_counter()
        for k, a in kernels.values():
            k(a, out)                                  # compile and warm up
        compile_s = time.perf_counter() - t0
        times = {name: [] for name in kernels}
        ratios = {name: [] for name in kernels}
        vs_base = {name: [] for name in kernels if "base." + name in kernels}

        def timed(k, a):
            t = time.perf_counter()
            k(a, out)
            return time.perf_counter() - t

        order = [name for name in kernels if name != "copy"]
        swapped = order[:]
        for i, name in enumerate(order):
            if name.startswith("base."):
                j = order.index(name[5:])
                swapped[i], swapped[j] = order[j], name
        for rep in range(args.repeats):
            # every other round the baseline runs first: no bias from position
            for name in (swapped if rep % 2 else order):
                k, a = kernels[name]
                tc = timed(copy, x)
                tf = timed(k, a)
                times["copy"].append(tc)
                times[name].append(tf)
                ratios[name].append(tc / tf)
            for name in vs_base:
                vs_base[name].append(times["base." + name][-1] / times[name][-1])
        nbytes = 2 * x.nbytes
        print(f"\n{np.dtype(dtype).name}, {n} elements ({nbytes / 2**20:.0f} MiB moved), "
              f"compile+warm-up {compile_s:.1f} s")
        print(f"{'kernel':12s} {'median ms':>10s} {'GB/s':>7s} {'of copy':>8s}"
              + (f" {'base/this':>9s}" if baseline is not None else ""))
        for name, ts in times.items():
            m = float(np.median(ts))
            frac = float(np.median(ratios[name])) if ratios[name] else 1.0
            vs = f" {float(np.median(vs_base[name])):9.3f}" if vs_base.get(name) else ""
            print(f"{name:12s} {m * 1e3:10.2f} {nbytes / m / 1e9:7.1f} {frac:8.0%}{vs}")


def _load(path):
    """Import a file as a module of its own (its overloads are its own)."""
    spec = importlib.util.spec_from_file_location("approx_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


if __name__ == "__main__":
    main()
