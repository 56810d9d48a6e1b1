"""Course-wide settings read from the environment.

``DTFS_QUICK=1`` selects the quick mode used by the test suite and CI: smaller
data subsets, fewer steps and smaller sweeps. Quick mode changes sizes, never
code paths. Used in every notebook and launched script.
"""
import os

QUICK = os.environ.get("DTFS_QUICK", "0").strip().lower() in ("1", "true", "yes", "on")


def quick(full, quick_value):
    """Return ``quick_value`` in quick mode, ``full`` otherwise.

    Args:
        full: the value students get when running the notebook normally.
        quick_value: the smaller value used by the test suite (``DTFS_QUICK=1``).
    Returns:
        One of the two values.
    """
    return quick_value if QUICK else full
