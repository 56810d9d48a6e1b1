"""Notebook 06 on a real network: your DDP stages and torch DDP with the links at 100 Mbit/s,
1 Gbit/s and unshaped.

:mod:`.bench` (the same model, batches and timing) on two hosts of an
:class:`exercise_utils.cluster.Cluster`, one rank each, so the gradients cross a shaped link
instead of loopback. Variants: ``local`` (compute only), ``naive``, ``flat``, ``overlap``,
``bucket <cap>`` and ``torch <cap>`` at one cap (several buckets, so that overlap is
possible), and ``torch default``. Per rate and variant: the median step time, and
``vs_flat``, the median over rounds of the step time relative to ``flat``'s in the same round
(``flat`` starts its one all-reduce after backward: it overlaps nothing, so a ratio below 1
is what overlapping bought). ``comm_ms``: the all-reduces alone; ``hidden_share``: the
part of ``min(compute, communication)`` a variant hid, ``(compute + comm_flat - step) /
min(compute, comm_flat)`` (1: the shorter of the two entirely hidden behind the longer).
Used in 06_build_your_own_ddp (:func:`sweep`, :func:`table`, :func:`plot`).
"""
import statistics

from ..bench import pyplot, save_figure, save_json
from ..config import quick
from . import bench

# None: unshaped (a veth pair: 10-20 Gbit/s); quick mode (the tests) leaves out 1 Gbit/s
RATES = quick(("100mbit", "1gbit", None), ("100mbit", None))
CAP = 5                                 # MiB: 3 buckets of the 12 MB model, 1 of the quick one
# quick: 256 wide (0.8 MB), not the loopback benchmark's 64 (52 kB, which the link's 64 kB
# token bucket would let through at full speed: no link to see)
WIDTH = quick(bench.WIDTH, 256)
WARMUP = 1                              # untimed rounds per rate (connections, DDP's rebuild)
REPEATS = quick(3, 2)                   # timed rounds: one step of every variant each
COMM_REPEATS = quick(2, 1)              # timed rounds of the communication-alone measurement
TIMEOUT = quick(240, 120)               # seconds per rate before the launch is killed
OUT = "results/06_ddp_network.json"


def sweep(work="work/06_myddp.py", rates=RATES, cap=CAP, out=OUT, timeout=TIMEOUT):
    """Run the benchmark on two hosts at every rate; return one row per variant and rate.

    Args:
        work: your file (all five stages implemented).
        rates: link rates (:func:`exercise_utils.links.rate_bits`; None: unshaped).
        cap: the bucket cap (MiB) of ``bucket`` and ``torch``.
        out: JSON file for the rows.
    Returns:
        list[dict]: :mod:`.bench`'s rows with ``rate`` (the name), ``rate_bits`` (bit/s, the
        unshaped link's measured), ``vs_flat`` and ``hidden_share`` added.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster
    args = ["--work", work, "--caps", cap, "--width", WIDTH, "--threads", bench.THREADS,
            "--warmup", WARMUP, "--repeats", REPEATS, "--comm-repeats", COMM_REPEATS]
    rows = []
    for name, bits, got in cluster.each_rate(bench.__name__, args, rates, out,
                                             "every variant", timeout=timeout):
        rows += [dict(r, rate=name, rate_bits=bits) for r in with_flat_ratios(got)]
    save_json(out, rows)
    return rows


def with_flat_ratios(rows):
    """One rate's rows with ``vs_flat`` (paired, see the module docstring) and ``hidden_share``."""
    flat = next(r for r in rows if r["variant"] == "flat")
    compute = flat["compute_ms"]
    shorter = min(compute, flat["comm_ms"])
    out = []
    for r in rows:
        ratio = statistics.median(a / b for a, b in zip(r["step_ms_all"], flat["step_ms_all"]))
        hidden = None if r["kind"] == "local" else (
            (compute + flat["comm_ms"] - r["step_ms"]) / shorter)
        out.append(dict(r, vs_flat=ratio, hidden_share=hidden))
    return out


def table(rows):
    """Markdown table: per variant, step ms and the ratio to flat at every rate."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    by = {(r["variant"], r["rate"]): r for r in rows}
    head = " | ".join(f"{rate}: step ms (vs flat)" for rate in rates)
    out = [f"| variant | all-reduces | {head} |", "|---|---|" + "---|" * len(rates)]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        cells = [f"{by[variant, rate]['step_ms']:.1f} ({by[variant, rate]['vs_flat']:.2f})"
                 for rate in rates]
        out.append(f"| {variant} | {by[variant, rates[0]]['messages']} | {' | '.join(cells)} |")
    comm = " | ".join(f"{by['flat', rate]['comm_ms']:.1f}" for rate in rates)
    out.append(f"| *flat's all-reduce alone* | 1 | {comm} |")
    return "\n".join(out)


def plot(rows, path="results/06_ddp_network.png"):
    """Step time relative to flat's against the link rate, one line per variant."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    by = {(r["variant"], r["rate"]): r for r in rows}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        ax.plot(range(len(rates)), [by[variant, rate]["vs_flat"] for rate in rates],
                marker="o", ls=":" if variant == "local" else "-", label=variant)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rates)), rates)
    ax.set(xlabel="link rate of each host", ylabel="step time / flat's (paired median)",
           title=f"Two hosts, one rank each: {rows[0]['param_mb']:.1f} MB of gradients per step")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, alpha=0.3)
    return save_figure(fig, path)
