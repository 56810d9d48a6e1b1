"""The front page and its guides (issue 40): README.md is a front page of at most 120 lines that
links the four guides in docs/, and every relative link of the README and the guides reaches a
file (and a heading, where it names one). Every command they show is run by a test: each is in
COMMANDS with the test that runs it, that test exists, and the command's program and
subcommand (or what its make target runs) appear in the test's source or in the helpers and
fixtures it uses; a make command is one the Makefile accepts (``make -n``, every variable used
by the target). A command no test runs is in UNTESTED with the reason. Each rule is also shown
to catch a wrong input."""
import ast
import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ["docs/students.md", "docs/instructors.md", "docs/grading-security.md",
          "docs/developing.md"]
README_LINES = 120

# Every command of the README and the guides -> the test that runs it. The command's program
# and subcommand (for make: what the target runs, e.g. course.py autograde --jobs for JOBS=4)
# must appear in that test or in what it calls.
COMMANDS = {
    "make lab": "tests/test_browser.py::test_first_exercises_in_the_browser",
    "make lab-instructor":
        "tests/test_student.py::test_the_students_lab_has_no_nbgrader_and_the_instructors_has",
    "make setup": "tests/test_docs.py::test_ci_runs_the_readme_test_command",
    "make test": "tests/test_docs.py::test_ci_runs_the_readme_test_command",
    "make demo": "tests/test_docs.py::test_the_demo_runs",
    "make release": "tests/test_pipeline.py::test_release_strips_solutions_and_keeps_writefile",
    ".venv/bin/python scripts/course.py release --check":
        "tests/test_pipeline.py::test_repository_notebooks_have_no_drift",
    "scripts/course.py meta": "tests/test_pipeline.py::test_meta_sets_metadata_and_is_idempotent",
    "make autograde": "tests/test_pipeline.py::test_autograde_end_to_end",
    "make autograde COURSE=course": "tests/test_pipeline.py::test_autograde_end_to_end",
    "make feedback COURSE=course": "tests/test_pipeline.py::test_autograde_end_to_end",
    "make autograde COURSE=course JOBS=4":
        "tests/test_parallel_grade.py::test_four_jobs_grade_a_class_and_isolate_failures",
    "make autograde-slurm COURSE=course PER_TASK=4":
        "tests/test_slurm.py::test_a_class_is_graded_by_an_array_job_and_a_merge_job",
    "scripts/course.py autograde --course course --slurm [--per-task K] "
    "[--sbatch-arg=--partition=cpu] [--wait]":
        "tests/test_slurm.py::test_a_class_is_graded_by_an_array_job_and_a_merge_job",
    'make autograde COURSE=course LIMITS="memory=4G,check=400"':
        "tests/test_limits.py::test_a_class_keeps_its_marks_beside_a_submission_that_hits_every_limit",
    "scripts/course.py autograde --limits ...":
        "tests/test_limits.py::test_a_class_keeps_its_marks_beside_a_submission_that_hits_every_limit",
    "make autograde UNSAFE=1":
        "tests/test_grading_sandbox.py::test_autograde_refuses_without_a_sandbox_unless_unsafe",
    "scripts/course.py autograde":
        "tests/test_grading_sandbox.py::test_notebook_cheats_score_zero_under_autograde",
    "scripts/grading_bench.py --sandbox":
        "tests/test_docs.py::test_grading_bench_offers_what_the_docs_run",
    "sudo .venv/bin/python -m exercise_utils.cluster cleanup":
        "tests/test_docs.py::test_cluster_cleanup_runs",
}
UNTESTED = {
    "DTFS_LIMITS_LOG=FILE make autograde":
        "measures the solutions' needs from each host's cgroup (root, cgroups, a whole grading "
        "run); the make command itself is make -n checked",
}

COMMAND = re.compile(r"^(sudo )?([A-Z][A-Z_]*=\S+ )*(make [a-z]|(\.venv/bin/)?python "
                     r"(-m exercise_utils|scripts/)|scripts/\w+\.py )")


