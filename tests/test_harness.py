"""The checker harness: per-rank results and student-readable failures."""
import textwrap
import time

import numpy as np
import pytest

from exercise_utils.harness import assert_close, run_ranks

pytestmark = pytest.mark.usefixtures("env_pythonpath")
GLOO_SUM = "harness_probes:probe_gloo_sum"


def student(tmp_path, code, name="student.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def test_gloo_results_per_rank(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            dist.all_reduce(t)
        """)
    assert run_ranks(path, GLOO_SUM, 3, "gloo", timeout=60) == [6.0, 6.0, 6.0]
    assert run_ranks(path, "harness_probes:probe_world", 2, "gloo") == [(0, 2, True), (1, 2, True)]


def test_not_implemented_yet(tmp_path):
    path = student(tmp_path, """
        def reduce(t):
            raise NotImplementedError()
        """)
    with pytest.raises(AssertionError, match="not implemented yet: reduce"):
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=60)


def test_gloo_hang_is_reported_and_killed(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 0:
                dist.all_reduce(t)      # rank 1 never joins
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError) as err:
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=10)
    assert time.monotonic() - start < 40
    msg = str(err.value)
    assert "hung: ranks issued different collectives?" in msg and "ranks still waiting: [0]" in msg


def test_crash_of_one_rank_is_reported_without_waiting(tmp_path):
    path = student(tmp_path, """
        import torch.distributed as dist
        def reduce(t):
            if dist.get_rank() == 1:
                raise ValueError("bad shapes on rank 1")
            dist.all_reduce(t)
        """)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"rank 1 raised ValueError: bad shapes on rank 1"):
        run_ranks(path, GLOO_SUM, 2, "gloo", timeout=60)
    assert time.monotonic() - start < 40, "the waiting rank must be stopped at once"


def test_mpi_crash_of_one_rank(tmp_path):
    path = student(tmp_path, """
        def value(rank):
            return 1 / (rank - 1)
        """)
    with pytest.raises(AssertionError, match="rank 1 raised ZeroDivisionError"):
        run_ranks(path, "harness_probes:probe_value", 2, "mpi", timeout=60)


def test_syntax_error_is_reported(tmp_path):
    path = student(tmp_path, "def value(rank)\n    return rank\n")
    with pytest.raises(AssertionError, match="SyntaxError"):
        run_ranks(path, "harness_probes:probe_value", 1, timeout=60)


def test_missing_file(tmp_path):
    with pytest.raises(AssertionError, match="does not exist: run the %%writefile cell"):
        run_ranks(tmp_path / "nope.py", "harness_probes:probe_value")


def test_exit_in_student_code_is_reported(tmp_path):
    path = student(tmp_path, "import sys\ndef value(rank):\n    sys.exit(0)\n")
    with pytest.raises(AssertionError, match="SystemExit"):
        run_ranks(path, "harness_probes:probe_value", 1, timeout=60)


def test_assert_close_names_rank_tensor_and_size():
    with pytest.raises(AssertionError, match=r"rank 2 differs by 3\.0e-02 in fc1\.weight"):
        assert_close({"fc1.weight": np.array([1.03, 2.0])}, {"fc1.weight": np.array([1.0, 2.0])},
                     "parameters", rank=2)
    with pytest.raises(AssertionError, match="has shape"):
        assert_close({"w": np.zeros(3)}, {"w": np.zeros(4)}, "parameters", rank=0)
    with pytest.raises(AssertionError, match="lacks"):
        assert_close({}, {"w": np.zeros(4)}, "parameters", rank=0)
    assert_close({"w": np.ones(3)}, {"w": np.ones(3) + 1e-7}, "parameters", rank=0)
