"""Notebook 08 (PowerSGD): the pure functions against the judge's reference (Hypothesis), the
sweeps reaching every edge the contract names, a crash in PowerSGD costing only its own points,
and the whole notebook autograded as the solution and as the blank release, with the rows of
the experiment it ran (``powersgd_experiment``, quick sizes) checked. (The checks against wrong
and right files: ``tests/test_checks.py``.)

The checkers keep their launches' results per file content, so the three checks of one file
cost one launch per world size (1, 2 and 3 gloo ranks); most wrong files fail at 1."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exercise_utils import cluster
from exercise_utils.bonus_powersgd import checks, network
from exercise_utils.bonus_powersgd import checks_powersgd, launches
from exercise_utils.bonus_powersgd import experiments as pe
from exercise_utils.bonus_powersgd import expected
from exercise_utils.bonus_powersgd import reference as ref
from exercise_utils.models import DropoutNet
from exercise_utils.notebook_files import extract_writefiles
from exercise_utils.rankworker import load_student
from grading import (assert_release_regions_in_function_bodies, autograde_solution_and_blank,
                     assert_launched_cells_open_with_their_box)

ROOT = Path(__file__).resolve().parents[1]
STEM = "08_bonus_powersgd"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RELEASE = ROOT / "notebooks" / f"{STEM}.ipynb"
POINTS = 6
CHECKERS = {"orthogonalize": checks.check_orthogonalize,
            "compression_rank": checks.check_compression_rank,
            "powersgd": checks.check_powersgd}


@pytest.fixture(scope="module")
def solution_file(tmp_path_factory):
    return extract_writefiles(SOLUTION, tmp_path_factory.mktemp("solution08"))["08_powersgd"]


@pytest.fixture(scope="module")
def blank_file(tmp_path_factory):
    """The release's student file: every solution region replaced by a raise."""
    return extract_writefiles(RELEASE, tmp_path_factory.mktemp("blank08"))["08_powersgd"]


def test_release_regions_sit_inside_function_bodies(blank_file):
    assert_release_regions_in_function_bodies(blank_file, 3)


def test_the_given_split_helper_cuts_every_shape_the_contract_names(blank_file):
    """The release's own ``_split`` (given code) cuts 0-d and 4-d pieces too: students use it to
    copy the uncompressed buffer back, and the check's models have 0-d parameters (it called
    ``view(*shape)``, i.e. ``view()`` for a 0-d shape, a TypeError)."""
    import torch
    split = load_student(blank_file)._split
    pieces = split(torch.arange(1 + 6 + 16, dtype=torch.float64), [(), (2, 3), (2, 2, 2, 2)])
    assert [p.shape for p in pieces] == [torch.Size([]), (2, 3), (2, 2, 2, 2)]
    assert pieces[1].flatten().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_a_crash_in_powersgd_costs_only_its_own_points(tmp_path, solution_file):
    """reduce() raises on rank 1 only (of the world of 2 ranks, the first with a rank 1): the
    launch fails (rank 0 waits in its all_reduce); the local stages run again alone and pass;
    check_powersgd names the world, the rank and the error."""
    path = tmp_path / "08_powersgd.py"
    path.write_text(Path(solution_file).read_text().replace(
        "        world = dist.get_world_size()\n",
        "        world = dist.get_world_size()\n"
        "        if dist.get_rank() == 1:\n"
        "            raise ValueError('boom on rank 1')\n", 1))
    with pytest.raises(AssertionError, match=r"raised ValueError in check case 'psgd-values': "
                                             r"\(with 2 ranks, as rank 1\) boom on rank 1"):
        checks.check_powersgd(path)
    checks.check_orthogonalize(path)
    checks.check_compression_rank(path)


# ------------------------------------------------------------------ pure functions (Hypothesis)
@pytest.fixture(scope="module")
def solution(solution_file):
    return load_student(solution_file)


SHAPES = st.lists(st.integers(1, 60), min_size=0, max_size=4).map(tuple)


