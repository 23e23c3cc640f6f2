"""Train a two-layer MLP with a learnable Swish on a synthetic 4-class problem.

The classes are the quadrant of a 2-D point crossed with "inside/outside the
unit circle" (not linearly separable). The model is
``Linear(2, 64) -> Swish(beta learnable) -> Linear(64, 4)``, trained with
Adam on cross-entropy; the script prints the training accuracy and the
learned beta.

Run: ``python examples/train_mlp.py [--steps 300] [--device cpu|cuda] [--hidden 64]``
"""

import argparse
import time

import numpy as np

import nbops
from nbops import nn


def make_data(n=512, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2.0, 2.0, (n, 2)).astype(dtype)
    outside = np.hypot(x[:, 0], x[:, 1]) > 1.2
    y = (outside.astype(np.int64) + 2 * (x[:, 0] > 0)).astype(np.int64)
    return x, y


def build_model(seed=0, hidden=64):
    return nn.Sequential(nn.Linear(2, hidden, rng=seed), nn.Swish(beta=1.0),
                         nn.Linear(hidden, 4, rng=seed + 1))


def train(steps=300, device="cpu", n=512, lr=0.03, seed=0, hidden=64):
    """Train and return ``(accuracy, beta, seconds)``."""
    x, y = make_data(n, seed)
    model = build_model(seed, hidden)
    if device == "cuda":
        model.to("cuda")
        x, y = nbops.to_device(x), nbops.to_device(y)
    opt = nbops.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for _ in range(steps):
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    with nbops.no_grad():
        pred = np.asarray(nbops.to_host(model(x))).argmax(axis=1)
    accuracy = float((pred == np.asarray(nbops.to_host(y))).mean())
    return accuracy, model[1].beta.item(), seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n", type=int, default=512, help="training points")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units")
    args = parser.parse_args(argv)
    acc, beta, seconds = train(args.steps, args.device, args.n, hidden=args.hidden)
    print(f"train_mlp: {args.steps} steps on {args.device} in {seconds:.2f} s: "
          f"accuracy {acc:.3f}, swish beta {beta:.3f} (started at 1.0)")
    return acc, beta


if __name__ == "__main__":
    main()
