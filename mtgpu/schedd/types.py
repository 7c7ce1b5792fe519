"""The scheduler's data types: requests, cluster snapshots, placements and reasons.

Every type here is a frozen dataclass with plain values (sizes in bytes, times in
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

#: Resources a member gets when the job file does not say (per member).
DEFAULT_CPUS = 1
DEFAULT_RAM = 1 << 30
#: Job priorities run from 0 to 100. A tenant may pick 0..DEFAULT_PRIORITY; above it
#: takes an admin. Aging is added on top (see :mod:`mtgpu.schedd.queue`).
MIN_PRIORITY = 0
DEFAULT_PRIORITY = 50
MAX_PRIORITY = 100
#: Brands a bare name in ``gpus=NAME:N`` is taken to be; any other name is a GPU type.
KNOWN_BRANDS = frozenset({"nvidia", "amd", "intel"})


class GpuMode(StrEnum):
    """How a job holds its GPUs."""

    #: The whole GPU; no other job shares it.
    EXCLUSIVE = "exclusive"
    #: A guaranteed slice of VRAM: committed VRAM on the GPU never exceeds its total.
    SHARED = "shared"
    #: Placed by measured free VRAM, with no guarantee.
    OVERCOMMIT = "overcommit"


class NodeState(StrEnum):
    """Whether a member takes new work."""

    UP = "up"
    #: Draining or drained: running jobs go on, nothing new is placed.
    DRAIN = "drain"
    #: Not heard from; nothing is placed.
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """What every member of a job needs, and how many members.

    ``gpus``, ``cpus``, ``ram`` are per member and ``vram`` is per GPU, so
    ``nodes=2 gpus=4`` is 8 GPUs. ``servers`` pins the members to those hosts.
    """

    gpus: int = 0
    gpu_brand: str | None = None
    gpu_type: str | None = None
    gpu_mode: GpuMode = GpuMode.EXCLUSIVE
    vram: int = 0
    cpus: int = DEFAULT_CPUS
    ram: int = DEFAULT_RAM
    nodes: int = 1
    servers: tuple[str, ...] = ()
    #: Members never to use (sbatch's --exclude).
    exclude: tuple[str, ...] = ()
    #: sbatch's --constraint: the NODE_FEATURES a member must have (``a100&nvlink|h100``).
    constraint: str | None = None
    #: sbatch's --exclusive: each member runs no other job while this one runs. It is
    #: placed only on members running nothing, gets all of their CPUs (RAM and GPUs
    #: as asked, as in Slurm), and nothing else is placed there until it ends.
    whole_member: bool = False

    def gpu_matches(self, brand: str, type_: str) -> bool:
        """True if a GPU of this brand and type satisfies the brand/type constraint."""
        return (self.gpu_brand is None or self.gpu_brand == brand) and (
            self.gpu_type is None or self.gpu_type == type_
        )

    def gpu_label(self) -> str:
        """The GPU constraint as a user wrote it: ``nvidia``, ``a100``, ``nvidia:a100`` or ``any``."""
        parts = [p for p in (self.gpu_brand, self.gpu_type) if p]
        return ":".join(parts) if parts else "any"

    def describe(self) -> str:
        """One line for messages, e.g. ``2 nvidia GPUs (exclusive), 4 CPUs, 16G RAM on each of 2 members``."""
        from mtgpu.config.units import format_size

        bits = []
        if self.gpus:
            kind = "" if self.gpu_label() == "any" else f"{self.gpu_label()} "
            vram = f" with {format_size(self.vram)} VRAM each" if self.vram else ""
            bits.append(f"{self.gpus} {kind}GPU{'s' if self.gpus > 1 else ''}{vram} ({self.gpu_mode})")
        bits.append(f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}")
        bits.append(f"{format_size(self.ram)} RAM")
        where = f"on each of {self.nodes} members" if self.nodes > 1 else "on one member"
        if self.whole_member:
            where = f"on each of {self.nodes} whole members" if self.nodes > 1 else "on one whole member"
        more = f" and {len(self.servers) - 3} more" if len(self.servers) > 3 else ""
        pin = f" among {','.join(self.servers[:3])}{more}" if self.servers else ""
        if self.constraint:
            pin += f" with features {self.constraint}"
        if self.exclude:
            pin += f" excluding {','.join(self.exclude[:3])}" + (" ..." if len(self.exclude) > 3 else "")
        return ", ".join(bits) + f" {where}{pin}"


@dataclass(frozen=True)
class JobSpec:
    """A parsed job file, with command-line overrides applied.

    ``array`` is the array spec as written (``0-99%8``); :func:`mtgpu.schedd.jobfile.expand_array`
    gives the indices. ``time_limit`` is in seconds, ``None`` for no limit.
    ``warnings`` holds one line per ignored ``#SBATCH`` option or similar.
    """

    request: ResourceRequest
    script: str
    name: str = "job"
    array: str | None = None
    array_limit: int | None = None
    priority: int = DEFAULT_PRIORITY
    time_limit: float | None = None
    output: str | None = None
    error: str | None = None
    workdir: str = ""
    container: str | None = None
    requeue: bool = False
    warnings: tuple[str, ...] = ()
    #: sbatch's task counts (--ntasks, --ntasks-per-node, --cpus-per-task), None when
    #: the job file does not say: the job's SLURM_NTASKS and SLURM_CPUS_PER_TASK.
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    #: sbatch's ``--export`` as written (None: ``ALL``), applied at submission to the
    #: submitting shell's environment (:func:`mtgpu.schedd.submitenv.exported`).
    export: str | None = None
    #: sbatch's --hold, --dependency (as written), --begin (as written; the submission
    #: makes it a time) and --kill-on-invalid-dep (:mod:`mtgpu.schedd.depend`).
    hold: bool = False
    dependency: str | None = None
    begin: str | None = None
    kill_on_invalid_dep: bool = True
    #: sbatch's --test-only (answer when and where it would start; submit nothing) and
    #: --wait (the submitting command returns when the job ends).
    test_only: bool = False
    wait: bool = False
    #: sbatch's --open-mode: "truncate" (the default) or "append" the output files.
    open_mode: str = "truncate"
    #: sbatch's --signal as written (``B:USR1@90``): a warning before the time limit.
    signal: str | None = None

    @property
    def gpus_total(self) -> int:
        """GPUs over all members."""
        return self.request.gpus * self.request.nodes


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


@dataclass(frozen=True, slots=True)
class MemberPlacement:
    """What one member of a placed job gets. ``rank`` is its place in the job (0 first)."""

    node: str
    rank: int
    gpu_indices: tuple[int, ...] = ()
    cpus: int = 0
    ram: int = 0
    vram_per_gpu: int = 0
    #: Named ranker scores that chose this member, for ``mt-job show``.
    scores: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job goes: one :class:`MemberPlacement` per member, all or nothing."""

    job_id: str
    gpu_mode: GpuMode
    members: tuple[MemberPlacement, ...]
    #: The job holds its members whole (sbatch's --exclusive): nothing else goes there.
    whole_member: bool = False

    @property
    def nodes(self) -> tuple[str, ...]:
        """Member names in rank order."""
        return tuple(m.node for m in self.members)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form with snake_case keys."""
        return {
            "job_id": self.job_id,
            "gpu_mode": str(self.gpu_mode),
            "whole_member": self.whole_member,
            "members": [
                {
                    "node": m.node,
                    "rank": m.rank,
                    "gpu_indices": list(m.gpu_indices),
                    "cpus": m.cpus,
                    "ram": m.ram,
                    "vram_per_gpu": m.vram_per_gpu,
                    "scores": dict(m.scores),
                }
                for m in self.members
            ],
        }


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
