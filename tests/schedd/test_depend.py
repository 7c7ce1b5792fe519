"""Dependencies, holds and --begin: the gates a pending job passes (tables, no clock)."""

from __future__ import annotations

import pytest

from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
from mtgpu.schedd.depend import Gates, gate, parse_begin, parse_dependency
from mtgpu.state.codec import JobRecord, decode_job


def rec(
    jid: str,
    state: str = "PENDING",
    user: str = "ann",
    name: str = "j",
    t: float = 1.0,
    spec: dict | None = None,
    **kw: object,
) -> JobRecord:
    """A job's typed record, as the job table gives it."""
    asked = {**spec_to_dict(JobSpec(ResourceRequest(), "true")), **(spec or {})}
    return decode_job(
        {
            "job_id": jid,
            "state": state,
            "user": user,
            "uid": 2000,
            "name": name,
            "workdir": "/w",
            "spec": asked,
            "submit_time": t,
            "start_time": None,
            **kw,
        }
    )


class Table:
    """The job table's typed reads, over the records given."""

    def __init__(self, *records: JobRecord) -> None:
        self.jobs = {r.job_id: r for r in records}

    def record(self, jid: str) -> JobRecord | None:
        return self.jobs.get(jid)

    def task_records(self, jid: str) -> list[JobRecord]:
        if jid in self.jobs:
            return [self.jobs[jid]]
        return [r for r in self.jobs.values() if r.array_id == jid]

    def active_records(self) -> list[JobRecord]:
        return [r for r in self.jobs.values() if r.state in ("PENDING", "RUNNING")]


def check(dep: str, *others: JobRecord, job: JobRecord | None = None) -> tuple[str, str]:
    t = Table(*others)
    me = job or rec("99", t=9.0)
    state, reason, _ = gate(
        me, dep, t.task_records, [r for r in t.active_records() if r.name == me.name], 100.0
    )
    return state, reason


@pytest.mark.parametrize(
    ("dep", "others", "expected"),
    [
        ("afterok:1", [rec("1", "RUNNING")], ("wait", "Dependency")),
        ("afterok:1", [rec("1", "COMPLETED")], ("ok", "")),
        ("afterok:1", [rec("1", "FAILED")], ("never", "DependencyNeverSatisfied")),
        ("afternotok:1", [rec("1", "FAILED")], ("ok", "")),
        ("afternotok:1", [rec("1", "COMPLETED")], ("never", "DependencyNeverSatisfied")),
        ("afterany:1", [rec("1", "CANCELLED")], ("ok", "")),
        ("afterany:1", [rec("1", "RUNNING")], ("wait", "Dependency")),
        ("after:1", [rec("1", "RUNNING", start_time=5.0)], ("ok", "")),
        ("after:1", [rec("1")], ("wait", "Dependency")),
        ("afterok:1:2", [rec("1", "COMPLETED"), rec("2", "RUNNING")], ("wait", "Dependency")),
        ("afterok:1,afternotok:2", [rec("1", "COMPLETED"), rec("2", "FAILED")], ("ok", "")),
        (
            "afterok:1,afterok:2",
            [rec("1", "COMPLETED"), rec("2", "FAILED")],
            ("never", "DependencyNeverSatisfied"),
        ),
        ("afterok:1?afterok:2", [rec("1", "FAILED"), rec("2", "COMPLETED")], ("ok", "")),
        ("afterok:1?afterok:2", [rec("1", "FAILED"), rec("2", "RUNNING")], ("wait", "Dependency")),
        (
            "afterok:1?afterok:2",
            [rec("1", "FAILED"), rec("2", "TIMEOUT")],
            ("never", "DependencyNeverSatisfied"),
        ),
        # An array's id stands for every task.
        (
            "afterok:5",
            [rec("5_0", "COMPLETED", array_id="5"), rec("5_1", "RUNNING", array_id="5")],
            ("wait", "Dependency"),
        ),
        (
            "afterok:5",
            [rec("5_0", "COMPLETED", array_id="5"), rec("5_1", "COMPLETED", array_id="5")],
            ("ok", ""),
        ),
        # A purged record: only after/afterany are met.
        ("afterany:7", [], ("ok", "")),
        ("afterok:7", [], ("never", "DependencyNeverSatisfied")),
        ("singleton", [rec("3", "RUNNING", t=2.0)], ("wait", "Dependency")),
        ("singleton", [rec("3", "COMPLETED", t=2.0)], ("ok", "")),
        ("singleton", [rec("3", "RUNNING", t=2.0, name="other")], ("ok", "")),
        (
            "singleton",
            [rec("100", "PENDING", t=20.0)],
            ("ok", ""),
        ),  # a later one waits for this one, not the reverse
    ],
)
def test_dependency_table(dep: str, others: list[dict], expected: tuple[str, str]) -> None:
    assert check(dep, *others) == expected


@pytest.mark.parametrize(
    "text",
    [
        "afterok",
        "afterok:",
        "afterok:x",
        "aftr:1",
        "afterok:1,afterok:2?afterok:3",
        "singleton:3",
        "",
        "afterok:" + ":".join(["1"] * 1001),
    ],
)
def test_bad_dependencies_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_dependency(text)


def test_held_and_begin_gates_come_first() -> None:
    t = Table(rec("1", "COMPLETED"))
    assert gate(rec("2", held=True), "afterok:1", t.task_records, [], 100.0)[:2] == ("wait", "JobHeldUser")
    assert gate(rec("2", begin_time=200.0), None, t.task_records, [], 100.0)[:2] == ("wait", "BeginTime")
    assert gate(rec("2", begin_time=50.0), None, t.task_records, [], 100.0)[0] == "ok"


def test_gates_look_only_at_the_tenants_own_jobs_and_end_what_can_never_run() -> None:
    """Hostile: a record of another tenant's with the id named is not looked at."""
    t = Table(
        rec("1", "FAILED", user="bob"),
        rec("2", spec={"dependency": "afterok:1"}),
        rec("3", spec={"dependency": "afterok:4", "kill_on_invalid_dep": False}),
        rec("4", "FAILED"),
        rec("5", spec={"dependency": "afterok:4"}),
    )
    g = Gates()
    g.waiting.update(dict.fromkeys(["2", "3", "5"]))
    opened, never, still = g.review(t, lambda jid: False, 100.0)
    # Job 1 is bob's: for ann's job 2 there is no job 1, so afterok can never be met,
    # and bob's job's state is not what says so.
    assert [j for j, _ in never] == ["2", "5"] and "job 1 is gone" in dict(never)["2"]
    assert still == {"3": ("DependencyNeverSatisfied", "job 4 ended FAILED (afterok)")}
    assert opened == [] and list(g.waiting) == ["3"]


def test_begin_times() -> None:
    assert parse_begin("now+90", 0.0) == 90.0
    assert parse_begin("now+2minutes", 0.0) == 120.0
    assert parse_begin("now+1day", 0.0) == 86400.0
    assert parse_begin("2030-01-31T08:00", 0.0) > parse_begin("2030-01-31", 0.0)
    at = parse_begin("12:00", 1_000_000.0)
    assert 1_000_000.0 <= at < 1_000_000.0 + 86400
    with pytest.raises(ValueError, match="is not a start time"):
        parse_begin("tomorrow-ish", 0.0)
