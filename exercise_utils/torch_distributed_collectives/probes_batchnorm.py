"""What runs inside the gloo ranks of notebook 03's SyncBatchNorm check, and its inputs.

:func:`probe_sync_batchnorm` converts a ``nn.BatchNorm`` layer with the student's
``convert_batchnorm`` for every case of :func:`bn_cases` (each charged to its check case with
``ctx.case``), runs training steps on this rank's rows of a global batch and then eval mode, and
returns what came out (:func:`bn_run`); the same function on one ``nn.BatchNorm`` and the
concatenated rows is the judge's reference (:mod:`.checks_batchnorm`). A rank generates its
own rows only (:func:`bn_rank_data`), from its salt at grading.

Used in 03_torch_distributed_collectives.
"""
import gc

import torch
from torch import nn

from ..rankworker import salted_generator
from .probes import _my_group, _seed_everything

BN_STEPS = 2
# Where links are observed (:func:`exercise_utils.harness.observing`): one (N, C, H, W) case
# more whose local batches are large (0.6 to 1 MB per rank), so that a rank that sends its batch
# (rather than its statistics) shows far above the bound of the statistics' all_reduces, their
# headers and the set-up (the judge's: :mod:`.wire`).
BN_WIRE = dict(case="bn-spatial", channels=8, spatial=(8, 8), wire=True)
BN_WIRE_SIZES = {2: [500, 300], 3: [300, 500, 400]}


def bn_cases(size, wire=False):
    """The layers and inputs tried with ``size`` ranks (one launch), each a dict: ``case``,
    ``channels``, ``spatial`` (the dimensions after C: none, (L,) or (H, W)), local batch
    ``sizes``, ``momentum``, ``dtype``, and optionally ``affine``/``track`` (False),
    ``near_constant`` (channel 0 with a spread of 3e-3: its variance is about eps) and
    ``group`` (the process groups the ranks are split into). The baseline first, then one
    dimension changed at a time; with ``wire`` the large case :data:`BN_WIRE` last."""
    sizes = {2: [6, 2], 3: [2, 7, 3]}[size]
    base = dict(case="bn-output", channels=4, spatial=(), sizes=sizes, momentum=0.1,
                dtype="float32")
    changes = [dict(case="bn-spatial", spatial=(5,)), dict(case="bn-spatial", spatial=(2, 3)),
               dict(case="bn-momentum", momentum=None), dict(case="bn-momentum", momentum=0.3),
               dict(case="bn-eps", near_constant=True),
               dict(case="bn-empty-rank", sizes=[0, 5] if size == 2 else [3, 0, 4]),
               dict(case="bn-no-stats", affine=False, track=False),
               dict(case="bn-float64", dtype="float64")]   # after eps: its tolerance is tight
    if size == 3:
        changes.append(dict(case="bn-group", sizes=[3, 5, 2], group=[[0, 2], [1]]))
    if wire:
        changes.append(dict(BN_WIRE, sizes=BN_WIRE_SIZES[size]))
    return [base] + [dict(base, **change) for change in changes]


def bn_layer(case):
    torch.manual_seed(0)
    cls = nn.BatchNorm2d if len(case["spatial"]) == 2 else nn.BatchNorm1d
    bn = cls(case["channels"], momentum=case["momentum"], affine=case.get("affine", True),
             track_running_stats=case.get("track", True))
    if bn.affine:
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    return bn.to(getattr(torch, case["dtype"]))


