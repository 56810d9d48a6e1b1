"""Grading in the sandbox (issue 25): under ``make autograde``'s policy every launch of a check
runs in bubblewrap, where solutions/, tests/, .git and the course folder (gradebook, other
submissions) read as empty, no capability is left and the judge's processes cannot be read.

The cheats of tests/cheats/sandbox/ pass their check where the files are readable (so each
trick is real and these tests can fail) and fail under the policy; a notebook whose exercise
cell runs the solution scores 0 under ``scripts/course.py autograde``; without a sandbox,
autograde refuses unless given ``--unsafe``.
"""
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import psutil
import pytest

from exercise_utils import sandbox, sides
from exercise_utils.processes import kill_processes
from grading import autograde, check_outputs
from test_cheats import checker_for
from test_sandbox import bwrap  # noqa: F401 - the fixture: installs bubblewrap or skips

ROOT = Path(__file__).resolve().parents[1]
CHEATS = ROOT / "tests" / "cheats" / "sandbox"
RUN_CHECK = textwrap.dedent("""
    import importlib, json, sys
    module, name, path = sys.argv[1:4]
    check = getattr(importlib.import_module(module), name)
    try:
        check(path)
        print(json.dumps({"passed": True}))
    except AssertionError as exc:
        print(json.dumps({"passed": False, "message": str(exc)[:1500]}))
""")


def policy_env(course):
    """The environment make autograde gives nbgrader (scripts/course.py)."""
    return {**os.environ, **sandbox.grading_policy(sandbox.grading_hidden(course))}


def submission(tmp_path, stem, text):
    """A course folder with one submission's exercise file in the kernel's folder:
    course/autograded/student/STEM/work/<file>, and a gradebook holding the solution's cells
    (the table nbgrader keeps them in)."""
    course = tmp_path / "course"
    folder = course / "autograded" / "student" / stem
    (folder / "work").mkdir(parents=True)
    db = sqlite3.connect(course / "gradebook.db")
    db.execute("CREATE TABLE source_cells (name TEXT, source TEXT)")
    nb = nbformat.read(next((ROOT / "solutions").glob(f"{stem[:2]}_*.ipynb")), as_version=4)
    db.executemany("INSERT INTO source_cells VALUES (?, ?)",
                   [(str(i), c.source) for i, c in enumerate(nb.cells)])
    db.commit()
    db.close()
    return course, folder, text


