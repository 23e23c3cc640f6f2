"""Elementwise fusion: one kernel per expression, with an optional reduction.

``nbops.fuse(fn)`` traces ``fn`` once per kind of arguments with symbolic
placeholders: Python operators, the NumPy ufuncs listed below, ``np.where``
and the nbops activations record an expression tree instead of computing.
The tree becomes Python source for one CPU kernel (parallel ``njit``) or one
CUDA kernel, written to a file in nbops' cache directory so that Numba's
on-disk cache holds across processes. Kernels are cached per dtype, device,
reduction and broadcast pattern; each call then makes a single pass over its
inputs, with no temporaries.

Broadcasting follows NumPy: every array argument is viewed with stride 0 on
its broadcast axes, and axes that every operand walks alike are merged, so a
contiguous ``(x + y) * z`` runs as one flat loop and ``x[:, None] * y`` as a
2-D loop whose inner operand is hoisted. Strided and negatively strided views
are read in place.

Supported inside ``fn``:

* ``+ - * / **``, unary ``-`` and ``abs()``, comparisons ``< <= > >= == !=``
  (a comparison used as a number is 1.0 or 0.0);
* ``np.where``, ``np.exp``, ``np.log``, ``np.tanh``, ``np.sqrt``, ``np.abs``,
  ``np.maximum``, ``np.minimum`` (NaN-propagating, as NumPy's),
  ``np.add``/``subtract``/``multiply``/``divide``/``power``/``negative`` and the
  comparison ufuncs, ``scipy.special.erf``;
* the nbops activations (``nbops.relu``, ``nbops.gelu(x, approximate="tanh")``,
  ``nbops.softplus(x, beta=2.0)``, ...) and their backward functions (except
  ``swish_backward``), with constant parameters, and the nbops arithmetic
  ops ``add``, ``sub``, ``mul``, ``div``, ``pow``, ``neg``, ``exp``, ``log``;
* Python numbers, and scalar arguments (which take the arrays' dtype, as
  NumPy 2 does).

Anything else (``np.sin``, indexing, ``if x > 0``, arrays captured from the
enclosing scope, ``np.sum``) raises ``TypeError`` naming the construct.
"""

import functools
import inspect
import numbers

import numpy as np

from . import _checks, _dispatch, _layout, _spec

__all__ = ["fuse", "Fused"]

FAMILY = _spec.mirror("fusion")

REDUCTIONS = ("sum", "mean", "max")

# ---------------------------------------------------------------------------
# Expression trees

# name -> (arity, source template); {0}, {1}, {2} are the operands' code.
_UNARY = {"neg": "(-{0})", "abs": "abs({0})", "exp": "exp({0})", "log": "log({0})",
          "tanh": "tanh({0})", "sqrt": "sqrt({0})", "erf": "erf({0})"}
_ARITH = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
          "div": "({0} / {1})", "pow": "({0} ** {1})", "maximum": "maximum({0}, {1})",
          "minimum": "minimum({0}, {1})"}
_COMPARE = {"lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})",
            "ge": "({0} >= {1})", "eq": "({0} == {1})", "ne": "({0} != {1})"}
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "lt": "<",
           "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}

_UFUNCS = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div",
    "true_divide": "div", "power": "pow", "float_power": "pow", "negative": "neg",
    "positive": "pos", "absolute": "abs", "fabs": "abs", "exp": "exp", "log": "log",
    "tanh": "tanh", "sqrt": "sqrt", "maximum": "maximum", "minimum": "minimum",
    "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge",
    "equal": "eq", "not_equal": "ne", "erf": "erf",
}

# nbops activations usable in expressions: op name -> (formula, parameter names).
# Backward formulas take (grad, saved) as their two array operands.
_ACTIVATIONS = {
    "relu": ("relu", ()), "leaky_relu": ("leaky_relu", ("negative_slope",)),
    "sigmoid": ("sigmoid", ()), "tanh": ("tanh", ()), "gelu": ("gelu", ()),
    "silu": ("silu", ()), "swish": ("swish", ("beta",)),
    "softplus": ("softplus", ("beta", "threshold")), "elu": ("elu", ("alpha",)),
    "hardswish": ("hardswish", ()), "hardtanh": ("hardtanh", ("min_val", "max_val")),
}
_ACTIVATIONS.update({k + "_backward": (f + "_backward", p) for k, (f, p) in
                     _ACTIVATIONS.items() if k != "swish"})
