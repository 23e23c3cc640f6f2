"""Reverse-mode automatic differentiation for nbops: Function, Tensor, gradcheck.

A :class:`Tensor` wraps a NumPy or device array. Calling any nbops operator
(or a :class:`Function`) on tensors that require grad records one node of a
graph; ``loss.backward()`` walks it in reverse topological order and leaves
gradients in the leaves' ``.grad``. On plain arrays nothing is recorded and
the operators run as they always do.

Two ways to make something differentiable:

* an nbops operator (built-in or ``nbops.register_op``) with a backward rule
  ``rule(ctx, *grads)`` returning one gradient per forward parameter, in
  signature order (trailing ones may be omitted, None = no gradient), with
  ``ctx.inputs``/``ctx.kwargs``/``ctx.output``/``ctx.needs_input_grad``;
* a :class:`Function` subclass with static ``forward(ctx, *args)`` and
  ``backward(ctx, *grad_outputs)``, as in PyTorch.

Design notes (tinygrad/micrograd style): a graph node holds the context, the
backward callable and the parents that need a gradient, nothing else; the
walk is iterative (no recursion limit on deep graphs) and frees each node
after use unless ``retain_graph=True``. Every tensor carries a version
counter bumped by in-place changes made through the Tensor API (``+=``,
item assignment, optimizer steps, ``.data = ...``); a saved tensor whose
version changed raises instead of yielding a wrong gradient. Changing the
*array* behind a tensor directly (``t.data[0] = 1``) bypasses the counter.
"""

import inspect
import numbers

import numpy as np

from . import _dispatch, arith
from ._dispatch import _has_tensor

__all__ = ["Function", "Tensor", "no_grad", "enable_grad", "is_grad_enabled", "gradcheck",
           "GradcheckError", "backward", "apply_operator"]


class _State:
    grad_enabled = True


def is_grad_enabled():
    """Whether operations on tensors are being recorded."""
    return _State.grad_enabled


