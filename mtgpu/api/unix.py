"""The API over a Unix socket (``RUN_DIR/api.sock``), identifying callers by SO_PEERCRED.

The kernel tells who is on the other end; nothing the client says about itself is
believed. One JSON request per line, one JSON answer per line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any
from pathlib import Path

from mtgpu.api.dispatcher import MAX_REQUEST_BYTES, Caller, Dispatcher
from mtgpu.errors import ApiError

log = logging.getLogger("mtgpu.api")


def peer_uid(sock: socket.socket) -> int:
    """The UID of the process on the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def encode_answer(answer: dict[str, Any]) -> bytes:
    """One answer line. Keys are sorted, so a client may print a result as it came."""
    try:
        text = json.dumps(answer, default=str, sort_keys=True)
    except TypeError:  # keys of mixed types cannot be sorted
        text = json.dumps(answer, default=str)
    return text.encode() + b"\n"


async def serve_lines(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      dispatcher: Dispatcher, caller: Caller) -> None:
    """Answer JSON-lines requests from one stream until it closes."""
    try:
        while True:
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                writer.write(b'{"ok": false, "error": "request too large", "code": "too_large"}\n')
                break
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            try:
                request = json.loads(line)
            except ValueError:
                answer = {"id": None, "ok": False, "code": "bad_request",
                          "error": "not valid JSON; send one JSON object per line"}
            else:
                answer = await dispatcher.handle(caller, request)
            writer.write(encode_answer(answer))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  exc: ApiError) -> None:
    """Answer the first request with the refusal, then close. The request is read
    first: closing with it unread would reset the connection, and the client would
    see a broken pipe instead of the reason."""
    try:
        await asyncio.wait_for(reader.readline(), 5)
    except (asyncio.TimeoutError, ValueError, ConnectionError):
        pass
    try:
        writer.write(json.dumps({"id": None, "ok": False, "code": exc.code,
                                 "error": str(exc)}).encode() + b"\n")
        await writer.drain()
    except ConnectionError:
        pass
    writer.close()


async def start_unix_api(path: str, dispatcher: Dispatcher,
                         identify: Callable[[int], Caller | None]) -> asyncio.AbstractServer:
    """Listen on ``path`` (mode 0666: any local user may ask, as themselves)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_socket() or p.exists():
        p.unlink()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            uid = peer_uid(sock)
        except OSError:
            writer.close()
            return
        try:
            caller = identify(uid)
            if caller is None:
                raise ApiError(f"UID {uid} is not an MTGPU user on this host", "unknown_user")
        except ApiError as exc:  # unknown, or a known user not granted this cluster
            await _refuse(reader, writer, exc)
            return
        await serve_lines(reader, writer, dispatcher, caller)

    server = await asyncio.start_unix_server(on_client, path=str(p), limit=MAX_REQUEST_BYTES)
    os.chmod(p, 0o666)
    return server
