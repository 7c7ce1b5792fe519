"""Who is in the cluster: the replicated member list and the capability score.

The capability score decides who votes (the K most capable members) and who is the
scheduler (the most capable caught-up voter). It is documented in the manual:

    score = 100 x GPUs + VRAM in GiB + CPUs + RAM in GiB / 4

so a GPU server outranks a CPU-only one, more and bigger GPUs outrank fewer, and
CPUs and RAM break ties between GPU-less members.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import SyncObjConsumer, replicated

from mtgpu.gpuinfo.types import NodeInventory

GIB = 1 << 30


def capability_score(inv: NodeInventory) -> float:
    """The documented capability score of a member, from its inventory.

    >>> from mtgpu.gpuinfo.types import GpuInfo, HostUsage
    >>> h = HostUsage(cpus=16, cpu_percent=0, ram_total=64 * GIB, ram_used=0, disk_total=0, disk_free=0)
    >>> g = GpuInfo(0, "nvidia", "rtx4090", "RTX 4090", "u", 24 * GIB, 0, 0)
    >>> capability_score(NodeInventory("a", (g,), h))
    156.0
    """
    vram = sum(g.vram_total for g in inv.gpus) / GIB
    return round(100 * len(inv.gpus) + vram + inv.host.cpus + inv.host.ram_total / GIB / 4, 3)


def voter_count(members: int) -> int:
    """K: 3 voters, or 5 from 5 members up (as Consul and Nomad servers)."""
    return 5 if members >= 5 else 3


class Members(SyncObjConsumer):
    """The member list: name -> address, score, role ('voter' or 'readonly')."""

    def __init__(self) -> None:
        super().__init__()
        self.members: dict[str, dict[str, Any]] = {}
        self.removed: dict[str, float] = {}
        #: name -> {"token", "shares", "checked"}: the member's homes marker token and
        #: the members whose markers it sees (see :mod:`mtgpu.cluster.homes`).
        self.homes: dict[str, dict[str, Any]] = {}

    def get(self, name: str) -> dict[str, Any] | None:
        return self.members.get(name)

    def all(self) -> list[dict[str, Any]]:
        return sorted(self.members.values(), key=lambda m: m["name"])

    def voters(self) -> list[str]:
        return sorted(n for n, m in self.members.items() if m["role"] == "voter")

    @replicated
    def upsert(self, name: str, address: str, score: float, role: str, now: float) -> dict[str, Any]:
        old = self.members.get(name, {})
        self.members[name] = {
            "name": name,
            "address": address,
            "score": score,
            "role": role,
            "joined": old.get("joined", now),
        }
        self.removed.pop(name, None)
        return self.members[name]

    @replicated
    def remove(self, name: str, now: float) -> bool:
        self.removed[name] = now
        self.homes.pop(name, None)
        return self.members.pop(name, None) is not None

    @replicated
    def set_homes(self, name: str, token: str | None, shares: list[str], now: float) -> None:
        """What member ``name`` sees of the others' homes markers (its own token too)."""
        if name in self.members:
            self.homes[name] = {"token": token, "shares": sorted(shares), "checked": now}
