"""Files nbops reads, damaged: truncated at every length class and with
bytes flipped. Each must give a clean fallback or a clear error, never a
crash, a hang or a wrong result.

* The autotune cache (nbops/autotune.py): a damaged file is ignored with
  an AutotuneCacheWarning (or a damaged entry re-tuned); the tuned call
  still returns the right value and rewrites a valid file.
"""

import json
import warnings

import numpy as np
import pytest

from nbops import autotune as at

#: damaged copies per file (in-process, each a JSON parse and a lookup)
MUTATIONS = 120


def _mutations(blob, count, seed=0):
    """Truncations (every length below 64 bytes, then spread over the rest)
    and copies with 1 to 4 bytes flipped (random bits, or a byte replaced
    by one of JSON's structural characters)."""
    r = np.random.default_rng(seed)
    cuts = sorted(set(list(range(min(64, len(blob)))) + list(
        r.integers(0, len(blob), count // 3))))
    for n in cuts:
        yield f"truncated to {n} bytes", blob[:n]
    for _ in range(count - len(cuts)):
        b = bytearray(blob)
        for _ in range(r.integers(1, 5)):
            i = int(r.integers(0, len(b)))
            b[i] = (b[i] ^ (1 << int(r.integers(0, 8)))) if r.random() < 0.6 else \
                int(r.choice(list(b'{}[]",:0-e.9 \x00\xff')))
        yield "bytes flipped", bytes(b)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NBOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NBOPS_AUTOTUNE", "1")
    monkeypatch.setattr(at, "_machine_busy", lambda: None)
    return tmp_path


CONFIGS = [{"step": 1}, {"step": 2}, {"step": 3}]


def _tuner():
    """A fresh tuner (nothing in memory: it reads the file), whose every
    config computes the same value."""
    @at.autotune(configs=CONFIGS, key=["n"], default={"step": 1}, name="test.hostile",
                 repeat=1, warmup=0)
    def count(x, n, step):
        return x * n + 0 * step

    return count


def test_damaged_autotune_cache_falls_back(cache_dir):
    x = np.ones(3)
    for n in (2, 3, 5):
        _tuner()(x, n=n)            # a valid cache file with three entries
    path = at.cache_path(at.device_name())
    blob = open(path, "rb").read()
    assert set(json.loads(blob)["entries"]) and len(blob) > 200
    seen = set()
    for what, damaged in _mutations(blob, MUTATIONS):
        with open(path, "wb") as f:
            f.write(damaged)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", at.AutotuneCacheWarning)
            for n in (2, 3, 5):
                np.testing.assert_array_equal(_tuner()(x, n=n), x * n, err_msg=what)
        rewritten = json.loads(open(path, "rb").read())   # still (or again) valid JSON
        assert isinstance(rewritten.get("entries"), dict), what
        seen.add(what.split(" ")[0])
    assert seen == {"truncated", "bytes"}
