r"""Notebook 10's benchmark: your pipeline's bubble and activation memory against the theory,
your tensor- and pipeline-parallel code against PyTorch's.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_model_parallel.bench \
        --work work/10_model_parallel.py --out results/10_model_parallel_bench_2.json

Rows (flat dicts, ``part`` says which), per launch of p ranks:

* ``bubble``: your ``pipeline_step`` with your ``gpipe_order`` / ``one_f_one_b_order`` on
  stages whose forward lasts ``T_F_MS`` and backward twice that (a sleep after the real compute,
  :class:`.bench_parts.TimedStage`, message latency hidden inside the ops); ``bubble`` = 1 - the
  ranks' busy time / (p x the step's makespan), the median of ``REPS`` steps, against
  ``theory`` = (p-1)/(m+p-1), for every m of ``MICROBATCHES``;
* ``memory``: per stage, the peak bytes of the activations autograd saved for the backward
  (alive at once) in one step of GPipe and of 1F1B with ``MEM_MICROBATCHES`` micro-batches;
  1F1B keeps at most p - s micro-batches in flight on stage s, GPipe all m: ``bound`` = p/m;
* ``library``: ``what="tensor"``: your ``ParallelMLP.from_mlp`` against ``parallelize_module``
  with ``ColwiseParallel`` (fc1) / ``RowwiseParallel`` (fc2) on a CPU ``DeviceMesh``, the same
  MLP weights; ``what="pipeline"``: your ``pipeline_step`` with ``one_f_one_b_order`` against
  ``PipelineStage`` + ``Schedule1F1B`` on the same stack of Linear + Tanh split into p stages.
  Step times interleaved (yours, torch's, ...), a barrier before each step, the slowest rank's,
  medians of ``ITERS``; both losses and the largest gradient difference.

Rank 0 writes JSON. Used in 10_bonus_model_parallel (:func:`run`, :func:`summary`,
:func:`table`, :func:`plot`).
"""
import functools
import statistics
import sys
import time

from ..bench import script_parser
from ..forking import exit_flushed
from ..config import quick

WORLD_SIZES = quick((2, 3), (2,))         # gloo ranks (= pipeline stages) of run()'s launches
SCHEDULES = ("gpipe", "1f1b")
MICROBATCHES = quick((1, 2, 4, 8), (1, 4))  # m of the bubble part
T_F_MS = 30.0             # forward time of a stage (backward: twice that), ms
REPS = quick(3, 2)        # timed steps per (schedule, m) of the bubble part (median)
DEPTH = 6                 # Linear + Tanh blocks of every stack (divisible by 2 and 3)
SMALL_WIDTH, SMALL_BATCH = 16, 32    # the stack of the bubble and memory parts
MEM_MICROBATCHES = 8      # m of the memory part
TP_WIDTH = quick(192, 96)  # d of the MLP(d, 4d) of the tensor-parallel comparison
TP_TOKENS = quick((8, 64), (4, 32))   # its input (batch, sequence)
PP_WIDTH, PP_BATCH = quick(256, 128), quick(64, 32)   # the stack of the pipeline comparison
PP_MICROBATCHES = 4       # m there (Schedule1F1B needs m >= p)
WARMUP, ITERS = 3, quick(30, 8)      # untimed, timed steps of each library comparison
THREADS = 1               # torch threads per rank
PG_TIMEOUT_S = 60         # gloo timeout: a missing message fails instead of hanging
TIMEOUT = quick(150, 100)  # seconds before a launch is declared hung and killed


def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    p = script_parser("pipeline bubble and memory; TP and PP vs torch",
                      "work/10_model_parallel.py", "results/10_model_parallel_bench_2.json",
                      {"reps": REPS, "mem-microbatches": MEM_MICROBATCHES, "tp-width": TP_WIDTH,
                       "pp-width": PP_WIDTH, "pp-batch": PP_BATCH,
                       "pp-microbatches": PP_MICROBATCHES, "iters": ITERS, "threads": THREADS})
    p.add_argument("--t-f-ms", type=float, default=T_F_MS)
    p.add_argument("--microbatches", type=int, nargs="+", default=list(MICROBATCHES))
    return p.parse_args(argv)


