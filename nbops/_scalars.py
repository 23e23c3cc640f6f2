"""Plain-Python functions (per element, per row) that both devices' kernel
modules compile: the CPU module with ``register_jitable`` or ``cpu_kernel``, the CUDA
module as device functions (:func:`nbops._codegen.twins`). Device-neutral:
no Numba here, so that CUDA kernel modules need no CPU kernel module.
Kernels compile these into themselves; ``_jit.SHARED_SOURCES`` keys their
disk caches on this file.
"""

import math

from ._formulas import m as approx  # lazy nbops.cpu._approx; math twins on CUDA

__all__ = ["offsets", "sgd_update", "adam_update", "row_max", "row_sum_exp", "row_loss",
           "row_grad", "bce_term", "bce_grad_term", "merge_rows", "stable_argsort",
           "canonical_count", "canonical_fill_row"]


def offsets(u, shape, dstr, sstr, doff, soff, skip0, skip1):
    """Destination and source offsets of the C-order multi-index ``u`` over
    the axes other than ``skip0``/``skip1`` (those the caller loops over
    itself). Compiled by :mod:`nbops.cpu.tensor` and, as a device function, by
    :mod:`nbops.cuda.tensor`."""
    for k in range(len(shape) - 1, -1, -1):
        if k == skip0 or k == skip1:
            continue
        q = u // shape[k]
        i = u - q * shape[k]
        u = q
        doff += i * dstr[k]
        soff += i * sstr[k]
    return doff, soff


# --- optimizers (nbops.optim): one parameter element per call ---------------


def sgd_update(i, p, g, buf, s):
    # s = (lr, weight_decay, keep, mix, momentum, nesterov, use_buffer): buf = keep*buf + mix*d
    lr, wd, keep, mix, momentum, nesterov, use_buffer = s
    d = g[i] + wd * p[i]
    if use_buffer:
        b = keep * buf[i] + mix * d
        buf[i] = b
        d = d + momentum * b if nesterov else b
    p[i] -= lr * d


def adam_update(i, p, g, m, v, s):
    # s = (b1, 1-b1, b2, 1-b2, l2, decay, step_size, inv_sqrt_bc2, eps)
    b1, c1, b2, c2, l2, decay, step_size, inv_sqrt_bc2, eps = s
    gi = g[i] + l2 * p[i]
    mi = b1 * m[i] + c1 * gi
    vi = b2 * v[i] + c2 * gi * gi
    m[i] = mi
    v[i] = vi
    p[i] = p[i] * decay - step_size * mi / (math.sqrt(vi) * inv_sqrt_bc2 + eps)


# --- losses (nbops.nn.losses): cross-entropy rows, BCE-with-logits terms -----
# ``approx``: vectorizable exponentials on the CPU, a module of math twins
# in nbops.nn.cuda.


def row_max(x, i):
    m = x[i, 0]
    for j in range(1, x.shape[1]):
        v = x[i, j]
        # NaN wins, as in a NaN-propagating max
        m = v if (v > m) | (v != v) else m
    return m


def row_sum_exp(x, i, m, zero):
    s = zero
    for j in range(x.shape[1]):
        s += approx.exp_nonpos(x[i, j] - m)
    return s


def row_loss(x, t, i, zero):
    m = row_max(x, i)
    return m + math.log(row_sum_exp(x, i, m, zero)) - x[i, t[i]]


def row_grad(x, t, grow, out, i, zero):
    """``out[i] = grow[i] * (softmax(x[i]) - onehot(t[i]))``."""
    m = row_max(x, i)
    scale = grow[i] / row_sum_exp(x, i, m, zero)
    for j in range(x.shape[1]):
        out[i, j] = approx.exp_nonpos(x[i, j] - m) * scale
    out[i, t[i]] -= grow[i]


def bce_term(x, t, p, c):
    # max(x, 0) - x t + log(1 + exp(-|x|)): no overflow for any x
    return (x if x > c.zero else c.zero) - x * t + approx.log1p(approx.exp_nonpos(-abs(x)))


