"""Load-time planning of an ONNX graph: the planner's :class:`Node`, graph
rewriting passes, and the execution plan a session runs.

A model is parsed once into a :class:`Graph` (nodes in topological order,
constants as NumPy arrays, the inputs and outputs with their declared
types). Then the passes in :data:`PASSES` rewrite it in order; each is a
function ``fn(graph) -> list[str]`` returning one line per rewrite it made
(printed by ``session.plan``). Built in:

* ``10`` eliminate Identity and inference-mode Dropout (consumers read the
  node's input; a graph output keeps its name through an alias);
* ``20`` fold constants: every node whose inputs are all constants runs at
  load time through its own handler (Constant, ConstantOfShape, shape
  arithmetic, Reshape targets, weight transposes);
* ``30`` fold BatchNormalization into the Conv before it (when the conv's
  output has no other reader);
* ``40`` fuse Conv [+ Relu or Clip] into ``ai.nbops.FusedConv`` (nbops'
  conv kernel with its epilogue) and Gemm / MatMul-with-a-constant-2-D-weight
  [+ Add of a constant bias] [+ an activation, Clip included] into
  ``ai.nbops.FusedLinear`` (:func:`nbops.linear`'s epilogue). A Clip fuses
  where its bounds are constants (attributes before opset 11, initializers
  from 11) as ``("hardtanh", lo, hi)``, a missing bound infinite;
* ``45`` a per-channel affine after a convolution or batch norm (``Mul``
  by, then ``Add`` of, constants of one value per channel, as Caffe2's
  converter writes DenseNet's batch norms) folded into the FusedConv's
  weights and bias (a following Relu or Clip into its epilogue) or into the
  BatchNormalization's scale and bias;
* ``46`` an inference-mode BatchNormalization of constant statistics whose
  only reader is a Relu into ``ai.nbops.ScaleShiftRelu`` (``relu(x * s +
  t)``, one fused pass instead of two);
* ``50`` the residual Add after a FusedConv (``relu(conv(x) + r)``, or a
  Clip after it) into the conv's epilogue (``residual=``);
* ``35`` recognise LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
  Div [, Mul, Add]) and Gelu (Div by sqrt 2, Erf, Add 1, Mul, Mul 0.5)
  subgraphs and map them to single nodes run by nbops' kernels.

Another module adds a pass with :func:`register_pass` (the quantized-op
module's QDQ fusion does), e.g.::

    from nbops.onnx._planner import register_pass

    def fuse_qdq(graph):
        ...  # rewrite graph.nodes, return ["QDQ conv -> QLinearConv: node 'c1'"]
        return rewrites

    register_pass(fuse_qdq, order=35)

Pass contract: ``graph.nodes`` is a list of :class:`Node` in a valid
execution order; ``graph.consts`` maps value names to NumPy arrays;
``graph.consumers(name)`` lists the nodes reading a value;
``graph.is_output(name)`` whether a value is a graph output; new nodes are
made with :func:`make_node` (which looks their handler up). A pass must keep
the graph's results unchanged.

Per input-shape set the session makes a :class:`Plan` (cached): the graph
with Shape nodes of known shapes folded and the fold pass rerun, each
value's last reader (so its buffer is released right after), and the steps.
"""

import functools
import itertools

import numpy as np

from ._registry import UnsupportedModelError, lookup

__all__ = ["Node", "Graph", "Plan", "PASSES", "register_pass", "make_node", "NBOPS_DOMAIN"]

#: Domain of the planner's own fused operators.
NBOPS_DOMAIN = "ai.nbops"


class Node:
    """One graph node as handlers see it.

    Attributes: ``name``, ``op_type``, ``domain`` ('' for ai.onnx),
    ``inputs`` / ``outputs`` (value names, '' for an omitted optional one),
    ``attrs`` (decoded Python values: int, float, str, lists, NumPy arrays
    for tensors), ``opset`` (the model's opset of the node's domain),
    ``input_dtypes`` (NumPy dtypes or None where unknown), ``spec`` (the
    op-table entry that runs it) and ``state`` (what its ``prepare``
    returned, else None).
    """

    __slots__ = ("name", "op_type", "domain", "inputs", "outputs", "attrs", "opset",
                 "input_dtypes", "spec", "state", "fused")

    def __init__(self, name, op_type, domain, inputs, outputs, attrs, opset,
                 input_dtypes=None, fused=None):
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs)
        self.opset = opset
        self.input_dtypes = list(input_dtypes) if input_dtypes else [None] * len(self.inputs)
        self.spec = None
        self.state = None
        # the original nodes a fused node stands for (names), for the plan
        self.fused = list(fused) if fused else [name]

    def __repr__(self):
        dom = f"{self.domain}." if self.domain else ""
        return (f"{dom}{self.op_type}({', '.join(self.inputs)}) -> "
                f"{', '.join(self.outputs)}  [{self.name}]")


def make_node(graph, name, op_type, inputs, outputs, attrs, domain=NBOPS_DOMAIN, fused=None,
              input_dtypes=None):
    """A new :class:`Node` for a pass, its handler looked up (raising
    :class:`UnsupportedModelError` if there is none)."""
    opset = 1 if domain == NBOPS_DOMAIN else graph.opsets.get(domain, 1)
    node = Node(name, op_type, domain, inputs, outputs, attrs, opset, input_dtypes, fused)
    node.spec = lookup(op_type, domain, opset, name)
    return node


