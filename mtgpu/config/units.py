"""Parsing of sizes and durations used in the configuration and job files."""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_size(value: object) -> int:
    """Parse a size such as ``24G``, ``512M``, ``1.5T`` or a byte count into bytes.

    Units are binary, as in Slurm: ``1G`` is 2**30 bytes.

    >>> parse_size("24G")
    25769803776
    >>> parse_size(1024)
    1024
    >>> parse_size("20Q")
    Traceback (most recent call last):
    ...
    ValueError: '20Q' is not a size; use a number with K, M, G, T or P, such as 24G
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; use a number with K, M, G, T or P, such as 24G")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_MULT[m.group(2).upper()])
    raise ValueError(f"{value!r} is not a size; use a number with K, M, G, T or P, such as 24G")


def format_size(n: int) -> str:
    """Format a byte count the way :func:`parse_size` reads it.

    >>> format_size(25769803776)
    '24G'
    >>> format_size(1536 * 2**20)
    '1.5G'
    """
    for unit in ("P", "T", "G", "M", "K"):
        mult = _SIZE_MULT[unit]
        if n >= mult:
            v = n / mult
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B" if n else "0"


_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_DUR_MULT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object, *, default_unit: str = "s") -> float:
    """Parse ``30s``, ``15m``, ``2h``, ``7d`` (or a bare number in ``default_unit``) into seconds.

    >>> parse_duration("7d")
    604800.0
    >>> parse_duration(90)
    90.0
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value) * _DUR_MULT[default_unit]
    if isinstance(value, str):
        m = _DUR_RE.match(value)
        if m:
            return float(m.group(1)) * _DUR_MULT[m.group(2) or default_unit]
    raise ValueError(f"{value!r} is not a duration; use a number with s, m, h or d, such as 7d")
