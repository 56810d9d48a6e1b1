"""No expected answer on the student side (issue 35, item 4).

At grading a rank can import every module of ``exercise_utils`` a rank needs (the student side:
``sides.student_side``); the judge's modules are hidden. So a value the judge compares
with must not come from the student side, unless no rank can rebuild it: the judge's
references computed from every rank's inputs, each rank's derived from a number only it and
the judge know (salted), or inputs and case tables (what a rank is given anyway).

The scan: every name a judge module imports from a student-side module is listed below with
what it is. A new one fails this test until someone decides which it is (and moves it to the
judge if it is an answer: notebook 10's GPipe and 1F1B orders, 02's sampler order went that
way). A name that looks like an answer (``ref``, ``expected``, ``order``, ``answer``,
``solution``, ``run``, ``sum``) may only be listed as salted.
"""
import ast
import re
from pathlib import Path

from exercise_utils import sides

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "exercise_utils"
SALTED, INPUT, CASES, CONSTANT, PROBE = ("salted", "input", "cases", "constant", "probe")
# module -> {name: what it is}; "salted": computed from inputs that derive, at grading, from
# every rank's own number (no rank can rebuild another's)
ALLOWED = {
    "bonus_fsdp.nets": {"EDGE_STEPS": CONSTANT, "MORE_STEPS": CONSTANT, "OPTIM": CONSTANT,
                        "STEPS": CONSTANT, "ZERO2_SKIPS": CONSTANT, "arrays": PROBE,
                        "combined": SALTED,
                        "edge_combined": SALTED, "edge_model": INPUT, "make_model": INPUT},
    "bonus_model_parallel.nets": {"BLOCKS": CASES, "D_MODEL": CONSTANT, "PARAMS": CONSTANT,
                                  "PP_LAYERS": CONSTANT, "PP_RUNS": CASES,
                                  "PP_WIDTHS": CONSTANT, "blocks": SALTED,
                                  "pp_reference": SALTED, "pp_runs": CASES,
                                  "reference": SALTED, "rows_of": INPUT, "shard": INPUT},
    "bonus_powersgd.reference": {"SEED": CONSTANT, "SETTINGS": CASES, "STEPS": CONSTANT,
                                 "gradient": SALTED, "trainable": INPUT},
    "bonus_zero_sharding.probes_memory": {"memory_calls": PROBE},
    "bonus_zero_sharding.probes_runs": {"RUNS": CASES, "_listed": CASES},
    "build_your_own_ddp.probes": {"BROADCAST_CASES": CASES, "OPTIMIZER_CASES": CASES},
    "build_your_own_ddp.probes_grad": {"BUCKET_CASES": CASES, "MICROS": CONSTANT,
                                       "OVERLAP_CASES": CASES, "REDUCE_CASES": CASES,
                                       "STALE": CASES},
    "build_your_own_ddp.probes_init": {"INIT_CASES": CASES, "INIT_TIMEOUT": CONSTANT,
                                       "launcher_env": INPUT},
    "build_your_own_ddp.reference": {"LR": CONSTANT, "MOMENTUM": CONSTANT, "STEPS": CONSTANT,
                                     "batch": SALTED, "grads_of": SALTED, "make_model": INPUT},
    "ddp_torchrun_fault_tolerance.simulate": {"FAKE_ENV": INPUT, "FAKE_RANK": INPUT},
    "mpi_parallel_sgd.inputs": {"GLOBAL": CASES, "SGD_STEPS": CONSTANT,
                                "average_model": SALTED, "bcast_model": SALTED,
                                "global_inputs": SALTED, "hidden_of": INPUT,
                                "scatter_data": SALTED, "sgd_batches": SALTED},
    "mpi_parallel_sgd.probes": {"AVERAGE_CASES": CASES, "BROADCAST_CASES": CASES,
                                "NO_GRAD": CONSTANT, "SCATTER_CASES": CASES, "SGD_CASES": CASES,
                                "bounds_cases": CASES, "converged_cases": CASES,
                                "params_arrays": PROBE, "sgd_model": INPUT, "sgd_run": SALTED,
                                "trained_numel": INPUT},
    "resnet_cifar_data_parallel.probes": {"CONFIG": INPUT, "LAUNCH": CONSTANT,
                                          "ORIGINAL": INPUT, "TRAIN_RUNS": CASES,
                                          "params": PROBE},
    "resnet_cifar_data_parallel.probes_rank": {"RUNS": CASES, "probe_rank_process": PROBE},
    "shared_memory_hogwild.probes": {"BATCH": CONSTANT, "crash_workers": CASES,
                                     "EPOCHS": CONSTANT, "KILL_WORKERS": CONSTANT,
                                     "LR": CONSTANT, "N_SAMPLES": CONSTANT, "SEED": CONSTANT,
                                     "SERIAL_CASES": CASES, "WORKERS": CONSTANT,
                                     "make_model": INPUT, "sampler_cases": CASES,
                                     "task_data": INPUT},
    "torch_distributed_collectives.probes": {"AVG_GROUPS": CASES, "AVG_GROUP_SPLIT": CASES,
                                             "LABEL_CASES": CASES, "PARTITIONER_CASES": CASES,
                                             "avg_batches": SALTED, "avg_cases": CASES,
                                             "avg_model": INPUT, "avg_run": SALTED,
                                             "group_rows": SALTED, "rows": SALTED,
                                             "size_cases": CASES},
    "torch_distributed_collectives.probes_batchnorm": {"BN_STEPS": CONSTANT, "bn_cases": CASES,
                                                       "bn_data": SALTED, "bn_layer": INPUT,
                                                       "bn_rows": SALTED, "bn_run": SALTED},
    "torch_distributed_collectives.probes_ring": {"GROUPS": CASES, "GROUP_CASE0": CONSTANT,
                                                  "GROUP_CASES": CASES, "group_of": INPUT,
                                                  "ring_cases": CASES, "ring_sum": SALTED},
}
ANSWER_LIKE = re.compile(r"ref|expected|order|answer|solution|run|sum", re.I)


