"""nbops.profiler: counts, shapes and devices of a known sequence of calls,
nesting and self time, compile time kept apart, the Chrome trace, the
table, the disabled state and the error paths."""

import json

import numpy as np
import pytest
from numba import njit

import nbops as nb
from helpers import to_dev
from nbops import _dispatch
from nbops.profiler import profile, record_function


def _by_key(prof, **kw):
    return {(a.key, tuple(map(tuple, a.input_shapes)) if a.input_shapes is not None
             else None): a for a in prof.key_averages(**kw)}


def test_counts_shapes_and_devices(device):
    x = to_dev(np.ones((4, 5), np.float32), device)
    y = to_dev(np.linspace(-1, 1, 7), device)
    nb.relu(x), nb.gelu(x)          # compile outside the block
    with profile(record_shapes=True) as prof:
        for _ in range(3):
            nb.relu(x)
        nb.gelu(x)
        nb.gelu(x, approximate="tanh")
        nb.relu(y)
    avgs = {a.key: a for a in prof.key_averages()}
    assert set(avgs) == {"relu", "gelu"}
    assert avgs["relu"].count == 4 and avgs["gelu"].count == 2
    assert avgs["relu"].devices == {device}
    for a in avgs.values():
        assert a.cpu_time_total > 0 and a.self_cpu_time_total == pytest.approx(a.cpu_time_total)
        assert (a.device_time_total > 0) == (device == "cuda")
        assert a.cuda_time_total == a.device_time_total
    grouped = _by_key(prof, group_by_input_shape=True)
    assert grouped["relu", ((4, 5),)].count == 3
    assert grouped["relu", ((7,),)].count == 1
    assert grouped["gelu", ((4, 5),)].count == 2
    events = prof.events()
    assert [e["name"] for e in events] == ["relu"] * 3 + ["gelu"] * 2 + ["relu"]
    assert events[-1]["input_dtypes"] == ["float64"] and events[0]["device"] == device
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="count", row_limit=2)
    lines = table.splitlines()
    assert "Self CPU %" in lines[1] and "# of Calls" in lines[1] and "Input Shapes" in lines[1]
    assert lines[3].startswith("relu") and "[[4, 5]]" in lines[3] and lines[3].split()[-3] == "3"
    assert ("Device total" in lines[1]) == (device == "cuda")
    assert len([ln for ln in lines if ln.startswith(("relu", "gelu"))]) == 2   # row_limit
    assert "Self CPU time total:" in table


def test_nested_ranges_and_operators():
    x = np.ones(10, np.float32)
    twice = nb.register_op("test_profiler_twice", cpu=lambda v: nb.relu(v) * 2)
    twice(x)
    with profile() as prof:
        with record_function("outer"):
            nb.relu(x)
            with record_function("inner"):
                twice(x)
    events = {e["name"]: e for e in prof.events()}
    assert [e["name"] for e in prof.events()] == ["relu", "relu", "test_profiler_twice",
                                                  "inner", "outer"]
    assert events["outer"]["depth"] == 0 and events["inner"]["depth"] == 1
    assert events["test_profiler_twice"]["depth"] == 2
    assert [e["depth"] for e in prof.events() if e["name"] == "relu"] == [1, 3]
    avgs = {a.key: a for a in prof.key_averages()}
    inner, twice_avg = avgs["inner"], avgs["test_profiler_twice"]
    assert inner.self_cpu_time_total == pytest.approx(
        inner.cpu_time_total - twice_avg.cpu_time_total, abs=1e-3)
    outer = avgs["outer"]
    first_relu = prof.events()[0]
    assert outer.cpu_time_total >= inner.cpu_time_total + first_relu["cpu_time_us"]
    assert events["outer"]["kind"] == "range" and events["relu"]["kind"] == "op"


