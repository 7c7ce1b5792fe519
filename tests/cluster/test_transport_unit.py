"""The SSH Raft transport without SSH: framing, handshake and thread hand-off.

Channels here are asyncio streams over socketpairs, which offer the same calls the
transport uses on asyncssh streams (``read``, ``write``, ``close``, a write buffer). A
fake SyncObj (a real PySyncObj poller, polled by a thread of its own as the tick thread
would) records what the transport delivers, so every rule is checked in isolation;
``test_transport.py`` runs the real thing over SSH between processes.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConsumer, replicated
from pysyncobj.node import Node
from pysyncobj.poller import createPoller

from mtgpu.cluster import framing
from mtgpu.cluster.handoff import LoopOutbox, TickInbox
from mtgpu.cluster.transport import SshRaftTransport
from mtgpu.state import syncobj
from mtgpu.state.store import StateStore, make_conf

pytestmark = pytest.mark.timeout(60)


class _ChunkReader:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def read(self, n: int = -1) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_frames_split_across_reads_and_keepalives() -> None:
    stream = framing.frame(b"abc") + framing.PING + framing.frame(b"x" * 1000) + framing.hello("n1", True)
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]

    async def go() -> list[Any]:
        fr = framing.FrameReader(_ChunkReader(chunks), max_frame=4096)
        out = [await fr.next(), await fr.next(), await fr.next(), await fr.next_control()]
        out.append(await fr.next())
        return out

    a, ping, big, hello, eof = asyncio.run(go())
    assert (a, ping, big, eof) == (b"abc", b"", b"x" * 1000, None)
    assert hello["hello"] == "n1" and hello["readonly"] is True


def test_oversized_frame_and_foreign_handshake_are_errors() -> None:
    async def go(data: bytes) -> Any:
        fr = framing.FrameReader(_ChunkReader([data]), max_frame=100)
        return await fr.next_control()

    with pytest.raises(framing.FrameError):
        asyncio.run(go(struct.pack("<I", 101) + b"x" * 101))
    with pytest.raises(framing.FrameError):
        asyncio.run(go(framing.frame(b"\x80\x02}q\x00.")))  # a pickle, not a hello


def test_tick_inbox_loses_no_wakeup() -> None:
    """A lost wake-up would leave the poller asleep for its whole 10 s timeout."""
    got: list[int] = []
    inbox = TickInbox(got.append, batch=97)
    poller = createPoller("auto")
    inbox.subscribe(poller)
    n = 100_000

    def consume() -> None:
        while len(got) < n:
            poller.poll(10.0)

    th = threading.Thread(target=consume)
    th.start()
    t0 = time.monotonic()
    for i in range(n):
        inbox.post(i)
        if i % 500 == 0:
            time.sleep(0.0005)  # bursts, so the consumer keeps going back to sleep
    th.join(15)
    assert not th.is_alive() and got == list(range(n))
    assert time.monotonic() - t0 < 8
    inbox.unsubscribe(poller)
    inbox.close()


def test_loop_outbox_loses_no_wakeup() -> None:
    async def go() -> list[int]:
        got: list[int] = []
        done = asyncio.Event()
        n = 100_000
        loop = asyncio.get_running_loop()

        def drain(items: list[int]) -> None:
            got.extend(items)
            if len(got) == n:
                done.set()

        box = LoopOutbox(loop, drain)

        def produce() -> None:
            for i in range(n):
                box.push(i)
                if i % 500 == 0:
                    time.sleep(0.0005)

        th = threading.Thread(target=produce)
        th.start()
        await asyncio.wait_for(done.wait(), 10)  # the loop has nothing else to wake it
        th.join()
        return got

    assert asyncio.run(go()) == list(range(100_000))


class FakeSync:
    """What the transport needs from a SyncObj, with a thread standing in for the tick."""

    def __init__(self, self_id: str | None, others: list[str]) -> None:
        self._poller = createPoller("auto")
        self.selfNode = Node(self_id) if self_id else None
        self.otherNodes = {Node(o) for o in others}
        self.events: list[tuple[str, str, Any]] = []
        self.threads: set[str] = set()
        self.stop = False
        self.transport: SshRaftTransport | None = None
        self.tick = threading.Thread(target=self._run, daemon=True)

    def start(self, t: SshRaftTransport) -> None:
        self.transport = t
        for name in (
            "MessageReceived",
            "NodeConnected",
            "NodeDisconnected",
            "ReadonlyNodeConnected",
            "ReadonlyNodeDisconnected",
        ):
            getattr(t, f"setOn{name}Callback")(self._recorder(name))
        t.bind(self)
        self.tick.start()

    def _recorder(self, name: str) -> Any:
        def rec(node: Node, msg: Any = None) -> None:
            self.threads.add(threading.current_thread().name)
            self.events.append((name, node.id, msg))

        return rec

    def _run(self) -> None:
        assert self.transport is not None
        while not self.stop:
            self.transport.tryGetReady()
            self._poller.poll(0.05)
        self.transport.destroy()

    def kinds(self, peer: str) -> list[str]:
        return [k for k, p, _ in self.events if p == peer and k != "MessageReceived"]


class Net:
    """Dials become socketpairs whose far end is handed to the peer's ``accept``."""

    def __init__(self) -> None:
        self.t: dict[str, SshRaftTransport] = {}
        self.auth_as: dict[str, str] = {}  # dialer -> id its channel is authenticated as
        self.writers: list[asyncio.StreamWriter] = []
        self.down: set[str] = set()

    def dial_for(self, me: str) -> Any:
        async def dial(peer: str) -> tuple[Any, Any, Any]:
            if peer in self.down or me in self.down or peer not in self.t:
                raise ConnectionRefusedError(f"{peer} is down")
            a, b = socket.socketpair()
            r1, w1 = await asyncio.open_connection(sock=a)
            r2, w2 = await asyncio.open_connection(sock=b)
            self.writers += [w1, w2]
            asyncio.get_running_loop().create_task(self.t[peer].accept(r2, w2, self.auth_as.get(me, me)))
            return r1, w1, w1.close

        return dial


