"""Notebook 07's benchmark: optimizer-state memory per rank, plain AdamW against your
``ShardedOptimizer`` and ``torch.distributed.optim.ZeroRedundancyOptimizer``.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    MALLOC_MMAP_THRESHOLD_=65536 python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_zero_sharding.bench --work work/07_zero.py \
        --out results/07_zero_bench_2.json

On every rank, for each variant in turn (``adam``: ``torch.optim.AdamW`` over all the
parameters, every rank alike; ``sharded``: ``ShardedOptimizer(params, AdamW)``; ``torch zero``:
``ZeroRedundancyOptimizer(params, AdamW)``), from the same initial weights: gradients of the
rank's own batch, averaged by all-reduce, then ``STEPS`` optimizer steps. Measured per rank:
``state_mb``, the bytes of every tensor in the optimizer state this rank holds (counted in the
optimizers' ``state``, not assumed); ``rss_mb``, the peak growth of the resident memory from
just before the optimizer is built until after its steps (sampled every millisecond: state
plus the step's temporary buffers; ``MALLOC_MMAP_THRESHOLD_`` makes glibc return freed tensors
to the system at once, so the variants, run one after the other, do not hide each other's
memory); ``param_diff``, the largest difference of the final parameters from ``adam``'s.
Rank 0 writes JSON. Used in 07_bonus_zero_sharding (:func:`run`, :func:`table`, :func:`plot`).
"""
import argparse
import gc
import sys
import threading
import time

from ..bench import script_parser
from ..forking import exit_flushed
from ..config import quick

WIDTH = quick(1024, 128)        # hidden features (Linear width x width): 6.3M parameters, 25 MB
DEPTH = 6                       # hidden Linear + ReLU blocks (6: splits evenly over 2 or 3 ranks)
BATCH = 32                      # examples per rank and step
STEPS = quick(3, 2)             # optimizer steps per variant
WORLD_SIZES = quick((1, 2, 3), (1, 3))  # gloo ranks of the launches of run()
VARIANTS = ("adam", "sharded", "torch zero")
THREADS = 1                     # torch threads per rank
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}   # freed tensors go back to the system
PG_TIMEOUT_S = 60               # gloo timeout: a missing collective fails instead of hanging
TIMEOUT = quick(90, 60)         # seconds before a launch is declared hung and killed


def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    return script_parser("optimizer-state memory: AdamW vs ZeRO-1", "work/07_zero.py",
                         "results/07_zero_bench_2.json",
                         {"width": WIDTH, "depth": DEPTH, "batch": BATCH, "steps": STEPS,
                          "threads": THREADS}).parse_args(argv)


def build_model(width, depth):
    """``depth`` blocks Linear(width, width) + ReLU, then Linear(width, 10); seed 0."""
    import torch
    torch.manual_seed(0)
    layers = [m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def make_optimizer(variant, params, zero):
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    if variant == "adam":
        return torch.optim.AdamW(params, lr=1e-3)
    if variant == "sharded":
        return zero.ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3)


def state_bytes(opt):
    """Bytes of the tensors in the optimizer state this rank holds: ``opt``'s own for a plain
    optimizer; else that of every optimizer among its attributes (``.optim``, the local one,
    for yours and for ZeroRedundancyOptimizer)."""
    import torch
    from .probes_base import optimizers
    holders = optimizers(opt) or ([opt] if isinstance(opt, torch.optim.Optimizer) else [])
    return sum(v.numel() * v.element_size() for o in holders for s in o.state.values()
               for v in s.values() if isinstance(v, torch.Tensor))


class PeakRSS:
    """Context manager: ``grown``, the peak resident memory inside it above the value on entry
    (sampled every millisecond by a thread: torch releases the GIL in its kernels)."""

    def __enter__(self):
        import psutil
        self._rss = lambda: psutil.Process().memory_info().rss
        self._stop, self.base = threading.Event(), self._rss()
        self.peak, self._thread = self.base, threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.grown = max(self.peak, self._rss()) - self.base


