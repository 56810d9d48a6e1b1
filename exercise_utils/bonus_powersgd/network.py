"""PowerSGD on a real network: step time against the link rate, and the break-even rate.

The training of :mod:`.experiments` (the same data and settings), on two hosts of an
:class:`exercise_utils.cluster.Cluster` with one worker each, every host's link shaped to
100 Mbit/s, 1 Gbit/s or left unshaped (a veth pair: about 10 Gbit/s), for notebook 08's
DropoutNet (``hidden`` 50: 87 kB of gradients per step) and a wide one (``hidden`` 2048:
2.7 MB, nearly all in one 320 x 2048 matrix). Per model, method and rate it reports the
median step time (forward, backward, communication and update; the first steps, sent
uncompressed or warming up, left out) and the test accuracy (the link changes the time of
a step, never what it computes: the same at every rate).

The *break-even rate*, above which compression no longer pays, is read off the measurements
(:func:`break_even`): where the speed-up over uncompressed training crosses 1 between two
measured rates, interpolated on log scales (the unshaped link's rate is measured in the run).
A cost model ``t = c + V / R`` (``c`` computing, ``V`` bits per step) would give it in closed
form, but DDP overlaps part of the communication with backward and a step of a few
milliseconds varies by about one from run to run: fitted, ``c`` came out different at every
rate. Used in 08_bonus_powersgd.
"""
import math
import statistics

from ..bench import pyplot, save_figure, save_json
from ..config import quick
from . import experiments

RATES = quick(("100mbit", "1gbit", None), ("100mbit", None))   # None: unshaped
HIDDEN = (experiments.HIDDEN, 2048)     # notebook 08's DropoutNet, and a wide one
TRAIN_SIZE = quick(2560, 640)           # 2 workers x batch 32: 40 (quick: 10) steps each
TEST_SIZE = quick(2000, 256)            # test examples (worker 0 evaluates)
SKIP = 3                                # first steps left out of the median (start-up, warm-up)


def sweep(student="work/08_powersgd.py", ranks=experiments.RANKS, rates=RATES, hidden=HIDDEN,
          out="results/08_network.json", timeout=180):
    """Run the training at every rate on two hosts; return one row per model, method, rank
    and rate.

    Args:
        student: the file with your ``PowerSGD``.
        ranks: PowerSGD ranks r (yours).
        rates: link rates (:func:`exercise_utils.links.rate_bits`; None: unshaped).
        hidden: DropoutNet widths (one model each, all trained in each launch).
        out: JSON file for the rows.
    Returns:
        list[dict]: ``hidden``, ``params``, ``method``, ``rank``, ``rate`` (its name),
        ``rate_bits`` (bit/s: the unshaped link's as measured), ``step_s`` (median),
        ``bytes_per_step``, ``accuracy``.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster
    args = ["--student", student, "--ranks", *ranks, "--methods", "uncompressed", "yours",
            "--epochs", 1, "--train-size", TRAIN_SIZE, "--test-size", TEST_SIZE,
            "--hidden", *hidden, "--threads", 1]
    rows = []
    for name, bits, got in cluster.each_rate(experiments.__name__, args, rates, out,
                                             f"{len(hidden) * (len(ranks) + 1)} trainings",
                                             timeout=timeout):
        for row in got:
            times = row["step_times"][SKIP:]
            rows.append({"hidden": row["hidden"], "params": row["params"],
                         "method": row["method"], "rank": row["rank"], "rate": name,
                         "rate_bits": bits, "step_s": statistics.median(times),
                         "bytes_per_step": row["bytes_per_worker"] / row["steps"],
                         "accuracy": row["accuracy"]})
    save_json(out, rows)
    return rows


def _label(row):
    return "uncompressed" if row["method"] == "uncompressed" else f"PowerSGD r={row['rank']}"


def _model(row):
    return f"hidden {row['hidden']} ({row['params']:,} parameters)"


def speedups(rows, model, label):
    """``[(rate bit/s, uncompressed step time / this one's)]`` for ``label`` of ``model``,
    by rate."""
    step = {(_model(r), _label(r), r["rate_bits"]): r["step_s"] for r in rows}
    return sorted((bits, step[m, "uncompressed", bits] / t)
                  for (m, lab, bits), t in step.items() if (m, lab) == (model, label))


def break_even(rows, model, label):
    """The link rate at which ``label`` stops being faster than uncompressed training:
    ``(bits, "")`` interpolated (log-log) between the first two measured rates whose
    speed-ups straddle 1, or ``(lowest rate, "below")`` / ``(highest rate, "above")``
    when it is slower / faster at every measured rate."""
    points = speedups(rows, model, label)
    if points[0][1] < 1:
        return points[0][0], "below"
    for (r0, s0), (r1, s1) in zip(points, points[1:]):
        if s0 >= 1 > s1:
            x0, x1, y0, y1 = math.log(r0), math.log(r1), math.log(s0), math.log(s1)
            return math.exp(x0 + (x1 - x0) * y0 / (y0 - y1)), ""
    return points[-1][0], "above"


def table(rows):
    """Step times per model, method and rate, the speed-up over the model's uncompressed
    training, bytes per step, test accuracy and the break-even rate."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    step = {(_model(r), _label(r), r["rate"]): r["step_s"] for r in rows}
    keys = list(dict.fromkeys((_model(r), _label(r)) for r in rows))
    head = " | ".join(f"{r}: ms per step (x faster)" for r in rates)
    out = [f"| model | method | {head} | bytes per step | test accuracy | break-even link rate |",
           "|---|---|" + "---|" * (len(rates) + 3)]
    for model, label in keys:
        cells = [f"{1e3 * step[model, label, r]:.1f} "
                 f"({step[model, 'uncompressed', r] / step[model, label, r]:.1f}x)" for r in rates]
        row = next(r for r in rows if (_model(r), _label(r)) == (model, label))
        even = "" if label == "uncompressed" else _rate(*break_even(rows, model, label))
        accuracy = "" if row.get("accuracy") is None else f"{row['accuracy']:.3f}"
        out.append(f"| {model} | {label} | {' | '.join(cells)} | "
                   f"{row['bytes_per_step'] / 1e3:.1f} kB | {accuracy} | {even} |")
    return "\n".join(out)


def _rate(bits, side=""):
    text = f"{bits / 1e9:.2g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.3g} Mbit/s"
    return f"{side} {text}".strip()


def plot(rows, path="results/08_network.png"):
    """Step time against link rate, one line per model and method (log scale)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    x = list(range(len(rates)))
    models = list(dict.fromkeys(r["hidden"] for r in rows))
    for (hidden, label) in dict.fromkeys((r["hidden"], _label(r)) for r in rows):
        ys = [1e3 * next(r["step_s"] for r in rows if (r["hidden"], _label(r), r["rate"])
                         == (hidden, label, rate)) for rate in rates]
        ax.plot(x, ys, marker="o", ls="-" if hidden == models[0] else "--",
                label=f"hidden {hidden}: {label}")
    ax.set_xticks(x, rates)
    ax.set_yscale("log")
    ax.set_xlabel("link rate of each host")
    ax.set_ylabel("median step time (ms)")
    ax.set_title("Two hosts, one worker each: time per training step")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
