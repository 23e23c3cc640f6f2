"""matmul, bmm and linear against NumPy in float64, on CPU and (simulated)
CUDA, route by route (the op table, tests/test_ops.py, runs the specs'
samples, errors, out= and strided inputs through the default route).

Tuning is off here (``NBOPS_AUTOTUNE=0``): the CPU kernel runs its default
config, or a tiny one (``SMALL``) whose block edges small matrices cross,
or the small-product route forced on (``linalg.plan_gemm``).
Few float32 signatures are compiled, since the micro-kernel compiles slowly.
"""

import types

import numpy as np
import pytest
from scipy import special

import nbops
from nbops import _dispatch, _formulas, linalg
from helpers import host, to_dev

# packed kernel only (SMALL=0): the small-product route has its own tests
SMALL = {"impl": "nbops", "MC": 16, "KC": 8, "NC": 32, "SMALL": 0}

# float64 references of the epilogue activations, with the kernels' defaults
ACT_REF = {
    "relu": lambda z: np.maximum(z, 0.0),
    "leaky_relu": lambda z, s=0.01: np.where(z > 0, z, s * z),
    "sigmoid": special.expit,
    "tanh": np.tanh,
    "gelu": lambda z: 0.5 * z * special.erfc(-z / np.sqrt(2.0)),
    "gelu_tanh": lambda z: z * special.expit(2 * np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)),
    "silu": lambda z: z * special.expit(z),
    "swish": lambda z, b=1.0: z * special.expit(b * z),
    "softplus": lambda z, b=1.0, t=20.0: np.where(b * z > t, z, np.logaddexp(0, b * z) / b),
    "elu": lambda z, a=1.0: np.where(z > 0, z, a * np.expm1(z)),
    "hardswish": lambda z: z * np.clip(z + 3, 0, 6) / 6,
    "hardtanh": lambda z, lo=-1.0, hi=1.0: np.clip(z, lo, hi),
}


@pytest.fixture(autouse=True)
def no_tuning(monkeypatch):
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")


