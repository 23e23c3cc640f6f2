"""Standalone GEMM timing: nbops' kernel and its BLAS route beside NumPy.

    python tools/bench_gemm.py                 # all groups, float32, all threads
    python tools/bench_gemm.py --group square --threads 1 2
    python tools/bench_gemm.py --group small small-shapes --dtype float32 float64
    python tools/bench_gemm.py --asm           # instruction mix of the micro-kernel and small tiles
    python tools/bench_gemm.py --compile-time  # cold compile, in a fresh cache
    python tools/bench_gemm.py --cuda          # the CUDA kernel, beside CuPy (cuBLAS) if installed

Prints GFLOP/s (2 m n k per product) and the ratio to NumPy measured in the
same run (for the square stacks of ``--group small`` also a "floor": an
elementwise ``a + b -> c`` over the same stack, which moves the bytes the
product must move; its figure is the rate no product of that stack can
beat on this machine, its ratio the most any kernel can gain over NumPy):
the libraries are interleaved round by round, with a short pause
before each timed block (thread pools that spin would otherwise steal the
cores); GFLOP/s are medians of the rounds, ratios the medians of the
rounds' ratios. On a machine shared with other jobs,
``OMP_WAIT_POLICY=passive`` keeps idle OpenMP workers from
spinning against the measured threads (it doubled nbops' wall-clock
figures for the small stacks at a load of 3 on 2 cores). Tuning is off
(``NBOPS_AUTOTUNE=0``) unless ``--tuned``: "nbops" is the default config.
"""

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


CLOCK = time.perf_counter


def _median_time(fn, rounds, pause):
    from nbops.bench.harness import warm_up  # after the pause: see WARM_UP there

    times = []
    for _ in range(rounds):
        time.sleep(pause)
        warm_up(fn)
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def _cases(group, dtype, rng):
    """(label, flops, {name: callable}) per case; the first callable is the baseline."""
    import nbops

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    if group == "square":
        for n in (512, 1024, 2048):
            a, b, c = r(n, n), r(n, n), np.empty((n, n), dtype)
            yield f"square {n}", 2 * n ** 3, {
                "numpy": lambda a=a, b=b, c=c: np.matmul(a, b, out=c),
                "nbops": lambda a=a, b=b, c=c: nbops.matmul(a, b, out=c, impl="nbops"),
                "nbops-blas": lambda a=a, b=b, c=c: nbops.matmul(a, b, out=c, impl="blas")}
    elif group == "linear":
        for batch in (64, 256):
            for out_f in (4096, 1024):
                x, w = r(batch, 4096), r(out_f, 4096)
                c = np.empty((batch, out_f), dtype)
                yield f"linear {batch}x4096 @ {out_f}x4096.T", 2 * batch * 4096 * out_f, {
                    "numpy": lambda x=x, w=w, c=c: np.matmul(x, w.T, out=c),
                    "nbops": lambda x=x, w=w, c=c: nbops.linear(x, w, out=c, impl="nbops"),
                    "nbops-blas": lambda x=x, w=w, c=c: nbops.linear(x, w, out=c, impl="blas")}
    elif group in ("small", "small-shapes"):
        # the small-product route (default config) beside the packed
        # kernel on the same stack (SMALL=0)
        shapes = [(4096, 32, 32, 32), (512, 64, 64, 64)] if group == "small" else [
            (64, 128, 128, 128), (8, 256, 256, 256), (4096, 4, 32, 32), (4096, 32, 8, 32),
            (1024, 33, 65, 31), (4, 64, 64, 64)]
        for batch, m, n, k in shapes:
            a, b, c = r(batch, m, k), r(batch, k, n), np.empty((batch, m, n), dtype)
            fns = {"numpy": lambda a=a, b=b, c=c: np.matmul(a, b, out=c),
                   "nbops": lambda a=a, b=b, c=c: nbops.matmul(a, b, out=c, impl="nbops"),
                   "nbops-packed": _packed(a, b, c)}
            if m == n == k:
                # the same bytes through memory and no arithmetic to speak
                # of: the rate a product of this stack could at most reach
                # here, and so the most any kernel can gain over NumPy
                fns["floor(a+b->c)"] = lambda a=a, b=b, c=c: nbops.add(a, b, out=c)
            yield f"batched {batch} x {m}x{n}x{k}", 2 * batch * m * n * k, fns
    elif group == "gelu":
        # the linear shapes, and small k (512 rows: the streamed-
        # weight route; the others: the packed one), where the activation's
        # pass is a larger share of the work. One row per way of writing the
        # unfused pair, its first entry the baseline: "out=" (the gelu into
        # a second preallocated array: nbops.gelu's own semantics, a new
        # result), "in place" (out= the product: the least traffic two
        # passes can have), "allocating" (both calls without out=, as
        # nbops.gelu(nbops.matmul(x, w.T)) is usually written; the fused
        # call allocates its one result too) and "+ bias" (a linear layer's
        # bias added in place in between, as matmul has none)
        for batch, out_f, k in ((64, 4096, 4096), (256, 4096, 4096), (512, 4096, 256),
                                (8192, 1024, 128), (4096, 4096, 64)):
            x, w = r(batch, k), (r(out_f, k) / np.sqrt(k)).astype(dtype)
            bias = r(out_f)
            c, d = np.empty((batch, out_f), dtype), np.empty((batch, out_f), dtype)
            label = f"linear+gelu {batch}x{out_f}x{k}"
            flops = 2 * batch * out_f * k

            def fused(out=None, b=None, impl="nbops", x=x, w=w):
                return nbops.linear(x, w, b, activation="gelu", out=out, impl=impl)

            def unfused(out=None, mm_out=None, x=x, w=w):
                return nbops.gelu(nbops.matmul(x, w.T, out=mm_out, impl="nbops"), out=out)

            def unfused_bias(c=c, x=x, w=w, bias=bias):
                y = nbops.matmul(x, w.T, out=c, impl="nbops")
                nbops.add(y, bias, out=y)
                return nbops.gelu(y, out=y)

            yield f"{label} out=", flops, {
                "matmul+gelu": lambda c=c, d=d, f=unfused: f(out=d, mm_out=c),
                "fused": lambda d=d, f=fused: f(out=d),
                "fused-blas": lambda d=d, f=fused: f(out=d, impl="blas")}
            yield f"{label} in place", flops, {
                "matmul+gelu": lambda c=c, f=unfused: f(out=c, mm_out=c),
                "fused": lambda c=c, f=fused: f(out=c)}
            yield f"{label} allocating", flops, {
                "matmul+gelu": lambda f=unfused: f(),
                "fused": lambda f=fused: f()}
            yield f"{label} + bias", flops, {
                "matmul+bias+gelu": unfused_bias,
                "fused": lambda c=c, f=fused, bias=bias: f(out=c, b=bias)}


