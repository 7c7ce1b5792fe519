"""A PySyncObj ``Transport`` that carries Raft messages over the daemon's SSH channels.

The transport opens no port of its own. Outbound channels come from a ``dial`` coroutine
the daemon provides; inbound ones arrive through the daemon's SSH server, which
authenticates the peer and hands the channel to :meth:`SshRaftTransport.accept`.

API
===

``SshRaftTransport(loop, self_id, dial, *, keepalive=1.0, dead_after=3.0,
max_buffer=64 MiB, readonly=False, retry=1.0, connect_timeout=5.0)``

* ``loop`` is the daemon's asyncio loop; every channel lives on it.
* ``self_id`` is this member's name. Node ids are member names (``pysyncobj.node.Node``
  with a string id).
* ``dial(node_id)`` returns ``(reader, writer, closer)``: a bidirectional binary
  stream to that member's ``mtgpu-raft`` subsystem (asyncssh ``SSHReader`` and
  ``SSHWriter`` opened with ``encoding=None``) and a ``closer()`` (plain or async)
  that releases what the dial opened. It raises ``OSError``/``asyncssh.Error`` when
  the member cannot be reached, and may be cancelled after ``connect_timeout``.

Attach it to PySyncObj in one of two ways:

* ``SyncObj(self_id, peers, conf, transport=t)`` then ``t.bind(sync)``. Until
  :meth:`bind`, the transport reports not ready and the tick thread idles. Needs
  ``autoTick=True`` (the default): with manual ticks ``SyncObj.__init__`` would wait
  forever for a transport that can only be bound after it returns.
* ``SyncObj(..., transportClass=t.attach)``, which is what
  ``StateStore(..., transport_factory=t.attach)`` does: PySyncObj calls
  :meth:`attach` with itself, the self node and the peers while it constructs.

Read-only members are ``SyncObj(None, voters, ...)`` with ``readonly=True``: they dial
every voter, say so in their hello, and are never dialed. A voter reports them with
``_onReadonlyNodeConnected`` and replicates to them; they do not vote.

``await t.accept(reader, writer, peer_id)`` serves one inbound channel and returns
when it closes (the daemon then ends the SSH session). ``peer_id`` must be the member
name the peer's certificate proves; a hello claiming another id is refused.

Only current voters are heard as voters: a voter channel from a member that is not in
this member's configuration is refused at the handshake, and its queued messages are
dropped once it is removed, so a demoted voter that comes back still believing it
votes cannot start elections here (PySyncObj itself answers a ``request_vote`` from
any node it hears, and has no pre-vote). Read-only channels carry no voter messages.

``addNode``/``dropNode`` (dynamic membership) are called by PySyncObj on its tick
thread; they only schedule work on the loop. An added voter is dialed if this member
dials it (see below) and otherwise accepted when it dials; a dropped one loses its
channel and is no longer dialed or accepted.

``t.on_peer_ended = fn`` has ``fn(node)`` called on the tick thread when a voter ended
its channel itself (its process ended or restarted), which is how a follower learns at
once that a crashed leader is gone instead of waiting out an election timeout.

``t.peers()`` (on the loop) lists the connected peers for status output. After
``SyncObj.destroy()`` (``StateStore.close()``), ``await t.wait_closed()`` waits until
every channel is closed. ``syncobj_admin`` utility messages are not carried: call
``getStatus()``/``transferLeadership()`` on the SyncObj instead.

Protocol
========

One channel per pair of members, dialed by the member with the higher id (PySyncObj's
TCP rule), or by the read-only member. Handshake (JSON frames, see ``framing``):
dialer ``hello{id, readonly}`` -> acceptor ``welcome{id}`` or ``refused{reason}`` ->
dialer ``ready``. Each side reports the peer connected only after receiving a frame
that proves the other side heard it, i.e. once the channel works both ways. Then
frames carry ``pysyncobj.pickle`` messages; empty frames are keepalives.

When a peer redials while its old channel still looks open (it restarted), the old
channel is reported disconnected before the new one connects, and its late end is
ignored. A channel that carries nothing for ``dead_after`` seconds (PySyncObj's
``connectionTimeout`` lives inside its TCP connection class, so this transport has its
own check), or whose unsent data exceeds ``max_buffer``, is dropped; Raft resends what
it lost. Dials are retried every ``retry`` seconds.

Threads
=======

PySyncObj calls ``send`` and its other entry points on its tick thread, and its
callbacks must run there too. ``send`` pickles on the tick thread, returns at once, and
hands frames to the loop through a deque with one ``call_soon_threadsafe`` per burst.
Inbound events go the other way through a deque and a pipe that PySyncObj's own
(private) ``_poller`` watches, so a message wakes the tick thread at once instead of on
its next 50 ms tick; see ``handoff``. This relies on PySyncObj internals, which is one
reason the version is pinned.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncssh
from pysyncobj import pickle
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from mtgpu.cluster import framing
from mtgpu.cluster.channel import Channel, Closer, Link, buffered, describe, release
from mtgpu.cluster.handoff import LoopOutbox, TickInbox
from mtgpu.state import syncobj as syncobj_parts

log = logging.getLogger("mtgpu.cluster.transport")

Dial = Callable[[str], Awaitable[tuple[Any, Any, Closer]]]

# Inbound events, handed from the loop to the tick thread.
_CONN, _DISC, _MSG, _ROCONN, _RODISC, _ROMSG = range(6)

# A disconnect's payload when the peer ended the channel (see ``on_peer_ended``).
_ENDED = b"ended"
#: What ``_pump`` says when the peer's end of an established channel closed.
PEER_CLOSED = "closed by the peer"

# Raft messages only a voter sends; dropped from read-only channels.
_VOTER_ONLY = frozenset({"request_vote", "response_vote", "append_entries", "timeout_now"})


class SshRaftTransport(Transport):
    """PySyncObj transport over asyncssh channels; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        self_id: str,
        dial: Dial,
        *,
        keepalive: float = 1.0,
        dead_after: float = 3.0,
        max_buffer: int = 64 << 20,
        readonly: bool = False,
        retry: float = 1.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(None, None, ())
        if dead_after <= keepalive:
            raise ValueError("dead_after must exceed keepalive, or idle peers look dead")
        self._loop = loop
        self._self_id = self_id
        self._dial = dial
        self._keepalive = keepalive
        self._dead_after = dead_after
        self._max_buffer = max_buffer
        self._readonly = readonly
        self._retry = retry
        self._connect_timeout = connect_timeout
        # Set by bind/attach; tick-thread side.
        self._poller: Any = None
        self._bound = False
        self._ready = False
        self._ready_evt = threading.Event()
        self._members: set[str] = set()  # voter ids as the tick thread knows them
        self._destroyed = False
        # Frames from the tick thread to the loop; events from the loop to the tick thread.
        self._outbox = LoopOutbox(loop, self._flush)
        self._inbox = TickInbox(self._deliver)
        # Loop side. ``_live`` is also read (never written) by ``send`` on the tick thread.
        self._live: dict[str, Channel] = {}
        self._links: dict[str, Link] = {}
        self._channels: set[Channel] = set()
        self._bound_evt = asyncio.Event()
        self._closed_evt = asyncio.Event()
        self._shut = False
        self._housekeeper: asyncio.Task[None] | None = None
        self._warned: dict[str, float] = {}
        #: ``on_peer_ended(node)``, called on the tick thread after a voter's
        #: disconnect when the voter ended its channel itself: its end closed or its
        #: connection dropped (its process ended), or it redialed (it restarted). Not
        #: for channels this member closed (dropped, dead for ``dead_after``, over
        #: ``max_buffer``, shutting down). The state store calls an election at once
        #: when that voter was its leader (``StateStore.expedite_elections``).
        self.on_peer_ended: Callable[[Node], None] | None = None

    # ------------------------------------------------------------------ binding

    def bind(self, syncobj: Any) -> None:
        """Attach to a SyncObj built with ``transport=self``; call right after it."""
        self._check_self(syncobj.selfNode)
        self._bind(syncobj, syncobj.otherNodes)

    def attach(self, syncObj: Any, selfNode: Node | None, otherNodes: Iterable[Node]) -> SshRaftTransport:
        """``transportClass``-style constructor: PySyncObj calls it while it constructs.

        ``syncObj.conf`` and ``syncObj._poller`` already exist at that point, but the
        callbacks are not set yet, so nothing may be delivered from here.
        """
        self._check_self(selfNode)
        self._bind(syncObj, otherNodes)
        return self

    def _check_self(self, node: Node | None) -> None:
        if node is None and not self._readonly:
            raise ValueError("a SyncObj without a self node is read-only: pass readonly=True")
        if node is not None and self._readonly:
            raise ValueError("a read-only transport needs SyncObj(None, voters, ...)")
        if node is not None and node.id != self._self_id:
            raise ValueError(f"SyncObj's self node {node.id!r} is not {self._self_id!r}")

    def _bind(self, syncobj: Any, nodes: Iterable[Node]) -> None:
        if self._bound:
            raise RuntimeError("this transport is already bound to a SyncObj")
        # Keep the poller, not the SyncObj: the loop's tasks hold the transport, and a
        # reference back would keep a destroyed SyncObj alive.
        self._poller = syncobj_parts.poller(syncobj)
        nodes = [n for n in nodes if n.id != self._self_id]
        self._members = {n.id for n in nodes}
        self._call(self._start, nodes)
        # Last: the tick thread's tryGetReady goes ahead once it sees this.
        self._bound = True

    def tryGetReady(self) -> None:
        # Runs on the tick thread, which owns the poller, so the pipe is subscribed
        # there. Never raises: TransportNotReadyError here would end the tick thread.
        if self._ready or not self._bound or self._destroyed:
            return
        self._inbox.subscribe(self._poller)
        self._ready = True
        self._ready_evt.set()

    @property
    def ready(self) -> bool:
        return self._ready

    def waitReady(self) -> None:
        if self._bound:
            self._ready_evt.wait(10.0)

    # -------------------------------------------------------- tick-thread side

    def send(self, node: Node, message: Any) -> bool:
        ch = self._live.get(node.id)
        if ch is None or ch.closed:
            return False
        try:
            data = pickle.dumps(message)
        except Exception:  # noqa: BLE001 - a bad message must not kill the tick
            log.exception("cannot pickle a raft message for %s", node.id)
            return False
        return self._outbox.push((ch, framing.HEADER.pack(len(data)) + data))

    def addNode(self, node: Node) -> None:
        if node.id == self._self_id:
            return
        self._members.add(node.id)
        self._call(self._add_link, node)

    def dropNode(self, node: Node) -> None:
        self._members.discard(node.id)
        self._call(self._drop_link, node.id)

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        for setter in (
            self.setOnMessageReceivedCallback,
            self.setOnNodeConnectedCallback,
            self.setOnNodeDisconnectedCallback,
            self.setOnReadonlyNodeConnectedCallback,
            self.setOnReadonlyNodeDisconnectedCallback,
        ):
            setter(None)
        if self._poller is not None:
            self._inbox.unsubscribe(self._poller)
        if not self._call(self._shutdown):
            self._inbox.close()  # no loop any more, so nothing posts to the pipe

    def _deliver(self, event: tuple[int, Node, bytes | None]) -> None:
        """One inbound event, on the tick thread (from the inbox's poller callback)."""
        kind, node, payload = event
        if kind == _MSG:
            # Events of a voter dropped on this thread may still be queued: skip them.
            if node.id in self._members:
                self._onMessageReceived(node, pickle.loads(payload))
        elif kind == _ROMSG:
            msg = pickle.loads(payload)
            # PySyncObj acts on a vote or an append from any node it hears, and has no
            # pre-vote; a read-only member never sends either, so they are dropped.
            if not (isinstance(msg, dict) and msg.get("type") in _VOTER_ONLY):
                self._onMessageReceived(node, msg)
        elif kind == _CONN:
            if node.id in self._members:
                self._onNodeConnected(node)
        elif kind == _DISC:
            self._onNodeDisconnected(node)
            if payload == _ENDED and self.on_peer_ended is not None:
                try:
                    self.on_peer_ended(node)
                except Exception:  # noqa: BLE001 - a failed hook must not end the tick thread
                    log.exception("handling the end of raft peer %s's channel failed", node.id)
        elif kind == _ROCONN:
            self._onReadonlyNodeConnected(node)
        elif kind == _RODISC:
            self._onReadonlyNodeDisconnected(node)

    def _call(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the loop is closed: the daemon is going away
            return False

    # ------------------------------------------------------------ loop side

    def _post(self, kind: int, node: Node, payload: bytes | None = None) -> None:
        if not self._shut:
            self._inbox.post((kind, node, payload))

    def _flush(self, items: list[tuple[Channel, bytes]]) -> None:
        """Write a burst of frames from the tick thread, one write per channel."""
        batches: dict[Channel, list[bytes]] = {}
        for ch, data in items:
            batches.setdefault(ch, []).append(data)
        now = time.monotonic()
        for ch, frames in batches.items():
            if ch.closed:
                continue  # Raft resends what a dropped channel lost
            self._write(ch, b"".join(frames) if len(frames) > 1 else frames[0], now)

    def _write(self, ch: Channel, data: bytes, now: float) -> None:
        try:
            ch.writer.write(data)
        except Exception as exc:  # noqa: BLE001 - BrokenPipeError, asyncssh errors
            self._close(ch, f"write failed: {describe(exc)}")
            return
        ch.last_tx = now
        if buffered(ch.writer) > self._max_buffer:
            # A peer that stopped reading: drop it rather than buffer without bound;
            # Raft resends from its match index once the peer is back.
            self._close(ch, f"more than {self._max_buffer} bytes wait to be sent", abort=True)

    def _start(self, nodes: list[Node]) -> None:
        if self._shut:
            return
        for node in nodes:
            self._add_link(node)
        self._housekeeper = self._loop.create_task(self._housekeeping())
        self._bound_evt.set()

    def _should_dial(self, peer: str) -> bool:
        return self._readonly or self._self_id > peer

    def _add_link(self, node: Node) -> None:
        if self._shut or node.id == self._self_id:
            return
        link = self._links.get(node.id)
        if link is None:
            link = self._links[node.id] = Link(node)
        if self._should_dial(node.id) and (link.task is None or link.task.done()):
            link.task = self._loop.create_task(self._dial_loop(link))

    def _drop_link(self, peer: str) -> None:
        link = self._links.pop(peer, None)
        if link is not None and link.task is not None:
            link.task.cancel()
        ch = self._live.get(peer)
        if ch is not None and not ch.readonly:
            self._close(ch, "removed from the cluster")

    async def _dial_loop(self, link: Link) -> None:
        peer = link.node.id
        last = float("-inf")
        while not self._shut and self._links.get(peer) is link:
            wait = last + self._retry - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            last = time.monotonic()
            try:
                reader, writer, closer = await asyncio.wait_for(self._dial(peer), self._connect_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: retry in `retry` s
                link.failures += 1
                lvl = logging.INFO if link.failures == 1 or link.failures % 60 == 0 else logging.DEBUG
                log.log(lvl, "cannot reach raft peer %s (%d tries): %s", peer, link.failures, describe(exc))
                continue
            if self._shut or self._links.get(peer) is not link:
                await release(Channel(peer, reader, writer, closer, True, 0), abort=False)
                break
            ch = Channel(peer, reader, writer, closer, True, self._max_buffer)
            ch.node = link.node
            await self._serve(ch, self._outbound(ch, link))

    async def accept(self, reader: Any, writer: Any, peer_id: str) -> None:
        """Serve one inbound ``mtgpu-raft`` channel from ``peer_id`` until it closes."""
        ch = Channel(peer_id, reader, writer, None, False, self._max_buffer)
        await self._serve(ch, self._inbound(ch))

    async def _serve(self, ch: Channel, body: Awaitable[str]) -> None:
        """Run a channel's handshake and reader as a task that a close can cancel."""
        self._channels.add(ch)
        task = ch.task = asyncio.ensure_future(body)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            self._close(ch, "transport closing")
            raise
        ended = False
        if task.cancelled():
            reason = "cancelled"
        elif (exc := task.exception()) is not None:
            reason = describe(exc)
            # The connection dropped under the channel (reset, or asyncssh's
            # ConnectionLost): the peer's process or host went away.
            ended = isinstance(exc, (OSError, asyncssh.DisconnectError))
        else:
            reason = task.result()
            ended = reason == PEER_CLOSED
        self._close(ch, reason, ended=ended)

    async def _outbound(self, ch: Channel, link: Link) -> str:
        ch.writer.write(framing.hello(self._self_id, self._readonly))
        msg = await asyncio.wait_for(ch.frames.next_control(), self._dead_after)
        if msg is None:
            return "closed during the handshake"
        if "refused" in msg:
            self._warn(f"raft peer {ch.peer} refused this member: {msg['refused']}")
            return f"refused: {msg['refused']}"
        if msg.get("welcome") != ch.peer:
            return f"answered as {msg.get('welcome')!r}, not {ch.peer!r}"
        ch.writer.write(framing.ready())
        if not self._install(ch):
            return "no longer wanted"
        link.failures = 0
        return await self._pump(ch)

    async def _inbound(self, ch: Channel) -> str:
        msg = await asyncio.wait_for(ch.frames.next_control(), self._dead_after)
        if msg is None:
            return "closed before its hello"
        why = await self._check_hello(ch, msg)
        if why:
            self._warn(f"refusing a raft channel from {ch.peer}: {why}")
            ch.writer.write(framing.refused(why))
            return f"refused: {why}"
        ch.writer.write(framing.welcome(self._self_id))
        msg = await asyncio.wait_for(ch.frames.next_control(), self._dead_after)
        if msg is None:
            return "closed during the handshake"
        if msg.get("ready") is not True:
            return "no ready after the welcome"
        if not self._install(ch):
            return "no longer wanted"
        return await self._pump(ch)

    async def _check_hello(self, ch: Channel, msg: dict[str, Any]) -> str:
        """Why a hello is refused, or "" to accept it."""
        claimed = msg.get("hello")
        if claimed != ch.peer:
            return f"the hello says {claimed!r} but the channel is authenticated as {ch.peer!r}"
        if self._readonly:
            return "a read-only member accepts no raft channels"
        if self._shut:
            return "this member is shutting down its replicated state"
        if ch.peer == self._self_id:
            return "the peer claims this member's own id"
        try:
            await asyncio.wait_for(self._bound_evt.wait(), self._dead_after)
        except TimeoutError:
            return "the replicated state is not started yet"
        link = self._links.get(ch.peer)
        if msg.get("readonly") is True:
            if link is not None:
                return f"{ch.peer} is a voter here and must not connect read-only"
            ch.readonly = True
            ch.node = Node(ch.peer)
            return ""
        if link is None:
            return f"{ch.peer} is not a voter this member knows"
        if self._should_dial(ch.peer):
            return f"{self._self_id} dials {ch.peer}, not the other way round"
        ch.node = link.node
        return ""

    def _install(self, ch: Channel) -> bool:
        """Make ``ch`` the peer's channel and report it connected."""
        if self._shut or ch.closed:
            return False
        if not ch.readonly and self._links.get(ch.peer) is None:
            return False  # dropped during the handshake
        assert ch.node is not None
        old = self._live.pop(ch.peer, None)
        if old is not None:
            # The peer redialed: disconnect the old channel first, then connect the
            # new one. The old one is no longer in _live, so its own close (maybe
            # much later) reports nothing.
            self._post(_RODISC if old.readonly else _DISC, old.node, _ENDED)
            self._close(old, "replaced by a new channel")
        ch.up = True
        ch.since = time.time()
        self._live[ch.peer] = ch
        self._post(_ROCONN if ch.readonly else _CONN, ch.node)
        log.info(
            "raft peer %s connected (%s%s)",
            ch.peer,
            "outbound" if ch.outbound else "inbound",
            ", read-only" if ch.readonly else "",
        )
        return True

    async def _pump(self, ch: Channel) -> str:
        """Hand every Raft message of an established channel to the tick thread."""
        nxt, post, node = ch.frames.next, self._post, ch.node
        kind = _ROMSG if ch.readonly else _MSG
        while not ch.closed:
            payload = await nxt()
            if payload is None:
                return PEER_CLOSED
            if payload:
                post(kind, node, payload)
        return ch.reason

    def _warn(self, text: str) -> None:
        # A refused peer redials every `retry` seconds: say so once a minute.
        now = time.monotonic()
        if now - self._warned.get(text, float("-inf")) >= 60.0:
            self._warned[text] = now
            log.warning("%s", text)
        else:
            log.debug("%s", text)

    def _close(self, ch: Channel, reason: str, abort: bool = False, ended: bool = False) -> None:
        if ch.closed:
            return
        ch.closed = True
        ch.reason = reason
        self._channels.discard(ch)
        if ch.task is not None and ch.task is not asyncio.current_task():
            ch.task.cancel()
        if self._live.get(ch.peer) is ch:
            del self._live[ch.peer]
            self._post(_RODISC if ch.readonly else _DISC, ch.node, _ENDED if ended else None)
            log.info("raft peer %s disconnected: %s", ch.peer, reason)
        else:
            log.debug("raft channel %s closed: %s", ch.peer, reason)
        self._loop.create_task(release(ch, abort))

    async def _housekeeping(self) -> None:
        """Keepalives and the dead-peer check (PySyncObj's lives inside TcpConnection)."""
        period = max(0.05, min(self._keepalive, self._dead_after) / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for ch in list(self._channels):
                if now - ch.frames.last_rx > self._dead_after:
                    what = "no data" if ch.up else "no handshake"
                    self._close(ch, f"{what} for {self._dead_after:.1f}s", abort=True)
                elif ch.up and now - ch.last_tx >= self._keepalive:
                    self._write(ch, framing.PING, now)

    def _shutdown(self) -> None:
        self._shut = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        for link in self._links.values():
            if link.task is not None:
                link.task.cancel()
        self._links.clear()
        for ch in list(self._channels):
            self._close(ch, "transport destroyed")
        self._live.clear()
        self._inbox.close()
        self._closed_evt.set()

    # ---------------------------------------------------------- for the daemon

    async def wait_closed(self) -> None:
        """Wait until :meth:`destroy` (``SyncObj.destroy``) has closed every channel."""
        await self._closed_evt.wait()

    def peers(self) -> dict[str, dict[str, Any]]:
        """Connected peers, for status output. Call on the loop."""
        return {
            p: {
                "readonly": ch.readonly,
                "direction": "outbound" if ch.outbound else "inbound",
                "since": ch.since,
                "buffered": buffered(ch.writer),
            }
            for p, ch in self._live.items()
        }