async def _until(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def _make(net: Net, name: str, others: list[str], readonly: bool = False, **kw: Any) -> FakeSync:
    fake = FakeSync(None if readonly else name, others)
    t = SshRaftTransport(asyncio.get_running_loop(), name, net.dial_for(name), readonly=readonly, **kw)
    net.t[name] = t
    fake.start(t)
    return fake


def _stop(*fakes: FakeSync) -> None:
    for f in fakes:
        f.stop = True
    for f in fakes:
        f.tick.join(2)


def test_handshake_messages_readonly_and_rules() -> None:
    async def go() -> None:
        net = Net()
        b = _make(net, "b", ["a"])
        a = _make(net, "a", ["b"])
        await _until(lambda: "NodeConnected" in a.kinds("b") and "NodeConnected" in b.kinds("a"))
        # b > a, so b dialed; callbacks ran on the tick threads only.
        assert net.t["b"].peers()["a"]["direction"] == "outbound"
        assert net.t["a"].peers()["b"]["direction"] == "inbound"
        assert all(th != threading.main_thread().name for th in a.threads | b.threads)
        # Messages both ways, in order, in one burst each.
        for i in range(500):
            assert net.t["a"].send(Node("b"), {"i": i})
            assert net.t["b"].send(Node("a"), {"j": i})
        await _until(
            lambda: (
                len([e for e in b.events if e[0] == "MessageReceived"]) == 500
                and len([e for e in a.events if e[0] == "MessageReceived"]) == 500
            )
        )
        assert [e[2]["i"] for e in b.events if e[0] == "MessageReceived"] == list(range(500))
        assert not net.t["a"].send(Node("zz"), {"x": 1})  # unknown peer: False at once
        # A read-only member dials the voter, which reports it read-only.
        r = _make(net, "r", ["a"], readonly=True)
        await _until(lambda: "ReadonlyNodeConnected" in a.kinds("r") and "NodeConnected" in r.kinds("a"))
        assert net.t["r"].send(Node("a"), {"from": "r"})
        await _until(lambda: ("MessageReceived", "r", {"from": "r"}) in a.events)
        # A hello that is not the authenticated id is refused, and so is a voter that
        # dials the wrong way or is unknown.
        refused = []
        for peer, auth, ro in (("a", "b", False), ("b", "a", False), ("a", "q", False), ("r", "a", False)):
            sa, sb = socket.socketpair()
            r1, w1 = await asyncio.open_connection(sock=sa)
            r2, w2 = await asyncio.open_connection(sock=sb)
            serve = asyncio.ensure_future(net.t[peer].accept(r2, w2, auth))
            w1.write(framing.hello("r" if peer == "a" and auth == "b" else auth, ro))
            msg = await framing.FrameReader(r1, 4096).next_control()
            refused.append(msg.get("refused", ""))
            await asyncio.wait_for(serve, 5)
            w1.close()
        assert "authenticated as 'b'" in refused[0]
        assert "dials" in refused[1]
        assert "not a voter" in refused[2]
        assert "read-only member accepts no" in refused[3]
        # The real b was not disturbed by the impostor.
        assert a.kinds("b") == ["NodeConnected"]
        _stop(a, b, r)
        await asyncio.sleep(0.1)

    asyncio.run(go())


def test_redial_replaces_and_dead_peer_and_buffer_cap() -> None:
    async def go() -> None:
        net = Net()
        a = _make(net, "a", ["b"], keepalive=0.2, dead_after=0.6)
        b = _make(net, "b", ["a"], keepalive=0.2, dead_after=0.6)
        await _until(lambda: a.kinds("b") == ["NodeConnected"])
        # b redials while a still holds the old channel: disc(old) then conn(new),
        # and the old channel's late end reports nothing more.
        old = net.t["a"]._live["b"]
        net.down.add("b")  # the real b cannot redial while the fake one is tested
        sa, sb = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=sa)
        r2, w2 = await asyncio.open_connection(sock=sb)
        serve = asyncio.ensure_future(net.t["a"].accept(r2, w2, "b"))
        w1.write(framing.hello("b", False))
        assert (await framing.FrameReader(r1, 4096).next_control())["welcome"] == "a"
        w1.write(framing.ready())
        await _until(lambda: a.kinds("b") == ["NodeConnected", "NodeDisconnected", "NodeConnected"])
        assert old.closed and net.t["a"]._live["b"] is not old
        await asyncio.sleep(0.2)
        assert a.kinds("b") == ["NodeConnected", "NodeDisconnected", "NodeConnected"]
        # The new channel never sends a keepalive: a drops it as dead.
        t0 = time.monotonic()
        await _until(lambda: a.kinds("b")[-1] == "NodeDisconnected", 3)
        dead = time.monotonic() - t0
        assert 0.3 < dead < 2.0
        await asyncio.wait_for(serve, 2)
        w1.close()
        net.down.discard("b")
        # b redials by itself within ~1 s and the pair is whole again.
        await _until(lambda: a.kinds("b")[-1] == "NodeConnected", 5)
        # A peer that stops reading: the send buffer cap drops the channel.
        c = _make(net, "c", ["a"], max_buffer=256 << 10)
        net.t["a"].addNode(Node("c"))
        await _until(lambda: "NodeConnected" in c.kinds("a"))
        net.t["a"]._live["c"].reader._transport.pause_reading()  # a stops reading c
        blob = b"x" * 65536
        for _ in range(200):
            net.t["c"].send(Node("a"), blob)
            await asyncio.sleep(0)
        await _until(lambda: "NodeDisconnected" in c.kinds("a"), 3)
        # dropNode: the channel goes, no redial, and a refuses c from now on.
        net.t["a"].dropNode(Node("c"))
        await _until(lambda: "c" not in net.t["a"].peers())
        await asyncio.sleep(1.5)
        assert "c" not in net.t["a"].peers()
        _stop(a, b, c)
        await asyncio.sleep(0.1)

    asyncio.run(go())


