"""Plain data across the boundary between the student's processes and the judge
(``exercise_utils.plaindata``): what a rank reports round-trips, nothing else is written, and
reading never unpickles; no module of the course unpickles what a student's process wrote."""
import ast
import io
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from exercise_utils import plaindata as pd
from exercise_utils.harness import run_ranks

ROOT = Path(__file__).resolve().parents[1]


def test_round_trip():
    value = {"a": [1, 2.5, None, True, "x", (3, 4)], 3: np.arange(6).reshape(2, 3),
             (1, 2): np.float64(1.5), "t": torch.arange(4, dtype=torch.int64),
             "b": torch.ones(2, dtype=torch.bfloat16), "nan": float("nan"), "inf": -math.inf,
             "bool": np.bool_(True), "i": np.int64(7), "empty": np.zeros((0, 3), np.float32),
             "big": 2 ** 70, "f64": torch.tensor([1 / 3], dtype=torch.float64),
             "0-d": np.array(2.5), "0-d tensor": torch.tensor(3, dtype=torch.int64),
             "transposed": np.arange(6.0).reshape(2, 3).T}
    out = pd.loads(pd.dumps(value))
    assert out["a"] == [1, 2.5, None, True, "x", (3, 4)] and isinstance(out["a"][5], tuple)
    assert out[3].dtype == np.int64 and out[3].shape == (2, 3)
    assert out[(1, 2)] == 1.5 and out["i"] == 7 and out["big"] == 2 ** 70
    assert out["t"].dtype == torch.int64 and out["b"].dtype == torch.bfloat16
    assert math.isnan(out["nan"]) and out["inf"] == -math.inf
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == np.float32
    assert out["f64"].item() == 1 / 3
    assert out["0-d"].shape == () and out["0-d"] == 2.5
    assert out["0-d tensor"].shape == () and out["0-d tensor"].item() == 3
    assert (out["transposed"] == np.arange(6.0).reshape(2, 3).T).all()


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_refuses_objects_when_writing():
    for bad in (Evil(), np.array([Evil()], dtype=object), np.array(["s"]), {1: object()}, print,
                {1, 2}, b"bytes"):
        with pytest.raises(pd.PlainDataError):
            pd.dumps(bad)


def test_reading_never_unpickles():
    text = b'{"__array__": "a0", "scalar": false}\n'
    buf = io.BytesIO()
    np.savez(buf, a0=np.array([Evil()], dtype=object))
    with pytest.raises(pd.PlainDataError):
        pd.loads(text + buf.getvalue())
    with pytest.raises(Exception):
        pd.loads(pickle.dumps({"x": 1}))


def test_a_rank_that_returns_an_object_gets_a_message(tmp_path, env_pythonpath):
    """A probe that hands back an object (here the student's own) is reported as an error of
    the student's code, never unpickled in the judge."""
    path = tmp_path / "student.py"
    path.write_text("class Evil:\n    def __reduce__(self):\n        return (print, ('pwned',))\n"
                    "def value(rank):\n    return Evil()\n")
    with pytest.raises(AssertionError, match="cannot report what your code gave back"):
        run_ranks(path, "harness_probes:probe_value", 1, timeout=60)


# Where the course may unpickle, and why that is not something a student's process wrote.
ALLOWED = {
    ("exercise_utils/rankworker.py", "pickle.loads"):
        "a rank reads the arguments the judge wrote for it",
    ("exercise_utils/data.py", "pickle.Unpickler"):
        "CIFAR-10's batch files, numpy arrays only (find_class refuses everything else)",
    ("exercise_utils/ddp_torchrun_fault_tolerance/probes.py", "weights_only=False"):
        "inside the student's worker: the snapshot its own code wrote, digested to plain data",
}
UNPICKLING = {"load", "loads", "Unpickler"}
MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def unpickling_calls(path):
    """``(what, line)`` of every place in ``path`` that unpickles or could."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in MODULES and node.attr in UNPICKLING | {"Unpickler"}):
            found.append((f"{node.value.id}.{node.attr}", node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            found.append((f"from {node.module} import", node.lineno))
        elif isinstance(node, ast.Import):
            found += [(f"import {a.name} as {a.asname}", node.lineno) for a in node.names
                      if a.name in MODULES and a.asname]
        elif isinstance(node, ast.keyword) and isinstance(node.value, ast.Constant):
            if (node.arg, node.value.value) in (("weights_only", False), ("allow_pickle", True)):
                found.append((f"{node.arg}={node.value.value}", node.value.lineno))
    return found


def test_nothing_a_student_process_wrote_is_unpickled():
    """An AST scan of every module of the course package and the grading scripts: no
    pickle.load(s), Unpickler, torch.load(weights_only=False) or np.load(allow_pickle=True)
    but the places ALLOWED says why."""
    files = sorted((ROOT / "exercise_utils").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    bad = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files
           for what, line in unpickling_calls(p)
           if (str(p.relative_to(ROOT)), what) not in ALLOWED]
    assert not bad, bad
    used = {(str(p.relative_to(ROOT)), what) for p in files for what, _ in unpickling_calls(p)}
    assert set(ALLOWED) <= used, f"stale entries: {set(ALLOWED) - used}"


def test_the_scan_sees_each_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import pickle\nimport pickle as p\nfrom dill import loads\nimport numpy as np\n"
                    "pickle.loads(b'')\nnp.load('x', allow_pickle=True)\n"
                    "torch.load('x', weights_only=False)\n")
    assert sorted(w for w, _ in unpickling_calls(path)) == sorted([
        "import pickle as p", "from dill import", "pickle.loads", "allow_pickle=True",
        "weights_only=False"])
