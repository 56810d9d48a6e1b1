"""Checker of notebook 05's snapshots: ``save_snapshot`` and ``load_snapshot`` of the ``Trainer``.

:func:`check_snapshots` runs two torchrun jobs of 2 CPU workers (:mod:`.jobs`), in float64 on
the checks' model (dropout, BatchNorm buffers, a frozen parameter, a tied weight:
:func:`.runner.check_net`), with a learning-rate warm-up that lasts into epoch 2:

A. uninterrupted, a snapshot every epoch: written by rank 0 alone, to a temporary file in the
   snapshot's folder renamed over ``config.snapshot``; each snapshot holds the unwrapped
   model's state_dict, the optimizer (momentum), the scheduler and the counters as they were
   when it was taken, and every rank's random state, entry r for rank r. Then
   ``load_snapshot`` of the worker RANK=3, LOCAL_RANK=1 of 4 on ``cuda:1`` (simulated,
   :mod:`.simulate`): ``map_location``; after job B (which judges a wrong entry first),
   that it restores entry 3 of "rng", its rank, not its local rank.
B. a new job that finds A's snapshot of epoch 1 (as after a crash in the middle of epoch 2);
   rank 0 is killed while it writes the epoch-2 snapshot (half the file written), torchrun
   restarts the job, which resumes from the epoch-1 snapshot again. Every rank loads it with
   ``map_location``; at the start of every epoch after a resume each rank's counters, model,
   momentum, scheduler and random state equal A's at that point, and its sampler's epoch too;
   the job ends with A's parameters (to 1e-6), counters and scheduler.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import os
import shutil
import tempfile
from pathlib import Path

from ..contract import fail
from ..harness import check
from .jobs import EPOCHS, RUN, TIMEOUT, require, run_job, steps_per_epoch, worker_errors
from .simulate import FAKE_RANK

WORKERS = 2
ARGS = [*RUN, "--save-every", "1", "--dtype", "float64"]
KEYS = ("model", "optimizer", "scheduler", "epochs_run", "step", "rng")
PHASES_A = {"load": "resume-loads", "other": "snapshot-contents"}
PHASES_B = {"load": "resume-loads", "epoch": "resume-model", "save": "snapshot-contents",
            "other": "resume-loads"}
BUFFERS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")   # per rank in DDP


@check
def check_snapshots(path, timeout=TIMEOUT):
    """Check ``save_snapshot`` and ``load_snapshot`` (module docstring: jobs A and B)."""
    require(path)
    with tempfile.TemporaryDirectory(prefix="dtfs-ddp-") as folder:
        a = run_job(path, folder, "A", WORKERS, ARGS, PHASES_A, timeout=timeout,
                    simulate="load", partial=lambda job: _check_a(job, complete=False))
        _check_a(a)
        _check_simulated_load(a.logs[0, 0]["sim"].get("load"))
        snapshot = Path(folder) / "B_snapshot.pt"
        shutil.copyfile(a.folder / "snapshot_after_1.pt", snapshot)
        b = run_job(path, folder, "B", WORKERS, [*ARGS, "--crash-in-save", "1"], PHASES_B,
                    restarts=1, timeout=timeout, snapshot=snapshot,
                    partial=lambda job: _failed_b(job, a))
        _check_b(b, a)
        _check_simulated_rng(a.logs[0, 0]["sim"].get("load"))


# ------------------------------------------------------------------ job A: what is written
def _check_a(job, complete=True):
    logs = job.ranks(0)
    for rank, log in logs.items():
        if rank and (log["saves"] or log["replaces"]):
            what = (f"torch.save to {log['saves'][0]}" if log["saves"] else
                    f"{log['replaces'][0]['call']} to {log['replaces'][0]['dst']}")
            fail("snapshot-rank0", f"rank {rank} wrote a file ({what}): only rank 0 writes the "
                 "snapshot (every replica holds the same state; several writers race on one "
                 "file): if self.rank == 0: ... after gathering the random states")
    zero = logs.get(0)
    if zero is None:
        return
    taken = zero["snapshots"]
    if complete and len(taken) < len(zero["save_states"]):
        fail("snapshot-contents", f"after save_snapshot at the end of epoch {len(taken) + 1} "
             f"there was no file at config.snapshot: rank 0 writes the snapshot there")
    _check_atomic(zero, os.path.realpath(job.snapshot), len(taken))
    spe = steps_per_epoch(WORKERS)
    for i, shot in enumerate(taken):
        where = f"the snapshot taken after epoch {i + 1}"
        missing = [k for k in KEYS if k not in shot.get("keys", ())]
        if shot["type"] != "dict" or missing:
            fail("snapshot-contents", f"{where} is a {shot['type']} lacking {missing}: the "
                 "snapshot is a dict with the keys \"model\", \"optimizer\", \"scheduler\", "
                 "\"epochs_run\", \"step\" and \"rng\"; without any of them a restarted job "
                 "cannot continue exactly where it stopped")
    for aspect in (_check_model, _check_optimizer, _check_scheduler):
        for i, shot in enumerate(taken):
            if "error" not in zero["save_states"][i]:
                aspect(f"the snapshot taken after epoch {i + 1}", shot, zero["save_states"][i])
    for i, shot in enumerate(taken):
        got, want = (shot["epochs_run"], shot["step"]), (i + 1, (i + 1) * spe)
        if got != want:
            fail("snapshot-counters", f"the snapshot taken after epoch {i + 1} holds (epochs_run"
                 f", step) = {got}; expected {want}: the epochs finished and the optimizer steps "
                 f"taken so far ({spe} per epoch), counted from the start and never reset")
    for i, shot in enumerate(taken):
        _check_rng(f"the snapshot taken after epoch {i + 1}", shot["rng"],
                   {r: log["save_states"][i]["rng"] for r, log in logs.items()
                    if i < len(log["save_states"]) and "error" not in log["save_states"][i]})


def _check_atomic(zero, snapshot, taken):
    folder = os.path.dirname(snapshot)
    if snapshot in zero["saves"]:
        fail("snapshot-atomic", f"torch.save wrote config.snapshot itself ({snapshot}): a crash "
             "during that write leaves a torn file where the only snapshot was. torch.save to "
             "a temporary file next to it (config.snapshot + '.tmp'), then os.replace(tmp, "
             "config.snapshot): the rename swaps the whole file at once")
    onto = [m for m in zero["replaces"] if m["dst"] == snapshot]
    if len(onto) < taken:
        fail("snapshot-atomic", f"{taken} snapshot(s) taken, {len(onto)} renamed over "
             "config.snapshot: write a temporary file next to it, then os.replace(tmp, "
             "config.snapshot) (copying the file over it, e.g. shutil.copy, is a write in place: "
             "a crash during it leaves a torn snapshot)")
    for move in onto:
        if os.path.dirname(move["src"]) != folder:
            fail("snapshot-atomic", f"the temporary file {move['src']} is not next to "
                 f"config.snapshot (in {folder}): {move['call']} is atomic only within one file "
                 "system, and /tmp or the working directory can be another one (then it fails, "
                 "or shutil.move copies: a torn file again). Write config.snapshot + '.tmp'")


def _check_model(where, shot, live):
    model, want = shot["model"], live.get("model", {})
    if model is None:
        fail("snapshot-model", f"{where}: its \"model\" is a {shot['model_type']}, not a "
             "state_dict: save self.model.module.state_dict()")
    if sorted(model) != sorted(want):
        extra, lack = sorted(set(model) - set(want))[:3], sorted(set(want) - set(model))[:3]
        odd = " and ".join(filter(None, [extra and f"has the keys {extra}, which the model's "
                                         "state_dict has not,", lack and f"lacks {lack}"]))
        fail("snapshot-model", f"{where}: its \"model\" {odd}: save the unwrapped module's "
             "state_dict, self.model.module.state_dict() (no 'module.' prefix of the DDP "
             "wrapper; buffers such as bn.running_mean, and a weight shared by two layers "
             "under both names, which named_parameters() leaves out)")
    for key, (digest, total, dtype) in want.items():
        if model[key][2] != dtype:
            fail("snapshot-model", f"{where}: its \"model\"[{key!r}] is {model[key][2]}, the "
                 f"model's {dtype}: save the state_dict as it is, in the model's own dtype")
        if model[key][0] != digest:
            fail("snapshot-model", f"{where}: its \"model\"[{key!r}] (sum {model[key][1]}) is "
                 f"not the model's when it was taken (sum {total}): save the current "
                 "state_dict")


def _check_optimizer(where, shot, live):
    got, want = shot["optimizer"], live["optimizer"]
    if got is None or got["momentum"] < want["momentum"]:
        fail("snapshot-optimizer", f"{where}: its \"optimizer\" holds "
             f"{0 if got is None else got['momentum']} momentum buffers, the optimizer "
             f"{want['momentum']}: save self.optimizer.state_dict() (a fresh optimizer's has "
             "none: momentum would restart from zero)")
    if got["hash"] != want["hash"]:
        fail("snapshot-optimizer", f"{where}: its momentum buffers (sum {got['sum']}) are not "
             f"the optimizer's when it was taken (sum {want['sum']}): save "
             "self.optimizer.state_dict()")


def _check_scheduler(where, shot, live):
    want = live["scheduler"]["last_epoch"]
    if shot["scheduler"] != want:
        fail("snapshot-scheduler", f"{where}: its \"scheduler\" ({shot['scheduler_type']}) "
             f"says last_epoch = {shot['scheduler']}; the scheduler had taken {want} steps: "
             "save self.scheduler.state_dict()")


def _check_rng(where, rng, live):
    entries = rng["entries"]
    if sorted(entries) != sorted(repr(r) for r in range(WORKERS)):
        fail("snapshot-rng", f"{where}: its \"rng\" is a {rng['type']} with the entries "
             f"{sorted(entries)}; expected one random state per rank, entry r for rank r "
             f"(snapshot['rng'][r], r = 0 .. {WORKERS - 1}): the list all_gather_object fills, "
             "or a dict {rank: state}")
    for rank, state in sorted(live.items()):
        if entries[repr(rank)] != state:
            fail("snapshot-rng", f"{where}: its \"rng\"[{rank}] is not rank {rank}'s random "
                 f"state when it was taken: gather every rank's runner.rng_state() (states = "
                 "[None] * world_size; dist.all_gather_object(states, runner.rng_state()))")


def _check_simulated_load(sim):
    """map_location on a GPU worker (simulated); no verdict when it saw no torch.load."""
    if not sim or "map_location" not in sim:
        return
    if sim["map_location"] not in ("cuda:1", "cuda"):      # "cuda": the device set_device set
        fail("resume-map-location", "Trainer.load_snapshot on the worker RANK=3, LOCAL_RANK=1 "
             "with self.device = cuda:1 (simulated on the CPU) called torch.load with "
             f"map_location={sim['map_location']}; expected self.device (cuda:1): every rank "
             "loads onto its own device (None puts the tensors back where they were saved "
             "from, cuda:0 for every rank; 'cpu' only works by accident on a CPU)")


def _check_simulated_rng(sim):
    """The entry of "rng" a worker whose rank is not its local rank restores (simulated: the
    worker RANK=3, LOCAL_RANK=1 of 4, 2 per node); no verdict when it restored none that
    could be told (jobs A and B judge the rest)."""
    if not sim or sim.get("rng_entry") is None or sim["rng_entry"] == FAKE_RANK:
        return
    entry = sim["rng_entry"]
    fail("resume-rng", "Trainer.load_snapshot on the worker RANK=3, LOCAL_RANK=1 of "
         "WORLD_SIZE=4 (2 workers per node; simulated, with a snapshot whose \"rng\" holds "
         f"the random states of ranks 0 to 3) restored entry {entry}; expected entry 3, its "
         "rank: the snapshot holds the random states of EVERY rank and rank r restores entry "
         "r, r the global rank (self.rank, RANK), not the local rank (LOCAL_RANK, the rank "
         "on its node, the same as the rank on one node only), or worker 3 takes worker "
         f"{entry}'s random state: runner.set_rng_state(snapshot['rng'][self.rank])")


# ------------------------------------------------------------------ job B: the resumes
def _failed_b(job, a):
    """Job B failed: after the torn write, a restart that could not load is the write's fault."""
    torn = "[fault injection] rank 0 killed while writing" in job.output
    if torn and any(log["phase"] == "load" and not log["finished"]
                    for log in job.ranks(1).values()):
        fail("snapshot-torn", "rank 0 was killed while writing the epoch-2 snapshot (half of the "
             "file written); the restarted job then failed to load config.snapshot:\n"
             f"{worker_errors(job.output)}\nThe old snapshot must stay whole until the new one "
             "replaces it: torch.save to a temporary file next to config.snapshot, then "
             "os.replace it over the snapshot")
    _check_b(job, a, complete=False)