# ---------------------------------------------------------------------------
# Parsing


_DTYPES = None


def np_dtype(elem_type):
    """NumPy dtype of an ONNX TensorProto element type, or None."""
    global _DTYPES
    if _DTYPES is None:
        from onnx import helper

        _DTYPES = {}
        for t in range(1, 30):
            try:
                _DTYPES[t] = np.dtype(helper.tensor_dtype_to_np_dtype(t))
            except Exception:  # noqa: BLE001  (types with no NumPy twin)
                pass
    return _DTYPES.get(elem_type)


def decode_attr(attr):
    """A Python value of an AttributeProto (tensors as NumPy arrays)."""
    from onnx import AttributeProto, helper, numpy_helper

    if attr.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    if attr.type == AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in attr.tensors]
    if attr.type == AttributeProto.GRAPH or attr.type == AttributeProto.GRAPHS:
        return attr  # no handler takes subgraphs; lookup refuses such ops
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    return value


class ValueInfo:
    """``name``, ``shape`` (ints, strings for symbolic dims, None where
    unknown), ``type`` ('tensor(float)') and ``dtype`` of a graph input or
    output, as onnxruntime's ``NodeArg``."""

    __slots__ = ("name", "shape", "type", "dtype")

    def __init__(self, name, shape, type_, dtype):
        self.name, self.shape, self.type, self.dtype = name, shape, type_, dtype

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


_TYPE_NAMES = {
    1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64",
    16: "bfloat16",
}


def value_info(vi):
    tt = vi.type.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                shape.append(d.dim_param)
            else:
                shape.append(None)
    name = _TYPE_NAMES.get(tt.elem_type, str(tt.elem_type))
    return ValueInfo(vi.name, shape, f"tensor({name})", np_dtype(tt.elem_type))


class Graph:
    """The rewritable graph (see the module docstring for what passes see)."""

    def __init__(self, nodes, consts, inputs, outputs, opsets, dtypes, aliases=None):
        self.nodes = nodes
        self.consts = consts
        self.inputs = inputs            # [ValueInfo] of the runtime inputs
        self.outputs = outputs          # [ValueInfo] of the graph outputs
        self.opsets = opsets
        self.dtypes = dtypes            # value name -> NumPy dtype, where known
        self.aliases = dict(aliases or {})   # graph output name -> value computing it
        self.ranks = {}                 # value name -> rank, where shape inference knew it
        self._counter = itertools.count()

    def copy(self):
        g = Graph(list(self.nodes), dict(self.consts), self.inputs, self.outputs, self.opsets,
                  self.dtypes, self.aliases)
        g._counter = self._counter
        g.ranks = self.ranks
        return g

    def fresh(self, stem):
        """A value or node name not used in the graph."""
        return f"_nbops_{stem}_{next(self._counter)}"

    def consumers(self, name):
        return [n for n in self.nodes if name in n.inputs]

    def use_count(self):
        counts = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    counts[i] = counts.get(i, 0) + 1
        return counts

    def consumers(self):
        """``{value name: [nodes reading it]}``, in graph order."""
        readers = {}
        for n in self.nodes:
            for i in n.inputs:
                readers.setdefault(i, []).append(n)
        return readers

    def is_output(self, name):
        return name in self.aliases.values()

    def rename_uses(self, old, new):
        """Every reader of ``old`` reads ``new`` (and a graph output that was
        ``old`` is computed by ``new``)."""
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        for k, v in self.aliases.items():
            if v == old:
                self.aliases[k] = new


def parse(model):
    """A :class:`Graph` of a checked ``ModelProto`` (shape inference run),
    every node's handler looked up: unsupported operators raise
    :class:`UnsupportedModelError` here, at load time."""
    from onnx import numpy_helper

    g = model.graph
    opsets = {}
    for imp in model.opset_import:
        dom = "" if imp.domain in ("", "ai.onnx") else imp.domain
        opsets[dom] = int(imp.version)
    consts = {}
    for init in g.initializer:
        try:
            consts[init.name] = numpy_helper.to_array(init)
        except (KeyError, ValueError, TypeError) as exc:
            # an unknown data_type (KeyError in onnx's map), data not matching
            # the dims: a damaged file the checker let through
            raise ValueError(f"nbops.onnx: initializer {init.name!r} cannot be read "
                             f"(data_type {init.data_type}, dims {list(init.dims)}): "
                             f"{type(exc).__name__}: {exc}") from None
    for sp in g.sparse_initializer:
        raise UnsupportedModelError(
            f"nbops.onnx: sparse initializer {sp.values.name!r} is not supported")
    for vi in itertools.chain(g.input, g.output):
        kind = vi.type.WhichOneof("value")
        if kind not in ("tensor_type", None):
            raise UnsupportedModelError(
                f"nbops.onnx: graph value {vi.name!r} is of type {kind} (only tensors are "
                f"supported)")
    dtypes, ranks = {}, {}
    for vi in itertools.chain(g.input, g.output, g.value_info):
        dt = np_dtype(vi.type.tensor_type.elem_type)
        if dt is not None:
            dtypes[vi.name] = dt
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    for name, arr in consts.items():
        dtypes[name] = arr.dtype
    inputs = [value_info(vi) for vi in g.input if vi.name not in consts]
    outputs = [value_info(vi) for vi in g.output]
    nodes = []
    for i, p in enumerate(g.node):
        dom = "" if p.domain in ("", "ai.onnx") else p.domain
        name = p.name or f"{p.op_type}_{i}"
        if dom not in opsets:
            raise UnsupportedModelError(
                f"nbops.onnx: node {name!r} op {p.op_type} uses domain {p.domain!r}, which "
                f"the model does not import (opset imports: {sorted(opsets)})")
        attrs = {a.name: decode_attr(a) for a in p.attribute}
        node = Node(name, p.op_type, dom, p.input, p.output, attrs, opsets[dom],
                    [dtypes.get(x) for x in p.input])
        node.spec = lookup(p.op_type, dom, opsets[dom], name)
        _check_dtype(node)
        nodes.append(node)
    graph = Graph(nodes, consts, inputs, outputs, opsets, dtypes,
                  {o.name: o.name for o in outputs})
    graph.ranks = ranks
    return graph


