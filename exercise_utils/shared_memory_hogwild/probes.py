"""What runs inside the processes that notebook 02's checkers start, and the inputs they share.

:func:`probe_sampler` calls the student's ``partition_indices`` on every case of
:func:`sampler_cases` (every argument at its edges, keywords, defaults and positional calls).
:func:`probe_hogwild` trains with the student's ``train_worker`` alone (in the probe's own
process, as rank 1 of 3: a float32 MLP, a float64 one, and :class:`~exercise_utils.models.EdgeNet`),
then ``hogwild`` with 3 workers on a model whose first forward pass in each worker waits for
the others (:mod:`.recorders`), then with a worker that raises (one worker more than the
cores, threads=None) and one killed by
SIGKILL (1 worker), reading every sample through a :class:`~.recorders.RecordingDataset`.
Both run in a fresh process of the harness (:func:`exercise_utils.harness.run_ranks`), never in
the notebook kernel.

Used in 02_shared_memory_hogwild.
"""
import importlib
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from ..compare import state_arrays
from ..models import EdgeNet, TinyMLP
from . import recorders
from .recorders import ConcurrencyWatch, Gate, GatedMLP, RecordingDataset, StartJoinCounter


# ---------------------------------------------------------------- sampler
SEEDS, EPOCHS_TRIED = (0, 7), (0, 1, 2)


def sampler_cases():
    """``(group, n, replicas, shuffle, seed, epoch, drop_last, how)`` for every case the
    sampler check tries, in the order it judges them. Groups: ``base`` (1 <= replicas <= n),
    ``small`` (0 < n < replicas: the order repeated again and again), ``empty`` (n = 0),
    ``signature`` (``how``: "defaults" calls with three arguments, "positional" with seven;
    "keywords" elsewhere)."""
    cases = []
    for n in (10, 12, 13, 7, 61, 3, 5, 2, 1, 0):
        for replicas in (3, 2, 4, 5, 1):
            group = "base" if n >= replicas else "small" if n else "empty"
            for drop_last in (False, True):
                for shuffle, seeds, epochs in ((True, SEEDS, EPOCHS_TRIED), (False, (0,), (0, 1))):
                    cases += [(group, n, replicas, shuffle, seed, epoch, drop_last, "keywords")
                              for seed in seeds for epoch in epochs]
    cases += [("base", 1000, 3, True, 2 ** 40 + 3, 99, False, "keywords"),
              ("base", 1000, 7, True, 123456789, 12, True, "keywords")]
    cases += [("signature", n, r, True, 0, 0, False, "defaults") for n, r in ((10, 3), (7, 4))]
    cases += [("signature", n, r, sh, seed, ep, dl, "positional")
              for n, r, sh, seed, ep, dl in ((13, 3, True, 7, 2, False), (13, 3, True, 7, 1, True),
                                             (11, 4, False, 0, 1, True))]
    order = ("base", "small", "empty", "signature")
    return sorted(cases, key=lambda case: order.index(case[0]))


CPU_LIMIT = 2.0     # CPU seconds one call may take (correct code: well under a millisecond)


class _EndlessLoop(Exception):
    pass


def _stop(signum, frame):
    raise _EndlessLoop()


def _call_partition(student, n, replicas, rank, shuffle, seed, epoch, drop_last, how):
    """One call, stopped after CPU_LIMIT seconds of CPU time (not wall time: a loaded machine
    changes nothing): an endless loop on one case must not hide the others."""
    signal.setitimer(signal.ITIMER_VIRTUAL, CPU_LIMIT)
    try:
        if how == "defaults":
            return student.partition_indices(n, replicas, rank)
        if how == "positional":
            return student.partition_indices(n, replicas, rank, shuffle, seed, epoch, drop_last)
        return student.partition_indices(n, replicas, rank, shuffle=shuffle, seed=seed,
                                         epoch=epoch, drop_last=drop_last)
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)


def _kind(value):
    """How a returned value is typed: 'list' (of int), or what it is instead."""
    if not isinstance(value, list):
        return f"{type(value).__module__.replace('builtins', '')}.{type(value).__name__}".lstrip(".")
    bad = next((v for v in value if not isinstance(v, int)), None)
    return "list" if bad is None else f"list of {type(bad).__module__}.{type(bad).__name__}"


