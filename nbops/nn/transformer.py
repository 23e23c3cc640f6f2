"""Transformer modules: ``MultiheadAttention`` and ``TransformerEncoderLayer``,
with PyTorch's parameter names and layout, on nbops' fused attention.

Inputs may be arrays or tensors, as for the other layers: while gradients
are recorded, outputs are :class:`~nbops.Tensor` and ``backward`` reaches
every parameter; under :func:`nbops.no_grad` arrays in give arrays out.
Weights exported from PyTorch load by name with ``load_state_dict``.
"""

import math

import numpy as np

from .. import _checks, _dispatch, _layout, activations, arith, linalg, tensor
from ..attention import scaled_dot_product_attention
from ..autograd import _is_tensor
from .layers import Dropout, Linear, _dtype, _operands, _rng
from .module import Module, Parameter
from .normalization import LayerNorm

__all__ = ["MultiheadAttention", "TransformerEncoderLayer"]


class MultiheadAttention(Module):
    """Multi-head attention (``torch.nn.MultiheadAttention``).

    ``out = out_proj(concat_h(attention(q W_q^h, k W_k^h, v W_v^h)))`` with
    ``num_heads`` heads of ``embed_dim // num_heads`` dimensions, the
    attention being :func:`nbops.scaled_dot_product_attention` (fused, no
    L x S matrix unless ``need_weights``).

    Parameters
    ----------
    embed_dim, num_heads : int
        ``embed_dim`` must be divisible by ``num_heads``.
    bias : bool
        ``in_proj_bias`` (3E) and ``out_proj.bias``.
    batch_first : bool
        Inputs (batch, seq, feature) when True (default here), else
        (seq, batch, feature). Unbatched (seq, feature) inputs work too.
    kdim, vdim : int, optional
        Feature sizes of key and value (default embed_dim). When either
        differs, the projections are ``q_proj_weight`` (E, E),
        ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim) instead of
        ``in_proj_weight`` (3E, E), as in PyTorch.
    dropout : float
        Only 0.0: the fused kernel has no dropout of attention weights
        (ValueError otherwise).
    dtype, rng : float32 (default) or float64; a Generator or seed.

    Initialisation as PyTorch: Xavier-uniform projections, zero biases,
    ``out_proj.weight`` as ``nn.Linear``.

    forward(query, key, value, key_padding_mask=None, attn_mask=None,
    is_causal=False, need_weights=False) returns ``(output, weights)``:

    * ``key_padding_mask`` (batch, S): bool, True marks padding to ignore
      (PyTorch's convention, the opposite of the attention op's), or float,
      added to the scores.
    * ``attn_mask`` (L, S) or (batch * num_heads, L, S): bool (True = not
      allowed, PyTorch's convention) or float (added).
    * ``is_causal``: query i sees keys j <= i; unlike PyTorch, where it is
      only a hint about ``attn_mask``, it needs no ``attn_mask``.
    * ``need_weights``: also return the attention weights averaged over
      heads, (batch, L, S), computed from an explicit score matrix (no
      gradient); otherwise ``weights`` is None.

    Raises ValueError for sizes below 1 or that do not fit (embed_dim not
    divisible by num_heads, feature sizes or batch sizes that differ from
    the parameters', masks of the wrong shape) and TypeError for non-int
    sizes and mask dtypes.

    >>> mha = nbops.nn.MultiheadAttention(16, 4, rng=0)
    >>> x = np.ones((2, 5, 16), np.float32)
    >>> with nbops.no_grad():
    ...     y, _ = mha(x, x, x, is_causal=True)
    >>> y.shape
    (2, 5, 16)
    """

    def __init__(self, embed_dim, num_heads, bias=True, batch_first=True, kdim=None,
                 vdim=None, dropout=0.0, dtype=np.float32, rng=None):
        super().__init__()
        name = "MultiheadAttention"
        embed_dim = _checks.int_arg(name, "embed_dim", embed_dim, low=1)
        num_heads = _checks.int_arg(name, "num_heads", num_heads, low=1)
        kdim = embed_dim if kdim is None else _checks.int_arg(name, "kdim", kdim, low=1)
        vdim = embed_dim if vdim is None else _checks.int_arg(name, "vdim", vdim, low=1)
        if embed_dim % num_heads:
            raise ValueError(f"{name}: embed_dim ({embed_dim}) must be divisible by "
                             f"num_heads ({num_heads})")
        p = _checks.scalar(name, "dropout", dropout, low=0.0, high=1.0)
        if p != 0.0:
            raise ValueError(f"{name}: dropout={p} is not supported: the fused attention "
                             "kernel has no dropout of attention weights; use 0.0")
        dtype = _dtype(name, dtype)
        rng = _rng(rng)
        E = self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = E // self.num_heads
        self.kdim, self.vdim = kdim, vdim
        self.batch_first = bool(batch_first)
        self.dropout = 0.0
        self._qkv_same_embed_dim = self.kdim == E and self.vdim == E

        def xavier(rows, cols):
            bound = math.sqrt(6.0 / (rows + cols))
            return Parameter(rng.uniform(-bound, bound, (rows, cols)).astype(dtype))

        if self._qkv_same_embed_dim:
            self.in_proj_weight = xavier(3 * E, E)
        else:
            self.q_proj_weight = xavier(E, E)
            self.k_proj_weight = xavier(E, self.kdim)
            self.v_proj_weight = xavier(E, self.vdim)
        self.in_proj_bias = Parameter(np.zeros(3 * E, dtype)) if bias else None
        self.out_proj = Linear(E, E, bias=bias, dtype=dtype, rng=rng)
        if bias:
            self.out_proj.bias.data[...] = 0

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}")

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None,
                is_causal=False, need_weights=False):
        name = "MultiheadAttention"
        E, H, hd = self.embed_dim, self.num_heads, self.head_dim
        unbatched = query.ndim == 2
        for arg, x, feat in (("query", query, E), ("key", key, self.kdim),
                             ("value", value, self.vdim)):
            if x.ndim != (2 if unbatched else 3):
                raise ValueError(f"{name}: '{arg}' must be {'2' if unbatched else '3'}-D like "
                                 f"'query', got shape {tuple(x.shape)}")
            if tuple(x.shape)[-1] != feat:
                raise ValueError(f"{name}: '{arg}' must have {feat} features (last axis), "
                                 f"got shape {tuple(x.shape)}")
        if unbatched:
            query, key, value = (tensor.reshape(x, (1,) + tuple(x.shape))
                                 for x in (query, key, value))
        elif not self.batch_first:
            query, key, value = (_swap01(x) for x in (query, key, value))
        B, L = query.shape[0], query.shape[1]
        S = key.shape[1]
        if key.shape[0] != B or value.shape[0] != B or value.shape[1] != S:
            raise ValueError(f"{name}: batch and sequence sizes of 'query' "
                             f"{tuple(query.shape)}, 'key' {tuple(key.shape)} and 'value' "
                             f"{tuple(value.shape)} do not fit (key and value need one "
                             "length, all one batch)")
        q, k, v = self._project(query, key, value)
        mask = self._mask(key_padding_mask, attn_mask, B, L, S, query)
        heads = [_split_heads(x, B, n, H, hd) for x, n in ((q, L), (k, S), (v, S))]
        o = scaled_dot_product_attention(*heads, mask, bool(is_causal))
        o = tensor.reshape(_transpose_12(o), (B, L, E))
        weight, bias = _operands(o, self.out_proj.weight, self.out_proj.bias)
        out = linalg.linear(o, weight, bias)
        weights = self._weights(heads, mask, is_causal, hd) if need_weights else None
        if unbatched:
            out = tensor.reshape(out, (L, E))
            weights = None if weights is None else weights[0]
        elif not self.batch_first:
            out = _swap01(out)
        return out, weights

    def _project(self, query, key, value):
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w, b = _operands(query, self.in_proj_weight, self.in_proj_bias)
            if query is key and key is value:  # self-attention: one GEMM
                qkv = linalg.linear(query, w, b)
                return tensor.split(qkv, [E, E, E], axis=-1)
            ws = tensor.split(w, [E, E, E], axis=0)
        else:
            ws = _operands(query, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            b = _operands(query, self.in_proj_bias)[0]
        bs = (None,) * 3 if b is None else tensor.split(b, [E, E, E], axis=0)
        return tuple(linalg.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), ws, bs))

    def _mask(self, key_padding_mask, attn_mask, B, L, S, like):
        """One mask in the attention op's convention (bool True = attend, or
        additive float), broadcastable to (B, H, L, S)."""
        name = "MultiheadAttention"
        data = like.data if _is_tensor(like) else like
        dev = _dispatch.device_of_array(data)
        parts = []
        for arg, m, shapes in (("key_padding_mask", key_padding_mask, ((B, S),)),
                               ("attn_mask", attn_mask, ((L, S), (B * self.num_heads, L, S)))):
            if m is None:
                continue
            m = _dispatch.to_host(m)
            if m.dtype != np.bool_ and m.dtype != data.dtype:
                raise TypeError(f"{name}: '{arg}' must be bool or {data.dtype}, got {m.dtype}")
            if tuple(m.shape) not in shapes:
                raise ValueError(f"{name}: '{arg}' must have shape "
                                 f"{' or '.join(str(s) for s in shapes)}, got {tuple(m.shape)}")
            if arg == "key_padding_mask":
                m = m.reshape(B, 1, 1, S)
            elif m.ndim == 3:
                m = m.reshape(B, self.num_heads, L, S)
            parts.append(m)
        if not parts:
            return None
        if all(m.dtype == np.bool_ for m in parts):
            allowed = ~parts[0] if len(parts) == 1 else ~(parts[0] | parts[1])
            mask = np.ascontiguousarray(allowed)
        else:
            neg = data.dtype.type(-np.inf)
            adds = [np.where(m, neg, data.dtype.type(0)) if m.dtype == np.bool_ else m
                    for m in parts]
            mask = np.ascontiguousarray(adds[0] if len(adds) == 1 else adds[0] + adds[1])
        return _dispatch.to_device(mask) if dev == _dispatch.CUDA else mask

    def _weights(self, heads, mask, is_causal, hd):
        # explicit (B, H, L, S) scores, only when asked for; no gradient
        q, k = (np.asarray(_dispatch.to_host(x.data if _is_tensor(x) else x), np.float64)
                for x in heads[:2])
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(hd)
        if mask is not None:
            m = _dispatch.to_host(mask)
            s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m
        if is_causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(top), top, 0))
        tot = e.sum(axis=-1, keepdims=True)
        w = (np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0)).mean(axis=1)
        w = w.astype(heads[0].dtype)
        data = heads[0].data if _is_tensor(heads[0]) else heads[0]
        return _dispatch.to_device(w) if _dispatch.device_of_array(data) == _dispatch.CUDA else w


