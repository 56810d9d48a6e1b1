"""What a student sees of a check (issue 26, part 1): a passed check is one line; a failed one
is a box whose first screen (title, message, the error line) is at most 12 lines, the rest of
the message and the checker's frames folded under "more", no checker source and no chained
exception; the cell still ends in an error, so nbgrader counts the failure as before. Tested
on the class, and in a real kernel (nbclient). The blank notebooks' CHECK cells are held to
the same in every notebook's autograde test (``grading.assert_failures_are_short``).
"""
import json
import re
import sys
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

from exercise_utils import display, launch, progress
from exercise_utils.contract import CheckFailure
from grading import first_screen

LONG = ("rank 1: ring_all_reduce on a tensor of shape (1007,), dtype float32, with 3 ranks is "
        "wrong at 3 of 1007 elements (first at flat index 1004: got 1.0, expected the sum "
        "3.0). Only the last numel % world_size = 2 elements are wrong.\n" +
        "\n".join(f"  detail {i}" for i in range(30)))


def failure(message=LONG):
    try:
        raise CheckFailure(message, "ring-uneven") from ValueError("inner")
    except CheckFailure as err:
        err.check, err.seconds = "check_ring_allreduce", 12.34
        return display.Failure(err)


def test_a_failure_shows_message_first_and_folds_the_rest():
    box = failure()
    text = box.text().splitlines()
    assert text[0] == "✗ check_ring_allreduce failed (case ring-uneven, 12.3 s)"
    shown = text[:text.index(next(t for t in text if t.startswith("▸ more")))]
    assert len(shown) + 2 <= display.FIRST_SCREEN            # + the "more" and error lines
    assert "rank 1: ring_all_reduce" in text[1] and all(len(t) <= 100 for t in shown)
    assert "detail 29" in box.text() and "detail 29" not in "\n".join(shown)
    assert any("test_display.py" in t for t in box.rest)     # the frames, folded
    html = box._repr_html_()
    assert "<details>" in html and "check_ring_allreduce failed" in html
    assert "&lt;" not in failure("a < b").text() and "a &lt; b" in failure("a < b")._repr_html_()


def test_a_short_failure_has_only_the_frames_folded():
    box = failure("not implemented yet: ring_all_reduce in work/03_ring_allreduce.py")
    assert box.first == ["not implemented yet: ring_all_reduce in work/03_ring_allreduce.py"]
    assert box.rest[1].startswith("The checker's traceback")


def test_summary_of_a_passed_check():
    line = display.summary("check_x", [("a", 3, "gloo"), ("b", 4, "gloo"), ("c", 2, "gloo")],
                           12.34)
    assert line == "✓ check_x: all checks passed (3 launches with 2, 3 and 4 ranks, 12.3 s)"
    assert display.summary("check_y", [], 0.01).endswith("(no launch, 0.0 s)")
    assert "with 1 rank," in display.summary("check_z", [("a", 1, "none")], 1)


def test_run_result_repr_is_one_line():
    res = launch.RunResult(["x"], 0, "a\nb\nc\n", 1.23)
    assert repr(res) == "<RunResult: exit code 0 after 1.2 s, 3 lines of output in .output>"


