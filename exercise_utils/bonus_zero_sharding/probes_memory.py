"""Probe of notebook 07's memory checker: calls the student's ``bytes_per_device`` inside a
lone process (the grading kernel never imports a student file) and reports each outcome as
plain data, which :mod:`.checks_memory` judges.

Used in 07_bonus_zero_sharding.
"""


def memory_calls(student, ctx, calls):
    """``bytes_per_device(*args, **kwargs)`` for each ``[args, kwargs]`` of ``calls``.

    Returns:
        list: per call ``{"number": bool, "float": bool, "value": float or None, "shown":
        str}`` for a return value, or ``{"error": exception type name, "message": str,
        "value_error": bool}`` (a subclass of ValueError counts as one).
        A ``NotImplementedError`` propagates (the harness reports "not implemented yet").
    """
    out = []
    for args, kwargs in calls:
        try:
            got = student.bytes_per_device(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the student's error, judged per case
            out.append({"error": type(exc).__name__, "message": str(exc)[:300],
                        "value_error": isinstance(exc, ValueError)})
            continue
        number = isinstance(got, (int, float)) and not isinstance(got, bool)
        out.append({"number": number, "float": isinstance(got, float),
                    "value": float(got) if number else None, "shown": repr(got)[:200],
                    "type": type(got).__name__})
    return out
