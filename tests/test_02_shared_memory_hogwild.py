"""Notebook 02 (shared-memory Hogwild): its checkers against the solution, known-wrong files
and correct variants, the experiment script's helpers, and the whole notebook autograded as a
solution and as a blank release."""
import os
from pathlib import Path

import pytest

from exercise_utils.shared_memory_hogwild import checks, experiments, probes, train
from exercise_utils.notebook_files import writefile_cells
from grading import autograde_solution_and_blank

ROOT = Path(__file__).resolve().parents[1]
STEM = "02_shared_memory_hogwild"
SOLUTION = ROOT / "solutions" / f"{STEM}.ipynb"
RIGHT = ROOT / "tests" / "right"
CHECKERS = {"sampler": checks.check_sampler, "hogwild": checks.check_hogwild}
POINTS = 8.0            # 3 (sampler) + 5 (hogwild)


def exercise_of(stem):
    return next(name for name in CHECKERS if stem[3:].startswith(name))


def test_solution_writes_one_file_per_exercise():
    files = {Path(p).stem for p in writefile_cells(SOLUTION)}
    assert {f"02_{name}" for name in CHECKERS} <= files


def test_every_checker_has_two_right_files():
    per_checker = {name: sum(exercise_of(p.stem) == name for p in RIGHT.glob("02_*.py"))
                   for name in CHECKERS}
    assert min(per_checker.values()) >= 2, per_checker


def test_sampler_reference_is_torch():
    """The checker's own reference and its case list (no student code involved)."""
    cases = probes.sampler_cases()
    assert len(cases) > 500 and any(n < r for n, r, *_ in cases)
    assert checks.reference_partition(2, 3, 2, False, 0, 0, False) == [0]
    assert checks.reference_partition(10, 3, 0, False, 0, 0, True) == [0, 3, 6]


def test_parse_run():
    assert train.parse_run("serial", cores=2) == (0, 2)
    assert train.parse_run("serialx1", cores=2) == (0, 1)
    assert train.parse_run("2x1", cores=2) == (2, 1)
    assert train.parse_run("4x", cores=2) == (4, 1)
    assert train.parse_run("2xauto", cores=8) == (2, 4)
    with pytest.raises(ValueError):
        train.parse_run("0x1")


def test_epoch_orders_shows_the_forgotten_set_epoch():
    lines = experiments.epoch_orders(12, 2, 2, set_epoch=False).splitlines()
    assert lines[1].split(":")[1] == lines[3].split(":")[1]       # epoch 0 == epoch 1
    lines = experiments.epoch_orders(12, 2, 2, set_epoch=True).splitlines()
    assert lines[1].split(":")[1] != lines[3].split(":")[1]


# ------------------------------------------------------------------ whole notebook
@pytest.mark.notebook
def test_autograde_solution_and_blank(tmp_path):
    graded, seconds = autograde_solution_and_blank(tmp_path, STEM, POINTS, len(CHECKERS), 1500)
    assert seconds < 300, f"autograding the solution and the blank release took {seconds:.0f} s"


def _read_many(data, index, times):
    for _ in range(times):
        data[index]


def test_recording_dataset_tells_forked_readers(monkeypatch):
    """A worker forked from the probe's process inherits its marker (check_hogwild rejects
    fork); the probe's own reads are not a fork's."""
    import multiprocessing
    import torch
    from exercise_utils.shared_memory_hogwild import probes as hogwild_probes
    monkeypatch.setattr(hogwild_probes, "_FORKED_FROM", os.getpid())
    data = hogwild_probes.RecordingDataset(torch.zeros(2, 3), torch.zeros(2), slots=2)
    data[0]
    assert not data.was_forked()
    child = multiprocessing.get_context("fork").Process(target=_read_many, args=(data, 1, 1))
    child.start()
    child.join()
    assert data.was_forked()


def test_recording_dataset_loses_no_read_when_workers_race():
    """Workers in different epochs can read one sample at the same moment: every read must
    keep its own slot (the checker once lost reads here under load and blamed the student)."""
    import multiprocessing
    import torch
    from exercise_utils.shared_memory_hogwild.probes import RecordingDataset
    workers, times = 4, 300
    data = RecordingDataset(torch.zeros(2, 3), torch.zeros(2), slots=workers * times)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_read_many, args=(data, 1, times)) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    reads, counts = data.reads()
    assert int(counts[1]) == workers * times
    assert sorted(len(seq) for seq in reads.values()) == [times] * workers


def _quick_exit():
    pass


def test_workers_together_counts_start_and_join_calls_not_processes_seen_alive():
    """On a busy machine a worker may finish before the next one starts (seen in CI: "at most
    2 worker process(es) were running at the same time" for a correct start-all-then-join-all
    file). The count comes from the order of the calls, so timing cannot change it."""
    import multiprocessing
    import time
    from exercise_utils.shared_memory_hogwild.probes import StartJoinCounter
    ctx = multiprocessing.get_context("fork")
    with StartJoinCounter() as together:
        procs = [ctx.Process(target=_quick_exit) for _ in range(3)]
        for p in procs:
            p.start()
            time.sleep(0.3)               # each worker is long gone before the next starts
        for p in procs:
            p.join()
    assert together.most == 3
    with StartJoinCounter() as one_by_one:
        for _ in range(3):
            p = ctx.Process(target=_quick_exit)
            p.start()
            p.join()
    assert one_by_one.most == 1
    from multiprocessing.process import BaseProcess
    assert BaseProcess.start.__qualname__ == "BaseProcess.start"      # restored afterwards
