"""Reading autograded notebooks in the tests of notebooks 01 to 03.

The autograde tests run every check cell on the solution and on the blank release, so they
also prove that each checker accepts the solution ("all checks passed") and says "not
implemented yet" for the blank release; separate checker runs on those files would only
repeat that work.
"""
import json


def check_outputs(course, student, stem):
    """Return ``{first line of each # CHECK cell: its outputs as JSON text}`` for one student."""
    path = course / "autograded" / student / stem / f"{stem}.ipynb"
    cells = json.loads(path.read_text())["cells"]
    return {"".join(c["source"]).split("\n")[0]: json.dumps(c.get("outputs", []))
            for c in cells if "".join(c["source"]).startswith("# CHECK ")}


def assert_every_check_says(course, student, stem, expected, count):
    """Assert that all ``count`` check cells of ``student`` printed ``expected``."""
    checks = check_outputs(course, student, stem)
    assert len(checks) == count, sorted(checks)
    for first_line, outputs in checks.items():
        assert expected in outputs, (student, first_line, outputs[-1500:])
