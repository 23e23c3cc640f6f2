"""scaled_dot_product_attention, positional_encoding, nn.MultiheadAttention and
nn.TransformerEncoderLayer against plain NumPy references, on CPU and
(simulated) CUDA.

The references build the explicit score matrix in float64, apply the masks,
a stable softmax (a row with no visible key gives zeros, as PyTorch's
``_safe_softmax``) and the product. CPU cases use small tiles (``TILES``)
so that short sequences still cross query and key tile edges; CUDA cases
are tiny (the simulator runs a thread per CUDA thread).
"""

import math

import numpy as np
import pytest
from scipy import special

import nbops
from nbops import attention, nn
from nbops.autograd import Tensor, gradcheck
from helpers import host, to_dev

#: CPU tiles for the tests: 32 queries (one float32 register-tile width,
#: two float64 ones) by 16 keys.
TILES = {"BQ": 32, "BK": 16}


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")
    monkeypatch.setattr(attention._cpu_forward, "default", dict(TILES))


def reference(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T * scale + mask) v with the L x S matrix, float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    tot = e.sum(axis=-1, keepdims=True)
    return np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0) @ v


def rand(rng, shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def make_mask(rng, kind, shape, dtype):
    if kind is None:
        return None
    keep = rng.random(shape) > 0.35
    if len(shape) >= 2:
        keep[..., 0, :] = False      # a fully masked row
    if kind == "bool":
        return keep
    return np.where(keep, rng.standard_normal(shape), -np.inf).astype(dtype)


# (q batch, k batch, v batch, L, S, D, Dv, causal, mask kind, mask shape, q scale)
CASES = [
    ((2, 3), (2, 3), (2, 3), 5, 7, 4, 6, False, None, None, 1.0),
    ((2,), (1,), (), 37, 37, 8, 8, True, None, None, 1.0),          # tile edges, causal
    ((1, 2), (2,), (1, 2), 45, 20, 8, 3, True, "bool", (45, 20), 1.0),
    ((3,), (3,), (3,), 33, 50, 16, 16, False, "float", (3, 1, 50), 1.0),
    ((2,), (2,), (2,), 40, 17, 8, 8, False, "bool", (2, 40, 17), 1.0),
    ((), (), (), 1, 1, 3, 2, True, None, None, 1.0),                 # length 1
    ((), (), (), 1, 9, 5, 4, False, "bool", (9,), 1.0),
    ((2,), (2,), (2,), 20, 30, 8, 8, False, None, None, 100.0),      # scores ~ 1e4
]


@pytest.mark.parametrize("case", CASES)
def test_forward_cpu_float64(case):
    qb, kb, vb, L, S, D, Dv, causal, kind, mshape, qs = case
    rng = np.random.default_rng(len(qb) + L + S)
    q, k, v = rand(rng, qb + (L, D), scale=qs), rand(rng, kb + (S, D)), rand(rng, vb + (S, Dv))
    mask = make_mask(rng, kind, mshape, np.float64)
    got = nbops.scaled_dot_product_attention(q, k, v, mask, causal)
    want = reference(q, k, v, mask, causal)
    assert got.shape == want.shape and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_forward_cpu_float32_default_tiles(monkeypatch):
    # the documented default tiles, lengths that divide by none of them
    monkeypatch.setattr(attention._cpu_forward, "default", dict(attention.DEFAULT_CONFIG))
    rng = np.random.default_rng(3)
    q, k, v = (rand(rng, (2, 2, n, 24), np.float32) for n in (131, 200, 200))
    mask = make_mask(rng, "bool", (131, 200), np.float32)
    for causal, m in ((False, None), (True, None), (False, mask)):
        got = nbops.scaled_dot_product_attention(q, k, v, m, causal)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, reference(q, k, v, m, causal), rtol=2e-5, atol=2e-6)
    assert not np.any(got[..., 0, :])      # the fully masked row


