"""More workers, fewer steps: notebook 05's accuracy drop and its fix (linear scaling, warm-up).

A torchrun script that trains :class:`~exercise_utils.models.DropoutNet` on a Fashion-MNIST
subset with ``DistributedDataParallel`` (gloo, CPU), ``DistributedSampler`` + ``set_epoch`` and
``B`` examples per worker and step, so ``k`` workers take ``k`` times fewer steps per epoch::

    python -m torch.distributed.run --nproc-per-node 4 \
        -m exercise_utils.ddp_torchrun_fault_tolerance.lr_scaling --rule linear --warmup-epochs 1 \
        --out results/05_lr_k4.json

``--rule none`` keeps the base learning rate whatever ``k`` (the seed report's setting);
``--rule linear`` multiplies it by ``k`` (Goyal et al. 2017, "Accurate, Large Minibatch SGD"),
reached by a per-step linear warm-up from the base rate over ``--warmup-epochs``.
``--seeds 0 1 2`` trains one run per seed in the same launch (start-up is paid once).
Rank 0 evaluates on the test subset and writes one JSON row per seed to ``--out``.

:func:`run` launches it (via :func:`exercise_utils.launch.torchrun`: live output, hard timeout,
no process left behind), :func:`sweep` runs the notebook's comparison, :func:`summary`,
:func:`table` and :func:`plot` present it. Used in 05_ddp_torchrun_fault_tolerance.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

from ..bench import pyplot, save_figure
from ..config import quick
from ..progress import Marks, runs

TRAIN_SIZE = quick(8000, 512)   # training examples shared by the workers
TEST_SIZE = quick(10000, 500)   # test examples (rank 0 evaluates)
EPOCHS = quick(3, 1)            # passes over the training subset
BATCH = 32                      # examples per worker and step (the "per-GPU batch")
BASE_LR = 0.01                  # learning rate of 1 worker (SGD with momentum)
MOMENTUM = 0.9
WARMUP_EPOCHS = 2.0             # warm-up of the fixed setting (epochs; 1 left k=4 ~0.8 point low)
DECAY = "cosine"                # after the warm-up: "cosine" (to 0 at the end) or "none" (constant)
SEEDS = quick((0, 1, 2), (0,))  # one run per seed (init, data order, dropout): shows the noise
WORKERS = quick((1, 2, 4), (1, 2))   # worker counts of the sweep
THREADS = 1                     # torch threads per worker (4 workers on 2 cores: oversubscribed)
PG_TIMEOUT_S = 60               # gloo timeout: a missing collective fails instead of hanging
TIMEOUT = quick(300, 120)       # seconds before a launch is declared hung and killed


def lr_at(step, steps_per_epoch, k, rule="none", base_lr=BASE_LR, warmup_epochs=0.0,
          total_steps=None):
    """Learning rate of optimizer step ``step`` (0-based) for ``k`` workers.

    Args:
        step: optimizer steps already taken.
        steps_per_epoch: steps per epoch of this run (it shrinks as ``k`` grows).
        k: number of workers.
        rule: "none" (``base_lr`` whatever ``k``) or "linear" (target ``base_lr * k``).
        base_lr: learning rate of one worker.
        warmup_epochs: length of the warm-up in epochs (may be fractional); during it the
            rate rises linearly per step from ``base_lr`` (step 0) to the target (reached at
            step ``round(warmup_epochs * steps_per_epoch)`` and kept after). With
            ``rule="none"`` the target is ``base_lr`` so warm-up changes nothing.
        total_steps: steps of the whole run; when given, after the warm-up the rate decays
            from the target to 0 along a half cosine, reaching 0 at ``total_steps`` (the same
            decay in every setting: it removes most of the seed-to-seed noise of the final
            weights). ``None``: constant after the warm-up.
    Returns:
        float: the learning rate.
    """
    if rule not in ("none", "linear"):
        raise ValueError(f"rule must be 'none' or 'linear', got {rule!r}")
    target = base_lr * k if rule == "linear" else base_lr
    warmup_steps = round(warmup_epochs * steps_per_epoch)
    if step < warmup_steps:
        return base_lr + (target - base_lr) * step / warmup_steps
    if total_steps is None or total_steps <= warmup_steps:
        return target
    done = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return target * 0.5 * (1 + math.cos(math.pi * done))


def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    p = argparse.ArgumentParser(description="DDP: accuracy vs workers and the linear scaling rule")
    p.add_argument("--rule", choices=("none", "linear"), default="none")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--decay", choices=("cosine", "none"), default=DECAY)
    p.add_argument("--base-lr", type=float, default=BASE_LR)
    p.add_argument("--momentum", type=float, default=MOMENTUM)
    p.add_argument("--batch", type=int, default=BATCH, help="examples per worker and step")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--train-size", type=int, default=TRAIN_SIZE)
    p.add_argument("--test-size", type=int, default=TEST_SIZE)
    p.add_argument("--data", default="fashion-mnist", help="fashion-mnist or synthetic")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--out", default="results/05_lr_scaling.json")
    return p.parse_args(argv)


def train_one(args, seed, train, test, rank, k):
    """Train one DDP run with ``seed``; return its result row (accuracy only on rank 0)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from ..models import DropoutNet

    torch.manual_seed(seed)                       # same initial weights everywhere (DDP also
    model = DDP(DropoutNet())                     # broadcasts rank 0's at construction)
    torch.manual_seed(seed * 1000 + rank + 1)     # then a different dropout stream per rank
    data = TensorDataset(train.x, train.y)
    sampler = DistributedSampler(data, num_replicas=k, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    steps_per_epoch = len(loader)
    total = steps_per_epoch * args.epochs if args.decay == "cosine" else None
    schedule = dict(steps_per_epoch=steps_per_epoch, k=k, rule=args.rule, base_lr=args.base_lr,
                    warmup_epochs=args.warmup_epochs, total_steps=total)
    opt = torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=args.momentum)
    step, losses, lrs = 0, [], []
    start = time.perf_counter()
    marks = Marks(enabled=rank == 0)              # the notebook's progress bar
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)                  # a new shuffle each epoch, same on all ranks
        model.train()
        seen = torch.zeros(2)
        marks.stage(f"seed {seed} epoch {epoch + 1}/{args.epochs}", len(loader))
        for i, (x, y) in enumerate(loader, start=1):
            lr = lr_at(step, **schedule)
            lrs.append(lr)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()                       # DDP averages the gradients over the k ranks
            opt.step()
            seen += torch.tensor([loss.item() * len(y), len(y)])
            step += 1
            marks.update(i)
        dist.all_reduce(seen)
        losses.append(float(seen[0] / seen[1]))
        if rank == 0:
            print(f"seed {seed} epoch {epoch + 1}/{args.epochs}: train loss {losses[-1]:.4f}, "
                  f"lr {lr:.4g}, {step} steps", flush=True)
    train_s = time.perf_counter() - start
    row = {"workers": k, "rule": args.rule, "warmup_epochs": args.warmup_epochs,
           "decay": args.decay, "base_lr": args.base_lr,
           "peak_lr": args.base_lr * (k if args.rule == "linear" else 1),
           "momentum": args.momentum, "batch": args.batch, "global_batch": args.batch * k,
           "steps_per_epoch": steps_per_epoch, "steps": step, "epochs": args.epochs,
           "train_size": len(train), "test_size": len(test), "seed": seed,
           "train_loss": losses, "lr": lrs, "train_s": train_s,
           "threads": torch.get_num_threads()}
    if rank == 0:
        model.module.eval()
        with torch.no_grad():
            out = model.module(test.x)
        row["test_loss"] = float(F.nll_loss(out, test.y))
        row["accuracy"] = float((out.argmax(1) == test.y).float().mean())
        print(f"seed {seed}: {k} worker(s), rule {args.rule}: test accuracy "
              f"{row['accuracy']:.4f} after {step} steps ({train_s:.1f} s)", flush=True)
    return row


