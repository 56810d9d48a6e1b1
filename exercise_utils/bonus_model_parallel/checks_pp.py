"""Checkers of notebook 10's pipeline exercises for ``work/10_model_parallel.py``.

* ``check_schedules``: ``gpipe_order`` and ``one_f_one_b_order`` are pure, so they run in one
  process without communication (``run_ranks(..., 1, "none")``, :func:`.probes_pp.probe_schedules`)
  for every ``p`` in 1..4, ``m`` in 1..8 and stage. Cases:

  - ``schedule-gpipe`` / ``schedule-1f1b``: a list of ``(kind, j)`` tuples, kind ``"F"`` or
    ``"B"``; each micro-batch once forward and once backward, F j before B j, the forwards in
    increasing order. GPipe: every F before any B, the backwards in reverse order (its
    docstring promises it). 1F1B: the first B at position ``min(p - stage, m)``, at most
    ``p - stage`` micro-batches in flight (F done, B not yet) at any time, strictly
    alternating B, F, B, F... from the first B until the last F, the backwards in increasing
    order. These rules leave exactly one list; a failure names p, m, the stage, the first
    wrong position and shows the expected and the returned list.
  - ``schedule-errors``: ValueError for every invalid argument tried (p or m < 1, stage
    outside ``[0, p)``, floats, bools, strings, None).

* ``check_pipeline``: 2 then 3 gloo ranks (:func:`.probes_pp.probe_pipeline`); the judge's own
  stack of Linear+Tanh layers (:func:`.nets.pp_stack`; at grading each stage's layers, the
  input and the target salted with the number of the rank that holds them) split into p
  stages, float64 and float32, the judge's own GPipe and 1F1B orders, m = 1, 2 (8 rows), 3, 4
  (10 rows: uneven micro-batches), ``pipeline_step`` called twice without zeroing. Cases,
  checked in this order:

  - ``pp-messages``: only point-to-point messages, only with the neighbouring stages (a message
    to another rank through ``torch.distributed``'s functions is stopped before it is made; one
    through the ProcessGroup object is seen by :mod:`exercise_utils.pgwatch`); per call and
    micro-batch its activation in one message (after at most one other: a header) forward to
    ``s+1`` and its gradient in one message back to ``s-1``, nothing else, both sent and
    received; no collective at all;
  - ``pp-order``: each stage ran the ops of its order in that order (the judge's stage module
    logs its forwards and their backwards);
  - ``pp-memory``: at no time more micro-batches' graphs alive on a stage than its order has in
    flight (the judge's stage module saves its tensors for backward through
    ``saved_tensors_hooks`` into holders that die with the graph), and, on the stages that
    receive their input, what the process holds: after each forward, at most one micro-batch
    (:data:`HELD_AFTER_BACKWARD`) whose backward has run while its input's storage is still
    alive (held by a dict, a receive's Work, an output or a loss kept with its graph);
  - ``pp-values``: after the first call, every stage's parameter gradients, and the loss the
    last stage returns, equal one process on the whole batch (:func:`.nets.judge_loss`, a mean
    over the batch that tells its arguments apart);
  - ``pp-accumulate``: after the second call, twice those gradients (accumulated, never zeroed);
  - ``pp-wire``: where links are observed (grading), with a run on a wide batch more
    (:data:`.nets.PP_WIRE_RUNS`), each directed link carries what the messages put there (the
    links between stages that are not neighbours: the set-up only; :mod:`.wire`).

Tolerance: ``max |diff| <= tol * scale``, tol ``1e-10`` (float64) or ``1e-5`` (float32); the
scale of the gradients is the largest reference gradient of the whole model (as in
:mod:`.checks`), that of the loss its magnitude.

A pipeline that deadlocks (e.g. a blocking send posted before the neighbour's receive) is
reported as a hang by the harness after :data:`TIMEOUT` seconds without progress.

Used in 10_bonus_model_parallel.
"""
from pathlib import Path

import numpy as np

from ..contract import CheckFailure, fail
from ..notebook_files import no_file, unwritten
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..recorder import P2P
from . import probes_pp
from .nets import PP_LAYERS, PP_RUNS, PP_WIDTHS, pp_reference, pp_runs
from .orders import ORDERS, stage_orders
from .wire import check_pp_wire


__all__ = ["check_schedules", "check_pipeline"]

