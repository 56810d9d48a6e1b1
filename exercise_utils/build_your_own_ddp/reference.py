"""The inputs of notebook 06's checks: the models, batches and data the probes hand the
student's code.

Shared by the probe side (:mod:`.probes`, :mod:`.probes_grad`, inside the ranks) and the
checker side (:mod:`.checks`, :mod:`.checks_overlap`). A model is named by a *spec*:

* ``"plain"``: a :class:`~exercise_utils.models.TinyMLP` (every parameter gets a gradient);
* ``"edge"`` / ``"edge64"``: an :class:`~exercise_utils.models.EdgeNet` in float32 / float64
  (tied, frozen, transposed and 0-d parameters, BatchNorm buffers whose int64 counter starts
  above 2**24, where float32 cannot hold every integer; in float64, parameters float32 cannot
  hold) with its ``unused`` layer frozen;
* ``"edge-unused"`` / ``"edge-unused64"``: the same with ``unused`` trainable: two parameters
  that never get a gradient (``grad`` None);
* ``"branch"``: a :class:`~exercise_utils.models.BranchNet`, whose layer ``branch`` the probe
  skips in step ``UNUSED_AT`` (its parameters ``UNUSED`` then get no gradient: BucketDDP must
  raise).

What single-process training on them gives (:func:`.references.replay`: SGD on the combined
batch, BatchNorm statistics per rank's sub-batch, as data parallelism without SyncBatchNorm
computes them) and the buckets BucketDDP must build (the notebook's greedy packing,
:mod:`.expected`) are the judge's alone: no rank imports them (the grading sandbox hides them).

Used in 06_build_your_own_ddp.
"""
import torch

from ..models import BranchNet, EdgeNet, TinyMLP
from ..rankworker import salted_generator

LOCAL_BATCH, STEPS, LR, MOMENTUM = 4, 3, 0.1, 0.9

# Bytes of the bucket cap of each BucketDDP run (bucket_cap_mb = cap / 2**20). EdgeNet in
# reverse registration order (frozen and unused skipped), float32 bytes: head.bias 16,
# head.weight 128, back.bias 32 (= 176: a bucket exactly at the cap), out.weight 256 (above the
# cap: alone), bn.bias, bn.weight, inp.bias 96, inp.weight 192 (alone), scale 4, proj 256. In
# float64 every size doubles and so does the cap: the same buckets; 4 bytes per element would
# pack others. A cap in decimal MB (10**6 bytes) or a bucket closed AT the cap split the first
# bucket alike at 176 bytes; at 724 they differ (and from the right packing).
BUCKET_CAPS = {"buckets-values": 176, "buckets-float64": 352, "buckets-no-sync": 724,
               "buckets-nested-no-sync": 176,
               "branch": 140}   # [head.bias, head.weight, branch.bias] (exactly 140),
#                                 [branch.weight], [fc1.bias], [fc1.weight]

UNUSED_AT, UNUSED = 1, ("branch.weight", "branch.bias")   # skipped in step 1 (of 0, 1, 2):
#                       one bucket lacks one of its three gradients, another all of its one

DATA_SIZE, GLOBAL_BATCH = 47, 12         # partition_dataset: 3 steps with 2 ranks and with 3;
#                                          a sampler that pads the 47 examples to 48 yields a
#                                          4th step (with a repeated example)
COUNTER = 2 ** 24 + 1    # BatchNorm's num_batches_tracked starts at COUNTER + 2 * seed (plus
#                          twice the salt mod 1000003): odd, which a float32 buffer cannot hold


def features(spec):
    return {"plain": 6, "branch": 8}.get(spec, 6)


def dtype_of(spec):
    return torch.float64 if spec.endswith("64") else torch.float32


def make_model(spec):
    """The model of ``spec`` (see the module docstring), freshly initialised."""
    if spec == "plain":
        return TinyMLP(6, 8, 4)
    if spec == "branch":
        return BranchNet()
    model = EdgeNet(dtype=dtype_of(spec))
    if not spec.startswith("edge-unused"):
        model.unused.requires_grad_(False)
    return model


def seeded_model(spec, seed, salt=0):
    """A model initialised from ``seed``; EdgeNet's BatchNorm also gets running statistics from
    a batch and a counter float32 cannot hold. With a rank's ``salt`` (``ctx.salt``: at
    grading a number only that rank and the judge know) its values derive from it too, so a
    rank's model can reach another only through the network (a broadcast)."""
    torch.manual_seed(salted_generator(seed, salt).initial_seed())     # (the global RNG)
    model = make_model(spec)
    if spec.startswith("edge"):
        with torch.no_grad():
            model(torch.randn(8, features(spec), dtype=dtype_of(spec)) * 2 + 1)
            model.bn.num_batches_tracked.fill_(COUNTER + 2 * seed + 2 * (salt % 1_000_003))
            if dtype_of(spec) == torch.float64:     # values float32 cannot hold
                for p in model.parameters():
                    p.mul_(1 + 2 ** -40)
    return model


def batch(spec, step, rank, micro=0, salt=0):
    """The local batch (x, y) of ``rank`` at ``step`` (micro-batch ``micro``): with ``salt``
    0 every rank can rebuild every rank's; at grading each rank's salt is a number only it
    was given (``ctx.salt``), and only the judge knows them all."""
    g = salted_generator(10007 * step + 101 * rank + 7 * micro + len(spec), salt)
    classes = 3 if spec == "branch" else 4
    return (torch.randn(LOCAL_BATCH, features(spec), generator=g).to(dtype_of(spec)),
            torch.randint(0, classes, (LOCAL_BATCH,), generator=g))


def dataset():
    """The dataset given to partition_dataset: (x, y, index) triples."""
    g = torch.Generator().manual_seed(5)
    return (torch.randn(DATA_SIZE, 6, generator=g),
            torch.randint(0, 4, (DATA_SIZE,), generator=g), torch.arange(DATA_SIZE))


def named_state(model):
    """``{name: array}`` of the parameters (tied ones once) and buffers."""
    items = list(model.named_parameters()) + list(model.named_buffers())
    return {k: v.detach().cpu().numpy().copy() for k, v in items}


def grad_params(spec):
    """[(name, numel)] of the parameters that get a gradient (tied ones once)."""
    skip = {"unused.weight", "unused.bias", "frozen"}
    return [(n, p.numel()) for n, p in make_model(spec).named_parameters()
            if p.requires_grad and n not in skip]


def grads_of(model):
    return {k: p.grad.detach().cpu().numpy().copy() for k, p in model.named_parameters()
            if p.grad is not None}
