"""Fuzzing every public operator from the table in tests/fuzz_table.py.

Each case is one call with drawn shapes (0 and 1 included), parameters
(inside and, now and then, outside their ranges), dtypes (supported or
not), layouts (F order, negative, sliced and zero strides, non-native byte
order, NumPy scalars for 0-d inputs), special values and ``out=`` arrays
(fresh, F order, aliasing or overlapping an input, the wrong dtype or byte
order, read-only). A valid call must match the NumPy reference, leave its
inputs alone and return native arrays; an invalid one must raise TypeError
or ValueError naming the operator. Nothing else may happen.

CPU only: the CUDA simulator runs kernels in Python, far too slowly for
this many cases (the CUDA paths share these fronts and checks).

The CI profile runs a fixed set of cases per operator (hypothesis
derandomized); ``pytest --fuzz-long tests/test_fuzz.py`` runs many more,
freshly random, for a nightly run. ``NBOPS_FUZZ_COUNTS=path.json`` writes
the number of cases per family.
"""

import collections
import contextlib
import json
import os
import resource
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbops
from fuzz_table import FAMILIES, TABLE, Draw

#: cases per operator: in CI, and with --fuzz-long
CI_EXAMPLES = 100
LONG_EXAMPLES = 400
#: address space a row may add to the process (bytes; see memory_budget)
MEMORY_BUDGET = int(os.environ.get("NBOPS_FUZZ_MEMORY", 4 << 30))

COUNTS = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    yield
    path = os.environ.get("NBOPS_FUZZ_COUNTS")
    if path:
        with open(path, "w") as f:
            json.dump({k: dict(v) for k, v in sorted(COUNTS.items())}, f, indent=1)


def _arrays(value):
    """The NumPy arrays among an argument (a list of arrays included)."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for a in value if isinstance(a, np.ndarray)]
    return []


LAYOUTS = ("c", "c", "c", "f", "neg", "slice", "bcast", "swap", "readonly")


def _layout(d, a, kind):
    """``a`` (or a view holding other values: the reference sees what the
    op sees) with the layout ``kind``."""
    if a.ndim == 0:
        return a[()] if kind in ("swap", "bcast") else a   # a NumPy scalar
    if kind == "f":
        return np.asfortranarray(a)
    if kind == "neg":
        ax = d.int(0, a.ndim - 1)
        return np.flip(np.flip(a, ax).copy(), ax)
    if kind == "slice":
        ax = d.int(0, a.ndim - 1)
        shape = list(a.shape)
        shape[ax] *= 2
        big = np.zeros(shape, a.dtype)
        idx = [slice(None)] * a.ndim
        idx[ax] = slice(None, None, 2)
        big[tuple(idx)] = a
        return big[tuple(idx)]
    if kind == "bcast":
        ax = d.int(0, a.ndim - 1)
        return np.broadcast_to(np.take(a, [0], axis=ax) if a.shape[ax] else a, a.shape)
    if kind == "swap":
        return a.astype(a.dtype.newbyteorder("S"))
    if kind == "readonly":
        a = a.copy()
        a.flags.writeable = False
        return a
    return a


def _vary(d, case, row):
    """Apply drawn layouts to the case's arrays (not those the row fixes)."""
    for i, v in enumerate(case.args):
        if i in case.fixed:
            continue
        if isinstance(v, np.ndarray):
            case.args[i] = _layout(d, v, d.choice(LAYOUTS))
        elif isinstance(v, list) and v and all(isinstance(a, np.ndarray) for a in v):
            case.args[i] = [_layout(d, a, d.choice(LAYOUTS)) for a in v]
    for k, v in case.kwargs.items():
        if isinstance(v, np.ndarray) and not k.startswith("_"):
            case.kwargs[k] = _layout(d, v, d.choice(LAYOUTS))


