"""WRONG (notebook 05, trainer_sampler_ignores_seed): the DistributedSampler is built without
seed=config.seed, so it shuffles with its default seed 0 whatever the run's seed: runs with
different seeds see the data in the same order.

Violates: "``self.sampler``: a DistributedSampler over train_set (shuffle, seed=config.seed)
that gives every rank a different part of the data; ``self.loader``: a DataLoader with
config.batch_size examples per worker."

Based on the solution with this one flaw; the checker must reject it.
"""
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from exercise_utils.ddp_torchrun_fault_tolerance import runner


def ddp_setup(config):
    """Join the job torchrun started; return ``(rank, local_rank, world_size, device)``.

    torchrun sets ``RANK`` (0..WORLD_SIZE-1 over all nodes), ``LOCAL_RANK`` (0.. on this node),
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` for every worker. With CUDA: backend
    "nccl", device ``cuda:LOCAL_RANK`` (also ``torch.cuda.set_device`` it); otherwise "gloo"
    and the CPU. Timeout: ``config.timeout_s`` seconds.
    """
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))
    return rank, local_rank, world_size, device


class Trainer:
    """Trains ``model`` on ``train_set`` with DDP; snapshots every ``config.save_every`` epochs.

    Attributes the course relies on: ``model`` (the DDP-wrapped model), ``optimizer``,
    ``scheduler``, ``sampler``, ``loader``, ``epochs_run`` (epochs finished), ``step``
    (optimizer steps taken), ``rank``, ``world_size``, ``device``, ``config``.
    """

    def __init__(self, model, train_set, optimizer, scheduler, config, rank, local_rank,
                 world_size, device):
        """Wrap the model, give every rank its part of the data, resume from a snapshot.

        Move the model to ``device`` and wrap it in DDP (``device_ids=[local_rank]`` on a GPU,
        none on the CPU). ``self.sampler``: a DistributedSampler over train_set (shuffle,
        seed=config.seed) that gives every rank a different part of the data;
        ``self.loader``: a DataLoader with config.batch_size examples per worker. Then, if
        the snapshot file config.snapshot exists, load it (``self.load_snapshot()``).
        """
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.optimizer, self.scheduler = optimizer, scheduler
        self.epochs_run, self.step = 0, 0
        # TODO: DDP, the sampler and the loader, then the snapshot (see the docstring).
        model = model.to(device)
        self.model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        self.sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                          shuffle=True)
        self.loader = DataLoader(train_set, batch_size=config.batch_size, sampler=self.sampler)
        if os.path.exists(config.snapshot):
            self.load_snapshot()

    def save_snapshot(self):
        """Write everything needed to resume exactly; rank 0 writes.

        The snapshot (a dict for ``torch.save``) holds: "model" (the unwrapped module's
        state_dict), "optimizer", "scheduler", "epochs_run", "step", and "rng": the random
        states of EVERY rank (``runner.rng_state()`` gathered with all_gather_object; rank r
        restores entry r). Rank 0 writes it to a temporary file next to config.snapshot and
        renames it over config.snapshot (``os.replace``: atomic, so a crash during the write
        never leaves a torn snapshot). A barrier after it keeps the other ranks from running
        ahead while rank 0 writes (a courtesy here: DDP's next all-reduce waits for rank 0).
        """
        rng = [None] * self.world_size
        dist.all_gather_object(rng, runner.rng_state())
        if self.rank == 0:
            snapshot = {"model": self.model.module.state_dict(),
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                        "epochs_run": self.epochs_run, "step": self.step, "rng": rng}
            tmp = f"{self.config.snapshot}.tmp"
            torch.save(snapshot, tmp)
            os.replace(tmp, self.config.snapshot)
        dist.barrier()

    def load_snapshot(self):
        """Restore what ``save_snapshot`` wrote, so that training continues exactly where the
        snapshot was taken: the model (into ``self.model.module``), optimizer, scheduler,
        counters and this rank's entry of "rng" (``runner.set_rng_state``). Load with
        ``map_location=self.device`` and ``weights_only=False`` (the file holds NumPy random
        states, which the default ``weights_only=True`` refuses; it is your own file)."""
        # weights_only=False: the snapshot holds NumPy random states (our own, trusted file)
        snapshot = torch.load(self.config.snapshot, map_location=self.device,
                              weights_only=False)
        self.model.module.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scheduler.load_state_dict(snapshot["scheduler"])
        self.epochs_run, self.step = snapshot["epochs_run"], snapshot["step"]
        runner.set_rng_state(snapshot["rng"][self.rank])
        if self.rank == 0:
            print(f"resumed from {self.config.snapshot}: {self.epochs_run} epoch(s) done, "
                  f"step {self.step}", flush=True)

    def run_epoch(self, epoch):
        """One pass over this rank's part of the data (every rank a different part).

        First tell the sampler which epoch this is (``set_epoch``: a new shuffle every epoch,
        the same on every rank), before iterating over the loader.
        """
        # TODO: the sampler's epoch (see the docstring).
        self.sampler.set_epoch(epoch)
        self.model.train()
        total, count = 0.0, 0
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            loss = runner.loss_fn(self.model(x), y)
            loss.backward()                      # DDP averages the gradients here
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            total, count = total + loss.item() * len(y), count + len(y)
            runner.fault_point(self)             # crashes here when asked (fault injection)
        return total / max(count, 1)

    def train(self):
        """Run the remaining epochs; snapshot every config.save_every epochs; rank 0 logs."""
        for epoch in range(self.epochs_run, self.config.epochs):
            loss = self.run_epoch(epoch)
            self.epochs_run = epoch + 1
            if self.rank == 0:
                print(f"epoch {epoch + 1}/{self.config.epochs}: training loss {loss:.4f} "
                      f"(rank 0), {self.step} steps, lr {self.scheduler.get_last_lr()[0]:.4f}",
                      flush=True)
            if self.epochs_run % self.config.save_every == 0:
                self.save_snapshot()


if __name__ == "__main__":
    runner.main(ddp_setup, Trainer)
