"""Checkers of notebook 04: ``rank_process`` and the data-parallel ``train``.

Both run the student's ``work/04_cifar_dp.py`` in 2 fresh processes (the student's own
``rank_process`` sets up the TCPStore and the gloo process group). The probes record, inside
those processes, what the trainer's parts from :mod:`exercise_utils.cifar_tricks` and the
model saw: every minibatch each rank trained on, the parameters at the first and the last
step, which ranks built and updated an EMA model and which validated. The checker then
replays single-process training on the combined batches (rank 0's minibatch, then rank 1's,
step by step) and demands the same parameters. Ghost BatchNorm (statistics per ghost batch of
8 examples, one ghost batch per minibatch) makes that equality exact up to rounding.

Used in 04_resnet_cifar_data_parallel.
"""
import dataclasses
import os
import time
import traceback

import numpy as np
import torch

from . import cifar_dp, cifar_tricks, models
from .config import quick
from .harness import assert_close, run_ranks

MODULE = "exercise_utils.checks_cifar"
TIMEOUT = quick(120, 90)      # seconds before a check is declared hung
WORLD = 2
MINIBATCH = 8                 # examples per rank and step (= one ghost batch)
# 47 examples: 23 per rank, 2 minibatches each (7 left over). Giving the last rank "the rest"
# (24) or striding (24 / 23) gives one rank a third minibatch: the classic hang.
CONFIG = cifar_dp.TrainConfig(
    data="synthetic-cifar10", train_size=WORLD * (3 * MINIBATCH - 1) + 1, test_size=32, epochs=2,
    batch_size=WORLD * MINIBATCH, width=4, ghost_size=MINIBATCH, ema_every=2,
    whitening_examples=40, augment=False, amp=False, seed=3, timeout_s=quick(30, 20), threads=1)
HANG_HINT = ("\nA rank that runs more minibatches than the others waits forever in all_reduce "
             "(until the timeout): give every rank the same number of examples (drop the "
             "remainder) so that every rank runs the same number of minibatches.")


# ---------------------------------------------------------------- recording (in the ranks)
class _Record:
    def __init__(self):
        self.epochs, self.init, self.model, self.ema_made, self.ema_updates = [], None, None, 0, 0
        self.evaluations, self.train_calls, self.backend, self.device = 0, 0, None, None


REC = _Record()


class _RecordedModel(models.ResNetBagOfTricks):
    def forward(self, x):
        if self.training and torch.is_grad_enabled() and REC.init is None:
            REC.init, REC.model = _params(self), self
        return super().forward(x)


class _RecordedEMA(cifar_tricks.EMA):
    def __init__(self, *args, **kwargs):
        REC.ema_made += 1
        super().__init__(*args, **kwargs)

    def update(self, model):
        REC.ema_updates += 1
        return super().update(model)


def _recorded_minibatches(*args, **kwargs):
    epoch = []
    REC.epochs.append(epoch)
    for xb, yb in _ORIGINAL["minibatches"](*args, **kwargs):
        epoch.append((xb.detach().cpu().numpy().copy(), yb.detach().cpu().numpy().copy()))
        yield xb, yb


def _recorded_evaluate(*args, **kwargs):
    REC.evaluations += 1
    return _ORIGINAL["evaluate"](*args, **kwargs)


_ORIGINAL = {"ResNetBagOfTricks": models.ResNetBagOfTricks, "EMA": cifar_tricks.EMA,
             "minibatches": cifar_tricks.minibatches, "evaluate": cifar_tricks.evaluate}
_REPLACEMENT = {"ResNetBagOfTricks": _RecordedModel, "EMA": _RecordedEMA,
                "minibatches": _recorded_minibatches, "evaluate": _recorded_evaluate}


def _install(student):
    """Replace the trainer's parts by recording ones, also where the student imported names."""
    models.ResNetBagOfTricks = _RecordedModel
    for name in ("EMA", "minibatches", "evaluate"):
        setattr(cifar_tricks, name, _REPLACEMENT[name])
    for key, value in list(vars(student).items()):
        for name, original in _ORIGINAL.items():
            if value is original:
                setattr(student, key, _REPLACEMENT[name])


def _params(model):
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
    _install(student)
    error, when = None, None
    try:
        student.rank_process(ctx.rank, ctx.size, config)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported with the counts, see check_train
        error, when = _error_text(exc, student), time.time()
    final = _params(REC.model) if REC.model is not None else None
    return dict(error=error, error_time=when, epochs=REC.epochs, init=REC.init, final=final,
                ema_made=REC.ema_made, ema_updates=REC.ema_updates, evaluations=REC.evaluations)


