"""Argument validation shared by every operator.

Each check raises before any kernel runs, with a message that names the
operator, the argument, what was expected and what came:

    relu: argument 'x' must be a float32 or float64 array, got int64
"""

import math
import numbers

import numpy as np

from . import _dispatch, _layout

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def describe(value):
    """A short description of ``value`` for error messages."""
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        where = "device array" if _dispatch.is_device_array(value) else "array"
        return f"{dtype} {where} of shape {tuple(shape)}"
    return f"{type(value).__name__} {value!r}" if isinstance(value, (int, float, str)) \
        else type(value).__name__


def _dtype_names(dtypes):
    names = [np.dtype(d).name for d in dtypes]
    return " or ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " or " + names[-1]


def array(op, name, x, dtypes=FLOAT_DTYPES):
    """Check that ``x`` is a NumPy or device array with one of ``dtypes``."""
    if not (isinstance(x, np.ndarray) or _dispatch.is_device_array(x)):
        raise TypeError(
            f"{op}: argument '{name}' must be a numpy.ndarray or a device array, "
            f"got {describe(x)}")
    if x.dtype not in dtypes:
        raise TypeError(
            f"{op}: argument '{name}' must be a {_dtype_names(dtypes)} array, "
            f"got {x.dtype}")
    return x


def same_dtype(op, **arrays):
    """Check that all named arrays share one dtype (no silent upcasts)."""
    items = [(n, a) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for name, a in items[1:]:
        if a.dtype != first.dtype:
            raise TypeError(
                f"{op}: '{first_name}' is {first.dtype} but '{name}' is {a.dtype}; "
                "cast one of them explicitly")


def same_shape(op, **arrays):
    """Check that all named arrays have one shape."""
    items = [(n, a) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for name, a in items[1:]:
        if tuple(a.shape) != tuple(first.shape):
            raise ValueError(
                f"{op}: '{name}' must have the shape of '{first_name}' "
                f"{tuple(first.shape)}, got {tuple(a.shape)}")


def empty(shape, dtype, device):
    """An uninitialised C-contiguous array on ``device``. On the CPU, arrays
    of ``ALIGN_FROM`` bytes or more start on a cache line (``ALIGN`` bytes;
    NumPy's own start 16 bytes into one): their rows of whole lines can be
    written with non-temporal stores (:mod:`nbops.cpu._memory`), and vector
    loads of them do not straddle lines."""
    if device == _dispatch.CPU:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < ALIGN_FROM:
            return np.empty(shape, dtype)
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)
    return _dispatch.ensure_cuda().device_array(shape, dtype)


#: Alignment in bytes of large CPU outputs (:func:`empty`), and the size
#: from which it applies (below, the few microseconds of the aligned
#: allocation would show beside the kernel).
ALIGN = 64
ALIGN_FROM = 1 << 20


def output(op, out, shape, dtype, device, inputs=(), allow_inplace=()):
    """Check a user's ``out=`` array, or allocate one when it is None.

    ``out`` must be on ``device``, C-contiguous, of ``shape`` and ``dtype``,
    and must not overlap any of ``inputs`` (a dict name -> array), except that
    it may *be* one of the arrays named in ``allow_inplace`` (same memory and
    strides), which elementwise ops support as in-place updates.
    """
    shape = tuple(shape)
    if out is None:
        return empty(shape, dtype, device)
    if not (isinstance(out, np.ndarray) or _dispatch.is_device_array(out)):
        raise TypeError(f"{op}: argument 'out' must be an array, got {describe(out)}")
    out_dev = _dispatch.device_of_array(out)
    if out_dev != device:
        raise TypeError(f"{op}: argument 'out' is on {out_dev} but the inputs are on "
                        f"{device}; allocate it on {device}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{op}: argument 'out' must have shape {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{op}: argument 'out' must be {np.dtype(dtype).name}, got {out.dtype}")
    if not _layout.is_c_contiguous(out):
        raise ValueError(f"{op}: argument 'out' must be C-contiguous, got strides "
                         f"{tuple(out.strides)}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{op}: argument 'out' is read-only")
    for name, x in inputs.items():
        if x is None or not _layout.overlaps(out, x):
            continue
        if name in allow_inplace and _layout.same_layout(out, x):
            continue
        raise ValueError(
            f"{op}: argument 'out' overlaps input '{name}'"
            + (" (in-place is allowed only as out=" + name + " exactly)"
               if name in allow_inplace else "; pass a separate output array"))
    return out


def scalar(op, name, value, *, low=None, high=None, low_open=False, finite=True):
    """Check a real scalar parameter and return it as a Python float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: argument '{name}' must be a real number, got {describe(value)}")
    v = float(value)
    if finite and not math.isfinite(v):
        raise ValueError(f"{op}: argument '{name}' must be finite, got {v}")
    if low is not None and (v <= low if low_open else v < low):
        rel = ">" if low_open else ">="
        raise ValueError(f"{op}: argument '{name}' must be {rel} {low}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"{op}: argument '{name}' must be <= {high}, got {v}")
    return v


def choice(op, name, value, options):
    """Check that ``value`` is one of ``options``."""
    if value not in options:
        raise ValueError(f"{op}: argument '{name}' must be one of "
                         f"{', '.join(repr(o) for o in options)}, got {value!r}")
    return value


def axis(op, name, value, ndim):
    """Normalise an axis index (negative counts from the end)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: argument '{name}' must be an int, got {describe(value)}")
    if not -ndim <= value < ndim:
        raise ValueError(f"{op}: argument '{name}' is {value}, out of range for "
                         f"an array of {ndim} dimension(s)")
    return int(value) % ndim


class CheckedCache:
    """Results of an operator's parameter checks, remembered per call
    pattern: ``get(key, check)`` returns the result stored under ``key`` or
    runs ``check()`` and stores it (errors are raised each time, never
    stored). Keys come from :func:`typed_key`; an unhashable key (a list
    among the arguments) checks every time. Bounded: cleared when full."""

    def __init__(self, size=256):
        self.size = size
        self.results = {}

    def get(self, key, check):
        try:
            hit = self.results.get(key)
        except TypeError:
            return check()
        if hit is None:
            hit = check()
            if len(self.results) >= self.size:
                self.results.clear()
            self.results[key] = hit
        return hit


def typed_key(*values):
    """A key of call arguments that tells apart values equal across types
    (``True`` and ``1``, ``1`` and ``1.0``): each value with its type,
    tuples element by element."""
    return tuple(tuple((type(e), e) for e in v) if type(v) is tuple else (type(v), v)
                 for v in values)

