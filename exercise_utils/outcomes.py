"""How a launch ended: the errors :func:`.launch.run` raises (a failure, a timeout, a hang, a
grading limit, too much output) and the :class:`RunResult` it returns; the last lines of a
launch's output shown in a message.

Owns: :class:`LaunchError` and its kinds, :class:`RunResult`, :data:`HANG_HINT`, :func:`tail`,
:func:`signal_name`. Called by :mod:`.launch` (which re-exports the errors and RunResult: its
callers write ``launch.LaunchError``), :mod:`.launch_many` and :mod:`.display`.
"""
import signal
from dataclasses import dataclass, field


HANG_HINT = ("A distributed program that hangs is almost always waiting in a collective "
             "(Bcast, Allreduce, barrier, ...) that another rank never called, or called "
             "in a different order or with a different size.")


class LaunchError(RuntimeError):
    """A launched command failed. Attributes: cmd, returncode, output."""

    def __init__(self, message, cmd=None, returncode=None, output=""):
        super().__init__(message)
        self.cmd, self.returncode, self.output = cmd, returncode, output


class LaunchTimeout(LaunchError):
    """A launched command did not finish in time and was killed with all its processes."""


class LaunchHang(LaunchTimeout):
    """A launch's ``watch`` saw every process stop making progress; all were killed.
    Attribute ``report``: what the watch saw (see :class:`exercise_utils.heartbeat.Watch`)."""

    def __init__(self, message, cmd=None, output="", report=None):
        super().__init__(message, cmd, None, output)
        self.report = report


class LaunchLimit(LaunchError):
    """A limit at grading was hit (:mod:`.limits`): the watch said so (``("limit", line)``),
    or the launch printed more than its output limit; all its processes were killed.
    Attribute ``line``: the verdict, one line."""

    def __init__(self, message, cmd=None, output="", line=""):
        super().__init__(message, cmd, None, output)
        self.line = line


class LaunchOutput(LaunchLimit):
    """The launch printed more than its output limit (attribute ``limit``, bytes)."""

    def __init__(self, message, cmd=None, output="", limit=0, line=""):
        super().__init__(message, cmd, output, line)
        self.limit = limit


@dataclass
class RunResult:
    """What a finished launch returns: the command, its exit code, output and duration."""
    cmd: list
    returncode: int
    output: str
    seconds: float
    killed: list = field(default_factory=list)

    def __repr__(self):
        """One line (a notebook cell ending in a launch shows it after the live output, which
        it would otherwise repeat as one escaped string): ``result.output`` holds the text."""
        lines = len(self.output.splitlines())
        return (f"<RunResult: exit code {self.returncode} after {self.seconds:.1f} s, "
                f"{lines} line{'s' * (lines != 1)} of output in .output>")


def tail(lines, n=40):
    return "\n".join(line if len(line) <= 1000 else line[:1000] + " [...]" for line in lines[-n:])


def signal_name(code):
    if code is not None and code < 0:
        return f" (killed by signal {signal.Signals(-code).name})"
    return ""