def probe_rank_process(student, ctx, config, ports):
    """Run rank_process with a stand-in train (a correct one, and one that raises)."""
    import torch.distributed as dist
    seen = []

    def fake_train(rank, world_size, cfg, device):
        seen.append(dict(rank=rank, world_size=world_size, device=str(device),
                         backend=dist.get_backend(), group_rank=dist.get_rank(),
                         group_size=dist.get_world_size()))
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        seen[-1]["sum"] = float(t)
        if cfg.seed == 666:
            raise KeyError("train failed on purpose")
        return {"rank": rank, "ok": True}

    student.train = fake_train
    out = {}
    for case, port in zip(("returns", "raises"), ports):
        cfg = dataclasses.replace(config, master_port=port, seed=666 if case == "raises" else 0)
        try:
            out[case] = {"value": student.rank_process(ctx.rank, ctx.size, cfg)}
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001
            out[case] = {"raised": f"{type(exc).__name__}: {exc}"}
        out[case]["seen"] = seen[-1] if seen else None
        out[case]["still_initialized"] = dist.is_initialized()
        if dist.is_initialized():
            # Tidy up what the student left (a live gloo group aborts the process at exit,
            # which could kill the other rank before it reports); the ranks are in step here.
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()
            break
    return out


# ---------------------------------------------------------------- checkers (in the kernel)
def check_rank_process(path, timeout=TIMEOUT):
    """Check ``rank_process``: store, gloo group of 2, train called, group destroyed."""
    from .launch import free_port
    res = run_ranks(path, f"{MODULE}:probe_rank_process", WORLD, "none",
                    kwargs=dict(config=CONFIG, ports=_two_ports(free_port)), timeout=timeout,
                    what="rank_process with 2 ranks")
    for rank, out in enumerate(res):
        got = out["returns"]
        if "raised" in got:
            raise AssertionError(f"rank {rank}: rank_process raised {got['raised']}")
        seen = got["seen"]
        if seen is None:
            raise AssertionError(f"rank {rank}: rank_process never called train(rank, "
                                 f"world_size, config, device)")
        want = dict(rank=rank, world_size=WORLD, backend="gloo", group_rank=rank,
                    group_size=WORLD, device="cpu", sum=3.0)
        wrong = {k: seen[k] for k in want if seen[k] != want[k]}
        if wrong:
            raise AssertionError(f"rank {rank}: inside train saw {wrong}; expected "
                                 f"{ {k: want[k] for k in wrong} } (a gloo group of "
                                 f"{WORLD} ranks on this CPU-only machine, device cpu)")
        if got.get("value") != {"rank": rank, "ok": True}:
            raise AssertionError(f"rank {rank}: rank_process returned {got.get('value')!r}; "
                                 "it must return what train returned")
        if got["still_initialized"]:
            raise AssertionError(f"rank {rank}: the process group is still initialized after "
                                 "rank_process returned: call dist.destroy_process_group() "
                                 "(after a final dist.barrier())")
        bad = out.get("raises", {})
        if "raised" not in bad or "train failed on purpose" not in bad["raised"]:
            raise AssertionError(f"rank {rank}: when train raises, rank_process must let the "
                                 f"exception through (got {bad.get('value', bad)!r})")
        if bad["still_initialized"]:
            raise AssertionError(f"rank {rank}: when train raised, the process group was left "
                                 "initialized: destroy it in a `finally:` block")


def _two_ports(free_port):
    ports = [free_port()]
    while len(ports) < 2:
        ports += [p for p in [free_port()] if p not in ports]
    return ports


def check_train(path, timeout=TIMEOUT):
    """Check the data-parallel ``train``: equal to single-process training on the whole batch."""
    try:
        res = run_ranks(path, f"{MODULE}:probe_train", WORLD, "none",
                        kwargs=dict(config=CONFIG), timeout=timeout,
                        what="rank_process + train with 2 gloo ranks")
    except AssertionError as err:
        raise AssertionError(str(err) + (HANG_HINT if "hung" in str(err) else "")) from None
    errors = sorted((out["error_time"], rank, out["error"]) for rank, out in enumerate(res)
                    if out["error"])
    if errors and not _waited(errors[0][2]):      # the first failure is a bug, not a wait
        raise AssertionError(f"rank {errors[0][1]} raised {errors[0][2]}")
    _check_counts(res)
    if errors:
        raise AssertionError(f"rank {errors[0][1]} raised {errors[0][2]}")
    _check_slices(res)
    for rank, out in enumerate(res[1:], start=1):
        assert_close(out["init"], res[0]["init"], "parameters at the first training step must "
                     "be rank 0's on every rank: broadcast them (or use the same seed and the "
                     "same whitening data on every rank)", rank, atol=0, rtol=0)
    want = replay(res, CONFIG)
    for rank, out in enumerate(res):
        assert_close(out["final"], want, f"parameters after {len(res[0]['epochs'])} epochs must "
                     "equal single-process training on the combined batches (rank 0's minibatch "
                     "then rank 1's, loss summed over the batch, optimizer built for "
                     f"{CONFIG.batch_size} examples per step). Too large or too small by "
                     f"a factor of {WORLD}? Check how the all-reduced gradients are scaled",
                     rank, atol=2e-5, rtol=2e-4)
    _check_leader_only(res)


