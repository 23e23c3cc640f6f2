"""Warm-up: compile the kernels a script will use, once, into Numba's disk cache.

Every nbops kernel is compiled with ``cache=True``: the first call of a
signature compiles it (seconds for large kernels) and writes it to the
cache; later processes load it (milliseconds). Warming up makes that first
call happen ahead of time, e.g. while building a container image::

    python -m nbops warmup --ops relu gelu matmul --dtypes float32
    python -m nbops warmup                      # every registered op, float32 + float64

or from Python, including fused expressions::

    nbops.warmup(ops=["relu", my_fused_fn], dtypes=["float32"])

Each op is called in the layouts its kernels distinguish: 1-D contiguous,
2-D contiguous and 2-D strided (a column slice), tiny and large (128K
elements, above the size where ops switch to their multi-threaded
kernels; not on a simulated CUDA device, which compiles nothing), with its
parameter variants that select other kernels (``gelu(approximate="tanh")``).
Layouts an op rejects (matmul of two vectors of the wrong length, say) are
skipped and reported; only an op for which no layout works is an error.

The cache lives beside the kernel modules (``__pycache__``) or in
``$NUMBA_CACHE_DIR``: warm up with the same setting the script will run
with. Measured first-call latencies are in ``tools/bench_fusion.py --startup``.
"""

import inspect
import sys
import time

import numpy as np

from . import _checks, _dispatch

__all__ = ["warmup"]

#: Keyword variants that select a different kernel; every op also runs once
#: with its defaults.
VARIANTS = {
    "gelu": [{"approximate": "tanh"}],
    "gelu_backward": [{"approximate": "tanh"}],
}

_DTYPES = ("float32", "float64")
#: Elements of the "large" layouts: above every serial/parallel threshold.
LARGE = 1 << 17


