"""Hangs are hangs, not slowness: checks of 02, 03, 05 and 06 pass on the reference solutions
while two CPU-bound processes load the 2-core machine (each rank then runs at a fraction of a
core, start-up takes several times longer, exits are slow). Before the heartbeat
(:mod:`exercise_utils.heartbeat`), the fixed wall-clock limits called such runs "hung".

The busy processes stop by themselves after ``BUSY_SECONDS`` and are killed at the end.
"""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exercise_utils.build_your_own_ddp.checks import check_naive
from exercise_utils.ddp_torchrun_fault_tolerance.checks import check_trainer
from exercise_utils.notebook_files import extract_writefiles
from exercise_utils.shared_memory_hogwild.checks import check_hogwild
from exercise_utils.torch_distributed_collectives.checks import check_average_gradients
from exercise_utils.torch_distributed_collectives.checks_ring import check_ring_allreduce

pytestmark = pytest.mark.serial
ROOT = Path(__file__).resolve().parents[1]
BUSY_SECONDS = 900
BUSY = f"import time\nend = time.time() + {BUSY_SECONDS}\nwhile time.time() < end: pass\n"
HANG_AFTER = 20     # a shorter no-progress limit than the checks' own: a stricter test


@pytest.fixture(scope="module")
def busy_machine():
    """Two CPU-bound processes for the duration of the module; killed at the end."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    time.sleep(2)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def solution(tmp_path, number, stem):
    notebook = next((ROOT / "solutions").glob(f"{number}_*.ipynb"))
    return extract_writefiles(notebook, tmp_path)[stem]


@pytest.mark.parametrize("number, stem, check", [
    ("02", "02_hogwild", check_hogwild),
    ("03", "03_ring_allreduce", check_ring_allreduce),
    ("03", "03_average_gradients", check_average_gradients),
    ("05", "05_trainer", check_trainer),
    ("06", "06_myddp", check_naive),
], ids=["02_hogwild", "03_ring", "03_average_gradients", "05_trainer", "06_naive"])
def test_no_false_hang_on_a_loaded_machine(busy_machine, tmp_path, number, stem, check):
    assert all(p.poll() is None for p in busy_machine), "the load generators must be running"
    check(solution(tmp_path, number, stem), timeout=HANG_AFTER)
