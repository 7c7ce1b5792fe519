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
