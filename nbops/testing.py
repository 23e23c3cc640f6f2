"""Checks of an operator against its declaration, for built-in and user ops.

An operator's spec (:class:`nbops._spec.OpSpec`, given to ``@operator`` or to
:func:`nbops.register_op`) declares sample calls, bad calls with the error
each must raise, tolerances and how to check its gradient. The functions
here run those declarations against a NumPy reference on a device; nbops'
own op table (``tests/test_ops.py``) is these checks over every built-in
spec, and :func:`check_op` runs them all for an operator of your own:

>>> import numpy as np, nbops, nbops.testing
>>> from nbops.testing import Elementwise, Grad
>>> double = nbops.register_op("double", cpu=lambda x: x * 2,
...                            backward=lambda ctx, g: (g * 2,),
...                            samples=Elementwise(), grad=Grad())
>>> nbops.testing.check_op(double, reference=lambda x: 2 * x, devices=("cpu",))

Each check raises ``AssertionError`` naming the op, the sample and what
differed. CUDA checks run on a GPU or in Numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``), where only samples whose arrays have at most
:data:`CUDA_MAX_SIZE` elements run (the simulator runs a Python thread per
element).
"""

import re

import numpy as np

from . import _dispatch
# what a declaration is made of, for operators of your own
from ._spec import Bad, Broadcasting, Elementwise, Grad, Sample, Shapes  # noqa: F401
from ._spec import arrays_in as _arrays, map_arrays as _map_arrays

__all__ = ["check_op", "check_forward", "check_out", "check_out_errors", "check_strided",
           "check_bad_inputs", "check_gradient", "to_device", "to_numpy", "CUDA_MAX_SIZE",
           "Sample", "Bad", "Grad", "Elementwise", "Broadcasting", "Shapes"]

#: the largest array the CUDA checks pass (one Python thread per element
#: in the simulator)
CUDA_MAX_SIZE = 128


def check_op(op, reference, devices=("cpu", "cuda")):
    """Every check of ``op`` (an :class:`nbops.Operator` or its name) whose
    spec declares what it needs, on each of ``devices`` (CUDA is skipped
    when no GPU or simulator is available). ``reference(*args, **kwargs)``
    computes the expected result in float64 from a sample's arguments
    (arrays converted to float64)."""
    op = _operator(op)
    spec = op.spec
    if spec.samples is None:
        raise ValueError(f"check_op: {spec.name} declares no samples")
    for device in devices:
        if device == "cuda" and not _dispatch.cuda_available():
            continue
        for dtype in spec.dtypes:
            check_forward(op, reference, dtype, device)
        if spec.out:
            check_out(op, reference, device)
            check_out_errors(op, reference, device)
        check_strided(op, device)
        if spec.bad is not None:
            check_bad_inputs(op, device)
    if spec.grad is not None and spec.backward is not None:
        check_gradient(op)


def check_forward(op, reference, dtype, device):
    """Every sample of ``dtype`` against ``reference``: values (within the
    spec's tolerance of the reference rounded to ``dtype``), NaN pattern,
    shape and dtype."""
    op = _operator(op)
    spec = op.spec
    if np.dtype(dtype) not in spec.dtypes:
        raise ValueError(f"check_forward: {spec.name} takes {[str(d) for d in spec.dtypes]}, "
                         f"not {np.dtype(dtype)}")
    for s in samples(op, dtype, device):
        try:
            with np.errstate(all="ignore"):
                got = op(*_moved(s.args, device), **_moved_kwargs(s.kwargs, device))
        except (OverflowError, ValueError):
            # the CUDA simulator runs kernels in Python, whose math.exp and
            # math.log raise where a GPU's give inf and NaN
            if device == "cuda" and _dispatch.cuda_simulated() and s.label == "edge":
                continue
            raise
        _compare(spec, dtype, got, expected(reference, s), f"{spec.name}[{s.label}]")


