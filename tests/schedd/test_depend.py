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


def test_singleton_reads_as_the_one_job_at_a_time_scan_did() -> None:
    """The per-name index gives the same answer (and the same job named) as looking
    at every active job of the tenant, however submission times and table order differ."""
    import random

    rnd = random.Random(57)
    records = []
    for n in range(300):
        state = rnd.choice(["PENDING", "PENDING", "RUNNING", "COMPLETED"])
        spec = {"dependency": rnd.choice(["singleton", "singleton?afterok:1", "afterany:2,singleton"])}
        records.append(
            rec(
                str(n + 1),
                state,
                user=rnd.choice(["ann", "bob"]),
                name=rnd.choice(["a", "b", "c"]),
                t=float(rnd.randrange(20)),
                spec=spec,
            )
        )
    t = Table(*records)
    g = Gates()
    g.waiting.update(dict.fromkeys(r.job_id for r in records if r.state == "PENDING"))
    opened, never, still = g.review(t, lambda jid: False, 100.0)
    assert not never and set(g.waiting) == set(still)
    for r in records:
        if r.state != "PENDING":
            continue
        mine = [o for o in t.active_records() if o.user == r.user and o.name == r.name]
        owned = lambda i, u=r.user: [o for o in t.task_records(i) if o.user == u]  # noqa: E731
        state, reason, why = gate(r, r.spec.dependency, owned, mine, 100.0)
        if state == "ok":
            assert r in opened
        else:
            assert still[r.job_id] == (reason, why)


# -------------------------------------------------- the real table and scheduler


def _submit(table, dependency: str | None = None, tasks: list[int] | None = None, **spec: object) -> str:
    asked = {**spec_to_dict(JobSpec(ResourceRequest(), "true")), "dependency": dependency, **spec}
    record = {"user": "ann", "uid": 2000, "name": "j", "workdir": "/w", "spec": asked}
    return table.submit(record, tasks, 1.0, _doApply=True)["job_id"]


def _scheduler(table):
    from mtgpu.schedd.scheduler import Scheduler

    async def apply(method, *args, **kw):
        return method(*args, _doApply=True)

    async def dispatch(job, term):
        raise AssertionError("no member: nothing starts")

    s = Scheduler(table, apply, dispatch, term=lambda: 1, clock=lambda: 100.0)
    s._recheck = False  # no member reports here: nothing is refused as one no member could run
    return s


def test_a_pass_over_thousands_of_gated_tasks_reads_each_record_a_few_times(monkeypatch) -> None:
    """`array=0-1999` with singleton, and another array after it: submitting them and
    one pass read each record a few times, not once per waiting task (counted, not timed)."""
    import asyncio

    from mtgpu.schedd.jobtable import JobTable

    n = 2000
    table = JobTable()
    first = _submit(table, "singleton", list(range(n)))
    second = _submit(table, f"afterok:{first}", list(range(n)))
    reads = [0]
    typed = JobTable.typed

    def counted(self, j):
        reads[0] += 1
        return typed(self, j)

    monkeypatch.setattr(JobTable, "typed", counted)
    s = _scheduler(table)
    s.accepted([f"{first}_{i}" for i in range(n)] + [f"{second}_{i}" for i in range(n)])
    asyncio.run(s.run_pass())
    assert reads[0] < 10 * 2 * n, reads[0]
    # What they wait for is as before: the first task runs first, the rest one at a time.
    assert f"{first}_0" in s.queue and len(s.queue) == 1
    assert s.pending_info[f"{first}_7"].message == f"job {first}_0 of the same name"
    assert s.pending_info[f"{second}_0"].message == f"job {first}_0 has not ended"


def test_a_chain_behind_a_cancelled_head_ends_in_one_pass() -> None:
    """1,000 jobs, each afterok the one before, behind a head that is cancelled: one
    pass ends them all, each with the reason it would have had ended on its own."""
    import asyncio

    from mtgpu.schedd.jobtable import JobTable

    table = JobTable()
    head = _submit(table)
    chain = [head]
    for _ in range(1000):
        chain.append(_submit(table, f"afterok:{chain[-1]}"))
    # Beside the chain: one met by a job that ends here (queued by the next pass, once
    # that job has ended), and one kept pending by --kill-on-invalid-dep=no (its own
    # dependents wait on it, as it may still be cancelled).
    opens = _submit(table, f"afternotok:{chain[500]}")
    kept = _submit(table, f"afterok:{chain[3]}", kill_on_invalid_dep=False)
    behind_kept = _submit(table, f"afterok:{kept}")
    s = _scheduler(table)
    s.rebuild()
    table.cancel([head], "ann", 50.0, _doApply=True)
    asyncio.run(s.run_pass())
    for before, jid in zip(chain, chain[1:]):
        j = table.get(jid)
        assert j["state"] == "CANCELLED", jid
        assert j["reason"] == f"DependencyNeverSatisfied: job {before} ended CANCELLED (afterok)"
    assert table.get(kept)["state"] == "PENDING"
    assert (s.pending_info[kept].reason, s.pending_info[kept].message) == (
        "DependencyNeverSatisfied",
        f"job {chain[3]} ended CANCELLED (afterok)",
    )
    assert table.get(behind_kept)["state"] == "PENDING"
    assert s.pending_info[behind_kept].reason == "Dependency"
    assert table.get(opens)["state"] == "PENDING" and opens not in s.queue
    asyncio.run(s.run_pass())
    assert opens in s.queue and table.get(behind_kept)["state"] == "PENDING"
