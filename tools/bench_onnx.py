"""nbops.onnx against onnxruntime on the onnx wheel's light models and
their random-weight twins: batch 1, sequential runs, both at the same
thread count (2 by default), interleaved rounds, medians.

    python tools/bench_onnx.py [--threads 2] [--rounds 5] [--reps 5] [--models resnet50,...]

Prints per model: session load time (parse, check, plan, fold; onnxruntime's
InferenceSession construction beside it), the first run (plans, packs the
convolutions, compiles or loads cached kernels, tunes new shapes), and the
steady latency of each runtime with the ratio nbops / onnxruntime (< 1:
nbops ahead), and the load average after the model's rounds. On a shared
machine the ratio is meaningful only at a low load: each nbops kernel is a
parallel region that waits for all its threads, so a busy machine slows
nbops far more than onnxruntime (at load 11 on 2 cores: 4-60x against
1.2-1.4x at load 0).
"""

import argparse
import glob
import os
import statistics
import time

import numpy as np


MODELS = ["resnet50", "squeezenet", "vgg19", "shufflenet", "densenet121", "inception_v1"]


def _light(name):
    import onnx

    path = glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data",
                                  "light", f"light_{name}.onnx"))[0]
    return onnx.load(path)


def _ort_session(model, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    t0 = time.perf_counter()
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s, time.perf_counter() - t0


def _time(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def bench(model, label, threads, rounds, reps):
    import nbops
    from nbops.onnx import InferenceSession

    t0 = time.perf_counter()
    sess = InferenceSession(model, threads=threads)
    load = time.perf_counter() - t0
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feeds = {inp.name: x}
    t0 = time.perf_counter()
    y = sess.run(None, feeds)[0]
    first = time.perf_counter() - t0
    ort_sess, ort_load = _ort_session(model, threads)
    ref = ort_sess.run(None, feeds)[0]
    err = float(np.max(np.abs(y - ref)) / (np.max(np.abs(ref)) or 1))
    nb_t, ort_t = [], []
    for _ in range(rounds):
        nb_t.append(_time(lambda: sess.run(None, feeds), reps))
        time.sleep(0.2)  # onnxruntime's and Numba's pools must not overlap
        ort_t.append(_time(lambda: ort_sess.run(None, feeds), reps))
        time.sleep(0.2)
    nb, rt = statistics.median(nb_t), statistics.median(ort_t)
    print(f"{label:<22} load {load:6.3f} s (ort {ort_load:5.3f})  first {first:7.3f} s  "
          f"nbops {nb * 1e3:8.2f} ms  ort {rt * 1e3:8.2f} ms  ratio {nb / rt:5.2f}  "
          f"rel.err {err:.1e}  peak {sess.peak_memory / 2**20:.0f} MiB  "
          f"load avg {os.getloadavg()[0]:.1f}", flush=True)
    del nbops
    return nb / rt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-twins", action="store_true")
    args = ap.parse_args(argv)
    import nbops
    from nbops.onnx._twins import random_weight_twin

    nbops.set_num_threads(args.threads)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.2f}")
    for name in args.models.split(","):
        m = _light(name)
        bench(m, name, args.threads, args.rounds, args.reps)
        if not args.no_twins:
            bench(random_weight_twin(m, seed=0), name + " (random)", args.threads,
                  args.rounds, args.reps)


if __name__ == "__main__":
    main()
