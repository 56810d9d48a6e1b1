"""What runs inside the gloo ranks of notebook 03's ring all-reduce check, and its inputs.

:func:`probe_ring` runs the student's ``ring_all_reduce`` on every case of :func:`ring_cases`
(with 4 ranks then on :data:`GROUP_CASES` inside the process groups of :data:`GROUPS`,
whose ranks are not consecutive), each charged to its check case (``ctx.case``), inside
:func:`recording`, which wraps ``torch.distributed`` so that every message the ring sends (and
any collective it calls) is logged, and a message to or from a rank other than the ring
neighbour is stopped with a clear error before it is made (it would otherwise hang or crash
the ring with a message that names no cause). The wrappers are installed inside the probe
only, and removed when it returns: importing this module patches nothing. The verdict is
:mod:`.checks_ring`.

Used in 03_torch_distributed_collectives.
"""
import torch

from ..rankworker import salted_generator
from ..recorder import SENDS, PointToPoint

GROUP_HINT = (" (with a group, rank and size are dist.get_rank(group) and "
              "dist.get_world_size(group); send/recv take global ranks: translate group rank r "
              "with dist.get_global_rank(group, r), and pass group=group)")
CHUNK_HINT = (" (torch.tensor_split(tensor.view(-1), world_size) always returns world_size "
              "chunks, some empty when numel < world_size; torch.chunk may return fewer)")


def ring_cases(size):
    """The ``(case, shape, dtype)`` inputs tried with ``size`` ranks: the baseline (a length
    every world size divides, float32) first, then one dimension changed at a time: lengths
    that do not divide, more dimensions, float64, integers beyond float's range, tensors
    smaller than the world (one element, none at all)."""
    return [("ring-sum", (60,), "float32"),
            ("ring-uneven", (1007,), "float32"), ("ring-uneven", (2 * size + 1,), "float32"),
            ("ring-shape", (5, 7), "float32"), ("ring-shape", (4, 3, 5), "float32"),
            ("ring-float64", (60,), "float64"), ("ring-float64", (5, 7), "float64"),
            ("ring-integer", (2 * size * 5,), "int64"), ("ring-integer", (10007,), "int32"),
            ("ring-small", (size - 1,), "int64"), ("ring-small", (1,), "float32"),
            ("ring-small", (0, 3), "float32")]


# With 4 ranks (not in the first launch: a ring that ignores the group fails these cases, and a
# crash there would hide what the earlier cases show) the ring also runs inside process groups whose
# ranks are not consecutive (so that group rank + offset is not the global rank): each group
# sums its own ranks' tensors only; a group of one rank returns its tensor as it is.
# Cases: (case, shape, dtype).
GROUPS = {4: [[1], [0, 2, 3]]}
GROUP_CASES = [("ring-group", (1007,), "float32"), ("ring-group", (2,), "int64")]
GROUP_CASE0 = 100       # ring_input's case numbers of the group cases: 100, 101, ...
INT_RANGE = {"int64": 2 ** 58, "int32": 2 ** 28}   # |values| below: float64 cannot hold every
#                       int64 of this size, float32 no int32; sums of 4 ranks do not overflow


def group_of(rank, size):
    """The ranks of the group ``rank`` belongs to in the group cases (None: no group cases)."""
    return next((g for g in GROUPS.get(size, []) if rank in g), None)


def ring_input(shape, dtype, rank, case, salt=0):
    """The tensor rank ``rank`` contributes in case number ``case``. With ``salt`` 0 every
    rank can rebuild it; where the judge observes the links each rank's salt is its own
    (``ctx.salt``), and only the judge knows them all."""
    g = salted_generator(1000 * case + rank, salt)
    if dtype.startswith("int"):
        bound = INT_RANGE[dtype]
        return torch.randint(-bound, bound, shape, generator=g, dtype=getattr(torch, dtype))
    values = torch.randn(shape, generator=g, dtype=torch.float64) * 10 + rank
    return values.to(getattr(torch, dtype))


def ring_sum(shape, dtype, ranks, case, salts=None):
    """The exact sum over ``ranks`` (int64 for integers, float64 for floats), as numpy;
    ``salts``: each rank's salt (``{rank: salt}``; 0 for a rank not in it)."""
    wide = torch.int64 if dtype.startswith("int") else torch.float64
    total = torch.zeros(shape, dtype=wide)
    for r in ranks:
        total += ring_input(shape, dtype, r, case, (salts or {}).get(r, 0)).to(wide)
    return total.numpy()


