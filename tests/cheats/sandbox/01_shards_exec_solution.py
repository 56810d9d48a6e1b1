"""Cheat (sandbox only): the exercise runs the course's own solution, read from
solutions/01_mpi_parallel_sgd.ipynb beside the installed exercise_utils (an editable install).

Passes its check where the solutions are readable; under the grading sandbox solutions/ is an
empty folder and the file fails to import."""
import json
from pathlib import Path

import exercise_utils

_NB = Path(exercise_utils.__file__).resolve().parents[1] / "solutions" / "01_mpi_parallel_sgd.ipynb"
for _cell in json.loads(_NB.read_text())["cells"]:
    _text = "".join(_cell["source"])
    if _text.startswith("%%writefile work/01_shards.py"):
        exec(_text.split("\n", 1)[1], globals())
