"""Leases on the scheduler's side: a member's jobs are declared lost only once its lease
and fencing grace are surely over, every listed member is watched, a requeued job
waits for its old run, and a late report about a fenced attempt changes nothing.

And what a new scheduler takes over: a hand-off or an election stops the deposed
scheduler's starts in flight, so a new one starts again what the old one placed but
may never have asked for (else the job stays RUNNING on its member with nothing
running: a ghost job), and a member asked twice starts it once."""

from __future__ import annotations

import asyncio
import types

import pytest

from mtgpu.config.options import load_text
from mtgpu.errors import ConfigError
from mtgpu.gpuinfo.types import HostUsage, NodeInventory
from mtgpu.jobspec import spec_to_dict
from mtgpu.schedd.agent import Agent
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable, attempt_of
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import NodeState

G = 1 << 30


def inv(name: str) -> NodeInventory:
    return NodeInventory(
        name, (), HostUsage(cpus=8, cpu_percent=0, ram_total=64 * G, ram_used=0, disk_total=0, disk_free=0)
    )


async def apply(method, *args, **kw):
    return method(*args, _doApply=True)


def scheduler(members, now, table=None):
    started = []

    async def dispatch(job, term):
        started.append(job.job_id)

    s = Scheduler(table or JobTable(), apply, dispatch, term=lambda: 1, clock=lambda: now[0])
    s.members = lambda: set(members)
    s.own_name = members[0]
    s.lost_after = 10.0
    s.lease = 6.0
    s.takeover_wait = 5.0
    s.started_at = s.lease_started = now[0]
    s.running_now = lambda: True  # as while its loop runs
    return s, started