def _check_dtype(node):
    allowed = node.spec.dtypes
    dt = node.input_dtypes[0] if node.input_dtypes else None
    if allowed is None or dt is None or dt.name in allowed:
        return
    raise UnsupportedModelError(
        f"nbops.onnx: node {node.name!r} op {node.op_type} at opset {node.opset}: element "
        f"type {dt.name} is not supported (supported: {', '.join(allowed)})")


# ---------------------------------------------------------------------------
# Passes

#: ``[(order, name, fn)]`` run in order by :func:`optimize`.
PASSES = []


def register_pass(fn, order, name=None):
    """Adds a rewriting pass ``fn(graph) -> list[str]`` run at position
    ``order`` (built-in passes: 10 Identity, 20 fold, 30 BN, 35 subgraphs, 40 fusion, 45
    per-channel affine, 46 batch norm + Relu, 50 residual). Registering the same function
    twice replaces it."""
    name = name or fn.__name__
    PASSES[:] = [p for p in PASSES if p[1] != name]
    PASSES.append((order, name, fn))
    PASSES.sort(key=lambda p: p[0])
    return fn


def optimize(graph):
    """Runs every pass; returns the rewrite log ``[(pass name, line)]``."""
    log = []
    for _, name, fn in list(PASSES):
        for line in fn(graph) or ():
            log.append((name, line))
    return log


def run_node(node, args):
    """Runs one node's handler (``state=`` only for handlers with a
    ``prepare``); returns a tuple of outputs."""
    if node.spec.prepare is not None:
        res = node.spec.run(node, *args, state=node.state)
    else:
        res = node.spec.run(node, *args)
    res = res if isinstance(res, tuple) else (res,)
    # NumPy reductions and takes of 0-d results give scalars: arrays here
    return tuple(np.asarray(r) if isinstance(r, np.generic) else r for r in res)


def _eliminate_identity(graph):
    log, keep = [], []
    counts = graph.use_count()
    for n in graph.nodes:
        passthrough = n.op_type == "Identity" and n.domain == ""
        if n.op_type == "Dropout" and n.domain == "":
            mode = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
            training = mode is not None and not (mode in graph.consts
                                                 and not bool(graph.consts[mode]))
            mask = n.outputs[1] if len(n.outputs) > 1 else ""
            mask_used = bool(mask) and (counts.get(mask, 0) > 0 or graph.is_output(mask))
            passthrough = not training and not mask_used
        if passthrough and n.inputs and n.inputs[0]:
            graph.rename_uses(n.outputs[0], n.inputs[0])
            log.append(f"{n.op_type} {n.name!r} removed")
        else:
            keep.append(n)
    graph.nodes = keep
    return log


#: Constant-folded results larger than this stay computed at run time
#: (a huge ConstantOfShape would only cost memory; VGG-19's 400 MB classifier weight
#: is below it: folded once, not rebuilt on every run).
FOLD_LIMIT_BYTES = 1 << 30


def fold_constants(graph):
    """Runs every node whose inputs are all constants, at load time."""
    log, keep = [], []
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if n.domain == "" and n.op_type in ("RandomNormal", "RandomUniform",
                                            "RandomNormalLike", "RandomUniformLike"):
            keep.append(n)
            continue
        if all(i in graph.consts for i in ins):
            args = [graph.consts[i] if i else None for i in n.inputs]
            prepare_node(n, graph)
            outs = run_node(n, args)
            if builtins_sum(getattr(o, "nbytes", 0) for o in outs) <= FOLD_LIMIT_BYTES \
                    and all(isinstance(o, np.ndarray) for o in outs if o is not None):
                for name, o in zip(n.outputs, outs):
                    if name:
                        graph.consts[name] = o
                        graph.dtypes[name] = o.dtype
                log.append(f"{n.op_type} {n.name!r} folded")
                continue
        keep.append(n)
    graph.nodes = keep
    return log


builtins_sum = sum


def _sole_reader(graph, name, counts):
    return counts.get(name, 0) == 1 and not graph.is_output(name)


