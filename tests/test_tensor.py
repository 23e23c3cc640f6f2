"""Tensor operators (transpose/permute, cat, split, reshape, contiguous)
beyond the op table (tests/test_ops.py, driven by the specs in
nbops/tensor.py, whose NumPy references are the ``ref_*`` functions here):
shapes that leave partial tiles on either device, bitwise copies of every
dtype width, odd and broadcast strides, cat on the device and with ``out=``,
views and copies of split and reshape, the copy plans, the backward rules
on both devices, the errors of ``out=`` and mixed devices."""

import glob
import importlib
import inspect
import os
from types import SimpleNamespace

import numpy as np
import pytest

import nbops
from helpers import check_bench_case, host, to_dev
from nbops import _layout
from nbops import tensor as T
from nbops.cpu import tensor as cpu_tensor

CPU_TILE = cpu_tensor.TILE
# the tile edge CUDA uses in this process (simulator-sized without a GPU)
CUDA_TILE = 8 if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else 32


def tile(device):
    return CPU_TILE if device == "cpu" else CUDA_TILE


def rand(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check_same(got, want):
    got = host(got)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    # bitwise: data movement must not touch the bits (NaN payloads, -0.0)
    assert np.array_equal(np.ascontiguousarray(got).reshape(-1).view(np.uint8),
                          np.ascontiguousarray(want).reshape(-1).view(np.uint8))


# ---------------------------------------------------------------------------
# NumPy references of the op table (the specs name them "test_tensor:ref_*")


# (a C-order copy: np.ascontiguousarray makes 0-d arrays 1-d)
def ref_transpose(x, axes=None):
    return np.transpose(x, axes).copy(order="C")


def ref_permute(x, dims):
    return np.transpose(x, dims).copy(order="C")


def ref_cat(arrays, axis=0):
    return np.concatenate([np.asarray(a, np.float64) for a in arrays], axis=axis)


def ref_split(x, sizes_or_sections, axis=0):
    if isinstance(sizes_or_sections, int):
        return tuple(np.array_split(x, sizes_or_sections, axis=axis))
    return tuple(np.split(x, np.cumsum(sizes_or_sections)[:-1], axis=axis))


def ref_reshape(x, shape):
    return np.reshape(x, shape)


def ref_contiguous(x):
    return x.copy(order="C")


# ---------------------------------------------------------------------------
# transpose / permute


def transpose_cases(t):
    n = 3 * t + 1
    return [
        ((), None),
        ((5,), None),
        ((0,), None),
        ((n, n), None),                     # partial tiles on both axes
        ((t, 2 * t), (1, 0)),               # whole tiles only
        ((1, n), None), ((n, 1), None),
        ((0, 4), None), ((3, 0), (1, 0)),
        ((2, 5, n), (0, 2, 1)),             # batched 2-D transpose
        ((n, 3, 4), (2, 1, 0)),             # tiles with a batch axis between
        ((3, 4, 5), (1, 2, 0)), ((3, 4, 5), (2, 0, 1)), ((3, 4, 5), (1, 0, 2)),
        ((2, 3, 4, 5), (3, 1, 0, 2)), ((2, 1, 3, 4), (-1, -2, 0, 1)),
        ((2, 3, 1, 2, 3), (4, 0, 3, 1, 2)), ((2, 3, 2, 2, 3), None),
    ]


@pytest.mark.parametrize("case", range(len(transpose_cases(8))))
def test_transpose_matches_numpy(device, case):
    shape, axes = transpose_cases(tile(device))[case]
    x = rand(shape)
    got = nbops.transpose(to_dev(x, device), axes)
    check_same(got, np.transpose(x, axes))
    assert nbops.to_host(got).flags.c_contiguous


STRIDED = {
    "step": lambda a: a[::2, 1::3],
    "negative": lambda a: a[::-1, ::-2],
    "reversed-rows": lambda a: a[::-1],          # tiles with a negative row stride
    "transposed": lambda a: a.T,
    "column": lambda a: a[:, 5],
    "offset-block": lambda a: a[3:, 2:-1],
}


@pytest.mark.parametrize("view", sorted(STRIDED))
def test_transpose_strided_input(device, view):
    t = tile(device)
    x = STRIDED[view](rand((3 * t + 1, 2 * t + 3)))
    check_same(nbops.transpose(to_dev(x, device)), np.ascontiguousarray(x.T))


def test_transpose_broadcast_input():
    x = np.broadcast_to(np.arange(5.0), (4, 5))
    check_same(nbops.transpose(x), np.ascontiguousarray(x.T))
    check_same(nbops.contiguous(x), np.ascontiguousarray(x))


def test_transpose_odd_strides():
    # strides that are not a multiple of the itemsize: the copy moves bytes
    rec = np.zeros((6, 7), dtype=[("a", np.int8), ("f", np.float32)])
    rec["f"] = rand((6, 7))
    x = rec["f"]
    assert x.strides[1] % 4
    check_same(nbops.transpose(x), np.ascontiguousarray(x.T))
    check_same(nbops.contiguous(x), np.ascontiguousarray(x))


@pytest.mark.parametrize("dtype", [d.name for d in T.DTYPES])
def test_every_dtype(device, dtype):
    t = tile(device)
    x = rand((2 * t + 1, t + 2), dtype)
    if dtype.startswith("float"):
        x.flat[:3] = [np.nan, -0.0, np.inf]
    check_same(nbops.transpose(to_dev(x, device)), np.ascontiguousarray(x.T))
    v = x[::-1, ::2]
    check_same(nbops.contiguous(to_dev(v, device)), np.ascontiguousarray(v))


def test_transpose_returns_new_array():
    x = np.arange(4.0)
    y = nbops.transpose(x)
    assert y is not x and not np.shares_memory(x, y)


# ---------------------------------------------------------------------------
# The copy plans: the fast loop shapes are the ones actually taken


@pytest.mark.parametrize("shape, axes, axis, merged", [
    ((64, 32), (1, 0), 0, (32, 64)),
    ((4, 6, 8), (0, 2, 1), 1, (4, 8, 6)),        # batched
    ((4, 6, 8), (2, 0, 1), 0, (8, 24)),          # (6, 8) merge into one axis
    ((4, 6, 8), (1, 0, 2), -1, (6, 4, 8)),       # rows stay contiguous
    ((4, 6, 8), (0, 1, 2), -1, (192,)),          # one flat run
])
def test_plan(shape, axes, axis, merged):
    x = np.empty(shape, np.float32)
    out_shape = tuple(shape[a] for a in axes)
    plan, word = T.plan_copy(out_shape, np.empty(out_shape, np.float32).strides,
                             [x.strides[a] for a in axes], 4)
    assert (plan.axis, plan.shape, word) == (axis, merged, 4)


def test_plan_words_for_wide_or_odd_elements():
    plan, word = T.plan_copy((3, 4), (64, 16), (16, 48), 16)     # complex128
    assert word == 8 and plan.shape == (3, 4, 2)
    plan, word = T.plan_copy((3, 4), (16, 4), (4, 13), 4)        # packed record field
    assert word == 1 and plan.shape == (3, 4, 4)


# ---------------------------------------------------------------------------
# cat / split


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_cat(device, axis):
    t = tile(device)
    base = rand((3, 2 * t + 1, t + 3), seed=1)
    shapes = [(3, 2 * t + 1, t + 3)]
    ax = axis % 3
    for n in (1, 0, t + 1):
        s = list(shapes[0])
        s[ax] = n
        shapes.append(tuple(s))
    arrays = [rand(s, seed=i) for i, s in enumerate(shapes)]
    arrays[0] = base[:, ::-1, :]                    # a strided input among them
    got = nbops.cat([to_dev(a, device) for a in arrays], axis=axis)
    check_same(got, np.concatenate(arrays, axis=axis))


def test_cat_one_array_and_out(device):
    x = rand((4, 5))
    check_same(nbops.cat((to_dev(x, device),)), x)
    out = to_dev(np.zeros((4, 10), np.float32), device)
    assert nbops.cat([to_dev(x, device), to_dev(x.T.T, device)], axis=1, out=out) is out
    check_same(out, np.concatenate([x, x], axis=1))


def test_split_returns_views(device):
    x = rand((6, 4))
    xd = to_dev(x, device)
    a, b = nbops.split(xd, [2, 4], axis=0)
    c, d = nbops.split(xd, 2, axis=1)
    assert all(_layout.overlaps(p, xd) for p in (a, b, c, d))
    assert not _layout.overlaps(a, b)
    # views see writes made through the parent
    check_same(nbops.contiguous(d), np.ascontiguousarray(x[:, 2:]))


# ---------------------------------------------------------------------------
# reshape / contiguous


RESHAPES = [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), 24), ((2, 3, 4), (4, -1, 2)),
            ((24,), (2, 1, 3, 1, 4)), ((1,), ()), ((), (1, 1)), ((0, 3), (3, 0)),
            ((0, 3), (0,)), ((2, 3), [3, 2])]