async def submit(table, now, text):
    spec = parse_job_file("#!/bin/bash\n" + text + "\nsleep 60\n", default_workdir="/h")
    r = await apply(
        table.submit,
        {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
        None,
        now[0],
        None,
    )
    return r["job_id"]


def placed_unstarted(table, jid, node, now, term=1):
    """``jid`` placed on ``node`` with ``term``; its start not recorded (yet)."""
    table.place(
        jid,
        {
            "job_id": jid,
            "gpu_mode": "exclusive",
            "members": [{"node": node, "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 1, "vram_per_gpu": 0}],
        },
        term,
        now[0],
        _doApply=True,
    )


def placed_on(table, jid, node, now, term=1):
    """``jid`` placed on ``node`` and started there."""
    placed_unstarted(table, jid, node, now, term)
    table.started(jid, node, now[0], attempt_of(table.get(jid)), _doApply=True)


def three_members_reporting():
    """A scheduler of a, b and c, past its take-over wait, b and c granted leases."""
    now = [1000.0]
    table = JobTable()
    s, _ = scheduler(["a", "b", "c"], now, table)
    granted_after_takeover(s, now, ("b", "c"))
    return now, table, s


def granted_after_takeover(s, now, names) -> None:
    """Past the take-over wait, ``names`` report and are granted their leases."""
    now[0] += 5.0
    for n in names:
        s.report(inv(n))
        s.grant(n)


def test_a_member_is_lost_only_once_its_lease_is_surely_over_counted_from_the_last_grant():
    now = [1000.0]
    s, _ = scheduler(["a", "b"], now)

    async def go():
        now[0] += 5.0  # past the take-over wait
        s.report(inv("b"))
        assert s.grant("b") == 6.0
        granted = now[0]
        now[0] = granted + 9.9  # lease (6) + fencing grace (2) + margin (2) not yet over
        assert await s.check_lost() == []
        now[0] = granted + 10.1
        assert await s.check_lost() == ["b"]

    asyncio.run(go())


def test_a_new_scheduler_watches_members_that_never_reported_to_it_and_waits_out_the_old_one():
    now = [1000.0]
    table = JobTable()
    s, _ = scheduler(["a", "b", "c"], now, table)

    async def go():
        # c ran a job under the previous scheduler and never reports to this one.
        jid = await submit(table, now, "#MTGPU cpus=1 ram=10M server=c")
        placed_on(table, jid, "c", now)
        s.report(inv("b"))
        now[0] += 10.5  # lost_after since the start, but a deposed scheduler may have
        s.report(inv("b"))  # granted leases for takeover_wait after it
        assert await s.check_lost() == []
        assert s.silent_members() == ["c"]  # listed, never left out
        now[0] += 5.0
        s.report(inv("b"))
        assert await s.check_lost() == ["c"]
        return table.get(jid)

    job = asyncio.run(go())
    assert job["state"] == "NODE_FAIL" and "its member c was lost" in job["reason"]


def test_a_requeued_job_starts_again_only_once_its_old_run_has_ended():
    now = [1000.0]
    table = JobTable()
    s, _ = scheduler(["a", "b"], now, table)

    async def go():
        s.report(inv("a"))
        s.report(inv("b"))
        s.grant("b")
        jid = await submit(table, now, "#MTGPU cpus=1 ram=10M requeue=yes")
        placed_on(table, jid, "b", now)
        # drain b --now: the job goes back to the queue while its run on b stops.
        await apply(table.requeue, jid, "requeued: b was drained", now[0], 0)
        assert table.get(jid)["old_run"] == {"attempt": 0, "members": ["b"]}
        s.rebuild()
        s._catch_up()
        assert jid not in s.queue  # not placed while the old run may still run
        # b reports the old run's end: the job may run again.
        r = table.part_ended(jid, "b", 1, "CANCELLED", None, "", now[0], 0, _doApply=True)
        assert r["code"] == "stale" and table.get(jid)["state"] == "PENDING"
        assert table.get(jid)["old_run"] is None
        s._catch_up()
        assert jid in s.queue
        return jid

    asyncio.run(go())


def test_a_requeued_job_whose_member_went_silent_waits_for_that_members_lease():
    now = [1000.0]
    table = JobTable()
    s, _ = scheduler(["a", "b"], now, table)

    async def go():
        now[0] += 5.0
        s.report(inv("b"))
        s.grant("b")
        jid = await submit(table, now, "#MTGPU cpus=1 ram=10M requeue=yes")
        placed_on(table, jid, "b", now)
        await apply(table.requeue, jid, "requeued: b was drained", now[0], 0)
        now[0] += 9.0
        assert await s.release_old_runs() == []
        now[0] += 1.5
        assert await s.release_old_runs() == [jid]
        return table.get(jid)

    job = asyncio.run(go())
    assert job["old_run"] is None and "lease of b ran out" in job["old_run_end"]


def test_a_late_report_about_a_fenced_attempt_leaves_the_newer_attempt_alone():
    now, table, s = three_members_reporting()

    async def go():
        jid = await submit(table, now, "#MTGPU cpus=1 ram=10M requeue=yes")
        placed_on(table, jid, "b", now)
        now[0] += 10.5
        s.report(inv("c"))
        assert await s.check_lost() == ["b"]
        j = table.get(jid)
        # b's lease is over: nothing to wait for, the job may run at once.
        assert j["state"] == "PENDING" and j.get("old_run") is None and attempt_of(j) == 1
        placed_on(table, jid, "c", now, term=2)
        # The partition heals: b reports how its fenced run (attempt 0) ended.
        r = table.part_ended(jid, "b", 1, "NODE_FAIL", None, "fenced: ...", now[0], 0, _doApply=True)
        assert r["code"] == "stale"
        return table.get(jid)

    job = asyncio.run(go())
    assert job["state"] == "RUNNING" and job["placement"]["members"][0]["node"] == "c"
    assert attempt_of(job) == 1


def test_a_lease_bound_too_short_for_the_reports_is_refused():
    with pytest.raises(ConfigError) as exc:
        load_text(
            "CLUSTER_MODE: cluster\nCLUSTER_ID: lab\nCLUSTER_KEY: k0123456789abcdef\n"
            "CLUSTER_LOST_AFTER: 10s\nCLUSTER_FENCE_GRACE: 5s\nUSAGE_SAMPLE_INTERVAL: 2\n",
            "c.yaml",
        )
    msg = str(exc.value)
    assert "CLUSTER_LOST_AFTER" in msg and "CLUSTER_FENCE_GRACE" in msg and len(msg) < 300, msg
    o = load_text(
        "CLUSTER_MODE: cluster\nCLUSTER_ID: lab\nCLUSTER_KEY: k0123456789abcdef\nCLUSTER_LOST_AFTER: 30s\n",
        "c.yaml",
    )
    assert o.cluster_fence_grace == 5.0


def test_a_member_cannot_renew_another_members_lease_with_its_report(tmp_path):
    # A member (any holder of the cluster key) reports in another member's name, to
    # keep that member's jobs alive past their lease: the report is taken as usage,
    # but only the named member's own report is answered with a lease.
    from mtgpu.api import cluster as cluster_api
    from mtgpu.api.dispatcher import Caller, Dispatcher
    from mtgpu.cluster.identity import ClusterIdentity
    from mtgpu.cluster.runtime import ClusterRuntime
    from mtgpu.config import Options

    key = "s3cret-cluster-key-0123456789"
    o = Options(
        cluster_mode="cluster",
        cluster_id="lab",
        cluster_key=key,
        state_dir=str(tmp_path),
        server_name="m1",
        ssh_listen=("127.0.0.1", 2222),
    )
    d = Dispatcher()
    rt = ClusterRuntime(o, ClusterIdentity.derive("lab", key), lambda: None)
    cluster_api.register(d, rt)
    rt.is_leader = lambda: True
    granted = []
    rt.grant = lambda name: granted.append(name) or 6.0
    seen = []
    rt.on_report = lambda inv: seen.append(inv.name)
    op = d.op("node.report")
    assert op is not None
    report = op.fn
    body = {"inventory": inv("m2").to_dict(processes=False)}
    r = report(Caller("mtgpu-peer.m3", 0, False, "peer"), body)
    assert "lease" not in r and granted == [] and seen == ["m2"]
    r = report(Caller("mtgpu-peer.m2", 0, False, "peer"), body)
    assert r["lease"] == 6.0 and granted == ["m2"]
    rt.peers.close()


def test_a_split_nodes_2_job_ends_once_a_members_lease_has_run_out_naming_it():
    now, table, s = three_members_reporting()

    async def go():
        jid = await submit(table, now, "#MTGPU nodes=2 cpus=1 ram=10M")
        table.place(
            jid,
            {
                "job_id": jid,
                "gpu_mode": "exclusive",
                "members": [
                    {"node": n, "rank": r, "gpu_indices": [], "cpus": 1, "ram": 1, "vram_per_gpu": 0}
                    for r, n in enumerate(("b", "c"))
                ],
            },
            1,
            now[0],
            _doApply=True,
        )
        now[0] += 5.9  # within b's lease (6 s)
        s.report(inv("c"))
        assert await s.check_lost() == [] and table.get(jid)["state"] == "RUNNING"
        now[0] += 0.2  # b's lease is over: it fences its part, and c stops its own now
        s.report(inv("c"))
        assert await s.check_lost() == []  # b is not declared lost yet
        return table.get(jid)

    job = asyncio.run(go())
    assert job["state"] == "NODE_FAIL" and "its member b was lost" in job["reason"], job


def test_a_new_scheduler_starts_again_each_job_placed_before_it_whose_start_is_not_recorded():
    now = [1000.0]
    table = JobTable()
    asked = []

    async def dispatch(job, term):
        asked.append((job.job_id, term))

    s = Scheduler(table, apply, dispatch, term=lambda: 3, clock=lambda: now[0])
    s.members = lambda: {"a", "b", "c"}
    s.own_name = "a"

    async def go():
        unstarted = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        placed_unstarted(table, unstarted, "b", now, term=2)  # the old scheduler's, never started
        started = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        placed_unstarted(table, started, "b", now, term=2)
        table.started(started, "b", now[0], attempt_of(table.get(started)), _doApply=True)
        on_lost = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        placed_unstarted(table, on_lost, "c", now, term=2)
        s.node_state["c"] = NodeState.DOWN  # the lost-member handling ends or requeues it
        mine = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        placed_unstarted(table, mine, "b", now, term=3)  # this scheduler's own: its start is under way
        pending = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        s.report(inv("b"))
        got = s.start_unstarted()
        await asyncio.gather(*list(s._starting))
        return unstarted, got, pending

    unstarted, got, pending = asyncio.run(go())
    assert got == [unstarted]
    assert asked == [(unstarted, 2)], "asked again with the term it was placed with"
    assert table.get(unstarted)["state"] == "RUNNING"
    assert table.get(pending)["state"] == "PENDING"


def test_a_member_asked_again_for_a_part_it_runs_does_not_start_it_twice():
    table = JobTable()
    starts = []
    runner = types.SimpleNamespace(start=lambda launch: starts.append(launch.job_id))
    sampler = types.SimpleNamespace(set_declared=lambda d: None)
    agent = Agent("m1", table, runner, sampler, apply, None)

    async def user_for(name, uid):
        return types.SimpleNamespace(name=name, uid=uid, gid=uid, home="/h", shell="/bin/sh")

    agent.user_for = user_for
    now = [1.0]

    async def go():
        jid = await submit(table, now, "#MTGPU cpus=1 ram=10M")
        placed_unstarted(table, jid, "m1", now, term=2)
        job = table.record(jid)
        agent.terms[jid] = (2, job.attempt)
        agent.cores[jid] = (0,)  # started here already, by the first ask
        await agent.dispatch(job, 2)
        return jid

    jid = asyncio.run(go())
    assert starts == [], "the second ask started nothing"
    # ... and recorded the start, which the first ask's record may have lost.
    assert table.get(jid)["start_time"] is not None
