"""Graph layers on :mod:`nbops.sparse`: GraphConv (Kipf and Welling's GCN)."""

import math

import numpy as np

from .. import arith, linalg, sparse
from .layers import _dtype, _operands, _rng
from .module import Module, Parameter

__all__ = ["GraphConv"]


class GraphConv(Module):
    """Graph convolution ``adj @ (x @ weight.T) + bias``.

    ``adj`` is a (nodes, nodes) :class:`nbops.sparse.CSRMatrix`, normally the
    normalised adjacency ``sparse.gcn_norm(A)`` = D^-1/2 (A + I) D^-1/2,
    built once per graph; ``x`` is (nodes, in_features). The features are
    transformed first, then aggregated over the graph by one SpMM, so the
    sparse product runs on the narrower width when ``out_features`` is the
    smaller. ``weight`` is (out_features, in_features), ``bias``
    (out_features,), initialised as :class:`~nbops.nn.Linear`. Gradients
    reach ``weight``, ``bias`` and ``x`` (and ``adj``'s values when they are a
    Tensor that requires grad).

    Parameters: ``in_features``, ``out_features`` (positive ints), ``bias``
    (bool), ``dtype`` (float32 default, or float64), ``rng`` (a
    ``numpy.random.Generator`` or a seed).

    Raises ValueError for bad sizes or an adjacency that is not
    (nodes, nodes) for x's nodes; TypeError when ``adj`` is not a CSRMatrix.

    Example
    -------
    >>> adj = nbops.sparse.gcn_norm(nbops.sparse.from_scipy(graph))
    >>> layer = nbops.nn.GraphConv(16, 8, rng=0)
    >>> h = layer(adj, features)              # (nodes, 8)
    """

    def __init__(self, in_features, out_features, bias=True, dtype=np.float32, rng=None):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"GraphConv: {name} must be a positive int, got {v!r}")
        dtype = _dtype("GraphConv", dtype)
        self.in_features, self.out_features = int(in_features), int(out_features)
        rng = _rng(rng)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features))
                                .astype(dtype))
        self.bias = Parameter(rng.uniform(-bound, bound, out_features).astype(dtype)) \
            if bias else None

    def forward(self, adj, x):
        if not isinstance(adj, sparse.CSRMatrix):
            raise TypeError(f"GraphConv: 'adj' must be a nbops.sparse.CSRMatrix, got "
                            f"{type(adj).__name__}")
        n = x.shape[0]
        if adj.shape != (n, n):
            raise ValueError(f"GraphConv: 'adj' must be ({n}, {n}) for {n} nodes, got "
                             f"{adj.shape}")
        weight, bias = _operands(x, self.weight, self.bias)
        h = sparse.mm(adj, linalg.linear(x, weight))
        return h if bias is None else arith.add(h, bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
