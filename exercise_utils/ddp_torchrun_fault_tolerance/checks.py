"""Checkers of notebook 05: the student's torchrun ``Trainer``, then its snapshots and restarts.

Both run ``work/05_trainer.py`` under torchrun (:mod:`.jobs`) through the worker entry point of
:mod:`.probes`, which records what the workers do and runs :func:`.runner.main` exactly as the
student's own launch does, and judge the records (plain data), naming the case of the contract
(:mod:`.requirements`) that found the problem, most basic first.

:func:`check_trainer` (``ddp_setup``, ``Trainer.__init__``, ``run_epoch``): one job of 3 CPU
workers (256 examples do not divide by 3: the sampler pads) without a snapshot file. Before it
starts, rank 0 calls ``ddp_setup`` as worker 3 of 4 (``LOCAL_RANK`` 1) with and without CUDA,
and builds a ``Trainer`` on ``cuda:1`` (simulated, :mod:`.simulate`): NCCL, ``cuda:LOCAL_RANK``,
``set_device`` and DDP's ``device_ids`` on GPUs, gloo on CPUs, ``config.timeout_s``, RANK (not
LOCAL_RANK) as the rank. Then: DDP (replicas agree although every rank initialised its model
from another seed), every rank iterates its own part through a ``DistributedSampler``
(``config.seed``, shuffled) and a loader of ``config.batch_size``, ``set_epoch`` before each
epoch's iteration, the counters at the start of every epoch and at the end, no snapshot loaded
or written (``save_every`` 1000), rank 0 alone logs.

:func:`check_snapshots` (``save_snapshot``, ``load_snapshot``): :mod:`.checks_snapshots`.

Used in 05_ddp_torchrun_fault_tolerance.
"""
import math
import tempfile

from ..contract import fail
from ..harness import check
from .checks_snapshots import check_snapshots  # noqa: F401  (the CHECK cell imports it here)
from .jobs import (BATCH, EPOCHS, RUN, SEED, TIMEOUT, TIMEOUT_S, TRAIN, require, run_job,
                   steps_per_epoch)
from .simulate import FAKE_ENV

WORKERS = 3                  # the trainer's job: 256 examples do not divide by 3
# the case a crash or hang is charged to, by what the student's code was doing (probes.Log)
PHASES = {"setup": "setup-cpu", "init": "trainer-ddp", "load": "trainer-no-snapshot",
          "epoch": "trainer-set-epoch", "save": "trainer-save-every", "other": "trainer-ddp"}


@check
def check_trainer(path, timeout=TIMEOUT):
    """Check ``ddp_setup``, ``Trainer.__init__`` and ``run_epoch``: one job, no snapshots."""
    require(path)
    with tempfile.TemporaryDirectory(prefix="dtfs-ddp-") as folder:
        job = run_job(path, folder, "T", WORKERS, [*RUN, "--save-every", "1000"], PHASES,
                      timeout=timeout, simulate="setup,init",
                      partial=lambda job: _check_run(job, complete=False))
        _check_run(job)
        _check_final(job)


def _check_run(job, complete=True):
    """What the records show, most basic first (``complete=False``: a job that failed part-way,
    only what it reached)."""
    sim = job.logs.get((0, 0), {}).get("sim", {})
    if "setup" in sim:
        _check_setup(sim["setup"])
    if "init" in sim:
        _check_init(sim["init"])
    logs = job.ranks(0)
    for rank, log in logs.items():
        if any(not e["ddp"] for e in _states(log)):
            fail("trainer-ddp", f"rank {rank}: self.model is not a DistributedDataParallel: "
                 "wrap the model in DDP (every rank then starts from rank 0's parameters and DDP "
                 "averages the gradients in backward)")
    for rank, log in logs.items():
        _check_loader(rank, log)
    for rank, log in logs.items():
        _check_sampler(rank, log, complete)
    for rank, log in logs.items():
        want = list(range(EPOCHS if complete else len(log["iterated"])))
        if log["iterated"] != want:
            fail("trainer-set-epoch", f"rank {rank}: the sampler's epoch when each epoch's "
                 f"iteration began was {log['iterated']}; expected {want}. Call "
                 "self.sampler.set_epoch(epoch) at the start of run_epoch, before iterating "
                 "over the loader, with the epoch run_epoch was given (the same on every rank): "
                 "without it, or after the loop, an epoch repeats the previous one's order")
    for rank, log in logs.items():
        _check_counters(rank, log)


