"""RIGHT (notebook 05, trainer): env:// with explicit rank/world size, a BatchSampler loader.

ddp_setup passes ``init_method="env://"`` and the rank and world size it read from the
environment explicitly, and builds the device as ``torch.device("cuda", local_rank)``; the
Trainer builds the sampler with explicit ``num_replicas``/``rank`` and a DataLoader that draws
batches of ``config.batch_size`` from it through an explicit ``BatchSampler``; the snapshot is
written with ``tempfile.mkstemp`` in the snapshot's folder (an absolute path).

Written from the release notebook alone; the checker must accept it.
"""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from exercise_utils.ddp_torchrun_fault_tolerance import runner


def ddp_setup(config):
    """Join the job torchrun started; return ``(rank, local_rank, world_size, device)``."""
    env = os.environ
    rank, local_rank, world_size = (int(env[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=config.timeout_s))
    return rank, local_rank, world_size, device


class Trainer:
    """Trains ``model`` on ``train_set`` with DDP; snapshots every ``config.save_every`` epochs."""

    def __init__(self, model, train_set, optimizer, scheduler, config, rank, local_rank,
                 world_size, device):
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.optimizer, self.scheduler = optimizer, scheduler
        self.epochs_run, self.step = 0, 0
        model = model.to(device)
        if device.type == "cuda":
            self.model = DDP(model, device_ids=[local_rank], output_device=local_rank)
        else:
            self.model = DDP(model)
        self.sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=config.seed)
        self.loader = DataLoader(
            train_set,
            batch_sampler=BatchSampler(self.sampler, batch_size=config.batch_size,
                                       drop_last=False))
        if os.path.exists(config.snapshot):
            self.load_snapshot()

    def save_snapshot(self):
        """Write everything needed to resume exactly; rank 0 writes."""
        states = [None] * self.world_size
        dist.all_gather_object(states, runner.rng_state())
        if self.rank == 0:
            snapshot = {
                "model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "epochs_run": self.epochs_run,
                "step": self.step,
                "rng": states,
            }
            target = os.path.abspath(self.config.snapshot)
            folder, name = os.path.split(target)
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folder)
            os.close(fd)
            try:
                torch.save(snapshot, tmp)
                os.replace(tmp, target)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        dist.barrier()

    def load_snapshot(self):
        """Restore what ``save_snapshot`` wrote."""
        snap = torch.load(self.config.snapshot, map_location=self.device, weights_only=False)
        self.model.module.load_state_dict(snap["model"])
        self.optimizer.load_state_dict(snap["optimizer"])
        self.scheduler.load_state_dict(snap["scheduler"])
        self.epochs_run = int(snap["epochs_run"])
        self.step = int(snap["step"])
        runner.set_rng_state(snap["rng"][self.rank])
        if self.rank == 0:
            print(f"resumed from {self.config.snapshot}: {self.epochs_run} epoch(s) done, "
                  f"step {self.step}", flush=True)

    def run_epoch(self, epoch):
        """One pass over this rank's part of the data (every rank a different part)."""
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
