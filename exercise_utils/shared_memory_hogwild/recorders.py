"""What notebook 02's Hogwild probe watches the student's processes with (the student side).

* :class:`RecordingDataset`: a dataset that logs, in shared memory, which process read which
  sample, in which order, with how many threads, and whether it was forked; it can make the
  worker that reads a given sample raise or die by a signal.
* :class:`StartJoinCounter`: counts the worker processes started and not yet joined at once
  (from the order of ``Process.start`` / ``join`` calls, not from timing), and says which
  started processes the caller never saw end (never joined) when ``hogwild`` returned.
* :class:`Gate`, :class:`GatedMLP` and :class:`ConcurrencyWatch`: each worker's first forward
  pass waits until every worker is inside its own. Lock-free workers all get there; with a
  lock around the steps the others wait for the lock (blocked: asleep, no CPU used) while the
  first waits at the gate, and the watch in the probe's process sees it and lets the first go
  on. Only a deadlock that ends in a verdict: a slow start-up never does.

Used in 02_shared_memory_hogwild (:mod:`.probes`).
"""
import multiprocessing
import os
import threading
import time

import numpy as np
import psutil
import torch

from ..models import TinyMLP

_FORKED_FROM = None    # the probe's pid, set before hogwild: a forked worker inherits it
SETTLE = 3.0           # seconds every other worker must stay blocked before the gate opens
GIVE_UP = 60.0         # seconds without a new arrival after which the gate opens, undecided


def forked_from(pid):
    """Mark ``pid`` as the probe's process: readers that inherited the mark were forked."""
    global _FORKED_FROM
    _FORKED_FROM = pid