def _check_b(job, a, complete=True):
    reference = a.ranks(0)
    for attempt in job.attempts:
        logs = job.ranks(attempt)
        if any(log["epochs"] for log in logs.values()):
            _check_loaded(job, attempt, logs)
        for rank, log in logs.items():
            ran = [e["epoch"] for e in log["epochs"]]
            if ran and ran[0] != 1:
                fail("resume-counters", f"rank {rank}: having loaded the snapshot of epoch 1, "
                     f"the job began with epoch {ran[0]} (epochs_run = "
                     f"{log['epochs'][0]['epochs_run']}); expected epoch 1 (the second): "
                     "restore epochs_run and step from the snapshot; train() runs the "
                     "remaining epochs, range(self.epochs_run, config.epochs) (a finished "
                     "job's snapshot leaves none)")
            for i, entry in enumerate(log["epochs"]):
                if entry["epoch"] not in range(1, EPOCHS):
                    fail("resume-counters", f"rank {rank} ran epoch {entry['epoch']} after "
                         f"loading the snapshot of epoch 1; the job has epochs 0 .. {EPOCHS - 1}"
                         ": train() runs range(self.epochs_run, config.epochs)")
                where = (f"rank {rank}, when epoch {entry['epoch'] + 1} began after the "
                         f"{'restart' if attempt else 'start from the epoch-1 snapshot'}")
                want = reference[rank]["epochs"][entry["epoch"]]
                if "error" not in entry and "error" not in want:
                    _compare(where, entry, want, rank)
                if i < len(log["iterated"]) and log["iterated"][i] != entry["epoch"]:
                    fail("resume-set-epoch", f"{where}: the sampler's epoch when the iteration "
                         f"began was {log['iterated'][i]}; expected {entry['epoch']}, as in the "
                         "uninterrupted run: call self.sampler.set_epoch(epoch) at the start of "
                         "run_epoch with the epoch it was given (a fresh sampler starts at 0: a "
                         "call after the loop, or an own counter, repeats the wrong order)")
    if complete:
        _check_final(job.final, a.final)


