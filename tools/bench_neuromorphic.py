"""Timing of the spiking neurons against memory bandwidth and NumPy loops.

Prints, for T=100 steps of [batch 64, 4096 neurons] in float32 (by
default), each kernel's median time, its effective bandwidth (the bytes it
must move: inputs read once, spikes written once; for the backward the
inputs and the spike gradients read once and the input gradients written
once), the fraction of a parallel copy's bandwidth measured in the same run,
and the ratio to the NumPy loop over time (the seed article's loop).
snnTorch and PyTorch loops are timed when importable.

    python tools/bench_neuromorphic.py [--threads 2] [--repeat 9] [--steps 100]

Every row is timed in the same rounds, interleaved (``nbops.bench.harness``),
so that the machine's slow phases hit the copy and the kernels alike.
"""

import argparse
import importlib

import numpy as np


def _copy_kernel():
    from numba import njit, prange

    @njit(parallel=True, cache=True)
    def copy(src, dst):
        for i in prange(src.size):
            dst[i] = src[i]

    return copy


def numpy_lif(x, beta, thr, out):
    v = np.zeros_like(x[0])
    for t in range(x.shape[0]):
        v *= beta
        v += x[t]
        np.greater(v, thr, out=out[t])
        v -= out[t] * thr
    return out, v


def numpy_lif_bptt(gs, x, beta, thr, slope):
    """BPTT of LIF (reset by subtraction, detached) with the fast-sigmoid
    surrogate: forward storing the membrane, then the reverse sweep."""
    u = np.empty_like(x)
    v = np.zeros_like(x[0])
    for t in range(x.shape[0]):
        u[t] = v * beta + x[t]
        v = u[t] - (u[t] > thr) * thr
    gx = np.empty_like(x)
    gv = np.zeros_like(x[0])
    one = x.dtype.type(1)
    for t in range(x.shape[0] - 1, -1, -1):
        d = one / (slope * np.abs(u[t] - thr) + one)
        gu = gs[t] * d * d + gv
        gx[t] = gu
        gv = beta * gu
    return gx


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--neurons", type=int, default=4096)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)

    import nbops
    import nbops.neuromorphic as nm
    from nbops.bench.harness import time_interleaved

    cpu = importlib.import_module("nbops.neuromorphic.cpu")
    nbops.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    shape = (args.steps, args.batch, args.neurons)
    rng = np.random.default_rng(0)
    x = (rng.random(shape) * 0.6).astype(dt)
    n = x.size
    it = dt.itemsize
    # (name, function, bytes it must move, the baseline its ratio is against)
    rows = []

    copy = _copy_kernel()
    dst = np.empty_like(x)
    rows.append(("copy (numba prange)", lambda: copy(x.reshape(-1), dst.reshape(-1)),
                 2 * n * it, None))
    out = np.empty_like(x)
    rows.append(("NumPy loop over time", lambda: numpy_lif(x, dt.type(0.9), dt.type(1.0), out),
                 2 * n * it, None))

    spk = np.empty(shape, dt)
    spk8 = np.empty(shape, np.uint8)
    cases = [
        ("lif", lambda: nm.lif(x, 0.9, out=spk), it),
        ("lif, uint8 spikes", lambda: nm.lif(x, 0.9, spike_dtype=np.uint8, out=spk8), 1),
        ("if_neuron", lambda: nm.if_neuron(x, out=spk), it),
        ("synaptic", lambda: nm.synaptic(x, 0.8, 0.9, out=spk), it),
        ("alif", lambda: nm.alif(x, 0.9, out=spk), it),
        ("lif + membrane trace", lambda: nm.lif(x, 0.9, trace=True, out=spk), 2 * it),
    ]
    for name, fn, out_bytes in cases:
        rows.append((name, fn, n * (it + out_bytes), "NumPy loop over time"))

    # the other memory order: time outermost, a parallel sweep over neurons per step
    call_args = _layout_args(nm, x)
    rows.append(("lif, time loop outside (layout A)",
                 lambda: cpu.forward("lif", *call_args, time_outer=True), 2 * n * it,
                 "NumPy loop over time"))

    # backward through time: inputs and spike gradients read, input gradients written
    gs = rng.standard_normal(shape).astype(dt)
    gx = np.empty_like(x)
    rows.append(("NumPy BPTT loop",
                 lambda: numpy_lif_bptt(gs, x, dt.type(0.9), dt.type(1.0), dt.type(25.0)),
                 3 * n * it, None))
    rows.append(("lif_backward", lambda: nm.lif_backward(gs, x, 0.9, out=gx), 3 * n * it,
                 "NumPy BPTT loop"))
    rows.append(("synaptic_backward", lambda: nm.synaptic_backward(gs, x, 0.8, 0.9, out=gx),
                 3 * n * it, "NumPy BPTT loop"))
    rows.append(("alif_backward", lambda: nm.alif_backward(gs, x, 0.9, out=gx), 3 * n * it,
                 "NumPy BPTT loop"))

    # streaming: one step of [batch, neurons]; x and v read, spikes and v written
    step_x = x[0].copy()
    state = nm.LIFState(np.zeros_like(step_x))
    p = nm.LIFParameters(0.9, 1.0, "subtract")
    step_bytes = 4 * step_x.size * it
    step_spikes = np.empty_like(step_x)
    rows.append(("lif_step, one step", lambda: nm.lif_step(step_x, state, p), step_bytes,
                 None))
    rows.append(("lif_step, out= and inplace", lambda: nm.lif_step(
        step_x, state, p, out=step_spikes, inplace=True), step_bytes, None))

    _peers(rows, x, it)

    for _, fn, _, _ in rows:
        fn()
    times = dict(zip([r[0] for r in rows],
                     (1e3 * t for t in time_interleaved([r[1] for r in rows], args.repeat))))
    bw_copy = 2 * n * it / times["copy (numba prange)"] / 1e6
    print(f"T={args.steps} batch={args.batch} neurons={args.neurons} {dt.name}, "
          f"{args.threads} threads, medians of {args.repeat} interleaved rounds; "
          f"copy {bw_copy:.1f} GB/s")
    print(f"{'kernel':36s} {'ms':>9s} {'GB/s':>7s} {'of copy':>8s} {'vs NumPy':>9s}")
    for name, _, nbytes, base in rows:
        ms = times[name]
        gbs = nbytes / ms / 1e6
        ratio = f"{times[base] / ms:8.1f}x" if base else ""
        print(f"{name:36s} {ms:9.3f} {gbs:7.1f} {gbs / bw_copy:8.0%} {ratio:>9s}")
    for name in ("lif_step, one step", "lif_step, out= and inplace"):
        overhead_us = 1e3 * times[name] - step_bytes / (bw_copy * 1e3)
        print(f"{name}: {overhead_us:.1f} us beyond its memory traffic at copy bandwidth")
    if "snnTorch Leaky" in times:
        print(f"lif against snnTorch's Leaky: {times['snnTorch Leaky'] / times['lif']:.1f}x")


