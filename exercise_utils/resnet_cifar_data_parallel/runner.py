"""Settings, launcher and small helpers of the data-parallel CIFAR-10 trainer (notebook 04).

The student's ``work/04_cifar_dp.py`` holds ``rank_process`` and ``train``; its last lines
call :func:`main`, which parses the settings, starts one process per rank with
``torch.multiprocessing.spawn`` and writes rank 0's summary to ``--results`` (JSON)::

    python work/04_cifar_dp.py --world-size 2 --preset cpu --results work/04_run.json

Presets: ``gpu`` is the seed's run (all 50,000 CIFAR-10 images, width-64 network, batch 512,
10 epochs, bfloat16 autocast); ``cpu`` is a smoke run that fits a 2-core laptop (a subset,
a narrow network, 3 epochs); ``auto`` picks ``gpu`` when CUDA is available. Every setting
below can be overridden on the command line (``--epochs 3``, ``--data synthetic-cifar10``).
``--data auto`` uses CIFAR-10 when a local copy exists (``$DTFS_DATA``, the download cache)
and otherwise the clearly labelled synthetic stand-in; ``--data cifar10`` downloads it.

Used in 04_resnet_cifar_data_parallel.
"""
import argparse
import contextlib
import dataclasses
import json
import os
from pathlib import Path

from ..forking import exit_flushed
from ..config import quick


@dataclasses.dataclass
class TrainConfig:
    """Every setting of one training run (picklable: it travels to the ranks)."""
    data: str = "auto"              # "cifar10" | "synthetic-cifar10" | "auto" (see above)
    data_root: str = None           # folder holding cifar-10-batches-py (None: the usual places)
    train_size: int = None          # training examples used (None: all 50,000)
    test_size: int = None           # validation examples (None: all 10,000)
    epochs: int = 10                # passes over each rank's slice
    batch_size: int = 512           # examples per optimizer step, all ranks together
    width: int = 64                 # channels of the first block (64 = the seed's network)
    ghost_size: int = 32            # examples per ghost batch of the BatchNorm layers
    lr: float = 0.4                 # peak learning rate for the mean loss (warm-up, then decay)
    weight_decay: float = 5e-4      # per example; biases get 1/64 of it and 64x the lr
    label_smoothing: float = 0.2
    ema_momentum: float = 0.99      # EMA of the weights, used for validation
    ema_every: int = 5              # optimizer steps between EMA updates
    whitening_examples: int = 10000  # first training examples the whitening is computed from
    augment: bool = True            # random crop (pad 4) and horizontal flip
    amp: bool = True                # bfloat16 autocast on CUDA (ignored on CPU)
    seed: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    timeout_s: float = 120          # gloo/NCCL timeout: a rank left waiting fails after it
    threads: int = 0                # CPU threads per rank (0: cores // world size)


PRESETS = {
    "gpu": {},
    "cpu": dict(train_size=quick(2048, 512), test_size=quick(1000, 256), epochs=quick(3, 1),
                batch_size=128, width=16, ghost_size=32, ema_every=1, whitening_examples=2048),
}


def choose_backend(world_size, rank):
    """Return ``(backend, device)`` for this rank.

    NCCL when CUDA has at least ``world_size`` GPUs (rank r on ``cuda:r``); otherwise gloo,
    on ``cuda:0`` when there is a GPU (the ranks share it; gloo stages through host memory),
    else on the CPU.
    Used in 04_resnet_cifar_data_parallel.
    """
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        torch.cuda.set_device(rank)
        return "nccl", torch.device("cuda", rank)
    if torch.cuda.is_available():
        return "gloo", torch.device("cuda", 0)
    return "gloo", torch.device("cpu")


def cifar10_found(root=None):
    """Whether a local CIFAR-10 copy exists (``root``, ``$DTFS_DATA``, the download cache)."""
    from .. import data
    try:
        data._locate("cifar10", "train", root, download=False)
        return True
    except data.DatasetError:
        return False


def resolve_data(name, root=None):
    """Turn ``"auto"`` into "cifar10" (a local copy exists) or "synthetic-cifar10"."""
    if name != "auto":
        return name
    return "cifar10" if cifar10_found(root) else "synthetic-cifar10"


