"""Where should an elementwise activation leave the thread pool alone?

Times the serial and the parallel flat kernel of a cheap (relu) and an
expensive (gelu) activation over sizes from 1K to 1M elements and prints the
median of each; ``nbops/_tunables.py:SERIAL_BELOW`` is set from where
the parallel kernel starts to win. Run on an idle machine:

    python tools/serial_threshold.py [--dtype float32]
"""

import argparse
import inspect
import time

import numpy as np

import nbops  # noqa: F401  (registers and compiles nothing)
from nbops import _formulas
from nbops.cpu import activations as A


def median_time(fn, reps=200):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dt = np.dtype(args.dtype)
    p, c = _formulas.params(dt, 1.0), _formulas.consts(dt)
    print(f"{'op':6} {'n':>8} {'serial us':>10} {'parallel us':>12}  faster")
    for op in ("relu", "gelu"):
        kernels = inspect.getclosurevars(getattr(A, op)).nonlocals
        serial, parallel = kernels["serial"], kernels["parallel"]
        for n in (1024, 4096, 16384, 32768, 65536, 262144, 1048576):
            x = np.random.default_rng(0).standard_normal(n).astype(dt)
            o = np.empty_like(x)
            ts = median_time(lambda: serial(x, o, p, c))
            tp = median_time(lambda: parallel(x, o, p, c))
            print(f"{op:6} {n:8d} {ts * 1e6:10.1f} {tp * 1e6:12.1f}  "
                  f"{'serial' if ts < tp else 'parallel'}")


if __name__ == "__main__":
    main()
