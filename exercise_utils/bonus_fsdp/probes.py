"""Probe of notebook 09's checkers: runs inside every rank (see :mod:`.checks`), on the models
and references of :mod:`.nets`.

Stages (one launch runs those asked for, in order; each part names its check case with
``ctx.case`` before it runs, so a crash or a hang is charged to it; ``shard_flat``'s sweep runs
before, in a lone process: :mod:`.shards`):

* ``"zero2"``: ``STEPS`` steps of ``Zero2`` on :class:`~.nets.Net` (its last block left out
  of the forward at the steps of ``ZERO2_SKIPS``: its parameters have no gradient there, and
  one at the others), its local optimizer a
  ``torch.optim.SGD`` that records, when it steps, the gradients left on the model and the
  bytes alive; per step the collectives of ``step()`` (the core's recorder), the gradients
  left and the bytes alive after it; then ``EDGE_STEPS`` steps on EdgeNet in float32 and
  float64.
* ``"zero3"`` (:mod:`.probes_zero3`): ``STEPS`` steps with ``Zero3(model, list(model.blocks))``
  and ``SGD`` over its ``parameters()``; per step the collectives of forward, backward and the
  optimizer step, the module attributes still holding gathered parameters after forward and
  after the step, the bytes alive after the step, the outputs on a combined batch after
  training; in step ``MEASURED_STEP`` the bytes alive above the start of forward at every leaf
  module's forward and after forward (with a :class:`.memory.Witness`). Then EdgeNet (units
  ``inp``, ``bn``, ``unused``, ``back``, ``head``) in float32, float64, and with two backward
  passes per step.
* ``"state_dict"`` (:mod:`.probes_zero3`, after ``"zero3"``'s training): ``full_state_dict()``
  on every rank, the attributes and bytes it leaves; rank 0's result is broadcast and loaded
  with ``load_full_state_dict`` into a wrapper of a model built from another seed (another
  buffer and frozen value too) whose optimizer was built before the load; whether the load kept
  the shards, frozen parameters and buffers in place; ``MORE_STEPS`` steps beside the
  reference. Then a float64 EdgeNet: its full state dict, and the same loaded into another
  seed's model.

Used in 09_bonus_fsdp.
"""
import datetime
import gc

import torch
import torch._dynamo  # noqa: F401 - the ranks' optimizers need it: imported once, before they fork
import torch.distributed as dist
import torch.nn.functional as F

from ..rankworker import not_implemented
from ..recorder import Recorder
from .memory import alive_bytes, start
from .nets import (EDGE_STEPS, OPTIM, STEPS, ZERO2_SKIPS, arrays, edge_local, edge_model, local,
                   make_model)
from .probes_zero3 import state_dict, zero3


def _spying(optimizer_cls, model, log, base):
    """``optimizer_cls`` whose ``step`` first records the gradients left on ``model`` and the
    bytes alive: what a rank holds while its optimizer runs."""
    class Spy(optimizer_cls):
        def step(self, *args, **kwargs):
            gc.collect()
            log.append({"grads": [n for n, p in model.named_parameters() if p.grad is not None],
                        "alive": alive_bytes() - base})
            return super().step(*args, **kwargs)
    Spy.__name__ = Spy.__qualname__ = optimizer_cls.__name__
    return Spy


def _zero2_net(student, ctx, rec):
    gc.collect()
    base = alive_bytes()
    model, at_step = make_model(), []
    opt = student.Zero2(model.parameters(), _spying(torch.optim.SGD, model, at_step, base),
                        **OPTIM)
    steps = []
    for step in range(STEPS):
        opt.zero_grad()
        model.skip_last = step in ZERO2_SKIPS    # which parameters have a gradient varies
        x, y = local(step, ctx)
        F.cross_entropy(model(x), y).backward()
        rec.take()
        opt.step()
        events = rec.take()
        left = [n for n, p in model.named_parameters() if p.grad is not None]
        gc.collect()
        steps.append({"events": events, "grads_left": left, "alive": alive_bytes() - base})
    final = arrays(dict(model.named_parameters()))
    del opt
    return {"steps": steps, "at_step": at_step, "final": final}


def _zero2_edge(student, ctx, dtype):
    model = edge_model(0, dtype)
    opt = student.Zero2(model.parameters(), torch.optim.SGD, **OPTIM)
    for step in range(EDGE_STEPS):
        opt.zero_grad()
        x, y = edge_local(step, 0, ctx, dtype)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return {"final": arrays(model.state_dict())}


def zero2(student, ctx, rec):
    ctx.case("zero2-collectives")
    out = _zero2_net(student, ctx, rec)
    ctx.case("zero2-features")
    out["edge32"] = _zero2_edge(student, ctx, "float32")
    ctx.case("zero2-float64")
    out["edge64"] = _zero2_edge(student, ctx, "float64")
    return out


STAGES = {"zero2": zero2, "zero3": zero3, "state_dict": state_dict}


def probe(student, ctx, stages, gloo_timeout):
    """Run ``stages``; ``{stage: result}`` (``{"todo": function}`` where the student's code
    raised NotImplementedError), and ``"hidden"``: ``{stage: communication that bypassed the
    recorded collectives}`` (point-to-point messages, or calls below torch.distributed)."""
    torch.set_num_threads(1)     # 2-3 ranks on 2 cores, small tensors: more threads only spin
    dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size,
                            timeout=datetime.timedelta(seconds=gloo_timeout))
    start()
    rec = Recorder()
    rec.install(student)
    results, hidden = {}, {}
    try:
        for stage in stages:
            try:
                results[stage] = STAGES[stage](student, ctx, rec)
            except NotImplementedError as exc:
                results[stage] = not_implemented(student, exc)
            hidden[stage] = rec.take_hidden()
    finally:
        rec.uninstall()
    results["hidden"] = hidden
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return results
