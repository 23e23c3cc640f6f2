"""Spiking neurons: whole sequences in one kernel, trainable through time.

Inputs are time-major, ``[T, ...]``: the first axis is time, the others are
neurons (``[T, batch, features]``, ``[T, batch, channels, h, w]``...). Each
model runs its time loop *inside* one kernel, parallel over neurons and
sequential over steps, on the CPU (NumPy arrays) or on CUDA (device arrays),
in float32 or float64:

=============  ==============================================================
:func:`lif`    leaky integrate-and-fire (the seed article's loop), optional
               refractory period
:func:`if_neuron`  integrate-and-fire, no leak (``lif`` with ``beta = 1``)
:func:`synaptic`   second order: synaptic current, then membrane
:func:`alif`   adaptive threshold (LSNN-style)
:func:`lif_step`   one time step of ``lif`` for streaming (edge) use
=============  ==============================================================

The equations, and how the order of decay and reset compares with
snnTorch's ``Leaky``, are in :mod:`nbops.neuromorphic.lif`. Spikes may be
stored as the input's float dtype (default), ``uint8`` or ``bool``.

Training: every model has a backward pass through time (``lif_backward``,
...) with a surrogate derivative chosen by name from one table
(:data:`SURROGATES`: ``"fast_sigmoid"`` (``slope``), ``"sigmoid"``
(``slope``), ``"atan"`` (``alpha``), ``"triangle"`` (``width``),
``"straight_through"``), gradients for the inputs, the initial state and the
learnable ``beta`` and ``threshold``; the models are nbops operators, so
they join the autograd tape when given :class:`nbops.Tensor` arguments.

Encoders and decoders live in :mod:`nbops.neuromorphic.encoding` and are
re-exported here: :func:`rate`, :func:`latency`, :func:`delta`,
:func:`spike_count`, :func:`first_spike_time`.
"""

import numbers

import numpy as np

from .. import _checks, _dispatch, _layout, _spec
from .._dispatch import operator
from . import lif as _lif
from .encoding import delta, first_spike_time, latency, rate, spike_count  # noqa: F401
from .lif import LIFParameters, LIFState, SURROGATES  # noqa: F401

__all__ = ["lif", "if_neuron", "synaptic", "alif", "lif_step", "lif_backward",
           "if_neuron_backward", "synaptic_backward", "alif_backward", "LIFParameters",
           "LIFState", "SURROGATES", "rate", "latency", "delta", "spike_count",
           "first_spike_time"]

FAMILY = _spec.subpackage("neuromorphic")

_SPIKE_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))

# ---------------------------------------------------------------------------
# Argument checks


def _sequence(op, inputs):
    inputs = _checks.array(op, "inputs", inputs)
    if inputs.ndim < 2:
        raise ValueError(
            f"{op}: argument 'inputs' must be time-major [T, ...] with at least one neuron "
            f"axis after the time axis, got shape {tuple(inputs.shape)}; for a single "
            "neuron use inputs[:, None]")
    if inputs.shape[0] == 0:
        raise ValueError(f"{op}: argument 'inputs' has an empty time axis (shape "
                         f"{tuple(inputs.shape)}); the first axis must be time, T >= 1")
    return inputs


def _contiguous(x):
    """``x`` C-contiguous: a copy where it is a strided view (the kernels
    read rows of neurons), on either device."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    from ..tensor import contiguous_array

    return contiguous_array(x)


def _state(op, name, value, inputs, dev):
    """An initial state: None (rest) or an array shaped like one time step."""
    if value is None:
        return None
    value = _checks.array(op, name, value)
    _checks.same_dtype(op, inputs=inputs, **{name: value})
    step = tuple(inputs.shape[1:])
    if tuple(value.shape) != step:
        hint = ""
        for ax in range(1, inputs.ndim):
            if tuple(value.shape) == tuple(np.delete(inputs.shape, ax)):
                hint = (f"; it matches the inputs without axis {ax}: the time axis must be "
                        f"first (np.moveaxis(inputs, {ax}, 0))")
        raise ValueError(f"{op}: argument '{name}' must have the shape of one time step "
                         f"{step}, got {tuple(value.shape)}{hint}")
    return _contiguous(value).reshape(-1)


def _param(op, name, value, dtype, step, low, high=None, low_open=False):
    """A model parameter: a number, or an array that broadcasts to one time
    step. Returns ``(value, shape or None)``: a dtype scalar, or a host
    ``[M]`` array of per-neuron values; the shape is that of the user's
    array (None for a number), to shape its gradient."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        v = _checks.scalar(op, name, value, low=low, high=high, low_open=low_open)
        return dtype.type(v), None
    if not (isinstance(value, np.ndarray) or _dispatch.is_device_array(value)):
        raise TypeError(f"{op}: argument '{name}' must be a number or an array, got "
                        f"{_checks.describe(value)}")
    value = _checks.array(op, name, value)
    if value.dtype != dtype:
        raise TypeError(f"{op}: argument '{name}' is {value.dtype} but 'inputs' is {dtype}; "
                        "cast one of them explicitly")
    host = np.asarray(_dispatch.to_host(value))
    try:
        ok = np.broadcast_shapes(host.shape, step) == tuple(step)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{op}: argument '{name}' of shape {host.shape} does not broadcast "
                         f"to one time step {tuple(step)} (per-neuron parameters have the "
                         "neurons' shape or a shape that broadcasts to it)")
    bad = ~np.isfinite(host) | (host < low) | ((host <= low) if low_open else False)
    if high is not None:
        bad |= host > high
    if bad.any():
        rng = f"[{low}, {high}]" if high is not None else (f"> {low}" if low_open else
                                                          f">= {low}")
        raise ValueError(f"{op}: argument '{name}' must be finite and in {rng}, got "
                         f"{host.reshape(-1)[np.argmax(bad.reshape(-1))]!r}")
    if host.size == 1:
        return dtype.type(host.reshape(-1)[0]), host.shape
    return np.broadcast_to(host, step).reshape(-1), host.shape


