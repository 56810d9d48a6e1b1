"""The recorder of a check: every collective the student's code issues, in order.

:class:`Recorder` replaces the ``torch.distributed`` collectives (and the names the student's
module imported from it) by recording wrappers: which collective, how many elements,
``async_op``, and when its ``wait()`` came: every public collective, ``*_single`` and
``*_object`` forms included (a ``*_single`` under the name of its ``*_tensor`` twin). A collective that reaches the ProcessGroup below
those functions (``dist.group.WORLD.allreduce([t])``, ``torch.distributed.distributed_c10d
.all_reduce``, which the wrappers do not replace, or ``torch.ops.c10d.*``) is logged in
:attr:`Recorder.hidden` (:mod:`exercise_utils.pgwatch`); the checks report it as an
integrity violation. Every call the recorder or the probe makes itself runs inside
``paths.sanctioned()`` and is not hidden.

:class:`PointToPoint` records the point-to-point messages (name, elements, global peer) and
the collectives (by name) of code that talks to its neighbours: a ring, a pipeline.

Used in 06_build_your_own_ddp and 09_bonus_fsdp (:class:`Recorder`), in
03_torch_distributed_collectives and 10_bonus_model_parallel (:class:`PointToPoint`), all by
their probes.
"""
import contextlib
import inspect

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import pgwatch
from .integrity import VIOLATION

# Every public collective of torch.distributed: tensor, list, ``*_single`` and ``*_object``
# forms (what runs inside one, down to the ProcessGroup, is its own and never hidden).
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce", "reduce_scatter", "barrier",
               "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce_coalesced",
               "all_gather_coalesced", "all_to_all", "scatter", "gather", "gather_into_tensor",
               "all_gather_single", "reduce_scatter_single", "gather_single",
               "all_to_all_single", "all_gather_object", "gather_object",
               "broadcast_object_list", "scatter_object_list")
# The same operation under two names (torch 2.14 recommends the ``*_single`` ones): recorded
# under one, so that a check counting all-gathers counts both.
SAME_AS = {"all_gather_single": "all_gather_into_tensor",
           "reduce_scatter_single": "reduce_scatter_tensor",
           "gather_single": "gather_into_tensor"}


P2P = ("send", "recv", "isend", "irecv")
SENDS = ("send", "isend")
# What :class:`PointToPoint` logs by name only, beside the point-to-point messages.
BY_NAME = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
           "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
           "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
           "all_to_all_single", "all_reduce_coalesced", "barrier", "monitored_barrier",
           "send_object_list", "recv_object_list")


class StandsFor:
    """Base of a recording wrapper that compares equal to the function ``self.fn`` it stands
    for: ``dist.P2POp`` accepts only ``op in [isend, irecv]`` (distributed_c10d's own).
    Used by :class:`PointToPoint` (03 and 10) and 08's recorder."""

    def __eq__(self, other):
        return other is self or other is self.fn

    def __hash__(self):
        return hash(self.fn)


class _Work:
    """Stands for the Work object of an async collective; records when ``wait()`` is called."""

    def __init__(self, work, recorder, index):
        self._work, self._recorder, self._index = work, recorder, index

    def wait(self, *args, **kwargs):
        self._recorder.mark("wait", self._index)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def elements(first):
    """The elements a collective's first argument holds: a tensor's, or the sum over a list
    form's tensors (``all_gather(tensor_list, t)`` records the whole output, as
    ``all_gather_into_tensor`` does; ``all_to_all`` its outputs); 0 for objects."""
    if isinstance(first, torch.Tensor):
        return first.numel()
    if isinstance(first, (list, tuple)):
        return sum(elements(item) for item in first)
    return 0


class Recorder:
    """Replaces the torch.distributed collectives (also names the student imported) by
    recording wrappers; ``events`` lists ("coll", name, numel, async_op) (numel:
    :func:`elements` of its first argument), ("wait", i) and the probe's own marks in the order
    they happened; ``hidden`` lists ``(name, numel, peer)`` of what reached the ProcessGroup
    by another path (:mod:`exercise_utils.pgwatch`: collectives under qualified names such as
    ``ProcessGroup.allreduce``, point-to-point messages as ``send`` / ``recv``)."""

    def __init__(self):
        self.events, self.hidden, self.original, self.student = [], [], {}, None
        self._watch, self.paths = contextlib.ExitStack(), None

    def install(self, student):
        self.student = student
        self.paths = self._watch.enter_context(pgwatch.watching(self.hidden))
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self.original[name] = fn
                self._replace(fn, self._wrap(name, fn))

    def uninstall(self):
        for name, fn in self.original.items():
            self._replace(getattr(dist, name), fn)
        self._watch.close()

    def call(self, name, *args, **kwargs):
        """The probe's own collective: the original function, neither recorded nor hidden."""
        with self.paths.sanctioned():
            return self.original[name](*args, **kwargs)

    def _replace(self, old, new):
        for module in (dist, self.student):
            for key, value in list(vars(module).items()):
                if value is old:
                    setattr(module, key, new)

    def _wrap(self, name, fn):
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            signature = None

        def recorded(*args, **kwargs):
            try:            # by name: async_op sits at another position in each collective
                bound = signature.bind_partial(*args, **kwargs).arguments
            except (AttributeError, TypeError):     # no signature, or bad arguments: the
                bound = {}                          # collective itself will say what is wrong
            numel = elements(next(iter(bound.values()), None))
            async_op = bound.get("async_op", False)
            index = len(self.events)
            self.events.append(("coll", SAME_AS.get(name, name), numel, bool(async_op)))
            with self.paths.sanctioned():
                work = fn(*args, **kwargs)
            return _Work(work, self, index) if work is not None else None
        return recorded

    def mark(self, *event):
        self.events.append(event)

    def take(self):
        events, self.events = self.events, []
        return events

    def take_hidden(self):
        hidden, self.hidden[:] = list(self.hidden), []
        return hidden


