"""``spawn`` workers forked from a template of the rank (exercise_utils/spawn_template.py) are
what exec'd ones are: the same probe, with the template and without (``DTFS_SPAWN_TEMPLATE=0``),
sees the same workers, and they end the same way."""
import textwrap

import pytest

from exercise_utils import harness
from exercise_utils.harness import run_ranks

pytestmark = pytest.mark.usefixtures("env_pythonpath")

STUDENT = textwrap.dedent('''
    import atexit
    import os
    import random
    import signal
    import sys
    import threading
    import time

    import numpy as np
    import torch

    STATE = {"parent": False, "imports": 0}
    STATE["imports"] += 1                      # the module ran here (spawn imports it afresh)


    def observe(conn, mode, folder):
        print("printed by the worker", mode)     # before the parent can end it
        fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
        kinds = sorted(os.readlink(f"/proc/self/fd/{f}").split(":")[0].replace(folder, "F")
                       for f in fds
                       if os.path.exists(f"/proc/self/fd/{f}"))
        conn.send({
            "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
            "env": os.environ.get("SPAWN_SEEN"), "threads": torch.get_num_threads(),
            "state": dict(STATE), "argv": len(sys.argv), "fds": kinds,
            "handlers": {s.name: repr(signal.getsignal(s)) for s in
                         (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE)},
            "seeds": (torch.initial_seed(), random.random(), float(np.random.rand())), "main": sys.modules["__main__"].__name__,
            "name": __name__, "stdout_fd": sys.stdout.fileno(), "stdin": os.readlink(f"/proc/self/fd/{sys.stdin.fileno()}"),
            "modules": "student_student" in sys.modules, "exit_handlers": atexit._ncallbacks()})
        conn.close()
        if mode == "raise":
            raise RuntimeError("worker raised on purpose")
        if mode == "exit3":
            sys.exit(3)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "term":
            time.sleep(60)
        if mode == "threads_atexit":
            atexit.register(lambda: open(os.path.join(folder, "atexit-ran"), "w").close())
            def late():
                time.sleep(0.5)
                open(os.path.join(folder, "thread-joined"), "w").close()
            threading.Thread(target=late).start()
''')


def run(tmp_path, monkeypatch, on):
    folder = tmp_path / ("on" if on else "off")
    folder.mkdir()
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "spawned_student.py").write_text(STUDENT)
    (code / "student.py").write_text("x = 1\n")
    monkeypatch.setenv("DTFS_SPAWN_TEMPLATE", "1" if on else "0")
    with harness.session():             # the ranks forked from a zygote, as checks run them
        return run_ranks(code / "student.py", "harness_probes:probe_spawn_workers", 1, "none",
                         {"folder": str(folder)}, timeout=120)[0]


def test_spawn_workers_from_the_template_are_those_exec_makes(tmp_path, monkeypatch):
    on, off = run(tmp_path, monkeypatch, True), run(tmp_path, monkeypatch, False)
    assert off["spawned"] == 0 and on["spawned"] == 6, (on["spawned"], off["spawned"])
    for mode, seen in off["workers"].items():
        assert seen["is_child"], (mode, seen)
        assert seen["state"] == {"parent": False, "imports": 1}, seen
        assert seen["env"] == "from the parent", seen
    assert {m: w["exitcode"] for m, w in off["workers"].items()} == {
        "ok": 0, "raise": 1, "exit3": 3, "kill": -9, "threads_atexit": 0, "term": -15}
    for one in (on, off):           # every worker's random numbers its own (seeded by the OS)
        seeds = [w.pop("seeds") for w in one["workers"].values()]
        assert len({s for seed in seeds for s in seed}) == 3 * len(seeds), seeds
    for mode in off["workers"]:
        a, b = dict(on["workers"][mode]), dict(off["workers"][mode])
        assert a.pop("cwd").endswith("/on") and b.pop("cwd").endswith("/off")
        assert a == b, f"{mode}: {a} != {b}"
    assert on["atexit"] == off["atexit"] == ["atexit-ran", "stdout", "thread-joined"]
    # what the workers printed reached the rank's descriptor 1 (the harness's ranks run with
    # PYTHONUNBUFFERED, and so do their workers: even those a signal ended)
    assert on["stdout"] == off["stdout"] == "".join(
        f"printed by the worker {mode}\n"
        for mode in ("ok", "raise", "exit3", "kill", "threads_atexit", "term")), on["stdout"]