def check_out(op, reference, device):
    """``out=`` a fresh array, then each input the spec allows in place:
    the op returns ``out`` itself, holding the reference's result."""
    op = _operator(op)
    spec = op.spec
    s = main_sample(op)
    want = expected(reference, s)
    kwargs = _moved_kwargs(s.kwargs, device)
    out = to_device(np.empty(_out_part(spec, want).shape, np.float64), device)
    got = op(*_moved(s.args, device), **kwargs, out=out)
    assert _out_part(spec, got) is out, f"{spec.name}: out= was not returned"
    _compare(spec, np.float64, got, want, f"{spec.name}: out=")
    for i in spec.inplace:
        args = list(_moved(s.args, device))
        args[i] = to_device(s.args[i].copy(), device)
        got = op(*args, **kwargs, out=args[i])
        assert _out_part(spec, got) is args[i], f"{spec.name}: out=args[{i}] was not returned"
        _compare(spec, np.float64, got, want, f"{spec.name}: out=args[{i}]")


def check_out_errors(op, reference, device):
    """The ``out=`` errors every operator raises alike: wrong shape, dtype
    or device; on the CPU also not C-contiguous, read-only, and overlapping
    an input."""
    op = _operator(op)
    name = op.spec.name
    s = main_sample(op, np.float32)
    shape = _out_part(op.spec, expected(reference, s)).shape
    args, kwargs = _moved(s.args, device), _moved_kwargs(s.kwargs, device)

    def call(out, moved=args):
        return lambda: op(*moved, **kwargs, out=out)

    wrong = tuple(reversed(shape)) + (2,)
    _raises(ValueError, f"{name}: .*'out' must have shape",
            call(to_device(np.empty(wrong, np.float32), device)))
    _raises(TypeError, f"{name}: .*'out' must be float32, got float64",
            call(to_device(np.empty(shape, np.float64), device)))
    other = "cuda" if device == "cpu" else "cpu"
    if other == "cpu" or _dispatch.cuda_available():
        _raises(TypeError, f"{name}: arguments are on different devices",
                call(to_device(np.empty(shape, np.float32), other)))
    if device != "cpu":
        return
    first, inner, x = next(_array_positions(s.args), (None, None, None))
    if x is not None and x.ndim >= 2 and x.shape == shape:
        _raises(ValueError, f"{name}: .*C-contiguous",
                call(np.empty(shape[::-1], np.float32).T))
        ro = np.empty(shape, np.float32)
        ro.flags.writeable = False
        _raises(ValueError, f"{name}: .*read-only", call(ro))
        buf = np.zeros(x.size + 2, np.float32)
        view = buf[:x.size].reshape(x.shape)
        view[...] = x
        _raises(ValueError, f"{name}: .*'out' overlaps input",
                call(buf[2:].reshape(x.shape), _replaced(args, first, inner, view)))


def check_strided(op, device):
    """Each array input the spec allows (``strided``) passed as F-order,
    reversed and every-other-element views gives the contiguous call's
    result and is not modified."""
    op = _operator(op)
    spec = op.spec
    s = main_sample(op, np.float32)
    kwargs = _moved_kwargs(s.kwargs, device)
    want = to_numpy(op(*_moved(s.args, device), **kwargs))
    for i, j, a in _array_positions(s.args):
        if spec.strided is not None and i not in spec.strided:
            continue
        for view in _strided_views(a):
            before = view.copy()
            args = _replaced(s.args, i, j, view)
            got = to_numpy(op(*_moved(args, device), **kwargs))
            for (_, g), (_, w) in zip(_parts(got), _parts(want)):
                np.testing.assert_allclose(g, w, rtol=spec.tol[np.dtype(np.float32)][0],
                                           err_msg=f"{spec.name}: input {i} with strides "
                                                   f"{view.strides}")
            assert len(_parts(got)) == len(_parts(want)), f"{spec.name}: input {i} strided"
            np.testing.assert_array_equal(view, before, err_msg=f"{spec.name}: input {i} "
                                                                "was modified")


def check_bad_inputs(op, device):
    """Every bad call of the spec raises its error, with a message that
    starts with the op's name and matches the declared pattern."""
    op = _operator(op)
    spec = op.spec

    def moved(a):
        if isinstance(a, np.ndarray):
            return to_device(a, device) if a.dtype.kind in "fiub" else a
        return _moved_value(a, device)

    for b in spec.bad(np.float32):
        args = tuple(moved(a) for a in b.args)
        kwargs = {k: moved(v) for k, v in b.kwargs.items()}
        message = _raises(b.error, f"{spec.name}: ", lambda: op(*args, **kwargs))
        assert re.search(b.match, message), \
            f"{spec.name}: the error {message!r} does not match {b.match!r}"


