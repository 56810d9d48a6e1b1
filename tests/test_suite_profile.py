"""The profile make test ends with (tests/suite_profile.py): tests are attributed to the
notebook package they test, a package's share follows its test seconds, and a package over
its budget, or without one, is named."""
import json

import suite_profile as sp


def record(name, wall, tests):
    return {"pass": name, "wall": wall, "workers": 3, "finished": "t", "tests": tests}


def test_tests_belong_to_the_package_of_their_file_or_their_parameter():
    assert sp.package("tests/test_06_build_your_own_ddp.py::test_x") == "06"
    assert sp.package("tests/test_checks.py::test_check_rejects_flaw[03_ring_allreduce_a]") == "03"
    assert sp.package("tests/test_wire.py::test_w[10_pipeline_input_to_last_stage]") == "10"
    assert sp.package("tests/test_harness.py::test_a[2-gloo]") == "core"


def test_shares_split_a_pass_s_wall_by_test_seconds():
    r = record("serial", 100.0, {"tests/test_01_a.py::t": 30.0, "tests/test_checks.py::f[02_x]": 90.0,
                                 "tests/test_launch.py::t": 0.0})
    assert sp.shares(r) == {"01": 25.0, "02": 75.0, "core": 0.0}


def test_a_package_over_its_budget_or_without_one_is_named(tmp_path, capsys):
    r = record("serial", 100.0, {"tests/test_01_a.py::t": 30.0, "tests/test_02_b.py::t": 70.0})
    lines = "\n".join(sp.table([r], {"01": 40}))
    assert "package 02 took 70 s of CI wall time, and has no budget" in lines
    assert "package 01" not in lines.split("tests over")[1]
    lines = "\n".join(sp.table([r], {"01": 20, "02": 80}))
    assert "package 01 took 30 s of CI wall time, over its budget of 20 s" in lines
    (tmp_path / "serial.json").write_text(json.dumps(r))
    assert sp.main([str(tmp_path)]) == 0
    assert "where the time went" in capsys.readouterr().out
    assert sp.main([str(tmp_path / "none")]) == 1


def test_how_busy_the_cores_were_is_shown():
    r = {**record("serial", 100.0, {"tests/test_01_a.py::t": 30.0}), "cpu_busy": 0.5}
    lines = sp.table([r], None)
    assert any(line.startswith("serial") and line.endswith("50%") for line in lines), lines
    assert sp.cpu_busy((10, 100), (60, 200)) == 0.5 and sp.cpu_busy(None, (1, 2)) is None


def test_worksteal_starts_every_worker_with_its_share_of_the_long_tests():
    """tests/conftest.py deals the long tests round the slices that xdist's worksteal
    scheduler sends its workers at the start (simulated here with xdist's own scheduler)."""
    from types import SimpleNamespace

    from xdist.scheduler.worksteal import WorkStealingScheduling
    from conftest import dealt

    items = [f"t{i}" for i in range(23)]
    order = dealt(items, [i < 7 for i in range(23)], 3)
    assert sorted(order) == sorted(items)
    config = SimpleNamespace(getvalue=lambda name: ["3*popen"] if name == "tx" else None)
    sched = WorkStealingScheduling(config)
    sent = {}
    class Node:
        def __init__(self, k):
            self.k, self.shutting_down = k, False
            self.gateway = SimpleNamespace(id=f"gw{k}")

        def send_runtest_some(self, ids):
            sent.setdefault(self.k, list(ids))

    nodes = [Node(k) for k in range(3)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, order)
    sched.schedule()
    slices = [[order[i] for i in sent[k]] for k in range(3)]
    longs = {f"t{i}" for i in range(7)}
    assert [[t for t in s if t in longs] for s in slices] == [["t0", "t3", "t6"], ["t1", "t4"],
                                                              ["t2", "t5"]], slices
    assert all(s[:3 - (k > 0)] == [t for t in s if t in longs]      # each slice's first
               for k, s in enumerate(slices)), slices
