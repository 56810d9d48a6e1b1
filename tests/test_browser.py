"""A student's first exercise, in a real browser (issue 26, part 8).

What the other tests cannot see: a student meets the checks in JupyterLab, not in nbclient or
nbgrader. This test does what a student does after ``make lab``, with nothing but a browser's
mouse and keyboard (no call to the kernel behind the browser's back):

1. ``make lab`` on a temporary copy: :func:`scripts/student.main` copies the release notebooks
   into a temporary student folder and writes its Jupyter settings; a JupyterLab server is
   started there with ``JUPYTER_CONFIG_DIR=<folder>/.jupyter``, as ``make lab`` starts it
   (plus a free port, a token and ``--no-browser``; ``DTFS_QUICK=1``).
2. Headless chromium, driven by playwright, opens the lab, double-clicks notebook 01 in the
   file browser and runs, each with Shift+Enter: the setup cell, the first exercise (the
   ``%%writefile work/01_shards.py`` cell) as released, i.e. a skeleton that raises
   ``NotImplementedError``, and its CHECK cell.
3. It asserts that the check's first screen (the first :data:`FIRST_SCREEN` lines of the
   output as the page renders it) says "not implemented yet".
4. It "solves" the exercise as a student would: clicks into the cell's editor, selects all
   (Control+A) and types the solution (the same cell of ``solutions/``, without nbgrader's
   solution markers), runs it again, and runs the CHECK again.
5. It asserts that the check's output is now the one line of a passed check
   (:func:`exercise_utils.display.summary`: ``✓ check_shards: all checks passed (...)``), with
   no error box and no stderr.

A second test does issue 39's steps on notebook 10 the same way (its file built over five
``%%part`` cells): the skeleton's tensor-parallel check says what to write first; the benchmark
cell on the unfinished file shows the short box first, without a traceback; part 1 typed in,
its try cell shows both ranks' results; part 2 typed in with one realistic bug (the
row-parallel layer's bias added before the all-reduce: ``tests/wrong/10_flaws.py``'s
``bias_before_all_reduce``), part 3 (the MLP and the attention) still as released: the check
names the bug, not the unfinished part; parts 2 and 3 finished: the check passes in one line.

Screenshots of every stage are kept as test artifacts in ``$DTFS_ARTIFACTS/browser`` (default
``work/artifacts/browser``, git-ignored; ``01-*`` and ``10-*``), also of the stage a failure
stopped at.

The browser comes from where it can: the module's set-up installs playwright from PyPI into
this interpreter's environment (``pip install playwright``) and Debian's ``chromium`` (root and
``apt-get`` only) when they are missing, saying what it installs, and skips the test with the
reason when it cannot have them. Playwright's own browser download is not used: playwright
drives Debian's chromium through ``executable_path``. No server, kernel or browser process
outlives the test: every process the test started is stopped in a ``finally``.

It asserts no timing (generous waits: a loaded machine only slows it), so it runs in the
suite's parallel pass: ``.venv/bin/python -m pytest tests/test_browser.py -s`` runs it alone.
"""
import contextlib
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from exercise_utils.display import FIRST_SCREEN
from exercise_utils.processes import kill_processes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import student  # noqa: E402  (scripts/student.py: what `make lab` runs first)

import flaws  # noqa: E402  (tests/flaws.py: the wrong files, as patches of the solution)
from exercise_utils.notebook_files import parts_of  # noqa: E402

STEM = "01_mpi_parallel_sgd"
NOTEBOOK = f"{STEM}.ipynb"
EXERCISE = "01_shards"                    # nbgrader grade_id of the first exercise cell
CHECK = "check_shards"                    # nbgrader grade_id of its CHECK cell
ARTIFACTS = Path(os.environ.get("DTFS_ARTIFACTS", ROOT / "work" / "artifacts")) / "browser"
TOKEN = "dtfs-browser-test"

# Generous waits (milliseconds, as playwright counts): the machine may be loaded; the first
# import of torch in a fresh kernel has taken 15 s, a check 30 to 60 s.
UI_MS = 60_000                            # the lab's page, the notebook, a cell's editor
SETUP_MS = 180_000                        # kernel start plus the setup cell's imports
CELL_MS = 60_000                          # a %%writefile cell
CHECK_MS = 240_000                        # a CHECK cell


