"""conv1d / conv2d, batch norm folding and the fused conv ops against NumPy
references written from the definition, on CPU and (simulated) CUDA.

The specs in nbops/conv.py declare each op's samples, bad inputs and
gradient; the op table (test_ops.py) runs them against the references here
(``ref_conv2d_op`` and the others with the ops' signatures). This file
keeps what a table row cannot say: every CPU algorithm forced on each
geometry, the plan and its rules, tile and block edges, the direct and
depthwise kernels' own paths, residuals under each algorithm, gradients of
more geometries and on CUDA, packed weights, and the nn modules.

One table (``CASES``) drives the algorithm tests: random-looking
configurations of stride, padding, dilation and groups (depthwise and
depthwise with a channel multiplier included), odd spatial sizes, batch 1.
Tuning is off (``NBOPS_AUTOTUNE=0``); the CPU's implicit GEMM runs its
default blocks and, in ``small_blocks`` tests, blocks small enough that
the shapes here cross their edges; the BLAS route is forced where tested.
"""

import numpy as np
import pytest

import nbops
from nbops import conv as conv_mod
from nbops.autograd import Tensor, gradcheck
from helpers import check_bench_case, host, to_dev


@pytest.fixture(autouse=True)
def no_tuning(monkeypatch):
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")


@pytest.fixture(params=[{"algo": "igemm", "NC": 32, "KC": 8}, {"algo": "blas", "NC": 0, "KC": 0},
                        {"algo": "direct", "NC": 0, "KC": 0}],
                ids=["igemm-small", "blas", "direct"])
def cpu_algo(request, monkeypatch):
    # a default whose algorithm does not apply falls back to DEFAULT_CONFIG
    # (the implicit GEMM), as documented in Autotuner.config_for
    monkeypatch.setattr(conv_mod._cpu_conv, "default", dict(request.param))
    return request.param


DIRECT = {"algo": "direct", "NC": 0, "KC": 0}


# ---------------------------------------------------------------------------
# References from the definition