def _out(d, row, case, want, dtype):
    """An ``out=`` array (or None), and whether the call stays valid."""
    if not row.out or isinstance(want, tuple) or not isinstance(want, np.ndarray):
        return None, True
    mode = d.choice(["none", "none", "fresh", "fortran", "alias", "overlap", "dtype",
                     "swapped", "readonly"])
    shape = want.shape
    # a fill the op must overwrite (integer outputs: matmul_integer's int32)
    fill = np.nan if dtype.kind == "f" else 0x5A
    if mode == "fresh":
        return np.full(shape, fill, dtype), True
    if mode == "fortran":
        o = np.full(shape, fill, dtype, order="F")
        return o, o.flags.c_contiguous
    if mode == "dtype":
        return np.empty(shape, np.float32 if dtype == np.float64 else np.float64), False
    if mode == "swapped":   # one-byte dtypes have no byte order: valid then
        return np.empty(shape, dtype.newbyteorder("S")), dtype.itemsize == 1
    if mode == "readonly":
        o = np.empty(shape, dtype)
        o.flags.writeable = False
        return o, False
    if mode == "alias" and row.inplace:
        i = d.choice(row.inplace)
        a = case.args[i] if i < len(case.args) else None
        if not isinstance(a, np.ndarray):
            return None, True
        ok = (a.flags.c_contiguous and a.flags.writeable and a.dtype == dtype
              and a.shape == shape)
        # an input that is also the output: a broadcast operand may not be
        # (it overlaps a larger output only partly)
        return a, ok
    if mode == "overlap" and isinstance(case.args[0], np.ndarray) \
            and case.args[0].size >= 2 and case.args[0].dtype == dtype and want.size >= 1:
        a = case.args[0]
        base = np.empty(a.size + want.size + 1, dtype)
        moved = base[want.size - 1: want.size - 1 + a.size].reshape(a.shape)
        moved[...] = a
        case.args[0] = moved
        return base[:want.size].reshape(shape), False
    return None, True


def _close(got, want, scale, rtol, dtype, name):
    python_scalar = isinstance(got, (float, int))
    got = np.asarray(got if python_scalar else nbops.to_host(got))
    assert got.shape == want.shape, f"{name}: shape {got.shape}, reference {want.shape}"
    if got.dtype.kind == "f" and np.dtype(dtype).kind == "f" and not python_scalar:
        assert got.dtype == dtype, f"{name}: result dtype {got.dtype}, input {dtype}"
    if got.dtype.kind == "f":
        with np.errstate(all="ignore"):
            w = want.astype(got.dtype).astype(np.float64)
        g = got.astype(np.float64)
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(g), nan), \
            f"{name}: NaN at {np.argwhere(np.isnan(g) != nan)[:5].tolist()}"
        inf = np.isinf(w)
        assert np.array_equal(g[inf], w[inf]), f"{name}: infinities differ"
        fin = ~nan & ~inf
        s = 1.0 if scale is None else np.broadcast_to(np.abs(np.asarray(scale, np.float64)),
                                                       w.shape)[fin]
        err = np.abs(g[fin] - w[fin])
        with np.errstate(all="ignore"):
            # subnormal results carry fewer digits: an absolute floor (in the
            # input's precision: a float sum of float32 terms is float32-exact)
            tiny = np.finfo(dtype if np.dtype(dtype).kind == "f" else got.dtype).tiny
            bound = rtol * (np.abs(w[fin]) + s) + 4 * tiny
        bad = ~(err <= bound)
        assert not bad.any(), (f"{name}: off the reference by {err[bad][:4]} "
                               f"(bound {np.broadcast_to(bound, err.shape)[bad][:4]})")
    else:
        assert np.array_equal(got, want.astype(got.dtype) if got.dtype.kind != "b" else want
                              != 0), f"{name}: differs from the reference"


def _snapshot(case):
    return [(a, a.copy()) for v in list(case.args) + list(case.kwargs.values())
            for a in _arrays(v)]


def _results(row, y, want):
    y = row.result(y) if row.result else y
    if isinstance(want, tuple):
        y = tuple(row.result(v) if row.result else v for v in y)
        assert isinstance(y, tuple) and len(y) == len(want), f"{row.name}: {len(y)} results"
        return list(y), list(want)
    return [y], [want]


def _describe(value):
    if isinstance(value, (nbops.quant.QTensor, nbops.quant.PackedWeight)):
        q = getattr(value, "qweight", value)
        return (f"{type(value).__name__}({_describe(q.values)}, scale {q.scale!r}, "
                f"zero_point {q.zero_point!r}, axis {q.axis})")
    if isinstance(value, np.ndarray):
        return (f"{value.dtype.str}{list(value.shape)} strides {value.strides}"
                f"{'' if value.flags.writeable else ' read-only'}"
                + (f" {value.ravel()[:6].tolist()}" if value.size else ""))
    if isinstance(value, (list, tuple)):
        return type(value)(_describe(v) for v in value)
    return repr(value) if not hasattr(value, "shape") else type(value).__name__


def _one_case(row, data):
    """One drawn call of ``row``'s operator, checked; a failure names the
    call (shapes, strides, dtypes, parameters)."""
    d = Draw(data)
    call = {}
    try:
        _check_case(row, d, call)
    except AssertionError as e:
        raise AssertionError(f"{e}\n  call: {call}") from None
    except Exception as e:   # anything else (a MemoryError past the budget, a SystemError)
        raise AssertionError(f"{row.name}: {type(e).__name__}: {e}\n  call: {call}") from e


