"""Spike encoders and decoders, on the CPU and on CUDA.

Encoders turn intensities into time-major spike trains ``[T, ...]``;
decoders reduce spike trains over the time axis. Spike trains are stored as
``uint8`` by default (a quarter of float32's memory), or as ``bool``,
``float32``/``float64`` on request; the decoders accept any of them.

Random encoders are counter-based: the draw for element ``(t, i)`` depends
only on the seed and its position, so a seed gives the same spikes on the
CPU and on CUDA, for any number of threads.
"""

import importlib

import numpy as np

from .. import _checks, _dispatch, _spec
from .._dispatch import operator

# the package's ``lif`` attribute is the public function; reach the module by name
_lif = importlib.import_module(".lif", __package__)

__all__ = ["rate", "latency", "delta", "spike_count", "first_spike_time"]

FAMILY = _spec.subpackage("neuromorphic")
_dispatch.register_kernels(FAMILY, ("rate", "latency", "delta", "spike_count",
                                    "first_spike_time"))

_SPIKE_STORAGE = tuple(np.dtype(d) for d in (np.uint8, np.bool_, np.float32, np.float64))
_ANY_SPIKES = _SPIKE_STORAGE + (np.dtype(np.int8),)


def _steps(op, num_steps):
    return _checks.int_arg(op, "num_steps", num_steps, low=1)


def _storage(op, dtype, allowed=_SPIKE_STORAGE):
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    # not `d not in allowed` alone: NumPy's float64 == None is True
    if d is None or d not in allowed:
        raise TypeError(f"{op}: argument 'dtype' must be one of "
                        f"{', '.join(a.name for a in allowed)}, got {dtype!r}")
    return d


def _flat(x, dtype=None):
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x, dtype).reshape(-1)
    from .. import _layout

    if not _layout.is_c_contiguous(x):
        raise ValueError("device arrays must be C-contiguous here; copy them first")
    return x.reshape(-1)


def _seed(op, seed):
    seed = _checks.int_arg(op, "seed", seed, low=0)
    if seed >= 2 ** 64:
        raise ValueError(f"{op}: argument 'seed' must be < 2**64, got {seed}")
    return _lif.seed_key(seed)


def _encode(op, kernel, x, num_steps, dtype, args):
    x = _checks.array(op, "x", x)
    t = _steps(op, num_steps)
    d = _storage(op, dtype)
    dev = _dispatch.resolve_device(op, x=x)
    out = _checks.empty((t,) + tuple(x.shape), d, dev, op)
    # the kernels compute in float64 anyway: one compiled CPU kernel per output dtype
    FAMILY.kernel(kernel, dev)(_flat(x, np.float64), *args,
                               out.reshape(t, -1) if x.size else out)
    return out


@operator("spike_rate")
def rate(x, num_steps, gain=1.0, *, mode="bernoulli", seed=0, dtype=np.uint8):
    """Rate coding: independent spikes whose probability grows with intensity.

    ``mode="bernoulli"``: a spike at each step with probability
    ``clip(gain * x, 0, 1)`` (snnTorch's ``spikegen.rate``).
    ``mode="poisson"``: a spike where a Poisson process of rate ``gain * x``
    per step fires at least once in that step, ``1 - exp(-gain * x)``.

    Parameters
    ----------
    x : float32/float64 array [...], CPU or device
        Intensities (NaN and negative values never spike).
    num_steps : int >= 1
    gain : float >= 0
    seed : int in [0, 2**64)
        The same seed gives the same spikes on every device.
    dtype : np.uint8 (default), np.bool_, np.float32 or np.float64

    Returns
    -------
    spikes : [num_steps, *x.shape] of ``dtype`` on x's device.

    Raises TypeError (x not float, bad dtype, non-int num_steps or seed) and
    ValueError (num_steps < 1, negative gain, unknown mode, seed outside
    [0, 2**64)).

    Example
    -------
    >>> s = nbops.neuromorphic.rate(np.array([0.0, 0.5, 1.0]), num_steps=100, seed=1)
    >>> s.shape, int(s[:, 0].sum()), int(s[:, 2].sum())
    ((100, 3), 0, 100)
    """
    g = _checks.scalar("rate", "gain", gain, low=0.0)
    _checks.choice("rate", "mode", mode, ("bernoulli", "poisson"))
    key = _seed("rate", seed)
    return _encode("rate", "rate", x, num_steps, dtype, (key, g, mode == "poisson"))


@operator("spike_latency")
def latency(x, num_steps, *, tau=5.0, threshold=0.01, linear=False, dtype=np.uint8):
    """Latency coding: one spike per neuron, earlier for stronger input.

    Intensities ``x <= threshold`` never fire. Otherwise the spike step is
    ``round(tau * log(x / (x - threshold)))`` (an RC circuit charging to
    ``threshold``, snnTorch's ``spikegen.latency``), or with ``linear=True``
    ``round((1 - min(x, 1)) * (num_steps - 1))`` (x = 1 fires at step 0).
    Steps at or past ``num_steps`` mean no spike.

    Parameters
    ----------
    x : float32/float64 array [...], CPU or device
    num_steps : int >= 1
    tau : float > 0;  threshold : float >= 0;  linear : bool
    dtype : np.uint8 (default), np.bool_, np.float32 or np.float64

    Returns ``[num_steps, *x.shape]`` spikes. Raises TypeError/ValueError
    for bad types and ranges, as :func:`rate`.

    Example
    -------
    >>> s = nbops.neuromorphic.latency(np.array([1.0, 0.5, 0.0]), 5, linear=True)
    >>> nbops.neuromorphic.first_spike_time(s)       # 5: never
    array([0, 2, 5], dtype=int32)
    """
    tau = _checks.scalar("latency", "tau", tau, low=0.0, low_open=True)
    thr = _checks.scalar("latency", "threshold", threshold, low=0.0)
    if not isinstance(linear, (bool, np.bool_)):
        raise TypeError(f"latency: argument 'linear' must be a bool, got "
                        f"{_checks.describe(linear)}")
    return _encode("latency", "latency", x, num_steps, dtype, (tau, thr, bool(linear)))


