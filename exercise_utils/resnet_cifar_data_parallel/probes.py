"""What runs inside the processes of notebook 04's checks: recording parts, the train probe, and
what both probes share (simulated GPUs, ranks kept in step between runs).

Each check starts :data:`LAUNCH` fresh processes once and runs the student's ``rank_process``
several times in them (*runs*: 1, 2 or 3 ranks, other settings), each run with its own
TCPStore port; between two runs every process waits for the others (:class:`Lockstep`, a store
of the probe's own), and after a run in which a rank failed all of them stop.
:func:`probe_train` replaces the trainer's parts from :mod:`.tricks` and the model by recording
ones (also where the student imported their names), so it reports, per run and rank, every
minibatch trained on, the parameters and buffers at the first step and the parameters after
every step, which ranks built an EMA model, after which steps they updated it and its final weights,
which model each rank validated, and what ``rank_process`` returned. The recorded model draws
its frozen parameters and BatchNorm statistics at random (from torch's global generator, as
the rest of the model), so that a broadcast that leaves them out shows.
The rank_process probe is :mod:`.probes_rank`; the verdicts are in :mod:`.checks`.

Used in 04_resnet_cifar_data_parallel.
"""
import contextlib
import dataclasses
import datetime
import json
import os
import time
import traceback

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork

from .. import models
from . import runner, tricks

WORLD = 2                     # ranks of the first (baseline) run of each check
LAUNCH = 3                    # processes each check starts (the largest run's ranks)
MINIBATCH = 8                 # examples per rank and step (= one ghost batch)


# 47 examples: 23 per rank, 2 minibatches each (7 left over). Giving the last rank "the rest"
# (24) or striding (24 / 23) gives one rank a third minibatch: the classic hang.
# lr 0.1, not the presets' 0.4: the float32 rounding differences between the ranks' summed
# gradients and the single-process gradient grow with the step size (biases move with 64 times
# the learning rate); at 0.4 a correct trainer that slices x[rank::world_size] missed the
# checker's tolerance (1e-4 off), at 0.1 every correct variant stays 4 times inside it.
CONFIG = runner.TrainConfig(
    data="synthetic-cifar10", train_size=WORLD * (3 * MINIBATCH - 1) + 1, test_size=32, epochs=2,
    batch_size=WORLD * MINIBATCH, width=4, ghost_size=MINIBATCH, ema_every=2, lr=0.1,
    whitening_examples=40, augment=False, amp=False, seed=3, timeout_s=30, threads=1)

# The runs of check_train, in the order they run: (name, ranks, settings changed from CONFIG).
# Every run has 2 minibatches per rank and epoch, 4 optimizer steps in all; 71 examples on 3
# ranks and 23 on 1 leave a remainder the same way 47 on 2 do. ema_every 3 does not divide the
# steps of an epoch: a step counter that restarts every epoch never reaches it.
TRAIN_RUNS = (
    ("2 ranks", WORLD, {}),
    ("3 ranks", 3, dict(train_size=3 * (3 * MINIBATCH - 1) + 2, batch_size=3 * MINIBATCH)),
    ("1 rank, ema_every 3", 1, dict(train_size=3 * MINIBATCH - 1, batch_size=MINIBATCH,
                                    ema_every=3)),
)


