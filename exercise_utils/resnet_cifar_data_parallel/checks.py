"""Checkers of notebook 04: ``rank_process`` (:mod:`.checks_rank`) and the data-parallel ``train``.

``check_train`` runs the student's ``work/04_cifar_dp.py`` in one launch of 3 fresh processes
through :func:`.probes.probe_train`, once per run of :data:`.probes.TRAIN_RUNS` (2 ranks; 3
ranks; 1 rank with ``ema_every`` 3; every run 2 epochs, a training set that leaves a
remainder). The probe records what the trainer's parts from :mod:`.tricks` and the
model saw: every minibatch each rank trained on, the parameters and buffers at the first step
(frozen parameters and BatchNorm statistics drawn at random per rank), the parameters at the
last, which ranks built and updated an EMA model and which validated. Per run, the checker
then replays single-process training on the combined batches (rank 0's minibatch, then rank
1's, ... step by step) and demands the same parameters. Ghost BatchNorm (statistics per ghost
batch of 8 examples, one ghost batch per minibatch) makes that equality exact up to rounding.
The verdicts come one promise at a time over every run, the most basic first; each failure
names its case of the contract (:mod:`.requirements`).

Used in 04_resnet_cifar_data_parallel.
"""
import copy
import dataclasses

import numpy as np
import torch

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, assert_close, check, run_ranks
from . import probes, runner, tricks
from .checks_rank import check_rank_process, distinct_ports  # noqa: F401 - the CHECK cell's
from .probes import CONFIG, LAUNCH, ORIGINAL, TRAIN_RUNS, params

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
HANG_HINT = ("\nA rank that runs more minibatches than the others waits forever in all_reduce "
             "(until the timeout): give every rank the same number of examples (drop the "
             "remainder) so that every rank runs the same number of minibatches.")


