"""Notebook 06's benchmark: your DDP stages against ``torch.nn.parallel.DistributedDataParallel``.

A torchrun script, 2 gloo ranks on CPU (one thread each), importing the student file::

    python -m torch.distributed.run --nproc-per-node 2 -m exercise_utils.build_your_own_ddp.bench \
        --work work/06_myddp.py --out results/06_ddp_bench.json

It times a training step (zero_grad, forward, backward, sync, SGD step) of a ~13 MB MLP with
50 parameter tensors for: ``local`` (no sync: compute only), ``naive``, ``flat``, ``overlap``,
``bucket <cap>`` (caps swept), ``torch <cap>`` (same caps) and ``torch default`` (DDP without
a cap: a 1 MiB first bucket, then 25 MiB; the reference of the ratios). Same initial weights
and per-rank batches for all; they take turns step by step (order rotated each round) so
the noise falls on all alike. ``step_ms``: median over rounds of the slowest rank's step.
``comm_ms``: the variant's all-reduces ALONE (same count and sizes: per parameter, one flat
buffer, per bucket; one after the other for naive and flat, all started then awaited
otherwise; no compute, no copies); ``comm_share = comm_ms / step_ms``. ``exposed_share =
1 - compute_ms / step_ms`` (``compute_ms``: the local step): the share of the step that
compute does not explain (communication not hidden, copies, waits). Sanity: ``rank_diff``
(largest parameter difference between the ranks), ``torch_diff`` (from ``torch default``).
Rank 0 writes JSON. Used in 06_build_your_own_ddp (:func:`run`, :func:`table`, :func:`plot`).
"""
import json
import statistics
import sys
import time
from pathlib import Path

from ..bench import OtherLoad, pyplot, rank_rows, record_load, save_figure, script_parser
from ..config import quick

WIDTH = quick(512, 64)          # features of each hidden layer (Linear width x width)
DEPTH = quick(12, 3)            # hidden blocks Linear + LayerNorm + ReLU: 4 tensors each
BATCH = quick(256, 8)           # examples per rank and step
CAPS = quick((1, 5, 25), (0.01, 25))   # bucket caps in MiB, for BucketDDP and torch DDP
WARMUP = quick(3, 2)            # untimed rounds (torch DDP rebuilds its buckets in them)
REPEATS = quick(15, 3)          # timed rounds: one step of every variant each
COMM_REPEATS = quick(10, 2)     # timed rounds of the communication-alone measurement
LR = 0.01                       # SGD with momentum
THREADS = 1                     # torch threads per rank (2 ranks on 2 cores)
PG_TIMEOUT_S = quick(60, 30)    # gloo timeout: a missing collective fails instead of hanging
TIMEOUT = quick(120, 90)        # seconds before a launch is declared hung and killed
REFERENCE = "torch default"     # the variant ratios are taken to


def parse_args(argv=None):
    """Command-line settings of the launched script (defaults: the module constants)."""
    p = script_parser("naive / flat / overlap / buckets vs torch DDP", "work/06_myddp.py",
                      "results/06_ddp_bench.json",
                      {"width": WIDTH, "depth": DEPTH, "batch": BATCH, "warmup": WARMUP,
                       "repeats": REPEATS, "comm-repeats": COMM_REPEATS, "threads": THREADS})
    p.add_argument("--caps", type=float, nargs="+", default=list(CAPS))
    return p.parse_args(argv)


def build_model(width, depth, classes=10):
    """The benchmark's MLP: ``depth`` blocks Linear + LayerNorm + ReLU, then a Linear head."""
    import torch.nn as nn
    blocks = [(nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()) for _ in range(depth)]
    return nn.Sequential(*[m for block in blocks for m in block], nn.Linear(width, classes))


