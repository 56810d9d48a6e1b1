"""Checkers of notebook 05: the student's torchrun ``Trainer``, then its snapshots and restarts.

Both run ``work/05_trainer.py`` under torchrun with 2 CPU workers through the worker entry
point of :mod:`.probes`, which imports the student file, records what the workers do
(``set_epoch`` before each epoch's iteration, every ``torch.save`` / ``torch.load`` and on
which rank) and then runs :func:`.runner.main` exactly as the student's own launch does.

:func:`check_trainer` (``ddp_setup``, ``Trainer.__init__``, ``run_epoch``): one run without
snapshots: ``ddp_setup`` as worker 3 of 4 with and without CUDA (simulated, :mod:`.probes`:
NCCL, ``cuda:LOCAL_RANK`` and ``set_device`` on GPUs, gloo on CPUs, ``config.timeout_s``,
RANK not LOCAL_RANK as the rank); every rank iterates a ``DistributedSampler`` of its own
part with ``config.seed``; it trains every epoch, a new shuffle each epoch (``set_epoch``),
and the replicas agree at the end although every rank initialised its model from a different
seed (DDP).

:func:`check_snapshots` (``save_snapshot``, ``load_snapshot``), three runs:

A. uninterrupted: snapshots come from rank 0 only and hold the unwrapped model's state_dict,
   the optimizer state (momentum), the scheduler, the counters and every rank's RNG state;
B. a crash while rank 0 writes a snapshot (half a file written, then killed), one restart:
   must resume from the last complete snapshot and end with A's parameters;
C. rank 1 killed in the middle of an epoch, one restart: must end with A's parameters.

B and C must also end with A's counters and scheduler (a warm-up that lasts past the first
snapshot) and load the snapshot with ``map_location``.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import json
import re
import tempfile
from pathlib import Path

from . import probes

TIMEOUT = 60                 # seconds both workers may make no progress before it is a hang
LIMIT = 900                  # seconds a job that keeps making progress may run (endless loop)
SEED, TIMEOUT_S = 3, 20      # config.seed (not the sampler's default 0), config.timeout_s
RUN = ["--data", "synthetic", "--train-size", "256", "--epochs", "3", "--batch-size", "16",
       "--model", "mlp", "--lr", "0.05", "--warmup-steps", "20", "--save-every", "1",
       "--seed", str(SEED), "--timeout-s", str(TIMEOUT_S)]
STEPS_PER_EPOCH = 8          # 256 examples / 2 workers / 16 per step
# (the warm-up lasts past the epoch-1 snapshot: a resumed job needs the scheduler's state)


def _run(path, folder, name, extra_run=(), restarts=0, timeout=TIMEOUT):
    """One torchrun job of 2 workers; return (launch result, final state, records)."""
    from .. import heartbeat, launch
    import torch
    records = Path(folder) / f"records_{name}"
    records.mkdir()
    probes.beat_folder(records).mkdir()
    out, snap = Path(folder) / f"{name}_final.pt", Path(folder) / f"{name}_snapshot.pt"
    args = ["--student", str(Path(path).resolve()), "--records", str(records), *RUN,
            "--snapshot", str(snap), "--out", str(out), *extra_run]
    try:
        watch = heartbeat.Watch(probes.beat_folder(records), 2, timeout)
        result = launch.torchrun(probes.__name__, 2, args, timeout=LIMIT, watch=watch,
                                 extra=["--max-restarts", str(restarts), "-m"], echo=False,
                                 what=f"your trainer under torchrun ({name})")
    except launch.LaunchHang as err:
        seen = "\n  ".join(heartbeat.describe(err.report, path))
        raise AssertionError(f"run {name}: hung: both workers stopped making progress:\n  "
                             f"{seen}\nDo both ranks make the same collective calls (DDP's "
                             f"forward and backward, barriers) in the same order?") from None
    except launch.LaunchTimeout as err:
        raise AssertionError(f"run {name}: still running after {LIMIT} s although it kept "
                             f"making progress (an endless loop?): {err}") from None
    except launch.LaunchError as err:
        if "NotImplementedError" in err.output:
            raise AssertionError(f"not implemented yet: {path} still raises NotImplementedError "
                                 "(ddp_setup, Trainer.__init__, save_snapshot, load_snapshot or "
                                 "run_epoch). Replace the `raise` lines, then run the "
                                 "%%writefile cell again.") from None
        if name in ("A", "T"):               # what the records already show comes first
            _check_records(_logs(records), complete=False)
        raise AssertionError(f"run {name}: the torchrun job failed:\n"
                             f"{_worker_errors(err.output)}") from None
    logs = _logs(records)
    if not out.exists():
        raise AssertionError(f"run {name}: the job ended without rank 0 writing its result "
                             f"(did Trainer.train return?)\n{_tail(result.output)}")
    return result, torch.load(out, map_location="cpu"), logs, snap


def _logs(records):
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(records).glob("*.json"))}


def _tail(output, n=25):
    lines = [l for l in output.splitlines() if l.strip()]
    return "\n".join(lines[-n:])


def _worker_errors(output):
    """The workers' own error lines (and injected faults), else the end of the output."""
    keep = [l for l in output.splitlines() if "[fault injection]" in l or
            re.match(r"^\[rank\d+\]: [\w.]*(Error|Exception)\b", l)]
    if keep:
        return "\n".join(keep[-12:])
    errors = [l for l in output.splitlines() if re.search(r"\b\w*(Error|Exception)\b: ", l)]
    return "\n".join(errors[-8:] + ["--- last lines ---", _tail(output, 40)])


