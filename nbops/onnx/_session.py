"""``InferenceSession``: onnxruntime's surface on nbops kernels.

Loading (once per session): the model is parsed (a path, bytes or a
``ModelProto``), checked with ``onnx.checker``, its shapes inferred, every
node's handler looked up (an unsupported operator, attribute or dtype is an
:class:`UnsupportedModelError` here, naming the node), and the planner's
passes run (:mod:`nbops.onnx._planner`): folding, batch-norm folding,
fusion into nbops' fused kernels, subgraph recognition, weight packing.

Running: each input-shape set gets its own :class:`~nbops.onnx._planner.Plan`
(Shape nodes of known shapes folded, so Reshape targets become constants),
made on first use and cached. Feeds are checked against the declared inputs
(names, dtypes, ranks, fixed dims) before any kernel runs; intermediate
buffers are dropped right after their last reader, and the peak of the
bytes held by intermediates is recorded (:attr:`InferenceSession.last_run`).
"""

import time

import numpy as np

from . import _planner
from ._registry import UnsupportedModelError

__all__ = ["InferenceSession", "ModelMeta", "PlanReport"]


class ModelMeta:
    """onnxruntime's ``ModelMetadata``: producer_name, graph_name, domain,
    description, graph_description, version, custom_metadata_map."""

    def __init__(self, model):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = int(model.model_version)
        self.custom_metadata_map = {p.key: p.value for p in model.metadata_props}

    def __repr__(self):
        return (f"ModelMeta(producer_name={self.producer_name!r}, graph_name="
                f"{self.graph_name!r}, version={self.version})")