CELLS = [
    "import exercise_utils\nfrom exercise_utils.harness import check\n"
    "from exercise_utils.contract import fail",
    textwrap.dedent('''
        @check
        def check_demo(bad):
            if bad:
                fail("demo-case", %r)
            return True         # (a check's value is not shown: one line)
        check_demo(False)''') % LONG,
    "check_demo(True)",
    "raise ValueError('an ordinary error keeps its traceback')",
    textwrap.dedent('''
        import pathlib, tempfile
        from exercise_utils.harness import run_ranks
        blank = pathlib.Path(tempfile.mkdtemp()) / "blank.py"
        blank.write_text("import time\\ntime.sleep(2.5)\\n")
        @check
        def check_launch():
            run_ranks(blank, "exercise_utils.rankworker:probe_idle", 2, "none", what="idle")
        check_launch()'''),
    "import time\ntime.sleep(1.5)\ncheck_demo(False)",
    textwrap.dedent('''
        unfinished = blank.parent / "unfinished.py"
        unfinished.write_text(
            "class Demo:\\n    def shard(self):\\n        # YOUR CODE HERE\\n"
            "        raise NotImplementedError()\\n\\n\\n"
            "def later():\\n    raise NotImplementedError\\n\\n\\nDemo().shard()\\n")
        from exercise_utils import launch
        launch.mpiexec(unfinished, 2, timeout=60)'''),
    # in the kernel itself (issue 39): a student's function not written yet, a name only an
    # earlier cell sets, what a cell needs first; errors of other kinds keep their traceback
    "import runpy\nprint('before')\nrunpy.run_path(str(unfinished))",
    "print(set_by_an_earlier_cell)",
    "from exercise_utils.display import NotReady\nraise NotReady('not there yet: x.pt\\nRun the "
    "cell above first.')",
    "raise NotImplementedError('the cell itself')",
    "exec(compile('undefined_name', str(blank.parent / 'lib.py'), 'exec'))",   # not the cell's
    "import os\nos.chdir(blank.parent)",
    "%%part parted.py 1/2\nA = 1",             # the magic of one file over several cells
]


@pytest.mark.timeout(300)
def test_in_a_kernel_a_passed_check_is_one_line_and_a_failure_a_short_box():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True).execute()
    passed = nb.cells[1].outputs
    assert [o.output_type for o in passed] == ["stream"], passed
    assert passed[0].text.startswith("✓ check_demo: all checks passed (no launch, ")
    assert passed[0].text.count("\n") == 1
    failed = nb.cells[2].outputs
    assert [o.output_type for o in failed] == ["display_data", "error"], failed
    assert "<details>" in failed[0].data["text/html"]
    assert failed[1].ename == "CheckFailure" and len(failed[1].traceback) == 1
    screen = first_screen(json.dumps(failed))
    assert len(screen) <= display.FIRST_SCREEN and "rank 1: ring_all_reduce" in screen[1]
    assert not any("harness.py" in line or "exercise_utils/" in line for line in screen)
    other = nb.cells[3].outputs
    assert other[0].output_type == "error" and len(other[0].traceback) > 1
    launched = [o for o in nb.cells[4].outputs if o.output_type != "display_data"
                or o.data.get("text/plain")]        # the progress line, emptied at the end
    assert [o.output_type for o in launched] == ["stream"], nb.cells[4].outputs
    assert launched[0].text.startswith("✓ check_launch: all checks passed (1 launch with 2 "
                                       "ranks, "), launched[0].text
    # a launched cell on an unfinished file: no traceback on the screen, the box first names
    # the function and what else the file has still to write (issue 39)
    todo = nb.cells[6].outputs
    shown = "".join(o.get("text", "") for o in todo if o.output_type == "stream")
    assert "Traceback" not in shown and "[0] NotImplementedError" in shown, todo
    assert "lines of the ranks' tracebacks not shown" in shown, todo
    box = next(o for o in todo if o.output_type == "display_data")
    text = box.data["text/plain"]
    assert text.startswith("✗ not implemented yet: Demo.shard\nDemo.shard in "), text
    assert "Still to do in that file, in order: later." in " ".join(text.split()), text
    screen = first_screen(json.dumps([o for o in todo if o.output_type != "stream"]))
    assert len(screen) <= display.FIRST_SCREEN, screen
    assert todo[0].output_type == "display_data" and todo[0].data["text/plain"] == text, todo
    for index, title, first in ((7, "✗ not implemented yet: Demo.shard", "Demo.shard in "),
                                (8, "✗ name 'set_by_an_earlier_cell' is not defined",
                                 "This cell uses `set_by_an_earlier_cell`, which no cell"),
                                (9, "✗ not there yet: x.pt", "Run the cell above first.")):
        shown = first_screen(json.dumps(nb.cells[index].outputs))
        shown = shown[1:] if index == 7 and shown[0] == "before" else shown   # (its own print)
        assert shown[0] == title and shown[1].startswith(first), shown
        assert len(shown) <= display.FIRST_SCREEN and not any(
            "Traceback" in line or "File" in line for line in shown), shown
    assert first_screen(json.dumps(nb.cells[7].outputs))[-1] == "NotImplementedError: "
    for index in (10, 11):                       # not the student's file, not the cell: as ever
        error = nb.cells[index].outputs[-1]
        assert [o.output_type for o in nb.cells[index].outputs] == ["error"], index
        assert len(error.traceback) > 1, error
    assert [o.text for o in nb.cells[13].outputs] == [
        "Wrote part 1/2 of parted.py (parts not run yet: 2)\n"], nb.cells[13].outputs
    # the time a check prints is its cell's, from the cell's start (the cell's imports too)
    late = nb.cells[5].outputs
    assert [o.output_type for o in late] == ["stream"], late
    assert float(re.search(r", ([0-9.]+) s\)$", late[0].text.strip()).group(1)) >= 1.5, late


