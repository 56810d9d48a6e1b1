"""Plain data across the boundary between the student's processes and the judge.

What a rank reports (and what the harness hands a rank) is written as JSON plus one ``.npz`` of
numeric arrays, and read back with pickling off: a student file cannot make the reader run
code (a pickle's ``__reduce__``, an object array), only hand it numbers, strings and arrays.

Encodable: None, bool, int, float (NaN and infinities included), str, list, tuple, dict (any
encodable keys), numpy arrays and scalars of numeric or bool dtype, and torch tensors (read
back as tensors of the same dtype; bfloat16 and other dtypes numpy lacks travel as float32
and are cast back). Anything else raises :class:`PlainDataError` on the writing side, so a
probe that would report an object says so at once.

    write(path, value)        # path.json (+ path.npz when there are arrays)
    value = read(path)

Used by :mod:`exercise_utils.harness` (reads) and :mod:`exercise_utils.rankworker` (writes):
every checker, 01_mpi_parallel_sgd onwards.
"""
import io
import json
import math
import sys
from pathlib import Path

import numpy as np

KINDS = "biufc"                  # numpy dtype kinds a report may hold (no objects, no strings)
MAX_BYTES = 1 << 30              # a report larger than this is refused (a runaway probe)


class PlainDataError(TypeError):
    """A value that is not plain data (or a file that does not hold plain data)."""


def encode(value):
    """``(json_text, {name: array})`` for ``value``."""
    arrays = {}
    return json.dumps(_enc(value, arrays, 0), allow_nan=True), arrays


def decode(text, arrays):
    """The value :func:`encode` encoded."""
    return _dec(json.loads(text), arrays)


def dumps(value):
    """One bytes object holding ``value``: a JSON header line, then an ``.npz`` archive."""
    text, arrays = encode(value)
    buf = io.BytesIO()
    if arrays:
        np.savez(buf, **arrays)
    blob = text.encode() + b"\n" + buf.getvalue()
    if len(blob) > MAX_BYTES:
        raise PlainDataError(f"a report of {len(blob)} bytes is too large")
    return blob


def loads(blob):
    """The value :func:`dumps` wrote; never unpickles."""
    text, _, archive = blob.partition(b"\n")
    arrays = {}
    if archive:
        try:
            with np.load(io.BytesIO(archive), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except ValueError as exc:       # an object array: np.load refuses it without pickle
            raise PlainDataError(f"not plain data: {exc}") from None
    return decode(text.decode(), arrays)


def write(path, value):
    """Write ``value`` to ``path`` (bytes of :func:`dumps`)."""
    Path(path).write_bytes(dumps(value))


def read(path):
    """The value :func:`write` wrote to ``path``; never unpickles."""
    return loads(Path(path).read_bytes())


def _enc(value, arrays, depth):
    if depth > 64:
        raise PlainDataError("a report nested more than 64 levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if type(value) is int else int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"__float__": repr(float(value))}
    if isinstance(value, (list, tuple)):
        items = [_enc(v, arrays, depth + 1) for v in value]
        return items if type(value) is list else {"__tuple__": items}
    if isinstance(value, dict):
        return {"__dict__": [[_enc(k, arrays, depth + 1), _enc(v, arrays, depth + 1)]
                             for k, v in value.items()]}
    if isinstance(value, (np.ndarray, np.generic)):
        return _array(np.asarray(value), arrays, scalar=isinstance(value, np.generic))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        try:
            data = t.numpy()
        except TypeError:              # bfloat16 and other dtypes numpy does not have
            data = t.float().numpy()
        return {**_array(data, arrays, False), "tensor": dtype}
    raise PlainDataError(f"cannot report a {type(value).__module__}.{type(value).__qualname__}: "
                         f"a probe reports plain data (numbers, strings, lists, tuples, dicts, "
                         f"numeric arrays, tensors)")


def _array(data, arrays, scalar):
    if data.dtype.kind not in KINDS:
        raise PlainDataError(f"cannot report an array of dtype {data.dtype}")
    name = f"a{len(arrays)}"
    arrays[name] = np.array(data, order="C")          # (ascontiguousarray makes 0-d 1-d)
    return {"__array__": name, "scalar": scalar}


def _dec(obj, arrays):
    if isinstance(obj, list):
        return [_dec(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tuple__" in obj:
        return tuple(_dec(v, arrays) for v in obj["__tuple__"])
    if "__dict__" in obj:
        return {_key(_dec(k, arrays)): _dec(v, arrays) for k, v in obj["__dict__"]}
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__array__" in obj:
        data = arrays.get(obj["__array__"])
        if data is None or data.dtype.kind not in KINDS:
            raise PlainDataError(f"not plain data: array {obj['__array__']!r}")
        if "tensor" in obj:
            import torch
            return torch.from_numpy(data.copy()).to(getattr(torch, obj["tensor"]))
        return data[()] if obj.get("scalar") else data
    raise PlainDataError(f"not plain data: {sorted(obj)[:3]}")


def _key(key):
    if isinstance(key, list):          # a list cannot be a key; a tuple can
        raise PlainDataError("not plain data: a list as a dict key")
    return key
