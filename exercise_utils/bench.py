"""Benchmark helpers: warm-up, medians, tables, JSON and plots.

Timings on shared machines are noisy: always warm up, repeat, take medians,
and compare ratios measured in the same run rather than absolute times.

Used in 01_mpi_parallel_sgd and later notebooks.
"""
import json
import os
import statistics
import time
from pathlib import Path


def time_it(fn, warmup=2, repeats=7, sync=None):
    """Time ``fn()``: run it ``warmup`` times untimed, then ``repeats`` timed runs.

    Args:
        fn: callable without arguments.
        warmup: untimed runs first (caches, lazy initialisation, connections).
        repeats: timed runs.
        sync: called before reading the clock (e.g. ``torch.cuda.synchronize`` or a barrier).
    Returns:
        dict with ``median``, ``min`` and ``all`` (seconds).
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times), "all": times}


class OtherLoad:
    """How many cores other processes kept busy while the block ran (``with OtherLoad() as
    load: ...``, then ``load.cores``): the machine's busy CPU time, less this process's and
    that of the children it waited for (a launch's processes), over the wall time. A timing
    taken while others used a core or more of a small machine measures them too: on 2 cores
    beside 2 busy processes, one training process with 2 intra-op threads ran 69 times
    slower (notebook 01, section 6)."""

    def __enter__(self):
        import psutil
        self._busy = _busy_seconds(psutil.cpu_times())
        self._ours = _our_seconds()
        self._start = time.perf_counter()
        self.cores = None
        return self

    def __exit__(self, *exc):
        import psutil
        wall = time.perf_counter() - self._start
        others = (_busy_seconds(psutil.cpu_times()) - self._busy) - (_our_seconds() - self._ours)
        self.cores = max(0.0, others / wall) if wall > 0 else 0.0


def _busy_seconds(times):
    return sum(v for k, v in times._asdict().items() if k not in ("idle", "iowait"))


def _our_seconds():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def load_warning(rows, key="others", cores=None, limit=0.25):
    """A warning (or "") when other processes kept more than ``limit`` cores busy during any
    of the runs whose rows record it under ``key``."""
    worst = max((r.get(key) or 0.0 for r in rows), default=0.0)
    if worst <= limit:
        return ""
    cores = cores or os.cpu_count()
    return (f"WARNING: other processes kept up to {worst:.1f} of the {cores} cores busy during "
            f"these runs: the timings measure them too and cannot be trusted. Close other "
            f"programs (or wait for them) and run the cell again.")


def record_load(rows, load, cores=None):
    """``rows`` (dicts, returned) with ``"others"``: the cores other processes kept busy while
    they were measured (``load``: a finished :class:`OtherLoad`), and ``"cores"``: the
    machine's (kept where a row has them already)."""
    for row in rows:
        row.setdefault("others", load.cores)
        row.setdefault("cores", cores or os.cpu_count())
    return rows


def load_note(rows, key="others", limit=0.25):
    """The lines a table of timings ends with (or "" for rows without a load record): the
    cores, how many of them other processes kept busy meanwhile, and :func:`load_warning`'s
    warning when that was more than ``limit``."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return ""
    cores = max((r.get("cores") or 0 for r in rows), default=0) or os.cpu_count()
    warning = load_warning(rows, key, cores, limit)
    return (f"\nmeasured on {cores} cores; other processes kept up to {max(values):.1f} of them "
            f"busy meanwhile" + (f"\n{warning}" if warning else ""))


def format_table(rows, columns, formats=None):
    """Return rows (dicts) as an aligned text table.

    Args:
        rows: list of dicts.
        columns: list of (key, header) pairs.
        formats: optional dict key -> format spec, e.g. {"speedup": ".2f"}.
    Returns:
        str
    """
    formats = formats or {}
    cells = [[h for _, h in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k), formats.get(k, "")) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value, spec):
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def save_json(path, data):
    """Write ``data`` as indented JSON to ``path`` (creating folders); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def load_json(path):
    """Read JSON written by :func:`save_json`."""
    return json.loads(Path(path).read_text())


def line_plot(series, xlabel, ylabel, title, path, logx=False, logy=False, xticks=None):
    """Plot named (x, y) series as lines with markers and save a PNG.

    Args:
        series: dict label -> (xs, ys).
        xlabel, ylabel, title: texts.
        path: PNG file to write.
        logx, logy: logarithmic axes.
        xticks: optional explicit x ticks.
    Returns:
        the matplotlib Figure (a notebook shows it).
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks(xticks)
        ax.set_xticklabels([str(t) for t in xticks])
    ax.grid(True, alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def per_variant(rows, variants):
    """``(world_size, variant, its rows)`` for every world size (ascending) and variant (in the
    order of ``variants``) that has rows: the groups (one row per rank) of which a benchmark's
    summary makes one row each. Used by the benchmarks of 07 and 09 (their ``summary``)."""
    for world in sorted({r["world_size"] for r in rows}):
        for variant in variants:
            mine = [r for r in rows if (r["variant"], r["world_size"]) == (variant, world)]
            if mine:
                yield world, variant, mine


def save_figure(fig, path):
    """Lay out ``fig``, write it as a PNG to ``path`` (creating folders), close it; return it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def pyplot():
    """``matplotlib.pyplot``, with the file-only Agg backend outside IPython (scripts, tests,
    headless runs), the notebook's own backend inside it (so figures display)."""
    import matplotlib
    if not _interactive():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _interactive():
    try:
        return get_ipython() is not None  # noqa: F821 - defined inside IPython only
    except NameError:
        return False


def script_parser(description, work, out, ints):
    """The command line of a launched benchmark (an ``argparse.ArgumentParser``, for more
    options and ``parse_args``): ``--work`` (the student's file, default ``work``), ``--out``
    (default ``out``) and an integer option ``--<name>`` per item of ``ints`` (``{name:
    default}``: the script's module constants). Used by the benchmarks of 06, 07, 09 and 10
    and 10's network sweep."""
    import argparse
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--work", default=work, help="the student's file")
    p.add_argument("--out", default=out)
    for name, value in ints.items():
        p.add_argument(f"--{name}", type=int, default=value)
    return p


def save_rows(rows, args, start, **more):
    """Write ``{"config", "rows"}`` to ``args.out``: a launched benchmark's rows, its config
    being its settings (``args``), ``more`` and ``seconds`` since ``start`` (its
    ``time.perf_counter()`` at the beginning). Called on rank 0 only."""
    config = dict(vars(args), **more, seconds=time.perf_counter() - start)
    save_json(args.out, {"config": config, "rows": rows})


def gather_rows(rows, args, world, start):
    """Every rank's rows to rank 0, which writes them (:func:`save_rows`, with ``world_size``);
    a launched benchmark's last step. Used by the torchrun benchmarks of
    07_bonus_zero_sharding, 09_bonus_fsdp and 10_bonus_model_parallel."""
    import torch.distributed as dist
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        save_rows([r for per_rank in gathered for r in per_rank], args, start, world_size=world)


def rank_rows(benchmark, args, pg_timeout):
    """Every rank of a torchrun benchmark whose rank 0 writes its own rows only: in the job's
    gloo group (:func:`exercise_utils.rankworker.gloo_group`, ``pg_timeout`` seconds,
    ``args.threads`` threads), ``rows = benchmark(student, args, rank, world)`` on the
    student's module loaded from ``args.work``; rank 0 writes them (:func:`save_rows`).
    Returns ``(rank, rows)``. Used by the benchmarks of 06_build_your_own_ddp and
    10_bonus_model_parallel (its network sweep)."""
    from .rankworker import gloo_group, load_student
    with gloo_group(pg_timeout, args.threads) as (rank, world):
        start = time.perf_counter()
        rows = benchmark(load_student(args.work), args, rank, world)
        if rank == 0:
            save_rows(rows, args, start)
    return rank, rows


def torchrun_rows(module, world_sizes, out, args, timeout, echo=True, threads=1, env=None):
    """Launch ``python -m module`` under torchrun once per world size (``args`` then
    ``--threads`` and ``--out`` a part file per launch), collect every launch's rows and write
    them all to ``out``; return them, each with its launch's load record (:func:`record_load`).
    ``threads``: torch threads per rank; ``env``: more environment of the launches; ``echo``:
    print their output live; ``timeout``: seconds before a launch is killed.
    Used by :func:`gather_rows`'s benchmarks (their ``run``)."""
    from . import launch
    from .progress import runs
    out, rows = Path(out), []
    for world in runs(world_sizes, f"{module.rsplit('.', 2)[-2]} benchmark"):
        part = out.with_name(f"{out.stem}_{world}{out.suffix}")
        part.unlink(missing_ok=True)
        with OtherLoad() as load:
            launch.torchrun(module, world, [*args, "--threads", threads, "--out", part],
                            extra=["-m"], env=env, timeout=timeout, echo=echo,
                            threads_per_process=threads,
                            what=f"`torchrun --nproc-per-node {world} -m {module}`")
        rows += record_load(load_json(part)["rows"], load)
        part.unlink()
    save_json(out, rows)
    return rows
