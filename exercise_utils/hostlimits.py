"""The cgroups of the checks' hosts: at grading (as root, where cgroups can be made), the
kernel bounds the memory and the processes of everything on a host, its zygote included, and
the judge reads from outside every sandbox what the kernel stopped there.

A host's limits are its rank's (:func:`.limits.current`) plus what its zygote holds of its own
(:data:`ZYGOTE_MEMORY`, :data:`ZYGOTE_TASKS`); before each launch its processes are let grow by
the rank's limit from what runs there then (its sandbox and zygote). With ``DTFS_LIMITS_LOG``
the most each host used is written at the end (measuring the solutions' needs:
``tests/test_limits.py``).

Owns: :class:`HostCgroups`. Called by :mod:`.hosts` (``Pool.limit_events``, read by
:func:`.harness.run_ranks`; each zygote joins its host's cgroup as it starts).
"""
import json
import os

from . import limits

ZYGOTE_MEMORY = 1 << 30     # at grading, a host's memory: its rank's limit and this (the zygote)
ZYGOTE_TASKS = 32           # ... its processes and threads: its rank's limit and these


class HostCgroups:
    """One :class:`.limits.Cgroup` per host, made when its zygote starts (see the module
    docstring)."""

    def __init__(self):
        self.groups = {}             # host -> its limits.Cgroup (at grading, as root)
        self.peaks = {}              # host -> most tasks above the zygote's, most memory seen

    def of(self, h):
        """Host ``h``'s cgroup at grading (:mod:`.limits`: memory and processes bounded by
        the kernel for everything on the host, its zygote included, which holds about
        :data:`ZYGOTE_MEMORY` of its own), or None: no limits, or no cgroups here."""
        found = limits.current()
        if not found:
            return None
        if h not in self.groups:
            group = limits.Cgroup.make(f"h{h}")
            if group is None:
                return None
            group.set(memory=int(found["memory"]) + ZYGOTE_MEMORY,
                      processes=int(found["processes"]) + ZYGOTE_TASKS)
            self.groups[h] = group
        return self.groups[h]

    def events(self, size, arm=False):
        """``[{"memory": n, "processes": n} or None for each of the first size hosts]``: what
        the kernel stopped on each so far (:meth:`.limits.Cgroup.events`). ``arm``: first
        let each host's processes and threads grow by the limit from what runs there now
        (its sandbox and zygote, swept of any launch's)."""
        found = limits.current()
        for h in range(size):
            group = self.groups.get(h)
            if group is None:
                continue
            tasks, peak = len(group.tasks()), self.peaks.setdefault(h, {"tasks": 0, "memory": 0})
            if arm and found:
                peak["base"] = tasks
                peak["zygote"] = min(peak.get("zygote", 1 << 62), group.anonymous())
                group.set(processes=tasks + int(found["processes"]))
            elif "base" in peak:    # (what the solutions need: DTFS_LIMITS_LOG, see close)
                peak["tasks"] = max(peak["tasks"], tasks - peak["base"])
                peak["memory"] = max(peak["memory"], group.anonymous())
        return [self.groups[h].events() if h in self.groups else None for h in range(size)]

    def close(self):
        """Write the peaks to ``DTFS_LIMITS_LOG`` (if set) and remove every host's cgroup."""
        log = os.environ.get("DTFS_LIMITS_LOG")
        if log and self.peaks:        # measuring the solutions' needs (tests/test_limits.py)
            with open(log, "a") as f:
                f.write(json.dumps({"cwd": os.getcwd(), "peaks": self.peaks}) + "\n")
        for group in self.groups.values():
            group.close()
        self.groups = {}