def test_out_strided_inputs_and_scale():
    rng = np.random.default_rng(4)
    base = rand(rng, (2, 9, 3, 8))                     # (B, L, H, D): heads as a view
    q = base.transpose(0, 2, 1, 3)
    k = np.ascontiguousarray(rand(rng, (2, 3, 8, 10))).swapaxes(-1, -2)  # (2, 3, 10, 8)
    v = rand(rng, (10, 5))
    out = np.empty((2, 3, 9, 5))
    got = nbops.scaled_dot_product_attention(q, k, v, scale=0.3, out=out)
    assert got is out
    np.testing.assert_allclose(out, reference(q, k, v, scale=0.3), rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, (2, 4, 3)), rand(rng, (2, 6, 3)), rand(rng, (2, 6, 2))
    for mask in (np.zeros((4, 6), bool), np.full((2, 4, 6), -np.inf)):
        mask = mask.copy()
        mask[..., 1:, :2] = True if mask.dtype == np.bool_ else 0.0
        tq, tk, tv = (Tensor(x, requires_grad=True) for x in (q, k, v))
        y = nbops.scaled_dot_product_attention(tq, tk, tv, mask)
        assert not np.any(y.data[:, 0]) and np.all(np.isfinite(y.data))
        nbops.sum(y).backward()
        assert not np.any(tq.grad[:, 0])
        assert np.all(np.isfinite(tk.grad)) and np.all(np.isfinite(tv.grad))


GRAD_CASES = [
    ((2,), 3, 4, 3, 2, False, None, None),
    ((2,), 4, 4, 3, 3, True, None, None),
    ((1, 2), 3, 5, 2, 3, False, "bool", (2, 3, 5)),
    ((2,), 5, 3, 2, 2, True, "float", (5, 3)),
]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_gradcheck_cpu(case):
    batch, L, S, D, Dv, causal, kind, mshape = case
    rng = np.random.default_rng(L * 7 + S)
    q, k, v = rand(rng, batch + (L, D)), rand(rng, (S, D)), rand(rng, batch + (S, Dv))
    mask = make_mask(rng, kind, mshape, np.float64)
    if mask is not None and mask.ndim >= 2:
        mask[..., 0, 0] = True if kind == "bool" else 0.0   # finite differences need a key
    ts = [Tensor(x, requires_grad=True) for x in (q, k, v)]
    assert gradcheck(lambda a, b, c: nbops.scaled_dot_product_attention(a, b, c, mask, causal),
                     ts)