#: nbops arithmetic operators that are nodes of their own (nbops.add(x, y) == x + y).
_NBOPS_ARITH = ("add", "sub", "mul", "div", "pow", "neg", "exp", "log")


class _Node:
    """One operation of the traced expression. ``kind`` is "f" (a float in the
    compute dtype) or "b" (a boolean). Nodes are hash-consed by ``key`` so a
    repeated sub-expression is computed once."""

    __slots__ = ("op", "args", "value", "kind", "key")

    def __init__(self, op, args=(), value=None, kind="f"):
        self.op, self.args, self.value, self.kind = op, tuple(args), value, kind
        self.key = (op, tuple(a.key for a in self.args), value)


class _Tracer:
    def __init__(self, name):
        self.name = name
        self.nodes = {}

    def node(self, op, args=(), value=None, kind="f"):
        n = _Node(op, args, value, kind)
        return self.nodes.setdefault(n.key, n)

    def lift(self, v, what):
        """A node for an operand: a Symbol of this trace or a Python number."""
        if isinstance(v, Symbol):
            if v._tracer is not self:
                raise TypeError(f"{self.name}: a value from another fused function leaked in")
            return v._node
        if isinstance(v, (bool, np.bool_)):
            return self.node("const", value=float(v))
        if isinstance(v, numbers.Real):
            return self.node("const", value=float(v))
        if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf":
            return self.node("const", value=float(v))
        if isinstance(v, np.ndarray) or _dispatch.is_device_array(v):
            raise TypeError(
                f"{self.name}: unsupported construct: an array captured from outside the "
                f"function ({_checks.describe(v)}) in {what}; pass it as an argument")
        raise TypeError(f"{self.name}: unsupported construct: {type(v).__name__} "
                        f"operand in {what}")

    def apply(self, op, *operands):
        args = [self.lift(v, _describe_op(op)) for v in operands]
        if op == "pos":
            return Symbol(self, args[0])
        if op in _COMPARE:
            return Symbol(self, self.node(op, args, kind="b"))
        return Symbol(self, self.node(op, args))


def _describe_op(op):
    return f"'{_SYMBOL[op]}'" if op in _SYMBOL else f"{op}()"


def _unsupported(what):
    def method(self, *args, **kwargs):
        raise TypeError(f"{self._tracer.name}: unsupported construct: {what}")

    return method


