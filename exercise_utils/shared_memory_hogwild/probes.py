"""What runs inside the processes that notebook 02's checkers start, and the inputs they share.

:func:`probe_sampler` calls the student's ``partition_indices`` on every case of
:func:`sampler_cases`. :func:`probe_hogwild` trains a small model with the student's
``train_worker`` (in the probe's own process, as rank 1 of 3) and ``hogwild`` (3 worker
processes), reading every sample through a :class:`RecordingDataset` that logs, in shared
memory, which process read which sample, in which order and with how many threads; then it
makes one worker crash. Both run in a fresh process of the harness
(:func:`exercise_utils.harness.run_ranks`), never in the notebook kernel.

Used in 02_shared_memory_hogwild.
"""
import importlib
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
import torch

from ..harness import state_arrays
from ..models import TinyMLP


# ---------------------------------------------------------------- sampler
def sampler_cases():
    """(dataset_len, num_replicas, shuffle, seed, epoch, drop_last) groups the checker tries."""
    cases = []
    for n in (10, 12, 13, 7, 2, 1, 61, 3, 0):
        for replicas in (3, 2, 4, 5, 1):
            for drop_last in (False, True):
                for shuffle, seeds, epochs in ((True, (0, 7), (0, 1, 2)), (False, (0,), (0, 1))):
                    cases += [(n, replicas, shuffle, seed, epoch, drop_last)
                              for seed in seeds for epoch in epochs]
    return cases


def probe_sampler(student, ctx):
    """Return, for every case, the list of every rank's indices (or what the call raised), and
    whether the calls changed torch's global random state (a sampler must not)."""
    rng = torch.get_rng_state()
    results = []
    for n, replicas, shuffle, seed, epoch, drop_last in sampler_cases():
        per_rank = []
        for rank in range(replicas):
            try:
                got = student.partition_indices(n, replicas, rank, shuffle=shuffle, seed=seed,
                                                epoch=epoch, drop_last=drop_last)
            except NotImplementedError:
                raise
            except Exception as exc:  # reported per case, not as a crash
                per_rank.append(f"raised {type(exc).__name__}: {exc}")
                continue
            try:
                per_rank.append([int(i) for i in got])
            except (TypeError, ValueError):
                per_rank.append(f"returned {got!r}, not a list of int")
        results.append(per_rank)
    return results, not torch.equal(rng, torch.get_rng_state())


def shuffled_order(n, shuffle, seed, epoch):
    """The order DistributedSampler partitions: ``randperm(n)`` seeded with seed + epoch."""
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


# ---------------------------------------------------------------- hogwild
N_SAMPLES, FEATURES, CLASSES = 240, 20, 4   # 240 = 80 per worker with 3 workers, 120 with 2
EPOCHS, BATCH, LR, SEED = 3, 16, 0.2, 5


_FORKED_FROM = None    # the probe's pid, set before hogwild: a forked worker inherits it


class RecordingDataset(torch.utils.data.Dataset):
    """A map-style dataset that logs every read in shared memory (works across processes).

    ``dataset[i]`` returns ``(x[i], y[i])`` and records, for the k-th read of sample i, the
    reading process's pid, a per-process sequence number, ``torch.get_num_threads()`` and
    whether the process was forked from the probe's (it inherited ``_FORKED_FROM``; a spawned
    one imports this module afresh). Reading sample ``fail_index`` raises (to crash the worker
    that owns it).
    """

    def __init__(self, x, y, slots, fail_index=None):
        n = len(y)
        self.x, self.y, self.fail_index = x, y, fail_index
        self.count = torch.zeros(n, dtype=torch.int64).share_memory_()
        self.pid, self.seq, self.threads, self.forked = (
            torch.full((n, slots), -1, dtype=torch.int64).share_memory_() for _ in range(4))
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
            self.forked[index, k] = int(_FORKED_FROM not in (None, os.getpid()))
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

    def was_forked(self):
        """Whether a process forked from the probe's read a sample (fork, not spawn)."""
        return bool((self.forked == 1).any())


class StartJoinCounter:
    """Counts how many worker processes were started and not yet joined at once, from the
    order of ``Process.start()`` and ``Process.join()`` calls (every multiprocessing and
    torch.multiprocessing process class inherits both from ``BaseProcess``): Hogwild's
    workers must run together. A count of the calls, not of the processes seen alive, so a
    busy machine that delays a worker's start cannot change it: start-join, start-join gives
    1, start all then join all gives the number of workers."""

    def __enter__(self):
        from multiprocessing.process import BaseProcess
        self.most, self._open = 0, set()
        self._base, real_start, real_join = BaseProcess, BaseProcess.start, BaseProcess.join
        self._real = (real_start, real_join)

        def start(proc, *args, **kwargs):
            result = real_start(proc, *args, **kwargs)
            self._open.add(id(proc))
            self.most = max(self.most, len(self._open))
            return result

        def join(proc, *args, **kwargs):
            result = real_join(proc, *args, **kwargs)
            if proc.exitcode is not None:       # joined for good (not a join with a timeout)
                self._open.discard(id(proc))
            return result
        BaseProcess.start, BaseProcess.join = start, join
        return self

    def __exit__(self, *exc):
        self._base.start, self._base.join = self._real


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
    out["serial"] = {"reads": data.reads(), "changed": _changed(before, model),
                     "state": state_arrays(model)}
    from .checks import check_serial     # the checker's verdict on that run, here in the rank
    try:
        check_serial(out, workers)
    except AssertionError:
        return out          # the checker reports it; no need to start processes
    # 2. hogwild with `workers` processes
    global _FORKED_FROM
    _FORKED_FROM = os.getpid()
    model, data = _model(), RecordingDataset(x, y, EPOCHS)
    before, acc_before = state_arrays(model), _accuracy(model, x, y)
    with StartJoinCounter() as alive:
        module.hogwild(model, data, workers, epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED,
                       threads=threads)
    out["hogwild"] = {"reads": data.reads(), "changed": _changed(before, model),
                      "accuracy": _accuracy(model, x, y), "accuracy_before": acc_before,
                      "together": alive.most, "forked": data.was_forked()}
    from .checks import _check_parallel
    try:
        _check_parallel(out, workers)
    except AssertionError:
        return out          # the checker reports it; the crash run would only cost time
    # 3. a worker crashes: hogwild must raise; threads=None: each worker its share of the cores
    second = int(shuffled_order(N_SAMPLES, True, SEED, 0)[1])
    crash = RecordingDataset(x, y, 1, fail_index=second)
    try:
        module.hogwild(_model(), crash, crash_workers, epochs=1, batch_size=BATCH, lr=LR,
                       seed=SEED)
        out["crash"] = None
    except Exception as exc:  # noqa: BLE001 - any exception reports the failure
        out["crash"] = f"{type(exc).__name__}: {exc}"
    out["default_threads"] = {"reads": crash.reads()[0],
                              "share": max(1, (os.cpu_count() or 1) // crash_workers)}
    return out


def _changed(before, model):
    after = state_arrays(model)
    return max(float(np.max(np.abs(after[k] - before[k]))) for k in before)
