"""The API over a Unix socket (``RUN_DIR/api.sock``), identifying callers by SO_PEERCRED.

The kernel tells who is on the other end; nothing the client says about itself is
believed. One JSON request per line, one JSON answer per line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from mtgpu.api.dispatcher import MAX_JSON_DEPTH, MAX_REQUEST_BYTES, Caller, Dispatcher
from mtgpu.errors import ApiError

log = logging.getLogger("mtgpu.api")

#: Refused connections answered at once; beyond, a refused one is closed unanswered.
MAX_REFUSING = 64


def peer_uid(sock: socket.socket) -> int:
    """The UID of the process on the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode_answer(answer: dict[str, Any]) -> bytes:
    """One answer line, strict JSON (never NaN or Infinity). Keys are sorted, so a
    client may print a result as it came."""
    for attempt in (answer, _finite(answer)):
        try:
            text = json.dumps(attempt, default=str, sort_keys=True, allow_nan=False)
        except TypeError:  # keys of mixed types cannot be sorted
            try:
                text = json.dumps(attempt, default=str, allow_nan=False)
            except ValueError:
                continue
        except ValueError:  # a NaN or infinity somewhere: send null in its place
            continue
        return text.encode() + b"\n"
    return (
        json.dumps(
            {
                "id": None,
                "ok": False,
                "code": "internal",
                "retryable": False,
                "error": "the answer could not be written as JSON",
            }
        ).encode()
        + b"\n"
    )


class RequestTooLarge(Exception):
    """A request line over the limit; the rest of it was read and dropped."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class LineReader:
    """Lines of at most ``limit`` bytes from a stream (an asyncio or an asyncssh reader).

    Each byte is looked at once, so a long line costs its length, not its square. A
    line over ``limit`` is not kept: it is read to its end and dropped, and
    :meth:`next` raises :class:`RequestTooLarge` once for it, so the client gets one
    answer for the whole line and the stream goes on. A line that never ends is
    dropped until ``discard_limit`` bytes, then the stream is given up.
    """

    def __init__(
        self, reader: Any, limit: int = MAX_REQUEST_BYTES, discard_limit: int = 16 * MAX_REQUEST_BYTES
    ) -> None:
        self.reader, self.limit, self.discard_limit = reader, limit, discard_limit
        self._buf = bytearray()
        self._scanned = 0

    async def _more(self) -> bytes:
        return bytes(await self.reader.read(1 << 16))

    async def next(self) -> bytes | None:
        """The next line without its newline; None at the end of the stream."""
        while True:
            i = self._buf.find(b"\n", self._scanned)
            if 0 <= i <= self.limit:
                line = bytes(self._buf[:i])
                del self._buf[: i + 1]
                self._scanned = 0
                return line
            if i > self.limit or len(self._buf) > self.limit:
                await self._drop_line(i)
            self._scanned = len(self._buf)
            data = await self._more()
            if not data:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                return None
            self._buf += data

    async def _drop_line(self, newline: int) -> None:
        size = newline if newline >= 0 else len(self._buf)
        if newline >= 0:
            del self._buf[: newline + 1]
        else:
            self._buf.clear()
            while True:
                if size > self.discard_limit:
                    raise ConnectionError("a request line that does not end")
                data = await self._more()
                if not data:
                    break
                i = data.find(b"\n")
                if i >= 0:
                    size += i
                    self._buf += data[i + 1 :]
                    break
                size += len(data)
        self._scanned = 0
        raise RequestTooLarge(size)


def _depth_over(value: Any, limit: int) -> bool:
    """True if ``value`` nests arrays and objects more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                return True
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_request(line: bytes) -> tuple[Any, dict[str, Any] | None]:
    """(request, None), or (None, the answer refusing it): not JSON, NaN or Infinity
    (which Python's json would read), or nested deeper than MAX_JSON_DEPTH."""
    too_deep = {
        "id": None,
        "ok": False,
        "code": "bad_request",
        "retryable": False,
        "error": f"the request nests arrays and objects more than {MAX_JSON_DEPTH} deep; "
        "no operation takes that",
    }
    try:
        request = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        return None, too_deep
    except ValueError:
        return None, {
            "id": None,
            "ok": False,
            "code": "bad_request",
            "retryable": False,
            "error": "not valid JSON (NaN and Infinity are not JSON either); send one JSON object per line",
        }
    # Counting brackets (strings' included) is a cheap upper bound of the depth.
    if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and _depth_over(request, MAX_JSON_DEPTH):
        return None, too_deep
    return request, None


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
    """Answer JSON-lines requests from one stream until it closes."""
    lines = LineReader(reader)
    try:
        while True:
            try:
                line = await lines.next()
            except RequestTooLarge as exc:
                writer.write(
                    encode_answer(
                        {
                            "id": None,
                            "ok": False,
                            "code": "too_large",
                            "retryable": False,
                            "error": f"the request is {exc.size} bytes; a request line is at most "
                            f"{MAX_REQUEST_BYTES} (4 MiB); keep data out of requests",
                        }
                    )
                )
                await writer.drain()
                continue
            if line is None:
                break
            line = line.strip()
            if not line:
                continue
            if len(line) > _PARSE_INLINE:
                request, refusal = await asyncio.to_thread(parse_request, line)
            else:
                request, refusal = parse_request(line)
            answer = refusal or await dispatcher.handle(caller, request)
            writer.write(encode_answer(answer))
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
        writer.write(
            json.dumps(
                {"id": None, "ok": False, "code": exc.code, "retryable": exc.retryable, "error": str(exc)}
            ).encode()
            + b"\n"
        )
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
