"""Argument validation shared by every operator.

Each check raises before any kernel runs, with a message that names the
operator, the argument, what was expected and what came:

    relu: argument 'x' must be a float32 or float64 array, got int64
"""

import math
import numbers
import os

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


def array(op, name, x, dtypes=FLOAT_DTYPES, written=False):
    """Check that ``x`` is a NumPy or device array with one of ``dtypes``,
    and return it in the form the kernels take (callers use the result).

    Two things NumPy accepts are taken as NumPy takes them, converted once
    here: a NumPy scalar (``np.float32(-1)``) becomes a 0-d array, and a
    NumPy array of a supported dtype in non-native byte order (``'>f4'``,
    as files and network formats deliver it) becomes a native-order copy.
    Everything else is returned as it came, at no cost. ``written=True``
    marks an argument the op updates in place (running statistics): a copy
    would lose the update, so non-native byte order is refused by name.
    """
    if not (isinstance(x, np.ndarray) or _dispatch.is_device_array(x)):
        if not isinstance(x, np.generic):
            raise TypeError(
                f"{op}: argument '{name}' must be a numpy.ndarray or a device array, "
                f"got {describe(x)}")
        x = np.asarray(x)
    if x.dtype not in dtypes:
        native = x.dtype.newbyteorder("=")
        if native in dtypes and not x.dtype.isnative and isinstance(x, np.ndarray):
            if written:
                raise TypeError(
                    f"{op}: argument '{name}' is updated in place, which needs native "
                    f"byte order, got {x.dtype.str}; pass x.astype('{native.str}') and "
                    "keep that array")
            return x.astype(native)
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


def empty(shape, dtype, device, op=None):
    """An uninitialised C-contiguous array on ``device``. On the CPU, arrays
    of ``ALIGN_FROM`` bytes or more start on a cache line (``ALIGN`` bytes;
    NumPy's own start 16 bytes into one): their rows of whole lines can be
    written with non-temporal stores (:mod:`nbops.cpu._memory`), and vector
    loads of them do not straddle lines.

    Sizes of ``ALIGN_FROM`` bytes or more are checked first by
    :func:`allocation` (naming ``op``, when given, in the error)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= ALIGN_FROM:
        allocation(op, shape, dtype, device, nbytes)
    try:
        if device != _dispatch.CPU:
            return _dispatch.ensure_cuda().device_array(shape, dtype)
        if nbytes < ALIGN_FROM:
            return np.empty(shape, dtype)
        raw = np.empty(nbytes + ALIGN, np.uint8)
    except (ValueError, MemoryError):
        # small sizes skip the check above (it would show beside tiny
        # kernels); a dimension too large or negative for NumPy lands here
        allocation(op, shape, dtype, device, nbytes)
        raise OutputTooLarge(f"{op or 'nbops'}: cannot allocate an array of shape "
                             f"{tuple(shape)} ({dtype.name}, {_bytes(nbytes)})") from None
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class OutputTooLarge(ValueError, MemoryError):
    """An output an operator cannot allocate: more bytes than an address
    holds, or than this machine's memory. A ValueError (the arguments ask
    for it) and a MemoryError (what NumPy raises for the same request)."""


def _bytes(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.4g} {unit}" if unit != "bytes" else f"{n} bytes"
        n /= 1024
    return f"{n:.4g} EiB"


def _physical_memory():
    """Bytes of RAM of this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


_RAM = _physical_memory()