def verify_no_hidden(res, where, functions):
    """Raise for communication that bypassed the recorded functions (``out["hidden"]`` of each
    rank's result, :meth:`Recorder.take_hidden`): a collective below them is an integrity
    violation, a point-to-point message is off-topic.

    Args:
        res: the per-rank results. where: where it happened, for the message ("in stage
            'flat'"). functions: the collectives the notebook asks for ("dist.all_reduce,
            dist.broadcast").
    Used in 06_build_your_own_ddp and 09_bonus_fsdp (their checks).
    """
    for rank, out in enumerate(res):
        hidden = out.get("hidden") or []
        below = sorted({e[0] for e in hidden if "." in e[0]})
        if below:
            raise AssertionError(
                f"{VIOLATION}: rank {rank} reached {', '.join(below)} {where}, below "
                "torch.distributed's functions where the check records communication. "
                f"Communicate only through {functions} (the functions of torch.distributed), "
                "as the notebook says")
        if hidden:
            raise AssertionError(
                f"rank {rank} sent or received point-to-point messages {where} "
                f"({sorted({e[0] for e in hidden})}): this notebook communicates with "
                f"collectives only ({functions})")


def global_peer(group, group_rank):
    """The global rank of ``group_rank`` of ``group`` (None: the default group), or None where
    there is none."""
    try:
        return dist.get_global_rank(group or dist.group.WORLD, group_rank)
    except (ValueError, RuntimeError):
        return None


class _Logged(StandsFor):
    """Stands for a ``torch.distributed`` function in :class:`PointToPoint`: logs each call
    the student makes, then makes it."""

    def __init__(self, name, fn, rec):
        self.name, self.fn, self.rec = name, fn, rec
        self.__name__ = self.__qualname__ = name
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        if self.rec.depth:
            # made by a recorded call under way: torch 2.14's dist.send is isend + wait, its
            # dist.recv irecv + wait, send_object_list a send: the student's one call is
            # one message, logged once, by the outermost
            return self.fn(*args, **kwargs)
        self.rec.depth += 1
        try:
            self.rec.note(self.name, args, kwargs)
            with self.rec.paths.sanctioned():
                return self.fn(*args, **kwargs)
        finally:
            self.rec.depth -= 1


class PointToPoint:
    """While installed (``with PointToPoint(student, expect) as rec``), every point-to-point
    message and collective made through ``torch.distributed`` is logged in ``rec.log`` as
    ``(name, elements, peer)`` (``peer``: the global rank, also of a message addressed by
    ``group_dst`` / ``group_src``; ``elements`` and ``peer`` None for a collective); what
    reaches the ProcessGroup by another path is logged too (:mod:`exercise_utils.pgwatch`).
    ``expect(name, peer)``, if given, is called before each message is made and may raise to
    stop one to a rank the exercise never talks to (it would hang, or reach the wrong rank).

    It replaces the functions on ``torch.distributed``, the names the student's module imported
    from it, and ``distributed_c10d``'s own ``isend`` / ``irecv``: ``batch_isend_irecv`` (left
    as it is) makes each ``P2POp`` with the function the op holds, a recorded one, and tells a
    send from a receive by the identity ``op.op is isend`` of ``distributed_c10d``'s name. A
    recorded call made inside another (torch's ``dist.send`` is ``isend`` + ``wait``) is not
    logged again: one call of the student's, one entry. Used by the probes of
    03_torch_distributed_collectives (the ring) and 10_bonus_model_parallel (the pipeline)."""

    def __init__(self, student=None, expect=None):
        self.student, self.expect, self.log, self.depth = student, expect, [], 0

    def note(self, name, args, kwargs):
        """Log one call of ``name`` (and ask ``expect`` first, for a message)."""
        if name not in P2P:
            self.log.append((name, None, None))
            return
        tensor = args[0] if args else kwargs.get("tensor")
        key = "dst" if name in SENDS else "src"
        peer = args[1] if len(args) > 1 else kwargs.get(key)
        if peer is None and kwargs.get(f"group_{key}") is not None:
            peer = global_peer(args[2] if len(args) > 2 else kwargs.get("group"),
                               kwargs[f"group_{key}"])
        self.log.append((name, int(tensor.numel()) if isinstance(tensor, torch.Tensor)
                         else None, peer))
        if self.expect is not None:
            self.expect(name, peer)

    def take(self):
        """The calls logged so far (the log is emptied)."""
        log, self.log[:] = list(self.log), []
        return log

    def __enter__(self):
        self._watch = pgwatch.watching(self.log)
        self.paths = self._watch.__enter__()
        self.originals = {n: getattr(dist, n) for n in P2P + BY_NAME if hasattr(dist, n)}
        wrapped = {n: _Logged(n, f, self) for n, f in self.originals.items()}
        by_id = {id(f): wrapped[n] for n, f in self.originals.items()}
        self.rebound = ({k: v for k, v in vars(self.student).items() if id(v) in by_id}
                        if self.student is not None else {})
        self.c10d = {n: getattr(c10d, n) for n in ("isend", "irecv")}
        for n, f in wrapped.items():
            setattr(dist, n, f)
        for n in self.c10d:
            setattr(c10d, n, wrapped[n])
        for k, v in self.rebound.items():
            setattr(self.student, k, by_id[id(v)])
        return self

    def __exit__(self, *exc):
        for n, f in self.originals.items():
            setattr(dist, n, f)
        for n, f in self.c10d.items():
            setattr(c10d, n, f)
        for k, v in self.rebound.items():
            setattr(self.student, k, v)
        return self._watch.__exit__(*exc)
