"""Batch inference over Dask: images/s without Dask, on 1 and 2 worker
processes, Dask's overhead per chunk against chunk size, and the
scheduler's per-task cost (docs/dask.md has the figures and the reading).

    python tools/bench_dask.py [--images 10000] [--rounds 3] [--no-onnx]

Configurations are interleaved round by round (one process, 1 worker, 2
workers, then again) and medians reported, with the load average beside
them: on a shared machine the rounds see the same neighbours.
"""

import argparse
import os
import statistics
import time

import numpy as np


def make_net():
    import nbops

    nn = nbops.nn
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    net.eval()
    return net


def make_session(net):
    """The same network as an ONNX model, run by nbops.onnx."""
    from onnx import TensorProto, helper, numpy_helper

    import nbops.onnx

    p = [np.asarray(t.data) for t in net.parameters()]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(p, ["w1", "b1", "w2", "b2", "w3",
                                                                "b3"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return nbops.onnx.InferenceSession(model.SerializeToString())


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_local(model, images, chunk):
    """One process, no Dask: the same chunks in a loop, nbops on all cores."""
    from nbops.dask import _tasks

    for i in range(0, len(images), chunk):
        _tasks.run_model(model, images[i:i + chunk])


def noop(x):
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--no-onnx", action="store_true")
    args = ap.parse_args()

    import dask.array as da
    import distributed

    import nbops
    import nbops.dask as nd

    cores = len(os.sched_getaffinity(0))
    images = np.random.default_rng(0).standard_normal((args.images, 1, 28, 28)).astype(
        np.float32)
    net = make_net()
    models = {"nn.Module": net}
    if not args.no_onnx:
        models["nbops.onnx"] = make_session(net)
    for m in models.values():  # compile in this process first: workers load the cache
        run_local(m, images[:args.chunk], args.chunk)
    if "nbops.onnx" in models:  # the session is the same network
        from nbops.dask import _tasks

        np.testing.assert_allclose(_tasks.run_model(models["nbops.onnx"], images[:64]),
                                   _tasks.run_model(net, images[:64]), rtol=1e-4, atol=1e-4)

    import logging

    logging.getLogger("distributed").setLevel(logging.ERROR)  # the in-process scheduler

    def cluster(workers, threads):
        return distributed.Client(distributed.LocalCluster(
            n_workers=workers, threads_per_worker=threads, dashboard_address=":0",
            silence_logs=logging.ERROR), set_as_default=False)

    c1, c2, c1x2 = cluster(1, 1), cluster(2, 1), cluster(1, 2)
    print(f"{_cpu()}; nbops threads per task: one process {nbops.get_num_threads()}, "
          f"1 worker x 1 thread {cores}, 2 workers x 1 thread {max(1, cores // 2)}, "
          f"1 worker x 2 threads {max(1, cores // 2)}")

    def on_cluster(client, arr, chunk):
        # the images are loaded on the workers first (as a real pipeline
        # reads them there): timings then exclude sending 31 MB of inputs
        x = client.persist(da.from_array(arr, chunks=(chunk, 1, 28, 28)))
        with client.as_current():
            distributed.wait(x)
        return x

    def dask_run(client, model, chunk):
        y = nd.map_model(model, on_cluster(client, images, chunk))
        return lambda: client.compute(y, sync=True)

    # -- images/s: one process vs 1 and 2 worker processes, interleaved --------
    print(f"\n{args.images} images 1x28x28, chunks of {args.chunk}; medians of "
          f"{args.rounds} interleaved rounds")
    for name, model in models.items():
        runs = {"one process": lambda: run_local(model, images, args.chunk),
                "1 worker": dask_run(c1, model, args.chunk),
                "2 workers": dask_run(c2, model, args.chunk),
                "1 worker x 2 threads": dask_run(c1x2, model, args.chunk)}
        for f in runs.values():  # warm: workers receive the model, first calls
            f()
        times = {k: [] for k in runs}
        for _ in range(args.rounds):
            for k, f in runs.items():
                times[k].append(_timed(f))
        load = os.getloadavg()[0]
        for k, ts in times.items():
            t = statistics.median(ts)
            print(f"  {name:10s} {k:20s} {args.images / t:9.0f} images/s  ({t:.3f} s; "
                  f"load {load:.2f})")

    # -- Dask's overhead per chunk against chunk size (1 worker, paired) --------
    print("\noverhead per chunk, 1 worker vs the same chunks in this process "
          "(nn.Module, inputs on the worker, paired medians)")
    print("  chunk  chunks  local s  dask s  overhead/chunk ms  dask/local")
    for chunk in (10, 50, 200, 1000, 2500):
        n = min(args.images, max(chunk * 8, 2000))
        sub = images[:n]
        y = nd.map_model(net, on_cluster(c1, sub, chunk))
        local, dsk = [], []
        run_local(net, sub, chunk)  # a new batch size may compile a kernel variant
        c1.compute(y, sync=True)
        for _ in range(args.rounds):
            local.append(_timed(lambda: run_local(net, sub, chunk)))
            dsk.append(_timed(lambda: c1.compute(y, sync=True)))
        tl, td = statistics.median(local), statistics.median(dsk)
        k = -(-n // chunk)
        print(f"  {chunk:5d}  {k:6d}  {tl:7.3f}  {td:6.3f}  {1e3 * (td - tl) / k:17.2f}  "
              f"{td / tl:10.2f}   (load {os.getloadavg()[0]:.2f})")

    # -- the scheduler's cost per task ----------------------------------------
    ntasks = 4000
    c2.gather(c2.map(noop, range(100), pure=False))
    ts = [_timed(lambda: c2.gather(c2.map(noop, range(ntasks), pure=False)))
          for _ in range(args.rounds)]
    per_task = statistics.median(ts) / ntasks
    print(f"\nscheduler: {1e6 * per_task:.0f} us per task end to end "
          f"({ntasks} trivial tasks on 2 workers; load {os.getloadavg()[0]:.2f})")
    t_img = statistics.median(times["one process"]) / args.images * nbops.get_num_threads()
    for workers in (100, 1000):
        # a central scheduler handles one task per `per_task`; W workers
        # finishing a chunk every t_chunk ask W / t_chunk tasks per second.
        # Kept to half its capacity (and worker overhead under 10%):
        t_chunk = 2 * workers * per_task
        print(f"  {workers:5d} workers: chunks of >= {t_chunk:.2f} s of work, about "
              f"{t_chunk / t_img:,.0f} images of this net per chunk "
              f"({1e6 * t_img:.0f} us per image per core)")
    for client in (c1, c2, c1x2):
        cl = client.cluster
        client.close()
        cl.close()


def _cpu():
    from nbops._info import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
