"""Checkers of notebook 04: ``rank_process`` and the data-parallel ``train``.

Both run the student's ``work/04_cifar_dp.py`` in 2 fresh processes through the probes of
:mod:`.probes`, which record what the trainer's parts from :mod:`.tricks` and the model saw:
every minibatch each rank trained on, the parameters at the first and the last step, which
ranks built and updated an EMA model and which validated. The checker then replays
single-process training on the combined batches (rank 0's minibatch, then rank 1's, step by
step) and demands the same parameters. Ghost BatchNorm (statistics per ghost batch of 8
examples, one ghost batch per minibatch) makes that equality exact up to rounding.

Used in 04_resnet_cifar_data_parallel.
"""
import numpy as np
import torch

from ..harness import HANG_AFTER, assert_close, run_ranks
from . import probes, runner, tricks
from .probes import CONFIG, MINIBATCH, ORIGINAL, WORLD, params

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
HANG_HINT = ("\nA rank that runs more minibatches than the others waits forever in all_reduce "
             "(until the timeout): give every rank the same number of examples (drop the "
             "remainder) so that every rank runs the same number of minibatches.")


def check_rank_process(path, timeout=TIMEOUT):
    """Check ``rank_process``: the store at the config's port with its timeout, a gloo group of
    2 with the same timeout, train called, a barrier, the group destroyed (also after a raise)."""
    from ..launch import free_port
    res = run_ranks(path, probes.probe_rank_process, WORLD, "none",
                    kwargs=dict(config=CONFIG, ports=_two_ports(free_port)), timeout=timeout,
                    what="rank_process with 2 ranks", warm_up=True)
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
        _check_rendezvous(rank, seen, got["port"])
        if got.get("value") != {"rank": rank, "ok": True}:
            raise AssertionError(f"rank {rank}: rank_process returned {got.get('value')!r}; "
                                 "it must return what train returned")
        if got["still_initialized"]:
            raise AssertionError(f"rank {rank}: the process group is still initialized after "
                                 "rank_process returned: call dist.destroy_process_group() "
                                 "(after a final dist.barrier())")
        after = got["events"][got["events"].index("train returned") + 1:]
        destroy = "dist.destroy_process_group()"
        if "dist.barrier()" not in after[:after.index(destroy) if destroy in after else None]:
            raise AssertionError(f"rank {rank}: after train returned, rank_process called "
                                 f"{' then '.join(after) or 'nothing'}; expected dist.barrier() "
                                 "and then dist.destroy_process_group(): the barrier makes every "
                                 "rank finish its last collective before any rank tears the "
                                 "group down")
        bad = out.get("raises", {})
        if "raised" not in bad or "train failed on purpose" not in bad["raised"]:
            raise AssertionError(f"rank {rank}: when train raises, rank_process must let the "
                                 f"exception through (got {bad.get('value', bad)!r})")
        if bad["still_initialized"]:
            raise AssertionError(f"rank {rank}: when train raised, the process group was left "
                                 "initialized: destroy it in a `finally:` block")


def _check_rendezvous(rank, seen, port):
    """The store at the config's port; the store and the group with the config's timeout."""
    want = CONFIG.timeout_s
    if seen["port"] != port:
        raise AssertionError(f"rank {rank}: the process group's store listens on port "
                             f"{seen['port']}; expected config.master_port = {port}: create the "
                             f"dist.TCPStore at config.master_addr, config.master_port")
    for what, key, default in (("the TCPStore", "store_timeout", "5 minutes"),
                               ("the process group", "group_timeout", "30 minutes for gloo")):
        got = seen[key]
        if got is not None and abs(got - want) > 0.5:
            raise AssertionError(
                f"rank {rank}: {what} has a timeout of {got:g} s; expected config.timeout_s = "
                f"{want:g} s. Pass timeout=datetime.timedelta(seconds=config.timeout_s) to "
                f"dist.TCPStore and to dist.init_process_group (their defaults: {default}; a "
                f"rank waiting for a peer that never comes would block that long)")


def _two_ports(free_port):
    ports = [free_port()]
    while len(ports) < 2:
        ports += [p for p in [free_port()] if p not in ports]
    return ports


