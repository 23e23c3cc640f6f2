"""A tiny Transformer classifier that reads each 8x8 digit as 8 row tokens.

Each image row (8 pixels) is a token:

    Linear(8, 32) + sinusoidal positional encoding
    -> TransformerEncoderLayer(32, 4 heads, feed-forward 64, gelu)
    -> flatten the 8 tokens -> Linear(256, 10)

The attention is :func:`nbops.scaled_dot_product_attention` (fused, online
softmax), with layer norms and residuals around it; trained with Adam on
cross-entropy, backward through the whole layer.

Run: ``python examples/digits_transformer.py [--quick] [--device cpu|cuda] [--seed N]``
"""

import numpy as np

import nbops
from nbops import nn

from . import _common as C

#: Epochs (full, quick), batch size, model width.
EPOCHS = (12, 3)
BATCH = 64
D_MODEL = 32


class RowTransformer(nn.Module):
    """Row tokens -> one encoder layer -> a linear classifier."""

    def __init__(self, rng, d_model=D_MODEL, nhead=4):
        super().__init__()
        self.embed = nn.Linear(8, d_model, rng=rng)
        self.encoder = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2 * d_model,
                                                  activation="gelu", rng=rng)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(8 * d_model, 10, rng=rng)
        # a buffer, so that to() moves it; derived from the sizes, so not saved
        self.register_buffer("pe", nbops.positional_encoding(8, d_model), persistent=False)

    def forward(self, rows):
        return self.head(self.flatten(self.encoder(nbops.add(self.embed(rows), self.pe))))


def run(cfg, data=None):
    """Train the Transformer; returns ``(results, history, {})``."""
    data = data or C.load_digits(cfg)
    rng = np.random.default_rng(cfg.seed)
    d_model, nhead = cfg.size(D_MODEL, 2), cfg.size(4, 1)
    model = RowTransformer(rng, d_model, nhead).to(cfg.device)
    opt = nbops.optim.Adam(model.parameters(), lr=2e-3)
    x_test = C.move(cfg, data.x_test)

    def step(idx):
        loss = nn.cross_entropy(model(C.move(cfg, data.x_train[idx])),
                                C.move(cfg, data.y_train[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return C.loss_value(loss)

    def infer(images):
        with nbops.no_grad():
            return model(C.move(cfg, images))

    def evaluate():
        return C.accuracy(infer(x_test), data.y_test)

    with C.CompileClock() as clock:
        history, train_s = C.train(cfg, "transformer", len(data.x_train), BATCH,
                                   cfg.epochs(*EPOCHS), step, evaluate)
    params = sum(p.data.size for p in model.parameters())
    result = C.Result("transformer", evaluate(), train_s, C.latency(infer, data.x_test[:1]),
                      C.latency(infer, data.x_test[:256]), cfg.device, clock.seconds,
                      f"8 row tokens, d_model {d_model}, {nhead} heads, {params} parameters")
    return [result], history, {}


def main(argv=None):
    """Run this task on its own (``python -m nbops demo --only transformer``): its
    rows of the summary table and its plots. Returns the exit status."""
    from . import main as demo_main

    return demo_main(argv, task="transformer")

