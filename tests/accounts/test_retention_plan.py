"""Retention's decisions as a table (pure: facts and a time in, steps out), and the
helpers' doctests."""

from __future__ import annotations

import doctest

import pytest

from mtgpu import clock
from mtgpu.accounts import homescan, quota, retention
from mtgpu.accounts.retention import DAY, TenantFacts, last_activity, plan

NOW = 1000 * DAY


@pytest.mark.parametrize("facts, action", [
    (TenantFacts("t", False, NOW - 29.9 * DAY), None),                      # active
    (TenantFacts("t", False, NOW - 30 * DAY), "lock"),                      # exactly due
    (TenantFacts("t", True, NOW - 400 * DAY), "exempt"),                    # an admin
    (TenantFacts("t", True, NOW - 400 * DAY, locked=NOW - 50 * DAY), "exempt"),
    (TenantFacts("t", False, NOW - 400 * DAY, work=("12",)), "blocked"),     # a running job
    (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 50 * DAY, work=("ws",)), "blocked"),
    (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 6 * DAY), "wait"),
    (TenantFacts("t", False, NOW - 400 * DAY, locked=NOW - 7 * DAY), "remove"),
    # Unlocked-and-active again would not be listed; locked but since active still goes on.
    (TenantFacts("t", False, NOW - 1 * DAY, locked=NOW - 8 * DAY), "remove"),
])
def test_plan(facts, action):
    steps = plan([facts], NOW, 30, 7 * DAY)
    assert [s.action for s in steps] == ([action] if action else [])
    if action == "wait":
        assert steps[0].due == NOW + DAY


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