def _surrogate(op, surrogate, dtype, given):
    """``(name, typed parameter)`` from ``surrogate`` (a name or a
    ``(name, value)`` pair) and the surrogate keywords the caller set."""
    value = None
    if isinstance(surrogate, tuple) and len(surrogate) == 2:
        surrogate, value = surrogate
    _checks.choice(op, "surrogate", surrogate, tuple(_lif.SURROGATES))
    _, key, default = _lif.SURROGATES[surrogate]
    for k, v in given.items():
        if v is None:
            continue
        if k != key:
            raise ValueError(f"{op}: surrogate {surrogate!r} takes "
                             + (f"'{key}'" if key else "no parameter")
                             + f", not '{k}'")
        value = v
    value = default if value is None else value
    v = _checks.scalar(op, key or "surrogate parameter", value, low=0.0, low_open=True)
    return surrogate, dtype.type(v)


def _refractory(op, value):
    """The refractory period in time steps."""
    return _checks.int_arg(op, "refractory", value, low=0)


def _spike_dtype(op, spike_dtype, dtype):
    if spike_dtype is None:
        return dtype
    try:
        d = np.dtype(spike_dtype)
    except TypeError:
        d = None
    if d not in (dtype,) + _SPIKE_DTYPES:
        raise TypeError(f"{op}: argument 'spike_dtype' must be None, {dtype.name}, uint8 or "
                        f"bool, got {spike_dtype!r}")
    return d


# ---------------------------------------------------------------------------
# The shared front of every model and of every backward


class _Call:
    """A model call with its arguments checked and laid out for the kernels:
    ``x[T, M]``, state ``a0``/``b0`` (``[M]`` or None), the four parameters
    ``p`` and their user shapes, constants ``c``, surrogate and device."""

    def __init__(self, op, model, inputs, beta, threshold, reset, a0, b0, p2=0.0, p3=0.0,
                 refractory=0, surrogate="fast_sigmoid", sgrad=None, detach_reset=True,
                 out=None):
        inputs = _sequence(op, inputs)
        self.dev = _dispatch.resolve_device(op, inputs=inputs, beta=beta, threshold=threshold,
                                            **{a0[0]: a0[1], b0[0]: b0[1]}, out=out)
        self.op, self.model, self.dtype = op, model, inputs.dtype
        self.shape = tuple(inputs.shape)
        step = self.shape[1:]
        _checks.choice(op, "reset", reset, _lif.RESETS)
        self.refractory = _refractory(op, refractory)
        names = _lif.MODELS[model][2]
        bt, self.beta_shape = _param(op, "beta", beta, self.dtype, step, 0.0, 1.0)
        th, self.thr_shape = _param(op, "threshold", threshold, self.dtype, step, 0.0,
                                    low_open=True)
        q2 = _param(op, names[0], p2, self.dtype, step, 0.0, 1.0)[0] if names[0] else \
            self.dtype.type(0)
        q3 = _param(op, names[1], p3, self.dtype, step, 0.0)[0] if names[1] else \
            self.dtype.type(0)
        # the kernels take the parameters as rows of one [4, 1] (shared) or
        # [4, M] (per neuron) array
        self.m = int(np.prod(step))
        p = [bt, th, q2, q3]
        cols = self.m if any(np.ndim(v) for v in p) else 1
        prm = np.empty((4, cols), self.dtype)
        for row, v in enumerate(p):
            prm[row] = v
        self.p = prm if self.dev == _dispatch.CPU else _dispatch.to_device(prm)
        self.surrogate, self.sp = _surrogate(op, surrogate, self.dtype, sgrad or {})
        if not isinstance(detach_reset, (bool, np.bool_)):
            raise TypeError(f"{op}: argument 'detach_reset' must be a bool, got "
                            f"{_checks.describe(detach_reset)}")
        self.c = _lif.consts(self.dtype, reset, detach_reset, self.refractory)
        # rest is zeros, passed as an array: one kernel signature per model
        # (LIF without refractory period keeps no second state at all)
        self.keep_b = _lif.keeps_second_state(model, self.refractory)
        self.a0 = self._state0(a0, inputs)
        self.b0 = self._state0(b0, inputs) if self.keep_b else None
        self.x = _contiguous(inputs).reshape(self.shape[0], self.m)

    def _state0(self, named, inputs):
        given = _state(self.op, named[0], named[1], inputs, self.dev)
        return self.zeros(self.m) if given is None else given

    def zeros(self, n):
        z = np.zeros(n, self.dtype)
        return z if self.dev == _dispatch.CPU else _dispatch.to_device(z)

    def empty(self, shape, dtype=None):
        return _checks.empty(shape, dtype or self.dtype, self.dev)

    def forward(self, trace, spike_dtype, out=None, a_out=None):
        # a_out: where the final membrane goes (the initial state's own
        # array for lif_step(inplace=True): each chunk reads its a0 first)
        sd = _spike_dtype(self.op, spike_dtype, self.dtype)
        spk = _checks.output(self.op, out, self.shape, sd, self.dev,
                             {"inputs": self.x, "v0": self.a0})
        a = self.empty(self.shape[1:]) if a_out is None else a_out
        b = self.empty(self.shape[1:]) if self.keep_b else None
        tr = self.empty(self.shape) if trace else None
        t, m = self.shape[0], self.m
        FAMILY.kernel("forward", self.dev)(
            self.model, self.x, self.a0, self.b0, self.p, self.c, spk.reshape(t, m),
            a.reshape(m), None if b is None else b.reshape(m),
            None if tr is None else tr.reshape(t, m))
        return spk, a, b, tr

    def backward(self, grad_spikes, grad_a, grad_b, grad_trace, out=None):
        t, m = self.shape[0], self.m
        gs = self._grad("grad_spikes", grad_spikes, self.shape).reshape(t, m)
        ga = self._grad("grad_v", grad_a, self.shape[1:])
        gb = self._grad("grad_state", grad_b, self.shape[1:])
        ga = self.zeros(m) if ga is None else ga.reshape(m)
        gb = self.zeros(m) if gb is None else gb.reshape(m)
        gtr = self._grad("grad_trace", grad_trace, self.shape)
        gx = _checks.output(self.op, out, self.shape, self.dtype, self.dev,
                            {"inputs": self.x, "grad_spikes": gs, "grad_trace": gtr})
        ga0, gb0, gbeta, gthr = (self.empty((m,)) for _ in range(4))
        FAMILY.kernel("backward", self.dev)(
            self.model, self.surrogate, self.x, self.a0,
            self.zeros(m) if self.b0 is None else self.b0, self.p, self.c, self.sp, gs,
            None if gtr is None else gtr.reshape(t, m),
            ga, gb,
            gx.reshape(t, m), ga0, gb0, gbeta, gthr)
        step = self.shape[1:]
        return (gx, _reduce(gbeta, self.beta_shape, step, self.dev),
                _reduce(gthr, self.thr_shape, step, self.dev),
                ga0.reshape(step), gb0.reshape(step))

    def _grad(self, name, g, shape):
        if g is None:
            return None
        g = _checks.array(self.op, name, g, _checks.FLOAT_DTYPES + _SPIKE_DTYPES)
        if tuple(g.shape) != tuple(shape):
            raise ValueError(f"{self.op}: argument '{name}' must have shape {tuple(shape)}, "
                             f"got {tuple(g.shape)}")
        if _dispatch.device_of_array(g) != self.dev:
            raise TypeError(f"{self.op}: argument '{name}' is on "
                            f"{_dispatch.device_of_array(g)} but 'inputs' is on {self.dev}")
        if g.dtype != self.dtype:
            # autograd hands integer spikes a zero gradient of their own dtype
            g = _dispatch.to_host(g).astype(self.dtype)
            g = g if self.dev == _dispatch.CPU else _dispatch.to_device(g)
        return _contiguous(g)


