"""CPU kernels of the spiking neurons, generated from :mod:`.lif`'s equations.

Memory order (see PERF_NOTES): the neurons are cut into chunks, one ``prange``
iteration per chunk; each chunk runs its whole time loop with the neuron loop
innermost, unit stride, so that the state stays in L1, every input row of
the chunk is read once and every spike row written once, and LLVM vectorizes
the step. ``forward_time_outer`` is the other order (time outermost, a
parallel sweep over all neurons per step), kept for the benchmark that
compares them.

Backward through time recomputes the chunk's forward pass into a
chunk-local membrane buffer (``[T, chunk]``, about 1 MiB; a threshold buffer
too where the threshold varies) and then walks it in reverse: it reads the
inputs and the spike gradients once and writes the input gradients once,
and the forward never has to store a trace for it.

Kernels compile per model (and, for the backward, per reset mode and detach
flag) on first use; the backward kernel takes the surrogate as a runtime
code, so one kernel serves every surrogate. Optional arrays are None and
shared parameters a tuple of scalars, so each call compiles only the
variant it uses.
No contraction flag: ``v * beta + x`` rounds as the seed's NumPy loop does,
so spikes and membranes are bit-identical to it.
"""

import importlib

import numpy as np
from numba import prange
from numba.core import types
from numba.extending import overload, register_jitable

from .._codegen import generated
from .._jit import cpu_kernel
from .._tunables import NEURON_BACKWARD_BUFFER as BACKWARD_BUFFER, NEURON_CHUNK as CHUNK
# the package's ``lif`` attribute is the public function; reach the module by name
_lif = importlib.import_module(".lif", __package__)

_FASTMATH = frozenset({"nsz", "arcp"})


for _f in _lif.functions().values():
    register_jitable(_f)
del _f


def _params(q, i):
    """The parameters ``(beta, threshold, p2, p3)`` of neuron ``i``: from
    ``[4, n]`` rows (per-neuron parameters), or the 4-tuple of scalars
    itself (shared ones, kept in registers: rows of a shared value cost the
    sweep four L2 streams)."""
    return q if isinstance(q, tuple) else (q[0, i], q[1, i], q[2, i], q[3, i])


@overload(_params, jit_options={"cache": False})
def _params_typed(q, i):
    if isinstance(q, types.BaseTuple):
        return lambda q, i: q
    return lambda q, i: (q[0, i], q[1, i], q[2, i], q[3, i])


def _chunk_params(prm, j0, n):
    """The parameters of neurons ``j0 .. j0 + n`` in the form :func:`_params`
    takes: the tuple of shared scalars itself, or the chunk's ``[4, n]``
    rows copied out of the ``[4, M]`` per-neuron array."""


@overload(_chunk_params, jit_options={"cache": False})
def _chunk_params_typed(prm, j0, n):
    if isinstance(prm, types.BaseTuple):
        return lambda prm, j0, n: prm
    return lambda prm, j0, n: _rows(prm, j0, n)


def _param_arg(p):
    # shared parameters ([4, 1]) travel as a tuple of four scalars, per-neuron
    # ones as the array: two argument types, so a kernel compiles the form a
    # call uses, not both
    return tuple(p[:, 0]) if p.shape[1] == 1 else p


def _named(fn, name, **options):
    # a unique qualname gives each generated kernel its own on-disk cache entry
    fn.__name__ = fn.__qualname__ = name
    return cpu_kernel(fn, parallel=True, fastmath=_FASTMATH, **options)


def _jitable(fn, name):
    # Helpers generated per model need their own names too: Numba's symbol
    # names come from the qualname, and two cached kernels whose helpers
    # shared a symbol (lif's and alif's "sweep", say) were linked against
    # whichever was loaded first, so alif loaded after lif ran lif's loop
    fn.__name__ = fn.__qualname__ = name
    return register_jitable(fn)


def _rows(prm, j0, n):
    # the chunk's per-neuron parameters ([4, M]) as contiguous [4, n] rows
    pb = np.empty((4, n), prm.dtype)
    for k in range(4):
        for i in range(n):
            pb[k, i] = prm[k, j0 + i]
    return pb