def _check_case(row, d, call):
    if row.bad_dtypes and d.flag(0.06):
        dtype = d.choice(row.bad_dtypes)
        d.valid = False
    else:
        dtype = np.dtype(d.choice(row.dtypes))
    case = row.draw(d, dtype)
    if row.layouts:
        _vary(d, case, row)
    fam = COUNTS[row.family]
    fam["cases"] += 1
    want = out = None
    valid = d.valid
    if valid:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)   # means of empty axes
                want = row.ref(*case.args, **case.kwargs)
        except ValueError:
            # rows whose reference is NumPy's own rule (broadcasting, matmul's
            # shapes) let it tell valid shapes from invalid ones
            if not row.ref_decides:
                raise
            valid = False
        if valid:
            out, valid = _out(d, row, case, want, dtype)
    kwargs = dict(case.kwargs)
    if out is not None:
        kwargs["out"] = out
    call.update(args=_describe(case.args), kwargs={k: _describe(v) for k, v in kwargs.items()
                                                    if not k.startswith("_")}, valid=valid)
    before = _snapshot(case)
    try:
        with np.errstate(all="ignore"):
            y = row.fn(*case.args, **kwargs)
    except (TypeError, ValueError) as e:
        head = str(e).split(":")[0]
        assert row.name in head, f"{row.name}: error without the op's name: {e!r}"
        assert not valid, f"{row.name}: a valid call raised {e!r}"
        fam["errors"] += 1
        return
    assert valid, f"{row.name}: an invalid call returned (expected TypeError/ValueError)"
    fam["valid"] += 1
    fam["specials"] += d.specials
    fam["out="] += out is not None
    for a, copy in before:
        if (out is not None and a is out) or any(a is w for w in _written(row, case)):
            continue
        assert np.array_equal(a, copy, equal_nan=a.dtype.kind in "fc"), \
            f"{row.name}: an input was modified"
    if out is not None:
        assert y is out, f"{row.name}: out= given but another array returned"
    scale = None
    if row.scale is not None:
        with np.errstate(all="ignore"):
            scale = row.scale(*case.args, **case.kwargs)
    gots, wants = _results(row, y, want)
    scales = list(scale) if isinstance(scale, tuple) else [scale] * len(wants)
    for g, w, s in zip(gots, wants, scales):
        _close(g, np.asarray(w), s, row.rtol.get(np.dtype(dtype), 0) if
               np.dtype(dtype) in row.rtol else 0, dtype, row.name)


def _written(row, case):
    """Arguments the op updates by design (batch_norm's running stats)."""
    if row.name == "batch_norm" and case.kwargs.get("training") is True:
        return [case.args[1], case.args[2]]
    return []


