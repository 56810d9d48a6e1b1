"""One launch of a check on the session's hosts (:mod:`.hosts`: at grading, as root): rank r
runs on host r, in a sandbox of its own, and the judge reads the bytes every link carried from
the kernel's counters, outside every sandbox; what a launch left running (a daemon) is counted
and swept.

Owns: :func:`session_pool`, :func:`launch_on_hosts`. Called by :func:`.harness.run_ranks`.
"""
import sys
import time
from pathlib import Path

from . import cluster, hosts, launch, reports, sandbox, sessions, stops, zygote


def session_pool(world_size):
    """The hosts (:func:`.hosts.pool`: this process's, started at its first launch on hosts),
    reset when the session ends (:meth:`.hosts.Pool.reset`)."""
    sessions.SESSION[0]["pool"] = hosts.pool(world_size)
    return sessions.SESSION[0]["pool"]


def launch_on_hosts(pool, size, backend, copies, kwfiles, folders, common, limit, what, watch):
    """One launch on the session's hosts, rank r on host r (:mod:`.hosts`); returns the bytes
    sent on each link between them, as the kernel counted them. A host's zygote that was gone
    before any rank started is started anew and the launch runs again, once."""
    opts = sessions.options(common)
    module, probe = opts["--probe"].split(":")
    preload = [module, *sessions.optimizer(Path(copies[0]), module, "--warm-up" in common)]
    if backend == "mpi":
        preload = ["mpi4py.MPI", *preload]
        home = pool.root / "{host}"
        k = Path(folders[0]).name
        copy = copies[0] if Path(pool.root) not in Path(copies[0]).parents else (
            home / "in" / k / Path(copies[0]).name)
        args = ["--student", str(copy), "--kwargs",
                str(home / "in" / k / "kwargs.pkl"), "--out", str(home / "w" / k), *common]
        env = {**cluster.MPI_OVER_LINKS, "MASTER_ADDR": pool.net.hosts[0].address}
    else:
        env = {}
    for attempt in (0, 1):
        cmd = (pool.mpi_command(size, args, preload) if backend == "mpi" else
               pool.command([(["--student", str(copies[r]), "--kwargs", str(kwfiles[r]),
                               "--out", str(folders[r]), *common], folders[r])
                             for r in range(size)], preload))
        env["MASTER_PORT"] = str(pool.port())
        before = pool.link_bytes(size)
        try:
            launch.run(cmd, nprocs=size, timeout=limit, echo=False, what=what, watch=watch,
                       sandboxed=True, env=env, output_limit=stops.output_limit())
        except launch.LaunchTimeout:
            raise
        except launch.LaunchError as err:
            if attempt or err.returncode != zygote.LOST or not reports.untouched(folders):
                raise
            lost = "; ".join(pool.lost(h) for h in range(size))
            print(f"note: {what}: a host's zygote was lost ({lost}); the launch ran again.",
                  file=sys.stderr, flush=True)
            continue
        finally:
            if sandbox.policy() is not None and not sandbox.weakened("strays"):
                # at grading: what outlived the launch
                pool.left = _strays(pool, size)
            pool.sweep()
        after = pool.link_bytes(size)
        return {link: after[link] - before[link] for link in after}


def _strays(pool, size):
    """``{host: count}`` of processes a launch's ranks left running outside their zygote's
    tree (:meth:`.hosts.Pool.strays`) a second after it ended (slow exits are let end)."""
    end = time.monotonic() + 1.0
    left = pool.strays(size)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = pool.strays(size)
    return {h: len(procs) for h, procs in left.items()}