def run_check(cheat, folder, env):
    check = checker_for(cheat.stem)
    target = folder / "work" / cheat.name
    target.write_text(cheat.read_text())
    out = subprocess.run([sys.executable, "-c", RUN_CHECK, check.__module__, check.__name__,
                          str(target)], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stem", sorted(p.stem for p in CHEATS.glob("*.py")))
def test_sandbox_cheat_passes_unsandboxed_and_fails_under_the_policy(bwrap, tmp_path, stem):  # noqa: F811
    cheat = CHEATS / f"{stem}.py"
    course, folder, _ = submission(tmp_path, stem, cheat.read_text())
    free = run_check(cheat, folder, dict(os.environ))
    assert free["passed"], f"the trick does not work even without the sandbox: {free}"
    jailed = run_check(cheat, folder, policy_env(course))
    assert not jailed["passed"], "the sandbox let the cheat pass"
    assert "integrity" not in jailed["message"], jailed["message"]
    assert " raised " in jailed["message"], jailed["message"]     # the file's own error


PROBE = textwrap.dedent("""
    import json, os, subprocess
    out = {"solutions": os.listdir(%(root)r + "/solutions"), "tests": os.listdir(%(root)r + "/tests"),
           "course": sorted(os.listdir(%(course)r)), "own": os.path.isdir("work")}
    try:
        open("/proc/%(judge)d/environ", "rb").read(10)
        out["judge_environ"] = "read"
    except OSError as exc:
        out["judge_environ"] = type(exc).__name__
    try:
        os.kill(%(outsider)d, 19)       # SIGSTOP to a process outside (as the judge's kernel)
        out["outsider_stopped"] = "stopped"
    except OSError as exc:
        out["outsider_stopped"] = type(exc).__name__
    out["umount"] = subprocess.run(["umount", %(root)r + "/solutions"], capture_output=True).returncode
    for name, path in (("cwd", "mine.txt"), ("repo", %(root)r + "/x.txt"),
                       ("tmpdir", os.path.join(os.environ["TMPDIR"], "t.txt"))):
        try:
            open(path, "w").write("x")
            out[name] = "wrote"
        except OSError as exc:
            out[name] = type(exc).__name__
    out["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    import importlib, importlib.util
    def judge(m):
        try:
            return sorted(n for n in vars(importlib.import_module(m)) if not n.startswith("__"))
        except ImportError as exc:
            return type(exc).__name__
    out["judge"] = {m: judge(m) for m in ("exercise_utils.bonus_zero_sharding.checks_memory",
                              "exercise_utils.bonus_powersgd.expected",
                              "exercise_utils.build_your_own_ddp.expected",
                              "exercise_utils.mpi_parallel_sgd.checks")}
    out["pyc"] = [len(open(p, "rb").read()) for p in %(pyc)r]
    out["probes"] = "probe_sharding" in vars(importlib.import_module("exercise_utils.bonus_fsdp.shards"))
    print(json.dumps(out))
""")


def test_a_launch_under_the_policy_sees_only_its_submission(bwrap, tmp_path):  # noqa: F811
    """What a rank sees: the course's hidden folders empty, its own folder and the kernel's
    private temporary folder writable, the repository read-only, no capability, the judge's
    environment unreadable and itself beyond reach (as every process outside: its memory too),
    since the rank has a pid namespace of its own."""
    course, folder, _ = submission(tmp_path, "01_mpi_parallel_sgd", "")
    (course / "submitted" / "other" / "01_mpi_parallel_sgd").mkdir(parents=True)
    pyc = [str(p) for p in sides.judge_files() if p.suffix == ".pyc"]
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    code = PROBE % {"root": str(ROOT), "course": str(course), "judge": os.getpid(), "pyc": pyc,
                    "outsider": outsider.pid}
    launcher = textwrap.dedent(f"""
        import json, sys, tempfile
        from exercise_utils import launch
        res = launch.run([sys.executable, "-c", {code!r}], timeout=120, echo=False)
        got = json.loads(res.output.strip().splitlines()[-1])
        got["private_tmp"] = tempfile.gettempdir()
        print(json.dumps(got))
    """)
    try:
        out = subprocess.run([sys.executable, "-c", launcher], cwd=folder,
                             env=policy_env(course), capture_output=True, text=True, timeout=300)
        stopped = psutil.Process(outsider.pid).status() == psutil.STATUS_STOPPED
    finally:
        outsider.kill()
        outsider.wait()
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["solutions"] == [] and got["tests"] == [], got
    assert got["course"] == ["autograded"], got          # no gradebook, no other submission
    assert got["own"] and got["cwd"] == "wrote" and got["tmpdir"] == "wrote", got
    assert got["repo"] == "OSError" or got["repo"].endswith("Error"), got
    # the judge's process is not even there (a pid namespace of its own): no environment to
    # read; nor any other process outside to stop
    assert got["repo"] != "wrote" and got["judge_environ"] == "FileNotFoundError", got
    assert got["outsider_stopped"] == "ProcessLookupError" and not stopped, got
    assert got["umount"] != 0 and int(got["caps"], 16) == 0, got
    assert got["private_tmp"].startswith("/tmp/dtfs-grade-"), got
    assert got["judge"] == {m: "ModuleNotFoundError" for m in got["judge"]}, got["judge"]
    assert got["pyc"] and not any(got["pyc"]), got["pyc"]              # and their bytecode
    assert got["probes"], "a module a rank needs was hidden"
    assert not Path(got["private_tmp"]).exists(), "the kernel's private folder outlived it"
    assert (folder / "mine.txt").read_text() == "x"


def test_autograde_refuses_without_a_sandbox_unless_unsafe(tmp_path):
    """No bwrap on PATH (a laptop, Colab): autograde says why and grades nothing; with
    --unsafe it grades (the fixture notebook, solution: full marks)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for exe in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if exe.name != "bwrap" and not (bin_dir / exe.name).exists():
                (bin_dir / exe.name).symlink_to(exe)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}"}
    fixture = ROOT / "tests" / "fixtures" / "00_fixture"
    course = tmp_path / "course"
    target = course / "submitted" / "student" / "00_fixture"
    target.mkdir(parents=True)
    (target / "00_fixture.ipynb").write_text((fixture / "00_fixture.ipynb").read_text())
    cmd = [sys.executable, str(ROOT / "scripts" / "course.py"), "autograde", "--course",
           str(course), "--solutions", str(fixture), "--cell-timeout", "60"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0, refused.stdout[-2000:]
    assert "refuses to grade without a sandbox" in refused.stderr, refused.stderr[-2000:]
    assert "bubblewrap" in refused.stderr and "--unsafe" in refused.stderr
    assert not (course / "grades.csv").exists()
    graded = subprocess.run(cmd + ["--unsafe"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    assert "WITHOUT a sandbox" in graded.stdout
    import csv
    rows = list(csv.DictReader((course / "grades.csv").open()))
    assert [(r["student_id"], float(r["score"])) for r in rows] == \
        [("student", float(rows[0]["max_score"]))], rows


CHEAT_CELL = {
    "reads_solution": (CHEATS / "07_memory_exec_solution.py").read_text(),
    "reads_gradebook": (CHEATS / "07_memory_read_gradebook.py").read_text(),
}


def test_notebook_cheats_score_zero_under_autograde(bwrap, tmp_path):  # noqa: F811
    """Submissions of notebook 07 whose exercise cell runs the course's solution, read from
    solutions/ or from the gradebook: 0 points under make autograde's sandbox (each trick
    passes check_memory where the files are readable: the parametrized test above)."""
    stem = "07_bonus_zero_sharding"
    release = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    subs = {}
    for student, body in CHEAT_CELL.items():
        nb = nbformat.reads(nbformat.writes(release), as_version=4)
        cell = next(c for c in nb.cells if c.source.startswith("%%part work/07_zero.py 1/"))
        cell.source = cell.source.split("\n", 1)[0] + "\n" + body
        subs[student] = nbformat.writes(nb)
    course, scores, _ = autograde(tmp_path, stem, subs, whole_notebook=False)
    assert scores == {"reads_solution": 0.0, "reads_gradebook": 0.0}, scores
    for student in subs:
        text = next(v for k, v in check_outputs(course, student, stem).items()
                    if k.startswith("# CHECK memory"))
        assert "FileNotFoundError" in text and "violated" not in text, text[-1500:]


def test_ranks_are_out_of_reach_of_another_sandbox(bwrap):  # noqa: F811
    """Two submissions graded at once (JOBS): a process of one sandbox can neither read the
    environment (nor the memory) of a rank in another, hardened or not, nor signal it: it does
    not see it at all (each sandbox has a pid namespace of its own). From outside any sandbox
    (root, all capabilities) the rank's environment reads, so the test can fail."""
    seen = {}
    for hardened in (False, True):
        code = ("import time\nfrom exercise_utils import sandbox\n"
                + ("sandbox.harden()\n" if hardened else "") + "print('up', flush=True)\ntime.sleep(60)")
        victim = subprocess.Popen(sandbox.command([sys.executable, "-c", code], cwd="/"),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert victim.stdout.readline().strip() == "up"
            pid = next(p.pid for p in psutil.Process(victim.pid).children(recursive=True)
                       if "python" in p.name())
            spy = f"import os\nopen('/proc/{pid}/environ', 'rb').read(10)\nos.kill({pid}, 19)"
            for where, cmd in (("outside", [sys.executable, "-c", spy.split("\nos.kill")[0]]),
                               ("sandbox", sandbox.command([sys.executable, "-c", spy], cwd="/"))):
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                seen[where, hardened] = out.returncode == 0 or out.stderr.strip().splitlines()[-1]
            assert psutil.Process(pid).status() != psutil.STATUS_STOPPED
        finally:
            inside = psutil.Process(victim.pid).children(recursive=True)
            victim.kill()
            victim.wait()
            kill_processes(inside)
    assert seen["outside", False] is True, seen
    assert all("FileNotFoundError" in str(seen["sandbox", h]) for h in (False, True)), seen


FAIL_ONCE = """#!/bin/bash
# bwrap, failing once at set-up while {marker} exists (as a mount it binds can vanish); two
# started at once (the hosts' zygotes) must not both fail: only one can take the marker
if mv {marker} {marker}.taken 2>/dev/null; then
    echo 'bwrap: Can'"'"'t bind mount /oldroot/ on /newroot/: (a test: failed once)' >&2
    exit 1
fi
exec {real} "$@"
"""

SANDBOX_FAILS_ONCE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from exercise_utils import harness, sandbox
    path, marker = sys.argv[1:3]
    Path(marker).touch()
    got = {"unavailable": sandbox.unavailable(), "probe marker left": Path(marker).exists()}
    for name, backend, in_session in (("plain", "gloo", False), ("session", "gloo", True),
                                      ("mpi", "mpi", False)):
        Path(marker).touch()
        if in_session:
            with harness.session():
                got[name] = harness.run_ranks(path, "sandbox_probe:probe_value", 2, backend,
                                              timeout=120)
        else:
            got[name] = harness.run_ranks(path, "sandbox_probe:probe_value", 2, backend,
                                          timeout=120)
        got[name + " marker left"] = Path(marker).exists()
    print(json.dumps(got))
""")


@pytest.mark.parametrize("on_hosts", ["0", "1"])
def test_a_sandbox_that_failed_to_start_runs_again(bwrap, tmp_path, on_hosts):  # noqa: F811
    """bubblewrap can fail to set up a launch's sandbox (CI: a mount it binds vanished
    meanwhile) before anything of the student's ran: the launch runs again, and says why on
    stderr. The same when the session's zygote's sandbox fails: the launch runs without it;
    and when the first sandbox, which tells whether one can run here, fails: it is tried
    again (else every check of the notebook would fail: "no sandbox can run here"). On hosts
    (at grading, as root: ``on_hosts``) a host's zygote whose sandbox failed is started anew
    and the launch runs again."""
    import shutil
    marker, fake = tmp_path / "fail-once", tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text(FAIL_ONCE.format(marker=marker, real=shutil.which("bwrap")))
    fake.chmod(0o755)
    folder = tmp_path / "course" / "autograded" / "student" / "harness"
    folder.mkdir(parents=True)
    (folder / "student.py").write_text("def value(rank):\n    return rank * 10\n")
    probes = tmp_path / "probes"     # (the course folder is hidden from the ranks)
    probes.mkdir()
    (probes / "sandbox_probe.py").write_text("def probe_value(student, ctx):\n"
                                             "    return student.value(ctx.rank)\n")
    env = {**policy_env(tmp_path / "course"), "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(probes), "DTFS_OBSERVE": on_hosts}
    out = subprocess.run([sys.executable, "-c", SANDBOX_FAILS_ONCE, "student.py", str(marker)],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    if on_hosts == "1":     # the hosts' zygotes start once per process: the first one fails
        assert [got[k] for k in ("unavailable", "plain", "session", "mpi")] == \
            [None, [0, 10], [0, 10], [0, 10]], got
        assert len(notes) == 1 and "(a test: failed once)" in notes[0], out.stderr[-3000:]
        assert ("a host's zygote was lost" in notes[0] and "ran again" in notes[0]) or \
            ("zygote: exit status 1" in notes[0] and "started anew" in notes[0]), notes
        return
    assert got == {"unavailable": None, "probe marker left": False, "plain": [0, 10], "plain marker left": False, "session": [0, 10],
                   "session marker left": False, "mpi": [0, 10], "mpi marker left": False}, got
    assert len(notes) == 3, out.stderr[-3000:]
    assert all("(a test: failed once)" in note for note in notes), notes
    assert sum("the sandbox failed to start" in n and "ran again" in n for n in notes) == 2
    assert sum("zygote exited with status 1" in n and "ran without it" in n
               for n in notes) == 1, notes


HANG_UNDER_POLICY = textwrap.dedent("""
    import json, time
    from exercise_utils import harness
    got = {}

    def launch(name, path, timeout=120):
        start = time.monotonic()
        try:
            got[name] = harness.run_ranks(path, "sandbox_probe:probe_sum", 2, "gloo",
                                          timeout=timeout)
        except AssertionError as err:
            got[name] = str(err)
        got[name + " seconds"] = time.monotonic() - start

    with harness.session():
        launch("hang", "hang.py", timeout=10)
        with harness.session():          # a check inside a check: reaped when it ends
            launch("before", "good.py")
        launch("after", "good.py")
    print(json.dumps(got))
