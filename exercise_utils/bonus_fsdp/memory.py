"""Measure the memory a rank holds in tensors that are actually alive, not what code claims.

:func:`alive_bytes` adds up the bytes of the unique storages (by address) of every tensor this
process can still reach: every tensor object the garbage collector tracks, their ``.grad`` and
``_base``, a DTensor's local shard, plus tensors the caller found elsewhere. Torch keeps the
Python object of a tensor that C++ still holds (a weight autograd saved for backward), so those
count too; :class:`Witness` covers what may still escape, tensors that never had a Python
object:

* a :func:`torch.autograd.graph.saved_tensors_hooks` pair that keeps what it is given sees every
  tensor saved by code that installs no hooks of its own (the innermost pair wins: code that
  does install hooks decides itself what to keep);
* a module's weight attribute seen during forward (a view of gathered parameters) is kept by
  weak reference and counted while it is alive.

Storages count at their size at the moment of measurement: storage freed by ``resize_(0)``
(FSDP2's way) counts as zero.

Used in 09_bonus_fsdp (its probes and its benchmark).
"""
import gc
import os
import threading
import time
import weakref

import torch

from .. import heartbeat

QUIET_S = 0.5      # the longest :func:`alive_bytes` waits for other threads to stand still


def _storage(t):
    """(address, bytes) of ``t``'s storage, or None (a DTensor: its local tensor counts)."""
    local = getattr(t, "_local_tensor", None)
    if local is not None:
        t = local
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def start():
    """Collect, then freeze every object alive now (``gc.freeze``): later scans and collections
    skip them (torch's own 300,000 objects: a scan takes milliseconds instead of 0.2 s). Call it
    before building what is measured; what existed before is never counted.
    """
    gc.collect()
    gc.freeze()


def alive_bytes(extra=(), settle=0.01):
    """Bytes of the unique storages of every reachable tensor (see the module docstring).

    Args:
        extra: more tensors to count (those a :class:`Witness` holds).
        settle: seconds between the two scans whose smaller total is returned: another thread
            that briefly holds a frame the main thread has left keeps that frame's tensors
            alive for a moment (the checks' heartbeat, which reads where the main thread is,
            is kept out of every scan by ``heartbeat.FRAMES``); nothing in this thread changes
            between the scans.
    Returns:
        int: bytes; storages of size 0 or without an address do not count.
    """
    _quiet()
    first = _scan(extra)
    time.sleep(settle)
    return min(first, _scan(extra))


def _runnable_threads():
    """Native ids of this process's other threads that are running or waiting for a CPU
    (state ``R`` in ``/proc/self/task/*/stat``); None where /proc cannot tell."""
    me, busy = threading.get_native_id(), []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue                    # the thread has just exited
        if state == "R" and int(task) != me:
            busy.append(int(task))
    return busy


def _quiet(most=None):
    """Wait (at most ``most`` seconds) until no other thread of this process is running or
    waiting for a CPU. A collective's worker thread (gloo's) still holds the tensors of a
    collective that has already completed until it gets a CPU again to drop them: on a loaded
    machine that took longer than ``settle`` (CI: a right ZeRO-2 measured 866 kB alive where
    594 kB were: its flat gradient, released by gloo's thread a moment later)."""
    end = time.monotonic() + (QUIET_S if most is None else most)
    while _runnable_threads() and time.monotonic() < end:
        time.sleep(0.002)


def _scan(extra):
    with heartbeat.FRAMES:      # the beating thread holds no frame (and its tensors) now
        return _scan_now(extra)


def _scan_now(extra):
    seen = {}

    def add(t):
        if isinstance(t, torch.Tensor):
            found = _storage(t)
            if found and found[0]:
                seen[found[0]] = max(seen.get(found[0], 0), found[1])

    # type(), not isinstance(): some objects warn when asked for their __class__, and
    # silencing them with warnings.catch_warnings() resets every module's record of the
    # warnings already shown, so that torch's deprecation warnings (one per process) came
    # back after every scan: 150 times in the benchmark, past nbgrader's output limit
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    for obj in tensors:
        add(obj)
        if obj.is_leaf:
            add(obj.grad)
        add(obj._base)
    for t in extra:
        add(t)
    del tensors
    return sum(seen.values())


class Witness:
    """What the garbage collector cannot see: tensors autograd saved (:meth:`hooks`) and the
    weights modules used (:meth:`watch`), kept weakly and counted while alive (:meth:`tensors`)."""

    def __init__(self):
        self.saved, self.weak = [], []

    def hooks(self):
        """A ``saved_tensors_hooks`` context that keeps every tensor it packs (and returns it)."""
        def pack(t):
            self.saved.append(t)
            return t
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def watch(self, module, names):
        """Keep weak references to ``module``'s attributes ``names`` (and their bases)."""
        for name in names:
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor):
                for obj in (t, t._base):
                    if obj is not None:
                        self.weak.append(weakref.ref(obj))

    def tensors(self):
        alive = [r() for r in self.weak]
        return self.saved + [t for t in alive if t is not None]

    def clear(self):
        self.saved, self.weak = [], []
