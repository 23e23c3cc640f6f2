"""Random-weight twins of ONNX models whose weights are constants.

The onnx wheel's "light" models build every weight with
``ConstantOfShape(0.02)``: their outputs are uniform and check little. A
twin replaces each such weight by seeded random values (initializers),
keeping the graph, so that fused and folded paths are compared on varied
numbers (tests and tools/bench_onnx.py).
"""

import numpy as np

__all__ = ["random_weight_twin"]


def random_weight_twin(model, seed=0, scale=None):
    """A copy of ``model`` (a ModelProto) whose ConstantOfShape weights are
    seeded random initializers of the same shape and dtype.

    Values are ``N(0, 1) * scale``; ``scale=None`` picks ``1/sqrt(fan_in)``
    per tensor (fan-in = the product of all but the first dim, 1 for 1-D),
    which keeps activations of deep CNNs in range. Batch-norm variances
    (a 1-D weight feeding a BatchNormalization's 5th input) are made
    positive.

    Example
    -------
    >>> twin = random_weight_twin(onnx.load("light_resnet50.onnx"))  # doctest: +SKIP
    """
    import onnx
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    variances = {n.input[4] for n in g.node if n.op_type == "BatchNormalization"
                 and len(n.input) > 4}
    keep, inits = [], []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and _static(g, node.input[0]):
            shape = _static(g, node.input[0])
            value = next((numpy_helper.to_array(a.t) for a in node.attribute
                          if a.name == "value"), np.zeros(1, np.float32))
            dtype = value.dtype
            if dtype.kind != "f":
                keep.append(node)
                continue
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            s = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
            arr = rng.standard_normal(shape) * s
            if node.output[0] in variances:
                arr = np.abs(arr) + 0.5
            inits.append(numpy_helper.from_array(arr.astype(dtype), node.output[0]))
            continue
        keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(inits)
    if m.ir_version < 4:
        # before IR 4 every initializer is also a graph input
        from onnx import helper

        for init in inits:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                         list(init.dims)))
    return m


def _static(graph, name):
    """The int64 shape held by initializer or Constant ``name``, else None."""
    from onnx import numpy_helper

    for init in graph.initializer:
        if init.name == name:
            return tuple(int(v) for v in numpy_helper.to_array(init).reshape(-1))
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    return tuple(int(v) for v in numpy_helper.to_array(a.t).reshape(-1))
    return None
