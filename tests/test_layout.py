"""The package layout of COURSE_DESIGN.md: a shared core at the top of ``exercise_utils`` and one
package per notebook (its stem without ``NN_``) that imports the core and its own modules only;
every dotted ``exercise_utils.…`` name written anywhere in the repository (code, launch strings,
docstrings, notebooks, README) resolves. Each rule is also shown to catch a wrong input."""
import ast
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "exercise_utils"
CORE = {"config", "data", "models", "launch", "launch_many", "processes", "harness", "rankworker",
        "heartbeat", "integrity", "pgwatch", "recorder",
        "bench", "notebook_files", "linebuf", "cluster", "contract", "zygote", "plaindata",
        "sandbox", "display", "hosts", "wire", "spawn_template", "limits", "tries",
        "compare", "stops", "reports", "sessions", "hostlaunch",
        "netns", "links", "hostranks", "hostsweep", "hostlimits",
        "outcomes", "ports", "commands", "progress", "sides", "forking"}
OLD_KINDS = re.compile(r"^(checks_\w+|\w+_probe|\w+_bench|\w+_experiments?)$")
DOTTED = re.compile(r"exercise_utils(?:\.\w+)+")


def topics():
    """``{topic package: notebook stem}`` for every solution notebook."""
    stems = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    return {stem[3:]: stem for stem in stems}


def modules_of(folder):
    return sorted(p.stem for p in Path(folder).glob("*.py") if p.stem != "__init__")


def listed_modules(init_file):
    """The modules an ``__init__.py`` docstring lists (``* ``name``...`` lines)."""
    doc = ast.get_docstring(ast.parse(Path(init_file).read_text())) or ""
    return sorted(n for line in doc.splitlines() if line.startswith("* ")
                  for n in re.findall(r"``(\w+)``", line.split(":")[0]))


