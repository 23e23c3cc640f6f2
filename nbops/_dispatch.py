"""Devices and the operator registry: the one place that knows about devices.

Every operator, built-in or user-defined, is an :class:`Operator`: a front
function (argument checks, allocation) plus kernels registered per device
under the operator's name. Kernels are named by ``"module:attribute"`` strings
and imported on first use, so ``import nbops`` loads no kernel module and
``numba.cuda`` is imported only when a device array first arrives.

Calls go straight to the front function unless something is listening
(autograd tensors among the arguments, the profiler, debug mode); those
hooks live here so that every operator gets them the same way.
"""

import importlib

import numpy as np

from . import _spec

CPU = "cpu"
CUDA = "cuda"
DEVICES = (CPU, CUDA)

# ---------------------------------------------------------------------------
# Devices


def is_device_array(x):
    """True if ``x`` lives on a CUDA device (exposes the CUDA array interface,
    or is a Numba device array, real or simulated)."""
    if type(x) is np.ndarray:
        return False
    return hasattr(x, "__cuda_array_interface__") or bool(
        getattr(x, "__cuda_ndarray__", False)
    )


def device_of_array(x):
    """``"cpu"`` for a NumPy array, ``"cuda"`` for a device array, else None."""
    if isinstance(x, np.ndarray):
        return CPU
    if is_device_array(x):
        return CUDA
    return None


def resolve_device(op, **arrays):
    """The device that ``op`` runs on, given its array arguments by name.

    ``None`` values are skipped. Raises ``TypeError`` naming the arguments
    when they live on different devices; nothing moves silently.
    """
    found = {}
    for name, value in arrays.items():
        if value is None:
            continue
        dev = device_of_array(value)
        if dev is not None:
            found.setdefault(dev, []).append(name)
    if len(found) > 1:
        where = "; ".join(f"{', '.join(n)} on {d}" for d, n in sorted(found.items()))
        raise TypeError(
            f"{op}: arguments are on different devices ({where}); move them "
            "with nbops.to_device() or nbops.to_host() first"
        )
    if found:
        dev = next(iter(found))
        if dev == CUDA:
            ensure_cuda()
        return dev
    return CPU


_cuda_module = None


def ensure_cuda():
    """Import numba.cuda (once) and return it."""
    global _cuda_module
    if _cuda_module is None:
        from numba import cuda

        _cuda_module = cuda
    return _cuda_module


def cuda_available():
    """True if CUDA kernels can run: a real GPU, or Numba's simulator
    (``NUMBA_ENABLE_CUDASIM=1``)."""
    try:
        return bool(ensure_cuda().is_available())
    except Exception:  # a broken driver install must not break the caller
        return False


def cuda_simulated():
    """True when CUDA kernels run in Numba's simulator."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def to_device(x):
    """Copy a NumPy array to the GPU; device arrays are returned as they are.

    Example::

        d = nbops.to_device(np.ones(4, np.float32))
        y = nbops.relu(d)            # runs on the GPU, returns a device array
    """
    if is_device_array(x):
        return x
    if not isinstance(x, np.ndarray):
        raise TypeError(f"to_device: expected a numpy.ndarray, got {type(x).__name__}")
    return ensure_cuda().to_device(np.ascontiguousarray(x) if x.ndim else x)


def to_host(x):
    """Copy a device array to a NumPy array; NumPy arrays are returned as they are."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    if is_device_array(x):
        return ensure_cuda().as_cuda_array(x).copy_to_host()
    raise TypeError(f"to_host: expected an array, got {type(x).__name__}")


# ---------------------------------------------------------------------------
# Kernel registry

_KERNELS = {}


def register_kernel(op, device, impl):
    """Register ``impl`` (a callable or a ``"module:attr"`` string, imported on
    first use) as the kernel of ``op`` on ``device``."""
    if device not in DEVICES:
        raise ValueError(f"register_kernel: device must be one of {DEVICES}, got {device!r}")
    if not (callable(impl) or isinstance(impl, str)):
        raise TypeError(f"register_kernel: {op} on {device}: expected a callable or "
                        f"'module:attr' string, got {type(impl).__name__}")
    _KERNELS[(op, device)] = impl