@check
def check_train(path, timeout=TIMEOUT):
    """Check the data-parallel ``train`` with 1, 2 and 3 ranks: equal to single-process
    training on the whole batch, from rank 0's model, with the leader alone keeping, updating
    and validating the EMA model."""
    ports = distinct_ports(len(TRAIN_RUNS) + 1)
    runs = [(name, world, dataclasses.replace(CONFIG, master_port=port, **changes))
            for (name, world, changes), port in zip(TRAIN_RUNS, ports[1:])]
    try:
        res = run_ranks(path, probes.probe_train, LAUNCH, "none",
                        kwargs=dict(runs=runs, port=ports[0]), timeout=timeout,
                        what="rank_process + train with 1, 2 and 3 gloo ranks", warm_up=True,
                        case="train-counts")
    except CheckFailure as err:
        raise CheckFailure(str(err) + (HANG_HINT if "hung" in str(err) else ""),
                           err.case) from None
    done = [(name, world, config, [res[r][name] for r in range(world)])
            for name, world, config in runs if name in res[0]]
    for run in done:
        _check_errors(run, waits=False)
    for run in done:
        _check_counts(run)
    for run in done:
        _check_errors(run, waits=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # the replays: tiny convolutions, 10x slower on 2 threads
    try:                              # of a busy machine
        for verdict in (_check_slices, _check_init, _check_step, _check_leader, _check_ema,
                        _check_validates, _check_returns):
            for run in done:
                verdict(run)
    finally:
        torch.set_num_threads(threads)


def _waited(error):
    """Whether an error is what a rank gets when its peers never join (timeout, peer gone)."""
    words = ("timed out", "timeout", "connection", "closed", "peer", "gloo")
    return any(w in error.split("\n")[0].lower() for w in words)


def _check_errors(run, waits):
    """The first error of the run (a bug), or with ``waits`` the first of any kind (a rank
    left waiting for its peers), charged to the part of train that raised it."""
    name, _, _, outs = run
    errors = sorted((out["error"]["time"], rank, out["error"]) for rank, out in enumerate(outs)
                    if out["error"])
    if errors and (waits or not _waited(errors[0][2]["text"])):
        _, rank, error = errors[0]
        fail(error["case"] or "train-step", f"rank {rank} of the run with {name} raised "
                                            f"{error['text']}")


def _check_counts(run):
    name, world, config, outs = run
    counts = [[len(e) for e in out["epochs"]] for out in outs]
    if len(set(map(tuple, counts))) > 1:
        shown = ", ".join(f"rank {r} ran {c}" for r, c in enumerate(counts))
        fail("train-counts", f"run with {name}: minibatches per epoch differ: {shown} (training "
                             f"set of {config.train_size} examples, batch {config.batch_size} "
                             f"= {world} rank(s) x minibatch {config.batch_size // world})."
                             f"{HANG_HINT}")
    if not counts[0] or not counts[0][0]:
        fail("train-counts", f"run with {name}: no minibatch was trained on: train must loop "
                             "over T.minibatches(x_local, y_local, minibatch_size, ...)")


def _check_slices(run):
    name, world, config, outs = run
    train = runner.load_data(config, "train", verbose=False)
    index = {row.tobytes(): i for i, row in enumerate(train.x.numpy())}
    minibatch = config.batch_size // world
    for epoch in range(len(outs[0]["epochs"])):
        owner = {}
        for rank, out in enumerate(outs):
            for xb, _ in out["epochs"][epoch]:
                if len(xb) != minibatch:
                    fail("train-slices", f"run with {name}: rank {rank} trained on minibatches "
                                         f"of {len(xb)} examples; with batch "
                                         f"{config.batch_size} and {world} rank(s) each rank's "
                                         f"minibatch is {minibatch}")
                for row in xb:
                    i = index.get(row.tobytes())
                    if i is None:
                        fail("train-slices", f"run with {name}: rank {rank} trained on an "
                                             "image that is not in the training set")
                    if i in owner:
                        who = "twice" if owner[i] == rank else f"and rank {owner[i]} both"
                        fail("train-slices",
                             f"run with {name}: rank {rank} {who} trained on example {i} in "
                             f"epoch {epoch + 1}: each rank must take its own slice of the "
                             "training data")
                    owner[i] = rank
    per_rank = config.train_size // world
    for rank, out in enumerate(outs):
        got = (out["summary"] or {}).get("examples") if isinstance(out["summary"], dict) else None
        if got is not None and got != per_rank:
            fail("train-slices", f"run with {name}: rank {rank} holds {got} training examples; "
                                 f"give every rank len(data) // world_size = "
                                 f"{config.train_size} // {world} = {per_rank} (drop only the "
                                 f"remainder)")


def _check_init(run):
    name, _, _, outs = run
    for rank, out in enumerate(outs[1:], start=1):
        assert_close(out["init"], outs[0]["init"], f"run with {name}: parameters and buffers "
                     "at the first training step must be rank 0's on every rank, frozen "
                     "parameters and BatchNorm statistics included (the given code seeds every "
                     "rank differently): broadcast every tensor of model.state_dict() from "
                     "rank 0 after building the model", rank, atol=0, rtol=0,
                     case="train-init", dtype=True)
    if outs[0]["built"] is not None:
        assert_close(outs[0]["init"], outs[0]["built"], f"run with {name}: rank 0's parameters "
                     "and buffers at the first training step must be those its model was built "
                     "with: every rank starts from rank 0's model, so rank 0's must not change "
                     "(broadcast from rank 0; averaging the ranks' models changes it)", 0,
                     atol=0, rtol=0, case="train-init", dtype=True)


def replay(outs, config):
    """Single-process training on the combined minibatches the ranks recorded, one step at a
    time, each step from rank 0's parameters before it (so that rounding differences never
    grow over steps); its EMA built from the starting model and updated with rank 0's
    parameters after steps ``ema_every``, ``2 * ema_every``, ... (counted over all epochs).

    Returns:
        (parameters after each step, the EMA model's parameters)
    """
    rank0 = outs[0]
    steps = len(rank0["epochs"][0])
    init = {k: torch.from_numpy(v) for k, v in rank0["init"].items()}
    model = ORIGINAL["ResNetBagOfTricks"](init["whiten.weight"], width=config.width,
                                          ghost_size=config.ghost_size)
    model.load_state_dict(init)
    names = dict(model.named_parameters())
    before = [{k: v for k, v in rank0["init"].items() if k in names}] + rank0["trajectory"]
    opt, schedule = tricks.make_optimizer(model, config.batch_size, config.epochs * steps,
                                          lr=config.lr, weight_decay=config.weight_decay)
    ema = replay_ema(outs, config)
    batches = [[o["epochs"][e][i] for o in outs] for e in range(len(rank0["epochs"]))
               for i in range(steps)]
    after = []
    for step, parts in enumerate(batches):
        _load(model, before[step])
        xb = torch.from_numpy(np.concatenate([x for x, _ in parts]))
        yb = torch.from_numpy(np.concatenate([y for _, y in parts]))
        loss = tricks.label_smoothing_loss(model(xb), yb, config.label_smoothing).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        after.append(params(model))
    return after, ema


def replay_ema(outs, config, lag=0):
    """The EMA model's parameters: built from rank 0's starting model and updated with rank
    0's parameters after steps ``ema_every``, ``2 * ema_every``, ... (``lag`` 1: with those
    before each of these steps, i.e. one step behind)."""
    rank0 = outs[0]
    init = {k: torch.from_numpy(v) for k, v in rank0["init"].items()}
    model = ORIGINAL["ResNetBagOfTricks"](init["whiten.weight"], width=config.width,
                                          ghost_size=config.ghost_size)
    model.load_state_dict(init)
    names = dict(model.named_parameters())
    states = ([{k: v for k, v in rank0["init"].items() if k in names}] + rank0["trajectory"]
              + [rank0["final"]])                    # states[s]: after step s
    ema, current = ORIGINAL["EMA"](model, config.ema_momentum), copy.deepcopy(model)
    for step in range(config.ema_every, len(states), config.ema_every):
        _load(current, states[step - lag])
        ema.update(current)
    return params(ema.model)


def _load(model, arrays):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(arrays[name]))


