r"""Where each dimension of the mesh belongs, on the cluster: your composed step of a GPT on a
2 x 2 x 2 mesh over two hosts of four ranks, with tensor parallelism inside a host or across
the link, at 100 Mbit/s and 1 Gbit/s.

Two hosts of an :class:`exercise_utils.cluster.Cluster` (a switch, each host's link shaped in
both directions), four gloo ranks on each, one launch per placement and rate of
:mod:`.network_ranks` (its docstring has the command). Two placements of the same mesh:

* ``tp-inside``: each host holds one data-parallel replica; the data-parallel all-reduces of the
  gradients cross the link, once per step;
* ``tp-across``: every tensor-parallel pair is split between the hosts; its all-reduces cross,
  two per block in the forward and two in the backward, plus the embedding's and the loss's.

:func:`expected_bytes`: what each dimension puts on the links per step (all links, both
directions; gloo's all-reduce of ``B`` bytes over 2 ranks puts ``2 B`` there, a message
``B``), from the sizes alone: ``dp``, per data-parallel group twice the bytes of its stage's
gradients; ``tp``, per tensor-parallel group twice each all-reduce (``4 L/pp + 1`` activations
of ``b S d`` numbers on a stage, and the loss's three of ``b S``); ``pp``, per pipeline line
the activation forward and its gradient back. The link carries ``dp`` (tp-inside) or ``tp``
(tp-across), measured by the kernel's counters. ``wire_ms``: the crossing bytes' time on the
link at its rate, each direction carrying half. Used in 11_bonus_composed (:func:`sweep`,
:func:`table`).
"""
import json
from pathlib import Path

from ..bench import OtherLoad, load_note, record_load, save_json
from ..config import quick

RATES = quick(("100mbit", "1gbit"), ("100mbit",))
# the model and batch: 2 blocks of 0.5 M parameters per stage, an activation 0.5 MB (float32)
MODEL = {"vocab": 512, "width": 256, "heads": 8, "hidden": 512, "layers": 4, "seq": 64,
         "batch": quick(32, 8)}
WARMUP = 1                  # untimed rounds (connections, first allocations)
STEPS = quick(5, 2)         # timed rounds
TIMEOUT = quick(240, 180)   # seconds per launch before it is killed
OUT = "results/11_composed_network.json"
PLACEMENTS = ("tp-inside", "tp-across")
CROSSING = {"tp-inside": "dp", "tp-across": "tp"}


def model_and_batch(student, args):
    """Your ``GPT`` of ``args``' sizes (seed 0) and a batch ``(tokens, targets)`` (seed 1): what
    every launched measurement of the composed step runs (:mod:`.network_ranks`,
    :mod:`.bench_torch`, :mod:`.bench_memory`)."""
    import torch
    torch.manual_seed(0)
    model = student.GPT(args.vocab, args.width, args.heads, args.hidden, args.layers, args.seq)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
    return model, tokens, targets


def expected_bytes(vocab, width, heads, hidden, layers, seq, batch, item=4):
    """``{dim: bytes}`` one step of the 2 x 2 x 2 mesh puts on all links (see the module
    docstring)."""
    d, h, V, S, b = width, hidden, vocab, seq, batch // 2
    act = b * S * d * item
    per_block = 2 * d + 3 * d * d // 2 + 3 * d // 2 + d * d // 2 + d + 2 * d + h // 2 * d \
        + h // 2 + d * (h // 2) + d
    nb = layers // 2
    first = V // 2 * d + S * d + nb * per_block
    last = nb * per_block + 2 * d + V // 2 * d
    tp = 2 * (2 * (4 * nb + 1) * act + 2 * (4 * nb + 1) * act + 3 * 2 * b * S * item)
    return {"dp": 2 * 2 * (first + last) * item + 4 * 2 * 8,
            "tp": tp, "pp": 4 * (2 * act + 8)}


def sweep(work="work/11_composed.py", rates=RATES, out=OUT, timeout=TIMEOUT):
    """Run both placements at every rate; return one row per placement and rate.

    Returns:
        list[dict]: ``placement``, ``rate``, ``rate_bits``, ``bytes_per_step`` (measured on the
        link), ``expected_bytes`` (of the dimension that crosses), ``bytes_ratio``, ``dims``
        (every dimension's expected bytes), ``step_ms``, ``wire_ms``, ``loss``, the sizes and
        the load record.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster, links
    args = ["--work", work, "--warmup", WARMUP, "--steps", STEPS, "--threads", 1]
    for key, value in MODEL.items():
        args += [f"--{key}", value]
    rows = []
    with OtherLoad() as load, cluster.Cluster(2) as net:
        for rate in rates:
            net.shape(rate)
            bits = links.rate_bits(rate) or 1e6 * net.measure(net.hosts[0], net.hosts[1], 200)
            for placement in PLACEMENTS:
                path = Path(f"{out}.{placement}.{rate}.json")
                path.unlink(missing_ok=True)
                print(f"links at {rate}: the composed step, {placement}, on h0 and h1 ...",
                      flush=True)
                net.torchrun(f"{__package__}.network_ranks", 4,
                             [*map(str, args), "--placement", placement, "--out", str(path)],
                             module=True, timeout=timeout, echo=False, threads_per_process=1,
                             what=f"the composed step {placement} at {rate}")
                got = json.loads(path.read_text())["rows"]
                path.unlink()
                for r in got:
                    dims = expected_bytes(*(r[k] for k in MODEL))
                    crossing = dims[CROSSING[placement]]
                    rows.append(dict(r, rate=rate, rate_bits=bits, dims=dims,
                                     expected_bytes=crossing,
                                     bytes_ratio=r["bytes_per_step"] / crossing,
                                     wire_ms=1e3 * 8 * crossing / 2 / bits))
    rows = record_load(rows, load)
    save_json(out, rows)
    return rows


def table(rows):
    """Markdown table: per placement the dimension whose bytes cross the link, its bytes per
    step expected and measured, the step time at each rate (and the link's share of it); a
    last line with the factor tp-across / tp-inside at each rate; the load record."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    by = {(r["placement"], r["rate"]): r for r in rows}
    dims = rows[0]["dims"]
    head = " | ".join(f"{rate}: step ms (link ms)" for rate in rates)
    out = ["Bytes per step on all links, by dimension (expected): "
           + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in dims.items()) + "\n",
           f"| placement | crossing the link | MB/step expected | MB/step measured | {head} |",
           "|---|---|---:|---:|" + "---:|" * len(rates)]
    for placement in PLACEMENTS:
        if (placement, rates[0]) not in by:
            continue
        first = by[placement, rates[0]]
        cells = " | ".join(f"{by[placement, rate]['step_ms']:.0f} "
                           f"({by[placement, rate]['wire_ms']:.0f})" for rate in rates)
        out.append(f"| {placement} | {CROSSING[placement]} | "
                   f"{first['expected_bytes'] / 1e6:.2f} | "
                   f"{first['bytes_per_step'] / 1e6:.2f} | {cells} |")
    if all((p, rate) in by for p in PLACEMENTS for rate in rates):
        factors = " | ".join(f"**{factor(rows, rate):.2f}x**" for rate in rates)
        out.append(f"| **tp-across / tp-inside** | | | | {factors} |")
    return "\n".join(out) + load_note(rows)


def factor(rows, rate):
    """The step time with tensor parallelism across the link over the time with it inside."""
    by = {(r["placement"], r["rate"]): r for r in rows}
    return by["tp-across", rate]["step_ms"] / by["tp-inside", rate]["step_ms"]
