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
