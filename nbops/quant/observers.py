"""Calibration observers: record the range of values that flow through a
point of a model, then give the (scale, zero_point) that quantizes them.

The formulas are PyTorch's (``torch.ao.quantization.observer``), computed in
float32 as PyTorch does, so calibrating the same data gives the same
parameters:

* the range always includes 0: ``lo = min(min_val, 0)``, ``hi = max(max_val, 0)``;
* affine: ``scale = max((hi - lo) / (qmax - qmin), eps)``,
  ``zero_point = clamp(qmin - round_half_even(lo / scale), qmin, qmax)``;
* symmetric: ``scale = max(max(-lo, hi) / ((qmax - qmin) / 2), eps)``,
  ``zero_point = 0`` for int8 and ``128`` for uint8;

with ``eps = float32 machine epsilon`` (1.19e-7), so an all-zero or
constant-zero tensor gives ``scale = eps`` instead of dividing by zero, and
a constant tensor ``c`` gives the range [min(c, 0), max(c, 0)].
``reduce_range=True`` drops one bit (int8 [-64, 63], uint8 [0, 127]), for
kernels whose 16-bit intermediate sums would otherwise overflow. An
observer that has seen no data warns and returns PyTorch's defaults
(1.0, 0).

Observers accept NumPy arrays, device arrays (reduced on the host after a
copy) and :class:`nbops.Tensor` (their ``.data``), and return what they
were given, so they can sit inside a model's forward pass.
"""

import bisect
import warnings

import numpy as np

from .. import _dispatch
from .qtensor import QTYPES

__all__ = ["QSCHEMES", "MinMaxObserver", "MovingAverageMinMaxObserver",
           "PerChannelMinMaxObserver", "HistogramObserver"]

#: The quantization schemes (PyTorch's names).
QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
            "per_channel_symmetric")

_EPS = np.float32(np.finfo(np.float32).eps)