def test_a_notebooks_launch_leaves_the_ranks_tracebacks_out_of_the_live_output():
    """(:class:`display.Tracebacks`) each rank's traceback, but for its error line, and
    nothing else; chained ones too; the lines left pass the inner filter."""
    lines = ["[0] starting", "[0] Traceback (most recent call last):",
             '[0]   File "x.py", line 3, in <module>', "[1] Traceback (most recent call last):",
             "[0]     f()", '[1]   File "x.py", line 3, in <module>', "[0] ValueError: no",
             "[1] KeyError: 'a'", "[1] ", "[1] During handling of the above exception, "
             "another exception occurred:", "[1] ", "[1] Traceback (most recent call last):",
             '[1]   File "x.py", line 5, in <module>', "[1] RuntimeError: again", "[0] done",
             "[0] drop me"]
    echo = display.Tracebacks(inner=lambda line: line != "[0] drop me")
    assert [line for line in lines if echo(line)] == [
        "[0] starting", "[0] ValueError: no", "[1] KeyError: 'a'", "[1] RuntimeError: again",
        "[0] done"]
    assert echo.hidden == 10 and "10 lines of the ranks' tracebacks" in echo.note()
    assert display.Tracebacks().note() is None
    # two ranks without a prefix (torchrun's workers forked from a zygote), their tracebacks
    # interleaved: the second one's frames after the first one's error line stay out too
    bare = ["Traceback (most recent call last):", "Traceback (most recent call last):",
            '  File "z.py", line 331, in _run_script', "    run()", "NotImplementedError",
            '  File "z.py", line 331, in _run_script', "    run()", "NotImplementedError",
            "(a summary)"]
    echo = display.Tracebacks()
    assert [line for line in bare if echo(line)] == [
        "NotImplementedError", "NotImplementedError", "(a summary)"]
    # ... and a frame's source line first (a fresh-clone CI run, notebook 05's blank release:
    # the other rank's "    runpy.run_path(...)" came right after the first one's error line)
    bare = ["Traceback (most recent call last):", "Traceback (most recent call last):",
            "NotImplementedError", '    runpy.run_path(target, run_name="__main__")',
            '  File "<frozen runpy>", line 291, in run_path', "NotImplementedError",
            "(a summary)"]
    echo = display.Tracebacks()
    assert [line for line in bare if echo(line)] == [
        "NotImplementedError", "NotImplementedError", "(a summary)"]


def test_a_launch_stopped_by_unwritten_code_names_the_function(tmp_path):
    path = tmp_path / "w.py"
    path.write_text("class A:\n    def f(self):\n        raise NotImplementedError\n\n\n"
                    "def g():\n    raise NotImplementedError()\n\n\ndef h():\n    return 1\n")
    out = (f'[rank1]:   File "{path}", line 3, in f\n[rank0]: Traceback (most recent call '
           f'last):\n[rank0]:   File "/lib/torch.py", line 9, in f\n[rank0]: '
           f'NotImplementedError\n[rank1]: NotImplementedError\n')
    name, message = display.not_written(out)
    assert name == "A.f" and message.startswith(f"A.f in {path} still raises "), message
    assert message.endswith("Still to do in that file, in order: g."), message
    # raised in a library's function of the same name: an ordinary error
    assert display.not_written(out.replace("[rank1]: NotImplementedError\n", "")) is None
    assert display.not_written("ValueError: x") is None