def _layouts(n_arrays, dtype):
    """Argument tuples for one op: 1-D, 2-D contiguous, 2-D strided views."""
    rng = np.random.default_rng(0)

    def make(shape):
        return rng.uniform(0.5, 1.5, shape).astype(dtype)

    yield "1-D", tuple(make(33) for _ in range(n_arrays))
    yield "2-D", tuple(make((8, 8)) for _ in range(n_arrays))
    yield "2-D strided", tuple(make((8, 16))[:, ::2] for _ in range(n_arrays))
    # large enough for the multi-threaded kernels of ops that keep small
    # inputs on the calling thread (nbops.fuse, optimizers, ...)
    yield "1-D large", tuple(make(LARGE) for _ in range(n_arrays))
    yield "2-D large strided", tuple(make((LARGE // 512, 1024))[:, ::2]
                                     for _ in range(n_arrays))


def _arity(fn):
    """Number of required positional parameters (the arrays)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in sig.parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty) or 1


def _resolve(op):
    """``(name, callable, arity)`` for an op name, an Operator or a fused function."""
    from .fusion import Fused

    if isinstance(op, str):
        try:
            operator = _dispatch.get_operator(op)
        except KeyError:
            raise ValueError(f"warmup: no operator named {op!r}; see "
                             "nbops.registered_ops()") from None
        return op, operator, _arity(operator.front)
    if isinstance(op, Fused):
        return op.name, op, _arity(op.fn)
    if isinstance(op, _dispatch.Operator):
        return op.name, op, _arity(op.front)
    raise TypeError(f"warmup: ops must hold operator names, operators or fused functions, "
                    f"got {_checks.describe(op)}")


def warmup(ops=None, dtypes=_DTYPES, devices=("cpu",), verbose=False):
    """Compile (or load) the kernels of ``ops`` for ``dtypes`` on ``devices``.

    Parameters
    ----------
    ops : iterable of str, Operator or Fused, optional
        Operator names (``"relu"``), operators, or functions made by
        :func:`nbops.fuse`; default every registered operator.
    dtypes : iterable of {"float32", "float64"}
    devices : iterable of {"cpu", "cuda"}
        "cuda" needs a GPU (or the simulator, where nothing is compiled).
    verbose : bool
        Print one line per op.

    Returns
    -------
    dict
        ``{op name: {"ok": [(dtype, device, layout), ...], "skipped":
        [(dtype, device, layout, reason), ...], "seconds": float}}``.

    Raises
    ------
    ValueError
        An unknown op name, dtype or device, or an op that ran in no layout.
    TypeError
        ``ops`` holds something that is not a name, Operator or Fused.

    Example
    -------
    >>> report = nbops.warmup(ops=["relu"], dtypes=["float32"])
    >>> report["relu"]["ok"][0]
    ('float32', 'cpu', '1-D')
    """
    dtypes = [dtypes] if isinstance(dtypes, str) else list(dtypes)
    devices = [devices] if isinstance(devices, str) else list(devices)
    for d in dtypes:
        _checks.choice("warmup", "dtypes", d, _DTYPES)
    for d in devices:
        _checks.choice("warmup", "devices", d, _dispatch.DEVICES)
    if "cuda" in devices and not _dispatch.cuda_available():
        raise ValueError("warmup: devices includes 'cuda' but no GPU (or simulator) is "
                         "available")
    if isinstance(ops, str):
        ops = [ops]
    resolved = [_resolve(op) for op in (ops if ops is not None else _dispatch.registered_ops())]
    simulated = "cuda" in devices and _dispatch.cuda_simulated()
    report = {}
    for name, fn, arity in resolved:
        t0 = time.perf_counter()
        ok, skipped = [], []
        for device in devices:
            for dtype in dtypes:
                for layout, args in _layouts(arity, dtype):
                    if device == "cuda" and simulated and "large" in layout:
                        # the simulator compiles nothing and runs each CUDA
                        # thread in Python: minutes for nothing cached
                        continue
                    if device == "cuda":
                        args = tuple(_to_device(a) for a in args)
                    for kwargs in [{}] + VARIANTS.get(name, []):
                        try:
                            fn(*args, **kwargs)
                        except Exception as exc:  # any rejection: try the next layout
                            skipped.append((dtype, device, layout,
                                            f"{type(exc).__name__}: {exc}"))
                        else:
                            if kwargs == {}:
                                ok.append((dtype, device, layout))
        report[name] = {"ok": ok, "skipped": skipped, "seconds": time.perf_counter() - t0}
        if verbose:
            print(f"{name:24s} {report[name]['seconds']:7.2f} s  {len(ok)} ok, "
                  f"{len(skipped)} skipped", file=sys.stderr)
        explicit = ops is not None
        if explicit and not ok:
            reasons = "; ".join(sorted({s[3] for s in skipped}))[:500]
            raise ValueError(f"warmup: {name} ran in no layout: {reasons}")
    return report


def _to_device(a):
    # strided host views keep their strides on the device, as users' views do
    cuda = _dispatch.ensure_cuda()
    if a.flags.c_contiguous:
        return cuda.to_device(a)
    from ._layout import strided_view

    base = cuda.to_device(np.ascontiguousarray(a.base))
    off = a.__array_interface__["data"][0] - a.base.__array_interface__["data"][0]
    return strided_view(base, a.shape, a.strides, off)


def main(argv=None):
    """``python -m nbops warmup`` (also ``python -m nbops.warmup``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nbops warmup",
                                description="compile nbops kernels into the disk cache")
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p):
    """The warmup options, for ``python -m nbops``'s sub-command parser."""
    p.add_argument("--ops", nargs="+", metavar="NAME",
                   help="operator names (default: every registered operator)")
    p.add_argument("--dtypes", nargs="+", choices=_DTYPES, default=list(_DTYPES))
    p.add_argument("--devices", nargs="+", choices=_dispatch.DEVICES, default=["cpu"])
    p.add_argument("--quiet", action="store_true", help="no per-op lines")


def run(args):
    """Run the warm-up for parsed arguments; exit status 0, or 2 on a bad request."""
    t0 = time.perf_counter()
    try:
        report = warmup(ops=args.ops, dtypes=args.dtypes, devices=args.devices,
                        verbose=not args.quiet)
    except (ValueError, TypeError) as exc:
        print(f"nbops warmup: {exc}", file=sys.stderr)
        return 2
    n_ok = sum(len(r["ok"]) for r in report.values())
    print(f"nbops warmup: {len(report)} op(s), {n_ok} kernel call(s) compiled or loaded in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
