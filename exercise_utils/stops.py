"""Why a check's launch was stopped, in the words the student reads: a hang (the pattern:
a point-to-point deadlock, a rank spinning, different collectives), a grading limit hit (disk,
memory, processes, a daemon left running, read from outside the sandbox), or the check's time
used up; and the limits that apply to the check running now (:mod:`.limits`, at grading).

Owns: :data:`DEADLINE` (set by :func:`.sessions.check`), :func:`launch_limit`,
:func:`hang_time`, :func:`grading_limits`, :func:`output_limit`, :func:`within_limits` (a watch
that also looks at the ranks' folders and cgroups), :func:`hang_message`. Called by
:mod:`.harness`, :mod:`.hostlaunch`, :mod:`.reports` and :mod:`.sessions`.
"""
import os
import time
from pathlib import Path

from . import heartbeat, limits, sandbox
from .contract import CheckFailure


DEADLINE = [None]  # at grading: when the check running now must end (limits: "check")


def launch_limit(limit, what, case=None):
    """Seconds a launch of the check running now may take: ``limit``, or at grading less
    where the check's time (:mod:`.limits`) ends sooner. Raises CheckFailure when that time
    is up already. Returns ``(seconds, cut)``: ``cut`` says the check's time set them."""
    if DEADLINE[0] is None:
        return limit, False
    left = DEADLINE[0] - time.monotonic()
    found = limits.current() or limits.DEFAULTS
    if left < 1:
        raise CheckFailure(out_of_time(what, found), case)
    return min(limit, max(1, int(left))), left < limit


def grading_limits():
    """The limits the judge applies to this check's launches (:mod:`.limits`): at grading
    (a sandbox policy, on the judge's side of it), else None."""
    return limits.current() if sandbox.policy() is not None else None


def hang_time(timeout):
    """Seconds every unfinished rank of a check's launch may stand still before it is hung:
    ``timeout`` (the check's), or the grader's ``hang`` limit where that is less."""
    found = grading_limits()
    return min(timeout, float(found["hang"])) if found else timeout


def output_limit():
    """Bytes of output a check's launch may print at grading (:mod:`.limits`), else None."""
    found = grading_limits()
    return found["output"] if found else None


def out_of_time(what, found):
    """The verdict of a check that used up its time at grading (:mod:`.limits`)."""
    return (f"{what} was still running when this check's time ran out: a grading limit "
            f"(check={found['check']:g} s for the whole check, below the notebook's cell "
            "timeout), so every rank was stopped. Correct code needs a small part of it:")


def _where(seen, rank, path):
    """``"in shard_bounds (line 12 of zero.py)"``: where ``rank`` was at the watch's last
    look (its beat), or ""."""
    s = (seen or {}).get(rank) or {}
    if s.get("student"):
        line, func = s["student"]
        return f"in {func} (line {line} of {Path(path).name})"
    return ""


def within_limits(watch, places, found, path, events=None):
    """``watch`` that also stops the launch, looking once a second, once a rank's folder
    (``places[r]``, on the judge's side of the sandbox) holds more than the disk limit, or
    the kernel stopped something on a rank's host (``events``: a callable returning
    :meth:`.hosts.Pool.limit_events`, whose first answer is the launch's start)."""
    state = {"next": 0.0, "start": events() if events else None}

    def watching():
        now = time.monotonic()
        if now >= state["next"]:
            state["next"] = now + 1.0
            hit = disk_hit(places, found, watch, path)
            if hit:
                return ("limit", hit)
            if events is not None:
                hit = kernel_hits(state["start"], events(), found, watch, path)
                if hit:
                    return ("limit", hit)
        return watch()
    watching.seen, watching.summary, watching.close = watch.seen, watch.summary, watch.close
    return watching


def disk_hit(places, found, watch, path):
    """The verdict for the first rank whose folder holds more than the disk limit (and the
    MiB the judge's own files there may take: beats, reports), or None."""
    for r, place in enumerate(places):
        if _bytes_in(place, found["disk"] + (1 << 20)) > found["disk"] + (1 << 20):
            return limits.verdict(r, "disk", found["disk"], _where(watch.seen, r, path))
    return None


