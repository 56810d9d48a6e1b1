"""nbgrader's autograde, running only what is graded: ``GradedOnlyExecute``.

It replaces nbgrader's ``Execute`` in ``c.Autograde.autograde_preprocessors`` (the
``nbgrader_config.py`` that ``scripts/course.py`` writes), so the gradebook, ``nbgrader
export``, feedback and formgrader work as before. What the kernel runs, in this order:

1. the locked setup cells (first line ``# Setup``; their text is the gradebook's, as
   nbgrader's ``OverwriteCells`` restores every locked cell);
2. nothing for the ``%%writefile`` exercise cells: the grader itself writes the cell's body
   to the file the *source* notebook names (a student who replaced the magic line by Python
   gets that Python written to the file, never run); a ``%%part`` cell's body becomes the
   part the *source* names of the file the grader builds from the submission's parts (as
   :func:`exercise_utils.notebook_files.part_magic` builds it in a student's kernel); a
   solution cell that is kernel code
   (first line ``# solution: <id>``; the course's notebooks have none) runs as code;
3. the CHECK cells, with the gradebook's text.

Every other code cell (demos, experiments, benchmarks, cells a student added, cells whose
nbgrader metadata was removed) is not run; its output says so, and the feedback shows it.
A setup or CHECK cell missing from the submission is put back from the gradebook (CHECK
cells by nbgrader's ``OverwriteCells.add_missing_cells``, setup cells here). Because the
phases run in this order, a CHECK cell moved above its exercise still sees the file.

``c.GradedOnlyExecute.graded_only = False`` runs the whole notebook as nbgrader does.
Used by scripts/course.py (autograde).
"""
import copy
import re
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from nbclient import NotebookClient
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook
from nbgrader.preprocessors import Execute
from traitlets import Bool

MAGIC_RE = re.compile(r"^%%writefile(?:\s+(?:-a|--append))?\s+(?P<path>\S+)\s*$")


def _load_notebook_files():
    """exercise_utils/notebook_files.py, loaded by its path: the package's ``__init__`` (which
    sets up a grading kernel's temporary folder) must not run in the grader's process."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_dtfs_notebook_files",
        Path(__file__).resolve().parents[1] / "exercise_utils" / "notebook_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FILES = _load_notebook_files()
PART_RE, with_part = _FILES.PART_RE, _FILES.with_part
from nbmeta import SETUP_RE  # scripts/ is on sys.path (nbgrader_config.py puts it there)
NOT_RUN = ("[not run during grading: only the setup, exercise (%%writefile) and CHECK cells "
           "run when a notebook is graded]\n")
WRITTEN = ("Writing {path}\n[graded: the grader wrote this cell's body to {path}; "
           "the cell itself was not run]\n")
RESTORED = "[restored from the course's source: this cell was missing from the submission]\n"


def _stream(text):
    return NotebookNode(output_type="stream", name="stdout", text=text)


def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def source_plan(gradebook, notebook_id, assignment_id):
    """The graded cells of a notebook as the gradebook holds them.

    Returns:
        dict: ``grade_id -> (kind, path, source cell)`` in source order, kind one of
        ``"setup"``, ``"write"`` (path: the one in the source's ``%%writefile`` line),
        ``"code"`` (a kernel-code solution) or ``"check"``; path None but for "write".
    """
    notebook = gradebook.find_notebook(notebook_id, assignment_id)
    grades = {cell.name for cell in notebook.grade_cells}
    solutions = {cell.name for cell in notebook.solution_cells}
    plan = {}
    for row in notebook.source_cells:   # plain copies: they outlive the gradebook session
        cell = SimpleNamespace(name=row.name, source=row.source or "", checksum=row.checksum,
                               locked=row.locked, cell_type=row.cell_type)
        first = cell.source.split("\n", 1)[0]
        if cell.cell_type != "code":
            continue
        if cell.name in grades:
            plan[cell.name] = ("check", None, cell)
        elif cell.name in solutions:
            magic = MAGIC_RE.match(first) or PART_RE.match(first)
            plan[cell.name] = ("write", magic["path"], cell) if magic else ("code", None, cell)
        elif cell.locked and SETUP_RE.match(first):
            plan[cell.name] = ("setup", None, cell)
    return plan


def body_of(source):
    """What ``%%writefile`` would write for a cell: the text after a ``%%writefile`` first line,
    or the whole cell when its first line is anything else (it is written, never run)."""
    first, _, rest = source.partition("\n")
    return rest if first.startswith(("%%writefile", "%%part")) else source


def safe_path(folder, path):
    """``folder / path`` for a relative path that stays inside ``folder``."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"%%writefile path {path!r} must be relative and stay inside the notebook's folder")
    return Path(folder) / rel


class GradedOnlyExecute(Execute):
    """nbgrader's ``Execute``, running only the graded cells (see the module docstring)."""

    graded_only = Bool(True, help="Run only setup, exercise and CHECK cells (False: the whole "
                                  "notebook, as nbgrader's Execute).").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        if not self.graded_only:
            return super().preprocess(nb, resources, km)
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            plan = source_plan(gb, info["notebook"], info["assignment"])
            self._restore_setup(nb, plan)
        folder = (resources.get("metadata") or {}).get("path") or "."
        phases = {"setup": [], "write": [], "check": []}
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            kind = plan.get(_grade_id(cell), (None,))[0]
            if kind is None:
                cell.outputs, cell.execution_count = [_stream(NOT_RUN)], None
                continue
            phases["write" if kind in ("write", "code") else kind].append((index, cell))
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        with self.setup_kernel():
            reply = self.wait_for_reply(self.kc.kernel_info())
            self.nb.metadata["language_info"] = reply["content"]["language_info"]
            for index, cell in phases["setup"]:
                self.execute_cell(cell, index, store_history=True)
            built = {}                   # path -> text of the parts written so far (%%part)
            for index, cell in phases["write"]:
                kind, path, source = plan[_grade_id(cell)]
                if kind == "code":
                    self.execute_cell(cell, index, store_history=True)
                else:
                    self._write(cell, folder, path, PART_RE.match(source.source.split("\n")[0]),
                                built)
            for index, cell in phases["check"]:
                self.execute_cell(cell, index, store_history=True)
        self.set_widgets_metadata()
        return self.nb, self.resources

    def _write(self, cell, folder, path, part=None, built=None):
        """Write the cell's body to ``path``; a part (the *source*'s ``%%part`` line) into
        the file the grader builds from this submission's parts alone (``built``), never
        from what the folder held before."""
        target = safe_path(folder, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = body_of(cell.source)
        if part is not None:
            text = built[path] = with_part(built.get(path, ""), path, int(part["k"]),
                                           int(part["n"]), text)
        target.write_text(text, encoding="utf-8")
        cell.outputs, cell.execution_count = [_stream(WRITTEN.format(path=path))], None

    def _restore_setup(self, nb, plan):
        """Put back setup cells the submission lacks, at the top, in source order."""
        present = {_grade_id(cell) for cell in nb.cells}
        missing = [(gid, cell) for gid, (kind, _, cell) in plan.items()
                   if kind == "setup" and gid not in present]
        for offset, (gid, source) in enumerate(missing):
            self.log.warning("Missing setup cell %s: restored from the gradebook", gid)
            cell = NotebookNode(cell_type="code", execution_count=None, outputs=[],
                                metadata={"nbgrader": {"grade": False, "solution": False,
                                                       "locked": True, "task": False,
                                                       "schema_version": 3, "grade_id": gid,
                                                       "checksum": source.checksum}},
                                source="# " + RESTORED + source.source)
            nb.cells.insert(offset, copy.deepcopy(cell))
