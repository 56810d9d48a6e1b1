"""The sweep of the checks' hosts: what runs there beside the zygotes is killed, and what a
check left in the hosts' folders and sandboxes is removed.

On each host of a :class:`.hosts.Pool` a zygote, inside its sandbox (``bwrap``'s processes
above it), forks the ranks of every launch. A rank's children stay in its zygote's tree; what
a rank starts and cuts loose (a daemon: a new session, its parent gone) does not:
:func:`strays` finds it, and :func:`sweep` kills it with everything below each zygote. Between
two checks the hosts' folders (:func:`empty`) and each sandbox's own ``/tmp`` and ``/dev/shm``
(:func:`empty_sandboxes`, reached through ``/proc/<zygote>/root``) are emptied; the zygotes
stay. ``zygotes`` below is the pool's ``{host: {"proc": its Popen, "sandboxed": bool, ...}}``.

Owns: :func:`zygote_processes`, :func:`strays`, :func:`sweep`, :func:`stop_zygotes`,
:func:`empty`, :func:`empty_sandboxes`. Called by :mod:`.hosts` (``Pool.strays``,
``Pool.sweep``, ``Pool.reset``, ``Pool.close``). Used by every checker at grading.
"""
import os
import shutil
from pathlib import Path

import psutil

from .processes import _is_alive, kill_processes


def zygote_processes(zygotes):
    """``{host: the zygote's psutil process}`` for every host whose zygote runs."""
    found = {}
    for h, state in zygotes.items():
        try:
            below = psutil.Process(state["proc"].pid).children(recursive=True)
        except psutil.Error:
            continue
        zygote = next((p for p in below if _is_zygote(p) and not _is_zygote(_parent(p))), None)
        if zygote is not None:
            found[h] = zygote
    return found


def strays(zygotes, size):
    """``{host: [psutil processes]}`` left on each of the first ``size`` hosts outside its
    zygote's tree: what a rank started and cut loose (a daemon: a new session, its parent
    gone), which outlives its launch; empty hosts left out. Only kills say more."""
    running, found = zygote_processes(zygotes), {}
    for h in range(size):
        state, zygote = zygotes.get(h), running.get(h)
        if state is None or zygote is None:
            continue
        try:
            below = psutil.Process(state["proc"].pid).children(recursive=True)
            keep = {zygote.pid} | {p.pid for p in zygote.children(recursive=True)}
            keep |= {p.pid for p in zygote.parents()}
        except psutil.Error:
            continue
        left = [p for p in below if p.pid not in keep and _is_alive(p)]
        if left:
            found[h] = left
    return found


def sweep(zygotes, size):
    """Kill whatever is left running on the first ``size`` hosts (a rank's children, a daemon
    it started), sparing each zygote and the processes above it."""
    victims = []
    for zygote in zygote_processes(zygotes).values():
        try:
            victims += zygote.children(recursive=True)
        except psutil.Error:
            pass
    for left in strays(zygotes, size).values():
        victims += left
    kill_processes(victims, grace=0.2)


def stop_zygotes(zygotes):
    """Kill every zygote (its sandbox's first process) and everything below it."""
    for state in zygotes.values():
        proc = state["proc"]
        try:
            inside = psutil.Process(proc.pid).children(recursive=True)
        except Exception:     # noqa: BLE001 - already gone
            inside = []
        proc.kill()
        proc.wait()
        kill_processes(inside, grace=0.2)


def empty_sandboxes(zygotes):
    """Empty the ``/tmp`` and ``/dev/shm`` of every running zygote's sandbox (bare, without
    bwrap, a zygote's /tmp is the machine's: never emptied)."""
    for h, zygote in zygote_processes(zygotes).items():
        if zygotes[h]["sandboxed"] and _sandboxed(zygote.pid):
            for inside in ("/tmp", "/dev/shm"):
                _empty_inside(zygote.pid, inside)


def empty(folder):
    """Remove everything inside ``folder`` (which stays)."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
        except OSError:
            pass


def _empty_inside(pid, folder):
    """Remove everything inside ``folder`` as process ``pid`` (in a sandbox) sees it, but the
    mount points there and the folders that lead to them (the sandbox's binds: its host's
    folders, the course's checkout; removing one from outside would detach it)."""
    try:
        with open(f"/proc/{pid}/mountinfo") as info:
            mounts = {line.split()[4] for line in info}
    except OSError:
        return
    top = f"/proc/{pid}/root"

    def clean(inside):
        try:
            names = os.listdir(top + inside)
        except OSError:
            return
        for name in names:
            path = f"{inside.rstrip('/')}/{name}"
            if path in mounts:
                continue
            if any(m.startswith(path + "/") for m in mounts):
                clean(path)
                continue
            full = Path(top + path)
            try:
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    full.unlink()
            except OSError:
                pass
    clean(folder)


def _parent(proc):
    try:
        return proc.parent()
    except Exception:     # noqa: BLE001
        return None


def _is_zygote(proc):
    """Whether ``proc`` is a zygote's Python (or a rank it forked: the same command line),
    not one of the processes that started it (``bwrap``'s hold the command line too)."""
    try:
        return proc is not None and proc.cmdline()[1:4] == ["-P", "-m", "exercise_utils.zygote"]
    except Exception:     # noqa: BLE001
        return False


def _sandboxed(pid):
    """Whether process ``pid`` sees a ``/tmp`` and a ``/dev/shm`` of its own (a sandbox's:
    never the machine's, which ``ip netns exec`` alone, a mount namespace of its own, still
    shows: emptying that one would empty the machine's)."""
    try:
        for folder in ("/tmp", "/dev/shm"):
            inside, here = os.stat(f"/proc/{pid}/root{folder}"), os.stat(folder)
            if (inside.st_dev, inside.st_ino) == (here.st_dev, here.st_ino):
                return False
        return True
    except OSError:
        return False
