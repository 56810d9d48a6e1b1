"""Checkers of notebook 09 (ZeRO-2 and ZeRO-3 / FSDP from scratch) for ``work/09_fsdp.py``.

Each check launches 2, then 3 gloo ranks (:mod:`.probes`; results kept per file content) and
compares with one process training the same model on the combined batch (SGD with momentum, tolerance
``ATOL`` + ``RTOL``), on a model with a tied weight, a frozen parameter, a buffer and units
that need padding:

* ``check_zero2``: ``shard_flat`` on small cases; after every ``step()`` exactly one
  reduce-scatter (this rank's padded share of the flat gradient) and one all-gather (the whole
  padded flat vector), nothing else; no full gradient left on the model; the bytes alive after
  the step at most the parameters plus ``SLACK_FACTOR`` x the 1/N shards of gradient, master
  copy and AdamW's two moments (MEASURED: :mod:`.memory`); the parameters equal the reference.
* ``check_zero3``: per step, forward all-gathers each unit once (its padded size), backward
  gathers each at most once and reduce-scatters each once, no other collective; at every leaf
  module's forward at most the root's and that unit's gathered parameters are alive above the
  start of forward (plus ``SLACK`` for activations), after forward at most the root's; after
  the step the bytes alive are about 1/N of parameters, gradients and state; ``parameters()``
  yields exactly the shards; the outputs after training equal the reference's.
* ``check_state_dict``: rank 0's ``full_state_dict()`` equals the reference's ``state_dict()``
  (every key: tied, frozen, buffer), the other ranks get None; loaded into a model built from
  another seed, two more steps follow the reference.

Used in 09_bonus_fsdp.
"""
import hashlib
import math
from pathlib import Path

import numpy as np

from ..harness import HANG_AFTER, assert_close, run_ranks
from ..recorder import verify_no_hidden
from . import probes

WORLD_SIZES = (2, 3)
GLOO_TIMEOUT = 15
ATOL, RTOL = 1e-5, 1e-4
SLACK = 16_000             # bytes of activations and small tensors a measurement may include
SLACK_FACTOR = 1.3         # sharded state measured against 3 x 1/N (shard, gradient, momentum)
SHARDED = 3                # tensors of a parameter's size per shard: the shard, its gradient, momentum
GATHERS = ("all_gather", "all_gather_into_tensor")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor")
FP32 = 4
_CACHE = {}


def _launch(path, size, stages):
    key = (hashlib.sha256(Path(path).read_bytes()).hexdigest(), size, tuple(stages))
    if key not in _CACHE:
        _CACHE[key] = run_ranks(path, probes.probe, size, "none",
                                dict(stages=list(stages), gloo_timeout=GLOO_TIMEOUT),
                                HANG_AFTER, what=f"09_fsdp.py with {size} ranks")
    return _CACHE[key]


def _results(path, stages, stage):
    """Yield ``(size, per-rank results of stage)`` for 2 then 3 ranks."""
    path = Path(path)
    if not path.is_file():
        raise AssertionError(f"{path} does not exist: run the %%writefile cell that creates "
                             "it first.")
    for size in WORLD_SIZES:
        res = _launch(path, size, stages)
        verify_no_hidden(res, f"with {size} ranks",
                         "dist.all_gather_into_tensor / dist.reduce_scatter_tensor")
        for out in res:
            for name in stages:
                if "todo" in out[name]:
                    raise AssertionError(
                        f"not implemented yet: {out[name]['todo']} in {path} still raises "
                        "NotImplementedError. Replace the `raise` line with your code, then "
                        "run the %%writefile cell again.")
        yield size, [out[stage] for out in res]


def padded(numel, size):
    return math.ceil(numel / size) * size


def _kb(n):
    return f"{n / 1e3:.1f} kB"


def _kinds(events):
    """(all-gathers, reduce-scatters, others) of recorded events, each as (name, numel)."""
    colls = [(e[1], e[2]) for e in events if e[0] == "coll"]
    return ([c for c in colls if c[0] in GATHERS], [c for c in colls if c[0] in SCATTERS],
            [c for c in colls if c[0] not in GATHERS + SCATTERS])


# ---------------------------------------------------------------- check_zero2
def expected_shard(shapes, world, rank):
    flat = np.concatenate([np.arange(1, 1 + int(np.prod(s)), dtype=np.float64) + 100 * i
                           for i, s in enumerate(shapes)])
    per = math.ceil(flat.size / world)
    flat = np.concatenate([flat, np.zeros(per * world - flat.size)])
    return flat[rank * per:(rank + 1) * per].tolist(), int(sum(np.prod(s) for s in shapes))


