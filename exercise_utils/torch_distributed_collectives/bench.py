"""Benchmark: the student's ring all-reduce against ``dist.all_reduce`` (gloo), 1 KiB to 64 MiB.

Launch (from the folder that holds ``work/``)::

    torchrun --nproc-per-node 2 -m exercise_utils.torch_distributed_collectives.bench --work work \
        --out results/03_ring_vs_allreduce.json

or from Python: :func:`run_ring_benchmark` (then :func:`ring_table`, :func:`plot_ring`).

For each size (a float32 tensor), for ``ring_all_reduce`` of ``work/03_ring_allreduce.py``
and for ``dist.all_reduce``: warm-up calls, then timed repeats; a repeat counts the
slowest rank (an all-reduce ends when its last rank is done) and the median over repeats
is reported. Bandwidths follow nccl-tests: ``algbw = bytes / time``;
``busbw = algbw * 2 (n - 1) / n``, the rate at which each rank must send in a
bandwidth-optimal all-reduce, comparable across process counts. Every call starts from
the same input and the sums are checked, so a wrong ring cannot report a fast time.

Used in 03_torch_distributed_collectives.
"""
import argparse
import statistics
import time
from datetime import timedelta
from pathlib import Path

from .. import launch
from ..bench import (OtherLoad, format_table, line_plot, load_json, load_note, record_load,
                     save_json)
from ..config import quick

# Settings (each overridable on the command line, e.g. --repeats 20).
SIZES_KIB = quick([1, 4, 16, 64, 256, 1024, 4096, 16384, 65536],   # tensor sizes (KiB)
                  [1, 16, 256, 1024])
REPEATS = quick(10, 4)              # timed calls per size and implementation (median reported)
WARMUP = 2                          # untimed calls first (connections, buffers, caches)
PROCS = 2                           # gloo processes started by run_ring_benchmark
GLOO_TIMEOUT = 60                   # seconds a rank waits in a collective before failing
OUT = "results/03_ring_vs_allreduce.json"
PLOT = "results/03_ring_vs_allreduce.png"
TIMEOUT = quick(180, 90)            # seconds before the launched benchmark is killed
NETWORK_SIZES_KIB = quick((1024, 4096), (1024,))   # tensor sizes of run_on_hosts
FILE = "03_ring_allreduce.py"
MARK = "ring benchmark error: "       # prefixes the lines that say why the benchmark stopped


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="work", help=f"folder holding the student's {FILE}")
    p.add_argument("--sizes-kib", type=int, nargs="+", default=SIZES_KIB)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--warmup", type=int, default=WARMUP)
    p.add_argument("--gloo-timeout", type=float, default=GLOO_TIMEOUT)
    p.add_argument("--out", default=OUT, help="JSON file for the results (rank 0 writes it)")
    return p.parse_args(argv)