def _bytes_in(folder, stop):
    """Bytes of the files under ``folder`` (their sizes; counting stops past ``stop``)."""
    total, todo = 0, [str(folder)]
    while todo and total <= stop:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def kernel_hits(before, after, found, watch, path, pool=None):
    """The verdict for the first rank the kernel stopped on its host during a launch (its
    cgroup: memory, processes), read from outside every sandbox, or that left a process
    running after it (a daemon); or None."""
    left = getattr(pool, "left", None) or {}
    if pool is not None:
        pool.left = {}
    for r, (old, new) in enumerate(zip(before, after)):
        if old is None or new is None:
            continue
        for name in ("memory", "processes"):
            if new[name] > old[name]:
                return limits.verdict(r, name, found[name], _where(watch.seen, r, path))
    for r in sorted(left):
        return (f"rank {r} left {left[r]} process(es) running after its launch ended (a daemon: "
                "started in a new session, or cut loose from the rank by a double fork): that "
                "is a grading limit (daemons=0: every process a rank starts ends with it), so "
                "it was killed and the check fails. Join or terminate what you start.")
    return None


def hang_message(what, backend, world_size, reports, report, path):
    """What the watch saw when every unfinished rank stopped making progress: first the
    launch, the case (and run) the ranks were in and the pattern (``hung: ...``), then a line
    per rank, then who finished."""
    seen = "\n  ".join(heartbeat.describe(report, path))
    return (f"{what}{_hang_case(report)}: {_hang_cause(backend, report)}\n  {seen}\n"
            f"No progress with {world_size} {backend} process(es) (ranks finished: "
            f"{sorted(reports) or 'none'}; ranks still waiting: {[s['rank'] for s in report]});"
            f" all were killed.")


def _hang_case(report):
    """``", case pp-values (1F1B, m = 2, ...)"``: the case (and run) of the first waiting rank
    that said one (``ctx.case``), else ``""``."""
    said = next((s for s in report if s.get("case")), None)
    if said is None:
        return ""
    return f", case {said['case']}" + (f" ({said['detail']})" if said.get("detail") else "")


def _hang_cause(backend, report):
    """The pattern of a hang, in a sentence that starts with ``hung: ``."""
    cycle, waits = heartbeat.wait_for(report)
    spinning = [s["rank"] for s in report if s.get("spinning")]
    # collectives in the student's code (the probe's own end, a barrier, is not one)
    collective = [s for s in report if s.get("comm") and s["comm"] not in heartbeat.P2P
                  and s.get("phase") != "exit"]
    if cycle:
        calls = {rank: (call, peer) for rank, call, peer in waits}
        return ("hung: a point-to-point deadlock: "
                + ", ".join(f"rank {r} waits in {calls[r][0]} {heartbeat.toward(*calls[r])}"
                            for r in cycle)
                + ": each waits for the next (a blocking send waits until the other side "
                "has posted its receive). Post the receives with irecv before waiting on "
                "anything, or order the sends and receives so that one side receives first.")
    if spinning:
        return (f"hung: rank{'s' * (len(spinning) > 1)} {', '.join(map(str, spinning))} "
                "kept looping on the same few lines (polling, e.g. `while not "
                "work.is_completed()`) while the others waited: what the loop waits for "
                "never came (a message never sent, a tag that does not match, a rank waiting "
                "for this one?).")
    if waits and not collective:
        return ("hung: " + ", ".join(
            f"rank {r} waits in {call} {heartbeat.toward(call, peer)}" for r, call, peer in waits)
            + ", and nothing will come: every send needs its receive posted on the other "
            "side, with the same tag.")
    if (collective and backend != "none") or backend == "mpi":     # (mpi4py's calls: unseen)
        return ("hung: ranks issued different collectives? Every rank must call the same "
                "collectives, in the same order, with matching sizes.")
    if any(s.get("comm") for s in report):
        return ("hung: no rank is inside a collective of your code: a message that never "
                "comes (a receive or a wait whose send never happened, a tag or a peer that "
                "does not match) or a rank that returned early while the others wait for it.")
    return ("hung: the code stopped making progress (waiting for something that never "
            "happens: a lock, a queue, a process that was never started or has died?)")