def _packed(a, b, c):
    """nbops' packed kernel on ``c = a @ b`` with the small-product route off."""
    from nbops import _formulas, linalg
    from nbops.cpu import linalg as cpu

    batch = c.shape[:-2]
    abuf, offa, sam, sak = linalg._operand("matmul", "a", a, batch)
    bbuf, offb, sbk, sbn = linalg._operand("matmul", "b", b, batch)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    args = (abuf, offa, sam, sak, bbuf, offb, sbk, sbn, c.reshape(-1, m, n), m, n, k,
            np.empty(0, c.dtype), 0, _formulas.params(c.dtype), _formulas.consts(c.dtype))
    plan = linalg.plan_gemm(args[8].shape[0], m, n, k, sak, sbk, sbn,
                            dict(linalg.DEFAULT_CONFIG, SMALL=0, STREAM=0))
    return lambda: cpu.gemm(*args, plan)


def run(groups, dtypes, threads, rounds, pause):
    import nbops

    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for group in groups:
            for label, flops, fns in _cases(group, dtype, rng):
                for f in fns.values():  # compile / load from the cache, warm up
                    f()
                for nt in threads:
                    nbops.set_num_threads(nt)
                    times = {k: [] for k in fns}
                    for _ in range(rounds):  # interleaved rounds
                        for k, f in fns.items():
                            times[k].append(_median_time(f, 1, pause))
                    # the ratio is the median of the rounds' ratios: a round's
                    # calls ran seconds apart, so the machine's drift cancels
                    base = next(iter(times.values()))
                    parts = []
                    for k, ts in times.items():
                        ratio = statistics.median(b / t for b, t in zip(base, ts))
                        gf = flops / statistics.median(ts) / 1e9
                        parts.append(f"{k} {gf:6.1f} GF/s ({ratio:4.2f}x)")
                    print(f"{dtype:7s} {nt}T {label:34s} " + "  ".join(parts), flush=True)


