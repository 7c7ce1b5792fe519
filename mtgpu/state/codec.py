"""The replicated job records, their format version, and their typed form.

The job table replicates plain dicts (they pickle the same in every release); this
module is the one place that knows their fields. :func:`decode_job` turns a record
into a :class:`JobRecord` once, checking each field, and the readers (the API's
views) use that instead of picking the dict apart again.

The format of the state is :data:`mtgpu.STATE_FORMAT`. The job table keeps the format
its records are in (``state_format`` in its full dump; a dump without it is format 1)
and the release that wrote them (``written_by``), and converts older records when it
loads them (:func:`upgrade_jobs`). Journal entries
are replicated calls, the same in every format: the records they make are of the
format of the code applying them.

- Format 1: records hold only the keys their job needed when they were written
  (``requeues``, ``held``, ``numeric_id``, ``placed_time`` may be missing).
- Format 2: every record holds each of those keys (:data:`FORMAT_2_DEFAULTS`).

A record's ``spec`` and ``placement`` are decoded into :mod:`mtgpu.jobspec`'s types,
which refuse keys they do not know: a field added to JobSpec, ResourceRequest or
Placement that a release before it could not read is a new format.

:func:`check_state_dir` looks at a STATE_DIR before the store opens it, so that state
of a newer format, or a damaged record in the dump, is refused with what to do and
nothing is written.
"""

from __future__ import annotations

import gzip
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import pickle as raft_pickle

import mtgpu
from mtgpu.errors import StateError
from mtgpu.jobspec import (
    GpuMode,
    JobSpec,
    MemberPlacement,
    Placement,
    bound_warnings,
    member_from_dict,
    spec_from_dict,
)
from mtgpu.jobstate import JobState

#: The format this release reads and writes.
FORMAT = mtgpu.STATE_FORMAT
#: The release writing it (a dump's ``written_by``).
RELEASE = mtgpu.__version__
#: The oldest format it converts at start.
OLDEST = 1

#: What a format-2 record holds that a format-1 record may lack.
FORMAT_2_DEFAULTS: dict[str, Any] = {"requeues": 0, "held": False, "numeric_id": None, "placed_time": None}


class StateFormatError(StateError):
    """The state is of a format this release cannot read, or a record in it is damaged."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "state_format")


def upgrade_job(record: dict[str, Any], fmt: int) -> dict[str, Any]:
    """``record`` (of format ``fmt``) in :data:`FORMAT`; the same object if nothing changes."""
    if fmt < 2 and any(k not in record for k in FORMAT_2_DEFAULTS):
        record = {**FORMAT_2_DEFAULTS, **record}
    return record


def upgrade_jobs(jobs: dict[str, dict[str, Any]], fmt: int) -> dict[str, dict[str, Any]]:
    """A job table's records (of format ``fmt``) in :data:`FORMAT`, each one's warnings
    within today's bound (:func:`bounded_warnings`)."""
    if fmt > FORMAT:
        raise StateFormatError(newer_text("the job table", fmt))
    out = jobs if fmt == FORMAT else {jid: upgrade_job(j, fmt) for jid, j in jobs.items()}
    for jid, j in out.items():
        trimmed = bounded_warnings(j)
        if trimmed is not j:
            out = out if out is not jobs else dict(jobs)
            out[jid] = trimmed
    return out


