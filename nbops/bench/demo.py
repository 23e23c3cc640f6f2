"""``python -m nbops selftest``: a short tour that runs every operator family on
synthetic data, on the CPU and (when available) on CUDA, checks each result
against NumPy and prints the error, PASS/FAIL and timings.

The tour is every :class:`~nbops.bench.harness.Case` of :mod:`nbops.bench`
at a small size, plus the ``DEMOS`` steps of those modules: callables for
work that is not one op beside a baseline (a training step, the profiler).
A step is called as ``step(device, quick)`` and returns a dict with
``name``, ``err`` and ``tol`` (PASS when ``err <= tol``) and optionally
``seconds`` and ``note``.
"""

import time

import numpy as np

from . import harness

#: Elements per CPU input (quick, full); CUDA under the simulator gets a size
#: that crosses block boundaries (3 blocks of 32 threads + 1) but stays tiny,
#: since the simulator runs one OS thread per CUDA thread.
CPU_SIZES = (1 << 14, 1 << 20)
GPU_SIZES = (1 << 14, 1 << 22)
SIM_SIZE = 3 * 32 + 1


def cuda_devices():
    """``[("cuda", label)]`` when CUDA kernels can run here, else ``[]``,
    with a line saying why not; imports numba.cuda only when it can help."""
    from .._info import cuda_status

    kind, text = cuda_status()
    if kind == "none":
        return [], f"CUDA: skipped, {text}"
    import nbops

    if not nbops.cuda_available():
        return [], f"CUDA: skipped, {text} but nbops.cuda_available() is False"
    return [("cuda", kind)], f"CUDA: {text}"


def _size(device_kind, quick):
    if device_kind == "simulator":
        return SIM_SIZE
    return (GPU_SIZES if device_kind == "gpu" else CPU_SIZES)[0 if quick else 1]


def _line(name, device, cells, verdict, timing):
    return f"  {name:<20} {device:<4} {'  '.join(cells):<34} {verdict:<4}  {timing}"


def run_demo(quick=False, devices=("cpu", "cuda"), only=None, write=print):
    """Run the tour (the cases and families matching the globs in ``only``,
    default all); returns the number of failed checks (0 is success)."""
    targets = [("cpu", "cpu")] if "cpu" in devices else []
    if "cuda" in devices:
        found, line = cuda_devices()
        targets += found
        write(line)
    write(f"threads: {_threads()}; sizes: CPU {harness.size_label(_size('cpu', quick))} "
          "elements per input" + (f", CUDA {harness.size_label(_size(targets[-1][1], quick))}"
                                  if targets and targets[-1][0] == "cuda" else ""))
    failures = 0
    for family, error in harness.broken().items():
        if not only or family in only:
            write(f"\n{family}\n  FAIL: the family's module did not load: {error}")
            failures += 1
    families = {}
    other_families = {family for family, _ in harness.demos()} | set(harness.broken())
    case_patterns = [p for p in only or () if p not in other_families]
    for case in harness.select(case_patterns) if case_patterns or not only else ():
        families.setdefault(case.family, ([], []))[0].append(case)
    for family, step in harness.demos():
        if not only or family in only:
            families.setdefault(family, ([], []))[1].append(step)
    t_start = time.perf_counter()
    for family, (fcases, steps) in families.items():
        write(f"\n{family}")
        skipped = sorted({m for c in fcases for m in c.missing()})
        if skipped:
            write(f"  skipped: nbops.{', nbops.'.join(skipped)} not there yet")
        for case in fcases:
            if case.missing():
                continue
            for device, kind in targets:
                failures += _demo_case(case, device, kind, quick, write)
        for step in steps:
            for device, _ in targets:
                failures += _demo_step(step, device, quick, write)
    write(f"\n{'FAILED: ' + str(failures) + ' check(s)' if failures else 'all checks passed'}"
          f" in {time.perf_counter() - t_start:.1f} s")
    return failures


def _threads():
    import nbops

    return nbops.get_num_threads()


def _demo_case(case, device, kind, quick, write):
    n = _size(kind, quick)
    results = [harness.run_case(case, n, dt, device=device, rounds=3, pause=0.0,
                                time_it=(dt == case.dtypes[0] and kind != "simulator"))
               for dt in case.dtypes]
    cells = [f"{np.dtype(r.dtype).name.replace('float', 'f')} "
             f"{'-' if r.err is None else format(r.err, '.1e')}" for r in results]
    bad = [r for r in results if not r.passed]
    first = results[0]
    if first.t_nbops is not None:
        timing = (f"nbops {harness.fmt_time(first.t_nbops)}, {case.baseline_name} "
                  f"{harness.fmt_time(first.t_baseline)} ({first.ratio:.1f}x, {first.dtype})")
    else:
        timing = "(simulated: not timed)" if kind == "simulator" else ""
    write(_line(case.name, device, cells, "FAIL" if bad else "PASS", timing))
    for r in bad:
        write(f"      {r.dtype}: {r.note or f'error {r.err:.2e} above tolerance {r.tol:.0e}'}")
    return len(bad)


def _demo_step(step, device, quick, write):
    name = getattr(step, "__name__", "step")
    try:
        out = step(device, quick)
    except Exception as exc:  # a broken step is a failed check, not a crash
        write(_line(name, device, [], "FAIL", f"{type(exc).__name__}: {exc}"))
        return 1
    ok = out["err"] <= out["tol"]
    timing = harness.fmt_time(out["seconds"]) if out.get("seconds") else ""
    write(_line(out.get("name", name), device, [f"err {out['err']:.1e}"],
                "PASS" if ok else "FAIL", f"{timing} {out.get('note', '')}".strip()))
    return 0 if ok else 1

