"""What runs inside the gloo ranks of notebook 03's ring all-reduce check, and its inputs.

:func:`probe_ring` runs the student's ``ring_all_reduce`` on every case of :func:`ring_cases`
inside :func:`recording`, which wraps ``torch.distributed`` so that every message the ring
sends (and any collective it calls) is logged. The wrappers are installed inside the probe
only, and removed when it returns: importing this module patches nothing. The verdict is
:mod:`.checks_ring`.

Used in 03_torch_distributed_collectives.
"""
from contextlib import contextmanager

import torch

from .. import pgwatch

P2P = ("send", "recv", "isend", "irecv")
SENDS = ("send", "isend")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
               "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
               "all_to_all", "all_to_all_single", "all_reduce_coalesced", "barrier",
               "monitored_barrier", "send_object_list", "recv_object_list")


CHUNK_HINT = (" (torch.tensor_split(tensor.view(-1), world_size) always returns world_size "
              "chunks, some empty when numel < world_size; torch.chunk may return fewer)")


def ring_cases(size):
    """The (shape, dtype) cases tried with ``size`` ranks, most telling first."""
    return [((1007,), "float32"), ((5, 7), "float64"), ((size - 1,), "int64"), ((1,), "float32"),
            ((4, 3, 5), "float32"), ((2 * size * 5,), "int64"), ((10007,), "int32")]


def ring_input(shape, dtype, rank, case):
    """The tensor rank ``rank`` contributes in case number ``case`` (every rank can rebuild it)."""
    g = torch.Generator().manual_seed(1000 * case + rank)
    if dtype.startswith("int"):
        return torch.randint(-1000, 1000, shape, generator=g, dtype=getattr(torch, dtype))
    values = torch.randn(shape, generator=g, dtype=torch.float64) * 10 + rank
    return values.to(getattr(torch, dtype))


class _Recorded:
    """Stands for a ``torch.distributed`` function: logs each call, then makes it."""

    def __init__(self, name, fn, log, paths):
        self.name, self.fn, self.log, self.paths = name, fn, log, paths
        self.__name__ = self.__qualname__ = name
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        if self.name in P2P:
            tensor = args[0] if args else kwargs.get("tensor")
            key = "dst" if self.name in SENDS else "src"
            peer = args[1] if len(args) > 1 else kwargs.get(key)
            self.log.append((self.name, int(tensor.numel()), peer))
        else:
            self.log.append((self.name, None, None))
        with self.paths.sanctioned():
            return self.fn(*args, **kwargs)

    def __eq__(self, other):            # dist.P2POp checks `op in [isend, irecv]`
        return other is self or other is self.fn

    def __hash__(self):
        return hash(self.fn)


def _batch_recorder(batch_fn, originals, log, paths):
    def batch_isend_irecv(p2p_op_list):
        for op in p2p_op_list:
            fn = getattr(op.op, "fn", op.op)
            name = "isend" if fn is originals["isend"] else "irecv"
            log.append((name, int(op.tensor.numel()), op.peer))
            op.op = fn
        with paths.sanctioned():
            return batch_fn(p2p_op_list)
    return batch_isend_irecv


@contextmanager
def recording(student=None):
    """Record every communication call made through ``torch.distributed`` in a list.

    Patches the functions on the ``torch.distributed`` module, and names the student's
    module imported from it (``from torch.distributed import send``), until the block ends;
    what reaches the ProcessGroup below them by another path is logged too
    (:mod:`exercise_utils.pgwatch`: collectives under qualified names such as
    ``ProcessGroup.allreduce``).

    Yields:
        list of ``(name, elements, peer)`` tuples (``elements``/``peer`` None for collectives).
    """
    import torch.distributed as dist
    log, names = [], [n for n in P2P + COLLECTIVES if hasattr(dist, n)]
    with pgwatch.watching(log) as paths:
        originals = {n: getattr(dist, n) for n in names + ["batch_isend_irecv"]}
        wrapped = {n: _Recorded(n, originals[n], log, paths) for n in names}
        wrapped["batch_isend_irecv"] = _batch_recorder(originals["batch_isend_irecv"],
                                                       originals, log, paths)
        by_id = {id(fn): wrapped[n] for n, fn in originals.items()}
        rebound = {k: v for k, v in vars(student).items() if id(v) in by_id} if student else {}
        try:
            for n, fn in wrapped.items():
                setattr(dist, n, fn)
            for k, v in rebound.items():
                setattr(student, k, by_id[id(v)])
            yield log
        finally:
            for n, fn in originals.items():
                setattr(dist, n, fn)
            for k, v in rebound.items():
                setattr(student, k, v)


def probe_ring(student, ctx, cases):
    """Run ``ring_all_reduce`` on every case; return per case the result and the calls."""
    results = []
    with recording(student) as log:
        for i, (shape, dtype) in enumerate(cases):
            tensor = ring_input(shape, dtype, ctx.rank, i)
            ptr = tensor.data_ptr()
            del log[:]
            try:
                out = student.ring_all_reduce(tensor)
            except NotImplementedError:
                raise
            except Exception as exc:    # keep type and traceback; say which case failed
                where = f"ring_all_reduce on a tensor of shape {tuple(shape)}, dtype {dtype}, "
                hint = CHUNK_HINT if isinstance(exc, IndexError) else ""
                exc.args = (f"{where}with {ctx.size} ranks: {exc}{hint}",)
                raise
            results.append({"value": tensor.numpy().copy(), "same": out is tensor and
                            tensor.data_ptr() == ptr, "returned": type(out).__name__,
                            "calls": list(log)})
    return results
