"""A student's own copy of the course: ``student/`` (git-ignored), made by ``make lab``.

Each release notebook (``notebooks/NN_*.ipynb``) is copied into the student folder once and
never overwritten: a ``git pull`` of course fixes changes ``notebooks/`` only, so it never
conflicts with a student's work. When a release notebook changed after the student's copy was
made, this says so and how to take the new one. The folder also gets its own Jupyter settings
(``student/.jupyter``), which turn nbgrader's instructor extensions off in the student's lab
(the Nbgrader menu, formgrader, "Create Assignment"; and the server extensions whose "No
nbgrader_config.py file found" filled the terminal); ``make lab-instructor`` opens
``notebooks/`` with them.

    python scripts/student.py [--folder student] [--release notebooks]

Prints what it did; exit status 0. Used by ``make lab``; tested in ``tests/test_student.py``.
"""
import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ".release.json"          # notebook name -> digest of the release it was copied from
NBGRADER_LAB = ["@jupyter/nbgrader"]
NBGRADER_SERVER = ["nbgrader.server_extensions.formgrader",
                   "nbgrader.server_extensions.validate_assignment",
                   "nbgrader.server_extensions.assignment_list",
                   "nbgrader.server_extensions.course_list"]


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def jupyter_settings(folder):
    """``folder/.jupyter``: the student's Jupyter config dir (``JUPYTER_CONFIG_DIR``), with
    nbgrader's lab and server extensions off. Returns the folder."""
    config = Path(folder) / ".jupyter"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {name: True for name in NBGRADER_LAB}}, indent=1) + "\n")
    (config / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {name: False for name in NBGRADER_SERVER}}},
        indent=1) + "\n")
    return config


def make_copies(folder, release):
    """Copy every release notebook missing from ``folder``; never overwrite one. Returns
    ``(copied, kept, updated)``: names copied now, names already there, and names whose
    release changed since their copy was made."""
    folder, release = Path(folder), Path(release)
    notebooks = sorted(release.glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"student: no notebooks in {release}: run `make release` first")
    folder.mkdir(parents=True, exist_ok=True)
    state_file = folder / STATE
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    copied, kept, updated = [], [], []
    for source in notebooks:
        target = folder / source.name
        if target.exists():
            kept.append(source.name)
            if state.get(source.name) not in (None, digest(source)):
                updated.append(source.name)
            continue
        shutil.copyfile(source, target)
        state[source.name] = digest(source)
        copied.append(source.name)
    state_file.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    return copied, kept, updated


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=str(ROOT / "student"))
    parser.add_argument("--release", default=str(ROOT / "notebooks"))
    args = parser.parse_args(argv)
    copied, kept, updated = make_copies(args.folder, args.release)
    jupyter_settings(args.folder)
    folder = Path(args.folder)
    if copied:
        print(f"student: copied {len(copied)} notebook(s) into {folder}/: {', '.join(copied)}")
    if kept:
        print(f"student: kept your {len(kept)} notebook(s) in {folder}/ (never overwritten)")
    for name in updated:
        print(f"student: the course's {name} changed since your copy was made. Yours is "
              f"kept; the new one is {Path(args.release) / name}. To start over from it, "
              f"rename or delete {folder / name} and run `make lab` again.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
