"""Graph layers on :mod:`nbops.sparse`: GraphConv (Kipf and Welling's GCN)."""

from .. import arith, linalg, sparse
from .layers import Linear, _operands

__all__ = ["GraphConv"]


class GraphConv(Linear):
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

    Parameters (as :class:`~nbops.nn.Linear`, whose parameters and
    initialisation it shares): ``in_features``, ``out_features`` (positive
    ints), ``bias`` (bool), ``dtype`` (float32 default, or float64), ``rng``
    (a ``numpy.random.Generator`` or a seed).

    Raises ValueError for bad sizes or an adjacency that is not
    (nodes, nodes) for x's nodes; TypeError when ``adj`` is not a CSRMatrix.

    Example
    -------
    >>> adj = nbops.sparse.gcn_norm(nbops.sparse.from_scipy(graph))
    >>> layer = nbops.nn.GraphConv(16, 8, rng=0)
    >>> h = layer(adj, features)              # (nodes, 8)
    """

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
