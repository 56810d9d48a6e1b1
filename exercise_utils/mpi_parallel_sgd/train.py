"""Data-parallel training with MPI, built from the student's functions of notebook 01.

Launch (from the folder that holds ``work/``)::

    mpiexec -n 4 python -m exercise_utils.mpi_parallel_sgd.train --work work --mode gradient \
        --out results/01_n4.json

``--mode gradient``: synchronous SGD, gradients averaged with one Allreduce per step.
``--mode model``: one-shot model averaging, as in the seed tutorial: every rank trains
alone on its shard, then the weights are averaged once at the end.

It imports ``01_shards.py``, ``01_broadcast.py``, ``01_allreduce_sgd.py``,
``01_model_averaging.py`` and ``01_convergence.py`` from ``--work``. The global batch
stays fixed as ranks grow (each rank takes GLOBAL_BATCH // size samples a step), so
every process count runs the same optimisation and only the time should change.

Used in 01_mpi_parallel_sgd and by ``make demo``.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..config import quick
from ..progress import Marks

# Settings (each overridable on the command line, e.g. --epochs 5).
DATASET = "auto"                    # mnist when present, else fashion-mnist (load_dataset)
TRAIN_SUBSET = quick(12000, 1500)   # training samples used (None: all 60000)
TEST_SUBSET = quick(5000, 500)      # test samples used for accuracy
EPOCHS = quick(3, 1)                # at most this many epochs
GLOBAL_BATCH = 64                   # samples per SGD step over all ranks together
LR = 0.05                           # SGD learning rate
MOMENTUM = 0.9                      # SGD momentum
REL_TOL = 0.005                     # stop when the global training loss changes less than this
MODE = "gradient"                   # "gradient" (synchronous SGD) or "model" (one-shot averaging)
SEED = 0                            # data order; model init is per rank, then broadcast
FILES = ("01_shards", "01_broadcast", "01_allreduce_sgd", "01_model_averaging", "01_convergence")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="MPI data-parallel training (notebook 01)")
    p.add_argument("--work", default="work", help="folder holding the student's 01_*.py files")
    p.add_argument("--mode", default=MODE, choices=["gradient", "model"])
    p.add_argument("--dataset", default=DATASET)
    p.add_argument("--train-subset", type=int, default=TRAIN_SUBSET)
    p.add_argument("--test-subset", type=int, default=TEST_SUBSET)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--momentum", type=float, default=MOMENTUM)
    p.add_argument("--rel-tol", type=float, default=REL_TOL)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--no-broadcast", action="store_true",
                   help="skip broadcast_parameters: every rank keeps its own random init")
    p.add_argument("--out", default=None, help="JSON file for the results (rank 0 writes it)")
    return p.parse_args(argv)


def load_work(folder, mode):
    """Import the student's files of notebook 01 (model averaging only in model mode).

    Returns:
        dict: short name ("shards", "broadcast", ...) -> module.
    """
    from ..rankworker import load_student
    files = [f for f in FILES if mode == "model" or f != "01_model_averaging"]
    missing = [f for f in files if not (Path(folder) / f"{f}.py").exists()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)} in {folder}: run their %%writefile cells")
    return {f[3:]: load_student(str(Path(folder) / f"{f}.py")) for f in files}


def accuracy(model, x, y):
    """Fraction of correct predictions of ``model`` on (x, y)."""
    import torch
    model.eval()
    with torch.no_grad():
        correct = sum((model(xb).argmax(1) == yb).sum().item()
                      for xb, yb in zip(x.split(1000), y.split(1000)))
    model.train()
    return correct / len(y)


def train(args, comm, work):
    """Run the training; return rank 0's result dict (None on other ranks)."""
    import torch
    import torch.nn.functional as F
    from mpi4py import MPI
    from ..data import load_dataset
    from ..models import MPINet
    rank, size = comm.Get_rank(), comm.Get_size()
    train_set = test_set = None
    if rank == 0:
        train_set = load_dataset(args.dataset, "train", subset=args.train_subset, seed=args.seed)
        test_set = load_dataset(train_set.name, "test", subset=args.test_subset, seed=args.seed)
    x, y = work["shards"].scatter_shards(comm, *(train_set.x, train_set.y) if rank == 0
                                         else (None, None), root=0)
    torch.manual_seed(1000 + rank)                  # different on purpose: broadcast fixes it
    model = MPINet()
    if not args.no_broadcast:
        work["broadcast"].broadcast_parameters(comm, model, root=0)
    local_batch = max(1, args.global_batch // size)
    steps = comm.allreduce(len(x) // local_batch, op=MPI.MIN)   # same step count on every rank
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    history, prev = [], None
    marks = Marks(enabled=rank == 0)                # the notebook's progress bar
    for epoch in range(args.epochs):
        start, loss_sum, count = time.perf_counter(), 0.0, 0
        order = torch.randperm(len(x), generator=gen)
        marks.stage(f"epoch {epoch + 1}/{args.epochs}", steps)
        for step in range(steps):
            idx = order[step * local_batch:(step + 1) * local_batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            if args.mode == "gradient":
                work["allreduce_sgd"].average_gradients(comm, model)
            opt.step()
            loss_sum, count = loss_sum + loss.item() * len(idx), count + len(idx)
            marks.update(step + 1)
        seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        loss = work["convergence"].global_loss(comm, loss_sum, count)
        acc = accuracy(model, test_set.x, test_set.y) if rank == 0 else None
        history.append({"epoch": epoch + 1, "seconds": seconds, "train_loss": loss,
                        "test_accuracy": acc})
        if rank == 0:
            print(f"epoch {epoch + 1}: {seconds:.2f} s, global train loss {loss:.4f}, "
                  f"rank-0 model test accuracy {acc:.3f}", flush=True)
        if work["convergence"].converged(prev, loss, args.rel_tol):
            if rank == 0:
                print(f"converged: loss changed by less than {args.rel_tol:.1%}", flush=True)
            break
        prev = loss
    return finish(args, comm, work, model, test_set, history, steps, local_batch, len(x))


def finish(args, comm, work, model, test_set, history, steps, local_batch, shard):
    """Average the models (model mode), evaluate, and build rank 0's result."""
    rank = comm.Get_rank()
    local_acc = None
    if args.mode == "model":
        local_state = {k: v.clone() for k, v in model.state_dict().items()}
        states = comm.gather(local_state, root=0)
        work["model_averaging"].average_weights(comm, model, root=0)
        if rank == 0:
            local_acc = []
            for state in states:
                probe = type(model)()
                probe.load_state_dict(state)
                local_acc.append(accuracy(probe, test_set.x, test_set.y))
    shards = comm.gather(shard, root=0)
    if rank != 0:
        return None
    secs = sorted(h["seconds"] for h in history)
    return {"procs": comm.Get_size(), "mode": args.mode, "broadcast": not args.no_broadcast,
            "threads": int(os.environ.get(
        "OMP_NUM_THREADS", "0") or 0), "dataset": args.dataset, "shard_sizes": shards,
        "local_batch": local_batch, "steps_per_epoch": steps, "epochs": history,
        "median_epoch_seconds": secs[len(secs) // 2],
        "test_accuracy": accuracy(model, test_set.x, test_set.y),
        "local_test_accuracies": local_acc}


def main(argv=None):
    from mpi4py import MPI
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    result = train(args, comm, load_work(args.work, args.mode))
    if result is not None:
        print(f"final test accuracy {result['test_accuracy']:.3f} ({result['mode']} averaging, "
              f"{result['procs']} processes)", flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