def _check_setup(setup):
    """``ddp_setup`` as worker 3 of 4 (LOCAL_RANK 1), without CUDA and with it (simulated)."""
    env = ", ".join(f"{k}={FAKE_ENV[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    for kind, case, backend, device in (("cpu", "setup-cpu", "gloo", "cpu"),
                                        ("cuda", "setup-cuda", "nccl", "cuda:1")):
        got = setup[kind]
        where = (f"ddp_setup(config) for the worker {env} on a machine "
                 f"{'with' if kind == 'cuda' else 'without'} CUDA (simulated: no group is joined)")
        if "error" in got:
            fail(case, f"{where} raised {got['error']}")
        if len(got["init"]) != 1:
            fail(case, f"{where} called init_process_group {len(got['init'])} times; expected "
                       "once")
        init = got["init"][0]
        if init["backend"] != backend:
            fail(case, f"{where} chose the backend {init['backend']!r}; expected {backend!r} "
                       "(NCCL on GPUs, gloo on CPUs)")
        if init["timeout"] != TIMEOUT_S:
            fail("setup-timeout", f"{where} called init_process_group with timeout "
                 f"{init['timeout']} s; expected config.timeout_s = {TIMEOUT_S} s (timeout="
                 "datetime.timedelta(seconds=config.timeout_s)): with the default a missing "
                 "collective hangs for 30 minutes")
        returned = got["returned"]
        if not isinstance(returned, list) or returned[:3] != [3, 1, 4]:
            fail("setup-rank", f"{where} returned {returned}; expected (rank, local_rank, "
                 f"world_size, device) = (3, 1, 4, {device!r}): the rank is RANK (over all "
                 "nodes), the local rank LOCAL_RANK (on this node), both ints")
        if returned[3] != device:
            fail(case, f"{where} returned the device {returned[3]!r}; expected {device!r} (the "
                       "GPU is LOCAL_RANK, the GPU's number on this node)")
        if kind == "cuda" and not set(got["set_device"]) & {"1", "cuda:1"}:
            fail(case, f"{where} called torch.cuda.set_device with "
                       f"{got['set_device'] or 'nothing'}; expected LOCAL_RANK (1)")


def _check_init(sim):
    """``Trainer(...)`` for worker 3 of 4 on ``cuda:1`` (simulated): the model moved there, DDP's
    device_ids, the sampler's part. No verdict when the simulation raised (its limits: no
    process group) or saw no DDP: the real job says what is wrong."""
    where = ("Trainer(...) for the worker RANK=3, LOCAL_RANK=1 of WORLD_SIZE=4 (2 per node) "
             "with device cuda:1 (simulated on the CPU: DDP and the model's .to/.cuda are "
             "recorded)")
    if "error" in sim or not sim["ddp"]:
        return
    if not any(m in ("cuda:1", "cuda") for m in sim["moved"]):
        fail("trainer-gpu-ddp", f"{where} moved the model to {sim['moved'] or 'nowhere'}; "
             "expected device (cuda:1): model.to(device) before wrapping it in DDP")
    if sim["ddp"][0] not in (["1"], ["cuda:1"]):
        fail("trainer-gpu-ddp", f"{where} wrapped the model with DDP(..., device_ids="
             f"{sim['ddp'][0]}); expected device_ids=[local_rank] = [1] on a GPU (none on the "
             "CPU): the GPU of this worker on its node, not its global rank")
    if sim.get("sampler", [4, 3]) != [4, 3]:
        fail("trainer-sampler", f"{where} built a DistributedSampler with (num_replicas, rank) "
             f"= {tuple(sim['sampler'])}; expected (4, 3): the whole job's world size and this "
             "worker's rank, not the node's (LOCAL_WORLD_SIZE, LOCAL_RANK)")


