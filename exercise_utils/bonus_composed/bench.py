r"""Notebook 11's benchmark: your ring attention measured on c gloo ranks, the balanced split
against the contiguous one, causal.

A torchrun script on gloo ranks (CPU, one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 \
        -m exercise_utils.bonus_composed.bench \
        --work work/11_composed.py --out results/11_composed_bench_2.json

One row per rank and layout (``"balanced"``: ``balanced_positions``; ``"contiguous"``:
``arange(S)`` in c chunks) of a launch of c ranks, the same whole sequence of ``S`` tokens
(``B`` x ``H`` heads of ``HD`` features, float32, causal):

* ``kept_bytes``: what the forward kept for the backward on this rank (the tensors the autograd
  node saved or holds), beside ``one_process_bytes``, the same measure with the whole sequence
  on one rank (its q, k, v, output and log-sum-exp): the memory of attention per rank;
* ``entries``: the query x key entries this rank's ``block_forward`` calls computed (its work),
  and ``visible``: the entries its queries must see;
* ``step_ms``: forward and backward, the median of ``REPS`` after a warm-up (a barrier before
  each), and ``max_err``: the largest difference of this rank's output from attention over the
  whole sequence in one process (``torch.nn.functional.scaled_dot_product_attention``).

Rank 0 writes JSON. Used in 11_bonus_composed (:func:`run`, :func:`table`, :func:`plot`).
"""
import statistics
import time

from ..bench import script_parser
from ..config import quick

WORLD_SIZES = quick((1, 2, 4), (1, 2))   # c: ranks of the ring, one launch each
S = quick(1024, 256)                     # tokens of the sequence (2c divides it)
B, H, HD = 1, 2, 32
REPS = quick(5, 2)                       # timed steps (median)
THREADS = 1
PG_TIMEOUT_S = 120
TIMEOUT = quick(300, 150)
LAYOUTS = ("balanced", "contiguous")


def parse_args(argv=None):
    return script_parser("ring attention on c gloo ranks", "work/11_composed.py",
                         "results/11_composed_bench.json",
                         {"seq": S, "reps": REPS, "threads": THREADS}).parse_args(argv)


def _kept(node):
    total = sum(t.numel() * t.element_size() for t in node.saved_tensors
                if t.is_floating_point())
    for value in vars(node).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        total += sum(t.numel() * t.element_size() for t in items
                     if hasattr(t, "is_floating_point") and t.is_floating_point())
    return total


def layout_rows(student, args, rank, world, kind):
    """This rank's row for one layout (see the module docstring)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    S_ = args.seq
    gen = torch.Generator().manual_seed(1100)
    q, k, v, up = (torch.randn(B, H, S_, HD, generator=gen) for _ in range(4))
    positions = (student.balanced_positions(S_, world) if kind == "balanced"
                 else list(torch.arange(S_).tensor_split(world)))
    pos = positions[rank]
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, :, pos]
    entries = []
    original = student.block_forward

    def counted(qq, kk, *a, **kw):
        entries.append(qq.shape[-2] * kk.shape[-2])
        return original(qq, kk, *a, **kw)
    student.block_forward = counted

    def step():
        mine = [t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v)]
        out = student.RingAttention.apply(*mine, positions, None, True)
        out.backward(up[:, :, pos])
        return out
    try:
        step()                                             # warm-up
        mine = [t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v)]
        entries.clear()
        out = student.RingAttention.apply(*mine, positions, None, True)
        work, kept = sum(entries), _kept(out.grad_fn)
        out.backward(up[:, :, pos])
        times = []
        for _ in range(args.reps):
            dist.barrier()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    finally:
        student.block_forward = original
    one = 4 * B * H * S_ * HD * 4 + B * H * S_ * 4       # q, k, v, out, lse of the whole
    visible = int((pos + 1).sum())                       # a query at p sees p + 1 keys
    return {"world_size": world, "rank": rank, "layout": kind, "seq": S_, "tokens": len(pos),
            "kept_bytes": kept, "one_process_bytes": one, "memory_ratio": kept / one,
            "entries": work, "visible": visible, "step_ms": 1e3 * statistics.median(times),
            "max_err": float((out.detach() - full).abs().max())}


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring)."""
    args = parse_args(argv)
    from ..bench import gather_rows
    from ..rankworker import gloo_group, load_student
    with gloo_group(PG_TIMEOUT_S, args.threads) as (rank, world):
        start, student = time.perf_counter(), load_student(args.work)
        rows = [layout_rows(student, args, rank, world, kind) for kind in LAYOUTS]
        if rank == 0:
            print(f"{world} ranks: kept {rows[0]['memory_ratio']:.3f} of one process's "
                  f"attention memory", flush=True)
        gather_rows(rows, args, world, start)


def run(work="work/11_composed.py", out="results/11_composed_bench.json",
        world_sizes=WORLD_SIZES, extra=(), echo=True, timeout=TIMEOUT):
    """Launch the benchmark on the student's ``work``, once per ring size; return all the rows
    (also written to ``out``)."""
    from ..bench import torchrun_rows
    return torchrun_rows(__name__, world_sizes, out, ["--work", work, *extra], timeout, echo,
                         THREADS, env=None)


def summary(rows):
    """One row per (c, layout): the largest kept share, the work of the busiest and of the
    idlest rank (and their ratio), the slowest rank's step, the largest error."""
    out = []
    for world in sorted({r["world_size"] for r in rows}):
        for kind in LAYOUTS:
            mine = [r for r in rows if (r["world_size"], r["layout"]) == (world, kind)]
            if not mine:
                continue
            most, least = max(r["entries"] for r in mine), min(r["entries"] for r in mine)
            out.append({"world_size": world, "layout": kind,
                        "memory_ratio": max(r["memory_ratio"] for r in mine),
                        "entries_max": most, "entries_min": least,
                        "imbalance": most / least if least else None,
                        "visible_max": max(r["visible"] for r in mine),
                        "step_ms": max(r["step_ms"] for r in mine),
                        "max_err": max(r["max_err"] for r in mine)})
    return out


COLUMNS = [("world_size", "c"), ("layout", "split"), ("memory_ratio", "kept / one process"),
           ("entries_max", "busiest rank's entries"), ("entries_min", "idlest's"),
           ("imbalance", "busiest / idlest"), ("step_ms", "slowest step ms"),
           ("max_err", "max error")]
FORMATS = {"memory_ratio": ".3f", "imbalance": ".2f", "step_ms": ".1f", "max_err": ".1e"}


def table(rows):
    """The summary as text."""
    from ..bench import format_table, load_note
    return format_table(summary(rows), COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/11_composed_bench.png"):
    """What the forward keeps per rank, as a share of one process's, against c (and 1/c)."""
    from ..bench import line_plot
    s = summary(rows)
    worlds = sorted({r["world_size"] for r in s})
    series = {kind: ([r["world_size"] for r in s if r["layout"] == kind],
                     [r["memory_ratio"] for r in s if r["layout"] == kind]) for kind in LAYOUTS}
    series["1/c"] = (worlds, [1 / c for c in worlds])
    return line_plot(series, "c (ranks of the ring)", "kept for the backward / one process's",
                     "ring attention: memory per rank", path, logx=True, xticks=worlds)


if __name__ == "__main__":
    main()
