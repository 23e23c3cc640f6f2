"""CPU kernels of the quantization operators (:mod:`nbops.quant`).

Launchers take arrays the front end has checked and allocated (C-contiguous)
and the scalar parameters it derived, and return the output.

* ``quantize`` / ``dequantize``: one vectorised pass. A per-tensor call is a
  flat ``prange`` over elements; a per-channel call sees the array as
  ``(outer, channels, inner)`` and runs ``prange`` over ``outer * channels``
  rows with a unit-stride inner loop. Quantization *divides* by the scale
  (ONNX QuantizeLinear does; ``x * (1 / s)`` rounds differently at ties), so
  its kernels compile without ``arcp`` (or any fast-math flag).
* ``add``: the integer-only formula of TFLite/XNNPACK (inputs shifted left
  by 20 bits, each scaled by a fixed-point multiplier, summed, requantized),
  or the float path; ``add_relu`` is ``add`` with the lower clamp at the
  output zero point.
* ``max_pool2d`` on the integers (max commutes with the monotone affine map),
  ``adaptive_avg_pool2d`` summing in int32 and requantizing each output with
  a per-window multiplier (windows differ in size).
"""

import numpy as np
from numba import prange
from numba.extending import register_jitable

from .._jit import cpu_kernel
from ._requant import INT32_MAX, INT32_MIN, requantize, requantize_float

__all__ = ["quantize", "dequantize", "add", "relu", "max_pool2d", "adaptive_avg_pool2d"]

#: TFLite's left shift for 8-bit add: (q - zp) < 2**9, so 2**29 fits int32
#: with room for the sum, and 20 bits keep the rescale exact to ~2**-20.
ADD_LEFT_SHIFT = 20


def quantize(x, scales, zero_points, qmin, qmax, out, inner):
    """``out = saturate(rint(x / scale) + zero_point)``. ``scales`` (x's
    dtype) and ``zero_points`` (int32) have one entry per channel; a single
    entry means per tensor. ``inner`` is the product of the dimensions after
    the channel axis."""
    xf, of = x.reshape(-1), out.reshape(-1)
    if scales.size == 1:
        _quantize_flat(xf, scales[0], zero_points[0], qmin, qmax, of)
    elif xf.size:
        _quantize_rows(xf, scales, zero_points, qmin, qmax, of, inner)
    return out


def dequantize(q, scales, zero_points, out, inner):
    """``out = (q - zero_point) * scale`` (scales in out's dtype)."""
    qf, of = q.reshape(-1), out.reshape(-1)
    if scales.size == 1:
        _dequantize_flat(qf, scales[0], zero_points[0], of)
    elif qf.size:
        _dequantize_rows(qf, scales, zero_points, of, inner)
    return out


@cpu_kernel(parallel=True, fastmath=frozenset())
def _quantize_flat(x, scale, zp, qmin, qmax, out):
    lo, hi, z = x.dtype.type(qmin), x.dtype.type(qmax), x.dtype.type(zp)
    for i in prange(x.size):
        out[i] = _quantize_one(x[i], scale, z, lo, hi)


