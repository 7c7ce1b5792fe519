"""A job's end reaches the job table even when a leader change loses its first commit."""

from __future__ import annotations

import asyncio
import types

from mtgpu.errors import StateError
from mtgpu.schedd import agent as agent_mod
from mtgpu.schedd.agent import Agent
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable, spec_to_dict
from mtgpu.schedd.runner import FinalState, JobResult


def test_an_end_whose_commit_a_hand_off_lost_is_recorded_on_the_retry(monkeypatch):
    monkeypatch.setattr(agent_mod.asyncio, "sleep", _no_sleep)
    table = JobTable()
    failures = [StateError("the leader changed before the command committed; retry")] * 2
    acked = []

    async def replicate(method, *args, **kw):
        if method.__name__ == "part_ended" and failures:
            raise failures.pop()
        return method(*args, _doApply=True)

    runner = types.SimpleNamespace(ack=lambda job_id, attempt=0: acked.append(job_id))
    sampler = types.SimpleNamespace(set_declared=lambda d: None)
    agent = Agent("m1", table, runner, sampler, replicate, None)
    spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=1\ntrue\n", default_workdir="/h")

    async def go() -> dict:
        r = await replicate(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        jid = r["job_id"]
        placement = {
            "job_id": jid,
            "gpu_mode": "exclusive",
            "members": [{"node": "m1", "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 0, "vram_per_gpu": 0}],
        }
        await replicate(table.place_many, [(jid, placement)], 1, 2.0)
        await agent._record(JobResult(jid, FinalState.COMPLETED, exit_code=0, end_time=3.0))
        return table.get(jid)

    job = asyncio.run(go())
    assert job["state"] == "COMPLETED" and not failures and acked == [job["job_id"]]


async def _no_sleep(_seconds):
    return None


def test_a_start_whose_record_a_hand_off_lost_is_recorded_when_the_scheduler_asks_again():
    """The part started, but the record of its start was lost to a leader change: the
    scheduler is told (leader_changed) and asks again; the member does not start the
    part twice, and records the start then (it stayed unrecorded before: a job
    RUNNING with no start, and the scheduler took the second answer as a start)."""
    from mtgpu.schedd.jobenv import JobUser

    table = JobTable()
    failures = [StateError("the leader changed before the command committed; retry", "leader_changed")]
    starts = []

    async def replicate(method, *args, **kw):
        if method.__name__ == "started" and failures:
            raise failures.pop()
        return method(*args, _doApply=True)

    async def user_for(name, uid):
        return JobUser(name, uid, uid, "/h", "/bin/sh")

    runner = types.SimpleNamespace(start=starts.append, job_dir=lambda jid: f"/nonexistent/{jid}")
    sampler = types.SimpleNamespace(set_declared=lambda d: None, latest=None)
    agent = Agent("m1", table, runner, sampler, replicate, user_for)
    spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=1\ntrue\n", default_workdir="/h")

    async def go() -> dict:
        r = await replicate(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        jid = r["job_id"]
        placement = {
            "job_id": jid,
            "gpu_mode": "exclusive",
            "members": [{"node": "m1", "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 0, "vram_per_gpu": 0}],
        }
        await replicate(table.place_many, [(jid, placement)], 1, 2.0)
        job = table.get(jid)
        try:
            await agent.dispatch(job, 1)
        except StateError as exc:
            assert exc.code == "leader_changed"
        else:
            raise AssertionError("the lost record was not reported")
        assert table.get(jid)["start_time"] is None
        await agent.dispatch(table.get(jid), 1)  # the scheduler asks again
        return table.get(jid)

    job = asyncio.run(go())
    assert len(starts) == 1 and not failures
    assert job["state"] == "RUNNING" and job["start_time"] is not None