def _layout_args(nm, x):
    lifmod = importlib.import_module("nbops.neuromorphic.lif")
    t, m = x.shape[0], x[0].size
    prm = np.array([[0.9], [1.0], [0.0], [0.0]], x.dtype)
    return (x.reshape(t, m), np.zeros(m, x.dtype), None, prm, lifmod.consts(x.dtype),
            np.empty((t, m), x.dtype), np.empty(m, x.dtype), None, None)


def _peers(rows, x, it):
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: torch and snnTorch loops skipped")
        return
    torch.set_num_threads(2)
    xt = torch.from_numpy(x)

    @torch.no_grad()
    def torch_loop():
        v = torch.zeros_like(xt[0])
        out = torch.empty_like(xt)
        for t in range(xt.shape[0]):
            v = v * 0.9 + xt[t]
            s = (v > 1.0).float()
            v = v - s
            out[t] = s
        return out

    rows.append(("torch loop over time", torch_loop, 2 * x.size * it, "NumPy loop over time"))
    try:
        import snntorch as snn
    except ImportError:
        print("snnTorch not installed: snnTorch Leaky skipped")
        return
    leaky = snn.Leaky(beta=0.9)

    @torch.no_grad()
    def snn_loop():
        mem = leaky.init_leaky()
        for t in range(xt.shape[0]):
            spk, mem = leaky(xt[t], mem)

    rows.append(("snnTorch Leaky", snn_loop, 2 * x.size * it, "NumPy loop over time"))


if __name__ == "__main__":
    main()
