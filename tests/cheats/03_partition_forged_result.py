"""Cheat: at import, write the check's result files itself (its folder is in argv, the format
is plain data, as the worker's code shows: exercise_utils.plaindata) and exit before the probe
runs. Its values are
empty here; a real cheat would put the expected ones: the point is that the check never
believes a result the worker did not sign.

Must be rejected: "the check's integrity was violated" (the results are not signed)."""
import os
import sys

from exercise_utils import plaindata

if "--out" in sys.argv:
    rank = int(os.environ.get("RANK", 0))
    out = sys.argv[sys.argv.index("--out") + 1].replace("{rank}", str(rank))   # its folder
    fake = {"ok": True, "value": ([], [], [], [], []), "tampered": []}
    with open(os.path.join(out, f"rank{rank}.report"), "wb") as f:
        f.write(plaindata.dumps(fake))
    os._exit(0)


def partition_sizes(n, fractions):
    raise NotImplementedError()