@settings(max_examples=400, deadline=None)
@given(shape=SHAPES, rank=st.integers(1, 70), rate=st.floats(0, 8))
def test_reference_compression_rank_meets_the_contract(shape, rank, rate):
    """0 below 2 dimensions; else 0 or r' = min(n, m, rank), r' exactly when compressing saves
    enough."""
    got = expected.compression_rank(shape, rank, rate)
    assert type(got) is int
    if len(shape) < 2:
        assert got == 0
        return
    n, m = shape[0], int(np.prod(shape[1:]))
    r = min(n, m, rank)
    assert got == (r if (n + m) * r * rate < n * m else 0)


@settings(max_examples=400, deadline=None)
@given(shape=SHAPES, rank=st.integers(1, 70), rate=st.floats(0, 8), as_tuple=st.booleans())
def test_solution_compression_rank_equals_the_reference(solution, shape, rank, rate, as_tuple):
    got = solution.compression_rank(shape if as_tuple else torch.Size(shape), rank, rate)
    assert type(got) is int and got == expected.compression_rank(shape, rank, rate)


def _record(result):
    """What the probe records of orthogonalize's result."""
    return {"type": "torch.Tensor", "dtype": str(result.dtype).replace("torch.", ""),
            "value": result.detach().double().numpy()}


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), data=st.data(), dtype=st.sampled_from(["float32", "float64"]),
       seed=st.integers(0, 2 ** 31), zero=st.booleans())
def test_solution_and_qr_orthogonalize_meet_the_check(solution, n, data, dtype, seed, zero):
    """On random P (n >= r, float32 or float64 at the checks' scales, sometimes a zero column)
    the solution's Gram-Schmidt and torch.linalg.qr (which the docstring accepts) both pass the
    judge's verdict."""
    r = data.draw(st.integers(1, n))
    p = torch.randn(n, r, generator=torch.Generator().manual_seed(seed),
                    dtype=getattr(torch, dtype)) * ref.SCALE[dtype]
    col = data.draw(st.integers(0, r - 1)) if zero and r > 1 else None
    if col is not None:
        p[:, col] = 0
    if float(torch.linalg.matrix_rank(p.double())) < r - (col is not None):
        return                                      # (nearly) dependent columns: no contract
    if np.linalg.cond(p.double().numpy()[:, [j for j in range(r) if j != col]]) > 1e3:
        return
    assert checks.verdict(p.double().numpy(), dtype, _record(solution.orthogonalize(p.clone())),
                          col) is None
    assert checks.verdict(p.double().numpy(), dtype, _record(torch.linalg.qr(p).Q), col) is None


