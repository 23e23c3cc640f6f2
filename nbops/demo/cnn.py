"""A small CNN on the 8x8 digits: train, fuse, quantize to int8, export to ONNX.

1. ``conv-bn-relu -> max pool -> conv-bn-relu -> max pool -> linear``,
   trained with nbops autograd and Adam on cross-entropy;
2. folded and fused for inference (:func:`nbops.nn.fuse_modules`: each
   conv + batch norm + relu becomes one kernel), the predictions checked
   identical, latency unfused vs fused at batch 1 and 256 beside the same
   forward pass written in NumPy;
3. static int8 quantization (:mod:`nbops.quant`: prepare, calibrate on
   training images, convert), accuracy drop and int8 latency;
4. the fused float model exported to ONNX (:func:`nbops.onnx.export`) and
   run back through :class:`nbops.onnx.InferenceSession` (and onnxruntime
   when installed), predictions compared.

Run: ``python examples/digits_cnn.py [--quick] [--device cpu|cuda] [--seed N]``
"""

import copy
import os
import time

import numpy as np

import nbops
from nbops import nn, quant

from . import _common as C

#: Epochs (full, quick) and the batch size.
EPOCHS = (10, 3)
BATCH = 64


def build_model(rng, c1=16, c2=32):
    """Two conv-bn-relu-pool stages (``c1``, ``c2`` channels) and a linear
    classifier: 8x8 -> 4x4 -> 2x2."""
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, rng=rng), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1, rng=rng), nn.BatchNorm2d(c2), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c2 * 2 * 2, 10, rng=rng))


def numpy_forward(fused, x):
    """The fused model's forward pass written in NumPy (im2col by strided
    views, one matmul per convolution): the baseline of the latency chart,
    and a check of the fused weights."""
    for layer in fused:
        if isinstance(layer, nn.FusedConv):
            if not (layer.relu and layer.padding == 1 and layer.stride == 1):
                raise ValueError("numpy_forward: written for 3x3 conv-relu layers, padding 1")
            w, b = C.host(layer.weight), C.host(layer.bias)
            p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
            cols = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))
            # (n, c, h, w, 3, 3) x (o, c, 3, 3) -> (n, h, w, o)
            y = np.tensordot(cols, w, axes=([1, 4, 5], [1, 2, 3])) + b
            x = np.maximum(y, 0).transpose(0, 3, 1, 2)
        elif isinstance(layer, nn.MaxPool2d):
            n, c, h, w = x.shape
            x = x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
        elif isinstance(layer, nn.Flatten):
            x = x.reshape(len(x), -1)
        elif isinstance(layer, nn.Linear):
            x = x @ C.host(layer.weight).T + C.host(layer.bias)
        else:
            raise TypeError(f"numpy_forward: no NumPy form of {type(layer).__name__}")
    return x


def _onnx_step(cfg, fused, x_test, y_test, reference, timings):
    """Export ``fused`` to ONNX and run it back (and through onnxruntime
    where installed); rows for the table, their latencies left to
    ``timings``, or a 'skipped' row naming what is missing."""
    api = {}
    for name in ("export", "InferenceSession"):
        try:   # nbops.onnx loads its parts lazily: a missing part is an ImportError
            api[name] = getattr(__import__("nbops.onnx", fromlist=[name]), name)
        except (ImportError, AttributeError) as exc:
            return [C.Result("cnn onnx", float("nan"),
                             note=f"skipped: nbops.onnx.{name} not available ({exc})")]
    example = np.ascontiguousarray(x_test[:1])
    if cfg.plots:   # the exported file sits beside the plots; --no-plots writes nothing
        os.makedirs(cfg.out, exist_ok=True)
        model = os.path.join(cfg.out, "digits_cnn.onnx")
        api["export"](fused, (example,), model)
    else:
        model = api["export"](fused, (example,)).SerializeToString()
    session = api["InferenceSession"](model)
    name = session.get_inputs()[0].name

    def run(xb):
        return session.run(None, {name: xb})[0]

    rows = []
    pred = C.host(run(x_test)).argmax(axis=1)
    same = int((pred == reference).sum())
    rows.append(C.Result("cnn onnx (nbops)", float((pred == y_test).mean()),
                         note=f"{same}/{len(reference)} predictions as fused"))
    timings.add(rows[-1], run, example, x_test[:256], bar="nbops.onnx")
    try:
        import onnxruntime as ort
    except ImportError:
        rows.append(C.Result("cnn onnxruntime", float("nan"),
                             note="skipped: onnxruntime not installed (optional peer)"))
        return rows
    options = ort.SessionOptions()
    options.intra_op_num_threads = nbops.get_num_threads()   # the same cores as nbops
    ort_session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    ort_name = ort_session.get_inputs()[0].name

    def run_ort(xb):
        return ort_session.run(None, {ort_name: xb})[0]

    pred = run_ort(x_test).argmax(axis=1)
    same = int((pred == reference).sum())
    rows.append(C.Result("cnn onnxruntime", float((pred == y_test).mean()),
                         note=f"{same}/{len(reference)} predictions as fused"))
    timings.add(rows[-1], run_ort, example, x_test[:256], bar="onnxruntime")
    return rows


