"""What a student sees of a check: one line when it passes, a short box when it fails;
and of a launch that failed (:class:`~exercise_utils.launch.LaunchError`): how it ended and
each rank's first error, its output folded.

A failed check (:class:`~exercise_utils.contract.CheckFailure`, raised by every ``check_*``)
shows in a Jupyter kernel as a box: the check's name, the case of the contract and the time
first, then the message, the first screen at most :data:`FIRST_SCREEN` lines; the rest of the
message and the checker's traceback (its frames, without source) are folded in a
``<details>`` element (plain text, indented, where no HTML is shown). The cell still ends in an
error, of one line, so nbgrader's autograder sees the failure exactly as before. Other
exceptions are left to IPython. :func:`install` registers it (``import exercise_utils``
does, in a kernel); :func:`summary` is the one line of a check that passed.

Used by every notebook (through :mod:`exercise_utils` and :func:`exercise_utils.harness.check`).
"""
import html
import os
import re
import sys
import textwrap
import time
import traceback

from .contract import CheckFailure
from .outcomes import LaunchError
from .progress import WIDTH, cell_finished, live, take_slot

FIRST_SCREEN = 12        # lines of a failure's first screen, title and error line included


def _lines(message):
    """The message as lines of at most :data:`WIDTH` characters (indentation kept)."""
    out = []
    for line in str(message).splitlines() or [""]:
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent + "  ",
                             break_long_words=True, break_on_hyphens=False) or [""]
    return out


def _frames(tb):
    """The traceback's frames as "file:line in function" lines, without source."""
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_tb(tb)]


HOST = r"(?:\[h\d+\] )?"      # a line of a host of the course's cluster: "[h1] [rank1]: ..."
ERROR_LINE = re.compile(r"^" + HOST + r"(?:\[(?:rank)?(\d+)\]:? ?)?((?:[A-Za-z_][\w.]*\.)?"
                        r"[A-Z]\w*(?:Error|Exception|Interrupt)\b:?.*)$")


def first_errors(output, limit=6):
    """Each rank's first exception line in a launch's output (``[rankN]: ValueError: ...`` as
    torch labels them, ``[N] ...`` as the course's mpiexec does, or unlabelled), in order of
    appearance; torchrun's own ChildFailedError is not one of them."""
    found, seen = [], set()
    for line in output.splitlines():
        m = ERROR_LINE.match(line.strip())
        if not m or "ChildFailedError" in m[2]:
            continue
        who = m[1]
        if who not in seen:
            seen.add(who)
            found.append((f"rank {who}: " if who is not None else "") + m[2])
    return found[:limit]


FRAME_LINE = re.compile(r'^(' + HOST + r'\[(?:rank)?\d+\]:? ?)?\s*File "([^"]+)", line \d+, '
                        r'in (\w+)')


def not_written(output):
    """``(function, message)`` where a launch's ranks stopped at a NotImplementedError raised
    in a student's file (the innermost frame before it, in the output's tracebacks): the
    message names the function (``Class.method`` where the file says so) and the file's
    other functions still to write, in file order; else None."""
    last = {}
    for line in output.splitlines():
        frame = FRAME_LINE.match(line)
        if frame:
            last[frame[1]] = (frame[2], frame[3])
            continue
        m = ERROR_LINE.match(line.strip())
        if m and m[2].split(":")[0].split(".")[-1] == "NotImplementedError":
            where = last.get(line.strip()[:len(line.strip()) - len(m[2])] or None)
            found = _todo_at(*where) if where is not None else None
            if found is not None:       # else raised elsewhere (a library): an ordinary error
                return found
    return None


def _todo_at(path, func):
    """``(name, message)`` when function ``func`` of the file at ``path`` is one the student
    has still to write (:func:`.notebook_files.unimplemented`), else None."""
    from .notebook_files import unimplemented, unwritten
    todo = unimplemented(path)
    name = next((t for t in todo if t.split(".")[-1] == func), None)
    if name is None:
        return None
    shown = os.path.relpath(path)
    shown = path if shown.startswith("..") else shown
    return name, unwritten(name, shown, [t for t in todo if t != name], this_cell=True)