""")


@pytest.mark.parametrize("on_hosts", ["1", "0"])
def test_a_hang_is_a_hang_in_the_sandbox_and_the_session_goes_on(bwrap, tmp_path, on_hosts):  # noqa: F811
    """In the sandbox (a pid namespace of its own: the ranks' pids are not the launcher's) the
    watch still tells a rank standing still from a dead one (the lock its beat holds), so a
    deadlock is called a hang within the hang limit; and a session, when a check inside it
    ends, reaps what its zygote forked and not the zygote (found by the pid it has inside),
    which forks the next launch's ranks. The same where each rank runs on a host of its own
    (at grading, as root: ``on_hosts``), whose zygotes outlive every launch of the session."""
    folder = tmp_path / "course" / "autograded" / "student" / "harness"
    folder.mkdir(parents=True)
    probes = tmp_path / "probes"     # (the course folder is hidden from the ranks)
    probes.mkdir()
    collective = "    dist.all_reduce(t)\n    return t.tolist()\n"
    (folder / "good.py").write_text("import torch.distributed as dist\n\n\ndef total(t):\n"
                                    + collective)
    (folder / "hang.py").write_text("import torch.distributed as dist\n\n\ndef total(t):\n"
                                    "    if dist.get_rank() == 0:\n" + collective.replace(
                                        "    ", "        ", 1) + "    return []\n")
    (probes / "sandbox_probe.py").write_text(
        "import psutil\nimport torch\n\n\ndef probe_sum(student, ctx):\n"   # and when the
        "    zygote = [p for p in psutil.Process().parents()\n"     # zygote began (the oldest:
        "              if 'exercise_utils.zygote' in ' '.join(p.cmdline())][-1]\n"  # its forks
        #                                                                  share its cmdline)
        "    return student.total(torch.tensor([ctx.rank + 1.0])), zygote.create_time()\n")
    env = {**policy_env(tmp_path / "course"), "PYTHONPATH": str(probes), "DTFS_OBSERVE": on_hosts}
    out = subprocess.run([sys.executable, "-c", HANG_UNDER_POLICY], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "hung" in got["hang"] and "ranks still waiting: [0]" in got["hang"], got
    assert got["hang seconds"] < 60, got
    assert [total for total, _ in got["after"]] == [[3.0], [3.0]], got
    assert got["after"] == got["before"], "the session's zygote was killed with the hung ranks"


def test_salts_reach_each_rank_alone_under_the_grading_policy(bwrap, tmp_path):  # noqa: F811
    """At grading (the policy, no DTFS_SALT) a salted check's ranks get their salts in their
    sandbox: a cheat that rebuilds the other ranks' rows fails, a right file passes."""
    from exercise_utils import harness
    cheat = ROOT / "tests" / "cheats" / "salted" / "03_average_gradients_local_mean.py"
    right = ROOT / "tests" / "right" / "03_average_gradients_per_parameter.py"
    course, folder, _ = submission(tmp_path, cheat.stem, "")
    env = {k: v for k, v in policy_env(course).items() if k != harness.SALT}
    caught = run_check(cheat, folder, env)
    assert not caught["passed"] and "hold different gradients" in caught["message"], caught
    passed = run_check(right, folder, env)
    assert passed["passed"], passed


