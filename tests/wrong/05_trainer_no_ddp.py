"""WRONG (notebook 05, trainer_no_ddp): the model is moved to the device but never wrapped in DistributedDataParallel, so each rank trains its own model on its own part of the data (no broadcast of rank 0's initial parameters, no gradient averaging).

Violates: "Move the model to ``device`` and wrap it in DDP (``device_ids=[local_rank]`` on a
GPU, none on the CPU)."

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
    ### BEGIN SOLUTION
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=config.timeout_s))
    return rank, local_rank, world_size, device
    ### END SOLUTION


class Trainer:
    """Trains ``model`` on ``train_set`` with DDP; snapshots every ``config.save_every`` epochs.

    Attributes the course relies on: ``model`` (the DDP-wrapped model), ``optimizer``,
    ``scheduler``, ``sampler``, ``loader``, ``epochs_run`` (epochs finished), ``step``
    (optimizer steps taken), ``rank``, ``world_size``, ``device``, ``config``.
    """

    def __init__(self, model, train_set, optimizer, scheduler, config, rank, local_rank,
                 world_size, device):
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.optimizer, self.scheduler = optimizer, scheduler
        self.epochs_run, self.step = 0, 0
        # TODO: move the model to the device and wrap it in DDP (device_ids=[local_rank] on a
        # GPU, none on the CPU); a DistributedSampler (shuffle, seed=config.seed) over
        # train_set and a DataLoader with config.batch_size examples per worker; then, if
        # the snapshot file config.snapshot exists, load it (self.load_snapshot()).
        ### BEGIN SOLUTION
        model = model.to(device)
        self.model = model          # FLAW: not wrapped in DistributedDataParallel
        self.sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=config.seed)
        self.loader = DataLoader(train_set, batch_size=config.batch_size, sampler=self.sampler)
        if os.path.exists(config.snapshot):
            self.load_snapshot()
        ### END SOLUTION

    def save_snapshot(self):
        """Write everything needed to resume exactly; rank 0 writes, every rank waits.

        The snapshot (a dict for ``torch.save``) holds: "model" (the unwrapped module's
        state_dict), "optimizer", "scheduler", "epochs_run", "step", and "rng": the random
        states of EVERY rank (``runner.rng_state()`` gathered with all_gather_object; rank r
        restores entry r). Rank 0 writes it to a temporary file next to config.snapshot and
        renames it over config.snapshot (``os.replace``: atomic, so a crash during the write
        never leaves a torn snapshot); then all ranks meet at a barrier.
        """
        ### BEGIN SOLUTION
        rng = [None] * self.world_size
        dist.all_gather_object(rng, runner.rng_state())
        if self.rank == 0:
            snapshot = {"model": self.model.state_dict(),
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                        "epochs_run": self.epochs_run, "step": self.step, "rng": rng}
            tmp = f"{self.config.snapshot}.tmp"
            torch.save(snapshot, tmp)
            os.replace(tmp, self.config.snapshot)
        dist.barrier()
        ### END SOLUTION

    def load_snapshot(self):
        """Restore what ``save_snapshot`` wrote (``map_location`` = this rank's device), so
        that training continues exactly where the snapshot was taken."""
        ### BEGIN SOLUTION
        # weights_only=False: the snapshot holds NumPy random states (our own, trusted file)
        snapshot = torch.load(self.config.snapshot, map_location=self.device,
                              weights_only=False)
        self.model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scheduler.load_state_dict(snapshot["scheduler"])
        self.epochs_run, self.step = snapshot["epochs_run"], snapshot["step"]
        runner.set_rng_state(snapshot["rng"][self.rank])
        ### END SOLUTION
        if self.rank == 0:
            print(f"resumed from {self.config.snapshot}: {self.epochs_run} epoch(s) done, "
                  f"step {self.step}", flush=True)

    def run_epoch(self, epoch):
        """One pass over this rank's part of the data (every rank a different part)."""
        # TODO: tell the sampler which epoch this is (a new shuffle every epoch, the same on
        # every rank), before iterating over the loader.
        ### BEGIN SOLUTION
        self.sampler.set_epoch(epoch)
        ### END SOLUTION
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
