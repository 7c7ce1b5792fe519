"""The scheduler decides what can ever run only from a complete inventory: a member in
the member list that has not reported yet is unknown, never absent."""

from __future__ import annotations

import asyncio

import pytest

from mtgpu.errors import JobError
from mtgpu.gpuinfo.types import GpuInfo, HostUsage, NodeInventory
from mtgpu.jobspec import spec_to_dict
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler

G = 1 << 30
FOUR = "#!/bin/bash\n#MTGPU nodes=4 cpus=1 ram=10M\ntrue\n"


def inv(name: str, gpus: int = 1) -> NodeInventory:
    cards = tuple(
        GpuInfo(i, "nvidia", "rtx4090", "RTX 4090", f"{name}-{i}", 24 * G, 0, 0) for i in range(gpus)
    )
    return NodeInventory(
        name, cards, HostUsage(cpus=8, cpu_percent=0, ram_total=64 * G, ram_used=0, disk_total=0, disk_free=0)
    )


async def apply(method, *args, **kw):
    """The replicated call of a cluster of one: applied at once."""
    return method(*args, _doApply=True)


async def nothing(job, term):
    raise AssertionError("nothing is started here")


def scheduler(members, table=None, clock=None):
    s = Scheduler(table or JobTable(), apply, nothing, term=lambda: 1, **({"clock": clock} if clock else {}))
    listed = set(members)
    s.members = lambda: listed
    s.lost_after = 30.0
    s.grace = 5.0
    s.started_at = s.clock()
    s.running_now = lambda: True  # as while its loop runs
    return s, listed


def request(text=FOUR):
    return parse_job_file(text, default_workdir="/h").request


def steady_reason(names, text=FOUR) -> str:
    """What a scheduler that has every report says to ``text``."""
    s, _ = scheduler(names)
    for n in names:
        s.report(inv(n))
    with pytest.raises(JobError) as exc:
        s.check_submit(request(text))
    return str(exc.value)


def test_a_member_that_has_not_reported_is_waited_for_and_the_answer_is_the_steady_one():
    s, _ = scheduler(["a", "b", "c"])
    s.report(inv("a"))  # b and c are in the member list but have not reported yet
    assert s.unknown() == ["b", "c"]

    async def go() -> str:
        async def late_reports() -> None:
            await asyncio.sleep(0.2)
            s.report(inv("b"))
            await asyncio.sleep(0.1)
            s.report(inv("c"))

        task = asyncio.ensure_future(late_reports())
        await s.settle(request())
        await task
        with pytest.raises(JobError) as exc:
            s.check_submit(request())
        return str(exc.value)

    got = asyncio.run(go())
    assert got == steady_reason(["a", "b", "c"])
    assert "nodes=4 needs 4 members, and this cluster has 3 members" in got


def test_a_request_that_fits_what_has_reported_is_not_kept_waiting():
    s, _ = scheduler(["a", "b", "c"])
    s.report(inv("a"))
    s.grace = 30.0

    async def go() -> None:
        await asyncio.wait_for(s.settle(request("#!/bin/bash\n#MTGPU cpus=1\ntrue\n")), 1.0)

    asyncio.run(go())
    s.check_submit(request("#!/bin/bash\n#MTGPU cpus=1\ntrue\n"))


def test_accepted_on_an_incomplete_inventory_it_is_refused_once_complete_with_the_same_reason():
    table = JobTable()
    s, _ = scheduler(["a", "b", "c"], table)
    s.report(inv("a"))
    spec = parse_job_file(FOUR, default_workdir="/h")
    s.check_submit(spec.request)  # c and b could be anything: not refused on a guess

    async def go() -> dict:
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": spec.name, "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s.accepted(r["tasks"])
        await s.run_pass()
        job = table.get(r["job_id"])
        assert job["state"] == "PENDING"  # still incomplete: it waits, and says why
        assert s.pending_info[job["job_id"]].reason == "Inventory"
        assert "waiting for b, c to report" in s.pending_info[job["job_id"]].message
        s.report(inv("b"))
        s.report(inv("c"))
        await s.run_pass()
        return table.get(r["job_id"])

    job = asyncio.run(go())
    assert job["state"] == "FAILED"
    assert job["reason"] == steady_reason(["a", "b", "c"])
    assert job["job_id"] not in s.queue


def test_a_new_scheduler_refuses_impossible_jobs_its_predecessor_accepted():
    table = JobTable()
    spec = parse_job_file(FOUR, default_workdir="/h")
    fits = parse_job_file("#!/bin/bash\n#MTGPU nodes=3 cpus=1\ntrue\n", default_workdir="/h")
    started = []

    async def dispatch(job, term):
        started.append(job.job_id)

    async def go() -> tuple[dict, dict]:
        bad = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        good = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "y", "spec": spec_to_dict(fits), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s, _ = scheduler(["a", "b", "c"], table)
        s.dispatch = dispatch
        for n in "abc":
            s.report(inv(n))
        s.rebuild()  # what a scheduler taking over does: the queue from the job table
        await s.run_pass()
        return table.get(bad["job_id"]), table.get(good["job_id"])

    bad, good = asyncio.run(go())
    assert bad["state"] == "FAILED" and bad["reason"] == steady_reason(["a", "b", "c"])
    assert good["state"] == "RUNNING" and started == [good["job_id"]]


