"""Notebook 04's try cell (issue 39): part 1 of ``work/04_cifar_dp.py``, ``rank_process``, run
as soon as it is written, on 2 processes with a stand-in ``train`` that makes one all-reduce
and says what it saw (:mod:`exercise_utils.tries`). Not a check: nothing is judged here (the
CHECK cells do that); part 2, ``train``, is tried by the checks and the runs of section 3.

    from exercise_utils.resnet_cifar_data_parallel import tries
    tries.run("rank_process")

Used in 04_resnet_cifar_data_parallel.
"""
import torch
import torch.distributed as dist

from .. import tries as core
from ..launch import free_port
from . import runner
from .probes import reachable

WORK = "work/04_cifar_dp.py"


def run(part="rank_process", work=WORK):
    """Run the try of ``part`` (``"rank_process"``) with the file ``work`` on 2 processes;
    print what each saw."""
    core.run(TRIES, part, work)


def try_rank_process(mine, ctx, port):
    """``rank_process(rank, 2, config)`` with a stand-in ``train``; what it saw and left."""
    config = runner.make_config("cpu", master_addr=reachable("127.0.0.1"), master_port=port,
                                timeout_s=30)
    seen = {}

    def stand_in(rank, world_size, cfg, device):
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        seen.update(rank=rank, world=world_size, device=str(device), sum=float(t),
                    backend=dist.get_backend(), group=(dist.get_rank(), dist.get_world_size()))
        return f"train of rank {rank}"

    mine.train = stand_in
    got = mine.rank_process(ctx.rank, ctx.size, config)
    if not seen:
        return [f"rank_process returned {got!r} without calling train"]
    total = ctx.size * (ctx.size + 1) / 2
    return [f"train ran as rank {seen['rank']} of {seen['world']} on {seen['device']}, in a "
            f"{seen['backend']} group as rank {seen['group'][0]} of {seen['group'][1]}; an "
            f"all_reduce of rank + 1 gave {seen['sum']:g} (expected {total:g})",
            f"rank_process returned {got!r} (expected train's value); the group left "
            f"initialised: {dist.is_initialized()} (expected False)"]


TRIES = {"rank_process": core.Try(try_rank_process, ("rank_process",), "rank_process",
                                  backend="none", kwargs=lambda: {"port": free_port()})}
