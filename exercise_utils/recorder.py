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

Used in 06_build_your_own_ddp and 09_bonus_fsdp (by their probes).
"""
import contextlib
import inspect

import torch
import torch.distributed as dist

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


class StandsFor:
    """Base of a recording wrapper that compares equal to the function ``self.fn`` it stands
    for: ``dist.P2POp`` accepts only ``op in [isend, irecv]`` (distributed_c10d's own).
    Used by the point-to-point recorders of 03, 08 and 10."""

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


class Recorder:
    """Replaces the torch.distributed collectives (also names the student imported) by
    recording wrappers; ``events`` lists ("coll", name, numel, async_op), ("wait", i) and
    the probe's own marks in the order they happened; ``hidden`` lists ``(name, numel,
    peer)`` of what reached the ProcessGroup by another path (:mod:`exercise_utils.pgwatch`:
    collectives under qualified names such as ``ProcessGroup.allreduce``, point-to-point
    messages as ``send`` / ``recv``)."""

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
            tensor = next(iter(bound.values()), None)
            numel = tensor.numel() if isinstance(tensor, torch.Tensor) else 0
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