def _check_step(run):
    name, world, config, outs = run
    want, outs[0]["replayed_ema"] = replay(outs, config)
    total = len(want)
    for step, expected in enumerate(want):
        for rank, out in enumerate(outs):
            got = (out["trajectory"] + [out["final"]])[step]
            assert_close(got, expected, f"run with {name}: parameters after step {step + 1} of "
                         f"{total} must equal single-process training's step on the combined "
                         f"batch (rank 0's minibatch then rank 1's ..., loss summed over the "
                         f"batch, optimizer built for {config.batch_size} examples per step) "
                         f"from the same parameters. Too large or too small by a factor of "
                         f"{world}? Scale the all-reduced gradients by 1 / world_size (not by "
                         f"a constant)", rank, atol=2e-5, rtol=2e-4, case="train-step")


def _check_leader(run):
    name, _, _, outs = run
    for rank, out in enumerate(outs[1:], start=1):
        if out["ema_made"] or out["evaluated"]:
            fail("train-leader", f"run with {name}: rank {rank} built {out['ema_made']} EMA "
                                 f"model(s) and validated {len(out['evaluated'])} times: only "
                                 "the leader (rank 0) keeps the EMA model and validates")
    if outs[0]["ema_made"] != 1:
        fail("train-leader", f"run with {name}: rank 0 built {outs[0]['ema_made']} EMA models; "
                             "expected one, built once before training")


def _check_ema(run):
    """The leader updated its EMA after the right steps; its weights equal the replay's EMA."""
    name, _, config, outs = run
    out = outs[0]
    steps = sum(len(e) for e in out["epochs"])
    every = config.ema_every
    want_steps = list(range(every, steps + 1, every))
    if out["ema_steps"] != want_steps:
        fail("train-ema",
             f"run with {name}: rank 0 updated its EMA model after optimizer steps "
             f"{out['ema_steps']} of {steps}; expected after steps {want_steps}: every "
             f"config.ema_every = {every} steps, counting steps from 1 over all epochs (do not "
             f"restart the count each epoch) and updating after opt.step() (step += 1 first, "
             f"then if step % config.ema_every == 0)")
    assert_close(out["ema"], out["replayed_ema"], f"run with {name}: the EMA model's weights "
                 f"after {steps} steps must be those of single-process training's EMA "
                 f"(T.EMA(model, config.ema_momentum) built from the starting model, "
                 f"ema.update(model) after steps {want_steps}, each after opt.step())", 0,
                 atol=2e-5, rtol=2e-4, case="train-ema", mistakes={
                     "one step behind: these are the weights of an EMA updated with the "
                     "parameters from BEFORE each of those optimizer steps. Update the EMA "
                     "after opt.step().": lambda: replay_ema(outs, config, lag=1)})


def _check_validates(run):
    name, _, config, outs = run
    if outs[0]["evaluated"] != ["the EMA model"] * config.epochs:
        fail("train-validates", f"run with {name}: rank 0 validated "
                                f"{outs[0]['evaluated'] or 'nothing'} in {config.epochs} "
                                f"epochs; expected the EMA model (ema.model) once per epoch")


def _check_returns(run):
    """What train returns: this rank's sizes and counts; the leader's records, one per epoch
    with the accuracy its validation measured; none on the other ranks."""
    name, world, config, outs = run
    for rank, out in enumerate(outs):
        got = out["summary"]
        want = dict(rank=rank, world_size=world, examples=config.train_size // world,
                    minibatch_size=config.batch_size // world,
                    minibatches_per_epoch=len(out["epochs"][0]))
        wrong = {k: got.get(k) for k in want if got.get(k) != want[k]} if isinstance(
            got, dict) else {"summary": got}
        accuracies = [e.get("val_acc") for e in got.get("epochs", [])] if not wrong else None
        expected = out["accuracies"] if rank == 0 else []
        if wrong or accuracies != expected:
            fail("train-returns", f"run with {name}: rank {rank}'s train returned "
                                  f"{wrong or {'validation accuracies': accuracies}}; expected "
                                  f"{ {k: want[k] for k in wrong} if wrong else expected}: "
                                  f"return runner.summary(...) as the given code does, with "
                                  f"one record per epoch on the leader (history.append("
                                  f"runner.epoch_record(...)) after validating) and none on "
                                  f"the other ranks")
