"""``python -m nbops demo``: real networks on real data, every family at work.

On scikit-learn's bundled 8x8 digits (1,797 images, no download), with a
fixed seed and a held-out test split, four tasks, each a module here that
reads as a script (and runs as one from ``examples/digits_*.py``):

* :mod:`~nbops.demo.cnn`: a CNN trained with autograd and Adam, fused for
  inference, quantized to int8, exported to ONNX and run back;
* :mod:`~nbops.demo.snn`: a spiking network on rate-coded pixels;
* :mod:`~nbops.demo.gcn`: a GCN on a k-nearest-neighbour graph of the images;
* :mod:`~nbops.demo.transformer`: a Transformer over the image rows.

Then one summary table (accuracy, training time, latency, device, time spent
compiling) and PNG plots in ``--out``. The code lives in the package, not
in ``examples/`` alone, so that the command runs from an installed wheel.
"""

import argparse
import importlib
import os
import sys
import time

import nbops

from . import _common as C

__all__ = ["TASKS", "TARGETS", "main", "run_tasks", "task_module"]

#: The tasks in the order they run (modules of this package, imported when
#: run: ``python -m nbops info`` builds the demo's options without them).
TASKS = ("cnn", "snn", "gcn", "transformer")

#: The issue's accuracy targets (full settings): row -> least test accuracy.
TARGETS = {"cnn fused": 0.97, "snn": 0.90, "transformer": 0.95}
#: Most accuracy the int8 model may lose against the fused float model.
MAX_INT8_DROP = 0.01


def run_tasks(cfg, only=None):
    """Run the tasks named in ``only`` (default all) on one data split;
    returns ``(results, histories, extras)`` keyed by task."""
    data = C.load_digits(cfg)
    results, histories, extras = [], {}, {}
    names = [name for name in TASKS if not only or name in only]
    if cfg.ahead:
        _run_ahead(cfg, data, names)
        return results, histories, extras
    C.Ahead.start(cfg, names)
    for i, name in enumerate(names):
        if i:
            C.settle()
        module = task_module(name)
        cfg.say(f"{name}: {module.__doc__.splitlines()[0]}")
        rows, history, extra = module.run(cfg, data)
        results += rows
        histories[name], extras[name] = history, extra
    return results, histories, extras


def _run_ahead(cfg, data, names):
    # The second process of C.Ahead: the later tasks, the last first, so
    # that it meets the first process (arriving at the second task) as late
    # as possible.
    for name in names[::-1]:
        task_module(name).run(cfg, data)


def _mark_warm(cfg, tasks):
    # the tasks ran: the disk cache now holds their kernels
    try:
        path = C.warm_marker(cfg, tasks)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    except OSError:  # a read-only cache folder: the next run starts the second process again
        pass


def task_module(name):
    """The module of task ``name`` (one of :data:`TASKS`)."""
    return importlib.import_module(f"{__name__}.{name}")


def check_targets(results):
    """Lines naming each target missed by ``results`` (empty: all met)."""
    by_task = {r.task: r for r in results}
    missed = [f"{task}: accuracy {by_task[task].accuracy:.2%} below {least:.0%}"
              for task, least in TARGETS.items()
              if task in by_task and not by_task[task].accuracy >= least]
    if "cnn int8" in by_task and "cnn fused" in by_task:
        drop = by_task["cnn fused"].accuracy - by_task["cnn int8"].accuracy
        if not drop <= MAX_INT8_DROP:
            missed.append(f"cnn int8: {drop * 100:.2f} points below float, more than "
                          f"{MAX_INT8_DROP * 100:.0f}")
    return missed


def write_plots(cfg, histories, extras):
    """The PNGs of the tasks that ran; returns their paths (none, after one
    line saying how to get them, without matplotlib)."""
    if C.pyplot(cfg) is None:
        return []
    paths = [C.plot_training_curves(cfg, histories)]
    if "cnn" in extras:
        paths.append(C.plot_latency(cfg, extras["cnn"]["latency"]))
        paths.append(C.plot_confusion(cfg, extras["cnn"]["labels"], extras["cnn"]["predicted"],
                                      "CNN (fused), test set"))
    if "snn" in extras:
        paths.append(C.plot_raster(cfg, extras["snn"]["raster"],
                                   task_module("snn").raster_title(extras["snn"])))
    return [p for p in paths if p]


def _header(cfg):
    cores = C.cores()
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    mode = "smoke" if cfg.smoke else "quick" if cfg.quick else "full"
    return (f"nbops {nbops.__version__} demo ({mode}, seed {cfg.seed}) on {cfg.device}: "
            f"{nbops.get_num_threads()} thread(s), {cores} core(s){load}")


def main(argv=None, args=None, task=None):
    """The command: parse ``argv`` (or take parsed ``args``), run, print the
    table, write the plots. ``task`` runs that task alone (its script's
    options have no ``--only``). Returns the exit status: 0, 1 when a full
    run misses a target, 2 for an unusable device."""
    if args is None:
        prog = f"digits_{task}.py" if task else "python -m nbops demo"
        parser = argparse.ArgumentParser(prog=prog, description=(
            task_module(task) if task else sys.modules[__name__]).__doc__.splitlines()[0])
        args = C.add_options(parser, None if task else list(TASKS)).parse_args(argv)
    only = [task] if task else args.only
    if args.jobs is None:
        args.jobs = 2 if C.cores() >= 2 and not args.smoke else 1
    cfg = C.config_from(args)
    ahead_report = os.environ.pop(C.Ahead.REPORT, None)
    if ahead_report:  # this is the second process of another run's Ahead
        from ..warmup import claim_kernels

        claim_kernels(os.environ.pop(C.Ahead.CLAIMS))
        C.Ahead.inside = True
    if cfg.device == "cuda" and not nbops.cuda_available():
        print("nbops demo: --device cuda, but no CUDA device (nor the simulator, "
              "NUMBA_ENABLE_CUDASIM=1) is available", file=sys.stderr)
        return 2
    print(_header(cfg), flush=True)
    start = time.perf_counter()
    with C.CompileClock() as clock:
        results, histories, extras = run_tasks(cfg, only)
    wall = time.perf_counter() - start
    if ahead_report:
        with open(ahead_report, "w") as f:
            f.write(f"{clock.seconds:.3f}")
    elif cfg.device == "cpu":
        _mark_warm(cfg, [t for t in TASKS if not only or t in only])
    ahead = C.Ahead.current
    C.Ahead.current = None
    print()
    print("\n".join(C.summary_table(results)))
    also = (f" (and {ahead.seconds:.1f} s in a second process compiling ahead)"
            if ahead is not None else "")
    print(f"\ntotal {wall:.1f} s, of which {clock.seconds:.1f} s compiling or loading "
          f"kernels (Numba's compiler events){also}; latency = median ms per call")
    for path in write_plots(cfg, histories, extras):
        print(f"wrote {path}")
    missed = check_targets(results)
    if cfg.quick or cfg.limit or cfg.smoke:
        return 0
    for line in missed:
        print(f"target missed: {line}")
    return 1 if missed else 0
