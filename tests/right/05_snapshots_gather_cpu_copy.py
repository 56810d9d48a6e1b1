"""RIGHT (notebook 05, snapshots): gather_object to rank 0, CPU copies, pathlib sibling tmp.

The random states are collected on rank 0 only with ``dist.gather_object`` (the other ranks
send theirs and keep no list) and stored as a tuple indexed by rank; the model's state is saved
as detached CPU copies (loaded back onto each rank's device by ``map_location``); the
temporary file is the snapshot's pathlib sibling ``<name>.tmp`` and is renamed with
``os.replace`` on Path objects; the snapshot's existence is tested with ``Path.is_file``;
ddp_setup takes the device from ``torch.device(f"cuda:{local_rank}")`` and sets it by device,
with the timeout in milliseconds.

Written from the release notebook alone; the checker must accept it.
"""
import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from exercise_utils.ddp_torchrun_fault_tolerance import runner


def ddp_setup(config):
    """Join the job torchrun started; return ``(rank, local_rank, world_size, device)``."""
    local_rank = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo",
                            timeout=datetime.timedelta(milliseconds=1000.0 * config.timeout_s))
    return rank, local_rank, world_size, device


class Trainer:
    """Trains ``model`` on ``train_set`` with DDP; snapshots every ``config.save_every`` epochs."""

    def __init__(self, model, train_set, optimizer, scheduler, config, rank, local_rank,
                 world_size, device):
        self.config, self.rank, self.world_size, self.device = config, rank, world_size, device
        self.optimizer, self.scheduler = optimizer, scheduler
        self.epochs_run, self.step = 0, 0
        on_gpu = torch.device(device).type == "cuda"
        self.model = DDP(model.to(device), device_ids=[local_rank] if on_gpu else None)
        self.sampler = DistributedSampler(train_set, world_size, rank, shuffle=True,
                                          seed=config.seed)
        self.loader = DataLoader(train_set, batch_size=config.batch_size, shuffle=False,
                                 sampler=self.sampler)
        if Path(config.snapshot).is_file():
            self.load_snapshot()

    def save_snapshot(self):
        """Write everything needed to resume exactly; rank 0 writes."""
        mine = runner.rng_state()
        gathered = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.rank == 0:
            model_state = {k: v.detach().to("cpu", copy=True)
                           for k, v in self.model.module.state_dict().items()}
            snapshot = dict(model=model_state, optimizer=self.optimizer.state_dict(),
                            scheduler=self.scheduler.state_dict(), epochs_run=self.epochs_run,
                            step=self.step, rng=tuple(gathered))
            final = Path(self.config.snapshot)
            tmp = final.with_name(final.name + ".tmp")
            torch.save(snapshot, tmp)
            os.replace(tmp, final)
        dist.barrier()

    def load_snapshot(self):
        """Restore what ``save_snapshot`` wrote."""
        snap = torch.load(Path(self.config.snapshot), map_location=self.device,
                          weights_only=False)
        self.model.module.load_state_dict(snap["model"], strict=True)
        self.optimizer.load_state_dict(snap["optimizer"])
        self.scheduler.load_state_dict(snap["scheduler"])
        self.epochs_run, self.step = snap["epochs_run"], snap["step"]
        runner.set_rng_state(snap["rng"][self.rank])
        if self.rank == 0:
            print(f"resumed from {self.config.snapshot}: {self.epochs_run} epoch(s) done, "
                  f"step {self.step}", flush=True)

    def run_epoch(self, epoch):
        """One pass over this rank's part of the data (every rank a different part)."""
        self.loader.sampler.set_epoch(epoch)
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
