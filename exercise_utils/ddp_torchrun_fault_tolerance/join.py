"""Uneven inputs under DDP: the hang, ``model.join()`` as the fix, notebook 03's "min steps".

Launch: ``python -m torch.distributed.run --nproc-per-node 2 -m
exercise_utils.ddp_torchrun_fault_tolerance.join --mode join --out r.json`` (or :func:`demo`).
Each worker: the same seeded ``nn.Linear`` in DDP (gloo default group, timeout
``--gloo-timeout`` s), SGD over ITS OWN share of a synthetic data set: with the 70/30 split,
rank 0 has 14 batches and rank 1 has 6. Modes:

* ``hang``: the plain loop (DDP all-reduces the gradient inside ``backward()``). Rank 1 runs
  out of batches and goes on to the script's final ``dist.barrier()``; rank 0 waits in DDP's
  all-reduce of its batch 7. Same group and sequence number, but gloo keys messages by
  (collective type, sequence number): a barrier never matches an all-reduce (all-reduces of
  different sizes would cross-match: notebook 03). So both always wait for the gloo timeout
  (default 30 min!), fail with "Timed out waiting ...ms for recv operation to complete",
  print where they waited and exit with an error; torchrun stops the job.
* ``join``: the loop in ``with model.join(divide_by_initial_world_size=...)``. Each forward
  first all-reduces a "still training" flag; a rank whose loop ended keeps answering it and
  shadows the peer's gradient all-reduce with zeros; when all have joined, DDP broadcasts the
  last-joined rank's parameters. All batches run; replicas end identical. True (default): the
  lone rank's gradient is still divided by 2 (every sample weighs the same); False
  (``--divide-by-initial 0``): by the number of ranks still training.
* ``min``: notebook 03's fix: ``all_reduce(MIN)`` of the batch counts; rank 0 drops batches.

Rank 0 simulates the run in one process and writes ``--out`` (JSON): mode, divide_by_initial,
batches, steps, max_replica_diff, max_vs_reference (|DDP - simulation|), max_vs_other_divisor
(the same, other divisor), checksum (sum |param|), seconds. Used in 05_ddp_torchrun_fault_tolerance.
"""
import argparse
import gc
import contextlib
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path

from .. import launch, processes
from ..bench import format_table, save_json
from ..config import quick

SAMPLES = 160          # synthetic samples shared out between the ranks
SPLIT = "0.7,0.3"      # fraction of the samples per rank (notebook 03's 70/30)
BATCH_SIZE = 8         # samples per batch on each rank
FEATURES, CLASSES = 16, 4
LR = 0.1               # plain SGD
GLOO_TIMEOUT = 3       # seconds before a collective nobody matches fails
TIMEOUT = quick(120, 90)   # launcher limit of one demo (far above the gloo timeout)
OUT = "results/05/ddp_join.json"   # rank 0's JSON result


def is_gloo_timeout(text):
    """Whether a gloo error is its timeout, in either wording: "Timed out waiting ... for recv
    operation to complete" or "Application timeout caused pair closure" (seen in CI)."""
    return "Timed out" in text or "timeout" in text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("hang", "join", "min"), required=True)
    for name, value in (("samples", SAMPLES), ("split", SPLIT), ("batch-size", BATCH_SIZE),
                        ("lr", LR), ("gloo-timeout", GLOO_TIMEOUT), ("out", OUT),
                        ("divide-by-initial", 1)):        # join's flag: 1 (default) or 0
        p.add_argument("--" + name, type=type(value), default=value)
    return p.parse_args(argv)


def rank_batches(args, size):
    """Every rank's list of (x, y) batches (the same on every rank: a seeded generator)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, FEATURES, generator=gen)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=gen)).argmax(1)
    frac = [float(f) for f in args.split.split(",")]          # one fraction per rank
    ends = [0] + [round(args.samples * sum(frac[:r + 1]) / sum(frac)) for r in range(size)]
    return [list(zip(x[a:b].split(args.batch_size), y[a:b].split(args.batch_size)))
            for a, b in zip(ends, ends[1:])]


def reference(lr, batches, steps, by_initial=True):
    """Single-process SGD as DDP should compute it: at step t, the sum of the gradients of the
    ranks still training divided by the world size (``by_initial``) or by their number."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES)
    for t in range(max(steps)):
        pairs = [batches[r][t] for r in range(len(batches)) if t < steps[r]]    # still training
        loss = sum(torch.nn.functional.cross_entropy(model(x), y) for x, y in pairs)
        model.zero_grad()
        (loss / (len(batches) if by_initial else len(pairs))).backward()
        for p in model.parameters():
            p.data -= lr * p.grad
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main(argv=None):
    import torch
    import torch.distributed as dist
    from torch.nn.functional import cross_entropy
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.gloo_timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    batches = (all_batches := rank_batches(args, size))[rank]
    if args.mode == "min":                       # notebook 03's fix: agree on the count
        count = torch.tensor([len(batches)])
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        batches = batches[:int(count)]
    torch.manual_seed(0)                         # the same initial model on every rank
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    done, start = 0, time.perf_counter()
    with model.join(divide_by_initial_world_size=bool(args.divide_by_initial),
                    enable=args.mode == "join"):
        for x, y in batches:
            opt.zero_grad()
            with _waiting(rank, f"stuck in DDP's gradient all-reduce of batch {done + 1} of "
                                f"its {len(batches)}"):
                cross_entropy(model(x), y).backward()      # DDP's all-reduce runs in here
            opt.step()
            done += 1
    seconds = time.perf_counter() - start
    print(f"[rank {rank}] ran {done} of its {len(all_batches[rank])} batches", flush=True)
    with _waiting(rank, f"ran all its {done} batches, then stuck in the end-of-training barrier"):
        dist.barrier()                           # the end-of-training synchronisation
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dist.all_gather_object(every := [None] * size, (done, flat))      # (steps, params) per rank
    if rank == 0:
        steps = [n for n, _ in every]
        diff = max((f - flat).abs().max().item() for _, f in every)
        by_initial = args.mode != "join" or bool(args.divide_by_initial)
        gap = [(flat - reference(args.lr, all_batches, steps, b)).abs().max().item()
               for b in (by_initial, not by_initial)]
        save_json(args.out, {
            "mode": args.mode, "divide_by_initial": bool(args.divide_by_initial),
            "batches": [len(b) for b in all_batches], "steps": steps, "seconds": seconds,
            "max_replica_diff": diff, "max_vs_reference": gap[0],
            "max_vs_other_divisor": gap[1], "checksum": flat.double().abs().sum().item()})
    dist.barrier()
    del model, opt                # free DDP (it holds the group) before destroying the group
    gc.collect()                  # and whatever of it sits in reference cycles
    dist.destroy_process_group()


