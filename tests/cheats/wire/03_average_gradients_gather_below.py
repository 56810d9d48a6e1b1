"""Cheat: the expected all_reduce of every n_r * g_r (and of n_r) is made, and every rank's
whole scaled gradient is gathered as well, through the process group's own ``allgather`` method
taken from the class when the file is imported (before any recorder could wrap it): the sums
come from the gathered gradients, N from the all_reduce. The values are a right file's; the
network carries an all-gather of the whole gradient more per step ((n - 1) n times its bytes
beside the all_reduce's 2 (n - 1)). Self-contained (at grading nothing of the course's tests
can be read). Must fail ``avg-wire``."""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

_ALLGATHER = ProcessGroup.allgather


def average_gradients(model, num_samples, group=None):
    params = [p for p in model.parameters() if p.grad is not None]
    like = params[0].grad if params else torch.zeros(0)
    count = like.new_tensor([float(num_samples)])
    flat = torch.cat([p.grad.reshape(-1) * num_samples for p in params] + [count])
    reduced = flat.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)
    pg = group or dist.group.WORLD
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(pg))]
    _ALLGATHER(pg, [parts], [flat]).wait()                                    # unseen
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    offset = 0
    for p in params:
        p.grad.copy_((total[offset:offset + p.numel()] / reduced[-1]).view_as(p.grad))
        offset += p.numel()
