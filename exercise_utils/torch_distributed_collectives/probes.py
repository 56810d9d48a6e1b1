"""Checker of notebook 03 for the CPU SyncBatchNorm exercise (``DistributedBatchNorm``).

``check_sync_batchnorm`` runs the student file in fresh gloo processes (world sizes 2 and
3, unequal local batch sizes) through :func:`exercise_utils.harness.run_ranks` and compares
outputs, input and parameter gradients, running statistics and eval-mode outputs with a
single ``nn.BatchNorm`` on the concatenated batch; ``probe_sync_batchnorm`` runs inside
those processes.

Used in 03_torch_distributed_collectives.
"""
import gc

import numpy as np
import torch
from torch import nn

from .checks_dist import TIMEOUT, _seed_everything
from .harness import assert_close, run_ranks

MODULE = "exercise_utils.checks_syncbn"

BN_STEPS = 2
BN_CASES = {2: [dict(channels=5, spatial=(), sizes=[6, 2], momentum=0.1),
                dict(channels=3, spatial=(3, 4), sizes=[1, 3], momentum=None)],
            3: [dict(channels=4, spatial=(), sizes=[2, 7, 3], momentum=0.1),
                dict(channels=3, spatial=(2, 3), sizes=[1, 4, 2], momentum=0.3)]}


def _bn_layer(case):
    torch.manual_seed(0)
    cls = nn.BatchNorm2d if case["spatial"] else nn.BatchNorm1d
    bn = cls(case["channels"], momentum=case["momentum"])
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_()
    return bn


def _bn_data(case):
    """Per step: the global input (channels with different scales and offsets) and the
    loss weights; the loss is sum(output * weights). Plus an eval-mode input."""
    g = torch.Generator().manual_seed(99)
    c, shape = case["channels"], (sum(case["sizes"]), case["channels"], *case["spatial"])
    view = (1, c) + (1,) * len(case["spatial"])
    scale, offset = torch.rand(c, generator=g) * 2.5 + 0.5, torch.randn(c, generator=g) * 2
    make = lambda: torch.randn(shape, generator=g) * scale.view(view) + offset.view(view)
    return [(make(), torch.randn(shape, generator=g)) for _ in range(BN_STEPS)], make()


def _bn_run(layer, steps, x_eval, part=slice(None)):
    out = {"y": [], "dx": [], "dweight": [], "dbias": []}
    layer.train()
    for x, w in steps:
        x = x[part].clone().requires_grad_()
        y = layer(x)
        (y * w[part]).sum().backward()
        out["y"].append(y.detach().numpy().copy())
        out["dx"].append(x.grad.numpy().copy())
        out["dweight"].append(layer.weight.grad.numpy().copy())
        out["dbias"].append(layer.bias.grad.numpy().copy())
        layer.weight.grad = layer.bias.grad = None
    out["buffers"] = {k: v.numpy().copy() for k, v in layer.named_buffers()}
    layer.eval()
    with torch.no_grad():
        out["eval"] = layer(x_eval[part]).numpy().copy()
    return out


def probe_sync_batchnorm(student, ctx):
    results = []
    for case in BN_CASES[ctx.size]:
        layer = student.convert_batchnorm(nn.Sequential(_bn_layer(case)))[0]
        _seed_everything(1000 + ctx.rank)
        steps, x_eval = _bn_data(case)
        sizes = case["sizes"]
        part = slice(sum(sizes[:ctx.rank]), sum(sizes[:ctx.rank + 1]))
        out = _bn_run(layer, steps, x_eval, part)
        out["is_student_class"] = isinstance(layer, student.DistributedBatchNorm)
        results.append(out)
    # Autograd graphs that hold the process group can sit in reference cycles; if the garbage
    # collector frees them only at interpreter exit, gloo aborts ("terminate called ...").
    gc.collect()
    return results


def _bn_candidates(case, x):
    """Training outputs of two flawed BatchNorms: local statistics; unweighted means of them."""
    layer, dims = _bn_layer(case), [0] + list(range(2, x.dim()))
    view = (1, -1) + (1,) * (x.dim() - 2)
    chunks = torch.split(x.double(), case["sizes"])
    local = [(c.mean(dims), c.var(dims, unbiased=False)) for c in chunks]
    unweighted = [tuple(sum(s) / len(local) for s in zip(*local))] * len(local)
    weight, bias = (t.detach().double().view(view) for t in (layer.weight, layer.bias))
    return [[((c - m.view(view)) / torch.sqrt(v.view(view) + 1e-5) * weight + bias).numpy()
             for c, (m, v) in zip(chunks, stats)] for stats in (local, unweighted)]


