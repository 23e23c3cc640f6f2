"""Helpers shared by the test files: moving arrays between devices."""

import numpy as np


def to_dev(x, device):
    """Move a NumPy array to ``device`` (keeping strided views strided on CUDA)."""
    if device == "cpu" or x is None:
        return x
    from numba import cuda

    if x.flags.c_contiguous:
        return cuda.to_device(x)
    # a strided device view: copy the base, then take the same view of it
    base = np.ascontiguousarray(x.base if x.base is not None else x)
    d = cuda.to_device(base)
    import nbops._layout as layout

    offset = x.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if x.base is None or offset < 0:
        return cuda.to_device(np.ascontiguousarray(x))
    return layout.strided_view(d, x.shape, x.strides, offset)


def host(y):
    """A NumPy copy of ``y`` wherever it lives (scalars pass through)."""
    import nbops

    if isinstance(y, (tuple, list)):
        return type(y)(host(v) for v in y)
    if isinstance(y, (float, int)) or y is None:
        return y
    return np.asarray(nbops.to_host(y))


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