def test_the_sweeps_reach_every_edge_the_contract_names():
    """compression_rank: 0-d, 1-D, 3-D and 4-D shapes, rank above min(n, m), ties at rate 1 and
    at another rate, rates 0, below and above 1, every case of the table. orthogonalize: float32
    and float64, one column (also 1 x 1), a zero column first and in the middle, nearly parallel
    columns. PowerSGD: 1, 2 and 3 ranks, two steps at least, warm_start False, another rate, a
    rank above every min(n, m), float64, and frozen (in the middle), unused (a matrix and a
    bias), transposed, channels_last and 0-d parameters; tied weights listed once."""
    cases = ref.rank_cases()
    assert {c[0] for c in cases} == set(ref.RANK_ORDER)
    dims = {len(shape) for _, shape, _, _ in cases}
    assert {0, 1, 2, 3, 4} <= dims
    two_d = [(shape, rank, rate) for _, shape, rank, rate in cases if len(shape) == 2]
    assert any(rank > min(shape) and rate < 1 for shape, rank, rate in two_d)
    ties = [(rate, expected.compression_rank(shape, rank, rate)) for shape, rank, rate in two_d
            if (shape[0] + shape[1]) * min(rank, *shape) * rate == shape[0] * shape[1]]
    assert {1.0, 2.25} <= {rate for rate, _ in ties} and all(got == 0 for _, got in ties)
    rates = {rate for *_, rate in cases}
    assert 0.0 in rates and any(0 < r < 1 for r in rates) and any(r > 1 for r in rates)
    ortho = ref.ORTHO_CASES
    assert {"float32", "float64"} == {dtype for _, _, dtype, _ in ortho}
    assert (1, 1) in {shape for _, shape, _, _ in ortho}
    assert {sp[1] for *_, sp in ortho if isinstance(sp, tuple) and sp[0] == "zero"} == {0, 1}
    scaled = {(dtype, sp[1]) for _, _, dtype, sp in ortho if isinstance(sp, tuple)
              and sp[0] == "scale"}
    for dtype in ("float32", "float64"):      # norms where eps under the square root shows,
        assert any(d == dtype and x <= 1e-3 for d, x in scaled)      # and far above 1
        assert any(d == dtype and x >= 1e3 for d, x in scaled)
    assert any(0 in shape and len(shape) == 2 and shape[0] == 0 for _, shape, _, _ in cases)
    assert any(0 in shape[1:] for _, shape, _, _ in cases if len(shape) > 2)
    assert any(sp == "parallel" for *_, sp in ortho)
    assert launches.WORLDS == (1, 2, 3) and ref.STEPS >= 2
    s = ref.SETTINGS
    assert s["rank2"].case == "psgd-values" and not s["cold"].warm and s["rate2"].rate != 1
    assert s["float64"].dtype == "float64"
    full = [shape for _, _, shape, _ in ref.trainable(s["full"].model) if len(shape) >= 2]
    assert all(s["full"].rank > min(shape[0], int(np.prod(shape[1:]))) for shape in full)
    kinds = {kind for _, _, kind in ref.layout(s["varying"].model)}
    steps = range(ref.STEPS)
    assert any(not ref.has_grad(k, 0) and ref.has_grad(k, 1) for k in kinds)   # gets one later
    assert any(ref.has_grad(k, t) and not ref.has_grad(k, t + 1) and ref.has_grad(k, t + 2)
               for k in kinds for t in steps[:-2])                    # loses it, gets it back
    assert all(s["varying"].rank > 0 and any(ref.has_grad(k, t) and k != "none" for k in kinds)
               for t in steps)
    empty = [shape for _, shape, _ in ref.layout(s["empty"].model) if 0 in shape]
    assert any(shape[0] == 0 for shape in empty) and any(0 in shape[1:] for shape in empty)
    synthetic = [kind for _, _, kind in ref.layout("synthetic")]
    assert synthetic.index("frozen") not in (0, len(synthetic) - 1)
    assert [shape for _, shape, kind in ref.layout("synthetic") if kind == "none"] == [(5, 8), (5,)]
    edge = ref.layout(s["edgenet"].model)
    assert {"frozen", "none", "transposed", "channels_last", "grad"} == {k for _, _, k in edge}
    assert any(shape == () for _, shape, _ in edge)
    names = [n for n, _, _ in edge]
    assert "out.weight" in names and "back.weight" not in names     # tied: once
    # the wide setting: the network's counters tell factors from whole gradients (grading)
    from exercise_utils.bonus_powersgd.expected import expected_elements
    plain, comp = expected_elements("wide")
    assert s["wide"].case == "psgd-values" and list(s)[-1] == "wide"
    assert (plain + sum(comp)) * 50 < 256 * 1024 and plain == 256


def _gram_schmidt(P, classical, eps=1e-8):
    done = []
    for j in range(P.shape[1]):
        v = P[:, j].clone()
        for u in done:
            v = v - (u @ (P[:, j] if classical else v)) * u
        done.append(v / (v.norm() + eps))
    return torch.stack(done, dim=1)


