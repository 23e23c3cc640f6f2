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
    """``x`` as a flat C-contiguous array (of ``dtype`` on the CPU; a device
    kernel converts as it reads): a copy where ``x`` is a strided view."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x, dtype).reshape(-1)
    from ..tensor import contiguous_array

    return contiguous_array(x).reshape(-1)


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


# ---------------------------------------------------------------------------
# Declarations: samples, bad inputs and the spec of every operator


def _intensities(rng, shape, dtype, low=-0.5, high=1.5):
    return rng.uniform(low, high, shape).astype(dtype)


def _rate_samples(dtype):
    """Spike trains stored as the sample's float dtype (the op table
    compares results of that dtype); the reference reproduces the
    counter-based draws exactly."""
    rng = np.random.default_rng(0)
    e = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 0.5, 1e-30, 2.0, -1.0], dtype)
    return [_spec.Sample((_intensities(rng, (5, 20), dtype), 3), dict(dtype=dtype), "5x20"),
            _spec.Sample((_intensities(rng, (7,), dtype), 4),
                         dict(gain=0.8, mode="poisson", seed=2 ** 40 + 3, dtype=dtype),
                         "poisson,seed>2**32"),
            _spec.Sample((_intensities(rng, (2, 3, 4), dtype), 2),
                         dict(gain=2.0, seed=7, dtype=dtype), "gain2"),
            _spec.Sample((_intensities(rng, (), dtype), 5), dict(dtype=dtype), "0-d"),
            _spec.Sample((np.zeros(0, dtype), 3), dict(dtype=dtype), "empty"),
            _spec.Sample((e, 6), dict(mode="poisson", dtype=dtype), "edge")]


def _latency_samples(dtype):
    rng = np.random.default_rng(1)
    e = np.array([1.0, 0.5, 0.2, 0.011, 0.01, 0.005, 0.0, -1.0, np.nan, np.inf, 1e30], dtype)
    return [_spec.Sample((_intensities(rng, (5, 20), dtype, -0.2), 6), dict(dtype=dtype),
                         "5x20"),
            _spec.Sample((_intensities(rng, (7,), dtype, -0.2), 11),
                         dict(linear=True, dtype=dtype), "linear"),
            _spec.Sample((_intensities(rng, (2, 3, 4), dtype, -0.2), 4),
                         dict(tau=2.0, threshold=0.2, dtype=dtype), "tau,threshold"),
            _spec.Sample((np.zeros((0, 2), dtype), 3), dict(dtype=dtype), "empty"),
            _spec.Sample((e, 30), dict(dtype=dtype), "edge"),
            _spec.Sample((e, 11), dict(linear=True, dtype=dtype), "edge,linear")]


def _delta_samples(dtype):
    """Signals in multiples of 1/16: every difference is exact in float32."""
    rng = np.random.default_rng(2)

    def q(*shape):
        return (rng.integers(-16, 17, shape) / 16).astype(dtype)

    e = np.array([[0.0, 1.0, np.nan, np.inf, -np.inf, 1e30],
                  [np.inf, 1.0, 1.0, np.inf, 0.0, -1e30],
                  [np.nan, 0.5, 2.0, -np.inf, np.inf, 1e30]], dtype)
    return [_spec.Sample((q(6, 20),), dict(dtype=dtype), "6x20"),
            _spec.Sample((q(5, 7), 0.25), dict(off_spike=True, padding=True, dtype=dtype),
                         "off,padding"),
            _spec.Sample((q(4, 2, 3), 0.125), dict(off_spike=True, dtype=dtype), "off"),
            _spec.Sample((q(1, 5),), dict(padding=True, dtype=dtype), "T1,padding"),
            _spec.Sample((q(7),), dict(dtype=dtype), "1-d"),
            _spec.Sample((np.zeros((3, 0), dtype),), dict(dtype=dtype), "no-neurons"),
            _spec.Sample((e, 0.25), dict(off_spike=True, dtype=dtype), "edge")]


def _count_samples(dtype):
    """Float spike trains (float spikes are counted in their own dtype)."""
    rng = np.random.default_rng(3)
    return [_spec.Sample(((rng.random(shape) < 0.3).astype(dtype),), {}, f"{shape}")
            for shape in ((9, 2, 6), (1, 5), (5,), (4, 0), (3, 4))]


def _first_samples(dtype):
    """Spike trains of every storage dtype (the result is int32 for all),
    neurons that never fire among them, and float spikes of any nonzero
    value."""
    rng = np.random.default_rng(4)
    s = [(rng.random(shape) < 0.2) for shape in ((9, 2, 6), (1, 5), (5,), (4, 0), (12, 10))]
    e = np.array([[0.0, -0.0, 0.0, 0.0, 0.0], [0.0, 0.5, -1.0, 0.0, 0.0],
                  [0.0, 1.0, 0.0, 2.0, 0.0]], dtype)
    return ([_spec.Sample((a.astype(dtype),), {}, f"{a.shape}") for a in s]
            + [_spec.Sample((s[0].astype(np.uint8),), {}, "uint8"),
               _spec.Sample((s[4].astype(np.bool_),), {}, "bool"),
               _spec.Sample((s[4].astype(np.int8),), {}, "int8"),
               _spec.Sample((e,), {}, "edge")])


def _spikes_bad(dtype):
    return [
        _spec.Bad((np.ones((4, 3), np.int64),), {}, TypeError, "'spikes'"),
        _spec.Bad((np.ones((4, 3), np.complex64),), {}, TypeError, "'spikes'"),
        _spec.Bad((np.ones((), np.uint8),), {}, ValueError, "time-major"),
        _spec.Bad((np.ones((0, 3), np.uint8),), {}, ValueError, "time-major"),
        _spec.Bad(([1, 0],), {}, TypeError, "'spikes'")]


SPECS = {s.name: s for s in (
    _spec.OpSpec(
        "spike_rate", FAMILY, ("rate",), reference="test_neuromorphic:ref_rate",
        samples=_rate_samples, out=False,
        bad=_spec.float_only(1, ("x",), defaults=dict(num_steps=4), params=(
            (dict(num_steps=0), ValueError, "'num_steps'"),
            (dict(num_steps=2.0), TypeError, "'num_steps' must be an int"),
            (dict(gain=-1.0), ValueError, "'gain'"),
            (dict(mode="gauss"), ValueError, "'mode'"),
            (dict(seed=-1), ValueError, "'seed'"),
            (dict(seed=2 ** 64), ValueError, r"'seed' must be < 2\*\*64"),
            (dict(seed=True), TypeError, "'seed' must be an int"),
            (dict(dtype=np.int64), TypeError, "'dtype'")))),
    _spec.OpSpec(
        "spike_latency", FAMILY, ("latency",), reference="test_neuromorphic:ref_latency",
        samples=_latency_samples, out=False,
        bad=_spec.float_only(1, ("x",), defaults=dict(num_steps=4), params=(
            (dict(tau=0.0), ValueError, "'tau'"),
            (dict(threshold=-1.0), ValueError, "'threshold'"),
            (dict(linear=1), TypeError, "'linear'"),
            (dict(num_steps=0), ValueError, "'num_steps'"),
            (dict(dtype=np.int8), TypeError, "'dtype'")))),
    _spec.OpSpec(
        "spike_delta", FAMILY, ("delta",), reference="test_neuromorphic:ref_delta",
        samples=_delta_samples, out=False,
        bad=_spec.float_only(1, ("x",), params=(
            (dict(threshold=0.0), ValueError, "'threshold'"),
            (dict(off_spike=True, dtype=np.uint8), TypeError, "'dtype'"),
            (dict(padding="no"), TypeError, "'padding'"),
            _spec.Bad((np.ones((), np.float32),), {}, ValueError, "time-major")))),
    _spec.OpSpec(
        "spike_count", FAMILY, ("spike_count",), reference="test_neuromorphic:ref_spike_count",
        samples=_count_samples, bad=_spikes_bad, out=False),
    # int32 steps for every spike dtype (compared exactly)
    _spec.OpSpec("first_spike_time", FAMILY, ("first_spike_time",),
                 reference="test_neuromorphic:ref_first_spike_time", samples=_first_samples,
                 bad=_spikes_bad, out=False),
)}


@operator(SPECS["spike_rate"])
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
    g = _checks.scalar("spike_rate", "gain", gain, low=0.0)
    _checks.choice("spike_rate", "mode", mode, ("bernoulli", "poisson"))
    key = _seed("spike_rate", seed)
    return _encode("spike_rate", "rate", x, num_steps, dtype, (key, g, mode == "poisson"))


@operator(SPECS["spike_latency"])
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
    tau = _checks.scalar("spike_latency", "tau", tau, low=0.0, low_open=True)
    thr = _checks.scalar("spike_latency", "threshold", threshold, low=0.0)
    if not isinstance(linear, (bool, np.bool_)):
        raise TypeError(f"spike_latency: argument 'linear' must be a bool, got "
                        f"{_checks.describe(linear)}")
    return _encode("spike_latency", "latency", x, num_steps, dtype, (tau, thr, bool(linear)))


@operator(SPECS["spike_delta"])
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
    x = _checks.array("spike_delta", "x", x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(f"spike_delta: argument 'x' must be time-major [T, ...] with T >= 1, got "
                         f"shape {tuple(x.shape)}")
    thr = _checks.scalar("spike_delta", "threshold", threshold, low=0.0, low_open=True)
    for name, flag in (("padding", padding), ("off_spike", off_spike)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"spike_delta: argument '{name}' must be a bool, got "
                            f"{_checks.describe(flag)}")
    signed = (np.dtype(np.int8), np.dtype(np.float32), np.dtype(np.float64))
    d = _storage("spike_delta",
                 dtype if dtype is not None else (np.int8 if off_spike else np.uint8),
                 signed if off_spike else _ANY_SPIKES)
    dev = _dispatch.resolve_device("spike_delta", x=x)
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


@operator(SPECS["spike_count"])
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


@operator(SPECS["first_spike_time"])
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