def _reduce(g, shape, step, dev):
    """Per-neuron gradient ``g[M]`` summed (in float64) to a parameter's
    shape: a Python float for a number, else an array of ``shape``."""
    host = np.asarray(_dispatch.to_host(g), np.float64).reshape(step)
    if shape is None:
        return float(host.sum())
    lead = len(step) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                      if n == 1 and step[lead + i] != 1)
    r = host.sum(axis=axes, keepdims=True).reshape(shape).astype(g.dtype)
    return r if dev == _dispatch.CPU else _dispatch.to_device(r)


def _surrogate_kw(slope, alpha, width):
    return {"slope": slope, "alpha": alpha, "width": width}


# ---------------------------------------------------------------------------
# Backward rules for autograd: one gradient per forward parameter


def _rule(model, layout):
    """The autograd rule of a model whose forward parameters are named in
    ``layout`` (the names of its gradient slots, in signature order). The
    backward operators are looked up at call time: the rules are declared
    before them."""

    def rule(ctx, *grads):
        back = {"lif": lif_backward, "if": if_neuron_backward, "synaptic": synaptic_backward,
                "alif": alif_backward}[model]
        kw = dict(ctx.kwargs)
        for k in ("trace", "spike_dtype", "out"):
            kw.pop(k, None)
        gs = grads[0]
        states = grads[1:3] if model in ("synaptic", "alif") else grads[1:2]
        gtr = grads[len(states) + 1] if ctx.kwargs.get("trace") else None
        if model == "synaptic":
            kw["grad_syn"], kw["grad_v"] = states
        elif model == "alif":
            kw["grad_v"], kw["grad_a"] = states
        else:
            kw["grad_v"] = states[0]
        kw["grad_trace"] = gtr
        named = back(gs, **kw)
        return tuple(named.get(k) for k in layout)

    return rule


_BACK_DOC = """

    Returns a dict of gradients: ``"inputs"`` (shape of inputs), ``"beta"``
    and ``"threshold"`` (a float for a number, else an array of the
    argument's shape, summed over the neurons it was broadcast to), and the
    initial state(s) (``"v0"``, ...: arrays shaped like one step). Upstream
    gradients: ``grad_spikes`` (required, shape of the spikes), of the final
    state(s) and of the membrane trace (optional). Model arguments must be
    those of the forward call. The backward recomputes the forward inside
    the kernel, so it needs no saved trace. ``out`` (optional, shape and
    dtype of inputs, C-contiguous, on their device, overlapping none of
    the inputs) receives the input gradient: a training loop that passes
    the same buffer every step saves the allocation (and the page faults
    of a fresh one: about a third of the kernel's time at T=100 x
    [64, 4096]).
    """


# ---------------------------------------------------------------------------
# Declarations: samples, bad inputs and the spec of every operator


def _current(rng, shape, dtype):
    """Input currents in multiples of 1/16: with decays of 1/2 or 3/4 every
    membrane value of a few steps is exact in float32, so the float32 spikes
    are those of the float64 reference (no spike hangs on a rounding)."""
    return (rng.integers(-4, 20, shape) / 16).astype(dtype)