@cpu_kernel(parallel=True, fastmath=frozenset())
def _quantize_rows(x, scales, zps, qmin, qmax, out, inner):
    lo, hi = x.dtype.type(qmin), x.dtype.type(qmax)
    channels = scales.size
    for r in prange(x.size // inner):
        c = r % channels
        s, z = scales[c], x.dtype.type(zps[c])
        base = r * inner
        for j in range(inner):
            out[base + j] = _quantize_one(x[base + j], s, z, lo, hi)


@cpu_kernel(parallel=True)
def _dequantize_flat(q, scale, zp, out):
    for i in prange(q.size):
        out[i] = out.dtype.type(np.int32(q[i]) - zp) * scale


@cpu_kernel(parallel=True)
def _dequantize_rows(q, scales, zps, out, inner):
    channels = scales.size
    for r in prange(q.size // inner):
        c = r % channels
        s, z = scales[c], zps[c]
        base = r * inner
        for j in range(inner):
            out[base + j] = out.dtype.type(np.int32(q[base + j]) - z) * s


@register_jitable(inline="always")
def _quantize_one(x, scale, zp, lo, hi):
    v = np.rint(x / scale) + zp
    # NaN maps to the zero point (real 0); min/max written as selects vectorize
    v = zp if v != v else v
    v = lo if v < lo else v
    return hi if v > hi else v


# --- add ------------------------------------------------------------------------


def add(a, b, out, iparams, fparams, fixed):
    """Quantized ``a + b`` into ``out`` (all C-contiguous, same shape).

    ``iparams`` (int64): za, zb, zo, lo, hi, m_a, shift_a, m_b, shift_b,
    m_out, shift_out; ``fparams`` (float64): sa / so, sb / so. ``lo`` is qmin
    for add and max(qmin, zo) for add_relu."""
    if a.size:
        (_add_fixed if fixed else _add_float)(a.reshape(-1), b.reshape(-1), out.reshape(-1),
                                             iparams, fparams)
    return out


@cpu_kernel(parallel=True)
def _add_fixed(a, b, out, ip, fp):
    za, zb, zo, lo, hi = ip[0], ip[1], ip[2], ip[3], ip[4]
    ma, sa, mb, sb, mo, so = ip[5], ip[6], ip[7], ip[8], ip[9], ip[10]
    for i in prange(a.size):
        xa = (np.int64(a[i]) - za) << ADD_LEFT_SHIFT
        xb = (np.int64(b[i]) - zb) << ADD_LEFT_SHIFT
        total = (requantize(xa, ma, sa, 0, INT32_MIN, INT32_MAX)
                 + requantize(xb, mb, sb, 0, INT32_MIN, INT32_MAX))
        out[i] = requantize(total, mo, so, zo, lo, hi)


# no "contract": an FMA would round (a - za) * ra + (b - zb) * rb differently
@cpu_kernel(parallel=True, fastmath=frozenset())
def _add_float(a, b, out, ip, fp):
    za, zb, zo, lo, hi = ip[0], ip[1], ip[2], ip[3], ip[4]
    ra, rb = fp[0], fp[1]
    for i in prange(a.size):
        v = np.rint((np.int64(a[i]) - za) * ra + (np.int64(b[i]) - zb) * rb) + zo
        v = lo if v < lo else v
        out[i] = hi if v > hi else v


def relu(q, zero_point, out):
    """``max(q, zero_point)``: NumPy's ufunc already runs at memory speed."""
    np.maximum(q, q.dtype.type(zero_point), out=out)
    return out


# --- pooling --------------------------------------------------------------------


def max_pool2d(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    """Max over each window of the NCHW integers; padding never wins."""
    if out.size:
        n, c, h, w = x.shape
        _max_pool2d(x.reshape(n * c, h, w), out.reshape(n * c, out.shape[2], out.shape[3]),
                    kh, kw, sh, sw, ph, pw, dh, dw)
    return out


@cpu_kernel(parallel=True)
def _max_pool2d(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    h, w = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    for p in prange(x.shape[0]):
        for i in range(oh):
            for j in range(ow):
                best = np.int32(-1 << 30)
                for u in range(kh):
                    y = i * sh - ph + u * dh
                    if y < 0 or y >= h:
                        continue
                    for v in range(kw):
                        z = j * sw - pw + v * dw
                        if z >= 0 and z < w:
                            e = np.int32(x[p, y, z])
                            best = e if e > best else best
                out[p, i, j] = best


def adaptive_avg_pool2d(x, out, zi, zo, qmin, qmax, mult, shift, fscale, fixed):
    """Average over PyTorch's adaptive windows, requantized per output
    position: ``mult``/``shift`` (int32, fixed point) or ``fscale``
    (float64) hold ``s_in / (s_out * window_size)`` for each of the
    ``oh * ow`` positions."""
    if out.size:
        n, c, h, w = x.shape
        _adaptive_avg_pool2d(x.reshape(n * c, h, w),
                             out.reshape(n * c, out.shape[2], out.shape[3]),
                             zi, zo, qmin, qmax, mult, shift, fscale, fixed)
    return out


@cpu_kernel(parallel=True)
def _adaptive_avg_pool2d(x, out, zi, zo, qmin, qmax, mult, shift, fscale, fixed):
    h, w = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    for p in prange(x.shape[0]):
        for i in range(oh):
            y0, y1 = (i * h) // oh, -((-(i + 1) * h) // oh)
            for j in range(ow):
                z0, z1 = (j * w) // ow, -((-(j + 1) * w) // ow)
                acc = np.int32(0)
                for y in range(y0, y1):
                    for z in range(z0, z1):
                        acc += np.int32(x[p, y, z])
                acc -= np.int32(zi * (y1 - y0) * (z1 - z0))
                k = i * ow + j
                if fixed:
                    out[p, i, j] = requantize(acc, mult[k], shift[k], zo, qmin, qmax)
                else:
                    out[p, i, j] = requantize_float(acc, fscale[k], zo, qmin, qmax)
