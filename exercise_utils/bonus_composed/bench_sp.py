r"""Notebook 11's sequence-parallel measurement: what your ``SequenceParallelNormMLP`` keeps for
the backward against the same block with tensor parallelism only, and the collectives each
makes.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_composed.bench_sp \
        --work work/11_composed.py --out results/11_composed_sp_2.json

On t ranks, the notebook's ``NormMLP`` (width ``D``, hidden ``HIDDEN``, seed 0) on ``S`` x
``BATCH`` tokens (float32), two ways:

* ``sp``: your ``SequenceParallelNormMLP.from_block`` on this rank's ``S/t`` rows;
* ``tp``: tensor parallelism only, every rank on all ``S`` rows: the norm, your
  ``CopyToGroup`` ("f"), the rank's rows of fc1 and columns of fc2, your ``ReduceFromGroup``
  ("g"), fc2's bias once, the residual.

Per variant, rank 0's row: ``kept_norm``, the bytes the forward kept for the backward while the
norm ran (a saved-tensors hook: every floating-point tensor autograd saved, parameters and
tensors saved twice counted once), ``kept_rest`` those kept elsewhere (the matrices, the
activation), ``kept`` both; ``ring_fwd`` and ``ring_bwd``, the bytes per rank the recorded
collectives move on a ring (the core's :class:`~exercise_utils.recorder.Recorder`: an
all-reduce of N numbers 2 (t-1)/t N, an all-gather of N (t-1)/t N, a reduce-scatter into N/t
(t-1)/t N; what NCCL does, whereas gloo's reduce-scatter is an all-reduce that keeps its
part), and the calls. Rank 0 writes JSON. Used in 11_bonus_composed (:func:`run`,
:func:`table`).
"""
from ..bench import script_parser
from ..config import quick

WORLD_SIZES = quick((2, 4), (2,))
S = quick(1024, 256)                    # tokens of the sequence (t divides it)
BATCH, D, HIDDEN = 2, 256, 1024
THREADS = 1
PG_TIMEOUT_S = 120
TIMEOUT = quick(240, 150)
VARIANTS = ("tp", "sp")
RING = {"all_reduce": lambda n, t: 2 * (t - 1) / t * n,
        "all_gather_into_tensor": lambda n, t: (t - 1) / t * n,
        "all_gather": lambda n, t: (t - 1) / t * n,
        "reduce_scatter_tensor": lambda n, t: (t - 1) * n,
        "reduce_scatter": lambda n, t: (t - 1) * n}


def parse_args(argv=None):
    return script_parser("sequence against tensor parallelism on t gloo ranks",
                         "work/11_composed.py", "results/11_composed_sp.json",
                         {"seq": S, "threads": THREADS}).parse_args(argv)


def tensor_parallel(student, block, group):
    """``block`` with tensor parallelism only, from your "f" and "g" (a module)."""
    import copy

    import torch
    import torch.nn.functional as F
    r, t = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
    k = block.fc1.out_features // t
    rows = slice(r * k, (r + 1) * k)

    class TensorParallelNormMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.act = copy.deepcopy(block.norm), copy.deepcopy(block.act)
            self.w1 = torch.nn.Parameter(block.fc1.weight.detach()[rows].clone())
            self.b1 = torch.nn.Parameter(block.fc1.bias.detach()[rows].clone())
            self.w2 = torch.nn.Parameter(block.fc2.weight.detach()[:, rows].clone())
            self.b2 = torch.nn.Parameter(block.fc2.bias.detach().clone())

        def forward(self, x):
            h = student.CopyToGroup.apply(self.norm(x), group)
            h = self.act(F.linear(h, self.w1, self.b1))
            return x + student.ReduceFromGroup.apply(F.linear(h, self.w2), group) + self.b2
    return TensorParallelNormMLP()


def saving(params, count):
    """A saved-tensors hook context that calls ``count(nbytes)`` once for each distinct
    floating-point tensor autograd saves that is not a parameter (``params``: their data
    pointers); tensors saved twice count once. Used here and by :mod:`.bench_memory`."""
    import torch
    seen = set()

    def pack(tensor):
        key = (tensor.data_ptr(), tensor.numel())
        if tensor.is_floating_point() and tensor.data_ptr() not in params and key not in seen:
            seen.add(key)
            count(tensor.numel() * tensor.element_size())
        return tensor
    return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)