def _require(path):
    if not Path(path).is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates it first.")


def check_trainer(path, timeout=TIMEOUT):
    """Check ``ddp_setup``, ``Trainer.__init__`` and ``run_epoch``: one run, no snapshots."""
    _require(path)
    with tempfile.TemporaryDirectory(prefix="dtfs-ddp-") as folder:
        _, final, logs, snap = _checked_run(path, folder, "T", ["--save-every", "1000"],
                                            timeout=timeout)
        _check_setup(logs)
        _check_records(logs)
        _check_trained(final)
        if snap.exists():
            raise AssertionError("a snapshot was written although config.save_every (1000) is "
                                 "more than the number of epochs (3)")


def check_snapshots(path, timeout=TIMEOUT):
    """Check ``save_snapshot`` and ``load_snapshot`` (module docstring: runs A, B and C)."""
    _require(path)
    with tempfile.TemporaryDirectory(prefix="dtfs-ddp-") as folder:
        _, final_a, logs_a, snap_a = _checked_run(path, folder, "A", timeout=timeout)
        _check_uninterrupted(final_a, logs_a, snap_a)
        _, final_b, logs_b, _ = _checked_run(path, folder, "B", ["--crash-in-save", "2"], 1,
                                             timeout)
        _check_resumed(final_b, final_a, logs_b, "B (rank 0 killed while writing the epoch-2 "
                       "snapshot)")
        _, final_c, logs_c, _ = _checked_run(path, folder, "C", [
            "--crash-at-step", str(STEPS_PER_EPOCH + 4), "--crash-rank", "1"], 1, timeout)
        _check_resumed(final_c, final_a, logs_c, f"C (rank 1 killed after step "
                       f"{STEPS_PER_EPOCH + 4}, in the middle of epoch 2)")


def _checked_run(path, folder, name, extra=(), restarts=0, timeout=TIMEOUT):
    try:
        return _run(path, folder, name, extra, restarts, timeout)
    except AssertionError as err:
        text = str(err)
        if name == "B" and not text.startswith("not implemented"):
            text += ("\nRank 0 was killed while writing a snapshot. If the restarted job could "
                     "not load it, the snapshot was written in place: write to a temporary file "
                     "and os.replace it over the snapshot, so a torn file is never loaded.")
        raise AssertionError(text) from None