@pytest.fixture
def small_blocks(monkeypatch):
    # the packed kernel with tiny blocks: products of few rows would
    # otherwise take the matrix-vector route (tested on its own below)
    from nbops.cpu import linalg as cpu

    monkeypatch.setattr(linalg._cpu_gemm, "default", dict(SMALL))
    monkeypatch.setattr(linalg, "GEMV_MAX_ROWS", 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gemv_route(monkeypatch, m, dtype):
    # few rows of A: dot products against W's rows (linear, B = W.T) or
    # row updates (x @ B); k not a multiple of 4, n not of 16, more column
    # blocks asked for than columns in the narrow case; the epilogue on
    # every block
    from nbops.cpu import linalg as cpu

    calls = []
    real = cpu._gemv
    monkeypatch.setattr(cpu, "_gemv", lambda *a: calls.append(a[-1]) or real(*a))
    rng = np.random.default_rng(m)
    for k, n in [(37, 150), (8, 5), (300, 1000)]:
        x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        check(nbops.linear(x, w, impl="nbops"), want, dtype, k)
        check(nbops.linear(x, w, b, activation="relu", impl="nbops"),
              np.maximum(want + b, 0), dtype, k)
        bt = np.ascontiguousarray(w.T)
        check(nbops.matmul(x, bt, impl="nbops"), want, dtype, k)
        check(nbops.matmul(x[:, ::1], w.T, impl="nbops"), want, dtype, k)
    assert len(calls) == 12
    b = rand(rng, (8, 20), dtype)[:, ::2]                            # no unit stride: packed
    check(nbops.matmul(x[:, :8], b, impl="nbops"), x[:, :8] @ b, dtype, 8)
    assert len(calls) == 12
    def gemv(*shape):
        return linalg.plan_gemm(*shape, config=dict(linalg.DEFAULT_CONFIG, STREAM=0),
                                threads=2).route == "gemv"

    assert gemv(1, 16, 5, 3, 1, 1, 7) and not gemv(1, 17, 5, 3, 1, 1, 7)
    assert not gemv(2, 1, 5, 3, 1, 1, 7) and not gemv(1, 1, 5, 3, 2, 1, 7)
    assert not gemv(1, 1, 5, 3, 1, 2, 3) and gemv(1, 1, 5, 3, 1, 3, 1)


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def check(got, want, dtype=np.float64, k=1):
    got = host(got)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-12 * max(k, 1) if dtype == np.float64 else 2e-5 * max(k, 1) ** 0.5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------
# Forward, CPU

SHAPES = [(0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1), (1, 7, 5), (7, 1, 5), (13, 17, 11),
          (15, 31, 7), (16, 32, 8), (17, 33, 9), (31, 29, 23), (40, 65, 33)]


@pytest.mark.parametrize("impl", ["nbops", "blas", "auto"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matmul_shapes_small_blocks(small_blocks, m, n, k, impl):
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    check(nbops.matmul(a, b, impl=impl), a @ b, k=k)


@pytest.mark.parametrize("m,n,k", [(63, 2047, 255), (65, 2049, 257), (8, 16, 256)])
def test_matmul_default_block_edges(m, n, k):
    # just off MC=64, NC=2048, KC=256 and the 8 x 8 register tile
    rng = np.random.default_rng(1)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    check(nbops.matmul(a, b, impl="nbops"), a @ b, k=k)


def test_matmul_float32():
    rng = np.random.default_rng(2)
    for m, n, k in [(37, 45, 29), (64, 16, 300), (1, 17, 3)]:
        a, b = rand(rng, (m, k), np.float32), rand(rng, (k, n), np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        check(nbops.matmul(a, b, impl="nbops"), want, np.float32, k)
        check(nbops.matmul(a, b, impl="blas"), want, np.float32, k)
    # (the batch-parallel driver is the same template: tested in float64,
    # which spares the suite a second float32 compile)


def strided_operands(rng):
    a = rand(rng, (30, 40))
    b = rand(rng, (50, 36))
    yield a.T[:23, ::2], b[::2, :-3].T[:15, :20]         # transposed, step-sliced
    yield a[::-1, 5:25], b[::-2, ::-1][:20, :13]         # negative strides
    yield np.broadcast_to(a[0, :9], (6, 9)), b[:9, 3:11]  # stride-0 rows
    yield np.asfortranarray(a[:7, :11]), b[:11, :5]       # F-order


@pytest.mark.parametrize("impl", ["nbops", "blas"])
def test_matmul_strided(small_blocks, impl):
    rng = np.random.default_rng(3)
    for a, b in strided_operands(rng):
        a0, b0 = a.copy(), b.copy()
        check(nbops.matmul(a, b, impl=impl), a0 @ b0, k=a.shape[1])
        assert np.array_equal(a, a0) and np.array_equal(b, b0)


@pytest.mark.parametrize("sa,sb", [
    ((3, 1, 5, 4), (2, 4, 6)), ((2, 5, 4), (4, 6)), ((5, 4), (3, 4, 6)),
    ((1, 5, 4), (3, 4, 6)), ((4,), (4,)), ((4,), (2, 4, 6)), ((2, 5, 4), (4,)),
    ((4,), (4, 3)), ((5, 4), (4,)), ((0, 5, 4), (4, 3)), ((2, 3, 1, 4), (3, 4, 2))])
def test_matmul_broadcasting(small_blocks, sa, sb):
    rng = np.random.default_rng(4)
    a, b = rand(rng, sa), rand(rng, sb)
    check(nbops.matmul(a, b), np.matmul(a, b), k=sa[-1])


def test_matmul_batched_many(small_blocks):
    rng = np.random.default_rng(5)
    a, b = rand(rng, (40, 9, 7)), rand(rng, (7, 5))
    check(nbops.matmul(a, b), a @ b, k=7)
    a_t = rand(rng, (40, 7, 9)).transpose(0, 2, 1)       # strided batch members
    check(nbops.matmul(a_t, b), a_t @ b, k=7)
    check(nbops.matmul(a_t, b, impl="blas"), a_t @ b, k=7)


def test_matmul_contiguous_stacks(small_blocks):
    # C-contiguous stacks go as reshapes with cached batch offsets: the
    # offsets of one call must not leak into a call of another batch size,
    # and read-only stacks (the general path) agree with writable ones
    rng = np.random.default_rng(7)
    for sa, sb in [((3, 5, 4), (3, 4, 6)), ((7, 5, 4), (7, 4, 6)), ((3, 5, 4), (4, 6)),
                   ((2, 3, 5, 4), (2, 3, 4, 6)), ((5, 4), (7, 4, 6)), ((3, 5, 4), (3, 4, 6))]:
        a, b = rand(rng, sa), rand(rng, sb)
        want = np.matmul(a, b)
        check(nbops.matmul(a, b), want, k=sa[-1])
        a.flags.writeable = False
        check(nbops.matmul(a, b), want, k=sa[-1])


def test_matmul_out(small_blocks):
    rng = np.random.default_rng(6)
    a, b = rand(rng, (2, 5, 3)), rand(rng, (3, 4))
    out = np.full((2, 5, 4), np.nan)
    assert nbops.matmul(a, b, out=out) is out
    check(out, a @ b, k=3)


def test_bmm(small_blocks):
    rng = np.random.default_rng(7)
    a, b = rand(rng, (3, 9, 5)), rand(rng, (3, 5, 18))
    check(nbops.bmm(a, b), a @ b, k=5)
    check(nbops.bmm(a, b, impl="blas"), a @ b, k=5)


# ---------------------------------------------------------------------------
# linear and its epilogue


@pytest.mark.parametrize("activation", [None] + list(linalg.ACTIVATIONS))
def test_linear_epilogue(small_blocks, activation):
    rng = np.random.default_rng(8)
    x, w, bias = rand(rng, (3, 13, 11)), rand(rng, (19, 11)) * 0.5, rand(rng, 19)
    z = x @ w.T + bias
    want = z if activation is None else ACT_REF[activation](z)
    for impl in ("nbops", "blas"):
        got = host(nbops.linear(x, w, bias, activation=activation, impl=impl))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)  # approximated exp/erf


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_epilogue_column_groups(monkeypatch, dtype):
    # the packed kernel runs the epilogue over EPILOGUE_COLS columns of a
    # block at a time: whole groups, a partial last group, a column panel
    # narrower than a group, and column chunks (few row blocks) starting
    # inside a panel; each element exactly once
    from nbops.cpu import linalg as cpu

    monkeypatch.setattr(linalg, "GEMV_MAX_ROWS", 0)
    rng = np.random.default_rng(12)
    for m, n, k, nc in ((40, 700, 33, 4096), (9, 1000, 20, 4096), (40, 700, 33, 96)):
        monkeypatch.setattr(linalg._cpu_gemm, "default", dict(SMALL, NC=nc))
        x, w, bias = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype) * 0.5, \
            rand(rng, n, dtype)
        z = x.astype(np.float64) @ w.T.astype(np.float64) + bias
        got = nbops.linear(x, w, bias, activation="gelu", impl="nbops")
        tol = 1e-4 if dtype == np.float32 else 2e-6
        np.testing.assert_allclose(got, ACT_REF["gelu"](z), rtol=tol, atol=tol)


def test_linear_variants(small_blocks):
    rng = np.random.default_rng(9)
    w, bias = rand(rng, (6, 5)), rand(rng, 6)
    x = rand(rng, (4, 5))
    check(nbops.linear(x, w), x @ w.T, k=5)                                # no bias
    check(nbops.linear(x[0], w, bias), x[0] @ w.T + bias, k=5)             # 1-D x
    xs = rand(rng, (3, 8, 10))[:, ::2, ::2]                                # strided x
    check(nbops.linear(xs, w, bias), xs @ w.T + bias, k=5)
    wt = np.asfortranarray(w)
    check(nbops.linear(x, wt, bias), x @ w.T + bias, k=5)
    check(nbops.linear(rand(rng, (0, 5)), w, bias), np.zeros((0, 6)), k=5)
    z = x @ w.T + bias
    got = nbops.linear(x, w, bias, activation=("leaky_relu", 0.2))
    check(got, np.where(z > 0, z, 0.2 * z), k=5)
    got = nbops.linear(x, w, bias, activation=("softplus", 2.0, 1.0))
    np.testing.assert_allclose(got, ACT_REF["softplus"](z, 2.0, 1.0), rtol=2e-6, atol=2e-6)
    # hardtanh's bounds may be infinite (ONNX's Clip with one bound)
    for lo, hi in ((-np.inf, 0.25), (-0.25, np.inf), (0.1, 0.1)):
        got = nbops.linear(x, w, bias, activation=("hardtanh", lo, hi))
        check(got, np.clip(z, lo, hi), k=5)
    # k == 0: the result is the epilogue of the bias alone
    check(nbops.linear(np.zeros((2, 0)), np.zeros((3, 0)), bias[:3], activation="relu"),
          np.broadcast_to(np.maximum(bias[:3], 0), (2, 3)))


def test_linear_float32_gelu():
    rng = np.random.default_rng(10)
    x, w, bias = rand(rng, (21, 30), np.float32), rand(rng, (18, 30), np.float32), \
        rand(rng, 18, np.float32)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    got = nbops.linear(x, w, bias, activation="gelu", impl="nbops")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ACT_REF["gelu"](z), rtol=1e-4, atol=1e-4)


def test_nan_propagates(small_blocks):
    a = np.ones((3, 4))
    a[1, 2] = np.nan
    y = nbops.linear(a, np.ones((5, 4)), activation="relu")
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()


# ---------------------------------------------------------------------------
# The small-product route (non-packing driver)


@pytest.fixture
def stream_route(monkeypatch):
    """Default config (the streamed-weight route on, 64 columns per task)
    with k slices of 8, so that the shapes below cross slices; records
    the driver's use."""
    from nbops.cpu import linalg as cpu

    monkeypatch.setattr(linalg._cpu_gemm, "default", dict(linalg.DEFAULT_CONFIG, KC=8))
    calls = []
    real = cpu.stream_driver
    monkeypatch.setattr(cpu, "stream_driver", lambda dt: calls.append(dt) or real(dt))
    return calls


# m past the GEMV bound (16) and around the 32 / 16 sliver widths, n around
# the 8-row tile and the 64-column task block (n % 8 != 0: W's last rows
# go through the zero-padded copy), k around the slices
STREAM_SHAPES = [(17, 8, 1), (17, 9, 7), (32, 64, 8), (33, 65, 9), (63, 130, 17),
                 (100, 200, 3), (512, 23, 40)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stream_route_shapes(stream_route, dtype):
    # linear (B = W.T) with bias and an activation in the epilogue, and a
    # transposed, strided x (A read through both strides) with a W whose
    # rows are a slice of a wider array (row stride > k)
    rng = np.random.default_rng(21)
    for m, n, k in STREAM_SHAPES:
        x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
        z = x.astype(np.float64) @ w.T.astype(np.float64) + b
        check(nbops.linear(x, w, b, activation="gelu", impl="nbops"), ACT_REF["gelu"](z),
              dtype, k)
        xt = np.asfortranarray(rand(rng, (m, k), dtype))[:, ::1]
        wide = rand(rng, (n, k + 5), dtype)
        check(nbops.matmul(xt, wide[:, :k].T, impl="nbops"),
              xt.astype(np.float64) @ wide[:, :k].T, dtype, k)
    assert stream_route and set(stream_route) == {np.dtype(dtype)}

    def stream(nbatch, m, n, k, sbk, features):
        return linalg.plan_gemm(nbatch, m, n, k, 1, sbk, k if sbk == 1 else 1,
                                dict(linalg.DEFAULT_CONFIG, STREAM=features, SMALL=0),
                                threads=2).route == "stream"

    assert stream(1, 64, 64, 64, 1, 64) and stream(1, 512, 8, 64, 1, 64)
    assert not stream(1, 513, 64, 64, 1, 64)     # past STREAM_MAX_ROWS
    assert not stream(1, 64, 64, 64, 2, 64)      # B's columns not contiguous
    assert not stream(2, 64, 64, 64, 1, 64)      # a batch of products
    assert not stream(1, 64, 64, 64, 1, 0)       # the config's route off
    assert not stream(1, 64, 7, 64, 1, 64)       # fewer columns than a tile


@pytest.fixture
def small_route(monkeypatch):
    """Default config with the small-product route taking every product up
    to 128 (the rule also asks for one product per thread)."""
    from nbops.cpu import linalg as cpu

    monkeypatch.setattr(linalg._cpu_gemm, "default", dict(linalg.DEFAULT_CONFIG, SMALL=128))
    calls = []
    real = cpu.small_driver
    monkeypatch.setattr(cpu, "small_driver", lambda dt: calls.append(dt) or real(dt))
    return calls


# m, n, k around the 8-row tile, the one- and two-vector column tiles
# (16/32 float32, 8/16 float64) and the 64 bound; m < 8 pads A, n < one
# vector pads B and goes through a scratch tile
SMALL_SHAPES = [(1, 1, 1), (3, 3, 3), (1, 33, 5), (8, 16, 1), (31, 17, 63), (33, 31, 2),
                (63, 65, 33), (65, 63, 31), (9, 48, 64), (64, 64, 64)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_route_shapes(small_route, dtype):
    rng = np.random.default_rng(20)
    for m, n, k in SMALL_SHAPES:
        a, b = rand(rng, (3, m, k), dtype), rand(rng, (3, k, n), dtype)
        want = a.astype(np.float64) @ b
        check(nbops.matmul(a, b, impl="nbops"), want, dtype, k)
    assert small_route and set(small_route) == {np.dtype(dtype)}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_small_route_prefetching(small_route, dtype):
    # 4-16 KiB of operands per product: each task prefetches its next
    # product (through A's strides, B broadcast too) while computing one
    from nbops.cpu import linalg as cpu

    rng = np.random.default_rng(23)
    lo, hi = cpu.PREFETCH_PRODUCT_BYTES
    size = np.dtype(dtype).itemsize
    for m, n, k in ((24, 24, 24), (32, 32, 32), (17, 40, 33)):
        assert lo <= (m + n) * k * size <= hi
        a, b = rand(rng, (40, k, m), dtype).transpose(0, 2, 1), rand(rng, (40, k, n), dtype)
        check(nbops.matmul(a, b, impl="nbops"), a.astype(np.float64) @ b, dtype, k)
        check(nbops.matmul(a, b[7], impl="nbops"), a.astype(np.float64) @ b[7], dtype, k)
    assert small_route and set(small_route) == {np.dtype(dtype)}


def test_small_route_strided_and_broadcast(small_route):
    rng = np.random.default_rng(21)
    a = rand(rng, (4, 40, 70))
    b = rand(rng, (4, 70, 50))
    cases = [
        (a[:, :33, :31], b[:, :31, :17]),                           # sliced, row-major
        (a.transpose(0, 2, 1)[:, :17, :9], b[:, :9, ::2]),          # A transposed, B step 2
        (a[:, ::-1, ::-1][:, :9, :65], b[:, ::-1][:, :65, :31]),  # negative strides
        (a[0, :20, :10], b[:, :10, :40]),                           # A broadcast
        (np.broadcast_to(a[0, :5, :30], (4, 5, 30)), b[:, :30, :16]),  # stride-0 batch
        (a[:, :7, :30], np.asfortranarray(b[0, :30, :20])),           # F-order B, broadcast
        (a[:, :8, :3], b[:, :3, :5]),                                 # n under one vector
    ]
    for x, y in cases:
        x0, y0 = x.copy(), y.copy()
        check(nbops.matmul(x, y, impl="nbops"), np.matmul(x0, y0), k=x.shape[-1])
        assert np.array_equal(x, x0) and np.array_equal(y, y0)
    w = rand(rng, (24, 12))                                           # linear: B = w.T
    x = rand(rng, (6, 5, 12))
    check(nbops.matmul(x, w.T, impl="nbops"), x @ w.T, k=12)
    assert len(small_route) == len(cases) + 1


@pytest.mark.parametrize("activation", [None, "relu", "gelu", ("leaky_relu", 0.2),
                                        ("hardtanh", 0.0, 6.0)])
def test_small_route_epilogue(small_route, activation):
    # rows and columns past the tile edges are recomputed by shifted tiles:
    # the epilogue must still apply exactly once. x's leading axes do not
    # merge, so linear runs one product per batch member through the route.
    rng = np.random.default_rng(22)
    x = rand(rng, (13, 4, 11)).transpose(1, 0, 2)
    w, bias = rand(rng, (19, 11)) * 0.5, rand(rng, 19)
    name, params = (activation[0], activation[1:]) if isinstance(activation, tuple) \
        else (activation, ())
    for xx, ww, bb in ((x, w, bias), (x[:, :5], w, None), (x, w[:17], bias[:17])):
        z = xx @ ww.T + (0 if bb is None else bb)
        want = z if name is None else ACT_REF[name](z, *params)
        out = np.empty(z.shape)
        got = nbops.linear(xx, ww, bb, activation=activation, out=out)
        assert got is out
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert len(small_route) == 3


def test_small_route_rule():
    def small(nbatch, m, n, k, bound, threads):
        return linalg.plan_gemm(nbatch, m, n, k, 1, n, 1, dict(linalg.DEFAULT_CONFIG, SMALL=bound),
                                threads=threads).route == "small"

    assert small(4096, 32, 32, 32, 64, 2)
    assert small(2, 64, 3, 64, 64, 2)
    assert not small(4096, 32, 65, 32, 64, 2)  # past the bound
    assert not small(1, 32, 32, 32, 64, 2)     # fewer products than threads
    assert not small(4096, 32, 32, 32, 0, 1)   # route off
    assert linalg.DEFAULT_CONFIG["SMALL"] > 0
    assert any(c.get("SMALL") == 0 for c in linalg.GEMM_CONFIGS if c["impl"] == "nbops")


# ---------------------------------------------------------------------------
# Backward rules against central finite differences


def numeric_grads(f, inputs, g, eps=1e-6):
    """d sum(f(*inputs) * g) / d input, for every array input."""
    grads = []
    for i, x in enumerate(inputs):
        if not isinstance(x, np.ndarray):
            grads.append(None)
            continue
        gx = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [v.copy() if isinstance(v, np.ndarray) else v for v in inputs]
            args[i][idx] += eps
            up = np.sum(f(*args) * g)
            args[i][idx] -= 2 * eps
            gx[idx] = (up - np.sum(f(*args) * g)) / (2 * eps)
        grads.append(gx)
    return grads


def run_rule(op, inputs, names):
    out = op(*inputs)
    kwargs = dict(zip(names, inputs))
    ctx = types.SimpleNamespace(inputs=tuple(inputs), kwargs=kwargs, output=out,
                                needs_input_grad=(True,) * len(inputs))
    return out, ctx


@pytest.mark.parametrize("sa,sb", [((4, 3), (3, 5)), ((2, 4, 3), (3, 5)), ((3,), (3, 5)),
                                   ((4, 3), (3,)), ((2, 1, 4, 3), (3, 3, 2)), ((3,), (3,))])
def test_matmul_backward(small_blocks, sa, sb):
    rng = np.random.default_rng(11)
    a, b = rand(rng, sa), rand(rng, sb)
    out, ctx = run_rule(nbops.matmul, [a, b, None, "auto"], ["a", "b", "out", "impl"])
    g = rand(rng, np.shape(out))
    ga, gb, gout, gimpl = nbops.matmul.backward(ctx, g)
    na, nb = numeric_grads(lambda x, y: np.matmul(x, y), [a, b], g)
    np.testing.assert_allclose(ga, na, atol=1e-7)
    np.testing.assert_allclose(gb, nb, atol=1e-7)
    assert gout is None and gimpl is None


def test_bmm_backward(small_blocks):
    rng = np.random.default_rng(12)
    a, b = rand(rng, (2, 3, 4)), rand(rng, (2, 4, 5))
    out, ctx = run_rule(nbops.bmm, [a, b, None, "auto"], ["a", "b", "out", "impl"])
    g = rand(rng, out.shape)
    grads = nbops.bmm.backward(ctx, g)
    assert len(grads) == 4
    for got, want in zip(grads, numeric_grads(np.matmul, [a, b], g)):
        np.testing.assert_allclose(got, want, atol=1e-7)


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "sigmoid", "tanh",
                                        "swish", ("leaky_relu", 0.1), "softplus", "elu",
                                        "silu", "hardswish", ("hardtanh", -0.3, 0.4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_backward(small_blocks, activation, with_bias):
    rng = np.random.default_rng(13)
    x, w = rand(rng, (2, 3, 4)), rand(rng, (5, 4))
    bias = rand(rng, 5) if with_bias else None
    names = ["x", "weight", "bias", "activation", "out", "impl"]
    out, ctx = run_rule(nbops.linear, [x, w, bias, activation, None, "auto"], names)
    g = rand(rng, out.shape)
    got = nbops.linear.backward(ctx, g)
    assert len(got) == 6 and got[3:] == (None, None, None)
    want = numeric_grads(lambda *v: nbops.linear(*v), [x, w, bias, activation], g)
    for i in range(3 if with_bias else 2):
        np.testing.assert_allclose(got[i], want[i], atol=5e-6)  # approximated exp/erf
    if not with_bias:
        assert got[2] is None


@pytest.mark.parametrize("needs", [(False, True, True), (True, False, False),
                                   (False, False, True)])
def test_backward_rules_skip_unneeded_products(monkeypatch, needs):
    # a network's input needs no gradient: its product (the largest of a
    # training step) is not computed, and neither is a frozen weight's
    rng = np.random.default_rng(17)
    x, w, bias = rand(rng, (6, 4)), rand(rng, (5, 4)), rand(rng, 5)
    names = ["x", "weight", "bias", "activation", "out", "impl"]
    out, ctx = run_rule(nbops.linear, [x, w, bias, None, None, "auto"], names)
    ctx.needs_input_grad = needs + (False,) * 3
    products = []
    real = linalg.matmul
    monkeypatch.setattr(linalg, "matmul", lambda *a, **k: products.append(1) or real(*a, **k))
    g = rand(rng, out.shape)
    gx, gw, gb = nbops.linear.backward(ctx, g)[:3]
    assert len(products) == needs[0] + needs[1]
    for got, need, want in zip((gx, gw, gb), needs, (g @ w, g.T @ x, g.sum(0))):
        if need:
            np.testing.assert_allclose(got, want, atol=1e-12)
        else:
            assert got is None
    products.clear()
    out, ctx = run_rule(nbops.matmul, [x, w.T, None, "auto"], ["a", "b", "out", "impl"])
    ctx.needs_input_grad = needs[:2] + (False, False)
    ga, gb = nbops.matmul.backward(ctx, g)[:2]
    assert len(products) == needs[0] + needs[1]
    assert (ga is None) == (not needs[0]) and (gb is None) == (not needs[1])


@pytest.mark.parametrize("m,n", [(37, 6), (6, 37), (29, 29)])
def test_blas_route_bands(monkeypatch, m, n):
    # products too small for the parallel kernel in other tests: force it,
    # with many bands (each finished by the epilogue) over rows or columns,
    # transposed and sliced operands passed to BLAS as they lie
    from nbops.cpu import _blas
    from nbops.cpu import linalg as cpu_linalg

    monkeypatch.setattr(_blas, "SERIAL_FLOPS", 0)
    monkeypatch.setattr(cpu_linalg, "BLAS_BLOCK_BYTES", 64)
    rng = np.random.default_rng(18)
    x = rand(rng, (2, 9, m)).transpose(0, 2, 1)[:, :, 1:8]       # (2, m, 7), unit row stride
    w = rand(rng, (n, 11))[:, 2:9]                               # (n, 7), sliced rows
    bias = rand(rng, n)
    got = nbops.linear(x, w, bias, activation="relu", impl="blas")
    np.testing.assert_allclose(got, np.maximum(x @ w.T + bias, 0), atol=1e-12)
    check(nbops.matmul(x, w.T, impl="blas"), x @ w.T, k=7)


def test_gradcheck_through_autograd(small_blocks):
    gradcheck = getattr(getattr(nbops, "autograd", None), "gradcheck", None)
    if gradcheck is None:  # the autograd module is written concurrently
        return
    rng = np.random.default_rng(14)
    T = nbops.Tensor
    a, b = T(rand(rng, (2, 3, 4)), requires_grad=True), T(rand(rng, (4, 2)), requires_grad=True)
    assert gradcheck(lambda u, v: nbops.matmul(u, v), [a, b])
    x, w, bias = (T(rand(rng, s), requires_grad=True) for s in ((3, 4), (5, 4), (5,)))
    assert gradcheck(lambda u, v, c: nbops.linear(u, v, c, activation="tanh"), [x, w, bias])


# ---------------------------------------------------------------------------
# CUDA (the simulator in CI: tiles of 8 x 8 x 4, so small shapes cross edges)


@pytest.mark.parametrize("m,n,k", [(17, 9, 5), (1, 1, 1), (3, 4, 0), (8, 16, 4), (0, 3, 2)])
def test_cuda_matmul(m, n, k):
    if not nbops.cuda_available():
        pytest.fail("CUDA or its simulator must be available")
    rng = np.random.default_rng(15)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    check(nbops.matmul(to_dev(a, "cuda"), to_dev(b, "cuda")), a @ b, k=k)


def test_cuda_strided_batched_float32():
    rng = np.random.default_rng(16)
    a = rand(rng, (5, 11, 9), np.float32)
    b = rand(rng, (9, 10), np.float32)
    at = a.transpose(0, 2, 1)[:, :, :7]                   # (5, 9, 7) strided
    got = nbops.matmul(to_dev(at.transpose(0, 2, 1), "cuda"), to_dev(b, "cuda"))
    check(got, at.transpose(0, 2, 1).astype(np.float64) @ b, np.float32, 9)
    x, w = rand(rng, (3, 1, 6, 9)), rand(rng, (2, 9, 4))
    check(nbops.matmul(to_dev(x, "cuda"), to_dev(w, "cuda")), np.matmul(x, w), k=9)


def test_cuda_linear_and_backward():
    rng = np.random.default_rng(17)
    x, w, bias = rand(rng, (10, 6)), rand(rng, (9, 6)), rand(rng, 9)
    dx, dw, db = (to_dev(v, "cuda") for v in (x, w, bias))
    z = x @ w.T + bias
    got = nbops.linear(dx, dw, db, activation="gelu")
    np.testing.assert_allclose(host(got), ACT_REF["gelu"](z), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="impl='blas' runs on the CPU only"):
        nbops.linear(dx, dw, impl="blas")
    with pytest.raises(TypeError, match="different devices"):
        nbops.matmul(dx, w.T)
    g = rand(rng, z.shape)
    out, ctx = run_rule(nbops.linear, [dx, dw, db, "relu", None, "auto"],
                        ["x", "weight", "bias", "activation", "out", "impl"])
    gx, gw, gb = (host(v) for v in nbops.linear.backward(ctx, to_dev(g, "cuda"))[:3])
    gz = g * (z > 0)
    np.testing.assert_allclose(gx, gz @ w, atol=1e-12)
    np.testing.assert_allclose(gw, gz.T @ x, atol=1e-12)
    np.testing.assert_allclose(gb, gz.sum(0), atol=1e-12)


def test_cuda_benchmark_tool(capsys):
    # tools/bench_gemm.py --cuda: what a session with a GPU runs (here in
    # the simulator, at a size it can take)
    if not nbops.cuda_available():
        pytest.skip("no CUDA device or simulator")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "tools" / "bench_gemm.py"
    spec = importlib.util.spec_from_file_location("bench_gemm", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.cuda_run(["float32"], [16], 1)
    rows = [line for line in capsys.readouterr().out.splitlines() if " cuda " in line]
    assert [r.split("cuda ")[1].split("  ")[0] for r in rows] == [
        "square 16", "batched 64 x 2^2", "linear 16x16 gelu"]
    assert all("GF/s" in r for r in rows)


def test_linear_backward_unmergeable_rows(small_blocks):
    # x's leading axes cannot be seen as one row axis: per-batch products, summed
    rng = np.random.default_rng(18)
    x = rand(rng, (4, 6, 5)).transpose(1, 0, 2)[:, ::2]     # (6, 2, 5), strided
    w, bias = rand(rng, (3, 5)), rand(rng, 3)
    out, ctx = run_rule(nbops.linear, [x, w, bias, None, None, "auto"],
                        ["x", "weight", "bias", "activation", "out", "impl"])
    g = rand(rng, out.shape)
    gx, gw, gb = nbops.linear.backward(ctx, g)[:3]
    np.testing.assert_allclose(gx, g @ w, atol=1e-12)
    np.testing.assert_allclose(gw, np.einsum("abo,abi->oi", g, x), atol=1e-12)
    np.testing.assert_allclose(gb, g.sum((0, 1)), atol=1e-12)


def test_gemm_plan_names_every_route_and_the_kernel_runs_it(monkeypatch):
    # the planner holds every route rule (in GEMM_ROUTES order); the CPU
    # entry runs the route it is handed and refuses one it does not know
    from nbops.cpu import linalg as cpu

    cfg = linalg.DEFAULT_CONFIG

    def route(nbatch, m, n, k, sak=1, sbk=None, sbn=1, config=cfg, threads=2):
        sbk = n if sbk is None else sbk
        plan = linalg.plan_gemm(nbatch, m, n, k, sak, sbk, sbn, config, threads)
        assert plan.rule == linalg.GEMM_ROUTES[plan.route] and plan.threads == threads
        return plan.route

    assert route(1, 4, 4, 4, config=dict(cfg, impl="blas")) == "blas"
    assert route(3, 0, 4, 4) == "empty" and route(1, 4, 4, 0) == "fill"
    assert route(1, 16, 300, 64) == "gemv" and route(1, 17, 300, 64, sbk=1, sbn=64) == "stream"
    assert route(64, 32, 32, 32) == "small"
    assert route(64, 200, 200, 200) == "batched" and route(1, 600, 600, 600) == "tiles"
    assert route(2, 60, 600, 600) == "batched"                 # one per thread, m <= MC
    assert route(2, 65, 600, 600) == "tiles"
    gemv = linalg.plan_gemm(1, 4, 1000, 512, 1, 1, 512, cfg, 2)
    assert gemv.tasks == min(2 * linalg.GEMV_TASKS_PER_THREAD, 1000 // linalg.GEMV_MIN_COLUMNS)
    packed = linalg.plan_gemm(1, 600, 600, 600, 1, 600, 1, dict(cfg, MC=96, KC=128, NC=1024), 2)
    assert packed[3:6] == (96, 128, 1024)
    seen = []
    real = cpu.gemm
    monkeypatch.setattr(cpu, "gemm", lambda *a: seen.append(a[-1]) or real(*a))
    monkeypatch.setitem(_dispatch._KERNELS, ("linalg.gemm", "cpu"), cpu.gemm)
    a = np.ones((4, 40), np.float32)
    np.testing.assert_array_equal(nbops.matmul(a, a.T.copy(), impl="nbops"), np.full((4, 4), 40))
    assert [p.route for p in seen] == ["gemv"]
    bad = seen[0]._replace(route="warp")
    with pytest.raises(ValueError, match="unknown route 'warp'"):
        real(*linalg._operand("matmul", "a", a, ()), *linalg._operand("matmul", "b", a.T, ()),
             np.empty((1, 4, 4), np.float32), 4, 4, 40, np.empty(0, np.float32), 0,
             _formulas.params(np.float32), _formulas.consts(np.float32), bad)
