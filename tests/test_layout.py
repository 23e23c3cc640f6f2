"""The package layout's rules: ``import nbops`` loads no kernel module, and
CUDA kernel modules import no CPU kernel module (shared pieces live in
device-neutral modules such as :mod:`nbops._codegen`)."""

import ast
import json
import pathlib
import re
import subprocess
import sys

import nbops

ROOT = pathlib.Path(nbops.__file__).parent

#: A kernel module: nbops.cpu / nbops.cuda and what is in them, and a domain
#: package's cpu*/cuda* modules (nbops.quant.cpu_gemm, nbops.sparse.cuda...).
KERNEL_MODULE = re.compile(r"^nbops\.(\w+\.)?(cpu|cuda)(_\w+)?(\.|$)")


def test_kernel_module_pattern():
    # the pattern the two tests below rely on: kernel modules, and nothing else
    for name in ("nbops.cpu", "nbops.cpu._approx", "nbops.cuda.linalg", "nbops.quant.cpu_gemm",
                 "nbops.sparse.cuda", "nbops.nn.cpu"):
        assert KERNEL_MODULE.match(name), name
    for name in ("nbops", "nbops._formulas", "nbops._codegen", "nbops.quant.linear",
                 "nbops.sparse.csr", "nbops.neuromorphic.lif"):
        assert not KERNEL_MODULE.match(name), name


def test_import_loads_no_kernel_module():
    code = ("import json, sys, nbops; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nbops'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "nbops._formulas" in loaded  # the scan sees device-neutral modules
    assert [m for m in loaded if KERNEL_MODULE.match(m)] == []


def _imports(path, text=None):
    """Absolute names of what the file ``path`` (or ``text`` as that file)
    imports, at any depth: ``from ..cpu.tensor import offsets`` gives
    ``nbops.cpu.tensor`` and ``nbops.cpu.tensor.offsets``."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    package = parts[:-1]  # the file's package, e.g. ("nbops", "cuda")
    names = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            mod = ".".join(base + tuple(filter(None, [node.module])))
            names.append(mod)
            names += [f"{mod}.{a.name}" for a in node.names]
    return names


CPU_MODULE = re.compile(r"^nbops\.(\w+\.)?cpu(_\w+)?(\.|$)")
CUDA_FILES = sorted(set(ROOT.glob("cuda/*.py")) | set(ROOT.glob("*/cuda*.py")))


def test_import_scan_sees_cpu_imports():
    # the scan below, on the import shapes it must catch (and one it must not)
    names = _imports(ROOT / "cuda" / "x.py", "from ..cpu import optim\n"
                     "from ..cpu.tensor import offsets\nfrom . import _launch\n"
                     "def f():\n    import nbops.quant.cpu_gemm\n")
    assert [n for n in names if CPU_MODULE.match(n)] == [
        "nbops.cpu", "nbops.cpu.optim", "nbops.cpu.tensor", "nbops.cpu.tensor.offsets",
        "nbops.quant.cpu_gemm"]


def test_cuda_modules_import_no_cpu_module():
    assert len(CUDA_FILES) >= 15  # nbops/cuda/*.py and the domain packages' cuda*.py
    found = {str(p.relative_to(ROOT)): [n for n in _imports(p) if CPU_MODULE.match(n)]
             for p in CUDA_FILES}
    assert {f: n for f, n in found.items() if n} == {}