def probe_sampler(student, ctx):
    """Return, for every case, the list of every rank's result (its indices, or a dict saying
    what the call raised or returned instead of a list of int), and whether the calls changed
    torch's global random state (a sampler must not)."""
    rng, looped = torch.get_rng_state(), None
    previous = signal.signal(signal.SIGVTALRM, _stop)
    results = []
    try:
        for group, *case in sampler_cases():
            ctx.case({"base": "sampler-type", "small": "sampler-small",
                      "empty": "sampler-empty", "signature": "sampler-signature"}[group])
            per_rank = []
            for rank in range(case[1]):
                if looped:          # one endless loop is enough: the later cases are skipped
                    per_rank.append({"raised": f"not tried: {looped}"})
                    continue
                try:
                    got = _call_partition(student, case[0], case[1], rank, *case[2:])
                except NotImplementedError:
                    raise
                except _EndlessLoop:
                    looped = (f"partition_indices{(case[0], case[1], rank, *case[2:-1])} ran "
                              f"for {CPU_LIMIT} s of CPU time without returning")
                    per_rank.append({"raised": f"no result: an endless loop? ({looped})"})
                    continue
                except Exception as exc:  # noqa: BLE001 - reported per case, not as a crash
                    per_rank.append({"raised": f"{type(exc).__name__}: {exc}"})
                    continue
                kind = _kind(got)
                per_rank.append([int(i) for i in got] if kind == "list" else
                                {"returned": kind, "value": repr(got)[:200]})
            results.append(per_rank)
    finally:
        signal.signal(signal.SIGVTALRM, previous)
    return results, not torch.equal(rng, torch.get_rng_state())


# ---------------------------------------------------------------- hogwild
N_SAMPLES, FEATURES, CLASSES = 240, 20, 4   # 240 = 80 per worker with 3 workers, 120 with 2
EPOCHS, BATCH, LR, SEED = 3, 12, 0.2, 5   # 80 samples a worker: 6 batches of 12 and one of 8
WORKERS, KILL_WORKERS = 3, 1
# train_worker alone, as rank 1 of WORKERS: (case, model, dtype), baseline first
SERIAL_CASES = (("worker-partition", "mlp", "float32"), ("worker-float64", "mlp", "float64"),
                ("worker-edge", "edge", "float32"))


