"""Shared fixtures: every test must leave no launched process behind."""
import os
import sys
from pathlib import Path

import psutil
import pytest
from hypothesis import settings

# Property tests are reproducible by default: the same examples on every run, so a submission's
# CI verdict does not depend on which examples a random seed drew (a random draw once found,
# in CI only, a claim the test made that the contract does not: issue 24's note). Searching
# for new counter-examples is a separate, deliberate step:
#   HYPOTHESIS_PROFILE=explore .venv/bin/python -m pytest tests -k "contract or reference or solution"
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from exercise_utils import processes
# where the time went (issue 36): each pass's table, and work/profile/ for make test's last line
from suite_profile import (pytest_runtest_logreport, pytest_sessionfinish,  # noqa: F401,E402
                           pytest_terminal_summary)

ROOT = Path(__file__).resolve().parents[1]

# Tests that take minutes, longest first (test seconds of a fresh run, three at a time, after
# the threads' share, 2026-11-28: tests/suite_profile.py; notebook 11's autograde, the longest
# in the run of 2026-11-30 at 347 s, was missing): they start first, so that none of
# them starts last and runs on alone while the other workers idle (the notebook pass ended
# 54 s after its average worker in alphabetical order; test_colab, 133 s, was not listed).
LONGEST_FIRST = [f"tests/test_{stem}::test_autograde" for stem in (
    "11_bonus_composed.py", "03_torch_distributed_collectives.py",
    "05_ddp_torchrun_fault_tolerance.py", "01_mpi_parallel_sgd.py", "06_build_your_own_ddp.py",
    "09_bonus_fsdp.py", "07_bonus_zero_sharding.py")] + ["tests/test_colab.py::"] + [
    f"tests/test_{stem}::test_autograde" for stem in (
        "08_bonus_powersgd.py", "10_bonus_model_parallel.py", "02_shared_memory_hogwild.py",
        "04_resnet_cifar_data_parallel.py")] + [
    "tests/test_isolation.py::", "tests/test_11_bonus_composed.py::test_the_step_s_cheats",
    "tests/test_wire.py::test_the_wire_is_observed_under",
    "tests/test_parallel_grade.py::test_four_jobs",
    "tests/test_grading_sandbox.py::test_side_channels",
    "tests/test_grading_sandbox.py::test_notebook_cheats",
    "tests/test_graded_only.py::test_every_trick", "tests/test_pipeline.py::test_autograde",
    "tests/test_checks.py::test_check_accepts_right_file[02_hogwild",
    "tests/test_checks.py::test_check_rejects_flaw[02_hogwild",
    "tests/test_05_lr_scaling.py::", "tests/test_graded_only.py::test_the_tricks_work"]


def pytest_configure(config):
    """Tests side by side (xdist, ``-n N``): each worker's processes get their share of the
    cores for torch's threads, as :func:`exercise_utils.launch.run` gives each rank its share
    (set before any worker starts, so that torch reads it when a worker, kernel or zygote
    imports it). Three workers with every core each on 2 cores spin more than they compute
    (the same checks took 202 s of wall alone, 91 s with a thread each). A run without
    workers (the serial pass: timing and load tests) keeps the machine's default."""
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 0 and not hasattr(config, "workerinput"):
        from exercise_utils.launch import core_share
        share = str(core_share(workers))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, share)


# A whole notebook's autograde has its own limit (1500 s, tests/grading.py), which says
# what ran too long; pytest-timeout's 600 s (pyproject.toml) cut it first when the machine was
# slow: notebook 05's, 196 s here on a quiet day, passed 600 s in a fresh-clone run beside two
# other workers (its notebook 03 took 490 s there, 241 s the day before). A slow machine is
# not a hang: those tests get this limit, above every autograde's own.
NOTEBOOK_TIMEOUT = 1800


