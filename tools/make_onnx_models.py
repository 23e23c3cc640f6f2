"""Generate the real-weight ONNX test models under tests/data/ (run offline,
once; the outputs are committed).

* ``digits_cnn.onnx``: a small CNN (Conv-BN-ReLU-MaxPool x2, Linear) trained
  for a few epochs on scikit-learn's bundled 8x8 digits.
* ``tiny_transformer.onnx``: a 2-block transformer encoder (4-head
  self-attention, post-LayerNorm, GELU feed-forward) over the digits' 8 rows as 8 tokens of 8
  features, trained to classify them.

Each model is exported with torch (TorchScript exporter, opset 17, a
symbolic batch) and stored beside ``<name>.npz`` holding a batch of test
inputs (``x``) and torch's outputs for them (``y``), which
tests/test_onnx_models.py compares nbops.onnx with. Needs torch (``pip
install torch==2.13.0``) and scikit-learn; tests never import torch.

    python tools/make_onnx_models.py [--out tests/data]
"""

import argparse
import os

import numpy as np


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    return x, d.target.astype(np.int64)


def _models(torch):
    nn = torch.nn

    cnn = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 2 * 2, 10))

    class Block(nn.Module):
        # written out (not nn.TransformerEncoderLayer): torch exports
        # nn.MultiheadAttention with Mod/shape checks on the symbolic batch
        def __init__(self, d=32, heads=4, ff=64):
            super().__init__()
            self.heads, self.d = heads, d
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

        def forward(self, h):                 # (N, 8, d)
            hd = self.d // self.heads
            q, k, v = self.qkv(h).reshape(-1, 8, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5, dim=-1)
            h = self.ln1(h + self.proj((att @ v).transpose(1, 2).reshape(-1, 8, self.d)))
            return self.ln2(h + self.ff(h))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 32)
            self.pos = nn.Parameter(torch.randn(1, 8, 32) * 0.1)
            self.blocks = nn.Sequential(Block(), Block())
            self.head = nn.Linear(32, 10)

        def forward(self, x):                 # x: (N, 1, 8, 8) -> 8 tokens of 8 features
            h = self.embed(x.reshape(-1, 8, 8)) + self.pos
            return self.head(self.blocks(h).mean(dim=1))

    return {"digits_cnn": cnn, "tiny_transformer": Transformer()}


def _train(torch, model, x, y, epochs):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(xt).argmax(1) == yt).float().mean())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                 "data"))
    p.add_argument("--epochs", type=int, default=8)
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    x, y = _digits()
    os.makedirs(args.out, exist_ok=True)
    sample = x[:16]
    for name, model in _models(torch).items():
        acc = _train(torch, model, x[:1500], y[:1500], args.epochs)
        path = os.path.join(args.out, name + ".onnx")
        with torch.no_grad():
            ref = model(torch.from_numpy(sample)).numpy()
            torch.onnx.export(model, (torch.from_numpy(sample[:1]),), path, dynamo=False,
                              opset_version=17, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
        np.savez(os.path.join(args.out, name + ".npz"), x=sample, y=ref)
        print(f"{path}: {os.path.getsize(path)} bytes, train accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