def _neuron_samples(model, params, kwargs=None, refractory=True):
    """``samples(dtype)`` of ``model`` whose positional parameters between
    ``inputs`` and ``threshold`` are ``params`` (``beta`` last), with
    ``kwargs`` in every call: the main call (initial state, trace), each
    reset, per-neuron beta and threshold, one step, no neurons, special
    values."""
    kwargs = dict(kwargs or {})

    def samples(dtype):
        rng = np.random.default_rng(0)

        def x(*shape):
            return _current(rng, shape, dtype)

        state = {"lif": ("v0",), "synaptic": ("syn0", "v0"), "alif": ("v0", "a0")}[model]
        p, kw = tuple(params), kwargs
        out = [_spec.Sample((x(6, 4, 5),) + p,
                            dict(kw, trace=True, **{k: x(4, 5) for k in state}),
                            "T6x4x5,state,trace"),
               _spec.Sample((x(5, 7),) + p, dict(kw, threshold=1.0, reset="zero"), "zero"),
               _spec.Sample((x(4, 3),) + p, dict(kw, threshold=0.75, reset="none", trace=True),
                            "none"),
               _spec.Sample((x(1, 5),) + p, kw, "T1"),
               _spec.Sample((x(3, 0),) + p, kw, "no-neurons")]
        if refractory:
            out.append(_spec.Sample((x(6, 9),) + p, dict(kw, refractory=2), "refractory"))
        if p:
            # per-neuron parameters: beta over the features, threshold per batch row
            beta = np.array([0.5, 0.75, 1.0, 0.25], dtype)
            per = p[:-1] + (beta, np.full((3, 1), 0.75, dtype))
            out.append(_spec.Sample((x(5, 3, 4),) + per, kw, "per-neuron"))
        e = np.zeros((3, len(_spec.EDGE_VALUES)), dtype)
        e[0] = _spec.EDGE_VALUES
        out.append(_spec.Sample((e,) + p, kw, "edge"))
        return out

    return samples


_X = np.zeros((4, 3), np.float32)


def _bad(*calls):
    return lambda dtype: [_spec.Bad(*c) for c in calls]


_NEURON_BAD = (
    ((_X.astype(np.int32),), {}, TypeError, "'inputs' must be a float32"),
    ((_X[0],), {}, ValueError, "time-major"),
    ((_X[:0],), {}, ValueError, "empty time axis"),
    ((_X,), dict(threshold=0.0), ValueError, "'threshold' must be > 0"),
    ((_X,), dict(threshold=-1.0), ValueError, "'threshold'"),
    ((_X,), dict(threshold=float("nan")), ValueError, "'threshold' must be finite"),
    ((_X,), dict(reset="hard"), ValueError, "'reset'"),
    ((_X,), dict(v0=np.zeros(4, np.float32)), ValueError, "one time step"),
    ((np.zeros((4, 3, 5), np.float32),), dict(v0=np.zeros((4, 5), np.float32)), ValueError,
     "time axis must be first"),
    ((_X,), dict(v0=np.zeros(3)), TypeError, "'v0' is float64"),
    ((_X,), dict(surrogate="relu"), ValueError, "'surrogate'"),
    ((_X,), dict(slope=-1.0), ValueError, "'slope'"),
    ((_X,), dict(surrogate="straight_through", width=1.0), ValueError, "no parameter"),
    ((_X,), dict(spike_dtype=np.int64), TypeError, "'spike_dtype'"),
    ((_X,), dict(detach_reset="yes"), TypeError, "'detach_reset'"),
    ((_X,), dict(out=np.empty((4, 3), np.float64)), TypeError, "'out' must be float32"))


def _with(params, *calls, refractory=True, surrogate_alpha=True):
    """Bad calls of a model: the shared ones with ``params`` (keyword
    arguments every call needs) added, then ``calls``."""
    shared = [(a, {**params, **kw}, e, m) for a, kw, e, m in _NEURON_BAD]
    if refractory:
        shared += [((_X,), dict(params, refractory=-1), ValueError, "'refractory'"),
                   ((_X,), dict(params, refractory=1.5), TypeError,
                    "'refractory' must be an int")]
    if surrogate_alpha:
        shared.append(((_X,), dict(params, surrogate="atan", slope=3.0), ValueError,
                       "takes 'alpha'"))
    return _bad(*shared, *calls)


_BETA_BAD = (
    ((_X, 1.5), {}, ValueError, "'beta'"),
    ((_X, -0.1), {}, ValueError, "'beta'"),
    ((_X, np.array([0.5, 1.2, 0.1], np.float32)), {}, ValueError, "'beta' must be"),
    ((_X, np.ones(4, np.float32)), {}, ValueError, "does not broadcast"),
    ((_X, np.ones(3)), {}, TypeError, "'beta' is float64"),
    ((_X, "0.9"), {}, TypeError, "'beta'"))


def _backward_bad(params):
    """Bad calls of a backward pass: its upstream gradients and ``out=``
    (the model's own arguments are checked by the same code as the forward's)."""
    g = np.ones((4, 3), np.float32)
    return _bad(
        ((np.ones((4, 2), np.float32), _X), params, ValueError, "'grad_spikes' must have shape"),
        ((g, _X), dict(params, grad_v=np.ones(4, np.float32)), ValueError, "'grad_v'"),
        ((g, _X), dict(params, grad_trace=np.ones(3, np.float32)), ValueError,
         "'grad_trace'"),
        ((g, _X), dict(params, out=np.empty((4, 3), np.float64)), TypeError,
         "'out' must be float32"),
        ((g, _X), dict(params, out=np.empty((3, 4), np.float32)), ValueError,
         "'out' must have shape"),
        ((g, _X.astype(np.int32)), params, TypeError, "'inputs' must be a float32"),
        ((g, _X), dict(params, surrogate="relu"), ValueError, "'surrogate'"))


_LIF_STEP_BAD = _bad(
    ((_X[0], LIFState(np.zeros(4, np.float32))), {}, ValueError,
     "state.v must have the shape"),
    ((_X[0], (np.zeros(3, np.float32),)), {}, TypeError, "LIFState"),
    ((_X[0], None, (0.9, 1.0, "subtract")), {}, TypeError, "LIFParameters"),
    ((_X[0], None, LIFParameters(beta=2.0)), {}, ValueError, "'beta'"),
    ((_X[0], None, LIFParameters(threshold=0)), {}, ValueError, "'threshold'"),
    ((_X[0], None), dict(inplace=True), ValueError, "state is None"),
    ((_X[0], None), dict(inplace=1), TypeError, "'inplace' must be a bool"),
    ((_X[0], LIFState(np.zeros((3, 2), np.float32)[:, 0])), dict(inplace=True), ValueError,
     "C-contiguous state.v"),
    ((_X[0], None), dict(out=np.empty(4, np.float32)), ValueError, "'out' must have shape"),
    ((_X[0].astype(np.int64),), {}, TypeError, "'x' must be a float32"))

