"""A node dies in the middle of a two-host job: what torchrun does, measured.

Each run is your ``work/05_trainer.py`` on the two hosts of an
:class:`exercise_utils.cluster.Cluster` (one torchrun agent and one worker per host,
``--max-restarts 1``, the c10d rendezvous on ``h0``, a snapshot every epoch on the disk both
hosts share). After step ``kill_at_step`` host h1 *dies*: its agent and its worker are
killed with SIGKILL (:func:`runner.fault_point`, ``--kill-node-at-step``). Three ways on:

* ``"fixed"``: ``--nnodes=2`` and nothing replaces h1. h0's agent restarts its worker and
  waits at the rendezvous for a second node, until the join timeout (here ``JOIN_TIMEOUT``
  s; torchrun's default is 600 s): then the job fails.
* ``"replaced"``: ``--nnodes=2``; two seconds after the death a new agent starts on h1 (what
  a scheduler or an operator does). It joins the new rendezvous round, both workers load the
  snapshot, and the job ends as if nothing had happened.
* ``"elastic"``: ``--nnodes=1:2``: h0's agent waits ``LAST_CALL`` s for more nodes, then
  goes on alone: world size 1, from the snapshot.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import re
import shlex
import time
import uuid
from pathlib import Path

from .. import display, launch
from . import runner
from ..commands import agent_command

JOIN_TIMEOUT = 20      # seconds an agent waits at the rendezvous for the nodes it needs
LAST_CALL = 3          # elastic: seconds to wait for more nodes once the minimum is there
REPLACE_AFTER = 2      # "replaced": seconds between the death and the new agent's start
ENV = {**launch.FRESH_STORE_ENV, "LOGLEVEL": "INFO"}   # agents log the rendezvous (INFO)
MODES = {"fixed": ("2", False), "replaced": ("2", True), "elastic": ("1:2", False)}
# what a line must contain to tell the story (torchrun's agents log at INFO level here)
STORY = ("fault injection", "a new node starts", "Worker group FAILED", "Rendezvous'ing",
         "Rendezvous complete", "RendezvousTimeoutError", "dead node", "Error: ",
         "resumed from", "epoch ")           # "Error: ": the worker's error, however gloo words it
LOG_PREFIX = re.compile(r"[IWE]\d{4} [\d:.]+ +\d+ \S+\] ")   # torchrun's "I1124 19:54:39.47 ...py:942] "


def run(cluster, trainer, mode, args, kill_at_step, prefix="work/05_node", timeout=240,
        port=29400, echo=False):
    """Run one two-host job in which h1 dies after ``kill_at_step`` (see the module docstring).

    Args:
        cluster: a running :class:`exercise_utils.cluster.Cluster` (at least 2 hosts).
        trainer: the training script (``work/05_trainer.py``).
        mode: ``"fixed"``, ``"replaced"`` or ``"elastic"``.
        args: the trainer's arguments without ``--snapshot``/``--out``.
        kill_at_step: the optimizer step after which h1 dies.
        prefix: files ``<prefix>_<mode>_snapshot.pt`` and ``_final.pt`` (deleted first).
        timeout: seconds for the whole job.
    Returns:
        dict: ``mode``, ``ok`` (the job finished), ``seconds`` (whole job),
        ``after_death`` (seconds from the death to the job's end), ``error`` (h0's last
        error line when it failed), ``final`` (the ``--out`` file's counters: ``attempt``,
        ``world_size``, ``step``, ``epochs_run``) and ``story`` (the telling output lines).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    nnodes, replace = MODES[mode]
    snapshot, out = f"{prefix}_{mode}_snapshot.pt", f"{prefix}_{mode}_final.pt"
    marker = Path(runner.node_died_marker(snapshot))
    for f in (snapshot, out, marker):
        Path(f).unlink(missing_ok=True)
    conf = f"--rdzv-conf=join_timeout={JOIN_TIMEOUT},last_call_timeout={LAST_CALL}"
    cmd = agent_command(trainer, nnodes, 1, f"h0:{port}", f"dtfs-{uuid.uuid4().hex[:8]}",
                        [*args, "--snapshot", snapshot, "--out", out,
                         "--kill-node-at-step", kill_at_step], max_restarts=1, extra=[conf])
    h0, h1 = cluster.hosts[:2]
    jobs, labels = [(h0, cmd), (h1, cmd)], ["h0", "h1"]
    if replace:
        jobs.append((h1, _after_death(marker, cmd)))
        labels.append("h1, new")
    start, lines = time.time(), []
    result = {"mode": mode, "ok": True, "error": None, "final": None}
    try:
        cluster.run_many(jobs, labels=labels, timeout=timeout, echo=echo, may_fail=[1],
                         what=f"the two-host job ({mode})", env=ENV, transcript=lines)
    except launch.LaunchError as err:
        if display.not_written(err.output or ""):      # the trainer is not written yet: no
            raise                                      # story to tell, the box says what to do
        result.update(ok=False, error=_last_error(err.output))
    end = time.time()
    died = float(marker.read_text()) if marker.exists() and marker.read_text() else None
    result.update(seconds=end - start, after_death=None if died is None else end - died,
                  story=story(lines))
    if result["ok"] and Path(out).exists():
        import torch
        state = torch.load(out, map_location="cpu")
        result["final"] = {k: state[k] for k in ("attempt", "world_size", "step", "epochs_run")}
    return result