def reachable(addr):
    """``addr`` (a config's ``master_addr``) as every process of this launch reaches process 0:
    unchanged where they share one machine's loopback; where each runs on a host of its own
    (at grading: ``MASTER_ADDR`` is host 0's address, :mod:`exercise_utils.hosts`) host 0's
    name for ``localhost`` and its address for any other."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("127.0.0.1", "localhost"):
        return addr
    return "h0" if addr == "localhost" else master


class Lockstep:
    """The launch's processes in step between runs, through a TCPStore of the probe's own (at
    ``port``, hosted by process 0; never the student's). Waiting for it blocks without running
    Python, so ranks that all wait are seen as hung (:mod:`exercise_utils.heartbeat`)."""

    def __init__(self, ctx, port):
        import torch.distributed as dist
        self.rank, self.size = ctx.rank, ctx.size
        self.store = dist.TCPStore(reachable("127.0.0.1"), port, ctx.size, ctx.rank == 0,
                                   timeout=datetime.timedelta(seconds=3600))

    def after(self, run, ok):
        """Say whether this process's part of ``run`` went well; wait for every process;
        return whether all did."""
        self.store.set(f"{run}/{self.rank}", "ok" if ok else "failed")
        keys = [f"{run}/{r}" for r in range(self.size)]
        self.store.wait(keys)
        return all(self.store.get(k) == b"ok" for k in keys)

    def close(self):
        """Process 0 hosts the store: it leaves last."""
        self.store.set(f"bye/{self.rank}", "1")
        if self.rank == 0:
            self.store.wait([f"bye/{r}" for r in range(self.size)])


@contextlib.contextmanager
def simulated_gpus(count, set_devices=None):
    """Make torch.cuda say there are ``count`` GPUs (0: none) for the block; calls of
    ``torch.cuda.set_device`` are appended to ``set_devices`` instead of run. Communication
    stays on the CPU (gloo): the checks run the same on machines with and without GPUs."""
    cuda, current = torch.cuda, [0]
    names = ("is_available", "device_count", "set_device", "current_device", "get_device_name")
    saved = {name: getattr(cuda, name) for name in names}
    calls = set_devices if set_devices is not None else []

    def set_device(device):
        calls.append(str(device))
        current[0] = device if isinstance(device, int) else torch.device(device).index or 0
    cuda.is_available = lambda: count > 0
    cuda.device_count = lambda: count
    cuda.set_device = set_device
    cuda.current_device = lambda: current[0]
    cuda.get_device_name = lambda device=None: "simulated GPU"
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cuda, name, fn)


def plain(value):
    """``value`` as plain data (JSON types), else its repr: what crosses to the judge."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)[:300]


def error_text(exc, student):
    """The error and the traceback lines in the student's file (else the last three)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == student.__file__] or frames[-3:]
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_list(mine))


# ------------------------------------------------------------------ recording parts (train)
class _Record:
    def __init__(self, ctx=None):
        self.epochs, self.init, self.model, self.ctx = [], None, None, ctx
        self.emas, self.ema_steps, self.evaluated, self.accuracies = [], [], [], []
        self.trajectory, self.case = [], None      # parameters before steps 2, 3, ...
        self.built = None                          # the trained model's state when built

    def enter(self, case):
        """The part of train that runs now (a check case): errors and hangs are charged to it."""
        self.case = case
        if self.ctx is not None:
            self.ctx.case(case)


REC = _Record()


class _RecordedModel(models.ResNetBagOfTricks):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with torch.no_grad():                      # frozen parameters and buffers, at random
            w = self.whiten.weight
            w.mul_(1 + 0.05 * torch.randn(w.shape[0], 1, 1, 1))
            for m in self.modules():
                if isinstance(m, models.GhostBatchNorm):
                    m.weight.uniform_(0.8, 1.2)
                    m.running_mean.normal_(0, 0.1)
                    m.running_var.uniform_(0.5, 2.0)
                    m.num_batches_tracked.fill_(int(torch.randint(1, 1000, ())))
        self.dtfs_built = state(self)              # as built, before any broadcast
        REC.enter("train-init")

    def forward(self, x):
        if self.training and torch.is_grad_enabled() and REC.init is None:
            REC.init, REC.model, REC.built = state(self), self, self.dtfs_built
            REC.enter("train-step")
        return super().forward(x)


class _RecordedEMA(tricks.EMA):
    def __init__(self, *args, **kwargs):
        REC.emas.append(self)
        REC.enter("train-leader")
        super().__init__(*args, **kwargs)

    def update(self, model):
        REC.ema_steps.append(sum(len(e) for e in REC.epochs))     # minibatches trained so far
        case, _ = REC.case, REC.enter("train-ema")
        out = super().update(model)
        REC.enter(case)
        return out


def _recorded_minibatches(*args, **kwargs):
    epoch = []
    REC.epochs.append(epoch)
    for xb, yb in ORIGINAL["minibatches"](*args, **kwargs):
        if REC.model is not None:                 # a step was taken since the last minibatch
            REC.trajectory.append(params(REC.model))
        epoch.append((xb.detach().cpu().numpy().copy(), yb.detach().cpu().numpy().copy()))
        yield xb, yb


def _recorded_evaluate(model, *args, **kwargs):
    REC.evaluated.append("the EMA model" if any(model is e.model for e in REC.emas) else
                         "the trained model" if model is REC.model else "another model")
    case, _ = REC.case, REC.enter("train-validates")
    accuracy = ORIGINAL["evaluate"](model, *args, **kwargs)
    REC.accuracies.append(float(accuracy))
    REC.enter(case)
    return accuracy


ORIGINAL = {"ResNetBagOfTricks": models.ResNetBagOfTricks, "EMA": tricks.EMA,
            "minibatches": tricks.minibatches, "evaluate": tricks.evaluate}
REPLACEMENT = {"ResNetBagOfTricks": _RecordedModel, "EMA": _RecordedEMA,
               "minibatches": _recorded_minibatches, "evaluate": _recorded_evaluate}


def _install(student):
    """Replace the trainer's parts by recording ones, also where the student imported names.

    Returns:
        callable: puts the originals back (before the probe returns: the worker checks that
        the checker's code is unchanged afterwards, :mod:`exercise_utils.integrity`).
    """
    models.ResNetBagOfTricks = _RecordedModel
    for name in ("EMA", "minibatches", "evaluate"):
        setattr(tricks, name, REPLACEMENT[name])
    rebound = {key: value for key, value in vars(student).items()
               if any(value is original for original in ORIGINAL.values())}
    for key, value in rebound.items():
        name = next(n for n, original in ORIGINAL.items() if value is original)
        setattr(student, key, REPLACEMENT[name])

    def undo():
        models.ResNetBagOfTricks = ORIGINAL["ResNetBagOfTricks"]
        for name in ("EMA", "minibatches", "evaluate"):
            setattr(tricks, name, ORIGINAL[name])
        for key, value in rebound.items():
            setattr(student, key, value)
    return undo


def params(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.named_parameters()}


def state(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------ the train probe
def probe_train(student, ctx, runs, port):
    """Run the student's rank_process with recording parts, once per run of ``runs`` (name,
    ranks, config: the processes beyond a run's ranks wait); report, per run, what this rank
    did. All processes stop after a run in which one of them raised."""
    global REC
    step, out = Lockstep(ctx, port), {}
    torch.set_num_threads(1)                      # 3 processes on 2 cores: no oversubscription
    with simulated_gpus(0):                       # every run on the CPU, with or without GPUs
        for name, world, config in runs:
            if ctx.rank < world:
                REC = _Record(ctx)
                config = dataclasses.replace(config, master_addr=reachable(config.master_addr))
                out[name] = _train_run(student, ctx.rank, world, config)
            ctx.case("train-counts")              # waiting for ranks that run more minibatches?
            if not step.after(name, ctx.rank >= world or out[name]["error"] is None):
                break
    step.close()
    return out


def _train_run(student, rank, world, config):
    torch.manual_seed(1000 + rank)                # the ranks' global random states differ
    undo = _install(student)
    error, summary = None, None
    REC.enter("train-slices")
    try:
        summary = plain(student.rank_process(rank, world, config))
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the counts, see check_train
        error = dict(text=error_text(exc, student), time=time.time(), case=REC.case)
    finally:
        undo()
    return dict(error=error, epochs=REC.epochs, init=REC.init, summary=summary,
                trajectory=REC.trajectory, built=REC.built if rank == 0 else None,
                final=params(REC.model) if REC.model is not None else None,
                ema_made=len(REC.emas), ema_steps=REC.ema_steps,
                ema=params(REC.emas[-1].model) if REC.emas else None,
                evaluated=REC.evaluated, accuracies=REC.accuracies)