def _fold_batch_norm(graph):
    log = []
    counts = graph.use_count()
    producer = {o: n for n in graph.nodes for o in n.outputs}
    drop = set()
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain != "" or len(
                [o for o in bn.outputs if o]) != 1 or bn.attrs.get("training_mode", 0):
            continue
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op_type != "Conv" or conv.domain != "":
            continue
        if not _sole_reader(graph, conv.outputs[0], counts):
            continue
        stats = bn.inputs[1:5]
        wb = conv.inputs[1:3]
        if not all(s in graph.consts for s in stats) or wb[0] not in graph.consts or (
                len(wb) > 1 and wb[1] and wb[1] not in graph.consts):
            continue
        gamma, beta, mean, var = (graph.consts[s] for s in stats)
        w = graph.consts[wb[0]]
        if w.dtype.kind != "f" or gamma.ndim != 1:
            continue
        b = graph.consts[wb[1]] if len(wb) > 1 and wb[1] else np.zeros(w.shape[0], w.dtype)
        eps = float(bn.attrs.get("epsilon", 1e-5))
        # in float64, rounded once: the folded weights' only extra error
        s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        wf = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        bf = ((b - mean.astype(np.float64)) * s + beta).astype(w.dtype)
        wname, bname = graph.fresh("w"), graph.fresh("b")
        graph.consts[wname], graph.consts[bname] = wf, bf
        graph.dtypes[wname] = graph.dtypes[bname] = w.dtype
        conv.inputs = [conv.inputs[0], wname, bname]
        conv.input_dtypes = [conv.input_dtypes[0], w.dtype, w.dtype]
        conv.outputs = [bn.outputs[0]]
        conv.fused = conv.fused + bn.fused
        drop.add(id(bn))
        log.append(f"BatchNormalization {bn.name!r} folded into Conv {conv.name!r}")
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return log


#: Activations the GEMM epilogue of nbops.linear applies:
#: ONNX op type -> function(node attrs) -> nbops activation or None.
LINEAR_ACTIVATIONS = {
    "Relu": lambda a: "relu",
    "Sigmoid": lambda a: "sigmoid",
    "Tanh": lambda a: "tanh",
    "LeakyRelu": lambda a: ("leaky_relu", float(a.get("alpha", 0.01))),
    "Elu": lambda a: ("elu", float(a.get("alpha", 1.0))),
    "Softplus": lambda a: "softplus",
    "HardSwish": lambda a: "hardswish",
    "Gelu": lambda a: {"none": "gelu", "tanh": "gelu_tanh"}.get(a.get("approximate", "none")),
}


def _clip_bounds(graph, node):
    """``(lo, hi)`` of a Clip node as floats, a missing bound -inf / +inf:
    attributes before opset 11, optional inputs from 11, which must then be
    one-element constants. None where they are not, or are NaN or out of
    order (the node then runs on its own)."""
    if node.opset < 11:
        lo, hi = float(node.attrs.get("min", -np.inf)), float(node.attrs.get("max", np.inf))
    else:
        bounds = []
        for i, missing in ((1, -np.inf), (2, np.inf)):
            name = node.inputs[i] if len(node.inputs) > i else ""
            c = graph.consts.get(name) if name else None
            if name and (c is None or c.size != 1 or c.dtype.kind != "f"):
                return None
            bounds.append(missing if not name else float(c.reshape(-1)[0]))
        lo, hi = bounds
    if np.isnan(lo) or np.isnan(hi) or lo > hi:
        return None
    return lo, hi


def _epilogue_activation(graph, node, conv=False):
    """The activation a fused op's epilogue applies in place of ``node`` (the
    only reader of its output), or None: for nbops.linear any of
    ``LINEAR_ACTIVATIONS`` and Clip of constant bounds (``("hardtanh", lo,
    hi)``); for a convolution Relu and Clip. ``Clip(0, +inf)`` is relu."""
    if node is None:
        return None
    if node.op_type == "Clip" and node.domain == "":
        bounds = _clip_bounds(graph, node)
        if bounds is None:
            return None
        # Clip(+0.0, +inf) is relu, which the conv kernels apply themselves
        relu = bounds == (0.0, np.inf) and not np.signbit(bounds[0])
        return "relu" if relu else ("hardtanh",) + bounds
    if conv:
        return "relu" if node.op_type == "Relu" and node.domain == "" else None
    if node.domain in ("", NBOPS_DOMAIN) and node.op_type in LINEAR_ACTIVATIONS and \
            len(node.inputs) == 1:
        return LINEAR_ACTIVATIONS[node.op_type](node.attrs)
    return None


def _fuse_ops(graph):
    """Conv [+ Relu or Clip] -> FusedConv; Gemm / MatMul [+ Add bias] [+ act]
    -> FusedLinear."""
    log = []
    counts = graph.use_count()
    consumers = graph.consumers()
    drop = set()
    out_nodes = []
    for n in graph.nodes:
        if id(n) in drop:
            continue
        if n.domain != "":
            out_nodes.append(n)
            continue
        if n.op_type == "Conv" and _conv_fusable(graph, n):
            fused = make_node(graph, n.name, "FusedConv", n.inputs[:3], n.outputs,
                              dict(n.attrs, activation=None), fused=n.fused,
                              input_dtypes=n.input_dtypes[:3])
            nxt = _only_reader(graph, n.outputs[0], counts, consumers)
            act = _epilogue_activation(graph, nxt, conv=True)
            if act is not None:
                fused.attrs["activation"] = act
                fused.outputs = list(nxt.outputs)
                fused.fused = fused.fused + nxt.fused
                drop.add(id(nxt))
                log.append(f"Conv {n.name!r} + {nxt.op_type} {nxt.name!r} -> FusedConv")
            else:
                log.append(f"Conv {n.name!r} -> FusedConv")
            out_nodes.append(fused)
            continue
        lin = _as_linear(graph, n)
        if lin is not None:
            x, wname, bias, extra = lin
            fused_names = list(n.fused)
            outs = list(n.outputs)
            desc = [f"{n.op_type} {n.name!r}"]
            nxt = _only_reader(graph, outs[0], counts, consumers)
            if bias is None and nxt is not None and nxt.op_type == "Add" and nxt.domain == "":
                other = nxt.inputs[1] if nxt.inputs[0] == outs[0] else nxt.inputs[0]
                b = graph.consts.get(other)
                nout = graph.consts[wname].shape[0]
                if b is not None and b.dtype == graph.consts[wname].dtype and \
                        b.size == nout and b.shape[-1:] == (nout,) and b.ndim <= 1:
                    bias = other
                    outs = list(nxt.outputs)
                    fused_names += nxt.fused
                    drop.add(id(nxt))
                    desc.append(f"Add {nxt.name!r}")
                    nxt = _only_reader(graph, outs[0], counts, consumers)
            act = _epilogue_activation(graph, nxt)
            if act is not None:
                outs = list(nxt.outputs)
                fused_names += nxt.fused
                drop.add(id(nxt))
                desc.append(f"{nxt.op_type} {nxt.name!r}")
            attrs = dict(extra, activation=act)
            ins = [x, wname, bias or ""]
            out_nodes.append(make_node(graph, n.name, "FusedLinear", ins, outs, attrs,
                                       fused=fused_names,
                                       input_dtypes=[n.input_dtypes[0]] * 3))
            log.append(" + ".join(desc) + " -> FusedLinear")
            continue
        out_nodes.append(n)
    graph.nodes = out_nodes
    return log


