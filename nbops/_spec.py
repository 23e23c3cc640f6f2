"""Operator declarations: one :class:`OpSpec` per operator, as data.

A spec names the operator, where its kernels live (by module path, imported
on first use), its backward rule, its dtypes, the NumPy reference the tests
compare it with (by name: every reference lives in ``tests/``), sample
inputs with their edge cases, bad inputs with the error each must raise, and
its benchmark cases against a NumPy/SciPy baseline. Three readers:

* the registry (:func:`nbops._dispatch.operator` and ``register_op``)
  registers the kernels and the backward rule from it;
* the op test table (``tests/test_ops.py``) runs every spec's samples on
  both devices against the reference, through ``out=`` and strided views,
  checks the gradient and raises every bad input;
* ``nbops.bench`` builds its cases from the specs' :class:`Bench` entries.

Kernel keys follow one convention, ``"<family>.<kernel>"``, where the family
is the module pair of the mirror rule (``nbops/cpu/<family>.py`` and
``nbops/cuda/<family>.py``, or ``nbops/<family>/cpu.py`` and ``.../cuda.py``
for the subpackages) and the kernel is the attribute in those modules.

This module imports only the registry and builds nothing at import: specs
are cheap to declare, and their sample builders run only in the tests.
"""

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from . import _dispatch

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
FLOATS = (F32, F64)
#: dtypes that float-only operators must refuse with a TypeError
NOT_FLOAT = tuple(np.dtype(d) for d in (np.int64, np.bool_, np.complex128, np.float16,
                                        np.int8))


@dataclass(frozen=True)
class Family:
    """Where a family's kernels live: one module per device (the mirror rule).

    ``key(k)`` is the registry key of kernel ``k``, ``"<name>.<k>"``;
    ``path(k, device)`` its ``"module:attr"`` on that device (None where the
    family has no module for it).
    """

    name: str
    cpu: str
    cuda: Optional[str] = None

    def key(self, kernel):
        return f"{self.name}.{kernel}"

    def kernel(self, kernel, device):
        """Kernel ``kernel`` of this family on ``device``, imported on first use."""
        return _dispatch.kernel(self.key(kernel), device)

    def path(self, kernel, device):
        module = self.cpu if device == "cpu" else self.cuda
        return None if module is None else f"{module}:{kernel}"


def mirror(name):
    """The :class:`Family` of ``nbops/cpu/<name>.py`` and ``nbops/cuda/<name>.py``."""
    return Family(name, f"nbops.cpu.{name}", f"nbops.cuda.{name}")


def subpackage(name):
    """The :class:`Family` of ``nbops/<name>/cpu.py`` and ``nbops/<name>/cuda.py``."""
    return Family(name, f"nbops.{name}.cpu", f"nbops.{name}.cuda")


