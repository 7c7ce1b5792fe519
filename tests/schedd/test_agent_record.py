"""A job's end reaches the job table even when a leader change loses its first commit."""

from __future__ import annotations

import asyncio
import contextlib
import types

from mtgpu.errors import StateError
from mtgpu.jobspec import spec_to_dict
from mtgpu.schedd import agent as agent_mod
from mtgpu.schedd.agent import Agent
from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.jobtable import JobTable
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
        job = table.record(jid)
        try:
            await agent.dispatch(job, 1)
        except StateError as exc:
            assert exc.code == "leader_changed"
        else:
            raise AssertionError("the lost record was not reported")
        assert table.get(jid)["start_time"] is None
        await agent.dispatch(table.record(jid), 1)  # the scheduler asks again
        return table.get(jid)

    job = asyncio.run(go())
    assert len(starts) == 1 and not failures
    assert job["state"] == "RUNNING" and job["start_time"] is not None


class _HalfStartedRunner:
    """A runner whose earlier daemon was killed in the middle of a start: the part's
    launch is written (its directory exists), no supervisor ever ran. It behaves as
    Runner does: start() refuses a job whose launch it finds (JobAlreadyStarted), and
    start_interrupted() sets such a directory aside, after which start() starts it."""

    def __init__(self, tmp_path):
        self.root = tmp_path
        (tmp_path / "1").mkdir()
        (tmp_path / "1" / "spec.json").write_text("{}")
        self.starts: list[str] = []

    def job_dir(self, jid):
        return self.root / jid

    def listen_ends(self):
        return None

    def running(self):
        return []

    def launch_run(self, jid):
        return (1, 0) if (self.root / jid / "spec.json").exists() else (0, 0)

    def result(self, jid):
        return None

    def start_interrupted(self, jid, wait=10.0):
        (self.root / jid).rename(self.root / f".{jid}.interrupted")
        return True

    def start(self, launch):
        from mtgpu.schedd.runner import JobAlreadyStarted

        d = self.root / launch.job_id
        if (d / "spec.json").exists():
            raise JobAlreadyStarted(f"job {launch.job_id} was already started on this host")
        d.mkdir()
        (d / "spec.json").write_text("{}")
        self.starts.append(launch.job_id)

    def poll(self, ended=None):
        return []


def _placed_job(table, replicate):
    spec = parse_job_file("#!/bin/bash\n#MTGPU cpus=1\ntrue\n", default_workdir="/h")

    async def go() -> str:
        r = await replicate(
            table.submit,
            {"user": "ann", "uid": 20001, "name": "x", "spec": spec_to_dict(spec), "workdir": "/h"},
            None,
            1.0,
            None,
        )
        placement = {
            "job_id": r["job_id"],
            "gpu_mode": "exclusive",
            "members": [{"node": "m1", "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 0, "vram_per_gpu": 0}],
        }
        await replicate(table.place_many, [(r["job_id"], placement)], 1, 2.0)
        return r["job_id"]

    return go()


def _agent_on(runner, table, replicate):
    from mtgpu.schedd.jobenv import JobUser

    async def user_for(name, uid):
        return JobUser(name, uid, uid, "/h", "/bin/sh")

    sampler = types.SimpleNamespace(set_declared=lambda d: None, latest=None)
    return Agent("m1", table, runner, sampler, replicate, user_for)


def test_a_start_a_killed_daemon_left_half_done_runs_once_when_the_scheduler_asks_for_it_meanwhile(tmp_path):
    """kill -9 between writing a part's launch and its supervisor's fork, then a
    restart: the new scheduler asks for the start (not recorded) while the agent is
    still adopting the earlier daemon's jobs. The start waits for the adoption, which
    sets the half-done start aside and starts the part; it ran nowhere before (the
    start was taken as done, recorded, and the job stayed RUNNING with nothing
    running)."""
    table = JobTable()

    async def replicate(method, *args, **kw):
        return method(*args, _doApply=True)

    runner = _HalfStartedRunner(tmp_path)
    agent = _agent_on(runner, table, replicate)

    async def go() -> dict:
        jid = await _placed_job(table, replicate)
        assert jid == "1"
        agent.start()
        await agent.dispatch(table.record(jid), 1)  # the restarted scheduler's start
        await agent.stop()
        return table.get(jid)

    job = asyncio.run(go())
    assert runner.starts == ["1"], runner.starts
    assert job["state"] == "RUNNING" and job["start_time"] is not None


def test_a_start_after_a_restart_whose_record_an_election_lost_is_asked_again_not_failed(
    tmp_path, monkeypatch
):
    """The failover test saw a job FAILED 'could not start after a restart: the
    leader changed before the command committed; retry': the member restarted
    during an election. The start is asked again and recorded; the job runs."""
    monkeypatch.setattr(agent_mod.asyncio, "sleep", _no_sleep)
    table = JobTable()
    failures = [
        StateError("no leader yet", "no_leader"),
        StateError("the leader changed before the command committed; retry", "leader_changed"),
    ]

    async def replicate(method, *args, **kw):
        if method.__name__ == "started" and failures:
            raise failures.pop()
        return method(*args, _doApply=True)

    runner = _HalfStartedRunner(tmp_path)
    agent = _agent_on(runner, table, replicate)

    async def go() -> dict:
        jid = await _placed_job(table, replicate)
        agent._adopted = asyncio.Event()
        await agent._adopt()
        return table.get(jid)

    job = asyncio.run(go())
    assert not failures and runner.starts == ["1"]
    assert job["state"] == "RUNNING" and job["start_time"] is not None, (job["state"], job["reason"])


def test_a_look_that_took_longer_than_the_poll_interval_is_not_followed_at_once(monkeypatch):
    """A tick that overran the interval (its thread waited behind others on a loaded
    host) is followed by a pause of a quarter interval, not by the next tick at once:
    a host whose agents fall behind does not spin on their looks."""
    import time as _time

    monkeypatch.setattr(agent_mod, "POLL_INTERVAL", 0.2)
    looks: list[tuple[float, float]] = []

    def poll(ended=None):
        began = _time.monotonic()
        _time.sleep(0.3)  # longer than the interval
        looks.append((began, _time.monotonic()))
        return []

    runner = types.SimpleNamespace(running=lambda: [], poll=poll)
    sampler = types.SimpleNamespace(set_declared=lambda d: None)

    async def apply(method, *args, **kw):
        return method(*args, **kw, _doApply=True)

    agent = Agent("m1", JobTable(), runner, sampler, apply, None)

    async def go() -> None:
        task = asyncio.ensure_future(agent._loop())
        while len(looks) < 4:
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(go())
    gaps = [nxt[0] - prev[1] for prev, nxt in zip(looks, looks[1:], strict=False)]
    assert len(gaps) >= 3 and min(gaps) >= 0.2 / 4 - 0.005, gaps
