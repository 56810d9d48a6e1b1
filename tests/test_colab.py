"""The Colab set-up cell of docs/students.md, in a stand-in for Colab (issue 26, part 7).

The stand-in is what Colab gives a student: a fresh Python environment that already has torch,
torchvision, numpy, matplotlib, ipykernel and ipywidgets (linked from the course's own environment, so no
5 GB download) and nothing of the course (no ``exercise_utils``, mpi4py, mpich, JupyterLab or
nbgrader). A kernel of that environment, started in a folder outside the repository, runs

1. the guide's cell twice: the first run clones the course (from this repository's committed
   HEAD) and installs what is missing, the second installs nothing; both print the same
   "ready" line, torch stays the environment's own, and nothing of the instructor's extra
   (JupyterLab, nbgrader) is installed;
2. then, in a new kernel (Colab's "Restart session"), the cell again and notebook 01's graded
   cells (setup, exercises, its first two CHECKs) from the solution: both pass.

Not Colab itself: its container, GPU runtimes and network namespaces are untested here.
"""
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grading import graded_only

ROOT = Path(__file__).resolve().parents[1]
COLAB_HAS = ["torch", "torchvision", "numpy", "matplotlib", "ipykernel", "ipywidgets", "psutil",
             "tqdm", "PyYAML"]


def colab_cell():
    """The code of the Colab cell of docs/students.md (between its ``colab-cell`` markers)."""
    text = (ROOT / "docs" / "students.md").read_text()
    found = re.search(r"<!-- colab-cell[^>]*-->\n```python\n(.*?)```\n<!-- /colab-cell -->",
                      text, flags=re.S)
    assert found, "docs/students.md has no Colab cell between <!-- colab-cell --> markers"
    return found[1]


def closure(names):
    """The installed distributions ``names`` need, themselves included (markers evaluated,
    extras followed: torch needs ``cuda-toolkit[cudart, ...]``, whose extras name the
    ``nvidia-*`` libraries; a missed one is a distribution pip installs into the stand-in)."""
    from packaging.requirements import Requirement
    seen, todo, done = {}, [(name, ()) for name in names], set()
    while todo:
        name, extras = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue                                  # an optional dependency not installed
        key = dist.metadata["Name"].lower().replace("_", "-")
        seen[key] = dist
        if (key, tuple(sorted(extras))) in done:
            continue
        done.add((key, tuple(sorted(extras))))
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in ("", *extras)):
                todo.append((req.name, tuple(req.extras)))
    return list(seen.values())


def stand_in(folder):
    """A fresh venv at ``folder`` whose site-packages links what Colab has, file by file: a
    folder linked whole (``nvidia/``, shared by a dozen distributions) would let pip in the
    stand-in write into the course's own environment. A CI run lost two notebooks' torchrun
    launches to SIGBUS (exit 135) when it did: pip rewrote ``nvidia/cu13/lib/*.so`` while
    other tests' processes were loading them. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                               "print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    for dist in closure(COLAB_HAS):
        base = Path(dist.locate_file(""))
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue                              # scripts: not needed; caches: made here
            target = site / file
            if not target.exists() and not target.is_symlink():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(base / file)
    return python


def installed_here(site):
    """The distributions installed in the stand-in itself (a real ``*.dist-info`` folder, not
    one linked from the course's environment)."""
    return sorted(d.name.split("-")[0].lower() for d in Path(site).glob("*.dist-info")
                  if not any(f.is_symlink() for f in d.iterdir()))


def kernel_spec(folder, python, env):
    """A Jupyter kernel ``colab`` that runs ``python`` with ``env``; returns JUPYTER_PATH."""
    spec = folder / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "colab stand-in", "language": "python", "env": env}))
    return str(folder)


def run(cells, cwd, timeout):
    """Execute ``cells`` (source texts, or notebook cells) in a new ``colab`` kernel at
    ``cwd``; return the executed notebook."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c if isinstance(c, str) else "".join(c["source"]))
                for c in cells]
    NotebookClient(nb, timeout=timeout, kernel_name="colab",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def text(cell):
    return "".join(out.get("text", "") for out in cell.outputs)


@pytest.mark.notebook
@pytest.mark.timeout(1200)
def test_the_colab_cell_sets_up_a_fresh_colab_like_kernel(tmp_path, monkeypatch):
    python = stand_in(tmp_path / "env")
    before = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"],
                            capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    for absent in ("exercise_utils", "mpi4py", "nbgrader", "jupyterlab"):
        found = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True,
                               cwd=tmp_path)
        assert found.returncode != 0, f"the stand-in already has {absent}"
    content, home = tmp_path / "content", tmp_path / "content" / "dtfs"
    content.mkdir()
    env = {"DTFS_HOME": str(home), "DTFS_URL": ROOT.as_uri(), "DTFS_QUICK": "1",
           "PATH": f"{python.parent}:{os.environ['PATH']}"}
    monkeypatch.setenv("JUPYTER_PATH", kernel_spec(tmp_path / "jupyter", python, env))
    probe = ("import os, sys, exercise_utils, torch\n"
             "print('where', os.getcwd(), exercise_utils.__file__, torch.__file__)")

    nb = run([colab_cell(), colab_cell(), probe], content, timeout=600)
    first, second, where = map(text, nb.cells)
    assert "installing the course and mpi4py, mpich" in first, first
    assert "installing" not in second, second            # the second run installs nothing
    for out in (first, second):
        assert re.search(r"course set-up: ready \(torch .*mpiexec.*\); working in "
                         + re.escape(str(home / "student")), out), out
    cwd, package, torch_file = where.split()[1:4]
    assert cwd == str(home / "student") and package.startswith(str(home)), where
    assert torch_file + "\n" == before, "the set-up replaced the environment's torch"
    assert "note:" not in first         # the stand-in's torch is the tested one: no warning
    site = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    assert installed_here(site) == ["exercise_utils", "mpi4py", "mpich", "pip", "setuptools"], (
        installed_here(site))           # only what Colab lacks (and the venv's own pip)
    for extra in ("nbgrader", "jupyterlab", "nbclient"):
        found = subprocess.run([str(python), "-c", f"import {extra}"], capture_output=True,
                               cwd=tmp_path)
        assert found.returncode != 0, f"the set-up installed {extra} (the instructor's extra)"

    # Colab's "Restart session": a new kernel, the cell again, notebook 01's graded cells
    # (its first two checks: MPI ranks from the mpi4py and mpich the cell installed, the
    # course's package; the other three add launches of the same kind, not of the set-up)
    solution = json.loads(graded_only((ROOT / "solutions" / "01_mpi_parallel_sgd.ipynb")
                                      .read_text(), keep_checks=["shards", "broadcast"]))
    cells = [c for c in solution["cells"] if c["cell_type"] == "code"]
    nb = run([colab_cell(), *cells], content, timeout=900)
    assert "installing" not in text(nb.cells[0]) and "ready" in text(nb.cells[0])
    checks = [c for c in nb.cells if c.source.startswith("# CHECK ")]
    assert len(checks) == 2, [c.source[:30] for c in checks]
    for cell in checks:
        out = text(cell)
        assert "passed" in out and "Error" not in out, (cell.source[:40], out[-2000:])