class NotReady(RuntimeError):
    """What a notebook cell needs first is missing (a file an earlier cell writes, a result
    it makes): raised by the course's code with a message that says which cell to run (or
    finish) first; shown in a kernel as a short box, like a failed check."""


class NotWritten(NotReady):
    """What a cell runs is still as released (raises NotImplementedError): ``name``, the first
    function not written yet; the message is :func:`.notebook_files.unwritten`'s. Raised
    before anything starts (:func:`.tries.ready`); shown as the box of a function not written
    yet."""

    def __init__(self, name, message):
        super().__init__(message)
        self.name = name


class Failure:
    """A failed check as the student reads it (rendered as HTML in Jupyter, text elsewhere).

    Attributes:
        title: ``"✗ check_x failed (case c, 12.3 s)"``.
        first: the lines of the first screen (the title excluded).
        rest: the lines folded away: the rest of the message, then the checker's frames.
    """

    def __init__(self, err, tb=None):
        if isinstance(err, LaunchError):
            self._launch(err, tb)
            return
        if not isinstance(err, CheckFailure):
            self._plain(err, tb)
            return
        name = getattr(err, "check", None) or "the check"
        facts = [f"case {err.case}"] if getattr(err, "case", None) else []
        if getattr(err, "seconds", None) is not None:
            facts.append(f"{err.seconds:.1f} s")
        self.title = f"✗ {name} failed" + (f" ({', '.join(facts)})" if facts else "")
        lines = _lines(err)
        keep = FIRST_SCREEN - 3          # the title, the "more" line and the error line
        self.first, more = lines[:keep], lines[keep:]
        frames = _frames(tb if tb is not None else err.__traceback__)
        self.folded = "the rest of the message, the checker's traceback"
        self.rest = more + (["", "The checker's traceback (most recent call last):"] +
                            ["  " + f for f in frames] if frames else [])

    def _launch(self, err, tb):
        """A launch that failed: how it ended, then each rank's first error; its output and
        the frames folded. A launch stopped by code not written yet says which function and
        what else the file has still to write, first."""
        message = str(err).split("\n--- last output ---")[0]
        head = _lines(message)
        self.title = "✗ " + head[0]
        errors = first_errors(getattr(err, "output", "") or "")
        shown = [f"  {line}" for e in errors for line in _lines(e)]
        keep = FIRST_SCREEN - 3
        todo = not_written(getattr(err, "output", "") or "")
        if todo:
            self.title = f"✗ not implemented yet: {todo[0]}"
            head = _lines(todo[1])
        self.first = (head[1:] if not todo else head) + (
            ["Each rank's first error:"] + shown if shown else [])
        self.first = self.first[:keep]
        output = (getattr(err, "output", "") or "").splitlines()
        frames = _frames(tb if tb is not None else err.__traceback__)
        cmd = getattr(err, "cmd", None)
        self.folded = "the ranks' output, the command"
        self.rest = ([f"The output ({len(output)} lines, the last 200; all of it in the "
                      f"error's .output):"] + [f"  {line}" for line in output[-200:]] +
                     (["", "The command:", *("  " + c for c in _lines(" ".join(map(str, cmd))))]
                      if isinstance(cmd, (list, tuple)) and cmd else []) +
                     (["", "Where it was launched (most recent call last):"] +
                      ["  " + f for f in frames] if frames else []))

    def _plain(self, err, tb):
        """An error raised in the notebook's own kernel that the student can act on: a
        function not written yet (NotImplementedError from a student's file), a name an
        earlier cell sets (NameError in the cell itself), a result an earlier cell makes
        (:class:`NotReady`). The traceback is folded."""
        frames = [f for f in traceback.extract_tb(tb if tb is not None else err.__traceback__)
                  if "/IPython/core/" not in f.filename]          # (IPython's run_code)
        if isinstance(err, NotWritten):
            self.title, lines = f"✗ not implemented yet: {err.name}", _lines(err)
        elif isinstance(err, NotImplementedError):
            name, message = next(filter(None, (_todo_at(f.filename, f.name) for f in
                                               reversed(frames))), ("NotImplementedError", err))
            self.title, lines = f"✗ not implemented yet: {name}", _lines(message)
        elif isinstance(err, NameError):
            self.title = f"✗ {err}"
            lines = _lines(f"This cell uses `{getattr(err, 'name', None) or 'it'}`, which no cell "
                           "has set in this session: if a cell above sets it, run the cells "
                           "above first, in order (Run > Run All Above); one that fails says "
                           "what it needs. Otherwise check the spelling.")
        else:
            lines = _lines(err)
            self.title, lines = f"✗ {lines[0]}", lines[1:]
        keep = FIRST_SCREEN - 3
        self.first, more = lines[:keep], lines[keep:]
        self.folded = "the traceback"
        self.rest = more + ["", f"The traceback ({type(err).__name__}, most recent call last):"
                            ] + [f"  {f.filename}:{f.lineno} in {f.name}" for f in frames]

    def text(self):
        """Plain text: the first screen, then the folded part indented under a marker."""
        out = [self.title, *self.first]
        if self.rest:
            out.append(f"▸ more ({len(self.rest)} lines):")
            out += ["    " + line for line in self.rest]
        return "\n".join(out)

    def __repr__(self):
        return self.text()

    def _repr_html_(self):
        body = html.escape("\n".join(self.first))
        more = ""
        if self.rest:
            more = (f"<details><summary>more ({len(self.rest)} lines: {self.folded})</summary>"
                    f"<pre style=\"white-space: "
                    f"pre-wrap\">{html.escape(chr(10).join(self.rest))}</pre></details>")
        return (f"<div style=\"border-left: 4px solid #c62828; padding: 2px 8px; "
                f"background: #fff5f5\"><b>{html.escape(self.title)}</b>"
                f"<pre style=\"white-space: pre-wrap; margin: 4px 0\">{body}</pre>{more}</div>")