class Symbol:
    """Placeholder for an argument (or an intermediate value) while ``fuse``
    traces a function; it records operations instead of computing them."""

    __array_priority__ = 1000
    __hash__ = None
    #: routes nbops operator calls to __nbops_function__ (see nbops._dispatch)
    __nbops_tensor__ = True

    def __init__(self, tracer, node):
        self._tracer = tracer
        self._node = node

    def _binary(op, reflected=False):
        if reflected:
            return lambda self, other: self._tracer.apply(op, other, self)
        return lambda self, other: self._tracer.apply(op, self, other)

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __lt__, __le__, __gt__, __ge__ = _binary("lt"), _binary("le"), _binary("gt"), _binary("ge")
    __eq__, __ne__ = _binary("eq"), _binary("ne")
    del _binary

    def __neg__(self):
        return self._tracer.apply("neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return self._tracer.apply("abs", self)

    __bool__ = _unsupported("Python control flow on array values ('if', 'and', 'or', "
                            "'not', chained comparisons); use np.where")
    __float__ = __int__ = __index__ = _unsupported("conversion of an array value to a "
                                                   "Python number")
    __getitem__ = __setitem__ = _unsupported("indexing (fused expressions are elementwise)")
    __len__ = __iter__ = _unsupported("len() or iteration over an argument")
    __floordiv__ = __rfloordiv__ = _unsupported("'//' (floor division)")
    __mod__ = __rmod__ = _unsupported("'%' (modulo)")
    __matmul__ = __rmatmul__ = _unsupported("'@' (matrix product is not elementwise)")
    __and__ = __or__ = __xor__ = __invert__ = _unsupported("bitwise operators '& | ^ ~'")
    __array__ = _unsupported("conversion to a NumPy array (np.asarray)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TypeError(f"{self._tracer.name}: unsupported construct: attribute or "
                        f"method '.{name}' of an argument")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = self._tracer.name
        if method != "__call__":
            raise TypeError(f"{name}: unsupported construct: np.{ufunc.__name__}.{method} "
                            "(use fuse(..., reduce=...) for reductions)")
        if kwargs:
            raise TypeError(f"{name}: unsupported construct: keyword arguments "
                            f"{sorted(kwargs)} to np.{ufunc.__name__}")
        op = _UFUNCS.get(ufunc.__name__)
        if op is None:
            raise TypeError(f"{name}: unsupported construct: np.{ufunc.__name__} "
                            f"(supported: {', '.join(sorted(set(_UFUNCS)))})")
        return self._tracer.apply(op, *inputs)

    def __array_function__(self, func, types, args, kwargs):
        name = self._tracer.name
        if func is np.where and len(args) == 3 and not kwargs:
            t = self._tracer
            cond, a, b = (t.lift(v, "np.where()") for v in args)
            return Symbol(t, t.node("where", (cond, a, b)))
        if func is np.where:
            raise TypeError(f"{name}: unsupported construct: np.where needs exactly "
                            "three arguments (condition, x, y) in a fused expression")
        hint = " (use fuse(..., reduce=...) for reductions)" if func.__name__ in (
            "sum", "mean", "max", "amax") else ""
        raise TypeError(f"{name}: unsupported construct: np.{func.__name__}{hint}")

    def __nbops_function__(self, op, args, kwargs):
        """Called by ``Operator.__call__`` when an nbops operator gets a Symbol."""
        t = self._tracer
        spec = _ACTIVATIONS.get(op.name)
        if spec is None and op.name not in _NBOPS_ARITH:
            raise TypeError(f"{t.name}: unsupported construct: nbops.{op.name} (fusable "
                            f"nbops ops: {', '.join(sorted([*_ACTIVATIONS, *_NBOPS_ARITH]))})")
        try:
            bound = inspect.signature(op.front).bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{t.name}: nbops.{op.name}: {e}") from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        if values.pop("out", None) is not None:
            raise TypeError(f"{t.name}: unsupported construct: out= inside a fused "
                            f"expression (nbops.{op.name})")
        if spec is None:
            return t.apply(op.name, *values.values())
        formula, names = spec
        if op.name in ("gelu", "gelu_backward"):
            approx = _checks.choice(op.name, "approximate", values.pop("approximate"),
                                    ("none", "tanh"))
            formula = formula.replace("gelu", "gelu_tanh" if approx == "tanh" else "gelu")
        params = []
        for p in names:
            v = values.pop(p)
            if isinstance(v, Symbol):
                raise TypeError(f"{t.name}: unsupported construct: array-valued parameter "
                                f"'{p}' of nbops.{op.name}; parameters must be numbers")
            params.append(v if op.name.startswith("hardtanh") else _checks.scalar(op.name, p, v))
        if op.name.startswith("hardtanh"):  # bounds may be infinite, in order
            params = list(_checks.bounds(op.name, *(x for pair in zip(names, params)
                                                    for x in pair)))
        if op.name.startswith("softplus"):
            _checks.scalar(op.name, "beta", params[0], low=0.0, low_open=True)
        operands = [t.lift(v, f"nbops.{op.name}()") for v in values.values()]
        return Symbol(t, t.node("act", operands, value=(formula, tuple(params))))


def _trace(fn, name, kinds):
    """The expression tree of ``fn`` for arguments of ``kinds`` ("a" array,
    "s" scalar), as its root node."""
    tracer = _Tracer(name)
    symbols = [Symbol(tracer, tracer.node("in" if k == "a" else "scalar", value=i))
               for i, k in enumerate(kinds)]
    result = fn(*symbols)
    if isinstance(result, (tuple, list)):
        raise TypeError(f"{name}: unsupported construct: fn returned a {type(result).__name__};"
                        " a fused function returns one expression")
    return tracer.lift(result, "the return value")


def _walk(root):
    """The nodes under ``root`` in dependency order, each once."""
    order, seen = [], set()

    def visit(n):
        if n.key in seen:
            return
        seen.add(n.key)
        for a in n.args:
            visit(a)
        order.append(n)

    visit(root)
    return order


def _render(node, names):
    """Readable form of an expression, for names and error messages."""
    if node.op == "in" or node.op == "scalar":
        return names[node.value]
    if node.op == "const":
        return repr(node.value).replace(".0", "") if node.value == int(node.value) \
            else repr(node.value)
    args = [_render(a, names) for a in node.args]
    if node.op in _SYMBOL:
        return f"({args[0]} {_SYMBOL[node.op]} {args[1]})"
    if node.op == "neg":
        return f"-{args[0]}"
    if node.op == "act":
        formula, params = node.value
        extra = "".join(f", {p:g}" for p in params)
        return f"{formula}({', '.join(args)}{extra})"
    return f"{node.op}({', '.join(args)})"


# ---------------------------------------------------------------------------
# Code generation (device-neutral): statements over named operands


class Program:
    """An expression compiled to straight-line statements.

    ``lines`` assign ``e0, e1, ...``; array operand ``i`` is read as ``x{i}``
    by the kernel template; constants and scalar arguments are ``K[j]``;
    ``C`` is the :class:`nbops._formulas.Consts` of the dtype; ``result`` is
    the final value's name and ``kind`` its kind ("f" or "b"). ``names`` are
    the helper functions used, which the device module provides.
    """

    def __init__(self, root, n_args):
        self.lines, self.names, self.consts = [], set(), []
        self.scalar_slots = {}
        self.arrays = sorted({n.value for n in _walk(root) if n.op == "in"})
        code = {}
        for n in _walk(root):
            code[n.key] = self._emit(n, [code[a.key] for a in n.args],
                                     [a.kind for a in n.args])
        self.result, self.kind = code[root.key], root.kind
        self.n_args = n_args

    def _const(self, value):
        if value not in self.consts:
            self.consts.append(value)
        return f"K[{self.consts.index(value)}]"

    def _float(self, code, kind):
        return f"(C.one if {code} else C.zero)" if kind == "b" else code

    def _emit(self, n, args, kinds):
        op = n.op
        if op == "in":
            return f"x{n.value}"
        if op == "scalar":
            slot = self.scalar_slots.setdefault(n.value, ("scalar", n.value))
            return self._const(slot)
        if op == "const":
            return self._const(n.value)
        if op == "where":
            cond = args[0] if kinds[0] == "b" else f"({args[0]} != C.zero)"
            expr = f"({self._float(args[1], kinds[1])} if {cond} else " \
                   f"{self._float(args[2], kinds[2])})"
        elif op == "act":
            formula, params = n.value
            self.names.add("act_" + formula)
            p = [self._const(v) for v in params] + ["C.zero"] * (2 - len(params))
            fargs = ", ".join(self._float(a, k) for a, k in zip(args, kinds))
            expr = f"act_{formula}({fargs}, ({p[0]}, {p[1]}), C)"
        elif op == "pow" and n.args[1].op == "const" and n.args[1].value in (
                -1.0, 0.5, 1.0, 2.0, 3.0, 4.0):
            # NumPy computes x**2 as x*x; small powers must not go through libm pow
            base, e = self._float(args[0], kinds[0]), n.args[1].value
            expr = {-1.0: f"(C.one / {base})", 0.5: f"sqrt({base})", 1.0: base,
                    2.0: f"({base} * {base})", 3.0: f"({base} * {base} * {base})",
                    4.0: f"(({base} * {base}) * ({base} * {base}))"}[e]
            if e == 0.5:
                self.names.add("sqrt")
        else:
            template = _UNARY.get(op) or _ARITH.get(op) or _COMPARE[op]
            expr = template.format(*(self._float(a, k) for a, k in zip(args, kinds)))
            head = template.split("(")[0]
            if head and head != "abs":
                self.names.add(head)
        name = f"e{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        return name

    def accumulate(self, reduce, target="acc"):
        """Statements folding the result into ``target``: a sum (comparisons
        count 1.0 or 0.0), or for "max" a NaN-propagating maximum."""
        v = self.result if self.kind == "f" else f"(C.one if {self.result} else C.zero)"
        if reduce == "max":
            return [f"v = {v}", f"{target} = v if (v > {target}) | (v != v) else {target}"]
        return [f"{target} += {v}"]

    def constants(self, dtype, scalars):
        """The ``K`` tuple for a call: constants and scalar arguments in ``dtype``."""
        t = np.dtype(dtype).type
        return tuple(t(scalars[v[1]]) if isinstance(v, tuple) else t(v) for v in self.consts)


# ---------------------------------------------------------------------------
# Layout: operands as (flat base, element offset, element strides)


class Operand:
    """An array input as the kernels read it: ``base[offset + sum(i_d * strides[d])]``
    over the collapsed iteration space, with stride 0 on broadcast axes."""

    __slots__ = ("base", "offset", "strides")

    def __init__(self, base, offset, strides):
        self.base, self.offset, self.strides = base, offset, strides


def _broadcast_strides(x, shape):
    """Element strides of ``x`` broadcast to ``shape`` (0 on broadcast axes)."""
    item = x.dtype.itemsize
    lead = len(shape) - x.ndim
    st = [0] * lead
    for n, s, full in zip(x.shape, x.strides, shape[lead:]):
        if s % item:
            raise ValueError(f"strides {tuple(x.strides)} are not multiples of the item size")
        st.append(0 if n == 1 and full != 1 else s // item)
    return st


def _flat_base(x, shape, strides):
    """A 1-D contiguous view from the lowest address ``x`` touches, and the
    element offset of ``x``'s first element in it."""
    if _layout.is_c_contiguous(x):
        return x.reshape(-1) if x.ndim != 1 else x, 0
    low = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0)
    span = 1 + sum(abs(s) * (n - 1) for s, n in zip(strides, shape))
    item = x.dtype.itemsize
    return _layout.strided_view(x, (span,), (item,), low * item), -low


class Plan:
    """One call's iteration space: the collapsed ``shape``, the ``operands``,
    the output's element ``out_strides`` (0 along reduced axes) and ``axis``,
    the collapsed position of the reduced axis (None: map or full reduction)."""

    __slots__ = ("shape", "operands", "out_strides", "axis")


def plan(arrays, full_shape, reduce_axis, reduce_all):
    """Collapse the broadcast iteration space of ``arrays`` over ``full_shape``."""
    strides = [_broadcast_strides(x, full_shape) for x in arrays]
    if reduce_all:
        out_st = [0] * len(full_shape)
    else:
        out_shape = [n for d, n in enumerate(full_shape) if d != reduce_axis]
        c = list(_layout._c_strides(out_shape, 1)) if out_shape else []
        if reduce_axis is not None:
            c.insert(reduce_axis, 0)
        out_st = c
    if not full_shape:
        shape, collapsed = (1,), [(0,)] * (len(arrays) + 1)
    else:
        shape, collapsed = _layout.collapse(tuple(full_shape), tuple(out_st),
                                            *[tuple(s) for s in strides])
    p = Plan()
    p.shape = shape
    p.out_strides = collapsed[0]
    p.axis = None
    if reduce_axis is not None and not reduce_all:
        zero = [d for d, s in enumerate(p.out_strides) if s == 0 and shape[d] > 1]
        p.axis = zero[0] if zero else None
    p.operands = []
    for x, st in zip(arrays, strides):
        base, off = _flat_base(x, full_shape, st)
        p.operands.append(Operand(base, off, None))
    for op, st in zip(p.operands, collapsed[1:]):
        op.strides = st
    return p


# ---------------------------------------------------------------------------
# The public entry point


class Fused:
    """A compiled elementwise expression (made by :func:`fuse`); call it with
    the arguments of ``fn`` and an optional ``out=``."""

    def __init__(self, fn, reduce=None, axis=None, name=None):
        self.fn = fn
        self.reduce = reduce
        self.axis = axis
        self.name = name or f"fuse[{getattr(fn, '__name__', 'fn')}]"
        self._traces = {}
        self.operator = _dispatch.Operator(self.name, self._front)
        self.operator.__doc__ = f"Fused kernel of {self.name}."
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, out=None):
        return self.operator(*args, out=out)

    def __repr__(self):
        red = f", reduce={self.reduce!r}, axis={self.axis!r}" if self.reduce else ""
        return f"<nbops fused {self.name}{red}>"

    def trace(self, kinds):
        """``(root node, Program)`` of ``fn`` for argument kinds ("a"/"s")."""
        got = self._traces.get(kinds)
        if got is None:
            root = _trace(self.fn, self.name, kinds)
            got = self._traces[kinds] = (root, Program(root, len(kinds)))
        return got

    def expression(self, *args):
        """The traced expression as text, e.g. ``'((x0 + x1) * x2)'``."""
        kinds = tuple("a" if _is_array(a) else "s" for a in args)
        root, _ = self.trace(kinds)
        return _render(root, [f"x{i}" for i in range(len(kinds))])

    def _front(self, *args, out=None):
        op = self.name
        if not args:
            raise TypeError(f"{op}: no arguments; pass the arrays and scalars of fn")
        kinds, arrays, named = [], [], {}
        args = list(args)
        for i, a in enumerate(args):
            if _is_array(a):
                a = args[i] = _checks.array(op, f"args[{i}]", a)
                kinds.append("a")
                arrays.append(a)
                named[f"args[{i}]"] = a
            elif isinstance(a, numbers.Real) and not isinstance(a, (bool, np.bool_)):
                kinds.append("s")
            else:
                raise TypeError(f"{op}: argument {i} must be an array or a real number, "
                                f"got {_checks.describe(a)}")
        if not arrays:
            raise TypeError(f"{op}: at least one argument must be an array")
        _checks.same_dtype(op, **named)
        dtype = arrays[0].dtype
        device = _dispatch.resolve_device(op, out=out, **named)
        try:
            full = tuple(np.broadcast_shapes(*[tuple(a.shape) for a in arrays]))
        except ValueError:
            shapes = ", ".join(f"{n} {tuple(a.shape)}" for n, a in named.items())
            raise ValueError(f"{op}: shapes cannot be broadcast together: {shapes}") from None
        kinds = tuple(kinds)
        root, prog = self.trace(kinds)
        reduce_all = self.reduce is not None and self.axis is None
        axis = None
        if self.reduce is not None and self.axis is not None:
            axis = _checks.axis(op, "axis", self.axis, max(len(full), 1)) if full else None
            if not full:
                raise ValueError(f"{op}: axis={self.axis} given but the arguments are scalars "
                                 "(0-d)")
        if self.reduce is None:
            out_shape, out_dtype = full, (np.dtype(bool) if prog.kind == "b" else dtype)
        elif reduce_all:
            out_shape, out_dtype = (), dtype
        else:
            out_shape, out_dtype = full[:axis] + full[axis + 1:], dtype
        size = int(np.prod(full)) if full else 1
        if self.reduce == "max" and (size == 0 if reduce_all else full[axis] == 0):
            raise ValueError(f"{op}: max of an empty extent (shape {full}) has no identity")
        if out is not None or not reduce_all:
            out = _checks.output(op, out, out_shape, out_dtype, device,
                                 {n: a for n, a in named.items()})
        scalars = {i: a for i, a in enumerate(args) if kinds[i] == "s"}
        layout = plan([arrays[kinds[:i].count("a")] for i in prog.arrays], full, axis,
                      reduce_all)
        result = FAMILY.kernel("run", device)(
            prog, self.reduce, layout, size, out, dtype, prog.constants(dtype, scalars))
        if _dispatch._Hooks.debug:
            self._debug_check(root, args, kinds, full)
        return result

    def _debug_check(self, root, args, kinds, full):
        """Debug mode: re-evaluate the expression node by node on the host and
        raise at the first node that makes a NaN or Inf from finite operands."""
        values = {}
        for n in _walk(root):
            got = _evaluate(n, [values[a.key] for a in n.args], args, full)
            values[n.key] = got
            if n.op in ("in", "scalar", "const") or n.kind == "b":
                continue
            ins = [values[a.key] for a in n.args]
            for what, test in (("NaN", np.isnan), ("Inf", np.isinf)):
                bad = test(got)
                for v in ins:
                    bad &= ~test(v)
                if bad.any():
                    idx = tuple(int(i) for i in np.argwhere(bad)[0])
                    names = [f"x{i}" for i in range(len(args))]
                    raise FloatingPointError(
                        f"{self.name}: {_render(n, names)} produced {what} at index {idx} "
                        f"of the broadcast shape {full} although its operands were "
                        f"finite there, in {_render(root, names)} (nbops debug mode)")


