"""Probes of notebook 10's pipeline checkers (:mod:`.checks_pp`).

* :func:`probe_schedules` runs in one process without communication (``backend="none"``): the
  student's ``gpipe_order`` / ``one_f_one_b_order`` for every ``p`` in 1..4, ``m`` in 1..8 and
  stage, and on invalid arguments; it returns what they returned (as plain lists) or raised.
* :func:`probe_pipeline` runs inside every gloo rank (2 and 3 ranks). Rank ``s`` builds only
  its own stage's layers, from its own salt (``ctx.salt``: at grading a number only it and the
  judge know; 0 otherwise), and stage 0 the input, the last stage the target, from theirs
  (:func:`.nets.pp_stack`): no stage can rebuild another's weights or data. For every run of
  :func:`.nets.pp_runs` rank ``s`` builds stage ``s`` of the judge's stack (:func:`.nets.pp_stack`,
  :func:`.nets.pp_stage`), takes the judge's own order (given as the probe's arguments by
  :func:`.checks_pp.stage_orders`, which no rank can import: the student's order functions
  are checked by :func:`probe_schedules`, not here) and calls the student's
  ``pipeline_step`` twice without zeroing the gradients. Every ``torch.distributed`` call the
  student makes is recorded (point-to-point: name, elements, global peer; collectives: name);
  a message to or from a rank that is not a neighbouring stage is stopped before it is made
  (it would hang or reach the wrong stage). Returned as plain data: the loss and this stage's
  parameter gradients after each call, and the calls of each.

Used in 10_bonus_model_parallel.
"""
import gc
import weakref

import torch

from ..rankworker import not_implemented
from ..recorder import SENDS, PointToPoint
from .nets import judge_loss, pp_runs, pp_stack, pp_stage

P_MAX, M_MAX = 4, 8
BAD_ARGS = ((0, 1, 0), (1, 0, 0), (-1, 2, 0), (2, -3, 0), (2, 2, 2), (2, 2, -1), (3, 4, 5),
            (2.0, 2, 0), (2, 2.0, 0), (2, 2, 0.0), (True, 2, 0), (2, True, 0), ("2", 2, 0),
            (None, 2, 0))


# ---------------------------------------------------------------- schedules
def _plain(value):
    """A returned order as plain data: a list of [kind, j] where it is a list of pairs of a
    str and an int, else ``{"type": ..., "repr": ...}``."""
    if isinstance(value, (list, tuple)):
        items, kinds = [], set()
        for item in value:
            if (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], int) and not isinstance(item[1], bool)):
                items.append([item[0], int(item[1])])
                kinds.add(type(item).__name__)
            else:
                return {"type": type(value).__name__, "repr": repr(value)[:300],
                        "bad_item": repr(item)[:80]}
        return {"type": type(value).__name__, "ops": items, "items": sorted(kinds)}
    return {"type": type(value).__name__, "repr": repr(value)[:300]}


def probe_schedules(student, ctx):
    """``{"orders": {name: {"p,m,s": result}}, "errors": {name: [[args, result]]}}``; a
    result is ``_plain``'s dict or ``{"raised": type name, "message": str}``; a function
    whose code still raises NotImplementedError gives ``{"todo": function}``."""
    out = {"orders": {}, "errors": {}}
    for name in ("gpipe_order", "one_f_one_b_order"):
        fn = getattr(student, name, None)
        if fn is None:
            out["orders"][name] = {"missing": name}
            continue
        ctx.case("schedule-gpipe" if name == "gpipe_order" else "schedule-1f1b")
        results = {}
        try:
            for p in range(1, P_MAX + 1):
                for m in range(1, M_MAX + 1):
                    for s in range(p):
                        try:
                            results[f"{p},{m},{s}"] = _plain(fn(p, m, s))
                        except NotImplementedError:
                            raise
                        except Exception as exc:     # a verdict of the judge, not a crash
                            results[f"{p},{m},{s}"] = {"raised": type(exc).__name__,
                                                       "message": str(exc)[:200]}
        except NotImplementedError as exc:
            out["orders"][name] = not_implemented(student, exc)
            continue
        first = fn(3, 4, 1)               # a new list each call: changing one changes no other
        if isinstance(first, list):
            first.append(("F", 99))
        again = fn(3, 4, 1)
        results["fresh"] = again is not first and _plain(again) == _plain(fn(3, 4, 1)) and (
            ("F", 99) not in list(again))
        out["orders"][name] = results
        ctx.case("schedule-errors")
        errors = []
        for args in BAD_ARGS:
            try:
                got = {"returned": repr(fn(*args))[:100]}
            except Exception as exc:
                got = {"raised": type(exc).__name__, "message": str(exc)[:200]}
            errors.append([repr(args), got])
        out["errors"][name] = errors
    return out


# ---------------------------------------------------------------- pipeline
class WrongPeer(RuntimeError):
    """A message to or from a rank that is not a neighbouring stage (stopped before it is
    made)."""


def recording(student, peers):
    """A :class:`exercise_utils.recorder.PointToPoint` (``with recording(...) as rec``; the
    calls in ``rec.log``) that stops a message to or from a rank outside ``peers`` (the
    neighbouring stages' global ranks) with :class:`WrongPeer` before it is made."""
    def expect(name, peer):
        if peer not in peers:
            raise WrongPeer(f"dist.{name} {'to' if name in SENDS else 'from'} rank {peer}: "
                            f"stage s talks only to its neighbouring stages, here ranks "
                            f"{sorted(peers)}")
    return PointToPoint(student, expect)