class _GradMode:
    _mode = True

    def __enter__(self):
        self._prev = _State.grad_enabled
        _State.grad_enabled = self._mode
        return self

    def __exit__(self, *exc):
        _State.grad_enabled = self._prev
        return False

    def __call__(self, fn):
        """Use as a decorator: run ``fn`` in this mode."""
        mode = self._mode

        def wrapper(*args, **kwargs):
            with type(self)() if type(self)._mode == mode else self:
                return fn(*args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        wrapper.__doc__ = getattr(fn, "__doc__", None)
        return wrapper


class no_grad(_GradMode):
    """Context manager (or decorator) in which nothing is recorded: results
    of operations on tensors do not require grad.

    >>> with nbops.no_grad():
    ...     y = model(x)          # inference, no graph kept
    """

    _mode = False


class enable_grad(_GradMode):
    """Context manager (or decorator) that turns recording back on inside
    :class:`no_grad`."""

    _mode = True


def _is_tensor(v):
    return type(v) is not np.ndarray and getattr(v, "__nbops_tensor__", False)


def _is_array(v):
    return isinstance(v, np.ndarray) or _dispatch.is_device_array(v)


def _device(x):
    return _dispatch.device_of_array(x)


# ---------------------------------------------------------------------------
# Contexts and graph nodes


class Context:
    """What a :class:`Function`'s forward leaves for its backward.

    ``save_for_backward(*arrays)`` keeps arrays (inputs or outputs of the
    forward) and ``saved_tensors`` returns them, checking first that no saved
    tensor was modified in place since; ``needs_input_grad`` is a tuple of
    bools, one per forward input. Any other attribute may be set freely
    (shapes, flags, scalars).
    """

    def __init__(self):
        self.needs_input_grad = ()
        self._saved = ()
        self._versions = ()      # (what, tensor, version when saved)
        self._name = ""
        self._freed = False

    def save_for_backward(self, *values):
        self._saved = values

    @property
    def saved_tensors(self):
        if self._freed:
            raise RuntimeError(
                f"{self._name}: the saved tensors were freed by an earlier backward; "
                "call backward(retain_graph=True) the first time to backward twice")
        _check_versions(self._name, self._versions)
        return self._saved


class _PlainContext:
    """The context forward gets on plain arrays: saves nothing."""

    # indexable by any input position a forward may look up
    needs_input_grad = (False,) * 64

    def save_for_backward(self, *values):
        pass

    saved_tensors = ()


class OperatorContext:
    """The context an operator's backward rule receives: the forward's
    arguments bound to its signature (tensors unwrapped to arrays)."""

    __slots__ = ("inputs", "kwargs", "output", "needs_input_grad", "_name", "_versions",
                 "_freed")

    def __init__(self, name, inputs, kwargs, output, needs):
        self._name = name
        self.inputs = inputs
        self.kwargs = kwargs
        self.output = output
        self.needs_input_grad = needs
        self._versions = ()
        self._freed = False


def _check_versions(name, versions):
    for what, tensor, version in versions:
        if tensor._version != version:
            raise RuntimeError(
                f"{name}: {what} (shape {tuple(tensor.shape)}), saved for backward, was modified in "
                f"place afterwards (its version is {tensor._version}, "
                f"it was saved at version {version}); change it only after backward, or "
                "work on a copy")


class _Node:
    """One recorded call: how to get the inputs' gradients from the outputs'."""

    __slots__ = ("name", "backward", "ctx", "parents", "n_inputs", "exact", "outputs_meta",
                 "inputs_meta", "freed", "__weakref__")

    def __init__(self, name, backward, ctx, parents, n_inputs, exact):
        self.name = name
        self.backward = backward
        self.ctx = ctx
        self.parents = parents          # ((input position, Tensor), ...) needing grad
        self.n_inputs = n_inputs
        self.exact = exact              # Function: exactly one gradient per input
        self.inputs_meta = tuple((p, _meta(t.data)) for p, t in parents)
        self.outputs_meta = ()
        self.freed = False

    def __repr__(self):
        return f"<backward of {self.name}>"


def _meta(a):
    return tuple(a.shape), a.dtype, _device(a)


# ---------------------------------------------------------------------------
# Tensor


class Tensor:
    """An array (NumPy or device) that can record the operations applied to it.

    Parameters
    ----------
    data : ndarray, device array, or array-like
        Array-likes (lists, scalars) become NumPy arrays; arrays are wrapped
        without a copy.
    requires_grad : bool
        Leaves with ``requires_grad=True`` collect gradients in ``.grad``
        (float32/float64 only).

    Attributes: ``data`` (the array), ``grad`` (None or an array of data's
    shape, dtype and device, accumulated across backward calls),
    ``requires_grad``, ``is_leaf``, ``grad_fn``, ``shape``, ``dtype``,
    ``device`` ("cpu" or "cuda"). Arithmetic ``+ - * / ** @`` and unary
    ``-`` broadcast as NumPy does (scalars keep the tensor's dtype); ``sum``,
    ``mean``, ``exp``, ``log``, ``reshape``, ``transpose``/``T`` and
    indexing by ints and slices are differentiable too, and every nbops
    operator accepts tensors.

    Example
    -------
    >>> x = nbops.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    >>> y = (x * x).sum()
    >>> y.backward()
    >>> x.grad
    array([2., 4.])
    """

    __nbops_tensor__ = True
    # NumPy defers to Tensor in ``ndarray + Tensor`` (calls __radd__)
    __array_ufunc__ = None
    __slots__ = ("_data", "grad", "requires_grad", "_node", "_index", "_version", "__weakref__")

    def __init__(self, data, requires_grad=False):
        if _is_tensor(data):
            data = data.data
        elif not _is_array(data):
            data = np.asarray(data)
        if requires_grad and data.dtype not in (np.float32, np.float64):
            raise TypeError(f"Tensor: only float32/float64 tensors can require grad, "
                            f"got {data.dtype}")
        self._data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._node = None
        self._index = 0
        self._version = 0

    # -- the array and its description --------------------------------------
    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value):
        if _is_tensor(value):
            value = value.data
        if not _is_array(value):
            raise TypeError(f"Tensor.data must be an array, got {type(value).__name__}")
        self._data = value
        self._version += 1

    shape = property(lambda self: tuple(self._data.shape))
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: int(np.prod(self._data.shape)))
    device = property(lambda self: _device(self._data))
    is_leaf = property(lambda self: self._node is None)
    grad_fn = property(lambda self: self._node)
    T = property(lambda self: self.transpose())

    def __len__(self):
        return self._data.shape[0]

    def __repr__(self):
        extra = f", grad_fn={self._node!r}" if self._node is not None else \
            (", requires_grad=True" if self.requires_grad else "")
        if isinstance(self._data, np.ndarray):
            return f"Tensor({np.array2string(self._data, prefix='Tensor(')}{extra})"
        return f"Tensor(<{self.dtype} device array of shape {self.shape}>{extra})"

    def numpy(self):
        """A host copy of the data as a NumPy array."""
        return np.array(_dispatch.to_host(self._data), copy=True)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.size != 1:
            raise ValueError(f"item: tensor has {self.size} elements, expected 1")
        return np.asarray(_dispatch.to_host(self._data)).reshape(-1)[0].item()

    def detach(self):
        """A tensor sharing this one's array, outside any graph."""
        return Tensor(self._data)

    def requires_grad_(self, flag=True):
        """Set ``requires_grad`` on a leaf; returns self."""
        if not self.is_leaf:
            raise RuntimeError("requires_grad_: only leaf tensors can change requires_grad; "
                               "use .detach()")
        if flag and self.dtype not in (np.float32, np.float64):
            raise TypeError(f"requires_grad_: only float tensors can require grad, got "
                            f"{self.dtype}")
        self.requires_grad = bool(flag)
        return self

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``.

        ``grad`` (an array of self's shape and device) is the upstream
        gradient; it may be omitted for a one-element tensor (taken as 1).
        The graph is freed afterwards unless ``retain_graph``.
        """
        backward([self], None if grad is None else [grad], retain_graph=retain_graph)

    def to(self, device):
        """This tensor on ``device`` ("cpu" or "cuda"), differentiably; self
        when it is there already."""
        if device not in _dispatch.DEVICES:
            raise ValueError(f"Tensor.to: device must be 'cpu' or 'cuda', got {device!r}")
        return self if self.device == device else _ToDevice.apply(self, device)

    # -- differentiable operations ---------------------------------------------
    def __neg__(self):
        return arith.neg(self)

    def __matmul__(self, other):
        return _matmul(self, other)

    def __rmatmul__(self, other):
        return _matmul(other, self)

    def sum(self, axis=None, keepdims=False):
        return arith.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return arith.mean(self, axis, keepdims)

    def exp(self):
        return arith.exp(self)

    def log(self):
        return arith.log(self)

    def reshape(self, *shape):
        """A tensor of the same elements in ``shape`` (one -1 allowed); a
        view where the memory allows, else a copy."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        from .tensor import reshape

        return reshape(self, tuple(shape))

    def transpose(self, *axes):
        """The tensor with its axes permuted (reversed when none are given), a view."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return _Transpose.apply(self, tuple(axes) or tuple(range(self.ndim))[::-1])

    def __getitem__(self, index):
        return _GetItem.apply(self, index)

    # -- in-place changes (tracked by the version counter) -------------------
    def _inplace(self, symbol, fn, other):
        if _State.grad_enabled and (self.requires_grad or getattr(other, "requires_grad", False)):
            what = "a leaf tensor that requires grad" if self.is_leaf else \
                "a tensor that is part of a graph"
            raise RuntimeError(
                f"in-place '{symbol}' on {what}: do it under nbops.no_grad() (as "
                "optimizers do), or write it out of place (x = x + y) to record it")
        fn(self._data, other.data if _is_tensor(other) else other, out=self._data)
        self._version += 1
        return self

    def __setitem__(self, index, value):
        def put(data, v, out):
            arith.assign(arith.index_view(data, index), v)

        return self._inplace("x[...] =", put, value)

    def zero_(self):
        """Set every element to 0 in place; returns self."""
        return self._inplace("zero_", lambda data, _, out: arith.assign(
            data, arith.zeros((), data.dtype, _device(data))), None)


def _arithmetic_methods():
    """``+ - * / **``, their reflected and in-place forms, from one table."""

    def forward(op):
        return lambda self, other: op(self, other)

    def reflected(op):
        return lambda self, other: op(other, self)

    def inplace(op, symbol):
        return lambda self, other: self._inplace(symbol, op, other)

    for name, op, symbol in (("add", arith.add, "+="), ("sub", arith.sub, "-="),
                             ("mul", arith.mul, "*="), ("truediv", arith.div, "/="),
                             ("pow", arith.pow, "**=")):
        setattr(Tensor, f"__{name}__", forward(op))
        setattr(Tensor, f"__r{name}__", reflected(op))
        setattr(Tensor, f"__i{name}__", inplace(op, symbol))


_arithmetic_methods()


def _unwrap(v):
    """A tensor's array; a list/tuple with its tensors unwrapped (as ``cat``
    takes); anything else as it is."""
    if _is_tensor(v):
        return v.data
    if type(v) in (list, tuple) and any(_is_tensor(x) for x in v):
        return type(v)(_unwrap(x) for x in v)
    return v


def _tensors_in(position, v):
    """``(position, tensor)`` for a tensor argument, ``((position, k),
    tensor)`` for each tensor in a list/tuple argument."""
    if _is_tensor(v):
        return [(position, v)]
    if type(v) in (list, tuple):
        return [((position, k), x) for k, x in enumerate(v) if _is_tensor(x)]
    return []


def _label(position):
    return f"input {position}" if isinstance(position, int) else \
        f"input {position[0]}[{position[1]}]"


def _wrap_outputs(out, node):
    """Tensors for the array outputs of a forward (a single array or a tuple);
    other outputs (floats) pass through."""
    requires = node is not None
    many = isinstance(out, tuple)
    items = out if many else (out,)
    wrapped = []
    for k, o in enumerate(items):
        if _is_array(o):
            t = Tensor.__new__(Tensor)
            t._data, t.grad, t.requires_grad = o, None, requires
            t._node, t._index, t._version = node, k, 0
            wrapped.append(t)
        else:
            wrapped.append(o)
    if node is not None:
        node.outputs_meta = tuple(_meta(o) if _is_array(o) else None for o in items)
    return tuple(wrapped) if many else wrapped[0]


def _output_tensors(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if _is_tensor(o)]


# ---------------------------------------------------------------------------
# Function


class Function:
    """Base class of a differentiable operation written in Python.

    Subclass with two static methods::

        class Cube(nbops.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x ** 3                   # arrays in, arrays out

            @staticmethod
            def backward(ctx, grad):
                x, = ctx.saved_tensors
                return 3 * x ** 2 * grad        # one gradient per forward input

        y = Cube.apply(x)

    ``forward`` receives arrays (tensors unwrapped) and returns an array or a
    tuple of arrays; ``backward`` receives one gradient per output and
    returns one per positional forward input (None for inputs that need
    none; a single input's gradient may be returned bare). ``apply`` on
    plain arrays only runs forward; on tensors that require grad it records
    the call. Tensors that require grad must be passed positionally.
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("Function subclasses define a static forward(ctx, *args)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("Function subclasses define a static backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args, **kwargs):
        # the plain-array path: a type check per argument, then forward
        for a in args:
            if type(a) is not np.ndarray and getattr(a, "__nbops_tensor__", False):
                return _apply_function(cls, args, kwargs)
        if kwargs and _has_tensor((), kwargs):
            return _apply_function(cls, args, kwargs)
        return cls.forward(_PlainContext(), *args, **kwargs)


def _apply_function(cls, args, kwargs):
    name = cls.__name__
    for key, v in kwargs.items():
        if _is_tensor(v) and v.requires_grad:
            raise TypeError(f"{name}.apply: tensors that require grad must be passed "
                            f"positionally, got one as keyword '{key}'")
    _check_devices(name, args, kwargs)
    record = _State.grad_enabled and any(_is_tensor(a) and a.requires_grad for a in args)
    ctx = Context()
    ctx._name = name
    ctx.needs_input_grad = tuple(record and _is_tensor(a) and a.requires_grad for a in args)
    out = cls.forward(ctx, *[_unwrap(a) for a in args],
                      **{k: _unwrap(v) for k, v in kwargs.items()})
    if isinstance(out, list):
        out = tuple(out)
    if not record:
        return _wrap_outputs(out, None)
    parents = tuple((i, a) for i, a in enumerate(args) if _is_tensor(a) and a.requires_grad)
    node = _Node(name, cls.backward, ctx, parents, len(args), exact=True)
    wrapped = _wrap_outputs(out, node)
    # saved arrays -> the tensors they belong to, for the version check
    owners = [a for a in args if _is_tensor(a)] + _output_tensors(wrapped)
    ctx._versions = tuple((f"saved tensor {i}", t, t._version) for i, v in enumerate(ctx._saved)
                          for t in owners if t.data is v)
    return wrapped


def _check_devices(name, args, kwargs):
    found = {}
    for i, a in enumerate(list(args) + list(kwargs.values())):
        data = _unwrap(a)
        if _is_array(data):
            found.setdefault(_device(data), i)
    if len(found) > 1:
        raise TypeError(f"{name}: inputs are on different devices "
                        f"({', '.join(sorted(found))}); move them with "
                        "nbops.to_device()/to_host() (or Tensor.to) first")


# ---------------------------------------------------------------------------
# Operators: the tape entry point used by nbops._dispatch.Operator


class _OpSignature:
    """An operator front's signature, with what the fast binder needs when
    every parameter is positional-or-keyword or keyword-only (the built-in
    operators): names in order, defaults, and how many may come by
    position."""

    __slots__ = ("params", "names", "defaults", "index", "npos", "fast")

    def __init__(self, op):
        sig = inspect.signature(op.front)
        kinds = {p.kind for p in sig.parameters.values()}
        if kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            # a register_op front (*args, **kwargs): bind to the CPU kernel's signature
            try:
                cpu = _dispatch.kernel(_dispatch.user_kernel_key(op.name), _dispatch.CPU)
                sig = inspect.signature(getattr(cpu, "py_func", cpu))
            except (TypeError, ValueError, NotImplementedError):
                pass
        self.params = sig
        ps = list(sig.parameters.values())
        P = inspect.Parameter
        self.names = tuple(p.name for p in ps)
        self.defaults = tuple(p.default for p in ps)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.npos = sum(p.kind is P.POSITIONAL_OR_KEYWORD for p in ps)
        self.fast = all(p.kind is P.POSITIONAL_OR_KEYWORD for p in ps[:self.npos]) and \
            all(p.kind is P.KEYWORD_ONLY for p in ps[self.npos:])


def apply_operator(op, args, kwargs):
    """Run operator ``op`` on arguments that include tensors: unwrap them,
    call the front, and record a graph node when a gradient is needed.

    Called by :class:`nbops._dispatch.Operator` (never on plain arrays)."""
    info = op._function
    if info is None:
        info = op._function = _OpSignature(op)
    raw_args = [_unwrap(a) for a in args]
    raw_kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    record = _State.grad_enabled and any(
        t.requires_grad for v in (*args, *kwargs.values()) for _, t in _tensors_in(0, v))
    out = op.front(*raw_args, **raw_kwargs)
    if not record:
        return _wrap_outputs(out, None)
    inputs, named, tensors = _bind(op, info, args, kwargs)
    needs = [False] * len(inputs)
    for p, t in tensors:
        needs[p if isinstance(p, int) else p[0]] |= t.requires_grad
    ctx = OperatorContext(op.name, tuple(inputs), named, out, tuple(needs))
    parents = tuple((p, t) for p, t in tensors if t.requires_grad)
    node = _Node(op.name, op.backward or _no_backward(op.name), ctx, parents, len(inputs),
                 exact=False)
    wrapped = _wrap_outputs(out, node)
    checked = ([(_label(p), t) for p, t in tensors] if "inputs" in op.save else []) + \
        ([("its output", t) for t in _output_tensors(wrapped)] if "output" in op.save else [])
    ctx._versions = tuple((p, t, t._version) for p, t in checked)
    return wrapped


def _bind(op, info, args, kwargs):
    """``(inputs, named, tensors)``: the call's arguments in signature
    order, defaults filled in, tensors unwrapped; the same by name; and
    ``(position, tensor)`` of every tensor among them (see _tensors_in).

    Simple signatures bind here directly: ``inspect.Signature.bind`` and
    the walk over its result took 12 us of the 40 us that recording a
    small ``linear`` cost."""
    if info.fast and len(args) <= info.npos:
        values = list(args) + list(info.defaults[len(args):])
        for k, v in kwargs.items():
            i = info.index.get(k)
            if i is None or i < len(args):
                break       # unknown or given twice: the front accepted it, bind below
            values[i] = v
        else:
            if not any(v is inspect.Parameter.empty for v in values):
                inputs, tensors = [], []
                for i, v in enumerate(values):
                    if _is_tensor(v):
                        tensors.append((i, v))
                        v = v.data
                    elif type(v) in (list, tuple):
                        tensors.extend(_tensors_in(i, v))
                        v = _unwrap(v)
                    inputs.append(v)
                return inputs, dict(zip(info.names, inputs)), tensors
    return _bind_signature(op, info.params, args, kwargs)


def _bind_signature(op, sig, args, kwargs):
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        # the front accepted the call: bind positionally as given
        raw = list(args)
        return ([_unwrap(a) for a in raw], {k: _unwrap(v) for k, v in kwargs.items()},
                [pt for i, a in enumerate(raw) for pt in _tensors_in(i, a)])
    bound.apply_defaults()
    inputs, named, tensors = [], {}, []
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind == inspect.Parameter.VAR_KEYWORD:
            for k, v in value.items():
                if _is_tensor(v) and v.requires_grad:
                    raise TypeError(f"{op.name}: tensors that require grad must be passed as "
                                    f"named parameters, got one in **{name} as '{k}'")
                named[k] = _unwrap(v)
            continue
        for v in (value if kind == inspect.Parameter.VAR_POSITIONAL else (value,)):
            tensors.extend(_tensors_in(len(inputs), v))
            inputs.append(_unwrap(v))
        if kind != inspect.Parameter.VAR_POSITIONAL:
            named[name] = _unwrap(value)
    return inputs, named, tensors


def _no_backward(name):
    def rule(ctx, *grads):
        raise RuntimeError(f"{name}: this operator has no backward rule, so no gradient can "
                           "flow through it; call it on .detach()-ed tensors or under "
                           "nbops.no_grad()")

    return rule


# ---------------------------------------------------------------------------
# The backward walk


def backward(tensors, grad_tensors=None, retain_graph=False):
    """Accumulate gradients of ``tensors`` (with upstream ``grad_tensors``,
    one per tensor, None for an implicit 1 of a one-element tensor) into the
    leaves' ``.grad``. Several roots share one walk of the graph."""
    tensors = list(tensors)
    grads = [None] * len(tensors) if grad_tensors is None else list(grad_tensors)
    if len(grads) != len(tensors):
        raise ValueError(f"backward: got {len(tensors)} tensors but {len(grads)} gradients")
    delivered = _Delivered()
    pending = {}
    roots = []
    for t, g in zip(tensors, grads):
        g = _root_grad(t, g)
        delivered.add(g, external=True)
        if t._node is None:
            _accumulate_leaf(t, g, delivered)
        else:
            roots.append(t._node)
            _add_pending(pending, t._node, t._index, g)
    for node in reversed(_topological_order(roots)):
        out_grads = pending.pop(id(node), None)
        if node.freed:
            raise RuntimeError(
                f"{node.name}: trying to backward through the graph a second time (its "
                "saved values were freed by the first backward); pass retain_graph=True "
                "to the first backward call")
        if out_grads is not None and any(g is not None for g in out_grads):
            _run_node(node, out_grads, pending, delivered)
        if not retain_graph:
            node.freed = True
            node.ctx._freed = True
            node.ctx = None
            node.parents = ()


def _root_grad(t, g):
    if not _is_tensor(t):
        raise TypeError(f"backward: expected a Tensor, got {type(t).__name__}")
    if not t.requires_grad:
        raise RuntimeError(
            "backward: the tensor does not require grad (no input of the computation "
            "had requires_grad=True, or it was computed under no_grad)")
    if g is None:
        if t.size != 1:
            raise RuntimeError(
                f"backward: grad can be implied only for a one-element output; this one "
                f"has shape {t.shape}: pass grad= (an array of that shape)")
        return arith.add(arith.zeros(t.shape, t.dtype, t.device), 1.0)
    g = _unwrap(g)
    if not _is_array(g):
        raise TypeError(f"backward: grad must be an array, got {type(g).__name__}")
    if tuple(g.shape) != t.shape or g.dtype != t.dtype or _device(g) != t.device:
        raise ValueError(
            f"backward: grad must match the tensor ({t.dtype} of shape {t.shape} on "
            f"{t.device}), got {g.dtype} of shape {tuple(g.shape)} on {_device(g)}")
    return g


def _topological_order(roots):
    """Nodes reachable from ``roots``, each after all of its parents' nodes
    (iterative depth-first search: deep graphs need no recursion)."""
    order, seen = [], set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.parents))]
        while stack:
            node, parents = stack[-1]
            for _, p in parents:
                pn = p._node
                if pn is not None and id(pn) not in seen:
                    seen.add(id(pn))
                    stack.append((pn, iter(pn.parents)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _run_node(node, out_grads, pending, delivered):
    grads_in = [g if g is not None or meta is None else arith.zeros(*meta)
                for g, meta in zip(out_grads, node.outputs_meta)]
    _check_versions(node.name, node.ctx._versions)
    result = node.backward(node.ctx, *grads_in)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    n = len(result)
    extra_not_none = any(g is not None for g in result[node.n_inputs:])
    if extra_not_none or (node.exact and n < node.n_inputs):
        raise RuntimeError(
            f"{node.name}.backward returned {n} gradient(s), expected {node.n_inputs} "
            "(one per forward input, None where there is none; extra ones must be None)")
    for (pos, parent), (_, meta) in zip(node.parents, node.inputs_meta):
        g = _grad_at(node.name, result, pos)
        if g is None:
            continue
        g = _checked_grad(node.name, _label(pos)[len("input "):], g, meta)
        delivered.add(g)
        if parent._node is None:
            _accumulate_leaf(parent, g, delivered)
        else:
            _add_pending(pending, parent._node, parent._index, g)


def _grad_at(name, result, pos):
    """The gradient for parameter ``pos`` (or element ``pos[1]`` of the
    list/tuple parameter ``pos[0]``) among a backward's results."""
    if isinstance(pos, int):
        return result[pos] if pos < len(result) else None
    i, k = pos
    seq = result[i] if i < len(result) else None
    if seq is None:
        return None
    if not isinstance(seq, (list, tuple)) or k >= len(seq):
        raise RuntimeError(f"{name}.backward must return a list with one gradient per item "
                           f"of its list argument {i}, got {type(seq).__name__}")
    return seq[k]


def _checked_grad(name, pos, g, meta):
    shape, dtype, device = meta
    if _is_tensor(g):
        g = g.data
    if isinstance(g, numbers.Number) or isinstance(g, np.generic):
        if int(np.prod(shape)) != 1:
            raise RuntimeError(f"{name}.backward returned a scalar gradient for input {pos}, "
                               f"which has shape {shape}")
        g = np.full(shape, g, dtype)
        return g if device == _dispatch.CPU else _dispatch.to_device(g)
    if not _is_array(g):
        raise RuntimeError(f"{name}.backward returned a {type(g).__name__} as the gradient "
                           f"of input {pos}; expected an array or None")
    if tuple(g.shape) != shape:
        raise RuntimeError(f"{name}.backward returned a gradient of shape {tuple(g.shape)} "
                           f"for input {pos}, which has shape {shape}")
    if _device(g) != device:
        raise RuntimeError(f"{name}.backward returned a gradient on {_device(g)} for input "
                           f"{pos}, which is on {device}")
    if g.dtype != dtype:
        if device != _dispatch.CPU:
            raise RuntimeError(f"{name}.backward returned a {g.dtype} gradient for input {pos}, "
                               f"which is {dtype}")
        g = g.astype(dtype)
    return g


def _add_pending(pending, node, index, g):
    slots = pending.get(id(node))
    if slots is None:
        slots = pending[id(node)] = [None] * len(node.outputs_meta)
    slots[index] = g if slots[index] is None else arith.add(slots[index], g)


class _Delivered:
    """Arrays handed out during one backward. A leaf's ``.grad`` must not
    alias an array that is also somewhere else (``add``'s backward passes one
    gradient to both operands; the root gradient belongs to the caller), so
    such a gradient is copied once when it becomes a ``.grad``."""

    def __init__(self):
        self._keep = []          # keeps ids valid for the walk's duration
        self._count = {}
        self._external = set()

    def add(self, a, external=False):
        self._keep.append(a)
        self._count[id(a)] = self._count.get(id(a), 0) + 1
        if external:
            self._external.add(id(a))

    def shared(self, a):
        return id(a) in self._external or self._count.get(id(a), 0) > 1


def _accumulate_leaf(t, g, delivered):
    if t.grad is None:
        t.grad = _copy(g) if delivered.shared(g) else g
    else:
        t.grad = arith.add(t.grad, g)


def _copy(a):
    return a.copy() if isinstance(a, np.ndarray) else arith.expand(a, tuple(a.shape))


# ---------------------------------------------------------------------------
# Shape operations as Functions


def _matmul(a, b):
    from .linalg import matmul

    return matmul(a, b)


class _Transpose(Function):
    @staticmethod
    def forward(ctx, x, axes):
        ctx.inverse = tuple(np.argsort(axes))
        return arith.permute_view(x, axes)

    @staticmethod
    def backward(ctx, g):
        return arith.permute_view(g, ctx.inverse), None


class _GetItem(Function):
    @staticmethod
    def forward(ctx, x, index):
        ctx.meta, ctx.index = _meta(x), index
        return arith.index_view(x, index)

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.meta
        gx = arith.zeros(shape, dtype, device)
        arith.assign(arith.index_view(gx, ctx.index), g)
        return gx, None


class _ToDevice(Function):
    @staticmethod
    def forward(ctx, x, device):
        ctx.source = _device(x)
        return _dispatch.to_device(x) if device == _dispatch.CUDA else _dispatch.to_host(x)

    @staticmethod
    def backward(ctx, g):
        return (_dispatch.to_device(g) if ctx.source == _dispatch.CUDA else
                _dispatch.to_host(g)), None


# ---------------------------------------------------------------------------
# gradcheck


class GradcheckError(AssertionError):
    """Raised by :func:`gradcheck` when an analytic gradient is wrong."""


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0):
    """Compare the backward of ``fn`` with central finite differences.

    Parameters
    ----------
    fn : callable
        ``fn(*inputs)`` returning a Tensor or a tuple of Tensors (other
        outputs are ignored).
    inputs : sequence
        Tensors (those with ``requires_grad`` are checked), arrays or other
        arguments. Float inputs are promoted to float64 copies on their own
        device first, so the check measures the backward, not float32 noise.
    eps, atol, rtol : float
        Step of the differences and tolerance ``|a - n| <= atol + rtol |n|``.

    Every output is projected on a fixed random vector ``v`` (PyTorch's
    "fast mode"): one backward gives ``v^T J`` for all inputs, compared with
    ``(f(x + eps e_k) - f(x - eps e_k)) / 2 eps`` projected on ``v`` for every
    element ``k`` of every checked input.

    Returns True, or raises :class:`GradcheckError` naming the input index,
    the element index and the numerical and analytic values of the worst
    mismatch. Works for several inputs and outputs and on device arrays.

    Example
    -------
    >>> x = nbops.Tensor(np.random.rand(3, 4), requires_grad=True)
    >>> nbops.autograd.gradcheck(lambda t: (t * t).sum(axis=0), [x])
    True
    """
    base = [_as_float64(v) for v in inputs]
    checked = [i for i, v in enumerate(base) if _is_tensor(v) and v.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad")
    outputs = _tensor_outputs(fn, base, "gradcheck")
    rng = np.random.default_rng(seed)
    probes = [rng.standard_normal(o.shape) for o in outputs]
    for v in base:
        if _is_tensor(v):
            v.grad = None
    grads_out = [_like(p, o.data) for p, o in zip(probes, outputs)]
    differentiable = [(o, g) for o, g in zip(outputs, grads_out) if o.requires_grad]
    if differentiable:
        backward([o for o, _ in differentiable], [g for _, g in differentiable])
    worst = None
    for i in checked:
        analytic = np.zeros(base[i].shape) if base[i].grad is None else \
            np.asarray(_dispatch.to_host(base[i].grad), np.float64)
        numeric = _numerical(fn, base, i, probes, eps)
        err = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
        k = int(np.argmax(err)) if err.size else 0
        if err.size and err.reshape(-1)[k] > 0 and (worst is None or err.reshape(-1)[k] > worst[0]):
            idx = np.unravel_index(k, err.shape) if err.ndim else ()
            worst = (err.reshape(-1)[k], i, tuple(int(j) for j in idx),
                     numeric.reshape(-1)[k], analytic.reshape(-1)[k])
    if worst is not None:
        _, i, idx, num, ana = worst
        raise GradcheckError(
            f"gradcheck: gradient of input {i} is wrong at element {idx}: numerical "
            f"{num:.8g}, analytic {ana:.8g} (atol={atol}, rtol={rtol}; values are the "
            "output gradients projected on a random vector)")
    return True


def _as_float64(v):
    if _is_tensor(v):
        data = v.data
        if data.dtype in (np.float32, np.float64):
            data = _like(np.asarray(_dispatch.to_host(data), np.float64), data)
        return Tensor(data, requires_grad=v.requires_grad)
    if _is_array(v) and v.dtype in (np.float32, np.float64):
        return _like(np.asarray(_dispatch.to_host(v), np.float64), v)
    return v


def _like(host, ref):
    """``host`` (a NumPy array) on the device of ``ref``."""
    return host if _device(ref) == _dispatch.CPU else _dispatch.to_device(host)


def _tensor_outputs(fn, args, who):
    out = fn(*args)
    items = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [o for o in items if _is_tensor(o)]
    if not tensors:
        raise TypeError(f"{who}: fn must return a Tensor or a tuple of Tensors, got "
                        f"{type(out).__name__}")
    return tensors


def _numerical(fn, base, i, probes, eps):
    x0 = np.asarray(_dispatch.to_host(base[i].data), np.float64).copy()
    flat = x0.reshape(-1)
    result = np.zeros(flat.size)
    with no_grad():
        for k in range(flat.size):
            vals = []
            for step in (eps, -eps):
                x = x0.copy()
                x.reshape(-1)[k] += step
                args = list(base)
                args[i] = Tensor(_like(x, base[i].data))
                outs = _tensor_outputs(fn, args, "gradcheck")
                vals.append(sum(float(np.sum(np.asarray(_dispatch.to_host(o.data), np.float64)
                                             * p)) for o, p in zip(outs, probes)))
            result[k] = (vals[0] - vals[1]) / (2 * eps)
    return result.reshape(x0.shape)
