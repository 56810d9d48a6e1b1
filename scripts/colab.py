"""The course on Colab (or any Jupyter kernel without it): what the Colab cell of docs/students.md runs.

The cell clones the course once per runtime and calls :func:`setup`, which

* installs what the kernel's environment lacks, and only that: the course package (editable)
  and its missing dependencies (on Colab: ``mpi4py`` and the ``mpich`` wheel, whose
  ``mpiexec`` the MPI notebooks launch). Packages already there are kept, Colab's torch
  included: ``pip`` gets the course's pins (``constraints.txt``) only for what it installs.
  JupyterLab and nbgrader are the instructor's extra and are never installed here;
* makes the package importable in the running kernel at once (no restart needed);
* makes ``<course>/student`` the working directory, every time: Colab's "Restart session"
  resets it, and the notebooks write ``work/`` and ``results/`` there.

Running it again, or after "Restart session", installs nothing and prints the same one-line
summary. Tested by ``tests/test_colab.py`` (a stand-in: a fresh environment that has torch
and ipykernel, as Colab does, and nothing of the course).
"""
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

NEEDS = ["mpi4py", "mpich"]      # what a student's kernel needs beyond the usual scientific stack


def installed(name):
    """Whether the distribution ``name`` is installed in this kernel's environment."""
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def course_installed(home):
    """Whether ``exercise_utils`` is installed from ``home`` (editable): an installed
    distribution says so in its ``direct_url.json`` (the build's egg-info folder
    in ``home``, found once ``home`` is on ``sys.path``, is not an installation)."""
    where = Path(home).resolve().as_uri()
    return any(where in (dist.read_text("direct_url.json") or "")
               for dist in importlib.metadata.distributions(name="exercise_utils"))


def pins_for_missing(home):
    """The lines of ``home/constraints.txt`` for packages not installed here (pip gets only
    these: what is installed already, torch first, stays as it is)."""
    lines = []
    for line in (Path(home) / "constraints.txt").read_text().splitlines():
        found = re.match(r"([A-Za-z0-9_.\-]+)==", line.strip())
        if found and not installed(found[1]):
            lines.append(line.strip())
    return lines


def install(home):
    """``pip install -e home`` into this kernel's environment with the course's pins for
    what is missing. Raises RuntimeError with pip's last lines if it fails."""
    pins = pins_for_missing(home)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(pins) + "\n")
    try:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
               "-c", handle.name, "-e", str(home)]
        done = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        os.unlink(handle.name)
    if done.returncode:
        raise RuntimeError(f"installing the course failed ({' '.join(cmd)}):\n"
                           + "\n".join((done.stdout + done.stderr).splitlines()[-30:]))


def setup(home, work=None):
    """Make the course at ``home`` usable in this kernel (see the module docstring); work in
    ``work`` (default ``home/student``). Returns the working directory."""
    home = Path(home).resolve()
    importlib.invalidate_caches()           # what an earlier run of the cell installed
    missing = [name for name in NEEDS if not installed(name)]
    if missing or not course_installed(home):
        print(f"course set-up: installing the course{' and ' if missing else ''}"
              f"{', '.join(missing)} (once per runtime, about a minute) ...", flush=True)
        install(home)
    if str(home) not in sys.path:           # the editable install's hook loads at the next start
        sys.path.insert(0, str(home))
    importlib.invalidate_caches()
    import torch
    import mpi4py
    from exercise_utils import launch
    work = Path(work or home / "student")
    (work / "work").mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    print(f"course set-up: ready (torch {torch.__version__}, mpi4py {mpi4py.__version__}, "
          f"{launch.find_executable('mpiexec')}); working in {work}", flush=True)
    tested = tested_torch(home)
    if tested and torch.__version__.split("+")[0] != tested:
        print(f"course set-up: note: this kernel's torch is {torch.__version__}; the course is "
              f"tested with torch {tested} (constraints.txt)", flush=True)
    return work


def tested_torch(home):
    """The torch version the course's constraints pin, or None."""
    found = re.search(r"^torch==([\w.]+)$", (Path(home) / "constraints.txt").read_text(),
                      flags=re.M)
    return found[1] if found else None
