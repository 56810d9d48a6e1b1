"""The seed notebook's five experiments of notebook 03, run with torchrun and summarised.

Every run launches :mod:`.train` with 2 gloo ranks through
:func:`exercise_utils.launch.torchrun`, so a hang or crash is killed with all its processes
and reported. :func:`run_all` runs all configurations in ONE launch (each torch process
costs seconds to start); :func:`hang_demo` reproduces the uneven-batch deadlock with a short
gloo timeout and shows that nothing survives it.

Used in 03_torch_distributed_collectives.
"""
import json
import os
import re
import time
from pathlib import Path

from .. import launch, processes
from ..bench import format_table, load_json, pyplot
from ..config import quick

TIMEOUT = quick(300, 150)           # seconds before the experiment launch is declared hung
HANG_GLOO_TIMEOUT = quick(5, 3)     # seconds a rank waits in an unmatched collective (demo)
HANG_TIMEOUT = quick(90, 60)        # launcher limit of the hang demo (far above the gloo one)
OUT_DIR = "results/03"

# The seed's config keys (size, partition_sizes, custom_partition, lr, momentum,
# use_batch_norm, async_op) plus this course's (uneven, sync_bn); "experiment" numbers the
# seed experiment a run belongs to. Every run: 2 ranks, same model init, batch 32 per rank.
_BASE = {"size": 2, "lr": 0.05, "momentum": 0.9, "use_batch_norm": False, "async_op": False,
         "custom_partition": False, "partition_sizes": [0.5, 0.5], "uneven": "min"}
SEED_EXPERIMENTS = [{**_BASE, **run} for run in [
    {"experiment": "1 balanced", "name": "balanced 50/50"},
    {"experiment": "2 unbalanced", "name": "70/30, min steps", "partition_sizes": [0.7, 0.3]},
    {"experiment": "2 unbalanced", "name": "70/30, Join", "partition_sizes": [0.7, 0.3],
     "uneven": "join"},
    {"experiment": "3 async_op", "name": "70/30, async_op (seed)", "partition_sizes": [0.7, 0.3],
     "async_op": True, "uneven": "hang"},
    {"experiment": "4 batch norm", "name": "BN, per-rank stats (seed)", "use_batch_norm": True},
    {"experiment": "4 batch norm", "name": "BN, DistributedBatchNorm", "use_batch_norm": True,
     "sync_bn": True},
    {"experiment": "5 label-disjoint", "name": "label-disjoint", "custom_partition": True},
    {"experiment": "5 label-disjoint", "name": "label-disjoint + async_op",
     "custom_partition": True, "async_op": True},
    {"experiment": "5 label-disjoint", "name": "label-disjoint + BN per-rank",
     "custom_partition": True, "use_batch_norm": True},
    {"experiment": "5 label-disjoint", "name": "label-disjoint + DistributedBN",
     "custom_partition": True, "use_batch_norm": True, "sync_bn": True},
]]


def _launch(runs, work, out, timeout, echo, extra=()):
    """Write ``runs`` to a config file next to ``out``, launch dist_train once; return output."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = out.with_suffix(".config.json")
    config.write_text(json.dumps({"runs": list(runs)}, indent=1))
    if out.exists():
        out.unlink()
    script = f"{__package__}.train"
    return launch.torchrun(script, 2, ["--work", str(work), "--config", str(config), "--out",
                                       str(out), *extra], extra=["-m"], timeout=timeout, echo=echo,
                           what=f"`torchrun --nproc-per-node 2 -m {script}`")


def run_all(configs=SEED_EXPERIMENTS, work="work", timeout=TIMEOUT, out=None, echo=True,
            extra=()):
    """Run every configuration, one after the other, in a single 2-rank launch.

    Args:
        configs: list of run settings (see :mod:`.train`).
        work: folder holding the student's 03_*.py files.
        timeout: seconds before the launch is killed (LaunchTimeout).
        out: JSON file for the results (default results/03/experiments.json).
        extra: more dist_train options for every run, e.g. ``("--epochs", "2")``.
    Returns:
        list of dicts, one per configuration: name, settings, world_size, ranks (one metrics
        dict per rank), plus launch_seconds (the wall time of the whole launch).
    """
    out = out or f"{OUT_DIR}/experiments.json"
    start = time.monotonic()
    _launch(configs, work, out, timeout, echo, extra)
    results = load_json(out)
    for r in results:
        r["launch_seconds"] = time.monotonic() - start
    return results


def run_experiment(config, timeout=TIMEOUT, work="work", echo=True):
    """Run one configuration (a dict of settings) in its own launch; return its result dict."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", config.get("name", "run")).strip("_") or "run"
    return run_all([config], work, timeout, f"{OUT_DIR}/{slug}.json", echo)[0]


COLUMNS = [("name", "run"), ("rank", "rank"), ("labels", "labels"), ("samples", "samples"),
           ("batches", "batches"), ("train_loss", "train loss"), ("train_acc", "train acc"),
           ("val_loss", "val loss"), ("val_acc", "val acc"),
           ("param_divergence", "max |param - rank 0|"),
           ("buffer_divergence", "max |BN stats - rank 0|")]