def check_gradient(op, atol=1e-6, rtol=1e-5):
    """The autograd gradient of the main sample (float64, CPU) against
    central finite differences, for the inputs ``spec.grad.wrt``, with
    elements near the spec's kinks moved off them."""
    from .autograd import Tensor, gradcheck

    op = _operator(op)
    spec = op.spec
    s = main_sample(op)
    args = [_map_arrays(lambda a: _off_kinks(a, spec.grad.kinks), a) for a in s.args]
    # gradcheck takes a flat list of inputs: a list argument's arrays are
    # checked one by one and put back into a list for the call
    flat, where = [], []
    for i, a in enumerate(args):
        items = a if isinstance(a, (list, tuple)) else [a]
        for v in items:
            where.append(i)
            flat.append(Tensor(v, requires_grad=i in spec.grad.wrt)
                        if isinstance(v, np.ndarray) else v)

    def call(*values):
        rebuilt = [[] if isinstance(a, (list, tuple)) else None for a in args]
        for i, v in zip(where, values):
            if rebuilt[i] is None:
                rebuilt[i] = v
            else:
                rebuilt[i].append(v)
        rebuilt = [type(a)(r) if isinstance(a, tuple) else r for a, r in zip(args, rebuilt)]
        return op(*rebuilt, **s.kwargs)

    gradcheck(call, flat, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------
# Samples, references and devices


def samples(op, dtype, device):
    """The spec's samples of ``dtype`` that run on ``device``."""
    out = _operator(op).spec.samples(dtype)
    if device == "cuda":
        out = [s for s in out if all(a.size <= CUDA_MAX_SIZE for a in _arrays(s.args))]
    return out


def main_sample(op, dtype=np.float64):
    """The sample with the most elements among those small enough for CUDA:
    the one the out=, strided and gradient checks use."""
    fits = samples(op, dtype, "cuda")
    if not fits:
        raise ValueError(f"{_operator(op).spec.name}: no sample has arrays of at most "
                         f"{CUDA_MAX_SIZE} elements")
    return max(fits, key=lambda s: sum(a.size for a in _arrays(s.args)))


def expected(reference, sample):
    """``reference`` of ``sample``, its arrays (in lists too) as float64."""
    args = [_map_arrays(lambda a: np.asarray(a, np.float64), a) for a in sample.args]
    with np.errstate(all="ignore"):
        return reference(*args, **sample.kwargs)


def to_device(x, device):
    """``x`` (a NumPy array) on ``device``; a strided view stays a view of
    the same strides on CUDA."""
    if device == "cpu" or x is None:
        return x
    cuda = _dispatch.ensure_cuda()
    if x.flags.c_contiguous:
        return cuda.to_device(x)
    base = x.base if x.base is not None else x
    offset = x.__array_interface__["data"][0] - np.asarray(base).__array_interface__["data"][0]
    if x.base is None or offset < 0 or not isinstance(base, np.ndarray) \
            or not base.flags.c_contiguous:
        return cuda.to_device(np.ascontiguousarray(x))
    from . import _layout

    return _layout.strided_view(cuda.to_device(base), x.shape, x.strides, offset)


def to_numpy(y):
    """A NumPy copy of ``y`` wherever it lives (tuples and lists element by
    element; Python scalars and None pass through)."""
    if isinstance(y, dict):
        return {k: to_numpy(v) for k, v in y.items()}
    if isinstance(y, (tuple, list)):
        items = [to_numpy(v) for v in y]
        return type(y)(*items) if hasattr(y, "_fields") else type(y)(items)
    if isinstance(y, (float, int)) or y is None:
        return y
    if _movable(y):
        return y.to_host()
    return np.asarray(_dispatch.to_host(y))


def _operator(op):
    return _dispatch.get_operator(op) if isinstance(op, str) else op


def _moved(args, device):
    return tuple(_moved_value(a, device) for a in args)


def _moved_kwargs(kwargs, device):
    return {k: _moved_value(v, device) for k, v in kwargs.items()}


def _moved_value(v, device):
    """``v`` on ``device``: arrays (inside lists too), and values that move
    themselves (a QTensor's ``to_device``)."""
    if device != "cpu" and _movable(v):
        return v.to_device()
    return _map_arrays(lambda a: to_device(a, device), v)


def _movable(v):
    """A value that carries arrays and moves itself (nbops.quant.QTensor)."""
    return hasattr(v, "to_device") and hasattr(v, "to_host") and hasattr(v, "values")


def _parts(result, label=""):
    """``[(label, leaf)]`` of a result: tuples (named ones too) and dicts
    (by key) flattened, so that results of any structure compare leaf by leaf."""
    if isinstance(result, dict):
        return [p for k in sorted(result) for p in _parts(result[k], f"{label}[{k!r}]")]
    if isinstance(result, tuple):
        return [p for i, v in enumerate(result) for p in _parts(v, f"{label}[{i}]")]
    return [(label, result)]


def _out_part(spec, result):
    """The part of a result that ``out=`` receives (``spec.out_result``: an
    index of a tuple or a key of a dict)."""
    if isinstance(result, (tuple, dict)):
        return result[spec.out_result]
    return result


def _compare(spec, dtype, got, want, label):
    """``got`` (arrays of ``dtype``) against the float64 reference rounded to
    ``dtype``, so that both overflow and underflow alike."""
    rtol, atol = spec.tol[np.dtype(dtype)]
    got, want = _parts(got), _parts(want)
    assert [k for k, _ in got] == [k for k, _ in want], \
        f"{label}: results {[k for k, _ in got]}, expected {[k for k, _ in want]}"
    for (part, g), (_, w) in zip(got, want):
        lbl = label + part
        g = to_numpy(g)
        if _movable(w):
            _compare_carrier(g, w, lbl)
            continue
        if isinstance(w, np.ndarray) and w.dtype.kind in "iub":
            # integer and bool results are exact, in the reference's dtype
            assert g.dtype == w.dtype, f"{lbl}: dtype {g.dtype}, expected {w.dtype}"
            np.testing.assert_array_equal(g, w, err_msg=lbl)
            continue
        if isinstance(w, np.ndarray):
            with np.errstate(all="ignore"):
                w = w.astype(dtype).astype(np.float64)
            assert g.shape == w.shape, f"{lbl}: shape {g.shape}, expected {w.shape}"
            assert g.dtype == dtype, f"{lbl}: dtype {g.dtype}, expected {np.dtype(dtype)}"
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{lbl}: NaN")
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=lbl)