SHARED = ROOT / "tests" / "cheats" / "shared"


@pytest.mark.parametrize("stem", sorted(p.stem for p in SHARED.glob("*.py")))
def test_side_channels_between_ranks_pass_in_one_sandbox_and_fail_on_hosts(bwrap, tmp_path, stem):  # noqa: F811
    """Ranks that meet outside the network the judge watches (files in a shared ``/tmp``, a
    socket on a shared loopback) and send decoys on it: where the ranks of a launch share one
    sandbox (``DTFS_OBSERVE=0``: what grading falls back to without network namespaces) the
    trick scores, salts and all (so it is real and this test can fail); at grading, each rank
    on a host of its own (:mod:`exercise_utils.hosts`), it fails on the values."""
    cheat = SHARED / f"{stem}.py"
    course, folder, _ = submission(tmp_path, stem, "")
    env = policy_env(course)
    shared = run_check(cheat, folder, {**env, "DTFS_OBSERVE": "0"})
    assert shared["passed"], f"the side channel does not work even in one sandbox: {shared}"
    apart = run_check(cheat, folder, {k: v for k, v in env.items() if k != "DTFS_OBSERVE"})
    assert not apart["passed"], "a side channel between the hosts' ranks worked"
    message = apart["message"]
    assert "integrity" not in message, message        # a wrong value, not a caught trick
    assert "expected the sum" in message or "hold different gradients" in message, message