def load_data(config, split, verbose=True):
    """Load the train or test split the config names (the same data on every rank)."""
    from .. import data
    size = config.train_size if split == "train" else config.test_size
    name = resolve_data(config.data, config.data_root)
    ds = data.load_dataset(name, split, root=config.data_root, subset=size, seed=config.seed,
                           verbose=verbose)
    if ds.x.shape[1:] != (3, 32, 32):
        raise ValueError(f"{name} has images of shape {tuple(ds.x.shape[1:])}; "
                         "this trainer needs CIFAR-shaped 3x32x32 images")
    return ds


def synchronize(device):
    """Wait for queued GPU work, so that timings are honest (no-op on CPU)."""
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, config):
    """bfloat16 autocast on CUDA when ``config.amp``; a no-op context on CPU."""
    import torch
    if config.amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def epoch_record(epoch, seconds, train_loss, accuracy):
    """Print the leader's log line for an epoch and return it as a dict."""
    print(f"epoch {epoch}: {seconds:6.1f} s, training loss {train_loss:.3f} (rank 0's "
          f"minibatches), validation accuracy {accuracy:.3f} (EMA model)", flush=True)
    return dict(epoch=epoch, time_s=seconds, train_loss=train_loss, val_acc=accuracy)


def summary(rank, world_size, config, device, examples, minibatch_size, steps, history):
    """What ``train`` returns: sizes and counts of this rank (and the leader's epochs)."""
    return dict(rank=rank, world_size=world_size, device=str(device), examples=examples,
                batch_size=config.batch_size, minibatch_size=minibatch_size,
                minibatches_per_epoch=steps, data=resolve_data(config.data, config.data_root),
                epochs=history)


def make_config(preset="auto", **overrides):
    """A ``TrainConfig`` from a preset ("auto", "cpu", "gpu") and explicit overrides."""
    if preset == "auto":
        import torch
        preset = "gpu" if torch.cuda.is_available() else "cpu"
    if preset not in PRESETS:
        raise ValueError(f"preset must be 'auto', 'cpu' or 'gpu', got {preset!r}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; known: {sorted(fields)}")
    return TrainConfig(**{**PRESETS[preset], **overrides})


def parse_args(argv=None):
    """Return (world_size, results path, TrainConfig) from the command line."""
    p = argparse.ArgumentParser(description="Data-parallel CIFAR-10 ResNet (notebook 04)")
    p.add_argument("--world-size", type=int, default=2, help="number of ranks (processes)")
    p.add_argument("--preset", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--results", default=None, help="JSON file for rank 0's summary")
    for f in dataclasses.fields(TrainConfig):
        kind = {bool: _bool, int: int, float: float}.get(f.type, str)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=None)
    args = p.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name) is not None}
    if args.world_size < 1:
        p.error("--world-size must be at least 1")
    return args.world_size, args.results, make_config(args.preset, **overrides)


def _bool(text):
    if str(text).lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return str(text).lower() in ("1", "true", "yes", "on")


def _run_rank(rank, rank_process, world_size, config, results):
    """Body of each spawned process: threads, then the student's rank_process."""
    import torch
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // world_size))
    out = rank_process(rank, world_size, config)
    if rank == 0 and results:
        record = dict(summary=out, config=dataclasses.asdict(config))
        Path(results).parent.mkdir(parents=True, exist_ok=True)
        Path(results).write_text(json.dumps(record, indent=1))
    exit_flushed()    # the rank's work is done and written


def main(rank_process, argv=None):
    """Parse the command line and run ``rank_process`` in ``--world-size`` processes."""
    import torch.multiprocessing as mp
    from ..launch import free_port
    world_size, results, config = parse_args(argv)
    config.data = resolve_data(config.data, config.data_root)   # one choice for every rank
    config.master_port = free_port()
    print(f"{world_size} rank(s), data {config.data}, {config.train_size or 'all'} training "
          f"examples, batch {config.batch_size} ({config.batch_size // world_size} per rank), "
          f"width {config.width}, {config.epochs} epoch(s)", flush=True)
    mp.spawn(_run_rank, args=(rank_process, world_size, config, results), nprocs=world_size)
