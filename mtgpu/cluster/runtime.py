"""A member's cluster side: discovery, the replicated store over SSH, peer operations,
leadership (the scheduler runs on the Raft leader), usage reports and forwarding.

The daemon calls :meth:`ClusterRuntime.open_store` instead of building a cluster of
one, then :meth:`start` once its own parts exist.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.cluster.coordinator import Coordinator, LocalView, discover
from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.cluster.members import Members, capability_score
from mtgpu.cluster.peers import PeerClient
from mtgpu.cluster.transport import SshRaftTransport
from mtgpu.config import Options
from mtgpu.errors import ApiError
from mtgpu.gpuinfo.types import NodeInventory
from mtgpu.state.store import StateStore

log = logging.getLogger("mtgpu.cluster")


def advertised_address(options: Options) -> str:
    """The HOST:PORT other members reach this one at."""
    host, port = options.ssh_listen
    if options.cluster_advertise:
        return options.cluster_advertise
    if host not in ("0.0.0.0", "::", ""):
        return f"{host}:{port}"
    import socket

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return f"{a.address}:{port}"
    return f"127.0.0.1:{port}"


class ClusterRuntime:
    """Everything a member does because it is in a cluster."""

    def __init__(self, options: Options, identity: ClusterIdentity, dispatcher: Dispatcher,
                 inventory: Callable[[], NodeInventory | None]) -> None:
        self.options = options
        self.name = options.server_name
        self.identity = identity
        self.dispatcher = dispatcher
        self.inventory = inventory
        self.members = Members()
        self.address = advertised_address(options)
        self.addresses: dict[str, str] = {}
        self.peers = PeerClient(identity, self.name, options.state_dir, self.addresses.get)
        self.view = LocalView(options.state_dir)
        self.role = "voter"
        self.transport: SshRaftTransport | None = None
        self.store: StateStore | None = None
        self.coordinator: Coordinator | None = None
        self.on_leader: Callable[[bool], Awaitable[None]] | None = None
        self.on_report: Callable[[NodeInventory], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._was_leader = False

    # -------------------------------------------------------------- startup

    def score(self) -> float:
        inv = self.inventory()
        return capability_score(inv) if inv is not None else 0.0

    async def open_store(self, consumers: list[Any]) -> StateStore:
        """Discover or reload the cluster, then start the replicated store over SSH."""
        o = self.options
        view = self.view.load()
        if view is not None and view.get("cluster_id") not in (None, o.cluster_id):
            raise ApiError(f"STATE_DIR belongs to cluster {view['cluster_id']!r}, not "
                           f"{o.cluster_id!r}; use another STATE_DIR", "wrong_cluster")
        for name, addr in (view or {}).get("addresses", {}).items():
            self.addresses.setdefault(name, addr)
        if view is None:
            me = {"name": self.name, "address": self.address, "score": self.score(),
                  "cluster_id": o.cluster_id}
            found = await discover(self.peers, list(o.cluster_peers), me)
            if found.get("found"):
                role, voters = "voter", [self.name]
                log.info("founding cluster %s", o.cluster_id)
            else:
                role, voters = found["role"], found["voters"]
                self.addresses.update(found.get("addresses", {}))
                log.info("joining cluster %s as a %s member", o.cluster_id, role)
            self._save(role, voters)
        else:
            role, voters = view["role"], view["voters"]
        self.role = role
        loop = asyncio.get_running_loop()
        self.transport = SshRaftTransport(loop, self.name, self._dial, readonly=role == "readonly")
        peers = [v for v in voters if v != self.name]
        self.store = StateStore(self.name if role == "voter" else None, [*consumers, self.members],
                                o.state_dir, peers=peers, transport_factory=self.transport.attach)
        return self.store

    def _save(self, role: str, voters: list[str]) -> None:
        import json

        self.view.save(role, voters, self.options.cluster_id)
        data = json.loads(self.view.path.read_text())
        data["addresses"] = {**self.addresses, self.name: self.address}
        self.view.path.write_text(json.dumps(data))

    async def _dial(self, node: str) -> tuple[Any, Any, Callable[[], None]]:
        return await self.peers.open_raft(node)

    async def start(self, replicate: Callable[..., Awaitable[Any]]) -> None:
        assert self.store is not None
        self.replicate = replicate
        self.coordinator = Coordinator(self.name, self.store.sync, self.members, replicate, self.score)
        self._register()
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._watch()), loop.create_task(self._report_loop())]
        self.coordinator.start()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.coordinator is not None:
            await self.coordinator.stop()
        self.peers.close()

    # ----------------------------------------------------------- leadership

    def is_leader(self) -> bool:
        return self.coordinator is not None and self.coordinator.is_leader()

    def leader(self) -> str | None:
        return self.coordinator.leader() if self.coordinator else None

    async def _watch(self) -> None:
        """Follow leadership changes and keep the address book and local view fresh."""
        while True:
            await asyncio.sleep(0.1)
            for m in self.members.all():
                self.addresses[m["name"]] = m["address"]
            leader = self.is_leader()
            if leader and self.members.get(self.name) is None:
                try:
                    await self.replicate(self.members.upsert, self.name, self.address, self.score(),
                                         self.role, time.time())
                except Exception:  # noqa: BLE001
                    pass
            if leader != self._was_leader:
                self._was_leader = leader
                log.info("%s the scheduler", "now" if leader else "no longer")
                if self.on_leader is not None:
                    await self.on_leader(leader)
            voters = self.members.voters()
            if voters and self.role == "voter" and self.name in voters:
                view = self.view.load() or {}
                if sorted(voters) != view.get("voters"):
                    self._save(self.role, voters)

    async def _report_loop(self) -> None:
        """Send this member's inventory and measured use to the scheduler (not the log)."""
        while True:
            await asyncio.sleep(self.options.usage_sample_interval)
            inv = self.inventory()
            leader = self.leader()
            if inv is None or leader is None:
                continue
            if leader == self.name:
                if self.on_report is not None:
                    self.on_report(inv)
                continue
            try:
                await self.peers.call(leader, "node.report", inventory=inv.to_dict(processes=False),
                                      timeout=5)
            except ApiError as exc:
                log.debug("report to %s failed: %s", leader, exc)

    # ------------------------------------------------------------ peer ops

    def register_hello(self) -> None:
        """Answer joining members, from before this member's own store is open."""

        def hello(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """What this member knows of the cluster (for a joining member)."""
            _peer_only(caller)
            if arg(args, "cluster_id", str, self.options.cluster_id) != self.options.cluster_id:
                raise ApiError("another cluster ID", "wrong_cluster")
            leader = self.leader()
            if self.coordinator is None or leader is None:
                return {"name": self.name, "formed": False}
            addr = self.address if leader == self.name else self.addresses.get(leader)
            return {"name": self.name, "formed": True, "leader": leader,
                    "leader_address": addr, "voters": self.members.voters()}

        self.dispatcher.register("cluster.hello", hello)

    def _register(self) -> None:
        d = self.dispatcher
        peer_only = _peer_only

        async def join(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """Admit a member (on the leader)."""
            peer_only(caller)
            assert self.coordinator is not None
            name = arg(args, "name", str)
            if caller.name != f"mtgpu-peer.{name}":
                raise ApiError("a member can only join as itself", "forbidden")
            address = arg(args, "address", str)

            async def reachable() -> bool:
                try:
                    await self.peers.call(f"probe:{name}", "cluster.hello", dial_address=address,
                                          timeout=3, cluster_id=self.options.cluster_id)
                    return True
                except ApiError:
                    return False
                finally:
                    self.peers.forget(f"probe:{name}")

            r = await self.coordinator.join(name, address,
                                            float(arg(args, "score", (int, float), 0.0)), reachable)
            r["addresses"] = {**self.addresses, self.name: self.address}
            return r

        def report(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """A member's inventory and measured use, for the scheduler's memory."""
            peer_only(caller)
            inv = NodeInventory.from_dict(arg(args, "inventory", dict))
            if self.on_report is not None:
                self.on_report(inv)
            return {"ok": True}

        def status(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """The cluster as this member sees it."""
            return self.status()

        async def remove(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """Take a member out of the cluster (on the scheduler)."""
            name = arg(args, "name", str)
            if not self.is_leader():
                leader = self.leader()
                if leader is None:
                    raise ApiError("no scheduler is elected right now; retry", "no_leader")
                return await self.peers.call(leader, "cluster.remove", name=name)
            m = self.members.get(name)
            if m is None:
                raise ApiError(f"no member {name!r}; `mtgpu-admin cluster status` lists them",
                               "not_found")
            if name == self.name:
                raise ApiError("the scheduler cannot remove itself; run this on another "
                               "member after moving the scheduler, or stop this one", "bad_request")
            if m["role"] == "voter":
                assert self.coordinator is not None
                await self.coordinator.remove_voter(name)
            await self.replicate(self.members.remove, name, time.time())
            return {"removed": name}

        d.register("cluster.join", join)
        d.register("cluster.remove", remove, admin=True)
        d.register("node.report", report)
        d.register("cluster.status", status, admin=True)

    def status(self) -> dict[str, Any]:
        assert self.store is not None
        st = self.store.status()
        leader = st.get("leader")
        sync = self.store.sync
        members = []
        for m in self.members.all():
            role = "scheduler" if m["name"] == leader else m["role"].replace("readonly", "read-only")
            if m["name"] == self.name:
                state = "up"
            else:
                from pysyncobj.node import Node

                connected = sync.isNodeConnected(Node(m["name"])) if m["role"] == "voter" else None
                state = "up" if connected or connected is None and leader else "unreachable"
            members.append({"name": m["name"], "address": m["address"], "role": role,
                            "state": state, "score": m["score"]})
        voters = [m for m in members if m["role"] in ("voter", "scheduler")]
        warning = ("a cluster with two voters cannot keep a majority if either fails; add a "
                   "third member" if len(voters) == 2 else "")
        return {"cluster_id": self.options.cluster_id, "scheduler": leader, "term": st.get("term"),
                "members": members, "self": self.name, "warning": warning,
                "known_hosts": self.identity.known_hosts_line()}


def _peer_only(caller: Caller) -> None:
    if caller.via != "peer":
        raise ApiError("only other members may call this", "forbidden")