def _compare_carrier(g, w, label):
    """A value that carries arrays (a QTensor) against the reference's: the
    same type, values bit for bit, and the same other attributes."""
    assert type(g) is type(w), f"{label}: {type(g).__name__}, expected {type(w).__name__}"
    gv, wv = to_numpy(g.values), np.asarray(w.values)
    assert gv.dtype == wv.dtype and gv.shape == wv.shape, \
        f"{label}: values {gv.dtype}{gv.shape}, expected {wv.dtype}{wv.shape}"
    np.testing.assert_array_equal(gv, wv, err_msg=f"{label}: values")
    for name in getattr(type(w), "__slots__", ()):
        if name != "values":
            np.testing.assert_array_equal(np.asarray(getattr(g, name), dtype=object),
                                          np.asarray(getattr(w, name), dtype=object),
                                          err_msg=f"{label}: {name}")


def _raises(error, pattern, call):
    """The message of the ``error`` that ``call()`` raises, which must match
    ``pattern``."""
    try:
        call()
    except error as exc:
        message = str(exc)
        assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
        return message
    raise AssertionError(f"no {error.__name__} matching {pattern!r} was raised")


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


def _array_positions(args):
    """``(i, j, array)`` for each array argument ``i`` (``j`` None) and each
    array ``j`` of a list argument ``i``."""
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            yield i, None, a
        elif isinstance(a, (list, tuple)):
            for j, v in enumerate(a):
                if isinstance(v, np.ndarray):
                    yield i, j, v


def _replaced(args, i, j, value):
    """``args`` with argument ``i`` (or its element ``j``) replaced."""
    args = list(args)
    if j is None:
        args[i] = value
    else:
        items = list(args[i])
        items[j] = value
        kind = type(args[i])
        args[i] = kind(*items) if hasattr(kind, "_fields") else kind(items)
    return args


def _off_kinks(a, kinks):
    a = a.copy()
    for k in kinks:
        a[np.abs(a - k) < 1e-3] = k + 0.01
    return a
