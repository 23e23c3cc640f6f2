"""The autotuner: choosing, the JSON cache round trip, corrupted and foreign
cache files, NBOPS_AUTOTUNE=0, and the GEMM's use of it."""

import json
import os
import time
import warnings

import numpy as np
import pytest

import nbops
from nbops import autotune as at


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("NBOPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NBOPS_AUTOTUNE", "1")
    # no load readings: tunings are stored whatever else runs beside the
    # tests (test_disturbed_tuning_is_not_stored fakes them)
    monkeypatch.setattr(at, "_machine_busy", lambda: None)
    return tmp_path


CONFIGS = [{"delay": 0.04}, {"delay": 0.0}, {"delay": 0.02}]  # far apart: a busy machine


def make_tuner(calls, name="test.sleepy", **kw):
    @at.autotune(configs=CONFIGS, key=["n"], default={"delay": 0.02}, name=name,
                 repeat=3, **kw)
    def sleepy(x, n, delay):
        calls.append(delay)
        time.sleep(delay)
        return x * n

    return sleepy


def test_tunes_once_then_reuses_memory_and_disk():
    calls = []
    f = make_tuner(calls)
    x = np.ones(3, np.float32)
    assert (f(x, n=5) == 5).all()
    assert set(calls) == {0.04, 0.0, 0.02}            # every config was timed
    path = at.cache_path()
    data = json.load(open(path))
    assert data["device"] == at.device_name() and data["nbops"] == nbops.__version__
    (key, entry), = data["entries"].items()
    assert key == "test.sleepy|float32|n=8"             # bucketed to a power of two
    assert entry["config"] == {"delay": 0.0}
    calls.clear()
    f(x, n=7)                                           # same bucket: no timing
    assert calls == [0.0]
    calls2 = []
    g = make_tuner(calls2)                              # a new process, in effect
    g(x, n=6)
    assert calls2 == [0.0]
    g(x.astype(np.float64), n=6)                        # another dtype: tuned anew
    assert len(calls2) > 3


def test_disturbed_tuning_is_not_stored(monkeypatch):
    # other processes took 40% of the CPUs while the tuning ran: the choice
    # serves this process (no second tuning) but is not written to disk
    clock = {"busy": 100.0}
    monkeypatch.setattr(at, "_machine_busy", lambda: (clock["busy"], 2))
    calls = []
    f = make_tuner(calls)
    real_call = at.Autotuner._call

    def busy_call(self, args, kwargs, config):
        t0, p0 = time.perf_counter(), time.process_time()
        real_call(self, args, kwargs, config)
        # the others' CPU seconds: 40% of both CPUs over this call's wall
        # time, on top of what this process used
        clock["busy"] += 0.8 * (time.perf_counter() - t0) + (time.process_time() - p0)

    monkeypatch.setattr(at.Autotuner, "_call", busy_call)
    x = np.ones(3, np.float32)
    f(x, n=5)
    assert not os.path.exists(at.cache_path())
    calls.clear()
    f(x, n=5)
    assert calls == [0.0]                               # remembered in memory
    monkeypatch.setattr(at.Autotuner, "_call", real_call)
    g = make_tuner([], name="test.quiet")               # an idle machine: stored
    g(x, n=5)
    assert list(json.load(open(at.cache_path()))["entries"]) == ["test.quiet|float32|n=8"]


def test_load_watch_reads_proc_stat(monkeypatch):
    monkeypatch.undo()  # the real /proc/stat
    busy = at._machine_busy()
    if busy is None:
        pytest.skip("no /proc/stat here")
    assert busy[0] > 0 and busy[1] >= 1
    w = at._LoadWatch()
    share = w.others()
    assert share is not None and 0.0 <= share <= 1.0