def _orders(student):
    return dict(zip(SCHEDULES, (student.gpipe_order, student.one_f_one_b_order)))


def _small_data(first):
    import torch
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(SMALL_BATCH, SMALL_WIDTH, generator=gen)
    return x.requires_grad_(first), torch.randn(SMALL_BATCH, SMALL_WIDTH, generator=gen)


def bubble_rows(student, args, rank, world):
    """Rank 0: one row per (schedule, m); the other ranks: none."""
    import torch.nn.functional as F
    from .bench_parts import Clock, TimedStage, stack, stage_of, timed_step
    x, y = _small_data(True)               # stage 0's backward is timed too: x needs grad
    clock = Clock(args.t_f_ms / 1e3, rank == 0, rank == world - 1)
    stage = TimedStage(stage_of(stack(SMALL_WIDTH, DEPTH), world, rank), clock)
    found = {}
    for rep in range(args.reps + 1):       # rep 0, smallest m only: warm-up
        for m in (args.microbatches if rep else args.microbatches[:1]):
            for name, order in _orders(student).items():
                bubble, makespan, _ = timed_step(clock, lambda: student.pipeline_step(
                    stage, order(world, m, rank), inputs=x, targets=y, loss_fn=F.mse_loss))
                if rep:
                    found.setdefault((name, m), []).append((bubble, makespan))
    rows = []
    for (name, m), runs in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        theory = (world - 1) / (m + world - 1)
        bubble = statistics.median(r[0] for r in runs)
        rows.append({"part": "bubble", "world_size": world, "schedule": name, "m": m,
                     "bubble": bubble, "theory": theory, "rel_err": (bubble - theory) / theory,
                     "bubble_min": min(r[0] for r in runs), "bubble_max": max(r[0] for r in runs),
                     "makespan_ms": 1e3 * statistics.median(r[1] for r in runs),
                     "ideal_ms": 3 * args.t_f_ms * (m + world - 1),
                     "t_f_ms": args.t_f_ms, "reps": len(runs)})
    return rows if rank == 0 else []


def memory_rows(student, args, rank, world):
    """Every rank: the row of its stage."""
    import torch.nn.functional as F
    from .bench_parts import SavedTracker, Tracked, stack, stage_of
    m = args.mem_microbatches
    x, y = _small_data(False)
    inner = stage_of(stack(SMALL_WIDTH, DEPTH), world, rank)
    row = {"part": "memory", "world_size": world, "stage": rank, "m": m,
           "bound": world / m, "theory": min(world - rank, m) / m}
    for name, order in _orders(student).items():
        tracker = SavedTracker(inner.parameters())
        student.pipeline_step(Tracked(inner, tracker), order(world, m, rank), inputs=x,
                              targets=y, loss_fn=F.mse_loss)
        row[f"{name}_bytes"], row[f"{name}_live_after"] = tracker.peak, tracker.live
    row["ratio"] = row["1f1b_bytes"] / row["gpipe_bytes"]
    return [row]


def _progress(world, part, rows, seconds):
    if part == "bubble":
        worst = max(rows, key=lambda r: abs(r["rel_err"]))
        what = (f"worst {worst['bubble']:.3f} vs theory {worst['theory']:.3f} "
                f"({worst['schedule']}, m={worst['m']})")
    elif part == "memory":
        r = rows[0]
        what = f"stage 0: 1F1B / GPipe peak {r['ratio']:.3f} (p/m = {r['bound']:.3f})"
    else:
        what = ", ".join(f"{r['what']} yours / torch {r['ratio']:.2f} (losses differ by "
                         f"{r['loss_diff']:.1e})" for r in rows)
    print(f"{world} ranks, {part}: {what} [{seconds:.0f} s]", flush=True)


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import gather_rows
    from ..rankworker import gloo_group, load_student
    from .bench_parts import library_rows

    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, world):
        start, student = time.perf_counter(), load_student(args.work)
        rows = []
        library = functools.partial(library_rows, depth=DEPTH, warmup=WARMUP, tokens=TP_TOKENS)
        for part, measure in (("bubble", bubble_rows), ("memory", memory_rows),
                              ("library", library)):
            begin = time.perf_counter()
            rows += measure(student, args, rank, world)
            if rank == 0:
                _progress(world, part, [r for r in rows if r["part"] == part],
                          time.perf_counter() - begin)
        gather_rows(rows, args, world, start)