def timed(fn, tensor, repeats, warmup):
    """Median over ``repeats`` of the slowest rank's time of ``fn(tensor)``; check the sums.

    Each call starts from ``tensor`` filled with ``rank + 1`` (refilled outside the timed
    region), so every rank must end with ``n (n + 1) / 2`` everywhere.

    Returns:
        (median seconds, whether the sums were right on every rank).
    """
    import torch
    import torch.distributed as dist
    rank, size = dist.get_rank(), dist.get_world_size()
    times, right = [], True
    for i in range(warmup + repeats):
        tensor.fill_(rank + 1)
        dist.barrier()                      # start together; no sync inside the timed region
        start = time.perf_counter()
        fn(tensor)
        elapsed = time.perf_counter() - start
        right = right and bool((tensor == size * (size + 1) / 2).all())
        if i >= warmup:
            times.append(elapsed)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    flag = torch.tensor([int(right)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return statistics.median(slowest.tolist()), bool(flag.item())


def measure(ring, kib, repeats, warmup):
    """Time ``ring`` and ``dist.all_reduce`` on a float32 tensor of ``kib`` KiB; return a row."""
    import torch
    import torch.distributed as dist
    size, nbytes = dist.get_world_size(), kib * 1024
    tensor = torch.empty(nbytes // 4, dtype=torch.float32)
    row = {"kib": kib, "bytes": nbytes, "procs": size}
    for name, fn in (("ring", ring), ("all_reduce", dist.all_reduce)):
        seconds, right = timed(fn, tensor, repeats, warmup)
        if not right:
            raise SystemExit(f"{MARK}{name} gave wrong sums on a tensor of {kib} KiB: run the "
                             f"check of ring_all_reduce first and fix what it reports")
        algbw = nbytes / seconds / 1e9
        row.update({f"{name}_ms": seconds * 1e3, f"{name}_algbw": algbw,
                    f"{name}_busbw": algbw * 2 * (size - 1) / size})
    row["ratio"] = row["ring_ms"] / row["all_reduce_ms"]
    return row


def main(argv=None):
    import torch
    import torch.distributed as dist
    from ..rankworker import load_student
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    path = Path(args.work) / FILE
    if not path.exists():
        raise SystemExit(f"{MARK}missing {path}: run its %%writefile cell first")
    ring = load_student(str(path)).ring_all_reduce
    rank, rows = dist.get_rank(), []
    for kib in args.sizes_kib:
        rows.append(measure(ring, kib, args.repeats, args.warmup))
        if rank == 0:
            r = rows[-1]
            print(f"{kib:6d} KiB: ring {r['ring_ms']:8.3f} ms ({r['ring_busbw']:6.3f} GB/s bus)"
                  f"  all_reduce {r['all_reduce_ms']:8.3f} ms ({r['all_reduce_busbw']:6.3f} GB/s"
                  f" bus)  ring/all_reduce x{r['ratio']:.2f}", flush=True)
    if rank == 0:
        save_json(args.out, {"procs": dist.get_world_size(), "backend": "gloo",
                             "threads": torch.get_num_threads(), "repeats": args.repeats,
                             "warmup": args.warmup, "rows": rows})
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- notebook side
def run_ring_benchmark(work="work", procs=PROCS, out=OUT, extra=(), echo=True, timeout=TIMEOUT):
    """Launch this benchmark with ``torchrun`` (gloo) and return its rows.

    Args:
        work: folder holding the student's ``03_ring_allreduce.py``.
        procs: number of processes.
        out: JSON file the results are written to.
        extra: more options of this script, e.g. ``("--sizes-kib", "1", "1024")``.
        echo: print the live output.
        timeout: seconds before every process is killed and ``LaunchTimeout`` raised.
    Returns:
        list of dicts, one per size: ``kib``, ``bytes``, ``procs``, ``ring_ms``,
        ``all_reduce_ms`` (median of the slowest rank), ``*_algbw`` and ``*_busbw`` (GB/s)
        and ``ratio`` (ring time / all_reduce time).
    """
    out = Path(out)
    if out.exists():
        out.unlink()
    try:
        with OtherLoad() as load:
            launch.torchrun(__name__, procs, ["--work", str(work), "--out", str(out), *extra],
                            extra=("--module",), timeout=timeout, echo=echo,
                            what=f"`torchrun --nproc-per-node {procs} -m {__name__}`")
    except launch.LaunchError as err:
        why = sorted({ln[ln.index(MARK):] for ln in err.output.splitlines() if MARK in ln})
        if not why:
            raise
        raise RuntimeError("the ring benchmark stopped: " + "; ".join(why)) from None
    return record_load(load_json(out)["rows"], load)


def run_on_hosts(work="work", hosts=3, rate="100mbit", sizes_kib=NETWORK_SIZES_KIB,
                 repeats=3, out="results/03_ring_network.json", timeout=TIMEOUT):
    """The same benchmark with one process on each of ``hosts`` hosts of an
    :class:`exercise_utils.cluster.Cluster`, every link shaped to ``rate``, tensors of
    ``sizes_kib`` KiB.

    Returns:
        list of dicts as :func:`run_ring_benchmark`'s, each with ``rate`` (bit/s),
        ``ring_of_link`` / ``all_reduce_of_link`` (bus bandwidth as a fraction of the link
        rate) and ``bound_ms``: the least time any all-reduce needs, each rank sending
        ``2 (n - 1) / n`` times the tensor over its link.
    Raises:
        exercise_utils.cluster.ClusterUnavailable: not root (the notebook says so and skips).
    """
    from .. import cluster, links
    out = Path(out)
    out.unlink(missing_ok=True)
    args = ["--work", str(work), "--out", str(out), "--sizes-kib", *map(str, sizes_kib),
            "--repeats", str(repeats), "--warmup", "1"]
    with cluster.Cluster(hosts, rate=rate) as net:
        print(f"{hosts} hosts, links of {rate}: {len(sizes_kib)} sizes ...", flush=True)
        net.torchrun(__name__, 1, args, module=True, timeout=timeout, echo=False,
                     what=f"the ring benchmark on {hosts} hosts")
    bits = links.rate_bits(rate)
    rows = load_json(out)["rows"]
    for row in rows:
        row["rate"] = bits
        row["bound_ms"] = 1e3 * 2 * (hosts - 1) / hosts * row["bytes"] * 8 / bits
        for name in ("ring", "all_reduce"):
            row[f"{name}_of_link"] = row[f"{name}_busbw"] * 8e9 / bits
    save_json(out, {"hosts": hosts, "rate": rate, "rows": rows})
    return rows


def plot_network(rows, path="results/03_ring_network.png"):
    """Bus bandwidth as a fraction of the link rate against tensor size; return the figure."""
    kib = [r["kib"] for r in rows]
    return line_plot({"ring_all_reduce (yours)": (kib, [r["ring_of_link"] for r in rows]),
                      "dist.all_reduce (gloo)": (kib, [r["all_reduce_of_link"] for r in rows])},
                     "tensor size (KiB, float32)", "bus bandwidth / link rate",
                     f"All-reduce on {rows[0]['procs']} hosts, {rows[0]['rate'] / 1e6:g} Mbit/s "
                     "links", path, logx=True, xticks=kib)


COLUMNS = [("kib", "KiB"), ("ring_ms", "ring ms"), ("all_reduce_ms", "all_reduce ms"),
           ("ring_busbw", "ring busbw GB/s"), ("all_reduce_busbw", "all_reduce busbw GB/s"),
           ("ratio", "ring / all_reduce time")]
FORMATS = {"ring_ms": ".3f", "all_reduce_ms": ".3f", "ring_busbw": ".3f",
           "all_reduce_busbw": ".3f", "ratio": ".2f"}


def ring_table(rows):
    """Format :func:`run_ring_benchmark` rows as a text table, with the load record."""
    return format_table(rows, COLUMNS, FORMATS) + load_note(rows)


def plot_ring(rows, path=PLOT):
    """Plot bus bandwidth against tensor size for both implementations; return the figure."""
    kib = [r["kib"] for r in rows]
    procs = rows[0]["procs"] if rows else PROCS
    return line_plot({"ring_all_reduce (yours)": (kib, [r["ring_busbw"] for r in rows]),
                      "dist.all_reduce (gloo)": (kib, [r["all_reduce_busbw"] for r in rows])},
                     "tensor size (KiB, float32)", "bus bandwidth (GB/s)",
                     f"All-reduce on {procs} gloo processes", path, logx=True, logy=True,
                     xticks=kib)


if __name__ == "__main__":
    main()
