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
It also replays rank 0's own forward passes (its minibatch alone, from its parameters before
each step): their losses are what each epoch record's training loss must be, and their
BatchNorm running statistics are what the EMA model copies; the judge evaluates the replayed
EMA model at the end of each epoch on the test set it loads itself and demands the accuracy
the leader recorded (examples decided by a hair count either way).
The verdicts come one promise at a time over every run, the most basic first; each failure
names its case of the contract (:mod:`.requirements`).

Used in 04_resnet_cifar_data_parallel.
"""
import copy
import dataclasses

import numpy as np
import torch

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, run_ranks
from ..compare import assert_close
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
                        _check_validates, _check_returns, _check_loss, _check_accuracy):
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


def _start(outs, config):
    """The model rank 0 trained from (its parameters and buffers at the first step), and the
    parameters before each step (``[s]``: before step ``s + 1``; the last: after the last)."""
    rank0 = outs[0]
    init = {k: torch.from_numpy(v) for k, v in rank0["init"].items()}
    model = ORIGINAL["ResNetBagOfTricks"](init["whiten.weight"], width=config.width,
                                          ghost_size=config.ghost_size)
    model.load_state_dict(init)
    names = dict(model.named_parameters())
    states = ([{k: v for k, v in rank0["init"].items() if k in names}] + rank0["trajectory"]
              + [rank0["final"]])
    return model, states


def replay(outs, config):
    """Single-process training on the combined minibatches the ranks recorded, one step at a
    time, each step from rank 0's parameters before it (so that rounding differences never
    grow over steps); its EMA built from the starting model and updated with rank 0's
    parameters after steps ``ema_every``, ``2 * ema_every``, ... (counted over all epochs).

    Returns:
        (parameters after each step, the EMA model's parameters, :func:`replay_leader`'s
        record of the leader)
    """
    rank0 = outs[0]
    steps = len(rank0["epochs"][0])
    model, before = _start(outs, config)
    opt, schedule = tricks.make_optimizer(model, config.batch_size, config.epochs * steps,
                                          lr=config.lr, weight_decay=config.weight_decay)
    leader = replay_leader(outs, config)
    ema = replay_ema(outs, config, buffers=leader["buffers"])
    batches = [[o["epochs"][e][i] for o in outs] for e in range(len(rank0["epochs"]))
               for i in range(steps)]
    after = []
    for step, parts in enumerate(batches):
        _load(model, before[step])
        xb = torch.from_numpy(np.concatenate([x for x, _ in parts]))
        yb = torch.from_numpy(np.concatenate([y for _, y in parts]))
        losses = tricks.label_smoothing_loss(model(xb), yb, config.label_smoothing)
        leader["all_losses"].append(losses.detach().double().numpy())
        opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        opt.step()
        schedule.step()
        after.append(params(model))
    return after, ema, leader


def replay_leader(outs, config):
    """What the leader's own forward passes give, replayed from rank 0's parameters before
    each step on its minibatch alone (training mode, one ghost batch): the examples' losses
    of each step and the model's buffers (BatchNorm running statistics) after each step, which
    the EMA model copies.

    Returns:
        dict: ``losses`` (per step, an array), ``buffers`` (``[s]``: after ``s`` steps),
        ``all_losses`` (filled by :func:`replay`: per step, every rank's examples' losses).
    """
    model, before = _start(outs, config)
    names = dict(model.named_parameters())
    buffers = [{k: v.clone() for k, v in model.state_dict().items() if k not in names}]
    losses = []
    with torch.no_grad():
        for step, (xb, yb) in enumerate(e for epoch in outs[0]["epochs"] for e in epoch):
            _load(model, before[step])
            out = model(torch.from_numpy(xb))
            losses.append(tricks.label_smoothing_loss(out, torch.from_numpy(yb),
                                                      config.label_smoothing).double().numpy())
            buffers.append({k: v.clone() for k, v in model.state_dict().items()
                            if k not in names})
    return dict(losses=losses, buffers=buffers, all_losses=[])


def replay_ema(outs, config, lag=0, buffers=None):
    """The EMA model's parameters: built from rank 0's starting model and updated with rank
    0's parameters after steps ``ema_every``, ``2 * ema_every``, ... (``lag`` 1: with those
    before each of these steps, i.e. one step behind). With ``buffers`` (rank 0's after each
    step, :func:`replay_leader`) the EMA copies them too, and the result is ``(parameters,
    [the EMA model's state at the end of each epoch])``."""
    model, states = _start(outs, config)             # states[s]: after step s
    steps = len(outs[0]["epochs"][0])
    ema, current = ORIGINAL["EMA"](model, config.ema_momentum), copy.deepcopy(model)
    ends = []
    for step in range(1, len(states)):
        if step % config.ema_every == 0 and step - lag >= 0:
            _load(current, states[step - lag])
            if buffers is not None:
                current.load_state_dict(buffers[step - lag], strict=False)
            ema.update(current)
        if buffers is not None and steps and step % steps == 0:
            ends.append(copy.deepcopy(ema.model))
    return (params(ema.model), ends) if buffers is not None else params(ema.model)


def _load(model, arrays):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(arrays[name]))


def _check_step(run):
    name, world, config, outs = run
    want, (outs[0]["replayed_ema"], outs[0]["ema_ends"]), outs[0]["leader"] = replay(outs,
                                                                                    config)
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


def _records(run):
    """The leader's epoch records (``_check_returns`` made sure there is one per epoch)."""
    return run[3][0]["summary"]["epochs"]


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _check_loss(run):
    """Each epoch record's training loss: the mean loss per example of rank 0's minibatches
    of that epoch, as the judge's replay computes it (from rank 0's parameters before each
    step), as the notebook says (the mean over every rank's minibatches is named as such)."""
    name, _, _, outs = run
    leader, steps = outs[0]["leader"], len(outs[0]["epochs"][0])
    for epoch, record in enumerate(_records(run)):
        part = slice(epoch * steps, (epoch + 1) * steps)
        mine = np.concatenate(leader["losses"][part])
        every = np.concatenate(leader["all_losses"][part])
        want, got = mine.mean(), record.get("train_loss")
        if _number(got) and abs(got - want) <= 1e-4 * abs(want) + 1e-6:
            continue
        hint = ""
        if _number(got):
            for value, what in ((mine.sum(), "the sum over the epoch (loss_sum), not divided by "
                                             "seen"),
                                (mine.sum() / steps, "the mean per minibatch (divided by the "
                                                     "minibatches, not by the examples seen)"),
                                (leader["losses"][part][-1].mean(), "the last minibatch's "
                                                                    "alone"),
                                (every.mean(), "the mean over every rank's minibatches, not "
                                               "rank 0's")):
                if abs(got - value) <= 1e-4 * abs(value) + 1e-6:
                    hint = f" {got:.6g} is {what}."
        fail("train-loss", f"run with {name}: the leader's record of epoch {epoch + 1} has "
                           f"training loss {got!r}; expected {want:.6g}, the loss per example "
                           f"of rank 0's {steps} minibatches of that epoch (the checker "
                           f"recomputed it from the minibatches and parameters rank 0 trained "
                           f"with).{hint} Each epoch's record holds the training loss per "
                           f"example of rank 0's minibatches: history.append("
                           f"runner.epoch_record(epoch, seconds, loss_sum / seen, accuracy))")


def _accuracy_range(model, x, y):
    """The accuracies ``T.evaluate(model, x, y)`` can give, as (low, high): the examples
    whose true class wins or loses by a hair (within rounding of the replay) count either
    way."""
    model.eval()
    with torch.no_grad():
        logits = (model(x) + model(x.flip(3))).double()
    true = logits.gather(1, y.view(-1, 1)).squeeze(1)
    others = logits.scatter(1, y.view(-1, 1), float("-inf")).max(1).values
    margin, tol = true - others, 2e-5 * max(1.0, float(logits.abs().max()))
    return float((margin > tol).sum()) / len(y), float((margin >= -tol).sum()) / len(y)


def _check_accuracy(run):
    """Each epoch record's validation accuracy: what the EMA model at the end of that epoch
    (the judge's replay: parameters and copied buffers) scores on the test set the judge
    loads itself."""
    name, _, config, outs = run
    test = runner.load_data(config, "test", verbose=False)
    for epoch, (record, model) in enumerate(zip(_records(run), outs[0]["ema_ends"])):
        low, high = _accuracy_range(model, test.x, test.y)
        got = record.get("val_acc")
        if _number(got) and low - 1e-9 <= got <= high + 1e-9:
            continue
        want = f"{low:.4g}" if high == low else f"between {low:.4g} and {high:.4g}"
        fail("train-accuracy", f"run with {name}: the leader's record of epoch {epoch + 1} "
                               f"has validation accuracy {got!r}; the EMA model at the end of "
                               f"that epoch scores {want} on the test set ({len(test.y)} "
                               f"images: the checker evaluated it). The leader validates on "
                               f"the test set (test_set, which the given code loads for the "
                               f"leader): accuracy = T.evaluate(ema.model, test_set.x, "
                               f"test_set.y), never on training data")
