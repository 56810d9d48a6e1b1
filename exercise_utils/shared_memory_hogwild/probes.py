"""Checker of notebook 02's Hogwild exercise: ``train_worker`` and ``hogwild``.

``check_hogwild`` trains a small model with the student's ``train_worker`` (in the
checker's process, as rank 1 of 3) and ``hogwild`` (3 worker processes), reading every
sample through a :class:`RecordingDataset` that logs, in shared memory, which process read
which sample, in which order and with how many threads; then it makes one worker crash.
``probe_hogwild`` runs in a fresh process of the harness
(:func:`exercise_utils.harness.run_ranks`), never in the notebook kernel.
The sampler exercise's checker is :mod:`exercise_utils.checks_sampler`.

Used in 02_shared_memory_hogwild.
"""
import importlib
import math
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import torch

from .checks_sampler import _order, _short, reference_partition
from .config import quick
from .harness import run_ranks, state_arrays
from .models import TinyMLP

MODULE = "exercise_utils.checks_hogwild"
TIMEOUT = quick(150, 120)   # seconds before the check is declared hung: it starts 5 processes


# ---------------------------------------------------------------- hogwild
N_SAMPLES, FEATURES, CLASSES = 240, 20, 4   # 240 = 80 per worker with 3 workers, 120 with 2
EPOCHS, BATCH, LR, SEED = 3, 16, 0.2, 5
MIN_ACCURACY = 0.7                          # chance is 0.25; the solution reaches about 1.0


class RecordingDataset(torch.utils.data.Dataset):
    """A map-style dataset that logs every read in shared memory (works across processes).

    ``dataset[i]`` returns ``(x[i], y[i])`` and records, for the k-th read of sample i, the
    reading process's pid, a per-process sequence number and ``torch.get_num_threads()``.
    Reading sample ``fail_index`` raises (to crash the worker that owns it).
    """

    def __init__(self, x, y, slots, fail_index=None):
        n = len(y)
        self.x, self.y, self.fail_index = x, y, fail_index
        self.count = torch.zeros(n, dtype=torch.int64).share_memory_()
        self.pid, self.seq, self.threads = (torch.full((n, slots), -1, dtype=torch.int64)
                                            .share_memory_() for _ in range(3))
        self._next = 0          # per process: every process reads its own unpickled copy
        # Two workers may read the same sample at once (in different epochs): claiming a slot
        # is a read-modify-write of shared memory, so it takes a lock (inherited or passed to
        # the workers at start, as multiprocessing allows) or one read could overwrite another.
        self.lock = multiprocessing.get_context("spawn").Lock()   # usable by fork and spawn

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        if not isinstance(index, int):
            index = torch.as_tensor(index)
            if index.dim() > 0:     # a batch of indices: record each, return stacked tensors
                pairs = [self[int(i)] for i in index]
                return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            index = int(index)
        with self.lock:
            k = int(self.count[index])
            self.count[index] += 1
        if k < self.pid.shape[1]:
            self.pid[index, k], self.seq[index, k] = os.getpid(), self._next
            self.threads[index, k] = torch.get_num_threads()
        self._next += 1
        if index == self.fail_index:
            raise RuntimeError(f"checker: sample {index} makes this worker crash on purpose")
        return self.x[index], self.y[index]

    def reads(self):
        """Return ``{pid: [(sample, threads), ...] in read order}`` and the read counts."""
        per_pid = {}
        for i, k in zip(*np.nonzero(self.pid.numpy() >= 0)):
            per_pid.setdefault(int(self.pid[i, k]), []).append(
                (int(self.seq[i, k]), int(i), int(self.threads[i, k])))
        return ({pid: [(i, t) for _, i, t in sorted(v)] for pid, v in per_pid.items()},
                self.count.numpy().copy())


def task_data():
    """A learnable toy task: 4 Gaussian clusters in 20 dimensions, balanced classes."""
    g = torch.Generator().manual_seed(1)
    centers = 1.5 * torch.randn(CLASSES, FEATURES, generator=g)
    y = torch.arange(N_SAMPLES) % CLASSES
    x = centers[y] + torch.randn(N_SAMPLES, FEATURES, generator=g)
    return x, y