class Counter(SyncObjConsumer):
    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, int] = {}

    @replicated
    def put(self, k: str, v: int) -> int:
        self.items[k] = v
        return len(self.items)


def test_pysyncobj_in_process_sync_and_async_writes(tmp_path: Any) -> None:
    """Three real SyncObjs: sequential writes stall at once if a wake-up is lost."""

    async def go() -> None:
        net = Net()
        loop = asyncio.get_running_loop()
        names = ["n1", "n2", "n3"]
        objs, cons = {}, {}
        for n in names:
            t = SshRaftTransport(loop, n, net.dial_for(n))
            net.t[n] = t
            cons[n] = Counter()
            conf = make_conf(str(tmp_path / n))
            if n == "n2":  # both ways of attaching
                objs[n] = SyncObj(
                    Node(n),
                    [Node(p) for p in names if p != n],
                    conf=conf,
                    consumers=[cons[n]],
                    nodeClass=Node,
                    transportClass=t.attach,
                )
            else:
                objs[n] = SyncObj(
                    Node(n),
                    [Node(p) for p in names if p != n],
                    conf=conf,
                    consumers=[cons[n]],
                    nodeClass=Node,
                    transport=t,
                )
                t.bind(objs[n])
        await _until(lambda: any(o._isLeader() for o in objs.values()), 10)
        leader = next(n for n, o in objs.items() if o._isLeader())
        follower = next(n for n in names if n != leader)

        async def put(n: str, k: str, v: int) -> int:
            fut = loop.create_future()
            cons[n].put(
                k,
                v,
                callback=lambda r, e: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result((r, e))),
            )
            r, e = await asyncio.wait_for(fut, 5)
            assert e == 0, e
            return r

        t0 = time.monotonic()
        for i in range(200):
            await put(leader, f"s{i}", i)
        for i in range(100):
            await put(follower, f"f{i}", i)
        seq = time.monotonic() - t0
        t0 = time.monotonic()
        await asyncio.gather(*(put(leader, f"a{i}", i) for i in range(2000)))
        burst = time.monotonic() - t0
        await _until(lambda: all(len(c.items) == 2300 for c in cons.values()), 10)
        assert cons["n1"].items == cons["n2"].items == cons["n3"].items
        print(f"\nin-process: 300 sequential commits in {seq:.2f}s, 2000 async in {burst:.2f}s")
        for o in objs.values():
            o.destroy()
        await asyncio.sleep(0.3)

    asyncio.run(go())