def test_the_hosts_keep_nothing_of_a_check_for_the_next(bwrap, monkeypatch, env_pythonpath, tmp_path):  # noqa: F811
    """The hosts (``DTFS_OBSERVE=1``: as at grading) outlive a check, their zygotes too (the
    next check's ranks fork from the same ones), but nothing else does: the files a rank left
    in its host's ``/tmp`` and ``/dev/shm`` and a daemon it started are gone when the next
    check starts; within one check they are still there (so the test can fail)."""
    from exercise_utils import harness
    monkeypatch.setenv(harness.OBSERVE, "1")
    blank = tmp_path / "blank.py"
    blank.write_text("")
    canary = tmp_path / "canary"      # (the machine's /tmp: never emptied)
    canary.write_text("")
    with harness.session():
        left = harness.run_ranks(blank, "harness_probes:probe_leave_traces", 2, "none")
        within = harness.run_ranks(blank, "harness_probes:probe_find_traces", 2, "none",
                                   {"daemon": left[0][0]})
    after = harness.run_ranks(blank, "harness_probes:probe_find_traces", 2, "none",
                              {"daemon": left[0][0]})
    assert [w[:2] for w in within] == [([True, True], False), ([True, True], False)], within
    assert [a[:2] for a in after] == [([False, False], False)] * 2, after
    assert [a[2] for a in after] == [w[2] for w in within] == [x[1] for x in left], \
        "the zygotes did not last"
    assert canary.exists(), "the machine's /tmp was emptied"
