"""See collectives that bypass ``torch.distributed``'s functions: the ProcessGroup object itself.

A probe's recorder wraps the functions of ``torch.distributed`` (``dist.all_reduce``, ...). A
student file can reach the same communication below them: the ProcessGroup object
(``dist.group.WORLD.allreduce([t])``, ``_get_default_group()``), its gloo backend
(``pg._get_backend(device)``), the module ``torch.distributed.distributed_c10d`` (whose functions
the recorder did not replace), the dispatcher ops (``torch.ops.c10d.allreduce_``) or the
functional collectives (``torch.ops._c10d_functional``). :func:`watching` wraps the methods of
the ``ProcessGroup`` and ``Backend`` classes and those ops for the duration of a probe. A call
counts as *hidden* when it arrives while no recorder wrapper is running: the recorder's own
calls go through :meth:`Paths.sanctioned`.

Point-to-point calls found this way (``ProcessGroup.send`` / ``recv``) are logged as the
ordinary ``send`` / ``recv`` with their sizes and peers (a ring built on them is still a ring);
collectives are logged under their qualified name (``ProcessGroup.allreduce``), which a check
reports as an integrity violation.

Used by :mod:`exercise_utils.recorder` (the recorders of 03_torch_distributed_collectives,
06_build_your_own_ddp, 09_bonus_fsdp and 10_bonus_model_parallel).
"""
import contextlib

METHODS = ("broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather",
           "all_gather_single", "_allgather_base", "allgather_coalesced",
           "all_gather_single_coalesced", "allgather_into_tensor_coalesced", "gather",
           "gather_single", "gather_into_tensor", "scatter", "reduce_scatter",
           "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_single_coalesced",
           "reduce_scatter_tensor_coalesced", "all_to_all_single", "alltoall_base", "alltoall",
           "send", "recv", "recv_anysource", "barrier", "monitored_barrier")
OP_NAMESPACES = ("c10d", "_c10d_functional")


class Paths:
    """The state of one watch: the log, and how deep inside sanctioned wrappers we are."""

    def __init__(self, log):
        self.log, self.depth = log, 0

    @contextlib.contextmanager
    def sanctioned(self):
        """Calls made inside this block come from the recorder's own wrappers: not hidden."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def seen(self, name, args):
        if self.depth:
            return
        short = name.rsplit(".", 1)[-1]
        if short in ("send", "recv", "recv_anysource"):
            tensors = args[0] if args else []
            numel = sum(int(t.numel()) for t in tensors) if isinstance(tensors, list) else None
            self.log.append(("send" if short == "send" else "recv", numel,
                             args[1] if len(args) > 1 else None))
        else:
            self.log.append((name, None, None))


def _method(paths, name, fn):
    def wrapper(self, *args, **kwargs):
        paths.seen(name, args)
        return fn(self, *args, **kwargs)
    return wrapper


class _Op:
    """Stands for an op packet (``torch.ops.c10d.allreduce_``) or one of its overloads
    (``.default``): calls are seen, every other attribute is the real one's."""

    def __init__(self, paths, name, fn):
        self._paths, self._name, self._fn = paths, name, fn

    def __call__(self, *args, **kwargs):
        self._paths.seen(self._name, args)
        return self._fn(*args, **kwargs)

    def __getattr__(self, attr):
        value = getattr(self._fn, attr)
        if callable(value) and type(value).__name__ == "OpOverload":
            return _Op(self._paths, self._name, value)
        return value


@contextlib.contextmanager
def watching(log):
    """Wrap the ProcessGroup/Backend methods and the c10d ops; yield :class:`Paths`.

    Args:
        log: the recorder's list; hidden calls are appended to it.
    """
    import torch
    import torch.distributed._functional_collectives  # noqa: F401  registers autograd on the
    #   _c10d_functional ops at import: it must find the real ops, not the wrappers
    from torch._C import _distributed_c10d as c10d
    paths, undo = Paths(log), []
    for cls in (c10d.ProcessGroup, c10d.Backend):
        for name in METHODS:
            fn = vars(cls).get(name)
            if fn is not None:
                setattr(cls, name, _method(paths, f"{cls.__name__}.{name}", fn))
                undo.append((cls, name, fn))
    names = torch._C._dispatch_get_all_op_names()
    for space in OP_NAMESPACES:
        ns = getattr(torch.ops, space)
        for full in sorted({n.split(".")[0] for n in names if n.startswith(space + "::")}):
            op = full.split("::", 1)[1]
            try:
                fn = getattr(ns, op)
            except (AttributeError, RuntimeError):
                continue
            setattr(ns, op, _Op(paths, f"torch.ops.{space}.{op}", fn))
            undo.append((ns, op, fn))
    try:
        yield paths
    finally:
        for owner, name, fn in reversed(undo):
            setattr(owner, name, fn)