def _model():
    torch.manual_seed(3)
    return TinyMLP(FEATURES, 16, CLASSES)


def _accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _importable(student):
    """Import the student's file under its own name (``02_hogwild``), as the spawned workers
    will: they find ``train_worker`` by module name on ``sys.path``, inherited from here."""
    path = Path(student.__file__).resolve()
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return importlib.import_module(path.stem)


def probe_hogwild(student, ctx, workers=3, crash_workers=2):
    """Run train_worker in this process, hogwild with ``workers`` processes, then a crash."""
    module = _importable(student)
    x, y = task_data()
    threads = 1 if torch.get_num_threads() != 1 else 2    # differs from the inherited default
    out = {"parent": os.getpid(), "threads": threads}
    # 1. train_worker alone, in this process, as rank 1 of `workers`
    model, data = _model(), RecordingDataset(x, y, EPOCHS)
    before = state_arrays(model)
    module.train_worker(1, workers, model, data, EPOCHS, BATCH, LR, SEED, threads)
    out["serial"] = {"reads": data.reads(), "changed": _changed(before, model)}
    try:
        _check_serial(out, workers)
    except AssertionError:
        return out          # the checker reports it; no need to start processes
    # 2. hogwild with `workers` processes
    model, data = _model(), RecordingDataset(x, y, EPOCHS)
    before, acc_before = state_arrays(model), _accuracy(model, x, y)
    module.hogwild(model, data, workers, epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED,
                   threads=threads)
    out["hogwild"] = {"reads": data.reads(), "changed": _changed(before, model),
                      "accuracy": _accuracy(model, x, y), "accuracy_before": acc_before}
    # 3. a worker crashes: hogwild must raise
    crash = RecordingDataset(x, y, 1, fail_index=int(_order(N_SAMPLES, True, SEED, 0)[1]))
    try:
        module.hogwild(_model(), crash, crash_workers, epochs=1, batch_size=BATCH, lr=LR,
                       seed=SEED, threads=threads)
        out["crash"] = None
    except Exception as exc:  # noqa: BLE001 - any exception reports the failure
        out["crash"] = f"{type(exc).__name__}: {exc}"
    return out


def _changed(before, model):
    after = state_arrays(model)
    return max(float(np.max(np.abs(after[k] - before[k]))) for k in before)


def expected_reads(rank, workers):
    """Sample indices DistributedSampler gives ``rank`` over all epochs (set_epoch each epoch)."""
    return [i for epoch in range(EPOCHS)
            for i in reference_partition(N_SAMPLES, workers, rank, True, SEED, epoch, False)]


def check_hogwild(path, timeout=TIMEOUT, workers=3, crash_workers=2):
    """Check ``train_worker`` and ``hogwild`` of ``path``: partitions, epochs, threads, the
    shared model, accuracy, and that a crashed worker is reported."""
    res = run_ranks(path, f"{MODULE}:probe_hogwild", 1, "none",
                    {"workers": workers, "crash_workers": crash_workers}, timeout,
                    what="train_worker / hogwild")[0]
    _check_serial(res, workers)
    _check_parallel(res, workers)
    if res["crash"] is None:
        raise AssertionError(
            f"hogwild() with {crash_workers} workers returned normally although one worker "
            f"crashed (it raised an exception, so its exit code was 1): after joining, check "
            f"every process's exitcode and raise RuntimeError if one is not 0, or failed "
            f"training goes unnoticed")


