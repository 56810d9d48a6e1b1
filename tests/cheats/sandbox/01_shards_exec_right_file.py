"""Cheat (sandbox only): the exercise runs a correct file of the course's tests
(tests/right/01_shards_send_recv.py), found beside the installed exercise_utils.

Passes its check where tests/ is readable; under the grading sandbox tests/ is an empty
folder and the file fails to import."""
from pathlib import Path

import exercise_utils

_RIGHT = Path(exercise_utils.__file__).resolve().parents[1] / "tests" / "right" / "01_shards_send_recv.py"
exec(compile(_RIGHT.read_text(), str(_RIGHT), "exec"), globals())