def _powersgd(name, size, salts, orthogonalize):
    """A correct PowerSGD (in the setting's dtype) on ``size`` ranks in one process: per step, per
    compressed tensor index, (grad, [errors], Q) as numpy float64."""
    s = ref.SETTINGS[name]
    gen = torch.Generator().manual_seed(ref.SEED)
    errors, qs, out = {}, {}, []
    for step in range(ref.STEPS):
        row = {}
        for i, (k, _, shape, kind) in enumerate(ref.trainable(s.model)):
            r = expected.compression_rank(shape, s.rank, s.rate)
            if kind == "none" or not r:
                continue
            ms = [ref.gradient(s, k, step, w, salts[w]).reshape(shape[0], -1)
                  + errors.get(i, [0] * size)[w] for w in range(size)]
            if not s.warm or i not in qs:
                qs[i] = torch.randn(ms[0].shape[1], r, generator=gen).to(ms[0].dtype)
            p = orthogonalize(sum(m @ qs[i] for m in ms))
            qs[i] = sum(m.T @ p for m in ms) / size
            errors[i] = [m - p @ qs[i].T for m in ms]
            row[i] = [(p @ qs[i].T).double().numpy(), [e.double().numpy() for e in errors[i]],
                      qs[i].double().numpy()]
        out.append(row)
    return out


@pytest.mark.parametrize("name,size", [("full", 3), ("rank2", 3), ("cold", 3), ("float64", 2)])
def test_correct_powersgd_stays_within_the_tolerance_for_any_salts(name, size):
    """The checks compare a rank's PowerSGD (in the setting's dtype) with the judge's float64
    replay within TOL * max|want|, for any salts. Gram-Schmidt in float32 loses orthogonality
    as eps * cond(P) (modified) or eps * cond(P)^2 (classical); at full rank on wide matrices
    P is square, its condition number heavy-tailed over random salts (measured: above 2000 in
    1% of runs), and correct files failed psgd-full-rank in about 1 run in 15; on the full
    setting's tall matrices every way of orthogonalizing stays well inside. In float64 the eps
    added to a column's norm is what differs from QR, and warm start with error feedback
    amplifies it step by step: at the inputs' old scale (1000) 5% of runs came within 10x of
    the tolerance and 1 in 750 failed it."""
    TOL = checks_powersgd.TOL
    rng = np.random.default_rng(5)
    ways = {"qr": lambda p: torch.linalg.qr(p).Q,
            "mgs": lambda p: _gram_schmidt(p, False), "cgs": lambda p: _gram_schmidt(p, True)}
    worst = 0.0
    for _ in range(100 if size == 2 else 60):
        salts = [int(x) for x in rng.integers(1, 2 ** 62, size=size)]
        want = expected.simulate(name, size, None, salts)
        for way in ways.values():
            for step, row in enumerate(_powersgd(name, size, salts, way)):
                w = want[step]
                for i, (grad, errs, q) in row.items():
                    pname = w["compressed"][i][0]
                    wg, wq = w["grads"][pname].reshape(grad.shape), w["qs"][i]
                    worst = max(worst, np.abs(grad - wg).max() / max(1e-3, np.abs(wg).max()),
                                np.minimum(abs(q - wq), abs(q + wq)).max()
                                / max(1e-3, np.abs(wq).max()),
                                max(np.abs(e - we).max() for e, we in
                                    zip(errs, w["errors"][i])) / w["scale"][i])
    dtype = ref.SETTINGS[name].dtype
    assert worst < TOL[dtype] / {"float32": 2, "float64": 10}[dtype], worst


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS))
    assert "uncompressed" in graded and "torch r=1" in graded
    # the experiment the notebook ran (quick sizes): bytes counted, torch's hook alike
    results = tmp_path / "course" / "autograded" / "solution" / STEM / "results"
    assert_experiment_rows(json.loads((results / "08_powersgd.json").read_text())["rows"], tmp_path)
    # PowerSGD on two hosts at three link rates (root only; CI is root)
    if cluster.unavailable_reason():
        assert "skipped: " in graded, "without root the network cell must say why"
        return
    assert_network_rows(json.loads((results / "08_network.json").read_text()), tmp_path)


