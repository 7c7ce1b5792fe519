"""Forming and keeping a cluster: discovery, founding, joining, voters and the scheduler.

A member with an empty journal asks its seeds (``CLUSTER_PEERS``) about the cluster
(``cluster.hello``). If a cluster is formed, it asks the leader to join
(``cluster.join``): the leader decides its role (a voter while there are fewer than K,
else a read-only member with a full replica) and adds it to the Raft configuration
once the newcomer runs. If no reachable member is formed yet, the one with the
smallest name among the reachable ones founds the cluster alone and the others join
it; that rule is the same everywhere, so members started together agree.

The local view (the voters this member starts with) is kept in
``STATE_DIR/cluster.json`` so that a restart, even of every member at once, needs no
discovery. The leader moves the scheduler role to the most capable caught-up voter.

The leader also keeps K voters (see :mod:`mtgpu.cluster.voters` for the rules): it
watches how long each member has been up or unreachable, and carries out one voter
change at a time. A promotion asks the member to restart its replica as a voter
(``cluster.role``), records the role, then adds it to the Raft configuration; a
demotion records the role, removes the member from the configuration, then tells it.
The replicated member list is the truth: the Raft configuration is brought back in
line with it when the two disagree (a change cut short by a leader change).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.cluster.members import Members, voter_count
from mtgpu.cluster.peers import PeerClient
from mtgpu.cluster.voters import MemberState, VoterChange, plan
from mtgpu.errors import ApiError, StateError
from mtgpu.state import syncobj

log = logging.getLogger("mtgpu.cluster")

#: A more capable voter takes over the scheduler only if it beats the leader by this much.
TRANSFER_MARGIN = 1.05


class LocalView:
    """``STATE_DIR/cluster.json``: this member's role and the voters it starts with."""

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / "cluster.json"

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def save(self, role: str, voters: list[str], cluster_id: str) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"role": role, "voters": sorted(voters), "cluster_id": cluster_id}))
        os.replace(tmp, self.path)


async def discover(
    peers: PeerClient, seeds: list[str], me: dict[str, Any], *, wait: float = 30.0
) -> dict[str, Any]:
    """Find out how to start: ``{"found": True}`` or ``{"role", "voters", "leader"}``."""
    deadline = time.monotonic() + wait
    while True:
        answers = []
        for seed in seeds:
            try:
                answers.append(
                    await peers.call(f"seed:{seed}", "cluster.hello", dial_address=seed, timeout=5, **me)
                )
            except ApiError as exc:
                log.info("seed %s: %s", seed, exc)
        formed = [a for a in answers if a.get("formed")]
        for a in formed:
            leader = a.get("leader")
            addr = a.get("leader_address")
            if not leader or not addr:
                continue
            try:
                r = await peers.call(leader, "cluster.join", dial_address=addr, timeout=10, **me)
                return {
                    "role": r["role"],
                    "voters": r["voters"],
                    "leader": leader,
                    "addresses": r.get("addresses", {}),
                }
            except ApiError as exc:
                log.info("joining through %s: %s", leader, exc)
        if not formed:
            # Found only when every seed answered and none is formed, and this member has
            # the smallest name: every member reaches the same verdict, so exactly one
            # founds. Past the deadline, the smallest of those that answered founds.
            names = sorted([me["name"]] + [a["name"] for a in answers])
            everyone = len(answers) == len(seeds)
            if names[0] == me["name"] and (everyone or time.monotonic() > deadline):
                return {"found": True}
            if time.monotonic() > deadline and not answers:
                raise StateError(
                    "no seed in CLUSTER_PEERS answered and this member is not the "
                    "first; check CLUSTER_PEERS, CLUSTER_ID and CLUSTER_KEY"
                )
        await asyncio.sleep(1.0)


AskRole = Callable[[str, str, list[str]], Awaitable[Any]]


