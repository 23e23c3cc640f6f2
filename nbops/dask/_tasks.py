"""What runs inside a Dask task: the thread arrangement, then the nbops call.

Kept apart from :mod:`nbops.dask` so that a worker unpickles a task by
reference to this small module (and nbops), never to the graph-building code.
"""

import os
import threading

import numpy as np

# Set on a worker by NbopsWorkerPlugin: threads per task chosen by the user.
_PINNED = None
_LAYER = None


def _threading_layer():
    """Numba's threading layer, started if it was not yet (the layer is only
    known once the pool is up)."""
    global _LAYER
    if _LAYER is None:
        import numba
        from numba.np.ufunc import parallel

        parallel._launch_threads()
        _LAYER = numba.threading_layer()
    return _LAYER


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_task(dask_threads):
    """nbops threads for one task when ``dask_threads`` tasks run at once in
    this process: the process's cores shared out, at least one, and never
    more than Numba's pool holds."""
    import numba

    if _PINNED is not None:
        n = _PINNED
    else:
        n = max(1, _cores() // max(1, dask_threads))
    return min(n, numba.config.NUMBA_NUM_THREADS)


def check_layer(dask_threads, where):
    """Numba's workqueue layer aborts the process when two threads enter a
    parallel kernel at once (numba#9288): refuse it with several Dask
    threads instead of letting a worker die."""
    if dask_threads > 1 and _threading_layer() == "workqueue":
        raise RuntimeError(
            f"nbops.dask: {where} runs {dask_threads} Dask threads but Numba's threading "
            "layer is 'workqueue', which aborts on concurrent parallel calls; install tbb "
            "or use OpenMP (NUMBA_THREADING_LAYER=omp), or run one thread per worker "
            "process (LocalCluster(threads_per_worker=1) / dask worker --nthreads 1)")


_HOST_THREADS = {}


def _host_threads(worker):
    """Dask threads of every worker on this worker's host (LocalCluster runs
    several worker processes on one machine: they share its cores). Asked of
    the scheduler once per process; this worker's own threads if that
    fails."""
    if worker.address not in _HOST_THREADS:
        n = worker.state.nthreads
        try:
            from distributed import get_client

            info = get_client().scheduler_info(n_workers=-1)["workers"]
            host = info[worker.address]["host"]
            n = sum(w["nthreads"] for w in info.values() if w["host"] == host)
        except Exception:  # noqa: BLE001  (an older scheduler, a lost connection)
            pass
        _HOST_THREADS[worker.address] = max(n, worker.state.nthreads)
    return _HOST_THREADS[worker.address]


def _dask_threads():
    """``(Dask threads sharing this machine's cores, where)``, or None in
    the main thread outside a worker (synchronous scheduler: nbops keeps its
    setting)."""
    try:
        from distributed import get_worker

        w = get_worker()
    except (ImportError, ValueError):
        w = None
    if w is not None:
        check_layer(w.state.nthreads, f"worker {w.address}")
        return _host_threads(w), None
    if threading.current_thread() is threading.main_thread():
        return None
    import dask

    pool = dask.config.get("num_workers", None) or _cores()
    return pool, "the threaded scheduler"


def configure():
    """Give this task its share of the cores. Numba's thread count is
    per Python thread, so it is set in every task (a few microseconds)."""
    found = _dask_threads()
    if found is None:
        return
    n, where = found
    if where is not None:
        check_layer(n, where)
    import numba

    numba.set_num_threads(threads_per_task(n))


def call(fn, *args):
    """The task of every blockwise op: ``fn(*blocks_and_constants)``."""
    configure()
    return fn(*args)


def _join(blocks, axis):
    """Blocks of a contracted axis, as Dask hands them (a list), in one."""
    if not isinstance(blocks, list):
        return blocks
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis)


def contract(fn, b_axis, a, b, bias):
    """A blockwise contraction: ``fn(a, b, bias)`` with a's K blocks (and
    b's, along ``b_axis``) joined, so one nbops kernel sums all of K."""
    configure()
    return fn(_join(a, -1), b if b_axis is None else _join(b, b_axis), bias)


def quantized(fn, scale, zero_point, block, *args):
    """A quantized op on one block of integer values with the tensor's
    fixed ``(scale, zero_point)``; a QTensor result is returned as its
    integer values (the caller knows its scale)."""
    from ..quant import QTensor

    configure()
    r = fn(QTensor(block, scale, zero_point), *args)
    return r.int_repr() if isinstance(r, QTensor) else r


def spiking_chunk(fn, block, states, kwargs):
    """One time chunk of one neuron block: the model from ``states`` (None:
    rest), returning ``(spikes, *final_states[, trace])`` as the model does."""
    configure()
    kwargs = dict(kwargs)  # the graph may hand every task the same dict
    names = kwargs.pop("_state_names")
    given = {} if states is None else dict(zip(names, states))
    return tuple(fn(block, **kwargs, **given))


def run_model(model, block):
    """An nn.Module or an ONNX session (duck-typed: ``run`` and
    ``get_inputs``) on one batch chunk."""
    configure()
    if hasattr(model, "run") and hasattr(model, "get_inputs"):
        name = model.get_inputs()[0].name
        return np.asarray(model.run(None, {name: block})[0])
    from ..autograd import Tensor, no_grad

    with no_grad():  # inference: no tape, and a module's parameters give Tensors
        out = model(block)
    return out.data if isinstance(out, Tensor) else out