def assert_network_rows(rows, tmp_path):
    """Both models, every method at every rate; the same accuracy at every rate (the link
    changes when bytes arrive, not what is computed). The issue's goal (PowerSGD rank 2 at
    least 3x faster per step than uncompressed at 100 Mbit/s on the wide model) is a measured
    time: held by ``test_powersgd_rank_2_is_3x_faster_at_100mbit`` in the serial pass, where
    nothing else runs (beside two other test workers, CI measured 2.2x: its compressed step's
    computing took 6 times what it takes alone, while the link's time stays what it is)."""
    rates = [rate or "unshaped" for rate in network.RATES]
    runs = [(h, m, r) for h in network.HIDDEN for m, r in
            [("uncompressed", None)] + [("yours", k) for k in pe.RANKS]]
    assert sorted((r["hidden"], r["method"], r["rank"] or 0, r["rate"]) for r in rows) == sorted(
        (h, m, k or 0, rate) for h, m, k in runs for rate in rates)
    for h, m, k in runs:
        same = {r["accuracy"] for r in rows if (r["hidden"], r["method"], r["rank"]) == (h, m, k)}
        assert len(same) == 1, (h, m, k, same)
    assert {r["rate_bits"] for r in rows if r["rate"] == "100mbit"} == {1e8}
    assert min(r["rate_bits"] for r in rows if r["rate"] == "unshaped") > 1e9
    wide = {(r["method"], r["rank"]): r["step_s"] for r in rows
            if r["hidden"] == max(network.HIDDEN) and r["rate"] == "100mbit"}
    # the wide model's uncompressed step (2.7 MB, every step the same; the link's burst is
    # 64 kB) is never faster than its bytes at 100 Mbit/s: 0.22 s (measured here: 0.27 s)
    sent = next(r["bytes_per_step"] for r in rows if r["hidden"] == max(network.HIDDEN)
                and r["method"] == "uncompressed")
    assert sent > 2.7e6 and wide["uncompressed", None] >= 0.9 * sent * 8 / 1e8, (sent, wide)
    text = network.table(rows)
    assert "break-even link rate" in text and "hidden 2048" in text
    network.plot(rows, tmp_path / "network.png")
    assert (tmp_path / "network.png").stat().st_size > 0


def expected_bytes(steps, start_iter, r):
    """4 bytes per element: uncompressed steps send every gradient; compressed ones send
    (n + m) * r' per matrix that shrinks and every other element."""
    per_step = 0
    for p in DropoutNet().parameters():
        n, m = p.shape[0], int(np.prod(p.shape[1:]))
        rr = min(n, m, r)
        per_step += (n + m) * rr if p.dim() >= 2 and (n + m) * rr < n * m else p.numel()
    full = sum(p.numel() for p in DropoutNet().parameters())
    return 4 * (start_iter * full + (steps - start_iter) * per_step)


