"""Keep a check honest inside the ranks, where the student's file runs beside the checker.

Two protections, both set up *before* the student file is imported:

* **Signed results.** The harness writes one random secret into each rank's folder
  (:func:`make_secrets`); the rank reads its own and deletes the file before the import
  (:func:`take_secret`), and signs its report with it (:func:`sign`). The harness accepts
  only reports whose signature checks out (:func:`verify`), so a student file that writes a
  result itself and exits reports nothing the checker believes. The secret is never in
  ``argv`` or the environment.
* **Guarded checker code.** :class:`Guard` fingerprints every function and class of the
  checker's modules loaded in the rank (the probe, its recorder, the worker, the signing code)
  before the import and compares after the probe: a student file that patched one of them
  (``probes.probe_x = ...``, ``Recorder.record = ...``, a replaced ``__code__``) is reported
  as an integrity violation instead of being graded.

What one Python process cannot prevent: code that runs in the same interpreter can read the
secret from memory (``gc.get_objects()``) or restore what it patched before the probe returns.
These take deliberate effort and leave traces in the file an instructor reads; docs/grading-security.md
("What the defences cannot stop") says so.

Used by :mod:`exercise_utils.rankworker` and :mod:`exercise_utils.harness` (every checker,
01_mpi_parallel_sgd onwards).
"""
import hashlib
import hmac
import os
import secrets
import sys
import types
from pathlib import Path

VIOLATION = "the check's integrity was violated"


def verify_rank0_number(res, salts):
    """Raise ``CheckFailure`` (an integrity violation) unless every rank's probe received rank
    0's number (``out["salt0"]``, broadcast by the probe: the inputs all ranks share come from
    it) as the judge gave it (``salts``: ``{rank: number}`` from ``run_ranks``; 0 where the
    launch was not salted). Used by the checks of notebooks 10 and 11."""
    from .contract import CheckFailure
    salt0 = salts.get(0, 0)
    if any(out["salt0"] != salt0 for out in res):
        raise CheckFailure(f"{VIOLATION}: the ranks did not all receive rank 0's number (your "
                           "file must not change torch.distributed's broadcast)")


_SIG = 64     # hex digits of a SHA-256 HMAC


def make_secrets(folders):
    """Write a fresh secret into each rank's folder (``folders[r]/secret``, owner-only);
    return ``{rank: secret}``."""
    out = {}
    for r, folder in enumerate(folders):
        path = Path(folder) / "secret"
        out[r] = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(out[r])
    return out


def take_secret(folder):
    """Read this rank's secret from its folder and delete the file (before any student code
    runs); None when there is none."""
    path = Path(folder) / "secret"
    try:
        value = path.read_bytes()
    except FileNotFoundError:
        return None
    path.unlink()
    return value


def sign(secret, payload):
    """``payload`` (bytes) preceded by its HMAC under ``secret``."""
    return hmac.new(secret, payload, hashlib.sha256).hexdigest().encode() + b"\n" + payload


def verify(secret, data):
    """The payload of signed ``data``, or None when the signature is not ``secret``'s."""
    mac, payload = data[:_SIG], data[_SIG + 1:]
    good = hmac.new(secret, payload, hashlib.sha256).hexdigest().encode()
    return payload if hmac.compare_digest(mac, good) else None


def _entries(module):
    """``{name: identity}`` for the functions, classes (and their methods) of ``module``."""
    found = {}
    for name, obj in list(vars(module).items()):
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type,
                            types.ModuleType)):
            found[name] = _identity(obj)
        if isinstance(obj, type) and getattr(obj, "__module__", None) == module.__name__:
            for key, member in list(vars(obj).items()):
                member = getattr(member, "__func__", member)
                if isinstance(member, (types.FunctionType, property)):
                    found[f"{name}.{key}"] = _identity(member)
    return found


def _identity(obj):
    code = getattr(obj, "__code__", None)
    return (id(obj), id(code), id(getattr(obj, "__defaults__", None)) if code else 0)


class Guard:
    """Fingerprint the checker's code in this process; :meth:`changed` names what moved.

    Args:
        names: module names to guard besides every loaded ``exercise_utils`` module and
            ``__main__`` (the worker itself).
    """

    def __init__(self, names=("hmac", "hashlib", "pickle", "json")):
        mods = {n: m for n, m in sys.modules.items() if m is not None and (
            n == "__main__" or n == "exercise_utils" or n.startswith("exercise_utils.")
            or n in names)}
        self.modules = mods
        self.prints = {n: _entries(m) for n, m in mods.items()}
        self.module_ids = {n: id(m) for n, m in mods.items()}

    def changed(self):
        """Names (``module.function``) of guarded code that is not what it was."""
        moved = [n for n, i in self.module_ids.items() if id(sys.modules.get(n)) != i]
        for n, before in self.prints.items():
            now = _entries(self.modules[n])
            moved += [f"{n}.{k}" for k, v in before.items() if now.get(k) != v]
        return sorted(set(moved))
