"""Config-driven data-parallel training with torch.distributed (gloo), built from the
student's files of notebook 03, reproducing the seed notebook's experiments.

Launch (from the folder that holds ``work/``)::

    torchrun --nproc-per-node 2 -m exercise_utils.torch_distributed_collectives.train --work work \
        --config c.yaml --out r.json

or from Python: ``launch.torchrun("exercise_utils.torch_distributed_collectives.train", 2,
["--work", "work", ...], extra=["-m"])`` (what :func:`.experiments.run_all` does).

``--config`` is a YAML or JSON file with the seed's keys (``size``, ``partition_sizes``,
``custom_partition``, ``lr``, ``momentum``, ``use_batch_norm``, ``async_op``) and any of the
settings below in lower case (``epochs``, ``batch_size``, ``uneven``, ``sync_bn``, ``seed``, ...).
It may hold one run (a mapping) or several (a list, or ``{"runs": [...]}``): the runs share one
launch and one data load, each gets a fresh model and its own process group. Precedence:
the constants below < the config file < options given on the command line.

Uneven batch counts (``uneven``): "hang" = each rank runs its own number of batches (the
seed's code; a synchronous run deadlocks at the end); "min" = every rank runs the smallest
batch count (one all_reduce(MIN)); "join" = every rank runs all its batches inside
``torch.distributed.algorithms.Join``, a finished rank shadowing the others' collectives.
``async_op``: the seed's averaging, ``dist.all_reduce(p.grad, async_op=True)`` never waited
on, then ``p.grad /= size`` and the optimizer step; the script measures what it did.

It imports ``03_partition.py``, ``03_average_gradients.py`` and ``03_sync_batchnorm.py`` from
``--work``. Rank 0 writes ``--out`` (JSON): a list with one entry per run, each holding the
settings and one metrics dict per rank (train/val loss and accuracy, replica divergence, ...).

Used in 03_torch_distributed_collectives.
"""
import argparse
import datetime
import gc
import json
import os
import sys
import time
from pathlib import Path

from ..config import quick
from . import uneven

# Settings (each overridable in --config or on the command line, e.g. --epochs 3).
DATASET = "auto"                    # Fashion-MNIST offline (load_dataset)
TRAIN_SUBSET = quick(6000, 1600)    # training samples shared out between the ranks
TEST_SUBSET = quick(2000, 500)      # validation samples; every rank evaluates all of them
EPOCHS = 1                          # passes over each rank's partition
BATCH_SIZE = 32                     # samples per batch on each rank
LR = 0.05                           # SGD learning rate
MOMENTUM = 0.9                      # SGD momentum (the tutorial used lr 0.01, momentum 0.5)
SIZE = None                         # seed key: expected world size (None: whatever was launched)
PARTITION_SIZES = None              # fractions per rank, e.g. [0.7, 0.3] (None: equal)
CUSTOM_PARTITION = False            # True: label-disjoint partitions (label_partitions)
USE_BATCH_NORM = False              # BatchNorm after each layer (per-rank statistics)
SYNC_BN = False                     # with batch norm: the student's DistributedBatchNorm
ASYNC_OP = False                    # the seed's all_reduce(async_op=True) without wait
UNEVEN = "min"                      # "hang" | "min" | "join" (see above)
SEED = 0                            # model init (same on every rank) and batch order
GLOO_TIMEOUT = quick(30, 20)        # seconds before a collective nobody matches fails
ASYNC_TIMEOUT = 3                   # seconds: timeout of an async_op run's group (unmatched
                                    # all_reduces left by the seed's code fail after it)
FILES = ("03_partition", "03_average_gradients", "03_sync_batchnorm")
DEFAULTS = {k.lower(): v for k, v in globals().items() if k.isupper() and k != "FILES"}


def parse_args(argv=None):
    """Command-line options: --work, --config, --out and one option per setting."""
    p = argparse.ArgumentParser(description="torch.distributed data-parallel training (nb 03)")
    p.add_argument("--work", default="work", help="folder holding the student's 03_*.py files")
    p.add_argument("--config", default=None, help="YAML/JSON file: one run or a list of runs")
    p.add_argument("--out", default=None, help="JSON file for the results (rank 0 writes it)")
    p.add_argument("--name", default=None, help="name of the run in the results")
    for key, value in DEFAULTS.items():
        kind = {bool: _bool, int: int, float: float}.get(type(value), _value)
        p.add_argument("--" + key.replace("_", "-"), dest=key, type=kind, default=None)
    return p.parse_args(argv)