def test_cuda_forward_and_backward_match_cpu():
    rng = np.random.default_rng(6)
    for dtype, causal, kind in ((np.float64, True, "bool"), (np.float32, False, "float")):
        q, k, v = rand(rng, (2, 5, 4), dtype), rand(rng, (2, 7, 4), dtype), \
            rand(rng, (2, 7, 6), dtype)
        mask = make_mask(rng, kind, (2, 5, 7), dtype)
        grads = {}
        for dev in ("cpu", "cuda"):
            ts = [Tensor(to_dev(x, dev), requires_grad=True) for x in (q, k, v)]
            y = nbops.scaled_dot_product_attention(*ts, to_dev(mask, dev), causal)
            tol = 1e-12 if dtype == np.float64 else 2e-6
            np.testing.assert_allclose(host(y.data), reference(q, k, v, mask, causal),
                                       rtol=tol, atol=tol)
            y.backward(to_dev(np.ones(y.shape, dtype), dev))
            grads[dev] = [host(t.grad) for t in ts]
        tol = 1e-12 if dtype == np.float64 else 2e-5
        for a, b in zip(grads["cpu"], grads["cuda"]):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_backward_matches_explicit_formula():
    # dL/dq of sum(w * attention): the explicit-matrix gradient, broadcast k
    rng = np.random.default_rng(7)
    q, k, v, w = rand(rng, (3, 6, 4)), rand(rng, (9, 4)), rand(rng, (3, 9, 5)), \
        rand(rng, (3, 6, 5))
    tq, tk, tv = (Tensor(x, requires_grad=True) for x in (q, k, v))
    nbops.scaled_dot_product_attention(tq, tk, tv, causal=True).backward(w)
    s = q @ k.T / 2.0
    s = np.where(np.tril(np.ones((6, 9), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / 2.0
    np.testing.assert_allclose(tq.grad, ds @ k, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tk.grad, (np.swapaxes(ds, -1, -2) @ q).sum(0), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(tv.grad, np.swapaxes(p, -1, -2) @ w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("d_model", [1, 6, 7])
def test_positional_encoding(d_model):
    pe = nbops.positional_encoding(11, d_model)
    assert pe.shape == (11, d_model) and pe.dtype == np.float32
    want = np.empty((11, d_model))
    for pos in range(11):
        for c in range(d_model):
            angle = pos / 10000 ** ((c - c % 2) / d_model)
            want[pos, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    np.testing.assert_allclose(pe, want, rtol=1e-6, atol=1e-7)
    assert nbops.positional_encoding(3, d_model, np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="'d_model' must be >= 1"):
        nbops.positional_encoding(3, 0)
    with pytest.raises(TypeError, match="'max_len' must be an int"):
        nbops.positional_encoding(2.5, 4)


# ---------------------------------------------------------------------------
# nn modules against PyTorch's formulas in NumPy


def mha_reference(m, query, key, value, key_padding_mask=None, attn_mask=None,
                  is_causal=False):
    """torch.nn.MultiheadAttention's forward (batch_first) from its weights."""
    sd = {n: np.asarray(host(a), np.float64) for n, a in m.state_dict().items()}
    E, H = m.embed_dim, m.num_heads
    hd = E // H
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = np.split(sd["in_proj_bias"], 3) if "in_proj_bias" in sd else (0, 0, 0)
    B, L, S = query.shape[0], query.shape[1], key.shape[1]

    def heads(x, n):
        return x.reshape(B, n, H, hd).transpose(0, 2, 1, 3)

    q, k, v = heads(query @ wq.T + bq, L), heads(key @ wk.T + bk, S), heads(value @ wv.T + bv, S)
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)
    for mk, shape in ((key_padding_mask, (B, 1, 1, S)), (attn_mask, None)):
        if mk is None:
            continue
        mk = mk.reshape(shape) if shape else (mk.reshape(B, H, L, S) if mk.ndim == 3 else mk)
        scores = np.where(mk, -np.inf, scores) if mk.dtype == np.bool_ else scores + mk
    if is_causal:
        scores = np.where(np.tril(np.ones((L, S), bool)), scores, -np.inf)
    p = special.softmax(scores, axis=-1)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(B, L, E)
    return o @ sd["out_proj.weight"].T + sd.get("out_proj.bias", 0), p.mean(axis=1)


def test_multihead_attention_matches_pytorch_formula(device):
    rng = np.random.default_rng(8)
    m = nn.MultiheadAttention(8, 2, dtype=np.float64, rng=0)
    assert list(m.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                    "out_proj.bias"]
    m.in_proj_bias.data[...] = rng.standard_normal(24)       # zeros would hide a bias bug
    if device == "cuda":
        m.to("cuda")
    x, mem = rand(rng, (2, 3, 8)), rand(rng, (2, 4, 8))
    kpm = np.array([[False, False, True, False], [False, False, False, False]])
    attn = rand(rng, (3, 4))
    with nbops.no_grad():
        y, w = m(to_dev(x, device), to_dev(mem, device), to_dev(mem, device),
                 key_padding_mask=kpm, attn_mask=attn, need_weights=True)
        ys, _ = m(to_dev(x, device), to_dev(x, device), to_dev(x, device), is_causal=True)
    want, want_w = mha_reference(m, x, mem, mem, kpm, attn)
    np.testing.assert_allclose(host(y), want, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(host(w), want_w, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(host(ys), mha_reference(m, x, x, x, is_causal=True)[0],
                               rtol=1e-11, atol=1e-12)


def test_multihead_attention_kdim_vdim_seq_first_and_grad():
    rng = np.random.default_rng(9)
    m = nn.MultiheadAttention(4, 2, kdim=3, vdim=5, batch_first=False, dtype=np.float64,
                              rng=1)
    assert {"q_proj_weight", "k_proj_weight", "v_proj_weight"} <= set(m.state_dict())
    q, k, v = rand(rng, (3, 2, 4)), rand(rng, (4, 2, 3)), rand(rng, (4, 2, 5))
    mask = np.triu(np.ones((3, 4), bool), 2)                 # PyTorch: True = not allowed
    y, w = m(q, k, v, attn_mask=mask)
    assert w is None
    want = mha_reference(m, *(x.transpose(1, 0, 2) for x in (q, k, v)), attn_mask=mask)[0]
    np.testing.assert_allclose(y.data, want.transpose(1, 0, 2), rtol=1e-11, atol=1e-12)
    nbops.sum(y).backward()
    assert all(p.grad is not None and np.all(np.isfinite(p.grad)) for p in m.parameters())
    tq = Tensor(q, requires_grad=True)
    assert gradcheck(lambda t: m(t, k, v, attn_mask=mask)[0], [tq])


@pytest.mark.parametrize("kwargs,exc,text", [
    (dict(embed_dim=6, num_heads=4), ValueError, "divisible by num_heads"),
    (dict(embed_dim=8, num_heads=2, dropout=0.1), ValueError, "dropout"),
])
def test_multihead_attention_errors(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        nn.MultiheadAttention(**kwargs)


def test_multihead_attention_bad_masks():
    m = nn.MultiheadAttention(4, 2, dtype=np.float64, rng=0)   # float64: no new signatures
    x = np.zeros((2, 3, 4))
    with nbops.no_grad():
        with pytest.raises(ValueError, match="'key_padding_mask' must have shape"):
            m(x, x, x, key_padding_mask=np.zeros((2, 4), bool))
        with pytest.raises(TypeError, match="'attn_mask' must be bool or float64"):
            m(x, x, x, attn_mask=np.zeros((3, 3), np.int64))
        with pytest.raises(ValueError, match="'key' must have 4 features"):
            m(x, x[..., :3], x)


def layer_reference(layer, x):
    sd = {n: np.asarray(a, np.float64) for n, a in layer.state_dict().items()}

    def ln(z, i):
        mu = z.mean(-1, keepdims=True)
        var = z.var(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + 1e-5) * sd[f"norm{i}.weight"] + sd[f"norm{i}.bias"]

    def act(z):
        return np.maximum(z, 0) if layer.activation == "relu" else \
            0.5 * z * special.erfc(-z / math.sqrt(2))

    def sa(z):
        return mha_reference(layer.self_attn, z, z, z)[0]

    def ff(z):
        h = act(z @ sd["linear1.weight"].T + sd["linear1.bias"])
        return h @ sd["linear2.weight"].T + sd["linear2.bias"]

    if layer.norm_first:
        x = x + sa(ln(x, 1))
        return x + ff(ln(x, 2))
    x = ln(x + sa(x), 1)
    return ln(x + ff(x), 2)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_layer(norm_first, activation):
    rng = np.random.default_rng(10)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, activation=activation,
                                       norm_first=norm_first, dtype=np.float64, rng=2)
    x = rand(rng, (2, 5, 8))
    y = layer(x)
    np.testing.assert_allclose(y.data, layer_reference(layer, x), rtol=1e-10, atol=1e-11)
    nbops.sum(nbops.mul(y, y)).backward()
    names = {n for n, p in layer.named_parameters() if p.grad is not None}
    assert names == set(layer.state_dict())
    tx = Tensor(x[:1, :3], requires_grad=True)
    assert gradcheck(lambda t: layer(t), [tx])


def test_transformer_example_trains(capsys):
    import runpy
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "transformer.py"
    before, after, _ = runpy.run_path(str(path))["main"](["--steps", "3", "--batch", "8"])
    assert after < before
    assert "transformer: 3 steps on cpu" in capsys.readouterr().out