def test_a_removed_member_no_longer_counts_and_its_late_reports_are_ignored():
    s, listed = scheduler(["a", "b", "c", "d"])
    for n in "abcd":
        s.report(inv(n))
    s.check_submit(request())  # four members: nodes=4 fits
    listed.discard("d")
    with pytest.raises(JobError, match="this cluster has 3 members"):
        s.check_submit(request())
    s.report(inv("d"))  # a removed member that still reports adds nothing
    assert "d" not in s.nodes
    with pytest.raises(JobError, match="this cluster has 3 members"):
        s.check_submit(request())


def test_a_member_silent_since_the_scheduler_started_counts_as_lost_after_lost_after():
    now = [1000.0]
    s, _ = scheduler(["a", "b", "c", "d"], clock=lambda: now[0])
    s.started_at = now[0]
    for n in "abc":
        s.report(inv(n))
    s.check_submit(request())  # d might come: accepted, re-checked later
    assert s._recheck
    now[0] += 31.0  # d never reported: after lost_after it is lost, not unknown
    assert s.unknown() == []
    with pytest.raises(JobError, match="this cluster has 3 members"):
        s.check_submit(request())


def test_a_tenant_cannot_keep_an_impossible_job_by_submitting_while_members_report():
    # A hostile tenant floods submissions of an impossible job in the first second of a
    # cluster, hoping some stick in the queue for ever: each one is refused once the
    # inventory is complete, and a later identical submission is refused at once.
    table = JobTable()
    s, _ = scheduler(["a", "b", "c"], table)
    s.report(inv("a"))
    spec = parse_job_file(FOUR, default_workdir="/h")

    async def go() -> list[dict]:
        ids = []
        for _ in range(20):
            s.check_submit(spec.request)
            r = await apply(
                table.submit,
                {"user": "mal", "uid": 20002, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
                None,
                1.0,
                None,
            )
            s.accepted(r["tasks"])
            ids.append(r["job_id"])
        s.report(inv("b"))
        s.report(inv("c"))
        await s.run_pass()
        return [table.get(i) for i in ids]

    jobs = asyncio.run(go())
    assert {j["state"] for j in jobs} == {"FAILED"}
    assert {j["reason"] for j in jobs} == {steady_reason(["a", "b", "c"])}
    with pytest.raises(JobError, match="this cluster has 3 members"):
        s.check_submit(spec.request)


def test_a_new_scheduler_whose_member_list_is_not_current_refuses_nothing_on_it():
    # Just elected, this member has not applied every entry its predecessor committed:
    # its member list may lack a member that joined (here "c"), so "a, b" is no
    # complete inventory even though both reported.
    s, listed = scheduler(["a", "b"])
    current = [False]
    s.state_current = lambda: current[0]
    s.report(inv("a", gpus=2))
    s.report(inv("b", gpus=2))
    two_each = "#!/bin/bash\n#MTGPU nodes=3 gpus=nvidia:2\ntrue\n"
    s.check_submit(request(two_each))  # not refused on a list that may be short
    assert s.unknown() == ["(the member list)"]
    listed.add("c")
    current[0] = True
    s.report(inv("c", gpus=2))
    s.check_submit(request(two_each))  # c was there all along: it fits


def test_jobs_on_a_removed_member_end_as_a_lost_members_do():
    now = [1000.0]
    table = JobTable()
    s, listed = scheduler(["a", "b"], table, clock=lambda: now[0])
    s.started_at = now[0]
    started = []

    async def dispatch(job, term):
        started.append(job.job_id)

    s.dispatch = dispatch
    s.report(inv("a"))
    s.report(inv("b"))
    spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=1 server=b\nsleep 60\n", default_workdir="/h")

    async def go() -> dict:
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            now[0],
            None,
        )
        s.accepted(r["tasks"])
        await s.run_pass()
        assert table.get(r["job_id"])["state"] == "RUNNING"
        listed.discard("b")  # `cluster remove b`
        assert s.unknown() == [] and "b" not in s.nodes
        assert await s.check_lost() == []
        now[0] += 31.0
        s.report(inv("a"))  # a reports as usual
        assert await s.check_lost() == ["b"]
        return table.get(r["job_id"])

    job = asyncio.run(go())
    assert job["state"] == "NODE_FAIL" and job["reason"] == "its member b was removed from the cluster"


def test_a_member_whose_scheduler_is_not_running_refuses_nothing_on_what_reached_it():
    # A submission forwarded to a member as it becomes the scheduler, before its
    # scheduler started: it knows only its own report (an H100 here), and no time to
    # count silent members as lost from. It must wait, not refuse on that.
    s, _ = scheduler(["m1", "m2", "m3", "m4"])
    del s.running_now  # not started
    s.started_at = 0.0
    s.report(inv("m4"))
    assert s.unknown()
    s.check_submit(request())  # accepted for now, checked again once complete
    s.running_now = lambda: True
    s.started_at = s.clock()
    for n in ("m1", "m2", "m3"):
        s.report(inv(n))
    with pytest.raises(JobError):
        s.check_submit(request("#!/bin/bash\n#MTGPU nodes=5 cpus=1 ram=10M\ntrue\n"))


def test_a_request_pinned_to_members_that_reported_is_answered_at_once():
    # A workspace's reservation names its own host: what the others have does not
    # matter, so neither a not-running scheduler nor a silent member delays the answer.
    s, _ = scheduler(["m1", "m2"])
    del s.running_now
    s.report(inv("m1"))
    pinned = request("#!/bin/bash\n#MTGPU gpus=h100:1 server=m1 cpus=1 ram=10M\ntrue\n")
    asyncio.run(asyncio.wait_for(s.settle(pinned), 1.0))
    with pytest.raises(JobError, match="h100"):
        s.check_submit(pinned)