def bce_grad_term(x, t, p, c):
    # sigmoid(x) - t, with the sigmoid from exp(-|x|)
    e = approx.exp_nonpos(-abs(x))
    s = c.one / (c.one + e)
    return (s if x >= c.zero else e * s) - t


# --- sparse (nbops.sparse.add): C = alpha * A + beta * B, a merge of sorted rows


def merge_rows(a_data, a_ind, a0, a1, b_data, b_ind, b0, b1, alpha, beta, data, ind, p, fill):
    """Merges one row of A (``a0:a1``) with one of B (``b0:b1``) into
    ``data``/``ind`` from position ``p`` (only counted unless ``fill``);
    returns the number of entries. Plain Python, compiled for both devices."""
    i = a0
    j = b0
    n = 0
    while i < a1 or j < b1:
        ca = a_ind[i] if i < a1 else -1
        cb = b_ind[j] if j < b1 else -1
        take_a = cb < 0 or (ca >= 0 and ca <= cb)
        take_b = ca < 0 or (cb >= 0 and cb <= ca)
        if fill:
            if take_a:
                v = alpha * a_data[i]
                if take_b:
                    v += beta * b_data[j]
            else:
                v = beta * b_data[j]
            ind[p + n] = ca if take_a else cb
            data[p + n] = v
        if take_a:
            i += 1
        if take_b:
            j += 1
        n += 1
    return n


#: Runs sorted by insertion before the merge passes of :func:`stable_argsort`.
ARGSORT_RUN = 16


def stable_argsort(keys, a, b, order, scratch, s0):
    """``order[a:b]`` = the positions a..b-1 sorted stably by ``keys``:
    insertion sort of short runs, then bottom-up merges through
    ``scratch[s0:s0 + b - a]``. Hand-written (compiled by
    :mod:`nbops.sparse.cpu` and, as a device function, :mod:`nbops.sparse.cuda`,
    so both devices order equal keys alike): ``np.argsort(kind="mergesort")``
    took 17 s to compile per dtype and does not exist on CUDA."""
    for i in range(a, b):
        order[i] = i
    for r0 in range(a, b, ARGSORT_RUN):
        r1 = min(b, r0 + ARGSORT_RUN)
        for i in range(r0 + 1, r1):
            p = order[i]
            j = i
            while j > r0 and keys[order[j - 1]] > keys[p]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = p
    width = ARGSORT_RUN
    while width < b - a:
        for l0 in range(a, b, 2 * width):
            mid = min(b, l0 + width)
            hi = min(b, l0 + 2 * width)
            if mid >= hi or keys[order[mid - 1]] <= keys[order[mid]]:
                continue  # already in order
            base = s0 - l0
            for i in range(l0, mid):
                scratch[base + i] = order[i]
            i, j, k = l0, mid, l0
            while i < mid and j < hi:
                if keys[order[j]] < keys[scratch[base + i]]:
                    order[k] = order[j]
                    j += 1
                else:
                    order[k] = scratch[base + i]
                    i += 1
                k += 1
            while i < mid:
                order[k] = scratch[base + i]
                i += 1
                k += 1
        width *= 2


def canonical_count(indices, a, b, order, merge):
    """Entries of a CSR row (positions a..b-1, ``order`` their column-sorted
    permutation) in canonical form: all of them, or with ``merge`` the
    distinct columns."""
    c = 0
    for i in range(a, b):
        if not merge or i == a or indices[order[i]] != indices[order[i - 1]]:
            c += 1
    return c


def canonical_fill_row(r, data, indices, indptr, order, merge, new_ptr, new_data, new_indices):
    """Row ``r`` of the canonical matrix: its entries in column order from
    ``new_ptr[r]``, with ``merge`` duplicates summed in that order (so both
    devices add them alike)."""
    p = new_ptr[r] - 1
    for i in range(indptr[r], indptr[r + 1]):
        src = order[i]
        col = indices[src]
        if merge and p >= new_ptr[r] and new_indices[p] == col:
            new_data[p] += data[src]
        else:
            p += 1
            new_data[p] = data[src]
            new_indices[p] = col
