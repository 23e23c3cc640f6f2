"""``QTensor``: int8/uint8 values with their quantization parameters.

A quantized tensor stores integers ``q`` and the affine map back to reals,
``x = (q - zero_point) * scale``, either one (scale, zero point) for the whole
tensor or one per slice along ``axis`` (per-channel quantization, the usual
scheme for weights). The values may live on the CPU (NumPy) or on a CUDA
device; scales and zero points always stay on the host, where the operators
that use them read them (they are small, and requantization constants are
derived from them before any kernel launches).

The class validates everything it is given, so an operator that receives a
``QTensor`` can trust its parameters.
"""

import math
import numbers

import numpy as np

from .. import _dispatch

#: The integer types a QTensor may hold, with their (min, max).
QTYPES = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
}


def qrange(dtype):
    """``(qmin, qmax)`` of a quantized integer type (int8 or uint8).

    Raises
    ------
    TypeError
        If ``dtype`` is not int8 or uint8.

    Example
    -------
    >>> qrange(np.uint8)
    (0, 255)
    """
    try:
        return QTYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"quantized dtype must be int8 or uint8, got {dtype!r}") from None


class QTensor:
    """Int8 or uint8 values with a scale and zero point (per tensor or per channel).

    Parameters
    ----------
    values : numpy.ndarray or device array, int8 or uint8
        The quantized integers, any shape. Not copied.
    scale : float, or float array of shape ``(values.shape[axis],)``
        Positive, finite step between consecutive integers. Per-channel scales
        are stored as a float32 array (the ONNX type of a scale).
    zero_point : int, or int array of shape ``(values.shape[axis],)``
        The integer that represents real 0; within the range of the values'
        type. Per-channel zero points are stored as an int32 array.
    axis : int or None
        None for per-tensor quantization, else the channel axis along which
        ``scale`` and ``zero_point`` vary.

    Attributes
    ----------
    values, scale, zero_point, axis, dtype, shape, ndim, size, device

    Raises
    ------
    TypeError
        ``values`` is not an int8/uint8 array, or a parameter has the wrong type.
    ValueError
        A scale is <= 0 or not finite, a zero point lies outside the type's
        range, ``axis`` is out of range, or per-channel parameters do not have
        one entry per channel (or are given without ``axis``, or scalars with it).

    Example
    -------
    >>> q = QTensor(np.array([-2, 0, 3], np.int8), scale=0.5, zero_point=0)
    >>> q.dequantize()
    array([-1. ,  0. ,  1.5], dtype=float32)
    """

    __slots__ = ("values", "scale", "zero_point", "axis")

    def __init__(self, values, scale, zero_point, axis=None):
        if not (isinstance(values, np.ndarray) or _dispatch.is_device_array(values)):
            raise TypeError("QTensor: 'values' must be an int8 or uint8 numpy.ndarray or "
                            f"device array, got {type(values).__name__}")
        dtype = np.dtype(values.dtype)
        if dtype not in QTYPES:
            hint = (" (quantize float data with nbops.quant.quantize_per_tensor or "
                    "quantize_per_channel)" if dtype.kind == "f" else "")
            raise TypeError(f"QTensor: 'values' must be int8 or uint8, got {dtype}{hint}")
        qmin, qmax = QTYPES[dtype]
        self.values = values
        if axis is None:
            self.axis = None
            self.scale = _check_scalar_scale("QTensor", "scale", scale)
            self.zero_point = _check_scalar_zero_point("QTensor", "zero_point", zero_point,
                                                       qmin, qmax, dtype)
        else:
            ndim = len(values.shape)
            if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
                raise TypeError(f"QTensor: 'axis' must be an int or None, got "
                                f"{type(axis).__name__}")
            if not -ndim <= axis < ndim:
                raise ValueError(f"QTensor: 'axis' is {axis}, out of range for values of "
                                 f"{ndim} dimension(s)")
            self.axis = int(axis) % ndim
            channels = values.shape[self.axis]
            self.scale = _check_channel_scales("QTensor", "scale", scale, channels)
            self.zero_point = _check_channel_zero_points("QTensor", "zero_point", zero_point,
                                                         channels, qmin, qmax, dtype)

    # -- description ---------------------------------------------------------

    @property
    def dtype(self):
        """The integer type of the values (int8 or uint8)."""
        return np.dtype(self.values.dtype)

    @property
    def shape(self):
        return tuple(self.values.shape)

    @property
    def ndim(self):
        return len(self.values.shape)

    @property
    def size(self):
        return int(np.prod(self.values.shape, dtype=np.int64))

    @property
    def device(self):
        """``"cpu"`` or ``"cuda"``: where the values live."""
        return _dispatch.device_of_array(self.values)

    @property
    def per_channel(self):
        """True for per-channel quantization (``axis`` is not None)."""
        return self.axis is not None

    @property
    def qmin(self):
        return QTYPES[self.dtype][0]

    @property
    def qmax(self):
        return QTYPES[self.dtype][1]

    def __repr__(self):
        if self.axis is None:
            params = f"scale={self.scale!r}, zero_point={self.zero_point}"
        else:
            params = (f"axis={self.axis}, scales={_short(self.scale)}, "
                      f"zero_points={_short(self.zero_point)}")
        return (f"QTensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device}, "
                f"{params})")

    def __len__(self):
        return self.shape[0]

    # -- parameters, PyTorch names ------------------------------------------------

    def int_repr(self):
        """The integer values (the stored array itself, not a copy)."""
        return self.values

    def q_scale(self):
        """The per-tensor scale (float). Raises ValueError for per-channel tensors."""
        self._need_per_tensor("q_scale")
        return self.scale

    def q_zero_point(self):
        """The per-tensor zero point (int). Raises ValueError for per-channel tensors."""
        self._need_per_tensor("q_zero_point")
        return self.zero_point

    def q_per_channel_scales(self):
        """The per-channel scales (float32 array). Raises ValueError if per-tensor."""
        self._need_per_channel("q_per_channel_scales")
        return self.scale

    def q_per_channel_zero_points(self):
        """The per-channel zero points (int32 array). Raises ValueError if per-tensor."""
        self._need_per_channel("q_per_channel_zero_points")
        return self.zero_point

    def q_per_channel_axis(self):
        """The channel axis (int). Raises ValueError if per-tensor."""
        self._need_per_channel("q_per_channel_axis")
        return self.axis

    def _need_per_tensor(self, what):
        if self.axis is not None:
            raise ValueError(f"QTensor.{what}: this tensor is quantized per channel along "
                             f"axis {self.axis}; use q_per_channel_scales() / "
                             "q_per_channel_zero_points()")

    def _need_per_channel(self, what):
        if self.axis is None:
            raise ValueError(f"QTensor.{what}: this tensor is quantized per tensor; use "
                             "q_scale() / q_zero_point()")

    # -- conversions --------------------------------------------------------------

    def dequantize(self, dtype=np.float32, out=None):
        """``(values - zero_point) * scale`` as float32 (default) or float64,
        on the values' device. See :func:`nbops.quant.dequantize`."""
        from . import dequantize

        return dequantize(self, dtype=dtype, out=out)

    def to_device(self):
        """A QTensor with the same parameters and the values copied to the GPU
        (returns ``self`` if they are already there)."""
        if self.device == _dispatch.CUDA:
            return self
        return self._with_values(_dispatch.to_device(self.values))

    def to_host(self):
        """A QTensor with the values copied to a NumPy array (``self`` if they
        already are one)."""
        if self.device == _dispatch.CPU:
            return self
        return self._with_values(_dispatch.to_host(self.values))

    def _with_values(self, values):
        """A QTensor sharing this one's (already validated) parameters."""
        q = object.__new__(QTensor)
        q.values, q.scale, q.zero_point, q.axis = values, self.scale, self.zero_point, self.axis
        return q