def bounded_warnings(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its spec's warnings within the bound every submission gets now
    (:func:`mtgpu.jobspec.bound_warnings`); the same object where they are. A record
    stored before that bound (a state or a journal entry of an older release, 33 MB of
    warnings for one job) is cut when it is read back, the same way on every replica."""
    spec = record.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("warnings"), (list, tuple)):
        return record
    warnings = spec["warnings"]
    bounded = bound_warnings(warnings)
    if len(bounded) == len(warnings) and all(a is b for a, b in zip(bounded, warnings, strict=True)):
        return record
    return {**record, "spec": {**spec, "warnings": list(bounded)}}


def newer_text(where: str, fmt: int, by: str = "") -> str:
    """The refusal of state of format ``fmt`` (newer than this release's)."""
    who = f"MTGPU {by}" if by else "a newer MTGPU"
    run = f"Run MTGPU {by} or newer" if by else "Run the MTGPU that wrote it, or a newer one"
    return (
        f"{where} holds state format {fmt}, written by {who}; this is MTGPU {mtgpu.__version__}, "
        f"which reads formats {OLDEST} to {FORMAT}. Nothing was changed. {run} (mtgpu-setup install)"
    )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to a job, as its record says, checked once.

    ``spec`` is what it asked for and ``placement`` where it went (None until it is
    placed), typed as :mod:`mtgpu.jobspec` defines them. ``raw`` is the record it was
    made from (the table replaces a record whole when its job changes, so a JobRecord
    made from the same dict is still right).
    """

    job_id: str
    array_id: str | None
    array_task: int | None
    numeric_id: str | None
    name: str
    user: str
    uid: int
    state: JobState
    spec: JobSpec
    placement: Placement | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    placed_time: float | None
    #: sbatch's --begin, as a time: not started before it.
    begin_time: float | None
    exit_code: int | None
    reason: str
    term: int | None
    cancel_requested: bool
    held: bool
    requeues: int
    requeue_reason: str | None
    #: A requeued job's earlier run that may still be running: ``{"attempt": N,
    #: "members": [...]}`` (None when there is none or it is known to be over).
    old_run: Mapping[str, Any] | None
    workdir: str
    #: What the submitting shell gave the job: ``env`` (the exported environment),
    #: ``umask``, ``rlimits``.
    submit: Mapping[str, Any]
    #: The cluster name the job's output files were named for.
    log_cluster: str
    container_ref: str | None
    image_id: str | None
    progress: Mapping[str, str]
    usage: Mapping[str, Mapping[str, Any]]
    gpu_info: Mapping[str, tuple[Mapping[str, Any], ...]]
    raw: Mapping[str, Any]

    @property
    def attempt(self) -> int:
        """Which start this is (0 first, one more per requeue)."""
        return self.requeues

    @property
    def members(self) -> tuple[MemberPlacement, ...]:
        """The placement's members in rank order (none before it is placed)."""
        return self.placement.members if self.placement is not None else ()

    @property
    def nodes(self) -> list[str]:
        return [m.node for m in self.members]

    def member_on(self, node: str) -> MemberPlacement | None:
        """This job's member on ``node``, if it has one there."""
        for m in self.members:
            if m.node == node:
                return m
        return None

    @property
    def container(self) -> Mapping[str, Any] | None:
        """The image a containerized job runs in (``ref``, ``id``, ...), else None."""
        c = self.raw.get("container")
        return c if c else None

    @property
    def cpus(self) -> int:
        return self.spec.request.cpus

    @property
    def ram(self) -> int:
        return self.spec.request.ram

    @property
    def exclusive(self) -> bool:
        return self.spec.request.whole_member

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def time_limit(self) -> float | None:
        return self.spec.time_limit

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.spec.warnings


_NUM = (int, float)

#: The exact types that pass each kind's check at once (the rest take the full check).
_EXACT: dict[Any, frozenset[type]] = {
    str: frozenset({str}),
    int: frozenset({int}),
    _NUM: frozenset({int, float}),
    Mapping: frozenset({dict, types.MappingProxyType}),
}
_ABSENT = object()


def _field(
    j: Mapping[str, Any], key: str, kind: Any, default: Any = ..., *, of: Any = None, within: str = ""
) -> Any:
    """``j[key]``, checked to be a ``kind`` (None allowed where ``default`` is None);
    ``of``: the record ``j`` is part of (for the job's id in the message)."""
    v = j.get(key, _ABSENT)
    if type(v) in _EXACT[kind]:  # nearly every field: one lookup, one set test
        return v
    if v is _ABSENT:
        if default is ...:
            jid = (of if of is not None else j).get("job_id", "?")
            raise StateFormatError(f"the record of job {jid!r} has no {within + key!r}")
        return default
    if v is None and default is None:
        return None
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        jid = (of if of is not None else j).get("job_id", "?")
        raise StateFormatError(
            f"the record of job {jid!r} has {within + key!r} = {v!r:.80}, not {_kind(kind)}"
        )
    return v


def _kind(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


#: The empty mapping every record without progress, usage or GPU details shares.
_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _mapping(v: Any) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(v)) if v else _EMPTY


def _spec(j: Mapping[str, Any], jid: str) -> JobSpec:
    spec = _field(j, "spec", Mapping)
    request = _field(spec, "request", Mapping, of=j, within="spec.")
    for key in ("cpus", "ram"):
        _field(request, key, int, of=j, within="spec.request.")
    _field(spec, "priority", int, of=j, within="spec.")
    _field(spec, "time_limit", _NUM, None, of=j, within="spec.")
    try:
        return spec_from_dict(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFormatError(f"the record of job {jid!r} has a damaged spec: {exc!r:.120}") from None


def _placement(j: Mapping[str, Any], jid: str) -> Placement | None:
    placement = _field(j, "placement", Mapping, None)
    if not placement:
        return None
    members = []
    for m in placement.get("members", ()):
        try:
            members.append(member_from_dict(m))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFormatError(
                f"the record of job {jid!r} has a damaged placement member {m!r:.80}: {exc!r}"
            ) from None
    try:
        mode = GpuMode(placement["gpu_mode"])
    except (KeyError, ValueError) as exc:
        raise StateFormatError(
            f"the record of job {jid!r} has a placement with no GPU mode: {exc!r}"
        ) from None
    return Placement(
        job_id=str(placement.get("job_id", jid)),
        gpu_mode=mode,
        members=tuple(members),
        whole_member=bool(placement.get("whole_member")),
    )


#: Specs a :data:`SpecCache` holds before it starts again.
SPEC_CACHE = 4096
#: Decoded specs by the identity of their dict: ``{id(d): (d, JobSpec)}``. The tasks
#: of an array share one spec dict, so an array's spec is decoded once.
SpecCache = dict[int, tuple[Mapping[str, Any], JobSpec]]


def decode_job(
    j: Mapping[str, Any], before: JobRecord | None = None, specs: SpecCache | None = None
) -> JobRecord:
    """The typed form of a job record (of :data:`FORMAT`, or older: missing keys take
    their defaults). Raises StateFormatError naming the job and the field that is wrong.

    ``before``: the job's record before this change, whose spec and placement are
    kept where the new record holds the same dicts (the table shares them between a
    job's records), so a transition decodes only what it changed. ``specs``: specs
    decoded for other records (kept in it too)."""
    if not isinstance(j, Mapping):
        raise StateFormatError(f"a job record is a {type(j).__name__}, not a mapping")
    jid = _field(j, "job_id", str)
    state_name = _field(j, "state", str)
    try:
        state = JobState(state_name)
    except ValueError:
        raise StateFormatError(
            f"the record of job {jid!r} has the state {state_name!r:.40}, which is no job state"
        ) from None
    raw_spec = j.get("spec")
    if before is not None and before.raw.get("spec") is raw_spec:
        spec = before.spec
    elif specs is not None and (hit := specs.get(id(raw_spec))) is not None and hit[0] is raw_spec:
        spec = hit[1]
    else:
        spec = _spec(j, jid)
        if specs is not None and isinstance(raw_spec, Mapping):
            if len(specs) >= SPEC_CACHE:
                specs.clear()
            specs[id(raw_spec)] = (raw_spec, spec)
    if before is not None and before.raw.get("placement") is j.get("placement"):
        placement = before.placement
    else:
        placement = _placement(j, jid)
    container = _field(j, "container", Mapping, None) or {}
    return JobRecord(
        job_id=jid,
        array_id=_field(j, "array_id", str, None),
        array_task=_field(j, "array_task", int, None),
        numeric_id=_field(j, "numeric_id", str, None),
        name=_field(j, "name", str),
        user=_field(j, "user", str),
        uid=_field(j, "uid", int),
        state=state,
        spec=spec,
        placement=placement,
        submit_time=_field(j, "submit_time", _NUM),
        start_time=_field(j, "start_time", _NUM, None),
        end_time=_field(j, "end_time", _NUM, None),
        placed_time=_field(j, "placed_time", _NUM, None),
        begin_time=_field(j, "begin_time", _NUM, None),
        exit_code=_field(j, "exit_code", int, None),
        reason=_field(j, "reason", str, None) or "",
        term=_field(j, "term", int, None),
        cancel_requested=bool(j.get("cancel_requested")),
        held=bool(j.get("held")),
        requeues=int(_field(j, "requeues", int, None) or 0),
        requeue_reason=_field(j, "requeue_reason", str, None),
        old_run=_field(j, "old_run", Mapping, None) or None,
        workdir=_field(j, "workdir", str),
        submit=_field(j, "submit", Mapping, None) or _EMPTY,
        log_cluster=_field(j, "log_cluster", str, None) or "",
        container_ref=container.get("ref"),
        image_id=container.get("id"),
        progress=_mapping(j.get("progress")),
        usage=_mapping({n: _mapping(u) for n, u in usage.items()}) if (usage := j.get("usage")) else _EMPTY,
        gpu_info=(
            _mapping({n: tuple(_mapping(g) for g in gs or ()) for n, gs in gpu_info.items()})
            if (gpu_info := j.get("gpu_info"))
            else _EMPTY
        ),
        raw=j,
    )


def _is_job_table(data: Any) -> bool:
    return isinstance(data, dict) and "jobs" in data and "next_id" in data


def read_dump(state_dir: str | Path) -> Any:
    """The full dump under ``state_dir`` as PySyncObj wrote it, or None if there is none."""
    return read_dump_file(Path(state_dir) / "raft.dump")


def read_dump_file(path: str | Path) -> Any:
    """The full dump in ``path`` (PySyncObj's gzipped pickle), or None if there is none."""
    try:
        with gzip.open(path, "rb") as f:
            return raft_pickle.load(f)
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError) as exc:
        raise StateFormatError(f"{path} cannot be read: {exc}; restore it from a backup") from exc


def check_state_dir(state_dir: str | Path) -> int | None:
    """Refuse (StateFormatError) a STATE_DIR whose full dump is of a newer format than
    :data:`FORMAT` or holds a damaged job record; reads only. Returns the dump's format
    (None without a dump): an older one is converted as the store loads it."""
    return check_dump(read_dump(state_dir), f"STATE_DIR {state_dir}")


def check_received_dump(path: str | Path) -> int | None:
    """:func:`check_state_dir` for a full dump the scheduler sent (``path``, before it
    replaces this member's): a member of an older release must not load, or keep on
    disk, state it would misread."""
    return check_dump(read_dump_file(path), "the full dump the scheduler sent")


def check_dump(data: Any, where: str) -> int | None:
    """The checks of :func:`check_state_dir` on a loaded dump (None: no dump)."""
    if data is None:
        return None
    try:
        parts = data[0] if isinstance(data[0], list) else [data[0]]
    except (TypeError, IndexError, KeyError):
        raise StateFormatError(
            f"the full dump in {where} is not PySyncObj's; restore it from a backup"
        ) from None
    tables = [p for p in parts if _is_job_table(p)]
    if not tables:
        return None
    table = tables[0]
    fmt = table.get("state_format", 1)
    if not isinstance(fmt, int) or fmt < OLDEST:
        raise StateFormatError(f"the job table in {where} claims state format {fmt!r}, which no MTGPU wrote")
    if fmt > FORMAT:
        by = table.get("written_by")
        raise StateFormatError(newer_text(where, fmt, by if isinstance(by, str) else ""))
    jobs = table["jobs"]
    if not isinstance(jobs, dict):
        raise StateFormatError(
            f"the job table in {where} holds {type(jobs).__name__} for its jobs, not a mapping"
        )
    specs: SpecCache = {}
    for jid, j in jobs.items():
        rec = decode_job(j, specs=specs)
        if rec.job_id != jid:
            raise StateFormatError(
                f"the job table in {where} keeps the record of job {rec.job_id!r} as {jid!r}"
            )
    return int(fmt)
