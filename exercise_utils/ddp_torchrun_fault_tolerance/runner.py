"""Settings, data, model, fault injection and the main function of notebook 05's trainer.

The student's ``work/05_trainer.py`` holds ``ddp_setup`` and ``Trainer``; its last line calls
:func:`main`, which every worker started by torchrun runs::

    torchrun --nproc-per-node 2 --max-restarts 1 work/05_trainer.py --epochs 3 \
        --snapshot work/05_snapshot.pt --out work/05_final.pt --crash-at-step 20

Fault injection (first attempt only, i.e. ``TORCHELASTIC_RESTART_COUNT`` is 0):
``--crash-at-step N`` kills rank ``--crash-rank`` right after optimizer step N;
``--crash-in-save K`` makes rank 0's K-th ``torch.save`` to a file write half of its bytes to it
it was given and then kills the process (a crash during a write). torchrun then restarts
every worker (``--max-restarts``) and they resume from the snapshot. ``--kill-node-at-step N``
kills a whole node, once: after step N a worker of node ``--kill-node`` (its GROUP_RANK)
writes ``<snapshot>.node_died`` and kills its torchrun agent and every worker of the node.

At the end rank 0 writes ``--out``: the final model state, the trainer's counters (and the
scheduler's step count) and every rank's parameter checksum (replicas must agree). Used in 05_ddp_torchrun_fault_tolerance.
"""
import argparse
import dataclasses
import gc
import io
import os
import random
import signal

from ..config import quick

EXIT_CRASH = 13      # exit code of an injected crash


@dataclasses.dataclass
class RunConfig:
    """Every setting of one run (defaults: the notebook's CPU run)."""
    data: str = "fashion-mnist"     # "fashion-mnist" (offline: Debian package) or "synthetic"
    train_size: int = quick(6000, 512)   # training examples shared by the workers
    epochs: int = 3
    batch_size: int = 32            # examples per worker and step
    model: str = "cnn"              # "cnn" (DropoutNet), "mlp" (small MLP with dropout) or
    #                                 "check" (the checks' CheckNet: buffers, frozen, tied)
    dtype: str = "float32"          # of the model and the inputs: "float32" or "float64"
    lr: float = 0.05                # learning rate (of the whole run; see warmup_steps)
    momentum: float = 0.9
    warmup_steps: int = 0           # linear warm-up from lr/10 to lr over this many steps
    save_every: int = 1             # epochs between snapshots
    snapshot: str = "work/05_snapshot.pt"
    out: str = ""                   # rank 0 writes the final state here ("" = do not)
    seed: int = 0
    timeout_s: float = 60           # process group timeout
    crash_at_step: int = -1         # fault injection (see the module docstring); -1 = never
    crash_rank: int = 1
    crash_in_save: int = -1
    kill_node_at_step: int = -1     # the node GROUP_RANK kill_node dies after this step (once)
    kill_node: int = 1


def parse_args(argv=None):
    """A RunConfig from the command line (``--epochs 3 --crash-at-step 20 ...``)."""
    p = argparse.ArgumentParser(description="DDP training under torchrun (notebook 05)")
    for f in dataclasses.fields(RunConfig):
        kind = {int: int, float: float}.get(f.type, str)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=f.default)
    return RunConfig(**vars(p.parse_args(argv)))


def attempt():
    """How many times torchrun has restarted this job (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _die(message):
    print(message, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def fault_point(trainer):
    """Kill this worker after step ``crash_at_step`` on ``crash_rank`` (first attempt only)."""
    c = trainer.config
    if attempt() == 0 and trainer.step == c.crash_at_step and trainer.rank == c.crash_rank:
        _die(f"[fault injection] rank {trainer.rank} killed after step {trainer.step}")
    if trainer.step == c.kill_node_at_step and os.environ.get("GROUP_RANK") == str(c.kill_node):
        _kill_node(trainer)


def node_died_marker(snapshot):
    """The file a node's death writes (``--kill-node-at-step``): it happens only once."""
    return f"{snapshot}.node_died"


