"""What runs inside the processes that notebook 03's checkers start, and the inputs they share.

Each ``probe_*(student, ctx, ...)`` is called by :func:`exercise_utils.harness.run_ranks` in a
fresh process (gloo, or independent processes for the partitions) with the imported student
module; it gives every rank its own global random state (ranks must not depend on it), calls
the student's code on fixed inputs and returns what came out. The verdicts are in
:mod:`.checks`; the ring all-reduce's probe is :mod:`.probes_ring`.

Used in 03_torch_distributed_collectives.
"""
import gc
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..harness import state_arrays
from ..models import FrozenTiedNet


def _seed_everything(seed):
    """Give this rank its own global random state (ranks must not depend on it)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _try(fn, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # reported per case, not as a crash
        return {"raised": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------- partitions
# ---------------------------------------------------------------- partitions
THIRD = 1 / 3
SIZE_CASES = [(10, [0.5, 0.5]), (11, [0.5, 0.5]), (10, [0.7, 0.3]), (7, [0.7, 0.3]),
              (7, [0.2, 0.3, 0.5]), (10, [THIRD] * 3), (11, [THIRD] * 3), (2, [THIRD] * 3),
              (1, [0.5, 0.5]), (0, [0.5, 0.5]), (3, [0.25] * 4), (9, [0.1, 0.6, 0.3]),
              (100, [0.1] * 10), (10, [0.25, 0.25]), (9, [0.5, 0.25]), (13, [1.0]),
              (13, [0.0, 1.0]), (50, [0.2, 0.3]), (7, [0.1] * 10)]   # sum 0.9999999999999999
BAD_CASES = [(10, [0.7, 0.4]), (10, [-0.5, 0.5, 1.0]), (10, [0.6, 0.6, -0.2])]
PARTITIONER_CASES = [(60, [0.5, 0.5], 1234), (61, [0.7, 0.3], 1234), (60, [0.7, 0.3], 7),
                     (50, [0.2, 0.3, 0.5], 1234), (40, [0.25, 0.25], 3), (2, [THIRD] * 3, 5),
                     (0, [0.5, 0.5], 1234), (60, [0.5, 0.5], 99)]
_perm = np.random.default_rng(3).permutation(30)
LABEL_CASES = [((np.arange(30) % 10)[_perm].tolist(), 2, True),
               ((np.arange(30) % 10)[_perm].tolist(), 3, False),
               ([9, 2, 5, 2, 7, 1, 9, 5, 1, 7, 7], 2, True),
               ([3, 0, 1, 2, 1], 3, False), ([4, 8, 4, 8], 3, False)]


def _rng_states():
    return (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist())


def _partitioner(student, n, fractions, seed):
    data = [1000 + i for i in range(n)]
    before = _rng_states()
    dp = student.DataPartitioner(data, fractions, seed=seed)
    parts = [[int(i) for i in p] for p in dp.partitions]
    used = [[dp.use(i)[j] for j in range(len(dp.use(i)))] for i in range(len(parts))]
    return {"parts": parts, "right_samples": used == [[data[k] for k in p] for p in parts],
            "rng_kept": _rng_states() == before}


def probe_partition(student, ctx):
    _seed_everything(11 + 17 * ctx.rank)
    sizes = [_try(lambda c: [int(s) for s in student.partition_sizes(*c)], c) for c in SIZE_CASES]
    bad = [_try(student.partition_sizes, *c) for c in BAD_CASES]
    bad = [r["raised"].split(":")[0] if isinstance(r, dict) else None for r in bad]
    parts = [_partitioner(student, *c) for c in PARTITIONER_CASES]
    again = _partitioner(student, *PARTITIONER_CASES[0])["parts"]
    labels = [student.label_partitions(torch.tensor(lab) if as_tensor else list(lab), k)
              for lab, k, as_tensor in LABEL_CASES]
    return sizes, bad, parts, again, [[[int(i) for i in p] for p in ps] for ps in labels]


# ---------------------------------------------------------------- gradient averaging
# ---------------------------------------------------------------- gradient averaging
# Local batch sizes per step and rank: unequal, one rank with a single sample.
AVG_SPLITS = {2: [[7, 3], [2, 8], [5, 5]], 3: [[5, 1, 3], [1, 4, 4], [3, 3, 2]]}
AVG_LR = 0.1
# With 3 ranks, one more step inside two process groups (rank 0 alone; ranks 1 and 2), with
# these local batch sizes: each group averages over its own ranks only.
AVG_GROUPS = {3: [[0], [1, 2]]}
AVG_GROUP_SPLIT = [4, 2, 5]


def avg_model():
    torch.manual_seed(0)
    return FrozenTiedNet()          # a frozen parameter (grad None) and a tied weight


def avg_batches(splits):
    g = torch.Generator().manual_seed(4321)
    return [(torch.randn(sum(s), 12, generator=g), torch.randint(0, 3, (sum(s),), generator=g))
            for s in splits]


def _grads(model):
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
            if p.grad is not None}


def avg_run(model, batches, rows=None, after_backward=None):
    """SGD with momentum; ``rows(step)`` picks this rank's rows. Returns (step-1 grads, state)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=AVG_LR,
                          momentum=0.9)
    first = None
    for step, (x, y) in enumerate(batches):
        part = rows(step) if rows else slice(None)
        opt.zero_grad()
        F.cross_entropy(model(x[part]), y[part]).backward()
        if after_backward:
            after_backward(len(y[part]))
        first = first or _grads(model)
        opt.step()
    return first, state_arrays(model)


