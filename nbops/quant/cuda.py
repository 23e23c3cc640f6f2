"""CUDA kernels of the quantization operators (:mod:`nbops.quant`), with the
CPU module's launcher signatures.

Elementwise kernels are grid-stride loops over the flat arrays (a
per-channel element finds its channel as ``(i // inner) % channels``);
pooling kernels run one thread per output element. The small parameter
arrays (per-channel scales, per-window multipliers) are copied to the
device by the launchers. The fixed-point requantization is the scalar code
of :mod:`nbops.quant._requant` compiled as device functions, so both
devices agree bit for bit. Rounding half to even is Python's ``round``,
which Numba lowers to libdevice's ``llrint`` on the GPU (and the simulator
runs as Python's). The float path of ``add`` may be contracted to an FMA
by NVVM, which can move an exact tie by one unit against the CPU (the fixed
path is exact on both).
"""

from numba import cuda

from ..cuda._launch import grid_1d
from ._requant import INT32_MAX, INT32_MIN, device_functions

__all__ = ["quantize", "dequantize", "add", "relu", "max_pool2d", "adaptive_avg_pool2d"]

_D = device_functions()
_requantize = _D["requantize"]
_requantize_float = _D["requantize_float"]

#: As :data:`nbops.quant.cpu.ADD_LEFT_SHIFT`.
ADD_LEFT_SHIFT = 20


def quantize(x, scales, zero_points, qmin, qmax, out, inner):
    """See :func:`nbops.quant.cpu.quantize`."""
    if x.size:
        _quantize[grid_1d(x.size)](x.reshape(x.size), cuda.to_device(scales),
                                   cuda.to_device(zero_points), qmin, qmax,
                                   out.reshape(out.size), inner)
    return out


def dequantize(q, scales, zero_points, out, inner):
    """See :func:`nbops.quant.cpu.dequantize`."""
    if q.size:
        _dequantize[grid_1d(q.size)](q.reshape(q.size), cuda.to_device(scales),
                                     cuda.to_device(zero_points), out.reshape(out.size),
                                     inner)
    return out


def add(a, b, out, iparams, fparams, fixed):
    """See :func:`nbops.quant.cpu.add`."""
    if a.size:
        _add[grid_1d(a.size)](a.reshape(a.size), b.reshape(b.size), out.reshape(out.size),
                              cuda.to_device(iparams), cuda.to_device(fparams), fixed)
    return out


def relu(q, zero_point, out):
    """See :func:`nbops.quant.cpu.relu`."""
    if q.size:
        _relu[grid_1d(q.size)](q.reshape(q.size), zero_point, out.reshape(out.size))
    return out


def max_pool2d(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    """See :func:`nbops.quant.cpu.max_pool2d`."""
    if out.size:
        _max_pool2d[grid_1d(out.size)](x, out, kh, kw, sh, sw, ph, pw, dh, dw)
    return out


def adaptive_avg_pool2d(x, out, zi, zo, qmin, qmax, mult, shift, fscale, fixed):
    """See :func:`nbops.quant.cpu.adaptive_avg_pool2d`."""
    if out.size:
        _adaptive_avg_pool2d[grid_1d(out.size)](
            x, out, zi, zo, qmin, qmax, cuda.to_device(mult), cuda.to_device(shift),
            cuda.to_device(fscale), fixed)
    return out


# --- kernels --------------------------------------------------------------------


@cuda.jit
def _quantize(x, scales, zps, qmin, qmax, out, inner):
    channels = scales.size
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = (i // inner) % channels
        v = x[i] / scales[c]
        if v != v:
            out[i] = zps[c]
        else:
            # saturates the same way (|q - zp| <= 383) and keeps round() finite
            v = -512.0 if v < -512.0 else (512.0 if v > 512.0 else v)
            r = round(v) + zps[c]  # llrint: half to even, as Python's round
            out[i] = qmin if r < qmin else (qmax if r > qmax else r)


@cuda.jit
def _dequantize(q, scales, zps, out, inner):
    channels = scales.size
    for i in range(cuda.grid(1), q.size, cuda.gridsize(1)):
        c = (i // inner) % channels
        out[i] = (q[i] - zps[c]) * scales[c]


@cuda.jit
def _add(a, b, out, ip, fp, fixed):
    za, zb, zo, lo, hi = ip[0], ip[1], ip[2], ip[3], ip[4]
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        da = int(a[i]) - za
        db = int(b[i]) - zb
        if fixed:
            total = (_requantize(da << ADD_LEFT_SHIFT, ip[5], ip[6], 0, INT32_MIN, INT32_MAX)
                     + _requantize(db << ADD_LEFT_SHIFT, ip[7], ip[8], 0, INT32_MIN,
                                   INT32_MAX))
            out[i] = _requantize(total, ip[9], ip[10], zo, lo, hi)
        else:
            r = round(da * fp[0] + db * fp[1]) + zo
            out[i] = lo if r < lo else (hi if r > hi else r)


@cuda.jit
def _relu(q, zp, out):
    for i in range(cuda.grid(1), q.size, cuda.gridsize(1)):
        v = q[i]
        out[i] = zp if v < zp else v


@cuda.jit
def _max_pool2d(x, out, kh, kw, sh, sw, ph, pw, dh, dw):
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = t % ow
        i = (t // ow) % oh
        p = t // (ow * oh)
        n, ch = p // c, p % c
        best = -(1 << 30)
        for u in range(kh):
            y = i * sh - ph + u * dh
            if y >= 0 and y < h:
                for v in range(kw):
                    z = j * sw - pw + v * dw
                    if z >= 0 and z < w:
                        e = x[n, ch, y, z]
                        if e > best:
                            best = e
        out[n, ch, i, j] = best


@cuda.jit
def _adaptive_avg_pool2d(x, out, zi, zo, qmin, qmax, mult, shift, fscale, fixed):
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = t % ow
        i = (t // ow) % oh
        p = t // (ow * oh)
        n, ch = p // c, p % c
        y0, y1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        z0, z1 = (j * w) // ow, -((-(j + 1) * w) // ow)
        acc = 0
        for y in range(y0, y1):
            for z in range(z0, z1):
                acc += int(x[n, ch, y, z])
        acc -= zi * (y1 - y0) * (z1 - z0)
        k = i * ow + j
        if fixed:
            out[n, ch, i, j] = _requantize(acc, mult[k], shift[k], zo, qmin, qmax)
        else:
            out[n, ch, i, j] = _requantize_float(acc, fscale[k], zo, qmin, qmax)
