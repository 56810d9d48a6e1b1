"""Notebook 10 (bonus): tensor and pipeline parallelism. The judge's schedule rules and the
solution's orders against the contract on arbitrary p, m and stage (Hypothesis), the sweeps
reaching every edge the contract names, the blank release's regions, and the whole notebook
autograded as the solution and as the blank release, with the rows of the benchmark it ran
(quick sizes) checked. The checks against the known-wrong and the correct files:
``tests/test_checks.py``.

Each of check_tensor_parallel and check_pipeline launches 2 and 3 gloo ranks; check_schedules
runs one process without communication."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils import cluster
from exercise_utils.bonus_model_parallel import (bench, checks, checks_pp, nets, network, orders,
                                                 probes_pp)
from exercise_utils.notebook_files import extract_writefiles
from grading import (assert_release_regions_in_function_bodies, autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)

ROOT = Path(__file__).resolve().parents[1]
STEM = "10_bonus_model_parallel"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 10
CHECKS = 3


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution10"))["10_model_parallel"]


@pytest.fixture(scope="module")
def blank_file(tmp_path_factory):
    return extract_writefiles(RELEASE, tmp_path_factory.mktemp("blank10"))["10_model_parallel"]


@pytest.fixture(scope="module")
def solution(solution_file):
    from exercise_utils.rankworker import load_student
    return load_student(solution_file)


# ------------------------------------------------------------------ schedules (Hypothesis)
SCHEDULE = st.tuples(st.integers(1, 12), st.integers(1, 24)).flatmap(
    lambda pm: st.tuples(st.just(pm[0]), st.just(pm[1]), st.integers(0, pm[0] - 1)))


@settings(max_examples=300, deadline=None)
@given(case=SCHEDULE, sched=st.sampled_from(["gpipe", "1f1b"]))
def test_the_judges_orders_meet_the_rules_and_the_solutions_equal_them(solution, case, sched):
    """Each judge's order passes the rules check_schedules applies (every op once, F j before B
    j, at most p - stage in flight for 1F1B), and the solution returns exactly it."""
    p, m, s = case
    want = orders.ORDERS[sched](p, m, s)
    assert checks_pp._first_wrong(sched, want, p, m, s) is None
    assert sorted(want) == sorted([(k, j) for k in "FB" for j in range(m)])
    in_flight, peak = 0, 0
    for kind, _ in want:
        in_flight += 1 if kind == "F" else -1
        peak = max(peak, in_flight)
    assert peak == (m if sched == "gpipe" else min(p - s, m))
    fn = solution.gpipe_order if sched == "gpipe" else solution.one_f_one_b_order
    assert fn(p, m, s) == want


@settings(max_examples=300, deadline=None)
@given(case=SCHEDULE, sched=st.sampled_from(["gpipe", "1f1b"]), data=st.data())
def test_the_rules_leave_one_order(case, sched, data):
    """Any other arrangement of the same ops (or one op changed) breaks a rule, at a position
    no later than the first where it differs: the rules alone decide, and the message points
    at the right place."""
    p, m, s = case
    want = orders.ORDERS[sched](p, m, s)
    other = data.draw(st.permutations(want))
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(other) - 1))
        other = other[:i] + [(other[i][0], other[i][1] + 1)] + other[i + 1:]
    if other == want:
        return
    wrong = checks_pp._first_wrong(sched, other, p, m, s)
    first_diff = next(i for i, (a, b) in enumerate(zip(other, want)) if a != b)
    assert wrong is not None and wrong[0] <= first_diff, (other, wrong)


def test_the_sweeps_reach_every_edge_the_contract_names():
    """Schedules: every p up to 4 with m below, equal to and above p; invalid arguments of every
    kind the notebook lists. Pipeline: both dtypes, both schedules, uneven micro-batches, 1F1B
    with m >= p at 3 stages (its steady state), widths changing at every layer. Tensor
    parallelism: sizes that split over 2 and 3 ranks, whole heads per rank."""
    assert probes_pp.P_MAX >= 4 and probes_pp.M_MAX > probes_pp.P_MAX
    kinds = {type(a).__name__ for args in probes_pp.BAD_ARGS for a in args}
    assert {"float", "bool", "str", "NoneType", "int"} <= kinds
    assert any(a[0] < 1 for a in probes_pp.BAD_ARGS if isinstance(a[0], int))
    assert any(a[1] < 1 for a in probes_pp.BAD_ARGS if isinstance(a[1], int))
    assert any(isinstance(a[2], int) and not isinstance(a[2], bool) and a[2] >= a[0]
               for a in probes_pp.BAD_ARGS if isinstance(a[0], int))
    runs = nets.PP_RUNS
    assert {r[1] for r in runs} == {"float32", "float64"} and {r[2] for r in runs} == {"gpipe", "1f1b"}
    assert any(batch % m for _, _, _, m, batch in runs)
    assert any(sched == "1f1b" and m >= 3 for _, _, sched, m, _ in runs)
    assert len(set(nets.PP_WIDTHS)) == len(nets.PP_WIDTHS)
    assert nets.PP_LAYERS % 2 == 0 and nets.PP_LAYERS % 3 == 0
    assert set(checks_pp.WORLD_SIZES) == set(checks.WORLD_SIZES) == {2, 3}
    for n in checks.WORLD_SIZES:
        assert nets.D_MODEL % n == nets.D_HIDDEN % n == nets.N_HEADS % n == 0
    assert {b[2] for b in nets.BLOCKS} == {"float32", "float64"} and any(b[3] for b in nets.BLOCKS)


def test_release_regions_sit_inside_function_bodies(blank_file):
    assert_release_regions_in_function_bodies(blank_file, 15)


# ------------------------------------------------------------------ whole notebook
def test_the_tensor_parallel_check_reports_piece_by_piece(tmp_path):
    """f, g and the two layers written, the MLP and the attention as released: the check runs
    what is finished (a bug there is shown: tests/wrong/10_flaws.py,
    ``bias_before_all_reduce_blocks_unfinished``), says what passed and lists the rest as
    still to do, in the notebook's order (issue 39)."""
    import flaws
    path, check = flaws.unfinished("10", "bias_before_all_reduce_blocks_unfinished", tmp_path)
    with pytest.raises(AssertionError) as err:
        check(path)
    assert str(err.value) == (
        f"not implemented yet: ParallelMLP.from_mlp in {path} still raises NotImplementedError. "
        "Replace the `raise` line with your code, then run the cell `%%part "
        "work/10_model_parallel.py 3/5` again. Finished "
        "and passing with 2 and 3 ranks: f and g, ColumnParallelLinear, RowParallelLinear. "
        "Still to do in that file, in order: ParallelMLP.forward, "
        "ParallelAttention.from_attention, "
        "ParallelAttention.forward."), str(err.value)


