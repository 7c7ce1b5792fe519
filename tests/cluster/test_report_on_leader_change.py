"""A new scheduler has the members' inventory at once, not one report interval later.

Members report every ``USAGE_SAMPLE_INTERVAL``; a member that sees the scheduler
change reports to the new one at once (within a short jitter), the new scheduler asks
the members still silent soon after it took over, and a member new to a scheduler
with jobs waiting starts a pass. The real report loop and ``node.report`` handler,
over a direct call in place of the SSH peer link; the interval is 60 s, so a report
inside the bound below is the leader change's, not the interval's."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from mtgpu.api import cluster as cluster_api
from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.cluster.runtime import ClusterRuntime
from mtgpu.config import Options
from mtgpu.gpuinfo.types import HostUsage, NodeInventory
from mtgpu.jobspec import spec_to_dict
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler

KEY = "s3cret-cluster-key-0123456789"
G = 1 << 30
INTERVAL = 60.0
#: Far under INTERVAL: a report this soon did not wait for the next tick.
BOUND = 10.0


def inv(name: str) -> NodeInventory:
    return NodeInventory(
        name, (), HostUsage(cpus=8, cpu_percent=0, ram_total=64 * G, ram_used=0, disk_total=0, disk_free=0)
    )


def runtime(tmp_path: Any, name: str) -> ClusterRuntime:
    o = Options(
        cluster_mode="cluster",
        cluster_id="lab",
        cluster_key=KEY,
        state_dir=str(tmp_path / name),
        server_name=name,
        ssh_listen=("127.0.0.1", 2222),
        usage_sample_interval=INTERVAL,
        cluster_lost_after=3 * INTERVAL,
    )
    (tmp_path / name).mkdir()
    return ClusterRuntime(o, ClusterIdentity.derive("lab", KEY), lambda: inv(name))


def link(member: ClusterRuntime, schedulers: dict[str, Dispatcher]) -> None:
    """``member``'s peer calls go straight to the named scheduler's dispatcher."""

    async def call(target: str, op: str, /, **kw: Any) -> Any:
        kw.pop("timeout", None)
        handler = schedulers[target].op(op)
        assert handler is not None, op
        r = handler.fn(Caller(f"mtgpu-peer.{member.name}", 0, False, "peer"), kw)
        return await r if inspect.isawaitable(r) else r

    member.peers.call = call  # type: ignore[method-assign]


def test_a_member_reports_to_a_new_scheduler_at_once_not_at_its_next_interval(tmp_path):
    got: dict[str, asyncio.Queue[str]] = {}
    schedulers: dict[str, Dispatcher] = {}
    rts = []
    for name in ("m1", "m2"):
        rt = runtime(tmp_path, name)
        d = Dispatcher()
        cluster_api.register(d, rt)
        rt.is_leader = lambda: True  # type: ignore[method-assign]
        q: asyncio.Queue[str] = asyncio.Queue()
        rt.on_report = lambda i, q=q: q.put_nowait(i.name)
        got[name], schedulers[name] = q, d
        rts.append(rt)
    member = runtime(tmp_path, "m3")
    link(member, schedulers)
    leader: list[str | None] = [None]
    member.leader = lambda: leader[0]  # type: ignore[method-assign]

    async def go() -> None:
        loop = asyncio.create_task(member._report_loop())
        try:
            await asyncio.sleep(0.3)  # no scheduler yet: nothing sent
            assert got["m1"].empty()
            leader[0] = "m1"  # a scheduler appears: the member reports to it at once
            assert await asyncio.wait_for(got["m1"].get(), BOUND) == "m3"
            leader[0] = "m2"  # m1 dies; m2 takes over, long before the next interval
            assert await asyncio.wait_for(got["m2"].get(), BOUND) == "m3"
            assert got["m1"].empty()
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(go())
    for rt in [*rts, member]:
        rt.peers.close()


def test_a_new_scheduler_asks_the_members_still_silent_soon_after_it_took_over(tmp_path):
    rt = runtime(tmp_path, "m1")
    rt.addresses.update({"m2": "10.0.0.2:2222", "m3": "10.0.0.3:2222"})
    rt.is_leader = lambda: True  # type: ignore[method-assign]
    leader: list[str | None] = ["m2"]
    rt.leader = lambda: leader[0]  # type: ignore[method-assign]
    rt.unreported = lambda: ["m2", "m3"]
    seen: asyncio.Queue[str] = asyncio.Queue()
    rt.on_report = lambda i: seen.put_nowait(i.name)
    asked: list[str] = []
    reported = asyncio.Event()

    async def call(target: str, op: str, /, **kw: Any) -> Any:
        asked.append(f"{op} {target}")
        if op == "node.report":
            reported.set()
        return inv(target).to_dict(processes=False) if op == "node.inventory" else {"ok": True}

    rt.peers.call = call  # type: ignore[method-assign]

    async def go() -> None:
        loop = asyncio.create_task(rt._report_loop())
        try:
            await asyncio.wait_for(reported.wait(), BOUND)  # m1 reports to the scheduler m2
            assert asked == ["node.report m2"] and seen.empty()
            asked.clear()
            leader[0] = "m1"  # m1 becomes the scheduler: it asks the silent, soon
            names = {await asyncio.wait_for(seen.get(), BOUND) for _ in range(3)}
            assert names == {"m1", "m2", "m3"}
            assert sorted(asked) == ["node.inventory m2", "node.inventory m3"]
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    asyncio.run(go())
    rt.peers.close()


def test_a_member_new_to_a_scheduler_with_jobs_waiting_starts_a_pass():
    async def apply(method: Any, *args: Any, **kw: Any) -> Any:
        return method(*args, _doApply=True)

    async def dispatch(job: Any, term: int) -> None:
        pass

    async def go() -> None:
        table = JobTable()
        s = Scheduler(table, apply, dispatch, term=lambda: 1)
        s.members = lambda: {"m1", "m2"}
        s.own_name = "m1"
        s.running_now = lambda: True  # type: ignore[method-assign]
        s.report(inv("m1"))
        spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=2\nsleep 60\n", default_workdir="/h")
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s.accepted([r["job_id"]])
        s._kick.clear()
        s.report(inv("m1"))  # a member it knows: no pass for that
        assert not s._kick.is_set()
        s.report(inv("m2"))  # new to this scheduler (just after a takeover): a pass now
        assert s._kick.is_set()

    asyncio.run(go())


def test_a_scheduler_that_starts_runs_its_first_pass_at_once():
    async def apply(method: Any, *args: Any, **kw: Any) -> Any:
        return method(*args, _doApply=True)

    async def dispatch(job: Any, term: int) -> None:
        pass

    async def go() -> None:
        s = Scheduler(JobTable(), apply, dispatch, term=lambda: 1)
        s.start()
        try:
            assert s._kick.is_set()  # not the loop's next 1 s tick
        finally:
            await s.stop()

    asyncio.run(go())