def _check_loaded(job, attempt, logs):
    loads = [load for log in logs.values() for load in log["loads"]
             if load["path"] == os.path.realpath(job.snapshot)]
    if not loads and attempt == 0:
        fail("resume-loads", "job B started with config.snapshot in place (the snapshot of "
             "epoch 1, as after a crash in the middle of epoch 2), but no rank loaded it: in "
             "__init__, if os.path.exists(config.snapshot): self.load_snapshot()")
    if not loads:
        fail("snapshot-torn", "rank 0 was killed while writing the epoch-2 snapshot, and the "
             "restarted job found no snapshot to load: the old one must stay in place until "
             "os.replace puts the new one over it (never delete it first)")
    for load in loads:
        if load["map_location"] != "cpu":
            fail("resume-map-location", f"torch.load(config.snapshot, map_location="
                 f"{load['map_location']}); expected self.device (cpu here): with None every "
                 "tensor goes back to the device it was saved from (GPU 0 for all ranks)")


def _compare(where, got, want, rank):
    """One rank's state at the start of an epoch after a resume, against the uninterrupted run's."""
    if (got["epochs_run"], got["step"]) != (want["epochs_run"], want["step"]):
        fail("resume-counters", f"{where}: (epochs_run, step) = ({got['epochs_run']}, "
             f"{got['step']}); the uninterrupted run had ({want['epochs_run']}, {want['step']}): "
             "restore both counters from the snapshot")
    for key, (digest, total, _) in want["model"].items():
        if (rank == 0 or key not in BUFFERS) and got["model"].get(key, [None])[0] != digest:
            fail("resume-model", f"{where}: the model's {key} (sum "
                 f"{got['model'].get(key, [None, None])[1]}) differs from the uninterrupted "
                 f"run's (sum {total}): load snapshot['model'] into self.model.module "
                 "(load_state_dict)")
    if got["optimizer"]["hash"] != want["optimizer"]["hash"]:
        fail("resume-optimizer", f"{where}: the momentum buffers ({got['optimizer']['momentum']}"
             f", sum {got['optimizer']['sum']}) differ from the uninterrupted run's "
             f"({want['optimizer']['momentum']}, sum {want['optimizer']['sum']}): "
             "self.optimizer.load_state_dict(snapshot['optimizer'])")
    if got["scheduler"] != want["scheduler"]:
        fail("resume-scheduler", f"{where}: the scheduler's last_epoch and learning rate are "
             f"{got['scheduler']}; the uninterrupted run's {want['scheduler']}: "
             "self.scheduler.load_state_dict(snapshot['scheduler']), or the warm-up starts "
             "again")
    wrong = [k for k in ("torch", "numpy", "python") if got["rng"].get(k) != want["rng"].get(k)]
    if wrong:
        fail("resume-rng", f"{where}: the {', '.join(wrong)} random state differs from rank "
             f"{rank}'s in the uninterrupted run: restore this rank's entry, "
             "runner.set_rng_state(snapshot['rng'][self.rank]), on every rank and after "
             "anything else that seeds or draws random numbers (another rank's entry gives "
             "this rank another rank's dropout masks)")


def _check_final(final, want):
    import numpy as np
    if (final["epochs_run"], final["step"]) != (want["epochs_run"], want["step"]):
        fail("resume-counters", f"job B ended with (epochs_run, step) = ({final['epochs_run']}, "
             f"{final['step']}); the uninterrupted run with ({want['epochs_run']}, "
             f"{want['step']}): work was repeated or skipped")
    if final["scheduler_steps"] != want["scheduler_steps"]:
        fail("resume-scheduler", f"job B's scheduler ended after {final['scheduler_steps']} "
             f"steps, the uninterrupted run's after {want['scheduler_steps']}")
    for name, value in want["model"].items():
        diff = float(np.abs(final["model"][name].double().numpy() -
                            value.double().numpy()).max())
        if diff > 1e-6:
            fail("resume-model", f"job B ended with {name} {diff:.1e} away from the "
                 "uninterrupted run's: a resumed run must continue exactly (model, optimizer, "
                 "scheduler, counters and each rank's random state from the snapshot)")
