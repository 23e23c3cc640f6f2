"""The registry, device resolution, user-defined operators, debug mode and
the runtime settings."""

import importlib
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import nbops
from nbops import _dispatch
from helpers import host, to_dev


def test_import_compiles_nothing_and_loads_no_kernels():
    code = ("import sys, time; t = time.perf_counter(); import nbops; "
            "dt = time.perf_counter() - t; "
            "mods = [m for m in sys.modules if m.startswith(('nbops.cpu.activations', "
            "'nbops.cuda', 'numba.cuda'))]; print(dt, mods)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    dt, mods = out.stdout.split(" ", 1)
    assert mods.strip() == "[]", mods
    assert float(dt) < 3.0  # import of numba itself included; nbops' own part is ms


def test_device_of_arrays():
    assert _dispatch.resolve_device("op", x=np.ones(2)) == "cpu"
    assert _dispatch.resolve_device("op", x=None) == "cpu"
    d = nbops.to_device(np.ones(2))
    assert _dispatch.resolve_device("op", x=d, out=None) == "cuda"
    with pytest.raises(TypeError, match=r"op: arguments are on different devices \(a, c on "
                                        r"cpu; b on cuda\)"):
        _dispatch.resolve_device("op", a=np.ones(1), b=d, c=np.ones(1))


def test_cuda_array_interface_objects_are_device_arrays():
    class Foreign:  # what CuPy or torch.cuda tensors look like to nbops
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    assert _dispatch.is_device_array(Foreign())
    assert not _dispatch.is_device_array(np.ones(1))
    assert _dispatch.device_of_array([1, 2]) is None


def test_to_device_and_back():
    x = np.arange(6.0).reshape(2, 3)
    d = nbops.to_device(x)
    assert _dispatch.is_device_array(d)
    assert nbops.to_device(d) is d
    np.testing.assert_array_equal(nbops.to_host(d), x)
    assert nbops.to_host(x) is x
    with pytest.raises(TypeError, match="to_device: expected a numpy.ndarray, got list"):
        nbops.to_device([1.0])
    with pytest.raises(TypeError, match="to_host: expected an array, got str"):
        nbops.to_host("x")


def test_cuda_available_under_simulator():
    assert nbops.cuda_available()


def test_user_operator_dispatch(device):
    calls = []

    def cpu(x, scale=2.0):
        calls.append("cpu")
        return x * scale

    def cuda(x, scale=2.0):
        calls.append("cuda")
        return nbops.to_device(nbops.to_host(x) * scale)

    op = nbops.register_op("test_scale", cpu=cpu, cuda=cuda,
                           backward=lambda ctx, g: (g * ctx.kwargs["scale"],))
    assert "test_scale" in nbops.registered_ops()
    assert nbops.get_operator("test_scale") is op
    y = op(to_dev(np.ones(3), device), scale=3.0)
    assert calls == [device]
    np.testing.assert_array_equal(host(y), 3.0)
    with pytest.raises(TypeError, match="test_scale: arguments are on different devices"):
        op(np.ones(2), scale=nbops.to_device(np.ones(2)))


def test_user_operator_without_cuda_kernel():
    op = nbops.register_op("test_cpu_only", cpu=lambda x: x + 1)
    with pytest.raises(NotImplementedError, match="test_cpu_only: no kernel registered for "
                                                  "device 'cuda'"):
        op(nbops.to_device(np.ones(2)))


def test_register_op_errors():
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        nbops.register_op("", cpu=lambda x: x)
    with pytest.raises(TypeError, match="cpu must be callable"):
        nbops.register_op("test_bad", cpu=None)
    with pytest.raises(ValueError, match="'relu' is a built-in"):
        nbops.register_op("relu", cpu=lambda x: x)
    with pytest.raises(ValueError, match="device must be one of"):
        _dispatch.register_kernel("x", "tpu", lambda: None)
    with pytest.raises(KeyError, match="no operator named 'nope'"):
        nbops.get_operator("nope")


def test_cuda_kernels_load_lazily():
    code = ("import numpy as np, sys, nbops; nbops.relu(np.ones(3)); "
            "print('numba.cuda' in sys.modules, 'nbops.cuda.activations' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_debug_mode_names_the_op(caplog):
    bad = nbops.register_op("test_makes_inf", cpu=lambda x: np.log(x * 0))
    nbops.set_debug(True)
    try:
        assert nbops.get_debug()
        with caplog.at_level(logging.DEBUG, logger="nbops"):
            nbops.relu(np.array([-1.0, 2.0]))
        assert "relu: inputs float64[2] range [-1, 2]" in caplog.text
        with pytest.raises(FloatingPointError, match=r"test_makes_inf: output 0 has Inf at "
                                                     r"index \(1,\)"):
            with np.errstate(divide="ignore"):
                bad(np.array([np.nan, 1.0]) * 0 + np.array([0.0, 1.0]))
        # NaN already in the input is not the op's fault
        nbops.relu(np.array([np.nan]))
    finally:
        nbops.set_debug(False)
    assert not _dispatch._Hooks.active


def test_debug_mode_from_environment():
    code = "import nbops; print(nbops.get_debug())"
    env = dict(os.environ, NBOPS_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == "True"


def test_threads():
    n = nbops.get_num_threads()
    try:
        nbops.set_num_threads(1)
        assert nbops.get_num_threads() == 1
        np.testing.assert_array_equal(nbops.relu(np.array([-1.0, 1.0])), [0.0, 1.0])
    finally:
        nbops.set_num_threads(n)
    for bad in (0, -1, 10**6, 1.5, True):
        with pytest.raises(ValueError, match="set_num_threads: n must be an int"):
            nbops.set_num_threads(bad)


def test_operators_carry_docs_and_names():
    for name in nbops.activations.__all__:
        op = getattr(nbops, name)
        assert isinstance(op, nbops.Operator)
        assert op.__name__ == name
        doc = op.__doc__ or ""
        assert "Example" in doc and ("Raises" in doc or "Raise" in doc), name


def test_kernel_modules_are_not_imported_by_public_modules():
    """The mirror rule: public modules name their kernels, never import them."""
    import nbops.activations as public

    src = importlib.util.find_spec(public.__name__).origin
    text = open(src).read()
    assert "from .cpu" not in text and "from .cuda" not in text


def test_checked_cache_keys_tell_types_apart_and_never_store_errors():
    from nbops import _checks

    cache = _checks.CheckedCache(size=2)
    calls = []

    def check(v):
        calls.append(v)
        if isinstance(v, bool):
            raise TypeError("bool")
        return v * 2

    assert cache.get(_checks.typed_key(1), lambda: check(1)) == 2
    assert cache.get(_checks.typed_key(1), lambda: check(1)) == 2   # remembered
    with pytest.raises(TypeError):                                  # True is not 1
        cache.get(_checks.typed_key(True), lambda: check(True))
    with pytest.raises(TypeError):                                  # and is not stored
        cache.get(_checks.typed_key(True), lambda: check(True))
    assert cache.get(_checks.typed_key((1, 2)), lambda: check(3)) == 6
    assert cache.get(_checks.typed_key((1, True)), lambda: check(4)) == 8
    assert cache.get(_checks.typed_key([1]), lambda: check(5)) == 10  # unhashable: each time
    assert cache.get(_checks.typed_key([1]), lambda: check(5)) == 10
    assert calls == [1, True, True, 3, 4, 5, 5]
    assert len(cache.results) <= 2