class RecordingDataset(torch.utils.data.Dataset):
    """A map-style dataset that logs every read in shared memory (works across processes).

    ``dataset[i]`` returns ``(x[i], y[i])`` and records, for the k-th read of sample i, the
    reading process's pid, a per-process sequence number, ``torch.get_num_threads()`` and
    whether the process was forked from the probe's (it inherited ``_FORKED_FROM``; a spawned
    one imports this module afresh). The process that reads sample ``fail_index`` raises
    (``fail="raise"``, exit code 1) or kills itself with SIGKILL (``fail="kill"``, -9).
    """

    def __init__(self, x, y, slots, fail_index=None, fail="raise"):
        n = len(y)
        self.x, self.y, self.fail_index, self.fail = x, y, fail_index, fail
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
            if self.fail == "kill":
                os.kill(os.getpid(), 9)     # SIGKILL: no Python cleanup, exit code -9
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
    1, start all then join all gives the number of workers.

    Also keeps the processes started (``procs``, with ``last_start``, the time of the latest
    start) and, through :meth:`unseen_end`, those whose end the caller never saw: a process is
    seen ending when ``join()``, ``is_alive()`` or ``exitcode`` found it finished (each reaps
    it); one never joined is still running or a zombie, whatever the timing.
    """

    def __enter__(self):
        from multiprocessing.process import BaseProcess
        self.most, self._open, self.procs, self.last_start = 0, set(), [], time.monotonic()
        self._base, real_start, real_join = BaseProcess, BaseProcess.start, BaseProcess.join
        self._real = (real_start, real_join)

        def start(proc, *args, **kwargs):
            result = real_start(proc, *args, **kwargs)
            self._open.add(id(proc))
            self.procs.append(proc)
            self.most, self.last_start = max(self.most, len(self._open)), time.monotonic()
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

    def unseen_end(self):
        """The processes started whose end the caller never saw (never joined): ``[(index in
        start order, pid)]``. Call it before anything else starts a process (``start`` reaps
        finished children)."""
        return [(i, p.pid) for i, p in enumerate(self.procs)
                if getattr(p._popen, "returncode", 0) is None]

    def cleanup(self):
        """Kill and join what the caller left running (a check must leave no process)."""
        for proc in self.procs:
            if getattr(proc._popen, "returncode", 0) is None:
                proc.kill()
                proc.join()


class Gate:
    """Holds each worker's first forward pass until the watch in the probe's process opens it
    (:class:`ConcurrencyWatch`). Shared memory: ``[open, arrivals, pid of each arrival...]``.
    The process that made it (the probe's) passes straight through, and so does every later
    forward pass. Copies of the model share the gate (``deepcopy`` returns the gate itself)."""

    def __init__(self, slots=16):
        self.owner = os.getpid()
        self.state = torch.zeros(2 + slots, dtype=torch.int64).share_memory_()
        self.lock = multiprocessing.get_context("spawn").Lock()

    def __deepcopy__(self, memo):
        return self

    def __getstate__(self):
        return {"owner": self.owner, "state": self.state, "lock": self.lock}

    def wait(self):
        if os.getpid() == self.owner or getattr(self, "_passed", None) == os.getpid():
            return
        self._passed = os.getpid()
        with self.lock:
            k = int(self.state[1])
            if 2 + k < len(self.state):
                self.state[2 + k] = os.getpid()
            self.state[1] += 1
        while not int(self.state[0]):
            time.sleep(0.01)

    def arrived(self):
        """The pids of the workers that reached the gate."""
        k = min(int(self.state[1]), len(self.state) - 2)
        return {int(p) for p in self.state[2:2 + k]}

    def open(self):
        self.state[0] = 1


class GatedMLP(TinyMLP):
    """:class:`~exercise_utils.models.TinyMLP` whose forward passes through a :class:`Gate`
    first (a plain attribute: not in ``state_dict()``, not a parameter)."""

    def __init__(self, gate, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def forward(self, x):
        self.gate.wait()
        return super().forward(x)


class ConcurrencyWatch:
    """In the probe's process, beside the student's ``hogwild``: opens the gate and says how
    many workers were inside their steps at once.

    * every one of ``workers`` arrived: ``verdict = "together"`` (lock-free);
    * some arrived, no process was started for :data:`SETTLE` s, and every other process
      started is gone or blocked (asleep with no CPU time used) for :data:`SETTLE` s: they
      wait for something the waiting worker holds (a lock): ``verdict = "serial"``;
    * nothing new for :data:`GIVE_UP` s: opened, ``verdict = "undecided"`` (no verdict).
    A process that is starting up or computing is never blocked, however slow the machine.
    """

    def __init__(self, gate, counter, workers):
        self.gate, self.counter, self.workers = gate, counter, workers
        self.verdict, self.most, self.blocked = "none", 0, []
        self._stop, self._idle = threading.Event(), {}
        self._thread = threading.Thread(target=self._run, name="dtfs-gate", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.verdict == "none":      # hogwild returned before a verdict (no processes?)
            self.most = len(self.gate.arrived())
        self.gate.open()

    def _run(self):
        seen, changed = 0, time.monotonic()
        while not self._stop.wait(0.1):
            arrived, now = self.gate.arrived(), time.monotonic()
            if len(arrived) != seen:
                seen, changed = len(arrived), now
            if len(arrived) >= self.workers:
                return self._decide("together", arrived)
            if not arrived:
                continue
            pending = [p for p in self.counter.procs if p.pid not in arrived]
            blocked = [self._blocked(p.pid, now) for p in pending]
            if now - self.counter.last_start >= SETTLE and all(blocked):
                self.blocked = [p.pid for p, b in zip(pending, blocked) if b != "gone"]
                return self._decide("serial", arrived)
            if now - changed >= GIVE_UP:
                return self._decide("undecided", arrived)

    def _decide(self, verdict, arrived):
        self.verdict, self.most = verdict, len(arrived)
        self.gate.open()

    def _blocked(self, pid, now):
        """"gone" (exited), True (asleep with no CPU used for SETTLE s) or False."""
        try:
            proc = psutil.Process(pid)
            status, cpu = proc.status(), sum(proc.cpu_times()[:2])
        except psutil.Error:
            return "gone"
        if status == psutil.STATUS_ZOMBIE:
            return "gone"
        last = self._idle.get(pid)
        if status != psutil.STATUS_SLEEPING or last is None or last[0] != cpu:
            self._idle[pid] = (cpu, now) if status == psutil.STATUS_SLEEPING else None
            return False
        return now - last[1] >= SETTLE
