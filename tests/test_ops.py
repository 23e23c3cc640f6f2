"""The op table: every operator whose spec (nbops/_spec.py) declares samples,
run through the same few tests on both devices.

* forward vs its NumPy reference (``reference.py``, found by the spec's
  reference name): values, NaN pattern, shape and dtype, every sample;
* ``out=``: a fresh output, and each input the spec allows in place;
* the ``out=`` errors every op shares (shape, dtype, device, overlap,
  layout, read-only);
* strided inputs (F order, negative and sliced views) give the contiguous
  result, and are not modified;
* every bad input of the spec raises its error, naming the op;
* the gradient through autograd against central differences (float64).

Hand-written tests remain in each family's file only for what a table row
cannot say: accuracy sweeps, streaming paths, special-value contracts that
differ from the reference's formula.
"""

import importlib

import numpy as np
import pytest

import nbops
from nbops import _dispatch, _spec
from nbops.autograd import Tensor, gradcheck
import reference as ref
from helpers import host, to_dev

SPECS = [s for s in _dispatch.specs().values() if s.samples is not None]
IDS = [s.name for s in SPECS]
#: the CUDA simulator runs one Python thread per element: small samples only
CUDA_MAX_SIZE = 128


def _op(spec):
    return _dispatch.get_operator(spec.name)


def _reference_fn(spec):
    """``reference.py``'s function of the spec's reference name, or, for a
    ``"test_module:attr"`` name, that test module's (a family's own file)."""
    name = spec.reference_name
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)
    return getattr(ref, name)


def _reference(spec, sample):
    fn = _reference_fn(spec)
    args = [np.asarray(a, np.float64) if isinstance(a, np.ndarray) else a for a in sample.args]
    with np.errstate(all="ignore"):
        return fn(*args, **sample.kwargs)


def _samples(spec, dtype, device):
    out = spec.samples(dtype)
    if device == "cuda":
        out = [s for s in out if all(a.size <= CUDA_MAX_SIZE for a in _arrays(s.args))]
    return out


def _arrays(args):
    return [a for a in args if isinstance(a, np.ndarray)]


def _dev_args(args, device):
    return tuple(to_dev(a, device) if isinstance(a, np.ndarray) else a for a in args)


def _dev_kwargs(kwargs, device):
    return {k: to_dev(v, device) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


def _parts(result):
    return result if isinstance(result, tuple) else (result,)


def _check(spec, dtype, got, want, label):
    """``got`` (arrays of ``dtype``) against the float64 reference rounded to
    ``dtype`` (so that both overflow and underflow alike)."""
    rtol, atol = spec.tol[np.dtype(dtype)]
    for g, w in zip(_parts(got), _parts(want)):
        g = host(g)
        if isinstance(w, np.ndarray):
            with np.errstate(all="ignore"):
                w = w.astype(dtype).astype(np.float64)
            assert g.shape == w.shape, label
            assert g.dtype == dtype, label
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"NaN, {label}")
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=label)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_forward_matches_reference(spec, dtype, device):
    op = _op(spec)
    for s in _samples(spec, dtype, device):
        try:
            with np.errstate(all="ignore"):
                got = op(*_dev_args(s.args, device), **_dev_kwargs(s.kwargs, device))
        except (OverflowError, ValueError):
            # the CUDA simulator runs kernels in Python, whose math.exp and
            # math.log raise where a GPU's give inf and NaN
            if device == "cuda" and nbops._dispatch.cuda_simulated() and s.label == "edge":
                continue
            raise
        _check(spec, dtype, got, _reference(spec, s), f"{spec.name}{s.label}")


def _main_sample(spec, dtype=np.float64):
    """The sample with the most elements among those small enough for CUDA."""
    fits = [s for s in spec.samples(dtype)
            if all(a.size <= CUDA_MAX_SIZE for a in _arrays(s.args))]
    return max(fits, key=lambda s: sum(a.size for a in _arrays(s.args)))


@pytest.mark.parametrize("spec", [s for s in SPECS if s.out], ids=[s.name for s in SPECS if s.out])
def test_out_and_inplace(spec, device):
    op, s = _op(spec), _main_sample(spec)
    want = _reference(spec, s)
    first = _parts(want)[0]
    out = to_dev(np.empty(first.shape, np.float64), device)
    got = op(*_dev_args(s.args, device), **_dev_kwargs(s.kwargs, device), out=out)
    assert _parts(got)[0] is out
    _check(spec, np.float64, got, want, "out=")
    for i in spec.inplace:
        args = list(_dev_args(s.args, device))
        args[i] = to_dev(s.args[i].copy(), device)
        got = op(*args, **_dev_kwargs(s.kwargs, device), out=args[i])
        assert _parts(got)[0] is args[i]
        _check(spec, np.float64, got, want, f"out=args[{i}]")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.out], ids=[s.name for s in SPECS if s.out])