def _evaluate(n, ins, args, full):
    """Value of node ``n`` over the broadcast shape, on the host, in NumPy
    (activations through their registered CPU kernels)."""
    if n.op == "in":
        x = np.asarray(_dispatch.to_host(args[n.value]))
        return np.broadcast_to(x, full)
    if n.op in ("scalar", "const"):
        dtype = next(np.asarray(_dispatch.to_host(a)).dtype for a in args if _is_array(a))
        v = args[n.value] if n.op == "scalar" else n.value
        return np.full(full, v, dtype)
    ins = [v.astype(ins[-1].dtype if ins[-1].dtype != bool else ins[0].dtype)
           if v.dtype == bool and n.op != "where" else v for v in ins]
    with np.errstate(all="ignore"):
        if n.op == "act":
            formula, params = n.value
            dtype = ins[0].dtype
            from . import _formulas

            x = [np.ascontiguousarray(v) for v in ins]
            return _dispatch.kernel("activations." + formula, _dispatch.CPU)(
                *x, np.empty(full, dtype), _formulas.params(dtype, *params),
                _formulas.consts(dtype))
        if n.op == "where":
            return np.where(ins[0], ins[1], ins[2])
        if n.op == "erf":
            from scipy.special import erf

            return erf(ins[0])
        ufunc = {"neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log,
                 "tanh": np.tanh, "sqrt": np.sqrt, "add": np.add, "sub": np.subtract,
                 "mul": np.multiply, "div": np.divide, "pow": np.power,
                 "maximum": np.maximum, "minimum": np.minimum, "lt": np.less,
                 "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                 "eq": np.equal, "ne": np.not_equal}[n.op]
        return ufunc(*ins)


def _is_array(a):
    return isinstance(a, np.ndarray) or _dispatch.is_device_array(a)


# ---------------------------------------------------------------------------
# Declaration

#: ``fuse`` takes a function to trace and returns a compiled one, so no
#: sample of arrays can call it, and no backward: the op table runs its bad
#: calls only (tests/test_fusion.py checks the functions it makes).
SPEC = _spec.OpSpec(
    "fuse", FAMILY, ("run",), out=False,
    exempt="takes a function and returns a compiled one: tests/test_fusion.py checks those",
    bad=lambda dtype: [_spec.Bad(*b) for b in (
        ((3,), {}, TypeError, "fn must be callable"),
        ((abs,), dict(reduce="min"), ValueError, "'reduce' must be one of 'sum', 'mean', 'max'"),
        ((abs,), dict(reduce="sum", axis=1.0), TypeError, "'axis' must be an int, got float"),
        ((abs,), dict(axis=1), ValueError, "'axis' needs a reduction"),
        ((abs,), dict(name=3), TypeError, "'name' must be a str"))])


@_dispatch.operator(SPEC)
def fuse(fn=None, reduce=None, axis=None, name=None):
    """Compile the elementwise function ``fn`` into one kernel per device.

    Parameters
    ----------
    fn : callable
        ``fn(*args)`` built from the operations listed in :mod:`nbops.fusion`
        (arithmetic, comparisons, ``np.where``, ``np.exp``/``log``/``tanh``/
        ``sqrt``/``abs``/``maximum``/``minimum``, ``scipy.special.erf``, nbops
        activations). Usable as a decorator, bare or with arguments.
    reduce : {None, "sum", "mean", "max"}
        Fuse a reduction of the result: sums and means accumulate in float64
        and are rounded to the arrays' dtype once; max propagates NaN.
    axis : int, optional
        Reduce along this axis of the broadcast shape (negative counts from
        the end); None reduces over all elements and returns a NumPy scalar.
    name : str, optional
        Name in the profiler and in errors (default ``"fuse[<fn name>]"``).

    Returns
    -------
    Fused
        Call it with float32 or float64 arrays of one dtype (NumPy arrays or
        device arrays, not mixed; shapes broadcast as in NumPy) and Python
        scalars, plus an optional C-contiguous ``out=`` of the result's shape
        and dtype (bool when the expression is a comparison). Each call
        returns a new array (or ``out``), or a scalar for ``axis=None``
        reductions.

    Raises
    ------
    TypeError
        at the first call with an unsupported construct (named in the
        message), for arguments that are not float arrays or numbers, mixed
        dtypes or devices; ValueError for shapes that do not broadcast, an
        axis out of range, a bad ``out=`` or the max of an empty extent.

    Example
    -------
    >>> import numpy as np, nbops as nb
    >>> f = nb.fuse(lambda x, y, z: (x + y) * z, reduce="sum")
    >>> x = np.ones(1000, np.float32)
    >>> f(x, x, x)
    np.float32(2000.0)
    """
    if fn is None:
        return lambda f: fuse(f, reduce=reduce, axis=axis, name=name)
    if not callable(fn):
        raise TypeError(f"fuse: fn must be callable, got {_checks.describe(fn)}")
    if reduce is not None:
        _checks.choice("fuse", "reduce", reduce, REDUCTIONS)
    if axis is not None:
        axis = _checks.int_arg("fuse", "axis", axis)
    if axis is not None and reduce is None:
        raise ValueError("fuse: argument 'axis' needs a reduction (reduce='sum', 'mean' "
                         "or 'max')")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"fuse: argument 'name' must be a str, got {_checks.describe(name)}")
    return Fused(fn, reduce, axis, name)
