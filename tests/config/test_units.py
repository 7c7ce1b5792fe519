"""The one number parser: ASCII digits only, no NaN or infinity, bounded magnitudes,
and a ValueError (never an OverflowError) for everything else."""

from __future__ import annotations

import pytest

from mtgpu.config.units import MAX_DURATION, MAX_SIZE, finite_number, parse_count, parse_duration, parse_size
from mtgpu.schedd.timefmt import parse_time_limit


@pytest.mark.parametrize(
    "value",
    [
        "３G",
        "٣G",
        "²G",
        "9" * 400 + "G",
        "nanG",
        "infG",
        float("nan"),
        float("inf"),
        10**400,
        "1" + "0" * 30,
        True,
        -1,
        "x" * 10_000,
    ],
)
def test_sizes_refuse_what_is_not_a_plain_bounded_number(value):
    with pytest.raises(ValueError) as exc:
        parse_size(value)
    assert len(str(exc.value)) < 200


@pytest.mark.parametrize(
    "value", ["٣", "３", "9" * 400, "nan", "inf", "-1", "1.5", float("nan"), 10**40, "x" * 10_000]
)
def test_counts_refuse_other_digits_and_absurd_magnitudes(value):
    with pytest.raises(ValueError) as exc:
        parse_count(value)
    assert len(str(exc.value)) < 200


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), "9" * 400 + "s", "٣m", 10**400, "101y", str(MAX_DURATION * 2)]
)
def test_durations_refuse_nan_infinity_and_centuries(value):
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    "value", ["9" * 400 + "s", "9" * 400, "٣٠", "99999999999", "1-" + "9" * 30, "9999999999w"]
)
def test_time_limits_are_bounded_before_any_arithmetic(value):
    with pytest.raises(ValueError) as exc:
        parse_time_limit(value)
    assert "OverflowError" not in str(exc.value) and len(str(exc.value)) < 300


def test_the_largest_values_still_parse():
    assert parse_size("1024P") == MAX_SIZE
    assert parse_count("8", minimum=1) == 8
    assert parse_duration("36600d") == MAX_DURATION
    assert parse_time_limit("36000d") == 36000 * 86400.0
    assert finite_number(1.5) == 1.5