def test_the_progress_line_says_what_runs_and_who_stands_still():
    seen = {0: {"case": "ring-uneven", "moved": 100.0, "student": [12, "ring_all_reduce"]},
            1: {"case": "ring-uneven", "moved": 80.0, "student": None}}
    line = progress.progress_line("ring_all_reduce with 3 ranks", 3, "gloo", 21.4, seen, 101.0)
    assert line == ("running ring_all_reduce with 3 ranks: 3 gloo ranks, 21 s, case ring-uneven; "
                    "rank 1: no progress for 21 s")
    seen[0]["moved"] = 80.0
    assert "rank 0: no progress for 21 s at line 12 (ring_all_reduce)" in progress.progress_line(
        "x", 3, "gloo", 21.4, seen, 101.0)


def test_a_failed_launch_shows_each_ranks_first_error_and_folds_the_output():
    output = "\n".join(["rank 0 starting", "[rank1]: Traceback (most recent call last):",
                        '[rank1]:   File "x.py", line 6, in <module>',
                        "[rank1]: ValueError: rank 1 broke on purpose",
                        "[rank0]: RuntimeError: Connection closed by peer",
                        "[rank1]: ValueError: again", "Traceback (most recent call last):",
                        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                        *[f"report line {i}" for i in range(40)]])
    err = launch.LaunchError("`torchrun --nproc-per-node 2 x.py` failed with exit code 1 after "
                             "3.2 s; its remaining processes were killed.\n--- last output "
                             "---\n" + output, ["torchrun"], 1, output)
    box = display.Failure(err)
    assert box.title.startswith("✗ `torchrun --nproc-per-node 2 x.py` failed with exit code 1")
    assert box.first[-3:] == ["Each rank's first error:",
                              "  rank 1: ValueError: rank 1 broke on purpose",
                              "  rank 0: RuntimeError: Connection closed by peer"]
    assert len(box.first) + 3 <= display.FIRST_SCREEN
    assert "report line 39" in "\n".join(box.rest)
    assert display.first_errors("OverflowError: big\nplain line") == ["OverflowError: big"]


def test_torchruns_failure_report_is_hidden_from_the_live_output(tmp_path, capsys):
    script = tmp_path / "fail.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      "import sys\nsys.stdout.write(f'rank {dist.get_rank()} up\\n')\n"
                      "sys.stdout.flush()\n"   # one write: the ranks share a pipe, unbuffered
                      "if dist.get_rank() == 1:\n    raise ValueError('rank 1 broke')\n"
                      "dist.barrier()\n")
    with pytest.raises(launch.LaunchError) as err:
        launch.torchrun(script, 2, timeout=120)
    shown = capsys.readouterr().out
    assert "[rank1]: ValueError: rank 1 broke" in shown and "rank 1 up" in shown
    assert "ChildFailedError" not in shown and "Root Cause" not in shown
    assert "torchrun's failure report" in shown
    assert "ChildFailedError" in err.value.output            # nothing lost
    assert len(shown.splitlines()) < len(err.value.output.splitlines()) - 20


MARKING = textwrap.dedent("""\
    import time
    from exercise_utils.progress import Marks
    marks = Marks(every=0.0)
    for epoch in (1, 2):
        marks.stage(f"epoch {epoch}/2", 3)
        for step in (1, 2, 3):
            time.sleep(0.05)
            marks.update(step)
        print(f"epoch {epoch} done", flush=True)
    """)


