"""One checked torchrun job of the student's trainer, and what it left behind (judge side).

:func:`run_job` starts ``work/05_trainer.py`` as torchrun does (:mod:`.agent`: torchrun's
environment, every worker restarted when one fails) through the worker entry point of
:mod:`.probes`, waits for it (a hang is a hang only when every worker stopped making progress:
:mod:`exercise_utils.heartbeat`), and returns a :class:`Job`: every rank's records of every
attempt (plain JSON), the final result rank 0 wrote, the output. A job that fails raises
:class:`~exercise_utils.contract.CheckFailure`, charged to the case of what the failing worker
was doing (its ``phase``: ``setup``, ``init``, ``load``, ``epoch``, ``save``; the checker gives
the map), after the checker's ``partial`` checks have looked at the records the workers had
written (what they already show comes first).

Used in 05_ddp_torchrun_fault_tolerance (:mod:`.checks`, :mod:`.checks_snapshots`).
"""
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..contract import CheckFailure
from ..notebook_files import no_file
from . import agent, probes

TIMEOUT = 60                 # seconds all workers may make no progress before it is a hang
ROOT = Path(__file__).resolve().parents[2]   # the folder that holds exercise_utils
LIMIT = 900                  # seconds a job that keeps making progress may run (endless loop)
SEED, TIMEOUT_S = 3, 20      # config.seed (not the sampler's default 0), config.timeout_s
TRAIN, BATCH, EPOCHS = 256, 16, 3
RUN = ["--data", "synthetic", "--train-size", str(TRAIN), "--epochs", str(EPOCHS),
       "--batch-size", str(BATCH), "--model", "check", "--lr", "0.05", "--warmup-steps", "20",
       "--seed", str(SEED), "--timeout-s", str(TIMEOUT_S)]
NOT_IMPLEMENTED = ("not implemented yet: {path} still raises NotImplementedError (ddp_setup, "
                   "Trainer.__init__, save_snapshot, load_snapshot or run_epoch). Replace the "
                   "`raise` lines, then run the %%writefile cell again.")


def steps_per_epoch(workers, train=TRAIN, batch=BATCH):
    """Optimizer steps per epoch: each rank's share of ``train`` examples, padded by the
    DistributedSampler to the same length on every rank, in batches of ``batch``."""
    return math.ceil(math.ceil(train / workers) / batch)


def require(path):
    if not Path(path).is_file():
        raise CheckFailure(no_file(path))


@dataclass
class Job:
    """What a finished job left: ``logs`` {(rank, attempt): records}, ``final`` (what rank 0
    wrote at the end, or None), ``output``, ``folder`` (its records and snapshot copies),
    ``snapshot`` (the path it was given)."""
    logs: dict
    final: dict
    output: str
    folder: Path
    snapshot: Path

    def ranks(self, attempt):
        """{rank: records} of one attempt."""
        return {r: log for (r, a), log in sorted(self.logs.items()) if a == attempt}

    @property
    def attempts(self):
        return sorted({a for _, a in self.logs})