def test_dynamic_membership_add_and_remove(tmp_path: Any) -> None:
    """addNodeToCluster/removeNodeFromCluster: the transport follows, the tick never waits."""

    async def go() -> None:
        net = Net()
        loop = asyncio.get_running_loop()
        objs: dict[str, SyncObj] = {}
        cons: dict[str, Counter] = {}

        def member(n: str, peers: list[str]) -> None:
            t = SshRaftTransport(loop, n, net.dial_for(n))
            net.t[n] = t
            cons[n] = Counter()
            objs[n] = SyncObj(
                Node(n),
                [Node(p) for p in peers],
                conf=make_conf(str(tmp_path / n)),
                consumers=[cons[n]],
                nodeClass=Node,
                transport=t,
            )
            t.bind(objs[n])

        async def done(call: Any, *args: Any) -> int:
            fut = loop.create_future()
            call(
                *args,
                callback=lambda r, e: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(e)),
            )
            return await asyncio.wait_for(fut, 10)

        for n in ("n1", "n2", "n3"):
            member(n, [p for p in ("n1", "n2", "n3") if p != n])
        await _until(lambda: any(o._isLeader() for o in objs.values()), 10)
        leader = next(n for n, o in objs.items() if o._isLeader())
        for i in range(50):
            assert await done(cons[leader].put, f"k{i}", i) == 0
        # n4 dials everyone (highest id) and is refused until the change reaches them.
        member("n4", ["n1", "n2", "n3"])
        assert await done(objs[leader].addNodeToCluster, "n4") == 0
        await _until(lambda: len(cons["n4"].items) == 50, 10)
        await _until(
            lambda: all(
                sorted(net.t[n].peers()) == sorted({"n1", "n2", "n3", "n4"} - {n})
                for n in ("n1", "n2", "n3", "n4")
            ),
            10,
        )
        assert await done(cons[leader].put, "with-n4", 1) == 0
        await _until(lambda: "with-n4" in cons["n4"].items)
        assert await done(objs[leader].removeNodeFromCluster, "n4") == 0
        await _until(lambda: all("n4" not in net.t[n].peers() for n in ("n1", "n2", "n3")), 10)
        assert await done(cons[leader].put, "without-n4", 1) == 0
        await asyncio.sleep(1.5)  # n4 keeps dialing; it is refused and learns nothing more
        assert "without-n4" not in cons["n4"].items and not net.t["n4"].peers()
        for o in objs.values():
            o.destroy()
        await asyncio.sleep(0.3)

    asyncio.run(go())


