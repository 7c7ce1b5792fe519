"""One ``mtgpu-raft`` channel as the transport tracks it, and closing one."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.node import Node

from mtgpu.cluster import framing

log = logging.getLogger("mtgpu.cluster.transport")

Closer = Callable[[], Any]


class Channel:
    """One channel to a peer, outbound or inbound, from handshake to close."""

    __slots__ = (
        "peer",
        "node",
        "readonly",
        "outbound",
        "reader",
        "writer",
        "closer",
        "frames",
        "last_tx",
        "up",
        "closed",
        "reason",
        "task",
        "since",
    )

    def __init__(
        self, peer: str, reader: Any, writer: Any, closer: Closer | None, outbound: bool, max_frame: int
    ) -> None:
        self.peer = peer
        self.node: Node | None = None
        self.readonly = False
        self.outbound = outbound
        self.reader, self.writer, self.closer = reader, writer, closer
        self.frames = framing.FrameReader(reader, max_frame)
        self.last_tx = time.monotonic()
        self.up = False
        self.closed = False
        self.reason = ""
        self.task: asyncio.Future[Any] | None = None
        self.since = 0.0


class Link:
    """A voter this member knows of, with the task that dials it if this side dials."""

    __slots__ = ("node", "task", "failures")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.task: asyncio.Task[None] | None = None
        self.failures = 0


def buffered(writer: Any) -> int:
    """Bytes written to a channel but not yet sent (asyncssh or asyncio writer)."""
    chan = getattr(writer, "channel", None)
    if chan is not None:
        return chan.get_write_buffer_size()
    tr = getattr(writer, "transport", None)
    return tr.get_write_buffer_size() if tr is not None else 0


def describe(exc: BaseException) -> str:
    """An exception as a log line: its type, and its message if it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def release(ch: Channel, abort: bool) -> None:
    """Close a channel's stream and whatever its dial opened.

    ``abort`` discards unsent data (a dead peer would never read it); otherwise the
    stream is flushed first, so that a refusal reaches the peer before the close.
    """
    try:
        chan = getattr(ch.writer, "channel", None)
        if abort and chan is not None:
            chan.abort()
        elif abort and getattr(ch.writer, "transport", None) is not None:
            ch.writer.transport.abort()
        else:
            ch.writer.close()
        if ch.closer is not None:
            res = ch.closer()
            if inspect.isawaitable(res):
                await res
    except Exception as exc:  # noqa: BLE001 - closing a broken channel may fail
        log.debug("closing the raft channel to %s: %s", ch.peer, describe(exc))