@pytest.mark.parametrize("shape, new", RESHAPES)
def test_reshape_contiguous_input_is_a_view(device, shape, new):
    x = rand(shape)
    xd = to_dev(x, device)
    got = nbops.reshape(xd, new)
    check_same(got, x.reshape(new))
    if device == "cpu" and x.size:
        assert np.shares_memory(got, x)


@pytest.mark.parametrize("view, new, is_view", [
    (lambda a: a[:, ::2], (4, 2, 3), True),      # splitting a strided axis: a view
    (lambda a: a[::2], (2, 3, 4), True),         # a step on axis 0, rows split
    (lambda a: a[::2], (-1,), False),            # rows no longer adjacent
    (lambda a: a.T, (-1,), False),               # needs a copy
    (lambda a: a[::-1], (2, 2, 12), True),
    (lambda a: a[:, :5], (2, 10), False),
])
def test_reshape_strided_input(device, view, new, is_view):
    x = view(rand((4, 12)))
    xd = to_dev(x, device)
    got = nbops.reshape(xd, new)
    check_same(got, x.reshape(new))
    if device == "cpu":
        assert np.shares_memory(got, x) == is_view
        assert is_view or got.flags.c_contiguous


def test_view_strides_rule():
    # PyTorch's rule: a view needs each contiguous group of old axes to map
    # onto whole new axes
    assert T.view_strides((4, 6), (48, 4), (4, 2, 3), 4) == (48, 12, 4)
    assert T.view_strides((4, 6), (4, 16), (24,), 4) is None
    assert T.view_strides((2, 1, 3), (12, 99, 4), (6,), 4) == (4,)