def run(work="work/10_model_parallel.py", out="results/10_model_parallel_bench.json",
        world_sizes=WORLD_SIZES, extra=(), echo=True, timeout=TIMEOUT):
    """Launch the benchmark on the student's ``work``, once per world size (gloo ranks;
    ``extra``: more script options, e.g. ``--reps``), and return all the rows (also written to
    ``out``): flat rows, ``part`` "bubble", "memory" or "library" (see the module docstring).
    :func:`exercise_utils.bench.torchrun_rows` says the rest of the arguments."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work, *extra], timeout, echo,
                         THREADS, env=None)


def summary(rows):
    """``{"bubble": [...], "memory": [...], "library": [...]}``: per (p, m) GPipe's and 1F1B's
    bubble beside the theory; per (p, stage) the memory rows; the library rows, sorted."""
    part = {k: [r for r in rows if r["part"] == k] for k in ("bubble", "memory", "library")}
    bubble = []
    for world, m in sorted({(r["world_size"], r["m"]) for r in part["bubble"]}):
        mine = {r["schedule"]: r for r in part["bubble"] if (r["world_size"], r["m"]) == (world, m)}
        first = next(iter(mine.values()))
        row = {"world_size": world, "m": m, "theory": first["theory"],
               "ideal_ms": first["ideal_ms"]}
        for name, r in mine.items():
            row.update({f"{name}_bubble": r["bubble"], f"{name}_rel_err": r["rel_err"],
                        f"{name}_makespan_ms": r["makespan_ms"]})
        bubble.append(row)
    return {"bubble": bubble,
            "memory": sorted(part["memory"], key=lambda r: (r["world_size"], r["stage"])),
            "library": sorted(part["library"],
                              key=lambda r: (r["world_size"], r["what"] != "tensor"))}


BUBBLE_COLUMNS = [("world_size", "p"), ("m", "m"), ("theory", "(p-1)/(m+p-1)"),
                  ("gpipe_bubble", "GPipe"), ("gpipe_rel_err", "rel. err"),
                  ("1f1b_bubble", "1F1B"), ("1f1b_rel_err", "rel. err"),
                  ("ideal_ms", "ideal ms"), ("gpipe_makespan_ms", "GPipe ms"),
                  ("1f1b_makespan_ms", "1F1B ms")]
MEMORY_COLUMNS = [("world_size", "p"), ("stage", "stage"), ("m", "m"),
                  ("gpipe_bytes", "GPipe peak B"), ("1f1b_bytes", "1F1B peak B"),
                  ("ratio", "1F1B / GPipe"), ("theory", "(p-s)/m"), ("bound", "p/m")]
LIBRARY_COLUMNS = [("what", "parallelism"), ("world_size", "ranks"), ("mine_ms", "yours ms"),
                   ("torch_ms", "torch ms"), ("ratio", "yours / torch"),
                   ("ratio_paired", "paired"), ("loss_mine", "your loss"),
                   ("loss_torch", "torch loss"), ("grad_diff", "max grad diff")]
FORMATS = {"bubble": {"theory": ".3f", "gpipe_bubble": ".3f", "1f1b_bubble": ".3f",
                      "gpipe_rel_err": "+.1%", "1f1b_rel_err": "+.1%",
                      "ideal_ms": ".0f", "gpipe_makespan_ms": ".0f",
                      "1f1b_makespan_ms": ".0f"},
           "memory": {"ratio": ".3f", "theory": ".3f", "bound": ".3f"},
           "library": {"mine_ms": ".1f", "torch_ms": ".1f", "ratio": ".2f",
                       "ratio_paired": ".2f", "loss_mine": ".6f", "loss_torch": ".6f",
                       "grad_diff": ".1e"}}


def table(rows):
    """Three text tables (bubble, activation memory, against torch) of :func:`summary`, with
    the load record."""
    from ..bench import format_table, load_note
    s = summary(rows)
    t_f = next((r["t_f_ms"] for r in rows if r["part"] == "bubble"), T_F_MS)
    return (f"Bubble fraction, measured (per stage and micro-batch: forward {t_f:g} ms, "
            f"backward {2 * t_f:g} ms; ms: a step's makespan)\n"
            + format_table(s["bubble"], BUBBLE_COLUMNS, FORMATS["bubble"])
            + "\n\nActivations saved for the backward, peak bytes per stage\n"
            + format_table(s["memory"], MEMORY_COLUMNS, FORMATS["memory"])
            + "\n\nYours against torch (step time: medians, slowest rank; paired: the median"
            " of each step's yours / torch, the two run in turn step by step, so a load that"
            " comes and goes slows both alike)\n"
            + format_table(s["library"], LIBRARY_COLUMNS, FORMATS["library"])
            + load_note(rows))


def plot(rows, path="results/10_model_parallel_bench.png"):
    """Bubble against m (measured and theory), peak activation memory per stage (GPipe, 1F1B)
    and your step time over torch's."""
    from ..bench import pyplot, save_figure
    plt, s = pyplot(), summary(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    for i, world in enumerate(sorted({r["world_size"] for r in s["bubble"]})):
        mine = [r for r in s["bubble"] if r["world_size"] == world]
        ms = [r["m"] for r in mine]
        dense = [ms[0] * (ms[-1] / ms[0]) ** (k / 40) for k in range(41)]
        ax.plot(dense, [(world - 1) / (m + world - 1) for m in dense], "--", color=f"C{i}",
                label=f"(p-1)/(m+p-1), p={world}")
        for name, marker in (("gpipe", "o"), ("1f1b", "x")):
            ax.plot(ms, [r.get(f"{name}_bubble") for r in mine], marker, color=f"C{i}",
                    markersize=9, fillstyle="none", label=f"{name}, p={world}")
    ax.set(xscale="log", xlabel="micro-batches m", ylabel="bubble fraction",
           title="pipeline bubble (measured: markers)")
    ticks = sorted({r["m"] for r in s["bubble"]})
    ax.minorticks_off()
    ax.set_xticks(ticks, [str(m) for m in ticks])
    ax.legend(fontsize=8)
    mem = s["memory"]
    pos = range(len(mem))
    for shift, name, label in ((-0.2, "gpipe", "GPipe"), (0.2, "1f1b", "1F1B")):
        axes[1].bar([i + shift for i in pos], [r[f"{name}_bytes"] / 1024 for r in mem], 0.4,
                    label=label)
    axes[1].plot([i + 0.2 for i in pos], [r["theory"] * r["gpipe_bytes"] / 1024 for r in mem],
                 "k_", markersize=20, label="(p-s)/m x GPipe (theory)")
    m = mem[0]["m"] if mem else "?"
    axes[1].set(xticks=list(pos), ylabel="KiB", title=f"peak saved activations, m={m}")
    axes[1].set_xticklabels([f"p={r['world_size']} s{r['stage']}" for r in mem])
    axes[1].legend(fontsize=8)
    lib = s["library"]
    axes[2].bar(range(len(lib)), [r["ratio"] for r in lib], color="C2")
    axes[2].axhline(1.0, color="k", lw=1)
    axes[2].set(xticks=range(len(lib)), ylabel="your step time / torch's",
                title="against torch (below 1: yours faster)")
    axes[2].set_xticklabels([f"{r['what']}\n{r['world_size']} ranks" for r in lib])
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.suptitle("Tensor and pipeline parallelism (CPU, gloo)")
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_flushed()    # the group is destroyed, the rows written