def test_peer_ended_is_reported_only_when_the_peer_ended_its_channel() -> None:
    """``on_peer_ended`` fires on the tick thread when the peer's end went (its process
    ended, or it redialed after a restart), and never for a channel this member closed
    itself, so a leader that drops a silent channel does not call elections."""

    async def go() -> None:
        net = Net()
        a = _make(net, "a", ["b"], keepalive=0.2, dead_after=0.6)
        b = _make(net, "b", ["a"], keepalive=0.2, dead_after=0.6)
        ended: list[tuple[str, str, list[str]]] = []
        net.t["a"].on_peer_ended = lambda n: ended.append(
            (n.id, threading.current_thread().name, a.kinds("b"))
        )
        await _until(lambda: a.kinds("b") == ["NodeConnected"])
        # b "restarts": a new channel authenticated as b replaces the old one.
        net.down.add("b")
        sa, sb = socket.socketpair()
        r1, w1 = await asyncio.open_connection(sock=sa)
        r2, w2 = await asyncio.open_connection(sock=sb)
        serve = asyncio.ensure_future(net.t["a"].accept(r2, w2, "b"))
        w1.write(framing.hello("b", False))
        assert (await framing.FrameReader(r1, 4096).next_control())["welcome"] == "a"
        w1.write(framing.ready())
        await _until(lambda: len(ended) == 1)
        peer, thread, kinds_then = ended[0]
        assert peer == "b" and thread != threading.main_thread().name
        assert kinds_then == ["NodeConnected", "NodeDisconnected"]  # after the disconnect
        # The new channel stays silent: a drops it as dead, which a did, not b.
        await _until(lambda: a.kinds("b")[-1] == "NodeDisconnected", 3)
        await asyncio.wait_for(serve, 2)
        w1.close()
        await asyncio.sleep(0.2)
        assert len(ended) == 1
        # b comes back, then its transport ends (as a killed process's would).
        net.down.discard("b")
        await _until(lambda: a.kinds("b")[-1] == "NodeConnected", 5)
        _stop(b)
        await _until(lambda: len(ended) == 2)
        assert ended[1][0] == "b"
        # A read-only member going away is not a voter ending: nothing is reported.
        r = _make(net, "r", ["a"], readonly=True)
        await _until(lambda: "ReadonlyNodeConnected" in a.kinds("r"))
        _stop(r)
        await _until(lambda: a.kinds("r")[-1] == "ReadonlyNodeDisconnected")
        await asyncio.sleep(0.1)
        assert len(ended) == 2
        # A failing hook is logged; the tick thread goes on delivering.
        net.t["a"].on_peer_ended = lambda n: 1 / 0
        c = _make(net, "c", ["a"])
        net.t["a"].addNode(Node("c"))
        await _until(lambda: "NodeConnected" in a.kinds("c"))
        _stop(c)
        await _until(lambda: a.kinds("c")[-1] == "NodeDisconnected")
        assert a.tick.is_alive()
        _stop(a)
        await asyncio.sleep(0.1)

    asyncio.run(go())


def test_survivors_stand_in_the_order_of_succession(tmp_path: Any) -> None:
    """Five real stores over the transport, elections slowed to a minute: a follower
    that ends moves no one's election; when the leader ends, the first survivor in the
    order stands at once and wins in one term, and a survivor the order leaves out
    ranks after those it names."""

    async def go() -> None:
        net = Net()
        loop = asyncio.get_running_loop()
        names = ["n1", "n2", "n3", "n4", "n5"]
        stores: dict[str, StateStore] = {}
        for n in names:
            t = SshRaftTransport(loop, n, net.dial_for(n))
            net.t[n] = t
            stores[n] = StateStore(
                n,
                [Counter()],
                str(tmp_path / n),
                peers=[p for p in names if p != n],
                transport_factory=t.attach,
                fsync=False,
            )
        await _until(lambda: any(syncobj.is_leader(s.sync) for s in stores.values()), 15)
        old = next(n for n, s in stores.items() if syncobj.is_leader(s.sync))
        survivors = [n for n in names if n != old]
        # The order names all but the survivor last by name, which still ranks last.
        left_out = max(survivors)
        order = [n for n in reversed(names) if n != left_out]
        for n in names:
            stores[n].expedite_elections(net.t[n], lambda: order, step=1.0)
        for n in survivors:
            conf = syncobj.conf(stores[n].sync)
            conf.raftMinTimeout, conf.raftMaxTimeout = 60.0, 61.0
            syncobj.set_election_deadline(stores[n].sync, time.monotonic() + 60.0)
        term = stores[old].sync.raftCurrentTerm
        expected = [n for n in order if n in survivors] + [left_out]
        # A follower ending first: no survivor moves its election.
        quitter = expected[1]
        before = {n: syncobj.election_deadline(stores[n].sync) for n in survivors if n != quitter}
        stores[quitter].close()
        await _until(lambda: quitter not in net.t[old].peers())
        await asyncio.sleep(0.3)
        for n, when in before.items():
            assert syncobj.election_deadline(stores[n].sync) >= when - 0.01, n
        # The leader ends: the first standing survivor wins at once, in one term.
        t0 = time.monotonic()
        stores[old].close()
        alive = [n for n in survivors if n != quitter]
        await _until(lambda: any(syncobj.is_leader(stores[n].sync) for n in alive), 10)
        took = time.monotonic() - t0
        new = next(n for n in alive if syncobj.is_leader(stores[n].sync))
        assert new == expected[0], (new, expected)
        assert stores[new].sync.raftCurrentTerm == term + 1
        assert took < 30  # far below the minute the timeouts were set to
        for n in alive:
            stores[n].close()
        await asyncio.sleep(0.3)

    asyncio.run(go())
