"""Where the suite's time goes: pytest's own durations, per test file, per notebook package and
per slow test, for each pass of ``make test`` and for the whole run (issue 36).

Each pass (one pytest run) records, on its controller (never on an xdist worker), every test's
setup + call + teardown seconds and the pass's wall time into ``$DTFS_PROFILE``
(``work/profile/`` by default), one JSON file a pass, and prints its own table at the end.
``python tests/suite_profile.py`` (the last line of ``make test``) prints the table of every
pass recorded there, and each notebook package's share of every pass beside its budget
(``tests/budget.json``: seconds of CI wall time a package may take, setup excluded).

A package's share of a pass is the pass's wall time times the package's part of the test
seconds of that pass (tests run side by side: their seconds add up to more than the wall).
"""
import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("DTFS_PROFILE", ROOT / "work" / "profile"))
BUDGET = ROOT / "tests" / "budget.json"
SHORT = {"not serial": "parallel", "serial": "serial"}          # make test's passes
SLOW = 20.0                     # seconds: every test over this is listed by name

_seconds = defaultdict(float)
_outcomes = {}


def cpu_ticks():
    """(busy, all) clock ticks of every core since boot, from /proc/stat (None elsewhere)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)         # idle + iowait
    return sum(fields) - idle, sum(fields)


_cpu_start = cpu_ticks()        # this module is imported when the pass starts (conftest)


def cpu_busy(start, end):
    """The fraction of the cores' time that was busy between two :func:`cpu_ticks`: near 1, a
    pass is bound by the CPU (more tests side by side cannot help); well below, its tests wait
    (for a timeout, a peer, a sleep) and more of them side by side would fill the cores."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round((end[0] - start[0]) / (end[1] - start[1]), 3)


def package(nodeid):
    """The notebook package a test belongs to: ``"01"`` ... ``"10"`` from its file
    (``tests/test_01_...``) or its parameter (``[03_ring_...]``, a wrong, right or cheating
    file of that notebook), else ``"core"`` (the harness, the sandbox, the course tools)."""
    path, _, name = nodeid.partition("::")
    found = re.match(r"test_(\d\d)_", Path(path).name)
    if found:
        return found.group(1)
    found = re.search(r"\[(\d\d)_", name)
    return found.group(1) if found else "core"


def _controller(config):
    return not hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    """Add each phase's seconds to its test (the controller sees every worker's reports)."""
    _seconds[report.nodeid] += report.duration
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = report.outcome


def label(config):
    """A pass's name: its marker expression (``all`` without one)."""
    return (config.getoption("markexpr", "") or "all").strip()


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _controller(config) or not _seconds:
        return
    import psutil
    wall = time.time() - psutil.Process().create_time()      # the whole pass, start-up included
    record = {"pass": label(config), "wall": round(wall, 1),
              "workers": getattr(config.option, "numprocesses", None) or 1,
              "cpu_busy": cpu_busy(_cpu_start, cpu_ticks()), "exitstatus": int(exitstatus),
              "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "tests": {k: round(v, 2) for k, v in sorted(_seconds.items())},
              "outcomes": _outcomes}
    FOLDER.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9]+", "-", record["pass"]).strip("-")
    (FOLDER / f"{name}.json").write_text(json.dumps(record, indent=1))
    session.config._dtfs_profile = record


def pytest_terminal_summary(terminalreporter, config):
    record = getattr(config, "_dtfs_profile", None)
    if record:
        for line in table([record], budgets=None):
            terminalreporter.write_line(line)


# ------------------------------------------------------------------ the tables
def _by(record, key):
    out = defaultdict(float)
    for nodeid, seconds in record["tests"].items():
        out[key(nodeid)] += seconds
    return out


def shares(record):
    """``{package: seconds of the pass's wall time}``: its part of the pass's test seconds."""
    per = _by(record, package)
    total = sum(per.values()) or 1.0
    return {k: record["wall"] * v / total for k, v in per.items()}


def _mmss(seconds):
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def table(records, budgets):
    """The lines of the profile of ``records`` (passes), with ``budgets`` ({package: s}) or
    without (None)."""
    lines = []
    names = [r["pass"] for r in records]
    width = max(12, *(len(n) for n in names))
    lines.append("")
    lines.append("=" * 30 + " where the time went " + "=" * 30)
    lines.append(f"{'pass':<{width}}  {'wall':>6}  {'tests':>5}  {'test s':>7}  workers  cpu busy")
    for r in records:
        busy = r.get("cpu_busy")
        lines.append(f"{r['pass']:<{width}}  {_mmss(r['wall']):>6}  {len(r['tests']):>5}  "
                     f"{sum(r['tests'].values()):>7.0f}  {r['workers']:>7}  "
                     + (f"{busy:>7.0%}" if busy is not None else "      ?"))
    if len(records) > 1:
        lines.append(f"{'all':<{width}}  {_mmss(sum(r['wall'] for r in records)):>6}  "
                     f"{sum(len(r['tests']) for r in records):>5}")
    # per test file
    files = sorted({f for r in records for f in _by(r, lambda n: n.split("::")[0])})
    per_file = [_by(r, lambda n: n.split("::")[0]) for r in records]
    lines.append("")
    lines.append("test seconds per file (each pass; tests side by side add up over its wall)")
    rows = sorted(files, key=lambda f: -sum(p.get(f, 0) for p in per_file))
    for f in rows:
        cells = "  ".join(f"{p.get(f, 0):>7.0f}" for p in per_file)
        lines.append(f"  {f[len('tests/'):] if f.startswith('tests/') else f:<44} {cells}")
    # per package: share of every pass
    per_pkg = [shares(r) for r in records]
    pkgs = sorted({k for p in per_pkg for k in p})
    lines.append("")
    head = "  ".join(f"{SHORT.get(n, n)[:9]:>9}" for n in names)
    lines.append(f"wall seconds per notebook package (its share of each pass)")
    lines.append(f"  {'package':<8} {head}  {'total':>7}" + ("  budget" if budgets else ""))
    over = []
    for k in pkgs:
        total = sum(p.get(k, 0) for p in per_pkg)
        cells = "  ".join(f"{p.get(k, 0):>9.0f}" for p in per_pkg) + f"  {total:>7.0f}"
        extra = ""
        if budgets:
            limit = budgets.get(k)
            extra = f"  {limit:>6}" if limit is not None else "  (none)"
            if limit is None or total > limit:
                extra += "  OVER" if limit is not None else "  NO BUDGET"
                over.append((k, total, limit))
        lines.append(f"  {k:<8} {cells}{extra}")
    # slow tests
    slow = sorted(((s, n) for r in records for n, s in r["tests"].items() if s > SLOW),
                  reverse=True)
    lines.append("")
    lines.append(f"tests over {SLOW:.0f} s: {len(slow)}")
    for seconds, nodeid in slow:
        lines.append(f"  {seconds:>6.1f}  {nodeid}")
    for k, total, limit in over:
        lines.append(f"budget: package {k} took {total:.0f} s of CI wall time"
                     + (f", over its budget of {limit} s" if limit is not None
                        else ", and has no budget in tests/budget.json"))
    return lines


def main(argv):
    folder = Path(argv[0]) if argv else FOLDER
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not records:
        print(f"no profile in {folder}: run make test first")
        return 1
    order = {"not serial": 0, "serial": 1}
    records.sort(key=lambda r: (order.get(r["pass"], 3), r["finished"]))
    budgets = json.loads(BUDGET.read_text())["seconds"] if BUDGET.exists() else {}
    print("\n".join(table(records, budgets)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
