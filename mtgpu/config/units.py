"""The one parser of sizes, durations and counts, for the configuration, job files and
the API.

Every number a tenant or an administrator writes goes through here, so each is
bounded the same way: ASCII digits only (``cpus=٣`` and ``ram=３G`` are refused as
``ram=²G`` is), at most :data:`MAX_DIGITS` of them, no NaN or infinity, and a result
no larger than the largest that means anything (:data:`MAX_SIZE`,
:data:`MAX_DURATION`, :data:`MAX_COUNT`). A refusal is a ``ValueError`` saying what
was wrong and what is expected; nothing here raises ``OverflowError``.
"""

from __future__ import annotations

import math
import re

from mtgpu.errors import ValidationError

#: The most digits a number may have before its unit (a size of 2**60 has 19).
MAX_DIGITS = 20
#: The largest size: 1 EiB, far beyond any memory or disk of one host.
MAX_SIZE = 1 << 60
#: The longest duration: 100 years, in seconds.
MAX_DURATION = 100 * 366 * 86400
#: The largest count (CPUs, members, jobs, tries...).
MAX_COUNT = 1_000_000_000

# [0-9], not \d: \d also matches other scripts' digits, which int() would read.
_NUMBER = rf"([0-9]{{1,{MAX_DIGITS}}}(?:\.[0-9]{{1,{MAX_DIGITS}}})?)"
_SIZE_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([KMGTP]?)(i?B?)?\s*$", re.IGNORECASE | re.ASCII)
_SIZE_MULT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_COUNT_RE = re.compile(rf"^\s*([0-9]{{1,{MAX_DIGITS}}})\s*$", re.ASCII)


def finite_number(value: object, what: str = "a number") -> float:
    """``value`` as a float if it is a real, finite number (not a bool, NaN or infinity).

    >>> finite_number(2)
    2.0
    >>> finite_number(float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: nan is not a finite number; expected a number
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"{value!r} is not {what}")
    if isinstance(value, int):
        if abs(value) > 10**MAX_DIGITS:
            raise ValidationError(f"a number of {len(str(abs(value)))} digits is too large; expected {what}")
        return float(value)
    if not math.isfinite(value):
        raise ValidationError(f"{value!r} is not a finite number; expected {what}")
    return value


def parse_count(
    value: object, *, minimum: int = 0, maximum: int = MAX_COUNT, what: str = "a whole number"
) -> int:
    """A whole number from ``minimum`` to ``maximum``, from an int or ASCII digits.

    >>> parse_count("8", minimum=1)
    8
    >>> parse_count("٣")
    Traceback (most recent call last):
    ...
    ValueError: '٣' is not a whole number; use the digits 0-9
    """
    if isinstance(value, bool):
        raise ValidationError(f"{value!r} is not {what}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _COUNT_RE.match(value)
        if not m:
            if len(value) > 40:
                raise ValidationError(f"a value of {len(value)} characters is not {what}")
            raise ValidationError(f"{value!r} is not {what}; use the digits 0-9")
        n = int(m.group(1))
    else:
        raise ValidationError(f"{value!r} is not {what}")
    if not minimum <= n <= maximum:
        shown = str(n) if len(str(n)) <= 20 else f"a number of {len(str(n))} digits"
        raise ValidationError(f"{shown} is not {what} from {minimum} to {maximum}")
    return n


def _shown(value: object) -> str:
    """``repr(value)``, cut short: a refusal never echoes a megabyte back."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"...' ({len(text)} characters)"


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
    n: float | None = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        n = value
    elif isinstance(value, str):
        n = _with_unit(value, _SIZE_RE, _SIZE_MULT, "")
    return int(
        _bounded(
            value,
            n,
            MAX_SIZE,
            "a size; use a number with K, M, G, T or P, such as 24G",
            "larger than the largest size, 1024P",
        )
    )


def _with_unit(text: str, pattern: re.Pattern[str], mult: dict[str, int], default_unit: str) -> float | None:
    """The number in ``text`` times its unit, or None if ``text`` is not one."""
    m = pattern.match(text) if len(text) <= 64 else None
    if m is None:
        return None
    unit = m.group(2) or default_unit
    return float(m.group(1)) * (mult[unit] if unit in mult else mult[unit.upper()])


def _bounded(value: object, n: float | None, maximum: float, what: str, past: str) -> float:
    """``n`` (what ``value`` reads as), refused if it is None (``value`` is not ``what``)
    or above ``maximum`` (it is ``past`` the largest)."""
    if n is None:
        raise ValidationError(f"{_shown(value)} is not {what}")
    if n > maximum:
        raise ValidationError(f"{_shown(value)} is {past}")
    return n


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


_DUR_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([smhdw]?)\s*$", re.ASCII)
_DUR_MULT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object, *, default_unit: str = "s") -> float:
    """Parse ``30s``, ``15m``, ``2h``, ``7d`` (or a bare number in ``default_unit``) into seconds.

    >>> parse_duration("7d")
    604800.0
    >>> parse_duration(90)
    90.0
    """
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValidationError(
                f"{value!r} is not a duration; use a finite number with s, m, h, d or w, such as 7d"
            )
        if value >= 0 and (isinstance(value, float) or value <= 10**MAX_DIGITS):
            seconds = float(value) * _DUR_MULT[default_unit]
    elif isinstance(value, str):
        seconds = _with_unit(value, _DUR_RE, _DUR_MULT, default_unit)
    return _bounded(
        value,
        seconds,
        MAX_DURATION,
        "a duration; use a number with s, m, h, d or w, such as 7d",
        "longer than the longest duration, 100 years",
    )