class PlanReport:
    """What ``print(session.plan)`` shows: node counts before and after
    planning, each rewrite applied, and the nodes that run."""

    def __init__(self, before, graph, log):
        self.nodes_before = before
        self.nodes_after = len(graph.nodes)
        self.rewrites = list(log)
        self.nodes = list(graph.nodes)

    def fusions(self):
        """The rewrite lines, ``(pass, line)``."""
        return list(self.rewrites)

    def __str__(self):
        lines = [f"nbops.onnx plan: {self.nodes_before} nodes -> {self.nodes_after} nodes"]
        counts = {}
        for name, _ in self.rewrites:
            counts[name] = counts.get(name, 0) + 1
        if counts:
            lines.append("rewrites: " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
        lines += [f"  [{name}] {line}" for name, line in self.rewrites]
        lines.append("steps:")
        lines += [f"  {n!r}" for n in self.nodes]
        return "\n".join(lines)

    __repr__ = __str__


def _load_model(model):
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "the given bytes"
    else:
        path = str(model)
        with open(path, "rb") as f:  # FileNotFoundError names the path
            data = f.read()
        where = repr(path)
    if not data:
        raise ValueError(f"nbops.onnx: {where} is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and kin)
        raise ValueError(f"nbops.onnx: cannot parse {where} as an ONNX model "
                         f"(malformed or truncated file): {exc}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ValueError(f"nbops.onnx: {where} holds no graph (malformed or truncated "
                         f"file, or not an ONNX model)")
    if not isinstance(model, (bytes, bytearray, memoryview)):
        import os

        base = os.path.dirname(os.path.abspath(str(model)))
        try:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(proto, base)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"nbops.onnx: {where}: cannot load its external data: "
                             f"{exc}") from None
    return proto


def _check(model):
    import onnx

    known = {"", "ai.onnx", "ai.onnx.ml"}
    for imp in model.opset_import:
        if imp.domain not in known:
            from ._registry import supported_ops

            if not any(d == imp.domain for d, _ in supported_ops()):
                used = [n for n in model.graph.node if n.domain == imp.domain]
                if used:
                    n = used[0]
                    raise UnsupportedModelError(
                        f"nbops.onnx: node {n.name or n.op_type!r} op {n.op_type} is in "
                        f"opset domain {imp.domain!r} (version {imp.version}), which "
                        f"nbops.onnx does not know")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ValueError(f"nbops.onnx: the model is not valid ONNX: {exc}") from None
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (inference is best effort; types come from here)
        return model


class InferenceSession:
    """Runs an ONNX model on nbops kernels, with onnxruntime's surface.

    Parameters
    ----------
    model : str or path, bytes, or onnx.ModelProto
    threads : int, optional
        Numba threads for this session's runs (set around each run).
    device : "cpu" or "cuda"
        "cuda": weights are moved to the GPU once, inputs on each run, and
        kernels run on device arrays (outputs returned as NumPy arrays).

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A malformed or truncated file, a model the checker rejects, a bad
        ``device`` or ``threads``.
    UnsupportedModelError (a ValueError)
        An operator, attribute, dtype or opset domain nbops.onnx does not
        run, naming the node, its op type and opset.

    Example
    -------
    >>> sess = nbops.onnx.InferenceSession("model.onnx")  # doctest: +SKIP
    >>> name = sess.get_inputs()[0].name                   # doctest: +SKIP
    >>> (y,) = sess.run(None, {name: x})                   # doctest: +SKIP
    """

    def __init__(self, model, threads=None, device="cpu", **_ort_options):
        t0 = time.perf_counter()
        if device not in ("cpu", "cuda"):
            raise ValueError(f"InferenceSession: device must be 'cpu' or 'cuda', got "
                             f"{device!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"InferenceSession: threads must be an int >= 1, got "
                             f"{threads!r}")
        self._device = device
        # validated here: runs set it without nbops.set_num_threads's checks
        self._threads = None if threads is None else min(threads, _max_threads())
        proto = _load_model(model)
        self._model = _check(proto)
        self._meta = ModelMeta(proto)
        graph = _planner.parse(self._model)
        before = len(graph.nodes)
        log = _planner.optimize(graph)
        self._prepare_cache = {}
        for n in graph.nodes:
            _planner.prepare_node(n, graph, self._prepare_cache)
        self._graph = graph
        self._report = PlanReport(before, graph, log)
        self._inputs = graph.inputs
        self._outputs = graph.outputs
        self._plans = {}
        self._device_consts = None
        self.last_run = None
        self.load_seconds = time.perf_counter() - t0

    # -- onnxruntime's surface ---------------------------------------------

    def get_inputs(self):
        """The runtime inputs (initializers excluded): ``name``, ``shape``,
        ``type``."""
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_modelmeta(self):
        return self._meta

    def get_providers(self):
        return ["NbopsCUDA" if self._device == "cuda" else "NbopsCPU"]

    @property
    def plan(self):
        """The load-time plan (print it): nodes before/after, rewrites."""
        return self._report

    def run(self, output_names, input_feed, run_options=None):
        """Runs the model; returns the outputs (NumPy arrays) in the order
        of ``output_names`` (None: every graph output).

        Raises
        ------
        ValueError
            A missing or unknown input, an input of the wrong rank or fixed
            size, an unknown output name.
        TypeError
            An input of the wrong element type or not an array.
        """
        names = self._check_outputs(output_names)
        feeds = self._check_feeds(input_feed)
        key = tuple((k, feeds[k].shape, feeds[k].dtype.str) for k in sorted(feeds))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(feeds)
        if self._threads is None:
            return self._execute(plan, feeds, names)
        import numba

        old = numba.get_num_threads()
        if old == self._threads:
            return self._execute(plan, feeds, names)
        numba.set_num_threads(self._threads)
        try:
            return self._execute(plan, feeds, names)
        finally:
            numba.set_num_threads(old)

    # -- internals ---------------------------------------------------------

    def _check_outputs(self, output_names):
        known = [o.name for o in self._outputs]
        if output_names is None:
            return known
        if isinstance(output_names, str):
            raise TypeError("InferenceSession.run: output_names must be a list of names or "
                            f"None, got the string {output_names!r}")
        for name in output_names:
            if name not in known:
                raise ValueError(f"InferenceSession.run: unknown output name {name!r}; the "
                                 f"model's outputs are {known}")
        return list(output_names)

    def _check_feeds(self, input_feed):
        if not isinstance(input_feed, dict):
            raise TypeError(f"InferenceSession.run: input_feed must be a dict "
                            f"{{name: array}}, got {type(input_feed).__name__}")
        declared = {i.name: i for i in self._inputs}
        for name in input_feed:
            if name not in declared:
                raise ValueError(f"InferenceSession.run: unknown input name {name!r}; the "
                                 f"model's inputs are {list(declared)}")
        feeds = {}
        for name, info in declared.items():
            if name not in input_feed:
                raise ValueError(f"InferenceSession.run: missing input {name!r} (expected "
                                 f"{info.type} of shape {info.shape})")
            x = input_feed[name]
            if not isinstance(x, np.ndarray):
                if hasattr(x, "__cuda_array_interface__"):
                    import nbops

                    x = nbops.to_host(x)
                elif isinstance(x, (np.generic, int, float, bool, list)):
                    x = np.asarray(x)
                else:
                    raise TypeError(f"InferenceSession.run: input {name!r} must be a NumPy "
                                    f"array, got {type(x).__name__}")
            if info.dtype is not None and x.dtype != info.dtype:
                raise TypeError(f"InferenceSession.run: input {name!r} must be {info.type} "
                                f"({info.dtype}), got {x.dtype}")
            if info.shape is not None:
                if x.ndim != len(info.shape):
                    raise ValueError(f"InferenceSession.run: input {name!r} must have rank "
                                     f"{len(info.shape)} (shape {info.shape}), got shape "
                                     f"{x.shape}")
                for i, (want, got) in enumerate(zip(info.shape, x.shape)):
                    if isinstance(want, int) and want != got:
                        raise ValueError(f"InferenceSession.run: input {name!r} has shape "
                                         f"{x.shape}; dimension {i} must be {want} (declared "
                                         f"shape {info.shape})")
            feeds[name] = x
        return feeds

    def _make_plan(self, feeds):
        graph = self._graph.copy()
        shapes = {k: tuple(v.shape) for k, v in feeds.items()}
        shapes.update(_inferred_shapes(self._model, shapes))
        log = _planner.fold_shapes(graph, shapes)
        if log:
            log += _planner.fold_constants(graph)
        for n in graph.nodes:
            _planner.prepare_node(n, graph, self._prepare_cache)
        if self._device == "cuda":
            graph.consts = self._on_device(graph.consts)
        return _planner.Plan(graph, log)

    def _on_device(self, consts):
        import nbops

        cache = self._device_consts
        if cache is None:
            cache = self._device_consts = {}
        out = {}
        for k, v in consts.items():
            # float tensors go to the GPU once; ints (shapes, axes) stay on
            # the host, where the handlers read them
            if isinstance(v, np.ndarray) and v.dtype in (np.float32, np.float64) and v.ndim:
                key = (k, id(v))
                if key not in cache:
                    cache[key] = nbops.to_device(np.ascontiguousarray(v))
                out[k] = cache[key]
            else:
                out[k] = v
        return out

    def _execute(self, plan, feeds, names):
        import nbops

        t0 = time.perf_counter()
        vals = plan.initial.copy()
        cuda = self._device == "cuda"
        for name, slot in plan.feeds:
            v = feeds[name]
            if cuda and v.dtype in (np.float32, np.float64):
                v = nbops.to_device(np.ascontiguousarray(v))
            vals[slot] = v
        # bytes each slot's value holds, their running total and its peak
        owned = [0] * len(vals)
        held = peak = 0
        for fn, ins, outs, rel in plan.program:
            res = fn(*[vals[i] for i in ins])
            if type(res) is not tuple:
                res = (res,)
            for slot, v in zip(outs, res):
                if isinstance(v, np.generic):
                    # NumPy reductions and takes of 0-d results give scalars
                    v = np.asarray(v)
                vals[slot] = v
                held += (b := _owned_bytes(v)) - owned[slot]
                owned[slot] = b
            if held > peak:
                peak = held
            for slot in rel:
                held -= owned[slot]
                owned[slot] = 0
                vals[slot] = None
        results = []
        for name in names:
            val = vals[plan.results[name]]
            if not isinstance(val, np.ndarray):
                val = nbops.to_host(val) if hasattr(val, "__cuda_array_interface__") else \
                    np.asarray(val)
            results.append(val)
        self.last_run = {"seconds": time.perf_counter() - t0, "peak_bytes": peak,
                         "steps": len(plan.program)}
        return results

    @property
    def peak_memory(self):
        """Bytes held by intermediates at the peak of the last run (None
        before the first)."""
        return None if self.last_run is None else self.last_run["peak_bytes"]


def _owned_bytes(x):
    # a view (Reshape, Transpose, Identity) holds no new memory
    if isinstance(x, np.ndarray):
        return 0 if x.base is not None else x.nbytes
    return int(getattr(x, "nbytes", 0) or 0)


def _max_threads():
    from numba import config

    return config.NUMBA_NUM_THREADS


def _inferred_shapes(model, input_shapes):
    """Every value's shape once the inputs' are fixed (onnx shape inference
    on a copy with concrete input dims); {} where inference fails."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in input_shapes:
            shp = vi.type.tensor_type.shape
            del shp.dim[:]
            for d in input_shapes[vi.name]:
                shp.dim.add().dim_value = int(d)
    del m.graph.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for vi in list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if all(isinstance(d, int) for d in dims):
            out[vi.name] = tuple(dims)
    return out