def _only_reader(graph, name, counts, consumers):
    if not _sole_reader(graph, name, counts):
        return None
    readers = consumers.get(name, [])
    return readers[0] if len(readers) == 1 else None


def _conv_fusable(graph, n):
    w = graph.consts.get(n.inputs[1])
    if w is None or w.dtype not in (np.float32, np.float64) or w.ndim not in (3, 4):
        return False
    if len(n.inputs) > 2 and n.inputs[2] and n.inputs[2] not in graph.consts:
        return False
    return n.input_dtypes[0] in (None, w.dtype)


def _as_linear(graph, n):
    """``(x, weight (out, in) const name, bias const name or None, attrs)``
    where ``n`` is a Gemm or MatMul that nbops.linear runs, else None."""
    if n.op_type == "Gemm":
        a = n.attrs
        if a.get("transA", 0) or len(n.inputs) < 2 or n.inputs[1] not in graph.consts:
            return None
        w = graph.consts[n.inputs[1]]
        if w.dtype not in (np.float32, np.float64) or w.ndim != 2:
            return None
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        if n.opset < 7:
            return None
        wt = w if a.get("transB", 0) else np.ascontiguousarray(w.T)
        if alpha != 1.0:
            wt = (wt * alpha).astype(w.dtype)
        wname = graph.fresh("w")
        graph.consts[wname] = np.ascontiguousarray(wt)
        bias = None
        if len(n.inputs) > 2 and n.inputs[2]:
            c = graph.consts.get(n.inputs[2])
            if c is None or c.dtype != w.dtype or c.size != wt.shape[0] or \
                    c.shape[-1:] != (wt.shape[0],) or c.ndim > 2:
                return None
            bname = graph.fresh("b")
            graph.consts[bname] = np.ascontiguousarray((c.reshape(-1) * beta).astype(w.dtype))
            bias = bname
        return n.inputs[0], wname, bias, {"rank2": 1}
    if n.op_type == "MatMul":
        w = graph.consts.get(n.inputs[1])
        if w is None or w.dtype not in (np.float32, np.float64) or w.ndim != 2:
            return None
        if n.input_dtypes[0] not in (None, w.dtype):
            return None
        wname = graph.fresh("w")
        graph.consts[wname] = np.ascontiguousarray(w.T)
        return n.inputs[0], wname, None, {"rank2": 0}
    return None