BN_FORWARD_FLAWS = (
    "plain BatchNorm on the local batch: the ranks did not combine their statistics",
    "normalised with the unweighted average of the ranks' means and variances: wrong when local "
    "batch sizes differ, and the average of variances misses the spread between the ranks' means")
BN_HINTS = {
    "output": "normalise with the mean and biased variance of the global batch (all ranks): "
              "all_reduce the count, sum and sum of squares per channel; mean = sum/N, "
              "var = sumsq/N - mean^2",
    "input.grad": "the output is right, so the statistics are right, but autograd does not see "
                  "how they depend on the other ranks' inputs: the all_reduce must be "
                  "differentiable: use torch.distributed.nn.functional.all_reduce, not "
                  "dist.all_reduce (invisible to autograd) or a detached tensor",
    "running_mean": "it must move towards the mean of the global batch (momentum None: "
                    "cumulative average with factor 1/num_batches_tracked)",
    "running_var": "the running variance must use the unbiased variance of the global batch: "
                   "sumsq/N - mean^2 scaled by N/(N-1)",
    "eval output": "eval mode must normalise with the running statistics"}


def _bn_close(name, got, want, where, rank=None, hint=""):
    assert_close({name: got}, {name: want}, f"{where}: {BN_HINTS.get(name, '')}{hint}", rank,
                 1e-4, 1e-3)


def _check_bn_case(size, case, res, ref):
    sizes, (steps, _) = case["sizes"], _bn_data(case)
    where = (f"DistributedBatchNorm{2 if case['spatial'] else 1}d, {size} ranks, local batch "
             f"sizes {sizes}, momentum={case['momentum']}")
    split = lambda a: np.split(a, np.cumsum(sizes)[:-1])
    if not all(r["is_student_class"] for r in res):
        raise AssertionError(f"convert_batchnorm must replace nn.BatchNorm layers by "
                             f"DistributedBatchNorm layers ({where})")
    for step, (x, _) in enumerate(steps):
        at = f"step {step + 1}, {where}"
        got = [r["y"][step] for r in res]
        match = lambda cand: all(np.allclose(g, c, atol=1e-4, rtol=1e-3) for g, c in zip(got, cand))
        hint = next((f". Your output is {text}" for text, cand in
                     zip(BN_FORWARD_FLAWS, _bn_candidates(case, x)) if match(cand)), "")
        for rank, (r, y) in enumerate(zip(res, split(ref["y"][step]))):
            _bn_close("output", r["y"][step], y, f"training output, {at}", rank, hint)
        for rank, (r, dx) in enumerate(zip(res, split(ref["dx"][step]))):
            _bn_close("input.grad", r["dx"][step], dx, f"gradient w.r.t. the input, {at}", rank)
        for name in ("dweight", "dbias"):
            _bn_close(f"{name[1:]}.grad", sum(r[name][step] for r in res), ref[name][step],
                      f"gradient w.r.t. {name[1:]} summed over the ranks, {at}")
    for rank, (r, want) in enumerate(zip(res, split(ref["eval"]))):
        tracked = int(r["buffers"].get("num_batches_tracked", -1))
        if tracked != BN_STEPS:
            raise AssertionError(f"rank {rank}: num_batches_tracked is {tracked} after "
                                 f"{BN_STEPS} training steps; expected {BN_STEPS} ({where})")
        for name in ("running_mean", "running_var"):
            _bn_close(name, r["buffers"][name], ref["buffers"][name],
                      f"{name} after {BN_STEPS} steps, {where}", rank)
        _bn_close("eval output", r["eval"], want, f"eval-mode output, {where}", rank)


def check_sync_batchnorm(path, timeout=TIMEOUT):
    """Check ``DistributedBatchNorm`` (via ``convert_batchnorm``) against ``nn.BatchNorm``
    on the concatenated batch: outputs, input and parameter gradients, running statistics,
    eval mode; BatchNorm1d and 2d, unequal local batch sizes, 2 and 3 ranks."""
    for size in (2, 3):
        res = run_ranks(path, f"{MODULE}:probe_sync_batchnorm", size, "gloo", timeout=timeout,
                        what="DistributedBatchNorm")
        for i, case in enumerate(BN_CASES[size]):
            steps, x_eval = _bn_data(case)
            ref = _bn_run(_bn_layer(case), steps, x_eval)
            _check_bn_case(size, case, [r[i] for r in res], ref)
