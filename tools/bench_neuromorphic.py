"""Timing of the spiking neurons against memory bandwidth and NumPy loops.

Prints, for T=100 steps of [batch 64, 4096 neurons] in float32 (by
default), each kernel's median time, its effective bandwidth (the bytes it
must move: inputs read once, spikes written once; for the backward the
inputs and the spike gradients read once and the input gradients written
once), the fraction of a parallel copy's bandwidth measured in the same run,
and the ratio to the NumPy loop over time (the seed article's loop).
snnTorch and PyTorch loops are timed when importable.

    python tools/bench_neuromorphic.py [--threads 2] [--repeat 15] [--steps 100]
"""

import argparse
import importlib
import time

import numpy as np


def _median_ms(fn, repeat, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


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
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--neurons", type=int, default=4096)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)

    import nbops
    import nbops.neuromorphic as nm

    cpu = importlib.import_module("nbops.neuromorphic.cpu")
    nbops.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    shape = (args.steps, args.batch, args.neurons)
    rng = np.random.default_rng(0)
    x = (rng.random(shape) * 0.6).astype(dt)
    n = x.size
    it = dt.itemsize
    rows = []

    copy = _copy_kernel()
    dst = np.empty_like(x)
    t_copy = _median_ms(lambda: copy(x.reshape(-1), dst.reshape(-1)), args.repeat)
    bw_copy = 2 * n * it / t_copy / 1e6
    rows.append(("copy (numba prange)", t_copy, 2 * n * it, None))

    out = np.empty_like(x)
    t_np = _median_ms(lambda: numpy_lif(x, dt.type(0.9), dt.type(1.0), out), args.repeat)
    rows.append(("NumPy loop over time", t_np, 2 * n * it, None))

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
        rows.append((name, _median_ms(fn, args.repeat), n * (it + out_bytes), t_np))

    # the other memory order: time outermost, a parallel sweep over neurons per step
    call_args = _layout_args(nm, x)

    def time_outer():
        cpu.forward("lif", *call_args, time_outer=True)

    rows.append(("lif, time loop outside (layout A)", _median_ms(time_outer, args.repeat),
                 2 * n * it, t_np))

    # backward through time
    gs = rng.standard_normal(shape).astype(dt)
    t_np_b = _median_ms(lambda: numpy_lif_bptt(gs, x, dt.type(0.9), dt.type(1.0),
                                               dt.type(25.0)), max(3, args.repeat // 3), 1)
    rows.append(("NumPy BPTT loop", t_np_b, 3 * n * it, None))
    gx = np.empty_like(x)
    rows.append(("lif_backward", _median_ms(lambda: nm.lif_backward(gs, x, 0.9, out=gx),
                                            args.repeat), 3 * n * it, t_np_b))

    # streaming: one step of [batch, neurons]
    step_x = x[0].copy()
    state = nm.LIFState(np.zeros_like(step_x))
    p = nm.LIFParameters(0.9, 1.0, "subtract")
    t_step = _median_ms(lambda: nm.lif_step(step_x, state, p), args.repeat * 20, 20)
    step_bytes = 4 * step_x.size * it        # x and v read, spikes and v written
    rows.append(("lif_step, one step", t_step, step_bytes, None))

    _peers(rows, x, args.repeat, it, t_np)

    print(f"T={args.steps} batch={args.batch} neurons={args.neurons} {dt.name}, "
          f"{args.threads} threads; copy {bw_copy:.1f} GB/s")
    print(f"{'kernel':36s} {'ms':>9s} {'GB/s':>7s} {'of copy':>8s} {'vs NumPy':>9s}")
    for name, ms, nbytes, base in rows:
        gbs = nbytes / ms / 1e6
        ratio = f"{base / ms:8.1f}x" if base else ""
        print(f"{name:36s} {ms:9.3f} {gbs:7.1f} {gbs / bw_copy:8.0%} {ratio:>9s}")
    overhead_us = 1e3 * t_step - step_bytes / (bw_copy * 1e3)
    print(f"lif_step overhead beyond its memory traffic: {overhead_us:.1f} us")


def _layout_args(nm, x):
    lifmod = importlib.import_module("nbops.neuromorphic.lif")
    t, m = x.shape[0], x[0].size
    prm = np.array([[0.9], [1.0], [0.0], [0.0]], x.dtype)
    return (x.reshape(t, m), np.zeros(m, x.dtype), None, prm, lifmod.consts(x.dtype),
            np.empty((t, m), x.dtype), np.empty(m, x.dtype), None, None)


def _peers(rows, x, repeat, it, t_np):
    try:
        import torch
    except ImportError:
        print("PyTorch not installed: torch and snnTorch loops skipped")
        return
    torch.set_num_threads(2)
    xt = torch.from_numpy(x)

    def torch_loop():
        v = torch.zeros_like(xt[0])
        out = torch.empty_like(xt)
        for t in range(xt.shape[0]):
            v = v * 0.9 + xt[t]
            s = (v > 1.0).float()
            v = v - s
            out[t] = s
        return out

    with torch.no_grad():
        rows.append(("torch loop over time", _median_ms(torch_loop, repeat), 2 * x.size * it,
                     t_np))
    try:
        import snntorch as snn
    except ImportError:
        print("snnTorch not installed: snnTorch Leaky skipped")
        return
    leaky = snn.Leaky(beta=0.9)

    def snn_loop():
        mem = leaky.init_leaky()
        for t in range(xt.shape[0]):
            spk, mem = leaky(xt[t], mem)

    with torch.no_grad():
        rows.append(("snnTorch Leaky", _median_ms(snn_loop, repeat), 2 * x.size * it, t_np))


if __name__ == "__main__":
    main()
