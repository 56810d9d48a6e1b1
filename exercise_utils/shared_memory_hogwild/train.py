"""Hogwild! training on Fashion-MNIST with the student's ``02_hogwild.py``, against serial training.

Launch (from the folder that holds ``work/``)::

    python -m exercise_utils.shared_memory_hogwild.train --work work --runs serial 2x1 4x1 2x2 \
        --out results/02_hogwild.json

Every run starts from the same initial :class:`~exercise_utils.models.MPINet` and trains
EPOCHS epochs of plain SGD (BATCH samples a step, learning rate LR) on the same data:

* ``serial``: the student's ``train_worker(0, 1, ...)`` in this very process, one worker
  using every core's thread (no extra process); ``serialxT``: the same with T threads;
* ``PxT``: the student's ``hogwild(model, dataset, P, threads=T)``: P worker processes with
  T threads each; ``Px`` means the default, ``cores // P`` threads (at least 1).

The data is a :class:`TimedDataset`: it records, in shared memory, when each sample was
read, so the training time runs from the first sample read (by any worker) to the last one,
and the start-up (starting the processes, importing torch and the student's file) is the
time from the call to the first read. The result (one row per run) is written as JSON.

Used in 02_shared_memory_hogwild.
"""
import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from ..config import quick

# Settings (each overridable on the command line, e.g. --epochs 3).
DATASET = "auto"                    # mnist when present, else fashion-mnist (load_dataset)
TRAIN_SUBSET = quick(8000, 1000)    # training samples used (None: all 60000)
TEST_SUBSET = quick(2000, 500)      # test samples used for accuracy
EPOCHS = quick(2, 1)                # epochs of every run
BATCH = 64                          # samples per SGD step of one worker
LR = 0.05                           # SGD learning rate (no momentum: see the notebook)
SEED = 0                            # model initialisation and data order
RUNS = ("serial", "2x1")            # what to train, see the docstring


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Hogwild! against serial training (notebook 02)")
    p.add_argument("--work", default="work", help="folder holding the student's 02_hogwild.py")
    p.add_argument("--runs", nargs="+", default=list(RUNS), help="serial, PxT or Px")
    p.add_argument("--dataset", default=DATASET)
    p.add_argument("--train-subset", type=int, default=TRAIN_SUBSET)
    p.add_argument("--test-subset", type=int, default=TEST_SUBSET)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--out", default=None, help="JSON file for the results")
    return p.parse_args(argv)


def parse_run(spec, cores=None):
    """``"serial"`` -> (0, cores); ``"serialx1"`` -> (0, 1); ``"2x1"`` -> (2, 1);
    ``"4x"`` -> (4, max(1, cores // 4)).

    Returns:
        (processes, threads per process); 0 processes means serial in this process.
    """
    cores = cores or os.cpu_count() or 1
    procs, _, threads = spec.partition("x")
    if procs == "serial":
        return 0, int(threads) if threads not in ("", "auto") else cores
    procs = int(procs)
    if procs < 1:
        raise ValueError(f"run {spec!r}: at least one process")
    return procs, int(threads) if threads not in ("", "auto") else max(1, cores // procs)


def load_work(folder):
    """Import ``02_hogwild.py`` from ``folder`` by its own name, so that spawned workers can
    import it too (they inherit ``sys.path`` and find ``train_worker`` by module name)."""
    path = Path(folder).resolve() / "02_hogwild.py"
    if not path.exists():
        raise SystemExit(f"missing {path}: run the %%writefile cell that creates it")
    sys.path.insert(0, str(path.parent))
    return importlib.import_module(path.stem)


class TimedDataset:
    """``(x[i], y[i])`` pairs; remembers when each sample was first and last read, in shared
    memory, so that the times of reads made in worker processes reach the parent."""

    def __init__(self, x, y):
        import torch
        self.x, self.y = x, y
        self.first, self.last = (torch.zeros(len(y), dtype=torch.float64).share_memory_()
                                 for _ in range(2))

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        now = time.monotonic()       # one clock for all processes of the machine
        if self.first[i] == 0:
            self.first[i] = now
        self.last[i] = now
        return self.x[i], self.y[i]

    def read_times(self):
        """(first read, last read) over all samples since the last :meth:`reset`."""
        return float(self.first[self.first > 0].min()), float(self.last.max())

    def reset(self):
        self.first.zero_()
        self.last.zero_()


def accuracy(model, x, y):
    """Fraction of correct predictions of ``model`` on (x, y)."""
    import torch
    with torch.no_grad():
        return sum((model(xb).argmax(1) == yb).sum().item()
                   for xb, yb in zip(x.split(1000), y.split(1000))) / len(y)


def train_run(spec, work, dataset, test, args):
    """Train one run (see the module docstring); return its result row."""
    import torch
    from ..models import MPINet
    procs, threads = parse_run(spec)
    torch.manual_seed(args.seed)
    model = MPINet()
    hyper = dict(epochs=args.epochs, batch_size=args.batch, lr=args.lr, seed=args.seed,
                 threads=threads)
    dataset.reset()
    clock = time.monotonic()
    if procs:
        work.hogwild(model, dataset, procs, **hyper)
    else:
        work.train_worker(0, 1, model, dataset, args.epochs, args.batch, args.lr, args.seed,
                          threads)
    total = time.monotonic() - clock
    first, last = dataset.read_times()
    startup, seconds = first - clock, last - first
    row = {"run": spec, "procs": procs, "threads": threads,
           "busy_threads": max(1, procs) * threads, "cores": os.cpu_count(),
           "startup_s": startup, "train_s": seconds, "total_s": total,
           "epoch_s": seconds / max(1, args.epochs),
           "accuracy": accuracy(model, test.x, test.y)}
    print(f"{spec}: {max(1, procs)} process(es) x {threads} thread(s): start-up {startup:.1f} s, "
          f"{row['epoch_s']:.2f} s/epoch, test accuracy {row['accuracy']:.3f}", flush=True)
    return row


def main(argv=None):
    args = parse_args(argv)
    from ..bench import save_json
    from ..data import load_dataset
    work = load_work(args.work)
    train = load_dataset(args.dataset, "train", subset=args.train_subset, seed=args.seed)
    test = load_dataset(train.name, "test", subset=args.test_subset, seed=args.seed)
    print(f"{train.name}: {len(train)} training, {len(test)} test samples; {args.epochs} "
          f"epoch(s), batch {args.batch}, lr {args.lr}; {os.cpu_count()} CPU cores", flush=True)
    dataset = TimedDataset(train.x, train.y)
    from ..progress import Marks
    marks, rows = Marks(), []                   # the notebook's progress bar: runs done
    marks.stage(f"{len(args.runs)} runs", len(args.runs))
    for spec in args.runs:
        rows.append(train_run(spec, work, dataset, test, args))
        marks.update(len(rows))
    if args.out:
        save_json(args.out, {"dataset": train.name, "train_samples": len(train),
                             "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
                             "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