def allocation(op, shape, dtype, device=_dispatch.CPU, nbytes=None, workspace=0):
    """Check, before allocating, that an array of ``shape`` and ``dtype``
    can exist: its size must fit in an address (where NumPy would say only
    "Maximum allowed dimension exceeded") and, on the CPU, in this machine's
    memory (where an over-committing OS would accept it and kill the process
    once the kernel writes). Raises :class:`OutputTooLarge` naming ``op``;
    returns the size in bytes. ``workspace``: bytes of the kernels' own
    buffers, counted with the output. Python integers: the product cannot wrap."""
    op = op or "nbops"
    shape = tuple(shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"{op}: the arguments give an output of shape {shape}, with a "
                         "negative size")
    if nbytes is None:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    nbytes += workspace
    what = (f"{op}: the output of shape {shape} ({np.dtype(dtype).name})"
            + (" and the kernels' working memory take" if workspace else " takes")
            + f" {_bytes(nbytes)}")
    if nbytes > _MAX_BYTES or any(n > _MAX_BYTES for n in shape):
        raise OutputTooLarge(f"{what}, more than an address can hold; check the "
                             "arguments that set its size")
    if device == _dispatch.CPU and _RAM is not None and nbytes > _RAM:
        raise OutputTooLarge(f"{what}, more than this machine's memory ({_bytes(_RAM)})")
    return nbytes


_MAX_BYTES = np.iinfo(np.intp).max


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
        return empty(shape, dtype, device, op)
    if not (isinstance(out, np.ndarray) or _dispatch.is_device_array(out)):
        raise TypeError(f"{op}: argument 'out' must be an array, got {describe(out)}")
    out_dev = _dispatch.device_of_array(out)
    if out_dev != device:
        raise TypeError(f"{op}: argument 'out' is on {out_dev} but the inputs are on "
                        f"{device}; allocate it on {device}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{op}: argument 'out' must have shape {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        swapped = out.dtype.newbyteorder("=") == dtype
        raise TypeError(
            f"{op}: argument 'out' must be {np.dtype(dtype).name}, got {out.dtype}"
            + (" (non-native byte order, which the kernels cannot write; pass a "
               "native array and convert the result with .astype)" if swapped else ""))
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


def bounds(op, low_name, low, high_name, high):
    """Check a pair of real bounds ``low <= high`` (either may be +-inf, not
    NaN) and return them as Python floats."""
    lo = scalar(op, low_name, low, finite=False)
    hi = scalar(op, high_name, high, finite=False)
    for name, v in ((low_name, lo), (high_name, hi)):
        if math.isnan(v):
            raise ValueError(f"{op}: argument '{name}' must not be NaN")
    if lo > hi:
        raise ValueError(f"{op}: argument '{low_name}' ({lo}) must be <= '{high_name}' ({hi})")
    return lo, hi


def choice(op, name, value, options):
    """Check that ``value`` is one of ``options``."""
    if value not in options:
        raise ValueError(f"{op}: argument '{name}' must be one of "
                         f"{', '.join(repr(o) for o in options)}, got {value!r}")
    return value


def axis(op, name, value, ndim):
    """Normalise an axis index (negative counts from the end)."""
    value = int_arg(op, name, value)
    if not -ndim <= value < ndim:
        raise ValueError(f"{op}: argument '{name}' is {value}, out of range for "
                         f"an array of {ndim} dimension(s)")
    return value % ndim


def int_arg(op, name, value, low=None):
    """Check an integer parameter (a bool is not one) and return it as a
    Python int, at least ``low`` where given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: argument '{name}' must be an int, got {describe(value)}")
    if low is not None and value < low:
        raise ValueError(f"{op}: argument '{name}' must be >= {low}, got {value}")
    return int(value)


def int_tuple(op, name, value, n, low=None):
    """Check a parameter given as one int or as a tuple (or list) of ``n``
    ints, each at least ``low`` where given (strides, paddings, kernel
    sizes), and return it as an ``n``-tuple of Python ints."""
    vals = tuple(value) if isinstance(value, (tuple, list)) else (value,) * n
    what = f"{op}: argument '{name}' must be an int or a tuple of {n} ints, got {value!r}"
    if len(vals) != n:
        raise ValueError(what)
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral)
           for v in vals):
        raise TypeError(what)
    vals = tuple(int(v) for v in vals)
    if low is not None and any(v < low for v in vals):
        raise ValueError(f"{op}: argument '{name}' must be >= {low}, got {value!r}")
    return vals


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

