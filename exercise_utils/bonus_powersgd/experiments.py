"""PowerSGD in training: test accuracy against bytes communicated, yours against torch's.

A torchrun script that trains :class:`~exercise_utils.models.DropoutNet` on a Fashion-MNIST
subset on every worker (gloo, CPU, the same initial weights, ``DistributedSampler``), once per
method, all in one launch:

* ``uncompressed``: ``DistributedDataParallel`` with torch's plain ``allreduce_hook``;
* ``yours``: the student's ``PowerSGD`` (``work/08_powersgd.py``) called after ``backward()``
  in a notebook-06-style loop, at each rank of ``--ranks``;
* ``torch``: ``DistributedDataParallel`` with ``powerSGD_hook`` under the same settings
  (``matrix_approximation_rank`` r, ``min_compression_rate`` 1, ``use_error_feedback``,
  ``warm_start``, ``start_powerSGD_iter`` = ``--start-iter``).

Both PowerSGD variants send their first ``--start-iter`` steps uncompressed (torch's hook
requires at least 2 with error feedback or warm start). Launch::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_powersgd.experiments --student work/08_powersgd.py \
        --out results/08_powersgd.json

Bytes are COUNTED: ``torch.distributed.all_reduce`` is wrapped, so every gradient all-reduce
(DDP's hooks and the student's code alike) adds ``numel * element_size`` to the worker's
total ("bytes per worker": what one worker hands to all-reduce; a ring all-reduce moves
about twice that over the wire). Rank 0 evaluates on the test subset and writes the rows to
``--out``. :func:`run` launches it, :func:`table` and :func:`plot` present the rows
(the paper's figures are in :mod:`.paper`). Used in 08_bonus_powersgd.
"""
import argparse
import json
import sys
import time
from pathlib import Path

from ..bench import pyplot, save_figure
from ..config import quick
from ..progress import Marks

TRAIN_SIZE = quick(12000, 256)  # training examples shared by the workers
TEST_SIZE = quick(5000, 256)    # test examples (rank 0 evaluates)
EPOCHS = quick(3, 1)            # passes over the training subset
BATCH = 32                      # examples per worker and step
LR, MOMENTUM = 0.02, 0.9        # SGD with momentum (the same for every method)
RANKS = quick((1, 2, 4), (1, 2))  # PowerSGD ranks r
START_ITER = 2                  # steps sent uncompressed first (torch: start_powerSGD_iter >= 2)
HIDDEN = 50                     # DropoutNet's fully connected width (21,840 parameters)
WORKERS = 2                     # torchrun --nproc-per-node
THREADS = 1                     # torch threads per worker
SEED = 0                        # initial weights, data order, dropout
PG_TIMEOUT_S = 60               # gloo timeout: a missing collective fails instead of hanging
TIMEOUT = quick(300, 120)       # seconds before the launch is declared hung and killed

def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    p = argparse.ArgumentParser(description="PowerSGD: accuracy against bytes communicated")
    p.add_argument("--student", default="work/08_powersgd.py", help="the student's file")
    p.add_argument("--ranks", type=int, nargs="+", default=list(RANKS))
    p.add_argument("--methods", nargs="+", default=["uncompressed", "yours", "torch"])
    p.add_argument("--start-iter", type=int, default=START_ITER)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--train-size", type=int, default=TRAIN_SIZE)
    p.add_argument("--test-size", type=int, default=TEST_SIZE)
    p.add_argument("--data", default="fashion-mnist", help="fashion-mnist or synthetic")
    p.add_argument("--hidden", type=int, nargs="+", default=[HIDDEN],
                   help="DropoutNet widths to train (each with every method and rank)")
    p.add_argument("--threads", type=int, default=THREADS)
    p.add_argument("--out", default="results/08_powersgd.json")
    return p.parse_args(argv)


class ByteCounter:
    """Wraps ``torch.distributed.all_reduce``: ``bytes`` counts what this rank passed to it."""

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.original, self.bytes = dist, dist.all_reduce, 0

    def __enter__(self):
        def counted(tensor, *args, **kwargs):
            self.bytes += tensor.numel() * tensor.element_size()
            return self.original(tensor, *args, **kwargs)
        self.dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        self.dist.all_reduce = self.original


