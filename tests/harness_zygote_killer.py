"""A probe module that kills the process importing it, once: while the file named by
``DTFS_TEST_KILL_ONCE`` exists (it is removed first). A session's zygote preloads a launch's
probe module before it forks the ranks, so it dies there, before any rank started
(tests/test_harness.py)."""
import os
import signal
from pathlib import Path

from harness_probes import probe_lineage, probe_value  # noqa: F401 - the probes launched

_MARKER = os.environ.get("DTFS_TEST_KILL_ONCE")
if _MARKER and Path(_MARKER).exists():
    Path(_MARKER).unlink()
    os.kill(os.getpid(), signal.SIGKILL)