def test_changed_candidates_are_tuned_again():
    # an entry stored by a tuner with other configs (one added since) is not
    # trusted: its choice could never be the new candidate
    calls = []
    make_tuner(calls)(np.ones(3, np.float32), n=5)
    global CONFIGS
    saved = CONFIGS
    CONFIGS = saved + [{"delay": 0.01}]
    try:
        calls2 = []
        make_tuner(calls2)(np.ones(3, np.float32), n=5)
        assert set(calls2) == {0.04, 0.0, 0.02, 0.01}   # tuned again, the new one too
        calls3 = []
        make_tuner(calls3)(np.ones(3, np.float32), n=5)
        assert calls3 == [0.0]                          # and stored again
    finally:
        CONFIGS = saved


def test_tuning_rounds_interleave_configs(monkeypatch):
    # each round times every config once, in alternating order, after one
    # warm-up run each: a burst of load then hits all configs alike
    monkeypatch.setattr(at, "WARM_UP", 0.0)
    monkeypatch.setattr(at, "ROUND_BUDGET", 0.0)
    calls = []
    f = make_tuner(calls)
    f(np.ones(2, np.float32), n=3)
    a, b, c = (cfg["delay"] for cfg in CONFIGS)
    assert calls[:3] == [a, b, c]                       # warm-up
    assert calls[3:12] == [a, b, c, c, b, a, a, b, c]   # three rounds
    assert calls[12:] == [b]                            # the call itself, with the winner


@pytest.mark.parametrize("budget,max_rounds,rounds", [(0.21, 31, 4), (10.0, 5, 5)])
def test_cheap_tunings_take_more_rounds(monkeypatch, budget, max_rounds, rounds):
    # rounds go on past ``repeat`` (3) while they took under ROUND_BUDGET
    # seconds (0.06 s a round here), up to MAX_ROUNDS
    monkeypatch.setattr(at, "WARM_UP", 0.0)
    monkeypatch.setattr(at, "ROUND_BUDGET", budget)
    monkeypatch.setattr(at, "MAX_ROUNDS", max_rounds)
    calls = []
    make_tuner(calls)(np.ones(2, np.float32), n=3)
    assert len(calls) == 3 + 3 * rounds + 1


def test_disabled_uses_default(monkeypatch):
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")
    calls = []
    f = make_tuner(calls)
    f(np.ones(2), n=3)
    assert calls == [0.02]
    assert not os.path.exists(at.cache_path())
    assert not at.enabled()


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]), "\x00\xff",
                                     json.dumps({"format": 1, "device": "Some Other CPU",
                                                 "nbops": nbops.__version__, "entries": {}}),
                                     json.dumps({"format": 1, "device": at.device_name(),
                                                 "nbops": "0.0.1", "entries": {}})])
def test_corrupted_or_foreign_cache_is_ignored(content):
    path = at.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="latin-1") as fh:
        fh.write(content)
    calls = []
    f = make_tuner(calls)
    with pytest.warns(at.AutotuneCacheWarning, match="ignoring"):
        assert (f(np.ones(2), n=2) == 2).all()
    assert len(calls) > 3                               # tuned instead
    data = json.load(open(path))                        # and replaced by a valid file
    assert data["device"] == at.device_name() and len(data["entries"]) == 1


@pytest.mark.parametrize("entry", [
    {"config": {"delay": 99}, "times": []},
    {"config": {"delay": 0.0}, "times": [[{"delay": 0.0}, 0.1, 9]]},   # not pairs
    {"config": {"delay": 0.0}, "times": [5, 6]},
], ids=["foreign-config", "triples", "numbers"])
def test_malformed_entry_is_ignored(entry):
    path = at.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    entries = {"test.sleepy|float64|n=2": entry}
    json.dump({"format": at.FORMAT, "device": at.device_name(), "nbops": nbops.__version__,
               "entries": entries}, open(path, "w"))
    calls = []
    f = make_tuner(calls)
    with pytest.warns(at.AutotuneCacheWarning, match="malformed"):
        f(np.ones(2), n=2)                      # tuned again, not a failing call
    assert 99 not in calls and set(calls) >= {0.04, 0.0, 0.02}


