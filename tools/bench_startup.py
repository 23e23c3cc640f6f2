"""Start-up and coexistence figures of issue 29, each in fresh processes.

    python tools/bench_startup.py [--runs 5] [--only NAME ...] [--json FILE]

Parts (``--only``):

* ``import``: ``import numba``, then ``import nbops`` beyond it;
* ``first-call``: the first ``relu`` (float32) beyond ``import numba`` with
  the kernels in the disk cache, then the first ``conv2d``, ``linear`` and
  ``softmax`` after it; with nbops' fast load path and with Numba's own
  (``NBOPS_FASTLOAD=0``);
* ``cold``: the same first calls with an empty cache (compile included);
* ``coexist``: a loop alternating ``numpy.matmul`` with nbops' ``linear``,
  ``conv2d`` and ``gelu``, each op's median time there divided by its
  median time alone (and ``numpy.matmul``'s the same way), with nbops'
  BLAS coexistence on (the default) and off (``NBOPS_BLAS_COEXIST=0``).

Each figure is the median over ``--runs`` fresh processes, run
interleaved (settings alternate within a run number); the load average is
printed beside them: on a busy machine the figures mean little.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

FIRST_CALLS = """
import time, json
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
import numpy as np
import nbops
t2 = time.perf_counter()
nbops.relu(np.ones(1000, np.float32))
t3 = time.perf_counter()
x = np.ones((1, 8, 16, 16), np.float32); w = np.ones((8, 8, 3, 3), np.float32)
nbops.conv2d(x, w, padding=1)
t4 = time.perf_counter()
nbops.linear(np.ones((4, 16), np.float32), np.ones((8, 16), np.float32))
t5 = time.perf_counter()
nbops.softmax(np.ones((4, 16), np.float32))
t6 = time.perf_counter()
print(json.dumps({"import numba": t1 - t0, "import nbops": t2 - t1,
                  "first relu": t3 - t2, "then conv2d": t4 - t3,
                  "then linear": t5 - t4, "then softmax": t6 - t5}))
"""

COEXIST = """
import json, statistics, time
import numpy as np
import nbops
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 256), dtype=np.float32)
b = rng.standard_normal((256, 256), dtype=np.float32)
x = rng.standard_normal((64, 256), dtype=np.float32)
w = rng.standard_normal((256, 256), dtype=np.float32)
cx = rng.standard_normal((1, 16, 32, 32), dtype=np.float32)
cw = rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
g = rng.standard_normal(1 << 18, dtype=np.float32)
ops = {"linear": lambda: nbops.linear(x, w),
       "conv2d": lambda: nbops.conv2d(cx, cw, padding=1),
       "gelu": lambda: nbops.gelu(g)}
mm = lambda: np.matmul(a, b)
N = %(n)d

def timed(fn):
    t = time.perf_counter(); fn(); return time.perf_counter() - t

for fn in [mm, *ops.values()]:
    for _ in range(5):
        fn()
out = {}
alone_mm = [timed(mm) for _ in range(N)]
for name, fn in ops.items():
    alone = [timed(fn) for _ in range(N)]
    time.sleep(0.2)   # let every pool go idle before the alternating loop
    alt, alt_mm = [], []
    for _ in range(N):
        alt_mm.append(timed(mm))
        alt.append(timed(fn))
    out[name] = {"alone_ms": 1e3 * statistics.median(alone),
                 "alternating_ms": 1e3 * statistics.median(alt),
                 "matmul_alternating_ms": 1e3 * statistics.median(alt_mm)}
    time.sleep(0.2)
out["matmul"] = {"alone_ms": 1e3 * statistics.median(alone_mm)}
out["_coexistence"] = {k: v for k, v in nbops.get_blas_coexistence().items()}
print(json.dumps(out))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="fresh processes per figure")
    p.add_argument("--only", nargs="+", choices=["import", "first-call", "cold", "coexist"],
                   default=["first-call", "coexist"])
    p.add_argument("--rounds", type=int, default=50, help="calls per op in the coexist loop")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    print(f"{_cpu()}; load average {os.getloadavg()[0]:.1f} at start")
    report = {}
    if "import" in args.only or "first-call" in args.only:
        report["first-call"] = first_calls(args.runs)
    if "cold" in args.only:
        report["cold"] = cold_calls(args.runs)
    if "coexist" in args.only:
        report["coexist"] = coexist(args.runs, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def first_calls(runs):
    """Medians of the first calls with a warm cache, fast path against Numba's."""
    settings = {"fast load path": {}, "Numba's path": {"NBOPS_FASTLOAD": "0"}}
    _child(FIRST_CALLS, {})  # the kernels into the cache
    samples = {name: [] for name in settings}
    for _ in range(runs):
        for name, env in settings.items():
            samples[name].append(_child(FIRST_CALLS, env))
    return _table("first calls, warm cache (s)", samples)


def cold_calls(runs):
    samples = {"empty cache": []}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            samples["empty cache"].append(_child(FIRST_CALLS, {"NUMBA_CACHE_DIR": cache}))
    return _table("first calls, cold cache (s)", samples)


def coexist(runs, rounds):
    """The alternating loop with nbops' BLAS coexistence on and off."""
    code = COEXIST % {"n": rounds}
    settings = {"coexistence on": {}, "coexistence off": {"NBOPS_BLAS_COEXIST": "0"}}
    samples = {name: [] for name in settings}
    for _ in range(runs):
        for name, env in settings.items():
            samples[name].append(_child(code, env))
    rows = {}
    print("\nalternating numpy.matmul (256^2 float32) with an nbops op; ratio = median time "
          "in the loop / median time alone")
    print(f"{'setting':18s} {'op':8s} {'alone ms':>9s} {'ratio':>7s} {'matmul ratio':>13s}")
    for name, runs_ in samples.items():
        for op in ("linear", "conv2d", "gelu"):
            alone = statistics.median(r[op]["alone_ms"] for r in runs_)
            ratio = statistics.median(r[op]["alternating_ms"] / r[op]["alone_ms"] for r in runs_)
            mm = statistics.median(r[op]["matmul_alternating_ms"] / r["matmul"]["alone_ms"]
                                   for r in runs_)
            rows[f"{name} {op}"] = {"alone_ms": alone, "ratio": ratio, "matmul_ratio": mm}
            print(f"{name:18s} {op:8s} {alone:9.3f} {ratio:7.2f} {mm:13.2f}")
    return rows


def _table(title, samples):
    print(f"\n{title}, median of {len(next(iter(samples.values())))} fresh processes")
    keys = list(next(iter(samples.values()))[0])
    print(f"{'':16s}" + "".join(f"{k:>14s}" for k in keys))
    out = {}
    for name, runs in samples.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        out[name] = med
        print(f"{name:16s}" + "".join(f"{med[k]:14.3f}" for k in keys))
    return out


def _child(code, env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu():
    from nbops._info import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
