"""The judge's launcher of one launch on the checks' hosts: it asks each host's zygote for its
rank and exits with the first failing rank's status.

:func:`command` writes the launch's spec (each rank's zygote socket, worker arguments and
working directory; host 0's address; the modules the ranks preload) and returns the command
that runs this module on it, outside every sandbox::

    python -P -m exercise_utils.hostranks SPEC

Owns: :func:`command`, :func:`main`. Called by :meth:`.hosts.Pool.command` (the command
:func:`.hostlaunch.launch_on_hosts` runs). Used by every checker at grading.
"""
import json
import os
import selectors
import sys
from pathlib import Path


def command(spec_path, ranks, master, preload):
    """Write the spec of one launch to ``spec_path``; return the launcher's command.

    Args:
        ranks: ``[(zygote socket, worker arguments, working directory)]``, rank r on host r.
        master: host 0's address (MASTER_ADDR).
        preload: modules the ranks import (a zygote forks only those it preloaded).
    Returns:
        list[str]: the command (its exit status: the first failing rank's, :func:`main`).
    """
    spec = {"ranks": [{"socket": str(sock), "args": args, "cwd": str(cwd)}
                      for sock, args, cwd in ranks],
            "master": master, "preload": list(preload)}
    Path(spec_path).write_text(json.dumps(spec))
    return [sys.executable, "-P", "-m", "exercise_utils.hostranks", str(spec_path)]


def main(spec_path):
    """The launcher: ask each host's zygote for its rank (with this process's output
    descriptors and environment, RANK, WORLD_SIZE, MASTER_ADDR), wait for their exit
    statuses, and exit with the first non-zero one, closing the other connections (their
    zygotes kill those ranks) as soon as one fails. A zygote that cannot be reached, or that
    closed a connection without a status, makes it exit with :data:`.zygote.LOST`."""
    from .zygote import LOST, request
    spec = json.loads(Path(spec_path).read_text())
    n = len(spec["ranks"])
    base = dict(os.environ)
    conns = {}
    try:
        for r, rank in enumerate(spec["ranks"]):
            env = {**base, "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": str(n),
                   "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": spec["master"], "TMPDIR": "/tmp"}
            try:
                conns[r] = request(rank["socket"], rank["args"], env, preload=spec["preload"],
                                   cwd=rank["cwd"])
            except OSError as exc:
                print(f"hosts: rank {r}'s zygote could not be reached ({exc})", file=sys.stderr,
                      flush=True)
                sys.exit(LOST)
    except BaseException:
        for conn in conns.values():
            conn.close()
        raise
    sel = selectors.DefaultSelector()
    for r, conn in conns.items():
        sel.register(conn, selectors.EVENT_READ, r)
    statuses, code = {}, 0
    while len(statuses) < n and not code:
        for key, _ in sel.select(timeout=1.0):
            data = b""
            try:
                while chunk := key.fileobj.recv(64):  # (the zygote closes after the status)
                    data += chunk
            except OSError:                           # (a zygote gone before it accepted)
                data = b""
            sel.unregister(key.fileobj)
            statuses[key.data] = int(data) if data.strip() else LOST
            code = code or statuses[key.data]
    for conn in conns.values():
        conn.close()
    sys.exit(abs(code))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("python -m exercise_utils.hostranks SPEC")
    main(sys.argv[1])