def make_variants(ddp, args, x, y):
    """Every variant, from the same initial weights, as a dict: name, kind, cap, module (the
    bare model), step (one training step on ``x, y``), messages (element counts of its
    all-reduces, or a function giving them after the warm-up), async."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    def variant(name, kind, wrapped, module, opt, finish, messages, is_async, cap=None):
        def step():
            opt.zero_grad()
            F.cross_entropy(wrapped(x), y).backward()
            if finish:
                finish()
            opt.step()
        return dict(name=name, kind=kind, cap=cap, module=module, step=step,
                    messages=messages, is_async=is_async)

    def fresh():
        torch.manual_seed(0)                      # the same weights for every variant
        return build_model(args.width, args.depth)

    sgd = lambda model: torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)  # noqa: E731
    model = fresh()
    sizes = [p.numel() for p in model.parameters()]
    out = [variant("local", "local", model, model, sgd(model), None, [], False)]
    for strategy, msgs in (("naive", sizes), ("flat", [sum(sizes)])):
        model = fresh()
        ddp.broadcast_parameters(model)
        opt = ddp.DistributedOptimizer(sgd(model), model, strategy=strategy)
        out.append(variant(strategy, strategy, model, model, opt, None, msgs, False))
    wrapped = ddp.OverlapDDP(fresh())
    out.append(variant("overlap", "overlap", wrapped, wrapped.module, sgd(wrapped),
                       wrapped.finish_gradient_synchronization, sizes, True))
    for cap in args.caps:
        wrapped = ddp.BucketDDP(fresh(), bucket_cap_mb=cap)
        numel = {n: p.numel() for n, p in wrapped.module.named_parameters()}
        msgs = [sum(numel[n] for n in bucket) for bucket in wrapped.buckets]
        out.append(variant(f"bucket {cap:g}", "bucket", wrapped, wrapped.module, sgd(wrapped),
                           wrapped.finish_gradient_synchronization, msgs, True, cap))
    for cap in [*args.caps, None]:
        wrapped = DDP(fresh(), bucket_cap_mb=cap)
        out.append(variant("torch default" if cap is None else f"torch {cap:g}", "torch",
                           wrapped, wrapped.module, sgd(wrapped), None,
                           lambda m=wrapped: torch_messages(m), True, cap))
    return out


def torch_messages(model):
    """Element counts of DDP's buckets after its first iterations (it rebuilds them then)."""
    data = model._get_ddp_logging_data()            # private: what DDP logs about itself
    text = data.get("rebuilt_bucket_sizes") or data["bucket_sizes"]
    return [int(b) // 4 for b in text.split(",")]   # float32 bytes -> elements


def time_rounds(fns, rounds, warmup):
    """Round-robin timing: ``fns`` take turns (rotated order); per-rank seconds, one list each."""
    import torch.distributed as dist
    for fn in list(fns) * warmup:
        fn()
    times = [[] for _ in fns]
    for r in range(rounds):
        for i in [(r + j) % len(fns) for j in range(len(fns))]:
            dist.barrier()
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return times


def slowest_rank(values):
    """Nested lists of per-rank numbers -> element-wise max over the ranks (one all-reduce)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def comm_alone(messages, is_async):
    """A function doing the all-reduces of ``messages`` (element counts), and nothing else."""
    import torch
    import torch.distributed as dist
    buffers = [torch.randn(n) for n in messages]

    def fn():
        for work in [dist.all_reduce(b, async_op=is_async) for b in buffers]:
            if work is not None:                   # blocking calls return None
                work.wait()
    return fn


def benchmark(ddp, args, rank, world):
    """Run every variant; return the result rows (the same on every rank)."""
    import torch
    import torch.distributed as dist
    gen = torch.Generator().manual_seed(1000 + rank)          # different data on each rank
    x = torch.randn(args.batch, args.width, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    variants = make_variants(ddp, args, x, y)
    times = slowest_rank(time_rounds([v["step"] for v in variants], args.repeats, args.warmup))
    msgs = [v["messages"]() if callable(v["messages"]) else v["messages"] for v in variants]
    synced = [i for i, m in enumerate(msgs) if m]              # local has no messages
    comm = slowest_rank(time_rounds([comm_alone(msgs[i], variants[i]["is_async"])
                                     for i in synced], args.comm_repeats, 1))
    flat = [torch.cat([p.detach().reshape(-1) for p in v["module"].parameters()])
            for v in variants]
    ref = flat[[v["name"] for v in variants].index(REFERENCE)]
    roots = [f.clone() for f in flat]                         # rank 0's parameters, everywhere
    for root in roots:
        dist.broadcast(root, 0)
    diffs = slowest_rank([[float((f - root).abs().max()), float((f - ref).abs().max())]
                          for f, root in zip(flat, roots)])
    compute = statistics.median(times[0])
    rows = []
    for i, v in enumerate(variants):
        step = statistics.median(times[i])
        comm_ms = 1e3 * statistics.median(comm[synced.index(i)]) if i in synced else None
        rows.append({
            "variant": v["name"], "kind": v["kind"], "cap_mb": v["cap"], "async": v["is_async"],
            "messages": len(msgs[i]), "step_ms": 1e3 * step, "compute_ms": 1e3 * compute,
            "step_ms_all": [1e3 * t for t in times[i]], "exposed_share": 1 - compute / step,
            "comm_ms": comm_ms, "comm_share": None if comm_ms is None else comm_ms / (1e3 * step),
            "rank_diff": diffs[i][0], "torch_diff": diffs[i][1], "batch": args.batch,
            "world_size": world, "threads": torch.get_num_threads(),
            "param_mb": flat[i].nbytes / 2**20, "param_tensors": len(msgs[1])})
    return rows


def main(argv=None):
    """Entry point of every rank started by torchrun (see the module docstring): rank 0
    writes the rows (:func:`exercise_utils.bench.rank_rows`) and prints their table."""
    rank, rows = rank_rows(benchmark, parse_args(argv), PG_TIMEOUT_S)
    if rank == 0:
        print(table(rows), flush=True)


def run(work="work/06_myddp.py", out="results/06_ddp_bench.json", extra=(), echo=True,
        timeout=TIMEOUT):
    """Launch the benchmark on 2 ranks (one thread each) and return its rows.

    Args:
        work: the student's file; out: the JSON file the script writes (removed first).
        extra: more script options, e.g. ``("--repeats", "25", "--caps", "2", "8")``.
        echo: print the output live; timeout: seconds before the launch is killed.
    Returns:
        list[dict]: one row per variant (see the module docstring for the fields);
        ``wall_s`` is the whole launch, start-up included.
    """
    from .. import launch
    out = Path(out)
    out.unlink(missing_ok=True)
    args = ["--work", str(work), "--threads", str(THREADS), "--out", str(out), *map(str, extra)]
    with OtherLoad() as load:
        res = launch.torchrun(__name__, 2, args, extra=["-m"], timeout=timeout, echo=echo,
                              threads_per_process=THREADS,
                              what=f"`torchrun --nproc-per-node 2 -m {__name__}`")
    return record_load([dict(r, wall_s=res.seconds) for r in json.loads(out.read_text())["rows"]],
                       load)


def with_ratios(rows):
    """The rows with ``vs_torch`` (step time relative to ``torch default``'s) and, for buckets,
    ``vs_torch_same_cap`` (to torch DDP's with the same cap): each the median over rounds of
    the ratio within a round (paired, so a change of load between rounds cancels out)."""
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    torch_caps = {r["cap_mb"]: r for r in rows if r["kind"] == "torch"}

    def ratio(r, other):
        return None if other is None else statistics.median(
            a / b for a, b in zip(r["step_ms_all"], other["step_ms_all"]))
    return [dict(r, vs_torch=ratio(r, ref), vs_torch_same_cap=ratio(
        r, torch_caps.get(r["cap_mb"]) if r["kind"] == "bucket" else None),
        replicas_equal=r["rank_diff"] == 0 if r["kind"] != "local" else None) for r in rows]


COLUMNS = [("variant", "variant"), ("messages", "all-reduces"), ("step_ms", "step ms"),
           ("vs_torch", "vs torch DDP"), ("vs_torch_same_cap", "vs torch same cap"),
           ("comm_ms", "comm alone ms"), ("comm_share", "comm share"),
           ("exposed_share", "exposed share"), ("replicas_equal", "replicas equal"),
           ("torch_diff", "|w - w_torch|")]
FORMATS = {"step_ms": ".1f", "vs_torch": ".2f", "vs_torch_same_cap": ".2f", "comm_ms": ".1f",
           "comm_share": ".0%", "exposed_share": ".0%", "torch_diff": ".1e"}


def table(rows):
    """Text table of the rows with their ratios to torch DDP (see :func:`with_ratios`)."""
    from ..bench import format_table, load_note
    return format_table(with_ratios(rows), COLUMNS, FORMATS) + load_note(rows)


def plot(rows, path="results/06_ddp_bench.png"):
    """Bars: step time relative to torch DDP's (dashed line: 1), the compute-only part blue."""
    plt = pyplot()
    rows = [r for r in with_ratios(rows) if r["vs_torch"] is not None]
    ref = next(r["step_ms"] for r in rows if r["variant"] == REFERENCE)
    names, ratios = [r["variant"] for r in rows], [r["vs_torch"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.barh(names, ratios, color="tab:orange", label="rest: communication not hidden, copies")
    ax.barh(names, [q * min(1, r["compute_ms"] / r["step_ms"]) for q, r in zip(ratios, rows)],
            color="tab:blue", label="compute only (the local step)")
    for i, ratio in enumerate(ratios):
        ax.text(ratio, i, f" {ratio:.2f}", va="center", fontsize=8)
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.invert_yaxis()
    ax.set(xlim=(0, 1.12 * max(ratios)),
           xlabel=f"step time / torch DDP's (median of paired ratios; torch: {ref:.0f} ms)",
           title=f"{rows[0]['world_size']} gloo ranks on CPU, {rows[0]['param_mb']:.1f} MB model")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)


if __name__ == "__main__":
    main(sys.argv[1:])
