"""RIGHT (notebook 03, average_gradients): the list of ALL the model's parameters is built once
and kept on the model (what may be cached: the parameters themselves do not change); which of
them have a gradient is looked at in every call, as the docstring asks. The count and the
n_r-weighted gradients travel in one buffer of the gradients' dtype, the count in front.

Written differently from the solution on purpose; the checker must accept it.
"""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    """Turn every rank's local-mean-loss gradients into the global-mean-loss gradients.

    Args:
        model: the local replica; on entry ``p.grad`` of each parameter is the gradient of
            this rank's mean loss over its ``num_samples`` samples. Parameters whose
            ``grad`` is ``None`` (frozen or unused) are skipped. Which parameters have a
            gradient may change from one call to the next (a layer the forward skips in
            some steps, one frozen for a while): look at ``p.grad`` in every call.
        num_samples: number of samples this rank's loss averaged over (may differ between
            ranks). It may be 0 on a rank that has no sample (its gradients are then zeros);
            that rank still takes part in every ``all_reduce``.
        group: the process group (``None``: the default group); average over the ranks of
            ``group`` only.
    Returns:
        None. On return every rank's ``p.grad`` holds ``sum_r (n_r / N) * g_r``, with
        ``N`` the total number of samples, itself obtained with an ``all_reduce``.
    """
    everything = model.__dict__.get("_all_parameters")
    if everything is None:                       # the parameters never change: list them once
        everything = model.__dict__["_all_parameters"] = list(model.parameters())
    grads = [p.grad for p in everything if p.grad is not None]   # this call's, every call
    dtype = grads[0].dtype if grads else torch.float64
    flat = torch.cat([torch.tensor([float(num_samples)], dtype=dtype)]
                     + [g.reshape(-1) * num_samples for g in grads])
    dist.all_reduce(flat, group=group)
    flat[1:] /= flat[0]
    offset = 1
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].reshape(g.shape))
        offset += g.numel()
