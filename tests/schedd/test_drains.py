"""Drained members: the replicated marks, and a scheduler that places nothing there."""

from __future__ import annotations

import asyncio

from mtgpu.gpuinfo.report import format_nodes_table
from mtgpu.gpuinfo.types import HostUsage, NodeInventory
from mtgpu.jobspec import spec_to_dict
from mtgpu.jobstate import PENDING, RUNNING
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import NodeState

G = 1 << 30


def inv(name: str) -> NodeInventory:
    return NodeInventory(
        name, (), HostUsage(cpus=4, cpu_percent=0, ram_total=8 * G, ram_used=0, disk_total=0, disk_free=0)
    )


async def apply(method, *args, **kw):
    """The replicated call of a cluster of one: applied at once."""
    return method(*args, _doApply=True)


def test_drain_keeps_the_first_time_and_undrain_returns_the_mark() -> None:
    d = Drains()
    first = d.drain("gpu01", "fan  replacement", "root", 10.0, _doApply=True)
    assert first == {"node": "gpu01", "reason": "fan  replacement", "by": "root", "since": 10.0}
    again = d.drain("gpu01", "x" * 500, "ann", 20.0, _doApply=True)
    assert again["since"] == 10.0 and len(again["reason"]) == 200 and again["by"] == "ann"
    assert d.is_drained("gpu01") and not d.is_drained("gpu02")
    assert d.undrain("gpu01", _doApply=True)["by"] == "ann"
    assert d.undrain("gpu01", _doApply=True) is None and d.all() == []


def test_scheduler_places_nothing_on_a_drained_member_until_undrained() -> None:
    table, drains = JobTable(), Drains()
    started: list[tuple[str, str]] = []

    async def dispatch(job, term):
        started.append((job.job_id, job.nodes[0]))

    s = Scheduler(table, apply, dispatch, term=lambda: 1)
    s.drains = drains
    for n in ("a", "b"):
        s.report(inv(n))

    async def submit(text: str) -> str:
        spec = parse_job_file(text, default_workdir="/h")
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": spec.name, "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s.accepted(r["tasks"])
        return r["job_id"]

    async def go() -> None:
        await apply(drains.drain, "b", "maintenance", "root", 1.0)
        assert s.state_of("b") is NodeState.DRAIN and s.state_of("a") is NodeState.UP
        pinned = await submit("#!/bin/bash\n#MTGPU server=b cpus=1 ram=1G\ntrue\n")
        free = [await submit("#!/bin/bash\n#MTGPU cpus=1 ram=1G\ntrue\n") for _ in range(3)]
        await s.run_pass()
        # Unpinned work went to a; the job pinned to b waits, and says why.
        assert sorted(started) == sorted((j, "a") for j in free)
        assert table.get(pinned)["state"] == PENDING
        info = s.pending_info[pinned]
        assert info.reason == "ReqNodeNotAvail" and "b" in info.message
        # A drained member still shows its running work; a drain of a lost member
        # still shows it down.
        s.node_state["b"] = NodeState.DOWN
        assert s.state_of("b") is NodeState.DOWN
        del s.node_state["b"]
        await apply(drains.undrain, "b")
        await s.run_pass()
        assert (pinned, "b") in started and table.get(pinned)["state"] == RUNNING

    asyncio.run(go())


def test_nodes_table_says_which_member_is_drained_and_why() -> None:
    up = inv("a").to_dict(state="up")
    drained = {**inv("b").to_dict(state="drain"), "drain_reason": "new PSU"}
    text = format_nodes_table([{**up, "drain_reason": None}, drained])
    lines = text.splitlines()
    assert lines[2].split()[:2] == ["b", "drain"]
    assert lines[-1] == "b is drained: new PSU"