def check_train(path, timeout=TIMEOUT):
    """Check the data-parallel ``train``: equal to single-process training on the whole batch."""
    try:
        res = run_ranks(path, probes.probe_train, WORLD, "none",
                        kwargs=dict(config=CONFIG), timeout=timeout,
                        what="rank_process + train with 2 gloo ranks", warm_up=True)
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
                     "be rank 0's on every rank (the given code seeds every rank differently): "
                     "broadcast rank 0's parameters and buffers after building the model",
                     rank, atol=0, rtol=0)
    want, want_ema = replay(res, CONFIG)
    for rank, out in enumerate(res):
        assert_close(out["final"], want, f"parameters after {len(res[0]['epochs'])} epochs must "
                     "equal single-process training on the combined batches (rank 0's minibatch "
                     "then rank 1's, loss summed over the batch, optimizer built for "
                     f"{CONFIG.batch_size} examples per step). Too large or too small by "
                     f"a factor of {WORLD}? Check how the all-reduced gradients are scaled",
                     rank, atol=2e-5, rtol=2e-4)
    _check_leader_only(res, want_ema)


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
    train = runner.load_data(CONFIG, "train", verbose=False)
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
    """Single-process training on the combined minibatches the ranks recorded, with its EMA
    updated after steps ``ema_every``, ``2 * ema_every``, ...; returns both models' parameters."""
    steps = len(res[0]["epochs"][0])
    init = {k: torch.from_numpy(v) for k, v in res[0]["init"].items()}
    model = ORIGINAL["ResNetBagOfTricks"](init["whiten.weight"], width=config.width,
                                           ghost_size=config.ghost_size)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    opt, schedule = tricks.make_optimizer(model, config.batch_size, config.epochs * steps,
                                                lr=config.lr, weight_decay=config.weight_decay)
    ema, done = ORIGINAL["EMA"](model, config.ema_momentum), 0
    for epoch in range(len(res[0]["epochs"])):
        for step in range(steps):
            xb = torch.from_numpy(np.concatenate([o["epochs"][epoch][step][0] for o in res]))
            yb = torch.from_numpy(np.concatenate([o["epochs"][epoch][step][1] for o in res]))
            loss = tricks.label_smoothing_loss(model(xb), yb, config.label_smoothing).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            done += 1
            if done % config.ema_every == 0:
                ema.update(model)
    return params(model), params(ema.model)


def _check_leader_only(res, want_ema):
    """Rank 0 alone built an EMA model, updated it after the right steps (its weights equal the
    replay's EMA) and validated it, the EMA model, once per epoch."""
    steps = sum(len(e) for e in res[0]["epochs"])
    every = CONFIG.ema_every
    want_steps = list(range(every, steps + 1, every))
    for rank, out in enumerate(res[1:], start=1):
        if out["ema_made"] or out["evaluated"]:
            raise AssertionError(f"rank {rank} built {out['ema_made']} EMA model(s) and "
                                 f"validated {len(out['evaluated'])} times: only the leader "
                                 "(rank 0) keeps the EMA model and validates")
    out = res[0]
    if out["ema_made"] != 1:
        raise AssertionError(f"rank 0 built {out['ema_made']} EMA models; expected one, built "
                             "once before training")
    if out["ema_steps"] != want_steps:
        raise AssertionError(
            f"rank 0 updated its EMA model after optimizer steps {out['ema_steps']} of {steps}; "
            f"expected after steps {want_steps}: every config.ema_every = {every} steps, counting "
            f"steps from 1 and updating after opt.step() (step += 1 first, then "
            f"if step % config.ema_every == 0)")
    assert_close(out["ema"], want_ema, f"the EMA model's weights after {steps} steps must be "
                 f"those of single-process training's EMA (T.EMA(model, config.ema_momentum) "
                 f"built from the starting model, ema.update(model) after steps {want_steps})",
                 0, atol=2e-5, rtol=2e-4)
    if out["evaluated"] != ["the EMA model"] * CONFIG.epochs:
        raise AssertionError(f"rank 0 validated {out['evaluated'] or 'nothing'} in "
                             f"{CONFIG.epochs} epochs; expected the EMA model (ema.model) once "
                             f"per epoch")
