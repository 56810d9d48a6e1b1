"""Notebook 09's benchmark: per-rank memory and step time of DDP, ZeRO-1, your ZeRO-2 and ZeRO-3
and PyTorch's FSDP2, on the same model and data, AdamW.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 -m exercise_utils.bonus_fsdp.bench \
        --work work/09_fsdp.py --out results/09_fsdp_bench_2.json

Variants (each from the same initial weights, ``DEPTH`` blocks Linear + ReLU of ``WIDTH`` and a
head): ``ddp`` (``DistributedDataParallel``, gradients as bucket views, ``AdamW``); ``zero1``
(DDP and ``ZeroRedundancyOptimizer(AdamW)``, ZeRO stage 1); ``zero2`` (your ``Zero2``);
``zero3`` (your ``Zero3``, one unit per block); ``fsdp2`` (``fully_shard`` on each block,
then on the model). Per rank: ``state_mb``, the bytes alive after an optimizer
step above those before the model was built (parameters, gradients, optimizer state:
:mod:`.memory`, counted on the tensors, not assumed); ``peak_mb``, the most alive during one
step, sampled before and after every Linear's forward and after its backward (inside its
unit), after forward, backward and the step
(gathered parameters included; activations saved by autograd are not: the same for every
variant); ``step_ms``, the median of ``STEPS`` steps after ``WARMUP`` (every rank's, then the
slowest rank's median); ``loss``, the last step's. Rank 0 writes JSON.
Used in 09_bonus_fsdp (:func:`run`, :func:`table`, :func:`plot`, :func:`model_mb`).
"""
import argparse
import gc
import sys
import time
import warnings

from ..bench import script_parser
from ..forking import exit_flushed
from ..config import quick

WIDTH = quick(768, 256)         # hidden features: 3.55M parameters (13.5 MiB) in full mode
DEPTH = 6                       # hidden Linear + ReLU blocks: the units of zero3 and fsdp2
BATCH = 32                      # examples per rank and step
WARMUP, STEPS = 2, quick(5, 3)  # steps before timing; timed steps (median)
WORLD_SIZES = quick((1, 2, 3, 4), (2,))   # gloo ranks of the launches of run()
VARIANTS = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
THREADS = 1                     # torch threads per rank
PG_TIMEOUT_S = 60               # gloo timeout: a missing collective fails instead of hanging
TIMEOUT = quick(180, 120)       # seconds before a launch is declared hung and killed
MB = 2 ** 20


def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    return script_parser("memory and step time: DDP, ZeRO-1/2/3, FSDP2", "work/09_fsdp.py",
                         "results/09_fsdp_bench_2.json",
                         {"width": WIDTH, "depth": DEPTH, "batch": BATCH, "steps": STEPS,
                          "threads": THREADS}).parse_args(argv)


def build_model(width, depth):
    """``depth`` blocks (Linear(width, width), ReLU), each a unit of zero3 and fsdp2, and a
    head Linear(width, 10) (the root's); seed 0."""
    import torch
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
              for _ in range(depth)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def prepare(variant, model, student):
    """(module to call, optimizer.step, optimizer.zero_grad) of ``variant``."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    hidden = list(model)[:-1]                   # the blocks: units of zero3 and fsdp2
    if variant in ("ddp", "zero1"):
        net = DDP(model, gradient_as_bucket_view=True)
        opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if variant == "ddp" else
               ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW,
                                       lr=1e-3))
    elif variant == "zero2":
        net, opt = model, student.Zero2(model.parameters(), torch.optim.AdamW, lr=1e-3)
    elif variant == "zero3":
        net = student.Zero3(model, hidden)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in hidden:
            fully_shard(layer)
        net = fully_shard(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    return net, opt.step, opt.zero_grad


def _sampler(model, peak, base):
    """Hooks on every Linear that record the bytes alive into ``peak["mb"]``: before and after
    its forward and after its backward, all inside its unit (while a sharded variant holds the
    unit's parameters gathered)."""
    import torch
    from .memory import Witness, alive_bytes
    witness = Witness()

    def sample(*_):
        if peak["on"]:
            peak["mb"] = max(peak["mb"], (alive_bytes(witness.tensors()) - base) / MB)

    def watch(module, *_):
        if peak["on"]:
            witness.watch(module, ("weight", "bias"))
        sample()
    # The first layer's input needs no gradient, so torch warns that its full backward hook
    # fires on the outputs' gradients only: all this hook does is sample memory, so that is
    # fine (the warning filled a student's output twice a run)
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients "
                            "are computed with respect to module outputs")
    handles = []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            handles += [m.register_forward_pre_hook(watch), m.register_forward_hook(watch),
                        m.register_full_backward_hook(sample)]
    return sample, witness, handles


