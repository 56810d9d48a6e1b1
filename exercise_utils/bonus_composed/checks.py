"""Checkers of notebook 11 for ``work/11_composed.py``: ``check_mesh`` and
``check_vocab_parallel`` (the judge: expected values come from :mod:`.refs`).

* ``check_mesh`` launches 8 gloo ranks (shapes 2x2x2, 1x2x4, 4x1x2, 2x4x1) and 6 (3x1x2,
  1x3x2, 2x3x1): ``mesh-pure`` (``mesh_coords`` and ``mesh_lines`` on every grid up to the
  world's size, ValueError on invalid arguments), ``mesh-groups`` (what ``Mesh`` holds on every
  rank, the groups it made: every line of every dimension in the order the notebook fixes, the
  same on every rank, nothing for invalid sizes, which raise ValueError), ``mesh-comm`` (an
  all-reduce of each rank's own number over each of its groups sums exactly that group's).
* ``check_vocab_parallel`` launches 4 gloo ranks (two tensor-parallel groups of 2: a group's
  rank is not the global rank) and 3 (the world): ``vp-group`` (``ReduceFromGroup``),
  ``vp-embedding`` (``VocabParallelEmbedding``; its forward on 2-D, 1-D and empty tokens:
  with no token the all-reduce and the gradient may be left out), ``vp-loss``
  (``VocabParallelCrossEntropy``), float64 and float32, against one process;
  ``vp-collectives``: one all-reduce of the embedding's output in its forward, three of ``N``
  numbers in the loss's forward, none in either backward, nothing else; ``vp-wire``: where
  links are observed (grading), with a wide table and wide logits more
  (:data:`.inputs.SIZES`), all links together carry what those all-reduces put there
  (:mod:`.wire`), whatever the ranks do to the recorder in their memory.

Tolerance: ``1e-10`` (float64) or ``1e-5`` (float32) times the largest reference magnitude.

Used in 11_bonus_composed.
"""
from pathlib import Path

import numpy as np
import torch

from ..contract import CheckFailure, fail
from ..harness import HANG_AFTER, check, observing, run_ranks
from ..integrity import verify_rank0_number
from ..notebook_files import no_file, unimplemented, unwritten
from ..rankworker import salted_generator
from ..recorder import verify_no_hidden
from . import inputs, probes, refs
from .wire import check_vocab_wire

__all__ = ["check_mesh", "check_vocab_parallel"]

MESH_LAUNCHES = ((8, ((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 4, 1))),
                 (6, ((3, 1, 2), (1, 3, 2), (2, 3, 1))))
TOL = {"float64": 1e-10, "float32": 1e-5}
MESH_PIECES = ("mesh_coords", "mesh_lines", "Mesh.__init__")
VOCAB_PIECES = ("ReduceFromGroup.forward", "ReduceFromGroup.backward",
                "VocabParallelEmbedding.from_embedding", "VocabParallelEmbedding.forward",
                "VocabParallelCrossEntropy.forward", "VocabParallelCrossEntropy.backward")


def unfinished(found, path, pieces, sizes, passed):
    """The verdict of a check whose finished pieces all passed: ``found`` (the functions the
    ranks found unwritten) and those of ``pieces`` whose body still raises, in the order of
    ``pieces``; ``passed``: the pieces that passed with ``sizes`` ranks."""
    order = list(pieces)
    todo = [n for n in unimplemented(path) if n in order]
    todo = sorted(dict.fromkeys(found + todo), key=lambda n: order.index(n) if n in order
                  else len(order))
    raise CheckFailure("not implemented yet: " + unwritten(
        todo[0], path, todo[1:], passed=f"Finished and passing with {sizes} ranks: "
        f"{', '.join(passed)}." if passed else ""))


def close_to_scale(case, where, got, want, tol, scale, hint=""):
    """Fail ``case`` unless ``got`` has ``want``'s shape and lies within ``tol * scale`` of it
    (``scale`` given: one for all the arrays of a block); None: no gradient reached it. Used by
    :mod:`.checks_sp` and :mod:`.checks_step`."""
    if got is None:
        fail(case, f"{where} is None (no gradient reached it){hint}")
    got = np.asarray(got, dtype=np.float64)
    if got.shape != np.shape(want):
        fail(case, f"{where} has shape {got.shape}, expected {np.shape(want)}{hint}")
    diff = max_diff(got, want)
    if not np.isfinite(diff) or diff > tol * scale:
        fail(case, f"{where} differs from one process by {diff:.2e} (tolerance {tol:g} x "
                   f"{scale:.2e}){hint}")


