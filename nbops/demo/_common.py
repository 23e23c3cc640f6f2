"""What the digits tasks share: options, the data split, the training loop
with its progress bar, timings (wall, latency, compilation), the summary
table and the plots.

Kept free of any model code so that each task module reads as the script a
user would write: build a model, train it with :func:`train`, measure it,
return :class:`Result` rows and a history for the plots.
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

import nbops

#: What ``pip`` line brings the optional parts (plots, progress bars, data).
EXTRA_HINT = 'pip install "nbops[demo]"'


@dataclasses.dataclass
class Config:
    """One run's settings (the command-line options)."""

    device: str = "cpu"
    quick: bool = False
    seed: int = 0
    #: the train/test split's seed: fixed by default, so that ``--seed``
    #: varies the training alone (weights, batch order, augmentation, spike
    #: coding) and runs compare on the same 450 test images
    split_seed: int = 0
    out: str = "nbops-demo"
    quiet: bool = False
    plots: bool = True
    #: at most this many training and test images each (0: all); the CUDA
    #: simulator runs one OS thread per CUDA thread and needs tiny inputs
    limit: int = 0
    #: the smallest settings (8 images, one epoch, layers a few units wide):
    #: the code path alone, for tests and the CUDA simulator
    smoke: bool = False
    #: processes compiling kernels: 2 compiles ahead in a second process
    #: while the first task trains (see ``Ahead``); None picks 2 on a CPU
    #: run with 2+ cores (not for ``--smoke``)
    jobs: int = 1
    #: this process is another run's :class:`Ahead` (the later tasks, the
    #: last first; latencies of one call)
    ahead: bool = False

    def __post_init__(self):
        # The documented default GEMM configs unless the user asks for tuning:
        # the autotuner times every candidate (each compiled) on each new
        # shape, minutes for shapes a demo sees a few times.
        os.environ.setdefault("NBOPS_AUTOTUNE", "0")

    def epochs(self, full, quick):
        """Epochs of a task: ``quick`` under ``--quick``, else ``full``
        (one under ``--smoke``)."""
        return 1 if self.smoke else quick if self.quick else full

    def size(self, full, smoke):
        """A layer width, step count...: ``smoke`` under ``--smoke``."""
        return smoke if self.smoke else full

    def say(self, text):
        """Print a line unless ``--quiet``."""
        if not self.quiet:
            print(text, flush=True)


def add_options(parser, tasks=None):
    """The demo's options on ``parser``; ``tasks`` adds ``--only``."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="few epochs (seconds once compiled), same code path")
    parser.add_argument("--out", default="nbops-demo", metavar="DIR",
                        help="folder for the PNG plots (default ./nbops-demo)")
    parser.add_argument("--seed", type=int, default=0,
                        help="weights, batch order, augmentation, spike coding (default 0)")
    parser.add_argument("--split-seed", type=int, default=0, metavar="N",
                        help="the train/test split (default 0: the same held-out images)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or step lines")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="write no files (plots, the exported ONNX model)")
    parser.add_argument("--limit", type=int, default=0, metavar="N",
                        help="use at most N training and N test images")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="1: compile in this process only; 2 (default with 2+ cores): "
                             "a second process compiles what the later steps need while "
                             "the first task trains")
    parser.add_argument("--ahead", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="smallest settings (8 images, 1 epoch, narrow layers): checks "
                             "the code path, e.g. in the CUDA simulator")
    if tasks:
        parser.add_argument("--only", nargs="+", action="extend", choices=tasks,
                            metavar="TASK", help=f"run only these tasks ({', '.join(tasks)})")
    return parser


def config_from(args):
    """A :class:`Config` from parsed options."""
    return Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})


# ---------------------------------------------------------------------------
# Data


@dataclasses.dataclass
class Digits:
    """scikit-learn's 8x8 digits, pixels scaled to [0, 1], split 75/25
    (stratified, by the split seed)."""

    x_train: np.ndarray   # (n, 8, 8) float32
    y_train: np.ndarray   # (n,) int64
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(cfg):
    """The split of ``cfg.split_seed`` (no download: the images ship inside
    scikit-learn). Raises SystemExit with the install line when
    scikit-learn is missing."""
    try:
        from sklearn.datasets import load_digits as sk_load
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise SystemExit(f"nbops demo needs scikit-learn for its data set: {EXTRA_HINT}")
    d = sk_load()
    x = (d.images / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int64), test_size=0.25,
                                          random_state=cfg.split_seed, stratify=d.target)
    limit = cfg.limit or (8 if cfg.smoke else 0)
    if limit:
        xtr, ytr, xte, yte = xtr[:limit], ytr[:limit], xte[:limit], yte[:limit]
    return Digits(np.ascontiguousarray(xtr), ytr, np.ascontiguousarray(xte), yte)


def move(cfg, x):
    """``x`` on the run's device (arrays only move when asked: DESIGN.md)."""
    return nbops.to_device(x) if cfg.device == "cuda" else x