def _cell_code(tb):
    """Whether the innermost frame of ``tb`` is a notebook cell's own code."""
    frames = traceback.extract_tb(tb)
    name = frames[-1].filename if frames else ""
    return name.startswith("<ipython-input-") or "/ipykernel_" in name


def _ours(value, tb):
    """Whether the kernel's handler shows ``value`` as a box: a failed check or launch
    always; in a student's kernel (:func:`live`), also code not written yet, a name an earlier
    cell sets, and what a cell needs first (:meth:`Failure._plain`); any other error keeps
    IPython's traceback."""
    if isinstance(value, (CheckFailure, LaunchError)):
        return True
    if live() != "kernel":
        return False
    if isinstance(value, NotReady):
        return True
    if isinstance(value, NotImplementedError):
        return any(_todo_at(f.filename, f.name) for f in traceback.extract_tb(tb))
    return isinstance(value, NameError) and _cell_code(tb)


def show_failure(shell, etype, value, tb, tb_offset=None):
    """IPython's handler of a CheckFailure (and the errors of :func:`_ours`): the box (in the
    cell's :func:`.progress.top` slot where it has one, i.e. above the launch's own lines), then the
    cell's error as one line. IPython shows nothing of a custom handler's return value: the
    error output (what nbgrader's autograder counts as a failed cell) is sent here, as
    IPython would send it."""
    if not _ours(value, tb):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    box = Failure(value, tb)
    slot = take_slot()
    if slot is not None:
        slot.update(box)
    else:
        from IPython.display import display
        display(box)
    first = (str(value).splitlines() or [""])[0]
    stb = [f"{etype.__name__}: {first[:WIDTH]}" + ("…" if len(first) > WIDTH else "")]
    shell._showtraceback(etype, value, stb)
    return stb


