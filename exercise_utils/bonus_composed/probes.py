"""Probes of notebook 11's checkers: run inside every gloo rank (:mod:`.checks`).

* :func:`probe_mesh`: the pure ``mesh_coords`` and ``mesh_lines`` on every grid up to the
  world's size (rank 0), then ``Mesh(dp, pp, tp)`` for each shape of the world, every call to
  ``dist.new_group`` logged in order (its ranks), and what the mesh holds; where every rank's
  groups are what it says they are, one ``all_reduce`` of each rank's own number over each of
  its groups (so the groups are shown to work, not only to exist); invalid sizes must raise
  ValueError before any group is made.
* :func:`probe_vocab`: ``ReduceFromGroup``, ``VocabParallelEmbedding`` and
  ``VocabParallelCrossEntropy`` on the tensor-parallel groups of the launch
  (:data:`.inputs.VOCAB_LAUNCHES`), float64 and float32, every collective recorded
  (:class:`~exercise_utils.recorder.Recorder`) in the forward and in the backward apart.

Returned as plain data. Used in 11_bonus_composed.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..rankworker import not_implemented
from ..recorder import Recorder
from . import inputs

BAD_SIZES = ((0, 1, 1), (2, 2, 3), (2.0, 1, 1), (True, 1, 1), (-1, -1, 1), ("1", 1, 1))


@contextlib.contextmanager
def new_groups(student):
    """Log the ranks of every ``dist.new_group`` call (the student's, or one made for it by
    ``new_subgroups_by_enumeration``) while the block runs."""
    made, original = [], c10d.new_group

    def logged(ranks=None, *args, **kwargs):
        made.append(None if ranks is None else [int(r) for r in ranks])
        return original(ranks, *args, **kwargs)
    spots = [(m, k) for m in (dist, c10d, student) for k, v in list(vars(m).items())
             if v is original]
    for m, k in spots:
        setattr(m, k, logged)
    try:
        yield made
    finally:
        for m, k in spots:
            setattr(m, k, original)


def call(fn, *args):
    """``{"value": fn(*args)}``, or ``{"raised": type, "message": ...}`` for any exception but
    NotImplementedError (which goes up: the piece is not written yet)."""
    try:
        return {"value": fn(*args)}
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)[:200]}


def _pure(student, world):
    """mesh_coords and mesh_lines on every grid of at most ``world`` ranks, and invalid
    arguments."""
    out = {"coords": [], "lines": [], "errors": []}
    for dp in range(1, world + 1):
        for pp in range(1, world // dp + 1):
            for tp in range(1, world // (dp * pp) + 1):
                n = dp * pp * tp
                out["coords"].append([[dp, pp, tp], [_jsonable(call(student.mesh_coords, r,
                                                                     dp, pp, tp))
                                                     for r in range(n)]])
                out["lines"].append([[dp, pp, tp], {dim: _jsonable(call(student.mesh_lines, dim,
                                                                         dp, pp, tp))
                                                    for dim in ("dp", "pp", "tp")}])
    bad = [("mesh_coords", (4, 2, 1, 2)), ("mesh_coords", (-1, 2, 1, 1)),
           ("mesh_coords", (1, 0, 1, 1)), ("mesh_lines", ("cp", 1, 2, 1)),
           ("mesh_lines", ("tp", 1, 2.0, 1))]
    for name, args in bad:
        got = call(getattr(student, name), *args)
        out["errors"].append([name, list(map(repr, args)), _jsonable(got)])
    return out


def _jsonable(got):
    if "value" in got:
        v = got["value"]
        try:
            got = {"value": [list(map(int, x)) if isinstance(x, (list, tuple)) else int(x)
                             for x in v], "type": type(v).__name__,
                   "inner": sorted({type(x).__name__ for x in v}),
                   "numbers": sorted({type(y).__name__ for x in v
                                      for y in (x if isinstance(x, (list, tuple)) else [x])})}
        except (TypeError, ValueError):
            got = {"value": repr(v)[:200], "type": type(v).__name__}
    return got


def _describe(mesh, rank):
    got = {}
    for key in ("sizes", "coords", "ranks", "prev", "next"):
        value = getattr(mesh, key, "missing")
        if isinstance(value, dict):
            value = {k: (list(map(int, v)) if isinstance(v, (list, tuple)) else
                         v if isinstance(v, int) else repr(v)) for k, v in value.items()}
        elif not (value is None or isinstance(value, int)):
            value = repr(value)[:100]
        got[key] = value
    groups, members = getattr(mesh, "groups", None), {}
    for dim in ("dp", "pp", "tp"):
        group = groups.get(dim) if isinstance(groups, dict) else None
        try:
            members[dim] = [int(r) for r in dist.get_process_group_ranks(group)]
        except Exception as exc:                  # not a group, or one this rank is not in
            members[dim] = f"{type(exc).__name__}: {str(exc)[:100]}"
    got["members"] = members
    return got


def _all_reduce_each(mesh, members, value):
    """Each group's sum of the ranks' numbers, where every rank of the world found its groups
    to be groups it is in (else nobody communicates: a wrong group would hang)."""
    ok = all(isinstance(m, list) and dist.get_rank() in m for m in members.values())
    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not int(flag):
        return None
    sums = {}
    for dim in ("dp", "pp", "tp"):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, group=mesh.groups[dim])
        sums[dim] = float(t)
    return sums


def _usable(student, shapes, world):
    """Whether ``mesh_lines`` of every shape cuts the world into lines of its dimension's size
    (each rank in exactly one line of each dimension) without raising: what ``Mesh`` builds on.
    A stub (NotImplementedError) is usable: ``Mesh`` then reports it."""
    try:
        for shape in shapes:
            for dim, n in zip(("dp", "pp", "tp"), shape):
                lines = student.mesh_lines(dim, *shape)
                flat = sorted(int(r) for line in lines for r in line)
                if flat != list(range(world)) or any(len(line) != n for line in lines):
                    return False
    except NotImplementedError:
        return True
    except Exception:
        return False
    return True


def probe_mesh(student, ctx, shapes):
    """``{"pure": ... (rank 0), "meshes": [...], "errors": [...]}``."""
    torch.set_num_threads(1)
    out = {"pure": None, "meshes": [], "errors": []}
    ctx.case("mesh-pure")
    if ctx.rank == 0:
        try:
            out["pure"] = _pure(student, ctx.size)
        except NotImplementedError as exc:
            out["pure"] = not_implemented(student, exc)
    value = inputs.mesh_value(getattr(ctx, "salt", 0), ctx.rank)
    flag = torch.tensor([1 if _usable(student, shapes, ctx.size) else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not int(flag):           # Mesh would fail on some ranks and hang the others: the
        return out              # judge reports what mesh_coords / mesh_lines got wrong
    for shape in shapes:
        ctx.case("mesh-groups")
        with new_groups(student) as made:
            try:
                mesh = student.Mesh(*shape)
            except NotImplementedError as exc:
                out["meshes"].append({"shape": shape, **not_implemented(student, exc)})
                break
        got = _describe(mesh, ctx.rank)
        ctx.case("mesh-comm")
        got.update(shape=list(shape), made=made, sums=_all_reduce_each(mesh, got["members"],
                                                                      value))
        out["meshes"].append(got)
    ctx.case("mesh-groups")
    for shape in BAD_SIZES:
        with new_groups(student) as made:
            try:
                student.Mesh(*shape)
                got = {"returned": True}
            except NotImplementedError as exc:
                got = not_implemented(student, exc)
            except Exception as exc:
                got = {"raised": type(exc).__name__, "message": str(exc)[:200]}
        out["errors"].append([list(map(repr, shape)), got, made])
    return out


# ------------------------------------------------------------------ the vocabulary, split
def arr(t):
    """A tensor as plain data (float64 lists), or None."""
    return None if t is None else t.detach().double().numpy().tolist()


def _reduce_from_group(student, rec, group, gr, salt):
    from ..rankworker import salted_generator
    gen = salted_generator(7500 + gr, salt)
    x = torch.randn(3, 4, dtype=torch.float64, generator=gen).requires_grad_(True)
    up = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    before = x.detach().clone()
    rec.take()
    y = student.ReduceFromGroup.apply(x, group)
    forward = rec.take()
    y.backward(up)
    return {"y": arr(y), "x_grad": arr(x.grad), "x_kept": bool(torch.equal(x.detach(), before)),
            "forward": forward, "backward": rec.take()}


def digest(t, wide):
    """A tensor as the plain data of a report: whole, or (``wide``: too wide to send whole)
    each row's product with :func:`.inputs.projection` (the judge's twin: :func:`.refs.digest`)."""
    if t is None or not wide:
        return arr(t)
    return arr(t.detach().double() @ inputs.projection(t.shape[-1]))


def _embedding(student, rec, group, gi, t, gr, mine, salt0, dtype, size="small"):
    table = inputs.table(mine, gi, t, dtype, size)
    emb = torch.nn.Embedding.from_pretrained(table.clone(), freeze=False)
    tokens, _, upstream = inputs.shared(salt0, gi, t, dtype, size)
    tokens_before = tokens.clone()
    shard = student.VocabParallelEmbedding.from_embedding(emb, group)
    got = {"source_kept": bool(torch.equal(emb.weight.detach(), table))}
    w = getattr(shard, "weight", None)
    got["weight"] = None if not isinstance(w, torch.Tensor) else {
        "value": digest(w, size != "small"), "dtype": str(w.dtype),
        "requires_grad": bool(w.requires_grad),
        "is_view": bool(w.data_ptr() >= emb.weight.data_ptr()
                        and w.data_ptr() < emb.weight.data_ptr() + emb.weight.numel()
                        * emb.weight.element_size())}
    per, d, _, _ = inputs.SIZES[size]
    shaped = torch.tensor([1 if isinstance(w, torch.Tensor) and tuple(w.shape) == (per, d)
                           else 0])
    rec.call("all_reduce", shaped, op=dist.ReduceOp.MIN)
    got["tokens_kept"], got["emb_grad"], got["outs"] = True, False, None
    if not int(shaped):         # a shard of the wrong rows: the judge says which rows
        return got
    rec.take()
    outs = {}
    cases = inputs.token_cases(tokens, upstream) if size == "small" else (
        ("2-d", tokens, upstream),)
    for name, toks, up in cases:
        try:
            y = shard(toks)
        except Exception as exc:
            exc.add_note(f"(VocabParallelEmbedding's forward on {name} tokens, of shape "
                         f"{tuple(toks.shape)})")
            raise
        outs[name] = {"y": arr(y), "shape": list(y.shape), "dtype": str(y.dtype),
                      "forward": rec.take()}
        if y.requires_grad:
            (y * up).sum().backward()
        outs[name]["backward"] = rec.take()
        outs[name]["grad"] = digest(getattr(shard, "weight").grad, size != "small")
        shard.weight.grad = None
    got.update(outs=outs, tokens_kept=bool(torch.equal(tokens, tokens_before)),
               emb_grad=emb.weight.grad is not None)
    return got


def _loss(student, rec, group, gi, t, gr, mine, salt0, dtype, size="small"):
    full = inputs.logits(mine, gi, t, dtype, size)
    k = inputs.SIZES[size][0]
    logits = full[:, gr * k:(gr + 1) * k].clone().requires_grad_(True)
    _, targets, _ = inputs.shared(salt0, gi, t, dtype, size)
    kept = (logits.detach().clone(), targets.clone())
    rec.take()
    loss = student.vocab_parallel_cross_entropy(logits, targets, group)
    forward = rec.take()
    (loss * inputs.LOSS_SCALE).backward()
    backward = rec.take()
    return {"loss": float(loss.detach()) if isinstance(loss, torch.Tensor) else repr(loss),
            "dim": loss.dim() if isinstance(loss, torch.Tensor) else None,
            "dtype": str(getattr(loss, "dtype", type(loss).__name__)),
            "grad": digest(logits.grad, size != "small"), "forward": forward, "backward": backward,
            "kept": bool(torch.equal(logits.detach(), kept[0]) and torch.equal(targets, kept[1]))}


def tp_group(ctx, groups):
    """What a probe of a tensor-parallel group starts with (before any recorder): rank 0's
    number broadcast to all, the groups made (``groups``: tuples of global ranks, every rank
    makes each, in order; None: the world) and this rank's: ``(salt0, group, its index,
    members, t, group rank, mine)``, ``mine`` this rank's own number for every rank of the group
    (only its own is true: the others' parts it builds are stand-ins)."""
    torch.set_num_threads(1)
    salt = torch.tensor([getattr(ctx, "salt", 0) if ctx.rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(salt, src=0)
    salt0 = int(salt.item())
    if groups is None:
        group, gi, members = dist.group.WORLD, 0, list(range(ctx.size))
    else:
        made = [dist.new_group(list(g)) for g in groups]
        gi = next(i for i, g in enumerate(groups) if ctx.rank in g)
        group, members = made[gi], list(groups[gi])
    t, gr = len(members), members.index(ctx.rank)
    return salt0, group, gi, members, t, gr, [getattr(ctx, "salt", 0)] * t


def probe_vocab(student, ctx, groups=None, wire=False):
    """``{"salt0", "group": index, "parts": {part: result}, "hidden": [...]}``: the pieces on
    this rank's group (``groups``: the tensor-parallel groups to make, None: the world;
    ``wire``: the wide float64 parts too, :data:`.inputs.SIZES`)."""
    salt0, group, gi, members, t, gr, mine = tp_group(ctx, groups)
    rec = Recorder()
    rec.install(student)
    parts = {}
    try:
        for name, case, run in (
                ("group", "vp-group",
                 lambda: _reduce_from_group(student, rec, group, gr, mine[gr])),
                *((f"embedding-{str(d)[6:]}", "vp-embedding",
                   lambda d=d: _embedding(student, rec, group, gi, t, gr, mine, salt0, d))
                  for d in inputs.DTYPES),
                *((f"loss-{str(d)[6:]}", "vp-loss",
                   lambda d=d: _loss(student, rec, group, gi, t, gr, mine, salt0, d))
                  for d in inputs.DTYPES),
                *((("embedding-wire", "vp-embedding",
                    lambda: _embedding(student, rec, group, gi, t, gr, mine, salt0,
                                       torch.float64, "wire")),
                   ("loss-wire", "vp-loss",
                    lambda: _loss(student, rec, group, gi, t, gr, mine, salt0, torch.float64,
                                  "wire"))) if wire else ())):
            ctx.case(case)
            try:
                parts[name] = run()
            except NotImplementedError as exc:
                parts[name] = not_implemented(student, exc)
        ctx.case("vp-embedding")
        bad = torch.nn.Embedding(t * inputs.VOCAB_PER_RANK + 1, 2)
        try:
            student.VocabParallelEmbedding.from_embedding(bad, group)
            parts["not-divisible"] = {"returned": True}
        except NotImplementedError as exc:
            parts["not-divisible"] = not_implemented(student, exc)
        except Exception as exc:
            parts["not-divisible"] = {"raised": type(exc).__name__, "message": str(exc)[:200]}
        hidden = rec.take_hidden()
    finally:
        rec.uninstall()
    return {"salt0": salt0, "group": gi, "members": members, "parts": parts, "hidden": hidden}
