"""Time the tensor operators against NumPy and a parallel copy, in one run.

    python tools/bench_tensor.py                 # 8192 x 8192 float32
    python tools/bench_tensor.py -n 4096 --tile 32 --reps 9
    python tools/bench_tensor.py --cpu-time      # 1 thread, CPU seconds

Prints medians of interleaved repetitions, the bandwidth (bytes read plus
bytes written, once each) and ratios against the baselines measured in the
same run: NumPy's ``np.ascontiguousarray(a.T)`` (single-threaded) and a
parallel ``prange`` copy of the same bytes (nbops' own flat copy kernel), the
memory-speed bound for any data movement. ``--tile`` recompiles the CPU
transpose with another tile edge (in a private, temporary Numba cache).
"""

import argparse
import os
import sys
import tempfile
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=8192, help="matrix edge (default 8192)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--tile", type=int, default=None, help="override cpu.tensor.TILE")
    p.add_argument("--cpu-time", action="store_true",
                   help="one thread, timed in CPU seconds (time.process_time): robust "
                   "to other processes on a busy machine, blind to parallel speed-up")
    p.add_argument("--only", default="", help="time only cases containing this text "
                   "(the copy and NumPy a.T baselines always run)")
    args = p.parse_args(argv)
    if args.tile is not None:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbops-tile-")

    import numpy as np

    import nbops
    from nbops.bench.harness import warm_up
    from nbops.cpu import tensor as kernels

    if args.tile is not None:
        kernels.TILE = args.tile
    clock = time.perf_counter
    if args.cpu_time:
        nbops.set_num_threads(1)
        clock = time.process_time
    n = args.n
    a = np.random.default_rng(0).standard_normal((n, n)).astype(args.dtype)
    out = np.empty_like(a)
    half = np.ascontiguousarray(a[:, : n // 2]), np.ascontiguousarray(a[:, n // 2:])
    wide = np.empty((n, 2 * n), a.dtype)
    wide[:] = 1
    strided = wide[:, ::2]
    flat_in, flat_out = a.reshape(-1), out.reshape(-1)

    cases = {
        "copy (prange)": lambda: kernels._flat(flat_out, flat_in),
        "numpy ascontiguousarray(a.T)": lambda: np.ascontiguousarray(a.T),
        "numpy copyto(out, a.T)": lambda: np.copyto(out, a.T),
        "nbops.transpose(a)": lambda: nbops.transpose(a),
        "nbops.transpose(a, out=)": lambda: nbops.transpose(a, out=out),
        "numpy concatenate axis=1 (out=)": lambda: np.concatenate(half, axis=1, out=out),
        "nbops.cat axis=1 (out=)": lambda: nbops.cat(half, axis=1, out=out),
        "nbops.cat axis=0 (out=)": lambda: nbops.cat([a[: n // 2], a[n // 2:]], out=out),
        "numpy ascontiguousarray(a[:, ::2])": lambda: np.ascontiguousarray(strided),
        "nbops.contiguous(a[:, ::2])": lambda: nbops.contiguous(strided),
    }
    keep = ("copy (prange)", "numpy ascontiguousarray(a.T)")
    cases = {k: f for k, f in cases.items() if args.only in k or k in keep}
    for f in cases.values():  # compile and fault in every page before timing
        f()
    assert np.array_equal(nbops.transpose(a), a.T)
    times = {k: [] for k in cases}
    for _ in range(args.reps):  # interleaved, so drifting load hits all alike
        for k, f in cases.items():
            time.sleep(0.05)
            warm_up(f)  # work straight after a sleep ran slower on the development VM
            t = clock()
            f()
            times[k].append(clock() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    nbytes = 2 * a.nbytes
    print(f"n={n} {args.dtype} threads={nbops.get_num_threads()} TILE={kernels.TILE} "
          f"reps={args.reps}  (medians of {'CPU' if args.cpu_time else 'wall'} time; "
          "GB/s = bytes read + written)")
    for k, t in med.items():
        print(f"  {k:38s} {t * 1e3:8.2f} ms  {nbytes / t / 1e9:6.2f} GB/s  "
              f"vs numpy a.T {med['numpy ascontiguousarray(a.T)'] / t:5.2f}x  "
              f"vs copy {med['copy (prange)'] / t:5.2f}")
    return med


if __name__ == "__main__":
    sys.exit(main() and 0)