#: spikes and membranes are exact (see _current); the edge sample's
#: subnormals are not halved exactly in float32
_NEURON_TOL = {_spec.F32: (1e-6, 1e-30), _spec.F64: (1e-15, 1e-300)}


def _neuron(name, rule, samples, bad, bench=()):
    # surrogate derivatives are not derivatives of the forward: no Grad
    return _spec.OpSpec(name, FAMILY, ("forward",), backward=_rule(*rule),
                        reference=f"test_neuromorphic:ref_{name}", samples=samples, bad=bad,
                        tol=_NEURON_TOL, bench=bench)


def _backward(name, params, samples):
    # the reference is the chain rule through time of the equations with the
    # spike's derivative replaced by the surrogate (tests/test_neuromorphic.py,
    # which also checks the gradients against finite differences of a
    # smoothed forward); out= receives the input gradient
    return _spec.OpSpec(name, FAMILY, ("backward",), reference=f"test_neuromorphic:ref_{name}",
                        samples=samples, bad=_backward_bad(params), tol=_BACKWARD_TOL,
                        out_result="inputs")


def _backward_samples(model, params, kwargs=None, refractory=True):
    """``samples(dtype)`` of the backward of ``model`` (positional model
    parameters ``params`` after ``inputs``, ``kwargs`` in every call):
    upstream gradients of every output with the reset attached (the main
    call), each reset, each surrogate (straight-through with a refractory
    period, LIF only), per-neuron parameters, one step, no neurons. The
    currents are those of the forward samples (no spike hangs on a
    rounding); upstream gradients are multiples of 1/16."""
    kwargs = dict(kwargs or {})

    def samples(dtype):
        rng = np.random.default_rng(0)

        def x(*shape):
            return _current(rng, shape, dtype)

        def g(*shape):
            return (rng.integers(-16, 17, shape) / 16).astype(dtype)

        state = {"lif": (("v0", "grad_v"),), "synaptic": (("syn0", "grad_syn"), ("v0", "grad_v")),
                 "alif": (("v0", "grad_v"), ("a0", "grad_a"))}[model]
        p, kw = tuple(params), kwargs
        main = dict(kw, grad_trace=g(6, 4, 5), detach_reset=False)
        for s, gs in state:
            main.update({s: x(4, 5), gs: g(4, 5)})
        out = [_spec.Sample((g(6, 4, 5), x(6, 4, 5)) + p, main, "T6x4x5,state,grads,attached"),
               _spec.Sample((g(5, 7), x(5, 7)) + p,
                            dict(kw, threshold=1.0, reset="zero", surrogate=("atan", 2.0),
                                 grad_trace=g(5, 7)), "zero,atan"),
               _spec.Sample((g(4, 3), x(4, 3)) + p,
                            dict(kw, threshold=0.75, reset="none", surrogate=("sigmoid", 3.0),
                                 grad_trace=g(4, 3)), "none,sigmoid"),
               _spec.Sample((g(1, 5), x(1, 5)) + p, dict(kw, surrogate=("triangle", 1.5)),
                            "T1,triangle"),
               _spec.Sample((g(3, 0), x(3, 0)) + p, kw, "no-neurons")]
        if refractory:
            out.append(_spec.Sample((g(6, 9), x(6, 9)) + p,
                                    dict(kw, refractory=2, surrogate="straight_through"),
                                    "refractory,straight_through"))
        if p:
            beta = np.array([0.5, 0.75, 1.0, 0.25], dtype)
            per = p[:-1] + (beta, np.full((3, 1), 0.75, dtype))
            out.append(_spec.Sample((g(5, 3, 4), x(5, 3, 4)) + per, kw, "per-neuron"))
        return out

    return samples


#: the gradients sum products of surrogate derivatives (not exact in float32)
#: over time steps and neurons
_BACKWARD_TOL = {_spec.F32: (2e-5, 1e-5), _spec.F64: (1e-13, 1e-14)}


def _lif_step_samples(dtype):
    """Steps from rest and from a state, each reset, per-neuron parameters
    and a 0-d step (currents as the forward samples'). The main sample
    (the largest) passes no state: nbops.testing's strided check rebuilds a
    tuple argument as ``type(t)(items)``, which a named tuple does not take."""
    rng = np.random.default_rng(0)

    def x(*shape):
        return _current(rng, shape, dtype)

    per = LIFParameters(np.array([0.5, 0.75, 1.0, 0.25], dtype), np.full((3, 1), 0.75, dtype),
                        "zero")
    return [_spec.Sample((x(8, 16), None, LIFParameters(0.75, 1.0, "subtract")), {}, "8x16"),
            _spec.Sample((x(4, 5), LIFState(x(4, 5) * 4), LIFParameters(0.5, 1.0, "subtract")),
                         {}, "state"),
            _spec.Sample((x(7), LIFState(x(7) * 4), LIFParameters(0.75, 0.75, "none")), {},
                         "state,none"),
            _spec.Sample((x(3, 4), LIFState(x(3, 4) * 4), per), {}, "per-neuron,zero"),
            _spec.Sample((x(5), None), dict(spike_dtype=np.dtype(dtype)), "defaults"),
            _spec.Sample((np.asarray(x()), LIFState(np.asarray(x() * 4)), LIFParameters(0.5)),
                         {}, "0-d")]


_LIF_BENCH = _spec.Bench(
    "nbops.bench.neuromorphic:lif_numpy", "lif", "nbops.bench.neuromorphic:setup",
    kwargs=dict(beta=0.5, threshold=1.0), reference="nbops.bench.neuromorphic:lif_reference",
    options=dict(tol=(0.0, 0.0)))

