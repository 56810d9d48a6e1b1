"""Checkers of notebook 09 (ZeRO-2 and ZeRO-3 / FSDP from scratch) for ``work/09_fsdp.py``.

Each check launches 2, then 3 gloo ranks (:mod:`.probes`; results kept per file content) and
compares with one process training the same model on the combined batch (SGD with momentum,
tolerance ``ATOL`` + ``RTOL``; float64 runs ``TIGHT``), on a model with a tied weight, a frozen
parameter, a buffer and units that need padding, then on the core's ``EdgeNet`` (a tied weight
used inside a unit, frozen, unused, transposed and 0-d parameters, BatchNorm buffers with an
int64 counter) in float32 and float64. Every failure names the case of the contract
(:mod:`.requirements`) that found it:

* ``check_zero2``: ``shard_flat`` on 23 cases (values, then empty / one-element / 0-d /
  transposed inputs and world sizes 1 to 5, then float64 and int64: dtype kept, not a view);
  after every ``step()`` exactly one reduce-scatter (this rank's padded share of the flat
  gradient) and one all-gather (the whole padded flat vector), nothing else; the parameters
  equal the reference (also on EdgeNet: a missing gradient counts as zeros; float64 kept); no
  full gradient left on the model after ``step()``, none (and no flat buffer) alive while the
  local optimizer steps; the bytes alive after the step at most the parameters plus the 1/N
  shards of gradient, master copy and momentum (MEASURED: :mod:`.memory`); at grading
  (:func:`exercise_utils.harness.observing`) every launch (2 and 3 ranks) runs on a mesh and
  the bytes all links carried, read outside the ranks, are those two collectives' per step
  (:func:`.wire.zero2_wire_envelope`), else ``zero2-wire``.
* ``check_zero3``: ``parameters()`` yields exactly the shards; per step, forward all-gathers
  each unit once (its padded size), backward gathers each at most once and reduce-scatters
  each once, no other collective; the outputs after training equal the reference's; after
  forward and after the step no module attribute (a tied weight's second one included) holds
  gathered parameters; at every leaf module's forward at most the root's and that unit's
  gathered parameters are alive above the start of forward (plus ``SLACK`` for activations),
  after forward at most the root's; after the step the bytes alive are 1/N of parameters,
  gradients and momentum; EdgeNet in float32, float64 and with two backward passes per step;
  at grading the bytes all links carried are those collectives' (``zero3-wire``).
* ``check_state_dict``: rank 0's ``full_state_dict()`` equals the reference's ``state_dict()``
  (every key: tied, frozen, buffer; dtypes kept), the other ranks get None; it leaves every
  unit resharded; loaded into a model built from another seed whose optimizer exists already,
  the shards, frozen parameters and buffers are updated in place, every unit resharded, and two
  more steps follow the reference; a float64 EdgeNet's state dict, and the same reloaded; at
  grading the bytes all links carried are those of the steps, of ``full_state_dict()``
  gathering each unit once on rank 0 (a gather up to an all-gather) and of the probe's
  broadcast of the state dict (:func:`.wire.state_dict_wire_envelope`, ``state-wire``).

Used in 09_bonus_fsdp.
"""
import math

import numpy as np

from ..contract import fail
from ..harness import HANG_AFTER, check, run_ranks, wire_outside
from ..compare import assert_close
from . import nets, references, shards
from .checks_zero3 import check_state_dict, check_zero3  # noqa: F401 - the CHECK cells' import
from .wire import zero2_runs, zero2_wire_envelope
from .launches import (ATOL, FIXED, FP32, RTOL, SHARDED, SLACK, TIGHT, kb, kinds, links_of,
                       salts_of, stage_results,
                       padded)

__all__ = ["check_zero2", "check_zero3", "check_state_dict"]


# ---------------------------------------------------------------- shard_flat
def expected_shard(shapes, dtype, world, rank):
    """The judge's shard: ``(array of the tensors' dtype, numel)``."""
    flat = np.concatenate([a.reshape(-1) for a in shards.shard_input(shapes, dtype)])
    per = math.ceil(flat.size / world)
    full = np.zeros(per * world, dtype=flat.dtype)
    full[:flat.size] = flat
    return full[rank * per:(rank + 1) * per], int(flat.size)


SHARD_RULE = {
    "shard-values": "concatenate the flattened tensors in order, pad with zeros to a multiple "
                    "of world_size, and return part `rank` of world_size equal parts (ceil("
                    "numel / N) elements each) and the number of real elements",
    "shard-edges": "it must work for any tensors (empty, 0-d, transposed: reshape, not view) "
                   "and any world size, 1 included; with no elements every shard is empty",
    "shard-dtype": "the shard has the tensors' dtype (float64 stays float64, int64 stays "
                   "int64): pad with zeros of that dtype, never through float32",
}