def _fold_affine(graph):
    """FusedConv (no activation or residual yet) or BatchNormalization ->
    [Mul by a per-channel constant] -> [Add of one] (at least one of them),
    folded into the convolution's weights and bias (and a Relu or Clip after
    them into its epilogue) or into the batch norm's scale and bias."""
    log = []
    counts = graph.use_count()
    consumers = graph.consumers()
    drop = set()
    for n in graph.nodes:
        if id(n) in drop:
            continue
        conv = n.op_type == "FusedConv" and n.domain == NBOPS_DOMAIN and \
            n.attrs.get("activation") is None and len(n.inputs) <= 3
        bn = n.op_type == "BatchNormalization" and n.domain == "" and \
            all(i in graph.consts for i in n.inputs[1:5]) and len(n.outputs) == 1
        if not (conv or bn):
            continue
        ref = graph.consts[n.inputs[1]]
        channels = ref.shape[0]
        rank = ref.ndim if conv else graph.ranks.get(n.inputs[0])
        scale = shift = None
        out, chain = n.outputs[0], []
        for op in ("Mul", "Add"):
            nxt = _only_reader(graph, out, counts, consumers)
            if nxt is None or nxt.op_type != op or nxt.domain != "" or len(nxt.inputs) != 2:
                continue
            other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
            vec = _per_channel(graph.consts.get(other), channels, rank, ref.dtype)
            if vec is None:
                break
            if op == "Mul":
                scale = vec
            else:
                shift = vec
            out = nxt.outputs[0]
            chain.append(nxt)
        if not chain:
            continue
        one = np.ones(channels)
        s = one if scale is None else scale
        t = np.zeros(channels) if shift is None else shift
        if conv:
            w = graph.consts[n.inputs[1]]
            b = graph.consts[n.inputs[2]] if len(n.inputs) > 2 and n.inputs[2] else \
                np.zeros(channels, w.dtype)
            new = {"w": w * s.reshape((-1,) + (1,) * (w.ndim - 1)), "b": b * s + t}
            names = ("w", "b")
        else:
            gamma, beta = graph.consts[n.inputs[1]], graph.consts[n.inputs[2]]
            new = {"scale": gamma * s, "bias": beta * s + t}
            names = ("scale", "bias")
        fresh = []
        for key in names:
            name = graph.fresh(key)
            graph.consts[name] = np.ascontiguousarray(new[key].astype(ref.dtype))
            graph.dtypes[name] = ref.dtype
            fresh.append(name)
        n.inputs = [n.inputs[0]] + fresh + list(n.inputs[3:] if bn else [])
        if conv:
            n.input_dtypes = (list(n.input_dtypes) + [ref.dtype] * 3)[:3]
            relu = _only_reader(graph, out, counts, consumers)
            act = _epilogue_activation(graph, relu, conv=True)
            if act is not None:
                n.attrs = dict(n.attrs, activation=act)
                out = relu.outputs[0]
                chain.append(relu)
        n.outputs = [out]
        n.fused = n.fused + [f for m in chain for f in m.fused]
        drop.update(id(m) for m in chain)
        log.append(" + ".join([f"{n.op_type} {n.name!r}"] + [f"{m.op_type} {m.name!r}"
                                                              for m in chain])
                   + (" -> FusedConv" if conv else " -> BatchNormalization"))
    graph.nodes = [m for m in graph.nodes if id(m) not in drop]
    return log


def _batch_norm_relu(graph):
    """BatchNormalization (constant statistics) -> Relu as its only reader
    -> ScaleShiftRelu with ``s = gamma / sqrt(var + eps)``, ``t = beta -
    mean * s`` computed here (in float64, rounded once)."""
    log = []
    counts = graph.use_count()
    consumers = graph.consumers()
    replace, drop = {}, set()
    for bn in graph.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain != "" or len(bn.outputs) != 1 or \
                bn.attrs.get("training_mode", 0) or len(bn.inputs) != 5 or \
                not all(i in graph.consts for i in bn.inputs[1:5]):
            continue
        gamma, beta, mean, var = (graph.consts[i] for i in bn.inputs[1:5])
        dtype = graph.dtypes.get(bn.inputs[0])
        if dtype not in (np.float32, np.float64) or any(
                c.dtype != dtype or c.ndim != 1 for c in (gamma, beta, mean, var)):
            continue
        relu = _only_reader(graph, bn.outputs[0], counts, consumers)
        if relu is None or relu.op_type != "Relu" or relu.domain != "":
            continue
        scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) +
                                                   float(bn.attrs.get("epsilon", 1e-5)))
        shift = beta.astype(np.float64) - mean.astype(np.float64) * scale
        names = []
        for key, v in (("s", scale), ("t", shift)):
            name = graph.fresh(key)
            graph.consts[name], graph.dtypes[name] = v.astype(dtype), dtype
            names.append(name)
        replace[id(bn)] = make_node(graph, bn.name, "ScaleShiftRelu", [bn.inputs[0]] + names,
                                    relu.outputs, {}, fused=bn.fused + relu.fused,
                                    input_dtypes=[dtype] * 3)
        drop.add(id(relu))
        log.append(f"BatchNormalization {bn.name!r} + Relu {relu.name!r} -> ScaleShiftRelu")
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return log


def _per_channel(c, channels, rank, dtype):
    """``c`` (a constant) as one float64 value per channel where it
    broadcasts over a (N, channels, ...) value of ``rank`` dims that way,
    else None."""
    if c is None or rank is None or c.dtype != dtype or c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,)).copy() \
        if c.size == 1 else c.astype(np.float64).reshape(-1)


def _fuse_residual(graph):
    """FusedConv -> Add(other) [-> Relu or Clip] -> FusedConv(residual=other)."""
    log = []
    counts = graph.use_count()
    consumers = graph.consumers()
    producer = {o: n for n in graph.nodes for o in n.outputs}
    replace, drop = {}, set()
    for add in graph.nodes:
        # Sum of two is an Add (Caffe2-converted ResNets write it so)
        if add.op_type not in ("Add", "Sum") or add.domain != "" or len(add.inputs) != 2:
            continue
        for side in (0, 1):
            conv = producer.get(add.inputs[side])
            other = add.inputs[1 - side]
            if conv is None or conv.op_type != "FusedConv" or id(conv) in drop or \
                    conv.attrs.get("activation") is not None or len(conv.inputs) > 3 or \
                    other in graph.consts or other == add.inputs[side]:
                continue
            if not _sole_reader(graph, conv.outputs[0], counts):
                continue
            fused = make_node(graph, conv.name, "FusedConv",
                              (conv.inputs + ["", ""])[:3] + [other], add.outputs,
                              dict(conv.attrs), fused=conv.fused + add.fused,
                              input_dtypes=(conv.input_dtypes + [None, None])[:3] + [None])
            desc = f"{add.op_type} {add.name!r} into FusedConv {conv.name!r} (residual=)"
            nxt = _only_reader(graph, add.outputs[0], counts, consumers)
            act = _epilogue_activation(graph, nxt, conv=True)
            if act is not None:
                fused.attrs["activation"] = act
                fused.outputs = list(nxt.outputs)
                fused.fused += nxt.fused
                drop.add(id(nxt))
                desc += f" + {nxt.op_type} {nxt.name!r}"
            # the conv runs where the Add ran: both its input and the
            # residual exist by then
            replace[id(add)] = fused
            drop.add(id(conv))
            log.append(desc)
            break
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return log