def test_out_errors(spec, device):
    op, s = _op(spec), _main_sample(spec, np.float32)
    args = _dev_args(s.args, device)
    shape = _parts(_reference(spec, s))[0].shape
    s = _spec.Sample(s.args, _dev_kwargs(s.kwargs, device), s.label)
    name = spec.name
    wrong = tuple(reversed(shape)) + (2,)
    with pytest.raises(ValueError, match=f"{name}: .*'out' must have shape"):
        op(*args, **s.kwargs, out=to_dev(np.empty(wrong, np.float32), device))
    with pytest.raises(TypeError, match=f"{name}: .*'out' must be float32, got float64"):
        op(*args, **s.kwargs, out=to_dev(np.empty(shape, np.float64), device))
    other = "cuda" if device == "cpu" else "cpu"
    with pytest.raises(TypeError, match=f"{name}: arguments are on different devices"):
        op(*args, **s.kwargs, out=to_dev(np.empty(shape, np.float32), other))
    if device != "cpu":
        return
    first = next(i for i, a in enumerate(s.args) if isinstance(a, np.ndarray))
    x = s.args[first]
    if x.ndim >= 2 and x.shape == shape:
        bad = np.empty(shape[::-1], np.float32).T
        with pytest.raises(ValueError, match=f"{name}: .*C-contiguous"):
            op(*args, **s.kwargs, out=bad)
        ro = np.empty(shape, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match=f"{name}: .*read-only"):
            op(*args, **s.kwargs, out=ro)
        buf = np.zeros(x.size + 2, np.float32)
        view = buf[:x.size].reshape(x.shape)
        view[...] = x
        moved = list(args)
        moved[first] = view
        with pytest.raises(ValueError, match=f"{name}: .*'out' overlaps input"):
            op(*moved, **s.kwargs, out=buf[2:].reshape(x.shape))


def _strided_views(a):
    """Views of ``a``'s values that are not C-contiguous: F order, reversed,
    and every other element of a larger array."""
    if a.ndim == 0 or a.size < 2:
        return []
    f = np.asfortranarray(a)
    rev = np.ascontiguousarray(a[::-1])[::-1]
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    return [f, rev, wide[..., ::2]]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_strided_inputs(spec, device):
    op, s = _op(spec), _main_sample(spec, np.float32)
    kwargs = _dev_kwargs(s.kwargs, device)
    want = host(op(*_dev_args(s.args, device), **kwargs))
    for i, a in enumerate(s.args):
        if not isinstance(a, np.ndarray) or spec.strided is not None and i not in spec.strided:
            continue
        for view in _strided_views(a):
            before = view.copy()
            args = list(s.args)
            args[i] = view
            got = op(*_dev_args(args, device), **kwargs)
            for g, w in zip(_parts(host(got)), _parts(want)):
                np.testing.assert_allclose(g, w, rtol=spec.tol[np.dtype(np.float32)][0],
                                           err_msg=f"input {i} as {view.strides}")
            np.testing.assert_array_equal(view, before, err_msg="input modified")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.bad], ids=[s.name for s in SPECS if s.bad])
def test_bad_inputs(spec, device):
    op = _op(spec)

    def moved(a):
        return to_dev(a, device) if isinstance(a, np.ndarray) and a.dtype.kind in "fiub" else a

    for b in spec.bad(np.float32):
        args = tuple(moved(a) for a in b.args)
        kwargs = {k: moved(v) for k, v in b.kwargs.items()}
        with pytest.raises(b.error, match=f"{spec.name}: ") as info:
            op(*args, **kwargs)
        assert info.match(b.match)


def _off_kinks(a, kinks):
    a = a.copy()
    for k in kinks:
        a[np.abs(a - k) < 1e-3] = k + 0.01
    return a


GRAD = [s for s in SPECS if s.grad is not None and s.backward is not None]


@pytest.mark.parametrize("spec", GRAD, ids=[s.name for s in GRAD])
def test_gradient(spec):
    op, s = _op(spec), _main_sample(spec)
    args = [_off_kinks(a, spec.grad.kinks) if isinstance(a, np.ndarray) else a
            for a in s.args]
    inputs = [Tensor(a, requires_grad=i in spec.grad.wrt) if isinstance(a, np.ndarray) else a
              for i, a in enumerate(args)]
    assert gradcheck(lambda *t: op(*t, **s.kwargs), inputs, atol=1e-6, rtol=1e-5)


def test_every_operator_is_declared():
    """Every public operator has a spec with a family, samples and bad inputs
    (kernels unless it composes other operators), except the families still
    declared by their own test tables."""
    pending = {"tensor", "conv", "pooling",
               "fusion", "nn", "optim", "quant", "sparse", "neuromorphic",
               "warmup", "autograd"}
    for name, spec in _dispatch.specs().items():
        if spec.family is None:
            module = _dispatch.get_operator(name).__module__.split(".")
            assert module[1] in pending or module[-1] in pending, name
        else:
            assert spec.samples is not None and spec.bad is not None, name