_rows = register_jitable(_rows)


def _forward_kernels(model):
    step = _lif.MODELS[model][0]

    def sweep(x, j0, n, sa, sb, q, c, spk, trace):
        # the chunk's time loop, neurons innermost (unit stride). Everything
        # optional is None-or-array (pruned at compile time): a scratch
        # store in this loop kept LLVM from vectorizing it (measured 2-3x).
        # sb is None for a LIF without refractory period (its second state
        # stays 0); q is rows or a tuple of scalars (see _params).
        # Rows are sliced first: an index ``j0 + i`` is signed, gets a
        # negative-wraparound select, and LLVM then loads it with gathers
        for t in range(x.shape[0]):
            xr = x[t, j0:j0 + n]
            sr = spk[t, j0:j0 + n]
            tr = trace[t, j0:j0 + n] if trace is not None else None
            for i in range(n):
                s, u, th, a2, b2 = step(xr[i], sa[i], sb[i] if sb is not None else c.zero,
                                        _params(q, i), c)
                sr[i] = s
                sa[i] = a2
                if sb is not None:
                    sb[i] = b2
                if trace is not None:
                    tr[i] = u

    sweep = _jitable(sweep, f"{model}_sweep")

    def chunk_body(x, a0, b0, prm, c, j0, j1, spk, a_out, b_out, trace):
        # b0/b_out None: a LIF without refractory period, no second state;
        # trace None: not kept; prm a tuple (shared) or [4, M] rows. Each is
        # its own argument type, so a kernel compiles the variant a call
        # uses (all of them in one body cost every call's first use 4-8x
        # the compile time)
        n = j1 - j0
        sa = a0[j0:j1].copy()
        if b0 is not None:
            sb = b0[j0:j1].copy()
            sweep(x, j0, n, sa, sb, _chunk_params(prm, j0, n), c, spk, trace)
            b_out[j0:j1] = sb
        else:
            sweep(x, j0, n, sa, None, _chunk_params(prm, j0, n), c, spk, trace)
        a_out[j0:j1] = sa

    # a plain (register_jitable) function, not a dispatcher: a dispatcher in
    # a kernel's closure changes the on-disk cache key in every process
    body = _jitable(chunk_body, f"{model}_forward_chunk")

    def chunked(x, a0, b0, prm, c, chunk, spk, a_out, b_out, trace):
        m = x.shape[1]
        for k in prange((m + chunk - 1) // chunk):
            body(x, a0, b0, prm, c, k * chunk, min(k * chunk + chunk, m), spk, a_out, b_out,
                 trace)

    def time_outer(x, a0, b0, prm, c, spk, a_out, b_out, trace):
        # prm always [4, 1] or [4, M] rows here, b0/b_out arrays
        n_t, m = x.shape
        for j in prange(m):
            a_out[j] = a0[j]
            b_out[j] = b0[j]
        for t in range(n_t):
            for j in prange(m):
                # (a prange index may be unsigned: keep the select in int64)
                q = np.int64(j) if prm.shape[1] > 1 else np.int64(0)
                s, u, th, a2, b2 = step(x[t, j], a_out[j], b_out[j],
                                        (prm[0, q], prm[1, q], prm[2, q], prm[3, q]), c)
                spk[t, j] = s
                a_out[j] = a2
                b_out[j] = b2
                if trace is not None:
                    trace[t, j] = u

    return (_named(chunked, f"{model}_forward"), _named(time_outer, f"{model}_forward_t"))


def _surrogate_rows_source():
    # d s / d z of every surrogate over a row, behind one runtime code (its
    # index in SURROGATES): one backward kernel per model serves them all
    # (five kernels per model cost five times the compile time, about 8 s
    # each), and the switch sits outside the loops, so each loop is one
    # formula that LLVM vectorizes (a switch inside kept the adjoint loop
    # scalar: 7 ns per element, 11% of copy bandwidth)
    lines = ["def surrogate_rows(code, u, th, q, n, k, c, out):"]
    for i, (fn, _, _) in enumerate(_lif.SURROGATES.values()):
        lines += [f"    {'if' if i == 0 else 'elif'} code == {i}:",
                  "        for i in range(n):",
                  f"            out[i] = {fn.__name__}(u[i] - _theta(th, q, i), k, c)"]
    lines += ["    else:", "        out[:n] = c.zero"]
    return "\n".join(lines) + "\n"


@register_jitable
def _theta(row, q, i):
    # neuron i's threshold at a step: from the step's row where it varies
    # (ALIF, a refractory LIF), else the parameter itself
    return row[i] if row is not None else _params(q, i)[1]


_surrogate_rows = register_jitable(generated(
    _surrogate_rows_source(), "surrogate_rows",
    dict({fn.__name__: fn for fn, _, _ in _lif.SURROGATES.values()}, _theta=_theta), __name__))
_SURROGATE_CODES = {name: i for i, name in enumerate(_lif.SURROGATES)}


def _equations(reset, detach):
    """Copies of the neuron equations in which the reset mode and the detach
    flag are compile-time constants, under names of their own (cached
    kernels must not share helper symbols, see ``_jitable``)."""
    tag = f"r{reset}d{int(detach)}"
    return _lif.compiled_copies(
        register_jitable, "_" + tag,
        _reset_mode=register_jitable(inline="always")(_constant(reset, f"reset_{tag}")),
        _detached=register_jitable(inline="always")(_constant(bool(detach), f"detach_{tag}")))


def _constant(value, name):
    def constant(c):
        return value

    constant.__name__ = constant.__qualname__ = name
    return constant


def _backward_kernel(model, reset, detach, keep_b):
    """BPTT kernel of ``model`` for one reset mode and detach flag.

    ``keep_b``: the model has a second state (synaptic current, adaptation,
    refractory count). A LIF without refractory period has none, and then
    every step's threshold is the parameter: the recompute keeps neither
    that state nor a threshold row, and its step is the forward's branch-free
    one (a live refractory branch made the load of ``x`` conditional, and
    the recompute loop ran scalar).
    """
    # a LIF's second state (the refractory count) takes no gradient: its
    # adjoint row is not carried (one load and one store stream less)
    carry_b = model != "lif"
    theta_rows = model == "alif" or (model == "lif" and keep_b)
    eq = _equations(reset, detach)
    step = eq[_lif.MODELS[model][0].__name__]
    adj = eq[_lif.MODELS[model][1].__name__]
    surrogate_rows = _surrogate_rows
    reset_fn = eq["_reset"]
    model = f"{model}_r{reset}d{int(detach)}{'b' if keep_b else ''}"

    def recompute(x, j0, n, sa, sb, q, c, uu, tt):
        # the chunk's forward again, keeping the membrane (and where it
        # varies the threshold) as rows of 1-D views indexed by the loop
        # counter: a 2-D index with a signed row number is tested for
        # wraparound per element, and those tests kept these loops scalar
        for t in range(x.shape[0]):
            xr = x[t, j0:j0 + n]
            ur = uu[t]
            tr = tt[t] if tt is not None else None
            for i in range(n):
                s, u, th, a2, b2 = step(xr[i], sa[i], sb[i] if sb is not None else c.zero,
                                        _params(q, i), c)
                ur[i] = u
                if tt is not None:
                    tr[i] = th
                sa[i] = a2
                if sb is not None:
                    sb[i] = b2

    def reverse(j0, n, a0, q, c, code, sp, uu, tt, gs, gtrace, ga, gb, gx, acc_b, acc_t):
        # ga/gb carry the gradients of the state from the last step back
        n_t = uu.shape[0]
        a0r = a0[j0:j0 + n]
        sgr = np.empty(n, uu.dtype)
        for k in range(n_t):
            t = n_t - 1 - k
            ur = uu[t]
            tr = tt[t] if tt is not None else None
            surrogate_rows(code, ur, tr, q, n, sp, c, sgr)
            gsr = gs[t, j0:j0 + n]
            gxr = gx[t, j0:j0 + n]
            gtr = gtrace[t, j0:j0 + n] if gtrace is not None else None
            if t > 0:
                adjoint_row(n, q, c, ur, tr, uu[t - 1], tt[t - 1] if tt is not None else None,
                            a0r, sgr, gsr, gtr, gxr, ga, gb, acc_b, acc_t)
            else:
                adjoint_row(n, q, c, ur, tr, None, None, a0r, sgr, gsr, gtr, gxr, ga, gb,
                            acc_b, acc_t)

    def adjoint_row(n, q, c, ur, tr, prev, tprev, v0, sgr, gsr, gtr, gxr, ga, gb, acc_b,
                    acc_t):
        # one step back over the chunk's neurons. The membrane before the
        # step is the reset of the previous step's row ``prev``, recomputed
        # here, or ``v0`` at the first step (prev None: a loop of its own,
        # not a branch per element, which LLVM left in the vectorized loop)
        for i in range(n):
            u = ur[i]
            th = _theta(tr, q, i)
            if prev is None:
                vprev = v0[i]
            else:
                thp = _theta(tprev, q, i)
                vprev = reset_fn(prev[i], prev[i] > thp, thp, c)
            gu_ext = gtr[i] if gtr is not None else c.zero
            g, ga2, gb2, db, dth = adj(gsr[i], gu_ext, u, th, vprev, u > th, sgr[i], ga[i],
                                       gb[i] if carry_b else c.zero, _params(q, i), c)
            gxr[i] = g
            ga[i] = ga2
            if carry_b:
                gb[i] = gb2
            acc_b[i] += db
            acc_t[i] += dth

    adjoint_row = _jitable(adjoint_row, f"{model}_adjoint_row")
    recompute = _jitable(recompute, f"{model}_recompute")
    reverse = _jitable(reverse, f"{model}_reverse")

    def run(x, a0, b0, q, c, code, sp, j0, n, gs, gtrace, ga_t, gb_t, gx, ga0, gb0, gbeta,
            gthr):
        n_t = x.shape[0]
        uu = np.empty((n_t, n), x.dtype)
        tt = np.empty((n_t, n), x.dtype) if theta_rows else None
        sa = a0[j0:j0 + n].copy()
        sb = b0[j0:j0 + n].copy() if keep_b else None
        recompute(x, j0, n, sa, sb, q, c, uu, tt)
        ga = ga_t[j0:j0 + n].copy()
        gb = gb_t[j0:j0 + n].copy()
        acc_b = np.zeros(n, x.dtype)
        acc_t = np.zeros(n, x.dtype)
        reverse(j0, n, a0, q, c, code, sp, uu, tt, gs, gtrace, ga, gb, gx, acc_b, acc_t)
        ga0[j0:j0 + n] = ga
        if carry_b or n_t == 0:
            gb0[j0:j0 + n] = gb
        else:
            gb0[j0:j0 + n] = 0  # what every step's adjoint gives the LIF's second state
        gbeta[j0:j0 + n] = acc_b
        gthr[j0:j0 + n] = acc_t

    run = _jitable(run, f"{model}_backward_run")

    def chunk_body(x, a0, b0, prm, c, code, sp, j0, n, gs, gtrace, ga_t, gb_t, gx, ga0, gb0,
                   gbeta, gthr):
        # prm a tuple (shared) or [4, M] rows, gtrace None or [T, M]: each
        # variant compiles when a call first uses it (see the forward's)
        run(x, a0, b0, _chunk_params(prm, j0, n), c, code, sp, j0, n, gs, gtrace, ga_t, gb_t,
            gx, ga0, gb0, gbeta, gthr)

    body = _jitable(chunk_body, f"{model}_backward_chunk")

    def bwd(x, a0, b0, prm, c, code, sp, chunk, gs, gtrace, ga_t, gb_t, gx, ga0, gb0, gbeta,
            gthr):
        m = x.shape[1]
        for k in prange((m + chunk - 1) // chunk):
            body(x, a0, b0, prm, c, code, sp, k * chunk, min(chunk, m - k * chunk), gs, gtrace,
                 ga_t, gb_t, gx, ga0, gb0, gbeta, gthr)

    # the adjoint loop writes per-neuron rows (ga, acc_b, acc_t) while it
    # reads rows t of the [T, chunk] buffers: LLVM's alias checks hoisted
    # out of the time loop always failed there, and the loop ran scalar
    # (see nbops._jit; 1.45x faster without the hoisting)
    return _named(bwd, f"{model}_backward", hoist_checks=False), 1 + theta_rows


_FORWARD = {}
_BACKWARD = {}


def _forward_for(model):
    if model not in _FORWARD:
        _FORWARD[model] = _forward_kernels(model)
    return _FORWARD[model]


def forward(model, x, a0, b0, p, c, spk, a_out, b_out, trace, time_outer=False):
    """Run ``model`` over ``x[T, M]`` from state ``a0[M]``, ``b0[M]`` (b0 None:
    the model's second state starts at 0 and is not kept).

    Writes spikes ``spk[T, M]`` (float, uint8 or bool), the final state
    ``a_out[M]`` and ``b_out[M]`` (unless None), and the pre-reset membrane
    ``trace[T, M]`` unless it is None. ``p`` is a ``[4, 1]`` (shared) or
    ``[4, M]`` (per-neuron) array of the parameters ``(beta, threshold, p2,
    p3)``. ``time_outer`` picks the other loop order (benchmarks only).
    Absent arrays are None, and shared parameters a tuple: each combination
    compiles the variant of the kernel it needs on first use.
    """
    n_t, m = x.shape
    if m == 0:
        return
    if time_outer:
        if b_out is None:
            b0 = b_out = np.zeros(m, x.dtype)
        _forward_for(model)[1](x, a0, b0, p, c, spk, a_out, b_out, trace)
        return
    if b_out is None:
        b0 = None
    _forward_for(model)[0](x, a0, b0, _param_arg(p), c, _chunk(m), spk, a_out, b_out, trace)


def backward(model, surrogate, x, a0, b0, p, c, sp, gs, gtrace, ga_t, gb_t,
             gx, ga0, gb0, gbeta, gthr):
    """BPTT of ``model`` with surrogate ``surrogate`` (parameter ``sp``).

    Inputs as :func:`forward` (here ``b0`` is an array) plus the gradients
    of the spikes ``gs[T, M]``, of the trace ``gtrace[T, M]`` (or None) and
    of the final state ``ga_t``/``gb_t`` ``[M]``. Writes ``gx[T, M]``, the
    gradients of the initial state ``ga0``/``gb0`` and per-neuron parameter
    gradients ``gbeta``, ``gthr`` (all ``[M]``).
    """
    n_t, m = x.shape
    if m == 0:
        return
    keep_b = _lif.keeps_second_state(model, c.refr)
    key = (model, int(c.reset), bool(c.detach), keep_b)
    if key not in _BACKWARD:
        _BACKWARD[key] = _backward_kernel(*key)
    kernel, rows = _BACKWARD[key]
    # the chunk-local [T, chunk] buffers (membrane, threshold) stay near L2
    per_neuron = rows * max(n_t, 1) * x.itemsize
    chunk = max(16, min(CHUNK, BACKWARD_BUFFER // per_neuron // 16 * 16))
    kernel(x, a0, b0, _param_arg(p), c, _SURROGATE_CODES[surrogate], sp, _chunk(m, chunk), gs,
           gtrace, ga_t, gb_t, gx, ga0, gb0, gbeta, gthr)


def _chunk(m, chunk=CHUNK):
    # one chunk per thread where the neurons allow: longer runs per row beat
    # the finer load balance of several chunks per thread (see CHUNK)
    from numba import get_num_threads

    per = -(-m // get_num_threads())
    return max(min(chunk, (per + 15) // 16 * 16), 16)


# ---------------------------------------------------------------------------
# Encoders and decoders: the same chunked order (time loop inside a chunk,
# neurons innermost), so each output row of a chunk is written once.

_uniform = _lif.uniform
_rate_p = _lif.rate_probability
_latency_t = _lif.latency_time


def _per_neuron_encoder(name, prepare, emit):
    """A kernel that computes one value per neuron (a probability, a spike
    step) into a chunk buffer, then writes every step's spikes from it."""

    def kernel(x, key, a, b, flag, chunk, out):
        n_t, m = out.shape
        for k in prange((m + chunk - 1) // chunk):
            j0 = k * chunk
            j1 = min(j0 + chunk, m)
            v = np.empty(j1 - j0, np.float64)
            for j in range(j0, j1):
                v[j - j0] = prepare(x[j], n_t, a, b, flag)
            for t in range(n_t):
                for j in range(j0, j1):
                    out[t, j] = emit(v[j - j0], t, key, t * m + j)

    return _named(kernel, name)


def _rate_prepare(x, n_t, gain, unused, poisson):
    return _rate_p(x, gain, poisson)


def _rate_emit(p, t, key, index):
    return _uniform(key, index) < p


def _latency_prepare(x, n_t, tau, threshold, linear):
    return np.float64(_latency_t(x, n_t, tau, threshold, linear))


def _latency_emit(step, t, key, index):
    return step == t


for _f in (_rate_prepare, _rate_emit, _latency_prepare, _latency_emit):
    register_jitable(_f)
del _f
_rate = _per_neuron_encoder("rate_encode", _rate_prepare, _rate_emit)
_latency = _per_neuron_encoder("latency_encode", _latency_prepare, _latency_emit)


def rate(x, key, gain, poisson, out):
    """Bernoulli spikes ``out[T, M]`` with probability from ``x[M]``."""
    if out.size:
        _rate(x, key, gain, 0.0, poisson, _chunk(out.shape[1]), out)


def latency(x, tau, threshold, linear, out):
    """One spike per neuron at the step :func:`.lif.latency_time` gives."""
    if out.size:
        # latency draws nothing: a zero key keeps the shared kernel's signature
        _latency(x, np.uint64(0), tau, threshold, linear, _chunk(out.shape[1]), out)


@cpu_kernel(parallel=True, fastmath=_FASTMATH)
def _delta(x, threshold, zero, padding, off, chunk, out):
    n_t, m = x.shape
    for k in prange((m + chunk - 1) // chunk):
        j0 = k * chunk
        j1 = min(j0 + chunk, m)
        for t in range(n_t):
            for j in range(j0, j1):
                prev = x[t - 1, j] if t > 0 else (x[0, j] if padding else zero)
                d = x[t, j] - prev
                out[t, j] = 1 if d >= threshold else (-1 if (off and d <= -threshold) else 0)


def delta(x, threshold, padding, off_spike, out):
    """Delta modulation of ``x[T, M]`` into ``out[T, M]`` (+1/-1/0)."""
    if out.size:
        t = x.dtype.type
        _delta(x, t(threshold), t(0), padding, off_spike, _chunk(x.shape[1]), out)


def _decoder(name, init, update):
    """A kernel reducing ``spikes[T, M]`` over time into ``out[M]``:
    ``out = init(T)``, then ``out = update(out, t, spikes[t], T)`` step by step."""

    def kernel(spikes, chunk, out):
        n_t, m = spikes.shape
        for k in prange((m + chunk - 1) // chunk):
            j0 = k * chunk
            j1 = min(j0 + chunk, m)
            for j in range(j0, j1):
                out[j] = init(n_t)
            for t in range(n_t):
                for j in range(j0, j1):
                    out[j] = update(out[j], t, spikes[t, j], n_t)

    return _named(kernel, name)


def _zero(n_t):
    return 0


def _add(acc, t, s, n_t):
    return acc + s


def _never(n_t):
    return n_t


def _first_step(acc, t, s, n_t):
    return t if (s != 0 and acc == n_t) else acc


for _f in (_zero, _add, _never, _first_step):
    register_jitable(_f)
del _f
_count = _decoder("spike_count", _zero, _add)
_first = _decoder("first_spike", _never, _first_step)


def spike_count(spikes, out):
    """``out[M]`` = number of spikes of each neuron over ``spikes[T, M]``."""
    if out.size:
        _count(spikes, _chunk(spikes.shape[1]), out)


def first_spike_time(spikes, out):
    """``out[M]`` = first step with a spike, ``T`` where none."""
    if out.size:
        _first(spikes, _chunk(spikes.shape[1]), out)