def _pad_amounts(padding, k, d):
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        total = d * (k - 1)
        return (total // 2, total - total // 2)
    return (padding, padding)


def ref_conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Direct loops over output positions; ``padding`` entries are ints,
    "same" or "valid"."""
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = (_pad_amounts(padding[i], (kh, kw)[i], dilation[i]) for i in (0, 1))
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    mg = co // groups
    out = np.zeros((n, co, oh, ow))
    for i in range(n):
        for o in range(co):
            g = o // mg
            for y in range(oh):
                for z in range(ow):
                    s = 0.0 if b is None else float(b[o])
                    for ci in range(cg):
                        for a in range(kh):
                            ih = y * stride[0] - pt + a * dilation[0]
                            for e in range(kw):
                                iw = z * stride[1] - pl + e * dilation[1]
                                if 0 <= ih < h and 0 <= iw < wd:
                                    s += float(w[o, ci, a, e]) * float(x[i, g * cg + ci, ih, iw])
                    out[i, o, y, z] = s
    return out


def ref_conv1d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return ref_conv2d(x[:, :, None], w[:, :, None], b, (1, stride), (0, padding),
                      (1, dilation), groups)[:, :, 0]


def ref_bn(y, mean, var, gamma, beta, eps):
    sh = (1, -1) + (1,) * (y.ndim - 2)
    return (y - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps) * gamma.reshape(sh) \
        + beta.reshape(sh)


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


# The op table's references (tests/test_ops.py, named by the specs in
# nbops/conv.py): each takes its op's arguments as the samples pass them


def _ref_conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """conv1d or conv2d by ``weight``'s rank (as conv_relu and conv_bn choose)."""
    if weight.ndim == 3:
        return ref_conv1d(x, weight, bias, stride, padding, dilation, groups)
    pad = (padding, padding) if isinstance(padding, (int, str)) else tuple(padding)
    return ref_conv2d(x, weight, bias, _pair(stride), pad, _pair(dilation), groups)


def _plus(y, residual):
    return y if residual is None else y + residual


def ref_conv2d_op(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                  residual=None):
    return _plus(_ref_conv(x, weight, bias, stride, padding, dilation, groups), residual)


ref_conv1d_op = ref_conv2d_op


def ref_conv_relu(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                  residual=None):
    # (np.maximum keeps NaN, as the kernels' relu does)
    return np.maximum(ref_conv2d_op(x, weight, bias, stride, padding, dilation, groups,
                                    residual), 0)


def ref_conv_bn(x, weight, bias=None, bn_mean=None, bn_var=None, bn_weight=None,
                bn_bias=None, eps=1e-5, stride=1, padding=0, dilation=1, groups=1,
                residual=None):
    y = _ref_conv(x, weight, bias, stride, padding, dilation, groups)
    return _plus(ref_bn(y, bn_mean, bn_var, bn_weight, bn_bias, eps), residual)


def ref_conv_bn_relu(*args, **kwargs):
    return np.maximum(ref_conv_bn(*args, **kwargs), 0)


def ref_fold_batch_norm(weight, bias, bn_mean, bn_var, bn_weight, bn_bias, eps=1e-5):
    s = bn_weight / np.sqrt(bn_var + eps)
    b = 0.0 if bias is None else bias
    return weight * s.reshape((-1,) + (1,) * (weight.ndim - 1)), (b - bn_mean) * s + bn_bias


# (N, C, H, W, CO, kH, kW, stride, padding, dilation, groups)
CASES = [
    (1, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1),          # odd sizes, 3x3 "same"-like
    (2, 4, 9, 8, 6, 3, 3, 2, 0, 1, 2),          # strided, grouped
    (1, 4, 8, 9, 8, 3, 3, 1, 2, 2, 1),          # dilated
    (1, 6, 5, 5, 9, 1, 1, 1, 0, 1, 3),          # 1x1 grouped
    (1, 5, 6, 7, 3, 1, 1, 2, 1, 1, 1),          # 1x1 strided and padded
    (1, 3, 11, 10, 4, 7, 7, 2, 3, 1, 1),        # stem-like 7x7/2
    (1, 4, 6, 7, 4, 3, 3, 1, 1, 1, 4),          # depthwise
    (2, 3, 7, 6, 6, 3, 3, 2, 1, 1, 3),          # depthwise, channel multiplier 2
    (1, 2, 5, 9, 4, 2, 4, (1, 2), (1, 0), (2, 1), 1),  # pairs, even kernels
    (1, 3, 6, 6, 2, 3, 2, 1, "same", (1, 2), 1),       # asymmetric "same"
    (1, 3, 4, 5, 2, 3, 3, 1, "valid", 1, 1),
    (1, 9, 5, 4, 17, 2, 2, 1, 1, 1, 1),         # CO past one register tile
    (2, 3, 9, 11, 5, 5, 3, (1, 3), 2, (1, 2), 1),  # column stride 3 (phases), odd width
    (2, 20, 7, 9, 18, 1, 1, 1, 0, 1, 2),        # 1x1 read in place: whole + partial slivers
    (2, 8, 9, 11, 6, 1, 1, (2, 3), 0, 1, 2),    # 1x1 strided, no padding: subsampled
]
IDS = [f"case{i}" for i in range(len(CASES))]


def _case(case, dtype=np.float64, seed=0):
    n, c, h, w, co, kh, kw, s, p, d, g = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    wt = rng.standard_normal((co, c // g, kh, kw)).astype(dtype)
    b = rng.standard_normal(co).astype(dtype)
    return x, wt, b, dict(stride=s, padding=p, dilation=d, groups=g)


def _ref(x, wt, b, kw):
    p = kw["padding"]
    return ref_conv2d(x, wt, b, _pair(kw["stride"]), (p, p) if isinstance(p, (int, str))
                      else p, _pair(kw["dilation"]), kw["groups"])


def check(got, want, dtype=np.float64, k=1):
    got = host(got)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-12 * max(k, 1) if dtype == np.float64 else 3e-5 * max(k, 1) ** 0.5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------
# Forward


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv2d_cpu_algorithms(case, cpu_algo):
    x, wt, b, kw = _case(case)
    check(nbops.conv2d(x, wt, b, **kw), _ref(x, wt, b, kw), k=wt[0].size)


def test_conv2d_default_blocks_cross_edges():
    # 70 output channels (past the 8-row register tile), 300 pixels (past
    # the 256-pixel column block), k = 288 (past the 256 k block)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 15, 20))
    w = rng.standard_normal((70, 32, 3, 3))
    win = np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    want = np.einsum("nchwij,ocij->nohw", win, w)
    check(nbops.conv2d(x, w, padding=1), want, k=288)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_padded_plane_kernel(dtype):
    # strides 1 and 2 run on a zero-padded scratch plane (3x3 in one pass,
    # other windows tap by tap): window sizes, strides, dilation, no or
    # one-sided padding, a channel multiplier, batch 2 and the fused relu
    # against the reference
    rng = np.random.default_rng(5)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for (n, c, h, w, mult, kh, kw, s, p, d) in [(2, 3, 9, 13, 1, 3, 3, 1, (1, 1), 1),
                                                (1, 2, 7, 6, 2, 5, 5, 1, (2, 2), 1),
                                                (1, 4, 8, 9, 1, 3, 3, 1, (0, 2), 2),
                                                (1, 2, 5, 20, 1, 3, 1, 1, (1, 0), 1),
                                                (1, 3, 6, 6, 1, 3, 3, 1, (0, 0), 1),
                                                (2, 3, 11, 14, 1, 3, 3, 2, (1, 1), 1),
                                                (1, 2, 9, 8, 2, 5, 3, (2, 1), (2, 1), 1),
                                                (1, 3, 10, 9, 1, 3, 3, (1, 2), (0, 1), 2),
                                                # "same" with even windows pads one more
                                                # at the bottom and right
                                                (1, 3, 6, 7, 1, 2, 4, 1, "same", 1),
                                                (1, 2, 7, 6, 2, 4, 2, 1, "same", (1, 2))]:
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        wt = rng.standard_normal((c * mult, 1, kh, kw)).astype(dtype)
        b = rng.standard_normal(c * mult).astype(dtype)
        st = (s, s) if isinstance(s, int) else s
        dd = (d, d) if isinstance(d, int) else d
        pp = (p, p) if isinstance(p, str) else p
        want = ref_conv2d(x, wt, b, stride=st, padding=pp, dilation=dd, groups=c)
        kw_ = dict(stride=s, padding=p, dilation=d, groups=c)
        np.testing.assert_allclose(nbops.conv2d(x, wt, b, **kw_), want, **tol)
        np.testing.assert_allclose(nbops.conv_relu(x, wt, b, **kw_), np.maximum(want, 0), **tol)


@pytest.mark.parametrize("step_bytes", [1, 16 << 20], ids=["image-by-image", "one-step"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_algorithm_fused_and_batched(monkeypatch, dtype, step_bytes):
    # the direct convolution with folded batch norm (per-channel weight
    # scale), relu, groups with fewer output channels than a register tile,
    # batch 2, a tile count that is not a multiple of the task size
    monkeypatch.setattr(conv_mod._cpu_conv, "default", {"algo": "direct", "NC": 0, "KC": 0})
    rng = np.random.default_rng(11)
    from nbops.cpu import conv as cpu_conv

    # (Python-side only: a global that the compiled driver reads would be
    # frozen into its disk cache)
    monkeypatch.setattr(cpu_conv, "DIRECT_TASKS_PER_THREAD", 64)  # channel blocks too
    monkeypatch.setattr(cpu_conv, "DIRECT_STEP_BYTES", step_bytes)
    for (n, c, h, w, co, k, p, d, g) in [(2, 6, 13, 17, 10, 3, 1, 1, 2),
                                         (1, 4, 9, 30, 3, 3, 2, 2, 1),
                                         (2, 8, 6, 6, 16, 1, 0, 1, 1),
                                         (1, 6, 14, 14, 44, 3, 1, 1, 2),   # 22 = 8 + 8 + 6
                                         (1, 3, 5, 9, 5, (2, 4), "same", (2, 1), 1),
                                         (3, 2, 3, 14, 4, 3, 1, 1, 1),     # span == NR
                                         (2, 5, 9, 11, 6, (3, 1), 0, 1, 1)]:  # in place
        kh, kw_ = (k, k) if isinstance(k, int) else k
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        wt = rng.standard_normal((co, c // g, kh, kw_)).astype(dtype)
        b = rng.standard_normal(co).astype(dtype)
        mean, var, gamma, beta = _bn(co, dtype)
        kw = dict(padding=p, dilation=d, groups=g)
        geo, _ = conv_mod._geometry("t", 2, x, wt, 1, p, d, g)
        assert conv_mod.plan_conv(geo, dtype, "cpu", DIRECT).algorithm == "direct"
        got = nbops.conv_bn_relu(x, wt, b, mean, var, gamma, beta, **kw)
        wf, bf = nbops.fold_batch_norm(wt, b, mean, var, gamma, beta)
        want = np.maximum(_ref(x.astype(np.float64), wf.astype(np.float64),
                               bf.astype(np.float64), dict(stride=1, **kw)), 0)
        check(got, want, dtype=dtype, k=wt[0].size)
        # no epilogue at all (1x1 and 3x1 without padding: the kernel's
        # stores are the output)
        want = _ref(x.astype(np.float64), wt.astype(np.float64), None, dict(stride=1, **kw))
        check(nbops.conv2d(x, wt, **kw), want, dtype=dtype, k=wt[0].size)


@pytest.mark.parametrize("step_bytes", [1, 16 << 20], ids=["image-by-image", "one-step"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_algorithm_on_input_phases(monkeypatch, dtype, step_bytes):
    # strides >= 2 run the direct convolution on the input dealt into
    # sh x sw phases: windows not a multiple of the stride, odd padding, odd
    # sizes, stride 3, unequal strides, dilation, groups, 3x3/2 and 1x1/2,
    # folded batch norm and relu, batch 2; not depthwise, not stride 1
    monkeypatch.setattr(conv_mod._cpu_conv, "default", {"algo": "direct", "NC": 0, "KC": 0})
    rng = np.random.default_rng(12)
    from nbops.cpu import conv as cpu_conv

    monkeypatch.setattr(cpu_conv, "DIRECT_STEP_BYTES", step_bytes)

    for (n, c, h, w, co, k, s, p, d, g) in [(1, 3, 37, 41, 10, 7, 2, 3, 1, 1),  # stem-like
                                            (2, 4, 20, 23, 6, 5, 2, 2, 1, 1),
                                            (1, 5, 25, 30, 9, (6, 4), 2, (2, 1), 1, 1),
                                            (1, 2, 31, 33, 4, 6, 3, (1, 2), 1, 1),
                                            (1, 2, 18, 33, 4, 2, 2, 0, 1, 1),
                                            (2, 6, 21, 19, 12, 3, 2, 1, 1, 1),  # 3x3/2
                                            (1, 7, 16, 23, 10, 1, 2, 0, 1, 1),  # 1x1/2
                                            (1, 4, 27, 25, 6, 3, (2, 3), 1, 1, 1),
                                            (1, 4, 29, 31, 6, 3, 2, 2, 2, 1),   # dilated
                                            (1, 6, 23, 22, 9, 3, 2, 1, 1, 3)]:  # groups
        kh, kw_ = (k, k) if isinstance(k, int) else k
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        wt = rng.standard_normal((co, c // g, kh, kw_)).astype(dtype)
        b = rng.standard_normal(co).astype(dtype)
        mean, var, gamma, beta = _bn(co, dtype)
        kw = dict(stride=s, padding=p, dilation=d, groups=g)
        geo, _ = conv_mod._geometry("t", 2, x, wt, s, p, d, g)
        plan = conv_mod.plan_conv(geo, dtype, "cpu", DIRECT)
        # (the 1x1/2 runs stride 1 on the pixels it reads: subsampled)
        assert plan.algorithm == ("direct" if plan.subsample else "direct_phases")
        assert plan.subsample == (k == 1)
        check(nbops.conv2d(x, wt, b, **kw), _ref(x.astype(np.float64), wt.astype(np.float64),
                                                  b.astype(np.float64), kw),
              dtype=dtype, k=wt[0].size)
        got = nbops.conv_bn_relu(x, wt, b, mean, var, gamma, beta, **kw)
        wf, bf = nbops.fold_batch_norm(wt, b, mean, var, gamma, beta)
        want = np.maximum(_ref(x.astype(np.float64), wf.astype(np.float64),
                               bf.astype(np.float64), kw), 0)
        check(got, want, dtype=dtype, k=wt[0].size)
    # not on phases: stride 1 (the direct convolution itself) and depthwise
    # (its own kernels, which "direct" does not name)
    x30 = np.zeros((1, 4, 30, 30), dtype)
    geo, _ = conv_mod._geometry("t", 2, x30, np.zeros((4, 4, 3, 3), dtype), 1, 0, 1, 1)
    assert conv_mod.plan_conv(geo, dtype, "cpu", DIRECT).algorithm == "direct"
    geo, _ = conv_mod._geometry("t", 2, x30, np.zeros((4, 1, 3, 3), dtype), 2, 0, 1, 4)
    with pytest.raises(ValueError, match="'direct' does not apply"):
        conv_mod.plan_conv(geo, dtype, "cpu", DIRECT)


# ---------------------------------------------------------------------------
# The plan: one table of algorithms with their rules, run as planned


def _geo(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1):
    return conv_mod._geometry("t", len(x_shape) - 2, np.empty(x_shape), np.empty(w_shape),
                              stride, padding, dilation, groups)[0]


TUNED = {"igemm", "blas", "direct"}
PLANS = [  # x, weight, parameters, the untuned plan, tuned algorithms, what "direct" plans
    ((1, 16, 14, 14), (8, 16, 1, 1), {}, "igemm", TUNED, "direct"),                    # 1x1
    ((2, 8, 9, 9), (8, 8, 3, 3), dict(padding=1), "igemm", TUNED, "direct"),           # 3x3/1
    ((1, 8, 15, 15), (8, 8, 3, 3), dict(stride=2, padding=1), "igemm", TUNED,
     "direct_phases"),                                                                 # 3x3/2
    ((1, 6, 9, 9), (6, 1, 3, 3), dict(groups=6, padding=1), "depthwise_padded", set(), None),
    ((1, 6, 9, 9), (12, 1, 3, 3), dict(groups=6, stride=3), "depthwise", set(), None),
    ((1, 8, 12, 12), (8, 2, 3, 3), dict(groups=4, padding=1), "igemm", TUNED, "direct"),
    ((1, 4, 20, 20), (4, 4, 3, 3), dict(dilation=2, padding=2), "igemm", TUNED, "direct"),
    ((1, 4, 21, 21), (4, 4, 3, 3), dict(dilation=2, stride=2), "igemm", TUNED,
     "direct_phases"),
    ((2, 4, 50), (6, 4, 5), dict(padding=2), "igemm", TUNED, "direct"),                # 1-D
    # less output than one direct tile (OH * Wp < NR): no direct convolution
    ((1, 8, 4, 4), (8, 8, 3, 3), {}, "igemm", {"igemm", "blas"}, None),
    ((1, 4, 8), (4, 4, 3), {}, "igemm", {"igemm", "blas"}, None),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,ws,kw,untuned,tuned,direct", PLANS,
                         ids=["1x1", "3x3", "3x3s2", "depthwise", "depthwise-s3", "grouped",
                              "dilated", "dilated-s2", "1d", "tiny", "1d-tiny"])
def test_plan_names_the_algorithm_its_rules_give(monkeypatch, dtype, xs, ws, kw, untuned,
                                                 tuned, direct):
    from nbops.cpu import conv as cpu_conv

    geo = _geo(xs, ws, **kw)
    plan = conv_mod.plan_conv(geo, dtype, "cpu")
    assert (plan.algorithm, plan.geometry, plan.dtype, plan.device) == (untuned, geo, dtype,
                                                                       "cpu")
    assert plan.rule == next(a.rule for a in conv_mod.ALGORITHMS if a.name == untuned)
    assert conv_mod._tuned_algos(geo, np.dtype(dtype), "cpu") == tuned
    assert conv_mod.plan_conv(geo, dtype, "cuda").algorithm == "cuda_direct"
    # the padded plane the rule measures is the kernels' own
    assert geo.padded() == cpu_conv._padded(tuple(geo))
    # the kernel entry runs the algorithm a plan names, and nothing else
    ran = []
    for name, algo in (("_igemm", "igemm"), ("_blas_route", "blas"), ("_direct", "direct"),
                       ("_direct_phases", "direct_phases"),
                       ("_depthwise_padded", "depthwise_padded"), ("_depthwise", "depthwise")):
        def spy(*args, _real=getattr(cpu_conv, name), _algo=algo):
            ran.append(_algo)
            return _real(*args)
        monkeypatch.setattr(cpu_conv, name, spy)
    rng = np.random.default_rng(3)
    x, wt = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    spatial = len(xs) - 2
    full = {**dict(stride=1, padding=0, dilation=1, groups=1), **kw}
    want = _ref(x.astype(np.float64), wt.astype(np.float64), None, full) if spatial == 2 else \
        ref_conv1d(x, wt, None, **full)
    kernel = nbops._dispatch.kernel("conv.conv2d", "cpu")
    e = np.empty(0, dtype)
    plans = [plan] if not tuned else []
    for algo in ("igemm", "blas", "direct"):
        cfg = {"algo": algo, "NC": 64, "KC": 32}
        if algo not in tuned:
            with pytest.raises(ValueError, match=f"algorithm '{algo}' does not apply"):
                conv_mod.plan_conv(geo, dtype, "cpu", cfg)
            continue
        p = conv_mod.plan_conv(geo, dtype, "cpu", cfg)
        assert p.algorithm == (direct if algo == "direct" else algo)
        assert (p.NC, p.KC) == ((64, 32) if algo == "igemm" else (0, 0))
        assert (p.phases is not None) == (p.algorithm == "direct_phases")
        plans.append(p)
    for p in plans:
        ran.clear()
        out = np.empty(want.shape, dtype)
        kernel(conv_mod._as4d(x, spatial), conv_mod._as4d(wt, spatial), e, e,
               conv_mod._as4d(out, spatial), tuple(geo), 0, e, plan=p)
        # (on phases through the direct convolution's own function)
        assert ran == [p.algorithm] + (["direct"] if p.algorithm == "direct_phases" else [])
        check(out, want, dtype, k=wt[0].size)


def test_strided_1x1_is_planned_on_its_pixels():
    # a strided 1x1 without padding runs stride 1 on the pixels it reads;
    # with padding, or depthwise, it does not
    geo = _geo((1, 8, 15, 15), (4, 8, 1, 1), stride=2)
    plan = conv_mod.plan_conv(geo, np.float32, "cpu", DIRECT)
    assert plan.subsample and plan.algorithm == "direct"
    assert plan.kernel_geometry == (8, 8, 8, 1, 1, 1, 1, 0, 0, 1, 1, 8, 8, 1, 4)
    for geo in (_geo((1, 8, 15, 15), (4, 8, 1, 1), stride=2, padding=1),
                _geo((1, 8, 15, 15), (8, 1, 1, 1), stride=2, groups=8)):
        plan = conv_mod.plan_conv(geo, np.float32, "cpu")
        assert not plan.subsample and plan.kernel_geometry == tuple(geo)
    assert not conv_mod.plan_conv(geo, np.float32, "cuda").subsample


def test_plans_refuse_what_does_not_apply():
    geo = _geo((1, 8, 4, 4), (8, 8, 3, 3))
    with pytest.raises(ValueError, match=r"'direct' does not apply to ConvGeometry\(c=8.*it "
                                         r"needs direct: stride 1.*Applicable: igemm, blas"):
        conv_mod.plan_conv(geo, np.float64, "cpu", DIRECT)
    with pytest.raises(ValueError, match=r"no algorithm 'winograd' on cpu \(configs name "
                                         r"\['blas', 'direct', 'igemm'\]\); applicable: igemm"):
        conv_mod.plan_conv(geo, np.float64, "cpu", {"algo": "winograd"})
    with pytest.raises(ValueError, match=r"no algorithm 'igemm' on cuda \(none is chosen by a "
                                         r"config\); applicable: cuda_direct"):
        conv_mod.plan_conv(geo, np.float64, "cuda", conv_mod.DEFAULT_CONFIG)
    # the kernel entry runs a plan of its own call only
    other = conv_mod.plan_conv(_geo((1, 8, 5, 5), (8, 8, 3, 3)), np.float64)
    x, w = np.ones((1, 8, 4, 4)), np.ones((8, 8, 3, 3))
    e, out = np.empty(0), np.empty((1, 8, 2, 2))
    kernel = nbops._dispatch.kernel("conv.conv2d", "cpu")
    with pytest.raises(ValueError, match=r"conv2d: a plan for geometry \(8, 5, 5"):
        kernel(x, w, e, e, out, tuple(geo), 0, e, plan=other)
    with pytest.raises(ValueError, match="in float32 was given a call of .* in float64"):
        kernel(x, w, e, e, out, tuple(geo), 0, e, plan=conv_mod.plan_conv(geo, np.float32))
    with pytest.raises(ValueError, match="the plan names 'cuda_direct', not a CPU"):
        kernel(x, w, e, e, out, tuple(geo), 0, e,
               plan=conv_mod.plan_conv(geo, np.float64, "cuda"))


def test_a_default_that_does_not_apply_falls_back_and_packs_keep_their_plan(monkeypatch):
    # tuning off: the default config where its algorithm applies, else the
    # first config that does (DEFAULT_CONFIG): a pack shows which it runs
    monkeypatch.setattr(conv_mod._cpu_conv, "default", dict(DIRECT))
    rng = np.random.default_rng(8)
    for xs, expect in (((1, 8, 4, 4), ("igemm", 256, 256)), ((1, 8, 9, 9), ("direct", 0, 0))):
        x, w = rng.standard_normal(xs), rng.standard_normal((8, 8, 3, 3))
        pack = nbops.conv_pack(w, input_shape=x.shape)
        assert pack.plan is None
        check(nbops.conv2d(x, pack), _ref(x, w, None, dict(stride=1, padding=0, dilation=1,
                                                           groups=1)), k=72)
        assert (pack.plan.algorithm, pack.plan.NC, pack.plan.KC) == expect
        assert pack.plan.geometry == pack._geo


@pytest.mark.parametrize("shape,pad,strides,hw", [((2, 3, 9, 11), (1, 2), (2, 3), (6, 6)),
                                                  ((1, 2, 8, 8), (0, 0), (2, 2), (5, 4)),
                                                  ((1, 1, 5, 7), (3, 1), (3, 2), (4, 5))])
def test_phases_dealt_from_the_padded_input(shape, pad, strides, hw):
    # _deal_phases against NumPy's pad and transpose: phase (a, b) of plane
    # c holds padded input (sh u + a, sw v + b); past the input, zeros
    from nbops.cpu import conv as cpu_conv

    n, c, h, w = shape
    (ph, pw), (sh, sw), (hs, ws) = pad, strides, hw
    x = np.arange(1.0, 1 + np.prod(shape)).reshape(shape)
    xp = np.zeros((n, c, max(hs * sh, h + 2 * ph), max(ws * sw, w + 2 * pw)))
    xp[:, :, ph:ph + h, pw:pw + w] = x
    xp = xp[:, :, :hs * sh, :ws * sw]
    want = xp.reshape(n, c, hs, sh, ws, sw).transpose(0, 1, 3, 5, 2, 4)
    got = np.zeros((n, c, sh, sw, hs, ws))
    cpu_conv._deal_phases(x.reshape(-1), got.reshape(-1), n * c, h, w, ph, pw, sh, sw, sh, sw,
                          hs, ws)
    np.testing.assert_array_equal(got, want)
    first = np.zeros((n, c, 1, 1, hs, ws))   # the first phase only (strided 1x1)
    cpu_conv._deal_phases(x.reshape(-1), first.reshape(-1), n * c, h, w, ph, pw, sh, sw, 1, 1,
                          hs, ws)
    np.testing.assert_array_equal(first, want[:, :, :1, :1])


# ---------------------------------------------------------------------------
# Batch norm folding and the fused ops


def _bn(co, dtype=np.float64, seed=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(co).astype(dtype), rng.uniform(0.5, 2.0, co).astype(dtype),
            rng.standard_normal(co).astype(dtype), rng.standard_normal(co).astype(dtype))


FUSED = [CASES[0], CASES[3], CASES[7]]


# depthwise (its own kernels: the residual in a pass of its own), 1x1 read in
# place, stride 2 (phases under "direct"), grouped 3x3
RESIDUAL = [CASES[0], CASES[7], CASES[13], CASES[1], CASES[6]]


@pytest.mark.parametrize("case", RESIDUAL, ids=["3x3", "depthwise", "1x1", "strided-groups",
                                                "depthwise-same"])
def test_residual_in_the_epilogue(case, cpu_algo):
    # act(conv + bias + residual) for every fused op and algorithm, batch
    # norm folded or not; NaN in the residual propagates through the relu
    x, wt, b, kw = _case(case)
    mean, var, gamma, beta = _bn(wt.shape[0])
    conv = _ref(x, wt, b, kw)
    r = np.random.default_rng(9).standard_normal(conv.shape)
    r.flat[3] = np.nan
    z = ref_bn(conv, mean, var, gamma, beta, 1e-3) + r
    k = wt[0].size * 4
    check(nbops.conv2d(x, wt, b, residual=r, **kw), conv + r, k=k)
    check(nbops.conv_relu(x, wt, b, residual=r, **kw), np.maximum(conv + r, 0), k=k)
    check(nbops.conv_bn(x, wt, b, mean, var, gamma, beta, eps=1e-3, residual=r, **kw), z, k=k)
    got = nbops.conv_bn_relu(x, wt, b, mean, var, gamma, beta, eps=1e-3, residual=r, **kw)
    check(got, np.where(np.isnan(z), z, np.maximum(z, 0)), k=k)
    assert np.isnan(got.flat[3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_residual_default_blocks_float32_and_batches(dtype):
    # the default (tuned-off) igemm blocks and the direct algorithm over
    # several images, where each step's residual slice must line up
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 24, 12, 13)).astype(dtype)
    wt = rng.standard_normal((20, 24, 3, 3)).astype(dtype)
    r = rng.standard_normal((3, 20, 12, 13)).astype(dtype)
    want = np.maximum(_ref(x.astype(np.float64), wt.astype(np.float64), None,
                           dict(stride=1, padding=1, dilation=1, groups=1)) + r, 0)
    check(nbops.conv_relu(x, wt, padding=1, residual=r), want, dtype, k=wt[0].size)
    from nbops.cpu import conv as cpu_conv

    out = np.empty_like(r)
    geo, _ = conv_mod._geometry("t", 2, x, wt, 1, 1, 1, 1)
    e = np.empty(0, dtype)
    cpu_conv._direct(x, wt, e, e, out, tuple(geo), 1, r.reshape(-1))
    check(out, want, dtype, k=wt[0].size)


def test_residual_gradient():
    # (the op table checks gradients of positional inputs only; the
    # residual is a keyword argument)
    # the residual's gradient is the output's, through the relu
    x, wt, b, kw = _case(GRAD_CASES[0], seed=13)
    stats = _bn(wt.shape[0])
    r = np.random.default_rng(14).standard_normal(_ref(x, wt, b, kw).shape)
    ts = [Tensor(a, requires_grad=True) for a in (x, wt, b) + stats + (r,)]
    assert gradcheck(lambda a, c, d, m, v, g, be, res: nbops.conv_bn_relu(
        a, c, d, m, v, g, be, eps=0.1, residual=res, **kw), ts)
    ts = [Tensor(a, requires_grad=True) for a in (x, wt, r)]
    assert gradcheck(lambda a, c, res: nbops.conv2d(a, c, residual=res, **kw), ts)
    ts = [Tensor(a, requires_grad=True) for a in (x, wt, r)]
    y = nbops.conv_relu(ts[0], ts[1], residual=ts[2], **kw)
    y.sum().backward()
    np.testing.assert_array_equal(ts[2].grad, (y.data > 0).astype(float))


# ---------------------------------------------------------------------------
# Backward


GRAD_CASES = [
    (1, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1),
    (2, 4, 5, 6, 4, 3, 2, 2, 1, (2, 1), 2),
    (1, 3, 5, 5, 6, 3, 3, 1, 1, 1, 3),        # depthwise, multiplier 2
    (1, 3, 4, 4, 2, 1, 1, 1, 0, 1, 1),        # 1x1
]


# (the first, 3x3, is the op table's own gradient check of conv2d's main
# sample: the other geometries here)
@pytest.mark.parametrize("case", GRAD_CASES[1:], ids=["strided-groups", "depthwise", "1x1"])
def test_conv2d_gradcheck(case):
    x, wt, b, kw = _case(case)
    ts = [Tensor(a, requires_grad=True) for a in (x, wt, b)]
    assert gradcheck(lambda a, c, d: nbops.conv2d(a, c, d, **kw), ts)


def test_conv1d_and_no_bias_gradcheck():
    rng = np.random.default_rng(4)
    x = Tensor(rng.standard_normal((2, 4, 7)), requires_grad=True)
    w = Tensor(rng.standard_normal((2, 2, 3)), requires_grad=True)
    assert gradcheck(lambda a, c: nbops.conv1d(a, c, stride=2, padding=1, groups=2), [x, w])
    y = nbops.conv1d(x, w, groups=2)
    y.sum().backward()
    assert x.grad.shape == x.data.shape and w.grad.shape == w.data.shape


def test_gradcheck_cuda():
    x, wt, b, kw = _case((1, 4, 4, 3, 2, 2, 2, 2, 1, (1, 2), 2))
    ts = [Tensor(to_dev(a, "cuda"), requires_grad=True) for a in (x, wt, b)]
    assert gradcheck(lambda a, c, d: nbops.conv2d(a, c, d, **kw), ts)


# ---------------------------------------------------------------------------
# Errors


# (the error tables are the specs' bad inputs, run by the op table)

X4 = np.zeros((1, 4, 5, 5))
W4 = np.zeros((6, 2, 3, 3))


def test_residual_must_not_overlap_out():
    # one array as both (the op table moves each argument to the device on
    # its own, so it cannot pass the same array twice)
    r = np.zeros((1, 6, 3, 3))
    with pytest.raises(ValueError, match="conv_relu: .*overlap"):
        nbops.conv_relu(X4, W4, groups=2, residual=r, out=r)


# ---------------------------------------------------------------------------
# Packed weights (conv_pack)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_packed_conv_matches_reference(case, cpu_algo):
    x, wt, b, kw = _case(case)
    packed = nbops.conv_pack(wt, b, input_shape=x.shape, **kw)
    want = _ref(x, wt, b, kw)
    check(nbops.conv2d(x, packed), want, k=wt[0].size)
    # the algorithm is resolved on the first call and kept: a second call
    # runs the kept one, with a residual and the relu in the epilogue
    r = np.random.default_rng(9).standard_normal(want.shape)
    check(nbops.conv_relu(x, packed, residual=r), np.maximum(want + r, 0), k=wt[0].size)
    assert packed.input_shape == x.shape and packed.output_shape == want.shape


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", FUSED, ids=["3x3", "1x1-groups", "depthwise"])
def test_packed_batch_norm_float32_and_devices(device, case):
    x, wt, b, kw = _case(case, np.float32)
    stats = _bn(wt.shape[0], np.float32)
    eps = 1e-3
    z = ref_bn(_ref(x, wt, b, kw), *stats, eps)
    dev = [to_dev(a, device) for a in (x, wt, b) + stats]
    packed = nbops.conv_pack(dev[1], dev[2], input_shape=x.shape, batch_norm=dev[3:],
                             eps=eps, **kw)
    assert packed.batch_norm and packed.device == device and packed.dtype == np.float32
    check(nbops.conv_bn(dev[0], packed), z, np.float32, k=wt[0].size * 4)
    check(nbops.conv_bn_relu(dev[0], packed), np.maximum(z, 0), np.float32, k=wt[0].size * 4)
    # the same numbers as the unpacked fused op
    np.testing.assert_allclose(host(nbops.conv_bn_relu(dev[0], packed)),
                               host(nbops.conv_bn_relu(*dev, eps=eps, **kw)),
                               rtol=1e-5, atol=1e-5)


def test_packed_conv1d_and_out():
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((2, 4, 11)), rng.standard_normal((6, 2, 3)), \
        rng.standard_normal(6)
    packed = nbops.conv_pack(w, b, input_shape=x.shape, stride=2, padding=1, groups=2)
    assert packed.stride == (2,) and packed.padding == (1,) and packed.groups == 2
    out = np.empty(packed.output_shape)
    got = nbops.conv1d(x, packed, out=out)
    assert got is out
    check(out, ref_conv1d(x, w, b, 2, 1, 1, 2), k=6)
    check(nbops.conv_relu(x, packed), np.maximum(ref_conv1d(x, w, b, 2, 1, 1, 2), 0), k=6)


def test_geometry_is_named_and_kernels_get_a_plain_tuple(monkeypatch):
    # the fronts plan with a ConvGeometry (1-D: unit height); the kernels get
    # tuple(geo), since a named tuple is another Numba type and would compile
    # every conv kernel a second time
    geo, shape = conv_mod._geometry("t", 1, np.zeros((2, 4, 11)), np.zeros((6, 2, 3)), 2, 1,
                                    1, 2)
    assert geo == conv_mod.ConvGeometry(c=4, h=1, w=11, kh=1, kw=3, sh=1, sw=2, ph=0, pw=1,
                                        dh=1, dw=1, oh=1, ow=6, groups=2, co=6)
    assert shape == (2, 6, 6)
    from nbops import _dispatch

    seen = []
    for name, at in (("conv2d", 5), ("im2col", 1), ("col2im", 1)):
        def spy(*args, _real=_dispatch.kernel(f"conv.{name}", _dispatch.CPU), _at=at,
                _name=name, **kwargs):
            seen.append((_name, type(args[_at])))
            return _real(*args, **kwargs)
        monkeypatch.setitem(_dispatch._KERNELS, (f"conv.{name}", _dispatch.CPU), spy)
    x, w = np.ones((1, 4, 5, 5)), np.ones((6, 2, 3, 3))
    nbops.conv2d(x, w, groups=2)
    nbops.conv2d(x, nbops.conv_pack(w, input_shape=x.shape, groups=2))
    nbops.sum(nbops.conv2d(Tensor(x, requires_grad=True), Tensor(w, requires_grad=True),
                           groups=2)).backward()
    assert sorted(set(seen)) == [("col2im", tuple), ("conv2d", tuple), ("im2col", tuple)]


def test_packed_conv_errors():
    x = np.zeros((1, 4, 5, 5))
    packed = nbops.conv_pack(W4, input_shape=x.shape, groups=2, padding=1)
    with pytest.raises(ValueError, match=r"conv2d: 'x' has shape \(2, 4, 5, 5\) but the weight "
                                         r"was packed for input shape \(1, 4, 5, 5\)"):
        nbops.conv2d(np.zeros((2, 4, 5, 5)), packed)
    with pytest.raises(TypeError, match="'x' is float32 but the weight was packed for float64"):
        nbops.conv2d(x.astype(np.float32), packed)
    with pytest.raises(ValueError, match="differ from the packed weight's"):
        nbops.conv2d(x, packed, stride=2)
    with pytest.raises(ValueError, match="differ from the packed weight's"):
        nbops.conv_relu(x, packed, dilation=2, padding=2)
    with pytest.raises(ValueError, match="'bias' must be None with a packed weight"):
        nbops.conv2d(x, packed, np.zeros(6))
    with pytest.raises(ValueError, match=r"'residual' must have the output's shape"):
        nbops.conv2d(x, packed, residual=np.zeros((1, 6, 3, 3)))
    with pytest.raises(ValueError, match="conv_bn_relu: the packed weight has no batch norm"):
        nbops.conv_bn_relu(x, packed)
    c = np.ones(6)
    bn_packed = nbops.conv_pack(W4, input_shape=x.shape, groups=2, batch_norm=(c, c, c, c))
    with pytest.raises(ValueError, match="with a packed weight bn_mean, bn_var must be left"):
        nbops.conv_bn(x, bn_packed, None, c, c)
    with pytest.raises(TypeError, match="conv_bn: argument 'bn_mean' must be"):
        nbops.conv_bn(x, W4, groups=2)  # no statistics and no pack
    with pytest.raises(TypeError, match="'x' is on cuda but the weight was packed on cpu"):
        nbops.conv2d(to_dev(x, "cuda"), packed)
    # packing checks what conv2d checks, on the input shape
    with pytest.raises(ValueError, match=r"conv_pack: 'weight' \(6, 2, 3, 3\) expects 2 input.*'x' has 3"):
        nbops.conv_pack(W4, input_shape=(1, 3, 5, 5))
    with pytest.raises(ValueError, match="conv_pack: argument 'x' must be 4-D"):
        nbops.conv_pack(W4, input_shape=(4, 5, 5), groups=2)
    with pytest.raises(TypeError, match="'input_shape' must be a tuple of ints"):
        nbops.conv_pack(W4, input_shape=5, groups=2)
    with pytest.raises(TypeError, match="'batch_norm' must be a tuple"):
        nbops.conv_pack(W4, input_shape=x.shape, groups=2, batch_norm=(c, c))
    with pytest.raises(ValueError, match=r"conv_pack: argument 'bias' must have shape \(6,\)"):
        nbops.conv_pack(W4, np.zeros(5), input_shape=x.shape, groups=2)
    with pytest.raises(ValueError, match="conv_pack: argument 'weight' must be 4-D"):
        nbops.conv_pack(W4[0, 0], input_shape=x.shape)
    # inference only: no gradient through a pack
    t = Tensor(x, requires_grad=True)
    y = nbops.conv2d(t, packed)
    with pytest.raises(TypeError, match="no gradient through a packed weight"):
        nbops.sum(y).backward()


# ---------------------------------------------------------------------------
# Bench cases (the Bench entries of conv2d's spec)


@pytest.mark.parametrize("name", ["conv2d_3x3", "conv2d_1x1", "conv2d_depthwise_3x3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bench_cases_check_out(name, dtype, device):
    if device == "cuda" and name != "conv2d_depthwise_3x3" and nbops._dispatch.cuda_simulated():
        # 64 x 64 channels: the simulator's Python thread per output pixel
        # takes minutes over them
        pytest.skip("dense bench cases are too slow for the CUDA simulator")
    check_bench_case(name, dtype, device, "conv")


# ---------------------------------------------------------------------------
# nn modules and fuse_modules


def test_conv_modules():
    from nbops import nn

    layer = nn.Conv2d(4, 6, (3, 2), stride=2, padding=1, groups=2, rng=0, dtype=np.float64)
    assert [k for k, _ in layer.named_parameters()] == ["weight", "bias"]
    assert layer.weight.shape == (6, 2, 3, 2)
    x = np.random.default_rng(0).standard_normal((1, 4, 7, 6))
    with nbops.no_grad():
        y = layer(x)
    check(y, ref_conv2d(x, layer.weight.data, layer.bias.data, (2, 2), (1, 1), (1, 1), 2), k=12)
    y = layer(x)  # recorded: gradients reach the parameters
    y.sum().backward()
    assert layer.weight.grad.shape == layer.weight.shape
    np.testing.assert_allclose(layer.bias.grad, np.full(6, y.shape[2] * y.shape[3]))
    c1 = nn.Conv1d(2, 3, 3, padding="same", bias=False, rng=1, dtype=np.float64)
    with nbops.no_grad():
        check(c1(x[:, :2, 0]), ref_conv1d(x[:, :2, 0], c1.weight.data, None, 1, "same"), k=6)
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(4, 6, 3, groups=4)
    with pytest.raises(TypeError, match="Conv2d: argument 'in_channels' must be an int"):
        nn.Conv2d(4.0, 6, 3)
    with pytest.raises(ValueError, match="Conv1d: argument 'groups' must be >= 1"):
        nn.Conv1d(4, 6, 3, groups=0)
    with pytest.raises(ValueError, match="'kernel_size' must be an int or a tuple of 2 ints"):
        nn.Conv2d(4, 6, (3,))


def _randomise_bn(bn, rng):
    c = bn.num_features
    bn.running_mean[:] = rng.standard_normal(c)
    bn.running_var[:] = rng.uniform(0.5, 2.0, c)
    bn.weight.data[:] = rng.standard_normal(c)
    bn.bias.data[:] = rng.standard_normal(c)


def test_fuse_modules():
    from nbops import nn

    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, rng=0), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1, rng=1), nn.BatchNorm2d(4),
                          nn.Conv2d(4, 4, 3, groups=4, rng=2), nn.ReLU())
    for bn in (model[1], model[4]):
        _randomise_bn(bn, rng)
    with pytest.raises(ValueError, match="training mode"):
        nn.fuse_modules(model)
    model.eval()
    x = rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    with nbops.no_grad():
        want = model(x)
        nn.fuse_modules(model)
        got = model(x)
    assert [type(m).__name__ for m in model] == ["FusedConv"] * 3
    assert [m.relu for m in model] == [True, False, True]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fuse_modules_named_groups():
    from nbops import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 3, padding=1, rng=0)
            self.bn = nn.BatchNorm1d(3)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.bn(self.conv(x)) + 1.0)

    rng = np.random.default_rng(1)
    block = Block()
    _randomise_bn(block.bn, rng)
    block.eval()
    x = rng.standard_normal((2, 2, 8)).astype(np.float32)
    with nbops.no_grad():
        want = block(x)
        nn.fuse_modules(block)  # not a Sequential: left alone
        assert type(block.bn).__name__ == "BatchNorm1d"
        nn.fuse_modules(block, [["conv", "bn"]])
        got = block(x)
    assert type(block.bn).__name__ == "Identity"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="must name a Conv1d/Conv2d"):
        nn.fuse_modules(block, [["relu", "conv"]])