def _check_sharding(got):
    for (shapes, world, rank), out in zip(probes.SHARD_CASES, got):
        want, numel = expected_shard(shapes, world, rank)
        call = f"shard_flat(tensors of shapes {shapes}, world_size={world}, rank={rank})"
        if out["shard"] != want or out["numel"] != numel:
            raise AssertionError(
                f"{call} returned ({out['shard']}, {out['numel']}); expected ({want}, {numel}):"
                f" concatenate the flattened tensors in order, pad with zeros to a multiple of "
                f"world_size, and return part `rank` of world_size equal parts and the number "
                f"of real elements")
        if out["view"]:
            raise AssertionError(f"{call} returned a view of a larger tensor: return a NEW "
                                 f"tensor (.clone()) so the rank keeps only its 1/N")


def _check_zero2_step(size, rank, step, rec, total):
    gathers, scatters, others = _kinds(rec["events"])
    if others:
        raise AssertionError(
            f"with {size} ranks, Zero2.step() issued {sorted({c[0] for c in others})} on rank "
            f"{rank}: ZeRO-2 reduce-scatters the gradients and all-gathers the parameters, "
            f"no all-reduce")
    if len(scatters) != 1 or len(gathers) != 1:
        raise AssertionError(
            f"with {size} ranks, Zero2.step() issued {len(scatters)} reduce-scatters and "
            f"{len(gathers)} all-gathers in step {step}; expected one of each: reduce-scatter "
            f"ONE flat gradient buffer padded to a multiple of the world size, all-gather ONE "
            f"flat parameter buffer")
    want = padded(total, size)
    if scatters[0][1] not in (0, want // size) or gathers[0][1] not in (0, want):
        raise AssertionError(
            f"with {size} ranks, Zero2.step() reduce-scattered into {scatters[0][1]} elements "
            f"and all-gathered {gathers[0][1]}; expected {want // size} and {want}: the flat "
            f"vector of the {total} trainable elements padded to {want}")
    if rec["grads_left"]:
        raise AssertionError(
            f"with {size} ranks, after Zero2.step() the parameters {rec['grads_left'][:3]} "
            f"still hold their full gradients: free them (p.grad = None); a rank keeps only "
            f"its shard of the gradient")


def check_zero2(path):
    """Check ``shard_flat`` and ``Zero2`` (see the module docstring)."""
    total = sum(probes.unit_numels())
    fixed = 2 * probes.WIDTH * FP32                     # the frozen gain and the buffer
    for size, res in _results(path, ["zero2"], "zero2"):
        _check_sharding(res[0]["sharding"])
        share = padded(total, size) // size * FP32
        allowed = (total * FP32 + fixed) + SLACK_FACTOR * SHARDED * share + SLACK
        for rank, out in enumerate(res):
            for step, rec in enumerate(out["steps"]):
                _check_zero2_step(size, rank, step, rec, total)
            alive = out["steps"][-1]["alive"]
            if alive > allowed:
                raise AssertionError(
                    f"with {size} ranks, {_kb(alive)} of tensors are alive on rank {rank} after "
                    f"Zero2.step(); expected at most {_kb(allowed)}: the parameters "
                    f"({_kb(total * FP32)}) and 1/{size} of the parameters, gradient and "
                    f"momentum ({_kb(SHARDED * share)}). Keep only your shard of the "
                    f"gradient (free the flat buffer) and optimizer state for your shard only")
            assert_close(out["final"], out["ref"], f"parameters after {probes.STEPS} steps of "
                         f"Zero2 with {size} ranks, against one process on the combined batch",
                         rank, atol=ATOL, rtol=RTOL)


# ---------------------------------------------------------------- check_zero3
def _unit_of(leaf):
    return int(leaf.split(".")[1]) if leaf.startswith("blocks.") else None


def _check_zero3_step(size, rank, step, rec, sizes):
    for phase in ("forward", "backward", "step"):
        others = _kinds(rec[phase])[2]
        if others:
            raise AssertionError(
                f"with {size} ranks, rank {rank} issued {sorted({c[0] for c in others})} in "
                f"the {phase} of step {step}: ZeRO-3 all-gathers parameters and "
                f"reduce-scatters gradients, no all-reduce")
    gathers, _, _ = _kinds(rec["forward"])
    got = sorted(n for _, n in gathers)
    if len(gathers) != len(sizes) or any(n and n not in sizes for n in got):
        raise AssertionError(
            f"with {size} ranks, forward all-gathered {len(gathers)} times (elements {got}) in "
            f"step {step}; expected once per unit, the root included ({len(sizes)} units of "
            f"{sorted(sizes)} padded elements): gather a unit's parameters just before it runs")
    gathers, scatters, _ = _kinds(rec["backward"])
    shards = sorted(n // size for n in sizes)
    if sorted(n for _, n in scatters) != shards and not (
            len(scatters) == len(sizes) and not any(n for _, n in scatters)):
        raise AssertionError(
            f"with {size} ranks, backward reduce-scattered {len(scatters)} times (into "
            f"{sorted(n for _, n in scatters)} elements) in step {step}; expected once per unit "
            f"(into {shards}): each unit's gradient, reduce-scattered into its shard")
    if len(gathers) > len(sizes):
        raise AssertionError(
            f"with {size} ranks, backward all-gathered {len(gathers)} times in step {step}; "
            f"at most once per unit ({len(sizes)}): gather a unit again once, keep it until "
            f"its gradient is reduce-scattered")
    if rec["step"]:
        raise AssertionError(f"the optimizer step communicated: {rec['step'][:3]}")


def _check_forward_memory(size, rank, out, sizes):
    root = sizes[-1] * FP32
    for leaf, extra in out["samples"]:
        unit = _unit_of(leaf)
        allowed = root + (sizes[unit] * FP32 if unit is not None else 0) + SLACK
        if extra > allowed:
            raise AssertionError(
                f"with {size} ranks, when {leaf} ran, {_kb(extra)} more were alive on rank "
                f"{rank} than before forward; at most {_kb(allowed)}: the root's gathered "
                f"parameters ({_kb(root)}) and this unit's. Free each unit's gathered "
                f"parameters as soon as it has run: at most one unit unsharded at a time")
    if out["after_forward"] > root + SLACK:
        raise AssertionError(
            f"with {size} ranks, after forward {_kb(out['after_forward'])} more were alive on "
            f"rank {rank} than before it; at most {_kb(root + SLACK)} (the root's gathered "
            f"parameters). Autograd keeps what it saves for backward (a Linear saves its "
            f"weight): save a note instead (saved_tensors_hooks) and gather again in backward")


def check_zero3(path):
    """Check ``Zero3`` (see the module docstring)."""
    numels = probes.unit_numels()
    fixed = 2 * probes.WIDTH * FP32
    for size, res in _results(path, ["zero3"], "zero3"):
        sizes = [padded(n, size) for n in numels]
        share = sum(sizes) // size
        for rank, out in enumerate(res):
            if sum(out["shard_numels"]) != share:
                raise AssertionError(
                    f"with {size} ranks, Zero3.parameters() yields {sum(out['shard_numels'])} "
                    f"trainable elements on rank {rank}; expected {share}: only this rank's "
                    f"shard of each unit ({[n // size for n in sizes]})")
            for step, rec in enumerate(out["steps"]):
                _check_zero3_step(size, rank, step, rec, sizes)
            _check_forward_memory(size, rank, out, sizes)
            allowed = fixed + SLACK_FACTOR * SHARDED * share * FP32 + SLACK
            alive = out["steps"][-1]["alive"]
            if alive > allowed:
                raise AssertionError(
                    f"with {size} ranks, {_kb(alive)} of tensors are alive on rank {rank} after "
                    f"the optimizer step; expected at most {_kb(allowed)}: 1/{size} of the "
                    f"parameters, gradients and momentum ({_kb(SHARDED * share * FP32)}) "
                    f"and the frozen parameter and buffer. Free the gathered parameters and "
                    f"the full gradients")
            assert_close(out["outputs"], out["ref_outputs"],
                         f"outputs after {probes.STEPS} steps of Zero3 with {size} ranks, "
                         f"against one process on the combined batch", rank, atol=ATOL,
                         rtol=RTOL)


# ---------------------------------------------------------------- check_state_dict
def check_state_dict(path):
    """Check ``full_state_dict`` and ``load_full_state_dict`` (see the module docstring)."""
    for size, res in _results(path, ["state_dict"], "state_dict"):
        first = res[0]
        for rank, out in enumerate(res[1:], start=1):
            if out["full"] is not None:
                raise AssertionError(f"with {size} ranks, full_state_dict() returned "
                                     f"{type(out['full']).__name__} on rank {rank}; only rank 0 "
                                     f"gets the state dict, the others None")
        if not isinstance(first["full"], dict):
            raise AssertionError(f"full_state_dict() returned {type(first['full']).__name__} "
                                 f"on rank 0; expected the model's state dict")
        missing = [k for k in first["ref_keys"] if k not in first["full"]]
        extra = [k for k in first["full"] if k not in first["ref_keys"]]
        if missing or extra:
            raise AssertionError(
                f"full_state_dict() on rank 0 lacks {missing} and has extra keys {extra}: the "
                f"keys of the model's state_dict() before wrapping (tied weights under each "
                f"name, frozen parameters and buffers included)")
        assert_close(first["full"], first["ref"], f"full_state_dict() after {probes.STEPS} "
                     f"steps with {size} ranks, against one process", 0, atol=ATOL, rtol=RTOL)
        assert_close(first["continued"], first["ref_continued"],
                     f"a model built from another seed, after load_full_state_dict() and "
                     f"{probes.MORE_STEPS} more steps with {size} ranks (load every unit's "
                     f"shard, the frozen parameters and the buffers)", 0, atol=ATOL, rtol=RTOL)
