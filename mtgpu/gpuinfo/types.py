"""What a host has and how busy it is: the data types every probe and report share.

Sizes are bytes, utilisation is 0-100. These types are frozen so one sample can be
handed to the scheduler, the API and peers without anyone changing it underneath.
``to_dict`` gives the field names of ``mt-job nodes --json`` (see DESIGN.md);
``from_dict`` reads them back, so a peer's report round-trips over the wire.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """One process using a GPU: its PID, owning UID (None if it has gone) and VRAM."""

    pid: int
    uid: int | None
    used_memory: int

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "uid": self.uid, "used_memory": self.used_memory}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as a probe measured it.

    ``index`` is the host-wide GPU number the scheduler reserves; ``visibility_id``
    is what goes into the brand's visibility variable (a UUID for NVIDIA, an index
    for others). ``mig_mode`` is None where the card has no such mode.

    A card in MIG mode (or an AMD card in a compute partition mode other than SPX)
    is reported with ``mig_mode=True`` and is never placed whole: each of its
    instances is a GPU of its own, with ``parent`` the card's index, its own UUID
    (``MIG-...``), VRAM and a type naming the profile (``h100-3g.40gb``).
    """

    index: int
    brand: str
    type: str
    name: str
    uuid: str
    vram_total: int
    vram_used: int
    util: int
    processes: tuple[GpuProcess, ...] = ()
    mig_mode: bool | None = None
    visibility_id: str = ""
    #: VRAM held by processes that belong to no job (an admin's, a local account's);
    #: None where the member does not tell.
    vram_outside: int | None = None
    parent: int | None = None

    @property
    def placeable(self) -> bool:
        """False for a card split into instances: its instances are placed instead."""
        return not (self.mig_mode and self.parent is None)

    @property
    def vram_free(self) -> int:
        """VRAM not in use, never negative."""
        return max(0, self.vram_total - self.vram_used)

    def to_dict(self, jobs: Sequence[str] = (), *, processes: bool = False) -> dict[str, Any]:
        """The JSON form; ``jobs`` are the job ids the daemon placed on this GPU.

        Processes (PIDs and UIDs of whoever uses the card) are left out unless asked
        for, because tenants see this listing too.
        """
        d: dict[str, Any] = {
            "index": self.index,
            "brand": self.brand,
            "type": self.type,
            "vram_total": self.vram_total,
            "vram_used": self.vram_used,
            "util": self.util,
            "jobs": list(jobs),
            "name": self.name,
            "uuid": self.uuid,
            "mig_mode": self.mig_mode,
        }
        if self.vram_outside is not None:
            d["vram_outside"] = self.vram_outside
        if self.parent is not None:
            d["parent"] = self.parent
        if processes:
            d["processes"] = [p.to_dict() for p in self.processes]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuInfo:
        """Read back what :meth:`to_dict` wrote (``jobs`` is ignored)."""
        return cls(
            index=int(d["index"]),
            brand=str(d["brand"]),
            type=str(d["type"]),
            name=str(d.get("name", d["type"])),
            uuid=str(d.get("uuid", "")),
            vram_total=int(d["vram_total"]),
            vram_used=int(d["vram_used"]),
            util=int(d.get("util", 0)),
            processes=tuple(
                GpuProcess(int(p["pid"]), p.get("uid"), int(p["used_memory"])) for p in d.get("processes", ())
            ),
            mig_mode=d.get("mig_mode"),
            visibility_id=str(d.get("visibility_id", d["index"])),
            vram_outside=None if d.get("vram_outside") is None else int(d["vram_outside"]),
            parent=None if d.get("parent") is None else int(d["parent"]),
        )


@dataclass(frozen=True)
class HostUsage:
    """CPU, RAM and tenant-disk figures of the host."""

    cpus: int
    cpu_percent: float
    ram_total: int
    ram_used: int
    disk_total: int
    disk_free: int


@dataclass(frozen=True)
class NodeInventory:
    """One sample of one host: its GPUs, its CPU/RAM/disk, and what went wrong."""

    name: str
    gpus: tuple[GpuInfo, ...]
    host: HostUsage
    errors: tuple[str, ...] = ()
    sampled_at: float = 0.0
    #: The member's NODE_FEATURES (sbatch's --constraint chooses by them).
    features: tuple[str, ...] = ()

    def gpu(self, index: int) -> GpuInfo | None:
        """The GPU with host index ``index``, or None."""
        return next((g for g in self.gpus if g.index == index), None)

    def to_dict(
        self, jobs: Mapping[int, Sequence[str]] | None = None, *, state: str = "up", processes: bool = False
    ) -> dict[str, Any]:
        """The ``mt-job nodes --json`` member object.

        ``jobs`` maps a GPU index to the job ids holding it and ``state`` is the
        member's state; both are the daemon's to know, not the probes'.
        """
        jobs = jobs or {}
        h = self.host
        return {
            "name": self.name,
            "state": state,
            "cpus": h.cpus,
            "ram_total": h.ram_total,
            "ram_used": h.ram_used,
            "gpus": [g.to_dict(jobs.get(g.index, ()), processes=processes) for g in self.gpus],
            "cpu_percent": h.cpu_percent,
            "disk_total": h.disk_total,
            "disk_free": h.disk_free,
            "errors": list(self.errors),
            "sampled_at": self.sampled_at,
            "features": list(self.features),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], gpus: tuple[GpuInfo, ...] | None = None) -> NodeInventory:
        """Read back what :meth:`to_dict` wrote (``state`` and ``jobs`` are dropped);
        ``gpus``, when given, are the GPU records already read from ``d``."""
        host = HostUsage(
            cpus=int(d["cpus"]),
            cpu_percent=float(d.get("cpu_percent", 0.0)),
            ram_total=int(d["ram_total"]),
            ram_used=int(d["ram_used"]),
            disk_total=int(d.get("disk_total", 0)),
            disk_free=int(d.get("disk_free", 0)),
        )
        if gpus is None:
            gpus = tuple(GpuInfo.from_dict(g) for g in d.get("gpus", ()))
        return cls(
            name=str(d["name"]),
            gpus=gpus,
            host=host,
            errors=tuple(d.get("errors", ())),
            sampled_at=float(d.get("sampled_at", 0.0)),
            features=tuple(str(f) for f in d.get("features", ())),
        )


class ReportReader:
    """Reads members' reports (:meth:`NodeInventory.from_dict`), keeping each GPU's
    record from the member's previous report while its entry is unchanged.

    A scheduler reads a report from every member every few seconds, and most cards
    (idle ones, those whose jobs hold steady) report the same figures each time;
    comparing the entry with the last one is far cheaper than building the record.
    The kept records are the same objects, which lets the scheduler keep what it
    derived from them too.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[list[Any], tuple[GpuInfo, ...]]] = {}

    def read(self, d: Mapping[str, Any]) -> NodeInventory:
        name = str(d["name"])
        raw = d.get("gpus", ())
        if not isinstance(raw, list):
            raw = list(raw)
        last = self._last.get(name)
        if last is not None and len(last[0]) == len(raw):
            old_raw, old = last
            gpus = tuple(
                o if r == g else GpuInfo.from_dict(g) for g, r, o in zip(raw, old_raw, old, strict=True)
            )
        else:
            gpus = tuple(GpuInfo.from_dict(g) for g in raw)
        inv = NodeInventory.from_dict(d, gpus)
        self._last[name] = (raw, gpus)
        return inv

    def forget(self, name: str) -> None:
        """Drop what is kept for a member (it left the cluster)."""
        self._last.pop(name, None)