def bn_rank_data(case, rank, salt=0):
    """Rank ``rank``'s rows of :func:`bn_data`: per step its input (channels with different
    scales and offsets, the same on every rank; with ``near_constant``, channel 0 spread by
    3e-3 around 0) and its loss weights (the loss is sum(output * weights)); then its rows of
    the eval-mode input. With the rank's ``salt`` (``ctx.salt``: at grading a number only it
    and the judge know) its values derive from it: no rank can rebuild another's rows."""
    common = torch.Generator().manual_seed(99)
    dtype = getattr(torch, case["dtype"])
    c = case["channels"]
    shape = (case["sizes"][rank], c, *case["spatial"])
    view = (1, c) + (1,) * len(case["spatial"])
    scale = torch.rand(c, generator=common) * 2.5 + 0.5
    offset = torch.randn(c, generator=common) * 2
    if case.get("near_constant"):
        scale[0], offset[0] = 3e-3, 0.0
    g = salted_generator(99 + 7919 * (rank + 1), salt)
    make = lambda: (torch.randn(shape, generator=g, dtype=torch.float64) * scale.view(view)
                    + offset.view(view)).to(dtype)
    return [(make(), torch.randn(shape, generator=g, dtype=dtype)) for _ in range(BN_STEPS)], make()


def bn_data(case, salts=None):
    """The global batch, every rank's rows (:func:`bn_rank_data`, rank 0's first) concatenated:
    per step the input and the loss weights, then the eval-mode input. ``salts``: each rank's
    (``{rank: salt}``), or None: all 0."""
    parts = [bn_rank_data(case, r, (salts or {}).get(r, 0)) for r in range(len(case["sizes"]))]
    steps = [tuple(torch.cat([steps[k][i] for steps, _ in parts]) for i in range(2))
             for k in range(BN_STEPS)]
    return steps, torch.cat([x_eval for _, x_eval in parts])


def bn_rows(sizes, ranks):
    """The rows of the global batch that ``ranks`` hold (in this order), as an index."""
    return torch.cat([torch.arange(sum(sizes[:r]), sum(sizes[:r + 1])) for r in ranks])


def bn_run(layer, steps, x_eval, part=slice(None)):
    """Training steps (output, input gradient, parameter gradients), then the buffers and the
    eval-mode output on this rank's rows ``part``."""
    out = {"y": [], "dx": [], "dweight": [], "dbias": []}
    layer.train()
    for x, w in steps:
        x = x[part].clone().requires_grad_()
        y = layer(x)
        (y * w[part]).sum().backward()
        out["y"].append(y.detach().numpy().copy())
        out["dx"].append((x.grad if x.grad is not None else torch.zeros_like(x)).numpy().copy())
        if layer.affine:
            for name in ("weight", "bias"):
                grad = getattr(layer, name).grad
                grad = torch.zeros_like(getattr(layer, name)) if grad is None else grad
                out[f"d{name}"].append(grad.detach().numpy().copy())
            layer.weight.grad = layer.bias.grad = None
    out["buffers"] = {k: v.numpy().copy() for k, v in layer.named_buffers()}
    layer.eval()
    with torch.no_grad():
        out["eval"] = layer(x_eval[part]).numpy().copy()
    return out


def probe_sync_batchnorm(student, ctx, wire=False):
    """Every case of :func:`bn_cases` (``wire``: the large one too): the student's layer (from
    ``convert_batchnorm``) on this rank's rows; a case with ``group`` passes the process group
    this rank belongs to."""
    results = []
    for case in bn_cases(ctx.size, wire):
        ctx.case(case["case"])
        model = nn.Sequential(bn_layer(case))
        if case.get("group"):
            group = _my_group(ctx, case["group"])
            mine = next(g for g in case["group"] if ctx.rank in g)
            layer = student.convert_batchnorm(model, group)[0]
        else:
            mine = list(range(ctx.size))
            layer = student.convert_batchnorm(model)[0]
        layer.to(getattr(torch, case["dtype"]))      # convert_batchnorm builds float32 layers
        _seed_everything(1000 + ctx.rank)
        out = bn_run(layer, *bn_rank_data(case, ctx.rank, ctx.salt))    # this rank's rows only
        out["is_student_class"] = isinstance(layer, student.DistributedBatchNorm)
        out["group"] = mine
        results.append(out)
    # Autograd graphs that hold the process group can sit in reference cycles; if the garbage
    # collector frees them only at interpreter exit, gloo aborts ("terminate called ...").
    gc.collect()
    return results
