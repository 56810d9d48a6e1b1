"""RIGHT (notebook 03, average_gradients): first all-reduces the sample count alone (an int64
tensor, exact), then scales every local gradient by ``n_r / N`` *before* reducing, and reduces
one flat ``torch.cat`` bucket per gradient dtype (float32 and float64 never share a buffer),
copying the slices back through ``reshape`` (transposed and 0-d gradients).

Written from the release notebook alone; the checker must accept it.
"""
import torch
import torch.distributed as dist


def average_gradients(model, num_samples, group=None):
    """p.grad <- sum_r (n_r / N) g_r on every rank of ``group``."""
    count = torch.tensor([int(num_samples)], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    total = int(count.item())

    buckets = {}                                   # dtype -> list of grads, first-seen order
    for p in model.parameters():                   # parameters() lists a tied tensor once
        if p.grad is not None:
            buckets.setdefault(p.grad.dtype, []).append(p.grad)

    weight = int(num_samples) / total if total > 0 else 0.0
    for dtype, grads in buckets.items():
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(weight)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for g in grads:
            k = g.numel()
            g.copy_(flat[offset:offset + k].reshape(g.shape))
            offset += k
