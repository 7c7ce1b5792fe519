"""One SSH connection to one MTGPU server, speaking the ``mtgpu-api`` subsystem.

The connection is an asyncssh client that reads the user's ``~/.ssh/config``, keys,
agent and ``known_hosts`` as OpenSSH would. Requests are JSON lines
(:mod:`mtgpu.jsonl`) on a channel of that connection, answered in process by the server: nothing is spawned there per
refresh. Actions that may take a while (creating a workspace) get a channel of their
own so that refreshing goes on meanwhile.

Errors::

    MtgpuError
    ├── ServerUnreachable   the connection or the subsystem could not be had (reason)
    └── ApiError            the server refused a request (carries the server's code)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import asyncssh

from mtgpu import jsonl
from mtgpu.errors import MtgpuError
from mtgpu.tui.sources import Target

log = logging.getLogger("remotegpu")

SUBSYSTEM = "mtgpu-api"


class ServerUnreachable(MtgpuError):
    """No working connection: ``str()`` is the reason, in words a user can act on.
    ``host_key`` is set when the server answered but its host key is not trusted here:
    it is a server all the same, one ``ssh`` away from being usable."""

    def __init__(self, reason: str, host_key: bool = False) -> None:
        super().__init__(reason)
        self.host_key = host_key


def host_key_unknown(exc: BaseException, target: Target) -> bool:
    """Whether connecting failed only because this computer does not trust the host key
    yet: the key is not in known_hosts, or the known_hosts file that ~/.ssh/config
    names does not exist yet (``ssh`` creates it when the key is accepted)."""
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return True
    identity = os.path.expanduser(target.identity) if target.identity else None
    return isinstance(exc, FileNotFoundError) and bool(exc.filename) and exc.filename != identity


def reason_for(exc: BaseException, target: Target, timeout: float) -> str:
    """What went wrong, and what to do, for an error raised while connecting."""
    dest = " ".join(target.ssh_argv()[1:])
    if host_key_unknown(exc, target):
        why = (
            exc.reason
            if isinstance(exc, asyncssh.HostKeyNotVerifiable)
            else f"there is no {getattr(exc, 'filename', '')} yet"
        )
        return (
            f"host key unknown ({why}): check its fingerprint and trust it once "
            f"with `ssh {dest}`, or add the cluster's @cert-authority line to known_hosts; "
            "then press r"
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return (
            "key not accepted: ask an admin to add your public key or for an invite "
            f"(`ssh {dest}` redeems it)"
        )
    if isinstance(exc, asyncssh.ChannelOpenError):
        return f"not an MTGPU server (no {SUBSYSTEM} subsystem): {exc.reason}"
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, asyncssh.ConnectionLost)):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return f"unknown host {target.host!r}: {exc.strerror}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused on port {target.port or 22}: is mtgpu-server running?"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, (asyncssh.Error, ValueError, asyncssh.KeyImportError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class PageItems(list[Any]):
    """A page of a listing (``job.list``): its items, and the cursor of the next page."""

    def __init__(self, items: list[Any], next_cursor: str) -> None:
        super().__init__(items)
        self.next_cursor = next_cursor


class ApiChannel:
    """One ``mtgpu-api`` channel: requests matched to answers by id."""

    def __init__(self, writer: asyncssh.SSHWriter, reader: asyncssh.SSHReader) -> None:
        self._writer, self._reader = writer, reader
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pump = asyncio.get_running_loop().create_task(self._read())
        self.closed: str | None = None
        #: The last warning the server added to an answer (USER_DISK_LIMIT, retention).
        self.notice: str | None = None

    async def _read(self) -> None:
        lines = jsonl.LineReader(self._reader, limit=jsonl.MAX_ANSWER_BYTES, partial=False)
        try:
            while True:
                try:
                    answer = await lines.message()
                except jsonl.LineError:
                    continue  # not an answer: whoever waits for it times out
                if answer is None:
                    break
                rid = answer.get("id")
                fut = self._waiting.pop(rid, None) if isinstance(rid, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        except (asyncssh.Error, OSError, asyncio.IncompleteReadError) as exc:
            self.closed = str(exc) or type(exc).__name__
        finally:
            self.closed = self.closed or "the server closed the API channel"
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ServerUnreachable(f"connection lost: {self.closed}"))
            self._waiting.clear()

    async def call(self, op: str, timeout: float, **args: Any) -> Any:
        """Send one request; return its result or raise ApiError / ServerUnreachable."""
        if self.closed:
            raise ServerUnreachable(f"connection lost: {self.closed}")
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        req = {"op": op, "args": {k: v for k, v in args.items() if v is not None}, "id": rid}
        try:
            self._writer.write(jsonl.encode(req))
            answer = await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise ServerUnreachable(f"{op} got no answer within {timeout:g} s") from exc
        except (asyncssh.Error, OSError) as exc:
            raise ServerUnreachable(f"connection lost: {exc}") from exc
        finally:
            self._waiting.pop(rid, None)
        refused = jsonl.answer_error(answer)
        if refused is not None:
            raise refused
        if answer.get("notice"):
            self.notice = str(answer["notice"])[:2000]
        result = answer.get("result")
        if answer.get("next_cursor") and isinstance(result, list):
            return PageItems(result, str(answer["next_cursor"]))
        return result

    def close(self) -> None:
        self._pump.cancel()
        try:
            self._writer.close()
        except (asyncssh.Error, OSError):
            pass


class ServerLink:
    """The connection to one server; :meth:`connect` again after it is lost."""

    def __init__(self, target: Target, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self.conn: asyncssh.SSHClientConnection | None = None
        self.api: ApiChannel | None = None
        self.forwards: list[Any] = []

    async def connect(self) -> None:
        """Connect and open the API channel, or raise ServerUnreachable with the reason."""
        await self.close()
        t = self.target
        kwargs: dict[str, Any] = {
            "connect_timeout": self.timeout,
            "login_timeout": self.timeout,
            "keepalive_interval": 15,
            "keepalive_count_max": 3,
        }
        if t.port:
            kwargs["port"] = t.port
        if t.user:
            kwargs["username"] = t.user
        if t.identity:
            kwargs["client_keys"] = [os.path.expanduser(t.identity)]
        try:
            self.conn = await asyncssh.connect(t.host, **kwargs)
            self.api = await self._open_channel()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a reason on screen
            await self.close()
            raise ServerUnreachable(
                reason_for(exc, t, self.timeout), host_key=host_key_unknown(exc, t)
            ) from exc

    async def _open_channel(self) -> ApiChannel:
        assert self.conn is not None
        writer, reader, _ = await asyncio.wait_for(
            self.conn.open_session(subsystem=SUBSYSTEM, encoding=None), self.timeout
        )
        return ApiChannel(writer, reader)

    @property
    def notice(self) -> str | None:
        """The server's last warning for this user, if any."""
        return self.api.notice if self.api is not None else None

    @property
    def up(self) -> bool:
        return self.api is not None and not self.api.closed

    async def call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        if self.api is None:
            raise ServerUnreachable("not connected")
        return await self.api.call(op, timeout or self.timeout, **args)

    async def call_all(self, op: str, timeout: float | None = None, **args: Any) -> list[Any]:
        """Every item of a listing given in pages (``job.list``): each page in turn,
        its ``next_cursor`` sent back as ``cursor`` until the last."""
        items: list[Any] = []
        cursor = None
        for _ in range(jsonl.MAX_PAGES):
            page = await self.call(op, timeout, **args, cursor=cursor)
            items.extend(page or ())
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return items
        raise jsonl.too_many_pages(op)

    async def call_long(self, op: str, timeout: float = 120.0, **args: Any) -> Any:
        """A request on a channel of its own, so a slow action holds up no refresh."""
        if self.conn is None:
            raise ServerUnreachable("not connected")
        try:
            chan = await self._open_channel()
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise ServerUnreachable(reason_for(exc, self.target, self.timeout)) from exc
        try:
            return await chan.call(op, timeout, **args)
        finally:
            chan.close()

    async def follow(self, command: str) -> AsyncIterator[str]:
        """Run ``command`` on the server (as the user) and yield its output as it comes."""
        if self.conn is None:
            raise ServerUnreachable("not connected")
        try:
            proc = await self.conn.create_process(
                command, encoding="utf-8", errors="replace", stderr=asyncssh.STDOUT
            )
        except (asyncssh.Error, OSError) as exc:
            raise ServerUnreachable(reason_for(exc, self.target, self.timeout)) from exc
        try:
            while True:
                chunk = await proc.stdout.read(4096)
                if not chunk:
                    break
                yield chunk
        finally:
            proc.close()

    async def forward(self, remote_port: int, local_port: int = 0) -> int:
        """Forward ``127.0.0.1:local_port`` here to the server's loopback ``remote_port``;
        returns the local port (a free one when ``local_port`` is 0 or taken)."""
        if self.conn is None:
            raise ServerUnreachable("not connected")
        try:
            listener = await self.conn.forward_local_port("127.0.0.1", local_port, "127.0.0.1", remote_port)
        except OSError:
            if local_port == 0:
                raise
            listener = await self.conn.forward_local_port("127.0.0.1", 0, "127.0.0.1", remote_port)
        self.forwards.append(listener)
        return int(listener.get_port())

    def _release(self) -> asyncssh.SSHClientConnection | None:
        """Close the API channel and the forwards; hand back the connection to end."""
        if self.api is not None:
            self.api.close()
            self.api = None
        for f in self.forwards:
            f.close()
        self.forwards = []
        conn, self.conn = self.conn, None
        return conn

    def abort(self) -> None:
        """Drop the connection now, without waiting for the server (quitting)."""
        conn = self._release()
        if conn is not None:
            conn.abort()

    async def close(self) -> None:
        """Close the connection politely (for at most 2 s)."""
        conn = self._release()
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 2)
            except (TimeoutError, asyncssh.Error, OSError):
                pass