@contextlib.contextmanager
def _waiting(rank, where):     # on a failed collective: say where this rank waited, re-raise
    try:
        yield
    except RuntimeError as err:
        text = re.sub(r"\[/?\S+:\d+\] ", "", (str(err) or repr(err)).splitlines()[0])
        sys.stdout.write(f"[rank {rank}] {where}: {text}\n")   # one write: lines stay whole
        sys.stdout.flush()
        time.sleep(GLOO_TIMEOUT)   # let the peer time out and report too before torchrun
        raise                      # stops the job on this rank's exit


def demo(mode, timeout=TIMEOUT, echo=True, gloo_timeout=GLOO_TIMEOUT, out_dir="results/05",
         extra=()):
    """Run the script in one 2-worker torchrun launch and summarise it.

    Args: mode ("hang", "join", "min"); timeout: launcher limit (s), far above gloo_timeout (s a
    rank waits in an unmatched collective); extra: more options, e.g. ``("--lr", "0.2")``.
    Returns: dict: mode, hung, gloo_timeout, launch_seconds, batches and steps per rank; join,
    min: rank 0's JSON (module docstring); hang: seconds, waits (rank -> where it waited), error
    (gloo's), killed_by ("gloo timeout" or "launcher"), left_processes (must be []).
    The summary is also written to ``out_dir/ddp_join_<mode>.json`` (waits' keys as strings).
    Raises: LaunchError when the run failed otherwise than by the expected gloo timeout.
    """
    out = Path(out_dir) / f"ddp_join_{mode}.json"
    out.unlink(missing_ok=True)
    args = ["--mode", mode, "--gloo-timeout", str(gloo_timeout), "--out", str(out), *extra]
    start, result = time.monotonic(), {"mode": mode, "hung": False, "gloo_timeout": gloo_timeout}
    try:
        launch.torchrun(__name__, 2, args, extra=["-m"], timeout=timeout, echo=echo,
                        what=f"`torchrun -m {__name__} --mode {mode}`")
        result.update(json.loads(out.read_text()))
    except launch.LaunchTimeout as err:
        if mode != "hang":
            raise
        result.update(hung=True, killed_by="launcher", error=str(err).splitlines()[0], waits={})
    except launch.LaunchError as err:
        found = re.findall(r"\[rank (\d+)\] (stuck[^:\n]*|ran all[^:\n]*): "
                           r"((?:(?!\[rank \d+\] )[^\n])*)", err.output)   # cf. wait_reports, 03
        if mode != "hang" or not any(is_gloo_timeout(text) for _, _, text in found):
            raise                               # not the expected deadlock: do not hide it
        waits = {int(r): where for r, where, _ in found}
        nums = [[int(n) for n in re.findall(r"\d+", waits[r])] for r in sorted(waits)]
        result.update(hung=True, killed_by="gloo timeout", waits=waits,
                      error=next(text for _, _, text in found if is_gloo_timeout(text)),
                      batches=[n[-1] for n in nums],      # "batch 7 of its 14" / "all its 6"
                      steps=[n[0] - 1 if len(n) == 2 else n[0] for n in nums])
    result["launch_seconds"] = time.monotonic() - start
    if mode == "hang":
        result.update(seconds=result["launch_seconds"], left_processes=[p.pid for p in
                      processes.tagged_processes(lambda tag: tag.startswith(f"{os.getpid()}:"))])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))     # the summary replaces rank 0's file
    return result


def table(results):
    """One text row per :func:`demo` result: batches and steps per rank, outcome, gaps."""
    rows = [{**r, **{k: " / ".join(map(str, r.get(k, []))) for k in ("batches", "steps")},
             "mode": r["mode"] + ("" if r.get("divide_by_initial", True) else " (by ranks left)"),
             "outcome": f"{r['killed_by']} after {r['seconds']:.0f} s" if r["hung"]
             else "completed"} for r in results]
    return format_table(rows, [
        ("mode", "mode"), ("batches", "batches per rank"), ("steps", "steps run per rank"),
        ("outcome", "outcome"), ("max_replica_diff", "max |param - rank 0|"),
        ("max_vs_reference", "max |param - 1-process|"), ("checksum", "sum |param|")],
        {"max_replica_diff": ".1e", "max_vs_reference": ".1e", "checksum": ".6f"})


if __name__ == "__main__":
    main()
