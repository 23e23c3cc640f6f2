"""nbops.warmup and ``python -m nbops warmup``: kernels land in the disk cache
so that a later process loads instead of compiling; bad requests are refused."""

import os
import subprocess
import sys

import numpy as np
import pytest

import nbops as nb

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
