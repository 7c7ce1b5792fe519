"""Starting placed jobs' parts on other members, several to a request.

The scheduler starts each placed job by asking its member(s) over the peer channel
(``job.dispatch``). When a burst puts hundreds of jobs on a few members, one request
per job would make each member's starts wait on as many round trips. A
:class:`StartBatcher` keeps up to ``in_flight`` requests open per member; parts that
come while they are out wait and go together in the next request (up to ``batch``
of them). A lone start still costs a single round trip, with no added delay: batches
form only under load, as in a group commit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from mtgpu.errors import MtgpuError

Call = Callable[..., Awaitable[Any]]


class StartBatcher:
    """``await start(member, job_id, term)`` starts one part; see the module docstring."""

    def __init__(self, call: Call, *, batch: int = 64, in_flight: int = 2, timeout: float = 60.0) -> None:
        self._call = call
        self._batch = batch
        self._in_flight = in_flight
        self._timeout = timeout
        self._waiting: dict[str, deque[tuple[str, int, asyncio.Future[None]]]] = {}
        self._busy: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, member: str, job_id: str, term: int) -> None:
        """Start ``job_id``'s part on ``member``; raises what went wrong with it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(member, deque()).append((job_id, term, fut))
        self._pump(member)
        await fut

    def _pump(self, member: str) -> None:
        waiting = self._waiting.get(member)
        while waiting and self._busy.get(member, 0) < self._in_flight:
            # One request carries one term (a new scheduler's starts never ride with
            # an old one's).
            term = waiting[0][1]
            items = []
            while waiting and len(items) < self._batch and waiting[0][1] == term:
                item = waiting.popleft()
                if not item[2].done():  # not given up on (cancelled) meanwhile
                    items.append(item)
            if not items:
                continue
            self._busy[member] = self._busy.get(member, 0) + 1
            task = asyncio.get_running_loop().create_task(self._send(member, term, items))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not waiting:
            self._waiting.pop(member, None)

    async def _send(self, member: str, term: int, items: list[tuple[str, int, asyncio.Future[None]]]) -> None:
        try:
            try:
                answer = await self._call(member, "job.dispatch", jobs=[i[0] for i in items], term=term,
                                          timeout=self._timeout)
                errors = (answer.get("errors") or {}) if isinstance(answer, dict) else {}
            except Exception as exc:  # noqa: BLE001 - each part fails with the request
                for _, _, fut in items:
                    if not fut.done():
                        fut.set_exception(MtgpuError(str(exc) or type(exc).__name__))
                return
            for job_id, _, fut in items:
                if fut.done():
                    continue
                if job_id in errors:
                    fut.set_exception(MtgpuError(str(errors[job_id])))
                else:
                    fut.set_result(None)
        finally:
            left = self._busy.get(member, 1) - 1
            if left > 0:
                self._busy[member] = left
            else:
                self._busy.pop(member, None)
            self._pump(member)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