class Coordinator:
    """The leader's duties: admit members, keep K voters, hand the scheduler role on."""

    def __init__(
        self,
        name: str,
        sync: Any,
        members: Members,
        replicate: Callable[..., Any],
        score: Callable[[], float],
        *,
        grace: float = 60.0,
        ask_role: AskRole | None = None,
        report_window: float = 15.0,
    ) -> None:
        self.name = name
        self.sync = sync
        self.members = members
        self.replicate = replicate
        self.score = score
        #: How long a voter may be unreachable, and a member must be up, before a change.
        self.grace = grace
        #: ``ask_role(member, role, voters)``: tell a member to run its replica in a role.
        self.ask_role = ask_role
        #: A read-only member counts as up only if it reported within this many seconds.
        self.report_window = report_window
        #: When each member last reported its usage (monotonic), kept by the runtime.
        self.reported: dict[str, float] = {}
        self._adds: list[str] = []
        self._busy: set[str] = set()
        self._joining = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._leading = False
        self._up_since: dict[str, float] = {}
        self._down_since: dict[str, float] = {}
        self._changed: dict[str, float] = {}
        self._undialable: dict[str, float] = {}
        self._nodes: dict[str, Any] = {}

    def is_leader(self) -> bool:
        return self.sync is not None and syncobj.is_leader(self.sync)

    def leader(self) -> str | None:
        leader = syncobj.leader(self.sync) if self.sync is not None else None
        return getattr(leader, "id", None)

    def configured_voters(self) -> list[str]:
        """The Raft configuration as this member holds it: itself and the other voters."""
        others = {n.id for n in self.sync.otherNodes if n is not None}
        if self.sync.selfNode is not None:
            others.add(self.sync.selfNode.id)
        return sorted(others)

    async def join(
        self, name: str, address: str, score: float, reachable: Callable[[], Any] | None = None
    ) -> dict[str, Any]:
        """Admit ``name`` (on the leader): decide its role and schedule the Raft add.

        A member the leader cannot dial back (behind NAT, or a one-way firewall) joins
        as a read-only member: it keeps a full replica over the channels it opens.
        """
        # One at a time: members started together would otherwise all count the same
        # voters and all join as voters.
        async with self._joining:
            return await self._join(name, address, score, reachable)

    async def _join(
        self, name: str, address: str, score: float, reachable: Callable[[], Any] | None
    ) -> dict[str, Any]:
        if not self.is_leader():
            raise ApiError(f"not the leader; ask {self.leader()}", "not_leader")
        existing = self.members.get(name)
        voters = self.members.voters()
        if existing is not None:
            role = existing["role"]
        else:
            role = "voter" if len(voters) < voter_count(len(self.members.members) + 1) else "readonly"
            if role == "voter" and reachable is not None and not await reachable():
                log.info("%s at %s cannot be reached from here: it joins read-only", name, address)
                role = "readonly"
                self._undialable[name] = float("inf")
        await self.replicate(self.members.upsert, name, address, score, role, time.time())
        if role == "voter" and name not in voters:
            self._adds.append(name)
        return {"role": role, "voters": sorted(set(self.members.voters()) | {self.name})}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                if not self.is_leader():
                    self._leading = False
                    continue
                if not self._leading:
                    # A new leader starts every clock afresh: nobody is replaced for
                    # what an earlier leader saw.
                    self._leading = True
                    self._up_since.clear()
                    self._down_since.clear()
                await self._admit()
                await self._reconcile()
                if not await self._keep_voters():
                    self._maybe_transfer()
            except Exception:  # noqa: BLE001 - keep coordinating
                log.exception("cluster coordination failed")

    async def _membership(self, change: Callable[..., Any], name: str) -> bool:
        """Apply one Raft membership change; True once it committed."""
        from pysyncobj.node import Node

        try:
            await self.replicate(change, Node(name), timeout=15)
            return True
        except StateError as exc:
            log.info("membership change for %s did not commit: %s", name, exc)
            return False

    async def _admit(self) -> None:
        """Add waiting voters to the Raft configuration, one at a time."""
        while self._adds:
            name = self._adds[0]
            if name in self.configured_voters():
                self._adds.pop(0)
                continue
            if not await self._membership(self.sync.addNodeToCluster, name):
                log.info("adding %s to the voters failed; retrying", name)
                return
            log.info("added %s to the voters", name)
            self._adds.pop(0)

    async def remove_voter(self, name: str) -> None:
        """Drop ``name`` from the Raft configuration (on the leader)."""
        for _ in range(20):
            if name not in self.configured_voters():
                return
            if await self._membership(self.sync.removeNodeFromCluster, name):
                return
            await asyncio.sleep(0.5)
        raise ApiError(f"could not remove {name} from the voters; retry", "error")

    async def remove_member(self, name: str) -> None:
        """Take ``name`` out of the cluster: out of the voters, then out of the list."""
        self._busy.add(name)
        try:
            await self.remove_voter(name)
            await self.replicate(self.members.remove, name, time.time())
        finally:
            self._busy.discard(name)

    # ---------------------------------------------------------------- voters

    def _fully_applied(self) -> bool:
        s = self.sync
        return bool(s.raftLastApplied >= syncobj.current_log_index(s))

    async def _reconcile(self) -> None:
        """Bring the Raft configuration in line with the member list's roles.

        Only once this leader has applied its whole log: before that, the member list
        may lag the configuration (a configuration change takes effect when appended,
        a role when applied).
        """
        if not self._fully_applied():
            return
        config = set(self.configured_voters())
        wanted = set(self.members.voters()) | {self.name}
        for name in sorted(wanted - config - self._busy):
            if name not in self._adds:
                log.info("%s is a voter in the member list but not in the configuration: adding it", name)
                self._adds.append(name)
        await self._admit()
        for name in sorted(config - wanted - self._busy - {self.name}):
            log.info("%s is in the configuration but not a voter in the member list: removing it", name)
            await self._membership(self.sync.removeNodeFromCluster, name)

    def observe(self, now: float) -> list[MemberState]:
        """Every member as seen from here now; updates how long each was up or down."""
        from pysyncobj.node import Node

        out = []
        nodes = self._nodes
        for m in self.members.all():
            name = m["name"]
            if name == self.name:
                up = True
            else:
                # One Node per member, kept: this runs every second over every member.
                node = nodes.get(name)
                if node is None:
                    node = nodes[name] = Node(name)
                up = bool(self.sync.isNodeConnected(node))
                if m["role"] != "voter":
                    up = up and now - self.reported.get(name, float("-inf")) <= self.report_window
            if up:
                self._down_since.pop(name, None)
                self._up_since.setdefault(name, now)
            else:
                self._up_since.pop(name, None)
                self._down_since.setdefault(name, now)
            out.append(
                MemberState(
                    name,
                    m["role"],
                    float(m["score"]),
                    up,
                    self._up_since.get(name),
                    self._down_since.get(name),
                    dialable=self._undialable.get(name, float("-inf")) <= now,
                    changed=self._changed.get(name),
                )
            )
        return out

    async def _keep_voters(self) -> bool:
        """Make the voter change the rules ask for now, if any; True if one was tried."""
        now = time.monotonic()
        states = self.observe(now)
        if self.ask_role is None or self._busy or self._adds:
            return False
        change = plan(states, self.name, now, grace=self.grace)
        if change is None:
            return False
        await self._apply(change)
        return True

    async def _apply(self, change: VoterChange) -> None:
        steps = [("promote", change.promote), ("demote", change.demote)]
        if change.demote_first:
            steps.reverse()
        done: list[str] = []
        for kind, name in steps:
            if name is None:
                continue
            self._busy.add(name)
            try:
                ok = await (self._promote(name) if kind == "promote" else self._demote(name))
            finally:
                self._busy.discard(name)
                self._changed[name] = time.monotonic()
            if not ok:
                log.warning("voter change stopped: could not %s %s (%s)", kind, name, change.reason)
                return
            done.append(kind)
        p, d = change.promote, change.demote
        if p and d:
            log.warning("promoted %s to voter: replaces %s, %s", p, d, change.reason)
        elif p:
            log.warning("promoted %s to voter: %s", p, change.reason)
        elif d:
            log.warning("demoted %s to read-only: %s", d, change.reason)

    async def _promote(self, name: str) -> bool:
        """The member restarts its replica as a voter; then it is recorded and added."""
        m = self.members.get(name)
        if m is None or self.ask_role is None:
            return False
        voters = sorted(set(self.configured_voters()) | {name})
        try:
            await self.ask_role(name, "voter", voters)
        except ApiError as exc:
            log.info("%s cannot become a voter now: %s", name, exc)
            self._undialable[name] = time.monotonic() + self.grace
            return False
        await self.replicate(self.members.upsert, name, m["address"], m["score"], "voter", time.time())
        self._adds.append(name)
        await self._admit()
        return name not in self._adds

    async def _demote(self, name: str) -> bool:
        """Record the role, take the member out of the configuration, then tell it."""
        m = self.members.get(name)
        if m is None:
            return False
        await self.replicate(self.members.upsert, name, m["address"], m["score"], "readonly", time.time())
        try:
            await self.remove_voter(name)
        except ApiError as exc:
            log.info("%s stays in the configuration for now: %s", name, exc)
            return False
        if self.ask_role is not None and self._down_since.get(name) is None:
            # A reachable member switches now; an unreachable one finds out when it is back.
            try:
                await self.ask_role(name, "readonly", self.configured_voters())
            except ApiError as exc:
                log.info("%s will find out it is read-only later: %s", name, exc)
        return True

    def _maybe_transfer(self) -> None:
        mine = self.score()
        config = set(self.configured_voters())
        best = max(
            (
                m
                for m in self.members.all()
                if m["role"] == "voter" and m["name"] != self.name and m["name"] in config
            ),
            key=lambda m: (m["score"], m["name"]),
            default=None,
        )
        if best is not None and best["score"] > mine * TRANSFER_MARGIN:
            from pysyncobj.node import Node

            self.sync.transferLeadership(Node(best["name"]))
