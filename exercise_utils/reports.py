"""What the ranks of a check's launch leave in their folders, read on the judge's side: the
signed reports (plain data, :mod:`.plaindata`; a report not signed with the rank's secret is
an integrity violation, :mod:`.integrity`), and the first error a rank reported turned into the
student's message ("not implemented yet: ...", "rank 1 raised ...", a grading limit's verdict).

Owns: :func:`read_reports`, :func:`raise_student_errors`, :func:`written`, :func:`untouched`
(no rank started), :func:`rankworker_folder`, :func:`shown`. Called by :mod:`.harness` and
:mod:`.hostlaunch`.
"""
from pathlib import Path

from . import integrity, limits, plaindata, stops
from .contract import CheckFailure
from .notebook_files import unimplemented, unwritten


def rankworker_folder(out, rank):
    """Rank ``rank``'s folder of a launch whose ``--out`` is ``out`` (``{rank}`` read as the
    rank: :func:`.rankworker.own_folder`)."""
    return Path(str(out).replace("{rank}", str(rank)))


def untouched(folders):
    """Whether no rank of the launch whose rank folders are ``folders`` started: every secret
    is still there, no rank beat or reported."""
    return (all((Path(f) / "secret").exists() for f in folders)
            and not any(list(Path(f).glob("beat*")) for f in folders)
            and not written(folders))


def written(folders):
    """The ranks whose report file exists (checked for its signature by :func:`read_reports`)."""
    return {r for r, folder in enumerate(folders) if (Path(folder) / f"rank{r}.report").exists()}


def read_reports(folders, keys, copies=(), path=None):
    """Read the reports the ranks wrote: {rank: report} for the ranks that wrote one; the
    paths of the copies of the student's file the ranks ran (``copies``) read as ``path``.

    Raises:
        AssertionError: a report not signed with the rank's secret (the student's file wrote
            it), or one that says the student's file changed the checker's code.
    """
    found = {}
    for r, folder in enumerate(folders):
        try:
            data = (Path(folder) / f"rank{r}.report").read_bytes()
        except FileNotFoundError:
            continue
        payload = integrity.verify(keys[r], data)
        if payload is None:
            raise CheckFailure(f"{integrity.VIOLATION}: rank {r}'s result was not written by "
                                 f"the checker (its signature is wrong): your file must not "
                                 f"write the check's results itself.")
        try:
            found[r] = plaindata.loads(payload)
        except (plaindata.PlainDataError, ValueError) as exc:
            raise CheckFailure(f"{integrity.VIOLATION}: rank {r}'s result is not plain data "
                               f"({exc})") from None
        if found[r].get("tampered"):
            raise CheckFailure(f"{integrity.VIOLATION}: on rank {r} your file changed the "
                                 f"checker's code: {', '.join(found[r]['tampered'][:5])}. "
                                 f"Exercise files must not patch the checks.")
        if path is not None and not found[r].get("ok", True):
            for key in ("message", "traceback"):
                found[r][key] = _as_given(found[r].get(key), copies, path)
    return found


def _as_given(text, copies, path):
    """``text`` with the paths of the copies of the student's file read as ``path`` (the one
    the check was given, e.g. ``work/01_shards.py``)."""
    if not isinstance(text, str):
        return text
    for copy in {str(c) for c in copies}:
        if copy != str(path):
            text = text.replace(copy, str(path))
    return text


def shown(err, copies, path):
    """A launch's error as the student should read it (:func:`_as_given`)."""
    return _as_given(str(err), copies, path)


def raise_student_errors(reports, path, case=None):
    """Turn the first error a rank reported into a :class:`CheckFailure` for the student,
    charged to the case the rank was running (else ``case``)."""
    # The first rank to fail is the cause; later errors are usually its consequence
    # (e.g. gloo's "Connection closed by peer" on the ranks that were waiting for it).
    errors = sorted(((r, rep) for r, rep in reports.items() if not rep["ok"]),
                    key=lambda e: e[1]["time"])
    if not errors:
        return
    todo = list(dict.fromkeys(rep["where"] for _, rep in errors
                              if rep["type"] == "NotImplementedError"))
    if todo:
        later = [name for name in unimplemented(path) if name not in todo
                 and not any(w.endswith(f".{name}") or w == name.split(".")[-1] for w in todo)]
        raise CheckFailure("not implemented yet: " + unwritten(
            todo, path, later if len(later) <= 3 else ()))     # (not a file's every stage)
    rank, rep = errors[0]
    running = rep.get("case") or case
    during = f" in check case '{running}'" if running else ""
    found = stops.grading_limits()
    name = limits.from_error(rep) if found else None
    if name:
        where = f"in {rep['where']}" if rep.get("where") else ""
        value = found["disk" if name == "file" else name]
        raise CheckFailure(f"{limits.verdict(rank, name, value, where)}\n"
                           f"rank {rank} raised {rep['type']}{during}: {rep['message']}\n"
                           f"{rep['traceback']}", running)
    raise CheckFailure(f"rank {rank} raised {rep['type']}{during}: {rep['message']}\n"
                       f"{rep['traceback']}", running)
