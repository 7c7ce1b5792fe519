"""The pending reason the scheduler keeps for a job (what ``mt-job list`` and ``mt-job
show`` print): a job's own --exclude and --constraint are named as such, never as
resources reserved for a higher-priority job."""

from __future__ import annotations

import asyncio

from mtgpu.gpuinfo.types import GpuInfo, HostUsage, NodeInventory
from mtgpu.jobspec import spec_to_dict
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.queue import PendingInfo
from mtgpu.schedd.scheduler import Scheduler

G = 1 << 30


def inv(name: str, ram_used: int = 0, features: tuple[str, ...] = ()) -> NodeInventory:
    cards = (GpuInfo(0, "nvidia", "rtx4090", "RTX 4090", f"{name}-0", 24 * G, 0, 0),)
    host = HostUsage(cpus=8, cpu_percent=0, ram_total=64 * G, ram_used=ram_used, disk_total=0, disk_free=0)
    return NodeInventory(name, cards, host, features=features)


async def apply(method, *args, **kw):
    """The replicated call of a cluster of one: applied at once."""
    return method(*args, _doApply=True)


async def nothing(job, term):
    raise AssertionError("nothing is started here")


def pending_reason(script: str, *members: NodeInventory) -> PendingInfo:
    """The reason the scheduler gives for ``script``, submitted alone to ``members``."""
    table = JobTable()
    s = Scheduler(table, apply, nothing, term=lambda: 1)
    listed = {m.name for m in members}
    s.members = lambda: listed
    s.started_at = s.clock()
    s.running_now = lambda: True
    for m in members:
        s.report(m)
    spec = parse_job_file(script, default_workdir="/h")
    s.check_submit(spec.request)

    async def go() -> PendingInfo:
        r = await apply(
            table.submit,
            {"user": "ann", "uid": 20001, "name": spec.name, "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        s.accepted(r["tasks"])
        await s.run_pass()
        assert table.get(r["job_id"])["state"] == "PENDING"
        return s.pending_info[r["job_id"]]

    return asyncio.run(go())


def test_a_job_with_a_constraint_and_nothing_else_queued_is_not_told_of_reservations() -> None:
    # Only a has the feature, and its RAM is in use: b and c lack the feature.
    info = pending_reason(
        "#!/bin/bash\n#SBATCH --constraint=fast\n#MTGPU cpus=1 ram=8G\ntrue\n",
        inv("a", ram_used=60 * G, features=("fast",)),
        inv("b"),
        inv("c"),
    )
    assert info.reason == "Resources" and info.per_filter_counts == {"constraint": 2, "ram": 1}
    assert "(of 3 members: 2 lack the features asked by --constraint, 1 lack free RAM)" in info.message
    assert "reserved" not in info.message


def test_a_job_with_an_exclude_and_nothing_else_queued_is_not_told_of_reservations() -> None:
    info = pending_reason(
        "#!/bin/bash\n#SBATCH --exclude=b,c\n#MTGPU cpus=1 ram=8G\ntrue\n",
        inv("a", ram_used=60 * G),
        inv("b"),
        inv("c"),
    )
    assert info.reason == "Resources" and info.per_filter_counts == {"excluded": 2, "ram": 1}
    assert "(of 3 members: 2 are excluded by --exclude, 1 lack free RAM)" in info.message
    assert "reserved" not in info.message
