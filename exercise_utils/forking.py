"""What a child forked from a process that imported torch once needs, to be what a fresh
interpreter would be: the parent's objects frozen out of its collector's way
(:func:`freeze_for_fork`), Python's and numpy's random numbers seeded anew
(:func:`fresh_random_state`), an exit that flushes its output and runs none of its parent's
cleanup (:func:`exit_flushed`), and output streams that write each line whole
(:func:`whole_lines`: a forked torchrun worker's, which shares its pipe with the others).

Owns the four. Called by :mod:`.zygote` (its ranks and torchrun jobs), :mod:`.rankworker`
(ranks forked by ``--spawn``), :mod:`.spawn_template` (notebook 02's spawn workers) and
the launched benchmarks and ranks of 04, 05, 07, 09 and 10 (their ends); a leaf:
it imports nothing of the course.
"""
import os
import sys


def freeze_for_fork():
    """Move every object this process holds now (torch's, numpy's, the probes' modules: some
    400,000) into the collector's permanent generation before forking: a child's
    ``gc.collect()`` then walks only what it made itself. Unfrozen, every full collection in a
    child walked them all: 0.14 s of CPU with torch and torch._dynamo imported, and every gloo
    rank collects at its end (:func:`exercise_utils.rankworker._finish`). The frozen objects
    live as long as the process anyway (modules, their functions and classes)."""
    import gc
    gc.freeze()


def exit_flushed(code=0):
    """Flush Python's stdout and stderr, then leave at once with ``code``: a forked child
    (a rank, a spawn worker of :mod:`.spawn_template`) runs no cleanup of its parent's. Also
    the end of a launched rank whose work is done and written (the benchmarks of 07, 09 and
    10, 10's network sweep, 04's spawned ranks, the workers 05's checks fork): without the
    interpreter's teardown, where a C++ thread torch still holds (gloo's, the DataLoader's,
    FSDP2's, ZeroRedundancyOptimizer's, a pipelining schedule's) can end the rank with
    "terminate called without an active exception" (SIGABRT: once in 09's benchmark, once in
    a CI-like run of 04's trainer, 2 of 10 two-node jobs of 05's hello on a loaded 2-core
    machine), which its launcher reports as a failed rank."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def fresh_random_state():
    """Seed Python's and numpy's global random numbers from the OS, as a fresh interpreter
    does: every child of one zygote would otherwise start from the same state (notebook
    05's check of snapshots that leave numpy's out then saw a resumed job equal the first)."""
    import random
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def whole_lines(fd):
    """A text stream on ``fd`` that writes each line (up to its ``\\n`` or ``\\r``) in one
    write, as soon as it ends. A job's ranks share one pipe, and python's traceback printer
    writes a line in pieces: unbuffered, as ``python -u``, two ranks' tracebacks mixed within
    a line, and a fragment of one showed as a line of its own on a student's first screen
    under the failure's box (a fresh-clone run under load, 2026-11-30). Text printed without
    an end of line waits for one, or for a flush (``print(..., flush=True)``). The same rule
    as :mod:`.linebuf` gives mpiexec's ranks, for streams a forked child makes anew."""
    import io
    return io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False), 1 << 16),
                            line_buffering=True)