def measure(variant, zero, args, rank, world):
    """One variant on this rank: {state_mb, rss_mb, final parameters (flat tensor)}."""
    import torch
    import torch.distributed as dist
    model = build_model(args.width, args.depth)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(args.batch, args.width, generator=gen), torch.randint(0, 10, (args.batch,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    gc.collect()
    dist.barrier()
    with PeakRSS() as memory:
        opt = make_optimizer(variant, list(model.parameters()), zero)
        for _ in range(args.steps):
            opt.step()
    param_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    row = {"variant": variant, "world_size": world, "rank": rank, "param_mb": param_mb,
           "state_mb": state_bytes(opt) / 2**20, "rss_mb": memory.grown / 2**20}
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    del opt, model
    gc.collect()
    return row, flat


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import gather_rows
    from ..rankworker import gloo_group, load_student

    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, world):
        start, zero = time.perf_counter(), load_student(args.work)
        for variant in VARIANTS:     # warm-up: code loaded on first use is not the state's
            measure(variant, zero, argparse.Namespace(**dict(vars(args), width=16)), rank, world)
        rows, flats = zip(*[measure(v, zero, args, rank, world) for v in VARIANTS])
        flats = dict(zip(VARIANTS, flats))
        for row in rows:
            row["param_diff"] = float((flats[row["variant"]] - flats["adam"]).abs().max())
        gather_rows(rows, args, world, start)


def run(work="work/07_zero.py", out="results/07_zero_bench.json", world_sizes=WORLD_SIZES,
        extra=(), echo=True, timeout=TIMEOUT):
    """Launch the benchmark on the student's ``work``, once per world size (gloo ranks;
    ``extra``: more script options, e.g. ``--width``), and return all the rows (also written to
    ``out``): variant, world_size, rank, state_mb, rss_mb, param_mb, param_diff.
    :func:`exercise_utils.bench.torchrun_rows` says the rest of the arguments."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work, *extra], timeout, echo,
                         THREADS, env=MALLOC_ENV)


def summary(rows):
    """One row per (variant, world size): the largest rank's numbers, and relative to adam's
    on 1 rank (``state_vs_adam``, ``rss_vs_adam``)."""
    base = next((r for r in rows if r["variant"] == "adam" and r["world_size"] == 1), None)
    from ..bench import per_variant
    out = []
    for world, variant, mine in per_variant(rows, VARIANTS):
        row = {k: max(r[k] for r in mine) for k in ("state_mb", "rss_mb", "param_mb",
                                                    "param_diff")}
        row.update(variant=variant, world_size=world,
                   state_min_mb=min(r["state_mb"] for r in mine))
        for key in ("state", "rss"):
            row[f"{key}_vs_adam"] = (row[f"{key}_mb"] / base[f"{key}_mb"]
                                     if base and base[f"{key}_mb"] else None)
        out.append(row)
    return out


COLUMNS = [("variant", "variant"), ("world_size", "ranks"), ("state_mb", "state MB (max rank)"),
           ("state_min_mb", "state MB (min rank)"), ("state_vs_adam", "state / 1-rank AdamW"),
           ("rss_mb", "peak RSS growth MB"), ("rss_vs_adam", "RSS / 1-rank AdamW"),
           ("param_diff", "|w - w_adam|")]
FORMATS = {"state_mb": ".2f", "state_min_mb": ".2f", "state_vs_adam": ".2f", "rss_mb": ".1f",
           "rss_vs_adam": ".2f", "param_diff": ".1e"}


def table(rows):
    """Text table of :func:`summary`, with the load record."""
    from ..bench import format_table, load_note
    return format_table(summary(rows), COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/07_zero_bench.png"):
    """Two panels of bars per world size: optimizer state and RSS growth (largest rank)."""
    from ..bench import pyplot, save_figure
    plt = pyplot()
    rows, worlds = summary(rows), sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "state_mb", "optimizer state per rank (MB, counted)"),
                           (axes[1], "rss_mb", "resident memory growth per rank (MB)")):
        for i, variant in enumerate(VARIANTS):
            values = [next((r[key] for r in rows if r["variant"] == variant
                            and r["world_size"] == w), 0) for w in worlds]
            ax.bar([j + (i - 1) * 0.27 for j in range(len(worlds))], values, width=0.27,
                   label=variant)
        ax.set(xticks=range(len(worlds)), ylabel=label,
               xticklabels=[f"{w} rank{'s' * (w > 1)}" for w in worlds])
        ax.grid(True, axis="y", alpha=0.3)
    axes[1].legend(loc="upper right")
    fig.suptitle(f"AdamW on a {rows[0]['param_mb']:.1f} MB model: the largest rank's memory")
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_flushed()    # the group is destroyed, the rows written