# ----------------------------------------------------------------------------- set-up
def _import_playwright():
    """playwright.sync_api, or None where it is not installed."""
    importlib.invalidate_caches()
    try:
        return importlib.import_module("playwright.sync_api")
    except ImportError:
        return None


def _pip_install_playwright():
    """``pip install playwright`` into this interpreter's environment (the venv's pins of
    ``constraints.txt`` kept). Returns None when it worked, else why not."""
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
           "-c", str(ROOT / "constraints.txt"), "playwright"]
    print(f"\nbrowser test: installing playwright from PyPI: {' '.join(cmd)}", flush=True)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "pip install playwright took over 300 s"
    if out.returncode != 0:
        return f"pip install playwright failed: {(out.stdout + out.stderr).strip()[-500:]}"
    print("browser test: installed playwright", flush=True)
    return None


def _find_chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _apt_install_chromium():
    """``apt-get install chromium`` (after ``apt-get update`` if the first try fails). Returns
    None when it worked, else why not."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root, or no apt-get here (install it with: sudo apt-get install chromium)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "chromium"]
    print(f"\nbrowser test: installing Debian's chromium: {' '.join(install)}", flush=True)
    out = None
    for before in ([], [["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=300"]]):
        try:
            for cmd in before:
                subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            out = subprocess.run(install, capture_output=True, text=True, timeout=420, env=env)
        except subprocess.TimeoutExpired as err:
            return f"{' '.join(err.cmd)} took over {err.timeout} s"
        if out.returncode == 0:
            print(f"browser test: installed chromium ({_find_chromium()})", flush=True)
            return None
    return f"apt-get install chromium failed: {(out.stdout + out.stderr).strip()[-500:]}"


@pytest.fixture(scope="module")
def browser_kit():
    """``(playwright.sync_api, path of chromium)``, installing what is missing; skips the test,
    saying why, where playwright or chromium cannot be had."""
    api, no_api = _obtain(_import_playwright, _pip_install_playwright, "playwright",
                          "installed, but it does not import")
    chromium, no_chromium = _obtain(_find_chromium, _apt_install_chromium, "Debian's chromium",
                                    "installed, but not found on PATH")
    missing = [why for why in (no_api, no_chromium) if why]
    if missing:
        pytest.skip("the browser test needs " + " and ".join(missing))
    return api, chromium


def _obtain(find, install, name, odd):
    """``(find(), None)``, installing first if it finds nothing; ``(None, why)`` if it still
    does not (``odd``: the reason when the install said it worked)."""
    found = find()
    if found is None:
        why = install()
        found = find()
        if found is None:
            return None, f"{name} ({why or odd})"
    return found, None


# ----------------------------------------------------------------------------- the lab
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_lab(folder, log):
    """``make lab``'s server on ``folder`` (its ``.jupyter`` settings), on a free port with a
    token, its output into ``log``. Returns ``(process, base URL)``."""
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / ".jupyter"), "DTFS_QUICK": "1"}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
           f"--IdentityProvider.token={TOKEN}", "--ServerApp.ip=127.0.0.1",
           *(["--allow-root"] if os.geteuid() == 0 else []), str(folder)]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    return proc, f"http://127.0.0.1:{port}"


def _wait_for_lab(proc, base, seconds=120):
    """Wait until the server answers its API (or fail, when it died or took too long)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, f"the lab server exited with status {proc.returncode}"
        try:
            req = urllib.request.Request(f"{base}/api/status",
                                         headers={"Authorization": f"token {TOKEN}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"the lab server did not answer in {seconds} s"
        time.sleep(0.5)


def _stop(procs):
    """Stop every given process that is still alive (SIGTERM, then SIGKILL)."""
    kill_processes([p for p in procs if p.pid != os.getpid()], grace=5.0)


# ----------------------------------------------------------------------------- the notebook
def _cell_source(notebook, grade_id):
    cells = json.loads(Path(notebook).read_text())["cells"]
    [source] = ["".join(c["source"]) for c in cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]
    return source


def _solved_source(notebook, grade_id):
    """An exercise as a student would type it: the solution's cell without nbgrader's
    ``### BEGIN/END SOLUTION`` lines."""
    source = _cell_source(ROOT / "solutions" / notebook, grade_id)
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")) + "\n"


class Lab:
    """The notebook's page, as a student uses it."""

    def __init__(self, page, expect):
        self.page, self.expect = page, expect
        self.count = 0                    # the kernel's execution count so far
        self.shots = []

    def code_cell(self, text):
        """The notebook's first code cell with a line of source that contains ``text``."""
        cells = self.page.locator(".jp-NotebookPanel:visible .jp-Cell")
        line = self.page.locator(".jp-InputArea-editor .cm-line", has_text=text)
        cell = cells.filter(has=line).first
        self.expect(cell).to_be_visible(timeout=UI_MS)
        # by its place, not its text: the editor draws only the lines in view, so a long
        # cell scrolled past its first line would no longer be found by it
        index = cell.evaluate("c => Array.from(c.closest('.jp-Notebook')"
                              ".querySelectorAll('.jp-Cell')).indexOf(c)")
        return cells.nth(index)

    def run(self, cell, timeout_ms):
        """Click into the cell's editor, press Shift+Enter and wait until the cell's prompt
        shows its execution count (``[n]:``, not ``[*]:``)."""
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Shift+Enter")
        self.count += 1
        prompt = cell.locator(".jp-InputArea-prompt")
        self.expect(prompt).to_have_text(f"[{self.count}]:", timeout=timeout_ms)

    def type_into(self, cell, source):
        """Select all of the cell's source in its editor and type ``source`` in its place."""
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Control+A")
        self.page.keyboard.insert_text(source)

    def output_text(self, cell):
        """The cell's output as the page shows it (empty lines left out)."""
        text = cell.locator(".jp-OutputArea").inner_text()
        return [line for line in text.splitlines() if line.strip()]

    def shot(self, name, cell=None):
        """A full-page screenshot (and one of ``cell``, if given), kept as a test artifact."""
        # JupyterLab 4 asks, in a toast, whether to fetch Jupyter news; it may hide the check's
        # output in a screenshot: close it as a student would (its x, not "No", which would
        # write a setting).
        for close in self.page.get_by_title("Hide notification").all():
            if close.is_visible():
                close.click()
                close.wait_for(state="hidden", timeout=10_000)
        if cell is not None:
            cell.scroll_into_view_if_needed()
        paths = [ARTIFACTS / f"{name}.png"]
        self.page.screenshot(path=str(paths[0]), full_page=True)
        if cell is not None:
            paths.append(ARTIFACTS / f"{name}-cell.png")
            cell.screenshot(path=str(paths[1]))
        self.shots += paths
        for path in paths:
            print(f"browser test: screenshot {path}", flush=True)


@contextlib.contextmanager
def student_lab(api, chromium, tmp_path, notebook):
    """``make lab`` on a temporary copy, a headless browser on it and ``notebook`` opened from
    the file browser: yields ``(Lab, the student's folder)``. Screenshots the page where the
    block fails; stops every process it started (the server, its kernel and what that
    started, playwright's driver, chromium) and asserts that none is left."""
    folder = tmp_path / "student"
    folder.parent.mkdir(parents=True, exist_ok=True)
    assert student.main(["--folder", str(folder), "--release", str(ROOT / "notebooks")]) == 0
    assert (folder / notebook).exists() and (folder / ".jupyter" / "labconfig").is_dir()
    log_path = tmp_path / "lab.log"
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    server = None
    lab = None
    try:
        with open(log_path, "wb") as log:
            server, base = _start_lab(folder, log)
        _wait_for_lab(server, base)
        print(f"\nbrowser test: JupyterLab on {folder} at {base} (log: {log_path})", flush=True)

        with api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(UI_MS)
                lab = Lab(page, api.expect)
                page.goto(f"{base}/lab?token={TOKEN}")
                page.locator(".jp-DirListing-item", has_text=notebook).dblclick()
                # a Shift+Enter pressed before the kernel is up runs nothing: wait for it,
                # as a student waits for the status bar's "Idle"
                api.expect(page.locator(".jp-StatusBar-Widget", has_text="| Idle").first
                           ).to_be_visible(timeout=SETUP_MS)
                yield lab, folder
            except BaseException:
                if lab is not None:
                    try:
                        lab.shot("failed-here")
                    except Exception as err:              # the page itself may be gone
                        print(f"browser test: no screenshot of the failure: {err}")
                raise
            finally:
                browser.close()
    except BaseException:
        print(f"browser test: the lab's log ends:\n{log_path.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        started = [p for p in me.children(recursive=True) if p.pid not in before]
        if server is not None:
            try:
                started += psutil.Process(server.pid).children(recursive=True)
            except psutil.Error:
                pass
        _stop(started)
        if server is not None:
            server.wait(timeout=30)
        left = [p for p in me.children(recursive=True) if p.pid not in before]
        assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


def _fresh_artifacts(prefix):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob(f"{prefix}*.png"):        # this run's screenshots only
        old.unlink()


@pytest.mark.timeout(900)
def test_first_exercises_in_the_browser(browser_kit, tmp_path):
    """Notebook 01's first exercise, then notebook 10's parts (one test: one worker installs
    the browser where it is missing, and the two labs run one after the other)."""
    api, chromium = browser_kit
    first_exercise_of_01(api, chromium, tmp_path / "01")
    notebook_10_piece_by_piece(api, chromium, tmp_path / "10")


def first_exercise_of_01(api, chromium, tmp_path):
    """Notebook 01's first exercise: the skeleton's check fails with "not implemented yet";
    the solution typed in, it passes in one line."""
    _fresh_artifacts("01-")
    with student_lab(api, chromium, tmp_path, NOTEBOOK) as (lab, folder):
        # 1-2. `make lab` on a temporary copy, notebook 01 opened from its file browser
        setup = lab.code_cell("# Setup (run first)")
        lab.shot("01-1-notebook-opened")

        # The setup cell: the kernel starts, imports the course's package.
        lab.run(setup, SETUP_MS)
        assert "quick mode" in " ".join(lab.output_text(setup)), lab.output_text(setup)
        lab.shot("01-2-setup-ran", setup)

        # 3. The first exercise as released (a skeleton), then its CHECK.
        exercise = lab.code_cell(f"%%writefile work/{EXERCISE}.py")
        check = lab.code_cell(f"# CHECK {CHECK.removeprefix('check_')}")
        assert "raise NotImplementedError" in _cell_source(folder / NOTEBOOK, EXERCISE)
        lab.run(exercise, CELL_MS)
        assert (folder / "work" / f"{EXERCISE}.py").exists()
        lab.run(check, CHECK_MS)
        first_screen = lab.output_text(check)[:FIRST_SCREEN]
        lab.shot("01-3-skeleton-check-failed", check)
        print("browser test: the failed check's first screen:\n  " +
              "\n  ".join(first_screen), flush=True)
        assert first_screen and first_screen[0].startswith(f"✗ {CHECK} failed"), first_screen
        assert "not implemented yet" in "\n".join(first_screen), first_screen

        # 4. Solve it: type the solution into the exercise cell, run it again.
        solved = _solved_source(NOTEBOOK, EXERCISE)
        lab.type_into(exercise, solved)
        lab.run(exercise, CELL_MS)
        written = (folder / "work" / f"{EXERCISE}.py").read_text()
        assert written.strip() == solved.split("\n", 1)[1].strip(), \
            "the file the cell wrote is not what was typed into its editor"
        lab.shot("01-4-solved-exercise-written", exercise)

        # 5. Its CHECK again: one line, the pass.
        lab.run(check, CHECK_MS)
        lab.shot("01-5-check-passed", check)
        _assert_passed(lab, check, CHECK)


def _assert_passed(lab, check, name):
    """The check's output is the one line of a pass, no error box, no stderr."""
    passed = lab.output_text(check)
    print(f"browser test: the passed check: {passed}", flush=True)
    assert len(passed) == 1, passed
    assert re.fullmatch(rf"✓ {name}: all checks passed \(.+, \d+\.\d s\)", passed[0]), passed
    errors = check.locator(
        '[data-mime-type="application/vnd.jupyter.stderr"], .jp-RenderedHTMLCommon')
    assert errors.count() == 0, "an error box or stderr beside the pass"


NB10 = "10_bonus_model_parallel.ipynb"
FILE10 = "10_model_parallel"              # its file, built by five %%part cells
BENCH_MS = 240_000                        # the benchmark cell on an unfinished file


def _type_part(lab, cell, k, text):
    """Type part ``k`` of the file into its cell (as a student would: select all, type)."""
    lab.type_into(cell, f"%%part work/{FILE10}.py {k}/5\n{text}")
    lab.run(cell, CELL_MS)


def notebook_10_piece_by_piece(api, chromium, tmp_path):
    """Issue 39's steps on notebook 10, whose file is built over five ``%%part`` cells: the
    skeleton's check says what to write first; the benchmark on the unfinished file shows the
    short box first, no traceback; part 1 (f and g) written: its try cell prints both ranks'
    results; part 2 written with one realistic bug (the row-parallel bias added before the
    all-reduce), part 3 (the MLP and attention) still as released: the check names the bug,
    not the unfinished part; parts 2 and 3 finished: the check passes in one line."""
    _fresh_artifacts("10-")
    flaw = next(f for f in flaws.load("10") if f.name == "bias_before_all_reduce")
    solved = parts_of(flaws.solution_file("10", f"{FILE10}.py"))
    buggy = parts_of(flaws.apply(flaws.solution_file("10", f"{FILE10}.py"), flaw.patch))
    assert sorted(solved) == [1, 2, 3, 4, 5] and buggy[2] != solved[2]
    with student_lab(api, chromium, tmp_path, NB10) as (lab, folder):
        setup = lab.code_cell("# Setup (run first)")
        lab.run(setup, SETUP_MS)
        check = lab.code_cell("# CHECK tensor_parallel")
        bench = lab.code_cell("bench_rows = bench.run()")

        # the skeleton: its five parts run, the check says what to write first (each cell
        # found as it comes into view: the editor draws only the lines in view)
        part = {}
        for k in range(1, 6):
            part[k] = lab.code_cell(f"%%part work/{FILE10}.py {k}/5")
            lab.run(part[k], CELL_MS)
            if k == 1:
                tried = lab.code_cell('tries.run("f_and_g")')
        assert parts_of((folder / "work" / f"{FILE10}.py").read_text()).keys() == set(range(1, 6))
        lab.run(check, CHECK_MS)
        screen = lab.output_text(check)[:FIRST_SCREEN]
        lab.shot("10-1-skeleton-check", check)
        assert screen[0].startswith("✗ check_tensor_parallel failed"), screen
        assert "not implemented yet: CopyToParallel.forward" in " ".join(screen), screen

        # the benchmark on the unfinished file: the box first, no traceback on the screen
        lab.run(bench, BENCH_MS)
        screen = lab.output_text(bench)[:FIRST_SCREEN]
        lab.shot("10-2-benchmark-unfinished", bench)
        print("browser test: the benchmark's first screen:\n  " + "\n  ".join(screen))
        assert screen[0].startswith("✗ not implemented yet: "), screen
        assert not any("Traceback" in line or 'File "' in line for line in screen), screen

        # part 1 written: its try cell shows what f and g did on each rank
        _type_part(lab, part[1], 1, solved[1])
        lab.run(tried, CHECK_MS)
        shown = lab.output_text(tried)
        lab.shot("10-3-part-1-tried", tried)
        assert sum(line.startswith(("rank 0: f(x) =", "rank 1: f(x) =")) for line in shown) == 2, \
            shown

        # part 2 with the bias bug, part 3 as released: the check names the bug
        _type_part(lab, part[2], 2, buggy[2])
        lab.run(check, CHECK_MS)
        screen = lab.output_text(check)[:FIRST_SCREEN]
        lab.shot("10-4-part-2-with-a-bug", check)
        print("browser test: the buggy part's first screen:\n  " + "\n  ".join(screen))
        assert screen[0].startswith("✗ check_tensor_parallel failed"), screen
        assert flaw.expect in " ".join(" ".join(screen).split()), screen
        assert "not implemented yet" not in " ".join(screen), screen

        # parts 2 and 3 finished: one line
        _type_part(lab, part[2], 2, solved[2])
        _type_part(lab, part[3], 3, solved[3])
        lab.run(check, CHECK_MS)
        lab.shot("10-5-finished", check)
        _assert_passed(lab, check, "check_tensor_parallel")