@operator("spike_delta")
def delta(x, threshold=0.1, *, padding=False, off_spike=False, dtype=None):
    """Delta modulation: a spike where the signal rose by ``threshold``.

    ``x`` is a time-major sequence ``[T, ...]``; ``s[t] = 1`` where
    ``x[t] - x[t-1] >= threshold``, and with ``off_spike=True`` ``-1``
    where it fell by as much. The first step compares with 0, or with
    itself (no spike) when ``padding=True`` (snnTorch's ``spikegen.delta``).

    Returns ``[T, ...]`` spikes of ``dtype``: uint8 by default, int8 (the
    default) with ``off_spike``; float32/float64 also accepted.
    Raises TypeError for non-float x or a dtype that cannot hold -1,
    ValueError for x without a time axis or a threshold <= 0.

    Example
    -------
    >>> nbops.neuromorphic.delta(np.array([[0.0], [0.5], [0.55], [0.0]]), 0.1,
    ...                          off_spike=True)[:, 0]
    array([ 0,  1,  0, -1], dtype=int8)
    """
    x = _checks.array("delta", "x", x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(f"delta: argument 'x' must be time-major [T, ...] with T >= 1, got "
                         f"shape {tuple(x.shape)}")
    thr = _checks.scalar("delta", "threshold", threshold, low=0.0, low_open=True)
    for name, flag in (("padding", padding), ("off_spike", off_spike)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"delta: argument '{name}' must be a bool, got "
                            f"{_checks.describe(flag)}")
    signed = (np.dtype(np.int8), np.dtype(np.float32), np.dtype(np.float64))
    d = _storage("delta", dtype if dtype is not None else (np.int8 if off_spike else np.uint8),
                 signed if off_spike else _ANY_SPIKES)
    dev = _dispatch.resolve_device("delta", x=x)
    out = _checks.empty(tuple(x.shape), d, dev)
    t = x.shape[0]
    if x.size:
        FAMILY.kernel("delta", dev)(_flat(x).reshape(t, -1), thr, bool(padding),
                                    bool(off_spike), out.reshape(t, -1))
    return out


def _spikes(op, spikes):
    """``(device, spikes)``, the spikes as :func:`nbops._checks.array` returns
    them (native byte order)."""
    spikes = _checks.array(op, "spikes", spikes, _ANY_SPIKES)
    if spikes.ndim < 1 or spikes.shape[0] == 0:
        raise ValueError(f"{op}: argument 'spikes' must be time-major [T, ...] with T >= 1, "
                         f"got shape {tuple(spikes.shape)}")
    return _dispatch.resolve_device(op, spikes=spikes), spikes


def _counted(spikes):
    # bool spikes are counted through their bytes: one kernel for bool and uint8
    return spikes.view(np.uint8) if spikes.dtype == np.bool_ else spikes


@operator("spike_count")
def spike_count(spikes):
    """Spikes per neuron over the time axis (rate decoding).

    ``spikes`` is ``[T, ...]`` of uint8, int8, bool, float32 or float64, on
    the CPU or a device. Returns ``[...]``: int32 counts for integer and
    bool spikes, the sum in the spikes' dtype for float spikes. Raises
    TypeError for other dtypes, ValueError without a time axis.

    Example
    -------
    >>> nbops.neuromorphic.spike_count(np.array([[1, 0], [1, 1]], np.uint8))
    array([2, 1], dtype=int32)
    """
    dev, spikes = _spikes("spike_count", spikes)
    d = spikes.dtype if spikes.dtype.kind == "f" else np.dtype(np.int32)
    out = _checks.empty(tuple(spikes.shape[1:]), d, dev)
    t = spikes.shape[0]
    FAMILY.kernel("spike_count", dev)(_flat(_counted(spikes)).reshape(t, -1),
                                      out.reshape(-1))
    return out


@operator("first_spike_time")
def first_spike_time(spikes):
    """Step of each neuron's first spike (latency decoding); ``T`` where a
    neuron never fires.

    ``spikes`` as :func:`spike_count`. Returns ``[...]`` int32.

    Example
    -------
    >>> nbops.neuromorphic.first_spike_time(np.array([[0, 0], [1, 0], [1, 0]], np.uint8))
    array([1, 3], dtype=int32)
    """
    dev, spikes = _spikes("first_spike_time", spikes)
    out = _checks.empty(tuple(spikes.shape[1:]), np.int32, dev)
    t = spikes.shape[0]
    FAMILY.kernel("first_spike_time", dev)(_flat(_counted(spikes)).reshape(t, -1),
                                           out.reshape(-1))
    return out