@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, CHECKS)
    assert "bubble" in graded
    results = tmp_path / "course" / "autograded" / "solution" / STEM / "results"
    assert_benchmark_rows(json.loads((results / "10_model_parallel_bench.json").read_text()))
    # the same model data-, tensor- and pipeline-parallel on two hosts (root only; CI is root)
    if cluster.unavailable_reason():
        assert "skipped: " in graded, "without root the network cell must say why"
        return
    assert_network_rows(json.loads((results / "10_model_parallel_network.json").read_text()),
                        tmp_path)


def assert_benchmark_rows(rows):
    """One row per expected key of each part; the bubble of GPipe and 1F1B within -10 % and
    +25 % of (p-1)/(m+p-1) (stages of fixed duration, latency hidden: it measures the schedule and the
    messages, not the machine's speed); on every stage 1F1B's peak of saved activations at most
    (p/m) x GPipe's (+10 %) and nothing left alive after a step; yours and torch's losses (and
    gradients) equal for both the tensor- and the pipeline-parallel comparison. No timing
    assertions (a test is no benchmark)."""
    worlds, ms = tuple(bench.WORLD_SIZES), tuple(bench.MICROBATCHES)
    assert {r["part"] for r in rows} == {"bubble", "memory", "library"}
    bubble = [r for r in rows if r["part"] == "bubble"]
    memory = [r for r in rows if r["part"] == "memory"]
    library = [r for r in rows if r["part"] == "library"]
    assert sorted((r["world_size"], r["schedule"], r["m"]) for r in bubble) == sorted(
        (w, s, m) for w in worlds for s in bench.SCHEDULES for m in ms)
    assert sorted((r["world_size"], r["stage"]) for r in memory) == sorted(
        (w, s) for w in worlds for s in range(w))
    assert sorted((r["world_size"], r["what"]) for r in library) == sorted(
        (w, what) for w in worlds for what in ("pipeline", "tensor"))
    for r in bubble:
        p, m = r["world_size"], r["m"]
        assert r["theory"] == pytest.approx((p - 1) / (m + p - 1))
        # a busy machine only delays a stage (a wait it cannot hide): the bubble may come out
        # above theory, never below (a fresh-clone CI run, three test workers on 2 cores:
        # GPipe, p = 2, m = 4 measured 0.235 against 0.2); a wrong schedule is far off (one
        # micro-batch at a time: 0.5 there)
        assert -0.1 * r["theory"] <= r["bubble"] - r["theory"] <= 0.25 * r["theory"], r
        assert r["makespan_ms"] >= r["ideal_ms"] * 0.99, r
    for r in memory:
        assert r["m"] == bench.MEM_MICROBATCHES and r["gpipe_bytes"] > 0 < r["1f1b_bytes"], r
        assert r["1f1b_bytes"] <= r["world_size"] / r["m"] * r["gpipe_bytes"] * 1.1, r
        assert r["gpipe_live_after"] == 0 == r["1f1b_live_after"], "a graph outlived its step"
    for r in library:
        assert r["mine_ms"] > 0 and r["torch_ms"] > 0, r
        assert r["loss_mine"] == pytest.approx(r["loss_torch"], rel=1e-5, abs=1e-6), r
        assert r["grad_diff"] < 1e-5, r
    assert len(bench.summary(rows)["bubble"]) == len(worlds) * len(ms)
    text = bench.table(rows)
    assert "(p-1)/(m+p-1)" in text and "1F1B peak B" in text and "yours / torch" in text


