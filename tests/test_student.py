"""A copy of their own (issue 26, part 6): ``make lab`` copies the release notebooks into the
git-ignored ``student/`` once and never overwrites them (a course update says so instead),
and opens JupyterLab there without nbgrader's instructor extensions, which a real server
started with the student's settings proves (the page's config, the formgrader's URL); the
instructor's lab keeps them.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exercise_utils.processes import kill_processes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import student  # noqa: E402


def test_copies_are_made_once_and_never_overwritten(tmp_path, capsys):
    release, folder = tmp_path / "notebooks", tmp_path / "student"
    release.mkdir()
    (release / "01_a.ipynb").write_text("release 1")
    (release / "02_b.ipynb").write_text("release 2")
    assert student.main(["--folder", str(folder), "--release", str(release)]) == 0
    assert "copied 2 notebook(s)" in capsys.readouterr().out
    (folder / "01_a.ipynb").write_text("my work")
    (release / "01_a.ipynb").write_text("release 1, fixed")
    (release / "03_c.ipynb").write_text("release 3")
    student.main(["--folder", str(folder), "--release", str(release)])
    out = capsys.readouterr().out
    assert (folder / "01_a.ipynb").read_text() == "my work"           # never overwritten
    assert (folder / "03_c.ipynb").read_text() == "release 3"          # a new notebook: copied
    assert "copied 1 notebook(s)" in out and "03_c.ipynb" in out
    assert re.search(r"the course's 01_a.ipynb changed since your copy was made\. Yours is "
                     r"kept", out), out
    assert "02_b.ipynb changed" not in out
    (folder / "01_a.ipynb").unlink()                                    # start over from it
    student.main(["--folder", str(folder), "--release", str(release)])
    assert (folder / "01_a.ipynb").read_text() == "release 1, fixed"
    assert "changed since" not in capsys.readouterr().out


def test_no_release_says_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="make release"):
        student.make_copies(tmp_path / "s", tmp_path / "empty")


def test_student_folder_is_ignored_by_git():
    out = subprocess.run(["git", "check-ignore", "student/01_mpi_parallel_sgd.ipynb"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_server(folder, config_dir=None):
    port, token = free_port(), "dtfs-test"
    env = {**os.environ, **({"JUPYTER_CONFIG_DIR": str(config_dir)} if config_dir else {})}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
           f"--IdentityProvider.token={token}", "--ServerApp.ip=127.0.0.1",
           *(["--allow-root"] if os.geteuid() == 0 else []), str(folder)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return proc, f"http://127.0.0.1:{port}", token


def get(url, token, deadline):
    while True:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, ""
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def page_config(html):
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                      html, flags=re.S)
    return json.loads(found[1])


@pytest.mark.timeout(240)
def test_the_students_lab_has_no_nbgrader_and_the_instructors_has(tmp_path):
    folder = tmp_path / "student"
    (folder).mkdir()
    config = student.jupyter_settings(folder)
    for config_dir, instructor in ((config, False), (None, True)):
        proc, base, token = lab_server(folder, config_dir)
        try:
            deadline = time.monotonic() + 120
            status, html = get(f"{base}/lab", token, deadline)
            assert status == 200, html[-1000:]
            disabled = page_config(html).get("disabledExtensions", [])
            formgrader, _ = get(f"{base}/formgrader", token, deadline)
            if instructor:
                assert "@jupyter/nbgrader" not in disabled and formgrader != 404
            else:
                assert "@jupyter/nbgrader" in disabled and formgrader == 404, (disabled,
                                                                               formgrader)
        finally:
            import psutil
            kill_processes([psutil.Process(proc.pid)])
            out = proc.communicate()[0]
        if not instructor:
            assert "nbgrader_config.py" not in out, out[-2000:]