def task_data(dtype="float32"):
    """A learnable toy task: 4 Gaussian clusters in 20 dimensions, balanced classes."""
    g = torch.Generator().manual_seed(1)
    centers = 1.5 * torch.randn(CLASSES, FEATURES, generator=g, dtype=torch.float64)
    y = torch.arange(N_SAMPLES) % CLASSES
    x = centers[y] + torch.randn(N_SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    return x.to(getattr(torch, dtype)), y


def make_model(kind="mlp", dtype="float32", gate=None):
    """The model every run starts from (seeded): TinyMLP, EdgeNet (frozen, unused, tied,
    transposed and 0-d parameters, BatchNorm buffers) or, with ``gate``, a GatedMLP."""
    torch.manual_seed(3)
    if gate is not None:
        return GatedMLP(gate, FEATURES, 16, CLASSES)
    if kind == "edge":
        return EdgeNet(FEATURES, 8, CLASSES, dtype=getattr(torch, dtype))
    return TinyMLP(FEATURES, 16, CLASSES).to(getattr(torch, dtype))


def _accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _importable(student):
    """Import the student's file under its own name (``02_hogwild``), as the spawned workers
    will: they find ``train_worker`` by module name on ``sys.path``, inherited from here."""
    path = Path(student.__file__).resolve()
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return importlib.import_module(path.stem)


def crash_workers():
    """Workers of the run where one raises (threads=None): one more than the cores, so that
    os.cpu_count() // num_workers is 0 and only the floor of max(1, ...) gives a thread."""
    return (os.cpu_count() or 1) + 1


def pick_threads():
    """Thread counts that differ from the default, so that a worker (or a hogwild) that
    ignores ``threads`` shows. For train_worker alone and the 3 workers: 1 (2 where the default
    is 1); never more here, whose OpenMP threads would deadlock the children of a student's
    fork (the check must say "fork", not hang). For the killed worker (alone): a count that
    also differs from its share of the cores, all of them."""
    default, share = torch.get_num_threads(), max(1, (os.cpu_count() or 1) // KILL_WORKERS)
    return (1 if default != 1 else 2), next(t for t in (1, 2, 3) if t not in (default, share))


def probe_hogwild(student, ctx, stage="serial"):
    """One stage of the Hogwild check, as the judge asks for it (a launch each, so that no
    verdict runs here): ``"serial"``: train_worker alone (three models); ``"hogwild"``: hogwild
    with WORKERS processes; ``"crash"``: a worker raises, threads=None; ``"kill"``: a worker is
    killed by SIGKILL. Every stage also reports this process's pid (``parent``) and the thread
    counts it used."""
    module = _importable(student)
    threads, kill_threads = pick_threads()
    out = {"parent": os.getpid(), "threads": threads, "kill_threads": kill_threads}
    if stage == "serial":                        # 1. train_worker alone, as rank 1 of WORKERS
        out["serial"] = {}
        for case, kind, dtype in SERIAL_CASES:
            ctx.case(case)
            x, y = task_data(dtype)
            model, data = make_model(kind, dtype), RecordingDataset(x, y, EPOCHS)
            before = state_arrays(model)
            module.train_worker(1, WORKERS, model, data, EPOCHS, BATCH, LR, SEED, threads)
            out["serial"][case] = {"reads": data.reads(), "changed": _changed(before, model),
                                   "state": state_arrays(model)}
    elif stage == "hogwild":                     # 2. hogwild with WORKERS processes
        ctx.case("hogwild-processes")
        out["hogwild"] = _run_hogwild(module, threads)
    elif stage == "crash":                       # 3. a worker raises; threads=None
        ctx.case("crash-exception")
        workers = crash_workers()
        out["crash"] = {**_run_crash(module, workers, "raise", threads=None), "workers": workers}
        out["default_threads"] = {"reads": out["crash"].pop("reads"), "workers": workers,
                                  "share": max(1, (os.cpu_count() or 1) // workers)}
    elif stage == "kill":                        # 4. a worker is killed by SIGKILL
        ctx.case("crash-signal")
        out["kill"] = _run_crash(module, KILL_WORKERS, "kill", threads=kill_threads)
    else:
        raise ValueError(f"unknown stage {stage!r}")
    return out


# spawn workers forked from a template of the rank that imported torch once, as fresh as
# exec'd ones (:mod:`exercise_utils.spawn_template`): six workers a file, ~3 s of CPU each
probe_hogwild.spawn_template = True


def _run_hogwild(module, threads):
    x, y = task_data()
    gate = Gate()
    model, data = make_model(gate=gate), RecordingDataset(x, y, EPOCHS)
    before, acc_before = state_arrays(model), _accuracy(model, x, y)
    recorders.forked_from(os.getpid())
    with StartJoinCounter() as counter, ConcurrencyWatch(gate, counter, WORKERS) as watch:
        module.hogwild(model, data, WORKERS, epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED,
                       threads=threads)
    return {"reads": data.reads(), "changed": _changed(before, model),
            "accuracy": _accuracy(model, x, y), "accuracy_before": acc_before,
            "together": counter.most, "forked": data.was_forked(),
            "gate": {"verdict": watch.verdict, "most": watch.most, "blocked": watch.blocked}}


def _run_crash(module, workers, fail, threads):
    """hogwild with ``workers`` processes and ``threads`` where the reader of sample
    ``order[0]`` (rank 0's first) raises or is killed. Returns what hogwild raised (type,
    message, or None), the processes it never joined, and the reads."""
    x, y = task_data()
    first = int(torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(SEED))[0])
    data = RecordingDataset(x, y, 1, fail_index=first, fail=fail)
    raised = None
    with StartJoinCounter() as counter:
        try:
            module.hogwild(make_model(), data, workers, epochs=1, batch_size=BATCH, lr=LR,
                           seed=SEED, **({} if threads is None else {"threads": threads}))
        except Exception as exc:  # noqa: BLE001 - any exception reports the failure
            raised = {"type": type(exc).__name__, "runtime": isinstance(exc, RuntimeError),
                      "message": str(exc)[:2000]}
        unseen = counter.unseen_end()
        counter.cleanup()
    return {"raised": raised, "unseen": unseen, "started": len(counter.procs),
            "reads": data.reads()[0]}


def _changed(before, model):
    after = state_arrays(model)
    return max(float(np.max(np.abs(after[k] - before[k]))) for k in before if after[k].size)
