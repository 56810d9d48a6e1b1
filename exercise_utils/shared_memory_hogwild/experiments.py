"""The experiments of notebook 02: Hogwild! against serial training, and the set_epoch demo.

:func:`run` launches :mod:`.train` through :func:`exercise_utils.launch.run` (live output,
hard timeout, every process killed at the end), so no worker process ever runs inside the
notebook kernel. :func:`table` and :func:`plot` summarise its rows.
:func:`epoch_orders` only builds ``DistributedSampler`` objects (no process): it runs in
the kernel.

Used in 02_shared_memory_hogwild.
"""
import sys
from pathlib import Path

from .. import launch
from ..bench import OtherLoad, format_table, load_json, load_note, pyplot, record_load
from ..config import quick

TIMEOUT = quick(480, 240)    # seconds before a training launch is declared hung and killed
RUNS = quick(("serial", "serialx1", "2x1", "4x1", "2x2"), ("serial", "2x1"))


def run(runs=RUNS, work="work", out="results/02_hogwild.json", extra=(), echo=True,
        timeout=TIMEOUT):
    """Train every run of ``runs`` (see :mod:`.train`); return the result rows.

    Each row gets ``speedup``: the first run's time per epoch divided by its own.
    ``extra`` holds more options of the script, e.g. ``("--epochs", "1")``.
    """
    out = Path(out)
    if out.exists():
        out.unlink()
    script = f"{__package__}.train"
    cmd = [sys.executable, "-m", script, "--work", work, "--runs", *runs, "--out", out, *extra]
    with OtherLoad() as load:
        launch.run(cmd, timeout=timeout, echo=echo,
                   what=f"`python -m {script} --runs {' '.join(runs)}`")
    rows = record_load(load_json(out)["rows"], load)
    for row in rows:
        row["speedup"] = rows[0]["epoch_s"] / row["epoch_s"] if row["epoch_s"] else None
    return rows


COLUMNS = [("run", "run"), ("procs", "processes"), ("threads", "threads/proc"),
           ("busy_threads", "threads in all"), ("cores", "cores"), ("startup_s", "start-up s"),
           ("epoch_s", "s/epoch"), ("speedup", "speedup"), ("accuracy", "test accuracy")]
FORMATS = {"startup_s": ".1f", "epoch_s": ".2f", "speedup": ".2f", "accuracy": ".3f"}


def table(rows):
    """Format :func:`run` rows as a text table (processes 0 = serial, in the launched process),
    with the load record (:func:`..bench.load_note`)."""
    return format_table(rows, COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/02_hogwild.png"):
    """Bar charts of time per epoch (plus start-up) and test accuracy per run; return the figure."""
    plt = pyplot()
    labels = [f"{r['run']}\n{max(1, r['procs'])}p x {r['threads']}t" for r in rows]
    xs = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(xs, [r["epoch_s"] for r in rows], label="training, per epoch")
    left.bar(xs, [r["startup_s"] for r in rows], bottom=[r["epoch_s"] for r in rows],
             alpha=0.4, label="start-up (once)")
    left.set(ylabel="seconds", title=f"Time ({rows[0]['cores']} CPU cores)")
    left.legend()
    right.bar(xs, [r["accuracy"] for r in rows], color="tab:green")
    right.set(ylabel="test accuracy", title="Accuracy after the same epochs",
              ylim=(0, 1))
    for ax in (left, right):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def epoch_orders(dataset_len=12, num_replicas=2, epochs=3, set_epoch=True, seed=0):
    """Indices each replica of ``DistributedSampler`` visits in each epoch, as text lines.

    Args:
        set_epoch: call ``sampler.set_epoch(epoch)`` before each epoch (as one should).
    Returns:
        str: one line per (epoch, replica).
    """
    from torch.utils.data import DistributedSampler
    samplers = [DistributedSampler(range(dataset_len), num_replicas=num_replicas, rank=rank,
                                   shuffle=True, seed=seed) for rank in range(num_replicas)]
    lines = [f"set_epoch called: {set_epoch}"]
    for epoch in range(epochs):
        for rank, sampler in enumerate(samplers):
            if set_epoch:
                sampler.set_epoch(epoch)
            lines.append(f"  epoch {epoch}, replica {rank}: {list(sampler)}")
    return "\n".join(lines)
