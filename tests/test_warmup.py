"""nbops.warmup and ``python -m nbops warmup``: kernels land in the disk cache
so that a later process loads instead of compiling; bad requests are refused."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nbops as nb

W = importlib.import_module("nbops.warmup")  # nbops.warmup is the function

# A later process: call relu and a fused function, then report whether each
# kernel came from the cache (hits) or was compiled (misses).
_LATER = """
import gc
import numpy as np, nbops
from numba.core.registry import CPUDispatcher
x, big = np.ones(50, np.float32), np.ones(1 << 17, np.float32)
nbops.relu(x)
f = nbops.fuse(lambda a, b: a * b + 2.0, name="warm_fma")
assert f(x, x)[0] == 3.0 and f(big, big)[-1] == 3.0
hits = misses = 0
for obj in gc.get_objects():
    if isinstance(obj, CPUDispatcher) and obj.signatures:
        hits += sum(obj.stats.cache_hits.values())
        misses += sum(obj.stats.cache_misses.values())
print(hits, misses)
"""

_WARM_FUSED = """
import nbops
nbops.warmup(ops=[nbops.fuse(lambda a, b: a * b + 2.0, name="warm_fma")], dtypes=["float32"])
"""


def _run(env, *args):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_later_process_loads_instead_of_compiling(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               NBOPS_CACHE_DIR=str(tmp_path / "nbops"))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    cli = _run(env, "-m", "nbops", "warmup", "--ops", "relu", "--dtypes", "float32", "--quiet")
    assert cli.returncode == 0, cli.stderr
    assert "nbops warmup: 1 op(s), 5 kernel call(s) compiled or loaded" in cli.stdout
    api = _run(env, "-c", _WARM_FUSED)
    assert api.returncode == 0, api.stderr
    later = _run(env, "-c", _LATER)
    assert later.returncode == 0, later.stderr
    hits, misses = map(int, later.stdout.split())
    # relu's kernel and the fused kernel's serial and parallel forms: loaded, not compiled
    assert misses == 0 and hits >= 2


def test_command_line_refuses_unknown_ops():
    bad = _run(dict(os.environ), "-m", "nbops", "warmup", "--ops", "no_such_op")
    assert bad.returncode == 2 and "no operator named 'no_such_op'" in bad.stderr


def test_report_lists_layouts_and_variants():
    report = nb.warmup(ops=["gelu", "relu_backward"], dtypes="float32")
    assert report["gelu"]["ok"] == [("float32", "cpu", layout) for layout in (
        "1-D", "2-D", "2-D strided", "1-D large", "2-D large strided")]
    assert report["relu_backward"]["skipped"] == []
    assert report["gelu"]["seconds"] >= 0


def test_fused_functions_and_operators_are_accepted(device):
    f = nb.fuse(lambda a: a * 2.0 + 1.0)
    report = nb.warmup(ops=[f, nb.relu], dtypes=["float32"], devices=[device])
    # the simulator skips the large layouts (it caches nothing)
    layouts = 3 if device == "cuda" and nb._dispatch.cuda_simulated() else 5
    assert len(report[f.name]["ok"]) == layouts and len(report["relu"]["ok"]) == layouts


def test_errors():
    with pytest.raises(ValueError, match="no operator named 'nope'"):
        nb.warmup(ops=["nope"])
    with pytest.raises(ValueError, match="'dtypes' must be one of 'float32', 'float64', "
                                         "got 'int8'"):
        nb.warmup(ops=["relu"], dtypes=["int8"])
    with pytest.raises(ValueError, match="'devices' must be one of 'cpu', 'cuda', got 'tpu'"):
        nb.warmup(ops=["relu"], devices=["tpu"])
    with pytest.raises(TypeError, match="ops must hold operator names"):
        nb.warmup(ops=[np.ones(3)])
    never = nb.register_op("test_warmup_never", cpu=lambda x: (_ for _ in ()).throw(
        ValueError("refuses every input")))
    with pytest.raises(ValueError, match="test_warmup_never ran in no layout: ValueError: "
                                         "refuses every input"):
        nb.warmup(ops=[never], dtypes=["float32"])


# A later process: run ops as a script would and count Numba's compilations
# (numba:compile events fire for compiled kernels only, not cache loads).
_COUNT_COMPILES = """
import sys
from numba.core import event
import numpy as np, nbops