def test_unwritable_cache_dir_warns(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("NBOPS_CACHE_DIR", str(blocker / "sub"))
    f = make_tuner([])
    with pytest.warns(at.AutotuneCacheWarning, match="could not write"):
        assert (f(np.ones(2), n=2) == 2).all()


def test_failing_config_loses_and_all_failing_raises():
    def flaky(n, mode):
        if mode == "bad":
            raise RuntimeError("cannot run")
        return n

    tuner = at.Autotuner(flaky, [{"mode": "bad"}, {"mode": "good"}], key=["n"], name="t.flaky")
    assert tuner(n=3) == 3
    # asking for the config that failed at tuning time runs it: its own error
    # says why, not "no config matches"
    with pytest.raises(RuntimeError, match="cannot run"):
        tuner.run((), {"n": 3}, only={"mode": "bad"})
    broken = at.Autotuner(lambda n, mode: 1 / 0, [{"mode": "x"}], key=["n"], name="t.broken")
    with pytest.raises(ZeroDivisionError):
        broken(n=1)


def test_api_errors_and_module_call():
    with pytest.raises(ValueError, match="configs must not be empty"):
        at.autotune(configs=[], key=["n"])(lambda n: n)
    tuner = nbops.autotune(configs=[{"a": 1}], key=["n"])(lambda n, a: n + a)  # module call
    with pytest.raises(TypeError, match="key argument 'n' was not passed"):
        tuner()
    assert tuner(n=1) == 2
    with pytest.raises(ValueError, match="no config matches"):
        tuner.config_for((), {"n": 1}, only={"a": 5})
    assert callable(nbops.autotune.tune_main)


def test_tune_main(capsys, monkeypatch):
    ran = []
    monkeypatch.setitem(at._TUNINGS, "dummy", (lambda dt, q: ran.append((dt, q)), lambda: "d"))
    assert at.tune_main(["--list"]) == 0
    assert "gemm:" in capsys.readouterr().out
    assert at.tune_main(["--op", "dummy", "--dtype", "float64", "--quick", "--clear"]) == 0
    assert ran == [("float64", True)]
    assert "cache:" in capsys.readouterr().out
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")
    assert at.tune_main(["--op", "dummy"]) == 1


def test_gemm_is_tuned_and_impl_is_respected(monkeypatch):
    from nbops import linalg

    # small candidate list: tuning compiles nothing new for float64
    configs = [linalg.DEFAULT_CONFIG, {"impl": "blas", "MC": 0, "KC": 0, "NC": 0}]
    monkeypatch.setattr(linalg._cpu_gemm, "configs", configs)
    linalg._cpu_gemm.clear()
    a = np.random.default_rng(0).standard_normal((9, 7))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(nbops.matmul(a, a.T), a @ a.T, atol=1e-12)
    data = json.load(open(at.cache_path()))
    (key, entry), = data["entries"].items()
    assert key == "nbops.gemm|float64|m=16|n=16|k=8|batch=1|wt=True"  # B = a.T
    assert [c for c, _ in entry["times"]] == configs
    only = linalg._cpu_gemm.config_for((), {"m": 9, "n": 9, "k": 7, "batch": 1, "wt": True,
                                            "dtype": "float64"}, only={"impl": "nbops"})
    assert only == linalg.DEFAULT_CONFIG
    linalg._cpu_gemm.clear()


def test_only_configs_that_apply_are_timed_and_chosen():
    calls = []
    f = make_tuner(calls)
    x = np.ones(3, np.float32)

    def no_fast(c):
        return c["delay"] != 0.0

    assert f.config_for((x,), {"n": 5}, applies=no_fast) == {"delay": 0.02}
    assert set(calls) == {0.04, 0.02}                   # the other one never ran
    (key, entry), = json.load(open(at.cache_path()))["entries"].items()
    assert [c for c, _ in entry["times"]] == [{"delay": 0.04}, {"delay": 0.02}]
    calls.clear()
    # a call where every config applies: the entry misses one, tuned again
    assert f.config_for((x,), {"n": 5}) == {"delay": 0.0}
    assert set(calls) == {0.04, 0.0, 0.02}
    calls.clear()
    # an entry that timed more serves: the fastest that applies, no timing
    assert f.config_for((x,), {"n": 6}, applies=no_fast) == {"delay": 0.02}
    assert make_tuner(calls).config_for((x,), {"n": 6}, applies=no_fast) == {"delay": 0.02}
    assert calls == []
    # the remembered choices of a caller that knows its device keep them apart
    kw = {"n": 5, "dtype": "float32"}
    assert f.config_for((x,), kw, gpu=False, applies=no_fast) == {"delay": 0.02}
    assert f.config_for((x,), kw, gpu=False) == {"delay": 0.0}
    assert f.config_for((x,), kw, gpu=False, applies=no_fast) == {"delay": 0.02}
    with pytest.raises(ValueError, match="no config applies to this call"):
        f.config_for((x,), {"n": 5}, applies=lambda c: False)


def test_disabled_uses_the_default_where_it_applies(monkeypatch):
    # tuning off: the default if it applies, else the first config that does
    monkeypatch.setenv("NBOPS_AUTOTUNE", "0")
    f = make_tuner([])
    x = np.ones(2)
    assert f.config_for((x,), {"n": 3}, applies=lambda c: c["delay"] > 0) == {"delay": 0.02}
    assert f.config_for((x,), {"n": 3}, applies=lambda c: c["delay"] < 0.01) == {"delay": 0.0}
    with pytest.raises(ValueError, match="no config matches None and applies"):
        f.config_for((x,), {"n": 3}, applies=lambda c: False)


def test_conv_tunes_only_the_algorithms_that_apply(monkeypatch):
    # padding is not in the tuning key: with padding 0 the 4 x 4 map has
    # less output than one direct tile, with padding 3 it has enough
    from nbops import conv

    monkeypatch.setattr(at, "WARM_UP", 0.0)
    monkeypatch.setattr(at, "ROUND_BUDGET", 0.0)
    timed = []
    real_call = at.Autotuner._call

    def spy(self, args, kwargs, config):
        if self.name == "nbops.conv2d":
            timed.append(config["algo"])
        return real_call(self, args, kwargs, config)

    monkeypatch.setattr(at.Autotuner, "_call", spy)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 8, 4, 4)), rng.standard_normal((8, 8, 3, 3))
    conv._cpu_conv.clear()
    try:
        nbops.conv2d(x, w)
        assert set(timed) == {"igemm", "blas"}
        timed.clear()
        nbops.conv2d(x, w, padding=3)
        assert set(timed) == {"igemm", "blas", "direct"}   # a candidate was missing
        # the direct convolution made the stored winner: a pack of the
        # padding-0 call still plans without it, the padding-3 one with it
        (entry,) = conv._cpu_conv._memory.values()
        for pair in entry["times"]:
            pair[1] = 1e-9 if pair[0]["algo"] == "direct" else 1.0
        conv._cpu_conv._chosen.clear()
        timed.clear()
        plans = []
        for p in (0, 3):
            pack = nbops.conv_pack(w, input_shape=x.shape, padding=p)
            nbops.conv2d(x, pack)
            plans.append(pack.plan.algorithm)
        assert plans == ["igemm", "direct"] and timed == []
    finally:
        conv._cpu_conv.clear()


def test_processes_saving_at_once_keep_every_entry(tmp_path):
    # two processes merging entries into one cache file at the same time
    # (both start on a signal file): the cross-process lock keeps each
    # other's entries; without it about half were lost (223 of 400 by hand)
    import subprocess
    import sys

    path = str(tmp_path / "autotune-test.json")
    code = ("import os, sys, time; from nbops import autotune as at\n"
            "while not os.path.exists(sys.argv[1] + '.go'): time.sleep(0.001)\n"
            "for i in range(200):\n"
            "    at._save(sys.argv[1], 'dev', f'{sys.argv[2]}-{i}', {'config': {'i': i}})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, path, tag]) for tag in "ab"]
    time.sleep(1.5)   # both imported and waiting
    open(path + ".go", "w").close()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    entries = at._load(path, "dev")
    assert sorted(entries) == sorted(f"{t}-{i}" for t in "ab" for i in range(200))
