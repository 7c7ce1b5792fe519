"""A member's cluster side: discovery, the replicated store over SSH, peer operations,
leadership (the scheduler runs on the Raft leader), usage reports and forwarding.

The daemon calls :meth:`ClusterRuntime.open_store` instead of building a cluster of
one, then :meth:`start` once its own parts exist.

A member changes role (voter or read-only) without restarting the daemon, so tenants'
sessions and jobs carry on: :meth:`ClusterRuntime.switch_role` writes a snapshot,
closes the replica and reopens it on the same journal under the new role, with the
same consumers, then hands the new store to the daemon (``on_store``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mtgpu.cluster.coordinator import Coordinator, LocalView, discover
from mtgpu.cluster.homes import HomesProbe, layout, workdir_help
from mtgpu.cluster.identity import ClusterIdentity, known_hosts_patterns
from mtgpu.cluster.lease import MemberLease, lease_seconds
from mtgpu.cluster.lease import now as lease_now
from mtgpu.cluster.members import Members, capability_score
from mtgpu.cluster.peers import PeerClient
from mtgpu.cluster.transport import SshRaftTransport
from mtgpu.config import Options
from mtgpu.errors import ApiError
from mtgpu.gpuinfo.types import NodeInventory, ReportReader
from mtgpu.state import syncobj
from mtgpu.state.store import StateStore, forget_term, strip_dump_nodes

log = logging.getLogger("mtgpu.cluster")

#: How long a member waits to catch up with the scheduler's log before it answers a
#: read of replicated state (seconds); past it, the answer is a retryable error.
CATCH_UP_TIMEOUT = 5.0
#: The scheduler's answers to "what is your last log index?" that a moment mends:
#: catching up asks again, every ``ASK_AGAIN_PAUSE`` seconds, until ``CATCH_UP_TIMEOUT``.
ASK_AGAIN = frozenset({"no_leader", "not_leader", "unreachable", "starting"})
ASK_AGAIN_PAUSE = 0.05

#: A member that sees a new scheduler reports to it at once rather than at its next
#: ``USAGE_SAMPLE_INTERVAL`` tick, at a random point within this many seconds, so that
#: a thousand members reach a new scheduler within a second but not in one instant.
NEW_LEADER_REPORT_JITTER = 0.5
#: How often the report loop looks whether the scheduler changed (seconds).
LEADER_POLL = 0.1
#: A new scheduler asks the members that have not reported to it this long after it
#: took over: those that saw it have reported by then, so it asks only the rest.
PULL_AFTER_TAKEOVER = 2 * NEW_LEADER_REPORT_JITTER


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

    def __init__(
        self,
        options: Options,
        identity: ClusterIdentity,
        inventory: Callable[[], NodeInventory | None],
        *,
        drains: Any = None,
        on_store: Callable[[StateStore], None] | None = None,
        on_leader: Callable[[bool], Awaitable[None]] | None = None,
        on_report: Callable[[NodeInventory], None] | None = None,
        grant: Callable[[str], float | None] | None = None,
        unreported: Callable[[], list[str]] | None = None,
        replica_digest: Callable[[], str] | None = None,
    ) -> None:
        self.options = options
        self.name = options.server_name
        self.identity = identity
        self.inventory = inventory
        self.members = Members()
        self.address = advertised_address(options)
        self.addresses: dict[str, str] = {}
        self.peers = PeerClient(
            identity,
            self.name,
            options.state_dir,
            self.addresses.get,
            connect_timeout=options.cluster_connect_timeout,
        )
        self.view = LocalView(options.state_dir)
        self.role = "voter"
        self.transport: SshRaftTransport | None = None
        self.store: StateStore | None = None
        self.coordinator: Coordinator | None = None
        self.on_leader = on_leader
        self.on_report = on_report
        #: This member's lease from the scheduler (see :mod:`mtgpu.cluster.lease`).
        from pathlib import Path

        self.lease = MemberLease(Path(options.state_dir) / "jobs", options.cluster_fence_grace)
        self.lease_seconds = lease_seconds(options.cluster_lost_after, options.cluster_fence_grace)
        #: A digest of this member's replica of the job table, so that an admin can
        #: see that the replicas agree.
        self.replica_digest = replica_digest
        #: On the scheduler: the lease for a member that just reported (None: none).
        self.grant = grant
        #: The members the scheduler has not heard from.
        self.unreported = unreported
        self._pulls: set[str] = set()
        self.reports = ReportReader()
        #: Called with the new store after a role change (the daemon keeps a reference).
        self.on_store = on_store
        self._tasks: list[asyncio.Task[None]] = []
        self._was_leader = False
        self._blank: list[dict[str, Any]] = []
        self._switching = asyncio.Lock()
        self._switched_at = 0.0
        self._leaderless_since: float | None = None
        self._role_check: asyncio.Task[None] | None = None
        self._removed_logged = False
        #: The replicated drains (:class:`mtgpu.schedd.drains.Drains`), for the status.
        self.drains = drains
        self.homes: HomesProbe | None = None
        #: The next read-index round (see :meth:`leader_index`) and the task running them.
        self._next_round: asyncio.Future[int] | None = None
        self._rounds_task: asyncio.Task[None] | None = None

    # -------------------------------------------------------------- startup

    def score(self) -> float:
        inv = self.inventory()
        return capability_score(inv) if inv is not None else 0.0

    async def open_store(self, consumers: list[Any]) -> StateStore:
        """Discover or reload the cluster, then start the replicated store over SSH."""
        o = self.options
        view = self.view.load()
        if view is not None and view.get("cluster_id") not in (None, o.cluster_id):
            raise ApiError(
                f"STATE_DIR belongs to cluster {view['cluster_id']!r}, not "
                f"{o.cluster_id!r}; use another STATE_DIR",
                "wrong_cluster",
            )
        for name, addr in (view or {}).get("addresses", {}).items():
            self.addresses.setdefault(name, addr)
        if view is None:
            me = {
                "name": self.name,
                "address": self.address,
                "score": self.score(),
                "cluster_id": o.cluster_id,
            }
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
        consumers = [*consumers, self.members]
        # What the consumers hold before any entry: a role change that cannot start
        # from a fresh snapshot replays the journal onto this.
        self._blank = [copy.deepcopy(c._serialize()) for c in consumers]
        self.store = self._open(role, voters, consumers)
        return self.store

    def _open(self, role: str, voters: list[str], consumers: list[Any]) -> StateStore:
        self.role = role
        loop = asyncio.get_running_loop()
        self.transport = SshRaftTransport(loop, self.name, self._dial, readonly=role == "readonly")
        peers = [v for v in voters if v != self.name]
        store = StateStore(
            self.name if role == "voter" else None,
            consumers,
            self.options.state_dir,
            peers=peers,
            transport_factory=self.transport.attach,
        )
        if role == "voter":
            store.expedite_elections(self.transport, self._succession)
        return store

    def _succession(self) -> list[str]:
        """The voters in the order they stand when the leader's process ends: the most
        capable first, as the leader hands the scheduler role on (``Coordinator``), so
        the winner keeps it. Called on the tick thread, which applies the member list."""
        ranked = sorted(
            ((m["score"], m["name"]) for m in self.members.all() if m["role"] == "voter"), reverse=True
        )
        return [name for _, name in ranked]

    async def switch_role(self, role: str, voters: list[str]) -> bool:
        """Reopen the replica as a ``role`` member with ``voters``; False if it already is."""
        async with self._switching:
            if role == self.role:
                return False
            old, old_transport = self.store, self.transport
            assert old is not None and old_transport is not None
            log.warning(
                "switching this member's replica to %s (voters: %s)",
                "voter" if role == "voter" else "read-only",
                ", ".join(sorted(voters)),
            )
            self._save(role, voters)
            current = await asyncio.to_thread(old.snapshot)
            # Closed and reopened without yielding to the loop: nothing may call a
            # replicated method while the consumers belong to no store.
            old.close()
            strip_dump_nodes(self.options.state_dir, {None, self.name})
            if role == "readonly":
                forget_term(self.options.state_dir)
            if not current:
                log.warning("no fresh snapshot: replaying the journal from the start")
                for c, blank in zip(old.consumers, self._blank):
                    for k in c._serialize():
                        del c.__dict__[k]
                    c._deserialize(copy.deepcopy(blank))
            self.store = self._open(role, voters, old.consumers)
            if role == "voter":
                self.store.hold_elections(30.0)
            if self.coordinator is not None:
                self.coordinator.sync = self.store.sync
            self._switched_at = time.monotonic()
            self._leaderless_since = None
            if self.on_store is not None:
                self.on_store(self.store)
        try:
            await asyncio.wait_for(old_transport.wait_closed(), 5)
        except TimeoutError:
            log.info("the old replica's channels are still closing")
        return True

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
        o = self.options
        self.coordinator = Coordinator(
            self.name,
            self.store.sync,
            self.members,
            replicate,
            self.score,
            grace=o.cluster_voter_grace,
            ask_role=self._ask_role,
            report_window=3 * o.usage_sample_interval + 5,
        )
        loop = asyncio.get_running_loop()
        self.homes = HomesProbe(o.tenant_home_root, self.name, self.members, replicate)
        self._tasks += [
            loop.create_task(self._watch()),
            loop.create_task(self._report_loop()),
            loop.create_task(self.homes.run()),
        ]
        self.coordinator.start()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._role_check is not None:
            self._role_check.cancel()
        if self.coordinator is not None:
            await self.coordinator.stop()
        self.peers.close()

    # ----------------------------------------------------------- leadership

    def is_leader(self) -> bool:
        return self.coordinator is not None and self.coordinator.is_leader()

    def leader(self) -> str | None:
        return self.coordinator.leader() if self.coordinator else None

    # ------------------------------------------------------- read-your-writes

    def last_index(self) -> int:
        """The last entry in this member's log (PySyncObj 0.3.17 internals)."""
        assert self.store is not None
        return syncobj.current_log_index(self.store.sync)

    async def catch_up(self, timeout: float = CATCH_UP_TIMEOUT) -> None:
        """Raft's read-index: wait until this replica has applied every entry the
        scheduler held when asked (asked after this call began), so that a change
        acknowledged on any member is seen here. ApiError ``not_caught_up`` (retryable)
        if that cannot be done within ``timeout``.

        The scheduler's last log index, not its commit index, is the target: a member
        that has just become the scheduler holds every committed entry but learns the
        commit index only when an entry of its own term commits.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        target = await self._ask_target(deadline)
        while target is None or self.store is None or self.store.sync.raftLastApplied < target:
            if loop.time() > deadline:
                raise ApiError(
                    f"this member's copy of the cluster state is behind the scheduler's "
                    f"and did not catch up within {timeout:g}s; retry in a few seconds",
                    "not_caught_up",
                )
            await asyncio.sleep(0.005)

    async def _ask_target(self, deadline: float) -> int | None:
        """The scheduler's last log index, asked again every ``ASK_AGAIN_PAUSE`` while
        the answer is one a moment mends (no scheduler elected yet, the role passing
        between members, the scheduler out of reach): while a cluster forms, or after
        the scheduler is lost, the first answer is often one of those. None when the
        deadline passes; any other refusal ends the wait at once."""
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                return await asyncio.wait_for(self.leader_index(), remaining)
            except TimeoutError:
                return None
            except (ApiError, OSError) as exc:
                code = exc.code if isinstance(exc, ApiError) else "unreachable"
                if code not in ASK_AGAIN or loop.time() + ASK_AGAIN_PAUSE >= deadline:
                    raise ApiError(
                        f"this member cannot tell whether its copy of the cluster state is "
                        f"current ({exc}); retry in a few seconds",
                        "not_caught_up",
                    ) from exc
            await asyncio.sleep(ASK_AGAIN_PAUSE)

    async def leader_index(self) -> int:
        """The scheduler's last log index, from a round begun after this call (callers
        arriving together share one round: one question to the scheduler per round trip,
        however many logins ask)."""
        loop = asyncio.get_running_loop()
        fut = self._next_round
        if fut is None:
            fut = self._next_round = loop.create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            if self._rounds_task is None or self._rounds_task.done():
                self._rounds_task = loop.create_task(self._rounds())
        return await asyncio.shield(fut)

    async def _rounds(self) -> None:
        while self._next_round is not None:
            fut, self._next_round = self._next_round, None
            try:
                fut.set_result(await self._ask_index())
            except Exception as exc:  # noqa: BLE001 - handed to the waiters
                fut.set_exception(exc)

    async def _ask_index(self) -> int:
        if self.is_leader():
            return self.last_index()
        leader = self.leader()
        if leader is None:
            raise ApiError("no scheduler is elected right now", "no_leader")
        r = await self.peers.call(leader, "cluster.log_index", timeout=CATCH_UP_TIMEOUT)
        return int(r["index"])

    async def _watch(self) -> None:
        """Follow leadership changes and keep the address book and local view fresh.

        A failed round is logged and the next one runs: this task is what starts the
        scheduler on a new leader, so it must outlive any one error (a Raft leader
        whose watch had ended would take submissions and never place them)."""
        while True:
            await asyncio.sleep(0.1)
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged; the next round runs
                log.exception("following the cluster's leadership failed; trying again")
                await asyncio.sleep(1.0)

    async def _watch_once(self) -> None:
        """One round of :meth:`_watch`."""
        for m in self.members.all():
            self.addresses[m["name"]] = m["address"]
        leader = self.is_leader()
        if leader and self.members.get(self.name) is None:
            try:
                await self.replicate(
                    self.members.upsert, self.name, self.address, self.score(), self.role, time.time()
                )
            except Exception:  # noqa: BLE001
                pass
        if leader != self._was_leader:
            self._was_leader = leader
            log.info("%s the scheduler", "now" if leader else "no longer")
            if self.on_leader is not None:
                await self.on_leader(leader)
            if leader:
                self._grant_self(lease_now())
        voters = self.members.voters()
        if voters and self.role == "voter" and self.name in voters:
            view = self.view.load() or {}
            if sorted(voters) != view.get("voters"):
                self._save(self.role, voters)
        self._maybe_check_role()

    def _maybe_check_role(self) -> None:
        """Without a leader for a while, ask the others whether this member still votes.

        A voter demoted while it was away (cut off, or stopped) comes back as a voter
        the others no longer accept, and a member promoted while it was down comes
        back read-only; either one then has no leader, and this puts it right.
        """
        now = time.monotonic()
        if self.leader() is not None:
            self._leaderless_since = None
            return
        if self._leaderless_since is None:
            self._leaderless_since = now
        settled = now - self._switched_at >= 10.0
        if (
            now - self._leaderless_since >= 5.0
            and settled
            and (self._role_check is None or self._role_check.done())
        ):
            self._leaderless_since = now  # at most one round every 5 s
            self._role_check = asyncio.get_running_loop().create_task(self._check_role())

    async def _check_role(self) -> None:
        try:
            view = await self._leader_view()
            if view is None:
                return
            if self.name not in view.get("members", [self.name]):
                if not self._removed_logged:
                    self._removed_logged = True
                    log.warning(
                        "the scheduler %s no longer lists this member: it was removed "
                        "from the cluster; stop it, or clear STATE_DIR to join again",
                        view["name"],
                    )
                return
            voters = list(view.get("voters") or [])
            want = "voter" if self.name in voters else "readonly"
            if want != self.role:
                log.warning(
                    "the scheduler %s counts this member as %s: switching",
                    view["name"],
                    "a voter" if want == "voter" else "read-only",
                )
                await self.switch_role(want, voters)
        except Exception:  # noqa: BLE001 - retried on the next round
            log.exception("checking this member's role failed")

    async def _leader_view(self) -> dict[str, Any] | None:
        """``cluster.hello`` as the leader answers it, asked through any member that answers."""
        me = {"cluster_id": self.options.cluster_id}
        targets = [(n, a) for n, a in sorted(self.addresses.items()) if n != self.name]
        targets += [
            (f"seed:{s}", s)
            for s in self.options.cluster_peers
            if s not in self.addresses.values() and s != self.address
        ]
        for name, addr in targets:
            try:
                a = await self.peers.call(name, "cluster.hello", dial_address=addr, timeout=3, **me)
                if (
                    a.get("formed")
                    and a.get("leader")
                    and a["leader"] != a.get("name")
                    and a["leader"] != self.name
                    and a.get("leader_address")
                ):
                    a = await self.peers.call(
                        a["leader"], "cluster.hello", dial_address=a["leader_address"], timeout=3, **me
                    )
            except ApiError as exc:
                log.debug("asking %s about the cluster: %s", name, exc)
                continue
            finally:
                if name.startswith("seed:"):
                    self.peers.forget(name)
            if a.get("formed") and a.get("leader") == a.get("name") and a.get("voters"):
                return a
        return None

    async def _ask_role(self, member: str, role: str, voters: list[str]) -> Any:
        """Tell ``member`` to run its replica as ``role`` (from the leader)."""
        return await self.peers.call(member, "cluster.role", role=role, voters=voters, timeout=30)

    def _grant_self(self, sent: float) -> None:
        """The scheduler's own member holds its lease from itself while it leads."""
        if self.grant is not None and self.is_leader():
            seconds = self.grant(self.name)
            if seconds is not None:
                self.lease.granted(sent, seconds)

    def lease_lost_since(self) -> float | None:
        """When (wall clock) this member's lease ran out; None while it holds."""
        return self.lease.lost_since()

    async def _report_loop(self) -> None:
        """Send this member's inventory and measured use to the scheduler (not the log);
        each answer renews this member's lease.

        Every ``USAGE_SAMPLE_INTERVAL``, and at once (within
        ``NEW_LEADER_REPORT_JITTER``) when the scheduler changes: a new scheduler then
        has every live member's inventory within about a second of taking over,
        instead of waiting up to a whole interval for each. On the scheduler itself the
        same tick asks the members that have not reported (``PULL_AFTER_TAKEOVER``
        after it took over, then every interval)."""
        interval = self.options.usage_sample_interval
        seen: str | None = None
        due = time.monotonic() + interval
        fresh = False  # the next report is the first to a new scheduler
        while True:
            await asyncio.sleep(max(0.0, min(LEADER_POLL, due - time.monotonic())))
            leader = self.leader()
            now = time.monotonic()
            if leader != seen:
                seen = leader
                if leader is not None and leader != self.name:
                    due, fresh = min(due, now + random.uniform(0, NEW_LEADER_REPORT_JITTER)), True
                elif leader is not None:
                    due = min(due, now + PULL_AFTER_TAKEOVER)
                continue
            if now < due:
                continue
            due = now + interval
            if not await self._report_once(leader) and fresh:
                # The first report to a new scheduler failed (it may not serve peers
                # yet): once more soon, not a whole interval later.
                due = time.monotonic() + random.uniform(
                    NEW_LEADER_REPORT_JITTER, 2 * NEW_LEADER_REPORT_JITTER
                )
            fresh = False

    async def _report_once(self, leader: str | None) -> bool:
        """One report to ``leader`` (on the scheduler: its own, and asking the silent).
        False if it did not reach the scheduler."""
        inv = self.inventory()
        if inv is None or leader is None:
            return False
        sent = lease_now()
        if leader == self.name:
            if self.on_report is not None:
                self.on_report(inv)
            self._grant_self(sent)
            # Members the scheduler has not heard from (it just took over; one just
            # changed role and has not found it yet): ask them, so the inventory is
            # complete as soon as they answer.
            for name in self.unreported() if self.unreported is not None else []:
                if name in self.addresses and name != self.name and name not in self._pulls:
                    self._pulls.add(name)
                    task = asyncio.get_running_loop().create_task(self._pull_report(name))
                    task.add_done_callback(functools.partial(self._pulled, name))
            return True
        try:
            r = await self.peers.call(
                leader, "node.report", inventory=inv.to_dict(processes=False), timeout=5
            )
        except ApiError as exc:
            log.debug("report to %s failed: %s", leader, exc)
            return False
        if (
            isinstance(r, dict)
            and isinstance(r.get("lease"), (int, float))
            and not isinstance(r["lease"], bool)
            and 0 < r["lease"] <= self.lease_seconds
        ):
            self.lease.granted(sent, float(r["lease"]))
        return True

    def _pulled(self, name: str, _task: asyncio.Task[None]) -> None:
        self._pulls.discard(name)

    async def _pull_report(self, name: str) -> None:
        # No lease here: a question may be delivered late, and a lease counted from
        # its arrival could outlast what this scheduler believes. The member's own
        # report (within USAGE_SAMPLE_INTERVAL) brings its lease.
        try:
            r = await self.peers.call(name, "node.inventory", timeout=3)
        except ApiError as exc:
            log.debug("asking %s for its report: %s", name, exc)
            return
        inv = self.reports.read(r)
        if inv.name == name and self.is_leader() and self.on_report is not None:
            self.on_report(inv)

    def status(self) -> dict[str, Any]:
        assert self.store is not None
        st = self.store.status()
        leader = st.get("leader")
        sync = self.store.sync
        homes = layout(self.members)
        members = []
        for m in self.members.all():
            role = "scheduler" if m["name"] == leader else m["role"].replace("readonly", "read-only")
            if m["name"] == self.name:
                state = "up"
            else:
                from pysyncobj.node import Node

                watched = m["role"] == "voter" or leader == self.name
                connected = sync.isNodeConnected(Node(m["name"])) if watched else None
                state = "up" if connected or connected is None and leader else "unreachable"
            drain = self.drains.get(m["name"]) if self.drains is not None else None
            members.append(
                {
                    "name": m["name"],
                    "address": m["address"],
                    "role": role,
                    "state": state,
                    "score": m["score"],
                    "drained": drain is not None,
                    "drain_reason": drain["reason"] if drain else None,
                    "homes_shared_with": (
                        homes["shares"].get(m["name"], [])
                        if (self.members.homes.get(m["name"]) or {}).get("token")
                        else None
                    ),
                }
            )
        voters = [m for m in members if m["role"] in ("voter", "scheduler")]
        warning = (
            "a cluster with two voters cannot keep a majority if either fails; add a third member"
            if len(voters) == 2
            else ""
        )
        lost = self.lease.lost_since()
        replica: dict[str, Any] = {"applied": int(sync.raftLastApplied), "jobs": None}
        for _ in range(3):  # the replica may change while it is read: read again
            try:
                replica["jobs"] = self.replica_digest() if self.replica_digest is not None else None
                break
            except RuntimeError:
                continue
        return {
            "cluster_id": self.options.cluster_id,
            "scheduler": leader,
            "term": st.get("term"),
            "replica": replica,
            "lease": {
                "held": lost is None and self.lease.until > 0,
                "lost_since": lost if self.lease.until > 0 else None,
            },
            "members": members,
            "self": self.name,
            "warning": warning,
            "homes": homes["homes"],
            "tenant_home_root": self.options.tenant_home_root,
            # Scoped to the members' names and addresses (never `*`: users trust the
            # cluster's CA for its hosts only).
            "known_hosts": self.identity.known_hosts_line(
                known_hosts_patterns([*members, {"name": self.name, "address": self.address}])
            ),
        }

    def workdir_help(self, workdir: str) -> str:
        """Advice for a job whose working directory is missing on this member (called
        from the runner's thread while the store may apply entries: retried then)."""
        for _ in range(3):
            try:
                return workdir_help(self.members, self.name, self.options.tenant_home_root, workdir)
            except RuntimeError:  # the member list changed while it was read
                continue
        return ""
