"""The experiments of notebook 01, run with ``mpiexec`` and summarised as tables and plots.

Each experiment launches :mod:`.train` (or :mod:`.bench`) through
:func:`exercise_utils.launch.mpiexec`, so a hang or crash is killed with all its processes
and reported.

Used in 01_mpi_parallel_sgd and by ``make demo``.
"""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import psutil

from .. import launch
from ..bench import OtherLoad, format_table, line_plot, load_json, load_warning
from ..config import quick
from ..progress import runs
from ..processes import kill_processes

# seconds before a training run is declared hung and killed: the quick runs take 5-20 s alone,
# and one beside two busy processes (the oversubscription table) on a loaded machine had printed
# its final accuracy when 60 s cut it: a slow machine is not a hang
TIMEOUT = quick(900, 300)


def run_training(procs, mode="gradient", work="work", out_dir="results", extra=(), echo=True,
                 timeout=TIMEOUT, name=None, threads=None):
    """Train with ``procs`` MPI processes; return the result dict written by rank 0, with
    ``"others"``: the cores other processes kept busy meanwhile (:class:`..bench.OtherLoad`).

    ``extra`` holds more options of :mod:`.train` (e.g. ``("--epochs", "5")``);
    ``name`` names the JSON file (default: the mode); ``threads``: intra-op threads per
    process (default: the launcher's, cores // processes).
    """
    out = Path(out_dir) / f"01_{name or mode}_n{procs}.json"
    if out.exists():
        out.unlink()
    with OtherLoad() as load:
        launch.mpiexec(f"{__package__}.train", procs, ["--work", work, "--mode", mode, "--out",
                                                       out, *extra], module=True,
                       timeout=timeout, echo=echo, threads_per_process=threads)
    return {**load_json(out), "others": load.cores}


def scaling(procs=(1, 2, 4), work="work", out_dir="results", extra=(), echo=True, threads=1):
    """Train with each process count (gradient averaging); return table rows with speedups.

    Every process gets ``threads`` intra-op threads (default 1, as torchrun sets: one
    process per core, and a busy neighbour costs its share of a core, not 69 times the
    time: see :func:`oversubscription`); None: the launcher's cores // processes.
    Each row also keeps the full result of its run under ``"result"``, and under
    ``"others"`` the cores other processes kept busy during it.
    """
    rows = []
    for n in runs(procs, "scaling"):
        print(f"--- {n} process(es) ---", flush=True)
        r = run_training(n, "gradient", work, out_dir, extra, echo, threads=threads)
        rows.append({"procs": n, "threads": r["threads"], "cores": os.cpu_count(),
                     "steps": r["steps_per_epoch"], "epoch_s": r["median_epoch_seconds"],
                     "accuracy": r["test_accuracy"], "others": r["others"], "result": r})
    for row in rows:
        row["speedup"] = rows[0]["epoch_s"] / row["epoch_s"]
        row["efficiency"] = row["speedup"] / (row["procs"] / rows[0]["procs"])
    return rows


SCALING_COLUMNS = [("procs", "processes"), ("threads", "threads/proc"), ("cores", "cores"),
                   ("others", "busy cores (others)"),
                   ("steps", "steps/epoch"), ("epoch_s", "s/epoch (median)"),
                   ("speedup", "speedup"), ("efficiency", "efficiency"),
                   ("accuracy", "test accuracy")]
SCALING_FORMATS = {"epoch_s": ".2f", "speedup": ".2f", "efficiency": ".0%", "accuracy": ".3f",
                   "others": ".1f"}


def scaling_table(rows):
    """Format :func:`scaling` rows as a text table, with a warning when other processes
    kept the machine busy during a run (then the timings cannot be trusted)."""
    warning = load_warning(rows)
    return format_table(rows, SCALING_COLUMNS, SCALING_FORMATS) + (f"\n{warning}" if warning
                                                                   else "")