def _bool(text):
    return str(text).lower() in ("1", "true", "yes", "on")


def _value(text):
    """Parse JSON when possible (lists, numbers, null), else keep the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_settings(args):
    """Return the list of runs: DEFAULTS, updated by each config entry, then by the CLI."""
    runs = [{}]
    if args.config:
        text = Path(args.config).read_text()
        import yaml            # JSON is YAML too
        loaded = yaml.safe_load(text)
        loaded = loaded["runs"] if isinstance(loaded, dict) and "runs" in loaded else loaded
        runs = loaded if isinstance(loaded, list) else [loaded]
    cli = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    out = []
    for i, run in enumerate(runs):
        unknown = set(run) - set(DEFAULTS) - {"name", "experiment"}
        if unknown:
            raise SystemExit(f"unknown config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
        settings = {**DEFAULTS, "name": f"run{i}", **run, **cli}
        if args.name:
            settings["name"] = args.name
        if settings["uneven"] not in ("hang", "min", "join"):
            raise SystemExit(f"uneven must be 'hang', 'min' or 'join', got {settings['uneven']!r}")
        out.append(settings)
    return out


def load_work(folder, runs):
    """Import the student's files of notebook 03 that ``runs`` need from ``folder``.

    Returns:
        dict: short name ("partition", ...) -> module (03_sync_batchnorm only when a run
        has ``sync_bn``, so the earlier sections work before that exercise is written).
    """
    from ..rankworker import load_student
    needed = [f for f in FILES if f != "03_sync_batchnorm" or any(r["sync_bn"] for r in runs)]
    missing = [f for f in needed if not (Path(folder) / f"{f}.py").exists()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)} in {folder}: run their %%writefile cells")
    return {f[3:]: load_student(str(Path(folder) / f"{f}.py")) for f in needed}


def my_indices(s, work, y, rank, size):
    """This rank's sample indices, from the student's DataPartitioner or label_partitions."""
    import torch
    from torch.utils.data import TensorDataset
    if s["custom_partition"]:
        return list(work["partition"].label_partitions(y.tolist(), size)[rank])
    fractions = s["partition_sizes"] or [1.0 / size] * size
    if len(fractions) != size:
        raise SystemExit(f"partition_sizes has {len(fractions)} entries for {size} ranks")
    data = TensorDataset(torch.arange(len(y)), y)
    return list(work["partition"].DataPartitioner(data, fractions, seed=1234).partitions[rank])


def train_run(s, work, data, rank, size):
    """Train one run; return this rank's metrics dict."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
        seconds=s["async_timeout"] if s["async_op"] else s["gloo_timeout"]))
    (x, y), (vx, vy) = data
    torch.manual_seed(s["seed"])                          # same initial model on every rank
    from ..models import small_cnn
    model = small_cnn(s["use_batch_norm"])
    if s["use_batch_norm"] and s["sync_bn"]:
        model = work["sync_batchnorm"].convert_batchnorm(model)
    opt = torch.optim.SGD(model.parameters(), lr=s["lr"], momentum=s["momentum"])
    idx = torch.tensor(my_indices(s, work, y, rank, size), dtype=torch.long)
    gen = torch.Generator().manual_seed(s["seed"] * 1000 + rank)
    batches = [b for _ in range(s["epochs"])
               for b in idx[torch.randperm(len(idx), generator=gen)].split(s["batch_size"])]
    if s["uneven"] == "min":
        count = torch.tensor([len(batches)])
        dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
        batches = batches[:int(count)]
    empty_x = x[:0] if s["use_batch_norm"] and s["sync_bn"] else None
    averager = uneven.shadow_class()(model, opt, work["average_gradients"], group, empty_x)
    pending, changed_before, changed_after, done = [], [], [], 0
    start = time.perf_counter()
    from torch.distributed.algorithms.join import Join
    with Join([averager], enable=s["uneven"] == "join"):
        for b in batches:
            try:
                averager.notify()
                opt.zero_grad()
                loss = F.cross_entropy(model(x[b]), y[b])
                loss.backward()
                if s["async_op"]:
                    local = [p.grad.clone() / size for p in model.parameters()]
                    pending += uneven.seed_async_average(model, size, group)
                    changed_before.append(uneven.changed_fraction(model, local))
                    opt.step()
                    changed_after.append(uneven.changed_fraction(model, local))
                else:
                    work["average_gradients"].average_gradients(model, len(b), group=group)
                    opt.step()
            except RuntimeError as err:
                uneven.report_wait(err, f"[rank {rank}] stuck in the gradient all_reduce of "
                                        f"batch {done + 1} of its {len(batches)}")
                raise
            done += 1
    seconds = time.perf_counter() - start
    left = [h for h in pending if not h.is_completed()]
    unmatched, failure = uneven.wait_leftovers(left)
    if s["uneven"] == "hang" and not s["async_op"]:
        try:
            dist.barrier(group=group)                    # the end-of-training synchronisation
        except RuntimeError as err:
            uneven.report_wait(err, f"[rank {rank}] ran all its {done} batches, then stuck in "
                                    "the end-of-training barrier")
            raise
    metrics = {"rank": rank, "samples": len(idx), "batches": done, "seconds": seconds,
               "shadow_steps": averager.shadow_steps, "labels": sorted(set(y[idx].tolist())),
               **evaluate(model, x[idx], y[idx], "train"), **evaluate(model, vx, vy, "val"),
               **divergence(model)}
    if s["async_op"]:
        metrics.update(async_changed_before_step=sum(changed_before) / max(1, len(changed_before)),
                       async_changed_after_step=sum(changed_after) / max(1, len(changed_after)),
                       async_pending_at_end=len(left), async_unmatched=unmatched,
                       async_unmatched_error=failure)
    dist.destroy_process_group(group)
    return metrics


