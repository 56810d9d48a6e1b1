"""Progress a student sees while something runs: where it can show (:func:`live`: a Jupyter
kernel, a terminal, or nowhere), the line of a running check (:class:`Progress`,
:func:`progress_line`), the bars of a launch drawn from its ranks' marks (:class:`Marks` in
the rank, :class:`Bars` in the launcher), the bar over an experiment's runs (:func:`runs`), and
the cell's slot that a failure's box fills above them (:func:`top`).

Owns the above and :data:`MARK`, :data:`WIDTH`, :func:`cell_finished` (registered by
:func:`.display.install`), :func:`take_slot`. Called by :mod:`.display`, :mod:`.launch`, :mod:`.launch_many`,
:mod:`.sessions`, :mod:`.tries`, :mod:`.bench` and the topics' training scripts and
experiments (which print marks).
"""
import json
import os
import sys
import time

WIDTH = 100              # characters a line is wrapped at


def live(shell=None):
    """Where progress can be shown: ``"kernel"`` (a Jupyter kernel, not nbgrader's
    autograder), ``"tty"`` (a terminal on stderr) or None (pytest, a log file, nbgrader, or
    ``DTFS_PROGRESS=0``)."""
    if os.environ.get("DTFS_PROGRESS") == "0":
        return None
    if shell is None and "IPython" in sys.modules:
        from IPython import get_ipython
        shell = get_ipython()
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return None if os.environ.get("NBGRADER_EXECUTION") else "kernel"
    return "tty" if sys.stderr.isatty() else None


def top():
    """In a Jupyter kernel (:func:`live`), the current cell's slot for a failure's box: an
    empty display made at the first call in the cell (a launch, a bar of runs) that the
    cell's failure fills (:func:`.display.show_failure`), so that the box shows above what the
    launches printed; elsewhere None."""
    if _TOP[0] is None and live() == "kernel":
        from IPython.display import display
        _TOP[0] = display({"text/plain": ""}, raw=True, display_id=True)
    return _TOP[0]


def take_slot():
    """The cell's slot (:func:`top`) or None, forgotten: the failure's box fills it once."""
    slot, _TOP[0] = _TOP[0], None
    return slot


_TOP = [None]       # the current cell's slot (see top)


def cell_finished(*_):
    """The bars of :func:`runs` the cell left open (it failed half-way) are closed: tqdm
    shows an unfinished one as failed (red), not frozen; the cell's slot is forgotten."""
    _TOP[0] = None
    while _RUNS:
        _RUNS.pop().close()


MARK = "@dtfs-progress "     # a rank's progress line for its launcher's bar (:class:`Marks`)


class Marks:
    """In a rank (rank 0 of a training run): progress for the launcher's ``tqdm`` bar, one
    line ``@dtfs-progress {"what", "done", "total"}`` at most every ``every`` seconds and at
    the end of each stage (an epoch). Printed only where the launcher asked for it
    (:func:`exercise_utils.launch.run` sets ``DTFS_MARKS=1`` when it shows bars): run by hand,
    a script prints nothing more. ``marks = Marks(enabled=rank == 0)``, then
    ``marks.stage("epoch 1/3", steps)`` and ``marks.update(step)`` after each step."""

    def __init__(self, enabled=True, every=0.5):
        self.on = enabled and os.environ.get("DTFS_MARKS") == "1"
        self.every = every
        self.what, self.total, self.last = "", 0, 0.0

    def stage(self, what, total):
        self.what, self.total = what, int(total)
        self._print(0)
        self.last = time.monotonic()

    def update(self, done):
        now = time.monotonic()
        if self.on and (done >= self.total or now - self.last >= self.every):
            self.last = now
            self._print(done)

    def _print(self, done):
        if self.on:
            print(MARK + json.dumps({"what": self.what, "done": int(done),
                                     "total": self.total}), flush=True)


class Bars:
    """In the launcher: a ``tqdm.auto`` bar (a widget in Jupyter, a line on a terminal) drawn
    from its ranks' :class:`Marks`; :meth:`feed` takes every output line and says whether it
    was a mark (marks are never printed nor kept in the output). The bar is removed at the
    end (``close``): what stays are the ranks' own lines, e.g. each epoch's."""

    def __init__(self):
        self.bar, self.stage = None, None

    @staticmethod
    def wanted():
        return live() is not None

    def feed(self, line):
        at = line.find(MARK)
        if at < 0:
            return False
        try:
            mark = json.loads(line[at + len(MARK):])
            what, done, total = str(mark["what"]), int(mark["done"]), int(mark["total"])
        except (ValueError, KeyError, TypeError):
            return True
        if self.bar is None:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc=what, leave=False, unit="step",
                            dynamic_ncols=True)
        elif self.stage != (what, total):            # a new stage (epoch): the bar anew
            self.bar.reset(total=total)
            self.bar.set_description(what, refresh=False)
        self.stage = (what, total)
        self.bar.n = done
        self.bar.refresh()
        return True

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def runs(items, what):
    """``items`` with a ``tqdm.auto`` bar over them where progress shows (:func:`live`): the
    runs of a long experiment (e.g. 1, 2 and 4 processes), one step of the bar each."""
    items = list(items)
    if live() is None or len(items) < 2:
        return items
    from tqdm.auto import tqdm
    top()                       # a failure's box shows above the bar and the runs' lines
    bar = tqdm(items, desc=what, unit="run", leave=False, dynamic_ncols=True)
    _RUNS.append(bar)
    return bar


_RUNS = []      # the bars of runs() not closed yet (see cell_finished)


class Progress:
    """One line that says what a running check does, updated in place: in a Jupyter kernel a
    display that is rewritten (and emptied at the end, so that a passed check leaves one
    line), on a terminal a line rewritten with ``\\r``; elsewhere (pytest, nbgrader's
    autograder, a log file) nothing. Updated at most once a second."""

    def __init__(self):
        self.handle, self.tty, self.shown, self.last = None, False, "", 0.0
        where = live()
        if where == "kernel":
            from IPython.display import display
            self.handle = display({"text/plain": ""}, raw=True, display_id=True)
        self.tty = where == "tty"

    def update(self, text, force=False):
        now = time.monotonic()
        if text == self.shown or (not force and now - self.last < 1.0):
            return
        self.shown, self.last = text, now
        if self.handle is not None:
            self.handle.update({"text/plain": text}, raw=True)
        elif self.tty:
            sys.stderr.write("\r\033[K" + text[:WIDTH])
            sys.stderr.flush()

    def close(self):
        """Remove the line."""
        self.update("", force=True)


def progress_line(what, size, backend, seconds, seen, now):
    """The text of a running launch: what, how many ranks, how long, the case the ranks run,
    and any rank standing still for 10 s or more (with its line of the student's file)."""
    cases = sorted({s["case"] for s in seen.values() if s.get("case")})
    text = f"running {what}: {size} {backend} rank{'s' * (size != 1)}, {seconds:.0f} s"
    if cases:
        text += f", case {', '.join(cases)}"
    still = [(r, now - s["moved"], s) for r, s in sorted(seen.items())
             if now - s["moved"] >= 10]
    for rank, idle, s in still[:2]:
        at = f" at line {s['student'][0]} ({s['student'][1]})" if s.get("student") else ""
        text += f"; rank {rank}: no progress for {idle:.0f} s{at}"
    return text