@contextlib.contextmanager
def busy_processes(n):
    """A context: ``n`` processes that keep a core busy each (other programs on a laptop),
    killed when the block ends, however it ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              start_new_session=True) for _ in range(n)]
    try:
        yield procs
    finally:
        kill_processes([psutil.Process(p.pid) for p in procs if p.poll() is None])
        for p in procs:
            p.wait()


def oversubscription(threads=(1, 2), neighbours=(0, 2), work="work", out_dir="results",
                     extra=(), echo=False):
    """One training process with 1 and with 2 intra-op threads, alone and beside
    ``neighbours`` busy processes: rows of threads, neighbours, s/epoch and the slowdown
    against the same threads alone."""
    rows = []
    for t in threads:
        alone = None
        for busy in neighbours:
            print(f"--- 1 process, {t} thread(s), {busy} busy process(es) beside it ---",
                  flush=True)
            with busy_processes(busy):
                r = run_training(1, "gradient", work, out_dir, extra, echo,
                                 name=f"threads{t}_busy{busy}", threads=t)
            alone = r["median_epoch_seconds"] if busy == 0 else alone
            rows.append({"threads": t, "neighbours": busy, "epoch_s": r["median_epoch_seconds"],
                         "slowdown": r["median_epoch_seconds"] / alone if alone else None,
                         "others": r["others"]})
    return rows


OVERSUBSCRIPTION_COLUMNS = [("threads", "threads/proc"), ("neighbours", "busy processes beside"),
                            ("others", "busy cores (others)"), ("epoch_s", "s/epoch (median)"),
                            ("slowdown", "slower than alone")]


def oversubscription_table(rows):
    """Format :func:`oversubscription` rows as a text table."""
    return format_table(rows, OVERSUBSCRIPTION_COLUMNS,
                        {"epoch_s": ".2f", "slowdown": ".1f", "others": ".1f"})


def plot_scaling(rows, path="results/01_scaling.png"):
    """Plot measured speedup against linear speedup and the limit of the cores; return the figure."""
    procs = [r["procs"] for r in rows]
    cores = rows[0]["cores"] or 1
    return line_plot({"measured": (procs, [r["speedup"] for r in rows]),
                      "ideal (linear)": (procs, [p / procs[0] for p in procs]),
                      f"best possible with {cores} cores": (
                          procs, [min(p, cores) / min(procs[0], cores) for p in procs])},
                     "MPI processes", "speedup of one epoch", "Data-parallel SGD scaling",
                     path, xticks=procs)


def averaging_comparison(procs=4, work="work", out_dir="results", extra=(), echo=True,
                         gradient=None):
    """Compare gradient averaging with one-shot model averaging; return table rows.

    Three runs: gradient averaging; model averaging from a common start (broadcast);
    model averaging with every rank's own random start (``--no-broadcast``).

    Args:
        gradient: the result of a gradient-averaging run with ``procs`` processes to reuse
            (e.g. from :func:`scaling`); trained anew when None.
    """
    runs = [("gradient", "yes", ()), ("model", "yes", ()), ("model", "no", ("--no-broadcast",))]
    rows = []
    for mode, common, flags in runs:
        r = gradient if mode == "gradient" and gradient else None
        if r is None:
            print(f"--- {mode} averaging, {procs} processes, common start: {common} ---",
                  flush=True)
            r = run_training(procs, mode, work, out_dir, (*extra, *flags), echo,
                             name=f"{mode}_{'bcast' if common == 'yes' else 'own'}")
        local = r["local_test_accuracies"]
        rows.append({"mode": mode, "start": common, "procs": procs, "epochs": len(r["epochs"]),
                     "accuracy": r["test_accuracy"],
                     "local": None if local is None else sum(local) / len(local)})
    return rows


def averaging_table(rows):
    """Format :func:`averaging_comparison` rows as a text table."""
    return format_table(rows, [("mode", "averaging"), ("start", "common start"),
                               ("procs", "processes"),
                               ("epochs", "epochs"), ("local", "mean local-model accuracy"),
                               ("accuracy", "final test accuracy")],
                        {"accuracy": ".3f", "local": ".3f"})


def pickle_vs_buffer(procs=2, out="results/01_pickle_vs_buffer.json", extra=(), echo=True):
    """Run :mod:`.bench`; return its rows."""
    launch.mpiexec(f"{__package__}.bench", procs, ["--out", out, *extra], module=True,
                   timeout=TIMEOUT, echo=echo)
    return load_json(out)["rows"]


def plot_pickle_vs_buffer(rows, path="results/01_pickle_vs_buffer.png"):
    """Plot the median time of each operation against the array size; return the figure."""
    sizes = [r["size_mb"] for r in rows]
    labels = {"bcast_pickle": "comm.bcast (pickle)", "Bcast_buffer": "comm.Bcast (buffer)",
              "allreduce_pickle": "comm.allreduce (pickle)",
              "Allreduce_buffer": "comm.Allreduce (buffer)"}
    return line_plot({label: (sizes, [r[k] * 1e3 for r in rows]) for k, label in labels.items()},
                     "array size (MiB)",
                     "median time (ms)", "mpi4py: pickle (lowercase) vs buffer (uppercase)",
                     path, logx=True, logy=True, xticks=sizes)