def _check_records(logs, complete=True):
    """Snapshots written by rank 0 only; set_epoch before every epoch's iteration (for a run
    that failed part-way, ``complete=False``: before each epoch it reached)."""
    epochs = 3
    for name, log in logs.items():
        writers = [p for p in log["saves"] if "snapshot" in Path(p).name]
        if writers and not name.startswith("rank0"):
            raise AssertionError(f"{name} wrote the snapshot ({writers[0]}): only rank 0 may "
                                 "write it (all ranks hold the same state; several writers "
                                 "race on one file)")
    for name, log in logs.items():
        if complete and not log["iterated"]:
            raise AssertionError(f"{name} never iterated a DistributedSampler: give the "
                                 "DataLoader sampler=self.sampler, a DistributedSampler, so that "
                                 "every rank trains on its own part of the data")
        _check_samplers(name, log.get("samplers", []))
        want = list(range(epochs if complete else len(log["iterated"])))
        if log["iterated"] != want:
            raise AssertionError(
                f"{name}: the sampler's epoch when each epoch's iteration began was "
                f"{log['iterated']}; expected {want}. Call self.sampler.set_epoch(epoch) "
                "before iterating, or every epoch repeats the same order")


def _check_samplers(name, samplers):
    """Every sampler a rank iterated: shuffled with config.seed, this rank's part of 2."""
    rank = int(re.match(r"rank(\d+)", name).group(1))
    want = {"seed": SEED, "shuffle": True, "num_replicas": 2, "rank": rank}
    for got in samplers:
        wrong = {k: got[k] for k in want if got[k] != want[k]}
        if wrong:
            raise AssertionError(
                f"{name} iterated a DistributedSampler with {wrong}; expected {want} "
                f"(config.seed is {SEED}): DistributedSampler(train_set, num_replicas="
                "world_size, rank=rank, shuffle=True, seed=config.seed). With another seed "
                "the run's data order is not the one config.seed chooses")