def max_diff(a, e):
    """The largest absolute difference of two arrays (0 for empty ones)."""
    a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
    return float(np.max(np.abs(a - e))) if a.size else 0.0


# ------------------------------------------------------------------ the mesh
def _check_pure(pure):
    for (dp, pp, tp), got in pure["coords"]:
        for rank, item in enumerate(got):
            want = refs.coords(rank, dp, pp, tp)
            want = [want["dp"], want["pp"], want["tp"]]
            if (item.get("value") != want or item.get("type") != "tuple"
                    or item.get("numbers") != ["int"]):
                said = (f"raised {item['raised']} ({item['message']})" if "raised" in item
                        else f"returned {item.get('value')!r} ({item.get('type')} of "
                             f"{', '.join(item.get('numbers', []))})")
                fail("mesh-pure", f"mesh_coords({rank}, {dp}, {pp}, {tp}) {said}; expected the "
                                  f"tuple of ints {tuple(want)}: rank = (d * pp + p) * tp + t, "
                                  "tp varying fastest")
    for (dp, pp, tp), got in pure["lines"]:
        for dim, item in got.items():
            want = refs.lines(dim, dp, pp, tp)
            if (item.get("value") != want or item.get("type") != "list"
                    or item.get("inner") != ["list"] or item.get("numbers") != ["int"]):
                said = (f"raised {item['raised']} ({item['message']})" if "raised" in item
                        else f"returned {item.get('value')!r} (a {item.get('type')} of "
                             f"{', '.join(item.get('inner', []))} of "
                             f"{', '.join(item.get('numbers', []))})")
                fail("mesh-pure", f"mesh_lines({dim!r}, {dp}, {pp}, {tp}) {said}; expected "
                                  f"the list of lists of ints {want} (the ranks that share the "
                                  f"other two coordinates, each list ordered by {dim}, the "
                                  "lists by their first rank)")
    for name, args, got in pure["errors"]:
        if got.get("raised") != "ValueError":
            did = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                   else f"returned {got.get('value')!r}")
            fail("mesh-pure", f"{name}({', '.join(args)}) {did}; expected ValueError")


def _check_meshes(size, res, salts):
    values = [inputs.mesh_value(salts[r], r) for r in range(size)]
    for rank, out in enumerate(res):
        for got in out["meshes"]:
            dp, pp, tp = got["shape"]
            where = f"with {size} ranks, rank {rank}: Mesh({dp}, {pp}, {tp})"
            want, made = refs.mesh(rank, dp, pp, tp), refs.made(dp, pp, tp)
            if got["made"] != made:
                fail("mesh-groups", f"{where} called dist.new_group with {got['made']}; "
                                    f"expected {made}: every rank makes every group of every "
                                    "dimension (dp, then pp, then tp; each dimension's groups "
                                    "in the order of mesh_lines) and nothing else")
            for key in ("sizes", "coords", "ranks", "prev", "next"):
                if got[key] != want[key]:
                    fail("mesh-groups", f"{where}.{key} is {got[key]!r}; expected "
                                        f"{want[key]!r}")
    for rank, out in enumerate(res):
        for got in out["meshes"]:
            dp, pp, tp = got["shape"]
            want = refs.mesh(rank, dp, pp, tp)["ranks"]
            for dim, members in got["members"].items():
                if members != want[dim]:
                    fail("mesh-comm", f"with {size} ranks, rank {rank}: Mesh({dp}, {pp}, {tp})"
                                      f".groups[{dim!r}] is a group of {members}; expected the "
                                      f"group of {want[dim]}")
            for dim in ("dp", "pp", "tp"):
                total = sum(values[r] for r in want[dim])
                if got["sums"] is None or got["sums"][dim] != total:
                    fail("mesh-comm", f"with {size} ranks, rank {rank}: Mesh({dp}, {pp}, {tp})"
                                      f": an all-reduce over groups[{dim!r}] summed "
                                      f"{None if got['sums'] is None else got['sums'][dim]}; "
                                      f"expected {total}, the sum over ranks {want[dim]}")
    for rank, out in enumerate(res):
        for shape, got, made in out["errors"]:
            where = f"with {size} ranks, rank {rank}: Mesh({', '.join(shape)})"
            if "todo" in got:
                continue
            if got.get("raised") != "ValueError":
                did = (f"raised {got['raised']} ({got['message']})" if "raised" in got
                       else "returned")
                fail("mesh-groups", f"{where} {did}; expected ValueError (dp, pp, tp positive "
                                    f"ints whose product is the world size, {size})")
            if made:
                fail("mesh-groups", f"{where} made groups {made} before it raised: check the "
                                    "sizes first (check_sizes), before any group is made")


