"""The GPipe and 1F1B orders notebook 10's pipeline checks expect (the judge's: no rank can
import them at grading, :func:`exercise_utils.sides.judge_files`; a rank that could would
return them from ``gpipe_order`` / ``one_f_one_b_order``). The pipeline's ranks get the orders
of their own runs as the probe's arguments (:func:`stage_orders`).

Used in 10_bonus_model_parallel (by :mod:`.checks_pp`).
"""
from .nets import PP_RUNS


def gpipe_ref(p, m, s):
    """The judge's GPipe order: all forwards, then the backwards in reverse order."""
    return [("F", j) for j in range(m)] + [("B", j) for j in reversed(range(m))]


def one_f_one_b_ref(p, m, s):
    """The judge's 1F1B order: warm-up of min(p-s-1, m) forwards, then F(j), B(j-w) pairs,
    then the remaining backwards."""
    warm = min(p - s - 1, m)
    order = [("F", j) for j in range(warm)]
    for j in range(warm, m):
        order += [("F", j), ("B", j - warm)]
    return order + [("B", j) for j in range(m - warm, m)]


ORDERS = {"gpipe": gpipe_ref, "1f1b": one_f_one_b_ref}


def stage_orders(size, runs=PP_RUNS):
    """``{run name: [the order of stage s, as lists, for s in range(size)]}`` for every run of
    ``runs`` (:func:`.nets.pp_runs`): what the pipeline probe hands each stage's
    ``pipeline_step``."""
    return {name: [[list(op) for op in ORDERS[sched](size, m, s)] for s in range(size)]
            for name, _, sched, m, _ in runs}