def _check_setup(logs):
    """``ddp_setup`` as worker 3 of 4 (LOCAL_RANK 1), with CUDA and without (simulated)."""
    from .probes import FAKE_ENV
    setup = next((log["setup"] for log in logs.values() if "setup" in log), None)
    if setup is None:
        return
    env = ", ".join(f"{k}={FAKE_ENV[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    for kind, backend, device in (("cuda", "nccl", "cuda:1"), ("cpu", "gloo", "cpu")):
        got = setup[kind]
        where = (f"ddp_setup(config) for the worker {env} on a machine "
                 f"{'with' if kind == 'cuda' else 'without'} CUDA (simulated: no group is joined)")
        if "error" in got:
            raise AssertionError(f"{where} raised {got['error']}")
        if len(got["init"]) != 1:
            raise AssertionError(f"{where} called init_process_group {len(got['init'])} times; "
                                 "expected once")
        init, want = got["init"][0], [3, 1, 4, device]
        if init["backend"] != backend:
            raise AssertionError(f"{where} chose the backend {init['backend']!r}; expected "
                                 f"{backend!r} (NCCL on GPUs, gloo on CPUs)")
        if init["timeout"] != TIMEOUT_S:
            raise AssertionError(
                f"{where} called init_process_group with timeout {init['timeout']} s; expected "
                f"config.timeout_s = {TIMEOUT_S} s (timeout=datetime.timedelta(seconds="
                "config.timeout_s)): with the default a missing collective hangs for 30 minutes")
        if got["returned"] != want:
            raise AssertionError(
                f"{where} returned {got['returned']}; expected (rank, local_rank, world_size, "
                f"device) = {tuple(want)}: the rank is RANK (over all nodes), the GPU is "
                "LOCAL_RANK (on this node)")
        if kind == "cuda" and not set(got["set_device"]) & {"1", "cuda:1"}:
            raise AssertionError(f"{where} called torch.cuda.set_device with "
                                 f"{got['set_device'] or 'nothing'}; expected LOCAL_RANK (1)")


def _check_trained(final):
    epochs = 3
    if final["epochs_run"] != epochs or final["step"] != epochs * STEPS_PER_EPOCH:
        raise AssertionError(f"after the run epochs_run = {final['epochs_run']} and step = "
                             f"{final['step']}; expected {epochs} and {epochs * STEPS_PER_EPOCH}"
                             f" (256 examples, half of them per rank, config.batch_size = 16 "
                             f"per rank and step: {STEPS_PER_EPOCH} steps per epoch)")
    sums = final["checksums"]
    if any(max(abs(a - b) for a, b in zip(s, sums[0])) > 1e-6 for s in sums[1:]):
        raise AssertionError("the replicas differ at the end (rank 0 and rank 1 hold different "
                             "parameters): wrap the model in DistributedDataParallel")


def _check_uninterrupted(final, logs, snap):
    import torch
    epochs = 3
    _check_records(logs)
    _check_trained(final)
    if not snap.exists():
        raise AssertionError("no snapshot file was written at config.snapshot")
    s = torch.load(snap, map_location="cpu", weights_only=False)
    missing = [k for k in ("model", "optimizer", "scheduler", "epochs_run", "step", "rng")
               if k not in s]
    if missing:
        raise AssertionError(f"the snapshot lacks {missing}: without them a restarted job "
                             "cannot continue exactly where it stopped")
    keys = sorted(final["model"])
    saved = sorted(s["model"]) if isinstance(s["model"], dict) else [type(s["model"]).__name__]
    if saved != keys:
        raise AssertionError(f"snapshot['model'] has the keys {saved[:3]}...; the "
                             f"model's are {keys[:3]}...: save the unwrapped module's "
                             "state_dict (self.model.module.state_dict(), without DDP's "
                             "'module.' prefix), which also loads into a model without DDP")
    momentum = [v for v in s["optimizer"].get("state", {}).values() if "momentum_buffer" in v]
    if not momentum:
        raise AssertionError("the snapshot's optimizer state holds no momentum buffers: save "
                             "self.optimizer.state_dict(), not a fresh optimizer's")
    if (s["epochs_run"], s["step"]) != (epochs, epochs * STEPS_PER_EPOCH):
        raise AssertionError(f"the last snapshot says epochs_run = {s['epochs_run']}, step = "
                             f"{s['step']}; expected {epochs} and {epochs * STEPS_PER_EPOCH}")
    if not _one_entry_per_rank(s["rng"], 2):
        raise AssertionError("snapshot['rng'] must hold every rank's random state, entry r for "
                             "rank r (snapshot['rng'][r]): the list all_gather_object fills, or "
                             f"a dict {{rank: state}}; it is a {type(s['rng']).__name__} of "
                             f"{len(s['rng']) if hasattr(s['rng'], '__len__') else '?'} entries")


def _one_entry_per_rank(container, world):
    """Whether ``container[r]`` is one rank's state for r = 0 .. world - 1, and nothing else: a
    list or tuple of ``world`` entries, or a dict keyed by the ranks (ints)."""
    if isinstance(container, (list, tuple)):
        return len(container) == world
    return isinstance(container, dict) and set(container) == set(range(world))


def _check_resumed(final, want, logs, what):
    import numpy as np
    if final["attempt"] != 1:
        raise AssertionError(f"run {what}: the job finished on attempt {final['attempt']}; "
                             "expected one restart")
    loads = [l for name, log in logs.items() if name.endswith("attempt1") for l in log["loads"]]
    if not loads:
        raise AssertionError(f"run {what}: after the restart no rank loaded the snapshot")
    if any(l["map_location"] == "None" for l in loads):
        raise AssertionError(f"run {what}: torch.load without map_location: pass this rank's "
                             "device, or every rank loads onto the device the tensors were "
                             "saved from")
    if (final["epochs_run"], final["step"]) != (want["epochs_run"], want["step"]):
        raise AssertionError(f"run {what}: ended with epochs_run = {final['epochs_run']}, step "
                             f"= {final['step']}; the uninterrupted run ended with "
                             f"{want['epochs_run']} and {want['step']}: work was repeated or "
                             "skipped")
    if final["scheduler_steps"] != want["scheduler_steps"]:
        raise AssertionError(f"run {what}: the learning-rate scheduler ended after "
                             f"{final['scheduler_steps']} steps, the uninterrupted run's after "
                             f"{want['scheduler_steps']}: restore it from the snapshot "
                             "(self.scheduler.load_state_dict(snapshot['scheduler'])), or the "
                             "warm-up starts again after every restart")
    for name, value in want["model"].items():
        got = final["model"][name].numpy()
        if not np.allclose(got, value.numpy(), atol=1e-6, rtol=1e-5):
            diff = float(np.abs(got - value.numpy()).max())
            raise AssertionError(
                f"run {what}: after resuming, {name} differs by {diff:.1e} from the "
                "uninterrupted run. A resumed run must continue exactly: restore the model, "
                "the optimizer (momentum), the scheduler, the counters and each rank's random "
                "state from the snapshot")
