"""nbgrader metadata conventions of the course's source notebooks (solutions/NN_topic.ipynb).

The metadata is derived from the cell text, never written by hand:

- A code cell containing ``### BEGIN SOLUTION`` is a solution cell. Its grade_id is
  the file stem when its first line is ``%%writefile work/NN_name.py`` (id ``NN_name``),
  ``NN_name_partK`` when it is ``%%part work/NN_name.py K/N`` (one part of a file built over
  several cells, each with a solution region), otherwise its first line must be
  ``# solution: <id>``.
- A code cell whose first line is ``# CHECK <id> (<N> points)`` is an autograder test
  cell worth N points, grade_id ``check_<id>``; it may hold ``### BEGIN HIDDEN TESTS``.
  It must be self-contained: grading runs only the setup, exercise and CHECK cells
  (scripts/graded_only.py), so it may use only what the setup cell defines.
- A code cell whose first line starts with ``# Setup`` is the notebook's locked setup cell
  (grade_id ``setup``, at most one): grading runs it first, with the source's text.
- Every other cell carries no nbgrader metadata.

``normalize`` also clears outputs and execution counts, drops per-run cell metadata,
gives every cell a stable id and sets the python3 kernelspec, so that applying it twice
changes nothing. Used by scripts/course.py (meta, release, autograde).
"""
import copy
import hashlib
import re

import nbformat

# nbgrader's own delimiters (ClearSolutions / ClearHiddenTests match these substrings).
SOLUTION_DELIM = "BEGIN SOLUTION"
HIDDEN_DELIM = "BEGIN HIDDEN TESTS"
WRITEFILE_RE = re.compile(r"^%%writefile\s+(?:-a\s+|--append\s+)?work/(?P<id>[A-Za-z0-9_-]+)\.py\s*$")
PART_RE = re.compile(r"^%%part\s+work/(?P<id>[A-Za-z0-9_-]+)\.py\s+(?P<k>\d+)/(?P<n>\d+)\s*$")
SOLUTION_ID_RE = re.compile(r"^#\s*solution:\s*(?P<id>[A-Za-z0-9_-]+)\s*$")
SETUP_RE = re.compile(r"^#\s*Setup\b")
CHECK_RE = re.compile(r"^#\s*CHECK\s+(?P<id>[A-Za-z0-9_-]+)\s+\((?P<points>\d+(?:\.\d+)?)\s+points?\)")
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# Cell metadata that is per-run noise or stale nbgrader state; the script owns "nbgrader".
STALE_CELL_KEYS = ("nbgrader", "execution", "deletable", "editable", "trusted", "collapsed", "scrolled")
STALE_NB_KEYS = ("widgets", "celltoolbar")


class MetaError(Exception):
    """A source notebook breaks the conventions; the message lists every problem."""


def cell_metadata(cell, index):
    """Return the nbgrader metadata a cell must carry (None for ordinary cells).

    Args:
        cell: a notebook cell.
        index: its position in the notebook, used in error messages.
    Returns:
        A dict for ``cell.metadata["nbgrader"]`` or None.
    Raises:
        MetaError: the cell breaks a convention.
    """
    src = cell.source
    first = src.split("\n", 1)[0].strip()
    if cell.cell_type != "code":
        if SOLUTION_DELIM in src or HIDDEN_DELIM in src:
            raise MetaError(f"cell {index}: solution/hidden-test regions are only allowed in code cells")
        return None
    check = CHECK_RE.match(first)
    part = PART_RE.match(first)
    if part and SOLUTION_DELIM not in src:
        raise MetaError(f"cell {index}: a '%%part' cell is an exercise cell: it needs a solution "
                        "region (nbgrader would replace a whole solution cell without one)")
    if SOLUTION_DELIM in src:
        if check:
            raise MetaError(f"cell {index}: a '# CHECK' cell cannot contain a solution region")
        named = WRITEFILE_RE.match(first) or SOLUTION_ID_RE.match(first)
        if part:
            return {"schema_version": 3, "solution": True, "grade": False, "locked": False,
                    "task": False, "grade_id": f"{part['id']}_part{part['k']}"}
        if not named:
            raise MetaError(f"cell {index}: solution cell without an id; its first line must be "
                            f"'%%writefile work/NN_name.py', '%%part work/NN_name.py K/N' or "
                            f"'# solution: <id>' (found {first!r})")
        return {"schema_version": 3, "solution": True, "grade": False, "locked": False,
                "task": False, "grade_id": named["id"]}
    if check:
        points = float(check["points"])
        return {"schema_version": 3, "solution": False, "grade": True, "locked": True, "task": False,
                "points": int(points) if points.is_integer() else points,
                "grade_id": "check_" + check["id"]}
    if SETUP_RE.match(first) and HIDDEN_DELIM not in src:
        return {"schema_version": 3, "solution": False, "grade": False, "locked": True,
                "task": False, "grade_id": "setup"}
    if HIDDEN_DELIM in src:
        raise MetaError(f"cell {index}: hidden tests outside a '# CHECK <id> (N points)' cell")
    return None


def _stable_id(index, source, taken):
    digest = hashlib.sha1(f"{index}:{source}".encode()).hexdigest()
    n = 8
    while digest[:n] in taken:
        n += 1
    return digest[:n]


def normalize(nb):
    """Return a copy of a source notebook with the metadata the conventions prescribe.

    Args:
        nb: a notebook (nbformat v4 NotebookNode).
    Returns:
        The normalized copy.
    Raises:
        MetaError: listing every broken convention (missing or duplicate ids, ...).
    """
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
    errors, owners, taken = [], {}, set()
    for index, cell in enumerate(nb.cells):
        for key in STALE_CELL_KEYS:
            cell.metadata.pop(key, None)
        if not cell.get("id") or cell.id in taken:
            cell.id = _stable_id(index, cell.source, taken)
        taken.add(cell.id)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        try:
            meta = cell_metadata(cell, index)
        except MetaError as err:
            errors.append(str(err))
            continue
        if meta is None:
            continue
        gid = meta["grade_id"]
        if gid in owners:
            errors.append(f"cell {index}: duplicate grade_id {gid!r} (also cell {owners[gid]})")
        owners.setdefault(gid, index)
        cell.metadata["nbgrader"] = meta
    if errors:
        raise MetaError("\n".join(errors))
    for key in STALE_NB_KEYS:
        nb.metadata.pop(key, None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}  # no version string: no churn between machines
    return nb


def read(path):
    """Read a notebook file as nbformat v4."""
    return nbformat.read(str(path), as_version=4)


def dumps(nb):
    """Serialize exactly as nbformat.write does (indent 1, sorted keys, final newline)."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"