def _check_sampler(rank, log, complete):
    if complete and not log["iterated"]:
        fail("trainer-sampler", f"rank {rank} never iterated a DistributedSampler: give the "
             "DataLoader sampler=self.sampler, a DistributedSampler, so that every rank trains "
             "on its own part of the data")
    want = {"seed": SEED, "shuffle": True, "num_replicas": WORKERS, "rank": rank}
    for got in log["samplers"]:
        wrong = {k: got[k] for k in want if got[k] != want[k]}
        if wrong:
            fail("trainer-sampler", f"rank {rank} iterated a DistributedSampler with {wrong}; "
                 f"expected {want} (config.seed is {SEED}, {WORKERS} workers): "
                 "DistributedSampler(train_set, num_replicas=world_size, rank=rank, "
                 "shuffle=True, seed=config.seed) gives every rank a different part, in an "
                 "order config.seed chooses")


def _states(log, key="epochs"):
    """The states a rank recorded that could be read (a failed reading carries no verdict)."""
    return [entry for entry in log[key] if "error" not in entry]


def _check_loader(rank, log):
    for entry in _states(log):
        loader = entry.get("loader", {})
        if not loader.get("sampler_is_self_sampler"):
            fail("trainer-loader", f"rank {rank}: self.loader does not draw from self.sampler: "
                 "DataLoader(train_set, batch_size=config.batch_size, sampler=self.sampler) "
                 "(set_epoch on self.sampler must reach the loader)")
        if loader.get("batch_size") != BATCH:
            fail("trainer-loader", f"rank {rank}: self.loader has batch_size "
                 f"{loader.get('batch_size')}; expected config.batch_size = {BATCH}: "
                 "config.batch_size examples per worker and step (the global batch is "
                 "world_size times that)")


def _check_counters(rank, log):
    spe = steps_per_epoch(WORKERS)
    for entry in _states(log):
        e = entry["epoch"]
        got, want = (entry["epochs_run"], entry["step"]), (e, e * spe)
        if got != want:
            fail("trainer-counters", f"rank {rank}: when epoch {e} began, (epochs_run, step) "
                 f"= {got}; expected {want}: epochs_run counts the epochs finished, step the "
                 f"optimizer steps taken since the start ({spe} per epoch: {TRAIN} examples, "
                 f"padded to {math.ceil(TRAIN / WORKERS)} per rank, {BATCH} per step), never "
                 "reset")


def _check_final(job):
    spe, final = steps_per_epoch(WORKERS), job.final
    if (final["epochs_run"], final["step"]) != (EPOCHS, EPOCHS * spe):
        fail("trainer-counters", f"after the run (epochs_run, step) = ({final['epochs_run']}, "
             f"{final['step']}); expected ({EPOCHS}, {EPOCHS * spe})")
    sums = final["checksums"]
    if any(max(abs(a - b) for a, b in zip(s, sums[0])) > 1e-6 for s in sums[1:]):
        fail("trainer-ddp", "the replicas differ at the end (ranks hold different parameters): "
             "every step must go through the DDP-wrapped model, whose forward and backward "
             "average the gradients over the ranks (model.no_sync() or self.model.module(x) "
             "skip that), and DDP starts every rank from rank 0's parameters")
    logs = job.ranks(0)
    if any(log["loads"] for log in logs.values()):
        fail("trainer-no-snapshot", "a rank loaded a snapshot although config.snapshot does not "
             "exist: load it only if os.path.exists(config.snapshot)")
    if job.snapshot.exists() or any(log["save_states"] for log in logs.values()):
        fail("trainer-save-every", "a snapshot was taken although config.save_every (1000) is "
             f"more than the number of epochs ({EPOCHS}): snapshot when epochs_run % "
             "config.save_every == 0")
    lines = {rank: log["logged"] for rank, log in logs.items()}
    if any(n for r, n in lines.items() if r):
        fail("trainer-logs", f"epoch lines printed per rank: {lines}; expected none from the "
             "ranks other than 0: rank 0 logs (if self.rank == 0: print(...)), every rank "
             "trains")
