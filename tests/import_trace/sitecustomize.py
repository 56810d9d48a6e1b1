"""An import tracer for tests/test_isolation.py: with ``DTFS_IMPORT_TRACE=<folder>`` every
module name a Python process looks for (found or not: every ``find_spec`` that reaches the
import system) is appended to ``<folder>/<pid>.log`` with the process's role (the grading
kernel, a zygote, a rank, a stub, ...). Put this folder on ``PYTHONPATH`` to turn it on."""
import os
import sys

_FOLDER = os.environ.get("DTFS_IMPORT_TRACE")


class _Tracer:
    def find_spec(self, fullname, path=None, target=None):
        argv = " ".join(sys.argv[:3])
        role = ("kernel" if "ipykernel" in argv else "zygote" if "zygote" in argv and
                "--stub" not in argv else "stub" if "--stub" in argv else
                "rank" if "rankworker" in argv else "launcher" if "hostranks" in argv else "other")
        if role == "zygote" and os.environ.get("RANK") is not None:
            role = "rank"                   # (forked from the zygote: its argv)
        try:
            with open(os.path.join(_FOLDER, f"{os.getpid()}.log"), "a") as log:
                log.write(f"{role}\t{fullname}\n")
        except OSError:
            pass
        return None


if _FOLDER:
    sys.meta_path.insert(0, _Tracer())