def kept_and_calls(student, module, x, t):
    """``(kept_norm, kept_rest, forward calls, backward calls)`` of one step of ``module``."""
    import torch
    from ..recorder import Recorder
    params = {p.data_ptr() for p in module.parameters()}
    kept, where = {"norm": 0, "rest": 0}, ["rest"]
    hooks = [module.norm.register_forward_pre_hook(lambda *a: where.__setitem__(0, "norm")),
             module.norm.register_forward_hook(lambda *a: where.__setitem__(0, "rest"))]

    def count(nbytes):
        kept[where[0]] += nbytes
    rec = Recorder()
    rec.install(student)
    try:
        with saving(params, count):
            y = module(x)
        forward = [(e[1], e[2]) for e in rec.take() if e[0] == "coll"]
        y.backward(torch.ones_like(y))
        backward = [(e[1], e[2]) for e in rec.take() if e[0] == "coll"]
    finally:
        rec.uninstall()
        for h in hooks:
            h.remove()
    return kept["norm"], kept["rest"], forward, backward


def ring_bytes(calls, t, item=4):
    return sum(RING[kind](n, t) * item for kind, n in calls)


def variant_row(student, args, rank, world, variant):
    import torch
    import torch.distributed as dist
    torch.manual_seed(0)
    block = student.NormMLP(D, HIDDEN)
    x = torch.randn(args.seq, BATCH, D, generator=torch.Generator().manual_seed(1))
    group = dist.group.WORLD
    if variant == "sp":
        k = args.seq // world
        module, x = student.SequenceParallelNormMLP.from_block(block, group), x[rank * k:
                                                                               (rank + 1) * k]
    else:
        module = tensor_parallel(student, block, group)
    x = x.clone().requires_grad_(True)
    norm, rest, forward, backward = kept_and_calls(student, module, x, world)
    return {"world_size": world, "variant": variant, "seq": args.seq, "batch": BATCH,
            "width": D, "hidden": HIDDEN, "kept_norm": norm, "kept_rest": rest,
            "kept": norm + rest, "ring_fwd": ring_bytes(forward, world),
            "ring_bwd": ring_bytes(backward, world), "calls_fwd": forward,
            "calls_bwd": backward}


def benchmark(student, args, rank, world):
    """This rank's rows: one per variant (rank 0's are written)."""
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)  # (torch 2.14: *_single names)
    return [variant_row(student, args, rank, world, v) for v in VARIANTS]


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    from ..bench import rank_rows
    rank_rows(benchmark, parse_args(argv), PG_TIMEOUT_S)


def run(work="work/11_composed.py", out="results/11_composed_sp.json",
        world_sizes=WORLD_SIZES, echo=True, timeout=TIMEOUT):
    """Launch the measurement on the student's ``work``, once per t; return the rows (also
    written to ``out``)."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work], timeout, echo, THREADS,
                         env=None)


def summary(rows):
    """One row per t: sp's kept bytes over tp's (the norm's region, the rest, the whole), and
    the ring bytes of each (forward and backward together)."""
    out = []
    for t in sorted({r["world_size"] for r in rows}):
        by = {r["variant"]: r for r in rows if r["world_size"] == t}
        sp, tp = by["sp"], by["tp"]
        out.append({"world_size": t, "norm_ratio": sp["kept_norm"] / tp["kept_norm"],
                    "rest_ratio": sp["kept_rest"] / tp["kept_rest"],
                    "kept_ratio": sp["kept"] / tp["kept"],
                    "tp_mb": (tp["ring_fwd"] + tp["ring_bwd"]) / 1e6,
                    "sp_mb": (sp["ring_fwd"] + sp["ring_bwd"]) / 1e6,
                    "bytes_ratio": (sp["ring_fwd"] + sp["ring_bwd"])
                    / (tp["ring_fwd"] + tp["ring_bwd"])})
    return out


COLUMNS = [("world_size", "t"), ("norm_ratio", "kept in the norm: sp / tp"),
           ("rest_ratio", "kept elsewhere: sp / tp"), ("kept_ratio", "whole block: sp / tp"),
           ("tp_mb", "tp MB/rank (ring)"), ("sp_mb", "sp MB/rank (ring)"),
           ("bytes_ratio", "sp / tp bytes")]
FORMATS = {"norm_ratio": ".3f", "rest_ratio": ".3f", "kept_ratio": ".3f", "tp_mb": ".2f",
           "sp_mb": ".2f", "bytes_ratio": ".3f"}


def table(rows):
    """The summary as text."""
    from ..bench import format_table, load_note
    return format_table(summary(rows), COLUMNS, FORMATS) + load_note(rows)


if __name__ == "__main__":
    main()
