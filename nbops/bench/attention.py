"""Benchmark cases of scaled_dot_product_attention, and the issue's sweep
beside the NumPy formulation.

The case (``python -m nbops bench attention``, asv) runs B=4, H=8, D=64
with L = S = n / (B * H * D) clamped to [16, 2048], in GFLOP/s
(``4 B H L^2 D``: two products). The baseline is what a NumPy user writes:
``q @ k^T * scale``, a stable softmax in place, ``@ v``, with the L x S
score matrix.

:func:`compare` runs the issue's sweep, L = 512, 1024, 2048, 4096 (the
last unless ``--quick``), float32, timing both interleaved in one process
and measuring each one's extra peak memory (peak RSS during the call minus
RSS before it, in a fresh subprocess per measurement): linear in L for
nbops, quadratic for NumPy. Run it as
``NUMBA_NUM_THREADS=2 python -m nbops.bench.attention [--quick]``.
"""

import math
import subprocess
import sys

import numpy as np

import nbops

from .harness import fmt_time, spec_cases, time_interleaved

B, H, D = 4, 8, 64
MAX_L = 2048


def setup(n, dtype, rng):
    L = max(16, min(MAX_L, n // (B * H * D)))
    return tuple(rng.standard_normal((B, H, L, D)).astype(dtype) for _ in range(3))


def attention_numpy(q, k, v, out):
    """The NumPy formulation: explicit scores, stable softmax, product."""
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= q.dtype.type(1 / math.sqrt(q.shape[-1]))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v, out=out)


def reference(q, k, v):
    # one head at a time: float64 scores of every head at once would be large
    out = np.empty(q.shape[:-1] + (v.shape[-1],))
    for i in np.ndindex(q.shape[:-2]):
        attention_numpy(q[i], k[i], v[i], out[i])
    return out


def case_flops(inputs):
    q, k, v = inputs
    return 2 * int(np.prod(q.shape[:-1])) * k.shape[-2] * (q.shape[-1] + v.shape[-1])


# one case per Bench entry of the spec (nbops/attention.py)
CASES = spec_cases([nbops.attention.SPEC], None)

#: The issue's sequence lengths; the last one is left out by ``--quick``.
LENGTHS = (512, 1024, 2048, 4096)


def _inputs(L, dtype=np.float32):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, L, D)).astype(dtype) for _ in range(3))
    return q, k, v, np.empty_like(q)


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_child(impl, L):
    """Run in a subprocess: peak RSS during one call minus RSS before it, in
    bytes (Linux: the peak is reset through /proc/self/clear_refs first)."""
    q, k, v, out = _inputs(L)
    # compile / load kernels and touch the output outside the measurement
    if impl == "nbops":
        nbops.scaled_dot_product_attention(q[:1, :1, :16], k[:1, :1, :16], v[:1, :1, :16])
    out[...] = 0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_kib("VmRSS")
    if impl == "nbops":
        nbops.scaled_dot_product_attention(q, k, v, out=out)
    else:
        attention_numpy(q, k, v, out)
    print((_rss_kib("VmHWM") - before) * 1024)


def extra_peak_memory(impl, L):
    """Bytes a call adds to the peak memory of a process holding its inputs."""
    code = f"from nbops.bench.attention import _peak_child; _peak_child({impl!r}, {L})"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return int(res.stdout.split()[-1])


def compare(lengths=LENGTHS, rounds=5, write=print):
    """Time nbops against the NumPy formulation at B=4, H=8, D=64, float32,
    and measure both one's extra peak memory; returns rows of dicts."""
    rows = []
    write(f"attention B={B} H={H} D={D} float32, {nbops.get_num_threads()} threads")
    write(f"{'L':>5} {'GFLOP':>6} {'nbops':>9} {'numpy':>9} {'ratio':>6} {'GFLOP/s':>8}"
          f" {'mem nbops':>10} {'mem numpy':>10}")
    for L in lengths:
        q, k, v, out = _inputs(L)
        out_b = np.empty_like(out)
        nbops.scaled_dot_product_attention(q, k, v, out=out)
        attention_numpy(q, k, v, out_b)
        err = float(np.abs(out - out_b).max())
        t_n, t_b = time_interleaved(
            [lambda: nbops.scaled_dot_product_attention(q, k, v, out=out),
             lambda: attention_numpy(q, k, v, out_b)], rounds, 0.2)
        del q, k, v, out, out_b
        flops = 4 * B * H * L * L * D
        mem = [extra_peak_memory(impl, L) for impl in ("nbops", "numpy")]
        row = dict(L=L, gflop=flops / 1e9, t_nbops=t_n, t_numpy=t_b, ratio=t_b / t_n,
                   gflops=flops / t_n / 1e9, mem_nbops=mem[0], mem_numpy=mem[1], err=err)
        rows.append(row)
        write(f"{L:>5} {flops / 1e9:>6.1f} {fmt_time(t_n):>9} {fmt_time(t_b):>9} "
              f"{t_b / t_n:>5.2f}x {flops / t_n / 1e9:>8.1f} {mem[0] / 2**20:>8.1f}MB "
              f"{mem[1] / 2**20:>8.1f}MB  (max diff {err:.1e})")
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    compare(LENGTHS[:-1] if quick else LENGTHS)