def _waited(error):
    """Whether an error is what a rank gets when its peers never join (timeout, peer gone)."""
    words = ("timed out", "timeout", "connection", "closed", "peer", "gloo")
    return any(w in error.split("\n")[0].lower() for w in words)


def _check_counts(res):
    counts = [[len(e) for e in out["epochs"]] for out in res]
    if len(set(map(tuple, counts))) > 1:
        shown = ", ".join(f"rank {r} ran {c}" for r, c in enumerate(counts))
        raise AssertionError(f"minibatches per epoch differ: {shown} (training set of "
                             f"{CONFIG.train_size} examples, batch {CONFIG.batch_size} = "
                             f"{WORLD} ranks x minibatch {MINIBATCH}).{HANG_HINT}")
    if not counts[0] or not counts[0][0]:
        raise AssertionError("no minibatch was trained on: train must loop over "
                             "T.minibatches(x_local, y_local, minibatch_size, ...)")


def _check_slices(res):
    train = cifar_dp.load_data(CONFIG, "train", verbose=False)
    index = {row.tobytes(): i for i, row in enumerate(train.x.numpy())}
    for epoch in range(len(res[0]["epochs"])):
        owner = {}
        for rank, out in enumerate(res):
            for xb, _ in out["epochs"][epoch]:
                if len(xb) != MINIBATCH:
                    raise AssertionError(f"rank {rank} trained on minibatches of {len(xb)} "
                                         f"examples; with batch {CONFIG.batch_size} and {WORLD} "
                                         f"ranks each rank's minibatch is {MINIBATCH}")
                for row in xb:
                    i = index.get(row.tobytes())
                    if i is None:
                        raise AssertionError(f"rank {rank} trained on an image that is not in "
                                             "the training set")
                    if i in owner:
                        who = "twice" if owner[i] == rank else f"and rank {owner[i]} both"
                        raise AssertionError(
                            f"rank {rank} {who} trained on example {i} in epoch {epoch + 1}: "
                            "each rank must take its own slice of the training data")
                    owner[i] = rank


def replay(res, config):
    """Single-process training on the combined minibatches the ranks recorded."""
    steps = len(res[0]["epochs"][0])
    init = {k: torch.from_numpy(v) for k, v in res[0]["init"].items()}
    model = _ORIGINAL["ResNetBagOfTricks"](init["whiten.weight"], width=config.width,
                                           ghost_size=config.ghost_size)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    opt, schedule = cifar_tricks.make_optimizer(model, config.batch_size, config.epochs * steps,
                                                lr=config.lr, weight_decay=config.weight_decay)
    for epoch in range(len(res[0]["epochs"])):
        for step in range(steps):
            xb = torch.from_numpy(np.concatenate([o["epochs"][epoch][step][0] for o in res]))
            yb = torch.from_numpy(np.concatenate([o["epochs"][epoch][step][1] for o in res]))
            loss = cifar_tricks.label_smoothing_loss(model(xb), yb, config.label_smoothing).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
    return _params(model)


def _check_leader_only(res):
    steps = sum(len(e) for e in res[0]["epochs"])
    want_updates = steps // CONFIG.ema_every
    for rank, out in enumerate(res):
        if rank == 0:
            if out["ema_made"] != 1 or out["ema_updates"] != want_updates:
                raise AssertionError(
                    f"rank 0 built {out['ema_made']} EMA model(s) and updated it "
                    f"{out['ema_updates']} times in {steps} steps; expected 1 model updated "
                    f"every {CONFIG.ema_every} steps ({want_updates} updates)")
            if out["evaluations"] != CONFIG.epochs:
                raise AssertionError(f"rank 0 validated {out['evaluations']} times in "
                                     f"{CONFIG.epochs} epochs; expected once per epoch")
        elif out["ema_made"] or out["evaluations"]:
            raise AssertionError(f"rank {rank} built {out['ema_made']} EMA model(s) and "
                                 f"validated {out['evaluations']} times: only the leader "
                                 "(rank 0) keeps the EMA model and validates")
