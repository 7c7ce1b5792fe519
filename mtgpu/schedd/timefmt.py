"""Job time limits in Slurm's formats, and back.

A job's ``time`` limit is written the way ``sbatch --time`` takes it, so existing
scripts keep their meaning, or with a unit as elsewhere in MTGPU:

====================  ==========================
``MM``                minutes
``MM:SS``             minutes and seconds
``HH:MM:SS``          hours, minutes, seconds
``D-HH``              days and hours
``D-HH:MM``           days, hours, minutes
``D-HH:MM:SS``        days, hours, minutes, seconds
``90s`` ``30m`` ``2h`` ``1d`` ``1w``   a number with a unit
``0``, ``infinite``, ``unlimited``      no limit (as in Slurm)
====================  ==========================
"""

from __future__ import annotations

import re

from mtgpu.config.units import MAX_DURATION

_EXPECTED = (
    "expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or a number with "
    "s, m, h, d or w (such as 30m or 2h)"
)
# ASCII digits, at most ten a field: every form is bounded before any arithmetic.
_N = "([0-9]{1,10})"
_UNIT_RE = re.compile(r"^([0-9]{1,10}(?:\.[0-9]{1,10})?)([smhdw])$", re.ASCII)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DAYS_RE = re.compile(rf"^{_N}-{_N}(?::{_N})?(?::{_N})?$", re.ASCII)
_CLOCK_RE = re.compile(rf"^{_N}(?::{_N})?(?::{_N})?$", re.ASCII)
_UNLIMITED = {"infinite", "unlimited", "inf"}


def parse_time_limit(value: str) -> float | None:
    """Parse a time limit into seconds; ``None`` means no limit.

    >>> parse_time_limit("90")          # bare number: minutes, as in Slurm
    5400.0
    >>> parse_time_limit("1-12")
    129600.0
    >>> parse_time_limit("2:30:00")
    9000.0
    >>> parse_time_limit("30m")
    1800.0
    >>> parse_time_limit("unlimited") is None
    True
    >>> parse_time_limit("2x")
    Traceback (most recent call last):
    ...
    ValueError: '2x' is not a time limit; expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, \
D-HH:MM:SS or a number with s, m, h, d or w (such as 30m or 2h)
    """
    s = value.strip().lower()
    if s in _UNLIMITED:
        return None
    m = _UNIT_RE.match(s)
    if m:
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    elif (m := _DAYS_RE.match(s)) is not None:
        days, hours, minutes, secs = (int(g) if g else 0 for g in m.groups())
        seconds = float(days * 86400 + hours * 3600 + minutes * 60 + secs)
    elif (m := _CLOCK_RE.match(s)) is not None:
        parts = [int(g) for g in m.groups() if g is not None]
        # Slurm reads one field as minutes, two as MM:SS and three as HH:MM:SS.
        if len(parts) == 1:
            seconds = parts[0] * 60.0
        elif len(parts) == 2:
            seconds = parts[0] * 60.0 + parts[1]
        else:
            seconds = parts[0] * 3600.0 + parts[1] * 60 + parts[2]
    else:
        shown = repr(value) if len(value) <= 40 else f"a value of {len(value)} characters"
        raise ValueError(f"{shown} is not a time limit; {_EXPECTED}")
    if seconds > MAX_DURATION:
        raise ValueError(
            f"{value!r} is longer than the longest time limit, 100 years; use unlimited for no limit"
        )
    # Slurm takes a zero limit to mean "no limit"; doing the same keeps scripts' meaning.
    return None if seconds == 0 else seconds


def format_time_limit(seconds: float | None) -> str:
    """Format seconds the way ``squeue`` shows a limit: ``[D-]HH:MM:SS`` or ``UNLIMITED``.

    >>> format_time_limit(9000)
    '02:30:00'
    >>> format_time_limit(129600)
    '1-12:00:00'
    >>> format_time_limit(None)
    'UNLIMITED'
    """
    if seconds is None:
        return "UNLIMITED"
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