def _kill_node(trainer):
    """Kill this worker's torchrun agent and all its workers, as if the machine died."""
    import time
    import psutil
    marker = node_died_marker(trainer.config.snapshot)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return                                   # it died once already: this is its successor
    with open(marker, "w") as f:
        f.write(str(time.time()))
    agent = psutil.Process(os.getppid())
    print(f"[fault injection] node {os.environ['GROUP_RANK']} dies after step {trainer.step}: "
          f"its torchrun agent (pid {agent.pid}) and its workers are killed", flush=True)
    for proc in [agent, *agent.children(recursive=True)]:
        if proc.pid != os.getpid():
            proc.kill()
    os.kill(os.getpid(), signal.SIGKILL)


def file_on_disk(f):
    """The file a ``torch.save`` / ``torch.load`` argument names on disk: a path, or an open
    file's name (the durable write: ``open``, ``torch.save(obj, f)``, ``flush``, ``os.fsync``,
    ``os.replace``); None for in-memory buffers (``io.BytesIO``: pickled tensors)."""
    if isinstance(f, (str, os.PathLike)):
        return str(f)
    try:
        f.fileno()
    except (AttributeError, OSError, ValueError):       # io.UnsupportedOperation is both
        return None
    return str(getattr(f, "name", f"file descriptor {f.fileno()}"))