def host(x):
    """A NumPy array of an array, device array or Tensor."""
    if isinstance(x, nbops.Tensor):
        x = x.data
    return x if isinstance(x, np.ndarray) else np.asarray(nbops.to_host(x))


def accuracy(logits, labels):
    """Fraction of rows whose largest logit is the label."""
    return float((host(logits).argmax(axis=1) == labels).mean())


# ---------------------------------------------------------------------------
# Training loop and progress


def progress(total, desc, cfg):
    """A progress bar of ``total`` steps: tqdm when installed, else one
    plain line rewritten in place; nothing under ``--quiet``. Used as
    ``bar.update(n, text)`` then ``bar.close()``."""
    if cfg.quiet:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _LineBar(total, desc)
    return _TqdmBar(tqdm(total=total, desc=desc, leave=False, file=sys.stdout,
                         dynamic_ncols=True))


class _NoBar:
    def update(self, n=1, text=""):
        pass

    def close(self):
        pass


class _TqdmBar(_NoBar):
    def __init__(self, bar):
        self.bar = bar

    def update(self, n=1, text=""):
        if text:
            self.bar.set_postfix_str(text, refresh=False)
        self.bar.update(n)

    def close(self):
        self.bar.close()


class _LineBar(_NoBar):
    def __init__(self, total, desc):
        self.total, self.desc, self.done = total, desc, 0

    def update(self, n=1, text=""):
        self.done += n
        sys.stdout.write(f"\r  {self.desc}: {self.done}/{self.total} {text}   ")
        sys.stdout.flush()

    def close(self):
        sys.stdout.write("\r" + " " * 72 + "\r")
        sys.stdout.flush()


def train(cfg, desc, n, batch, epochs, step, evaluate, opt=None, final_lr=0.05):
    """Minibatch training: each epoch shuffles ``range(n)`` (seeded),
    calls ``step(indices)`` (returns the batch loss as a float) per batch
    and ``evaluate()`` (returns the test accuracy) after the epoch. With
    ``opt``, its learning rate follows a cosine from its initial value down
    to ``final_lr`` times it, one value per epoch, and is restored after
    (the last epochs settle instead of jumping between minima; the spiking
    task needs it to stay within a point across seeds, the CNN and the
    Transformer measured steadier at a constant rate).

    Returns ``(history, seconds)``: history is a dict of per-epoch lists
    ``loss`` (mean batch loss) and ``accuracy``; seconds is the wall time of
    the whole loop, evaluations and first-call compilation included (the
    summary reports compilation on its own)."""
    rng = np.random.default_rng(cfg.seed)
    history = {"loss": [], "accuracy": []}
    lr0 = opt.lr if opt is not None else None
    bar = progress(epochs, desc, cfg)
    start = time.perf_counter()
    for epoch in range(epochs):
        if opt is not None:
            frac = epoch / max(epochs - 1, 1)
            opt.lr = lr0 * (final_lr + (1 - final_lr) * 0.5 * (1 + np.cos(np.pi * frac)))
        order = rng.permutation(n)
        losses = [step(order[i:i + batch]) for i in range(0, n, batch)]
        history["loss"].append(float(np.mean(losses)))
        history["accuracy"].append(evaluate())
        bar.update(1, f"loss {history['loss'][-1]:.3f} acc {history['accuracy'][-1]:.3f}")
    bar.close()
    if opt is not None:
        opt.lr = lr0
    return history, time.perf_counter() - start


