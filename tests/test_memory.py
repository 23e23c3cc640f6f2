"""The memory helpers of nbops.cpu._memory (non-temporal line stores, the
span streamer with its carried partial lines) and the cache-line aligned
outputs of nbops._checks.empty."""

import numpy as np
import pytest
from numba import njit

from nbops import _checks
from nbops.cpu import _memory


@njit(cache=False)
def _write_spans(dst, src, lengths, a, b):
    # consecutive spans of dst, in order, as a row kernel writes its rows
    carry = np.empty(_memory.LINE // dst.itemsize, dst.dtype)
    o = 0
    for i in range(lengths.size):
        n = lengths[i]
        _memory.stream_rows(dst, o, src[o:o + n], a, b, carry, i == 0, i == lengths.size - 1)
        o += n


def _offset_array(n, dtype, offset):
    """A 1-D array of n elements starting ``offset`` bytes past a line."""
    raw = np.zeros(n * np.dtype(dtype).itemsize + 2 * _memory.LINE, np.uint8)
    start = -raw.ctypes.data % _memory.LINE + offset
    return raw[start:start + n * np.dtype(dtype).itemsize].view(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [0, 8, 16, 48])
@pytest.mark.parametrize("lengths", [[32], [33, 40, 47], [512] * 5, [64, 1001, 35, 100]])
def test_stream_rows_writes_every_element_once(dtype, offset, lengths):
    lengths = np.array([n * 8 // np.dtype(dtype).itemsize for n in lengths])  # >= 2 lines
    total = int(lengths.sum())
    src = np.random.default_rng(0).standard_normal(total).astype(dtype)
    dst = _offset_array(total, dtype, offset)
    dst[:] = np.nan
    a, b = dtype(0.25), dtype(-3.0)
    _write_spans(dst, src, lengths, a, b)
    np.testing.assert_array_equal(dst, src * a + b)
    _write_spans(dst, np.full(total, -0.0, dtype), lengths, dtype(1.0), dtype(-0.0))  # a copy
    assert np.signbit(dst).all() and not dst.any()


def test_stream_rows_falls_back_for_arrays_not_aligned_to_their_items():
    raw = np.zeros(8 * 200 + 64, np.uint8)
    dst = raw[4:4 + 8 * 200].view(np.float64)     # 4 bytes past an 8-byte boundary
    assert dst.ctypes.data % 8 == 4
    src = np.arange(200, dtype=np.float64)
    _write_spans(dst, src, np.array([100, 100]), 2.0, 1.0)
    np.testing.assert_array_equal(dst, src * 2.0 + 1.0)


def test_stream_affine_is_rejected_for_mixed_types():
    @njit(cache=False)
    def bad(dst, src):
        _memory.stream_affine(dst, 0, src, 0, np.float32(1), np.float32(0))

    with pytest.raises(Exception, match="stream_affine"):
        bad(np.zeros(16, np.float32), np.zeros(16, np.float64))


def test_streams_only_large_outputs(monkeypatch):
    assert not _memory.streams(np.empty(1000, np.float32))
    assert _memory.streams(np.empty(_memory.STREAM_BYTES // 4, np.float32))
    monkeypatch.setattr(_memory, "STREAM_BYTES", 0)
    assert _memory.streams(np.empty(1, np.float32))


@pytest.mark.parametrize("shape,dtype", [((1024, 512), np.float32), ((3, 1000, 77), np.float64),
                                         ((_checks.ALIGN_FROM,), np.int8)])
def test_large_cpu_outputs_start_on_a_cache_line(shape, dtype):
    a = _checks.empty(shape, dtype, "cpu")
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % _checks.ALIGN == 0
    a[...] = 1
    assert a.sum() == a.size


def test_small_cpu_outputs_are_plain_numpy():
    a = _checks.empty((10, 10), np.float32, "cpu")
    assert a.flags.owndata and a.shape == (10, 10)