def pytest_collection_modifyitems(config, items):
    """Give each ``notebook`` test without a limit of its own NOTEBOOK_TIMEOUT. Run the tests
    of LONGEST_FIRST first, in its order; the others keep theirs. Under
    ``--dist worksteal`` with N workers, xdist hands each worker a contiguous slice of this
    order at the start (then an idle worker takes half of the longest queue's tail): the
    long tests are dealt round the slices, each slice starting with its share of them, so
    that no worker starts with all of them and none is left running them alone at the end."""
    def rank(item):
        return next((i for i, prefix in enumerate(LONGEST_FIRST)
                     if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))
    items.sort(key=rank)
    for item in items:
        if item.get_closest_marker("notebook") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT))
    workers = getattr(config.option, "numprocesses", None)
    if getattr(config.option, "dist", None) == "worksteal" and isinstance(workers, int) \
            and workers > 1:
        items[:] = dealt(items, [rank(item) < len(LONGEST_FIRST) for item in items], workers)


def slice_sizes(total, workers):
    """The sizes of the slices xdist's worksteal scheduler sends ``workers`` idle workers
    from ``total`` tests: each takes the pending tests // the workers still to serve."""
    sizes = []
    for i in range(workers):
        sizes.append((total - sum(sizes)) // (workers - i))
    return sizes


def dealt(items, long_, workers):
    """``items`` reordered as ``workers`` consecutive slices (:func:`slice_sizes`): the long
    ones (``long_``, in their order) dealt round the slices first, then the others, in their
    order, filling each slice in turn."""
    sizes = slice_sizes(len(items), workers)
    piles = [[] for _ in range(workers)]
    longs = [item for item, is_long in zip(items, long_) if is_long]
    rest = [item for item, is_long in zip(items, long_) if not is_long]
    for i, item in enumerate(longs):
        free = [k for k in range(workers) if len(piles[k]) < sizes[k]]
        piles[min(free, key=lambda k: ((i - k) % workers, k))].append(item)
    for k in range(workers):
        take = sizes[k] - len(piles[k])
        piles[k] += rest[:take]
        rest = rest[take:]
    return [item for pile in piles for item in pile]


def _ours_or_orphaned(tag):
    from exercise_utils import hosts
    if tag in hosts.live_tags():        # this worker's hosts' zygotes: they outlive every check
        return False
    owner = tag.split(":")[0]
    return owner.isdigit() and (int(owner) == os.getpid() or not psutil.pid_exists(int(owner)))


def tagged_pids():
    """Pids of live processes started by exercise_utils.launch in this test process, or
    orphaned by a launcher that is gone (e.g. a notebook kernel run by nbgrader).

    The tag is ``<launcher pid>:<id>``; processes of launches that are still running in
    other programs (another pytest worker, a notebook) are not ours to judge.
    """
    return {p.pid for p in processes.tagged_processes(_ours_or_orphaned)}


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Fail any test after which a process started by the launcher is still alive."""
    before = tagged_pids()
    yield
    left = tagged_pids() - before
    if left:
        details = []
        for pid in left:
            try:
                details.append(" ".join(psutil.Process(pid).cmdline())[:120])
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        pytest.fail(f"processes left behind: {details}")


@pytest.fixture(scope="module")
def module_session():
    """Every check of a test module (in one pytest worker) forks its gloo and lone-process
    ranks from one zygote, and runs on one set of hosts where it observes links, instead of a
    zygote (and hosts) per check: each imports torch once (each check_* opens a
    harness.session; nested ones share the outer one). Started before the module's first test,
    so that no test sees it appear as a process left behind. Used by tests/test_checks.py,
    tests/test_cheats.py and tests/test_wire.py (``pytestmark``)."""
    from exercise_utils import harness
    with harness.session(start=True):
        yield


@pytest.fixture
def py():
    """This interpreter."""
    return sys.executable


@pytest.fixture
def env_pythonpath(monkeypatch):
    """Let worker processes import helper modules from tests/."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="session")
def fixture_release(tmp_path_factory):
    """The released (blank) fixture notebook tests/fixtures/00_fixture, made once per session."""
    from test_pipeline import FIXTURE, STEM, course, ok
    base = tmp_path_factory.mktemp("fixture-release")
    ok(course("release", "--solutions", FIXTURE.parent, "--notebooks", base))
    return base / f"{STEM}.ipynb"
