"""Shared fixtures: every test must leave no launched process behind."""
import os
import sys
from pathlib import Path

import psutil
import pytest

from exercise_utils import processes

ROOT = Path(__file__).resolve().parents[1]


def _ours_or_orphaned(tag):
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