def test_contiguous(device):
    x = rand((5, 6))
    xd = to_dev(x, device)
    assert nbops.contiguous(xd) is xd
    for v in (x[::2], x[:, ::-1], x.T, x[1:4, 2:5]):
        got = nbops.contiguous(to_dev(v, device))
        check_same(got, np.ascontiguousarray(v))
        assert nbops.to_host(got).flags.c_contiguous


def test_contiguous_readonly_input():
    x = rand((4, 6))[:, ::2]
    x.flags.writeable = False
    check_same(nbops.contiguous(x), np.ascontiguousarray(x))
    check_same(nbops.transpose(x), np.ascontiguousarray(x.T))


def test_large_flat_and_chunked_rows():
    # more elements than one work item takes, in one run and in few rows
    x = rand((3, 70001))
    check_same(nbops.contiguous(x[:, ::-1]), np.ascontiguousarray(x[:, ::-1]))
    check_same(nbops.cat([x[0], x[1]]), np.concatenate([x[0], x[1]]))


# ---------------------------------------------------------------------------
# Backward rules


def ctx_of(op, *args, **kwargs):
    bound = inspect.signature(op.front).bind(*args, **kwargs)
    bound.apply_defaults()
    return SimpleNamespace(inputs=tuple(bound.arguments.values()), kwargs=dict(bound.arguments),
                           output=op(*args, **kwargs))


@pytest.mark.parametrize("axes", [None, (2, 0, 1), (1, 2, 0), (-1, 0, 1)])
def test_transpose_and_permute_backward(device, axes):
    x = rand((2, 3, 4))
    y_shape = np.transpose(x, axes).shape
    g = rand(y_shape, seed=3)
    gx, *rest = nbops.transpose.backward(ctx_of(nbops.transpose, to_dev(x, device), axes),
                                         to_dev(g, device))
    assert rest == [None, None]
    check_same(gx, np.transpose(g, np.argsort(np.array(axes if axes else (2, 1, 0)) % 3)))
    if axes is not None:
        gp, *_ = nbops.permute.backward(ctx_of(nbops.permute, to_dev(x, device), axes),
                                        to_dev(g, device))
        check_same(gp, host(gx))


def test_cat_backward(device):
    parts = [rand((2, n)) for n in (3, 0, 4)]
    g = rand((2, 7), seed=5)
    grads, axis_grad, out_grad = nbops.cat.backward(
        ctx_of(nbops.cat, [to_dev(p, device) for p in parts], axis=-1), to_dev(g, device))
    assert axis_grad is None and out_grad is None
    for got, want in zip(grads, np.split(g, [3, 3], axis=1)):
        check_same(got, want)


