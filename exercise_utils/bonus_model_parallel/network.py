r"""Where each parallelism pays, on the cluster: the same model trained data-, tensor- and
pipeline-parallel on two hosts whose link is shaped to 100 Mbit/s and 1 Gbit/s.

Two hosts of an :class:`exercise_utils.cluster.Cluster` (a switch; one rank each, gloo over the
shaped links, one launch per rate, :func:`exercise_utils.cluster.each_rate`) run
:mod:`.network_ranks`, which trains ``DEPTH`` residual blocks ``x + MLP(WIDTH, 4 WIDTH)(x)``
(your ``MLP``, the same weights everywhere) on a batch of ``TOKENS`` rows, mse loss, SGD, three
ways, one step of each per round: ``data`` (half the batch per rank, one all-reduce of the flat
gradient), ``tensor`` (your ``ParallelMLP.from_mlp`` in every block), ``pipeline`` (two stages,
your ``pipeline_step`` with ``one_f_one_b_order(2, MICROBATCHES, rank)``). Each launch::

    python -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
        --rdzv-endpoint=h0:29400 --rdzv-id=dtfs-job --max-restarts=0 \
        -m exercise_utils.bonus_model_parallel.network_ranks --work work/10_model_parallel.py \
        --width 256 --depth 4 --tokens 512 --microbatches 4 --warmup 1 --steps 9 --threads 1 \
        --out results/10_model_parallel_network.json.100mbit.json

(on each host, in its namespaces, as ``Cluster.torchrun`` runs it). ``bytes_per_step`` is
counted by the kernel INSIDE the ranks: each reads its own host's interface counters
(``/sys/class/net/<dev>/statistics/tx_bytes``) after a barrier before and after every timed
step; the two hosts' sums are added (both directions; TCP/IP headers and acknowledgements
included). It comes out about 5 % above the model at 100 Mbit/s and within 1 % at 1 Gbit/s:
TCP hands a veth segments of up to 64 kB (GSO), counted with ONE set of headers, unless the
link's token bucket, which passes no packet larger than its burst (64 kB at 100 Mbit/s,
500 kB at 1 Gbit/s), cuts them into 1500-byte frames, each with its 66 bytes of headers.

The model, :func:`expected_bytes` (P the model's parameter bytes, A = TOKENS x WIDTH x 4 the
bytes of one activation, N = 2 ranks): gloo's ring all-reduce of B bytes has each rank send
2 (N-1)/N B, 2 (N-1) B on the links in all, 2 B at N = 2, so

* ``data``: one all-reduce of the gradient: 2 (N-1) P;
* ``tensor``: per block one all-reduce of the activation in the forward (g) and one of its
  gradient in the backward (f), except the first block's f (the input needs no gradient):
  2 (N-1) (2 DEPTH - 1) A;
* ``pipeline``: every activation crosses the border forward and its gradient backward, m
  micro-batches of A/m each, plus the reference's 80-byte header per micro-batch:
  (N-1) (2 A + 80 m).

``step_ms``: median of the slowest rank's step; ``compute_ms``: the same arithmetic with no
communication (:mod:`.network_ranks`; the pipeline's without its bubble), measured in the
same rounds; ``compute_bytes_per_step``: what the barrier after such a step sent (the
baseline, ~0.9 kB, inside every mode's count too); ``wire_ms``: the time the expected bytes
need on the link at its rate, each direction carrying half of them at once.
``loss``: the first step's (the same weights: equal in all three modes up to rounding),
``loss_last``: the last step's. Used in 10_bonus_model_parallel (:func:`sweep`,
:func:`table`, :func:`plot`).
"""
from ..bench import OtherLoad, load_note, pyplot, record_load, save_figure, save_json
from ..config import quick

RATES = quick(("100mbit", "1gbit"), ("100mbit",))   # each host's link, both directions
WIDTH, DEPTH, TOKENS = 256, 4, 512   # 8.4 MB of parameters; an activation is 0.5 MB
MICROBATCHES = 4                     # m of the pipeline
WARMUP = 1                           # untimed rounds (connections, first allocations)
STEPS = quick(9, 3)                  # timed rounds: one step of each mode (and compute) each
TIMEOUT = quick(150, 100)            # seconds per rate before the launch is killed
HEADER_BYTES = 80                    # the reference pipeline_step's header: 10 int64
MODES = ("data", "tensor", "pipeline")
OUT = "results/10_model_parallel_network.json"


def expected_bytes(mode, param_bytes, activation_bytes, depth, microbatches, world=2):
    """Bytes a step puts on the links, both directions together (see the module docstring)."""
    ring = 2 * (world - 1)               # bytes on the links per byte all-reduced
    if mode == "data":
        return ring * param_bytes
    if mode == "tensor":
        return ring * (2 * depth - 1) * activation_bytes
    if mode == "pipeline":
        return (world - 1) * (2 * activation_bytes + HEADER_BYTES * microbatches)
    raise ValueError(f"unknown mode {mode!r}")