def install():
    """In an IPython kernel, show every CheckFailure as a :class:`Failure` box and define the
    ``%%part`` magic (:func:`.notebook_files.part_magic`); elsewhere (a script, pytest)
    nothing changes. Returns whether it was installed."""
    if "IPython" not in sys.modules:     # no kernel here (a rank, a script): import nothing
        return False
    from IPython import get_ipython
    shell = get_ipython()
    if shell is None:
        return False
    from .notebook_files import part_magic
    shell.set_custom_exc((CheckFailure, LaunchError, NotReady, NotImplementedError, NameError),
                         show_failure)
    shell.register_magic_function(part_magic, "cell", "part")    # one file over several cells
    if _cell_started not in shell.events.callbacks["pre_run_cell"]:
        shell.events.register("pre_run_cell", _cell_started)
        shell.events.register("post_run_cell", cell_finished)
    return True


_CELL = [None]      # when the kernel's current cell started (time.monotonic), where known


def _cell_started(*_):
    _CELL[0] = time.monotonic()


def seconds_since(start):
    """Seconds of a check that started at ``start``, counted from its cell's start where the
    cell started before it (the check cell's own imports included), so that the time a check
    prints is the time Jupyter shows for its cell."""
    began = _CELL[0] if _CELL[0] is not None and _CELL[0] <= start else start
    return time.monotonic() - began


def summary(name, launches, seconds):
    """The one line of a check that passed: what ran (``launches``: ``(what, ranks,
    backend)``) and how long it took."""
    sizes = sorted({n for _, n, _ in launches})
    ranks = (f" with {', '.join(map(str, sizes[:-1]))} and {sizes[-1]} ranks" if len(sizes) > 1
             else f" with {sizes[0]} rank{'s' * (sizes[0] != 1)}" if sizes else "")
    runs = f"{len(launches)} launch{'es' * (len(launches) != 1)}" if launches else "no launch"
    return f"✓ {name}: all checks passed ({runs}{ranks}, {seconds:.1f} s)"


class Tracebacks:
    """An echo filter for a notebook's own launches (in Jupyter): each rank's traceback stays
    out of the live output but for its last line, the error; the box under the cell says
    what failed (:class:`Failure`), and every line stays in the output (``err.output``).
    ``inner``: a filter of the lines left (:class:`.launch.AgentReport`)."""
    PREFIX = re.compile(r"^(\[(?:rank)?\d+\]:? ?)?(.*)$")
    CHAINED = ("During handling of the above exception", "The above exception was the direct")
    FRAME = re.compile(r'^\s+File "[^"]+", line \d+')

    def __init__(self, inner=None):
        self.inner, self.open, self.ended, self.hidden = inner, set(), set(), 0

    def __call__(self, line):
        prefix, rest = self.PREFIX.match(line).groups()
        chained = prefix in self.ended and (not rest.strip() or rest.startswith(self.CHAINED))
        # ranks that print without a prefix (torchrun's workers forked from a zygote) can
        # interleave two tracebacks: a frame, or a frame's indented source line, after one's
        # error line is the other's, still open
        resumed = prefix in self.ended and (self.FRAME.match(rest) or (
            rest[:1].isspace() and rest.strip()))
        if rest.startswith("Traceback (most recent call last):") or chained or resumed or (
                prefix in self.open and (not rest.strip() or rest[0].isspace())):
            self.open.add(prefix)
            if not chained:
                self.ended.discard(prefix)
            self.hidden += 1
            return False
        if prefix in self.open:         # the error's line ends the traceback: it shows
            self.open.discard(prefix)
            self.ended.add(prefix)
        else:
            self.ended.discard(prefix)
        return self.inner(line) if self.inner is not None else True

    def note(self):
        """What was left out, said once at the end of the launch (or None)."""
        inner = getattr(self.inner, "note", lambda: None)()
        mine = (f"({self.hidden} lines of the ranks' tracebacks not shown here: a failed "
                "launch's box above says what failed; all of it is in the .output of the "
                "launch's result or error)" if self.hidden else None)
        return "\n".join(n for n in (inner, mine) if n) or None


