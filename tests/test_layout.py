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
