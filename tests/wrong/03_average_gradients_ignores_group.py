"""Wrong: the weighted average is right on the default group, but the all_reduce ignores the
`group` argument: with a process group it averages over every rank instead of the group's.

Violates: "average over the ranks of ``group`` only."
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
    params = [p for p in model.parameters() if p.grad is not None]
    # One all_reduce carries every n_r * g_r and, in its last element, n_r.
    like = params[0].grad if params else torch.zeros(0)
    count = like.new_tensor([float(num_samples)])
    flat = torch.cat([p.grad.reshape(-1) * num_samples for p in params] + [count])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    total = flat[-1]
    offset = 0
    for p in params:
        p.grad.copy_((flat[offset:offset + p.numel()] / total).view_as(p.grad))
        offset += p.numel()