def _recognise_subgraphs(graph):
    """LayerNorm and Gelu written out as primitive ops -> one node each."""
    log = []
    counts = graph.use_count()
    producer = {o: n for n in graph.nodes for o in n.outputs}
    replace, drop = {}, set()

    def prod(name, op):
        n = producer.get(name)
        return n if n is not None and n.op_type == op and n.domain == "" and \
            id(n) not in drop else None

    def const_val(name):
        c = graph.consts.get(name)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None

    for mul in graph.nodes:
        # Gelu: Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5) in either Mul order
        if mul.op_type != "Mul" or mul.domain != "" or id(mul) in drop:
            continue
        found = _match_gelu(mul, prod, const_val, graph, counts)
        if found is not None:
            x, inner = found
            node = make_node(graph, mul.name, "Gelu", [x], mul.outputs, {"approximate": "none"},
                             domain=NBOPS_DOMAIN, fused=[n.name for n in inner],
                             input_dtypes=[graph.dtypes.get(x)])
            replace[id(mul)] = node
            drop.update(id(n) for n in inner if n is not mul)
            log.append(f"Gelu subgraph ending at {mul.name!r} -> Gelu")
    for n in graph.nodes:
        if id(n) in drop or id(n) in replace:
            continue
        found = _match_layer_norm(n, prod, const_val, graph, counts)
        if found is not None:
            x, axes, eps, scale, bias, inner, outs = found
            node = make_node(graph, n.name, "LayerNorm", [x, scale or "", bias or ""], outs,
                             {"axes": axes, "epsilon": eps}, domain=NBOPS_DOMAIN,
                             fused=[m.name for m in inner],
                             input_dtypes=[graph.dtypes.get(x), None, None])
            replace[id(inner[-1])] = node
            drop.update(id(m) for m in inner if m is not inner[-1])
            log.append(f"LayerNorm subgraph ending at {inner[-1].name!r} -> LayerNorm")
    graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return log


def _inner_ok(graph, counts, nodes, last):
    """Every value the matched nodes produce, but the last's, is read only
    inside the match."""
    inside = {id(n) for n in nodes}
    for n in nodes:
        if n is last:
            continue
        for o in n.outputs:
            if graph.is_output(o):
                return False
            for r in graph.nodes:
                if o in r.inputs and id(r) not in inside:
                    return False
    return True


def _match_gelu(mul, prod, const_val, graph, counts):
    for a, b in ((0, 1), (1, 0)):
        if const_val(mul.inputs[b]) != 0.5:
            continue
        m2 = prod(mul.inputs[a], "Mul")
        if m2 is None:
            continue
        for c, d in ((0, 1), (1, 0)):
            add = prod(m2.inputs[d], "Add")
            if add is None:
                continue
            x = m2.inputs[c]
            for e, f in ((0, 1), (1, 0)):
                if const_val(add.inputs[f]) != 1.0:
                    continue
                erf = prod(add.inputs[e], "Erf")
                if erf is None:
                    continue
                div = prod(erf.inputs[0], "Div")
                if div is None or div.inputs[0] != x:
                    continue
                s = const_val(div.inputs[1])
                if s is None or abs(s - 2 ** 0.5) > 1e-5:
                    continue
                inner = [div, erf, add, m2, mul]
                if _inner_ok(graph, counts, inner, mul):
                    return x, inner
    return None


def _match_layer_norm(n, prod, const_val, graph, counts):
    # Div(Sub(x, ReduceMean(x)), Sqrt(Add(ReduceMean(Pow(Sub, 2)), eps)))
    if n.op_type != "Div" or n.domain != "":
        return None
    sub = prod(n.inputs[0], "Sub")
    sqrt = prod(n.inputs[1], "Sqrt")
    if sub is None or sqrt is None:
        return None
    mean1 = prod(sub.inputs[1], "ReduceMean")
    if mean1 is None or mean1.inputs[0] != sub.inputs[0]:
        return None
    x = sub.inputs[0]
    add = prod(sqrt.inputs[0], "Add")
    if add is None:
        return None
    eps = const_val(add.inputs[1])
    mean2 = prod(add.inputs[0], "ReduceMean")
    if eps is None or mean2 is None:
        return None
    pw = prod(mean2.inputs[0], "Pow")
    if pw is None or pw.inputs[0] != sub.outputs[0] or const_val(pw.inputs[1]) != 2.0:
        return None
    axes = []
    for m in (mean1, mean2):
        ax = m.attrs.get("axes")
        if ax is None and len(m.inputs) > 1 and m.inputs[1] in graph.consts:
            ax = graph.consts[m.inputs[1]].tolist()
        if ax is None or not m.attrs.get("keepdims", 1):
            return None
        axes.append(sorted(int(a) for a in ax))
    if axes[0] != axes[1]:
        return None
    inner = [mean1, sub, pw, mean2, add, sqrt, n]
    outs, last = n.outputs, n
    scale = bias = None
    consumers = [r for r in graph.nodes if n.outputs[0] in r.inputs]
    if len(consumers) == 1 and consumers[0].op_type == "Mul" and counts.get(n.outputs[0]) == 1:
        m = consumers[0]
        other = m.inputs[1] if m.inputs[0] == n.outputs[0] else m.inputs[0]
        if other in graph.consts:
            scale, last, outs = other, m, m.outputs
            inner.append(m)
            cons2 = [r for r in graph.nodes if m.outputs[0] in r.inputs]
            if len(cons2) == 1 and cons2[0].op_type == "Add" and \
                    counts.get(m.outputs[0]) == 1 and not graph.is_output(m.outputs[0]):
                a2 = cons2[0]
                other = a2.inputs[1] if a2.inputs[0] == m.outputs[0] else a2.inputs[0]
                if other in graph.consts:
                    bias, last, outs = other, a2, a2.outputs
                    inner.append(a2)
    if not _inner_ok(graph, counts, inner, last):
        return None
    # the whole chain must sit at the last node's position: move it there
    inner.remove(last)
    inner.append(last)
    return x, axes[0], eps, scale, bias, inner, outs