def asm_report(dtype):
    """Instruction mix of the micro-kernel's inner loop."""
    import numba
    from numba import types

    from nbops.cpu import linalg

    from nbops import _jit

    # a fresh, uncached dispatcher: Numba cannot show assembly loaded from its cache
    micro = numba.njit(nogil=True, fastmath=set(_jit.FASTMATH))(
        linalg.micro(*linalg.TILES[np.dtype(dtype)]).py_func)
    _jit._compile_with_settings(micro, slp=True)
    nt = numba.from_dtype(np.dtype(dtype))
    a2, a1, ip = types.Array(nt, 2, "C"), types.Array(nt, 1, "C"), types.intp
    micro.compile((ip, a2, a1, ip, ip, a1, ip, ip, types.boolean))
    asm = micro.inspect_asm(micro.signatures[0])
    fma = collections.Counter(re.findall(r"\b(vfmadd\w+)\s", asm))
    widths = collections.Counter(re.findall(r"vfmadd\w+\s[^\n]*%([xyz]mm)\d+\s*$", asm, re.M))
    bcast = len(re.findall(r"vfmadd[^\n]*1to", asm))
    spills = len(re.findall(r"rsp", asm))
    print(f"{dtype} micro-kernel {linalg.TILES[np.dtype(dtype)]}: FMA instructions {dict(fma)}, "
          f"accumulator widths {dict(widths)}, embedded broadcasts {bcast}, "
          f"stack references {spills}")
    # the small-product route's tiles: the k loop is the block with most FMAs
    mr, nr, nn = linalg.SMALL_TILES[np.dtype(dtype)]
    a1, ip = types.Array(nt, 1, "C"), types.intp
    for width in (nr, nn):
        tile = numba.njit(nogil=True, fastmath=set(_jit.FASTMATH), error_model="numpy")(
            linalg.tile(mr, width).py_func)
        tile.compile((a1, ip, ip, ip, ip, a1, ip, ip, ip, a1, ip, ip, types.boolean))
        loop = max(re.split(r"\n\.LBB", tile.inspect_asm(tile.signatures[0])),
                   key=lambda block: block.count("vfmadd"))
        fma = collections.Counter(re.findall(r"\b(vfmadd\w+)\s", loop))
        widths = collections.Counter(re.findall(r"vfmadd\w+\s[^\n]*%([xyz]mm)\d+\s*$", loop,
                                                re.M))
        print(f"{dtype} small tile {mr}x{width}, k loop: FMA instructions {dict(fma)}, widths "
              f"{dict(widths)}, stack references {loop.count('rsp')}")


def compile_time(dtype):
    """CPU seconds to compile the GEMM drivers from a cold cache (fresh
    process; CPU time, so that a busy machine does not inflate it). Two
    threads, so that the small stack takes the small-product route; the
    shared epilogue kernel compiles with the first driver."""
    code = ("import time, numpy as np, nbops\n"
            "nbops.set_num_threads(2)\n"
            "c = time.process_time\n"
            "t = c()\n"
            f"a = np.ones((8, 8), '{dtype}'); nbops.matmul(a, a, impl='nbops')\n"
            "t1 = c()\n"
            f"nbops.matmul(np.ones((64, 8, 8), '{dtype}'), a, impl='nbops')\n"
            "t2 = c()\n"
            f"nbops.matmul(np.ones((64, 8, 8), '{dtype}'), np.ones((64, 8, 300), '{dtype}'),"
            " impl='nbops')\n"
            "print(f'{t1 - t:.1f} {t2 - t1:.1f} {c() - t2:.1f}')\n")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, NBOPS_AUTOTUNE="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
    print(f"{dtype} cold compile, CPU seconds: micro-kernel + tiles driver + epilogue {out[0]}, "
          f"small-product driver {out[1]}, batched driver {out[2]}")


