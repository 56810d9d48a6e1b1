"""The Hogwild check of notebook 02 (``train_worker`` and ``hogwild``).

:func:`check_hogwild` runs :func:`.probes.probe_hogwild`, a fresh launch per stage (no verdict
runs beside the student's code), and judges what it recorded, most basic first, each verdict
raised through :func:`~exercise_utils.contract.fail` with its case of the contract
(:mod:`.requirements`): ``train_worker`` alone (its partition, set_epoch, threads, the model
trained in place with plain SGD, in float32, float64 and on a model with frozen, unused and
tied parameters and buffers), then ``hogwild`` with 3 workers (worker processes, partitions,
started together, lock-free, threads, the caller's model trained, spawn), then a worker that
raises (exit code 1) and one killed by SIGKILL (-9): a RuntimeError naming the rank and the
exit code, raised only after every worker was joined; and ``threads=None`` with more workers
than cores (the floor of one thread).

Used in 02_shared_memory_hogwild.
"""
import math
import re
import signal

import numpy as np
import torch
import torch.nn.functional as F

from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks
from ..compare import assert_close, state_arrays
from . import probes
from .probes import (BATCH, EPOCHS, KILL_WORKERS, LR, N_SAMPLES, SEED,
                     SERIAL_CASES, WORKERS, make_model, task_data)
from .reference import reference_partition, short

HOGWILD_TIMEOUT = HANG_AFTER
MIN_ACCURACY = 0.7                          # chance is 0.25; the solution reaches about 1.0
TOLERANCE = {"float32": (1e-5, 1e-4), "float64": (1e-12, 1e-10)}   # atol, rtol


@check
def check_hogwild(path, timeout=HOGWILD_TIMEOUT):
    """Check ``train_worker`` and ``hogwild`` of ``path``: partitions, epochs, threads, plain
    SGD in place on any model, worker processes started together and running lock-free on the
    shared model, and crashed or killed workers reported."""
    res = {}
    for stage, case, verdict in (("serial", "worker-partition", check_serial),
                                 ("hogwild", "hogwild-processes", check_parallel),
                                 ("crash", "crash-exception", check_crashes),
                                 ("kill", "crash-signal", check_kill)):
        # a launch per stage: a stage runs only if the ones before it passed (they cost
        # seconds), and no verdict runs beside the student's code
        res.update(run_ranks(path, probes.probe_hogwild, 1, "none", {"stage": stage},
                             timeout=timeout, what="train_worker / hogwild", case=case)[0])
        verdict(res)


# ---------------------------------------------------------------- train_worker alone
def expected_reads(rank, workers):
    """Sample indices DistributedSampler gives ``rank`` over all epochs (set_epoch each epoch)."""
    return [i for epoch in range(EPOCHS)
            for i in reference_partition(N_SAMPLES, workers, rank, True, SEED, epoch, False)]


def check_serial(res):
    """train_worker(1, WORKERS, ...) alone, on each model of SERIAL_CASES."""
    call = f"train_worker(rank=1, num_workers={WORKERS}, epochs={EPOCHS})"
    base = res["serial"]["worker-partition"]
    _check_reads(call, base["reads"])
    _check_threads(call, base["reads"][0], res["threads"], "worker-threads")
    if base["changed"] == 0:
        fail("worker-in-place", f"{call} did not change the model it was given: train `model` "
                                f"itself in place (an optimizer over model.parameters()), not "
                                f"a copy (\"Update `model` itself, never a copy of it.\")")
    for case, kind, dtype in SERIAL_CASES:
        what = {"mlp": f"a {dtype} MLP", "edge": "a model with frozen, unused, tied and 0-d "
                                                 "parameters and BatchNorm buffers"}[kind]
        atol, rtol = TOLERANCE[dtype]
        assert_close(res["serial"][case]["state"], reference_worker_state(kind, dtype),
                     f"{call} on {what} must take one plain SGD step per batch of its "
                     f"DataLoader: torch.optim.SGD(model.parameters(), lr=lr) with no momentum "
                     f"or weight decay, on F.cross_entropy(model(x), y), in the model's own "
                     f"dtype; the model after it", 0, atol, rtol,
                     case="worker-sgd" if case == "worker-partition" else case, dtype=True)