class WrongPeer(RuntimeError):
    """A message to or from a rank that is not the ring neighbour (stopped before it is made)."""


def _expect(name, peer, ring):
    """Stop a message to or from the wrong rank before it is made (it would hang or crash the
    ring with a message that names no cause). ``ring``: the probe's ``{"right", "left"}``."""
    want = ring.get("right" if name in SENDS else "left")
    if want is None or peer is None or peer == want:
        return
    side = (f"sent to rank {peer}: in a ring every rank sends only to its right neighbour "
            f"(rank + 1) % world_size" if name in SENDS else
            f"received from rank {peer}: in a ring every rank receives only from its left "
            f"neighbour (rank - 1) % world_size")
    raise WrongPeer(f"dist.{name} {side}, here global rank {want}")


def recording(student=None, ring=None):
    """A :class:`exercise_utils.recorder.PointToPoint` (``with recording(...) as rec``; the
    calls in ``rec.log``, as ``(name, elements, peer)``) that stops a message to or from a
    rank other than the ring neighbour before it is made.

    Args:
        student: the student's module (names it imported from ``torch.distributed``).
        ring: a dict the caller keeps up to date with the global ranks this rank must send
            to (``"right"``) and receive from (``"left"``); a message to or from another rank
            raises :class:`WrongPeer` before it is made. ``None``/empty: no such check.
    """
    ring = {} if ring is None else ring
    return PointToPoint(student, lambda name, peer: _expect(name, peer, ring))


def probe_ring(student, ctx, cases, group_cases=()):
    """Run ``ring_all_reduce`` on every case; return per case the result and the calls.

    ``cases`` and ``group_cases`` are ``(case, shape, dtype)``; each input is charged to its
    case (``ctx.case``), a message to a rank other than the neighbour to ``ring-neighbours``
    (``ring-group`` inside a group). ``group_cases`` (with 4 ranks) run after the
    others, each rank passing ``group=`` the process group of :data:`GROUPS` it belongs to
    (created before the recording starts).
    """
    import torch.distributed as dist
    groups = [dist.new_group(g) for g in GROUPS.get(ctx.size, [])] if group_cases else []
    mine = next((grp for grp, g in zip(groups, GROUPS.get(ctx.size, [])) if ctx.rank in g), None)
    runs = [(i, *c, None) for i, c in enumerate(cases)]
    runs += [(GROUP_CASE0 + i, *c, mine) for i, c in enumerate(group_cases)]
    results, ring = [], {}
    with recording(student, ring) as rec:
        for number, case, shape, dtype, group in runs:
            ctx.case(case)
            ranks = group_of(ctx.rank, ctx.size) if group is not None else list(range(ctx.size))
            pos = ranks.index(ctx.rank)
            ring.update(right=ranks[(pos + 1) % len(ranks)], left=ranks[pos - 1])
            tensor = ring_input(shape, dtype, ctx.rank, number, ctx.salt)
            ptr = tensor.data_ptr()
            rec.take()
            try:
                out = (student.ring_all_reduce(tensor) if group is None
                       else student.ring_all_reduce(tensor, group=group))
            except NotImplementedError:
                raise
            except Exception as exc:    # keep type and traceback; say which case failed
                if isinstance(exc, WrongPeer) and group is None:
                    ctx.case("ring-neighbours")
                where = f"ring_all_reduce on a tensor of shape {tuple(shape)}, dtype {dtype}, "
                hint = CHUNK_HINT if isinstance(exc, IndexError) else ""
                if group is not None:
                    where += (f"group=dist.new_group({group_of(ctx.rank, ctx.size)}) (this rank's "
                              f"group), ")
                    hint += GROUP_HINT
                exc.args = (f"{where}with {ctx.size} ranks: {exc}{hint}",)
                raise
            results.append({"value": tensor.numpy().copy(), "same": out is tensor and
                            tensor.data_ptr() == ptr, "returned": type(out).__name__,
                            "dtype": str(tensor.dtype), "calls": rec.take()})
    return results