TIMEOUT = HANG_AFTER     # seconds without progress before a launch is a hang (harness)
WORLD_SIZES = (2, 3)
TOL = {"float64": 1e-10, "float32": 1e-5}
HANG_HINT = ("In a pipeline, a hang is usually two neighbouring stages each waiting for the "
             "other: in gloo a blocking dist.send (or an isend waited on at once) waits until "
             "the neighbour has posted the matching receive. Post every receive with "
             "dist.irecv before you wait on anything (a gradient's receive as soon as its "
             "activation is sent), send with dist.isend and wait on the sends only at the end "
             "of the step; every tag must match on both sides (one per direction and "
             "micro-batch).")
# after its backward, a finished micro-batch's input may still be held by one of the step's
# variables until it is next assigned (``x, out = live.pop(j)``, then the next forward):
# one such micro-batch is not a leak
HELD_AFTER_BACKWARD = 1
FUNCS = {"gpipe_order": ("gpipe", "schedule-gpipe"),
         "one_f_one_b_order": ("1f1b", "schedule-1f1b")}


def _exists(path):
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    return path


def _todo(path, todo):
    raise CheckFailure("not implemented yet: " + unwritten(todo, path))


# ---------------------------------------------------------------- schedules
def _first_wrong(sched, ops, p, m, s):
    """``(position, reason)`` of the first op that breaks a rule, or None."""
    limit = min(p - s, m)
    done_f, done_b, n_b = set(), set(), 0
    for pos, (kind, j) in enumerate(ops):
        if kind not in ("F", "B"):
            return pos, f"kind {kind!r}: only 'F' and 'B'"
        if not 0 <= j < m:
            return pos, f"micro-batch {j} does not exist (j in 0..{m - 1})"
        if kind == "F":
            if j in done_f:
                return pos, f"F{j} a second time"
            if j != len(done_f):
                return pos, f"F{j} out of order: the forwards run F0, F1, F2, ... in order"
            if sched == "gpipe" and done_b:
                return pos, "a forward after a backward: GPipe runs every F before any B"
            if sched == "1f1b":
                if done_b and ops[pos - 1][0] == "F":
                    return pos, ("two forwards in a row after the first backward: the steady "
                                 "state alternates B, F, B, F ...")
                if len(done_f) + 1 - len(done_b) > p - s:
                    return pos, (f"{len(done_f) + 1 - len(done_b)} micro-batches in flight "
                                 f"(F done, B not yet): at most p - stage = {p - s}")
            done_f.add(j)
        else:
            if j in done_b:
                return pos, f"B{j} a second time"
            if j not in done_f:
                return pos, f"B{j} before F{j}"
            if sched == "gpipe":
                if len(done_f) < m:
                    return pos, "a backward before the last forward: GPipe runs every F first"
                if j != m - 1 - n_b:
                    return pos, (f"B{j}: GPipe runs the backwards in reverse order, "
                                 f"B{m - 1} first")
            else:
                if not done_b and pos != limit:
                    return pos, (f"the first backward is at position {pos}; expected "
                                 f"min(p - stage, m) = {limit} (a warm-up of {limit - 1} "
                                 f"forwards, then F, B)")
                if j != n_b:
                    return pos, f"B{j}: 1F1B runs the backwards in increasing order"
                if done_b and len(done_f) < m and ops[pos - 1][0] == "B":
                    return pos, ("two backwards in a row before the last forward: the "
                                 "steady state alternates B, F, B, F ...")
            done_b.add(j)
            n_b += 1
        if sched == "1f1b" and not done_b and pos + 1 == limit + 1:
            return pos, (f"no backward at position {limit}: expected min(p - stage, m) = "
                         f"{limit} forwards, then the first backward")
    if len(ops) != 2 * m:
        return len(ops), f"the list ends after {len(ops)} ops: expected 2m = {2 * m}"
    return None


def _fmt(ops):
    return "[" + ", ".join(f"{k}{j}" for k, j in ops) + "]"


