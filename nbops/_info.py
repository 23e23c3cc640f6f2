"""What ``python -m nbops info`` reports: versions, the CPU as LLVM sees it,
Numba's threads, CUDA and the kernel cache.

Everything is gathered into an ordered list of ``(label, value)`` pairs by
:func:`collect` so that the benchmark harness can store the same facts beside
its figures. ``numba.cuda`` costs about 1.6 s to import, so it is imported
only when it can tell something: when the simulator is switched on, or when
the machine shows signs of an NVIDIA driver.
"""

import glob
import os
import platform
import shutil

#: SIMD features worth knowing for Numba kernels, per architecture, in the
#: order shown.
SIMD_FEATURES = {
    "x86": ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw",
            "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni",
            "amx-tile", "amx-int8", "amx-bf16"),
    "arm": ("neon", "fp-armv8", "sve", "sve2", "dotprod", "i8mm", "bf16", "fullfp16"),
}


def cpu_model():
    """The marketing name of the CPU, where the OS tells it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def simd_features():
    """``(present, absent)`` lists of the features in :data:`SIMD_FEATURES`
    for the host CPU, as LLVM (hence Numba's code generator) sees it."""
    import numba  # noqa: F401  (initialises llvmlite's native target)
    from llvmlite import binding

    have = {k for k, v in binding.get_host_cpu_features().items() if v}
    arch = "x86" if platform.machine().lower() in ("x86_64", "amd64", "i686", "i386") \
        else "arm"
    relevant = SIMD_FEATURES[arch]
    return [f for f in relevant if f in have], [f for f in relevant if f not in have]


def threading(probe=True):
    """``(threads, layer)``; the layer Numba picked is known only after a
    parallel kernel ran, so ``probe`` runs a tiny one (compiled once, then
    loaded from the cache)."""
    import numba

    threads = numba.get_num_threads()
    if not probe:
        return threads, f"not probed (configured: {numba.config.THREADING_LAYER})"
    import numpy as np

    from .bench.harness import parallel_copy

    x = np.zeros(64)
    parallel_copy(x, np.empty_like(x))
    return threads, numba.threading_layer()


def cuda_status():
    """``(kind, description)`` with kind ``"gpu"``, ``"simulator"`` or ``"none"``.

    Imports ``numba.cuda`` only when the simulator is on or an NVIDIA driver
    seems present (device nodes, ``nvidia-smi`` or WSL's ``/dev/dxg``).
    """
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "simulator", "Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): correct, not fast"
    if not (glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi")
            or os.path.exists("/dev/dxg")):
        return "none", ("none (no NVIDIA driver found); NUMBA_ENABLE_CUDASIM=1 runs the CUDA "
                        "kernels in Numba's simulator")
    try:
        from numba import cuda

        if not cuda.is_available():
            return "none", "none (numba.cuda.is_available() is False: driver or toolkit missing)"
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        major, minor = dev.compute_capability
        return "gpu", f"{name}, compute capability {major}.{minor}"
    except Exception as exc:  # a broken driver must not break `info`
        return "none", f"none ({type(exc).__name__}: {exc})"


def cache_dir():
    """Where Numba keeps nbops' compiled kernels."""
    import numba

    if numba.config.CACHE_DIR:
        return f"{numba.config.CACHE_DIR} (NUMBA_CACHE_DIR)"
    from .bench.harness import parallel_copy

    cache = getattr(parallel_copy, "_cache", None)
    path = getattr(cache, "_cache_path", None)
    if path is None:
        return "unknown"
    # in-tree caches sit beside each kernel module; name the package's root
    root = os.path.dirname(os.path.abspath(__file__))
    if os.path.abspath(path).startswith(root):
        return f"__pycache__ beside each kernel module under {root}"
    return path


def collect(probe_threads=True):
    """The facts ``info`` prints, as a list of ``(label, value)`` pairs."""
    import llvmlite
    import numba
    import numpy

    import nbops

    try:
        import numba_cuda
        cuda_version = numba_cuda.__version__
    except ImportError:
        cuda_version = "not installed"
    present, absent = simd_features()
    from llvmlite import binding

    threads, layer = threading(probe_threads)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _, cuda_text = cuda_status()
    return [
        ("nbops", f"{nbops.__version__} ({os.path.dirname(nbops.__file__)})"),
        ("python", platform.python_version()),
        ("numpy", numpy.__version__),
        ("numba", numba.__version__),
        ("llvmlite", llvmlite.__version__),
        ("numba-cuda", cuda_version),
        ("cpu", f"{cpu_model()} ({cores} cores usable)"),
        ("llvm cpu name", binding.get_host_cpu_name()),
        ("simd", " ".join(present) or "none of the listed"),
        ("simd missing", " ".join(absent) or "-"),
        ("svml", "yes" if numba.config.USING_SVML else
         "no (transcendentals in nbops use their own vectorizable approximations)"),
        ("numba threads", f"{threads} of {numba.config.NUMBA_NUM_THREADS} "
                          "(nbops.set_num_threads, NUMBA_NUM_THREADS)"),
        ("threading layer", layer),
        ("beside NumPy's BLAS", _coexistence()),
        ("cuda", cuda_text),
        ("kernel cache", cache_dir()),
    ]


def _coexistence():
    """What nbops changed in the BLAS and OpenMP pools (nbops/_coexist.py)."""
    import nbops

    state = nbops.get_blas_coexistence()
    if not state["enabled"]:
        return "nothing changed (NBOPS_BLAS_COEXIST=0 or set_blas_coexistence(False))"
    pools = ", ".join(f"{os.path.basename(p)} idle spin 2**{e} cycles"
                      for p, e in state["openblas"].items()) or "no OpenBLAS loaded"
    return f"{pools}; GOMP_SPINCOUNT {state['openmp']} (NBOPS_BLAS_COEXIST=0 turns off)"


def format_info(pairs):
    """Aligned ``label: value`` lines."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in pairs)