def _view(x, shape, strides):
    """A strided view of an array or a tensor (differentiable for tensors)."""
    if _is_tensor(x):
        raise TypeError("internal: tensors are viewed through Tensor.transpose")
    return _layout.strided_view(x, shape, strides)


def _permuted(x, axes):
    if _is_tensor(x):
        return x.transpose(axes)
    if isinstance(x, np.ndarray):
        return x.transpose(axes)
    shape, st = tuple(x.shape), tuple(x.strides)
    return _view(x, tuple(shape[a] for a in axes), tuple(st[a] for a in axes))


def _swap01(x):
    return _permuted(x, (1, 0, 2))


def _transpose_12(x):
    return _permuted(x, (0, 2, 1, 3))


def _split_heads(x, B, n, H, hd):
    """(B, n, H*hd) -> (B, H, n, hd) as a view (attention reads any strides)."""
    return _transpose_12(tensor.reshape(x, (B, n, H, hd)))


class TransformerEncoderLayer(Module):
    """One Transformer encoder layer (``torch.nn.TransformerEncoderLayer``):
    self-attention and a feed-forward block, each with a residual and a
    layer norm, after the sublayer (``norm_first=False``, post-norm, the
    original) or before it (pre-norm).

    Post-norm: ``x = norm1(x + sa(x)); x = norm2(x + ff(x))``.
    Pre-norm: ``x = x + sa(norm1(x)); x = x + ff(norm2(x))``.
    ``ff(x) = linear2(dropout(activation(linear1(x))))``, the activation fused
    into ``linear1``'s GEMM epilogue.

    Parameters: ``d_model``, ``nhead`` (divisible), ``dim_feedforward``
    (2048), ``dropout`` (0.0: on the residual branches and inside ff, as
    PyTorch; attention weights themselves are not dropped),
    ``activation`` ("relu" or "gelu"), ``norm_first``, ``batch_first``
    (True), ``layer_norm_eps`` (1e-5), ``dtype``, ``rng``. Submodules and
    parameters carry PyTorch's names: ``self_attn``, ``linear1``,
    ``linear2``, ``norm1``, ``norm2``.

    forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False):
    masks as :class:`MultiheadAttention`'s ``attn_mask`` and
    ``key_padding_mask``. Raises as its parts do, and ValueError for an
    unknown activation.

    >>> layer = nbops.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, rng=0)
    >>> with nbops.no_grad():
    ...     layer(np.ones((2, 5, 16), np.float32)).shape
    (2, 5, 16)
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.0, activation="relu",
                 norm_first=False, batch_first=True, layer_norm_eps=1e-5, dtype=np.float32,
                 rng=None):
        super().__init__()
        name = "TransformerEncoderLayer"
        _checks.choice(name, "activation", activation, ("relu", "gelu"))
        rng = _rng(rng)
        self.self_attn = MultiheadAttention(d_model, nhead, batch_first=batch_first,
                                            dtype=dtype, rng=rng)
        self.linear1 = Linear(d_model, dim_feedforward, dtype=dtype, rng=rng)
        self.linear2 = Linear(dim_feedforward, d_model, dtype=dtype, rng=rng)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(dropout, rng=rng)
        self.dropout1 = Dropout(dropout, rng=rng)
        self.dropout2 = Dropout(dropout, rng=rng)
        self.activation = activation
        self.norm_first = bool(norm_first)

    def extra_repr(self):
        return f"activation={self.activation!r}, norm_first={self.norm_first}"

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = arith.add(x, self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            return arith.add(x, self._ff(self.norm2(x)))
        x = self.norm1(arith.add(x, self._sa(x, src_mask, src_key_padding_mask, is_causal)))
        return self.norm2(arith.add(x, self._ff(x)))

    def _sa(self, x, mask, padding, is_causal):
        y, _ = self.self_attn(x, x, x, key_padding_mask=padding, attn_mask=mask,
                              is_causal=is_causal)
        return self.dropout1(y)

    def _ff(self, x):
        w, b = _operands(x, self.linear1.weight, self.linear1.bias)
        h = self.dropout(linalg.linear(x, w, b, activation=self.activation))
        return self.dropout2(self.linear2(h))
