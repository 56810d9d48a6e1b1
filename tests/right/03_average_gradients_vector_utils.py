"""RIGHT (notebook 03, average_gradients): the gradients are flattened with
``torch.nn.utils.parameters_to_vector`` behind the sample count (first element), reduced in one
all_reduce, and written back with ``vector_to_parameters`` (which rebinds each gradient's data).
``parameters_to_vector`` views each tensor flat, so a transposed gradient goes in as a
contiguous copy; the vector keeps the gradients' dtype.

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
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    vector = parameters_to_vector([g.contiguous() for g in grads]) if grads else torch.zeros(0)
    flat = torch.cat([vector.new_tensor([float(num_samples)]), vector * num_samples])
    dist.all_reduce(flat, group=group)
    vector_to_parameters(flat[1:] / flat[0], grads)
