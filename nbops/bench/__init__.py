"""Benchmark cases and the harness behind ``python -m nbops bench`` and
``python -m nbops selftest``.

Each module here is a family (``activations``, ``tensor``, ``linalg``...)
and lists its :class:`~nbops.bench.harness.Case` objects in ``CASES``: the
nbops call, the NumPy/SciPy baseline doing the same math, an input maker
and, where it matters, the bytes moved or FLOPs done. Adding an operator to
the benchmarks and to the demo is adding a case to its family's module (or
a new module); the table, the JSON output, the demo's checks and the asv
suites in ``benchmarks/`` pick it up. A family whose operators do not exist
yet names them in ``Case.requires`` and is skipped with a note. Steps that
are not an op beside a baseline (a training step, the profiler) go in a
module's ``DEMOS`` list, see :mod:`nbops.bench.demo`.

Nothing in this package is imported by ``import nbops``.
"""

from .harness import (  # noqa: F401
    Case,
    Result,
    cases,
    max_error,
    measure_copy,
    parse_size,
    register,
    run_case,
    select,
    time_interleaved,
)
