"""Retention's decisions as a table (pure: facts and a time in, steps out), and the
helpers' doctests."""

from __future__ import annotations

import doctest

import pytest

from mtgpu import clock
from mtgpu.accounts import homescan, quota, retention
from mtgpu.accounts.retention import DAY, TenantFacts, last_activity, plan

NOW = 1000 * DAY


@pytest.mark.parametrize(
    "facts, action",
    [
        (TenantFacts("t", False, NOW - 29.9 * DAY), None),  # active
        (TenantFacts("t", False, NOW - 30 * DAY), "lock"),  # exactly due
        (TenantFacts("t", True, NOW - 400 * DAY), "exempt"),  # an admin
        (TenantFacts("t", True, NOW - 400 * DAY, locked=NOW - 50 * DAY), "exempt"),
        (TenantFacts("t", False, NOW - 400 * DAY, work=("12",)), "blocked"),  # a running job
        (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 50 * DAY, work=("ws",)), "blocked"),
        (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 6 * DAY), "wait"),
        (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 7 * DAY), "remove"),
        # Unlocked-and-active again would not be listed; locked but since active still goes on.
        (TenantFacts("t", False, NOW - 1 * DAY, locked=NOW - 8 * DAY), "remove"),
    ],
)
def test_plan(facts, action):
    steps = plan([facts], NOW, 30, 7 * DAY)
    assert [s.action for s in steps] == ([action] if action else [])
    if action == "wait":
        assert steps[0].due == NOW + DAY


def test_a_failed_removal_waits_for_its_back_off_unless_retried():
    failed = {"reason": "gpu01: /home/t/p is a mount point", "attempts": 2, "retry_at": NOW + 3600}
    t = TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 8 * DAY, failed=failed)
    [s] = plan([t], NOW, 30, 7 * DAY)
    assert s.action == "failed" and s.due == NOW + 3600 and "failed 2 time(s)" in s.reason
    assert "mount point" in s.reason
    assert [s.action for s in plan([t], NOW, 30, 7 * DAY, retry_failed=True)] == ["remove"]
    assert [s.action for s in plan([t], NOW + 3600, 30, 7 * DAY)] == ["remove"]
    assert [retention.retry_delay(n) for n in (1, 2, 3, 9, 40)] == [3600, 7200, 14400, 7 * DAY, 7 * DAY]


def test_a_retry_reuses_the_archive_written_since_the_lock(tmp_path):
    locked = 1_800_000_000.0
    stamp = retention._stamp
    for n in (
        f"ann-20001-{stamp(locked - DAY)}.tar.gz",  # an earlier lock's
        f"ann-20009-{stamp(locked + 60)}.tar.gz",  # another UID's
        f"ann-20001-{stamp(locked + 60)}.tar.gz.partial",
    ):
        (tmp_path / n).write_text("x")
    assert retention.earlier_archive(str(tmp_path), "ann", 20001, locked) is None
    mine = tmp_path / f"ann-20001-{stamp(locked + 3600)}.tar.gz"
    mine.write_text("x")
    assert retention.earlier_archive(str(tmp_path), "ann", 20001, locked) == str(mine)
    assert retention.earlier_archive(str(tmp_path / "none"), "ann", 20001, locked) is None


def test_jobs_count_as_activity_until_they_end():
    user = {"created": 0.0, "last_login": 10 * DAY, "last_active": None}
    jobs = [{"submit_time": 20 * DAY, "end_time": 45 * DAY}]
    assert last_activity(user, jobs) == 45 * DAY


def test_the_clock_moves_with_its_offset_file(tmp_path):
    f = tmp_path / "offset"
    c = clock.PolicyClock(str(f))
    assert c.offset() == 0.0  # no file yet: real time
    f.write_text(str(31 * DAY))
    assert c.offset() == 31 * DAY
    f.write_text("garbage")
    assert c.offset() == 0.0


@pytest.mark.parametrize("module", [retention, quota, homescan, clock])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0