def main(argv=None):
    """Entry point of every worker started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import save_json
    from ..data import load_dataset
    from ..rankworker import gloo_group

    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, k):
        train = load_dataset(args.data, "train", subset=args.train_size, seed=0, verbose=rank == 0)
        test = load_dataset(args.data, "test", subset=args.test_size, seed=0, verbose=rank == 0)
        rows = [train_one(args, seed, train, test, rank, k) for seed in args.seeds]
        if rank == 0:
            save_json(args.out, {"rows": rows})


# ----------------------------------------------------------------- notebook side (no DDP here)

def run(k, rule="none", warmup_epochs=0.0, seeds=SEEDS, out=None, extra=(), echo=True,
        timeout=TIMEOUT):
    """Launch the script on ``k`` workers (one thread each); return its rows (one per seed).

    Args:
        k: workers (torchrun ``--nproc-per-node``).
        rule, warmup_epochs: see :func:`lr_at`.
        seeds: one training run per seed, all in this launch.
        out: JSON path (default ``results/05_lr_k{k}_{rule}.json``).
        extra: more script options, e.g. ``("--epochs", "2", "--base-lr", "0.02")``.
    Returns:
        list[dict]: rows with workers, rule, steps_per_epoch, peak_lr, accuracy, ...;
        ``wall_s`` is the whole launch (start-up included) divided by the number of seeds.
    """
    from .. import launch
    out = Path(out or f"results/05_lr_k{k}_{rule}.json")
    if out.exists():
        out.unlink()
    args = ["--rule", rule, "--warmup-epochs", str(warmup_epochs), "--threads", str(THREADS),
            "--seeds", *map(str, seeds), "--out", str(out), *map(str, extra)]
    res = launch.torchrun(__name__, k, args, extra=["-m"], timeout=timeout, echo=echo,
                          threads_per_process=THREADS,
                          what=f"`torchrun --nproc-per-node {k} -m {__name__} --rule {rule}`")
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        row["wall_s"] = res.seconds / len(rows)
    return rows


def sweep(workers=WORKERS, seeds=SEEDS, warmup_epochs=WARMUP_EPOCHS, extra=(), echo=False,
          timeout=TIMEOUT):
    """The notebook's comparison: 1 worker, then each k > 1 in the seed's setting (rule none)
    and with the linear rule + warm-up. For k = 1 both settings are the same run (shared).

    Returns:
        list[dict]: the rows of :func:`run`, each with ``setting`` ("1 worker", "seed: same lr",
        "linear + warm-up").
    """
    rows, plans = [], []
    for k in workers:
        plans += [(k, "none", 0.0, "1 worker")] if k == 1 else [
            (k, "none", 0.0, "seed: same lr"), (k, "linear", warmup_epochs, "linear + warm-up")]
    for k, rule, warm, setting in runs(plans, "learning-rate sweep"):
        for row in run(k, rule, warm, seeds, extra=extra, echo=echo, timeout=timeout):
            row["setting"] = setting
            rows.append(row)
            print(f"{setting:>16}, k={k}, seed {row['seed']}: accuracy "
                  f"{row['accuracy']:.4f}", flush=True)
    return rows


def summary(rows):
    """One row per (setting, workers): accuracy mean, min, max over seeds and the gap to 1 worker
    (in points; 1-worker mean minus this mean, over the same seeds)."""
    groups = {}
    for r in rows:
        groups.setdefault((r.get("setting", r["rule"]), r["workers"]), []).append(r)
    ref = {r["seed"]: r["accuracy"] for r in rows if r["workers"] == 1}
    out = []
    for (setting, k), rs in groups.items():
        accs = [r["accuracy"] for r in rs]
        mean = sum(accs) / len(accs)
        base = [ref[r["seed"]] for r in rs if r["seed"] in ref]
        gap = 100 * (sum(base) / len(base) - mean) if len(base) == len(rs) else None
        out.append({"setting": setting, "workers": k, "global_batch": rs[0]["global_batch"],
                    "steps_per_epoch": rs[0]["steps_per_epoch"], "peak_lr": rs[0]["peak_lr"],
                    "seeds": len(rs), "accuracy": mean, "acc_min": min(accs),
                    "acc_max": max(accs), "gap_points": gap,
                    "wall_s": sum(r["wall_s"] for r in rs) / len(rs)})
    return out


COLUMNS = [("setting", "setting"), ("workers", "workers"), ("global_batch", "global batch"),
           ("steps_per_epoch", "steps/epoch"), ("peak_lr", "lr"), ("seeds", "seeds"),
           ("accuracy", "test accuracy (mean)"), ("acc_min", "min"), ("acc_max", "max"),
           ("gap_points", "drop vs 1 worker (points)"), ("wall_s", "s per run")]
FORMATS = {"peak_lr": ".3g", "accuracy": ".4f", "acc_min": ".4f", "acc_max": ".4f",
           "gap_points": "+.2f", "wall_s": ".1f"}


def table(rows):
    """Text table of :func:`sweep` rows, summarised over seeds by :func:`summary`."""
    from ..bench import format_table
    return format_table(summary(rows), COLUMNS, FORMATS)


def plot(rows, path="results/05_lr_scaling.png"):
    """Test accuracy against workers, one line per setting (mean over seeds, min-max bars)."""
    plt = pyplot()
    summ = summary(rows)
    one = [s for s in summ if s["workers"] == 1]
    fig, ax = plt.subplots(figsize=(6, 4))
    for setting in ("seed: same lr", "linear + warm-up"):
        pts = sorted(one + [s for s in summ if s["setting"] == setting], key=lambda s: s["workers"])
        ax.errorbar([s["workers"] for s in pts], [100 * s["accuracy"] for s in pts],
                    yerr=[[100 * (s["accuracy"] - s["acc_min"]) for s in pts],
                          [100 * (s["acc_max"] - s["accuracy"]) for s in pts]],
                    marker="o", capsize=4, label=setting)
    ax.set(xlabel="workers k (per-worker batch fixed)", ylabel="test accuracy (%)",
           title="Same epochs, k workers", xticks=sorted({s["workers"] for s in summ}))
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
