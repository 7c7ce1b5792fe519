"""Test-only Raft cluster: each member a separate process with its own asyncssh server.

Run as a script, this file is one member: an asyncssh server on 127.0.0.1 that routes
the ``mtgpu-raft`` subsystem to :meth:`SshRaftTransport.accept`, a ``dial`` built on
``asyncssh.connect`` + ``create_process(subsystem="mtgpu-raft", encoding=None)``, and a
replicated dict. Voters use ``StateStore(..., transport_factory=t.attach)`` as the
daemon will; read-only members use ``SyncObj(None, voters, transport=t)`` + ``bind``.

Authentication here is test-only: one client key shared by every member, the user
name taken as the member id, pinned host keys. The real cluster authenticates peers
with cluster certificates.

Imported, it offers :class:`Cluster`, which starts members, talks to them with JSON
lines over their stdin/stdout, and kills them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RAFT = "mtgpu-raft"
log = logging.getLogger("raft_harness")

# --------------------------------------------------------------------- member process


def _member_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--voters", required=True)
    ap.add_argument("--readonly", action="store_true")
    ap.add_argument("--conf", default="{}")
    ap.add_argument("--tcp", action="store_true", help="PySyncObj's own TCP transport, for comparison")
    args = ap.parse_args(argv)
    logging.basicConfig(
        filename=str(Path(args.dir) / f"{args.name}.log"),
        level=logging.INFO,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(_Member(args).run())


class _Member:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name
        self.dir = Path(args.dir)
        self.voters = args.voters.split(",")
        self.readonly = args.readonly
        self.conf = json.loads(args.conf)
        # Test knobs, not SyncObjConf options: see _faults().
        self.faults = {k: self.conf.pop(k) for k in ("sync_delay", "mutant") if k in self.conf}
        self.audit: dict[str, Any] = {"commits": 0, "off_thread": 0, "unsynced": [], "fsynced": 0}
        self.tcp = args.tcp
        self.partitioned = False
        self.conns: set[Any] = set()
        self.stream_task: asyncio.Task[None] | None = None
        self.ack_fd = os.open(self.dir / f"{self.name}.acked", os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    async def run(self) -> None:
        import asyncssh
        from pysyncobj import SyncObj, SyncObjConsumer, replicated
        from pysyncobj.node import Node

        from mtgpu.cluster.transport import SshRaftTransport
        from mtgpu.state.store import StateStore, make_conf

        class KV(SyncObjConsumer):
            def __init__(self) -> None:
                super().__init__()
                self.data: dict[str, int] = {}
                self.puts = 0  # entries applied: more than len(data) if one applied twice

            @replicated
            def put(self, k: str, v: int) -> int:
                self.data[k] = v
                self.puts += 1
                return len(self.data)

        self.asyncssh = asyncssh
        keys = self.dir / "keys"
        self.ckey = asyncssh.read_private_key(keys / "client")
        self.cpub = self.ckey.convert_to_public().public_data
        self.hostpub = {p.stem[5:]: asyncssh.read_public_key(p) for p in keys.glob("host-*.pub")}
        self.ports = json.loads((self.dir / "ports.json").read_text())
        member = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: Any) -> None:
                self.conn = conn
                member.conns.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                member.conns.discard(self.conn)

            def begin_auth(self, username: str) -> bool:
                return True

            def public_key_auth_supported(self) -> bool:
                return True

            def validate_public_key(self, username: str, key: Any) -> bool:
                return key.public_data == member.cpub

        await asyncssh.create_server(
            Server,
            "127.0.0.1",
            self.ports[self.name],
            reuse_address=True,
            server_host_keys=[asyncssh.read_private_key(keys / f"host-{self.name}")],
            process_factory=self.handle,
            encoding=None,
            line_editor=False,
        )
        loop = asyncio.get_running_loop()
        self.kv = KV()
        self.transport = SshRaftTransport(loop, self.name, self.dial, readonly=self.readonly)
        sdir = str(self.dir / f"state-{self.name}")
        if self.tcp:
            # Benchmark baseline: same members and journal, stock TCPTransport.
            from pysyncobj.node import TCPNode

            addr = {v: f"127.0.0.1:{self.ports[v + '.raft']}" for v in self.voters}
            self.names = {a: v for v, a in addr.items()}
            self.store = None
            self.sync = SyncObj(
                TCPNode(addr[self.name]),
                [TCPNode(addr[v]) for v in self.voters if v != self.name],
                conf=make_conf(sdir, **self.conf),
                consumers=[self.kv],
            )
        elif self.readonly:
            self.store = None
            self.sync = SyncObj(
                None,
                [Node(v) for v in self.voters],
                conf=make_conf(sdir, **self.conf),
                consumers=[self.kv],
                nodeClass=Node,
                transport=self.transport,
            )
            self.transport.bind(self.sync)
        else:
            self.store = StateStore(
                self.name,
                [self.kv],
                sdir,
                peers=[v for v in self.voters if v != self.name],
                transport_factory=self.transport.attach,
                **self.conf,
            )
            self.sync = self.store.sync
            self._faults()
            # As the daemon does, with the voters' order as given and a step long
            # enough that a slow test host does not split the votes.
            self.store.expedite_elections(self.transport, lambda: list(self.voters), step=2.0)
        await self.serve_commands()

    #: Mutants of the journal's durability, for checking that the power cut tests
    #: (tests/cluster/test_durability.py) catch them: a follower acknowledging entries
    #: before its fsync; a follower whose fsync does nothing; a leader that counts its
    #: own entry towards a commit without it being on disk (its fsync does nothing).
    MUTANTS = ("ack_before_fsync", "follower_fsync_noop", "leader_unsynced")

    def _faults(self) -> None:
        """Watch (and, for tests, slow or break) a voter's journal syncs.

        Always: every time this member, as leader, moves its commit index, the index
        is checked against the last entry its journal had when it was last fsynced
        (``cmd_audit``): PySyncObj's leader counts its own copy towards a commit
        unconditionally, so it must be on disk by then. ``sync_delay`` (seconds)
        makes every sync that has something to write wait first, as a slow disk
        would; ``mutant`` applies one of :data:`MUTANTS`.
        """
        from mtgpu.state import durable, syncobj

        sync, audit = self.sync, self.audit
        journal = syncobj.raft_log(sync)
        delay = float(self.faults.get("sync_delay", 0.0))
        mutant = self.faults.get("mutant")
        if mutant is not None and mutant not in self.MUTANTS:
            raise ValueError(f"unknown mutant {mutant!r}; one of {', '.join(self.MUTANTS)}")
        if mutant == "ack_before_fsync":
            durable.UNHELD = frozenset({"append_entries", "next_node_idx"})
        upto = [0]  # the last index the journal held when it was last fsynced
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if fd != journal._fd:
                real_fsync(fd)
                return
            leading = syncobj.is_leader(sync)
            if (mutant == "follower_fsync_noop" and not leading) or (mutant == "leader_unsynced" and leading):
                return
            last = journal[-1][1] if len(journal) else 0
            real_fsync(fd)
            upto[0] = last
            audit["fsynced"] += 1

        os.fsync = fsync  # this process is a test member: nothing else shares it
        real_sync = journal.sync

        def slow_sync() -> bool:
            if delay and journal.needs_sync:
                time.sleep(delay)
            return bool(real_sync())

        journal.sync = slow_sync
        real_commit = journal.setRaftCommitIndex

        def set_commit(index: int) -> None:
            if syncobj.is_leader(sync):
                audit["commits"] += 1
                if threading.current_thread() is not syncobj.tick_thread(sync):
                    audit["off_thread"] += 1
                if index > upto[0] and len(audit["unsynced"]) < 20:
                    audit["unsynced"].append([index, upto[0]])
            real_commit(index)

        journal.setRaftCommitIndex = set_commit

    async def cmd_audit(self) -> dict[str, Any]:
        """What :meth:`_faults` saw: commits this member made as leader, those made
        off the tick thread, and (index, last fsynced index) of any made before the
        entry was fsynced."""
        return dict(self.audit)

    async def handle(self, process: Any) -> None:
        if process.subsystem != RAFT or self.partitioned:
            process.exit(1)
            return
        await self.transport.accept(process.stdin, process.stdout, process.get_extra_info("username"))
        try:
            process.exit(0)
        except Exception as exc:  # noqa: BLE001 - the channel may already be gone
            log.debug("exit of a raft session: %s", exc)

    async def dial(self, peer: str) -> tuple[Any, Any, Any]:
        if self.partitioned:
            raise OSError("partitioned by the test")
        conn = await self.asyncssh.connect(
            "127.0.0.1",
            self.ports[peer],
            username=self.name,
            client_keys=[self.ckey],
            known_hosts=([self.hostpub[peer]], [], []),
            agent_path=None,
            config=[],
        )
        try:
            proc = await conn.create_process(subsystem=RAFT, encoding=None)
        except BaseException:
            conn.close()
            raise
        self.conns.add(conn)

        def closer() -> None:
            self.conns.discard(conn)
            conn.close()

        return proc.stdout, proc.stdin, closer

    # ------------------------------------------------------------ commands

    async def serve_commands(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 26)  # key lists are long lines
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        self.reply({"ready": self.name, "pid": os.getpid()})
        while True:
            line = await reader.readline()
            if not line:
                os._exit(0)
            req = json.loads(line)
            try:
                res = await getattr(self, "cmd_" + req["cmd"])(**req.get("args", {}))
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                log.exception("command %s", req)
                res = {"error": f"{type(exc).__name__}: {exc}"}
            self.reply({"id": req["id"], **res})

    def reply(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def cmd_status(self) -> dict[str, Any]:
        for _ in range(20):
            try:
                st = self.sync.getStatus()
                break
            except RuntimeError:  # a set changed under us on the tick thread
                await asyncio.sleep(0.001)
        data = dict(self.kv.data)
        peers = self.transport.peers()
        digest = hashlib.sha256(json.dumps(sorted(data.items())).encode()).hexdigest()[:16]
        leader = getattr(st.get("leader"), "id", None)
        if self.tcp:
            leader = self.names.get(leader)
            peers = {
                self.names[k.rsplit("_", 1)[1]]: {"since": 0}
                for k, v in st.items()
                if k.startswith("partner_node_status_server_") and v == 2
            }
        return {
            "leader": leader,
            "term": st["raft_term"],
            "state": st["state"],
            "commit": st["commit_idx"],
            "applied": st["last_applied"],
            "n": len(data),
            "puts": self.kv.puts,
            "digest": digest,
            "peers": sorted(peers),
            "since": {p: v["since"] for p, v in peers.items()},
        }

    async def cmd_write(self, prefix: str, n: int, wait: float = 10.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        res: dict[str, Any] = {"ok": 0, "fail": {}, "pending": n}

        def finished(k: str, err: int) -> None:
            res["pending"] -= 1
            if err == 0:
                res["ok"] += 1
            else:
                res["fail"][str(err)] = res["fail"].get(str(err), 0) + 1
            if res["pending"] == 0 and not done.done():
                done.set_result(None)

        t0 = time.monotonic()
        for i in range(n):
            k = f"{prefix}{i}"
            self.kv.put(k, i, callback=self._acker(loop, k, finished))
        try:
            await asyncio.wait_for(asyncio.shield(done), wait)
        except TimeoutError:
            pass
        res["secs"] = time.monotonic() - t0
        return res

    async def cmd_seq(self, prefix: str, n: int) -> dict[str, Any]:
        """``n`` writes one after the other, each awaited: commit latency."""
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        for i in range(n):
            fut: asyncio.Future[int] = loop.create_future()
            self.kv.put(
                f"{prefix}{i}",
                i,
                callback=lambda r, e, f=fut: loop.call_soon_threadsafe(lambda: f.done() or f.set_result(e)),
            )
            err = await asyncio.wait_for(fut, 10)
            if err != 0:
                return {"ok": i, "error_code": err, "secs": time.monotonic() - t0}
        return {"ok": n, "secs": time.monotonic() - t0}

    def _acker(self, loop: asyncio.AbstractEventLoop, k: str, finished: Any) -> Any:
        def cb(result: Any, err: int) -> None:
            if err == 0:  # logged on the tick thread before anyone can see the ack
                os.write(self.ack_fd, (k + "\n").encode())
            loop.call_soon_threadsafe(finished, k, err)

        return cb

    async def cmd_stream(self, prefix: str, batch: int = 50) -> dict[str, Any]:
        """Write continuously (``batch`` in flight) until stopped or killed."""

        async def run() -> None:
            i = 0
            while True:
                await self.cmd_write(f"{prefix}{i}.", batch, wait=2.0)
                i += 1

        self.stream_task = asyncio.get_running_loop().create_task(run())
        return {}

    async def cmd_missing(self, keys: list[str]) -> dict[str, Any]:
        data = dict(self.kv.data)
        miss = [k for k in keys if k not in data]
        return {"missing": len(miss), "sample": miss[:5], "n": len(data)}

    async def cmd_has(self, key: str) -> dict[str, Any]:
        return {"has": key in dict(self.kv.data)}

    async def cmd_partition(self, on: bool) -> dict[str, Any]:
        self.partitioned = on
        if on:
            for conn in list(self.conns):
                conn.close()
            self.conns.clear()
        return {}

    async def cmd_election_timeout(self, low: float, high: float) -> dict[str, Any]:
        """Elections after ``low``-``high`` s without a leader from now on (this
        member's next one too)."""
        import random

        from mtgpu.state import syncobj

        conf = syncobj.conf(self.sync)
        conf.raftMinTimeout, conf.raftMaxTimeout = low, high
        syncobj.set_election_deadline(self.sync, time.monotonic() + random.uniform(low, high))
        return {}

    async def cmd_destroy(self) -> dict[str, Any]:
        """A clean stop: SyncObj.destroy() (journal closed), then exit."""
        if self.store is not None:
            self.store.close()
        else:
            self.sync.destroy_synchronous()
        asyncio.get_running_loop().call_later(0.05, os._exit, 0)
        return {"destroyed": self.name}


# --------------------------------------------------------------------- test side


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_keys(keys: Path, names: list[str]) -> None:
    import asyncssh

    keys.mkdir(parents=True, exist_ok=True)
    for name in ["client"] + [f"host-{n}" for n in names]:
        k = asyncssh.generate_private_key("ssh-ed25519")
        k.write_private_key(keys / name)
        k.write_public_key(keys / f"{name}.pub")


class MemberProc:
    """One member process and the JSON-lines conversation with it."""

    def __init__(self, cluster: Cluster, name: str, readonly: bool) -> None:
        self.name = name
        self.readonly = readonly
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seq = 0
        cmd = [
            sys.executable,
            __file__,
            "--name",
            name,
            "--dir",
            str(cluster.root),
            "--voters",
            ",".join(cluster.voters),
            "--conf",
            json.dumps(cluster.conf),
        ]
        if readonly:
            cmd.append("--readonly")
        if cluster.tcp:
            cmd.append("--tcp")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.started = time.monotonic()
        with open(cluster.root / f"{name}.stderr", "ab") as err:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                pass

    def wait_ready(self, timeout: float = 20.0) -> None:
        msg = self.lines.get(timeout=timeout)
        assert "ready" in msg, msg

    def call(self, cmd: str, timeout: float = 20.0, **args: Any) -> dict[str, Any]:
        self.seq += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"id": self.seq, "cmd": cmd, "args": args}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            msg = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg.get("id") == self.seq:
                if "error" in msg:
                    raise RuntimeError(f"{self.name}: {msg['error']}")
                return msg

    def alive(self) -> bool:
        return self.proc.poll() is None