@dataclass(frozen=True)
class Sample:
    """One valid call: positional and keyword arguments (NumPy arrays, moved
    to the device under test by the tests) and a label for test ids."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class Bad:
    """One invalid call and what it must raise: ``error`` with a message
    matching ``match`` (a regular expression; the op's name is checked
    separately). ``args`` are NumPy arrays and values, as in :class:`Sample`."""

    args: tuple
    kwargs: dict
    error: type
    match: str = ""


@dataclass(frozen=True)
class Grad:
    """How to check the gradient: against central differences of the
    forward, through autograd, for the positional inputs ``wrt``; sample
    elements within ``1e-3`` of a kink (where the derivative jumps) are
    moved off it first."""

    wrt: tuple = (0,)
    kinks: tuple = ()


@dataclass(frozen=True)
class Bench:
    """One benchmark case of the operator against a NumPy/SciPy baseline.

    ``baseline`` is ``"module:attr"`` of ``baseline(*inputs, out)``;
    ``setup`` of ``setup(n, dtype, rng) -> inputs`` (empty: the family's
    default); ``kwargs`` go to the operator; ``reference`` names the float64
    reference where the baseline evaluated in float64 is not one;
    ``options`` are further :class:`nbops.bench.harness.Case` fields.
    """

    baseline: str
    name: str = ""
    setup: str = ""
    kwargs: dict = field(default_factory=dict)
    reference: str = ""
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class OpSpec:
    """The declaration of one operator.

    Parameters
    ----------
    name : str
        The public name, shown in errors and the profiler.
    family : Family
        Where ``kernels`` live; each is registered as ``family.key(k)``.
    kernels : tuple of str
        Kernel attributes the front calls (several ops may share one).
    backward : callable, optional
        ``backward(ctx, *grads)``, one gradient per positional input.
    save : tuple
        What autograd keeps for the backward: ``"inputs"`` and/or ``"output"``.
    dtypes : tuple of numpy.dtype
        The float dtypes the operator accepts.
    reference : str
        Name of the NumPy reference in ``tests/reference.py`` (default: ``name``),
        or ``"test_module:function"`` in a family's test file; called with
        the sample's arguments, arrays as float64.
    samples : callable
        ``samples(dtype) -> list of Sample``: valid calls, edge values among them.
    bad : callable
        ``bad(dtype) -> list of Bad``: invalid calls and their errors.
    grad : Grad, optional
        Whether and how the gradient is checked (needs ``backward``).
    tol : dict
        ``{dtype: (rtol, atol)}`` against the float64 reference.
    out : bool
        Whether the operator takes ``out=``; ``inplace`` lists the positional
        inputs ``out`` may be.
    strided : tuple, optional
        The positional inputs that may have any strides (default: every one).
    out_result : int or str
        Which part of a tuple or dict result ``out=`` receives.
    exempt : str
        Why the op table cannot run this operator's samples (it takes a
        function, say), where it declares none: its family's tests must.
    bench : tuple of Bench
    """

    name: str
    family: Family
    kernels: tuple = ()
    backward: Optional[Callable] = None
    save: tuple = ("inputs",)
    dtypes: tuple = FLOATS
    reference: str = ""
    samples: Optional[Callable] = None
    bad: Optional[Callable] = None
    grad: Optional[Grad] = None
    tol: dict = field(default_factory=lambda: {F32: (4e-6, 1e-6), F64: (1e-13, 1e-14)})
    out: bool = True
    inplace: tuple = ()
    strided: Optional[tuple] = None
    out_result: object = 0
    exempt: str = ""
    bench: tuple = ()

    @property
    def reference_name(self):
        return self.reference or self.name


def arrays_in(args):
    """The arrays among a call's arguments, those inside list/tuple
    arguments (``cat``'s list of arrays) and QTensors' values too."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += arrays_in(a)
        elif isinstance(getattr(a, "values", None), np.ndarray):  # a QTensor
            out.append(a.values)
    return out


def map_arrays(fn, v):
    """``v`` with ``fn`` applied to each array, inside lists and tuples too."""
    if isinstance(v, np.ndarray):
        return fn(v)
    if isinstance(v, (list, tuple)):
        items = [map_arrays(fn, a) for a in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
    return v


# ---------------------------------------------------------------------------
# Sample builders shared by families

#: shapes of elementwise samples: empty, one element, odd sizes either side
#: of the kernels' vector widths, several ranks
ELEMENTWISE_SHAPES = ((0,), (1,), (7,), (97,), (5, 19), (2, 3, 4, 5))
#: special and boundary values every elementwise op sees
EDGE_VALUES = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 1e-40, 1e4,
               -1e4, 88.0, -88.0, 1e30, -1e30, 3.0, -3.0, 2.5, -2.5, 20.0, 10.0)


@dataclass(frozen=True)
class Elementwise:
    """``samples(dtype)`` of an elementwise op of ``n_inputs`` same-shape
    arrays: normal values of standard deviation ``span / 3`` over
    :data:`ELEMENTWISE_SHAPES`, then the last input set to
    :data:`EDGE_VALUES` (if ``edge``), once per keyword set in ``variants``.
    ``ranges`` maps an input index to ``(low, high)`` of a uniform draw (an
    input that is a forward's output, say)."""

    n_inputs: int = 1
    span: float = 8.0
    variants: tuple = ({},)
    edge: bool = True
    ranges: tuple = ()

    def draw(self, rng, shape, dtype, i):
        ranges = dict(self.ranges)
        if i in ranges:
            return rng.uniform(*ranges[i], shape).astype(dtype)
        return (rng.standard_normal(shape) * self.span / 3).astype(dtype)

    def __call__(self, dtype):
        rng = np.random.default_rng(0)
        out = []
        for kw in self.variants:
            tag = ",".join(f"{k}={v}" for k, v in kw.items())
            for shape in ELEMENTWISE_SHAPES:
                args = tuple(self.draw(rng, shape, dtype, i) for i in range(self.n_inputs))
                out.append(Sample(args, dict(kw), f"{shape}{tag}"))
            if self.edge:
                e = np.array(EDGE_VALUES, dtype)
                args = tuple(self.draw(rng, e.shape, dtype, i)
                             for i in range(self.n_inputs - 1)) + (e,)
                out.append(Sample(args, dict(kw), f"edge{tag}"))
        return out


@dataclass(frozen=True)
class Broadcasting:
    """``samples(dtype)`` of a broadcasting binary op ``(a, b)``: equal shapes,
    shapes that broadcast either way, empty and 0-d arrays, a Python scalar
    on either side, and special values against special values. ``ranges``
    as :class:`Elementwise`'s (a divisor away from zero, say)."""

    span: float = 4.0
    ranges: tuple = ()

    PAIRS = (((5, 19), (5, 19)), ((2, 3, 4, 5), (4, 5)), ((3, 1), (1, 4)), ((4,), (2, 3, 4)),
             ((0, 3), (3,)), ((), ()), ((7,), None), (None, (7,)))

    def __call__(self, dtype):
        draw = Elementwise(2, self.span, ranges=self.ranges).draw
        rng = np.random.default_rng(0)
        out = []
        for sa, sb in self.PAIRS:
            a = 1.5 if sa is None else draw(rng, sa, dtype, 0)
            b = 1.5 if sb is None else draw(rng, sb, dtype, 1)
            out.append(Sample((a, b), {}, f"{sa}{sb}"))
        e = np.array(EDGE_VALUES, dtype)
        out.append(Sample((e, e[::-1].copy()), {}, "edge"))
        return out


@dataclass(frozen=True)
class Reduction:
    """``samples(dtype)`` of a reduction ``(x, axis=, keepdims=)``: every
    axis form (None, an int, a negative int, a tuple) with and without
    ``keepdims``, an empty axis, and special values."""

    AXES = (None, 0, -1, (0, 2), (1,))

    def __call__(self, dtype):
        rng = np.random.default_rng(0)
        x = (rng.standard_normal((3, 4, 5)) * 2).astype(dtype)
        out = [Sample((x,), dict(axis=axis, keepdims=keep), f"axis={axis},keepdims={keep}")
               for axis in self.AXES for keep in (False, True)]
        out.append(Sample((np.zeros((0, 3), dtype),), dict(axis=0), "empty"))
        # rows reducing to NaN, NaN (inf - inf), inf, and signed zeros with
        # subnormals (huge values of both signs would measure cancellation)
        e = np.array([[np.nan, 1, 2, 3], [np.inf, -np.inf, 1, 2], [np.inf, 1, 2, 3],
                      [-0.0, -0.0, 1e-40, -1e-40]], dtype)
        out.append(Sample((e,), dict(axis=1), "edge"))
        return out


@dataclass(frozen=True)
class Expansion:
    """``samples(dtype)`` of ``expand(x, shape)`` (or, ``reverse``d, of
    ``sum_to(x, shape)``): a small shape and a shape it broadcasts to."""

    reverse: bool = False
    PAIRS = (((4,), (3, 4)), ((3, 1), (3, 5)), ((1, 4), (2, 3, 4)), ((), (2, 3)),
             ((2, 3), (2, 3)), ((0, 1), (0, 4)))

    def __call__(self, dtype):
        rng = np.random.default_rng(0)
        out = []
        for small, big in self.PAIRS:
            src, dst = (big, small) if self.reverse else (small, big)
            x = rng.standard_normal(src).astype(dtype)
            out.append(Sample((x, dst), {}, f"{src}->{dst}"))
        return out


@dataclass(frozen=True)
class Shapes:
    """``samples(dtype)``: one array of normal values (standard deviation
    ``span / 3``) per ``(shape, kwargs)`` in ``cases``, then one per
    ``(values, kwargs)`` in ``edge`` (nested lists of special values)."""

    cases: tuple
    edge: tuple = ()
    span: float = 8.0

    def __call__(self, dtype):
        rng = np.random.default_rng(0)
        out = [Sample(((rng.standard_normal(shape) * self.span / 3).astype(dtype),),
                      dict(kw), f"{shape}{kw}") for shape, kw in self.cases]
        out += [Sample((np.array(values, dtype),), dict(kw), f"edge{kw}")
                for values, kw in self.edge]
        return out


def overrides(base, positional, cases):
    """``bad(dtype)`` from ``(changes, error, match)`` triples: the call with
    the arguments ``base`` (a dict; the names in ``positional`` are passed by
    position, the rest by keyword) updated by ``changes``."""
    def bad(dtype):
        out = []
        for changes, error, match in cases:
            kw = {**base, **changes}
            out.append(Bad(tuple(kw.pop(k) for k in positional), kw, error, match))
        return out

    return bad


def float_only(n_inputs=1, names=("x",), params=(), shapes="same", defaults=None):
    """``bad(dtype)`` for a float op: each input given a non-float dtype or a
    list, two inputs of two dtypes, or of shapes that do not match
    (``shapes="same"``) or broadcast (``"broadcast"``); plus ``params``:
    ``(kwargs, error, match)`` triples or whole :class:`Bad` calls.
    ``defaults`` are keyword arguments every call gets (unless a param
    overrides them)."""
    defaults = dict(defaults or {})

    def bad(dtype):
        good = [np.ones((3, 4), dtype) for _ in range(n_inputs)]
        out = []
        for i, name in enumerate(names[:n_inputs]):
            for d in NOT_FLOAT:
                args = list(good)
                args[i] = np.ones((3, 4), d)
                out.append(Bad(tuple(args), defaults, TypeError,
                               f"argument '{name}' must be a float32 or float64"))
            args = list(good)
            args[i] = [[1.0] * 4] * 3
            out.append(Bad(tuple(args), defaults, TypeError,
                           f"argument '{name}' must be a numpy.ndarray"))
        if n_inputs > 1:
            other = np.dtype(np.float64 if np.dtype(dtype) == F32 else np.float32)
            if shapes == "same":
                out.append(Bad((np.ones(3, dtype),) + tuple(good[1:]), defaults, ValueError,
                               f"must have the shape of '{names[0]}'"))
            else:
                out.append(Bad((np.ones(5, dtype),) + tuple(good[1:]), defaults, ValueError,
                               "shapes do not broadcast"))
            out.append(Bad((np.ones((3, 4), other),) + tuple(good[1:]), defaults, TypeError,
                           f"'{names[0]}' is {other.name} but"))
        for p in params:
            if isinstance(p, Bad):
                out.append(p)
                continue
            kwargs, error, match = p
            out.append(Bad(tuple(good), {**defaults, **kwargs}, error, match))
        return out

    return bad
