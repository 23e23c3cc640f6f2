"""A graph convolutional network on a k-nearest-neighbour graph of the digits.

Every image (training and test) is a node; each is joined to its ``K``
nearest neighbours by pixel distance (the distances through one
:func:`nbops.matmul`), the edges made symmetric and stored as a CSR matrix
(:mod:`nbops.sparse`), normalised once to ``D^-1/2 (A + I) D^-1/2``
(:func:`nbops.sparse.gcn_norm`). The two-layer GCN

    GraphConv(64, 32) -> relu -> GraphConv(32, 10)

is trained full-batch (transductive: the test nodes are in the graph, their
labels are not in the loss). The loss reads the training nodes' rows through
a selection matrix, itself a CSR matrix, so the gradient flows back through
two sparse products.

Run: ``python examples/digits_gcn.py [--quick] [--device cpu|cuda] [--seed N]``
"""

import time

import numpy as np

import nbops
from nbops import nn, sparse

from . import _common as C

#: Full-batch steps (full, quick) and neighbours per node.
EPOCHS = (100, 30)
K = 10


def knn_graph(features, k):
    """The symmetric k-nearest-neighbour adjacency of the rows of
    ``features`` as a float32 CSRMatrix (self excluded; unit weights)."""
    n = len(features)
    sq = (features * features).sum(axis=1)
    # |a - b|^2 = |a|^2 + |b|^2 - 2 a.b, the product on nbops' GEMM
    dist = sq[:, None] + sq[None, :] - 2 * nbops.matmul(features, features.T)
    np.fill_diagonal(dist, np.inf)
    nearest = np.argpartition(dist, k, axis=1)[:, :k]
    rows = np.repeat(np.arange(n), k)
    cols = nearest.reshape(-1)
    # both directions, each edge once
    keys = np.unique(np.concatenate([rows * n + cols, cols * n + rows]))
    coo = np.stack([keys // n, keys % n])
    return sparse.from_coo(coo, np.ones(len(keys), np.float32), (n, n))


def selection(rows, n):
    """The (len(rows), n) CSR matrix that picks ``rows`` of an n-row matrix."""
    m = len(rows)
    return sparse.from_coo(np.stack([np.arange(m), rows]), np.ones(m, np.float32), (m, n))


class GCN(nn.Module):
    """Two graph convolutions with a relu between."""

    def __init__(self, rng, hidden=32):
        super().__init__()
        self.conv1 = nn.GraphConv(64, hidden, rng=rng)
        self.conv2 = nn.GraphConv(hidden, 10, rng=rng)

    def forward(self, adj, x):
        return self.conv2(adj, nbops.relu(self.conv1(adj, x)))


def run(cfg, data=None):
    """Build the graph and train the GCN; returns ``(results, history, {})``."""
    data = data or C.load_digits(cfg)
    rng = np.random.default_rng(cfg.seed)
    n_train = len(data.x_train)
    features = np.concatenate([data.x_train, data.x_test]).reshape(-1, 64)
    features = np.ascontiguousarray(features, dtype=np.float32)
    test_rows = np.arange(n_train, len(features))
    with C.CompileClock() as clock:
        t0 = time.perf_counter()
        k = cfg.size(K, 3)
        adj = sparse.gcn_norm(knn_graph(features, k))
        pick = selection(np.arange(n_train), len(features))
        graph_s = time.perf_counter() - t0
        if cfg.device == "cuda":
            adj, pick = adj.to_device(), pick.to_device()
        x, y = C.move(cfg, features), C.move(cfg, data.y_train)
        model = GCN(rng, cfg.size(32, 2)).to(cfg.device)
        opt = nbops.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)

        def step(idx):   # full batch: the indices are not used
            loss = nn.cross_entropy(sparse.mm(pick, model(adj, x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return C.loss_value(loss)

        def predict():
            with nbops.no_grad():
                return C.host(model(adj, x))[test_rows]

        def evaluate():
            return C.accuracy(predict(), data.y_test)

        history, train_s = C.train(cfg, "gcn", 1, 1, cfg.epochs(*EPOCHS), step, evaluate)
    def full_graph(_):
        with nbops.no_grad():
            return model(adj, x)

    forward = C.latency(full_graph, None)
    result = C.Result("gcn", evaluate(), train_s, device=cfg.device, compile_s=clock.seconds,
                      note=f"{len(features)} nodes, {adj.nnz} nonzeros (k={k}); graph "
                           f"{graph_s * 1e3:.0f} ms, full-graph forward "
                           f"{forward * 1e3:.2f} ms")
    return [result], history, {}


def main(argv=None):
    """Run this task on its own (``python -m nbops demo --only gcn``): its
    rows of the summary table and its plots. Returns the exit status."""
    from . import main as demo_main

    return demo_main(argv, task="gcn")