@check
def check_mesh(path):
    """Your mesh with 8 and 6 gloo ranks: coordinates and lines on every grid, every rank's
    Mesh on seven shapes (its groups, made in order; its neighbours), each group shown to
    work by an all-reduce; ValueError on invalid sizes."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    for size, shapes in MESH_LAUNCHES:
        salts = {}
        res = run_ranks(path, probes.probe_mesh, size, "gloo", {"shapes": shapes}, HANG_AFTER,
                        what=f"11_composed.py's Mesh with {size} ranks", case="mesh-groups",
                        salts=salts)
        salts = [salts.get(r, 0) for r in range(size)]
        pure = res[0]["pure"]
        found = [pure["todo"]] if "todo" in pure else []
        found += [m["todo"] for out in res for m in out["meshes"] if "todo" in m]
        if "todo" not in pure:
            _check_pure(pure)
        if not found and not all(out["meshes"] for out in res):
            fail("mesh-pure", f"with {size} ranks, mesh_lines did not cut the world into lines "
                              f"on every rank (each rank in one line of each dimension, of "
                              f"that dimension's size), so Mesh was not tried")
        if not any("todo" in m for out in res for m in out["meshes"]):
            _check_meshes(size, res, salts)
        if found:
            passed = [n for n in ("mesh_coords", "mesh_lines") if n not in found]
            unfinished(found, path, MESH_PIECES, f"{size}", passed)


# ------------------------------------------------------------------ the vocabulary
def _describe_events(events):
    return ", ".join(f"{e[1]} of {e[2]} numbers" for e in events if e[0] == "coll") or "none"


def _collectives(where, events, want_n, what):
    colls = [e for e in events if e[0] == "coll"]
    if [(e[1], e[2]) for e in colls] != [("all_reduce", n) for n in want_n]:
        fail("vp-collectives", f"{where} issued {_describe_events(colls)}; expected "
                               f"{what}")


def close(case, where, got, want, tol, hint=""):
    """Fail ``case`` unless ``got`` has ``want``'s shape and lies within ``tol`` times its
    largest magnitude (at least 1) of it; None: no gradient reached it."""
    scale = max(1.0, float(np.max(np.abs(want)))) if np.size(want) else 1.0
    close_to_scale(case, where, got, want, tol, scale, hint)


def _check_group(size, res, salts, launch):
    for rank, out in enumerate(res):
        got = out["parts"]["group"]
        if "todo" in got:
            continue
        members = out["members"]
        xs, ups = {}, {}
        for r in members:
            gen = salted_generator(7500 + members.index(r), salts[r])
            xs[r] = torch.randn(3, 4, dtype=torch.float64, generator=gen).numpy()
            ups[r] = torch.randn(3, 4, dtype=torch.float64, generator=gen).numpy()
        where = f"with {launch}, rank {rank}: ReduceFromGroup.apply(x, group)"
        close("vp-group", where, got["y"], sum(xs.values()), 1e-12,
               " (the sum of x over the ranks of the group, not of the world)")
        close("vp-group", f"{where}: the gradient of x", got["x_grad"], ups[rank], 1e-12,
               " (the backward returns the incoming gradient as it is)")
        if not got["x_kept"]:
            fail("vp-group", f"{where} modified x in place: all-reduce a copy")
        _collectives(where, got["forward"], [12], "one all_reduce of x's 12 numbers")
        _collectives(f"{where}'s backward", got["backward"], [], "none")


PARTS = (("float64", "small"), ("float32", "small"), ("float64", "wire"))


def _part(kind, dtype, size):
    return f"{kind}-{dtype}" if size == "small" else f"{kind}-wire"


def _group_parts(res, kind):
    """``(rank, out, members, group index, t, group rank, dtype, size, result)`` for every
    finished part of ``kind`` (``"embedding"`` or ``"loss"``) on every rank."""
    for rank, out in enumerate(res):
        members, gi = out["members"], out["group"]
        for dtype, part in PARTS:
            got = out["parts"].get(_part(kind, dtype, part))
            if got is not None and "todo" not in got:
                yield (rank, out, members, gi, len(members), members.index(rank), dtype, part,
                       got)


def _check_embedding(size, res, salts, launch):
    for rank, out, members, gi, t, gr, dtype, part, got in _group_parts(res, "embedding"):
        k = inputs.SIZES[part][0]
        own = [salts[r] for r in members]
        ref = refs.vocab(own, out["salt0"], gi, t, getattr(torch, dtype), part)
        full = inputs.table(own, gi, t, getattr(torch, dtype), part).double().numpy()
        wide = "" if part == "small" else " (the wide table)"
        where = (f"with {launch}, rank {rank} (group rank {gr} of {t}): "
                 f"VocabParallelEmbedding.from_embedding(emb, group) in {dtype}{wide}")
        if not got["source_kept"] or got["emb_grad"]:
            fail("vp-embedding", f"{where} changed emb or let gradients reach it: emb "
                                 "itself is left as it is (its shard is a copy)")
        w = got["weight"]
        if w is None:
            fail("vp-embedding", f"{where} has no weight tensor")
        close("vp-embedding", f"{where}.weight", w["value"],
               refs.digest(full[gr * k:(gr + 1) * k], part != "small"), 0.0 if part == "small"
               else 1e-12, f" (group rank r holds rows [r*k, (r+1)*k) of the table, k = "
                           f"V / t = {k})")
        if got["outs"] is None:
            fail("vp-embedding", f"{where}: a rank's weight has another shape than "
                                 f"({k}, {inputs.SIZES[part][1]}) (group rank r holds rows "
                                 f"[r*k, (r+1)*k) of the table, k = V / t = {k})")
        if w["is_view"] or w["dtype"] != f"torch.{dtype}" or not w["requires_grad"]:
            fail("vp-embedding", f"{where}.weight: a view of emb's weight "
                                 f"{w['is_view']}, dtype {w['dtype']}, requires_grad "
                                 f"{w['requires_grad']}; expected a copy of emb's dtype "
                                 "that requires grad")
        tol = TOL[dtype]
        want_grad = refs.embedding_grads(salts, members, out["salt0"], gi, t, dtype, part)
        for name, o in got["outs"].items():
            what = f"{where}: forward on {name} tokens"
            want_y = inputs.token_case(name, ref["emb"])
            n = int(np.size(want_y))            # (an empty batch: no numbers, its shape kept)
            got_y = np.asarray(o["y"], dtype=np.float64).reshape(o["shape"])
            close("vp-embedding", f"{what}: the output", got_y, want_y, tol,
                   " (every rank returns the full table's embedding: its rows' lookups, "
                   "zeros for the other tokens, summed over the group)")
            if o["dtype"] != f"torch.{dtype}":
                fail("vp-embedding", f"{what}: the output is {o['dtype']}, expected "
                                     f"torch.{dtype}")
            if n or any(e[0] == "coll" for e in o["forward"]):   # (nothing to sum: it may skip)
                _collectives(what, o["forward"], [n], f"one all_reduce of the output's {n} "
                                                      "numbers")
            _collectives(f"{what}: its backward", o["backward"], [], "none (the "
                         "backward of a sum is the identity)")
            if not n and o["grad"] is None:     # no token: zeros or no gradient at all
                continue
            close("vp-embedding", f"{where}: the gradient of weight after the forward on "
                   f"{name} tokens", o["grad"],
                   refs.digest(want_grad[name][gr * k:(gr + 1) * k], part != "small"), tol,
                   " (its rows of the full table's gradient; the backward does not sum)")
        if not got["tokens_kept"]:
            fail("vp-embedding", f"{where}: the forward modified the tokens in place")
    for rank, out in enumerate(res):
        bad, t = out["parts"]["not-divisible"], len(out["members"])
        k = inputs.VOCAB_PER_RANK
        if "todo" not in bad and bad.get("raised") != "ValueError":
            did = f"raised {bad['raised']} ({bad['message']})" if "raised" in bad else "returned"
            fail("vp-embedding", f"with {launch}, rank {rank}: "
                                 f"VocabParallelEmbedding.from_embedding on a table of "
                                 f"{t * k + 1} rows (not divisible by {t}) {did}; expected "
                                 "ValueError")


def _check_loss(size, res, salts, launch):
    for rank, out, members, gi, t, gr, dtype, part, got in _group_parts(res, "loss"):
        k, rows = inputs.SIZES[part][0], inputs.SIZES[part][2]
        ref = refs.vocab([salts[r] for r in members], out["salt0"], gi, t,
                         getattr(torch, dtype), part)
        tol = TOL[dtype]
        wide = "" if part == "small" else f" (the wide logits, {rows} x {t * k})"
        where = (f"with {launch}, rank {rank} (group rank {gr} of {t}): "
                 f"vocab_parallel_cross_entropy in {dtype}{wide}")
        if got["dim"] != 0 or got["dtype"] != f"torch.{dtype}":
            fail("vp-loss", f"{where} returned {got['dtype']} of dim {got['dim']}; expected "
                            f"a 0-dim tensor of the logits' dtype (torch.{dtype})")
        close("vp-loss", f"{where}: the loss", [got["loss"]], [ref["loss"]], tol,
               " (the mean over the rows of -log softmax(full logits)[target], every row's "
               "maximum over all V columns subtracted before exp; row 1's logits are near "
               f"{inputs.BIG:g})")
        close("vp-loss", f"{where}: the gradient of the logits", got["grad"],
               refs.digest(ref["logits_grad"][:, gr * k:(gr + 1) * k], part != "small"), tol,
               f" (this rank's columns of (softmax - one_hot) / N times the incoming "
               f"gradient, {inputs.LOSS_SCALE:g} here)")
        if not got["kept"]:
            fail("vp-loss", f"{where} modified the logits or the targets in place")
        _collectives(where, got["forward"], [rows] * 3,
                     f"three all_reduce of N = {rows} numbers (the maxima, the sums of "
                     "exponentials, the target logits); the full logits are never gathered")
        _collectives(f"{where}: its backward", got["backward"], [], "none: the backward "
                     "needs only what the forward saved")


@check
def check_vocab_parallel(path):
    """Your ReduceFromGroup, VocabParallelEmbedding and VocabParallelCrossEntropy on two
    tensor-parallel groups of 2 ranks and on a world of 3, float64 and float32, against one
    process; the all-reduces of each forward and none in any backward. Where links are observed
    (grading), with a wide table and wide logits more, all links together must carry what those
    all-reduces put there (``vp-wire``: right files measured 0.39 to 0.42 of the most; the full
    logits gathered beside them, 4.4 times the most)."""
    path = Path(path)
    if not path.is_file():
        raise CheckFailure(no_file(path))
    found, observed = [], observing()
    for launch, size, groups in inputs.VOCAB_LAUNCHES:
        salts, links = {}, {}
        res = run_ranks(path, probes.probe_vocab, size, "gloo",
                        {"groups": groups, "wire": observed}, HANG_AFTER,
                        what=f"11_composed.py's vocabulary split with {launch}",
                        case="vp-group", salts=salts, links=links)
        try:
            verify_no_hidden(res, f"with {launch}", "dist.all_reduce")
        except AssertionError as err:
            raise CheckFailure(str(err)) from None
        verify_rank0_number(res, salts)
        salts = [salts.get(r, 0) for r in range(size)]
        found = [got["todo"] for out in res for got in out["parts"].values() if "todo" in got]
        _check_group(size, res, salts, launch)
        _check_embedding(size, res, salts, launch)
        _check_loss(size, res, salts, launch)
        if not found:
            check_vocab_wire(links, size, groups, launch)
    if found:
        passed = [p for p, names in (("ReduceFromGroup", VOCAB_PIECES[:2]),
                                     ("VocabParallelEmbedding", VOCAB_PIECES[2:4]),
                                     ("VocabParallelCrossEntropy", VOCAB_PIECES[4:]))
                  if not set(names) & set(found + unimplemented(path))]
        unfinished(found, path, VOCAB_PIECES, "4 and 3", passed)
