"""Checkers of notebook 09's ZeRO-3 exercises: ``check_zero3`` and ``check_state_dict`` (see
:mod:`.checks`, which the CHECK cells import them from).

Used in 09_bonus_fsdp.
"""
import numpy as np

from ..contract import fail
from ..harness import check, wire_outside
from ..compare import assert_close
from . import nets, references
from .launches import (ATOL, FIXED, FP32, RTOL, SHARDED, SLACK, TIGHT, kb, kinds, links_of,
                       salts_of, stage_results, padded)
from .wire import state_dict_wire_envelope, zero3_wire_envelope


# ---------------------------------------------------------------- check_zero3
def _unit_of(leaf):
    return int(leaf.split(".")[1]) if leaf.startswith("blocks.") else None


def _check_zero3_step(size, rank, step, rec, sizes):
    for phase in ("forward", "backward", "step"):
        others = kinds(rec[phase])[2]
        if others:
            fail("zero3-collectives",
                 f"with {size} ranks, rank {rank} issued {sorted({c[0] for c in others})} in "
                 f"the {phase} of step {step}: ZeRO-3 all-gathers parameters and "
                 f"reduce-scatters gradients, no all-reduce")
    gathers, _, _ = kinds(rec["forward"])
    got = sorted(n for _, n in gathers)
    if len(gathers) != len(sizes) or any(n and n not in sizes for n in got):
        fail("zero3-collectives",
             f"with {size} ranks, forward all-gathered {len(gathers)} times (elements {got}) in "
             f"step {step}; expected once per unit, the root included ({len(sizes)} units of "
             f"{sorted(sizes)} padded elements): gather a unit's parameters just before it runs")
    gathers, scatters, _ = kinds(rec["backward"])
    shards = sorted(n // size for n in sizes)
    if sorted(n for _, n in scatters) != shards and not (
            len(scatters) == len(sizes) and not any(n for _, n in scatters)):
        fail("zero3-collectives",
             f"with {size} ranks, backward reduce-scattered {len(scatters)} times (into "
             f"{sorted(n for _, n in scatters)} elements) in step {step}; expected once per unit "
             f"(into {shards}): each unit's gradient, reduce-scattered into its shard")
    if len(gathers) > len(sizes):
        fail("zero3-collectives",
             f"with {size} ranks, backward all-gathered {len(gathers)} times in step {step}; "
             f"at most once per unit ({len(sizes)}): gather a unit again once, keep it until "
             f"its gradient is reduce-scattered")
    if rec["step"]:
        fail("zero3-collectives", f"the optimizer step communicated: {rec['step'][:3]}")


def _check_attributes(size, rank, left, when):
    if left:
        fail("zero3-attrs-none",
             f"with {size} ranks, on rank {rank}, {when} the module attributes {left[:4]} still "
             f"pointed at gathered parameters: reshard() must set EVERY attribute a parameter "
             f"is registered under back to None (a tied weight has two), so that nothing keeps "
             f"the gathered vector alive")


def _check_forward_memory(size, rank, out, sizes):
    root = sizes[-1] * FP32
    for leaf, extra in out["samples"]:
        unit = _unit_of(leaf)
        allowed = root + (sizes[unit] * FP32 if unit is not None else 0) + SLACK
        if extra > allowed:
            fail("zero3-forward-memory",
                 f"with {size} ranks, when {leaf} ran, {kb(extra)} more were alive on rank "
                 f"{rank} than before forward; at most {kb(allowed)}: the root's gathered "
                 f"parameters ({kb(root)}) and this unit's. Free each unit's gathered "
                 f"parameters as soon as it has run: at most one unit unsharded at a time")
    if out["after_forward"] > root + SLACK:
        fail("zero3-forward-memory",
             f"with {size} ranks, after forward {kb(out['after_forward'])} more were alive on "
             f"rank {rank} than before it; at most {kb(root + SLACK)} (the root's gathered "
             f"parameters). Autograd keeps what it saves for backward (a Linear saves its "
             f"weight): save a note instead (saved_tensors_hooks) and gather again in backward")


def _check_zero3_edge(size, rank, out):
    what = {"zero3-features": "a float32 EdgeNet (units inp, bn, unused, back, head: back's "
                              "weight is tied to out's, the root's; frozen, unused, transposed "
                              "and 0-d parameters, BatchNorm buffers)",
            "zero3-float64": "a float64 EdgeNet (the shards, collectives and rebuilt views in "
                             "the model's dtype: no float32 on the way, no 4 bytes per element)",
            "zero3-accumulate": "a float32 EdgeNet with TWO backward passes before each step "
                                "(their gradients must add up in the shards' .grad, as for any "
                                "parameter)"}
    for case, text in what.items():
        run = out[case]
        _check_attributes(size, rank, run["gathered"], f"after forward with {text}")
        atol, rtol = TIGHT if case == "zero3-float64" else (ATOL, RTOL)
        assert_close(run["outputs"], run["ref_outputs"],
                     f"outputs after {nets.EDGE_STEPS} steps of Zero3 on {text} with {size} "
                     f"ranks, against one process on the combined batch", rank, atol=atol,
                     rtol=rtol, case=case, dtype=True)


@check
def check_zero3(path):
    """Check ``Zero3`` (see the module docstring)."""
    numels = nets.unit_numels()
    for size, res in stage_results(path, ["zero3"], "zero3"):
        sizes = [padded(n, size) for n in numels]
        share = sum(sizes) // size
        for rank, out in enumerate(res):
            if sum(out["shard_numels"]) != share:
                fail("zero3-parameters",
                     f"with {size} ranks, Zero3.parameters() yields {sum(out['shard_numels'])} "
                     f"trainable elements on rank {rank}; expected {share}: only this rank's "
                     f"shard of each unit ({[n // size for n in sizes]})")
            for step, rec in enumerate(out["steps"]):
                _check_zero3_step(size, rank, step, rec, sizes)
            # the logits' rounding scales with the largest of them, not with each one: an
            # absolute slack of RTOL x max|logit| (elementwise RTOL alone rejected correct files
            # for 3 of 8 salted batches: 2e-5 to 5e-4 off a logit near 0, of logits up to 40)
            scale = float(np.abs(out["ref_outputs"]).max(initial=0.0))
            assert_close(out["outputs"], out["ref_outputs"],
                         f"outputs after {nets.STEPS} steps of Zero3 with {size} ranks, "
                         f"against one process on the combined batch", rank,
                         atol=ATOL + RTOL * scale, rtol=RTOL, case="zero3-values")
            for step, rec in enumerate(out["steps"]):
                _check_attributes(size, rank, rec["gathered"],
                                  f"after the forward or the optimizer step of step {step}")
            _check_forward_memory(size, rank, out, sizes)
            allowed = FIXED + SHARDED * share * FP32 + SLACK
            alive = max(rec["alive"] for rec in out["steps"])
            if alive > allowed:
                fail("zero3-memory",
                     f"with {size} ranks, {kb(alive)} of tensors are alive on rank {rank} after "
                     f"the optimizer step; expected at most {kb(allowed)}: 1/{size} of the "
                     f"parameters, gradients and momentum ({kb(SHARDED * share * FP32)}) "
                     f"and the frozen parameter and buffer. Free the gathered parameters and "
                     f"the full gradients")
            _check_zero3_edge(size, rank, out)
        _check_zero3_wire(path, size)


def _check_zero3_wire(path, size):
    """The bytes the kernel counted on the launch's links (read outside the ranks: nothing in
    them can change the counters) against :func:`.wire.zero3_wire_envelope`."""
    found = wire_outside(links_of(path, size, ["zero3"]), zero3_wire_envelope(size))
    if found is None:
        return
    sent, least, most = found
    fail("zero3-wire",
         f"with {size} ranks, the network counted {sent:,} bytes on the links between the "
         f"ranks while they trained Zero3 ({nets.STEPS} steps of the tied model and a forward, "
         f"then EdgeNet three times); per step, each unit all-gathered in forward, gathered "
         f"again in backward and its gradient reduce-scattered put {least:,} to {most:,} "
         f"bytes there. The calls your code made through torch.distributed did not show this "
         f"traffic: the bytes come from the kernel's counters of each link, read outside the "
         f"ranks. Gather a unit's parameters with dist.all_gather_into_tensor and reduce-"
         f"scatter its gradient with dist.reduce_scatter_tensor (the given _Gather does "
         f"both), nothing else.")


# ---------------------------------------------------------------- check_state_dict
def _check_full(size, res):
    for rank, out in enumerate(res[1:], start=1):
        if out["full"]["kind"] != "NoneType":
            fail("state-rank0", f"with {size} ranks, full_state_dict() returned "
                                f"{out['full']['kind']} on rank {rank}; only rank 0 gets the "
                                f"state dict, the others None")
    first = res[0]
    if first["full"]["kind"] != "dict":
        fail("state-rank0", f"full_state_dict() returned {first['full']['kind']} on rank 0; "
                            f"expected the model's state dict (a dict of tensors)")
    state = first["full"]["state"]
    if "types" in state:
        fail("state-values", f"full_state_dict() on rank 0 holds {state['types']}: every value "
                             f"must be a tensor")
    missing = [k for k in first["ref_keys"] if k not in state["arrays"]]
    extra = [k for k in state["arrays"] if k not in first["ref_keys"]]
    if missing or extra:
        fail("state-keys",
             f"full_state_dict() on rank 0 lacks {missing} and has extra keys {extra}: the "
             f"keys of the model's state_dict() before wrapping (tied weights under each "
             f"name, frozen parameters and buffers included)")
    assert_close(state["arrays"], first["ref"], f"full_state_dict() after {nets.STEPS} "
                 f"steps with {size} ranks, against one process", 0, atol=ATOL, rtol=RTOL,
                 case="state-values", dtype=True)


def _check_left(size, res, what):
    for rank, out in enumerate(res):
        left = out["full"]["left"] if what == "full_state_dict()" else out["load"]["left"]
        if left["gathered"] or left["extra"] > SLACK:
            kept = (f"the module attributes {left['gathered'][:4]} still pointed at gathered "
                    f"parameters" if left["gathered"] else
                    f"{kb(left['extra'])} more were alive than before it")
            fail("state-resharded",
                 f"with {size} ranks, on rank {rank}, after {what} {kept}: "
                 f"full_state_dict() and load_full_state_dict() must leave every unit resharded "
                 f"(gather into temporaries, or reshard() what you unsharded)")


def _check_load(size, res, salts):
    for rank, out in enumerate(res):
        load = out["load"]
        if not load["shards_kept"] or load["moved"]:
            what = ("Zero3.parameters() no longer yields the same tensors, in the same memory"
                    if not load["shards_kept"] else f"the tensors {load['moved'][:4]} were "
                    f"replaced")
            fail("state-load-in-place",
                 f"with {size} ranks, on rank {rank}, after load_full_state_dict() {what}: an "
                 f"optimizer built before the load would update orphans. Copy the values into "
                 f"the existing shards, frozen parameters and buffers (tensor.copy_ under "
                 f"torch.no_grad())")
    first = res[0]
    if not isinstance(first["continued"], dict):
        fail("state-load", f"full_state_dict() after loading returned "
                           f"{type(first['continued']).__name__} on rank 0")
    want = references.continued(size, first["full"]["state"]["arrays"], salts)
    assert_close(first["continued"], want,
                 f"a model built from another seed, after load_full_state_dict() and "
                 f"{nets.MORE_STEPS} more steps with {size} ranks (load every unit's "
                 f"shard, the frozen parameters and the buffers)", 0, atol=ATOL, rtol=RTOL,
                 case="state-load")


def _check_edge_state(size, first):
    edge = first["edge"]
    what = (f"full_state_dict() of a float64 EdgeNet after {nets.EDGE_STEPS} steps with {size} "
            f"ranks, against one process (every key in the model's own dtype: float64 "
            f"parameters and buffers, the int64 counter exact)")
    if not edge["full"] or "types" in edge["full"]:
        fail("state-float64", f"{what}: rank 0 got {edge['full']}")
    assert_close(edge["full"]["arrays"], edge["ref"], what, 0, atol=TIGHT[0], rtol=TIGHT[1],
                 case="state-float64", dtype=True)
    reloaded = edge.get("reloaded") or {}
    assert_close(reloaded.get("arrays", {}), edge["full"]["arrays"], "the same loaded with "
                 "load_full_state_dict() into an EdgeNet built from another seed (other "
                 "buffers, frozen values and counter), then full_state_dict() again", 0,
                 atol=TIGHT[0], rtol=TIGHT[1], case="state-float64", dtype=True)


def _check_state_wire(path, size):
    """The bytes the kernel counted on the launch's links (read outside the ranks: nothing in
    them can change the counters) against :func:`.wire.state_dict_wire_envelope`."""
    found = wire_outside(links_of(path, size, ["state_dict"]), state_dict_wire_envelope(size))
    if found is None:
        return
    sent, least, most = found
    fail("state-wire",
         f"with {size} ranks, the network counted {sent:,} bytes on the links between the "
         f"ranks while they trained Zero3 ({nets.STEPS} + {nets.MORE_STEPS} steps of the tied "
         f"model, then a float64 EdgeNet), called full_state_dict() four times and loaded "
         f"the state dict rank 0 got (the check sends it to every rank); the steps' "
         f"collectives and full_state_dict() gathering every unit's shards on rank 0 (one "
         f"gather, or one all-gather, of each unit) put {least:,} to {most:,} bytes there. "
         f"The calls your code made through torch.distributed did not show this traffic: the "
         f"bytes come from the kernel's counters of each link, read outside the ranks. Gather "
         f"each unit once in full_state_dict(), and send nothing in load_full_state_dict() "
         f"(every rank is given the whole state dict).")


@check
def check_state_dict(path):
    """Check ``full_state_dict`` and ``load_full_state_dict`` (see the module docstring)."""
    for size, res in stage_results(path, ["state_dict"], "state_dict"):
        _check_full(size, res)
        _check_left(size, res, "full_state_dict()")
        _check_load(size, res, salts_of(path, size, ["state_dict"]))
        _check_left(size, res, "load_full_state_dict()")
        _check_edge_state(size, res[0])
        _check_state_wire(path, size)