def assert_experiment_rows(rows, tmp_path):
    """Every method ran; the bytes counted from the all_reduce calls match the PowerSGD
    formula, and torch's powerSGD_hook sends exactly as much as the solution. No timing."""
    ranks = tuple(pe.RANKS)
    by = {(r["method"], r["rank"]): r for r in rows}
    assert set(by) == {("uncompressed", None)} | {(m, r) for m in ("yours", "torch")
                                                  for r in ranks}
    steps = by[("uncompressed", None)]["steps"]
    per_worker = -(-pe.TRAIN_SIZE // pe.WORKERS)          # DistributedSampler pads
    assert steps == pe.EPOCHS * -(-per_worker // pe.BATCH), steps
    assert by[("uncompressed", None)]["bytes_per_worker"] == expected_bytes(steps, steps, 1)
    for r in ranks:
        want = expected_bytes(steps, pe.START_ITER, r)
        assert by[("yours", r)]["bytes_per_worker"] == want, r
        assert by[("torch", r)]["bytes_per_worker"] == want, r
        assert by[("yours", r)]["compression"] > 1.5
    assert by[("yours", ranks[0])]["bytes_per_worker"] < by[("yours", ranks[-1])]["bytes_per_worker"]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    text = pe.table(rows)
    assert "yours r=1" in text and "torch r=2" in text and "uncompressed" in text
    pe.plot(rows, tmp_path / "08.png")
    assert (tmp_path / "08.png").stat().st_size > 1000


@pytest.mark.serial    # a measured time: alone on the machine, as the notebook runs it
def test_powersgd_rank_2_is_3x_faster_at_100mbit(tmp_path, solution_file):
    """The issue's goal, measured as the notebook measures it (``network.sweep``: the wide
    model on two hosts, median step): PowerSGD rank 2 at least 3x faster per step than
    uncompressed training at 100 Mbit/s (quiet here: 11x)."""
    if cluster.unavailable_reason():
        pytest.skip(f"needs the course's cluster: {cluster.unavailable_reason()}")
    rows = network.sweep(student=str(solution_file), ranks=(2,), rates=("100mbit",),
                         hidden=(max(network.HIDDEN),), out=tmp_path / "network.json")
    step = {r["method"]: r["step_s"] for r in rows}
    assert step["uncompressed"] >= 3 * step["yours"], f"only {step['uncompressed'] / step['yours']:.1f}x: {step}"


def test_network_break_even_is_where_the_measured_speedup_crosses_1():
    """Speed-ups over the model's own uncompressed training per rate; the break-even rate is
    interpolated on log scales between the two rates whose speed-ups straddle 1, or reported
    as below / above the measured range; the table shows both models."""
    bits = {"100mbit": 1e8, "1gbit": 1e9, "unshaped": 1e10}
    steps = {(50, "uncompressed"): (10.0, 6.0, 5.0), (50, "powersgd"): (12.0, 12.0, 11.0),
             (2048, "uncompressed"): (240.0, 32.0, 18.0), (2048, "powersgd"): (24.0, 20.0, 20.0)}
    params = {50: 21840, 2048: 683178}
    rows = [{"hidden": h, "params": params[h], "method": method, "accuracy": 0.5,
             "rank": None if method == "uncompressed" else 2, "rate": rate,
             "rate_bits": bits[rate], "step_s": t / 1e3, "bytes_per_step": 1000.0}
            for (h, method), ts in steps.items() for rate, t in zip(bits, ts)]
    model = {h: f"hidden {h} ({params[h]:,} parameters)" for h in params}
    points = network.speedups(rows, model[2048], "PowerSGD r=2")
    assert [b for b, _ in points] == [1e8, 1e9, 1e10]
    assert [s for _, s in points] == pytest.approx([10.0, 1.6, 0.9])
    even, side = network.break_even(rows, model[2048], "PowerSGD r=2")
    assert side == "" and 1e9 < even < 1e10
    # log-log: log(1.6) falls to log(0.9) over one decade; 1 is crossed at this share of it
    assert even == pytest.approx(1e9 * 10 ** (math.log(1.6) / (math.log(1.6) - math.log(0.9))))
    assert network.break_even(rows, model[50], "PowerSGD r=2") == (1e8, "below")
    faster = [dict(r, step_s=r["step_s"] / 100) if r["method"] == "powersgd" else r for r in rows]
    assert network.break_even(faster, model[50], "PowerSGD r=2") == (1e10, "above")
    text = network.table(rows)
    assert ("| hidden 50 (21,840 parameters) | PowerSGD r=2 | 12.0 (0.8x) | 12.0 (0.5x) | "
            "11.0 (0.5x) | 1.0 kB | 0.500 | below 100 Mbit/s |") in text
    assert "| hidden 2048 (683,178 parameters) | PowerSGD r=2 | 24.0 (10.0x) |" in text
    assert f"| {network._rate(even)} |" in text and "Gbit/s" in network._rate(even)


@pytest.mark.timeout(420)
def test_every_launched_cell_of_the_blank_release_opens_with_its_box(tmp_path):
    """Issue 39: a student who runs a try cell, an experiment or a benchmark before finishing
    the file meets the short box first (which function, what to do), no traceback."""
    assert_launched_cells_open_with_their_box(STEM, tmp_path / "student")