def run_all(trainer, args, kill_at_step, modes=tuple(MODES), rate="1gbit", prefix="work/05_node",
            timeout=240):
    """Run one job per mode at the same time, each on its own two-host cluster.

    The runs are independent (their own hosts, rendezvous and files); together they take as
    long as the slowest, which is set by torchrun's timeouts more than by the computing.

    Args:
        trainer, args, kill_at_step, prefix, timeout: as :func:`run`.
        modes: the modes to run.
        rate: every host's link rate (:mod:`exercise_utils.cluster`).
    Returns:
        list[dict]: :func:`run`'s results, in the order of ``modes``.
    """
    from concurrent.futures import ThreadPoolExecutor
    from .. import cluster

    def one(mode):
        with cluster.Cluster(2, rate=rate) as net:
            return run(net, trainer, mode, args, kill_at_step, prefix, timeout)
    print(f"{len(modes)} two-host jobs at once ({', '.join(modes)}); host h1 dies after "
          f"step {kill_at_step} in each ...", flush=True)
    with ThreadPoolExecutor(len(modes)) as pool:
        return list(pool.map(one, modes))


def _after_death(marker, cmd):
    """``cmd`` started ``REPLACE_AFTER`` s after ``marker`` appears (gives up after 120 s)."""
    wait = (f'for i in $(seq 600); do [ -s {shlex.quote(str(marker))} ] && break; sleep 0.2; '
            f'done; [ -s {shlex.quote(str(marker))} ] || {{ echo "no node died"; exit 0; }}; '
            f'sleep {REPLACE_AFTER}; echo "a new node starts"; exec "$@"')
    return ["sh", "-c", wait, "sh", *map(str, cmd)]


def _last_error(output):
    errors = [line for line in output.splitlines() if re.search(r"\w+Error\b", line)]
    return LOG_PREFIX.sub("", (errors or output.splitlines() or [""])[-1]).strip()[:300]


def story(transcript, width=140):
    """The lines of a node-failure job that tell what happened, each with its time.

    Args:
        transcript: ``[(seconds since the start, "[label] line"), ...]`` (``run_many``'s).
    Returns:
        str: ``"  12.3 s  [h0] ..."`` lines, tracebacks left out.
    """
    keep = []
    for seconds, line in transcript:
        if not any(s in line for s in STORY) or line.split("] ", 1)[-1].startswith(" "):
            continue                                 # not telling, or a traceback's line
        line = f"{seconds:6.1f} s  {LOG_PREFIX.sub('', line).replace('[rank0]: ', '')}"
        keep.append(line if len(line) <= width else line[:width - 3] + "...")
    return "\n".join(keep)


def table(results):
    """The runs side by side as text (Markdown-style)."""
    rows = ["| run | nnodes | outcome | world size at the end | steps | restarts | "
            "seconds after the death |", "|---|---|---|---|---|---|---|"]
    for r in results:
        final = r["final"] or {}
        outcome = ("finished" if r["ok"] else f"failed: {r['error'][:70]}")
        after = "" if r["after_death"] is None else f"{r['after_death']:.1f}"
        rows.append(f"| {r['mode']} | {MODES[r['mode']][0]} | {outcome} | "
                    f"{final.get('world_size', '')} | {final.get('step', '')} | "
                    f"{final.get('attempt', '')} | {after} |")
    return "\n".join(rows)
