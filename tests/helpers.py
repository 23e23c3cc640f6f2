"""Helpers shared by the test files: moving arrays between devices (those of
nbops.testing) and running a bench case."""


def to_dev(x, device):
    """Move a NumPy array to ``device`` (keeping strided views strided on CUDA)."""
    from nbops.testing import to_device

    return to_device(x, device)


def host(y):
    """A NumPy copy of ``y`` wherever it lives (scalars pass through)."""
    from nbops.testing import to_numpy

    return to_numpy(y)


def check_bench_case(name, dtype, device, family):
    """The demo's and ``nbops bench``'s case ``name`` of ``family`` runs and
    agrees with its baseline's float64 reference on ``device`` (run from a
    family's test file, after its kernels were compiled in that worker)."""
    from nbops.bench import harness

    case = harness.cases()[name]
    assert case.family == family
    res = harness.run_case(case, 256 if device == "cuda" else 3000, dtype, device=device,
                           time_it=False)
    assert res.note == ""
    assert res.passed, (res.err, res.tol)