register_pass(_eliminate_identity, 10, "identity")
register_pass(fold_constants, 20, "fold")
register_pass(_fold_batch_norm, 30, "batch_norm")
register_pass(_fuse_ops, 40, "fuse")
register_pass(_fold_affine, 45, "affine")
register_pass(_batch_norm_relu, 46, "bn_relu")
register_pass(_fuse_residual, 50, "residual")
register_pass(_recognise_subgraphs, 35, "subgraphs")


# ---------------------------------------------------------------------------
# Preparing nodes and plans


def prepare_node(node, graph, cache=None):
    """Runs the node's ``prepare`` once (cached by node name and the
    identity of its constant inputs: packing survives replanning)."""
    if node.spec.prepare is None or node.state is not None:
        return
    consts = [graph.consts.get(i) if i else None for i in node.inputs]
    key = (node.name, node.op_type, tuple(id(c) for c in consts))
    if cache is not None and key in cache:
        node.state = cache[key]
        return
    node.state = node.spec.prepare(node, consts)
    if cache is not None:
        cache[key] = node.state


class Plan:
    """What one input-shape set runs: ``steps`` (the nodes), ``release[i]``
    the values whose last reader is step ``i``, and the graph (after shape
    folding) it came from.

    For the run loop the names are compiled away: every value has a slot
    in a list (slot 0 is None, read for omitted optional inputs),
    ``initial`` holds the constants in theirs, ``feeds`` pairs each input
    name with its slot, ``results`` maps each graph output name to its
    slot, and ``program`` holds per step ``(fn, input slots, output slots,
    slots to release)`` where ``fn(*inputs)`` is the node's handler with
    its node (and ``state=``) bound."""

    def __init__(self, graph, log):
        self.graph = graph
        self.log = log
        self.steps = list(graph.nodes)
        last = {}
        for i, n in enumerate(self.steps):
            for name in n.inputs:
                if name:
                    last[name] = i
        keep = set(graph.aliases.values()) | set(graph.consts) | {v.name for v in graph.inputs}
        self.release = [[] for _ in self.steps]
        for name, i in last.items():
            if name not in keep:
                self.release[i].append(name)
        # outputs nobody reads (optional ones) are dropped right away too
        for i, n in enumerate(self.steps):
            for o in n.outputs:
                if o and o not in last and o not in keep:
                    self.release[i].append(o)
        self._compile()

    def _compile(self):
        graph = self.graph
        slots = {"": 0}

        def slot(name):
            return slots.setdefault(name, len(slots))

        for name in graph.consts:
            slot(name)
        self.feeds = tuple((v.name, slot(v.name)) for v in graph.inputs)
        program = []
        for i, n in enumerate(self.steps):
            ins = tuple(slot(name) for name in n.inputs)
            # an omitted output gets a slot of its own, released at once
            outs = tuple(slot(o or f"\0{i}.{k}") for k, o in enumerate(n.outputs))
            dropped = [o for k, o in enumerate(outs) if not n.outputs[k]]
            rel = tuple(slot(name) for name in self.release[i]) + tuple(dropped)
            program.append((bound_handler(n), ins, outs, rel))
        self.program = tuple(program)
        self.results = {name: slot(value) for name, value in graph.aliases.items()}
        self.initial = [None] * len(slots)
        for name, value in graph.consts.items():
            self.initial[slots[name]] = value


def bound_handler(node):
    """``fn(*inputs)``: the node's handler with the node (and its prepared
    ``state=``) bound; returns what the handler returns."""
    if node.spec.prepare is not None:
        return functools.partial(node.spec.run, node, state=node.state)
    return functools.partial(node.spec.run, node)


def fold_shapes(graph, shapes):
    """Shape nodes of values whose shapes are known (``shapes``: name ->
    tuple of ints) become constants; returns the rewrite log."""
    log = []
    keep = []
    for n in graph.nodes:
        if n.op_type == "Shape" and n.domain == "" and n.inputs[0] in shapes:
            shp = np.array(shapes[n.inputs[0]], np.int64)
            start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
            graph.consts[n.outputs[0]] = shp[start:end] if n.opset >= 15 else shp
            graph.dtypes[n.outputs[0]] = np.dtype(np.int64)
            log.append(f"Shape {n.name!r} folded for this input shape")
            continue
        keep.append(n)
    graph.nodes = keep
    return log
