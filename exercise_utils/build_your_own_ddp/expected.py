"""The buckets notebook 06's BucketDDP must build: the judge's side, never imported by a rank
(the probes import only :mod:`.reference`'s models and batches; at grading the sandbox hides
this module from the ranks).

Used in 06_build_your_own_ddp (:mod:`.checks_overlap`).
"""
from .reference import make_model


def pack(nbytes, cap, over=lambda used, cap: used > cap):
    """The greedy packing of the notebook: indices of ``nbytes`` (in the order given) into
    buckets; an item joins the current bucket unless that would take its bytes ``over`` the
    cap (an item larger than the cap gets a bucket of its own; no bucket is empty)."""
    buckets, used = [], 0
    for i, size in enumerate(nbytes):
        if buckets and not over(used + size, cap):
            buckets[-1].append(i)
            used += size
        else:
            buckets.append([i])
            used = size
    return buckets


def expected_buckets(spec, cap, element_size=None, over=lambda used, cap: used > cap):
    """BucketDDP's buckets (names) for ``spec``'s model and a cap of ``cap`` bytes: the
    parameters that require a gradient in reverse registration order, :func:`pack`-ed;
    ``element_size`` and ``over`` give the buckets of mistaken rules (4 bytes per element; a
    bucket closed when it reaches the cap)."""
    named = [(n, p) for n, p in make_model(spec).named_parameters() if p.requires_grad][::-1]
    nbytes = [p.numel() * (element_size or p.element_size()) for _, p in named]
    return [[named[i][0] for i in bucket] for bucket in pack(nbytes, cap, over)]
