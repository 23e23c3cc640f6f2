"""The benchmark harness: the case registry, the figures derived from the
timings, the error measure, the table, and the demo's verdicts. No timing
is asserted, only the arithmetic that turns timings into the reported
figures and the correctness of every registered case's baseline."""

import math
import time

import numpy as np
import pytest

import nbops
from nbops.bench import demo, harness, training
from nbops.bench.harness import Case, Result


@pytest.fixture
def registered():
    """Registers cases for one test and removes them afterwards."""
    names = []

    def add(case, family="testfake"):
        harness.register(case, family)
        names.append(case.name)
        return case

    yield add
    for name in names:
        harness.unregister(name)


def _vec(n, dtype, rng):
    return (rng.standard_normal(n).astype(dtype),)


def _case(name, run, baseline=lambda x, out: np.multiply(x, 2, out=out), **kw):
    return Case(name, _vec, run, baseline, **kw)


@pytest.mark.parametrize("text, n", [("4096", 4096), ("64K", 65536), ("16M", 1 << 24),
                                     ("1.5k", 1536), (" 7 ", 7)])
def test_parse_size(text, n):
    assert harness.parse_size(text) == n
    assert harness.parse_size(harness.size_label(n)) == n


@pytest.mark.parametrize("text", ["", "0", "-3", "ten", "4X"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        harness.parse_size(text)


def test_every_activation_has_a_forward_and_backward_case():
    names = set(harness.cases())
    for op in nbops.activations.__all__:
        assert op in names
    assert {"gelu_tanh", "gelu_tanh_backward"} <= names
    assert {c.family for c in harness.cases().values()} >= {"activations", "tensor", "linalg"}


def test_select_by_glob_family_and_unknown():
    assert [c.name for c in harness.select(["relu"])] == ["relu"]
    gelu = {c.name for c in harness.select(["gelu*"])}
    assert gelu == {"gelu", "gelu_tanh", "gelu_backward", "gelu_tanh_backward"}
    fam = harness.select(["activations"])
    assert len(fam) == len(nbops.activations.__all__) + 2
    assert len(harness.select(["relu", "relu*"])) == 2  # no duplicates
    with pytest.raises(ValueError, match="'nope'"):
        harness.select(["nope"])


def test_duplicate_case_name_is_refused(registered):
    registered(_case("dup_case", lambda x, out: x))
    with pytest.raises(ValueError, match="dup_case"):
        harness.register(_case("dup_case", lambda x, out: x))


@pytest.mark.parametrize("name", [c.name for c in harness.cases().values()
                                  if c.family == "activations"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activation_baselines_agree_with_nbops(name, dtype):
    # the baseline is the same math as the op: nbops, the baseline and the
    # float64 reference agree within the case's tolerance
    case = harness.cases()[name]
    inputs = case.setup(1000, np.dtype(dtype), np.random.default_rng(1))
    ref = harness.reference(case, inputs)
    base = case.baseline(*inputs, out=np.empty_like(inputs[0]))
    assert harness.max_error(base, ref) <= max(case.tolerance(dtype), 1e-6 if dtype == "float32"
                                               else 1e-12)
    res = harness.run_case(case, 1000, dtype, time_it=False)
    assert res.note == ""
    assert res.passed, (res.err, res.tol)


def test_figures_follow_from_the_timings():
    case = harness.cases()["relu"]
    res = harness.run_case(case, 4096, "float32", rounds=2, pause=0.0, copy_gbps=10.0)
    assert res.note == "" and res.passed
    assert res.n == 4096 and res.nbytes == 2 * 4096 * 4 and res.flops is None
    assert res.t_nbops > 0 and res.t_baseline > 0
    assert res.ratio == pytest.approx(res.t_baseline / res.t_nbops)
    assert res.gbps == pytest.approx(res.nbytes / res.t_nbops / 1e9)
    assert res.baseline_gbps == pytest.approx(res.nbytes / res.t_baseline / 1e9)
    assert res.copy_fraction == pytest.approx(res.gbps / 10.0)
    d = res.as_dict()
    assert d["ratio"] == res.ratio and d["case"] == "relu" and d["dtype"] == "float32"


def test_copy_timed_in_the_same_rounds(monkeypatch):
    # a copy passed to run_case runs interleaved with a memory-bound case;
    # the fraction is the median of the per-round fractions
    rounds = [[2.0, 1.0, 4.0], [3.0, 1.0, 1.0], [1.0, 1.0, 3.0]]  # nbops, baseline, copy
    seen = []

    def fake(fns, rounds_, pause, sync=None, samples=False):
        seen.append(len(fns))
        assert samples
        return [list(t) for t in zip(*rounds)]

    monkeypatch.setattr(harness, "time_interleaved", fake)
    case = harness.cases()["relu"]
    copy = (lambda: None, 1000)
    res = harness.run_case(case, 4096, "float32", copy=copy)
    assert seen == [3] and res.note == ""
    per_round = [res.nbytes * c / (1000 * t) for t, _, c in rounds]
    assert res.copy_fraction == pytest.approx(sorted(per_round)[1])
    assert res.t_nbops == 2.0 and res.copy_gbps == pytest.approx(1000 / 3.0 * 1e-9)
    res = harness.run_case(harness.cases()["relu"], 4096, "float32", copy=None)
    assert seen[-1] == 2 and res.paired_copy_fraction is None


def test_backward_counts_two_inputs_and_flops_give_gflops(registered):
    res = harness.run_case(harness.cases()["gelu_backward"], 4096, "float64", rounds=1,
                           pause=0.0)
    assert res.nbytes == 3 * 4096 * 8
    case = registered(_case("flop_case", lambda x, out: np.multiply(x, 2, out=out),
                            flops=lambda inputs: 3 * inputs[0].size))
    res = harness.run_case(case, 100, "float64", rounds=1, pause=0.0)
    assert res.flops == 300 and res.gflops == pytest.approx(300 / res.t_nbops * 1e-9)


def test_missing_failing_and_wrong_cases_are_reported_not_raised(registered):
    absent = registered(_case("absent_case", lambda x, out: x, requires=("no_such_op",)))
    res = harness.run_case(absent, 10, "float32")
    assert "nbops.no_such_op does not exist yet" in res.note and res.t_nbops is None
    assert "no_such_op" in harness.table_row(res)

    def boom(x, out):
        raise RuntimeError("kernel exploded")

    res = harness.run_case(registered(_case("boom_case", boom)), 10, "float32")
    assert res.note == "error: RuntimeError: kernel exploded" and not res.passed
    assert "kernel exploded" in harness.table_row(res)

    wrong = registered(_case("wrong_case", lambda x, out: np.multiply(x, 3, out=out)))
    res = harness.run_case(wrong, 100, "float64", time_it=False)
    assert res.err > 0.1 and not res.passed


def test_max_error():
    nan, inf = math.nan, math.inf
    assert harness.max_error(np.array([1.0, nan, inf, -inf]),
                             np.array([1.0, nan, inf, -inf])) == 0.0
    assert harness.max_error(np.array([nan]), np.array([1.0])) == inf
    assert harness.max_error(np.array([1.0]), np.array([nan])) == inf
    assert harness.max_error(np.array([inf]), np.array([-inf])) == inf
    assert harness.max_error(np.ones(3), np.ones(4)) == inf
    assert harness.max_error(np.array([3.0]), np.array([1.0])) == pytest.approx(1.0)
    assert harness.max_error(np.array([1001.0]), np.array([1000.0])) == pytest.approx(1 / 1001)
    assert harness.max_error(np.zeros(0), np.zeros(0)) == 0.0
    assert harness.max_error((np.ones(2), 2.5), (np.ones(2), 2.0)) == pytest.approx(0.5 / 3)
    assert harness.max_error(np.ones(2), (np.ones(2), 1.0)) == inf


def test_time_interleaved_runs_every_function_each_round():
    calls = [0, 0]

    def f0():
        calls[0] += 1

    def f1():
        calls[1] += 1

    times = harness.time_interleaved([f0, f1], rounds=3, pause=0.0, min_block=0.0)
    assert len(times) == 2 and all(t >= 0 for t in times)
    assert calls == [4, 4]  # one calibration call, then one per round


def test_warm_up_after_each_pause():
    # after a pause, each function runs untimed for WARM_UP seconds (at
    # least once) before its timed block
    stamps = []
    t0 = time.perf_counter()
    harness.warm_up(lambda: stamps.append(time.perf_counter()), seconds=0.01)
    # it returns only once the time is up; the last call may have started
    # just before (asserting on the last call's start failed once in CI)
    assert stamps and time.perf_counter() - t0 >= 0.01
    stamps.clear()
    harness.warm_up(lambda: stamps.append(1), seconds=0.0)
    assert stamps == [1]
    calls = [0]

    def f():
        calls[0] += 1

    harness.time_interleaved([f], rounds=2, pause=0.001, min_block=0.0)
    assert calls[0] >= 1 + 2 * 2  # calibration, then warm-up and timed call per round


def test_measure_copy_and_parallel_copy():
    x = np.arange(1000, dtype=np.float32)
    out = np.zeros_like(x)
    harness.parallel_copy(x, out)
    np.testing.assert_array_equal(out, x)
    x4 = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    out4 = np.zeros_like(x4)
    harness.parallel_copy(x4, out4)  # seen flat (it used to index a 4-D pair as 1-D)
    np.testing.assert_array_equal(out4, x4)
    with pytest.raises(ValueError, match="same size"):
        harness.parallel_copy(x, out[:10])
    assert harness.measure_copy(1000, np.float64, rounds=1, pause=0.0) > 0


def test_table_columns_line_up():
    res = harness.run_case(harness.cases()["relu"], 2048, "float64", rounds=1, pause=0.0,
                           copy_gbps=1.0)
    header, rule = harness.table_header().split("\n")
    row = harness.table_row(res)
    assert len(row) == len(header) == len(rule)
    copy = harness.copy_row(2048, "float64", 12.5)
    assert copy.startswith("copy (prange)") and "12.5" in copy and "100%" in copy
    # each numeric cell ends where its title ends
    for title in ("nbops", "speedup", "GB/s", "max err"):
        end = header.index(title) + len(title)
        assert row[end - 1] != " " and (end == len(row) or row[end] == " ")


def test_run_bench_writes_copy_and_case_rows(registered):
    registered(_case("absent_case2", lambda x, out: x, requires=("no_such_op",)))
    lines = []
    results, copies = harness.run_bench(harness.select(["relu", "absent_case2"]), [512],
                                        ["float32"], rounds=1, pause=0.0, write=lines.append)
    assert [r.case for r in results] == ["relu"]
    assert list(copies) == [(512, "float32")] and copies[(512, "float32")] > 0
    text = "\n".join(lines)
    assert "absent_case2: skipped, nbops.no_such_op does not exist yet" in text
    assert "copy (prange)" in text and "\nrelu " in text


def test_demo_passes_and_fails(registered):
    lines = []
    assert demo.run_demo(quick=True, devices=("cpu",), only=["relu"], write=lines.append) == 0
    assert any(" relu " in ln and "PASS" in ln for ln in lines)
    registered(_case("wrong_demo_case", lambda x, out: np.multiply(x, 3, out=out)))
    lines.clear()
    assert demo.run_demo(quick=True, devices=("cpu",), only=["testfake"],
                         write=lines.append) == 2  # one per dtype
    text = "\n".join(lines)
    assert "FAIL" in text and "above tolerance" in text and "FAILED: 2 check(s)" in text


@pytest.mark.parametrize("result, verdict, failures", [
    ({"name": "step", "err": 1e-9, "tol": 1e-6, "seconds": 0.01}, "PASS", 0),
    ({"name": "step", "err": 1.0, "tol": 1e-6}, "FAIL", 1),
    (RuntimeError("broke"), "FAIL", 1),
])
def test_demo_steps(result, verdict, failures):
    def step(device, quick):
        if isinstance(result, Exception):
            raise result
        return result

    lines = []
    assert demo._demo_step(step, "cpu", True, lines.append) == failures
    assert verdict in lines[0]


def test_result_without_timings_has_no_figures():
    r = Result("x", "f", 10, "float32")
    assert r.ratio is r.gbps is r.copy_fraction is r.gflops is None and not r.passed


@pytest.mark.parametrize("step", training.DEMOS, ids=lambda s: s.__name__)
def test_training_and_profiler_demo_steps(step):
    out = step("cpu", True)
    assert out["err"] <= out["tol"], out


def test_demo_lists_families_with_missing_ops(registered):
    registered(_case("absent_demo_case", lambda x, out: x, requires=("no_such_op",)))
    lines = []
    assert demo.run_demo(quick=True, devices=("cpu",), only=["testfake"],
                         write=lines.append) == 0
    assert "  skipped: nbops.no_such_op not there yet" in lines


def test_a_family_that_fails_to_import_is_a_demo_failure(monkeypatch):
    harness.cases()
    monkeypatch.setitem(harness._broken, "brokenfam", "SyntaxError: oops")
    lines = []
    assert demo.run_demo(quick=True, devices=("cpu",), only=["brokenfam"],
                         write=lines.append) == 1
    assert any("did not load: SyntaxError: oops" in ln for ln in lines)
    lines.clear()
    harness.run_bench([], [16], ["float32"], write=lines.append)
    assert "brokenfam: not loaded, SyntaxError: oops" in lines


def test_markdown_table_one_line_per_case_with_its_limit():
    # two sizes of a memory-bound case and one compute-bound case: one line
    # each, at the largest size, with the fraction of copy or of FMA peak
    rows = [Result("relu", "activations", 1024, "float32", t_nbops=1e-3, t_baseline=2e-3,
                   nbytes=8 * 10**6, paired_copy_fraction=0.5),
            Result("relu", "activations", 4096, "float32", t_nbops=2e-3, t_baseline=6e-3,
                   nbytes=32 * 10**6, paired_copy_fraction=0.8),
            Result("matmul", "linalg", 4096, "float32", t_nbops=1e-2, t_baseline=2e-2,
                   flops=2 * 10**9, peak_gflops=400.0),
            Result("absent", "testfake", 16, "float32", note="skipped: nbops.x does not exist")]
    assert rows[2].peak_fraction == pytest.approx(0.5)
    assert rows[2].as_dict()["peak_fraction"] == rows[2].peak_fraction
    lines = harness.markdown_table(rows).splitlines()
    assert lines[0].startswith("| case |") and set(lines[1]) <= set("|-")
    body = lines[2:]
    assert len(body) == 3
    assert body[0].startswith("| relu | activations | 4K | float32 |")
    assert "3.00x" in body[0] and "80% of copy (16.0 GB/s)" in body[0]
    assert "2.00x" in body[1] and "200 GFLOP/s, 50% of FMA peak" in body[1]
    assert "skipped" in body[2]


def test_fma_peak_counts_its_flops():
    x = np.zeros((2, harness.FMA_ROW), np.float64)
    a, b = np.float64(0.5), np.float64(1.0)
    harness.fma_peak(x, 3, a, b)
    v = 0.0
    for _ in range(3 * 8):
        v = v * 0.5 + 1.0
    np.testing.assert_array_equal(x, v)
    assert harness.measure_fma_peak("float32", rounds=1, pause=0.0, threads=1) > 0