class _Tap(torch.autograd.Function):
    """Identity; its backward logs ``["B", k]``: when micro-batch ``k``'s backward reaches the
    stage's output."""

    @staticmethod
    def forward(ctx, y, k, log):
        ctx.k, ctx.log = k, log
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(["B", ctx.k])
        return grad, None, None


class _Saved:
    """What autograd keeps of a tensor saved for the backward of micro-batch ``k`` (through
    ``saved_tensors_hooks``): it lives exactly as long as that micro-batch's graph does."""

    def __init__(self, tensor, k, alive):
        self.tensor, self.k = tensor, k
        alive.add(self)
        weakref.finalize(self, alive.discard_k, k)


class _Alive:
    """How many saved tensors of each micro-batch are alive; the peak of micro-batches alive at
    once, looked at after every forward (when one more graph has just been built).

    It also follows what the process holds, not only what autograd keeps: on a stage that
    receives its input (``track``), a weak reference to the storage of each micro-batch's
    input. After every forward, ``held`` is the most micro-batches whose backward had already
    run while their input's storage was still alive (one that an unfinished micro-batch still
    uses does not count: a reused receive buffer), and ``held_at`` when that was. A storage
    lives while anything holds it: the student's variables and dicts, a Work handle of its
    receive, an output or a loss kept with its graph (the graph leads back to the input)."""

    def __init__(self, track=False):
        self.count, self.peak, self.track = {}, 0, track
        self.inputs, self.held, self.held_at = {}, 0, None

    def add(self, saved):
        self.count[saved.k] = self.count.get(saved.k, 0) + 1

    def discard_k(self, k):
        self.count[k] -= 1

    def follow(self, k, x):
        if self.track and isinstance(x, torch.Tensor):
            self.inputs[k] = weakref.ref(x.untyped_storage())

    def look(self, ops):
        self.peak = max(self.peak, sum(1 for n in self.count.values() if n > 0))
        if self.track:
            held = self._held(ops)
            if len(held) > self.held:
                gc.collect()                   # what only a reference cycle kept is not held
                held = self._held(ops)
            if len(held) > self.held:
                self.held, self.held_at = len(held), [sorted(held), ops[-1][1] if ops else None]

    def _held(self, ops):
        done = {k for kind, k in ops if kind == "B"}
        storages = {k: ref() for k, ref in self.inputs.items()}
        busy = {id(st) for k, st in storages.items() if k not in done and st is not None}
        return {k for k, st in storages.items()
                if k in done and st is not None and id(st) not in busy}


class _Logged(torch.nn.Module):
    """The judge's stage, logging ``["F", k]`` for its k-th forward of a call and (through
    :class:`_Tap`) ``["B", k]`` when that forward's backward runs, and counting the
    micro-batches whose graphs are alive (:class:`_Alive`)."""

    def __init__(self, stage):
        super().__init__()
        self.stage, self.ops, self.alive = stage, [], _Alive()

    def forward(self, x):
        k = sum(1 for op in self.ops if op[0] == "F")
        self.ops.append(["F", k])
        alive = self.alive
        alive.follow(k, x)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: _Saved(t, k, alive),
                                                      lambda saved: saved.tensor):
            y = self.stage(x)
        alive.look(self.ops)
        return _Tap.apply(y, k, self.ops)


def _grads(stage):
    return [None if q.grad is None else q.grad.detach().double().numpy().copy()
            for q in stage.parameters()]


SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B"}      # (a run's settings in a hang report)


def probe_pipeline(student, ctx, orders, runs=None, wire=False):
    """``{"runs": {name: result}}`` for every run of :func:`.nets.pp_runs` (``wire``: the wide
    one too; ``runs``: these names only; ``orders``: the judge's order of every stage in each,
    by run name); a result holds, for each of the two calls of ``pipeline_step``, ``{"loss",
    "grads", "calls"}``; a run whose code still raises NotImplementedError gives ``{"todo":
    function}``."""
    torch.set_num_threads(1)
    p, s = ctx.size, ctx.rank
    salts = [getattr(ctx, "salt", 0) if r == s else None for r in range(p)]
    peers = {r for r in (s - 1, s + 1) if 0 <= r < p}
    results = {}
    with recording(student, peers) as rec:
        for name, dtype, sched, m, batch in pp_runs(wire):
            if runs is not None and name not in runs:
                continue
            finished = f"; {len(results)} run{'s' * (len(results) != 1)} before it returned" \
                if results else ""
            ctx.case("pp-values", f"{SCHEDULES[sched]}, m = {m}, batch {batch}, {dtype}"
                                  + finished)
            layers, x, y = pp_stack(dtype, salts, batch, stages=[s])
            stage = pp_stage(layers, p, s)
            logged = _Logged(stage)
            order = [tuple(op) for op in orders[name][s]]
            calls = []
            try:
                for _ in range(2):
                    rec.take()
                    logged.ops, logged.alive = [], _Alive(track=s > 0)
                    try:
                        loss = student.pipeline_step(
                            logged, list(order), inputs=x if s == 0 else None,
                            targets=y if s == p - 1 else None,
                            loss_fn=judge_loss if s == p - 1 else None)
                    except WrongPeer:
                        ctx.case("pp-messages")
                        raise
                    calls.append({"loss": loss if isinstance(loss, (int, float)) or loss is None
                                  else repr(loss)[:100],
                                  "grads": _grads(stage), "calls": rec.take(),
                                  "ops": list(logged.ops), "peak": logged.alive.peak,
                                  "held": logged.alive.held,
                                  "held_at": logged.alive.held_at})
            except NotImplementedError as exc:
                results[name] = not_implemented(student, exc)
                continue
            results[name] = {"steps": calls}
    return {"runs": results}
