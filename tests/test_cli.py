"""``python -m nbops info|bench|selftest`` run as a user runs them: in a fresh
interpreter, checked by exit code and output (sizes kept tiny)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest


def nbops_cli(*args, env=None, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "nbops", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_info_lists_versions_cpu_threads_cuda_cache():
    rc, out, err = nbops_cli("info")
    assert rc == 0, err
    labels = [line.split("  ")[0] for line in out.splitlines()]
    for label in ("nbops", "numpy", "numba", "llvmlite", "cpu", "llvm cpu name", "simd",
                  "numba threads", "threading layer", "cuda", "kernel cache"):
        assert label in labels, out
    layer = next(ln for ln in out.splitlines() if ln.startswith("threading layer"))
    assert layer.split()[-1] in ("omp", "tbb", "workqueue"), layer
    cuda = next(ln for ln in out.splitlines() if ln.startswith("cuda"))
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        assert "simulator" in cuda


def test_info_does_not_import_numba_cuda_without_a_gpu():
    from nbops._info import cuda_status

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import sys; from nbops.__main__ import main; from nbops._info import cuda_status;"
            "main(['info', '--no-probe']); print('KIND', cuda_status()[0],"
            " 'numba.cuda' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kind, imported = proc.stdout.split("KIND")[1].split()
    if kind == "none" and cuda_status()[0] != "gpu":
        assert imported == "False"


def test_bench_quick_relu_table_and_json(tmp_path):
    path = tmp_path / "bench.json"
    rc, out, err = nbops_cli("bench", "--quick", "--op", "relu", "--size", "4096",
                             "--rounds", "1", "--pause", "0", "--threads", "1",
                             "--dtype", "float32", "float64", "--json", str(path))
    assert rc == 0, err
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("op "))
    for col in ("nbops", "baseline", "speedup", "GB/s", "of copy", "max err"):
        assert col in header
    assert "1 thread(s)" in out
    assert sum(ln.startswith("copy (prange)") for ln in lines) == 2
    rows = [ln for ln in lines if ln.startswith("relu ")]
    assert len(rows) == 2 and all("4K" in r and "x" in r for r in rows)
    doc = json.loads(path.read_text())
    assert [r["dtype"] for r in doc["results"]] == ["float32", "float64"]
    for r in doc["results"]:
        assert r["case"] == "relu" and r["n"] == 4096 and r["ratio"] > 0 and r["passed"]
        assert r["gbps"] == pytest.approx(r["nbytes"] / r["t_nbops"] / 1e9)
    assert doc["threads"] == 1 and {c["dtype"] for c in doc["copy_gbps"]} == {"float32",
                                                                               "float64"}


@pytest.mark.parametrize("args, message", [
    (("--op", "no_such_op"), "no case matches 'no_such_op'"),
    (("--threads", "0"), "set_num_threads"),
    (("--size", "many"), "size must be"),
])
def test_bench_bad_arguments(args, message):
    rc, out, err = nbops_cli("bench", *args)
    assert rc == 2 and message in err


def test_bench_list():
    rc, out, err = nbops_cli("bench", "--list", "--op", "activations")
    assert rc == 0, err
    assert "relu" in out and "hardswish_backward" in out and "transpose" not in out


def test_selftest_quick_passes_on_every_device():
    # the activations family keeps it short; the other families' steps are
    # checked in test_bench.py (the digits demo: test_demo.py)
    rc, out, err = nbops_cli("selftest", "--quick", "--op", "activations")
    assert rc == 0, out + err
    assert "all checks passed" in out
    for op in ("relu", "gelu", "gelu_tanh_backward", "swish_backward"):
        assert any(ln.split()[:2] == [op, "cpu"] and "PASS" in ln for ln in out.splitlines())
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        assert any(ln.split()[:2] == ["relu", "cuda"] and "PASS" in ln
                   for ln in out.splitlines())
    assert "FAIL" not in out


def test_no_command_is_a_usage_error():
    rc, out, err = nbops_cli()
    assert rc == 2 and "usage" in err


def test_bench_plot_writes_a_png(tmp_path):
    path = tmp_path / "bench.png"
    rc, out, err = nbops_cli("bench", "--op", "relu", "--size", "4096", "--rounds", "1",
                             "--pause", "0", "--plot", str(path))
    assert rc == 0, out + err
    assert f"wrote {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_refuses_results_without_timings(tmp_path):
    from nbops.bench.harness import Result
    from nbops.bench.plot import plot_results

    with pytest.raises(ValueError, match="no case was timed"):
        plot_results([Result("relu", "activations", 4096, "float32", note="error")],
                     tmp_path / "x.png")


def test_bench_plot_shows_both_limits(tmp_path, monkeypatch):
    # a memory-bound case against copy bandwidth, a compute-bound one against
    # the FMA peak: both get a bar on the right, each in its own colour
    import matplotlib.axes
    from nbops.bench.harness import Result
    from nbops.bench.plot import plot_results

    bars = []
    real = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh",
                        lambda ax, y, w, **kw: bars.append((list(w), kw)) or real(ax, y, w, **kw))
    results = [Result("relu", "activations", 4096, "float32", t_nbops=1e-3, t_baseline=2e-3,
                      nbytes=8 << 20, copy_gbps=16.0),
               Result("matmul", "linalg", 4096, "float32", t_nbops=1e-3, t_baseline=1e-3,
                      flops=200_000_000, peak_gflops=400.0)]
    path = plot_results(results, tmp_path / "limits.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    widths, kw = bars[-1]
    np.testing.assert_allclose(widths, [8.388608 / 16 * 100, 50.0])
    assert kw["color"] == ["C0", "C1"]
