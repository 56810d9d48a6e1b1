"""Read the ``%%writefile`` cells of a notebook: the student files an exercise writes.

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
from pathlib import Path

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def writefile_cells(notebook):
    """Return ``{relative path: file text}`` for every ``%%writefile`` cell of ``notebook``.

    Solution markers are removed (their content kept); a later cell writing the same
    path wins, as it would when the notebook runs top to bottom.
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    files = {}
    for cell in cells:
        src = "".join(cell.get("source", ""))
        first, _, body = src.partition("\n")
        if cell.get("cell_type") == "code" and first.startswith("%%writefile"):
            target = first.split()[-1]
            lines = [ln for ln in body.split("\n") if ln.strip() not in MARKERS]
            files[target] = "\n".join(lines).rstrip("\n") + "\n"
    return files


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
    return (f"{', '.join(names)} in {path} still raise{'s' * (len(names) == 1)} "
            "NotImplementedError. Replace the `raise` line with your code, then run the "
            f"%%writefile cell again{', then this cell' if this_cell else ''}."
            + (f" {passed}" if passed else "")
            + (f" Still to do in that file, in order: {', '.join(later[:6])}"
               + (", ..." if len(later) > 6 else "") + "." if later else ""))