def _check_reads(call, reads_counts):
    reads, counts = reads_counts
    got = [i for seq in reads.values() for i, _ in seq]
    expected, per_epoch = expected_reads(1, WORKERS), math.ceil(N_SAMPLES / WORKERS)
    if int(counts.sum()) != len(expected):
        fail("worker-partition",
             f"{call} read {int(counts.sum())} samples; it must read exactly its own partition, "
             f"{per_epoch} of the {N_SAMPLES} samples per epoch ({len(expected)} in all), through "
             f"DistributedSampler(dataset, num_replicas={WORKERS}, rank=1, shuffle=True, "
             f"seed=seed)")
    epochs = [got[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    wanted = [expected[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    if epochs[0] == wanted[0] and all(e == epochs[0] for e in epochs):
        fail("worker-set-epoch",
             f"{call} read the same samples in the same order in every epoch "
             f"({short(epochs[0], 8)}): call sampler.set_epoch(epoch) at the start of every "
             f"epoch, or every epoch repeats epoch 0's shuffle (and each worker its epoch-0 "
             f"partition)")
    for epoch, (a, b) in enumerate(zip(epochs, wanted)):
        if a != b:
            fail("worker-partition",
                 f"{call} read {short(a)} in epoch {epoch}; its DistributedSampler (num_replicas="
                 f"{WORKERS}, rank=1, shuffle=True, seed=seed) with set_epoch({epoch}) gives "
                 f"{short(b)}")


def reference_worker_state(kind="mlp", dtype="float32", rank=1):
    """The model after ``train_worker(rank, WORKERS, ...)`` alone: plain SGD on its batches."""
    x, y = task_data(dtype)
    with torch.random.fork_rng(devices=[]):      # the probe's model, without touching ours
        model = make_model(kind, dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        order = reference_partition(N_SAMPLES, WORKERS, rank, True, SEED, epoch, False)
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return state_arrays(model)


def _check_threads(call, reads, threads, case):
    used = sorted({t for seq in reads.values() for _, t in seq})
    if used != [threads]:
        fail(case, f"{call} ran with {used} thread(s), but threads={threads} was asked for: "
                   f"call torch.set_num_threads(threads) in the worker, with the `threads` that "
                   f"hogwild was given")


# ---------------------------------------------------------------- hogwild with WORKERS processes
def check_parallel(res):
    call = f"hogwild(model, dataset, num_workers={WORKERS}, epochs={EPOCHS})"
    out = res["hogwild"]
    reads, counts = out["reads"]
    pids = sorted(reads)
    if res["parent"] in pids or len(pids) != WORKERS:
        where = ("this process (no worker processes)" if res["parent"] in pids
                 else f"{len(pids)} process(es)")
        fail("hogwild-processes", f"{call}: samples were read by {where}; start {WORKERS} "
                                  f"worker processes, each running train_worker for its rank")
    if not (counts == EPOCHS).all():
        low, high = np.nonzero(counts < EPOCHS)[0], np.nonzero(counts > EPOCHS)[0]
        detail = (f"samples {short(high.tolist(), 8)} were read up to {int(counts.max())} "
                  f"times: workers trained on the same samples" if len(high) else
                  f"samples {short(low.tolist(), 8)} were read fewer times (some never)")
        fail("hogwild-partition",
             f"{call}: every sample must be read exactly {EPOCHS} times (once per epoch, by one "
             f"worker), but {detail}. Give each worker its own rank (0 ... num_workers-1), and "
             f"join every worker before returning.")
    expected = {r: expected_reads(r, WORKERS) for r in range(WORKERS)}
    for seq in reads.values():
        samples = [i for i, _ in seq]
        if samples not in expected.values():
            fail("hogwild-partition", f"{call}: a worker read {short(samples)}, which is no "
                                      f"rank's DistributedSampler order (rank 0 expected: "
                                      f"{short(expected[0])})")
    if out["together"] < WORKERS:
        fail("hogwild-together",
             f"{call}: at most {out['together']} worker process(es) were running at the same "
             f"time: the workers trained one after the other. Start them all, then join them "
             f"all (a join right after each start waits for that worker to finish)")
    _check_lock_free(call, out["gate"])
    _check_threads(call, reads, res["threads"], "hogwild-threads")
    _check_shared(call, out)
    if out["forked"]:
        fail("hogwild-spawn",
             f"{call}: the workers were started with fork (a copy of the running process, "
             f"threads excluded: section 1), not spawn. Use torch.multiprocessing.get_context("
             f"\"spawn\").Process (a bare mp.Process forks on Linux up to Python 3.13)")


def _check_lock_free(call, gate):
    if gate["verdict"] == "serial":
        fail("hogwild-lock-free",
             f"{call}: the workers' steps never ran at the same time. The check held the first "
             f"worker inside its first forward pass until the others got there, but "
             f"{len(gate['blocked'])} other worker(s) stayed blocked (asleep, using no CPU, for "
             f"seconds) instead: they waited for something the first one held, a lock around "
             f"the steps? Hogwild takes no lock: every worker reads and updates the shared "
             f"parameters whenever it likes (\"Take no lock\")")


def _check_shared(call, out):
    if out["changed"] == 0:
        fail("hogwild-shared",
             f"{call}: the model in the parent process is unchanged after training, so the "
             f"workers trained private copies. Call model.share_memory() before starting the "
             f"workers, pass `model` itself to every worker, and do not copy it in the worker "
             f"(with the fork start method nothing is shared unless you call share_memory())")
    if out["accuracy"] < MIN_ACCURACY:
        fail("hogwild-shared",
             f"{call}: the shared model reaches only {out['accuracy']:.2f} training accuracy "
             f"(before: {out['accuracy_before']:.2f}; the reference reaches about 1.0; at least "
             f"{MIN_ACCURACY} is required): do all the workers update the very same tensors, "
             f"the parameters of `model`, with plain SGD steps of lr?")


# ---------------------------------------------------------------- crashes
def _names(message, number):
    """Whether ``message`` names ``number`` (a rank, an exit code) as a number of its own."""
    found = re.search(rf"(?<![\d-]){number}(?!\d)" if number >= 0 else rf"{number}(?!\d)",
                      message) is not None
    if number < 0:                  # a signal: its name or number names it too
        name = signal.Signals(-number).name
        found = found or name in message or re.search(rf"signal {-number}(?!\d)", message)
    return bool(found)


def check_crashes(res):
    """The run where rank 0's worker raises (exit code 1), threads=None."""
    crash = res["crash"]
    call = f"hogwild(model, dataset, num_workers={crash['workers']})"
    what = "rank 0's worker raised an exception, so its exit code was 1"
    raised = crash["raised"]
    if raised is None:
        fail("crash-exception",
             f"{call} returned normally although {what}: after joining, check every "
             f"process's exitcode and raise RuntimeError if one is not 0, or failed training "
             f"goes unnoticed")
    _check_raised(call, what, raised, crash, rank=0, code=1, case="crash-message")
    _check_default_threads(res["default_threads"])


def check_kill(res):
    """The run where the only worker is killed by SIGKILL (exit code -9)."""
    kill = res["kill"]
    call = f"hogwild(model, dataset, num_workers={KILL_WORKERS})"
    what = "rank 0's worker was killed by signal 9 (SIGKILL), so its exit code was -9"
    if kill["raised"] is None:
        fail("crash-signal",
             f"{call} returned normally although {what}: a worker killed by a signal has a "
             f"negative exit code, which is not 0 either (`if p.exitcode != 0`, not `> 0`): "
             f"raise RuntimeError for it too")
    _check_raised(call, what, kill["raised"], kill, rank=0, code=-9, case="crash-signal")
    _check_threads(f"hogwild(model, dataset, num_workers={KILL_WORKERS}, "
                   f"threads={res['kill_threads']})", kill["reads"], res["kill_threads"],
                   "hogwild-threads")


def _check_raised(call, what, raised, run, rank, code, case):
    if not raised["runtime"]:
        fail("crash-type", f"{call} raised {raised['type']} when {what}; raise RuntimeError "
                           f"(\"raise RuntimeError (naming the rank and its exit code)\")")
    if run["unseen"]:
        left = ", ".join(f"process {i} (pid {pid})" for i, pid in run["unseen"])
        fail("crash-joined",
             f"{call} raised when {what}, but had not joined every worker first: {left} "
             f"never joined (left running, or a zombie). Start them all, then join them all, "
             f"and only then raise")
    if not (_names(raised["message"], rank) and _names(raised["message"], code)):
        fail(case, f"{call} raised RuntimeError when {what}, with the message "
                   f"{raised['message'][:300]!r}: name the rank ({rank}) and its exit code "
                   f"({code}) in it (\"naming the rank and its exit code\")")


def _check_default_threads(default):
    call = f"hogwild(model, dataset, num_workers={default['workers']}) (threads=None)"
    used = sorted({t for seq in default["reads"].values() for _, t in seq})
    if used != [default["share"]]:
        got = f"ran with {used} thread(s)" if used else "read no sample"
        fail("default-threads",
             f"{call}: the workers {got}; threads=None means max(1, os.cpu_count() // "
             f"num_workers) = {default['share']} thread(s) per worker on this machine (its "
             f"share of the cores: more threads than cores slow everything down; with more "
             f"workers than cores the share is 0, and torch.set_num_threads(0) fails: hence "
             f"the max(1, ...))")