def kernel(op, device):
    """The kernel registered for ``op`` on ``device``, imported if needed."""
    try:
        impl = _KERNELS[(op, device)]
    except KeyError:
        have = sorted(d for (o, d) in _KERNELS if o == op)
        raise NotImplementedError(
            f"{op}: no kernel registered for device {device!r} (registered: {have})"
        ) from None
    if isinstance(impl, str):
        if device == CUDA:
            ensure_cuda()
        impl = _KERNELS[(op, device)] = resolve(impl)
    return impl


def resolve(path):
    """The object a ``"module:attr"`` string names, its module imported."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def registered_ops():
    """Names of all operators, built-in and user-defined, sorted."""
    return sorted(_OPERATORS)


# ---------------------------------------------------------------------------
# Operators and the hooks around every call

_OPERATORS = {}


class _Hooks:
    """Global listeners; ``active`` is the single flag checked on every call."""

    active = False
    profiler = None      # object with .record(op, args, kwargs, call) (nbops.profiler)
    debug = False        # NaN/Inf checks and logging (nbops.set_debug)

    @classmethod
    def refresh(cls):
        cls.active = cls.profiler is not None or cls.debug


class Operator:
    """A public operator: a front function with kernels and an optional backward.

    Calling it runs the front (which checks arguments, allocates and calls
    ``nbops._dispatch.kernel(name, device)``). When an argument is an autograd
    tensor the call is recorded on the tape, using ``backward``.
    ``backward(ctx, *grad_outputs)`` receives a context whose ``inputs``,
    ``output`` and ``kwargs`` hold the forward call, and returns one gradient
    (or None) per positional input.
    """

    def __init__(self, name, front, backward=None, save=("inputs",)):
        self.name = name
        self.front = front
        self.backward = backward
        self.save = save
        self.__doc__ = front.__doc__
        self.__name__ = getattr(front, "__name__", name)
        self.__qualname__ = getattr(front, "__qualname__", name)
        self.__module__ = getattr(front, "__module__", __name__)
        self.__wrapped__ = front
        self._function = None

    def __call__(self, *args, **kwargs):
        if _Hooks.active or _has_tensor(args, kwargs):
            return _hooked_call(self, args, kwargs)
        return self.front(*args, **kwargs)

    def __repr__(self):
        return f"<nbops operator {self.name}>"


def _has_tensor(args, kwargs):
    for a in args:
        if type(a) is not np.ndarray and (getattr(a, "__nbops_tensor__", False)
                                          or type(a) in _SEQUENCES and _has_tensor(a, {})):
            return True
    for a in kwargs.values():
        if type(a) is not np.ndarray and (getattr(a, "__nbops_tensor__", False)
                                          or type(a) in _SEQUENCES and _has_tensor(a, {})):
            return True
    return False


# list/tuple arguments (nbops.cat's arrays) may hold tensors too
_SEQUENCES = (list, tuple)


def _hooked_call(op, args, kwargs):
    # An argument whose type defines __nbops_function__ (and sets
    # __nbops_tensor__ to get here) takes over the call, as NumPy's
    # __array_function__: nbops.fuse traces expressions this way.
    for a in (*args, *kwargs.values()):
        handler = getattr(type(a), "__nbops_function__", None)
        if handler is not None:
            return handler(a, op, args, kwargs)
    if _has_tensor(args, kwargs):
        from . import autograd

        call = lambda: autograd.apply_operator(op, args, kwargs)  # noqa: E731
    else:
        call = lambda: op.front(*args, **kwargs)  # noqa: E731
    if _Hooks.profiler is not None:
        result = _Hooks.profiler.record(op, args, kwargs, call)
    else:
        result = call()
    if _Hooks.debug:
        from . import _debug

        _debug.check(op.name, args, kwargs, result)
    return result


def operator(spec):
    """Decorator for built-in operators: registers the kernels and the
    backward rule of ``spec`` (an :class:`nbops._spec.OpSpec`) and wraps the
    front function into an :class:`Operator` (see :func:`define`)."""

    def deco(front):
        return define(spec, front)

    return deco


def register_kernels(family, kernels, devices=DEVICES):
    """Register the kernels named in ``kernels`` of ``family`` (a
    :class:`nbops._spec.Family`) on each of ``devices`` it has a module for,
    under the keys ``family.key(k)``."""
    for k in kernels:
        for device in devices:
            path = family.path(k, device)
            if path is not None:
                register_kernel(family.key(k), device, path)


def define(spec, front):
    """The one path from a declaration to a callable operator: registers the
    spec's kernels, wraps ``front`` and records the spec (built-in operators
    through :func:`operator`, user ones through :func:`register_op`)."""
    if spec.family is not None:
        register_kernels(spec.family, spec.kernels)
    op = Operator(spec.name, front, backward=spec.backward, save=spec.save)
    op.spec = spec
    _OPERATORS[spec.name] = op
    return op


# the packages whose import declares every built-in operator
_FAMILIES = ("nbops", "nbops.nn", "nbops.quant", "nbops.sparse", "nbops.neuromorphic")


def specs():
    """The :class:`nbops._spec.OpSpec` of every built-in operator, by name
    (imports every family)."""
    for module in _FAMILIES:
        importlib.import_module(module)
    return {name: op.spec for name, op in sorted(_OPERATORS.items())
            if op.__module__.startswith("nbops")}


def register_op(name, cpu, cuda=None, backward=None, *, doc=None, samples=None, bad=None,
                grad=None, tol=None, out=False, inplace=(), strided=None):
    """Define an operator from your own kernels and call it like a built-in.

    Parameters
    ----------
    name : str
        Unique operator name (shows in the profiler and in errors).
    cpu : callable
        ``cpu(*args, **kwargs)`` run when the array arguments are NumPy arrays.
    cuda : callable, optional
        The same signature, run when they are device arrays.
    backward : callable, optional
        ``backward(ctx, grad_output)`` returning one gradient (or None) per
        positional input; ``ctx.inputs``, ``ctx.output`` and ``ctx.kwargs`` hold
        the forward call. Makes the operator usable with ``nbops.Tensor``.
    samples, bad, grad, tol, out, inplace, strided : optional
        The rest of the operator's declaration (:class:`nbops._spec.OpSpec`),
        which :func:`nbops.testing.check_op` runs against a reference:
        ``samples(dtype)`` valid calls (``nbops.testing.Elementwise()``, or a
        function returning ``nbops.testing.Sample`` objects), ``bad(dtype)``
        invalid calls with their errors (``nbops.testing.Bad``), ``grad`` a
        ``nbops.testing.Grad``, ``tol``
        ``{dtype: (rtol, atol)}``, whether the kernels take ``out=`` and
        which inputs it may be, which inputs may have any strides.

    Returns
    -------
    Operator
        Dispatches on the device of its array arguments (mixing devices
        raises ``TypeError``), and gets profiling, debug checks and autograd.

    Example
    -------
    >>> import numpy as np, nbops
    >>> double = nbops.register_op("double", cpu=lambda x: x * 2,
    ...                            backward=lambda ctx, g: (g * 2,))
    >>> double(np.ones(3))
    array([2., 2., 2.])
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_op: name must be a non-empty str, got {name!r}")
    if not callable(cpu):
        raise TypeError(f"register_op: {name}: cpu must be callable, got {type(cpu).__name__}")
    if name in _OPERATORS and _OPERATORS[name].__module__.startswith("nbops"):
        raise ValueError(f"register_op: {name!r} is a built-in nbops operator")

    key = user_kernel_key(name)

    def front(*args, **kwargs):
        named = {f"args[{i}]": a for i, a in enumerate(args)}
        named.update(kwargs)
        return kernel(key, resolve_device(name, **named))(*args, **kwargs)

    front.__name__ = front.__qualname__ = name
    front.__doc__ = doc or getattr(cpu, "__doc__", None)
    register_kernel(key, CPU, cpu)
    if cuda is not None:
        register_kernel(key, CUDA, cuda)
    declared = dict(samples=samples, bad=bad, grad=grad, out=out, inplace=inplace,
                    strided=strided)
    if tol is not None:
        declared["tol"] = {np.dtype(k): v for k, v in tol.items()}
    op = define(_spec.OpSpec(name, None, backward=backward, **declared), front)
    op.__module__ = getattr(cpu, "__module__", "__main__")
    return op


def user_kernel_key(name):
    """The registry key of a :func:`register_op` operator's kernels: the
    family ``user``, whose kernels are callables rather than module paths."""
    return f"user.{name}"


def get_operator(name):
    """The registered :class:`Operator` called ``name``."""
    try:
        return _OPERATORS[name]
    except KeyError:
        raise KeyError(f"no operator named {name!r}; registered: {registered_ops()}") from None

