"""The scheduler answers a stream of submissions before it starts jobs."""

from __future__ import annotations

import asyncio
import time

from mtgpu.schedd import scheduler as sched_mod
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler


async def _nothing(*args, **kwargs):  # replicate and dispatch are not reached here
    raise AssertionError("not expected")


def test_a_pass_waits_for_a_submission_stream_to_pause_but_not_forever(monkeypatch):
    monkeypatch.setattr(sched_mod, "SUBMIT_QUIET", 0.05)
    monkeypatch.setattr(sched_mod, "MAX_DEFER", 0.3)
    s = Scheduler(JobTable(), _nothing, _nothing, term=lambda: 1)

    async def go() -> None:
        # No submission lately: no wait at all.
        t0 = time.monotonic()
        await s._defer_to_submissions()
        idle = time.monotonic() - t0
        # One submission just now: the pass waits for the quiet period after it.
        s.accepted([])
        t0 = time.monotonic()
        await s._defer_to_submissions()
        assert time.monotonic() - t0 >= 0.045
        # A stream that never pauses: the pass still runs after MAX_DEFER.
        stop = False

        async def stream() -> None:
            while not stop:
                s.accepted([])
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(stream())
        await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await s._defer_to_submissions()
        waited = time.monotonic() - t0
        stop = True
        await task
        assert waited >= 0.25 and idle < waited

    asyncio.run(go())


def test_the_loop_looks_for_lost_members_twice_a_second_not_on_every_pass(monkeypatch):
    """Every submission and job end kicks a pass; a look for members whose lease ran
    out goes over every member and running job, and leases last tens of seconds."""
    monkeypatch.setattr(sched_mod, "MIN_PASS_INTERVAL", 0.001)
    s = Scheduler(JobTable(), _nothing, _nothing, term=lambda: 1)
    looks: list[float] = []
    passes: list[float] = []

    async def check_lost() -> list[str]:
        looks.append(time.monotonic())
        return []

    async def run_pass(*, wait: bool = True) -> int:
        passes.append(time.monotonic())
        return 0

    monkeypatch.setattr(s, "check_lost", check_lost)
    monkeypatch.setattr(s, "run_pass", run_pass)

    async def go() -> None:
        task = asyncio.ensure_future(s._loop())
        try:
            deadline = time.monotonic() + 10
            while len(passes) < 20 and time.monotonic() < deadline:
                s.kick()
                await asyncio.sleep(0.005)
            assert len(passes) >= 20
            # Every pass within LOST_CHECK_INTERVAL of the last look went without one.
            assert len(looks) <= 1 + (passes[-1] - looks[0]) / sched_mod.LOST_CHECK_INTERVAL
            assert len(looks) < len(passes)
            # ...and the looks go on while the passes do.
            first = len(looks)
            while len(looks) == first and time.monotonic() < deadline:
                s.kick()
                await asyncio.sleep(0.01)
            assert len(looks) > first
            assert looks[first] - looks[first - 1] >= sched_mod.LOST_CHECK_INTERVAL
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