def _check_orders(path, name, results):
    sched, case = FUNCS[name]
    if "missing" in results:
        fail(case, f"{path} defines no {name}: keep the function's name and signature")
    if "todo" in results:
        _todo(path, results["todo"])
    for p in range(1, probes_pp.P_MAX + 1):
        for m in range(1, probes_pp.M_MAX + 1):
            for s in range(p):
                got = results[f"{p},{m},{s}"]
                where = f"{name}({p}, {m}, {s}) (p={p}, m={m}, stage={s})"
                want = ORDERS[sched](p, m, s)
                if "raised" in got:
                    fail(case, f"{where} raised {got['raised']}: {got['message']}; expected "
                               f"{_fmt(want)}")
                if "ops" not in got:
                    fail(case, f"{where} returned {got['repr']}: expected a list of (kind, j) "
                               f"tuples, kind 'F' or 'B', j an int, e.g. {want}")
                if got["type"] != "list":
                    fail(case, f"{where} returned a {got['type']}: expected a list")
                if got["items"] and got["items"] != ["tuple"]:
                    fail(case, f"{where} returned a list of {' and '.join(got['items'])}s: "
                               f"expected tuples (kind, j), e.g. {want[0]}")
                ops = [tuple(op) for op in got["ops"]]
                wrong = _first_wrong(sched, ops, p, m, s)
                if wrong is None and ops != want:     # the rules leave one list: cannot happen
                    wrong = (next(i for i, (a, b) in enumerate(zip(ops, want)) if a != b),
                             "differs from the expected order")
                if wrong is not None:
                    pos, reason = wrong
                    fail(case, f"{where}: position {pos} is wrong: {reason}.\n"
                               f"  expected {_fmt(want)}\n  returned {_fmt(ops)}")


def _check_fresh(path, name, results):
    sched, case = FUNCS[name]
    if not results.get("fresh", True):
        fail(case, f"{name}(3, 4, 1) returned a list that a later call returned again (or "
                   "that changed when the first was changed): return a new list each call")


def _check_errors(name, errors):
    for args, got in errors:
        if got.get("raised") != "ValueError":
            did = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                   else f"returned {got['returned']}")
            fail("schedule-errors",
                 f"{name}{args} {did}: expected ValueError (p >= 1, m >= 1 and "
                 f"0 <= stage < p, all ints and not bools)")


@check
def check_schedules(path):
    """Your ``gpipe_order`` and ``one_f_one_b_order`` for every p in 1..4, m in 1..8 and stage
    (one process, no communication): the order of F and B, the micro-batches in flight, and
    ValueError on invalid arguments."""
    path = _exists(path)
    res = run_ranks(path, probes_pp.probe_schedules, 1, "none", {}, TIMEOUT,
                    what="10_model_parallel.py (schedules)", case="schedule-gpipe")[0]
    # piece by piece (issue 39): a finished schedule is judged even where the other is not
    # written yet, which is then named as still to do
    todo = [name for name in FUNCS if "todo" in res["orders"][name]]
    for name in FUNCS:
        if name not in todo:
            _check_orders(path, name, res["orders"][name])
            _check_fresh(path, name, res["orders"][name])
    for name in FUNCS:
        if name not in todo:
            _check_errors(name, res["errors"].get(name, []))
    if todo:
        done = [name for name in FUNCS if name not in todo]
        raise CheckFailure("not implemented yet: " + unwritten(
            res["orders"][todo[0]]["todo"], path, [res["orders"][n]["todo"] for n in todo[1:]],
            passed=f"Finished and passing: {', '.join(done)}." if done else ""))



# ---------------------------------------------------------------- pipeline
def _describe(name, size, rank):
    _, dtype, sched, m, batch = next(run for run in pp_runs(True) if run[0] == name)
    return (f"with {size} ranks ({'GPipe' if sched == 'gpipe' else '1F1B'}, m={m}, batch "
            f"{batch}, {dtype}), stage {rank}")


def _check_messages(size, res, runs=PP_RUNS):
    for name, _, _, m, batch in runs:
        for rank, out in enumerate(res):
            for call, step in enumerate(out["runs"][name]["steps"]):
                where = f"{_describe(name, size, rank)}, call {call + 1} of pipeline_step"
                calls = step["calls"]
                below = sorted({c[0] for c in calls if "." in c[0]})
                if below:
                    raise CheckFailure(
                        f"the check's integrity was violated: {where} reached "
                        f"{', '.join(below)}, below torch.distributed's functions where the "
                        "check records communication")
                colls = sorted({c[0] for c in calls if c[0] not in P2P})
                if colls:
                    fail("pp-messages", f"{where} called {colls}: a pipeline needs only "
                                        "point-to-point messages (dist.isend / dist.irecv)")
                others = sorted({c[2] for c in calls if c[0] in P2P
                                 and c[2] not in (rank - 1, rank + 1)}, key=str)
                if others:
                    fail("pp-messages", f"{where} exchanged messages with rank(s) {others}: "
                                        "stage s talks only to its neighbouring stages")
                _check_traffic(where, calls, size, rank, m, batch)