def _check_serial(res, workers):
    call = f"train_worker(rank=1, num_workers={workers}, epochs={EPOCHS})"
    (reads, counts), changed = res["serial"]["reads"], res["serial"]["changed"]
    got = [i for seq in reads.values() for i, _ in seq]
    expected, per_epoch = expected_reads(1, workers), math.ceil(N_SAMPLES / workers)
    if int(counts.sum()) != len(expected):
        raise AssertionError(
            f"{call} read {int(counts.sum())} samples; it must read exactly its own partition, "
            f"{per_epoch} of the {N_SAMPLES} samples per epoch ({len(expected)} in all), through "
            f"DistributedSampler(dataset, num_replicas={workers}, rank=1, shuffle=True, "
            f"seed=seed)")
    epochs = [got[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    wanted = [expected[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)]
    if epochs[0] == wanted[0] and all(e == epochs[0] for e in epochs):
        raise AssertionError(
            f"{call} read the same samples in the same order in every epoch "
            f"({_short(epochs[0], 8)}): call sampler.set_epoch(epoch) at the start of every "
            f"epoch, or every epoch repeats epoch 0's shuffle (and each worker its epoch-0 "
            f"partition)")
    for epoch, (a, b) in enumerate(zip(epochs, wanted)):
        if a != b:
            raise AssertionError(
                f"{call} read {_short(a)} in epoch {epoch}; its DistributedSampler (num_replicas="
                f"{workers}, rank=1, shuffle=True, seed=seed) with set_epoch({epoch}) gives "
                f"{_short(b)}")
    _check_threads(call, reads, res["threads"])
    if changed == 0:
        raise AssertionError(f"{call} did not change the model it was given: train `model` "
                             f"itself in place (an optimizer over model.parameters()), not a copy")


def _check_threads(call, reads, threads):
    used = sorted({t for seq in reads.values() for _, t in seq})
    if used != [threads]:
        raise AssertionError(f"{call} ran with {used} thread(s), but threads={threads} was "
                             f"asked for: call torch.set_num_threads(threads) in the worker")


def _check_parallel(res, workers):
    call = f"hogwild(model, dataset, num_workers={workers}, epochs={EPOCHS})"
    out = res["hogwild"]
    reads, counts = out["reads"]
    pids = sorted(reads)
    if res["parent"] in pids or len(pids) != workers:
        where = "this process (no worker processes)" if res["parent"] in pids else f"{len(pids)} process(es)"
        raise AssertionError(f"{call}: samples were read by {where}; start {workers} worker "
                             f"processes, each running train_worker for its rank")
    if not (counts == EPOCHS).all():
        low, high = np.nonzero(counts < EPOCHS)[0], np.nonzero(counts > EPOCHS)[0]
        detail = (f"samples {_short(high.tolist(), 8)} were read up to {int(counts.max())} "
                  f"times: workers trained on the same samples" if len(high) else
                  f"samples {_short(low.tolist(), 8)} were read fewer times (some never)")
        raise AssertionError(
            f"{call}: every sample must be read exactly {EPOCHS} times (once per epoch, by one "
            f"worker), but {detail}. Give each worker its own rank (0 ... num_workers-1), and "
            f"join every worker before returning.")
    expected = {r: expected_reads(r, workers) for r in range(workers)}
    for pid, seq in reads.items():
        samples = [i for i, _ in seq]
        if samples not in expected.values():
            raise AssertionError(f"{call}: a worker read {_short(samples)}, which is no rank's "
                                 f"DistributedSampler order (rank 0 expected: "
                                 f"{_short(expected[0])})")
    _check_threads(call, reads, res["threads"])
    if out["changed"] == 0:
        raise AssertionError(
            f"{call}: the model in the parent process is unchanged after training, so the "
            f"workers trained private copies. Call model.share_memory() before starting the "
            f"workers, pass `model` itself to every worker, and do not copy it in the worker "
            f"(with the fork start method nothing is shared unless you call share_memory())")
    if out["accuracy"] < MIN_ACCURACY:
        raise AssertionError(
            f"{call}: the shared model reaches only {out['accuracy']:.2f} training accuracy "
            f"(before: {out['accuracy_before']:.2f}; the reference reaches about 1.0; at least "
            f"{MIN_ACCURACY} is required): do the workers run plain SGD steps with lr on "
            f"F.cross_entropy(model(x), y)?")