def assert_network_rows(rows, tmp_path):
    """Every mode at every rate, one rank per host; the bytes the kernel counted on the links
    within 12 % of the model (TCP/IP headers: up to ~7 %), the three modes computing the same
    thing (equal losses, first and last step), data > tensor > pipeline in bytes. No timing
    assertion."""
    rates = [rate or "unshaped" for rate in network.RATES]
    assert sorted((r["rate"], r["mode"]) for r in rows) == sorted(
        (rate, mode) for rate in rates for mode in network.MODES)
    width, depth = network.WIDTH, network.DEPTH
    for r in rows:
        assert r["world_size"] == 2 and len(r["step_ms_all"]) == network.STEPS, r
        assert r["param_bytes"] == 4 * depth * (8 * width ** 2 + 5 * width)   # MLP(d, 4d)
        assert r["activation_bytes"] == 4 * network.TOKENS * width
        assert r["expected_bytes"] == network.expected_bytes(
            r["mode"], r["param_bytes"], r["activation_bytes"], depth, r["microbatches"])
        assert 0.98 <= r["bytes_per_step"] / r["expected_bytes"] <= 1.12, r
        assert r["compute_bytes_per_step"] < 5e3, r         # a barrier, no data
        assert r["step_ms"] > 0 and r["compute_ms"] > 0 and r["rate_bits"] > 0
    for rate in rates:
        got = {r["mode"]: r for r in rows if r["rate"] == rate}
        for key in ("loss", "loss_last"):
            losses = [r[key] for r in got.values()]
            assert max(losses) - min(losses) < 1e-5, (rate, key, losses)
        assert got["data"]["loss_last"] < got["data"]["loss"]          # SGD trained
        assert (got["data"]["bytes_per_step"] > got["tensor"]["bytes_per_step"]
                > got["pipeline"]["bytes_per_step"])
    assert set(network.winners(rows)) == set(rates)
    text = network.table(rows)
    assert all(f"{rate}: step ms" in text for rate in rates) and "fastest" in text
    network.plot(rows, tmp_path / "network.png")
    assert (tmp_path / "network.png").stat().st_size > 0


def test_network_expected_bytes_formulas():
    """gloo's ring all-reduce of B bytes on 2 ranks puts 2B on the links: data all-reduces the
    gradient once; tensor parallelism an activation twice per block but the first block's f;
    the pipeline sends each activation and its gradient once, with a header per micro-batch."""
    assert network.expected_bytes("data", 1000, 10, 4, 4) == 2000
    assert network.expected_bytes("tensor", 1000, 10, 4, 4) == 2 * 7 * 10
    assert network.expected_bytes("pipeline", 1000, 10, 4, 4) == 2 * 10 + 80 * 4
    with pytest.raises(ValueError):
        network.expected_bytes("expert", 1, 1, 1, 1)


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
