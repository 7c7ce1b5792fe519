"""Hand-offs between the daemon's asyncio loop and PySyncObj's tick thread.

PySyncObj calls its transport on the tick thread, and the transport's callbacks into
PySyncObj must run there too; the SSH channels live on the loop. Two queues connect
them, each a ``collections.deque`` (append and popleft are atomic) plus one wake-up
per burst:

* :class:`LoopOutbox`, tick thread -> loop: ``call_soon_threadsafe`` once per burst.
* :class:`TickInbox`, loop -> tick thread: a pipe subscribed in PySyncObj's own
  poller, so an event wakes the tick thread at once instead of on its next tick
  (50 ms by default).

Both follow the same rule against lost wake-ups: the producer appends *then* looks at
the "wake-up pending" flag; the consumer clears the flag (after emptying the pipe)
*then* drains the deque. Whatever lands between the two is either drained now or
schedules a new wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import Callable
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE

log = logging.getLogger("mtgpu.cluster.transport")


class LoopOutbox:
    """Items pushed on any thread, handed to ``drain`` on the loop in bursts."""

    def __init__(self, loop: asyncio.AbstractEventLoop, drain: Callable[[list[Any]], None]) -> None:
        self._loop = loop
        self._drain = drain
        self._q: collections.deque[Any] = collections.deque()
        self._scheduled = False

    def push(self, item: Any) -> bool:
        """Queue ``item``; False if the loop is closed and nothing will drain it."""
        self._q.append(item)
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # the loop is closed: the daemon is going away
                return False
        return True

    def _run(self) -> None:
        self._scheduled = False  # before draining: a push from now on schedules again
        q, items = self._q, []
        while q:  # the loop is the only consumer, so a non-empty deque stays non-empty
            items.append(q.popleft())
        if items:
            self._drain(items)


class TickInbox:
    """Items posted on the loop, handed to ``deliver`` on the tick thread.

    ``deliver`` runs from PySyncObj's poller, i.e. inside ``SyncObj._onTick``. At most
    ``batch`` items are delivered per wake-up, so that a flood of messages still lets
    elections and heartbeats run between bursts; the rest wake the poller again.
    """

    def __init__(self, deliver: Callable[[Any], None], batch: int = 2000) -> None:
        self._deliver = deliver
        self._batch = batch
        self._q: collections.deque[Any] = collections.deque()
        self._pending = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def subscribe(self, poller: Any) -> None:
        """Watch the pipe from ``poller``; call on the thread that polls it."""
        poller.subscribe(self._r, self._on_pipe, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def unsubscribe(self, poller: Any) -> None:
        poller.unsubscribe(self._r)

    def post(self, item: Any) -> None:
        """Queue ``item`` for the tick thread (any thread; the loop in practice)."""
        if self._closed:
            return
        self._q.append(item)
        if not self._pending:
            self._wake()

    def _wake(self) -> None:
        self._pending = True
        try:
            os.write(self._w, b"!")
        except OSError:  # full: a wake-up is pending anyway
            pass

    def _on_pipe(self, fd: int, event: int) -> None:
        # Empty the pipe first, then clear the flag. The other order loses wake-ups: a
        # post between the two would see the flag clear, write a byte that the read
        # then swallows, and leave the flag set over an empty pipe, after which no post
        # would ever write again and the tick thread would sleep through every message.
        try:
            while os.read(fd, 4096):
                pass
        except BlockingIOError:
            pass
        except OSError:
            return
        self._pending = False
        q = self._q
        for _ in range(self._batch):
            try:
                item = q.popleft()
            except IndexError:
                return
            try:
                self._deliver(item)
            except Exception:  # noqa: BLE001 - one bad item must not strand the rest
                log.exception("delivering %r to the replicated state", item[:2])
        if q and not self._pending:
            self._wake()  # more than a batch waits: poll returns at once

    def close(self) -> None:
        """Close the pipe, once nothing posts any more (after unsubscribe)."""
        self._closed = True
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