def test_marks_print_only_for_a_launcher_that_shows_bars(monkeypatch, capsys):
    """A rank's progress marks: nothing unless the launcher asked (DTFS_MARKS=1); then one
    JSON line per update, rate-limited, always at a stage's end; off for other ranks."""
    monkeypatch.delenv("DTFS_MARKS", raising=False)
    progress.Marks().stage("epoch 1/1", 2)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("DTFS_MARKS", "1")
    progress.Marks(enabled=False).stage("epoch 1/1", 2)
    assert capsys.readouterr().out == ""
    marks = progress.Marks(every=60)
    marks.stage("epoch 1/1", 3)
    for step in (1, 2, 3):
        marks.update(step)                 # 1 and 2 within the minute: not printed; 3: the end
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(ln[len(progress.MARK):]) for ln in lines] == [
        {"what": "epoch 1/1", "done": 0, "total": 3}, {"what": "epoch 1/1", "done": 3, "total": 3}]


def test_a_launch_turns_its_ranks_marks_into_a_bar_and_never_prints_them(monkeypatch, capsys):
    fed = []
    monkeypatch.setattr(progress.Bars, "wanted", staticmethod(lambda: True))
    monkeypatch.setattr(progress.Bars, "feed",
                        lambda self, line: fed.append(line) if progress.MARK in line else None)
    res = launch.run([sys.executable, "-c", MARKING], timeout=120)
    out = capsys.readouterr().out
    assert progress.MARK not in out and progress.MARK not in res.output
    assert out.splitlines() == ["epoch 1 done", "epoch 2 done"] == res.output.splitlines()
    marks = [json.loads(line[line.index(progress.MARK) + len(progress.MARK):]) for line in fed]
    assert marks[0] == {"what": "epoch 1/2", "done": 0, "total": 3}
    assert marks[-1] == {"what": "epoch 2/2", "done": 3, "total": 3} and len(marks) == 8
    fed.clear()
    monkeypatch.setattr(progress.Bars, "wanted", staticmethod(lambda: False))
    res = launch.run([sys.executable, "-c", MARKING], timeout=120)   # no bar: no marks made
    assert fed == [] and progress.MARK not in res.output


@pytest.mark.timeout(300)
def test_in_a_kernel_a_launch_shows_a_tqdm_bar_and_only_the_ranks_lines():
    cells = ["from exercise_utils import launch\nimport sys",
             f"launch.run([sys.executable, '-c', {MARKING!r}], timeout=120)"
             "\nprint('after')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=240, kernel_name="python3").execute()
    outputs = nb.cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert text == "epoch 1 done\nepoch 2 done\nafter\n", outputs
    widgets = [o for o in outputs if o.output_type == "display_data"
               and "application/vnd.jupyter.widget-view+json" in o.data]
    assert widgets, outputs                  # tqdm.auto's bar: a widget in Jupyter


def test_a_bar_starts_again_only_at_a_new_stage(monkeypatch):
    """Bars.feed: a mark of the same stage moves the bar; a new stage (an epoch) resets it."""
    import tqdm.auto
    events = []

    class FakeBar:
        def __init__(self, total, desc, **kwargs):
            self.total, self.n = total, 0
            events.append(("new", desc, total))

        def reset(self, total):
            events.append(("reset", total))

        def set_description(self, desc, refresh=True):
            events.append(("desc", desc))

        def refresh(self):
            events.append(("at", self.n))

        def close(self):
            events.append(("close",))
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    bars = progress.Bars()
    mark = progress.MARK + '{"what": "%s", "done": %d, "total": 3}'
    for line in (mark % ("epoch 1/2", 0), "[0] " + mark % ("epoch 1/2", 2),
                 mark % ("epoch 2/2", 0), mark % ("epoch 2/2", 3)):
        assert bars.feed(line)
    assert not bars.feed("epoch 1: loss 0.3") and bars.feed(progress.MARK + "not json")
    bars.close()
    assert events == [("new", "epoch 1/2", 3), ("at", 0), ("at", 2), ("reset", 3),
                      ("desc", "epoch 2/2"), ("at", 0), ("at", 3), ("close",)]
