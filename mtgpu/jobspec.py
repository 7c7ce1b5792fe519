"""What a job is: what it asked for (:class:`JobSpec`, its :class:`ResourceRequest`)
and where it was put (:class:`Placement`), with their plain-dict forms.

These are defined once, here, below every part that reads them: the job file parser
and the API build a JobSpec once at the boundary; the scheduler places it; the
replicated job table stores the dict forms (:func:`spec_to_dict`,
:meth:`Placement.to_dict`), and :class:`mtgpu.state.codec.JobRecord` holds them typed
again (:func:`spec_from_dict`, :func:`placement_from_dict`), decoded once per change
of a job. Frozen dataclasses of plain values; nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
#: A job's warnings are kept in its record (replicated, and kept after it ends), so
#: they are bounded: at most MAX_WARNINGS lines (the last one then says how many more
#: there were), each at most MAX_WARNING_CHARS characters, about 4 KB a job at most.
MAX_WARNINGS = 20
MAX_WARNING_CHARS = 200


class GpuMode(StrEnum):
    """How a job holds its GPUs."""

    #: The whole GPU; no other job shares it.
    EXCLUSIVE = "exclusive"
    #: A guaranteed slice of VRAM: committed VRAM on the GPU never exceeds its total.
    SHARED = "shared"
    #: Placed by measured free VRAM, with no guarantee.
    OVERCOMMIT = "overcommit"


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
        bits.append(f"{format_size(self.ram)} RAM" if self.ram else "all its RAM")  # ram 0: --mem=0
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
    ``warnings`` holds one line per distinct ignored ``#SBATCH`` option or similar,
    bounded by :class:`WarningTally`.
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


class WarningTally:
    """A job's warnings as they are found: a repeat is counted, not kept again, and
    past MAX_WARNINGS distinct ones the rest are only counted, so neither the parse
    nor the job's record grows with them.

    >>> t = WarningTally()
    >>> for w in ["a", "b", "a", "a"]:
    ...     t.add(w)
    >>> t.lines()
    ('a (x3)', 'b')
    """

    __slots__ = ("_counts", "_more")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._more = 0

    def add(self, line: str) -> None:
        """Count one warning (cut to MAX_WARNING_CHARS, its NULs and undecodable
        bytes written as escapes)."""
        line = line[: MAX_WARNING_CHARS * 2].replace("\0", "\\x00")
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(line) > MAX_WARNING_CHARS:
            line = line[: MAX_WARNING_CHARS - 3] + "..."
        if line in self._counts:
            self._counts[line] += 1
        elif len(self._counts) < MAX_WARNINGS:
            self._counts[line] = 1
        else:
            self._more += 1

    def lines(self) -> tuple[str, ...]:
        """At most MAX_WARNINGS lines of at most MAX_WARNING_CHARS characters: each
        distinct warning once, with ``(xN)`` if it came N times, and a last line
        ``... and N more warnings`` if there were more distinct ones than fit."""
        items = list(self._counts.items())
        more = self._more
        if more:  # the summary takes the last line
            more += sum(n for _, n in items[MAX_WARNINGS - 1 :])
            items = items[: MAX_WARNINGS - 1]
        out = []
        for text, n in items:
            if n > 1:
                count = f" (x{n})"
                if len(text) + len(count) > MAX_WARNING_CHARS:
                    text = text[: MAX_WARNING_CHARS - len(count) - 3] + "..."
                text += count
            out.append(text)
        if more:
            out.append(f"... and {more} more warning{'s' if more != 1 else ''}")
        return tuple(out)


def bound_warnings(warnings: Iterable[str]) -> tuple[str, ...]:
    """``warnings`` within the bounds of :class:`WarningTally`: as they are if they
    already are (at most MAX_WARNINGS lines of at most MAX_WARNING_CHARS), else
    counted and cut as it does.

    >>> bound_warnings(["x"] * 5000 + [f"w{i}" for i in range(30)])[-2:]
    ('w17', '... and 12 more warnings')
    """
    if isinstance(warnings, (tuple, list)) and len(warnings) <= MAX_WARNINGS:
        if all(isinstance(w, str) and len(w) <= MAX_WARNING_CHARS for w in warnings):
            return tuple(warnings)
    tally = WarningTally()
    for w in warnings:
        tally.add(str(w))
    return tally.lines()


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """A plain-dict form of a job spec (what the job table stores), its warnings
    bounded (:func:`bound_warnings`) however the spec was made."""
    d = dataclasses.asdict(spec)
    d["request"]["gpu_mode"] = str(spec.request.gpu_mode)
    d["warnings"] = bound_warnings(spec.warnings)
    return d


#: JobSpec's fields in their order, each with its default (``_REQUIRED``: none).
_REQUIRED = object()
_set = object.__setattr__
_SPEC_TEMPLATE: dict[str, Any] = {
    f.name: _REQUIRED if f.default is dataclasses.MISSING else f.default for f in dataclasses.fields(JobSpec)
}


def spec_from_dict(d: Mapping[str, Any]) -> JobSpec:
    """Inverse of :func:`spec_to_dict`; raises KeyError, TypeError or ValueError if
    ``d`` is not one (a missing or unknown field, a GPU mode that does not exist).

    Every pending job's record is decoded once when it is queued, so this builds the
    frozen JobSpec without its generated ``__init__`` and the keyword dicts a call of
    it takes (half the cost): its fields are checked here as the constructor would,
    and JobSpec has no ``__post_init__`` to skip (tests/test_jobspec.py holds both
    to it).
    """
    r = dict(d["request"])
    r["gpu_mode"] = GpuMode(r["gpu_mode"])
    r["servers"] = tuple(r.get("servers", ()))
    r["exclude"] = tuple(r.get("exclude", ()))
    values = _SPEC_TEMPLATE.copy()  # every field, in the constructor's order
    values.update(d)
    if len(values) != len(_SPEC_TEMPLATE) or values["script"] is _REQUIRED:
        unknown = sorted(set(values) - set(_SPEC_TEMPLATE))
        raise TypeError(
            f"a job spec has unknown fields {unknown}" if unknown else "a job spec has no 'script'"
        )
    values["request"] = ResourceRequest(**r)
    values["warnings"] = tuple(values["warnings"])
    spec = object.__new__(JobSpec)
    # One attribute at a time, in the constructor's order, so the instance keeps the
    # class's shared keys (its __dict__ updated at once would be a dict of its own:
    # 1 KB a spec instead of 300 bytes, 12 MB more for 12,000 pending jobs).
    for name, value in values.items():
        _set(spec, name, value)
    return spec


def member_from_dict(m: Mapping[str, Any]) -> MemberPlacement:
    """One member of :meth:`Placement.to_dict`'s ``members`` (without its scores);
    raises KeyError, TypeError or ValueError if it is not one."""
    return MemberPlacement(
        node=str(m["node"]),
        rank=int(m["rank"]),
        gpu_indices=tuple(int(i) for i in m["gpu_indices"]),
        cpus=int(m["cpus"]),
        ram=int(m["ram"]),
        vram_per_gpu=int(m.get("vram_per_gpu") or 0),
    )


def placement_from_dict(d: Mapping[str, Any]) -> Placement:
    """Inverse of :meth:`Placement.to_dict` (without the ranker scores)."""
    return Placement(
        job_id=d["job_id"],
        gpu_mode=GpuMode(d["gpu_mode"]),
        members=tuple(member_from_dict(m) for m in d["members"]),
        whole_member=bool(d.get("whole_member")),
    )
