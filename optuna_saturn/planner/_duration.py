"""Durations as people write them: ``"90m"``, ``"8h"``, ``"1h30m"``, or a number of seconds."""

from __future__ import annotations

import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: float | str, name: str = "deadline") -> float:
    """Seconds, from a number of seconds or text such as ``"90m"``, ``"8h"``, ``"1d"`` or ``"1h30m"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().replace(" ", "")
    match = re.fullmatch(r"((?:\d+(?:\.\d+)?[smhd])+|\d+(?:\.\d+)?)", text)
    if not match:
        raise ValueError(f"{name} must be seconds or a duration such as '90m', '8h' or '1h30m', got {value!r}.")
    if text[-1].isdigit():
        return float(text)
    return sum(float(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))