SPECS = {s.name: s for s in (
    _neuron("lif", ("lif", ("inputs", "beta", "threshold", "reset", "v0")),
            _neuron_samples("lif", (0.75,)), _with({"beta": 0.9}, *_BETA_BAD),
            bench=(_LIF_BENCH,)),
    _neuron("if_neuron", ("if", ("inputs", "threshold", "reset", "v0")),
            _neuron_samples("lif", ()), _with({})),
    _neuron("synaptic", ("synaptic", ("inputs", "alpha", "beta", "threshold", "reset", "syn0",
                                      "v0")),
            _neuron_samples("synaptic", (0.5, 0.75), refractory=False),
            _with({"alpha": 0.5, "beta": 0.9},
                  ((_X, 1.5, 0.9), {}, ValueError, "'alpha'"),
                  ((_X, 0.5, 0.9), dict(syn0=np.zeros((3, 1), np.float32)), ValueError,
                   "'syn0'"),
                  refractory=False, surrogate_alpha=False)),
    _neuron("alif", ("alif", ("inputs", "beta", "threshold", "adapt_decay", "adapt_scale",
                              "reset", "v0", "a0")),
            _neuron_samples("alif", (0.75,), dict(adapt_decay=0.5, adapt_scale=0.25),
                            refractory=False),
            _with({"beta": 0.9},
                  ((_X, 0.9), dict(adapt_decay=2.0), ValueError, "'adapt_decay'"),
                  ((_X, 0.9), dict(adapt_scale=-1.0), ValueError, "'adapt_scale'"),
                  ((_X, 0.9), dict(a0=np.zeros((3, 1), np.float32)), ValueError, "'a0'"),
                  refractory=False)),
    _backward("lif_backward", {"beta": 0.9}, _backward_samples("lif", (0.75,))),
    _backward("if_neuron_backward", {}, _backward_samples("lif", ())),
    _backward("synaptic_backward", {"alpha": 0.5, "beta": 0.9},
              _backward_samples("synaptic", (0.5, 0.75), refractory=False)),
    _backward("alif_backward", {"beta": 0.9},
              _backward_samples("alif", (0.75,), dict(adapt_decay=0.5, adapt_scale=0.25),
                                refractory=False)),
    # spikes and membranes exact as the forward's (the same currents)
    _spec.OpSpec("lif_step", FAMILY, ("forward",), reference="test_neuromorphic:ref_lif_step",
                 samples=_lif_step_samples, bad=_LIF_STEP_BAD, tol=_NEURON_TOL),
)}


# ---------------------------------------------------------------------------
# Models


def _forward_doc(fn):
    return fn


