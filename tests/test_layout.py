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
        "outcomes", "ports", "commands"}
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