class _Observer:
    """Shared state and the (scale, zero_point) formula."""

    _schemes = ("per_tensor_affine", "per_tensor_symmetric")

    def __init__(self, dtype=np.uint8, qscheme="per_tensor_affine", reduce_range=False):
        name = type(self).__name__
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            self.dtype = None
        if self.dtype not in QTYPES:
            raise TypeError(f"{name}: 'dtype' must be numpy.int8 or numpy.uint8, got {dtype!r}")
        if qscheme not in self._schemes:
            raise ValueError(f"{name}: 'qscheme' must be one of "
                             f"{', '.join(map(repr, self._schemes))}, got {qscheme!r}")
        self.qscheme = qscheme
        self.reduce_range = bool(reduce_range)
        qmin, qmax = QTYPES[self.dtype]
        if self.reduce_range:  # PyTorch: one bit less, keeping the type's sign
            qmin, qmax = (qmin // 2, qmax // 2) if qmin < 0 else (0, qmax // 2)
        self.quant_min, self.quant_max = qmin, qmax
        self.min_val = np.float32(np.inf)
        self.max_val = np.float32(-np.inf)

    @property
    def symmetric(self):
        return self.qscheme.endswith("symmetric")

    def _host(self, x):
        data = getattr(x, "data", x) if getattr(x, "__nbops_tensor__", False) else x
        if _dispatch.is_device_array(data):
            data = _dispatch.to_host(data)
        if not isinstance(data, np.ndarray) or data.dtype.kind != "f":
            raise TypeError(f"{type(self).__name__}: expected a float array, got "
                            f"{getattr(data, 'dtype', type(data).__name__)}")
        return data

    def calculate_qparams(self):
        """``(scale, zero_point)``: Python float and int for per-tensor
        observers, a float32 and an int32 array for per-channel ones."""
        scale, zp = _qparams(self.min_val, self.max_val, self.quant_min, self.quant_max,
                             self.symmetric, self.dtype, type(self).__name__)
        if np.ndim(scale) == 0:
            return float(scale), int(zp)
        return scale, zp

    def extra_repr(self):
        return (f"dtype={self.dtype.name}, qscheme={self.qscheme}, "
                f"reduce_range={self.reduce_range}, min_val={self.min_val}, "
                f"max_val={self.max_val}")

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


def _qparams(min_val, max_val, qmin, qmax, symmetric, dtype, name):
    """PyTorch's ``_calculate_qparams`` in float32, elementwise over channels."""
    min_val = np.asarray(min_val, np.float32)
    max_val = np.asarray(max_val, np.float32)
    unseen = ~np.isfinite(min_val) | ~np.isfinite(max_val)
    if unseen.all():
        warnings.warn(f"{name}: no data observed yet; returning the default "
                      "scale 1.0 and zero point 0", RuntimeWarning, stacklevel=3)
        return np.ones(min_val.shape, np.float32), np.zeros(min_val.shape, np.int32)
    if unseen.any():
        raise ValueError(f"{name}: channels {np.flatnonzero(unseen).tolist()} saw no finite "
                         "values")
    lo = np.minimum(min_val, np.float32(0))
    hi = np.maximum(max_val, np.float32(0))
    if symmetric:
        half_range = np.float32((qmax - qmin) / 2)
        scale = np.maximum(np.maximum(-lo, hi) / half_range, _EPS).astype(np.float32)
        zp = np.full(lo.shape, 128 if dtype == np.uint8 else 0, np.int32)
    else:
        scale = np.maximum((hi - lo) / np.float32(qmax - qmin), _EPS).astype(np.float32)
        zp = qmin - np.rint(lo / scale).astype(np.int32)
        zp = np.clip(zp, qmin, qmax).astype(np.int32)
    return scale, zp


class MinMaxObserver(_Observer):
    """Running minimum and maximum over everything observed.

    Parameters
    ----------
    dtype : numpy.int8 or numpy.uint8 (default)
    qscheme : "per_tensor_affine" (default) or "per_tensor_symmetric"
    reduce_range : bool, one bit less range (see the module docstring)

    Raises
    ------
    TypeError
        A dtype other than int8/uint8; observing a non-float array.
    ValueError
        An unknown qscheme; observing data with NaN or Inf only.

    Example
    -------
    >>> obs = nbops.quant.MinMaxObserver(dtype=np.uint8)
    >>> _ = obs(np.array([-1.0, 3.0], np.float32))
    >>> obs.calculate_qparams()
    (0.01568627543747425, 64)
    """

    def __call__(self, x):
        """Record the range of ``x`` (any shape) and return ``x``."""
        lo, hi = _finite_range(self._host(x), type(self).__name__)
        if lo is not None:
            self._update(lo, hi)
        return x

    def _update(self, lo, hi):
        self.min_val = np.minimum(self.min_val, lo)
        self.max_val = np.maximum(self.max_val, hi)


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Exponential moving average of each batch's min and max:
    ``min_val += averaging_constant * (batch_min - min_val)`` (the first batch
    sets them). Parameters as :class:`MinMaxObserver`, plus
    ``averaging_constant`` in (0, 1], default 0.01.

    Raises
    ------
    TypeError, ValueError
        As :class:`MinMaxObserver`; averaging_constant outside (0, 1].

    Example
    -------
    >>> obs = nbops.quant.MovingAverageMinMaxObserver(averaging_constant=0.5)
    >>> for b in (np.array([0.0, 2.0]), np.array([0.0, 4.0])):
    ...     _ = obs(b)
    >>> float(obs.max_val)
    3.0
    """

    def __init__(self, averaging_constant=0.01, dtype=np.uint8, qscheme="per_tensor_affine",
                 reduce_range=False):
        super().__init__(dtype, qscheme, reduce_range)
        c = float(averaging_constant)
        if not 0.0 < c <= 1.0:
            raise ValueError(f"MovingAverageMinMaxObserver: 'averaging_constant' must be in "
                             f"(0, 1], got {averaging_constant!r}")
        self.averaging_constant = c

    def _update(self, lo, hi):
        if not np.isfinite(self.min_val):
            self.min_val, self.max_val = np.float32(lo), np.float32(hi)
        else:
            c = np.float32(self.averaging_constant)
            self.min_val = np.float32(self.min_val + c * (lo - self.min_val))
            self.max_val = np.float32(self.max_val + c * (hi - self.max_val))


class PerChannelMinMaxObserver(_Observer):
    """Running min and max of each slice along ``ch_axis`` (for per-channel
    weight quantization); :meth:`calculate_qparams` returns a float32 array of
    scales and an int32 array of zero points.

    Parameters
    ----------
    ch_axis : int, default 0 (output channels of Linear and Conv2d weights)
    dtype : numpy.int8 (default) or numpy.uint8
    qscheme : "per_channel_symmetric" (default) or "per_channel_affine"
    reduce_range : bool

    Raises
    ------
    TypeError, ValueError
        As :class:`MinMaxObserver`; data whose channel count changes between
        calls or whose ``ch_axis`` is out of range.

    Example
    -------
    >>> obs = nbops.quant.PerChannelMinMaxObserver(dtype=np.int8)
    >>> _ = obs(np.array([[1.0, -0.5], [0.0, 2.54]], np.float32))
    >>> obs.calculate_qparams()
    (array([0.00784314, 0.01992157], dtype=float32), array([0, 0], dtype=int32))
    """

    _schemes = ("per_channel_affine", "per_channel_symmetric")

    def __init__(self, ch_axis=0, dtype=np.int8, qscheme="per_channel_symmetric",
                 reduce_range=False):
        super().__init__(dtype, qscheme, reduce_range)
        self.ch_axis = int(ch_axis)
        self.min_val = self.max_val = None

    def __call__(self, x):
        """Record each channel's range of ``x`` and return ``x``."""
        data = self._host(x)
        name = type(self).__name__
        if not -data.ndim <= self.ch_axis < data.ndim:
            raise ValueError(f"{name}: ch_axis {self.ch_axis} is out of range for data of "
                             f"shape {data.shape}")
        rows = np.moveaxis(data, self.ch_axis, 0).reshape(data.shape[self.ch_axis], -1)
        if rows.shape[1] == 0:
            return x
        finite = np.isfinite(rows)
        lo = np.where(finite, rows, np.inf).min(axis=1).astype(np.float32)
        hi = np.where(finite, rows, -np.inf).max(axis=1).astype(np.float32)
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
        elif self.min_val.shape != lo.shape:
            raise ValueError(f"{name}: data has {lo.shape[0]} channels along axis "
                             f"{self.ch_axis}, earlier data had {self.min_val.shape[0]}")
        else:
            self.min_val = np.minimum(self.min_val, lo)
            self.max_val = np.maximum(self.max_val, hi)
        return x

    def calculate_qparams(self):
        if self.min_val is None:
            warnings.warn(f"{type(self).__name__}: no data observed yet; returning the "
                          "default scale 1.0 and zero point 0", RuntimeWarning, stacklevel=2)
            return np.ones(1, np.float32), np.zeros(1, np.int32)
        return super().calculate_qparams()


class HistogramObserver(_Observer):
    """A histogram of the observed values, and the clipping range that
    minimises the quantization error over it (PyTorch's HistogramObserver).

    Values are counted in ``bins`` equal bins over the running [min, max];
    when new data widens the range, the old counts are spread uniformly
    over the new bins they overlap. :meth:`calculate_qparams` runs PyTorch's
    ``_non_linear_param_search``: starting from the full range, it moves
    whichever end drops less mass (quantiles in steps of 1e-5) and keeps the
    narrower range while the L2 quantization error -- rounding error inside
    the range (``delta**2 / 12`` per destination bin, integrated over the
    source density) plus clipping error outside -- does not grow; then the
    (scale, zero_point) formula of the module docstring over that range.

    Parameters
    ----------
    bins : int >= 2, default 2048
    dtype : numpy.int8 or numpy.uint8 (default)
    qscheme : "per_tensor_affine" (default) or "per_tensor_symmetric"
    reduce_range : bool

    Raises
    ------
    TypeError, ValueError
        As :class:`MinMaxObserver`; bins < 2.

    Example
    -------
    >>> rng = np.random.default_rng(0)
    >>> obs = nbops.quant.HistogramObserver()
    >>> x = np.concatenate([rng.normal(size=1_000_000), [40.0]]).astype(np.float32)
    >>> _ = obs(x)
    >>> mm = nbops.quant.MinMaxObserver()
    >>> _ = mm(x)
    >>> obs.calculate_qparams()[0] < mm.calculate_qparams()[0]   # the outlier is clipped
    True
    """

    def __init__(self, bins=2048, dtype=np.uint8, qscheme="per_tensor_affine",
                 reduce_range=False):
        super().__init__(dtype, qscheme, reduce_range)
        if int(bins) < 2:
            raise ValueError(f"HistogramObserver: 'bins' must be >= 2, got {bins!r}")
        self.bins = int(bins)
        self.histogram = np.zeros(self.bins, np.float64)
        # PyTorch: 2**bits destination bins (all 256 codes, even with reduce_range)
        self.dst_nbins = 256

    def __call__(self, x):
        """Add ``x``'s values to the histogram and return ``x``."""
        data = self._host(x).reshape(-1)
        data = data[np.isfinite(data)]
        if data.size == 0:
            return x
        lo, hi = np.float32(data.min()), np.float32(data.max())
        if not np.isfinite(self.min_val):
            self.min_val, self.max_val = lo, hi
            self.histogram = _histogram(data, lo, hi, self.bins)
            return x
        new_lo, new_hi = min(self.min_val, lo), max(self.max_val, hi)
        if new_lo != self.min_val or new_hi != self.max_val:
            self.histogram = _rebin(self.histogram, self.min_val, self.max_val,
                                    new_lo, new_hi)
            self.min_val, self.max_val = np.float32(new_lo), np.float32(new_hi)
        self.histogram = self.histogram + _histogram(data, self.min_val, self.max_val,
                                                     self.bins)
        return x

    def calculate_qparams(self):
        if not np.isfinite(self.min_val):
            return super().calculate_qparams()
        if self.max_val == self.min_val:  # a constant: nothing to search
            lo, hi = self.min_val, self.max_val
        else:
            lo, hi = self._non_linear_param_search()
        return _qparams_scalar(lo, hi, self)

    def _non_linear_param_search(self):
        total = float(self.histogram.sum())
        csum = np.cumsum(self.histogram).tolist()
        bins = self.bins
        step = 1e-5
        alpha, beta = 0.0, 1.0
        start, end = 0, bins - 1
        norm_min = float("inf")
        while alpha < beta:
            next_alpha, next_beta = alpha + step, beta - step
            # first l >= start with csum[l] > next_alpha * total (capped at end),
            # last r <= end with csum[r] < next_beta * total (floored at start)
            l = min(max(bisect.bisect_right(csum, next_alpha * total), start), end)
            r = max(min(bisect.bisect_left(csum, next_beta * total) - 1, end), start)
            next_start, next_end = start, end
            if (l - start) > (end - r):
                next_start, alpha = l, next_alpha
            else:
                next_end, beta = r, next_beta
            if next_start == start and next_end == end:
                continue
            norm = self._quantization_error(next_start, next_end)
            if norm > norm_min:
                break
            norm_min = norm
            start, end = next_start, next_end
        width = (float(self.max_val) - float(self.min_val)) / bins
        return (np.float32(float(self.min_val) + width * start),
                np.float32(float(self.min_val) + width * (end + 1)))

    def _quantization_error(self, start, end):
        """PyTorch's ``_compute_quantization_error``: the L2 error of
        quantizing the histogram's density to ``dst_nbins`` levels spread
        over bins ``start..end``."""
        width = (float(self.max_val) - float(self.min_val)) / self.bins
        dst_width = width * (end - start + 1) / self.dst_nbins
        if dst_width == 0.0:
            return 0.0
        src = np.arange(self.bins, dtype=np.float64)
        begin = (src - start) * width
        stop = begin + width
        top = self.dst_nbins - 1
        dst_begin = np.clip(np.floor(begin / dst_width), 0, top)
        dst_begin_center = (dst_begin + 0.5) * dst_width
        dst_end = np.clip(np.floor(stop / dst_width), 0, top)
        dst_end_center = dst_end * dst_width + dst_width / 2
        density = self.histogram / width
        half = dst_width / 2
        norm = _norm(begin - dst_begin_center, half, density)
        norm = norm + (dst_end - dst_begin - 1) * _norm(-half, half, density)
        norm = norm + _norm(-half, stop - dst_end_center, density)
        return float(norm.sum())

    def extra_repr(self):
        return f"bins={self.bins}, " + super().extra_repr()


def _norm(delta_begin, delta_end, density):
    return density * (delta_end ** 3 - delta_begin ** 3) / 3


def _qparams_scalar(lo, hi, obs):
    scale, zp = _qparams(lo, hi, obs.quant_min, obs.quant_max, obs.symmetric, obs.dtype,
                         type(obs).__name__)
    return float(scale), int(zp)


def _finite_range(data, name):
    if data.size == 0:
        return None, None
    lo, hi = np.float32(np.min(data)), np.float32(np.max(data))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        finite = data[np.isfinite(data)]
        if finite.size == 0:
            raise ValueError(f"{name}: the data holds no finite values")
        lo, hi = np.float32(finite.min()), np.float32(finite.max())
    return lo, hi


def _histogram(data, lo, hi, bins):
    if hi == lo:  # all mass in one point: the first bin (torch.histc does the same)
        h = np.zeros(bins, np.float64)
        h[0] = data.size
        return h
    return np.histogram(data, bins=bins, range=(float(lo), float(hi)))[0].astype(np.float64)


def _rebin(hist, lo, hi, new_lo, new_hi):
    """Spread ``hist`` (bins over [lo, hi]) over the same number of bins on
    [new_lo, new_hi], each old bin's count uniformly over its width: the
    cumulative count is interpolated linearly at the new edges."""
    bins = hist.size
    if hi == lo:  # a point mass: it lands in the bin containing lo
        out = np.zeros(bins, np.float64)
        k = min(int((float(lo) - float(new_lo)) / (float(new_hi) - float(new_lo)) * bins),
                bins - 1)
        out[k] = hist.sum()
        return out
    old_edges = np.linspace(float(lo), float(hi), bins + 1)
    new_edges = np.linspace(float(new_lo), float(new_hi), bins + 1)
    cum = np.concatenate([[0.0], np.cumsum(hist)])
    return np.diff(np.interp(new_edges, old_edges, cum))
