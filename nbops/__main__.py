"""``python -m nbops`` (also the ``nbops`` script): info, demo, selftest, bench, tune, warmup.

    python -m nbops info                       versions, CPU/SIMD, threads, CUDA, cache
    python -m nbops demo                       train, fuse, quantize, serve networks on digits
    python -m nbops selftest                   every op family, checked against NumPy
    python -m nbops bench --quick --op gelu    nbops beside NumPy: time, GB/s, error
    python -m nbops warmup --jobs 2            compile kernels into the disk cache, in parallel
    python -m nbops run model.onnx --profile   run an ONNX model: output shapes, latency, ops
"""

import argparse
import json
import sys


def _info(args):
    from ._info import collect, format_info

    print(format_info(collect(probe_threads=not args.no_probe)))
    return 0


def _bench(args):
    import nbops

    from .bench import harness

    try:
        if args.threads is not None:
            nbops.set_num_threads(args.threads)
        selected = harness.select(args.op)
        sizes = ([harness.parse_size(s) for s in args.size] if args.size
                 else harness.QUICK_SIZES if args.quick else harness.FULL_SIZES)
    except ValueError as exc:
        print(f"nbops bench: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for c in selected:
            print(f"{c.family:<12} {c.name}")
        return 0
    dtypes = [harness.DTYPES[d] for d in args.dtype or ["float32"]]
    # with --markdown, stdout is the Markdown document and the progress goes to stderr
    log = (lambda *a: print(*a, file=sys.stderr)) if args.markdown else print
    log(f"nbops {nbops.__version__} bench: {nbops.get_num_threads()} thread(s); median of "
          f"{args.rounds} interleaved rounds after warm-up; speedup = baseline time / nbops "
          "time;\nGB/s counts each input and output once; 'of copy' compares it with a "
          "parallel copy at the same size timed in the same rounds (median of the "
          "per-round fractions;\nthe copy line is the copy alone, before the cases); "
          "max err = max |y - ref| / (1 + |ref|)\nagainst a float64 reference from the "
          "same inputs.")
    log(_load_warning() + "\n")
    peaks = {}
    results, copies = harness.run_bench(selected, sizes, dtypes, rounds=args.rounds,
                                        pause=args.pause, write=log, peaks=peaks)
    log(_load_warning())
    if args.markdown:
        print(_markdown(results, copies, peaks, args))
    if args.json:
        from ._info import collect

        doc = {"info": dict(collect()), "threads": nbops.get_num_threads(),
               "rounds": args.rounds, "load_average_at_end": _load_warning(),
               "copy_gbps": [{"n": n, "dtype": d, "gbps": g} for (n, d), g in copies.items()],
               "results": [r.as_dict() for r in results]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        try:
            from .bench.plot import plot_results

            print(f"wrote {plot_results(results, args.plot)}")
        except ImportError:
            print('bench --plot: matplotlib is not installed (pip install "nbops[demo]")',
                  file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"nbops {exc}", file=sys.stderr)
            return 2
    errors = [r for r in results if r.note.startswith("error")]
    return 1 if errors else 0


def _markdown(results, copies, peaks, args):
    """``bench --markdown``: the machine, the limits measured and one table
    line per case."""
    import nbops

    from ._info import cpu_model
    from .bench import harness

    copy_text = ", ".join(f"{harness.size_label(n)} {d} {g:.1f} GB/s"
                          for (n, d), g in copies.items()) or "not measured"
    peak_text = ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()) or "not measured"
    return "\n".join([
        f"nbops {nbops.__version__} on {cpu_model()}, {nbops.get_num_threads()} thread(s), "
        f"median of {args.rounds} interleaved rounds; {_load_warning()}.",
        f"Limits measured in this run: parallel copy {copy_text}; FMA peak {peak_text}.",
        "", harness.markdown_table(results)])


def _load_warning():
    """The load average beside the core count: other busy processes make
    multi-threaded timings meaningless, and the table cannot tell."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return "load average: unknown"
    busy = load > 0.5 * cores
    return (f"load average {load:.1f} on {cores} core(s)"
            + (": other processes compete for the cores, figures are unreliable" if busy
               else ""))


def _demo(args):
    from .demo import main

    return main(args=args)


def _selftest(args):
    from .bench.demo import run_demo

    devices = args.device or ["cpu", "cuda"]
    try:
        failures = run_demo(quick=args.quick, devices=devices, only=args.op)
    except ValueError as exc:
        print(f"nbops selftest: {exc}", file=sys.stderr)
        return 2
    return 1 if failures else 0


def _warmup(args):
    from .warmup import run

    return run(args)


def _run_onnx(args):
    from .onnx._cli import run

    return run(args)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m nbops", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{info,demo,selftest,bench,tune,warmup,run}",
                           required=True)

    info = sub.add_parser("info", help="versions, CPU and SIMD features, threads, CUDA, cache")
    info.add_argument("--no-probe", action="store_true",
                      help="do not run a tiny parallel kernel to learn the threading layer")
    info.set_defaults(func=_info)

    b = sub.add_parser("bench", help="time ops beside their NumPy/SciPy baselines")
    b.add_argument("--quick", action="store_true", help="sizes 1M and 16M elements only")
    b.add_argument("--op", nargs="+", action="extend", metavar="NAME",
                   help="cases or families to run (shell globs: 'gelu*', 'activations')")
    b.add_argument("--dtype", nargs="+", action="extend", choices=["float32", "float64"],
                   help="float32 (default) and/or float64")
    b.add_argument("--threads", type=int, help="Numba threads (default: all)")
    b.add_argument("--size", nargs="+", action="extend", metavar="N",
                   help="element counts instead of the defaults (4096, 64K, 16M)")
    b.add_argument("--rounds", type=int, default=5, help="timed rounds per case (median)")
    b.add_argument("--pause", type=float, default=0.05,
                   help="seconds of sleep before each timed block (default 0.05)")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    b.add_argument("--plot", metavar="FILE.png",
                   help="also draw the speed-ups (and fractions of copy bandwidth) as bars")
    b.add_argument("--markdown", action="store_true",
                   help="print a Markdown table, one line per case, with the fraction of "
                        "copy bandwidth or FMA peak (the progress goes to stderr)")
    b.add_argument("--list", action="store_true", help="list the cases and exit")
    b.set_defaults(func=_bench)

    from .demo import TASKS
    from .demo._common import add_options

    add_options(sub.add_parser("demo", help="CNN, spiking net, GCN and Transformer on the "
                               "digits: train, fuse, int8, ONNX, timings, plots"),
                TASKS).set_defaults(func=_demo)

    d = sub.add_parser("selftest", help="run every op family, check against NumPy, time it")
    d.add_argument("--quick", action="store_true", help="small inputs (seconds, once compiled)")
    d.add_argument("--device", nargs="+", action="extend", choices=["cpu", "cuda"],
                   help="devices to run on (default: cpu, and cuda when available)")
    d.add_argument("--op", nargs="+", action="extend", metavar="NAME",
                   help="cases or families to run (shell globs), default all")
    d.set_defaults(func=_selftest)

    t = sub.add_parser("tune", help="pre-tune GEMM (and other tuned kernels) for this machine",
                       add_help=False, prefix_chars="+")  # every "-" option is tune_main's
    t.add_argument("tune_args", nargs=argparse.REMAINDER,
                   help="arguments of nbops.autotune.tune_main (try: tune --help)")
    t.set_defaults(func=lambda a: __import__("nbops.autotune", fromlist=["tune_main"])
                   .tune_main(a.tune_args))

    from .warmup import add_arguments

    w = sub.add_parser("warmup", help="compile the kernels a script will use into the disk cache")
    add_arguments(w)
    w.set_defaults(func=_warmup)

    from .onnx._cli import add_arguments as add_run_arguments

    r = sub.add_parser("run", help="run an ONNX model: output shapes, latency, per-op profile")
    add_run_arguments(r)
    r.set_defaults(func=_run_onnx)
    return p


def main(argv=None):
    """Entry point of ``python -m nbops`` and of the ``nbops`` script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
