"""The API over a Unix socket (``RUN_DIR/api.sock``), identifying callers by SO_PEERCRED.

The kernel tells who is on the other end; nothing the client says about itself is
believed. One JSON request per line, one JSON answer per line (:mod:`mtgpu.jsonl`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from mtgpu import jsonl
from mtgpu.api.dispatcher import MAX_JSON_DEPTH, MAX_REQUEST_BYTES, MAX_REQUEST_ITEMS, Caller, Dispatcher
from mtgpu.errors import ApiError

log = logging.getLogger("mtgpu.api")

#: Refused connections answered at once; beyond, a refused one is closed unanswered.
MAX_REFUSING = 64


def peer_uid(sock: socket.socket) -> int:
    """The UID of the process on the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def parse_request(line: bytes, items: int | None = MAX_REQUEST_ITEMS) -> tuple[Any, dict[str, Any] | None]:
    """(request, None), or (None, the answer refusing it): over the limit, not UTF-8,
    not JSON (NaN and Infinity are not), nested deeper than MAX_JSON_DEPTH or holding
    more than ``items`` values (both counted before it is parsed, so a refused line
    costs a few scans of its bytes and builds nothing). A value that is not an object
    is the dispatcher's to refuse, with the request's shape."""
    try:
        return jsonl.decode_value(line, limit=MAX_REQUEST_BYTES, depth=MAX_JSON_DEPTH, items=items), None
    except jsonl.LineError as exc:
        return None, jsonl.refusal(exc)


def too_large(exc: jsonl.LineTooLong) -> dict[str, Any]:
    """The answer to a request line over the limit (read whole and dropped)."""
    return jsonl.error_answer(
        f"the request is {exc.size} bytes; a request line is at most "
        f"{MAX_REQUEST_BYTES} (4 MiB); keep data out of requests",
        "too_large",
    )


#: Lines longer than this are parsed off the event loop, which also serves logins.
_PARSE_INLINE = 64 << 10


class LineStream(Protocol):
    """The reading end of a connection: an asyncio StreamReader or asyncssh's SSHReader."""

    async def readline(self) -> bytes: ...

    async def read(self, n: int = -1) -> bytes: ...


class AnswerStream(Protocol):
    """The writing end: an asyncio StreamWriter or asyncssh's SSHWriter."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


async def serve_lines(
    reader: LineStream, writer: AnswerStream, dispatcher: Dispatcher, caller: Caller
) -> None:
    """Answer JSON-lines requests from one stream until it closes. A tenant's request
    holds at most MAX_REQUEST_ITEMS values; another member's (``via`` peer: a batch of
    job records to start) is bounded by its size and depth only."""
    lines = jsonl.LineReader(reader, limit=MAX_REQUEST_BYTES)
    items = None if caller.via == "peer" else MAX_REQUEST_ITEMS
    try:
        while True:
            try:
                line = await lines.next()
            except jsonl.LineTooLong as exc:
                writer.write(jsonl.encode_answer(too_large(exc)))
                await writer.drain()
                continue
            if line is None:
                break
            line = line.strip()
            if not line:
                continue
            if len(line) > _PARSE_INLINE:
                request, refusal = await asyncio.to_thread(parse_request, line, items)
            else:
                request, refusal = parse_request(line, items)
            answer = refusal or await dispatcher.handle(caller, request)
            writer.write(jsonl.encode_answer(answer))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncssh.Error, BrokenPipeError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


async def _refuse(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exc: ApiError, wait: float = 5
) -> None:
    """Answer the first request with the refusal, then close. The request is read
    first: closing with it unread would reset the connection, and the client would
    see a broken pipe instead of the reason."""
    try:
        await asyncio.wait_for(reader.readline(), wait)
    except (TimeoutError, ValueError, ConnectionError):
        pass
    try:
        writer.write(jsonl.encode_answer(jsonl.refusal(exc)))
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()


class ApiConnections:
    """Open API-socket connections, per UID and in all, against their limits
    (``API_MAX_CONNECTIONS_PER_USER``, ``API_MAX_CONNECTIONS``; root is counted in
    the total only).

    >>> c = ApiConnections(lambda: (1, 10))
    >>> c.take(20001) is None, c.take(20001)[:37]
    (True, 'too many API connections of UID 20001')
    >>> c.give(20001); c.take(20001) is None
    True
    """

    def __init__(self, limits: Callable[[], tuple[int, int]]) -> None:
        self.limits = limits
        self.total = 0
        self.per_uid: dict[int, int] = {}
        self.refusing = 0  # refused connections still being told why

    def take(self, uid: int) -> str | None:
        """Count one more connection of ``uid``; or why not (it is then not counted)."""
        per_user, total = self.limits()
        if self.total >= total:
            return f"too many API connections on this host: API_MAX_CONNECTIONS is {total}; retry in a moment"
        n = self.per_uid.get(uid, 0)
        if uid != 0 and n >= per_user:
            return (
                f"too many API connections of UID {uid}: API_MAX_CONNECTIONS_PER_USER is "
                f"{per_user}; end some of your mt-* commands (such as `mt-job logs -f`) "
                "and retry"
            )
        self.per_uid[uid] = n + 1
        self.total += 1
        return None

    def give(self, uid: int) -> None:
        self.total -= 1
        n = self.per_uid.get(uid, 0) - 1
        if n > 0:
            self.per_uid[uid] = n
        else:
            self.per_uid.pop(uid, None)


async def start_unix_api(
    path: str,
    dispatcher: Dispatcher,
    identify: Callable[[int], Caller | None],
    limits: Callable[[], tuple[int, int]] | None = None,
) -> asyncio.AbstractServer:
    """Listen on ``path`` (mode 0666: any local user may ask, as themselves).

    ``limits`` gives the current (per UID, total) connection limits."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_socket() or p.exists():
        p.unlink()
    conns = ApiConnections(limits or (lambda: (64, 1024)))

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            uid = peer_uid(sock)
        except OSError:
            writer.close()
            return
        why = conns.take(uid)
        if why is not None:
            log.warning("refused an API connection of UID %d: %s", uid, why)
            if conns.refusing >= MAX_REFUSING:  # a flood: no descriptor is held to explain
                writer.close()
                return
            conns.refusing += 1
            try:
                await _refuse(reader, writer, ApiError(why, "too_many_connections"), wait=1)
            finally:
                conns.refusing -= 1
            return
        try:
            await _serve(reader, writer, uid)
        finally:
            conns.give(uid)

    async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uid: int) -> None:
        try:
            caller = identify(uid)
            if caller is None:
                raise ApiError(f"UID {uid} is not an MTGPU user on this host", "unknown_user")
        except ApiError as exc:  # unknown, or a known user not granted this cluster
            await _refuse(reader, writer, exc)
            return
        await serve_lines(reader, writer, dispatcher, caller)

    server = await asyncio.start_unix_server(on_client, path=str(p), limit=MAX_REQUEST_BYTES, backlog=1024)
    os.chmod(p, 0o666)
    return server
