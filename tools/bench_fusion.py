"""Standalone timing of nbops.fuse against NumPy and a parallel read kernel.

    python tools/bench_fusion.py [--n 16777216] [--threads 2] [--repeat 15]
    python tools/bench_fusion.py --startup      first-call latency, cold and after warm-up

Prints medians (ms) of interleaved repetitions, measured in one run:

* ``read3``: a parallel kernel that reads three float32 arrays once and sums
  them (the memory-bandwidth ceiling of a fused three-input reduction);
* ``copy``: a parallel copy kernel (GB/s counts read + write);
* ``(x + y) * z`` then sum: NumPy's three passes vs ``fuse(..., reduce="sum")``;
* a five-op chain ``maximum(x * y + 1, 0) * 0.5 - x``: NumPy vs ``fuse``;
* the same two fused kernels writing into ``out=`` / with gelu and exp.

Ratios are what to read: absolute times move 10-20% between runs here.

``--startup`` runs fresh interpreters against an empty Numba cache
(``NUMBA_CACHE_DIR`` in a temporary directory): ``import numba``, ``import
nbops`` and the first ``nbops.relu`` on float32, cold, then again after
``python -m nbops warmup --ops relu --dtypes float32`` filled the cache.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np


def _median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


_STARTUP = """
import sys, time
t0 = time.perf_counter(); import numba; t1 = time.perf_counter()
import numpy as np, nbops; t2 = time.perf_counter()
x = np.ones(1000, np.float32)
t3 = time.perf_counter(); nbops.relu(x); t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t4 - t3, int("numba.cuda" in sys.modules))
"""


def startup(repeat):
    """Print first-call latencies in fresh processes, cold and after warm-up."""
    import subprocess
    import tempfile

    def measure(env):
        out = subprocess.run([sys.executable, "-c", _STARTUP], env=env, check=True,
                             capture_output=True, text=True).stdout.split()
        return [float(v) for v in out]

    rows = {"cold": [], "after warmup": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            rows["cold"].append(measure(env))
            subprocess.run([sys.executable, "-m", "nbops", "warmup", "--ops", "relu",
                            "--dtypes", "float32", "--quiet"], env=env, check=True,
                           capture_output=True)
            rows["after warmup"].append(measure(env))
    print(f"fresh processes, median of {repeat} (ms): import numba | import nbops | "
          "first nbops.relu(float32[1000]) | numba.cuda imported?")
    for k, v in rows.items():
        med = [statistics.median(c) for c in zip(*v)]
        print(f"  {k:13s} {med[0] * 1e3:8.1f} | {med[1] * 1e3:8.1f} | {med[2] * 1e3:8.1f} | "
              f"{'yes' if med[3] else 'no'}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--startup", action="store_true",
                    help="first-call latency in fresh processes instead")
    args = ap.parse_args(argv)
    if args.startup:
        startup(max(3, args.repeat // 5))
        return 0

    import numba

    import nbops as nb
    from nbops.bench.harness import parallel_copy

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from benchmarks.bench_fusion import _read3

    nb.set_num_threads(args.threads)

    read3, copy = _read3(), parallel_copy

    n = args.n
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    out = np.empty_like(x)
    fused_sum = nb.fuse(lambda x, y, z: (x + y) * z, reduce="sum")
    chain = nb.fuse(lambda x, y: np.maximum(x * y + 1.0, 0.0) * 0.5 - x)
    act = nb.fuse(lambda x, y: nb.gelu(x) * np.exp(-y * y))

    cases = {
        "read3 (parallel read of 3 inputs)": lambda: read3(x, y, z),
        "copy (parallel)": lambda: copy(x, out),
        "numpy ((x+y)*z).sum()": lambda: ((x + y) * z).sum(),
        "fused (x+y)*z sum": lambda: fused_sum(x, y, z),
        "numpy 5-op chain": lambda: np.maximum(x * y + 1.0, 0.0) * 0.5 - x,
        "fused 5-op chain": lambda: chain(x, y),
        "fused 5-op chain out=": lambda: chain(x, y, out=out),
        "fused gelu(x)*exp(-y*y) out=": lambda: act(x, y, out=out),
    }
    for fn in cases.values():  # compile / load caches, fault in pages
        fn()
        fn()
    results = {k: [] for k in cases}
    for _ in range(args.repeat):  # interleaved, so drift hits every case alike
        for k, fn in cases.items():
            results[k].append(_median_ms(fn, 1))
    med = {k: statistics.median(v) for k, v in results.items()}
    nbytes = x.nbytes
    print(f"n={n} float32, threads={numba.get_num_threads()}, median of {args.repeat} "
          "(ms, GB/s of the bytes each case must move)")
    moved = {"read3 (parallel read of 3 inputs)": 3, "copy (parallel)": 2,
             "fused (x+y)*z sum": 3, "fused 5-op chain": 3, "fused 5-op chain out=": 3,
             "fused gelu(x)*exp(-y*y) out=": 3}
    for k, v in med.items():
        gbs = f"{moved[k] * nbytes / v / 1e6:7.1f} GB/s" if k in moved else ""
        print(f"  {k:36s} {v:8.2f} ms {gbs}")
    print("ratios:")
    fused_sum = med["fused (x+y)*z sum"]
    print(f"  fused sum vs numpy three passes: {med['numpy ((x+y)*z).sum()'] / fused_sum:.2f}x"
          " (target >= 3)")
    print(f"  fused sum vs parallel read of 3: "
          f"{med['read3 (parallel read of 3 inputs)'] / fused_sum:.2f} of the read kernel's "
          "bandwidth (target >= 0.70)")
    print(f"  fused 5-op chain vs numpy: "
          f"{med['numpy 5-op chain'] / med['fused 5-op chain']:.2f}x (target >= 4)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
