"""What runs inside the two processes of notebook 04's checks: recording parts and the probes.

Both checks run the student's ``work/04_cifar_dp.py`` in 2 fresh processes (the student's own
``rank_process`` sets up the TCPStore and the gloo process group). :func:`probe_train`
replaces the trainer's parts from :mod:`.tricks` and the model by recording ones (also where
the student imported their names), so it reports, per rank, every minibatch trained on, the
parameters at the first and the last step, which ranks built an EMA model, after which steps
they updated it and its final weights, and which model each rank validated.
:func:`probe_rank_process` hands ``rank_process`` a stand-in ``train`` that reports the process
group it runs in (rank, size, backend, device, the store's port and timeout, the group's
timeout) and logs the order of its return, barriers and ``destroy_process_group``.
The verdicts are in :mod:`.checks`.

Used in 04_resnet_cifar_data_parallel.
"""
import dataclasses
import os
import time
import traceback

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork

from .. import models
from . import runner, tricks

WORLD = 2
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


class _Record:
    def __init__(self):
        self.epochs, self.init, self.model = [], None, None
        self.emas, self.ema_steps, self.evaluated = [], [], []


REC = _Record()


class _RecordedModel(models.ResNetBagOfTricks):
    def forward(self, x):
        if self.training and torch.is_grad_enabled() and REC.init is None:
            REC.init, REC.model = params(self), self
        return super().forward(x)


class _RecordedEMA(tricks.EMA):
    def __init__(self, *args, **kwargs):
        REC.emas.append(self)
        super().__init__(*args, **kwargs)

    def update(self, model):
        REC.ema_steps.append(sum(len(e) for e in REC.epochs))     # minibatches trained so far
        return super().update(model)


def _recorded_minibatches(*args, **kwargs):
    epoch = []
    REC.epochs.append(epoch)
    for xb, yb in ORIGINAL["minibatches"](*args, **kwargs):
        epoch.append((xb.detach().cpu().numpy().copy(), yb.detach().cpu().numpy().copy()))
        yield xb, yb


def _recorded_evaluate(model, *args, **kwargs):
    REC.evaluated.append("the EMA model" if any(model is e.model for e in REC.emas) else
                         "the trained model" if model is REC.model else "another model")
    return ORIGINAL["evaluate"](model, *args, **kwargs)


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


def _error_text(exc, student):
    """The error and the traceback lines in the student's file (else the last three)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == student.__file__] or frames[-3:]
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_list(mine))


def probe_train(student, ctx, config):
    """Run the student's rank_process with recording parts; report what each rank did."""
    config = dataclasses.replace(config, master_port=int(os.environ["MASTER_PORT"]))
    torch.manual_seed(1000 + ctx.rank)      # the ranks' global random states differ
    undo = _install(student)
    error, when = None, None
    try:
        student.rank_process(ctx.rank, ctx.size, config)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the counts, see check_train
        error, when = _error_text(exc, student), time.time()
    finally:
        undo()
    final = params(REC.model) if REC.model is not None else None
    ema = params(REC.emas[-1].model) if REC.emas else None
    return dict(error=error, error_time=when, epochs=REC.epochs, init=REC.init, final=final,
                ema_made=len(REC.emas), ema_steps=REC.ema_steps, ema=ema,
                evaluated=REC.evaluated)


def _rendezvous():
    """Port and timeout (seconds) of the default group's store, and the group's own timeout."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    store = c10d._get_default_store()
    found = dict(port=getattr(getattr(store, "underlying_store", store), "port", None),
                 store_timeout=store.timeout.total_seconds(), group_timeout=None)
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        found["group_timeout"] = backend.options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        pass
    return found


def _watch_barrier_and_destroy(student, events):
    """Log calls of dist.barrier / monitored_barrier / destroy_process_group into ``events``
    (also where the student imported the names); return a function that undoes it."""
    import torch.distributed as dist
    undo = []
    for name, event in (("barrier", "dist.barrier()"), ("monitored_barrier", "dist.barrier()"),
                        ("destroy_process_group", "dist.destroy_process_group()")):
        original = getattr(dist, name)

        def logged(*args, _fn=original, _event=event, **kwargs):
            events.append(_event)
            return _fn(*args, **kwargs)
        for owner in (dist, student):
            for key, value in list(vars(owner).items()):
                if value is original:
                    undo.append((owner, key, original))
                    setattr(owner, key, logged)
    return lambda: [setattr(owner, key, fn) for owner, key, fn in undo]


def probe_rank_process(student, ctx, config, ports):
    """Run rank_process with a stand-in train (a correct one, and one that raises); report what
    train saw (rank, group, device, the rendezvous' port and timeouts) and, per case, the order
    of train's return, barriers and destroy_process_group."""
    import torch.distributed as dist
    seen, events = [], []

    def fake_train(rank, world_size, cfg, device):
        seen.append(dict(rank=rank, world_size=world_size, device=str(device),
                         backend=dist.get_backend(), group_rank=dist.get_rank(),
                         group_size=dist.get_world_size(), **_rendezvous()))
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        seen[-1]["sum"] = float(t)
        if cfg.seed == 666:
            raise KeyError("train failed on purpose")
        events.append("train returned")
        return {"rank": rank, "ok": True}

    student.train = fake_train
    undo = _watch_barrier_and_destroy(student, events)
    out = {}
    try:
        for case, port in zip(("returns", "raises"), ports):
            cfg = dataclasses.replace(config, master_port=port, seed=666 if case == "raises" else 0)
            del events[:]
            try:
                out[case] = {"value": student.rank_process(ctx.rank, ctx.size, cfg)}
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001
                out[case] = {"raised": f"{type(exc).__name__}: {exc}"}
            out[case].update(seen=seen[-1] if seen else None, events=list(events),
                             still_initialized=dist.is_initialized(), port=port)
            if (out[case]["seen"] or {}).get("port", port) != port:
                break           # the second rendezvous would meet on the same wrong port
            if dist.is_initialized():
                # Tidy up what the student left (a live gloo group aborts the process at exit,
                # which could kill the other rank before it reports); the ranks are in step here.
                try:
                    dist.barrier()
                finally:
                    dist.destroy_process_group()
                break
    finally:
        undo()
    return out
