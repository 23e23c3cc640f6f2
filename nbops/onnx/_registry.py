"""The ONNX op table: one declaration per (op type, domain, opset range).

A handler module declares each operator once::

    @onnx_op("Relu", since=6)
    def relu(node, x):
        return nbops.relu(x)

    @onnx_op("Conv", since=1, prepare=pack_conv)
    def conv(node, x, w, b=None, *, state):
        ...

* ``node`` is the planner's :class:`Node`: ``name``, ``op_type``, ``domain``,
  ``inputs``/``outputs`` (value names), ``attrs`` (a dict of decoded Python
  values: ints, floats, strings, lists, NumPy arrays for tensors) and
  ``opset`` (the model's opset for the node's domain).
* Inputs arrive positionally, ``None`` for an omitted optional input.
* A handler returns one array or a tuple of arrays (one per output).
* ``prepare(node, consts)`` (optional) runs once at load time with the
  node's constant inputs (a list, ``None`` where an input is not constant)
  and returns a state object (pre-packed weights, parsed attributes), passed
  to the handler as ``state=``; it raises :class:`UnsupportedModelError` for
  an attribute or dtype the handler does not support.
* ``dtypes`` (optional): the element types (NumPy dtype names, e.g.
  ``("float32", "float64")``) the handler accepts on its first input; the
  planner refuses any other at load time, naming the node. ``None`` accepts
  any type the handler itself checks.
* The session passes ``state=`` only to handlers declared with a
  ``prepare``; a handler without one is called ``fn(node, *inputs)``.
* ``since``/``until`` bound the opset versions whose semantics the handler
  implements (inclusive); an op whose semantics changed gets one declaration
  per range (Softmax before and from 13, Clip before and from 11).
"""

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["OpSpec", "UnsupportedModelError", "onnx_op", "lookup", "supported_ops"]


class UnsupportedModelError(ValueError):
    """A model uses an operator, attribute or dtype nbops.onnx does not run
    (raised at load time, naming the node, its op type and opset)."""


@dataclass(frozen=True)
class OpSpec:
    op_type: str
    domain: str
    since: int
    until: Optional[int]
    run: Callable
    prepare: Optional[Callable] = None
    dtypes: Optional[tuple] = None

    def covers(self, opset):
        return self.since <= opset and (self.until is None or opset <= self.until)


_TABLE = {}


def onnx_op(op_type, since=1, until=None, *, domain="", prepare=None, dtypes=None):
    """Declares the handler of ``op_type`` for opsets ``since..until``."""

    def deco(fn):
        specs = _TABLE.setdefault((_norm_domain(domain), op_type), [])
        spec = OpSpec(op_type, _norm_domain(domain), since, until, fn, prepare,
                      None if dtypes is None else tuple(dtypes))
        for other in specs:
            if other.since <= (until or 10**9) and since <= (other.until or 10**9):
                raise ValueError(f"onnx_op: {op_type} opsets {since}..{until} overlap "
                                 f"{other.since}..{other.until}")
        specs.append(spec)
        return fn

    return deco


def lookup(op_type, domain, opset, node_name=""):
    """The spec that runs ``op_type`` of ``domain`` at ``opset``; raises
    :class:`UnsupportedModelError` naming the node when there is none."""
    _load_handlers()
    specs = _TABLE.get((_norm_domain(domain), op_type))
    where = f"node {node_name!r} " if node_name else ""
    if not specs:
        dom = f" (domain {domain!r})" if _norm_domain(domain) else ""
        raise UnsupportedModelError(
            f"nbops.onnx: {where}op {op_type}{dom} at opset {opset} is not supported")
    for spec in specs:
        if spec.covers(opset):
            return spec
    ranges = ", ".join(f"{s.since}..{s.until or 'latest'}" for s in specs)
    raise UnsupportedModelError(
        f"nbops.onnx: {where}op {op_type} at opset {opset} is not supported "
        f"(supported opsets: {ranges})")


def supported_ops():
    """``{(domain, op_type): [(since, until), ...]}`` of every declared handler."""
    _load_handlers()
    return {k: [(s.since, s.until) for s in v] for k, v in sorted(_TABLE.items())}


def _norm_domain(domain):
    return "" if domain in ("", "ai.onnx") else domain


_HANDLER_MODULES = ("nbops.onnx._ops", "nbops.onnx._ops_quant")
_loaded = False


def _load_handlers():
    global _loaded
    if _loaded:
        return
    import importlib

    for mod in _HANDLER_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real import error inside a handler module
                raise
    _loaded = True
