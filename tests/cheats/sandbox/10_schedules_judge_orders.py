"""Cheat (sandbox only): gpipe_order and one_f_one_b_order return the orders the check itself
expects, imported from the judge's module (``exercise_utils.bonus_model_parallel.orders``).

Passes its check where that module can be imported (until issue 35 it sat in ``nets``, which
the ranks need); under the grading sandbox the judge's modules are hidden and the file fails
to import."""
from exercise_utils.bonus_model_parallel.orders import ORDERS


def check_schedule_args(num_stages, num_microbatches, stage):
    for name, v in (("num_stages", num_stages), ("num_microbatches", num_microbatches),
                    ("stage", stage)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if num_stages < 1 or num_microbatches < 1 or not 0 <= stage < num_stages:
        raise ValueError(f"need num_stages >= 1, num_microbatches >= 1, 0 <= stage < "
                         f"num_stages; got {num_stages}, {num_microbatches}, {stage}")


def gpipe_order(num_stages, num_microbatches, stage):
    check_schedule_args(num_stages, num_microbatches, stage)
    return ORDERS["gpipe"](num_stages, num_microbatches, stage)


def one_f_one_b_order(num_stages, num_microbatches, stage):
    check_schedule_args(num_stages, num_microbatches, stage)
    return ORDERS["1f1b"](num_stages, num_microbatches, stage)