def _short(a):
    a = np.asarray(a)
    if a.size <= 6:
        return np.array2string(a, separator=", ")
    return (np.array2string(a[:3], separator=", ")[:-1] + ", ..., "
            + np.array2string(a[-2:], separator=", ")[1:])


# ---------------------------------------------------------------------------
# Parameter validation, shared with the quantize functions


def _check_scalar_scale(op, name, scale):
    if isinstance(scale, np.ndarray) and scale.ndim == 0:
        scale = scale[()]
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{op}: '{name}' must be a positive float for per-tensor "
                        f"quantization, got {_describe(scale)}"
                        + (" (pass axis= for per-channel scales)"
                           if isinstance(scale, (np.ndarray, list, tuple)) else ""))
    s = float(scale)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"{op}: '{name}' must be positive and finite, got {s}")
    return s


def _check_scalar_zero_point(op, name, zero_point, qmin, qmax, dtype):
    if isinstance(zero_point, np.ndarray) and zero_point.ndim == 0:
        zero_point = zero_point[()]
    if isinstance(zero_point, (bool, np.bool_)) or not isinstance(zero_point, numbers.Integral):
        if isinstance(zero_point, numbers.Real) and float(zero_point).is_integer():
            zero_point = int(zero_point)
        else:
            raise TypeError(f"{op}: '{name}' must be an int, got {_describe(zero_point)}")
    zp = int(zero_point)
    if not qmin <= zp <= qmax:
        raise ValueError(f"{op}: '{name}' must lie in [{qmin}, {qmax}] for {dtype.name}, "
                         f"got {zp}")
    return zp


def _check_channel_scales(op, name, scales, channels):
    a = _channel_array(op, name, scales, channels)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{op}: '{name}' must be a float array, got {a.dtype}")
    a64 = a.astype(np.float64)
    bad = ~np.isfinite(a64) | (a64 <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{op}: '{name}' must be positive and finite, got {a64[i]} "
                         f"at channel {i}")
    out = a.astype(np.float32)
    if (out <= 0).any():  # a tiny float64 scale that underflows in float32
        i = int(np.argmax(out <= 0))
        raise ValueError(f"{op}: '{name}' at channel {i} ({a64[i]}) underflows to 0 "
                         "in float32")
    return out


def _check_channel_zero_points(op, name, zero_points, channels, qmin, qmax, dtype):
    a = _channel_array(op, name, zero_points, channels)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise TypeError(f"{op}: '{name}' must hold integers, got {a.dtype} values "
                            "with a fractional part")
    elif a.dtype.kind not in "iu":
        raise TypeError(f"{op}: '{name}' must be an int array, got {a.dtype}")
    bad = (a < qmin) | (a > qmax)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{op}: '{name}' must lie in [{qmin}, {qmax}] for {dtype.name}, "
                         f"got {a[i]} at channel {i}")
    return a.astype(np.int32)


def _channel_array(op, name, value, channels):
    if _dispatch.is_device_array(value):
        value = _dispatch.to_host(value)
    if isinstance(value, (bool, np.bool_)) or isinstance(value, numbers.Number):
        raise TypeError(f"{op}: '{name}' must be an array of {channels} per-channel values "
                        f"when axis is given, got the scalar {value!r}")
    a = np.asarray(value)
    if a.ndim != 1 or a.shape[0] != channels:
        raise ValueError(f"{op}: '{name}' must have one entry per channel, i.e. shape "
                         f"({channels},), got shape {a.shape}")
    return a


def _describe(v):
    if isinstance(v, np.ndarray):
        return f"{v.dtype} array of shape {v.shape}"
    return f"{type(v).__name__} {v!r}"
