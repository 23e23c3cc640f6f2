"""``python -m nbops bench --plot FILE.png``: the bench table as bar charts.

Left: the speed-up of every case and size over its baseline (log scale, the
1x line marked: right of it nbops is faster). Right, for the cases whose
table row states one: the fraction of the machine's limit reached, a
parallel copy's bandwidth for memory-bound ops (blue), the FMA peak the
same run measured for compute-bound ones (orange).
Needs matplotlib (``pip install "nbops[demo]"``).
"""

import numpy as np

from .harness import size_label

__all__ = ["plot_results"]


def _label(r):
    return f"{r.case} {size_label(r.n)} {r.dtype}"


def plot_results(results, path):
    """Write the chart of ``results`` (:class:`~nbops.bench.harness.Result`)
    to ``path``; returns the path. Cases without a timing (skipped, failed)
    are left out. Raises ImportError when matplotlib is missing and
    ValueError when no case has a speed-up to show."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in results if r.ratio is not None]
    if not timed:
        raise ValueError("bench --plot: no case was timed against a baseline")
    labels = [_label(r) for r in timed]
    ratios = np.array([r.ratio for r in timed])
    fractions = [r.peak_fraction if r.flops else r.copy_fraction for r in timed]
    height = max(3.0, 0.28 * len(timed) + 1.2)
    fig, (ax_s, ax_c) = plt.subplots(1, 2, figsize=(12, height), sharey=True)
    y = np.arange(len(timed))
    ax_s.barh(y, ratios, color=np.where(ratios >= 1, "C2", "C3"))
    ax_s.axvline(1.0, color="k", lw=0.8)
    ax_s.set_xscale("log")
    ax_s.set(yticks=y, yticklabels=labels, xlabel="speed-up over the baseline (x)",
             title="nbops vs NumPy/SciPy")
    ax_s.invert_yaxis()
    have = [i for i, f in enumerate(fractions) if f is not None]
    ax_c.barh([y[i] for i in have], [fractions[i] * 100 for i in have],
              color=["C1" if timed[i].flops else "C0" for i in have])
    ax_c.axvline(100, color="k", lw=0.8)
    ax_c.set(xlabel="% of the limit: parallel-copy bandwidth (blue) or FMA peak (orange)",
             title="how close to the machine")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