def measure(variant, student, args, rank, world):
    """One variant on this rank: its row and its final loss."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ..bench import time_it
    from .memory import alive_bytes
    gc.collect()
    base = alive_bytes()
    model = build_model(args.width, args.depth)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    peak = {"on": False, "mb": 0.0}
    sample, witness, handles = _sampler(model, peak, base)
    net, step, zero_grad = prepare(variant, model, student)
    losses = []

    def one_step():
        zero_grad()
        loss = F.cross_entropy(net(x), y)
        sample()
        loss.backward()
        sample()
        step()
        sample()
        losses.append(float(loss.detach()))

    for _ in range(WARMUP):
        one_step()
    peak["on"] = True
    one_step()
    peak["on"] = False
    witness.clear()
    gc.collect()
    state = (alive_bytes() - base) / MB
    times = time_it(one_step, warmup=0, repeats=args.steps, sync=dist.barrier)
    for h in handles:
        h.remove()
    gc.collect()
    return {"variant": variant, "world_size": world, "rank": rank, "state_mb": state,
            "peak_mb": peak["mb"], "step_ms": 1e3 * times["median"],
            "loss": losses[-1], "param_mb": (args.width * (args.width + 1) * args.depth
                                             + 10 * (args.width + 1)) * 4 / MB}


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import gather_rows
    from ..rankworker import gloo_group, load_student
    from .memory import start as start_measuring

    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, world):
        start, student = time.perf_counter(), load_student(args.work)
        small = argparse.Namespace(**dict(vars(args), width=16, steps=1))
        for variant in VARIANTS:         # warm-up: code loaded on first use is not measured
            measure(variant, student, small, rank, world)
        start_measuring()                # what exists now is never counted; scans are fast
        rows = []
        for variant in VARIANTS:
            rows.append(measure(variant, student, args, rank, world))
            if rank == 0:
                print(f"{world} ranks, {variant}: {rows[-1]['step_ms']:.1f} ms per step, "
                      f"peak {rows[-1]['peak_mb']:.1f} MB", flush=True)
        gather_rows(rows, args, world, start)


def run(work="work/09_fsdp.py", out="results/09_fsdp_bench.json", world_sizes=WORLD_SIZES,
        extra=(), echo=True, timeout=TIMEOUT):
    """Launch the benchmark on the student's ``work``, once per world size (gloo ranks;
    ``extra``: more script options, e.g. ``--width``), and return all the rows (also written to
    ``out``): variant, world_size, rank, state_mb, peak_mb, step_ms, loss, param_mb.
    :func:`exercise_utils.bench.torchrun_rows` says the rest of the arguments."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work, *extra], timeout, echo,
                         THREADS, env=None)


def model_mb(variant, param_mb, world):
    """The ZeRO paper's model in fp32 with Adam (4 bytes parameter, 4 gradient, 8 state per
    parameter), as each variant is built here: MB per rank after a step."""
    p, n = param_mb, world
    return {"ddp": 16 * p / 4, "zero1": 8 * p / 4 + 8 * p / 4 / n,
            "zero2": 4 * p / 4 + 16 * p / 4 / n,     # + the shard's own copy (4 / N)
            "zero3": 16 * p / 4 / n, "fsdp2": 16 * p / 4 / n}[variant]


def summary(rows):
    """One row per (variant, world size): the largest rank's numbers, the model's, and your
    ZeRO-3 against FSDP2 (``vs_fsdp2``: peak and step time ratios)."""
    from ..bench import per_variant
    out = []
    for world, variant, mine in per_variant(rows, VARIANTS):
        row = {k: max(r[k] for r in mine) for k in ("state_mb", "peak_mb", "step_ms")}
        row.update(variant=variant, world_size=world, loss=mine[0]["loss"],
                   model_mb=model_mb(variant, mine[0]["param_mb"], world))
        out.append(row)
    for row in out:
        fsdp = next(r for r in out if r["variant"] == "fsdp2"
                    and r["world_size"] == row["world_size"])
        row["peak_vs_fsdp2"] = row["peak_mb"] / fsdp["peak_mb"]
        row["time_vs_fsdp2"] = row["step_ms"] / fsdp["step_ms"]
    return out


COLUMNS = [("variant", "variant"), ("world_size", "ranks"), ("model_mb", "model MB"),
           ("state_mb", "after step MB"), ("peak_mb", "peak MB"),
           ("peak_vs_fsdp2", "peak / FSDP2"), ("step_ms", "step ms"),
           ("time_vs_fsdp2", "time / FSDP2"), ("loss", "last loss")]
FORMATS = {"model_mb": ".1f", "state_mb": ".1f", "peak_mb": ".1f", "peak_vs_fsdp2": ".2f",
           "step_ms": ".1f", "time_vs_fsdp2": ".2f", "loss": ".4f"}


def table(rows):
    """Text table of :func:`summary` (largest rank per variant and world size), with the
    load record."""
    from ..bench import format_table, load_note
    return format_table(summary(rows), COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/09_fsdp_bench.png"):
    """Peak memory and step time per rank against the number of ranks, one line a variant."""
    from ..bench import pyplot, save_figure
    plt = pyplot()
    rows, worlds = summary(rows), sorted({r["world_size"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "peak_mb", "peak memory per rank (MB, measured)"),
                           (axes[1], "step_ms", "step time (ms, slowest rank's median)")):
        for variant in VARIANTS:
            ax.plot(worlds, [next(r[key] for r in rows if r["variant"] == variant
                                  and r["world_size"] == w) for w in worlds], "o-",
                    label=variant)
        ax.set(xlabel="ranks", ylabel=label, xticks=worlds)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle("Per-rank memory and step time, AdamW (CPU, gloo)")
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_flushed()    # the group is destroyed, the rows written