def test_compile_time_is_reported_apart():
    @njit
    def _scale(v):   # not cached: compiles on the first call in this process
        return v * 3.0

    op = nb.register_op("test_profiler_scale", cpu=lambda v: _scale(v))
    x = np.ones(4)
    with profile() as prof:
        op(x)
        op(x)
    first, second = prof.events()
    assert first["compiled"] and not second["compiled"]
    assert first["compile_time_us"] > 0 and second["compile_time_us"] == 0
    (avg,) = prof.key_averages()
    assert avg.count == 2 and avg.compile_count == 1
    assert avg.compile_time_total == pytest.approx(first["compile_time_us"])
    # the op's own time excludes it: far below the compilation it triggered
    assert first["cpu_time_us"] < first["compile_time_us"]
    assert "Compile" in prof.key_averages().table()


def test_chrome_trace_is_valid_json_with_trace_event_fields(tmp_path, device):
    @njit
    def _neg(v):
        return -v

    op = nb.register_op("test_profiler_neg", cpu=lambda v: _neg(v))
    x = to_dev(np.ones((3, 2), np.float32), device)
    with profile(record_shapes=True) as prof:
        with record_function("step"):
            nb.relu(x)
            op(np.ones(2))
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["dur"] >= 0
    slices = {e["name"]: e for e in events if e["ph"] == "X" and e["cat"] != "kernel"}
    assert {"relu", "step", "test_profiler_neg", "compile: test_profiler_neg"} <= set(slices)
    assert slices["relu"]["args"]["Input Dims"] == [[3, 2]]
    assert slices["relu"]["args"]["Input type"] == ["float32"]
    assert slices["test_profiler_neg"]["args"]["compiled"]
    step, relu = slices["step"], slices["relu"]
    assert step["ts"] <= relu["ts"] and relu["ts"] + relu["dur"] <= step["ts"] + step["dur"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == (1 if device == "cuda" else 0)


def test_disabled_profiler_records_nothing():
    x = np.ones(3, np.float32)
    assert _dispatch._Hooks.profiler is None and not _dispatch._Hooks.active
    with record_function("nothing listens"):   # a no-op outside a block
        nb.relu(x)
    with profile() as prof:
        assert _dispatch._Hooks.active
        nb.relu(x)
    assert _dispatch._Hooks.profiler is None and not _dispatch._Hooks.active
    nb.relu(x)
    with record_function("after"):
        nb.relu(x)
    assert [e["name"] for e in prof.events()] == ["relu"]


def test_an_op_that_raises_is_recorded_and_the_stack_unwinds():
    with profile() as prof:
        with pytest.raises(TypeError):
            with record_function("bad"):
                nb.relu(np.ones(3, np.int64))
        nb.relu(np.ones(3, np.float32))
    events = prof.events()
    assert [(e["name"], e["depth"]) for e in events] == [("relu", 1), ("bad", 0), ("relu", 0)]


def test_fused_kernels_are_profiled_as_operators():
    f = nb.fuse(lambda a, b: a * b + 1.0, name="fma_test")
    x = np.ones(8, np.float32)
    f(x, x)
    with profile(record_shapes=True) as prof:
        f(x, x)
    (avg,) = prof.key_averages(group_by_input_shape=True)
    assert avg.key == "fma_test" and avg.input_shapes == [[8], [8]]


def test_errors():
    with pytest.raises(TypeError, match="'record_shapes' must be a bool"):
        profile(record_shapes="yes")
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        record_function("")
    with pytest.raises(RuntimeError, match="nothing recorded"):
        profile().key_averages()
    with profile() as prof:
        with pytest.raises(RuntimeError, match="another profile block is already active"):
            with profile():
                pass
        with pytest.raises(RuntimeError, match="after the profile block has exited"):
            prof.key_averages()
    with pytest.raises(ValueError, match="needs profile\\(record_shapes=True\\)"):
        prof.key_averages(group_by_input_shape=True)
    with pytest.raises(ValueError, match="'sort_by' must be one of"):
        prof.key_averages().table(sort_by="speed")
    with pytest.raises(TypeError, match="'row_limit' must be an int"):
        prof.key_averages().table(row_limit="all")
