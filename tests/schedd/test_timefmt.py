"""Time limits in Slurm's formats."""

from __future__ import annotations

import pytest

from mtgpu.schedd.timefmt import format_time_limit, parse_time_limit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # MM
        ("5:30", 5 * 60 + 30),  # MM:SS
        ("2:00:00", 2 * 3600),  # HH:MM:SS
        ("100:00:00", 100 * 3600),  # hours above a day are fine
        ("1-12", 86400 + 12 * 3600),  # D-HH
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),  # D-HH:MM
        ("2-00:00:10", 2 * 86400 + 10),  # D-HH:MM:SS
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1w", 7 * 86400),
        ("1.5h", 5400),
        (" 2H ", 7200),
    ],
)
def test_formats(text: str, seconds: float) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["0", "infinite", "UNLIMITED", "inf", "0m"])
def test_no_limit(text: str) -> None:
    assert parse_time_limit(text) is None


@pytest.mark.parametrize("text", ["", "abc", "2x", "1-", "-5", "1:2:3:4", "1-2-3", "h"])
def test_bad(text: str) -> None:
    with pytest.raises(ValueError, match="expected MM, MM:SS, HH:MM:SS"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "UNLIMITED"),
        (59, "00:00:59"),
        (3600, "01:00:00"),
        (86400 + 61, "1-00:01:01"),
    ],
)
def test_format(seconds: float | None, text: str) -> None:
    assert format_time_limit(seconds) == text


@pytest.mark.parametrize("text", ["45", "1:30", "3:00:00", "2-03", "2-03:04", "2-03:04:05"])
def test_round_trip(text: str) -> None:
    seconds = parse_time_limit(text)
    assert parse_time_limit(format_time_limit(seconds)) == seconds
