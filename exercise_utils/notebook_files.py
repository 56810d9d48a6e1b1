"""Read the ``%%writefile`` cells of a notebook: the student files an exercise writes, and the
``%%part`` cells that build one file over several cells (:func:`part_magic`).

Tests and ``make demo`` use this to get the reference solution files straight
from ``solutions/NN_topic.ipynb`` (the one source of truth), instead of keeping
second copies.

Used by tests and by :mod:`exercise_utils.mpi_parallel_sgd.demo`; :func:`unimplemented` (what
a student's file has still to write) and :func:`unwritten` (the one message that says so) by
the checks' and the launches' messages (:mod:`.harness`, :mod:`.display`, notebooks 06 and
08 to 10).
"""
import ast
import json
import re
from pathlib import Path

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
PART_RE = re.compile(r"^%%part\s+(?P<path>\S+)\s+(?P<k>\d+)/(?P<n>\d+)\s*$")
PART_MARK = "# ---- part {k}/{n} of this file: from the notebook's cell `%%part {path} {k}/{n}`"
PART_MARK_RE = re.compile(r"^# ---- part (\d+)/(\d+) of this file: ")


def writefile_cells(notebook):
    """Return ``{relative path: file text}`` for every ``%%writefile`` cell of ``notebook``,
    and every file its ``%%part`` cells build (:func:`with_part`, parts in notebook order).

    Solution markers are removed (their content kept); a later cell writing the same
    path wins, as it would when the notebook runs top to bottom.
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    files = {}
    for cell in cells:
        src = "".join(cell.get("source", ""))
        first, _, body = src.partition("\n")
        if cell.get("cell_type") != "code":
            continue
        lines = [ln for ln in body.split("\n") if ln.strip() not in MARKERS]
        text = "\n".join(lines).rstrip("\n") + "\n"
        part = PART_RE.match(first)
        if part:
            target = part["path"]
            files[target] = with_part(files.get(target, ""), target, int(part["k"]),
                                      int(part["n"]), text)
        elif first.startswith("%%writefile"):
            files[first.split()[-1]] = text
    return files


def parts_of(text):
    """``{k: text of part k}`` of a file built by ``%%part`` cells (:func:`with_part`); text
    before the first part's mark (a file written otherwise) is left out."""
    parts, current = {}, None
    for line in text.splitlines(keepends=True):
        mark = PART_MARK_RE.match(line)
        if mark:
            current = int(mark[1])
            parts[current] = ""
        elif current is not None:
            parts[current] += line
    return {k: t.rstrip("\n") + "\n" if t.strip() else t for k, t in parts.items()}


def with_part(text, path, k, n, body):
    """The text of file ``path`` (now ``text``) with its part ``k`` of ``n`` set to ``body``:
    each part follows a mark line that names its cell, the parts in order (two blank lines
    between them), those not written yet absent; the other parts are kept as they were."""
    if not 1 <= k <= n:
        raise ValueError(f"%%part {path} {k}/{n}: the part must be between 1 and {n}")
    parts = {i: t for i, t in parts_of(text).items() if i <= n}
    parts[k] = body.rstrip("\n") + "\n" if body.strip() else body
    return "\n\n".join(PART_MARK.format(k=i, n=n, path=path) + "\n" + parts[i]
                       for i in sorted(parts))


def part_magic(line, cell):
    """The ``%%part PATH K/N`` cell magic: write the cell as part K of the N parts of file
    PATH, keeping the parts other cells wrote (:func:`with_part`), and say which parts are
    still to run. One exercise file is built over several cells this way (issue 39):
    re-running any of them replaces only its own part."""
    found = PART_RE.match(f"%%part {line.strip()}")
    if not found:
        raise ValueError(f"usage: %%part PATH K/N (got %%part {line.strip()})")
    path, k, n = Path(found["path"]), int(found["k"]), int(found["n"])
    old = path.read_text() if path.exists() else ""
    new = with_part(old, found["path"], k, n, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    todo = [i for i in range(1, n + 1) if i not in parts_of(new)]
    print(f"Wrote part {k}/{n} of {path}" +
          (f" (parts not run yet: {', '.join(map(str, todo))})" if todo else ""))


def extract_writefiles(notebook, dest):
    """Write the notebook's ``%%writefile`` files under ``dest`` (flattened to their names).

    Returns:
        dict: file stem -> written Path.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written = {}
    for target, text in writefile_cells(notebook).items():
        path = dest / Path(target).name
        path.write_text(text)
        written[path.stem] = path
    return written


def unimplemented(path):
    """The functions and methods (``Class.method``) of the file at ``path`` whose body still
    raises NotImplementedError (a statement of its own), in file order; [] if it does not
    parse. Read as text, never run."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return []
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(isinstance(s, ast.Raise) and s.exc is not None and "NotImplementedError"
                       in ast.unparse(s.exc) for s in child.body):
                    found.append(prefix + child.name)
    visit(tree, "")
    return found


def no_file(path):
    """The message of a student's file that does not exist yet (a check or a launch on it)."""
    return (f"{path} does not exist: run the cell that writes it first (its %%writefile "
            "cell, or each of its %%part cells).")


def unwritten(names, path, later=(), this_cell=False, passed=""):
    """The message of code not written yet, the same wherever it is found (a check, a launch,
    a function called in the notebook): ``names`` (functions, ``Class.method``) in ``path``
    still raise NotImplementedError, what to do, then ``passed`` (a sentence: what passed
    already) and ``later`` (the file's other functions still to write, at most six named).
    ``this_cell``: the message is shown under the cell that ran the code (a launch, an
    experiment), which is to be run again too. A check's message puts "not implemented yet: "
    before it; a box has that in its title."""
    names = [names] if isinstance(names, str) else list(names)
    later = list(later)
    part = _part_with(path, names[0])
    return (f"{', '.join(names)} in {path} still raise{'s' * (len(names) == 1)} "
            "NotImplementedError. Replace the `raise` line with your code, then run the "
            + (f"cell `%%part {part}` again" if part else "%%writefile cell again")
            + f"{', then this cell' if this_cell else ''}."
            + (f" {passed}" if passed else "")
            + (f" Still to do in that file, in order: {', '.join(later[:6])}"
               + (", ..." if len(later) > 6 else "") + "." if later else ""))


def _part_with(path, name):
    """``"PATH K/N"`` of the ``%%part`` cell whose part of the file at ``path`` defines
    ``name`` (a function or ``Class.method``), or None (no parts, not found, no file)."""
    try:
        text = Path(path).read_text()
    except (OSError, ValueError):
        return None
    if not PART_MARK_RE.match(text):           # not built by %%part cells
        return None
    owner, _, function = name.rpartition(".")
    define = re.compile(rf"\s*(async\s+)?def {re.escape(function)}\(")
    inside = not owner                         # a method: only inside its own class
    for line in text.splitlines():
        if PART_MARK_RE.match(line):
            current = part_cell(line)
        elif owner and re.match(r"(class|def|async\s+def)\s", line):
            inside = bool(re.match(rf"class\s+{re.escape(owner)}\b", line))
        elif inside and define.match(line):
            return current
    return None


def part_cell(mark):
    """``"PATH K/N"``: the ``%%part`` cell a part's mark line (:data:`PART_MARK`) names."""
    return mark.split("`%%part ", 1)[-1].rstrip().rstrip("`")
