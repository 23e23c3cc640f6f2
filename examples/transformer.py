"""A Transformer encoder layer from nbops operators, trained on a toy task.

Task: sequences of ``length`` tokens from a vocabulary of ``vocab``; at every
position the model must output the token seen at position 0 so far, which
only attention can fetch. The model is

    one-hot tokens -> Linear(vocab, d_model) + positional_encoding
    -> TransformerEncoderLayer(d_model, nhead, causal self-attention)
    -> Linear(d_model, vocab)

trained with Adam on cross-entropy over all positions. The attention is
:func:`nbops.scaled_dot_product_attention` (fused, tiled, online softmax),
and backward runs through the whole layer. The script first prints one
forward pass of the layer on a batch, then the loss before and after
training and the accuracy.

Run: ``python examples/transformer.py [--steps 200] [--norm-first] [--device cpu|cuda]``
"""

import argparse
import time

import numpy as np

import nbops
from nbops import nn


class TinyTransformer(nn.Module):
    def __init__(self, vocab=6, d_model=32, nhead=4, dim_feedforward=64, length=8,
                 norm_first=False, seed=0):
        super().__init__()
        self.embed = nn.Linear(vocab, d_model, rng=seed)
        self.layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward,
                                                activation="gelu", norm_first=norm_first,
                                                rng=seed + 1)
        self.head = nn.Linear(d_model, vocab, rng=seed + 2)
        # a buffer: to() moves it with the weights; derived from the sizes,
        # so it stays out of state_dict()
        self.register_buffer("pe", nbops.positional_encoding(length, d_model),
                             persistent=False)

    def forward(self, onehot):
        x = nbops.add(self.embed(onehot), self.pe)
        return self.head(self.layer(x, is_causal=True))


def make_batch(rng, batch, length, vocab):
    tokens = rng.integers(0, vocab, (batch, length))
    onehot = np.eye(vocab, dtype=np.float32)[tokens]
    target = np.repeat(tokens[:, :1], length, axis=1)  # the first token, everywhere
    return onehot, target.reshape(-1).astype(np.int64)


def train(steps=200, batch=32, length=8, vocab=6, device="cpu", norm_first=False,
          lr=3e-3, seed=0):
    """Train; returns ``(loss_before, loss_after, accuracy, seconds)``."""
    rng = np.random.default_rng(seed)
    model = TinyTransformer(vocab=vocab, length=length, norm_first=norm_first, seed=seed)
    if device == "cuda":
        model.to("cuda")
    move = nbops.to_device if device == "cuda" else (lambda a: a)
    opt = nbops.optim.Adam(model.parameters(), lr=lr)
    vx, vy = make_batch(np.random.default_rng(seed + 100), 64, length, vocab)

    def evaluate():
        with nbops.no_grad():
            logits = model(move(vx))
            flat = nbops.reshape(logits, (-1, vocab))
            loss = float(np.asarray(nbops.to_host(nn.cross_entropy(flat, move(vy)))))
            pred = np.asarray(nbops.to_host(flat)).argmax(axis=1)
        return loss, float((pred == vy).mean())

    before, _ = evaluate()
    start = time.perf_counter()
    for _ in range(steps):
        x, y = make_batch(rng, batch, length, vocab)
        logits = nbops.reshape(model(move(x)), (-1, vocab))
        loss = nn.cross_entropy(logits, move(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    after, accuracy = evaluate()
    return before, after, accuracy, seconds


def demo_forward():
    """One encoder layer on a (batch, seq, d_model) array, without autograd."""
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=8, dim_feedforward=128, rng=0)
    x = np.random.default_rng(0).standard_normal((4, 16, 64)).astype(np.float32)
    x += nbops.positional_encoding(16, 64)
    with nbops.no_grad():
        y = layer(x, src_key_padding_mask=np.arange(16)[None, :] >= np.array([[16], [12],
                                                                             [9], [16]]))
    print(f"encoder layer: {x.shape} -> {y.shape}, parameters "
          f"{sum(p.data.size for p in layer.parameters())}")
    return y


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--norm-first", action="store_true", help="pre-norm layer")
    args = parser.parse_args(argv)
    demo_forward()
    before, after, acc, seconds = train(args.steps, args.batch, device=args.device,
                                        norm_first=args.norm_first)
    print(f"transformer: {args.steps} steps on {args.device} in {seconds:.2f} s: "
          f"loss {before:.3f} -> {after:.3f}, accuracy {acc:.3f}")
    return before, after, acc


if __name__ == "__main__":
    main()