def _border_numels(size, m, batch):
    """Elements of each micro-batch's activation at the border after each stage: ``[stage]
    -> [m sizes]`` (the micro-batches of ``torch.tensor_split``, the stack's widths)."""
    rows = [batch // m + (1 if j < batch % m else 0) for j in range(m)]
    per = PP_LAYERS // size
    return [[r * PP_WIDTHS[(s + 1) * per] for r in rows] for s in range(size)]


def _check_traffic(where, calls, size, rank, m, batch):
    """Per micro-batch, forward: its activation in one message, after at most one other (a
    header); backward: its gradient in one message, nothing else; both ways, sent and
    received."""
    borders = _border_numels(size, m, batch)
    for kind, verb in (("send", "sent"), ("recv", "received")):
        for peer in (rank - 1, rank + 1):
            got = sorted(c[1] for c in calls if c[0] in (kind, "i" + kind) and c[2] == peer)
            if not 0 <= peer < size:
                if got:
                    fail("pp-messages", f"{where} {verb} {len(got)} messages "
                                        f"{'to' if kind == 'send' else 'from'} rank {peer}, "
                                        "which is no stage")
                continue
            border = borders[min(rank, peer)]          # the activation between the two
            forward = (peer > rank) == (kind == "send")
            rest = list(got)
            missing = []
            for numel in border:
                if numel in rest:
                    rest.remove(numel)
                else:
                    missing.append(numel)
            extra = len(rest) if not forward else max(0, len(rest) - m)
            if missing or extra:
                what = ("activations: one per micro-batch, after at most one header each"
                        if forward else "gradients: one per micro-batch, nothing else")
                fail("pp-messages",
                     f"{where} {verb} {len(got)} message{'s' * (len(got) != 1)} "
                     f"{'to' if kind == 'send' else 'from'} rank {peer} of {got} elements; "
                     f"expected the {what} ({sorted(border)} elements"
                     + (", and up to one header each" if forward else "") + ")")


def _check_order(size, res, runs=PP_RUNS):
    """Each stage ran its forwards and backwards in the order it was given (logged by the
    judge's stage module: its k-th forward, and when that forward's backward reached it)."""
    for name, _, sched, m, _ in runs:
        for rank, out in enumerate(res):
            want = [list(op) for op in ORDERS[sched](size, m, rank)]
            for call, step in enumerate(out["runs"][name]["steps"]):
                ops = step.get("ops", [])
                if ops != want:
                    fail("pp-order",
                         f"{_describe(name, size, rank)}, call {call + 1} of pipeline_step ran "
                         f"{_fmt([tuple(op) for op in ops])}; its order was "
                         f"{_fmt([tuple(op) for op in want])}: run the ops of `order` one "
                         "after the other (F j: the forward of micro-batch j; B j: its "
                         "backward, right then)")


def _check_memory(size, res, runs=PP_RUNS):
    """At no time more micro-batches' graphs alive on a stage than its order has in flight: a
    micro-batch's saved activations are freed by its backward."""
    for name, _, sched, m, _ in runs:
        for rank, out in enumerate(res):
            order = ORDERS[sched](size, m, rank)
            in_flight = max(sum(1 if k == "F" else -1 for k, _ in order[:i + 1])
                            for i in range(len(order)))
            for call, step in enumerate(out["runs"][name]["steps"]):
                if step.get("peak", 0) > in_flight:
                    fail("pp-memory",
                         f"{_describe(name, size, rank)}, call {call + 1} of pipeline_step: "
                         f"the saved activations of {step['peak']} micro-batches were alive at "
                         f"once; its order has at most {in_flight} in flight. A micro-batch's "
                         "graph must be freed by its backward (no retain_graph, no graph kept "
                         "for later): that is what 1F1B saves")
                if step.get("held", 0) > HELD_AFTER_BACKWARD:
                    done, k = step["held_at"]
                    fail("pp-memory",
                         f"{_describe(name, size, rank)}, call {call + 1} of pipeline_step: at "
                         f"the forward of micro-batch {k}, "
                         + (f"the input of micro-batch {done[0]} was" if len(done) == 1 else
                            "the inputs of micro-batches "
                            f"{', '.join(map(str, done))} were")
                         + " still alive in the process after their backward. Once its backward is done, keep nothing that holds a "
                         "micro-batch's input: not the tensor (in a dict or list), not its "
                         "receive's Work, not its output or its loss with their graph (the "
                         "graph leads back to the input: keep .item() or .detach(), and send "
                         "out.detach())")


def _diff(a, e):
    a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
    return float(np.max(np.abs(a - e))) if a.size else 0.0


def _check_values(size, res, salts, step, case, runs=PP_RUNS):
    factor = step + 1
    for name, dtype, _, _, batch in runs:
        ref = pp_reference(dtype, salts, batch)
        tol = TOL[dtype]
        scale = max(float(np.max(np.abs(g))) for stage in ref["grads"] for g in stage)
        hint = (" Is each micro-batch's loss loss_fn(output_j, target_j) (the output first: "
                "the check's loss tells its arguments apart) scaled by n_j / n (its share of "
                "the batch, not 1/m: the micro-batches can be uneven)?" if step == 0 else
                " Gradients accumulate: pipeline_step adds to .grad and never zeroes it, so a "
                "second call without zero_grad doubles them.")
        for rank, out in enumerate(res):
            got = out["runs"][name]["steps"][step]
            where = f"{_describe(name, size, rank)}, after call {step + 1} of pipeline_step"
            for i, (g, want) in enumerate(zip(got["grads"], ref["grads"][rank])):
                want = want * factor
                if g is None:
                    fail(case, f"{where}: parameter {i} of the stage has no gradient")
                g = np.asarray(g)
                d = _diff(g, want) if g.shape == want.shape else float("inf")
                if not np.isfinite(d) or d > tol * scale * factor:
                    fail(case, f"{where}: the gradient of parameter {i} of the stage (shape "
                               f"{tuple(want.shape)}) differs from one process on the whole "
                               f"batch{' (x2)' * step} by {d:.2e} (tolerance {tol:g} x "
                               f"{scale * factor:.2e}, the largest reference gradient)."
                               f"{hint}")
            if rank == size - 1:
                loss = got["loss"]
                if not isinstance(loss, (int, float)) or isinstance(loss, bool):
                    fail(case, f"{where}: the last stage returned {loss!r}; expected the whole "
                               "batch's loss as a Python float")
                d = abs(loss - ref["loss"])
                if not np.isfinite(d) or d > tol * max(abs(ref["loss"]), 1e-3):
                    fail(case, f"{where}: the returned loss {loss:.10g} differs from the whole "
                               f"batch's {ref['loss']:.10g} by {d:.2e}")
            elif got["loss"] is not None:
                fail(case, f"{where}: stage {rank} returned {got['loss']!r}; only the last "
                           "stage returns the loss, the others None")


@check
def check_pipeline(path, timeout=TIMEOUT):
    """Your ``pipeline_step`` with 2 and 3 gloo ranks under GPipe and 1F1B, m = 1..4 (uneven
    micro-batches included), float64 and float32: every stage's gradients and the loss equal
    one process on the whole batch, messages only between neighbouring stages, gradients
    accumulated over two calls. ``timeout``: seconds without progress before a hang. Where
    links are observed (grading) with a wide batch more, and each link must carry what the
    runs' messages put there, the links between stages that are not neighbours the set-up only
    (``pp-wire``, :mod:`.wire`: right files measured 1.21 to 1.39 times the least and 0.48 to
    0.61 of the most of a neighbours' link, 1.8 to 2.7 kB of the 32 kB between others; stage
    0's input sent to the last stage, 6.9 times that)."""
    path = _exists(path)
    observed = observing()
    runs = pp_runs(observed)
    for size in WORLD_SIZES:
        salts, links = {}, {}
        try:
            res = run_ranks(path, probes_pp.probe_pipeline, size, "gloo",
                            {"orders": stage_orders(size, runs), "wire": observed}, timeout,
                            what=f"10_model_parallel.py (pipeline_step) with {size} ranks",
                            case="pp-values", salts=salts, links=links)
        except CheckFailure as err:
            if " hung: " not in str(err):
                raise
            raise CheckFailure(f"{err}\n{HANG_HINT}",
                               err.case) from None
        salts = [salts.get(r, 0) for r in range(size)]
        for out in res:
            for result in out["runs"].values():
                if "todo" in result:
                    _todo(path, result["todo"])
        _check_messages(size, res, runs)
        _check_order(size, res, runs)
        _check_memory(size, res, runs)
        _check_values(size, res, salts, 0, "pp-values", runs)
        _check_values(size, res, salts, 1, "pp-accumulate", runs)
        check_pp_wire(links, size, runs)