def _install_torn_save(config):
    """Make rank 0's ``crash_in_save``-th torch.save to a file write half of it, then die."""
    import torch
    real, calls = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        name = file_on_disk(f)
        if name is None:                               # in-memory saves (pickled tensors)
            return real(obj, f, *args, **kwargs)
        calls[0] += 1
        if calls[0] != config.crash_in_save:
            return real(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(data[:len(data) // 2])
        else:                                           # the student's open file
            f.write(data[:len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        _die(f"[fault injection] rank 0 killed while writing {name} (half of {len(data)} bytes)")
    torch.save = save


def rng_state():
    """This process's random states (Python, NumPy, torch CPU and CUDA), picklable."""
    import numpy as np
    import torch
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    """Restore what :func:`rng_state` returned."""
    import numpy as np
    import torch
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def loss_fn(output, target):
    """Negative log-likelihood of log-probabilities (both models return log_softmax)."""
    import torch.nn.functional as F
    return F.nll_loss(output, target)


def make_model(name, dtype="float32"):
    """The run's network: DropoutNet (the seed's CNN, written correctly), a small MLP, or the
    checks' :func:`check_net`; its parameters and float buffers in ``dtype``."""
    import torch
    import torch.nn as nn
    from ..models import DropoutNet
    if name == "cnn":
        model = DropoutNet()
    elif name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Dropout(0.2),
                              nn.Linear(32, 10), nn.LogSoftmax(dim=1))
    elif name == "check":
        model = check_net()
    else:
        raise ValueError(f"model must be 'cnn', 'mlp' or 'check', got {name!r}")
    return model.to(getattr(torch, dtype))


def check_net():
    """The model the checks train: what a snapshot must hold besides weights. Dropout (a random
    state per rank), BatchNorm (running statistics and a 0-d int64 counter: buffers, not
    parameters), a frozen parameter (no gradient, no momentum) and one weight shared by two
    layers (``state_dict`` lists it under both names)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CheckNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(784, 24)
            self.bn = nn.BatchNorm1d(24)
            self.frozen = nn.Parameter(torch.linspace(0.5, 1.5, 24), requires_grad=False)
            self.mid = nn.Linear(24, 24, bias=False)
            self.back = nn.Linear(24, 24)
            self.back.weight = self.mid.weight                       # tied
            self.out = nn.Linear(24, 10)

        def forward(self, x):
            h = F.dropout(F.relu(self.bn(self.inp(x.flatten(1)))), 0.2, self.training)
            h = self.back(torch.tanh(self.mid(h * self.frozen)))
            return F.log_softmax(self.out(h), dim=1)
    return CheckNet()


def make_data(config, verbose=False):
    """The training set as a TensorDataset (the same on every worker), inputs in config.dtype."""
    import torch
    from torch.utils.data import TensorDataset
    from ..data import load_dataset
    ds = load_dataset(config.data, "train", subset=config.train_size, seed=config.seed,
                      verbose=verbose)
    return TensorDataset(ds.x.to(getattr(torch, config.dtype)), ds.y)


def make_optimizer(model, config):
    """SGD with momentum and a linear warm-up schedule (LambdaLR, stepped every step)."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    warm = max(0, config.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s >= warm else 0.1 + 0.9 * s / warm)
    return opt, sched


def main(ddp_setup, trainer_class, argv=None):
    """What every torchrun worker runs: set up, build, train, write the result, shut down."""
    import torch.distributed as dist
    config = parse_args(argv)
    if config.crash_in_save > 0 and attempt() == 0 and os.environ.get("RANK") == "0":
        _install_torn_save(config)
    rank, local_rank, world_size, device = ddp_setup(config)
    try:
        _train(trainer_class, config, rank, local_rank, world_size, device)
        dist.barrier()
    finally:
        # The DDP model (gone with _train's frame) holds the process group: once it is freed
        # the group really shuts down here, not in the interpreter's exit, where gloo's
        # threads can abort the process (SIGABRT; seen once in a CI run of notebook 05).
        gc.collect()
        dist.destroy_process_group()


def _train(trainer_class, config, rank, local_rank, world_size, device):
    import torch
    torch.manual_seed(config.seed + rank)       # dropout differs per rank; DDP syncs init
    train_set = make_data(config, verbose=rank == 0)
    model = make_model(config.model, config.dtype)
    optimizer, scheduler = make_optimizer(model, config)
    trainer = trainer_class(model, train_set, optimizer, scheduler, config, rank,
                            local_rank, world_size, device)
    trainer.train()
    _write_result(trainer, config, rank, world_size)


def _write_result(trainer, config, rank, world_size):
    """Rank 0 writes the final state, counters and every rank's parameter checksum."""
    import torch
    import torch.distributed as dist
    module = getattr(trainer.model, "module", trainer.model)
    sums = [None] * world_size
    dist.all_gather_object(sums, [float(p.detach().double().sum()) for p in module.parameters()])
    if rank == 0 and config.out:
        state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
        torch.save({"model": state, "epochs_run": trainer.epochs_run, "step": trainer.step,
                    "scheduler_steps": trainer.scheduler.last_epoch, "checksums": sums,
                    "attempt": attempt(), "world_size": world_size}, config.out)


def restart_story(output, width=150):
    """The lines of a torchrun job's output that tell what happened, for a crash demo.

    Drops the workers' traceback frames (keeps each worker's final error line) and shortens
    long lines to ``width`` characters. Returns the text.
    """
    import re
    keep = []
    for line in output.splitlines():
        frame = re.match(r"^\[rank\d+\]:(\s{2,}|\s*Traceback)", line)
        if frame or not line.strip():
            continue
        keep.append(line if len(line) <= width else line[:width - 3] + "...")
    return "\n".join(keep)


def compare(reference, other):
    """Compare two ``--out`` files of this script (e.g. an uninterrupted and a resumed run).

    Returns:
        dict: ``max_abs_diff`` (largest parameter difference between the two final models),
        ``steps`` and ``epochs`` (pairs), ``attempts`` (pair: 0 = never restarted) and
        ``replica_spread`` (pair: the largest difference of a parameter checksum between
        any rank and rank 0, within each run).
    Raises:
        NotReady: a file is missing (the run that writes it has not finished).
    """
    import torch
    missing = [str(p) for p in (reference, other) if not os.path.exists(p)]
    if missing:
        from ..display import NotReady
        raise NotReady(f"not there yet: {' and '.join(missing)}\nThe runs that write "
                       f"{'them' if len(missing) > 1 else 'it'} (the cell above) have not "
                       "finished: finish what that cell names, run it, then this cell.")
    a, b = (torch.load(p, map_location="cpu") for p in (reference, other))
    diff = max(float((a["model"][k].double() - b["model"][k].double()).abs().max())
               for k in a["model"])

    def spread(run):
        sums = run["checksums"]
        return max(abs(x - y) for s in sums for x, y in zip(s, sums[0]))
    return {"max_abs_diff": diff, "steps": (a["step"], b["step"]),
            "epochs": (a["epochs_run"], b["epochs_run"]), "attempts": (a["attempt"], b["attempt"]),
            "replica_spread": (spread(a), spread(b))}
