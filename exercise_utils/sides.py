"""Which modules of ``exercise_utils`` are the student side and which the judge's, at grading.

The student side is what a rank may import: the core, every topic module a rank starts from
(``probes*``, ``tries``, a module defining a ``probe*`` function, a script with a ``__main__``
guard) and everything they import, at any depth (:func:`student_side`, an AST scan). The
rest (checks, requirements, expected values) is the judge's: :func:`judge_files` lists its
files, which the sandbox hides at grading (:func:`exercise_utils.sandbox.grading_hidden`).

Used by the course's grading (through :mod:`exercise_utils.sandbox`), ``tests/test_answers.py``
(no expected answer on the student side) and ``tests/test_grading_sandbox.py``.
"""
import re
from pathlib import Path


def student_side(package_root=None):
    """The modules of ``exercise_utils`` a rank may import (dotted names): the core, every
    topic module a rank starts from (``probes*``, ``tries`` (the try cells' code that runs in
    the ranks: :mod:`.tries`), any module defining a ``probe*`` function, and the scripts that
    launches run: a ``__main__`` guard) and everything they import, at any depth (an AST scan,
    imports inside functions included). The other topic modules are the judge's (checks,
    requirements, expected values): :func:`judge_files` lists them, hidden at grading.

    Args:
        package_root: the package folder to scan (default: this ``exercise_utils``).
    Returns:
        set of dotted module names.
    """
    import ast
    root = Path(package_root or Path(__file__).resolve().parent)
    top = root.parent
    mods = {".".join(p.relative_to(top).with_suffix("").parts).removesuffix(".__init__"): p
            for p in root.rglob("*.py")}

    def imports(name):
        path = mods[name]
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                parts = pkg.split(".")
                base = (".".join(parts[:len(parts) - node.level + 1] + [node.module or ""])
                        .rstrip(".") if node.level else node.module or "")
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
        out = set()
        for dotted in found:
            while dotted and dotted not in mods:
                dotted = dotted.rpartition(".")[0]
            if dotted:
                out.add(dotted)
        return out

    def starts_a_rank(name, path):
        text = path.read_text()
        last = name.rsplit(".", 1)[-1]
        return (name.count(".") <= 1 or last.startswith("probes") or last == "tries"
                or "__main__" in text or re.search(r"^def probe", text, flags=re.M))

    todo = [m for m, p in mods.items() if starts_a_rank(m, p)]
    seen = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += imports(name)
            todo += [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]
    return seen


def judge_files(package_root=None):
    """The files of the judge's modules (see :func:`student_side`): each ``.py`` and its
    compiled ``__pycache__/*.pyc`` (which hold the same code), compiled first so that the
    sandbox can hide them: a ``.pyc`` written after the policy was made would not be.
    ``package_root``: as :func:`student_side`'s. Returns a list of Paths."""
    import compileall
    root = Path(package_root or Path(__file__).resolve().parent)
    compileall.compile_dir(str(root), quiet=2)
    keep = student_side(root)
    files = []
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        if name.removesuffix(".__init__") in keep:
            continue
        files.append(path)
        files += sorted((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
    return files
