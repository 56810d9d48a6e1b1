"""RIGHT (notebook 03, average_gradients): first one all_reduce of the sample count gives N;
then every gradient is scaled by n_r / N before its own all_reduce (one per parameter), so the
sum is already the weighted average.

Written differently from the solution on purpose; the checker must accept it.
"""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    """Turn every rank's local-mean-loss gradients into the global-mean-loss gradients.

    Args:
        model: the local replica; on entry ``p.grad`` of each parameter is the gradient of
            this rank's mean loss over its ``num_samples`` samples. Parameters whose
            ``grad`` is ``None`` (frozen or unused) are skipped.
        num_samples: number of samples this rank's loss averaged over (may differ between
            ranks).
        group: the process group (``None``: the default group); average over the ranks of
            ``group`` only.
    Returns:
        None. On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, with
        ``N`` the total number of samples, itself obtained with an ``all_reduce``.
    """
    total = torch.tensor([float(num_samples)], dtype=torch.float64)
    dist.all_reduce(total, group=group)
    weight = num_samples / total.item()
    for p in model.parameters():
        if p.grad is None:
            continue
        p.grad.mul_(weight)
        dist.all_reduce(p.grad, group=group)
