"""A checkpoint's training state that is not the model's or the optimizer's (the step, the LR scheduler, the random
generators, the loaders' positions), as JSON rather than a pickle.

Why: unpickling runs whatever the file says, so a checkpoint whose trainer state were a pickle would let anyone
who can write it run code in every worker that resumes from it. JSON runs nothing. The few values that JSON has no
word for are tagged: tuples (Python's and NumPy's generator states are tuples, and ``random.setstate`` wants one
back), dicts with keys that are not strings, tensors and NumPy arrays (the generators' states: raw bytes, with
their dtype and shape). Anything else is refused when the checkpoint is written, naming where it was, rather than
coming back changed.
"""

from __future__ import annotations

import base64
import json
from types import ModuleType
from typing import Any

import torch

_TUPLE, _DICT, _TENSOR, _ARRAY = "__tuple__", "__dict__", "__tensor__", "__ndarray__"


def dumps(state: Any) -> bytes:
    """``state`` as JSON bytes; TypeError naming the first value that JSON cannot keep."""
    return json.dumps(_encode(state, "state"), separators=(",", ":")).encode("utf-8")


def loads(blob: bytes) -> Any:
    """What :func:`dumps` wrote. A blob that is not JSON (a pickle an older version wrote) is refused."""
    try:
        data = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            "this checkpoint's trainer state is not JSON (an older optuna-saturn pickled it, and "
            "pickles are no longer loaded): the trial starts from its first step"
        ) from exc
    return _decode(data)


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(item, f"{where}[{i}]") for i, item in enumerate(value)]}
    if isinstance(value, dict):
        return {
            _DICT: [[_encode(key, f"{where} key"), _encode(item, f"{where}[{key!r}]")] for key, item in value.items()]
        }
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        return {_TENSOR: [str(flat.dtype).removeprefix("torch."), list(value.shape), _bytes_of(flat)]}
    numpy: ModuleType | None
    try:
        import numpy
    except ImportError:  # pragma: no cover (torch needs NumPy for little; it may be absent)
        numpy = None
    if numpy is not None and isinstance(value, numpy.ndarray):
        return {
            _ARRAY: [
                value.dtype.str,
                list(value.shape),
                base64.b64encode(numpy.ascontiguousarray(value).tobytes()).decode("ascii"),
            ]
        }
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    raise TypeError(
        f"a checkpoint keeps its trainer state as JSON, and {where} is a {type(value).__name__}: keep "
        "numbers, strings, lists, dicts, tensors and NumPy arrays in the LR scheduler's state_dict()"
    )


def _bytes_of(flat: torch.Tensor) -> str:
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    return base64.b64encode(raw.numpy().tobytes()).decode("ascii")


def _decode(data: Any) -> Any:
    if isinstance(data, list):
        return [_decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if _TUPLE in data:
        return tuple(_decode(item) for item in data[_TUPLE])
    if _DICT in data:
        return {_decode(key): _decode(item) for key, item in data[_DICT]}
    if _TENSOR in data:
        dtype_name, shape, encoded = data[_TENSOR]
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"this checkpoint's trainer state names no tensor type: {dtype_name!r}")
        raw = bytearray(base64.b64decode(encoded))
        if dtype == torch.bool:
            return (
                torch.frombuffer(raw, dtype=torch.uint8).to(torch.bool).reshape(shape)
                if raw
                else torch.empty(shape, dtype=torch.bool)
            )
        return torch.frombuffer(raw, dtype=dtype).reshape(shape).clone() if raw else torch.empty(shape, dtype=dtype)
    if _ARRAY in data:
        import numpy

        dtype_str, shape, encoded = data[_ARRAY]
        if numpy.dtype(dtype_str).hasobject:
            raise ValueError("this checkpoint's trainer state holds an array of Python objects")
        return numpy.frombuffer(base64.b64decode(encoded), dtype=numpy.dtype(dtype_str)).reshape(shape).copy()
    raise ValueError(f"this checkpoint's trainer state holds an untagged object {sorted(data)[:3]}")
