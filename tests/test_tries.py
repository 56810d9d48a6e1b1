"""The try cells' core (exercise_utils/tries.py, issue 39): a try on a file not ready says what
to run first without starting any rank; on a finished part it prints what every rank computed;
a part that fails in the ranks is the checks' short box, named after the try."""
from pathlib import Path

import pytest

from exercise_utils import display, tries
from exercise_utils.build_your_own_ddp import tries as tries06
from exercise_utils.contract import CheckFailure
from exercise_utils.notebook_files import extract_writefiles, writefile_cells
import flaws

ROOT = Path(__file__).resolve().parents[1]
NEEDS = ("init", "partition_dataset")


@pytest.fixture(scope="module")
def solution06(tmp_path_factory):
    return extract_writefiles(ROOT / "solutions" / "06_build_your_own_ddp.ipynb",
                              tmp_path_factory.mktemp("sol06"))["06_myddp"]


def test_a_file_not_ready_is_told_before_any_rank_starts(tmp_path, solution06):
    missing = tmp_path / "06_myddp.py"
    with pytest.raises(display.NotReady, match="does not exist: run the cell that writes it "
                                               r"first \(its %%writefile cell, or each of its "
                                               r"%%part cells\)\. Then run this cell\."):
        tries.ready(missing, NEEDS)
    missing.write_text("def init(:\n")
    with pytest.raises(display.NotReady, match=r"is not valid Python \(line 1"):
        tries.ready(missing, NEEDS)
    text = solution06.read_text()
    part1 = text.split("# ---- part 2/5")[0]          # the other parts' cells not run yet
    missing.write_text(part1)
    tries.ready(missing, NEEDS)                        # part 1 is all this try needs
    with pytest.raises(display.NotReady, match=r"broadcast_parameters not found in .*\(part "
                                               r"2: the cell `%%part work/06_myddp.py 2/5`\)"):
        tries.ready(missing, ("broadcast_parameters",))
    blank = writefile_cells(ROOT / "notebooks" / "06_build_your_own_ddp.ipynb")["work/06_myddp.py"]
    missing.write_text(blank)
    with pytest.raises(display.NotWritten) as err:
        tries.ready(missing, NEEDS)
    assert err.value.name == "init" and str(err.value).startswith(
        f"init, partition_dataset in {missing} still raise NotImplementedError. Replace the "
        "`raise` line with your code, then run the cell `%%part work/06_myddp.py 1/5` again, "
        "then this cell. Still to do in that file, in order: broadcast_parameters, "), str(err.value)
    box = display.Failure(err.value)
    assert box.title == "✗ not implemented yet: init" and box.first[0].startswith("init, ")
    assert {"DistributedOptimizer.step", "BucketDDP.no_sync", "init"} <= tries.defined(missing)


def test_a_try_prints_every_rank_and_a_failing_part_is_the_short_box(tmp_path, solution06,
                                                                      capsys):
    tries06.run("api", solution06)
    out = capsys.readouterr().out
    assert "rank 0: init() -> ('0', '2', 'cpu')" in out and "rank 1: step 2: this rank" in out
    assert "rank 1: 3 steps (expected 3)" in out, out
    wrong = tmp_path / "06_myddp.py"
    wrong.write_text(flaws.apply(solution06.read_text(), (flaws.Def(
        "partition_dataset", "def partition_dataset(dataset, batch_size, seed=0):\n"
                             "    raise ValueError('not my day')\n"),)))
    with pytest.raises(CheckFailure) as err:
        tries06.run("api", wrong)
    assert err.value.check == "the try of init and partition_dataset"
    assert "raised ValueError" in str(err.value) and "not my day" in str(err.value)
    with pytest.raises(ValueError, match="the try must be one of 'api', 'broadcast'"):
        tries06.run("nothing", solution06)