class Cluster:
    """Members n1..nK (voters) and read-only members, as processes under ``root``."""

    def __init__(
        self, root: Path, voters: list[str], readonly: list[str] = (), tcp: bool = False, **conf: Any
    ) -> None:
        self.root = root
        self.voters = list(voters)
        self.tcp = tcp
        self.conf = conf
        names = self.voters + list(readonly)
        make_keys(root / "keys", names)
        self.ports = {n: free_port() for n in names + [v + ".raft" for v in self.voters]}
        (root / "ports.json").write_text(json.dumps(self.ports))
        self.procs: dict[str, MemberProc] = {}

    def start(self, *names: str, readonly: bool = False, stagger: float = 0.0) -> None:
        for i, n in enumerate(names):
            if i and stagger:
                time.sleep(stagger)
            self.procs[n] = MemberProc(self, n, readonly)
        for n in names:
            self.procs[n].wait_ready()

    def live(self, voters_only: bool = True) -> list[str]:
        return [n for n, p in self.procs.items() if p.alive() and (not voters_only or not p.readonly)]

    def call(self, name: str, cmd: str, **kw: Any) -> dict[str, Any]:
        return self.procs[name].call(cmd, **kw)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name].proc
        os.kill(p.pid, sig)
        if sig == signal.SIGKILL:
            p.wait(10)

    def leader(
        self, among: list[str] | None = None, timeout: float = 15.0, exclude: str | None = None
    ) -> str:
        """The leader that every member in ``among`` agrees on and that leads."""
        among = among or self.live()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = {n: self.call(n, "status") for n in among}
            ids = {s["leader"] for s in sts.values()}
            if len(ids) == 1:
                lid = ids.pop()
                if lid and lid != exclude and lid in sts and sts[lid]["state"] == 2:
                    return lid
            time.sleep(0.02)
        raise AssertionError(f"no agreed leader among {among}: {sts}")

    def converge(self, names: list[str] | None = None, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until ``names`` hold the same data; return one status."""
        names = names or self.live(voters_only=False)
        deadline = time.monotonic() + timeout
        while True:
            sts = {n: self.call(n, "status") for n in names}
            if len({(s["digest"], s["n"]) for s in sts.values()}) == 1:
                return sts[names[0]]
            if time.monotonic() > deadline:
                raise AssertionError(f"members did not converge: {sts}")
            time.sleep(0.05)

    def acked(self) -> list[str]:
        keys: list[str] = []
        for f in sorted(self.root.glob("*.acked")):
            keys += f.read_text().split()
        return keys

    def close(self) -> None:
        for p in self.procs.values():
            if p.alive():
                try:
                    os.kill(p.proc.pid, signal.SIGCONT)
                    p.proc.kill()
                except ProcessLookupError:
                    pass
                p.proc.wait(10)


if __name__ == "__main__":
    _member_main(sys.argv[1:])
