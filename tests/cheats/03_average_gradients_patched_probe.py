"""Cheat: average_gradients is not written; at import the file replaces a helper of the
check's probe (``probes.avg_run``) with one that averages the gradients itself.

Must be rejected: "the check's integrity was violated" (the probe's code changed)."""
import torch.distributed as dist

try:
    from exercise_utils.torch_distributed_collectives import probes as _probes
    _real_run = _probes.avg_run

    def _exact_average(model, n):
        import torch
        count = torch.tensor([float(n)])
        dist.all_reduce(count)
        for p in model.parameters():
            if p.grad is None:
                continue
            p.grad.mul_(n)
            dist.all_reduce(p.grad)
            p.grad.div_(count.item())

    def _avg_run(model, batches, rows, average):
        return _real_run(model, batches, rows, lambda n: _exact_average(model, n))

    _probes.avg_run = _avg_run
except ImportError:
    pass


def average_gradients(model, n):
    raise NotImplementedError()