def cuda_run(dtypes, sizes, rounds):
    """GFLOP/s of nbops' CUDA GEMM on square device arrays (plus a batched
    stack and a linear layer with a fused gelu), beside CuPy's ``matmul``
    (cuBLAS) where CuPy is installed (``pip install cupy-cuda12x``):
    the issue's goal is at least half of cuBLAS. Each call is timed
    between two device synchronizations, median of ``rounds``. In Numba's
    simulator (``NUMBA_ENABLE_CUDASIM=1``) it runs as a smoke test at
    small ``sizes`` only."""
    from numba import cuda

    import nbops

    if not cuda.is_available():
        print("cuda: no CUDA device (set NUMBA_ENABLE_CUDASIM=1 to smoke-test in the simulator)")
        return
    try:
        import cupy
    except ImportError:
        cupy = None
        print("cuda: CuPy not installed, nbops alone")
    rng = np.random.default_rng(0)

    def timed(fn):
        fn()
        cuda.synchronize()
        times = []
        for _ in range(rounds):
            cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    for dtype in dtypes:
        for n in sizes:
            cases = [(f"square {n}", (n, n), (n, n), None),
                     (f"batched 64 x {n // 8}^2", (64, n // 8, n // 8), (64, n // 8, n // 8), None),
                     (f"linear {n}x{n} gelu", (n, n), (n, n), "gelu")]
            for label, sa, sb, act in cases:
                a = rng.standard_normal(sa).astype(dtype)
                b = rng.standard_normal(sb).astype(dtype)
                c = np.empty(sa[:-1] + sb[-1:], dtype)
                # outputs preallocated on both sides: allocation is not the
                # kernel (Numba's allocator has no pool, CuPy's has)
                da, db, dc = (nbops.to_device(v) for v in (a, b, c))
                flops = 2 * np.prod(sa) * sb[-1]
                if act is None:
                    fns = {"nbops": lambda da=da, db=db, dc=dc: nbops.matmul(da, db, out=dc)}
                else:  # x @ w.T: b is the weight, (out_features, in_features)
                    fns = {"nbops": lambda da=da, db=db, dc=dc: nbops.linear(
                        da, db, activation=act, out=dc)}
                if cupy is not None and act is None:
                    ca, cb, cc = (cupy.asarray(v) for v in (a, b, c))
                    fns["cupy (cuBLAS)"] = lambda ca=ca, cb=cb, cc=cc: cupy.matmul(ca, cb, out=cc)
                times = {k: timed(f) for k, f in fns.items()}
                base = next(iter(times.values()))
                parts = [f"{k} {flops / t / 1e9:8.1f} GF/s ({base / t:4.2f}x)"
                         for k, t in times.items()]
                print(f"{dtype:7s} cuda {label:24s} " + "  ".join(parts), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--group", nargs="+",
                   choices=["square", "linear", "small", "small-shapes", "gelu"],
                   default=["square", "linear", "small", "gelu"])
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    p.add_argument("--threads", nargs="+", type=int, help="Numba thread counts (default: all)")
    p.add_argument("--rounds", type=int, default=7)
    # NumPy's OpenBLAS threads spin after a call: 50 ms later nbops' next
    # parallel region still ran up to 10x slower beside them (linear 64 x
    # 4096 by 1024 x 4096: 22 GFLOP/s against 437 after a 0.3 s pause)
    p.add_argument("--pause", type=float, default=0.3)
    p.add_argument("--tuned", action="store_true", help="let the autotuner run")
    p.add_argument("--cpu-clock", action="store_true",
                   help="time in CPU seconds of this process (GFLOP per CPU-second): "
                        "comparable on a busy machine for single-threaded runs, e.g. "
                        "OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1")
    p.add_argument("--asm", action="store_true", help="print the micro-kernel's instructions")
    p.add_argument("--compile-time", action="store_true", help="time a cold compile")
    p.add_argument("--cuda", nargs="*", type=int, metavar="N",
                   help="time the CUDA kernel on square sizes N (default 1024 2048 4096)")
    ns = p.parse_args(argv)
    if not ns.tuned:
        os.environ["NBOPS_AUTOTUNE"] = "0"
    if ns.cpu_clock:
        global CLOCK
        CLOCK = time.process_time
    if ns.asm:
        for d in ns.dtype:
            asm_report(d)
        return 0
    if ns.compile_time:
        for d in ns.dtype:
            compile_time(d)
        return 0
    if ns.cuda is not None:
        cuda_run(ns.dtype, ns.cuda or [1024, 2048, 4096], ns.rounds)
        return 0
    import nbops

    run(ns.group, ns.dtype, ns.threads or [nbops.get_num_threads()], ns.rounds, ns.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
