"""Quantize float models to int8 with nbops.quant, both ways:

1. dynamic: ``quantize_dynamic(model)`` turns every Linear into an int8
   layer (weights per output channel, activations quantized per call);
2. static: ``prepare(model)`` folds conv + batch norm + relu and inserts
   observers, a few calibration batches record activation ranges, and
   ``convert(observed)`` gives a model that runs int8 end to end (uint8
   activations, int8 weights, int32 accumulation) between one quantize at
   the input and one dequantize at the output.

Run: ``python examples/quantize_model.py`` (CPU; a few seconds after the
first compilation).
"""

import numpy as np

from nbops import nn, quant


def make_data(rng, n, templates):
    """Images of 3x8x8 pixels: a class template plus noise."""
    labels = rng.integers(0, len(templates), n)
    x = templates[labels] + rng.normal(0, 0.8, (n,) + templates.shape[1:])
    return x.astype(np.float32), labels


def float_cnn(rng, templates):
    """conv-bn-relu-pool-conv-relu-pool-linear with seeded weights, batch norm
    statistics from data, and a ridge-regression head (no training loop)."""
    conv1, bn = nn.Conv2d(3, 8, 3, padding=1, rng=0), nn.BatchNorm2d(8)
    body = nn.Sequential(conv1, bn, nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1, rng=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten())
    head = nn.Linear(64, len(templates), rng=2)
    x, y = make_data(rng, 400, templates)
    pre = np.asarray(conv1(x).data)
    bn.running_mean[:] = pre.mean(axis=(0, 2, 3))
    bn.running_var[:] = pre.var(axis=(0, 2, 3))
    body.eval()
    feats = np.asarray(body(x).data)
    design = np.c_[feats, np.ones(len(feats))]
    target = 2 * np.eye(len(templates))[y] - 1
    coef = np.linalg.solve(design.T @ design + 10 * np.eye(design.shape[1]), design.T @ target)
    head.weight.data[:] = coef[:-1].T
    head.bias.data[:] = coef[-1]
    return nn.Sequential(body, head).eval()


def logits(model, x):
    y = model(x)
    return np.asarray(getattr(y, "data", y))


def main():
    rng = np.random.default_rng(0)

    # --- dynamic quantization of an MLP -----------------------------------------
    mlp = nn.Sequential(nn.Linear(256, 512, rng=0), nn.ReLU(), nn.Linear(512, 10, rng=1))
    qmlp = quant.quantize_dynamic(mlp)
    x = rng.normal(size=(64, 256)).astype(np.float32)
    ref, got = logits(mlp, x), qmlp(x)
    print(f"dynamic: max |int8 - float| = {np.abs(got - ref).max():.4f} "
          f"(logits up to {np.abs(ref).max():.3f}), argmax agreement "
          f"{(got.argmax(1) == ref.argmax(1)).mean():.1%}")

    # --- static quantization of a CNN -------------------------------------------
    templates = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
    model = float_cnn(rng, templates)
    observed = quant.prepare(model)          # folded, fused, observers in place
    for _ in range(8):                       # calibration
        observed(make_data(rng, 32, templates)[0])
    qmodel = quant.convert(observed)
    print(f"static: {qmodel}")
    x, labels = make_data(rng, 1000, templates)
    ref, got = logits(model, x), qmodel(x)
    agree = (got.argmax(1) == ref.argmax(1)).mean()
    print(f"static: float accuracy {(ref.argmax(1) == labels).mean():.1%}, int8 accuracy "
          f"{(got.argmax(1) == labels).mean():.1%}, argmax agreement {agree:.1%}")
    return agree


if __name__ == "__main__":
    main()
