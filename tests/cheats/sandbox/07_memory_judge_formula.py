"""Cheat (sandbox only): bytes_per_device is the checker's own formula, imported from the
judge's module (exercise_utils.bonus_zero_sharding.checks_memory.expected_bytes).

Passes its check where the judge is importable; under the grading sandbox the judge's modules
read as empty and the import fails."""
from exercise_utils.bonus_zero_sharding.checks_memory import expected_bytes


def bytes_per_device(num_params, num_devices, stage, k=12):
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage {stage}")
    return float(expected_bytes(num_params, num_devices, int(stage), k))