def sweep(work="work/10_model_parallel.py", rates=RATES, out=OUT, timeout=TIMEOUT):
    """Run the three modes on two hosts at every rate; return one row per mode and rate.

    Args:
        work: your file (``MLP``, ``ParallelMLP``, ``one_f_one_b_order``, ``pipeline_step``).
        rates: link rates (:func:`exercise_utils.links.rate_bits`; None: unshaped).
        out: JSON file for the rows.
        timeout: seconds per rate before its launch is killed.
    Returns:
        list[dict]: ``mode``, ``rate`` (its name), ``rate_bits`` (bit/s; the unshaped link's
        as measured), ``bytes_per_step`` (measured), ``expected_bytes``, ``bytes_ratio``
        (measured / expected), ``step_ms``, ``compute_ms``, ``wire_ms``, ``loss``,
        ``loss_last``, the sizes, ``step_ms_all``, ``losses`` and the load record.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster
    args = ["--work", work, "--width", WIDTH, "--depth", DEPTH, "--tokens", TOKENS,
            "--microbatches", MICROBATCHES, "--warmup", WARMUP, "--steps", STEPS,
            "--threads", 1]
    rows = []
    with OtherLoad() as load:
        for name, bits, got in cluster.each_rate(f"{__package__}.network_ranks", args, rates,
                                                 out, "data, tensor and pipeline parallel",
                                                 timeout=timeout):
            for r in got:
                expected = expected_bytes(r["mode"], r["param_bytes"], r["activation_bytes"],
                                          r["depth"], r["microbatches"], r["world_size"])
                rows.append(dict(r, rate=name, rate_bits=bits, expected_bytes=expected,
                                 bytes_ratio=r["bytes_per_step"] / expected,
                                 wire_ms=1e3 * 8 * expected / r["world_size"] / bits))
    rows = record_load(rows, load)
    save_json(out, rows)
    return rows


def winners(rows):
    """``{rate: mode}``: the mode with the shortest step at each rate."""
    best = {}
    for r in rows:
        if r["rate"] not in best or r["step_ms"] < best[r["rate"]]["step_ms"]:
            best[r["rate"]] = r
    return {rate: r["mode"] for rate, r in best.items()}


def table(rows):
    """Markdown table: per mode the bytes per step expected and measured (MB), the step time
    at every rate (and the link's share of it, ``wire_ms``), compute alone, the loss; a last
    line with the fastest mode at each rate; the load record."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    by = {(r["mode"], r["rate"]): r for r in rows}
    modes = [m for m in MODES if any(k[0] == m for k in by)]
    head = " | ".join(f"{rate}: MB measured | {rate}: step ms (link ms)" for rate in rates)
    out = [f"| mode | MB/step expected | {head} | compute ms | loss (1st step) |",
           "|---|---:|" + "---:|---:|" * len(rates) + "---:|---:|"]
    for mode in modes:
        first = by[mode, rates[0]]
        cells = " | ".join(f"{by[mode, rate]['bytes_per_step'] / 1e6:.2f} "
                           f"({by[mode, rate]['bytes_ratio']:.2f}x) | "
                           f"{by[mode, rate]['step_ms']:.0f} ({by[mode, rate]['wire_ms']:.0f})"
                           for rate in rates)
        compute = min(by[mode, rate]["compute_ms"] for rate in rates)
        out.append(f"| {mode} | {first['expected_bytes'] / 1e6:.2f} | {cells} | "
                   f"{compute:.0f} | {first['loss']:.6f} |")
    win = winners(rows)
    cells = ["**fastest**", ""] + [c for rate in rates for c in ("", f"**{win[rate]}**")]
    out.append("| " + " | ".join(cells + ["", ""]) + " |")
    return "\n".join(out) + load_note(rows)


def plot(rows, path="results/10_model_parallel_network.png"):
    """Step time per mode against the link rate (log scale; dotted: its compute alone)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    rates = sorted(dict.fromkeys(r["rate"] for r in rows),
                   key=lambda rate: next(r["rate_bits"] for r in rows if r["rate"] == rate))
    by = {(r["mode"], r["rate"]): r for r in rows}
    x = list(range(len(rates)))
    for i, mode in enumerate(m for m in MODES if (m, rates[0]) in by):
        mb = by[mode, rates[0]]["bytes_per_step"] / 1e6
        ax.plot(x, [by[mode, rate]["step_ms"] for rate in rates], marker="o", color=f"C{i}",
                label=f"{mode} ({mb:.1f} MB/step)")
        ax.plot(x, [by[mode, rate]["compute_ms"] for rate in rates], ls=":", marker="_", markersize=14,
                color=f"C{i}")
    ax.set_xticks(x, rates)
    if len(x) == 1:
        ax.set_xlim(-0.5, 0.5)
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.minorticks_off()
    ax.set_yticks([t for t in (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
                   if low <= t <= high] or [low, high])
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    first = rows[0]
    ax.set(xlabel="link rate of each host", ylabel="median step time (ms)",
           title=f"Two hosts: {first['depth']} MLP blocks of width {first['width']}, "
                 f"{first['tokens']} rows\n(dotted: the same arithmetic, no communication)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return save_figure(fig, path)