FORMATS = {"train_loss": ".3f", "train_acc": ".3f", "val_loss": ".3f", "val_acc": ".3f",
           "param_divergence": ".1e", "buffer_divergence": ".1e"}


def rows(results):
    """One row (dict) per run and rank, with the columns of :func:`table`."""
    out = []
    for r in results:
        for m in r["ranks"]:
            labels = m["labels"]
            span = f"{labels[0]}-{labels[-1]}" if labels == list(range(labels[0], labels[-1] + 1)) \
                else ",".join(map(str, labels))
            batches = f"{m['batches']}+{m['shadow_steps']} shadow" if m["shadow_steps"] \
                else str(m["batches"])
            out.append({**m, "name": r["name"], "labels": span, "batches": batches})
    return out


def table(results):
    """Format the results of :func:`run_all` as one text table: a row per run and rank."""
    return format_table(rows(results), COLUMNS, FORMATS)


def async_table(results):
    """What the seed's un-waited all_reduce did, per async run and rank (text table)."""
    found = [row for row in rows(results) if "async_changed_before_step" in row]
    return format_table(found, [
        ("name", "run"), ("rank", "rank"), ("batches", "batches"),
        ("async_changed_before_step", "grad changed by all_reduce before step"),
        ("async_changed_after_step", "... right after step"),
        ("async_pending_at_end", "all_reduces pending at end"),
        ("async_unmatched", "never matched (failed)")],
        {"async_changed_before_step": ".1%", "async_changed_after_step": ".1%"})


def plot(results, path=f"{OUT_DIR}/experiments.png"):
    """Bar charts: validation accuracy and replica divergence per run and rank; save a PNG.

    Returns:
        the matplotlib Figure.
    """
    plt = pyplot()
    names = [r["name"] for r in results]
    size = max(r["world_size"] for r in results)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    width = 0.8 / size
    for rank in range(size):
        xs = [i + (rank - (size - 1) / 2) * width for i in range(len(names))]
        ax1.bar(xs, [r["ranks"][rank]["val_acc"] for r in results], width, label=f"rank {rank}")
        ax2.bar(xs, [max(r["ranks"][rank]["param_divergence"], 1e-9) for r in results], width,
                label=f"rank {rank}")
    ax1.axhline(0.5, color="gray", ls="--", lw=1, label="50% (5 of 10 classes)")
    ax1.set(ylabel="validation accuracy", ylim=(0, 1), title="Seed experiments, 2 gloo ranks")
    ax2.set(ylabel="max |param - rank 0| (1e-9 = identical)", yscale="log")
    ax2.set_xticks(range(len(names)))
    ax2.set_xticklabels(names, rotation=30, ha="right")
    for ax in (ax1, ax2):
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def wait_reports(output):
    """The ``[rank R] <where it waited>: <error>`` lines of a launch's output, as (rank, where,
    error) tuples. Not anchored at line starts: another process's partial line (a traceback
    written piece by piece) may precede a report in the shared pipe."""
    return re.findall(r"\[rank (\d+)\] ([^:\n]*): ((?:(?!\[rank \d+\] )[^\n])*)", output)


def hang_demo(timeout=HANG_TIMEOUT, work="work", gloo_timeout=HANG_GLOO_TIMEOUT, echo=True,
              out_dir=OUT_DIR):
    """Run the seed's naive 70/30 training (each rank runs its own number of batches) with a
    short gloo timeout, so the deadlock fails fast; prove no process is left.

    Args:
        timeout: launcher limit (seconds); the gloo timeout should fire long before.
        gloo_timeout: seconds a rank waits in a collective its peer never calls.
        out_dir: folder for the run's config file.
    Returns:
        dict: hung (bool), seconds (the whole launch), gloo_timeout, waits (rank -> where it
        waited, as the rank reported it), error (the gloo error text), killed_by ("gloo
        timeout" or "launcher"), left_processes (pids still alive afterwards: must be []).
    Raises:
        LaunchError: the run failed for another reason than the expected timeout.
    """
    config = {**_BASE, "name": "70/30, naive (hang)", "partition_sizes": [0.7, 0.3],
              "uneven": "hang", "gloo_timeout": gloo_timeout, "train_subset": 1600,
              "test_subset": 200}
    start = time.monotonic()
    result = {"hung": False, "gloo_timeout": gloo_timeout, "waits": {}, "error": None,
              "killed_by": None}
    try:
        _launch([config], work, f"{out_dir}/hang_demo.json", timeout, echo)
    except launch.LaunchTimeout as err:
        result.update(hung=True, killed_by="launcher", error=str(err).splitlines()[0])
    except launch.LaunchError as err:
        found = wait_reports(err.output)
        timeouts = [text for _, _, text in found if "Timed out" in text or "timeout" in text]
        if not timeouts:
            raise                     # not the expected deadlock: do not hide it
        error = re.sub(r"\[/\S+:\d+\] ", "", timeouts[0])      # drop gloo's source location
        result.update(hung=True, killed_by="gloo timeout", error=error,
                      waits={int(rank): where for rank, where, _ in found})
    result["seconds"] = time.monotonic() - start
    mine = f"{os.getpid()}:"
    result["left_processes"] = [p.pid for p in processes.tagged_processes(
        lambda tag: tag.startswith(mine))]
    return result
