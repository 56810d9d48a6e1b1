"""Experiments of notebook 04: time per epoch and accuracy for 1, 2 (and 4) ranks.

:func:`compare` launches the student's ``work/04_cifar_dp.py`` once per (world size, batch)
pair through :func:`exercise_utils.launch.run` (live output, hard timeout, every process
killed at the end) and collects rank 0's JSON summaries. :func:`allreduce_cost` times what one training step
communicates (one all-reduce per parameter tensor, as in the exercise) in 2 gloo processes::

    torchrun --nproc-per-node 2 -m exercise_utils.resnet_cifar_data_parallel.experiments \
        --width 16 --out c.json

Used in 04_resnet_cifar_data_parallel.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from .. import launch, progress
from ..bench import (OtherLoad, format_table, load_json, load_note, pyplot, save_figure,
                     save_json)
from ..config import quick

TIMEOUT = quick(300, 120)    # seconds before a training launch is declared hung and killed
# (world size, batch) of each run: the batch scaled with the world size (minibatch 64 per
# rank), and one rank with the 2-rank batch, which separates the batch's effect from the ranks'.
RUNS = quick([(1, 64), (1, 128), (2, 128)], [(1, 64), (2, 128)])
# The seed's measurements (one NVIDIA V100 per rank, full CIFAR-10, 10 epochs, fp16).
SEED_REFERENCE = [dict(gpus=1, batch=512, seconds=30), dict(gpus=2, batch=512, seconds=22),
                  dict(gpus=4, batch=512, seconds=22), dict(gpus=4, batch=1024, seconds=11)]


def run(script, world_size, results, preset="cpu", echo=True, timeout=TIMEOUT, **settings):
    """Train once with ``world_size`` ranks; return rank 0's summary (see :func:`.runner.main`).

    ``settings`` override the preset, e.g. ``batch_size=256, epochs=1``.
    """
    results = Path(results)
    if results.exists():
        results.unlink()
    flags = [f for k, v in settings.items() for f in ("--" + k.replace("_", "-"), str(v))]
    cmd = [sys.executable, str(script), "--world-size", str(world_size), "--preset", preset,
           "--results", str(results), *flags]
    with OtherLoad() as load:
        launch.run(cmd, timeout=timeout, echo=echo, nprocs=world_size,
                   what=f"{script} with {world_size} rank(s)")
    record = load_json(results)
    return {**record["summary"], "config": record["config"], "others": load.cores,
            "cores": os.cpu_count()}


def compare(script, runs=RUNS, preset="cpu", folder="results/04", **settings):
    """Train once per (world size, batch) pair of ``runs``; return rank 0's summaries."""
    return [run(script, w, Path(folder) / f"run_w{w}_b{b}.json", preset=preset, batch_size=b,
                **settings) for w, b in progress.runs(runs, "runs")]


def rows(summaries):
    """Table rows: the last epoch's time (the first includes warm-up), speed relative to the
    first run, last training loss and validation accuracy."""
    out = []
    for s in summaries:
        last = s["epochs"][-1]
        out.append(dict(ranks=s["world_size"], device=s["device"], batch=s["batch_size"],
                        minibatch=s["minibatch_size"], steps=s["minibatches_per_epoch"],
                        epoch_s=last["time_s"], loss=last["train_loss"], accuracy=last["val_acc"],
                        others=s.get("others"), cores=s.get("cores")))
    for r in out:
        r["speed"] = out[0]["epoch_s"] / r["epoch_s"]
    return out


COLUMNS = [("ranks", "ranks"), ("device", "device"), ("batch", "batch"),
           ("minibatch", "minibatch/rank"), ("steps", "steps/epoch"), ("epoch_s", "s/epoch"),
           ("speed", "speed vs 1st"), ("loss", "train loss"), ("accuracy", "val accuracy")]
FORMATS = {"epoch_s": ".1f", "speed": ".2f", "loss": ".3f", "accuracy": ".3f"}


def table(summaries):
    """The measured runs as a text table (last epoch), with the load record."""
    measured = rows(summaries)
    return format_table(measured, COLUMNS, FORMATS) + load_note(measured)


def seed_table():
    """The seed's V100 figures with their speed-up over one GPU."""
    ref = [dict(r, speedup=SEED_REFERENCE[0]["seconds"] / r["seconds"]) for r in SEED_REFERENCE]
    return format_table(ref, [("gpus", "GPUs"), ("batch", "batch"), ("seconds", "s (10 epochs)"),
                              ("speedup", "speed-up")], {"speedup": ".2f"})


def plot(summaries, path="results/04/runs.png"):
    """Seconds per epoch (bars) and training loss per epoch (lines) of each run; save a PNG."""
    plt = pyplot()
    labels = [f"{s['world_size']} rank{'s' if s['world_size'] > 1 else ''}, batch "
              f"{s['batch_size']}" for s in summaries]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(range(len(summaries)), [s["epochs"][-1]["time_s"] for s in summaries])
    a.set_xticks(range(len(summaries)))
    a.set_xticklabels(labels, fontsize=8)
    a.set(ylabel="seconds (last epoch)", title="time per epoch")
    for label, s in zip(labels, summaries):
        b.plot([e["epoch"] for e in s["epochs"]], [e["train_loss"] for e in s["epochs"]],
               marker="o", label=label)
    b.set(xlabel="epoch", ylabel="training loss (rank 0)", title="learning per epoch")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.grid(True, alpha=0.3)
    save_figure(fig, path)
    return path


def allreduce_cost(width, world_size=2, out="results/04/allreduce.json", echo=False,
                   timeout=quick(120, 60)):
    """Seconds per training step spent in the gradient all-reduces (median, slowest rank)."""
    launch.torchrun(__name__, world_size, ["--width", str(width), "--out", str(out)],
                    extra=["-m"], echo=echo, timeout=timeout)
    return load_json(out)


def _bench_allreduce(width, out, repeats=quick(20, 5)):
    """In each torchrun worker: time one step's per-parameter all-reduces of the model."""
    import datetime
    import torch
    import torch.distributed as dist
    from .. import models
    from . import tricks
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    whitening = tricks.patch_whitening(torch.randn(64, 3, 32, 32))
    grads = [torch.randn_like(p) for p in models.ResNetBagOfTricks(whitening, width=width)
             .parameters() if p.requires_grad]
    times = []
    for i in range(repeats + 3):
        dist.barrier()
        start = time.perf_counter()
        for g in grads:
            dist.all_reduce(g)
        times.append(time.perf_counter() - start)
    slowest = [None] * dist.get_world_size()
    dist.all_gather_object(slowest, statistics.median(times[3:]))
    if dist.get_rank() == 0:
        save_json(out, dict(width=width, world_size=dist.get_world_size(), tensors=len(grads),
                            megabytes=sum(g.numel() for g in grads) * 4 / 1e6,
                            seconds_per_step=max(slowest)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="time one step's gradient all-reduces")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--out", default="results/04/allreduce.json")
    args = parser.parse_args()
    _bench_allreduce(args.width, args.out)
