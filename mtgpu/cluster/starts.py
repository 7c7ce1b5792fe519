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

from mtgpu.errors import RETRYABLE_CODES, ApiError, MtgpuError

Call = Callable[..., Awaitable[Any]]


class StartUnanswered(MtgpuError):
    """The member did not answer a start (the connection was lost, or it took too
    long): it may have started the part. Starting it again is safe: a member never
    starts a part twice."""


class StartRefusedForNow(MtgpuError):
    """The member refused a start for now, having done nothing (a retryable refusal:
    it is loading its state after a restart, say): the start may be asked for again."""


def _kind(code: object) -> type[MtgpuError]:
    """What a start that failed with ``code`` (a request's, or one part's) raises.

    Lost on the way (``unreachable``), or its record lost to a leader change
    (``leader_changed``: the member may have started the part, its commit did not
    finish): unanswered, asked again. Refused with nothing done (``no_leader``,
    ``busy``, ``starting``): refused for now. Anything else fails the job."""
    if code in ("unreachable", "leader_changed"):
        return StartUnanswered
    if isinstance(code, str) and code in RETRYABLE_CODES:
        return StartRefusedForNow
    return MtgpuError


class StartBatcher:
    """``await start(member, job_id, term, attempt, port)`` starts one part; see the module docstring."""

    def __init__(self, call: Call, *, batch: int = 64, in_flight: int = 2, timeout: float = 60.0) -> None:
        self._call = call
        self._batch = batch
        self._in_flight = in_flight
        self._timeout = timeout
        self._waiting: dict[str, deque[tuple[str, int, asyncio.Future[None], int, int]]] = {}
        self._busy: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, member: str, job_id: str, term: int, attempt: int = 0, port: int = 0) -> None:
        """Start ``job_id``'s part (of ``attempt``) on ``member`` (``port``: its rendezvous
        port, if the job has several members); raises what went wrong with it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(member, deque()).append((job_id, term, fut, attempt, port))
        self._pump(member)
        await fut

    def _pump(self, member: str) -> None:
        waiting = self._waiting.get(member)
        while waiting and self._busy.get(member, 0) < self._in_flight:
            # One request carries one term (a new scheduler's starts never ride with
            # an old one's).
            term = waiting[0][1]
            items: list[tuple[str, int, asyncio.Future[None], int, int]] = []
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

    async def _send(
        self, member: str, term: int, items: list[tuple[str, int, asyncio.Future[None], int, int]]
    ) -> None:
        try:
            try:
                ports = {i[0]: i[4] for i in items if i[4]}
                answer = await self._call(
                    member,
                    "job.dispatch",
                    jobs=[i[0] for i in items],
                    term=term,
                    attempts={i[0]: i[3] for i in items},
                    timeout=self._timeout,
                    **({"ports": ports} if ports else {}),
                )
                errors = (answer.get("errors") or {}) if isinstance(answer, dict) else {}
                codes = (answer.get("codes") or {}) if isinstance(answer, dict) else {}
            except Exception as exc:  # noqa: BLE001 - each part fails with the request
                kind = _kind(exc.code if isinstance(exc, ApiError) else None)
                if kind is MtgpuError and isinstance(exc, ApiError) and exc.retryable:
                    kind = StartRefusedForNow  # an answer that says it may be sent again
                for _, _, fut, _, _ in items:
                    if not fut.done():
                        fut.set_exception(kind(str(exc) or type(exc).__name__))
                return
            for job_id, _, fut, _, _ in items:
                if fut.done():
                    continue
                if job_id in errors:
                    fut.set_exception(_kind(codes.get(job_id))(str(errors[job_id])))
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
