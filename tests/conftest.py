"""Test set-up shared by every test file.

CUDA kernels run in Numba's simulator wherever no GPU is present (CI): the
variable must be set before numba is first imported, which is why it is set
here, at the top of the first module pytest loads.
"""

import os
import shutil


def _has_gpu():
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _has_gpu():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
# Tests use the documented default GEMM configs: no timing runs, no writes
# to the user's autotune cache (tests of the autotuner turn it on themselves).
os.environ.setdefault("NBOPS_AUTOTUNE", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

try:
    from hypothesis import settings

    # Fixed seed and bounded work in CI; the same everywhere else.
    settings.register_profile("ci", derandomize=True, max_examples=30, deadline=None)
    settings.register_profile("dev", max_examples=50, deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")
except ImportError:  # hypothesis is part of the [test] extra
    pass

DEVICES = ["cpu", "cuda"]


def pytest_addoption(parser):
    # tests/test_fuzz.py: many freshly random cases per operator (nightly)
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the long fuzz profile of tests/test_fuzz.py")


@pytest.fixture(params=DEVICES)
def device(request):
    """Runs a test once on the CPU and once on CUDA (simulated without a GPU)."""
    if request.param == "cuda":
        import nbops

        if not nbops.cuda_available():
            pytest.fail("CUDA (or its simulator) must be available for the CUDA tests")
    return request.param