def loss_value(loss):
    """The float of a 0-d loss Tensor on either device."""
    return float(host(loss))


# ---------------------------------------------------------------------------
# Timings


class CompileClock:
    """Seconds Numba spent compiling or loading kernels from its cache
    inside a ``with`` block, through Numba's event API (the
    ``numba:compiler_lock`` event: outermost intervals only, as
    :mod:`nbops.profiler` counts them)."""

    def __enter__(self):
        from numba.core import event

        from ..profiler import _CompileTimer

        self._modules = [event]
        cuda_event = sys.modules.get("numba.cuda.core.event")
        if cuda_event is not None and cuda_event is not event:
            self._modules.append(cuda_event)
        self._timer = _CompileTimer()
        for mod in self._modules:
            mod.Listener.register(_CompileTimer)   # a virtual subclass, as the profiler does
            mod.register("numba:compiler_lock", self._timer)
        return self

    def __exit__(self, *exc):
        for mod in self._modules:
            mod.unregister("numba:compiler_lock", self._timer)
        return False

    @property
    def seconds(self):
        return self._timer.total / 1e9


class Ahead:
    """A second process compiling kernels while the first task runs, on a
    machine with 2+ cores: it runs the later tasks with ``--quick`` (the
    same code path and layer sizes, so the same kernels; ``--smoke`` for a
    smoke run), the last first, quietly, into the shared disk cache. Both
    processes claim each kernel before compiling it
    (:func:`nbops.warmup.claim_kernels`), so that none compiles twice and
    no two write one cache entry; a process reaching a kernel the other is
    compiling waits and then loads it. It is stopped if this process exits
    first.

    Timings stay honest: :func:`settle` (called before every latency
    measurement and every later task) waits for the process to end, so
    nothing measured shares the cores with it."""

    current = None
    #: True in the second process itself
    inside = False
    #: environment variables: the claims folder, the file for its compile seconds
    CLAIMS, REPORT = "NBOPS_DEMO_CLAIMS", "NBOPS_DEMO_AHEAD_REPORT"

    def __init__(self, cfg, tasks, folder):
        import subprocess

        self.folder, self.report = folder, os.path.join(folder, "compile_s")
        self.seconds, self.done = 0.0, False
        env = dict(os.environ, **{self.CLAIMS: folder, self.REPORT: self.report})
        argv = [sys.executable, "-m", "nbops", "demo", "--smoke" if cfg.smoke else "--quick",
                "--ahead", "--quiet", "--no-plots",
                "--jobs", "1", "--device", cfg.device, "--seed", str(cfg.seed),
                "--split-seed", str(cfg.split_seed), "--out", folder, "--only", *tasks[1:]]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @classmethod
    def start(cls, cfg, tasks):
        """Start the process for the run's ``tasks`` after the first when it
        can help: a CPU run with ``jobs`` > 1, the cache not known warm
        (:func:`warm_marker`), and claims possible in this process (file
        locks, no kernel compiled here yet)."""
        import atexit
        import shutil
        import tempfile

        from ..warmup import claim_kernels

        if cfg.jobs < 2 or cfg.device != "cpu" or not tasks[1:]:
            return None
        if os.path.exists(warm_marker(cfg, tasks)):
            return None
        folder = tempfile.mkdtemp(prefix="nbops-demo-ahead-")
        # kept until exit: this process's claims take their locks in it
        atexit.register(shutil.rmtree, folder, True)
        if not claim_kernels(folder):
            return None
        cls.current = cls(cfg, tasks, folder)
        atexit.register(cls.current.stop)   # runs before the folder's removal
        return cls.current

    def stop(self):
        """End the process if it still runs (this one is exiting early)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()

    def wait(self):
        """Wait for the process (once); its compile seconds (0 if it failed:
        this process then compiles what it needs itself)."""
        if self.done:
            return self.seconds
        self.proc.wait()
        self.done = True
        try:
            with open(self.report) as f:
                self.seconds = float(f.read())
        except (OSError, ValueError):
            self.seconds = 0.0
        return self.seconds


def warm_marker(cfg, tasks):
    """The file a finished run of ``tasks`` leaves once the disk cache holds
    their kernels, named by what those kernels depend on (every nbops
    source and where it lies, Numba's version, the cache folder, the mode):
    a later run finding it starts no second process, whose work would only
    compete with the timings."""
    import hashlib
    import pathlib

    import numba

    from .._codegen import cache_dir

    root = pathlib.Path(nbops.__file__).parent
    h = hashlib.sha256(f"{numba.__version__} {os.environ.get('NUMBA_CACHE_DIR', '')} "
                       f"{sys.executable} {root} {cfg.smoke} {tasks}".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.read_bytes())
    return os.path.join(cache_dir(), f"demo-warm-{h.hexdigest()[:24]}")


def cores():
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def settle():
    """Wait for the background compile process of :class:`Ahead`, if one
    runs, so that what is measured next has the cores to itself."""
    if Ahead.current is not None:
        Ahead.current.wait()


def latency(fn, x, budget=0.25, most=200):
    """Median seconds of ``fn(x)`` after one warm-up call, over as many
    calls as fit in ``budget`` seconds (at least 3, at most ``most``).
    Device results are copied back, so a CUDA figure includes the copy.
    NaN in an :class:`Ahead` process, after the one call."""
    settle()
    host(fn(x))
    if Ahead.inside:
        return float("nan")
    times = []
    end = time.perf_counter() + budget
    while len(times) < 3 or (len(times) < most and time.perf_counter() < end):
        t = time.perf_counter()
        host(fn(x))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


class Timings:
    """Latencies a task measures together at its end, after every model it
    times has run once (its kernels compiled): ``add`` a row and the
    function to time, ``run`` fills the rows' ``latency_1`` / ``latency_256``
    and returns the latency chart's bars, ``{bar: {batch: seconds}}``."""

    def __init__(self):
        self.jobs = []

    def add(self, row, fn, one, batch, bar=None):
        """Time ``fn`` on ``one`` (batch 1) and ``batch`` (256) for ``row``."""
        self.jobs.append((row, fn, one, batch, bar))

    def run(self):
        bars = {}
        for row, fn, one, batch, bar in self.jobs:
            row.latency_1, row.latency_256 = latency(fn, one), latency(fn, batch)
            if bar:
                bars[bar] = {1: row.latency_1, 256: row.latency_256}
        return bars


@dataclasses.dataclass
class Result:
    """One row of the summary table."""

    task: str
    accuracy: float
    train_s: float = float("nan")
    latency_1: float = float("nan")     # seconds per call, batch 1
    latency_256: float = float("nan")   # seconds per call, batch 256
    device: str = "cpu"
    compile_s: float = float("nan")
    note: str = ""


def _ms(s):
    return "-" if s != s else f"{s * 1e3:.3g}"


def _sec(s):
    return "-" if s != s else f"{s:.1f}"


def summary_table(results):
    """The summary as text lines: one row per result."""
    head = (f"{'task':<20} {'accuracy':>8} {'train s':>8} {'ms b=1':>8} {'ms b=256':>9} "
            f"{'device':<6} {'compile s':>9}  note")
    lines = [head, "-" * len(head)]
    for r in results:
        acc = "-" if r.accuracy != r.accuracy else f"{r.accuracy:.2%}"
        lines.append(f"{r.task:<20} {acc:>8} {_sec(r.train_s):>8} "
                     f"{_ms(r.latency_1):>8} {_ms(r.latency_256):>9} {r.device:<6} "
                     f"{_sec(r.compile_s):>9}  {r.note}")
    return lines


# ---------------------------------------------------------------------------
# Plots (matplotlib optional)


def pyplot(cfg):
    """matplotlib's pyplot on the Agg backend, or None (with one line saying
    how to get it) when matplotlib is missing or plots are off."""
    if not cfg.plots:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plots skipped: matplotlib is not installed ({EXTRA_HINT} to get them)")
        return None
    return plt


def save(cfg, fig, name):
    """Write ``fig`` as ``cfg.out/name`` (100 dpi), close it, return the path."""
    os.makedirs(cfg.out, exist_ok=True)
    path = os.path.join(cfg.out, name)
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt   # loaded already: fig came from it

    plt.close(fig)
    return path


#: Figure sizes in inches at 100 dpi (the tests check the PNGs' pixels).
FIGSIZE = {"curves": (10, 4), "latency": (8, 4.5), "raster": (8, 4), "confusion": (5, 5)}


def plot_training_curves(cfg, histories):
    """Test accuracy and training loss per epoch of every task
    (``histories``: task -> history of :func:`train`); the PNG's path."""
    plt = pyplot(cfg)
    if plt is None or not histories:
        return None
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=FIGSIZE["curves"])
    for task, h in histories.items():
        epochs = np.arange(1, len(h["loss"]) + 1)
        ax_loss.plot(epochs, h["loss"], marker=".", label=task)
        ax_acc.plot(epochs, h["accuracy"], marker=".", label=task)
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="test accuracy", title="accuracy", ylim=(0, 1))
    ax_acc.legend(loc="lower right")
    fig.tight_layout()
    return save(cfg, fig, "training_curves.png")


