"""``python -m nbops run model.onnx``: load an ONNX model into an
:class:`~nbops.onnx.InferenceSession`, run it, print the outputs' shapes and
a latency summary, and with ``--profile`` the profiler's per-op table.

Inputs come from ``--input name=file.npy`` (repeatable); an input not given
is generated from its declared shape (symbolic or unknown dimensions -> 1):
standard normal values for float types, zeros for integer and bool types
(usually indices or masks, where random values could be out of range).

Example
-------
    python -m nbops run model.onnx --repeat 20 --threads 2 --profile
"""

import sys
import time

import numpy as np

# onnxruntime's type strings of the element types a random input can take
_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
          "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
          "tensor(bool)": np.bool_}


def add_arguments(p):
    """The ``run`` subcommand's options, on the argparse parser ``p``."""
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeatable); others are random")
    p.add_argument("--repeat", type=int, default=10, metavar="N",
                   help="timed runs after one warm-up run (default 10)")
    p.add_argument("--threads", type=int, metavar="N", help="Numba threads (default: all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--profile", action="store_true",
                   help="also run once under nbops.profiler and print the per-op table")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def random_input(info, rng):
    """An array for the session input ``info`` (``name``, ``shape``,
    ``type``): symbolic or unknown dimensions become 1.

    Raises ``ValueError`` for an element type the command cannot generate.
    """
    dtype = _TYPES.get(info.type)
    if dtype is None:
        raise ValueError(f"input {info.name!r} has type {info.type}: give it with "
                         f"--input {info.name}=FILE.npy")
    shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in (info.shape or ()))
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype)


def _feeds(sess, given, seed):
    files = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--input must be NAME=FILE.npy, got {item!r}")
        files[name] = path
    declared = {i.name: i for i in sess.get_inputs()}
    unknown = sorted(set(files) - set(declared))
    if unknown:
        raise ValueError(f"--input names {unknown} are not inputs of the model "
                         f"(inputs: {sorted(declared)})")
    rng = np.random.default_rng(seed)
    return {name: np.load(files[name]) if name in files else random_input(info, rng)
            for name, info in declared.items()}


def latency_summary(seconds):
    """``{"median", "p10", "p90", "min"}`` in milliseconds of run times in
    seconds (at least one)."""
    ms = np.asarray(seconds, np.float64) * 1e3
    p10, med, p90 = np.percentile(ms, [10, 50, 90])
    return {"median": float(med), "p10": float(p10), "p90": float(p90),
            "min": float(ms.min())}


def run(args):
    """The ``run`` subcommand: 0 on success, 2 on a bad model, input or option."""
    if args.repeat < 1:
        print(f"nbops run: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    from . import InferenceSession

    try:
        sess = InferenceSession(args.model, threads=args.threads, device=args.device)
        feeds = _feeds(sess, args.input, args.seed)
        t0 = time.perf_counter()
        outputs = sess.run(None, feeds)
        first = time.perf_counter() - t0
    except (OSError, ValueError, TypeError) as exc:
        print(f"nbops run: {exc}", file=sys.stderr)
        return 2
    print(f"{args.model}: loaded in {sess.load_seconds * 1e3:.1f} ms, first run "
          f"{first * 1e3:.1f} ms (plan, compile or cache load)")
    for name, x in feeds.items():
        print(f"  input  {name}: {tuple(x.shape)} {x.dtype}")
    for info, y in zip(sess.get_outputs(), outputs):
        print(f"  output {info.name}: {tuple(np.shape(y))} {np.asarray(y).dtype}")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    s = latency_summary(times)
    print(f"latency over {args.repeat} run(s): median {s['median']:.3f} ms, p10 "
          f"{s['p10']:.3f} ms, p90 {s['p90']:.3f} ms, min {s['min']:.3f} ms")
    if args.profile:
        from ..profiler import profile

        with profile() as prof:
            sess.run(None, feeds)
        print(prof.table())
    return 0
