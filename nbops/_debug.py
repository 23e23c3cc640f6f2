"""Debug mode: NaN/Inf checks on operator outputs and logging of every call.

Enabled by ``nbops.set_debug(True)`` or ``NBOPS_DEBUG=1``. An output holding
NaN or Inf when no input held one raises ``FloatingPointError`` naming the
operator, the output and the index of the first bad element.
"""

import logging

import numpy as np

from . import _dispatch

log = logging.getLogger("nbops")


def _host(x):
    if isinstance(x, np.ndarray):
        return x
    data = getattr(x, "data", None)  # autograd tensors
    if data is not None and getattr(x, "__nbops_tensor__", False):
        return _host(data)
    if _dispatch.is_device_array(x):
        return _dispatch.to_host(x)
    return None


def _arrays(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _arrays(v)
        else:
            h = _host(v)
            if h is not None and h.dtype.kind in "fc":
                yield h


def _describe(a):
    if a.size == 0:
        return f"{a.dtype}{list(a.shape)} (empty)"
    finite = a[np.isfinite(a)]
    rng = f"[{finite.min():.4g}, {finite.max():.4g}]" if finite.size else "[no finite values]"
    return f"{a.dtype}{list(a.shape)} range {rng}"


def check(op, args, kwargs, result):
    """Log the call and raise if ``result`` gained NaN/Inf the inputs lacked."""
    inputs = list(_arrays(list(args) + list(kwargs.values())))
    outputs = list(_arrays(result if isinstance(result, (list, tuple)) else [result]))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: inputs %s -> outputs %s", op,
                  ", ".join(_describe(a) for a in inputs) or "-",
                  ", ".join(_describe(a) for a in outputs) or "-")
    had_nan = any(np.isnan(a).any() for a in inputs)
    had_inf = any(np.isinf(a).any() for a in inputs)
    for k, a in enumerate(outputs):
        bad = (np.isnan(a) if not had_nan else np.zeros(a.shape, bool)) | \
              (np.isinf(a) if not had_inf else np.zeros(a.shape, bool))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise FloatingPointError(
                f"{op}: output {k} has {'NaN' if np.isnan(a[idx]) else 'Inf'} at index "
                f"{idx} although no input had one (nbops debug mode)")