def judge_imports(package=PACKAGE):
    """``{student-side module (without exercise_utils.): {names a judge module imports}}`` in
    ``package`` (a copy of exercise_utils: the student side is the real one's)."""
    side = sides.student_side()
    top = package.parent
    mods = {".".join(p.relative_to(top).with_suffix("").parts).removesuffix(".__init__"): p
            for p in package.rglob("*.py")}
    found = {}
    for name, path in mods.items():
        if name in side:
            continue
        parts = (name if path.name == "__init__.py" else name.rsplit(".", 1)[0]).split(".")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = (".".join(parts[:len(parts) - node.level + 1] + [node.module or ""])
                    .rstrip(".") if node.level else node.module or "")
            if base in side and base.count(".") >= 2:      # a notebook's student-side module
                short = base.removeprefix("exercise_utils.")
                found.setdefault(short, set()).update(a.name for a in node.names)
    return found


def unknown(found):
    """The names of ``found`` (:func:`judge_imports`) that ALLOWED does not list."""
    return {m: sorted(n - set(ALLOWED.get(m, {}))) for m, n in found.items()
            if n - set(ALLOWED.get(m, {}))}


def test_the_judge_takes_no_answer_from_the_student_side():
    found = judge_imports()
    assert found, "the scan found nothing: it is broken"
    assert not unknown(found), (
        f"judge modules import these names from modules the ranks can import: "
        f"{unknown(found)}. "
        "Is one a value the judge compares with? Then move it to a judge-side module (no "
        "probe imports it: hidden at grading). Else list it in ALLOWED with what it is")


def test_answer_like_names_are_only_taken_where_salted():
    for module, names in ALLOWED.items():
        for name, kind in names.items():
            if ANSWER_LIKE.search(name) and kind not in (SALTED, CASES, PROBE):
                raise AssertionError(f"{module}.{name} looks like an answer but is listed as "
                                     f"{kind}: a rank could return it")


def test_the_scan_sees_an_answer_moved_back_to_the_student_side(tmp_path):
    """The scan can fail: a copy of the package whose judge takes a new name from a module
    the ranks import (as 10's orders were, in nets) is reported."""
    import shutil
    copy = tmp_path / "exercise_utils"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    checks_pp = copy / "bonus_model_parallel" / "checks_pp.py"
    checks_pp.write_text(checks_pp.read_text() + "\nfrom .probes_pp import BAD_ARGS\n")
    assert unknown(judge_imports(copy)) == {"bonus_model_parallel.probes_pp": ["BAD_ARGS"]}
