"""The reference of notebook 06's checks: the models, batches and data the probes hand the
student's code, and what single-process training on them gives.

Shared by the probe side (:mod:`.probes`, inside the ranks) and the checker side
(:mod:`.checks`, :mod:`.checks_overlap`). The models have a frozen parameter and a tied
weight (:class:`~exercise_utils.models.FrozenTiedNet`) or BatchNorm buffers
(:class:`~exercise_utils.models.BNNet`); ``"branch"`` (:class:`~exercise_utils.models.BranchNet`)
has a layer the forward skips in step ``UNUSED_AT``, its parameters ``UNUSED`` then getting no
gradient (BucketDDP must raise). :func:`replay` is the reference: single-process SGD
on the combined batch, BatchNorm statistics per rank's sub-batch (as data parallelism without
SyncBatchNorm computes them), so each rank's running statistics are its own.

Used in 06_build_your_own_ddp.
"""
import torch
import torch.nn.functional as F

from ..models import BNNet, BranchNet, FrozenTiedNet

IN_FEATURES = {"tied": 12, "bn": 10, "branch": 8}


LOCAL_BATCH, STEPS, LR, MOMENTUM = 4, 3, 0.1, 0.9


BUCKET_CAPS = {"tied": 600,             # bytes: [head.*, decoder.bias] and [encoder.weight]
               "bn": 280,               # fc1.weight (640 bytes) above the cap; 10**6-byte
                                        # "MB" would split [fc2.*, bn.bias] (268 bytes)
               "branch": 400}           # [head.*, branch.*] and [fc1.*]


UNUSED_AT, UNUSED = 1, ("branch.weight", "branch.bias")   # skipped in step 1 (of 0, 1)


DATA_SIZE, GLOBAL_BATCH = 50, 12         # partition_dataset: 4 steps with 2 ranks and with 3


def make_model(name):
    return {"tied": FrozenTiedNet, "bn": BNNet, "branch": BranchNet}[name]()


def seeded_model(name, seed):
    """A model initialised from ``seed``; BNNet also gets running statistics from a batch."""
    torch.manual_seed(seed)
    model = make_model(name)
    if name == "bn":
        with torch.no_grad():
            model(torch.randn(8, IN_FEATURES["bn"]) * 2 + 1)
    return model


def batch(name, step, rank, micro=0):
    """The deterministic local batch (x, y) of ``rank`` at ``step`` (micro-batch ``micro``)."""
    g = torch.Generator().manual_seed(10007 * step + 101 * rank + 7 * micro + len(name))
    return torch.randn(LOCAL_BATCH, IN_FEATURES[name], generator=g), \
        torch.randint(0, 3, (LOCAL_BATCH,), generator=g)


def dataset():
    """The dataset given to partition_dataset: (x, y, index) triples."""
    g = torch.Generator().manual_seed(5)
    return (torch.randn(DATA_SIZE, IN_FEATURES["bn"], generator=g),
            torch.randint(0, 3, (DATA_SIZE,), generator=g), torch.arange(DATA_SIZE))


def named_state(model):
    """``{name: array}`` of the parameters (tied ones once) and buffers."""
    items = list(model.named_parameters()) + list(model.named_buffers())
    return {k: v.detach().cpu().numpy().copy() for k, v in items}


def replay(name, init, steps):
    """Single-process SGD on the combined batches; BatchNorm statistics per rank.

    Args:
        name: "tied" or "bn".
        init: ``named_state`` to start from.
        steps: per step, per rank, a list of micro-batches ``(x, y)`` (several: accumulated).
    Returns:
        (parameters, per-rank buffers, gradients of the first step), dicts of arrays.
    """
    model = make_model(name)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in init.items()}, strict=False)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    buffers = [{k: b.clone() for k, b in model.named_buffers()} for _ in steps[0]]
    grads = None
    for per_rank in steps:
        opt.zero_grad(set_to_none=True)
        for rank, micros in enumerate(per_rank):
            with torch.no_grad():
                for k, b in model.named_buffers():
                    b.copy_(buffers[rank][k])
            for x, y in micros:
                (F.cross_entropy(model(torch.as_tensor(x)), torch.as_tensor(y))
                 / len(per_rank)).backward()
            buffers[rank] = {k: b.clone() for k, b in model.named_buffers()}
        if grads is None:
            grads = grads_of(model)
        opt.step()
    params = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    return params, [{k: v.numpy() for k, v in b.items()} for b in buffers], grads


def reference(name, out, size, no_sync_first=False):
    """replay() of the batches the probe gave each rank (step 0: two if no_sync_first)."""
    return replay(name, out["init"], [
        [([batch(name, 0, r, 1)] if step == 0 and no_sync_first else [])
         + [batch(name, step, r)] for r in range(size)] for step in range(STEPS)])


def grad_params(name):
    """[(name, numel)] of the parameters that require a gradient (tied ones once)."""
    return [(n, p.numel()) for n, p in make_model(name).named_parameters() if p.requires_grad]


def expected_buckets(name, cap=None):
    """BucketDDP's buckets (names) for the model ``name`` and its cap in BUCKET_CAPS (or
    ``cap`` bytes)."""
    cap, buckets, used = cap or BUCKET_CAPS[name], [], 0
    for pname, numel in reversed(grad_params(name)):
        if buckets and used + 4 * numel <= cap:
            buckets[-1].append(pname)
            used += 4 * numel
        else:
            buckets.append([pname])
            used = 4 * numel
    return buckets


def grads_of(model):
    return {k: p.grad.detach().cpu().numpy().copy() for k, p in model.named_parameters()
            if p.grad is not None}
