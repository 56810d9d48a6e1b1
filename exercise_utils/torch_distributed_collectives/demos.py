"""Run a distributed demo that is *meant* to fail, and show only the lines that matter.

A failing torchrun job prints a wall of tracebacks (one per rank, plus torchrun's own).
Notebook 03 shows deliberate bugs (ranks that disagree on a collective, a rank that
skips one) and what PyTorch's diagnostics say about them; :func:`expect_failure` runs
such a script through :mod:`exercise_utils.launch` (hard timeout, every process killed)
and prints the few lines a student should read.

Used in 03_torch_distributed_collectives.
"""
import re
import time

from .. import launch

# Lines worth showing: what each rank printed itself, and the errors the ranks raised.
KEEP = re.compile(r"^(rank \d+[: ].*|\[rank\d+\]: \w*(Error|Exception)\b.*)$")
# Noise inside those lines: gloo's source locations, tensor options of collective fingerprints.
NOISE = re.compile(r"\[/\S+:\d+\] |, TensorDeviceTypes=TensorOptions\(.*?\(nullopt\)\)(?=\))")


def key_lines(output, width=320):
    """Return the lines of ``output`` a student should read, each cut to ``width`` chars.

    Args:
        output: the combined output of a launch.
        width: longest line shown.
    Returns:
        list of str: the ranks' own prints and their error lines, in order, without repeats.
    """
    seen, kept = set(), []
    for line in output.splitlines():
        line = NOISE.sub("", line.strip())
        if KEEP.match(line) and line not in seen:
            seen.add(line)
            kept.append(line if len(line) <= width else line[:width] + " ...")
    return kept


def expect_failure(script, nproc, args=(), env=None, timeout=60, show=True):
    """Run ``torchrun --nproc-per-node nproc script args`` expecting it to fail.

    Args:
        script: the script to run.
        nproc: number of ranks.
        args: script arguments.
        env: extra environment variables (e.g. ``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``).
        timeout: hard limit in seconds; the job and all its processes are killed after it.
        show: print the key lines and how the job ended.
    Returns:
        dict: ``ended`` ("failed", "killed after timeout" or "succeeded"), ``seconds``,
        ``lines`` (the key lines).
    """
    start = time.perf_counter()
    try:
        result = launch.torchrun(script, nproc, args=list(args), env=env, timeout=timeout,
                                 echo=False)
        ended, output = "succeeded", result.output
    except launch.LaunchTimeout as err:
        ended, output = f"killed after the {timeout} s timeout", err.output
    except launch.LaunchError as err:
        ended, output = "failed", err.output
    output = output if isinstance(output, str) else "\n".join(output)
    report = {"ended": ended, "seconds": time.perf_counter() - start,
              "lines": key_lines(output)}
    if show:
        for line in report["lines"]:
            print(line)
        print(f"--> the job {ended} after {report['seconds']:.0f} s; no process is left running.")
    return report