def evaluate(model, x, y, prefix):
    """Mean cross-entropy and accuracy of ``model`` (eval mode) on (x, y), as a dict."""
    import torch
    import torch.nn.functional as F
    model.eval()
    loss = correct = 0.0
    with torch.no_grad():
        for xb, yb in zip(x.split(1000), y.split(1000)):
            out = model(xb)
            loss += F.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
    model.train()
    return {f"{prefix}_loss": loss / len(y), f"{prefix}_acc": correct / len(y)}


def divergence(model):
    """Max |parameter - rank 0's parameter| and the same for buffers (BatchNorm running
    statistics), via a broadcast from rank 0 on the default group."""
    import torch
    import torch.distributed as dist
    out = {}
    for key, tensors in (("param_divergence", list(model.parameters())),
                         ("buffer_divergence", [b.float() for b in model.buffers()])):
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(1)
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        out[key] = (flat - ref).abs().max().item()
    return out


def main(argv=None):
    import torch
    import torch.distributed as dist
    from ..data import load_dataset
    args = parse_args(argv)
    runs = run_settings(args)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=runs[0]["gloo_timeout"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    work = load_work(args.work, runs)
    first = runs[0]
    train = load_dataset(first["dataset"], "train", subset=first["train_subset"], seed=0,
                         verbose=rank == 0)
    test = load_dataset(train.name, "test", subset=first["test_subset"], seed=0, verbose=rank == 0)
    results = []
    for s in runs:
        if s["size"] is not None and int(s["size"]) != size:
            raise SystemExit(f"run {s['name']}: config says size={s['size']} but {size} "
                             "processes were launched")
        m = train_run(s, work, ((train.x, train.y), (test.x, test.y)), rank, size)
        per_rank = [None] * size
        dist.all_gather_object(per_rank, m)
        results.append({"name": s["name"], "settings": s, "world_size": size, "ranks": per_rank})
        if rank == 0:
            print(f"{s['name']}: " + "; ".join(
                f"rank {r['rank']} {r['batches']} batches val acc {r['val_acc']:.3f} "
                f"divergence {r['param_divergence']:.2e}" for r in per_rank), flush=True)
    if rank == 0 and args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    gc.collect()        # free autograd graphs that hold the group now, not at exit (gloo abort)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