class Count(event.Listener):
    n, kernels = 0, []
    def on_start(self, ev):
        Count.n += 1
        Count.kernels.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev):
        pass

with event.install_listener("numba:compile", Count()):
    nbops.warmup(ops=sys.argv[1:], dtypes=["float32"])
print(Count.n, Count.kernels)
"""

# three families (activations, tensor, nn.losses) that share the strided
# copy behind contiguous(): cheap kernels, and one the workers must claim
_PARALLEL_OPS = ["relu", "contiguous", "binary_cross_entropy_with_logits"]


def _fresh_env(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               NBOPS_CACHE_DIR=str(tmp_path / "nbops"))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def test_parallel_workers_leave_a_complete_cache(tmp_path):
    env = _fresh_env(tmp_path)
    cli = _run(env, "-m", "nbops", "warmup", "--ops", *_PARALLEL_OPS, "--dtypes", "float32",
               "--jobs", "2")
    assert cli.returncode == 0, cli.stderr
    assert "3 op(s)" in cli.stdout and "(3 family(ies), 2 worker(s))" in cli.stdout
    # per-family seconds, and no kernel compiled by two workers
    assert cli.stdout.count(" compiled  waited ") == 3
    assert "compiled by several families" not in cli.stderr
    later = _run(env, "-c", _COUNT_COMPILES, *_PARALLEL_OPS)
    assert later.returncode == 0, later.stderr
    assert later.stdout.split()[0] == "0", later.stdout


def test_families_never_share_a_kernel_module():
    families = W.kernel_families(nb.registered_ops())
    seen = {}
    for ops, keys, cost in families:
        for key in keys:
            assert key not in seen, f"{key} in families {seen[key]} and {ops}"
            seen[key] = ops
        assert cost > 0
    placed = [op for ops, _, _ in families for op in ops]
    assert sorted(placed) == nb.registered_ops()
    # ops whose kernels share a module stay together; others apart
    assert [f[0] for f in W.kernel_families(["relu", "softmax", "relu_backward"])] == [
        ("relu", "relu_backward"), ("softmax",)]
    assert "nbops.cpu.linalg" in W.family_keys("bmm") and W.family_keys("conv2d").isdisjoint(
        W.family_keys("matmul"))
    costs = [f[2] for f in families]
    assert costs == sorted(costs, reverse=True)   # longest first


def _trace(tmp_path):
    f = nb.fuse(lambda a: a * 2.0, name="test_warmup_traced_fused")
    x = np.ones((4, 10), np.float32)
    with nb.profiler.profile(record_shapes=True) as prof:
        nb.relu(x)
        nb.nn.cross_entropy(x, np.zeros(4, np.int64))
        f(x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_from_profile_warms_the_traced_ops_dtypes_and_shapes(tmp_path):
    path = _trace(tmp_path)
    ops, unknown = W.ops_from_profile(str(path))
    # nested ops too: cross_entropy takes the mean of its losses
    assert set(ops) == {"relu", "cross_entropy", "mean"}
    assert unknown == ["test_warmup_traced_fused"]
    assert ops["relu"] == {"dtypes": ["float32"], "devices": ["cpu"],
                           "inputs": [[((4, 10), "float32")]]}
    assert ops["cross_entropy"]["inputs"] == [[((4, 10), "float32"), ((4,), "int64")]]
    cli = _run(dict(os.environ), "-m", "nbops", "warmup", "--from-profile", str(path),
               "--jobs", "1")
    assert cli.returncode == 0, cli.stderr
    # relu and mean: 5 layouts + the traced call each, float32 only;
    # cross_entropy rejects the generic layouts but runs the traced shapes
    assert "3 op(s), 13 kernel call(s)" in cli.stdout
    assert "not registered operators, not warmed" in cli.stderr
    assert "test_warmup_traced_fused" in cli.stderr


@pytest.mark.parametrize("args, message", [
    (["--ops", "relu", "no_such_op"], "no operator named 'no_such_op'"),
    (["--from-profile", "{tmp}/missing.json"], "cannot read trace '{tmp}/missing.json'"),
    (["--from-profile", "{tmp}/bad.json"], "trace '{tmp}/bad.json' is not JSON"),
    (["--from-profile", "{tmp}/empty.json"], "shows no registered nbops operator"),
    (["--from-profile", "{tmp}/other.json"], "is not a Chrome trace"),
    (["--ops", "relu", "--jobs", "0"], "--jobs must be >= 1, got 0"),
])
def test_bad_arguments_exit_with_status_2(tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{\"traceEvents\": [")
    (tmp_path / "empty.json").write_text(json.dumps({"traceEvents": [
        {"name": "fuse[f]", "cat": "cpu_op", "ph": "X", "args": {}}]}))
    (tmp_path / "other.json").write_text(json.dumps({"events": []}))
    args = [a.format(tmp=tmp_path) for a in args]
    bad = _run(dict(os.environ), "-m", "nbops", "warmup", *args)
    assert bad.returncode == 2, bad.stderr
    assert message.format(tmp=tmp_path) in bad.stderr


def test_a_failing_family_is_reported_and_fails_the_run():
    # cross_entropy runs in none of the generic layouts (it needs labels)
    cli = _run(dict(os.environ), "-m", "nbops", "warmup", "--ops", "relu", "cross_entropy",
               "--dtypes", "float32", "--jobs", "2", "--quiet")
    assert cli.returncode == 1
    assert "family cross_entropy failed: ValueError: warmup: cross_entropy ran in no layout" \
        in cli.stderr
    assert "(2 family(ies), 2 worker(s))" in cli.stdout   # relu's family still ran


def test_python_api_runs_families_in_workers():
    report = nb.warmup(ops=["relu", "contiguous"], dtypes="float32", jobs=2)
    assert report["relu"]["ok"] == report["contiguous"]["ok"] == [
        ("float32", "cpu", layout) for layout in (
            "1-D", "2-D", "2-D strided", "1-D large", "2-D large strided")]
    with pytest.raises(ValueError, match="family cross_entropy: ValueError: warmup: "
                                         "cross_entropy ran in no layout"):
        nb.warmup(ops=["relu", "cross_entropy"], dtypes="float32", jobs=2)


def test_jobs_must_be_a_positive_int():
    for jobs in (0, 1.5, True):
        with pytest.raises(ValueError, match="argument 'jobs' must be an int >= 1"):
            nb.warmup(ops=["relu"], jobs=jobs)


_CLAIMING = """
import importlib, sys, time
from numba.core import event
importlib.import_module("nbops.warmup")._Claims(sys.argv[1]).install()
sys.path.insert(0, sys.argv[2])
import claimed_kernel
compiled = []
class Count(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev):
        pass
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))   # both call at once
with event.install_listener("numba:compile", Count()):
    assert claimed_kernel.f(2.0) == 90.0
print(compiled.count("f"))
"""


def test_claims_let_one_process_compile_a_kernel_and_the_other_load_it(tmp_path):
    # Two processes call one uncached kernel at the same instant. Without the
    # claim both compile it and both write its cache index (measured: 2
    # compilations); with it one compiles and the other waits, then loads.
    (tmp_path / "claimed_kernel.py").write_text(
        "import numpy as np\nfrom numba import njit\n\n@njit(cache=True)\n"
        "def f(x):\n    return (np.arange(10.0) * x).sum()\n")
    (tmp_path / "claims").mkdir()
    env = _fresh_env(tmp_path)
    start = f"{__import__('time').time() + 6:.3f}"
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIMING, str(tmp_path / "claims"),
                               str(tmp_path), start], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert sorted(int(out) for out, _ in outs) == [0, 1]