def _check_sharding(got):
    """Every case's values (most basic first: float32, then the edges, then other dtypes),
    then the dtypes, then whether a shard is a view."""
    cases = shards.SHARD_CASES
    for (case, shapes, dtype, world, rank), out in zip(cases, got):
        call = (f"shard_flat({dtype} tensors of shapes {[tuple(s) for s in shapes]}, "
                f"world_size={world}, rank={rank})")
        if "raised" in out:
            fail(case, f"{call} raised {out['raised']}: {SHARD_RULE[case]}")
        want, numel = expected_shard(shapes, dtype, world, rank)
        shard = out["shard"]
        same = (out["dim"] == 1 and shard.shape == want.shape and out["numel"] == numel
                and np.array_equal(shard.astype(np.float64), want.astype(np.float64)))
        if not same:
            fail(case, f"{call} returned ({_show(shard)}, {out['numel']}); expected "
                       f"({_show(want)}, {numel}): {SHARD_RULE[case]}")
    for (case, shapes, dtype, world, rank), out in zip(cases, got):
        if out["dtype"] != dtype:
            fail("shard-dtype", f"shard_flat({dtype} tensors, world_size={world}) returned a "
                                f"{out['dtype']} shard: {SHARD_RULE['shard-dtype']}")
    for (case, shapes, dtype, world, rank), out in zip(cases, got):
        if out["view"]:
            fail("shard-new", f"shard_flat(tensors of shapes {shapes}, world_size={world}, "
                              f"rank={rank}) returned a view of a larger tensor: return a NEW "
                              f"tensor (.clone()) so the rank keeps only its 1/N")


def _show(a):
    a = np.asarray(a)
    return f"{a.dtype} {a.tolist()}" if a.size <= 12 else f"{a.dtype} of shape {a.shape}"