def test_split_backward(device):
    x = rand((7, 3))
    ctx = ctx_of(nbops.split, to_dev(x, device), [2, 4, 1])
    g0, g2 = rand((2, 3), seed=1), rand((1, 3), seed=2)
    gx, *rest = nbops.split.backward(ctx, to_dev(g0, device), None, to_dev(g2, device))
    assert rest == [None, None]
    check_same(gx, np.concatenate([g0, np.zeros((4, 3), np.float32), g2]))


def test_reshape_and_contiguous_backward(device):
    x = rand((3, 4)).T
    g = rand((2, 6), seed=4)
    gx, none = nbops.reshape.backward(ctx_of(nbops.reshape, to_dev(x, device), (2, 6)),
                                      to_dev(g, device))
    assert none is None
    check_same(gx, g.reshape(4, 3))
    gd = to_dev(g, device)
    assert nbops.contiguous.backward(ctx_of(nbops.contiguous, to_dev(x, device)), gd) == (gd,)


# ---------------------------------------------------------------------------
# Errors


def _bad_cases():
    # cat's out= (the op table checks transpose's and permute's)
    x = rand((2, 3))
    return [
        (lambda: nbops.cat([x, x], out=np.empty((4, 4), np.float32)), ValueError,
         r"cat: .*'out' must have shape \(4, 3\)"),
        (lambda: nbops.cat([x, x], out=np.empty((4, 3))), TypeError,
         "cat: .*'out' must be float32"),
        (lambda: nbops.cat([x[:1], x[1:]], out=x), ValueError, "cat: .*overlaps input"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_errors(case):
    call, exc, match = _bad_cases()[case]
    with pytest.raises(exc, match=match):
        call()


def test_operators_carry_docs():
    for name in T.__all__:
        op = getattr(nbops, name)
        assert isinstance(op, nbops.Operator) and op.__name__ == name
        assert "Example" in op.__doc__ and "Raises" in op.__doc__, name
        assert op.backward is not None, name


def test_mixed_devices():
    x = rand((2, 3))
    d = to_dev(x, "cuda")
    with pytest.raises(TypeError, match=r"cat: arguments are on different devices.*arrays\[1\]"):
        nbops.cat([x, d])
    with pytest.raises(TypeError, match="different devices"):
        nbops.transpose(x, out=to_dev(np.empty((3, 2), np.float32), "cuda"))
    with pytest.raises(TypeError, match="different devices"):
        nbops.cat([d, d], out=np.empty((4, 3), np.float32))


def test_device_out_errors():
    d = to_dev(rand((2, 3)), "cuda")
    with pytest.raises(ValueError, match="'out' must have shape"):
        nbops.transpose(d, out=to_dev(np.empty((2, 3), np.float32), "cuda"))
    with pytest.raises(ValueError, match="overlaps"):
        nbops.cat(nbops.split(d, 2), out=d)


def test_inputs_untouched(device):
    x = rand((5, 4))
    xd = to_dev(x, device)
    nbops.transpose(xd)
    nbops.cat([xd, xd])
    nbops.contiguous(to_dev(x[::2], device))
    check_same(xd, x)


# ---------------------------------------------------------------------------
# The mirror rule: every CPU kernel module with a CUDA twin offers the same
# launchers


def _mirrored_modules():
    root = os.path.dirname(nbops.__file__)
    names = []
    for path in sorted(glob.glob(os.path.join(root, "cpu", "*.py"))):
        name = os.path.basename(path)[:-3]
        if name != "__init__" and os.path.exists(os.path.join(root, "cuda", name + ".py")):
            names.append(name)
    return names


def test_tensor_is_mirrored():
    assert "tensor" in _mirrored_modules()


@pytest.mark.parametrize("name", _mirrored_modules())
def test_cpu_and_cuda_modules_offer_the_same_names(name):
    cpu = importlib.import_module(f"nbops.cpu.{name}")
    cuda = importlib.import_module(f"nbops.cuda.{name}")
    assert set(cpu.__all__) - set(getattr(cpu, "CPU_ONLY", ())) == set(cuda.__all__)
    for n in cuda.__all__:
        assert callable(getattr(cpu, n)) and callable(getattr(cuda, n))


@pytest.mark.parametrize("name", ["transpose", "cat", "contiguous"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bench_cases(device, name, dtype):
    check_bench_case(name, dtype, device, "tensor")


def test_small_copies_run_serially_and_restore_threads():
    threads = nbops.get_num_threads()
    small = rand((8, 8))
    assert small.nbytes < cpu_tensor.SERIAL_BYTES
    check_same(nbops.transpose(small), np.ascontiguousarray(small.T))
    assert nbops.get_num_threads() == threads
