"""Digests of a trainer's state and of a snapshot, as plain data (student side of notebook 05's
checks): what the workers of a checked job report to the judge instead of tensors or pickles.

A tensor becomes ``[hash, sum, dtype]`` (the hash says whether two are equal, the sum by how
much they differ, the dtype whether it was kept); a random state (:func:`.runner.rng_state`)
one hash per generator; an optimizer's state the number of momentum buffers, their hash and
their sum.

Used in 05_ddp_torchrun_fault_tolerance (:mod:`.probes`).
"""
import hashlib


def fingerprint(obj):
    """A short hash of a tensor, array, random state or container of them."""
    h = hashlib.sha1()
    _feed(h, obj)
    return h.hexdigest()[:16]


def _feed(h, obj):
    import numpy as np
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, np.ndarray):
        h.update(f"{obj.dtype}{obj.shape}".encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(repr(obj).encode())


def tensor_digest(t):
    """[hash, sum as float64, dtype] of a tensor."""
    import torch
    if not isinstance(t, torch.Tensor):
        return [fingerprint(t), None, type(t).__name__]
    return [fingerprint(t), float(t.detach().cpu().double().sum()) if t.numel() else 0.0,
            str(t.dtype).replace("torch.", "")]


def rng_digest(state):
    """{"python", "numpy", "torch": hash} of a :func:`.runner.rng_state` dict."""
    if not isinstance(state, dict):
        return {"type": type(state).__name__}
    return {k: fingerprint(state.get(k)) for k in ("python", "numpy", "torch")}


def optimizer_digest(state_dict):
    """What an optimizer's ``state_dict()`` holds per parameter (momentum buffers)."""
    state = state_dict.get("state", {}) if isinstance(state_dict, dict) else {}
    buffers = [v.get("momentum_buffer") for v in state.values() if isinstance(v, dict)]
    buffers = [b for b in buffers if b is not None]
    return {"entries": len(state), "momentum": len(buffers), "hash": fingerprint(
        [state[k].get("momentum_buffer") for k in sorted(state, key=str)
         if isinstance(state[k], dict)]),
        "sum": float(sum(float(b.double().sum()) for b in buffers))}


def plain(value):
    """A counter as JSON: ints and floats as they are, 0-d tensors as numbers, else repr."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    try:
        return value.item()
    except (AttributeError, ValueError, RuntimeError):
        return repr(value)[:80]


def trainer_state(trainer, optimizer, scheduler):
    """The trainer's state as plain data (see the module docstring)."""
    from torch.nn.parallel import DistributedDataParallel
    from . import runner
    model = getattr(trainer, "model", None)
    module = getattr(model, "module", model)
    loader, sampler = getattr(trainer, "loader", None), getattr(trainer, "sampler", None)
    return {"epochs_run": plain(getattr(trainer, "epochs_run", None)),
            "step": plain(getattr(trainer, "step", None)),
            "ddp": isinstance(model, DistributedDataParallel),
            "model": {k: tensor_digest(v) for k, v in module.state_dict().items()}
            if hasattr(module, "state_dict") else {},
            "optimizer": optimizer_digest(optimizer.state_dict()),
            "scheduler": {"last_epoch": scheduler.last_epoch,
                          "lr": [g["lr"] for g in optimizer.param_groups]},
            "rng": rng_digest(runner.rng_state()),
            "loader": loader_digest(loader, sampler)}


def loader_digest(loader, sampler):
    """The loader's batch size and whether it draws from ``sampler``: directly
    (``DataLoader(..., batch_size=b, sampler=sampler)``) or through a batch sampler
    (``DataLoader(..., batch_sampler=BatchSampler(sampler, b, drop_last))``)."""
    batches = getattr(loader, "batch_sampler", None)
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(batches, "batch_size", None)
    draws = sampler is not None and any(
        source is sampler for source in (getattr(loader, "sampler", None),
                                         getattr(batches, "sampler", None)))
    return {"batch_size": plain(size), "sampler_is_self_sampler": draws}


def snapshot_digest(obj):
    """What a snapshot file holds, as plain data."""
    import torch
    if not isinstance(obj, dict):
        return {"type": type(obj).__name__}
    model, opt, sched, rng = (obj.get(k) for k in ("model", "optimizer", "scheduler", "rng"))
    entries = (dict(enumerate(rng)) if isinstance(rng, (list, tuple)) else
               rng if isinstance(rng, dict) else {})
    return {"type": "dict", "keys": sorted(map(str, obj)),
            "model": {str(k): tensor_digest(v) for k, v in model.items()}
            if isinstance(model, dict) and all(isinstance(v, torch.Tensor)
                                               for v in model.values()) else None,
            "model_type": type(model).__name__,
            "optimizer": optimizer_digest(opt) if isinstance(opt, dict) else None,
            "scheduler": sched.get("last_epoch") if isinstance(sched, dict) else None,
            "scheduler_type": type(sched).__name__,
            "epochs_run": plain(obj.get("epochs_run")), "step": plain(obj.get("step")),
            "rng": {"type": type(rng).__name__,
                    "entries": {repr(k): rng_digest(v) for k, v in entries.items()}}}