# ---------------------------------------------------------------- check_zero2
def _check_zero2_collectives(size, rank, step, rec, total):
    gathers, scatters, others = kinds(rec["events"])
    if others:
        fail("zero2-collectives",
             f"with {size} ranks, Zero2.step() issued {sorted({c[0] for c in others})} on rank "
             f"{rank}: ZeRO-2 reduce-scatters the gradients and all-gathers the parameters, "
             f"no all-reduce")
    if len(scatters) != 1 or len(gathers) != 1:
        fail("zero2-collectives",
             f"with {size} ranks, Zero2.step() issued {len(scatters)} reduce-scatters and "
             f"{len(gathers)} all-gathers in step {step}; expected one of each: reduce-scatter "
             f"ONE flat gradient buffer padded to a multiple of the world size, all-gather ONE "
             f"flat parameter buffer")
    want = padded(total, size)
    if scatters[0][1] not in (0, want // size) or gathers[0][1] not in (0, want):
        fail("zero2-collectives",
             f"with {size} ranks, Zero2.step() reduce-scattered into {scatters[0][1]} elements "
             f"and all-gathered {gathers[0][1]}; expected {want // size} and {want}: the flat "
             f"vector of the {total} trainable elements padded to {want}")


def _check_zero2_edge(size, rank, out):
    for case, key, dtype, (atol, rtol) in (("zero2-features", "edge32", "float32", (ATOL, RTOL)),
                                           ("zero2-float64", "edge64", "float64", TIGHT)):
        run = out[key]
        assert_close(run["final"], run["ref"],
                     f"the state_dict() of a {dtype} EdgeNet after {nets.EDGE_STEPS} steps of "
                     f"Zero2 with {size} ranks, against one process on the combined batch: "
                     f"every trainable parameter in the flat vector (transposed and 0-d ones "
                     f"too, reshape not view), a parameter without .grad counted as zeros, "
                     f"frozen parameters and buffers untouched, the model's dtype kept",
                     rank, atol=atol, rtol=rtol, case=case, dtype=True)


def _skipped():
    return " and ".join(str(s + 1) for s in nets.ZERO2_SKIPS)


def _replay(size, salts, **mistake):
    """The reference of Zero2's run replayed with a known mistake."""
    return {n: p.detach().numpy() for n, p in references.reference(
        size, nets.STEPS, salts=salts, skips=nets.ZERO2_SKIPS, **mistake).named_parameters()}


def _start():
    """The parameters every run starts from (for the likely cause of a mismatch)."""
    return {n: p.detach().numpy() for n, p in nets.make_model().named_parameters()}


def _zero2_memory(size):
    """(bytes allowed after the step, while the local optimizer steps) with ``size`` ranks."""
    total = sum(nets.unit_numels())
    share = padded(total, size) // size * FP32
    after = total * FP32 + FIXED + SHARDED * share + SLACK
    return total, share, after, after + share


# ---------------------------------------------------------------- zero2 on the wire
def _check_zero2_wire(path, size):
    """The bytes the kernel counted on the launch's links (read outside the ranks: nothing in
    them can change the counters) against :func:`.wire.zero2_wire_envelope`."""
    found = wire_outside(links_of(path, size, ["zero2"]), zero2_wire_envelope(size))
    if found is None:
        return
    sent, least, most = found
    numel, _, steps = zero2_runs()[0]
    fail("zero2-wire",
         f"with {size} ranks, the network counted {sent:,} bytes on the links between the "
         f"ranks while they trained Zero2 ({steps} steps of the tied model, then EdgeNet in "
         f"float32 and float64); one reduce-scatter of the padded flat gradient and one "
         f"all-gather of the padded flat parameters per step put {least:,} to {most:,} bytes "
         f"there (the tied model: {padded(numel, size):,} elements of 4 bytes per "
         f"collective). The calls your code made through torch.distributed did not show this "
         f"traffic: the bytes come from the kernel's counters of each link, read outside the "
         f"ranks. In step() send the gradients with one dist.reduce_scatter_tensor and the "
         f"parameters with one dist.all_gather_into_tensor, nothing else.")


@check
def check_zero2(path):
    """Check ``shard_flat`` (in a lone process first) and ``Zero2`` (see the module docstring)."""
    [sharding] = run_ranks(path, shards.probe_sharding, 1, "none", timeout=HANG_AFTER,
                           what="shard_flat", case="shard-values")
    _check_sharding(sharding)
    for size, res in stage_results(path, ["zero2"], "zero2"):
        total, share, allowed, at_step = _zero2_memory(size)
        for rank, out in enumerate(res):
            for step, rec in enumerate(out["steps"]):
                _check_zero2_collectives(size, rank, step, rec, total)
            salts = salts_of(path, size, ["zero2"])
            assert_close(out["final"], out["ref"], f"parameters after {nets.STEPS} steps of "
                         f"Zero2 with {size} ranks (the forward leaves the last block out at "
                         f"steps {_skipped()}: blocks.3's parameters have no .grad there, one "
                         f"at the others), against one process on the combined batch",
                         rank, atol=ATOL, rtol=RTOL, case="zero2-values", start=_start(),
                         size=size, mistakes={
                             f"the parameters are those of SGD on the SUM of the {size} ranks' "
                             f"gradients: summed instead of averaged? Divide the reduce-"
                             f"scattered sum by the world size.":
                             lambda: _replay(size, salts, grad_scale=size),
                             "blocks.3's parameters, without .grad at step 1, were counted as "
                             "zeros at every later step too (they had one at step 2): which "
                             "parameters have a .grad changes from step to step; look at every "
                             "p.grad at every step, never at a list kept from the first.":
                             lambda: _replay(size, salts, zeros_once=True)})
            _check_zero2_edge(size, rank, out)
            for step, rec in enumerate(out["steps"]):
                if rec["grads_left"]:
                    fail("zero2-grads-freed",
                         f"with {size} ranks, after Zero2.step() the parameters "
                         f"{rec['grads_left'][:3]} still hold their full gradients: free them "
                         f"(p.grad = None); a rank keeps only its shard of the gradient")
            alive = max(rec["alive"] for rec in out["steps"])
            if alive > allowed:
                fail("zero2-memory",
                     f"with {size} ranks, {kb(alive)} of tensors are alive on rank {rank} after "
                     f"Zero2.step(); expected at most {kb(allowed)}: the parameters "
                     f"({kb(total * FP32)}), the frozen parameter and buffer, and 1/{size} of "
                     f"the parameters, gradient and momentum ({kb(SHARDED * share)}). Keep only "
                     f"your shard of the gradient (free the flat buffer) and optimizer state "
                     f"for your shard only")
            for step, rec in enumerate(out["at_step"]):
                if rec["grads"] or rec["alive"] > at_step:
                    held = (f"the parameters {rec['grads'][:3]} still held their full "
                            f"gradients" if rec["grads"] else
                            f"{kb(rec['alive'])} of tensors were alive (at most "
                            f"{kb(at_step)}: the parameters and 4 x the 1/{size} shard)")
                    fail("zero2-freed-before-step",
                         f"with {size} ranks, on rank {rank}, when Zero2's local optimizer "
                         f"stepped (step {step}), {held}: free the full gradients (every "
                         f"p.grad, and the flat buffer: del it) BEFORE the optimizer step")
        _check_zero2_wire(path, size)