def docs():
    """``{path: text}`` of the README and the guides."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


# ------------------------------------------------------------------ the front page and links
def readme_problems(text, root=ROOT):
    """What is wrong with README ``text``: too long, a guide not linked or not there."""
    problems = []
    if len(text.splitlines()) > README_LINES:
        problems.append(f"README.md has {len(text.splitlines())} lines, more than {README_LINES}")
    links = {link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text)}
    for guide in GUIDES:
        if guide not in links:
            problems.append(f"README.md does not link {guide}")
        elif not (root / guide).is_file():
            problems.append(f"README.md links {guide}, which does not exist")
    return problems


def anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation gone, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path, text, root=ROOT):
    """Relative links of ``text`` (a file at ``path`` under ``root``) that reach no file, or no
    heading of it where the link names one."""
    bad = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue                                       # https:, mailto:
        target, _, fragment = link.partition("#")
        file = (root / path).parent / target if target else root / path
        if not file.is_file():
            bad.append(f"{path}: {link}: no such file")
        elif fragment and fragment not in {anchor(h) for h in re.findall(
                r"^#+ (.*)$", file.read_text(), flags=re.M)}:
            bad.append(f"{path}: {link}: no such heading")
    return bad


def test_readme_is_a_front_page_that_links_every_guide():
    assert readme_problems((ROOT / "README.md").read_text()) == []


def test_every_relative_link_reaches_its_file_and_heading():
    assert [bad for path, text in docs().items() for bad in broken_links(path, text)] == []


def test_front_page_rules_catch_wrong_inputs(tmp_path):
    links = " ".join(f"[guide]({g})" for g in GUIDES)
    assert readme_problems(f"# Course\n\n{links}\n") == []
    assert readme_problems("line\n" * 121 + links) == ["README.md has 122 lines, more than 120"]
    assert readme_problems(links.replace("(docs/students.md)", "(students.md)")) == [
        "README.md does not link docs/students.md"]
    assert readme_problems(links, root=tmp_path) == [
        f"README.md links {g}, which does not exist" for g in GUIDES]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Limits at grading\n")
    assert broken_links("README.md", "[a](docs/a.md#limits-at-grading) [w](https://x.org/y)",
                        tmp_path) == []
    assert broken_links("README.md", "[a](docs/a.md#limits) [b](docs/b.md)", tmp_path) == [
        "README.md: docs/a.md#limits: no such heading", "README.md: docs/b.md: no such file"]
    assert broken_links("docs/a.md", "[r](../README.md) [top](#a)", tmp_path) == [
        "docs/a.md: ../README.md: no such file"]


# ------------------------------------------------------------------ the commands
def commands_in(text):
    """The commands of a markdown ``text``: every line of its ```bash blocks (comments off),
    and every inline code span that is a command of the course (``make ...``,
    ``.venv/bin/python scripts/...`` or ``-m exercise_utils...``, ``scripts/x.py ...``)."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                found.append(" ".join(line.split()))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if COMMAND.match(span):
            found.append(span)
    return found


def words_of(command):
    """``(environment names, words)`` of a command: sudo and optional ``[...]`` arguments
    dropped, ``NAME=value`` prefixes taken apart."""
    words = shlex.split(re.sub(r"\s*\[[^\]]*\]", "", command))
    if words[0] == "sudo":
        words = words[1:]
    env = []
    while re.match(r"[A-Z][A-Z_]*=", words[0]):
        env.append(words.pop(0).split("=")[0])
    return env, words


def recipe(target, makefile=None):
    """The recipe lines of ``target`` in the Makefile (None: no such target)."""
    text = makefile if makefile is not None else (ROOT / "Makefile").read_text()
    found = re.search(rf"^{re.escape(target)}:[^=\n]*\n((?:\t.*\n?)*)", text, flags=re.M)
    return found[1] if found else None


def make_parts(words):
    """``(target, {variable: value})`` of ``make TARGET VAR=value ...``."""
    target = next(w for w in words[1:] if "=" not in w)
    return target, dict(w.split("=", 1) for w in words[1:] if "=" in w)


def needles(command, makefile=None):
    """What a test that runs ``command`` must name: the program and its subcommand and flags;
    for ``make``, what the target runs (``course.py autograde --jobs`` for ``make autograde
    JOBS=4``: each variable's flag, and the flags the recipe always passes), else the target's
    words (``lab-instructor``: ``lab``, ``instructor``)."""
    env, words = words_of(command)
    if words[0] == "make":
        target, variables = make_parts(words)
        body = recipe(target, makefile) or ""
        line = re.search(r"scripts/course\.py (\w+)(.*)", body)
        if not line:
            return env + target.split("-")
        tied = re.findall(r"(--[\w-]+) \"?\$\((\w+)\)", line[2]) + [
            (flag, var) for var, flag in re.findall(r"\$\(if \$\((\w+)\),(--[\w-]+)", line[2])]
        bare = [f for f in re.findall(r"--[\w-]+", line[2]) if f not in {f for f, _ in tied}]
        flags = bare + [f for f, var in tied if var in variables]
        return env + ["course.py", line[1]] + list(dict.fromkeys(flags))
    if words[0].endswith("python"):
        words = words[1:]
    if words[0] == "-m":
        program, args = words[1], words[2:]
    else:
        program, args = Path(words[0]).name, words[1:]
    sub = [args[0]] if args and re.fullmatch(r"[a-z][\w-]*", args[0]) else []
    return env + [program] + sub + [a.split("=")[0] for a in args if a.startswith("--")]


def make_problems(command, makefile=None):
    """What is wrong with a make command: the Makefile has no such target, a variable the
    target does not use, or ``make -n`` fails (run only on the real Makefile)."""
    env, words = words_of(command)
    if words[0] != "make":
        return []
    target, variables = make_parts(words)
    body = recipe(target, makefile)
    if body is None:
        return [f"{command}: the Makefile has no target {target}"]
    problems = [f"{command}: {target} does not use {var}" for var in variables
                if f"$({var})" not in body]
    if makefile is None:
        dry = subprocess.run(["make", "-n", target, *[f"{k}={v}" for k, v in variables.items()]],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, **{name: "x" for name in env}})
        if dry.returncode != 0:
            problems.append(f"{command}: make -n exited {dry.returncode}: {dry.stderr[-300:]}")
    return problems


@functools.lru_cache(maxsize=None)
def module_index(path):
    """``{name: (source segment, file)}`` of a test module's top-level functions, classes and
    assignments, and ``{name: module file}`` for what it imports from other test modules."""
    text = path.read_text()
    tree, own, imported = ast.parse(text), {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        own[name.id] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            source = path.parent / f"{node.module}.py"
            if source.is_file():
                imported.update({a.asname or a.name: source for a in node.names})
    return own, imported


def source_of_test(test_id, depth=8):
    """The source of test ``test_id`` (``tests/file.py::name``) with the helpers, constants and
    fixtures it uses, followed through other test modules and conftest.py (``depth`` steps).
    None: no such test function."""
    path, _, name = test_id.partition("::")
    path = ROOT / path
    if not path.is_file() or name not in module_index(path)[0]:
        return None
    conftest = path.parent / "conftest.py"
    seen, todo, texts = set(), [(path, name)], []
    for _ in range(depth):
        later = []
        for file, symbol in todo:
            if (file, symbol) in seen:
                continue
            seen.add((file, symbol))
            own, imported = module_index(file)
            if symbol in own:
                segment = own[symbol]
            elif symbol in imported:
                later.append((imported[symbol], symbol))
                continue
            elif conftest.is_file() and symbol in module_index(conftest)[0]:
                later.append((conftest, symbol))
                continue
            else:
                continue
            texts.append(segment)
            nodes = list(ast.walk(ast.parse(segment)))
            names = {n.id for n in nodes if isinstance(n, ast.Name)}
            names |= {a.arg for n in nodes if isinstance(n, ast.arguments)
                      for a in n.args}                       # fixtures, by parameter name
            later += [(file, n) for n in sorted(names)]
        todo = later
    return "\n".join(texts)


def table_problems(table):
    """Entries of ``table`` whose test does not exist or names not what its command runs."""
    problems = []
    for command, test_id in table.items():
        source = source_of_test(test_id)
        if source is None:
            problems.append(f"{command}: no test {test_id}")
            continue
        missing = [n for n in needles(command) if n not in source]
        if missing:
            problems.append(f"{command}: {test_id} does not name {missing}")
    return problems


def test_every_command_in_the_docs_is_run_by_a_test():
    found = {c: path for path, text in docs().items() for c in commands_in(text)}
    unmapped = {c: path for c, path in found.items() if c not in COMMANDS and c not in UNTESTED}
    assert unmapped == {}, "add each to COMMANDS with the test that runs it"
    assert set(COMMANDS) | set(UNTESTED) <= set(found), "commands no longer in the docs"
    assert table_problems(COMMANDS) == []


def test_every_make_command_in_the_docs_is_one_the_makefile_accepts():
    found = {c for text in docs().values() for c in commands_in(text)}
    assert [p for c in sorted(found) for p in make_problems(c)] == []


def test_command_rules_catch_wrong_inputs():
    text = ("Run\n```bash\nmake frobnicate COURSE=x   # a comment\n\n# only a comment\n```\n"
            "then `scripts/course.py unknown --fast` or `make lab`; not `python -u`, `--unsafe`,\n"
            "`scripts/graded_only.py` nor\n```\n`make inside-a-plain-block`\n```\n")
    assert commands_in(text) == ["make frobnicate COURSE=x", "scripts/course.py unknown --fast",
                                 "make lab"]
    # a command in the docs without a test
    assert [c for c in commands_in(text) if c not in COMMANDS] == [
        "make frobnicate COURSE=x", "scripts/course.py unknown --fast"]
    # what a test must name
    assert needles("make autograde COURSE=course JOBS=4") == [
        "course.py", "autograde", "--course", "--jobs"]
    assert needles("make autograde-slurm PER_TASK=4") == [
        "course.py", "autograde", "--slurm", "--per-task"]
    assert needles("make lab-instructor") == ["lab", "instructor"]
    assert needles("DTFS_LIMITS_LOG=FILE make autograde") == [
        "DTFS_LIMITS_LOG", "course.py", "autograde"]
    assert needles("scripts/course.py autograde --course c --slurm [--per-task K] [--wait]") == [
        "course.py", "autograde", "--course", "--slurm"]
    assert needles("sudo .venv/bin/python -m exercise_utils.cluster cleanup") == [
        "exercise_utils.cluster", "cleanup"]
    # a test that does not run the command, a test that does not exist
    feedback = "tests/test_parallel_grade.py::test_four_jobs_grade_a_class_and_isolate_failures"
    assert table_problems({"make feedback COURSE=course": feedback}) == [
        f"make feedback COURSE=course: {feedback} does not name ['feedback']"]
    assert table_problems({"make autograde": "tests/test_pipeline.py::test_no_such_test"}) == [
        "make autograde: no test tests/test_pipeline.py::test_no_such_test"]
    # helpers are followed: course() in test_pipeline runs scripts/course.py
    assert "course.py" in source_of_test(COMMANDS["make autograde COURSE=course JOBS=4"])
    # a target the Makefile lacks, a variable the target does not use, make -n failing
    makefile = "lab: setup\n\tjupyter lab $(LAB_FLAGS)\n"
    assert make_problems("make frobnicate", makefile) == [
        "make frobnicate: the Makefile has no target frobnicate"]
    assert make_problems("make lab JOBS=4", makefile) == ["make lab JOBS=4: lab does not use JOBS"]
    assert make_problems("make lab", makefile) == []
    assert subprocess.run(["make", "-n", "frobnicate"], cwd=ROOT, capture_output=True
                          ).returncode != 0