def rows(splits, rank):
    return lambda step: slice(sum(splits[step][:rank]), sum(splits[step][:rank + 1]))


def _my_group(ctx, groups):
    """Create every group of ``groups`` (all ranks must) and return the one ``ctx.rank`` is in."""
    import torch.distributed as dist
    made = [dist.new_group(g) for g in groups]
    return next(grp for grp, g in zip(made, groups) if ctx.rank in g)


def probe_average_gradients(student, ctx):
    """SGD with unequal local batches; with 3 ranks also one step inside process groups."""
    model = avg_model()
    _seed_everything(1000 + ctx.rank)
    splits = AVG_SPLITS[ctx.size]
    first, state = avg_run(model, avg_batches(splits), rows(splits, ctx.rank),
                           lambda n: student.average_gradients(model, n))
    out = {"grads": first, "state": state, "group_grads": None}
    if ctx.size in AVG_GROUPS:
        group, model = _my_group(ctx, AVG_GROUPS[ctx.size]), avg_model()
        split = [AVG_GROUP_SPLIT]
        out["group_grads"] = avg_run(model, avg_batches(split), rows(split, ctx.rank),
                                     lambda n: student.average_gradients(model, n, group=group))[0]
    return out


# ---------------------------------------------------------------- SyncBatchNorm
BN_STEPS = 2
BN_CASES = {2: [dict(channels=5, spatial=(), sizes=[6, 2], momentum=0.1),
                dict(channels=3, spatial=(3, 4), sizes=[1, 3], momentum=None)],
            3: [dict(channels=4, spatial=(), sizes=[2, 7, 3], momentum=0.1),
                dict(channels=3, spatial=(2, 3), sizes=[1, 4, 2], momentum=0.3),
                dict(channels=3, spatial=(), sizes=[3, 2, 4], momentum=0.1, affine=False,
                     track=False)]}
# With 3 ranks, one more case inside two process groups (rank 0 alone; ranks 1 and 2).
BN_GROUPS = {3: [[0], [1, 2]]}
BN_GROUP_CASE = dict(channels=3, spatial=(), sizes=[3, 2, 4], momentum=None)


def bn_layer(case):
    torch.manual_seed(0)
    cls = nn.BatchNorm2d if case["spatial"] else nn.BatchNorm1d
    bn = cls(case["channels"], momentum=case["momentum"], affine=case.get("affine", True),
             track_running_stats=case.get("track", True))
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    return bn


def bn_data(case):
    """Per step: the global input (channels with different scales and offsets) and the
    loss weights; the loss is sum(output * weights). Plus an eval-mode input."""
    g = torch.Generator().manual_seed(99)
    c, shape = case["channels"], (sum(case["sizes"]), case["channels"], *case["spatial"])
    view = (1, c) + (1,) * len(case["spatial"])
    scale, offset = torch.rand(c, generator=g) * 2.5 + 0.5, torch.randn(c, generator=g) * 2
    make = lambda: torch.randn(shape, generator=g) * scale.view(view) + offset.view(view)
    return [(make(), torch.randn(shape, generator=g)) for _ in range(BN_STEPS)], make()


def bn_run(layer, steps, x_eval, part=slice(None)):
    out = {"y": [], "dx": [], "dweight": [], "dbias": []}
    layer.train()
    for x, w in steps:
        x = x[part].clone().requires_grad_()
        y = layer(x)
        (y * w[part]).sum().backward()
        out["y"].append(y.detach().numpy().copy())
        out["dx"].append(x.grad.numpy().copy())
        if layer.affine:
            out["dweight"].append(layer.weight.grad.numpy().copy())
            out["dbias"].append(layer.bias.grad.numpy().copy())
            layer.weight.grad = layer.bias.grad = None
    out["buffers"] = {k: v.numpy().copy() for k, v in layer.named_buffers()}
    layer.eval()
    with torch.no_grad():
        out["eval"] = layer(x_eval[part]).numpy().copy()
    return out


def probe_sync_batchnorm(student, ctx):
    """Every case of ``BN_CASES``; with 3 ranks then ``BN_GROUP_CASE`` inside process groups."""
    runs = [(case, None) for case in BN_CASES[ctx.size]]
    if ctx.size in BN_GROUPS:
        runs.append((BN_GROUP_CASE, _my_group(ctx, BN_GROUPS[ctx.size])))
    results = []
    for case, group in runs:
        model = nn.Sequential(bn_layer(case))
        layer = student.convert_batchnorm(model, group)[0] if group else \
            student.convert_batchnorm(model)[0]
        _seed_everything(1000 + ctx.rank)
        steps, x_eval = bn_data(case)
        sizes = case["sizes"]
        part = slice(sum(sizes[:ctx.rank]), sum(sizes[:ctx.rank + 1]))
        out = bn_run(layer, steps, x_eval, part)
        out["is_student_class"] = isinstance(layer, student.DistributedBatchNorm)
        results.append(out)
    # Autograd graphs that hold the process group can sit in reference cycles; if the garbage
    # collector frees them only at interpreter exit, gloo aborts ("terminate called ...").
    gc.collect()
    return results
