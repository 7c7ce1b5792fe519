"""The scheduler's data types: requests, cluster snapshots, placements and reasons.

What a job asked for and where it went (JobSpec, ResourceRequest, Placement) are
defined in :mod:`mtgpu.jobspec`, below the state codec that stores them, and are
named here too for the scheduler's code. Every type here is a frozen dataclass with plain values (sizes in bytes, times in
seconds since the epoch), so the replicated state can journal them and the API can
print them without conversion. Nothing here does I/O or reads a clock.

How they fit together::

    JobSpec ──request──> ResourceRequest <──── PendingJob (one per job or array task)
                               │
    ClusterSnapshot ── place() ┴──> Placement (MemberPlacement per member) | Reason
      NodeSnapshot ─ GpuSnapshot
      Allocation (what already runs, with its expected end)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mtgpu.jobspec import (
    DEFAULT_CPUS,
    DEFAULT_PRIORITY,
    DEFAULT_RAM,
    KNOWN_BRANDS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    GpuMode,
    JobSpec,
    MemberPlacement,
    Placement,
    ResourceRequest,
)

__all__ = [
    "DEFAULT_CPUS",
    "DEFAULT_RAM",
    "MIN_PRIORITY",
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "KNOWN_BRANDS",
    "GpuMode",
    "ResourceRequest",
    "JobSpec",
    "MemberPlacement",
    "Placement",
    "NodeState",
    "GpuSnapshot",
    "NodeSnapshot",
    "Reason",
    "REASON_CODES",
    "Allocation",
    "ClusterSnapshot",
    "PendingJob",
]


class NodeState(StrEnum):
    """Whether a member takes new work."""

    UP = "up"
    #: Draining or drained: running jobs go on, nothing new is placed.
    DRAIN = "drain"
    #: Not heard from; nothing is placed.
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU as the scheduler sees it at one moment.

    ``vram_used`` is measured (all processes, MTGPU's or not); ``vram_committed`` is
    the sum that shared jobs were guaranteed. ``shared_jobs`` counts shared and
    overcommit jobs on it; ``exclusive_job`` is the job holding it whole.
    """

    index: int
    brand: str
    type: str
    vram_total: int
    vram_used: int = 0
    vram_committed: int = 0
    exclusive_job: str | None = None
    shared_jobs: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One member: its capacity, measured use and what is committed to jobs."""

    name: str
    cpus: int
    ram_total: int
    gpus: tuple[GpuSnapshot, ...] = ()
    ram_used: int = 0
    cpus_committed: int = 0
    ram_committed: int = 0
    state: NodeState = NodeState.UP
    #: Its NODE_FEATURES, for sbatch's --constraint.
    features: tuple[str, ...] = ()
    #: The job holding the whole member (sbatch's --exclusive), if any.
    whole_job: str | None = None

    @property
    def schedulable(self) -> bool:
        """True if new work may be placed here."""
        return self.state is NodeState.UP


@dataclass(frozen=True)
class Reason:
    """Why a job cannot be placed, in Slurm's pending-reason words.

    ``code`` is one of :data:`REASON_CODES`. ``per_filter_counts`` says how many
    members each named filter turned away, so ``mt-job show`` can explain the wait.
    """

    code: str
    message: str
    per_filter_counts: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"code": self.code, "message": self.message, "per_filter_counts": dict(self.per_filter_counts)}


#: Pending reasons, named as Slurm names them where Slurm has one.
REASON_CODES = {
    "Resources": "not enough free resources now; the job waits for running work to end",
    "Priority": "it would fit, but only on resources reserved for a higher-priority job",
    "JobArrayTaskLimit": "the array's %N limit of tasks running at once is reached",
    "ReqNodeNotAvail": "the servers it is pinned to, or the only ones that could run it, are down or drained",
    "BadConstraints": "no member of the cluster as it is now could ever run it",
}


@dataclass(frozen=True, slots=True)
class Allocation:
    """Resources held by running work (a job or a workspace).

    ``expected_end`` is start time plus time limit, ``None`` when unlimited; the queue
    uses it to find when a waiting job could start (its reservation).
    """

    placement: Placement
    expected_end: float | None = None
    array_id: str | None = None


@dataclass(frozen=True, slots=True, weakref_slot=True)
class ClusterSnapshot:
    """The whole cluster at one moment: members and the allocations running on them.

    The committed figures in each :class:`NodeSnapshot` are the authority for what is
    free now; ``running`` is used for the future (when things end) and array limits.
    Nothing is kept on a snapshot: what placing derives from one (its plan) is kept
    beside it, in :data:`mtgpu.schedd.placement.SNAPSHOTS`, by its weak reference.
    """

    nodes: tuple[NodeSnapshot, ...]
    running: tuple[Allocation, ...] = ()

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate member names in snapshot: {', '.join(dup)}")

    def node(self, name: str) -> NodeSnapshot | None:
        """The member called ``name``, or None."""
        for n in self.nodes:
            if n.name == name:
                return n
        return None


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One job (or one array task) waiting in the queue.

    Array tasks carry ``array_id`` (the array's job id), their ``array_task`` index and
    the array's ``array_limit`` (the ``%N`` in ``array=0-99%8``).
    """

    job_id: str
    tenant: str
    request: ResourceRequest
    priority: int = DEFAULT_PRIORITY
    submit_time: float = 0.0
    time_limit: float | None = None
    array_id: str | None = None
    array_task: int | None = None
    array_limit: int | None = None
