"""The probe of ``check_rank_process`` (notebook 04): the student's ``rank_process`` with a
stand-in ``train``, in several runs.

Each run (:data:`RUNS`: 1, 2 or 3 ranks; no GPU, one GPU, a GPU per rank, simulated with
:func:`.probes.simulated_gpus`; a ``train`` that returns or raises; its own port, address and
timeout) records what the stand-in ``train`` saw (its arguments, the group's rank, size and
timeout, the default store's address, port and timeout, whether it is the ``dist.TCPStore``
the student created, with which ``world_size`` and ``is_master``), which backend
``dist.init_process_group`` was asked for (NCCL runs on gloo here: it needs real GPUs), the
order of train's return, barriers and ``destroy_process_group``, whether the group is left
initialized, and what ``rank_process`` returned or raised. The verdicts are in
:mod:`.checks_rank`.

Used in 04_resnet_cifar_data_parallel.
"""
import dataclasses

import torch

from . import probes
from .probes import Lockstep, plain, simulated_gpus

# (name, ranks, simulated GPUs, config.timeout_s, config.master_addr, train raises), in the
# order they run. Every timeout differs, so that no constant passes for config.timeout_s.
RUNS = (
    ("2 ranks", 2, 0, 30.0, "localhost", False),
    ("2 ranks, train raises", 2, 0, 33.0, "127.0.0.1", True),
    ("1 rank", 1, 0, 44.5, "127.0.0.1", False),
    ("3 ranks", 3, 0, 41.0, "127.0.0.1", False),
    ("2 ranks, 2 GPUs", 2, 2, 36.0, "127.0.0.1", False),
    ("2 ranks, 1 GPU", 2, 1, 39.0, "127.0.0.1", False),
)
STORE_ARGS = ("host_name", "port", "world_size", "is_master", "timeout")   # dist.TCPStore's


def _patch(student, events, made, backends):
    """Log dist.barrier / monitored_barrier / destroy_process_group into ``events``, the
    backend asked of init_process_group into ``backends`` (NCCL is run as gloo), and every
    dist.TCPStore created into ``made`` (also where the student imported the names); return
    a function that undoes it."""
    import torch.distributed as dist
    undo = []

    def swap(original, replacement):
        for owner in (dist, student):
            for key, value in list(vars(owner).items()):
                if value is original:
                    undo.append((owner, key, original))
                    setattr(owner, key, replacement)

    for name, event in (("barrier", "dist.barrier()"), ("monitored_barrier", "dist.barrier()"),
                        ("destroy_process_group", "dist.destroy_process_group()")):
        def logged(*args, _fn=getattr(dist, name), _event=event, **kwargs):
            events.append(_event)
            return _fn(*args, **kwargs)
        swap(getattr(dist, name), logged)

    def init(*args, _fn=dist.init_process_group, **kwargs):
        backend = args[0] if args else kwargs.get("backend")
        backends.append(str(backend))
        if "nccl" in str(backend).lower():
            args, kwargs = args[1:], {**kwargs, "backend": "gloo"}
            kwargs.pop("device_id", None)
        return _fn(*args, **kwargs)
    swap(dist.init_process_group, init)

    class TCPStore(dist.TCPStore):
        def __init__(self, *args, **kwargs):
            given = {**dict(zip(STORE_ARGS, args)), **kwargs}
            made.append(dict(world_size=plain(given.get("world_size")), id=id(self),
                             is_master=bool(given.get("is_master", False)), created=False))
            super().__init__(*args, **kwargs)
            made[-1]["created"] = True
    swap(dist.TCPStore, TCPStore)
    return lambda: [setattr(owner, key, fn) for owner, key, fn in reversed(undo)]


def _rendezvous():
    """The default store's address, port, timeout and identity, and the group's timeout."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    store = c10d._get_default_store()
    while hasattr(store, "underlying_store"):          # PrefixStores around the TCPStore
        store = store.underlying_store
    found = dict(host=getattr(store, "host", None), port=getattr(store, "port", None),
                 store_timeout=store.timeout.total_seconds(), store_id=id(store),
                 group_timeout=None)
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        found["group_timeout"] = backend.options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        pass
    return found


def probe_rank_process(student, ctx, config, ports, port):
    """Run rank_process once per run of :data:`RUNS` (port ``ports[i]``) with a stand-in
    train; report per run what it saw (see the module docstring). All processes stop after a
    run that raised unexpectedly or left the group initialized."""
    import torch.distributed as dist
    step, out = Lockstep(ctx, port), {}
    for (name, world, gpus, timeout, addr, raises), run_port in zip(RUNS, ports):
        ok = True
        if ctx.rank < world:
            cfg = dataclasses.replace(config, master_port=run_port, timeout_s=timeout,
                                      master_addr=probes.reachable(addr),
                                      seed=666 if raises else 0)
            with simulated_gpus(gpus):
                out[name] = _run(student, ctx, world, cfg, raises)
            ok = not out[name]["failed"]
            if dist.is_initialized():
                # Tidy up what the student left (a live gloo group can abort the process at
                # exit), so that the next run can start its own group.
                dist.destroy_process_group()
        ctx.case("rp-barrier")                    # a rank still inside rank_process?
        if not step.after(name, ok):
            break
    step.close()
    return out


def _run(student, ctx, world, cfg, raises):
    import torch.distributed as dist
    seen, events, made, backends = [], [], [], []

    def fake_train(rank, world_size, config, device):
        ctx.case("rp-train")
        seen.append(dict(rank=plain(rank), world_size=plain(world_size), device=str(device),
                         same_config=config == cfg, group_rank=dist.get_rank(),
                         group_size=dist.get_world_size(), **_rendezvous()))
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        seen[-1]["sum"] = float(t)
        ctx.case("rp-barrier")
        if raises:
            events.append("train raised")
            raise KeyError("train failed on purpose")
        events.append("train returned")
        return {"rank": rank, "ok": True}

    saved, student.train = student.train, fake_train
    undo = _patch(student, events, made, backends)
    ctx.case("rp-store")
    try:
        value = student.rank_process(ctx.rank, world, cfg)
        result = {"value": plain(value)}
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        result = {"raised": probes.error_text(exc, student)}
    finally:
        undo()
        student.train = saved
    raised_badly = "raised" in result and not (raises and "train failed on purpose" in
                                               result["raised"].split("\n")[0])
    return dict(result, seen=seen[-1] if seen else None, events=list(events),
                stores=[{k: v for k, v in s.items() if k != "id"} | {
                    "used": bool(seen) and s["id"] == seen[-1]["store_id"]} for s in made],
                backends=backends, still_initialized=dist.is_initialized(),
                port=cfg.master_port, addr=cfg.master_addr, timeout=cfg.timeout_s,
                failed=raised_badly or dist.is_initialized())
