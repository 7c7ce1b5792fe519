"""What keeps one scheduler cheap on a large cluster: snapshots made from what changed,
starts on many members side by side, and no spinning leader."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import ClassVar

from mtgpu.gpuinfo.types import GpuInfo, HostUsage, NodeInventory
from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
from mtgpu.schedd import scheduler as sched_mod
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import NodeState
from mtgpu.state.codec import decode_job
from mtgpu.state.store import StateStore

G = 1 << 30


def inv(name: str, used: int = 0, vram: int = 24) -> NodeInventory:
    gpus = tuple(
        GpuInfo(i, "nvidia", "rtx4090", "RTX 4090", f"{name}-{i}", vram * G, used * G, 0) for i in range(2)
    )
    return NodeInventory(
        name, gpus, HostUsage(cpus=8, cpu_percent=0, ram_total=64 * G, ram_used=0, disk_total=0, disk_free=0)
    )


async def apply(method, *args, **kw):
    """The replicated call of a cluster of one: applied at once."""
    return method(*args, _doApply=True)


def test_each_snapshot_shows_the_latest_report_state_and_running_work() -> None:
    table, drains = JobTable(), Drains()
    started: list[str] = []

    async def dispatch(job, term):
        started.append(job.job_id)

    s = Scheduler(table, apply, dispatch, term=lambda: 1)
    s.drains = drains
    for n in ("a", "b", "c"):
        s.report(inv(n))

    async def go() -> None:
        first = s.snapshot()
        assert [n.name for n in first.nodes] == ["a", "b", "c"]
        # Nothing changed: the members' snapshots are the same objects.
        again = s.snapshot()
        assert all(x is y for x, y in zip(first.nodes, again.nodes))
        # A report with the same figures keeps the member's snapshot; another does not.
        s.report(inv("b"))
        assert s.snapshot().nodes[1] is first.nodes[1]
        # RAM use changed, the GPU records are the same objects (what a ReportReader
        # gives for unchanged cards): a new snapshot that keeps the GPUs' snapshots.
        b = s.nodes["b"]
        s.report(dataclasses.replace(b, host=dataclasses.replace(b.host, ram_used=5 * G)))
        nb = s.snapshot().nodes[1]
        assert nb is not first.nodes[1] and nb.ram_used == 5 * G and nb.gpus is first.nodes[1].gpus
        # The latest report counts.
        s.report(inv("b", used=20))
        assert [g.vram_used for g in s.snapshot().nodes[1].gpus] == [20 * G, 20 * G]
        s.report(inv("b", used=3))
        assert [g.vram_used for g in s.snapshot().nodes[1].gpus] == [3 * G, 3 * G]
        # A drain, then a member lost, then back.
        await apply(drains.drain, "c", "fan", "root", 1.0)
        assert s.snapshot().nodes[2].state is NodeState.DRAIN
        await apply(drains.undrain, "c")
        s.node_state["c"] = NodeState.DOWN
        assert s.snapshot().nodes[2].state is NodeState.DOWN
        s.report(inv("c"))
        assert s.snapshot().nodes[2].state is NodeState.UP
        # A member reporting for the first time joins the snapshot in name order.
        s.report(inv("aa"))
        assert [n.name for n in s.snapshot().nodes] == ["a", "aa", "b", "c"]
        # Running work is committed, and released when it ends.
        spec = parse_job_file("#!/bin/bash\n#MTGPU gpus=2 server=a\ntrue\n", default_workdir="/h")
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": spec.name, "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s.accepted(r["tasks"])
        assert await s.run_pass() == 1 and started == [r["job_id"]]
        held = s.snapshot().nodes[0]
        assert [g.exclusive_job for g in held.gpus] == [r["job_id"]] * 2
        await apply(table.finish, r["job_id"], "COMPLETED", 0, "", 2.0)
        assert [g.exclusive_job for g in s.snapshot().nodes[0].gpus] == [None, None]

    asyncio.run(go())


def test_starts_on_many_members_run_side_by_side_but_few_on_one(monkeypatch) -> None:
    monkeypatch.setattr(sched_mod, "DISPATCH_CONCURRENCY", 2)
    s = Scheduler(JobTable(), apply, None, term=lambda: 1)
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    release = asyncio.Event

    async def go() -> None:
        gate = release()

        async def dispatch(job, term):
            node = job.nodes[0]
            now[node] = now.get(node, 0) + 1
            most[node] = max(most.get(node, 0), now[node])
            most["all"] = max(most.get("all", 0), sum(now.values()))
            await gate.wait()
            now[node] -= 1

        s.dispatch = dispatch
        jobs = [
            decode_job(
                {
                    "job_id": f"j{k}",
                    "state": "RUNNING",
                    "user": "ann",
                    "uid": 2000,
                    "name": "j",
                    "workdir": "/w",
                    "submit_time": 1.0,
                    "spec": spec_to_dict(JobSpec(ResourceRequest(), "true")),
                    "placement": {
                        "job_id": f"j{k}",
                        "gpu_mode": "exclusive",
                        "members": [
                            {"node": f"n{k % 10}", "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 0}
                        ],
                    },
                }
            )
            for k in range(50)
        ]
        tasks = [asyncio.ensure_future(s._start(j, 1)) for j in jobs]
        for _ in range(20):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(go())
    assert most["all"] == 20  # ten members, two each
    assert max(v for k, v in most.items() if k != "all") == 2


def test_a_leader_with_peers_does_not_wake_its_tick_for_uncommitted_entries() -> None:
    class Notifier:
        woken = 0

        def notify(self) -> None:
            self.woken += 1

    class Sync:
        otherNodes: ClassVar[set[str]] = set()
        _SyncObj__raftCommitIndex = 1
        _SyncObj__pipeNotifier = Notifier()

        def _SyncObj__getCurrentLogIndex(self) -> int:
            return 5

    store = StateStore.__new__(StateStore)
    store.sync = Sync()
    store._commit_alone()
    assert store.sync._SyncObj__pipeNotifier.woken == 1  # alone: it commits at once
    store.sync.otherNodes = {"m2", "m3"}  # others joined: their acknowledgements commit
    store._commit_alone()
    assert store.sync._SyncObj__pipeNotifier.woken == 1


def test_a_pass_stopped_at_its_bound_asks_for_the_next_one() -> None:
    from mtgpu.schedd.queue import QueuePolicy

    table = JobTable()
    started: list[str] = []

    async def dispatch(job, term):
        started.append(job.job_id)

    s = Scheduler(table, apply, dispatch, term=lambda: 1, policy=QueuePolicy(max_placements=2))
    s.report(inv("a"))

    async def go() -> None:
        spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=1 ram=1G array=0-4\ntrue\n", default_workdir="/h")
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": spec.name, "spec": spec_to_dict(spec), "workdir": "/h"},
            [0, 1, 2, 3, 4],
            1.0,
            None,
        )
        s.accepted(r["tasks"])
        s._kick.clear()
        assert await s.run_pass() == 2 and s._kick.is_set()
        s._kick.clear()
        assert await s.run_pass() == 2 and s._kick.is_set()
        s._kick.clear()
        assert await s.run_pass() == 1 and not s._kick.is_set()
        assert len(started) == 5

    asyncio.run(go())
