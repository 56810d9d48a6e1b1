"""Probe of notebook 11's ring-attention checker: runs inside every gloo rank
(:mod:`.checks_ring`).

Rank 0 tries the pure ``merge_blocks``, ``balanced_positions`` and ``block_pairs`` on the
judge's cases; then every rank, on each ring of the launch (:data:`.inputs.RING_LAUNCHES`:
the world, rings of 2 whose group ranks are not the global ranks, rings of 1) and each case
of :data:`.inputs.RING_CASES`, runs ``RingAttention`` forward and backward on its own tokens
(from its own number: the other ranks' tokens it builds are stand-ins), with every
point-to-point message recorded (:class:`~exercise_utils.recorder.PointToPoint`; one to a
rank that is not a ring neighbour is stopped before it is made), every ``block_forward`` /
``block_backward`` call counted (query x key entries), and what the forward keeps for the
backward measured (the tensors the autograd node saved or holds as attributes).

Returned as plain data. Used in 11_bonus_composed.
"""
import torch
import torch.distributed as dist

from ..rankworker import not_implemented
from ..recorder import PointToPoint
from . import inputs
from .probes import arr, digest
from .probes import call as _call

NEG_INF = float("-inf")


def _lse(t):
    return [None if x == NEG_INF else x for x in t.detach().double().reshape(-1).tolist()]


def merge_cases():
    """The judge's merge cases: ``(out, lse, out_b, lse_b)`` float64, rows with -inf on one side
    and on both."""
    gen = torch.Generator().manual_seed(7700)
    out, out_b = (torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in "ab")
    lse, lse_b = (torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) * 4 for _ in "ab")
    lse[..., 1], lse_b[..., 2] = NEG_INF, NEG_INF
    lse[..., 3] = lse_b[..., 3] = NEG_INF
    out[..., 1, :] = out[..., 3, :] = 0.0
    out_b[..., 2, :] = out_b[..., 3, :] = 0.0
    lse_b[..., 4] = lse[..., 4] + 800.0            # far apart: a naive exp overflows
    return out, lse, out_b, lse_b


PAIR_CASES = ((torch.tensor([0, 1, 2, 7, 8]), torch.tensor([3, 4, 5, 6]), True),
              (torch.tensor([3, 4, 5, 6]), torch.tensor([0, 1, 2, 7, 8]), True),
              (torch.tensor([0, 1, 2, 7, 8]), torch.tensor([0, 1, 2, 7, 8]), True),
              (torch.tensor([4, 5]), torch.tensor([0, 1]), True),
              (torch.tensor([0, 1]), torch.tensor([4, 5]), True),
              (torch.tensor([2, 9, 3]), torch.tensor([5, 6, 0]), True),
              (torch.tensor([0, 1, 2]), torch.tensor([5, 6]), False),
              (torch.tensor([0, 1, 5, 6]), torch.tensor([2, 3, 9]), False))
BALANCED = ((13, 3), (16, 4), (4, 2), (9, 1), (7, 3), (6, 3))
BAD_BALANCED = ((5, 3), (4, 0), (4.0, 2), (True, 1), ("8", 2), (8, None))


def _slice(s, n):
    return list(range(*s.indices(n))) if isinstance(s, slice) else repr(s)[:80]


def _pure(student):
    out = {}
    try:
        args = merge_cases()
        kept = [a.clone() for a in args]
        got = _call(student.merge_blocks, *args)
        if "value" in got:
            o, lse = got["value"]
            got = {"out": arr(o), "lse": _lse(lse), "shapes": [list(o.shape), list(lse.shape)],
                   "same": any(x is a for x in (o, lse) for a in args)}
        got["kept"] = all(torch.equal(a, b) for a, b in zip(args, kept))
        out["merge"] = got
    except NotImplementedError as exc:
        out["merge"] = not_implemented(student, exc)
    try:
        out["balanced"] = []
        for S, c in BALANCED + BAD_BALANCED:
            got = _call(student.balanced_positions, S, c)
            if "value" in got:
                v = got["value"]
                got = {"value": [[int(x) for x in p] for p in v] if isinstance(v, list)
                       else repr(v)[:100],
                       "dtypes": sorted({str(getattr(p, "dtype", type(p).__name__))
                                         for p in v}) if isinstance(v, list) else []}
            out["balanced"].append([repr(S), repr(c), got])
    except NotImplementedError as exc:
        out["balanced"] = not_implemented(student, exc)
    try:
        out["pairs"] = []
        for q_pos, k_pos, causal in PAIR_CASES:
            got = _call(student.block_pairs, q_pos, k_pos, causal)
            if "value" in got:
                got = {"value": [[_slice(qs, len(q_pos)), _slice(ks, len(k_pos)),
                                  None if m is None else m.tolist()]
                                 for qs, ks, m in got["value"]]}
            out["pairs"].append([q_pos.tolist(), k_pos.tolist(), causal, got])
    except NotImplementedError as exc:
        out["pairs"] = not_implemented(student, exc)
    return out


def _neighbours(group):
    me, c = dist.get_rank(group), dist.get_world_size(group)
    return (dist.get_global_rank(group, (me + 1) % c), dist.get_global_rank(group, (me - 1) % c))