def foreign_imports(folder, core=CORE):
    """Imports of a topic package's modules that reach outside the core and the package itself:
    ``from ..x`` with x not in the core, or ``exercise_utils.<other>`` (also inside strings,
    where a launch names a module)."""
    folder, bad = Path(folder), []
    for path in sorted(folder.glob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                names = [node.module] if node.module else [a.name for a in node.names]
                bad += [f"{path.name}: from ..{n}" for n in names if n.split(".")[0] not in core]
            elif isinstance(node, ast.ImportFrom) and node.level > 2:
                bad.append(f"{path.name}: from {'.' * node.level}{node.module}")
        for name in DOTTED.findall(text):
            first = name.split(".")[1]
            if first not in core and first != folder.name:
                bad.append(f"{path.name}: {name}")
    return bad


def unresolved(text):
    """The dotted ``exercise_utils.…`` names in ``text`` that are neither a module nor an
    attribute of one (a stale name after a rename)."""
    missing = []
    for name in sorted(set(DOTTED.findall(text))):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                missing.append(name)
            break
        else:
            missing.append(name)
    return missing


def repository_texts():
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").glob("*.py"),
             ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "Makefile"]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    for nb in [*(ROOT / "solutions").glob("*.ipynb"), *(ROOT / "notebooks").glob("*.ipynb")]:
        cells = json.loads(nb.read_text())["cells"]
        texts[str(nb.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells)
    return texts


# ------------------------------------------------------------------ the repository
def test_top_level_holds_the_core_and_one_package_per_notebook():
    top = set(modules_of(PACKAGE))
    assert top == CORE, f"not core: {sorted(top - CORE)}; missing: {sorted(CORE - top)}"
    assert not [m for m in top if OLD_KINDS.match(m)]
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(topics()), (sorted(packages), sorted(topics()))


@pytest.mark.parametrize("topic", sorted(topics()))
def test_topic_package(topic):
    folder = PACKAGE / topic
    importlib.import_module(f"exercise_utils.{topic}.checks")
    assert {"checks", "probes"} <= set(modules_of(folder))
    assert listed_modules(folder / "__init__.py") == modules_of(folder), (
        f"the docstring of exercise_utils/{topic}/__init__.py must list exactly its modules")
    assert foreign_imports(folder) == []
    stem = topics()[topic]
    for path in folder.glob("*.py"):
        if path.stem != "__init__":
            doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
            assert f"Used in {stem}" in doc, f"{path}: its docstring must say 'Used in {stem}'"


def test_every_dotted_name_in_the_repository_resolves():
    texts = repository_texts()
    del texts["tests/test_layout.py"]           # its wrong inputs below are stale on purpose
    stale = {f: bad for f, text in texts.items() if (bad := unresolved(text))}
    assert stale == {}


IMPORT_EACH_FIRST = """
import importlib, pkgutil, sys, exercise_utils
names = sorted(m.name for m in pkgutil.walk_packages(exercise_utils.__path__, "exercise_utils."))
bad = []
for name in names:
    for key in [k for k in sys.modules if k.split(".")[0] == "exercise_utils"]:
        del sys.modules[key]
    try:
        importlib.import_module(name)
    except Exception as err:
        bad.append(f"{name}: {type(err).__name__}: {err}")
print(len(names), bad)
"""


def test_every_module_imports_on_its_own():
    """Each module of exercise_utils imports first, in an interpreter with none of the course
    loaded: no import cycle whose outcome depends on which module a notebook or test imports
    first (08's checks and checks_powersgd had one: importing checks_powersgd first failed)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", IMPORT_EACH_FIRST], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    count, bad = out.stdout.strip().split(" ", 1)
    assert int(count) > 100 and bad == "[]", bad


def test_check_cells_import_from_their_notebooks_package():
    for topic, stem in topics().items():
        cells = json.loads((ROOT / "solutions" / f"{stem}.ipynb").read_text())["cells"]
        checks = ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("# CHECK ")]
        assert checks, stem
        for src in checks:
            assert re.search(rf"^from exercise_utils\.{topic}\.checks\w* import check_\w+$", src,
                             flags=re.M), src[:200]


def test_every_check_runs_in_one_session():
    """Every check a CHECK cell calls is wrapped by ``harness.check`` (one zygote for its
    launches: torch imported once per check, not once per launch)."""
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    import flaws
    bare = []
    for number in flaws.numbers():
        for exercise in flaws.checkers(number):
            func, _ = flaws.checker(number, exercise)
            if getattr(func, "__dtfs_check__", False) is not True:
                bare.append(f"{number} {exercise}: {func.__module__}.{func.__name__}")
    assert not bare, f"not decorated with @check (exercise_utils.harness.check): {bare}"


# ------------------------------------------------------------------ the rules catch wrong inputs
def test_rules_catch_wrong_inputs(tmp_path):
    assert unresolved("python -m exercise_utils.checks_mpi and exercise_utils.launch.torchrun") == [
        "exercise_utils.checks_mpi"]
    assert unresolved("exercise_utils.build_your_own_ddp.probes.no_such_function") != []
    assert unresolved("from exercise_utils.bonus_powersgd.checks import check_powersgd") == []
    pkg = tmp_path / "mytopic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Modules:\n\n* ``checks``: the checks;\n* ``gone``: old.\n"""\n')
    (pkg / "checks.py").write_text("from ..launch import run\nfrom ..other_topic import checks\n"
                                   "from . import probes\n"
                                   "CMD = 'python -m exercise_utils.shared_memory_hogwild.train'\n")
    (pkg / "probes.py").write_text("from ...x import y\n")
    assert foreign_imports(pkg) == ["checks.py: from ..other_topic",
                                    "checks.py: exercise_utils.shared_memory_hogwild.train",
                                    "probes.py: from ...x"]
    assert listed_modules(pkg / "__init__.py") == ["checks", "gone"] != modules_of(pkg)


# ------------------------------------------------------------------ a core without knots
CORE_LINES = 400        # the most lines a core module may have (COURSE_DESIGN: Style)
REPEAT = 6              # this many significant lines repeated in two places is one too many
PASSED_OVER = re.compile(r"^(#.*|[\s)\]}(\[{,:;]*|(import|from)\s.*)$")


def long_modules(folder=PACKAGE, most=CORE_LINES):
    """``{module: lines}`` of the core modules (the package's top level) over ``most`` lines."""
    return {p.name: n for p in sorted(Path(folder).glob("*.py"))
            if (n := len(p.read_text().splitlines())) > most}


def import_graph(folder=PACKAGE, package="exercise_utils"):
    """``{module: modules of the package it imports}``, imports inside functions included (a
    lazy import is still a dependency: it only hides the circle until the call)."""
    folder = Path(folder)
    names = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names[".".join((package, *parts))] = path
    graph = {}
    for name, path in names.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base
                         for a in node.names]
            else:
                continue
            deps |= {f for f in found if f in names and f != name}
        graph[name] = deps
    return graph


