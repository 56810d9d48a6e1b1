"""What torchrun's agent does for a checked job, in one process that forks its workers.

``torchrun --nproc-per-node N --max-restarts R`` starts N workers with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``TORCHELASTIC_RESTART_COUNT`` in their environment, watches them, and when one fails stops
the others and starts all N again (at most R times). This module does exactly that for the
checks of notebook 05 (:mod:`.jobs`), with one difference that only saves time: the workers are
forked from this process after it imported torch and the checks' worker code once, instead of
each importing them afresh (about 4 s of CPU per worker and per attempt, most of a check's
cost on 2 cores). Nothing runs on torch before a fork (no thread of torch's yet); each worker
then runs :func:`.probes.worker_main`, whose output lines carry ``[rank<R>]:`` as torchrun's
do. When a worker fails, the agent says which one first (rank, exit code or signal).

Launched by :func:`.jobs.run_job`::

    python -m exercise_utils.ddp_torchrun_fault_tolerance.agent --nproc 2 --max-restarts 1 \
        --student work/05_trainer.py --records DIR [trainer options ...]

Used in 05_ddp_torchrun_fault_tolerance.
"""
import os
import signal
import sys
import time
import traceback


class _Prefixed:
    """A stream whose every line starts with ``[rank<R>]: ``."""

    def __init__(self, stream, rank):
        self.stream, self.prefix, self.fresh = stream, f"[rank{rank}]: ", True

    def write(self, text):
        out = []
        for piece in text.splitlines(keepends=True):
            out.append((self.prefix if self.fresh else "") + piece)
            self.fresh = piece.endswith("\n")
        return self.stream.write("".join(out)) and len(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _worker(rank, nproc, attempt, restarts, port, argv):
    """In the forked child: torchrun's environment, then the checked worker; never returns."""
    from ..forking import exit_flushed
    from . import probes
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                      LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                      ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc), MASTER_PORT=str(port),
                      MASTER_ADDR="127.0.0.1", TORCHELASTIC_RESTART_COUNT=str(attempt),
                      TORCHELASTIC_MAX_RESTARTS=str(restarts))
    sys.stdout, sys.stderr = _Prefixed(sys.stdout, rank), _Prefixed(sys.stderr, rank)
    code = 1
    try:
        probes.worker_main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the worker's error, as torchrun's workers print it
        traceback.print_exc()
    finally:
        exit_flushed(code)


def _describe(code):
    return (f"killed by signal {signal.Signals(-code).name}" if code < 0
            else f"exit code {code}")


def run_attempt(nproc, attempt, restarts, argv, target=None):
    """Fork ``nproc`` workers; wait for all, or stop the others when one fails.

    Args:
        target: what a forked worker runs, ``target(rank, nproc, attempt, restarts, port,
            argv)``, never returning (default: the checked worker, :func:`_worker`).
    Returns:
        None when every worker exited with 0, else (rank, exit code) of the first failure.
    """
    from ..launch import free_port
    port = free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            (target or _worker)(rank, nproc, attempt, restarts, port, argv)
        pids[pid] = rank
    codes, failed = {}, None
    while len(codes) < nproc and failed is None:
        pid, status = os.waitpid(-1, 0)
        if pid in pids:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0:
                failed = (pids[pid], codes[pid])
    _stop([p for p in pids if p not in codes])
    return failed


def _stop(pids, grace=5.0):
    """SIGTERM the workers still running, SIGKILL those left after ``grace`` seconds; reap all."""
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    left, end = list(pids), time.monotonic() + grace
    while left and time.monotonic() < end:
        left = [p for p in left if os.waitpid(p, os.WNOHANG)[0] == 0]
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    nproc = int(argv[argv.index("--nproc") + 1])
    restarts = int(argv[argv.index("--max-restarts") + 1])
    rest = [a for i, a in enumerate(argv) if not (
        a in ("--nproc", "--max-restarts") or (i and argv[i - 1] in ("--nproc", "--max-restarts")))]
    _preload()
    for attempt in range(restarts + 1):
        failed = run_attempt(nproc, attempt, restarts, rest)
        if failed is None:
            return 0
        print(f"[agent] attempt {attempt}: worker rank {failed[0]} failed first "
              f"({_describe(failed[1])}); the others were stopped"
              f"{'; restarting every worker' if attempt < restarts else ''}", flush=True)
    return 1


# what every worker needs (torch, DDP, the optimizers, which import torch._dynamo, the checks'
# worker code): imported before any fork, here or by a zygote that forks the agent
# (:func:`..harness.module_command`)
PRELOAD = ["torch", "torch.distributed", "torch.optim", "torch._dynamo",
           "torch.nn.parallel", "torch.utils.data", "exercise_utils.data",
           "exercise_utils.heartbeat", "exercise_utils.models", "exercise_utils.rankworker",
           "exercise_utils.ddp_torchrun_fault_tolerance.probes",
           "exercise_utils.ddp_torchrun_fault_tolerance.runner",
           "exercise_utils.ddp_torchrun_fault_tolerance.simulate"]


def _preload():
    """Import PRELOAD before any fork; run nothing on torch."""
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)


if __name__ == "__main__":
    sys.exit(main())