@pytest.fixture
def fuzz_settings(request):
    if request.config.getoption("--fuzz-long"):
        return settings(max_examples=LONG_EXAMPLES, derandomize=False, deadline=None,
                        database=None, suppress_health_check=list(HealthCheck))
    return settings(max_examples=CI_EXAMPLES, derandomize=True, deadline=None,
                    database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("row", TABLE, ids=[f"{r.family}-{r.name}" for r in TABLE])
def test_fuzz(row, fuzz_settings):
    @fuzz_settings
    @given(st.data())
    def run(data):
        _one_case(row, data)

    with memory_budget():
        run()


@contextlib.contextmanager
def memory_budget(nbytes=None):
    """Caps the process's address space at its present size plus ``nbytes``
    (``NBOPS_FUZZ_MEMORY``, default 4 GiB) while a row runs.

    Past the cap an allocation fails (NumPy: MemoryError, which nbops turns
    into OutputTooLarge naming the op) and the case is reported with its call,
    where an over-committing OS would accept it and the OOM killer end the
    whole run once the memory is touched (issue 34's long run died so, at
    23.5 GB, in conv1d(padding=10**9): see docs/reliability.md)."""
    nbytes = MEMORY_BUDGET if nbytes is None else nbytes
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    except (OSError, StopIteration):       # not Linux: no cap
        yield
        return
    cap = size + nbytes if hard == resource.RLIM_INFINITY else min(size + nbytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_table_covers_every_family():
    """The table holds a row for every public operator module."""
    assert set(FAMILIES) == {"activations", "arith", "tensor", "linalg", "normalization",
                             "pooling", "softmax", "attention", "conv", "quant", "sparse",
                             "neuromorphic"}
    names = {r.name for r in TABLE if r.family not in ("quant", "sparse", "neuromorphic")}
    # fuse takes a function (its spec is exempt from samples): tests/test_fusion.py
    # checks the functions it makes
    ops = {n for n in nbops.__all__ if isinstance(getattr(nbops, n), nbops.Operator)
           and not getattr(nbops, n).spec.exempt}
    ops |= {"positional_encoding", "fold_batch_norm"}
    assert ops <= names, f"no fuzz row for {sorted(ops - names)}"


# ---------------------------------------------------------------------------
# What NumPy accepts, output sizes, and the fuzz suite's findings, one by one


def test_byte_swapped_input_converted_once():
    x = np.linspace(-2, 2, 7).astype(">f4")
    y = nbops.gelu(x)
    assert y.dtype == np.float32 and y.dtype.isnative
    np.testing.assert_array_equal(y, nbops.gelu(x.astype(np.float32)))
    assert x.dtype.str == ">f4"      # the input is left as it came


def test_numpy_scalars_run_as_0d_arrays():
    y = nbops.relu(np.float32(-1))
    assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == np.float32 and y == 0
    z = nbops.add(np.float64(1.5), np.float64(2))
    assert z.shape == () and z.dtype == np.float64 and z == 3.5


def test_byte_swapped_out_refused_with_the_reason():
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match="relu: .*non-native byte order"):
        nbops.relu(x, out=np.empty(3, ">f4"))


def test_arrays_updated_in_place_refuse_byte_swapped():
    x = np.ones((4, 2), np.float32)
    rm, rv = np.zeros(2, ">f4"), np.ones(2, ">f4")
    with pytest.raises(TypeError, match="batch_norm: argument 'running_mean' is updated in "
                                        "place, which needs native byte order"):
        nbops.batch_norm(x, rm, rv, training=True)
    # in evaluation the statistics are only read: converted like any input
    np.testing.assert_allclose(nbops.batch_norm(x, rm, rv), 1 / np.sqrt(1 + 1e-5), rtol=1e-6)


@pytest.mark.parametrize("padding, what", [(10 ** 9, "more than an address can hold"),
                                           (10 ** 6, "more than this machine's memory")])
def test_output_size_checked_before_allocating(padding, what):
    x = np.zeros((1, 1, 4, 4), np.float32)
    w = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match=f"conv2d: the output of shape .* {what}") as e:
        nbops.conv2d(x, w, padding=padding)
    assert isinstance(e.value, MemoryError)      # what NumPy raises for the same request


def test_allocation_names_negative_sizes():
    from nbops import _checks

    with pytest.raises(ValueError, match="op: the arguments give an output of shape "
                                         r"\(2, -1\), with a negative size"):
        _checks.empty((2, -1), np.float32, "cpu", "op")


def test_quantize_keeps_0d_shape():
    q = nbops.quant.quantize_per_tensor(np.float32(1.0), 0.5, 0, np.int8)
    assert q.int_repr().shape == () and q.int_repr() == 2


def test_spike_decoders_take_byte_swapped_spikes():
    s = np.array([[0, 1], [1, 1]], ">f8")
    np.testing.assert_array_equal(nbops.neuromorphic.spike_count(s), [1, 2])
    np.testing.assert_array_equal(nbops.neuromorphic.first_spike_time(s), [1, 0])


def test_sparse_scale_errors_name_the_public_op():
    A = nbops.sparse.from_dense(np.eye(3))
    with pytest.raises(ValueError, match="sparse.scale_rows: 'row_scale' must have 3 entries"):
        nbops.sparse.scale_rows(A, np.ones(4))
    with pytest.raises(ValueError, match="sparse.scale_columns: 'col_scale' must have 3"):
        nbops.sparse.scale_columns(A, np.ones(2))


def test_dtype_arguments_numpy_cannot_read_are_refused_by_name():
    q = nbops.quant.QTensor(np.zeros(3, np.int8), 0.1, 0)
    with pytest.raises(TypeError, match="dequantize: argument 'dtype' must be float32"):
        nbops.quant.dequantize(q, dtype="f4x")
    with pytest.raises(TypeError, match="positional_encoding: argument 'dtype' must be"):
        nbops.positional_encoding(4, 4, dtype="f4x")


@pytest.mark.parametrize("call, op", [
    (lambda: nbops.positional_encoding(10 ** 10, 10 ** 6), "positional_encoding"),
    (lambda: nbops.neuromorphic.rate(np.ones(4), 10 ** 13), "rate"),
])
def test_sizes_set_by_parameters_checked_by_name(call, op):
    with pytest.raises(ValueError, match=f"{op}: the output of shape .* takes"):
        call()


