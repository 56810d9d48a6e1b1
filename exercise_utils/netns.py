"""Network namespaces on this machine: whether they can be made, the tools that make them, and
the removal of what a dead owner left.

Every namespace this course makes is named ``dtfs-<pid>-...`` (:data:`PREFIX`, the maker's pid
first), and brings two files besides: its ``/etc/hosts`` (under :data:`NETNS_ETC`, which
``ip netns exec`` mounts) and its UTS namespace (under :data:`UTS_DIR`: its hostname). A
process killed with SIGKILL cannot remove them: :func:`remove_stale` removes those whose maker
is gone (every new :class:`.cluster.Cluster` calls it first; ``python -m exercise_utils.cluster
cleanup`` does it by hand).

Owns: :func:`unavailable_reason` (why no namespace can be made here, with the fix),
:func:`tool` and :func:`ip` (``ip``, ``tc``, ``unshare``: an error with their stderr),
:func:`remove` (one namespace, what runs in it and its files), :func:`namespaces`,
:func:`remove_stale`. Called by :mod:`.cluster` (its hosts and switch, re-exporting
``unavailable_reason`` for the notebooks), :mod:`.links` (shaping, counters) and :mod:`.hosts`
(whether the checks' hosts can run here). Used in 03, 05, 06, 08 and 10 and by every checker.
"""
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

PREFIX = "dtfs-"              # every namespace this course creates starts with it
NETNS_ETC = Path("/etc/netns")
UTS_DIR = Path("/run/dtfs-uts")  # one file per host: its UTS namespace (hostname)


def unavailable_reason():
    """Why this machine cannot make network namespaces (a sentence with the fix), or None.

    Returns:
        str or None: not Linux, not root, no iproute2/util-linux, or ``ip netns add`` refused.
    """
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return ("network namespaces need root: run Jupyter (or the tests) with sudo, or use "
                "Colab, which runs as root")
    missing = [name for name in ("ip", "tc", "unshare", "nsenter") if not shutil.which(name)]
    if missing:
        return (f"{' and '.join(missing)} not found: install iproute2 and util-linux "
                "(sudo apt-get install iproute2 util-linux)")
    probe = f"{PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return (f"`ip netns add` failed ({made.stderr.strip()}): this container may lack "
                "CAP_SYS_ADMIN (docker: --privileged)")
    ip("netns", "del", probe, check=False)
    return None


def tool(cmd, check=True):
    """Run ``cmd`` (a list: ``tc ...``, ``unshare ...``), its output captured.

    Returns:
        subprocess.CompletedProcess: its return code, stdout and stderr (text).
    Raises:
        RuntimeError: ``check`` and it failed (the command and its stderr).
    """
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc


def ip(*args, check=True):
    """``ip <args>`` with :func:`tool`."""
    return tool(["ip", *args], check)


def remove(netns):
    """Kill the processes in ``netns``, delete it and its files (/etc/netns, UTS).

    Returns:
        str: '' once it is gone, else the namespace and the error (after 5 s of tries).
    """
    for pid in ip("netns", "pids", netns, check=False).stdout.split():
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
    uts = UTS_DIR / netns
    if uts.exists():
        tool(["umount", str(uts)], check=False)
        uts.unlink(missing_ok=True)
    for _ in range(50):
        gone = ip("netns", "del", netns, check=False)
        if netns not in namespaces():
            return ""
        time.sleep(0.1)
    return f"{netns} ({gone.stderr.strip()})"


def namespaces(prefix=PREFIX):
    """Names of the network namespaces starting with ``prefix``."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def remove_stale():
    """Delete the ``dtfs-<pid>-...`` namespaces whose creating process is gone.

    Returns:
        list[str]: the namespaces deleted.
    """
    stale = []
    for ns in namespaces():
        found = re.match(rf"{PREFIX}(?:probe-)?(\d+)-", ns)
        if found and not psutil.pid_exists(int(found[1])):
            remove(ns)
            stale.append(ns)
    return stale