class Stopped(Exception):
    """A message to a rank that is not a ring neighbour, stopped before it was made."""


def _counting(student, log):
    """Wrap the student's ``block_forward`` / ``block_backward``: each call logs ``("block",
    kind, Lq * Lk)``."""
    originals = {n: getattr(student, n) for n in ("block_forward", "block_backward")}

    def wrap(name, fn):
        def counted(q, k, *args, **kwargs):
            log.append((name, int(q.shape[-2]) * int(k.shape[-2]), None))
            return fn(q, k, *args, **kwargs)
        return counted
    for n, fn in originals.items():
        setattr(student, n, wrap(n, fn))
    return originals


def _kept_bytes(node, seen=None):
    """Bytes of floating-point tensors the autograd node ``node`` holds: saved, and as
    attributes (in lists, tuples, dicts too)."""
    total, ids = 0, set()

    def add(x, depth=0):
        nonlocal total
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() and id(x) not in ids:
                ids.add(id(x))
                total += x.numel() * x.element_size()
        elif isinstance(x, (list, tuple)) and depth < 3:
            for y in x:
                add(y, depth + 1)
        elif isinstance(x, dict) and depth < 3:
            for y in x.values():
                add(y, depth + 1)
    try:
        add(tuple(node.saved_tensors))
    except RuntimeError:
        pass
    for value in vars(node).values() if hasattr(node, "__dict__") else ():
        add(value)
    return total


def _run_case(student, group, ring, index, case, mine, log, nbrs):
    name, dtype, kind, causal, S = case
    c = len(ring)
    me = ring.index(dist.get_rank())
    positions = inputs.layout(kind, S, c)
    hd = inputs.head_dim(case)
    wide = hd != inputs.HD
    q, k, v, dout = inputs.qkv(mine, positions, index, dtype, hd)
    pos = positions[me]
    q, k, v = (t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v))
    dout = dout[:, :, pos].clone()
    log.clear()
    out = student.RingAttention.apply(q, k, v, positions, group, causal)
    forward = list(log)
    kept = _kept_bytes(out.grad_fn) if out.grad_fn is not None else 0
    log.clear()
    raised = None
    if out.requires_grad:
        try:          # (autograd checks what the backward returned after all its messages)
            out.backward(dout)
        except RuntimeError as exc:
            raised = str(exc)[:300]
    backward = list(log)
    own = sum(t.numel() * t.element_size() for t in (q, k, v, out)) + out[..., 0].numel() * \
        out.element_size()
    return {"out": digest(out, wide), "dtype": str(out.dtype), "dq": digest(q.grad, wide),
            "dk": digest(k.grad, wide), "dv": digest(v.grad, wide), "forward": forward,
            "backward": backward, "kept": kept,
            "own": own, "neighbours": list(nbrs), "positions": [p.tolist() for p in positions],
            "backward_raised": raised}


def probe_ring(student, ctx, rings, wire=False):
    """``{"pure": ... (rank 0), "rings": [{"ring": ranks, "cases": {name: result}}]}``."""
    torch.set_num_threads(1)
    own = getattr(ctx, "salt", 0)
    out = {"pure": None, "rings": []}
    ctx.case("ring-pure")
    if ctx.rank == 0:
        try:
            out["pure"] = _pure(student)
        except NotImplementedError as exc:
            out["pure"] = not_implemented(student, exc)
    made = []
    for spec in rings:                       # every rank makes every group, in one order
        if spec is None:
            made.append((None, tuple(range(ctx.size))))
        else:
            groups = [dist.new_group(list(r)) for r in spec]
            made.append(next((g, r) for g, r in zip(groups, spec) if ctx.rank in r))
    for group, ring in made:
        nbrs = _neighbours(group if group is not None else dist.group.WORLD)

        def expect(name, peer, nbrs=nbrs):
            want = nbrs[0] if name in ("send", "isend") else nbrs[1]
            if name in ("send", "isend", "recv", "irecv") and peer != want:
                raise Stopped(f"{name} with rank {peer}, not the ring's "
                              f"{'next' if name in ('send', 'isend') else 'previous'} rank "
                              f"{want}")
        mine = [own] * len(ring)
        results = {}
        with PointToPoint(student, expect) as rec:
            originals = _counting(student, rec.log)
            try:
                for index, case in enumerate(inputs.ring_cases(wire)):
                    ctx.case("ring-messages" if len(ring) > 1 else "ring-values")
                    try:
                        results[case[0]] = _run_case(student, group, list(ring), index, case,
                                                     mine, rec.log, nbrs)
                    except NotImplementedError as exc:
                        results[case[0]] = not_implemented(student, exc)
                        break
                    except Stopped as exc:
                        results[case[0]] = {"stopped": str(exc)}
                        break
                    ok = torch.tensor([0 if results[case[0]]["backward_raised"] else 1])
                    with rec.paths.sanctioned():        # the probe's own: every rank of the
                        rec.originals["all_reduce"](    # ring stops, or none
                            ok, op=dist.ReduceOp.MIN, group=group)
                    if not int(ok):
                        break
            finally:
                for n, fn in originals.items():
                    setattr(student, n, fn)
        out["rings"].append({"ring": list(ring), "cases": results})
    return out
