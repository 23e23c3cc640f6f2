"""Time nbops.sparse against scipy.sparse in one run and print ratios and GB/s.

    python tools/bench_sparse.py [--rows 1000000] [--nnz-per-row 16] [--width 64]
                                 [--repeat 7] [--threads 2] [--only spmv,spmm,sddmm]

Matrices: ``uniform`` (every row ``nnz-per-row`` random columns) and
``powerlaw`` (Zipf row lengths, a=2, capped at 5% of the columns, rescaled
to the same nnz, rows shuffled; columns uniform so that both touch x alike).
float32 values, int32 indices. scipy runs single-threaded (it has no
threads); nbops on ``--threads``. Each figure is the median of ``--repeat``
runs, nbops and scipy interleaved; a parallel copy of 64M float32 measured
in the same run gives the machine's bandwidth.

Useful traffic (each byte counted once): SpMV reads values, column
indices, indptr and x, and writes y; SpMM reads A, B and writes C; SDDMM
reads the pattern, X and Y and writes the values.
"""

import argparse
import os
import sys
import time

import numpy as np
import scipy.sparse as sp
from numba import prange

import nbops
from nbops import sparse
from nbops._jit import cpu_kernel
from nbops.bench.harness import warm_up

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.bench_sparse import powerlaw, uniform  # noqa: E402  (one definition)


@cpu_kernel(parallel=True)
def _copy(src, dst):
    for i in prange(src.size):
        dst[i] = src[i]


def median_times(fns, repeat):
    """Median seconds of each function, run interleaved with pauses (thread
    pools of one runtime must not steal the next one's cores), each followed
    by untimed calls (``nbops.bench.harness.warm_up``: work straight after a
    sleep ran slower on the development VM)."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for t, f in zip(times, fns):
            time.sleep(0.05)
            warm_up(f)
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--nnz-per-row", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="spmv,spmm,sddmm")
    args = p.parse_args()
    nbops.set_num_threads(args.threads)
    only = set(args.only.split(","))
    m = n = args.rows
    nnz = m * args.nnz_per_row
    rng = np.random.default_rng(0)

    src = np.ones(64 << 20, np.float32)
    dst = np.empty_like(src)
    _copy(src, dst)
    (t_copy,) = median_times([lambda: _copy(src, dst)], args.repeat)
    copy_gbs = 2 * src.nbytes / t_copy / 1e9
    del src, dst
    print(f"parallel copy 64M float32, {args.threads} threads: {copy_gbs:.1f} GB/s")
    print(f"{m} x {n}, nnz {nnz}, float32 values, int32 indices; median of {args.repeat}")

    mats = {"uniform": uniform(m, n, args.nnz_per_row, rng),
            "powerlaw": powerlaw(m, n, nnz, rng)}
    x = rng.standard_normal(n, np.float32)
    per_nnz = {}
    for name, S in mats.items():
        A = sparse.from_scipy(S, check=False)
        lens = np.diff(S.indptr)
        print(f"\n[{name}] max row {lens.max()}, rows above 1000: {(lens > 1000).sum()}, "
              f"empty rows: {(lens == 0).sum()}")
        a_bytes = S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
        if "spmv" in only:
            y = np.empty(m, np.float32)
            sparse.mv(A, x, out=y)
            np.testing.assert_allclose(y, S @ x, rtol=1e-3, atol=1e-3)
            t_nb, t_sp = median_times([lambda: sparse.mv(A, x, out=y), lambda: S @ x],
                                      args.repeat)
            gbs = (a_bytes + x.nbytes + y.nbytes) / t_nb / 1e9
            per_nnz[name] = t_nb / S.nnz
            print(f"SpMV   nbops {t_nb * 1e3:8.2f} ms  scipy {t_sp * 1e3:8.2f} ms  "
                  f"x{t_sp / t_nb:5.2f}  {gbs:5.1f} GB/s ({gbs / copy_gbs:.0%} of copy)")
        if "spmm" in only:
            B = rng.standard_normal((n, args.width), np.float32)
            C = sparse.mm(A, B)   # nbops' allocation (cache-line aligned), reused as out=
            rows = rng.integers(0, m, 200)
            np.testing.assert_allclose(C[rows], (S[rows] @ B), rtol=1e-3, atol=1e-3)
            t_nb, t_sp = median_times([lambda: sparse.mm(A, B, out=C), lambda: S @ B],
                                      max(3, args.repeat // 2))
            gbs = (a_bytes + B.nbytes + C.nbytes) / t_nb / 1e9
            gf = 2 * S.nnz * args.width / t_nb / 1e9
            print(f"SpMM   nbops {t_nb * 1e3:8.2f} ms  scipy {t_sp * 1e3:8.2f} ms  "
                  f"x{t_sp / t_nb:5.2f}  {gbs:5.1f} GB/s  {gf:5.1f} GFLOP/s (n={args.width})")
            del B, C
        if "sddmm" in only:
            X = rng.standard_normal((m, args.width), np.float32)
            Y = rng.standard_normal((n, args.width), np.float32)
            out = np.empty(S.nnz, np.float32)
            sparse.sddmm_values(A.indices, A.indptr, A.shape, X, Y, out=out)
            (t_nb,) = median_times(
                [lambda: sparse.sddmm_values(A.indices, A.indptr, A.shape, X, Y, out=out)],
                max(3, args.repeat // 2))
            gbs = (S.indices.nbytes + S.indptr.nbytes + X.nbytes + Y.nbytes + out.nbytes) \
                / t_nb / 1e9
            gf = 2 * S.nnz * args.width / t_nb / 1e9
            print(f"SDDMM  nbops {t_nb * 1e3:8.2f} ms  {gf:5.1f} GFLOP/s  {gbs:5.1f} GB/s "
                  f"(d={args.width})")
            del X, Y, out
    if len(per_nnz) == 2:
        print(f"\nSpMV time per nnz, powerlaw / uniform: "
              f"{per_nnz['powerlaw'] / per_nnz['uniform']:.2f}")


if __name__ == "__main__":
    main()