@operator(SPECS["lif"])
def lif(inputs, beta, threshold=1.0, reset="subtract", v0=None, *, refractory=0, trace=False,
        spike_dtype=None, surrogate="fast_sigmoid", slope=None, alpha=None, width=None,
        detach_reset=True, out=None):
    """Leaky integrate-and-fire neurons over a whole sequence.

    Per neuron and time step (the seed article's loop, bit for bit)::

        u = v * beta + x[t]            # decay, then integrate
        s[t] = u > threshold           # fire
        v = u - s[t] * threshold       # reset="subtract" (or 0 for "zero", u for "none")

    With ``refractory=k`` a neuron that fired ignores its input and cannot
    fire for the next ``k`` steps (it still decays). snnTorch's ``Leaky``
    applies the reset one step later and undecayed (see
    :mod:`nbops.neuromorphic.lif`): same spikes for ``beta = 1``.

    Parameters
    ----------
    inputs : float32/float64 array [T, ...], CPU or device
        Input current per time step; axis 0 is time.
    beta : float in [0, 1], or array broadcasting to ``inputs.shape[1:]``
        Membrane decay per step (per neuron if an array).
    threshold : float > 0, or array as ``beta``, default 1.0
    reset : {"subtract", "zero", "none"}
    v0 : array shaped ``inputs.shape[1:]``, optional
        Initial membrane; None starts from rest (0).
    refractory : int >= 0, default 0
    trace : bool
        Also return the membrane before reset at every step, ``[T, ...]``
        (what snnTorch records as ``mem``).
    spike_dtype : None (inputs' dtype), np.uint8 or np.bool_
    surrogate, slope, alpha, width, detach_reset
        Used by the backward pass (autograd): the surrogate derivative by name
        with its parameter as a keyword (``surrogate="atan", alpha=2.0``), and
        whether the reset passes gradient (snnTorch's default: detached).
    out : array [T, ...] of spike_dtype, optional
        Where to write the spikes.

    Returns
    -------
    (spikes, v) or (spikes, v, trace)
        ``spikes`` [T, ...] (0/1), ``v`` the membrane after the last step's
        reset, on the inputs' device.

    Raises
    ------
    TypeError
        non-float inputs, mismatched dtypes or devices, bad ``spike_dtype``,
        a non-int ``refractory``.
    ValueError
        inputs not [T, ...] with T >= 1, beta outside [0, 1], threshold <= 0
        or non-finite, a negative ``refractory``, unknown reset or surrogate,
        a state of the wrong shape.

    Example
    -------
    >>> x = np.full((4, 1), 0.6, np.float32)
    >>> s, v = nbops.neuromorphic.lif(x, beta=0.9)
    >>> s[:, 0]
    array([0., 1., 0., 1.], dtype=float32)
    """
    call = _Call("lif", "lif", inputs, beta, threshold, reset, ("v0", v0), ("r0", None),
                 refractory=refractory, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    spk, v, _, tr = call.forward(trace, spike_dtype, out)
    return (spk, v, tr) if trace else (spk, v)


@operator(SPECS["if_neuron"])
def if_neuron(inputs, threshold=1.0, reset="subtract", v0=None, *, refractory=0, trace=False,
              spike_dtype=None, surrogate="fast_sigmoid", slope=None, alpha=None, width=None,
              detach_reset=True, out=None):
    """Integrate-and-fire neurons (no leak): :func:`lif` with ``beta = 1``.

    ``v = v + x[t]; s[t] = v > threshold; reset``. Arguments, returns and
    errors as :func:`lif` (without ``beta``).

    Example
    -------
    >>> s, v = nbops.neuromorphic.if_neuron(np.full((3, 1), 0.5))
    >>> s[:, 0], v
    (array([0., 0., 1.]), array([0.5]))
    """
    call = _Call("if_neuron", "lif", inputs, 1.0, threshold, reset, ("v0", v0), ("r0", None),
                 refractory=refractory, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    spk, v, _, tr = call.forward(trace, spike_dtype, out)
    return (spk, v, tr) if trace else (spk, v)


@operator(SPECS["synaptic"])
def synaptic(inputs, alpha, beta, threshold=1.0, reset="subtract", syn0=None, v0=None, *,
             trace=False, spike_dtype=None, surrogate="fast_sigmoid", slope=None, width=None,
             detach_reset=True, out=None):
    """Second-order (synaptic-current) LIF neurons, as snnTorch's ``Synaptic``.

    Per step: ``syn = alpha * syn + x[t]; u = beta * v + syn;
    s[t] = u > threshold; v = reset(u)``. ``alpha`` (in [0, 1], number or
    per-neuron array) is the synaptic current's decay; other arguments as
    :func:`lif`. The surrogate's parameter is given as ``slope``/``width``
    or as ``surrogate=("atan", 2.0)`` (``alpha`` is the synaptic decay here).

    Returns ``(spikes, syn, v)`` or ``(spikes, syn, v, trace)``.

    Example
    -------
    >>> s, syn, v = nbops.neuromorphic.synaptic(np.full((5, 2), 0.3), alpha=0.8, beta=0.9)
    """
    call = _Call("synaptic", "synaptic", inputs, beta, threshold, reset, ("v0", v0),
                 ("syn0", syn0), p2=alpha, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, None, width), detach_reset=detach_reset,
                 out=out)
    spk, v, syn, tr = call.forward(trace, spike_dtype, out)
    return (spk, syn, v, tr) if trace else (spk, syn, v)


@operator(SPECS["alif"])
def alif(inputs, beta, threshold=1.0, adapt_decay=0.95, adapt_scale=0.2, reset="subtract",
         v0=None, a0=None, *, trace=False, spike_dtype=None, surrogate="fast_sigmoid",
         slope=None, alpha=None, width=None, detach_reset=True, out=None):
    """Adaptive-threshold LIF neurons (LSNN-style).

    Per step: ``theta = threshold + adapt_scale * a; u = beta * v + x[t];
    s[t] = u > theta; v = reset(u)`` (subtracting ``theta``);
    ``a = adapt_decay * a + s[t]``. ``adapt_decay`` in [0, 1] and
    ``adapt_scale`` >= 0 are numbers or per-neuron arrays; other arguments
    as :func:`lif`. Returns ``(spikes, v, a)`` or ``(spikes, v, a, trace)``.

    Example
    -------
    >>> s, v, a = nbops.neuromorphic.alif(np.full((6, 1), 0.7), beta=0.9)
    """
    call = _Call("alif", "alif", inputs, beta, threshold, reset, ("v0", v0), ("a0", a0),
                 p2=adapt_decay, p3=adapt_scale, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    spk, v, a, tr = call.forward(trace, spike_dtype, out)
    return (spk, v, a, tr) if trace else (spk, v, a)


# ---------------------------------------------------------------------------
# Backward passes


@operator(SPECS["lif_backward"])
def lif_backward(grad_spikes, inputs, beta, threshold=1.0, reset="subtract", v0=None, *,
                 grad_v=None, grad_trace=None, refractory=0, surrogate="fast_sigmoid",
                 slope=None, alpha=None, width=None, detach_reset=True, out=None):
    call = _Call("lif_backward", "lif", inputs, beta, threshold, reset, ("v0", v0),
                 ("r0", None), refractory=refractory, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    gx, gb, gt, gv0, _ = call.backward(grad_spikes, grad_v, None, grad_trace, out)
    return {"inputs": gx, "beta": gb, "threshold": gt, "v0": gv0}


@operator(SPECS["if_neuron_backward"])
def if_neuron_backward(grad_spikes, inputs, threshold=1.0, reset="subtract", v0=None, *,
                       grad_v=None, grad_trace=None, refractory=0, surrogate="fast_sigmoid",
                       slope=None, alpha=None, width=None, detach_reset=True, out=None):
    call = _Call("if_neuron_backward", "lif", inputs, 1.0, threshold, reset, ("v0", v0),
                 ("r0", None), refractory=refractory, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    gx, _, gt, gv0, _ = call.backward(grad_spikes, grad_v, None, grad_trace, out)
    return {"inputs": gx, "threshold": gt, "v0": gv0}


@operator(SPECS["synaptic_backward"])
def synaptic_backward(grad_spikes, inputs, alpha, beta, threshold=1.0, reset="subtract",
                      syn0=None, v0=None, *, grad_syn=None, grad_v=None, grad_trace=None,
                      surrogate="fast_sigmoid", slope=None, width=None, detach_reset=True,
                      out=None):
    call = _Call("synaptic_backward", "synaptic", inputs, beta, threshold, reset, ("v0", v0),
                 ("syn0", syn0), p2=alpha, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, None, width), detach_reset=detach_reset,
                 out=out)
    gx, gb, gt, gv0, gs0 = call.backward(grad_spikes, grad_v, grad_syn, grad_trace, out)
    return {"inputs": gx, "beta": gb, "threshold": gt, "syn0": gs0, "v0": gv0}


@operator(SPECS["alif_backward"])
def alif_backward(grad_spikes, inputs, beta, threshold=1.0, adapt_decay=0.95, adapt_scale=0.2,
                  reset="subtract", v0=None, a0=None, *, grad_v=None, grad_a=None,
                  grad_trace=None, surrogate="fast_sigmoid", slope=None, alpha=None,
                  width=None, detach_reset=True, out=None):
    call = _Call("alif_backward", "alif", inputs, beta, threshold, reset, ("v0", v0),
                 ("a0", a0), p2=adapt_decay, p3=adapt_scale, surrogate=surrogate,
                 sgrad=_surrogate_kw(slope, alpha, width), detach_reset=detach_reset,
                 out=out)
    gx, gb, gt, gv0, ga0 = call.backward(grad_spikes, grad_v, grad_a, grad_trace, out)
    return {"inputs": gx, "beta": gb, "threshold": gt, "v0": gv0, "a0": ga0}


for _fn, _model in ((lif_backward, "lif"), (if_neuron_backward, "if neuron"),
                    (synaptic_backward, "synaptic"), (alif_backward, "alif")):
    _fn.__doc__ = (f"Backward through time of :func:`{_fn.__name__[:-9]}` ({_model} "
                   "neurons) with a surrogate derivative of the spike." + _BACK_DOC
                   + f"""
    Example
    -------
    >>> x = np.random.rand(8, 3)
    >>> g = nbops.neuromorphic.{_fn.__name__}(np.ones((8, 3)), x, """
                   + ("alpha=0.8, beta=0.9)" if _model == "synaptic" else
                      "threshold=1.0)" if _model == "if neuron" else "beta=0.9)")
                   + """
    >>> g["inputs"].shape
    (8, 3)
    """)
del _fn, _model



# ---------------------------------------------------------------------------
# Streaming


@operator(SPECS["lif_step"])
def lif_step(x, state=None, params=LIFParameters(), spike_dtype=None, *, out=None,
             inplace=False):
    """One time step of :func:`lif`, for streaming (edge) inference.

    Parameters
    ----------
    x : float32/float64 array [...], CPU or device
        The input current of one step (no time axis).
    state : LIFState or None
        ``LIFState(v)`` with ``v`` shaped like ``x``; None starts from rest.
    params : LIFParameters
        ``LIFParameters(beta, threshold, reset)``, checked as :func:`lif`
        checks them.
    spike_dtype : None (x's dtype), np.uint8 or np.bool_
    out : array, optional
        Receives the spikes (shape of x, ``spike_dtype``, C-contiguous, on
        x's device).
    inplace : bool
        Write the new membrane into ``state.v`` (C-contiguous, of x's
        dtype) and return ``state`` itself. With ``out`` too a step
        allocates nothing: a loop over a stream reuses the same two buffers.

    Returns
    -------
    (spikes, LIFState)
        Bit-identical to step ``t`` of :func:`lif` over the same inputs.

    Raises
    ------
    TypeError/ValueError as :func:`lif`; ValueError when ``state.v`` does
    not have x's shape (a sequence given as one step shows up here), or
    when ``inplace`` has no state to update or ``state.v`` is not
    C-contiguous.

    Example
    -------
    >>> p = nbops.neuromorphic.LIFParameters(beta=0.9, threshold=1.0, reset="subtract")
    >>> state = None
    >>> for x in np.full((4, 2), 0.6, np.float32):
    ...     s, state = nbops.neuromorphic.lif_step(x, state, p)
    >>> spikes = np.empty(2, np.float32)
    >>> state = nbops.neuromorphic.LIFState(np.zeros(2, np.float32))
    >>> for x in np.full((4, 2), 0.6, np.float32):
    ...     s, state = nbops.neuromorphic.lif_step(x, state, p, out=spikes, inplace=True)
    """
    if not isinstance(params, LIFParameters):
        raise TypeError(f"lif_step: argument 'params' must be a LIFParameters, got "
                        f"{_checks.describe(params)}")
    if state is not None and not isinstance(state, LIFState):
        raise TypeError(f"lif_step: argument 'state' must be a LIFState or None, got "
                        f"{_checks.describe(state)}")
    if not isinstance(inplace, (bool, np.bool_)):
        raise TypeError(f"lif_step: argument 'inplace' must be a bool, got "
                        f"{_checks.describe(inplace)}")
    x = _checks.array("lif_step", "x", x)
    seq = x.reshape((1,) + tuple(x.shape) if x.ndim else (1, 1))
    v0 = None if state is None else state.v
    if v0 is not None and tuple(getattr(v0, "shape", ())) != tuple(x.shape):
        raise ValueError(f"lif_step: state.v must have the shape of x {tuple(x.shape)}, got "
                         f"{tuple(getattr(v0, 'shape', ()))}")
    if inplace:
        if v0 is not None:  # updated in place: a native copy would lose the update
            _checks.array("lif_step", "state.v", v0, written=True)
        if v0 is None:
            raise ValueError("lif_step: inplace=True updates state.v, but state is None; "
                             "pass LIFState(v) with v the initial membrane (zeros from rest)")
        if not _layout.is_c_contiguous(v0):
            raise ValueError(f"lif_step: inplace=True needs a C-contiguous state.v, got "
                             f"strides {tuple(v0.strides)}")
    if v0 is not None:
        v0 = v0.reshape(seq.shape[1:])
    # out= joins the device check: on another device it raises the shared error
    call = _Call("lif_step", "lif", seq, params.beta, params.threshold, params.reset,
                 ("state.v", v0), ("r0", None), out=out)
    seq_out = None
    if out is not None:
        sd = _spike_dtype("lif_step", spike_dtype, call.dtype)
        _checks.output("lif_step", out, x.shape, sd, call.dev,
                       {"x": x, "state.v": state.v if state else None})
        seq_out = out.reshape(seq.shape)        # C-contiguous: a view
    spk, v, _, _ = call.forward(False, spike_dtype, seq_out, call.a0 if inplace else None)
    return (spk.reshape(x.shape) if out is None else out,
            state if inplace else LIFState(v.reshape(x.shape)))