def test_qlinear_matmul_refuses_a_per_column_1d_qb():
    # a 1-D qb's only axis is k: with k == 1 it ran, else NumPy's broadcast error
    qa = nbops.quant.QTensor(np.ones((2, 3), np.int8), 0.1, 0)
    qb = nbops.quant.QTensor(np.ones(3, np.int8), np.full(3, 0.1), np.zeros(3, np.int32), axis=0)
    with pytest.raises(ValueError, match="quant.matmul: a 1-D 'qb' is a single column"):
        nbops.quant.matmul(qa, qb, 0.1, 0)


def test_quant_gemm_output_sizes_refused_by_name():
    qx = nbops.quant.QTensor(np.zeros((1, 1, 3, 3), np.uint8), 1.0, 0)
    qw = nbops.quant.QTensor(np.ones((1, 1, 2, 2), np.int8), 1.0, 0)
    with pytest.raises(ValueError, match="quant.conv2d: the output of shape"):
        nbops.quant.conv2d(qx, qw, padding=10 ** 9)


def test_quant_average_pools_size_the_output_first_and_name_themselves():
    q = nbops.quant.QTensor(np.zeros((1, 1, 2, 2), np.int8), 0.1, 0)
    # the per-window tables (8 TB here) were built before the output was sized
    with pytest.raises(ValueError, match="quant.adaptive_avg_pool2d: the output of shape"):
        nbops.quant.adaptive_avg_pool2d(q, (10 ** 6, 10 ** 6))
    empty = nbops.quant.QTensor(np.zeros((0, 1, 2, 2), np.int8), 0.1, 0)
    assert nbops.quant.adaptive_avg_pool2d(empty, (10 ** 6, 10 ** 6)).shape == (0, 1, 10 ** 6,
                                                                               10 ** 6)
    with pytest.raises(ValueError, match="quant.global_avg_pool2d: argument 'requant'"):
        nbops.quant.global_avg_pool2d(q, requant="round")


@pytest.mark.parametrize("encoder", [nbops.neuromorphic.rate, nbops.neuromorphic.latency])
def test_spike_encoders_refuse_dtypes_numpy_cannot_read(encoder):
    # np.dtype("f4x") fails; the None left in its place equalled float64
    with pytest.raises(TypeError, match=f"{encoder.__name__}: argument 'dtype' must be one of"):
        encoder(np.ones(3), 4, dtype="f4x")


_WORKSPACE_CHILD = """
import numpy as np, nbops, test_fuzz
x = np.ones((1, 1, 3), np.float32)
nbops.conv1d(x, x, padding=1)                      # compiled before the cap
with test_fuzz.memory_budget(1 << 30):
    try:
        nbops.conv1d(x, x, padding=5 * 10 ** 7)    # a 0.37 GiB output
        print("ran")
    except ValueError as e:
        print(str(e).split(":")[0])
"""


def test_conv_workspace_past_memory_refused_by_name():
    """conv1d with an output that fits and a workspace that does not: it must
    run or raise an error naming it, not fail inside a kernel."""
    proc = subprocess.run([sys.executable, "-c", _WORKSPACE_CHILD], capture_output=True,
                          text=True, cwd=os.path.dirname(__file__), timeout=300)
    assert proc.stdout.strip() in ("ran", "conv1d"), proc.stdout[-500:] + proc.stderr[-1500:]


def test_conv_workspace_counted_against_memory():
    """The long fuzz run's OOM kill: an output that fits in RAM whose padded
    planes and staging buffer do not; refused by name before anything is
    allocated."""
    from nbops import _checks

    if _checks._RAM is None:
        pytest.skip("this machine's memory is unknown")
    # output 8p bytes (half the memory), padded plane and staging ~24p more
    p = _checks._RAM // 16
    x = np.ones((1, 1, 3), np.float32)
    with pytest.raises(ValueError, match=r"^conv1d: the output of shape .* \(float32\) and "
                       r"the kernels' working memory take .* more than this machine's memory"):
        nbops.conv1d(x, x, padding=p)


def test_tanh_backward_float32_past_tanhs_range_matches_the_reference():
    # the long run's one mismatch: y = 1e20 in float32 squares to inf, so
    # g = 0 gives NaN (as PyTorch's float32 does); the float64 reference had -0
    from reference import tanh_backward as ref

    g = np.array([0, 1, 0.5], np.float32)
    y = np.array([1e20, -3e19, 0.5], np.float32)
    with np.errstate(all="ignore"):
        want = ref(g, y).astype(np.float32)
    np.testing.assert_array_equal(nbops.tanh_backward(g, y), want)
    assert np.isnan(want[0])
