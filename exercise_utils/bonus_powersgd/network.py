"""PowerSGD on a real network: step time against the link rate, and the break-even rate.

The training of :mod:`.experiments` (the same model, data and settings), on two hosts of an
:class:`exercise_utils.cluster.Cluster` with one worker each, every host's link shaped to
100 Mbit/s, 1 Gbit/s or left unshaped (a veth pair: about 10 Gbit/s). Per method and rate
it reports the median step time (forward, backward, communication and update; the first
steps, sent uncompressed or warming up, left out).

A step costs ``t = c + V / R`` at link rate ``R``: ``c`` what does not depend on the link
(computing, compressing, per-message latencies), ``V`` the bits that cross it. Two shaped
rates give both for every method (:func:`fit`), and the *break-even rate*, above which
compression no longer pays, is where PowerSGD's line meets uncompressed training's:
``R* = (V_u - V_p) / (c_p - c_u)`` (:func:`break_even`). Used in 08_bonus_powersgd.
"""
import json
import statistics
from pathlib import Path

from ..bench import pyplot, save_figure
from ..config import quick
from . import experiments

RATES = ("100mbit", "1gbit", None)      # None: unshaped
BITS = {"100mbit": 1e8, "1gbit": 1e9}
TRAIN_SIZE = quick(2560, 1280)          # 2 workers x batch 32: 40 (quick: 20) steps each
SKIP = 3                                # first steps left out of the median (start-up, warm-up)


def sweep(student="work/08_powersgd.py", ranks=experiments.RANKS, rates=RATES,
          out="results/08_network.json", timeout=180):
    """Run the training at every rate on two hosts; return one row per method, rank and rate.

    Args:
        student: the file with your ``PowerSGD``.
        ranks: PowerSGD ranks r (yours).
        rates: link rates (:mod:`exercise_utils.cluster`; None: unshaped).
        out: JSON file for the rows.
    Returns:
        list[dict]: ``method``, ``rank``, ``rate``, ``step_s`` (median), ``bytes_per_step``.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster
    rows = []
    with cluster.Cluster(2) as net:
        for rate in rates:
            net.shape(rate)
            path = Path(f"{out}.{rate or 'unshaped'}.json")
            path.unlink(missing_ok=True)
            args = ["--student", student, "--ranks", *map(str, ranks), "--methods",
                    "uncompressed", "yours", "--epochs", "1", "--train-size", str(TRAIN_SIZE),
                    "--test-size", "64", "--threads", "1", "--out", str(path)]
            print(f"link {rate or 'unshaped'}: {len(ranks) + 1} trainings on h0 and h1 ...",
                  flush=True)
            net.torchrun(experiments.__name__, 1, args, module=True, timeout=timeout,
                         echo=False, threads_per_process=1, what=f"the training at {rate}")
            for row in json.loads(path.read_text())["rows"]:
                times = row["step_times"][SKIP:]
                rows.append({"method": row["method"], "rank": row["rank"],
                             "rate": rate or "unshaped", "step_s": statistics.median(times),
                             "bytes_per_step": row["bytes_per_worker"] / row["steps"]})
            path.unlink()
    Path(out).write_text(json.dumps(rows, indent=1))
    return rows


def _label(row):
    return "uncompressed" if row["method"] == "uncompressed" else f"PowerSGD r={row['rank']}"


def fit(rows):
    """``{label: (c seconds, V bits)}`` from the 100 Mbit/s and 1 Gbit/s step times."""
    got = {}
    for row in rows:
        if row["rate"] in BITS:
            got.setdefault(_label(row), {})[BITS[row["rate"]]] = row["step_s"]
    lines = {}
    for label, t in got.items():
        volume = (t[1e8] - t[1e9]) / (1 / 1e8 - 1 / 1e9)
        lines[label] = (t[1e9] - volume / 1e9, volume)
    return lines


def break_even(lines, label):
    """The link rate (bit/s) above which ``label`` is slower than uncompressed; None when
    it is faster at every rate (it costs no more than uncompressed off the link)."""
    c_u, v_u = lines["uncompressed"]
    c_p, v_p = lines[label]
    if c_p <= c_u:
        return None
    return (v_u - v_p) / (c_p - c_u)


def table(rows):
    """Step times per method and rate, the speed-up over uncompressed, and the break-even."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    step = {(_label(r), r["rate"]): r["step_s"] for r in rows}
    labels = list(dict.fromkeys(_label(r) for r in rows))
    lines = fit(rows) if all(b in rates for b in BITS) else {}
    head = " | ".join(f"{r}: ms per step (x faster)" for r in rates)
    out = [f"| method | {head} | bytes per step | break-even link rate |",
           "|---|" + "---|" * (len(rates) + 2)]
    for label in labels:
        cells = [f"{1e3 * step[label, r]:.1f} ({step['uncompressed', r] / step[label, r]:.1f}x)"
                 for r in rates]
        size = next(r["bytes_per_step"] for r in rows if _label(r) == label)
        even = "" if label == "uncompressed" or not lines else _rate(break_even(lines, label))
        out.append(f"| {label} | {' | '.join(cells)} | {size / 1e3:.1f} kB | {even} |")
    return "\n".join(out)


def _rate(bits):
    return "above every rate" if bits is None else f"{bits / 1e9:.2f} Gbit/s"


def plot(rows, path="results/08_network.png"):
    """Step time against link rate, one line per method (log-log)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    x = list(range(len(rates)))
    for label in dict.fromkeys(_label(r) for r in rows):
        ys = [1e3 * next(r["step_s"] for r in rows if _label(r) == label and r["rate"] == rate)
              for rate in rates]
        ax.plot(x, ys, marker="o", label=label)
    ax.set_xticks(x, rates)
    ax.set_yscale("log")
    ax.set_xlabel("link rate of each host")
    ax.set_ylabel("median step time (ms)")
    ax.set_title("Two hosts, one worker each: time per training step")
    ax.legend()
    return save_figure(fig, path)