def plot_latency(cfg, bars):
    """Grouped bars of milliseconds per call: ``bars`` maps an
    implementation ("nbops fused", "NumPy", "onnxruntime"...) to
    ``{batch: seconds}``; the PNG's path."""
    plt = pyplot(cfg)
    if plt is None or not bars:
        return None
    batches = sorted({b for v in bars.values() for b in v})
    fig, axes = plt.subplots(1, len(batches), figsize=FIGSIZE["latency"])
    for ax, b in zip(np.atleast_1d(axes), batches):
        names = [n for n in bars if b in bars[n]]
        ms = [bars[n][b] * 1e3 for n in names]
        ax.barh(names, ms, color=[f"C{i}" for i in range(len(names))])
        ax.set(xlabel="ms per call", title=f"CNN inference, batch {b}")
        ax.invert_yaxis()
    fig.tight_layout()
    return save(cfg, fig, "latency.png")


def plot_raster(cfg, spikes, title):
    """A spike raster of ``spikes`` (T, neurons) of one image; the PNG's path."""
    plt = pyplot(cfg)
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE["raster"])
    t, n = np.nonzero(np.asarray(spikes))
    ax.scatter(t, n, s=4, marker="|", color="k")
    ax.set(xlabel="time step", ylabel="neuron", title=title,
           xlim=(-0.5, spikes.shape[0] - 0.5), ylim=(-0.5, spikes.shape[1] - 0.5))
    fig.tight_layout()
    return save(cfg, fig, "spike_raster.png")


def plot_confusion(cfg, labels, predicted, title):
    """The 10 x 10 confusion matrix of ``predicted`` against ``labels``."""
    plt = pyplot(cfg)
    if plt is None:
        return None
    m = np.zeros((10, 10), np.int64)
    np.add.at(m, (labels, predicted), 1)
    fig, ax = plt.subplots(figsize=FIGSIZE["confusion"])
    ax.imshow(m, cmap="Blues")
    for (i, j), v in np.ndenumerate(m):
        if v:
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                    color="white" if v > m.max() / 2 else "black")
    ax.set(xticks=range(10), yticks=range(10), xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    return save(cfg, fig, "confusion_matrix.png")
