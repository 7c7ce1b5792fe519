"""Calls between members: the API dispatcher, over one SSH channel per member.

:class:`PeerClient` keeps one authenticated connection to each member it talks to
and one ``mtgpu-peer`` channel on it, sending JSON-lines requests (the same
protocol as the ``mtgpu-api`` subsystem) with answers matched by id. A broken
connection is redialed on the next call. Raft channels (``mtgpu-raft``) are opened
on the same connections through :meth:`PeerClient.open_raft`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import asyncssh

from mtgpu import jsonl
from mtgpu.cluster.dial import connect_peer
from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.errors import ApiError

log = logging.getLogger("mtgpu.cluster")

#: Connections being opened at once. A new scheduler dials the members it starts jobs
#: on; a thousand handshakes at once on a busy host would each miss their timeout.
MAX_DIALS = 16
#: Seconds a dial to another member may take (``CLUSTER_CONNECT_TIMEOUT``'s default).
CONNECT_TIMEOUT = 5.0


class _Link:
    def __init__(self, conn: asyncssh.SSHClientConnection, proc: asyncssh.SSHClientProcess) -> None:
        self.conn = conn
        self.proc = proc
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.reader: asyncio.Task[None] | None = None

    def close(self) -> None:
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(ApiError("the connection to the member was lost", "unreachable"))
        self.waiting.clear()
        self.conn.close()


class PeerClient:
    """Requests to other members by name; addresses come from ``address_of``."""

    def __init__(
        self,
        identity: ClusterIdentity,
        my_name: str,
        state_dir: str,
        address_of: Callable[[str], str | None],
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.identity = identity
        self.connect_timeout = connect_timeout
        self.my_name = my_name
        self.state_dir = state_dir
        self.address_of = address_of
        self._links: dict[str, _Link] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._ids = itertools.count(1)
        self._dials: asyncio.Semaphore | None = None

    async def connection(self, target: str, address: str | None = None) -> asyncssh.SSHClientConnection:
        return (await self._link(target, address)).conn

    async def _link(self, target: str, address: str | None = None) -> _Link:
        link = self._links.get(target)
        if link is not None and not link.conn.is_closed():
            return link
        lock = self._locks.setdefault(target, asyncio.Lock())
        async with lock:
            link = self._links.get(target)
            if link is not None and not link.conn.is_closed():
                return link
            addr = address or self.address_of(target)
            if addr is None:
                raise ApiError(f"no address is known for member {target!r}", "unreachable")
            if self._dials is None:
                self._dials = asyncio.Semaphore(MAX_DIALS)
            try:
                async with self._dials:
                    conn = await connect_peer(
                        addr,
                        self.identity,
                        self.my_name,
                        self.state_dir,
                        connect_timeout=self.connect_timeout,
                    )
                    proc = await conn.create_process(subsystem="mtgpu-peer", encoding=None)
            except asyncssh.HostKeyNotVerifiable as exc:
                log.warning(
                    "member %s at %s is not of this cluster: its host certificate is not "
                    "signed by this cluster's CA (another CLUSTER_ID or CLUSTER_KEY)",
                    target,
                    addr,
                )
                raise ApiError(
                    f"member {target} at {addr} is not of this cluster (its host "
                    "certificate is from another CLUSTER_ID or CLUSTER_KEY)",
                    "wrong_cluster",
                ) from exc
            except (OSError, asyncssh.Error) as exc:
                raise ApiError(f"member {target} at {addr} is unreachable: {exc}", "unreachable") from exc
            link = _Link(conn, proc)
            link.reader = asyncio.get_running_loop().create_task(self._read(target, link))
            self._links[target] = link
            return link

    async def _read(self, target: str, link: _Link) -> None:
        lines = jsonl.LineReader(link.proc.stdout, limit=jsonl.MAX_ANSWER_BYTES, partial=False)
        try:
            while True:
                try:
                    ans = await lines.message()
                except jsonl.LineError:
                    continue  # not an answer: whoever waits for it times out
                if ans is None:
                    break
                rid = ans.get("id")
                fut = link.waiting.pop(rid, None) if isinstance(rid, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(ans)
        except (asyncssh.Error, OSError):
            pass
        finally:
            if self._links.get(target) is link:
                del self._links[target]
            link.close()

    async def call(
        self, target: str, op: str, /, *, dial_address: str | None = None, timeout: float = 10.0, **args: Any
    ) -> Any:
        """Run ``op`` on member ``target`` and return its result; ApiError if refused.
        A page of a listing (its answer names a ``next_cursor``) is a
        :class:`~mtgpu.jsonl.Page`, so that a relayed listing keeps its cursor.

        ``dial_address`` reaches a member whose name is not known yet (a seed).
        """
        link = await self._link(target, dial_address)
        rid = next(self._ids)
        line = jsonl.encode({"op": op, "args": args, "id": rid})
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        link.waiting[rid] = fut
        link.proc.stdin.write(line)
        try:
            ans = await asyncio.wait_for(fut, timeout)
        except asyncio.CancelledError:
            link.waiting.pop(rid, None)  # given up on by the caller (a relay to a new leader)
            raise
        except TimeoutError as exc:
            link.waiting.pop(rid, None)
            raise ApiError(
                f"member {target} did not answer {op} within {timeout:.0f}s", "unreachable"
            ) from exc
        if ans.get("ok") and ans.get("next_cursor"):
            return jsonl.Page(list(ans.get("result") or ()), str(ans["next_cursor"]))
        return jsonl.result(ans)

    async def open_raft(self, target: str) -> tuple[Any, Any, Callable[[], None]]:
        """A ``mtgpu-raft`` channel to ``target``: (reader, writer, closer)."""
        link = await self._link(target)
        try:
            proc = await link.conn.create_process(subsystem="mtgpu-raft", encoding=None)
        except (AttributeError, asyncssh.Error) as exc:
            # The connection closed under us: drop it so the next dial makes a new one.
            link.close()
            raise OSError(f"the connection to {target} closed: {exc}") from exc

        def closer() -> None:
            # A Raft channel closes when its peer looks dead; a connection to a dead peer
            # would only hang the next dial, so the whole connection goes with it.
            proc.close()
            if self._links.get(target) is link:
                del self._links[target]
            link.close()

        return proc.stdout, proc.stdin, closer

    def forget(self, target: str) -> None:
        """Close the connection to ``target`` (a one-off probe, or a removed member)."""
        link = self._links.pop(target, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        for link in list(self._links.values()):
            link.close()
        self._links.clear()