def train_one(args, method, r, student, train, test, rank, k, hidden=HIDDEN):
    """Train one run of a DropoutNet ``hidden`` wide; return its row (accuracy only on rank 0)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from ..models import DropoutNet

    torch.manual_seed(SEED)                        # the same initial weights on every rank
    net = DropoutNet(hidden=hidden)
    numel = sum(p.numel() for p in net.parameters())
    torch.manual_seed(SEED * 1000 + rank + 1)      # then a different dropout stream per rank
    compressor = None
    if method == "yours":
        model = net
        compressor = student.PowerSGD(net.parameters(), rank=r, seed=SEED)
    else:
        model = DDP(net)
        if method == "torch":
            state = ps.PowerSGDState(None, matrix_approximation_rank=r, min_compression_rate=1,
                                     start_powerSGD_iter=args.start_iter, use_error_feedback=True,
                                     warm_start=True, random_seed=SEED)
            model.register_comm_hook(state, ps.powerSGD_hook)
        else:
            model.register_comm_hook(None, default_hooks.allreduce_hook)
    data = TensorDataset(train.x, train.y)
    sampler = DistributedSampler(data, num_replicas=k, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=MOMENTUM)
    step, losses, start, step_times = 0, [], time.perf_counter(), []
    marks = Marks(enabled=rank == 0)               # the notebook's progress bar
    with ByteCounter() as counter:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            net.train()
            seen = torch.zeros(2)
            marks.stage(f"{method} r={r} epoch {epoch + 1}/{args.epochs}", len(loader))
            for i, (x, y) in enumerate(loader, start=1):
                began = time.perf_counter()
                opt.zero_grad()
                loss = F.nll_loss(model(x), y)
                loss.backward()                    # DDP: its hook all-reduces here
                if compressor is not None:
                    if step < args.start_iter:
                        _average(net.parameters(), k)
                    else:
                        compressor.reduce()
                opt.step()
                step_times.append(time.perf_counter() - began)
                seen += torch.tensor([loss.item() * len(y), len(y)])
                step += 1
                marks.update(i)
            counter.original(seen)                 # bookkeeping: not counted
            losses.append(float(seen[0] / seen[1]))
    train_s = time.perf_counter() - start
    row = {"method": method, "rank": r, "hidden": hidden, "params": numel, "workers": k,
           "steps": step, "epochs": args.epochs,
           "start_iter": args.start_iter if method != "uncompressed" else None,
           "bytes_per_worker": counter.bytes, "uncompressed_bytes": 4 * numel * step,
           "compression": 4 * numel * step / max(1, counter.bytes), "train_loss": losses,
           "train_s": train_s, "train_size": len(train), "test_size": len(test),
           "step_times": step_times}
    if rank == 0:
        net.eval()
        with torch.no_grad():
            out = net(test.x)
        row["test_loss"] = float(F.nll_loss(out, test.y))
        row["accuracy"] = float((out.argmax(1) == test.y).float().mean())
        print(f"{_label(row):>16}: test accuracy {row['accuracy']:.4f}, "
              f"{row['bytes_per_worker'] / 1e6:.2f} MB per worker "
              f"({row['compression']:.1f}x less), {train_s:.1f} s", flush=True)
    dist.barrier()
    return row


def _average(params, k):
    """Plain averaging of every gradient in one flat all_reduce (the uncompressed steps)."""
    import torch
    import torch.distributed as dist
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= k
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main(argv=None):
    """Entry point of every worker started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import save_json
    from ..data import load_dataset
    from ..rankworker import gloo_group, load_student

    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, k):
        student = load_student(args.student) if "yours" in args.methods else None
        train = load_dataset(args.data, "train", subset=args.train_size, seed=0,
                             verbose=rank == 0)
        test = load_dataset(args.data, "test", subset=args.test_size, seed=0, verbose=rank == 0)
        plan = [(h, m, r) for h in args.hidden for m in args.methods for r in
                ([None] if m == "uncompressed" else args.ranks)]
        rows = [train_one(args, m, r, student, train, test, rank, k, h) for h, m, r in plan]
        if rank == 0:
            save_json(args.out, {"rows": rows})


# ----------------------------------------------------------------- notebook side
def run(student="work/08_powersgd.py", ranks=RANKS, workers=WORKERS, out=None, extra=(),
        echo=True, timeout=TIMEOUT):
    """Launch the script on ``workers`` ranks (one thread each); return its rows.

    Args:
        student: the student's file with ``PowerSGD``.
        ranks: PowerSGD ranks r to train with (yours and torch's).
        workers: torchrun ``--nproc-per-node``.
        out: JSON path (default ``results/08_powersgd.json``).
        extra: more script options, e.g. ``("--epochs", "3")``.
    Returns:
        list[dict]: one row per run: method, rank, accuracy, bytes_per_worker, compression, ...
    """
    from .. import launch
    out = Path(out or "results/08_powersgd.json")
    if out.exists():
        out.unlink()
    args = ["--student", str(student), "--ranks", *map(str, ranks), "--threads", str(THREADS),
            "--out", str(out), *map(str, extra)]
    from ..bench import OtherLoad, record_load
    with OtherLoad() as load:
        launch.torchrun(__name__, workers, args, extra=["-m"], timeout=timeout, echo=echo,
                        threads_per_process=THREADS,
                        what=f"`torchrun --nproc-per-node {workers} -m {__name__}`")
    return record_load(json.loads(out.read_text())["rows"], load)


def _label(row):
    return "uncompressed" if row["method"] == "uncompressed" else f"{row['method']} r={row['rank']}"


COLUMNS = [("run", "run"), ("accuracy", "test accuracy"), ("mb", "MB per worker"),
           ("compression", "x less than uncompressed"), ("train_s", "train s")]
FORMATS = {"accuracy": ".4f", "mb": ".3f", "compression": ".1f", "train_s": ".1f"}


def table(rows):
    """Text table of :func:`run`'s rows, with the load record."""
    from ..bench import format_table, load_note
    return format_table([{**r, "run": _label(r), "mb": r["bytes_per_worker"] / 1e6}
                         for r in rows], COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/08_powersgd.png"):
    """Test accuracy against bytes per worker (log scale): yours and torch's PowerSGD at each
    rank (labelled), the uncompressed run as a horizontal reference."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    for method, marker, offset in (("yours", "o", (4, 4)), ("torch", "s", (4, -12))):
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["rank"])
        if not pts:
            continue
        xs, ys = [r["bytes_per_worker"] / 1e6 for r in pts], [100 * r["accuracy"] for r in pts]
        ax.plot(xs, ys, marker=marker, label=f"{method} PowerSGD")
        for r, x, y in zip(pts, xs, ys):
            ax.annotate(f"r={r['rank']}", (x, y), textcoords="offset points", xytext=offset)
    for r in rows:
        if r["method"] == "uncompressed":
            ax.plot([r["bytes_per_worker"] / 1e6], [100 * r["accuracy"]], marker="*",
                    markersize=12, linestyle="", color="k", label="uncompressed")
    ax.set_xscale("log")
    ax.margins(x=0.08, y=0.12)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="MB all-reduced per worker (whole run)", ylabel="test accuracy (%)",
           title="PowerSGD: accuracy against communication")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