def circles(graph):
    """The import circles of ``graph``: each a sorted list of the modules that reach each
    other (strongly connected components of two or more)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def repeated_blocks(texts, size=REPEAT):
    """Places where ``size`` significant lines (white space folded; blank lines, comments,
    imports and lone brackets passed over) stand again elsewhere, the same to the letter:
    ``[[(file, first line, last line), ...], ...]``, overlapping windows of one run merged."""
    seen = {}
    for name, text in texts.items():
        lines = [(no, " ".join(line.split())) for no, line in enumerate(text.splitlines(), 1)]
        lines = [(no, s) for no, s in lines if s and not PASSED_OVER.match(s)]
        for i in range(len(lines) - size + 1):
            key = tuple(s for _, s in lines[i:i + size])
            seen.setdefault(key, []).append((name, lines[i][0], lines[i + size - 1][0]))
    runs = []
    for places in seen.values():
        apart = []
        for p in places:
            if not any(q[0] == p[0] and p[1] <= q[2] and q[1] <= p[2] for q in apart):
                apart.append(p)
        if len(apart) > 1:
            for run in runs:        # the next window of a run already found: grow it
                if all(r[0] == a[0] and r[1] < a[1] <= r[2] + 1 for r, a in zip(run, apart)) \
                        and len(run) == len(apart):
                    run[:] = [(r[0], r[1], a[2]) for r, a in zip(run, apart)]
                    break
            else:
                runs.append(apart)
    return runs


def test_no_core_module_is_over_its_lines():
    assert long_modules() == {}, (
        f"core modules over {CORE_LINES} lines: split them along the seams their docstrings "
        "name (each new module's docstring says what it owns and who calls it)")


def test_no_import_circle_in_exercise_utils():
    assert circles(import_graph()) == []


def test_no_block_repeated_inside_exercise_utils():
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    assert repeated_blocks(texts) == [], "one home per mechanism: move it to the core"


def test_knot_rules_catch_wrong_inputs(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "topic").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n" + "x = 1\n" * (CORE_LINES + 1))
    (pkg / "b.py").write_text("def f():\n    from .topic import c\n")     # lazy: still a circle
    (pkg / "topic" / "__init__.py").write_text("")
    (pkg / "topic" / "c.py").write_text("from ..a import x\nfrom .. import b\n")
    (pkg / "d.py").write_text("import pkg.topic.c\n")
    assert long_modules(pkg) == {"a.py": CORE_LINES + 2}
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.d"] == {"pkg.topic.c"} and graph["pkg.topic.c"] == {"pkg.a", "pkg.b"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.topic.c"]]
    same = "\n".join(f"    value = compute(value, {i})" for i in range(8))
    alike = {"one.py": f"def f(value):\n{same}\n",          # the same shape, other names
             "two.py": f"def g(value):\n{same.replace('value', 'result')}\n"}
    assert repeated_blocks(alike) == []
    twice = {"one.py": f"def f(value):\n{same}\n    return value\n",
             "two.py": f"# a copy\ndef g(value):\n{same}\n    return -value\n"}
    assert repeated_blocks(twice) == [[("one.py", 2, 9), ("two.py", 3, 10)]]
    assert repeated_blocks({"one.py": twice["one.py"]}) == []