def _inputs(data):
    # (n, 1, 8, 8): one input channel; standardised with the training statistics
    mean, std = data.x_train.mean(), data.x_train.std()
    return tuple(((x - mean) / std)[:, None].astype(np.float32)
                 for x in (data.x_train, data.x_test))


def run(cfg, data=None):
    """Train and serve the CNN; returns ``(results, history, extras)`` where
    extras holds the latency bars and the test predictions."""
    data = data or C.load_digits(cfg)
    rng = np.random.default_rng(cfg.seed)
    x_train, x_test = _inputs(data)
    xt_dev = C.move(cfg, x_test)

    model = build_model(rng, cfg.size(16, 2), cfg.size(32, 2))
    model.to(cfg.device)
    opt = nbops.optim.Adam(model.parameters(), lr=3e-3)

    def step(idx):
        loss = nn.cross_entropy(model(C.move(cfg, x_train[idx])),
                                C.move(cfg, data.y_train[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return C.loss_value(loss)

    def evaluate():
        model.eval()
        with nbops.no_grad():
            acc = C.accuracy(model(xt_dev), data.y_test)
        model.train()
        return acc

    with C.CompileClock() as clock:
        history, train_s = C.train(cfg, "cnn", len(x_train), BATCH,
                                   cfg.epochs(*EPOCHS), step, evaluate)
    model.eval()
    return _serve(cfg, model, data, x_train, x_test, history, train_s, clock.seconds)


def _serve(cfg, model, data, x_train, x_test, history, train_s, compile_s):
    """Steps 2-4 on the trained ``model`` (eval mode): fused, int8, ONNX.
    Every model runs once first; the latencies are measured together at
    the end (``C.Timings``)."""
    timings = C.Timings()
    # --- fold and fuse for inference -------------------------------------------
    # to() after the copy: a deep copy of device arrays need not stay on the device
    fused = nn.fuse_modules(copy.deepcopy(model)).to(cfg.device)

    def infer(m):
        def f(xb):
            with nbops.no_grad():
                return m(C.move(cfg, xb))
        return f

    with C.CompileClock() as clock:
        plain_logits, fused_logits = C.host(infer(model)(x_test)), C.host(infer(fused)(x_test))
        numpy_logits = numpy_forward(fused, x_test)
    compile_s += clock.seconds
    reference = fused_logits.argmax(axis=1)
    same = int((plain_logits.argmax(axis=1) == reference).sum())
    numpy_same = int((numpy_logits.argmax(axis=1) == reference).sum())
    one, batch = x_test[:1], x_test[:256]
    results = [
        C.Result("cnn", C.accuracy(plain_logits, data.y_test), train_s, device=cfg.device,
                 compile_s=compile_s, note="unfused, eval mode"),
        C.Result("cnn fused", C.accuracy(fused_logits, data.y_test), device=cfg.device,
                 note=f"{same}/{len(reference)} predictions as unfused"),
        C.Result("cnn numpy", C.accuracy(numpy_logits, data.y_test),
                 note=f"NumPy formulation, {numpy_same}/{len(reference)} as fused")]
    timings.add(results[0], infer(model), one, batch, bar="nbops unfused")
    timings.add(results[1], infer(fused), one, batch, bar="nbops fused")
    timings.add(results[2], lambda xb: numpy_forward(fused, xb), one, batch, bar="NumPy")
    cfg.say(f"  fused: {same}/{len(reference)} predictions identical to the unfused model")

    # --- int8 static quantization (CPU kernels), calibrated on training images --
    # int8 and ONNX run on the CPU (quant.convert's default device), on copies
    host_model = copy.deepcopy(model).to("cpu")
    host_fused = copy.deepcopy(fused).to("cpu")
    with C.CompileClock() as clock:
        t0 = time.perf_counter()
        observed = quant.prepare(host_model)
        for i in range(0, min(len(x_train), 512), 128):
            observed(x_train[i:i + 128])
        qmodel = quant.convert(observed)
        q_logits = qmodel(x_test)
        quant_s = time.perf_counter() - t0
    q_acc = C.accuracy(q_logits, data.y_test)
    drop = results[1].accuracy - q_acc
    results.append(C.Result("cnn int8", q_acc, quant_s, compile_s=clock.seconds,
                            note=f"static, {drop * 100:.2f} points below fused float "
                                 "(train s: calibration)"))
    timings.add(results[-1], qmodel, one, batch, bar="nbops int8")

    # --- ONNX round trip of the fused float model ---------------------------------
    with C.CompileClock() as clock:
        rows = _onnx_step(cfg, host_fused, x_test, data.y_test, reference, timings)
    if rows and rows[0].note.startswith("skipped"):
        cfg.say(f"  onnx: {rows[0].note}")
    else:
        rows[0].compile_s = clock.seconds
    results += rows
    return results, history, {"latency": timings.run(), "labels": data.y_test,
                               "predicted": reference}


def main(argv=None):
    """Run this task on its own (``python -m nbops demo --only cnn``): its
    rows of the summary table and its plots. Returns the exit status."""
    from . import main as demo_main

    return demo_main(argv, task="cnn")

