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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.cluster.members import Members, voter_count
from mtgpu.cluster.peers import PeerClient
from mtgpu.errors import ApiError, StateError

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


async def discover(peers: PeerClient, seeds: list[str], me: dict[str, Any],
                   *, wait: float = 30.0) -> dict[str, Any]:
    """Find out how to start: ``{"found": True}`` or ``{"role", "voters", "leader"}``."""
    deadline = time.monotonic() + wait
    while True:
        answers = []
        for seed in seeds:
            try:
                answers.append(await peers.call(f"seed:{seed}", "cluster.hello", dial_address=seed,
                                                timeout=5, **me))
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
                return {"role": r["role"], "voters": r["voters"], "leader": leader,
                        "addresses": r.get("addresses", {})}
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
                raise StateError("no seed in CLUSTER_PEERS answered and this member is not the "
                                 "first; check CLUSTER_PEERS, CLUSTER_ID and CLUSTER_KEY")
        await asyncio.sleep(1.0)


class Coordinator:
    """The leader's duties: admit members, keep K voters, hand the scheduler role on."""

    def __init__(self, name: str, sync: Any, members: Members, replicate: Callable[..., Any],
                 score: Callable[[], float]) -> None:
        self.name = name
        self.sync = sync
        self.members = members
        self.replicate = replicate
        self.score = score
        self._adds: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def is_leader(self) -> bool:
        return bool(self.sync is not None and self.sync._isLeader())

    def leader(self) -> str | None:
        leader = self.sync._getLeader() if self.sync is not None else None
        return getattr(leader, "id", None)

    async def join(self, name: str, address: str, score: float,
                   reachable: Callable[[], Any] | None = None) -> dict[str, Any]:
        """Admit ``name`` (on the leader): decide its role and schedule the Raft add.

        A member the leader cannot dial back (behind NAT, or a one-way firewall) joins
        as a read-only member: it keeps a full replica over the channels it opens.
        """
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
                if self.is_leader():
                    await self._admit()
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
            if not await self._membership(self.sync.addNodeToCluster, name):
                log.info("adding %s to the voters failed; retrying", name)
                return
            log.info("added %s to the voters", name)
            self._adds.pop(0)

    async def remove_voter(self, name: str) -> None:
        """Drop ``name`` from the Raft configuration (on the leader)."""
        for _ in range(20):
            if await self._membership(self.sync.removeNodeFromCluster, name):
                return
            await asyncio.sleep(0.5)
        raise ApiError(f"could not remove {name} from the voters; retry", "error")

    def _maybe_transfer(self) -> None:
        mine = self.score()
        best = max((m for m in self.members.all() if m["role"] == "voter" and m["name"] != self.name),
                   key=lambda m: (m["score"], m["name"]), default=None)
        if best is not None and best["score"] > mine * TRANSFER_MARGIN:
            from pysyncobj.node import Node

            self.sync.transferLeadership(Node(best["name"]))