def run_job(path, folder, name, nproc, args, phases, restarts=0, timeout=60, simulate="",
            partial=None, snapshot=None):
    """Run one job; return its :class:`Job`.

    Args:
        path: the student's file. folder: where the job's files go (a fresh one per check).
        name: the job's name in messages ("T", "A", "R"). nproc: workers.
        args: the trainer's options (:func:`.runner.parse_args`), ``--snapshot``, ``--out`` added.
        phases: {phase: case}: the case a crash or hang while the student's code runs that
            phase is charged to ("other": anything else).
        restarts: torchrun's ``--max-restarts``. timeout: seconds without progress = a hang.
        simulate: what rank 0 simulates (:mod:`.simulate`): "setup,init" or "load".
        partial: called with the :class:`Job` of a failed run before its failure is reported.
        snapshot: the snapshot's path (default: a new one in ``folder``).
    """
    from .. import heartbeat, launch, limits, sandbox, sessions, stops
    records = Path(folder) / f"records_{name}"
    records.mkdir()
    probes.beat_folder(records).mkdir()
    out = Path(folder) / f"{name}_final.pt"
    snapshot = Path(snapshot or Path(folder) / f"{name}_snapshot.pt")
    student = Path(path).resolve()
    if sandbox.policy() is not None:    # at grading: the submission's folder is out of sight
        student = Path(folder) / f"{name}_student" / Path(path).name
        student.parent.mkdir()
        student.write_bytes(Path(path).read_bytes())
    argv = ["--student", str(student), "--records", str(records),
            "--simulate", simulate, *args, "--snapshot", str(snapshot), "--out", str(out)]
    job = Job({}, None, "", records, snapshot)
    cwd = Path(folder) / f"{name}_cwd"      # the workers' working directory: files a student's
    cwd.mkdir()                             # code writes there go with the check's folder

    def given(output):                      # (the copy's path read as the one the check got)
        return (output or "").replace(str(student), str(path))
    try:
        watch = heartbeat.Watch(probes.beat_folder(records), nproc, stops.hang_time(timeout))
        line = ["--nproc", str(nproc), "--max-restarts", str(restarts), *argv]
        cmd = (sessions.module_command(agent.__name__, line, [*agent.PRELOAD, agent.__name__])
               or [sys.executable, "-P", "-m", agent.__name__, *line])
        limit, cut = stops.launch_limit(LIMIT, f"job {name}", phases["other"])
        result = launch.run(cmd, nprocs=nproc, timeout=limit,
                            watch=watch, echo=False, what=f"your trainer's job {name}",
                            cwd=cwd, writable=[folder], env={"PYTHONPATH": os.pathsep.join(
                                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                            output_limit=stops.output_limit())
    except launch.LaunchLimit as err:
        _failed(job, given(err.output), partial, path)
        raise CheckFailure(f"job {name}: {err.line}", phases["other"]) from None
    except launch.LaunchHang as err:
        _failed(job, given(err.output), partial, path)
        running = [phases.get(s.get("case"), phases["other"]) for s in err.report]
        seen = "\n  ".join(heartbeat.describe(err.report, path))
        raise CheckFailure(f"job {name}: hung: every worker stopped making progress:\n  {seen}"
                           f"\nDo all ranks make the same collective calls (DDP's forward and "
                           f"backward, all_gather_object, barriers) in the same order?",
                           running[0] if running else phases["other"]) from None
    except launch.LaunchTimeout as err:
        _failed(job, given(err.output), partial, path)
        if cut:
            raise CheckFailure(f"{stops.out_of_time(f'job {name}', limits.current())}"
                               f" an endless loop? {err}", phases["other"]) from None
        raise CheckFailure(f"job {name}: still running after {LIMIT} s although it kept making "
                           f"progress (an endless loop?): {err}", phases["other"]) from None
    except launch.LaunchError as err:
        _failed(job, given(err.output), partial, path)
        case = phases.get(_failed_phase(job, given(err.output)), phases["other"])
        raise CheckFailure(f"job {name} failed (while your code ran "
                           f"{_failed_phase(job, given(err.output)) or 'its start'}):\n"
                           f"{worker_errors(given(err.output))}", case) from None
    _read(job, given(result.output))
    if not out.exists():
        raise CheckFailure(f"job {name}: the job ended without rank 0 writing its result (did "
                           f"Trainer.train return?)\n{_tail(given(result.output))}", phases["other"])
    import torch
    job.final = torch.load(out, map_location="cpu")
    return job


def _read(job, output):
    job.output = output
    for p in sorted(job.folder.glob("rank*_attempt*.json")):
        rank, attempt = map(int, re.findall(r"\d+", p.stem))
        try:
            job.logs[rank, attempt] = json.loads(p.read_text())
        except ValueError:
            continue


def _failed(job, output, partial, path):
    """Read what the failed job left; not implemented yet?; the checker's partial checks."""
    _read(job, output or "")
    if "NotImplementedError" in job.output:
        raise CheckFailure(NOT_IMPLEMENTED.format(path=path))
    if partial:
        partial(job)


def _failed_phase(job, output):
    """The phase of the worker that failed first (the agent says which) in the last attempt."""
    found = re.findall(r"\[agent\] attempt (\d+): worker rank (\d+) failed first", output)
    last = max(job.attempts, default=0)
    logs = job.ranks(last)
    if found and int(found[-1][1]) in logs:
        return logs[int(found[-1][1])]["phase"]
    unfinished = [log["phase"] for log in logs.values() if not log["finished"]]
    return unfinished[0] if unfinished else None


def _tail(output, n=25):
    lines = [line for line in output.splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def worker_errors(output):
    """The workers' own error lines (and injected faults), else the end of the output."""
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)           # torch's bold text
    keep = [line for line in output.splitlines() if "[fault injection]" in line or
            re.match(r"^\[rank\d+\]: [\w.]*(Error|Exception)\b", line)]
    if keep:
        return "\n".join(keep[-12:])
    errors = [line for line in output.splitlines() if re.search(r"\b\w*(Error|Exception)\b: ", line)]
    return "\n".join(errors[-8:] + ["--- last lines ---", _tail(output, 40)])