# ------------------------------------------------------------------ commands run here
def test_ci_runs_the_readme_test_command():
    """``make test`` is what CI runs (.ci/run), and it is run by no test (it runs them all):
    CI runs exactly the README's test command, whose target runs ``make setup`` first, then
    the suite's two pytest passes and the profile."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test"] and "make test" in commands_in((ROOT / "README.md").read_text())
    assert re.search(r"^test: setup$", (ROOT / "Makefile").read_text(), flags=re.M)
    dry = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert dry.count("-m pytest tests") == 2 and "tests/suite_profile.py" in dry, dry


@pytest.mark.timeout(300)
def test_the_demo_runs(tmp_path):
    """``make demo``'s module in quick mode, with 1 and 2 processes (``make demo``: 1, 2, 4):
    its table and its plot."""
    proc = subprocess.run(
        [sys.executable, "-m", "exercise_utils.mpi_parallel_sgd.demo", "--procs", "1", "2",
         "--out", str(tmp_path / "demo")], cwd=ROOT, capture_output=True, text=True,
        timeout=280, env={**os.environ, "DTFS_QUICK": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "speedup" in proc.stdout and "test accuracy" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "demo" / "scaling.png").stat().st_size > 0
    assert "$(PY) -m exercise_utils.mpi_parallel_sgd.demo" in recipe("demo")


def test_grading_bench_offers_what_the_docs_run():
    """scripts/grading_bench.py grades every notebook several times (hours): its options the
    docs use are checked with ``--help``."""
    found = {c for text in docs().values() for c in commands_in(text)}
    used = {n for c in found if "grading_bench.py" in c for n in needles(c)[1:]}
    assert "--sandbox" in used, used
    usage = subprocess.run([sys.executable, str(ROOT / "scripts" / "grading_bench.py"),
                            "--help"], capture_output=True, text=True, check=True).stdout
    assert all(option in usage for option in used), (used, usage)


def test_cluster_cleanup_runs():
    """``python -m exercise_utils.cluster cleanup`` (students run it with sudo): it removes only
    namespaces whose creating process is dead, and says what it removed."""
    proc = subprocess.run([sys.executable, "-m", "exercise_utils.cluster", "cleanup"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("removed: "), proc.stdout + proc.stderr
