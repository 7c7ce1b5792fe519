"""The pending queue and one scheduling pass: priority with aging, a reservation for the
head job, backfill that does not delay it, and array ``%N`` limits.

Order. A job's effective priority is ``priority + age_weight * seconds waited``
(default: 10 points an hour). Every job ages at the same rate, so the order never
changes with time: it is the order of ``priority - age_weight * submit_time``, kept
sorted as jobs arrive. A priority-0 job overtakes a fresh job of the default
priority 50 after 5 hours; no job waits forever behind newer ones.

One pass (:func:`schedule_pass`) walks the queue in that order on a
:class:`~mtgpu.schedd.placement.Plan` of the snapshot:

1. A job that fits now is placed and committed to the plan.
2. The first job that does not fit (the head) gets a reservation: running work is
   released in the order it is expected to end (start plus time limit) until the head
   fits. That time is its shadow time, those resources its reservation.
3. Every later job is a backfill candidate (EASY backfill). It may start now if it
   fits now and either ends before the shadow time (its time limit says so) or also
   fits beside the reservation at the shadow time. Jobs without a time limit, and
   every job when the shadow time is unknown (the head waits for unlimited work),
   must leave the reserved resources alone.
4. An array task waits with ``JobArrayTaskLimit`` while ``%N`` tasks of its array run.

A pass is pure: it reads the snapshot and the queue and returns placements and
pending reasons; the daemon journals the placements and removes those jobs.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from bisect import insort
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from mtgpu.schedd.jobfile import expand_array
from mtgpu.schedd.placement import Plan
from mtgpu.schedd.timefmt import format_time_limit
from mtgpu.schedd.types import (
    ClusterSnapshot,
    JobSpec,
    PendingJob,
    Placement,
    Reason,
    ResourceRequest,
)

#: Priority points a job gains per second of waiting (10 an hour).
DEFAULT_AGE_WEIGHT = 10.0 / 3600


@dataclass(frozen=True)
class QueuePolicy:
    """Knobs of a pass. ``max_examined`` bounds the queue entries one pass looks at, as
    Slurm's ``default_queue_depth`` does, so a pass costs the same at 10k or 100k pending."""

    max_examined: int = 2000
    #: Tries to move a backfill job off a reservation's members before giving up.
    backfill_retries: int = 3
    #: Jobs a pass tries to make the head before giving up on a reservation. Trying can
    #: fail when what blocks a job is not work MTGPU placed (a process outside MTGPU
    #: holding VRAM); each try walks the running work, so the tries are few.
    reserve_attempts: int = 3
    #: Jobs one pass places at most (Slurm's ``sched_max_job_start``): a burst of a
    #: thousand tasks is placed over a few passes, so no pass holds the scheduler's
    #: loop long enough to delay its Raft heartbeats into an election.
    max_placements: int = 256


@dataclass(frozen=True)
class Reservation:
    """Resources held for the head job. ``start_time`` None: it waits for unlimited work."""

    job_id: str
    start_time: float | None
    placement: Placement
    #: With no start time: the running work without a time limit it waits for (ids).
    waits_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class PendingInfo:
    """Why a job (or the rest of an array, keyed by the array id) still waits, and where.

    ``position`` is 1 for the next entry to be considered; the pending tasks of one
    array share their array's position, as Slurm lists them on one line.
    """

    job_id: str
    position: int
    reason: str
    message: str
    effective_priority: float
    expected_start: float | None = None
    array_tasks: int = 0
    per_filter_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class PassResult:
    """What one pass decided. ``pending`` covers the entries examined; ``complete`` is
    False when ``max_examined`` stopped the pass before the end of the queue."""

    placements: list[Placement]
    pending: dict[str, PendingInfo]
    reservation: Reservation | None
    examined: int
    complete: bool


class _Entry:
    """One queue entry: a job, or the pending tasks of one array (same priority and submit time)."""

    __slots__ = ("alive", "head", "job", "key", "priority", "rank", "submit_time", "task_order", "tasks")

    def __init__(self, key: str, rank: tuple[float, float, int], job: PendingJob, is_array: bool) -> None:
        self.key = key
        self.rank = rank
        self.priority = job.priority
        self.submit_time = job.submit_time
        self.alive = True
        self.job: PendingJob | None = None if is_array else job
        self.tasks: dict[int, PendingJob] = {}
        self.task_order: list[int] = []
        self.head = 0

    def pending_tasks(self) -> Iterator[PendingJob]:
        """Array tasks still pending, lowest index first."""
        order, tasks = self.task_order, self.tasks
        for pos in range(self.head, len(order)):
            job = tasks.get(order[pos])
            if job is not None:
                yield job


class PendingQueue:
    """Pending jobs in effective-priority order, without re-sorting as time passes.

    Jobs are kept in one list per priority value, each in submit order, and merged on
    reading; adding a job is an append (an insertion when it is older than the last),
    and removing one marks it. An array's tasks sharing a priority and submit time form
    one entry, so a throttled array of 100,000 tasks costs one step in a pass.
    """

    def __init__(self, age_weight: float = DEFAULT_AGE_WEIGHT) -> None:
        self.age_weight = age_weight
        self._classes: dict[int, list[_Entry]] = {}
        # Where each class's live entries begin: placed jobs leave from the front.
        self._start: dict[int, int] = {}
        self._by_job: dict[str, tuple[_Entry, int | None]] = {}
        self._groups: dict[tuple[str, int, float], _Entry] = {}
        self._dead: dict[int, int] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._by_job)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_job

    def get(self, job_id: str) -> PendingJob | None:
        """The pending job with this id, or None."""
        found = self._by_job.get(job_id)
        if found is None:
            return None
        entry, task = found
        return entry.job if task is None else entry.tasks.get(task)

    def effective_priority(self, job: PendingJob, now: float) -> float:
        """``priority + age_weight * seconds waited``."""
        return job.priority + self.age_weight * max(0.0, now - job.submit_time)

    def add(self, job: PendingJob) -> None:
        """Queue a job or array task (ValueError if its id is already queued)."""
        if job.job_id in self._by_job:
            raise ValueError(f"job {job.job_id} is already pending")
        if job.array_id is not None and job.array_task is not None:
            gkey = (job.array_id, job.priority, job.submit_time)
            entry = self._groups.get(gkey)
            if entry is None or not entry.alive:
                entry = self._new_entry(job.array_id, job, is_array=True)
                self._groups[gkey] = entry
            if job.array_task in entry.tasks:
                raise ValueError(f"array task {job.array_id}_{job.array_task} is already pending")
            entry.tasks[job.array_task] = job
            order = entry.task_order
            if not order or job.array_task > order[-1]:
                order.append(job.array_task)
            else:
                insort(order, job.array_task, lo=entry.head)
        else:
            entry = self._new_entry(job.job_id, job, is_array=False)
        self._by_job[job.job_id] = (entry, job.array_task if entry.job is None else None)

    def _new_entry(self, key: str, job: PendingJob, is_array: bool) -> _Entry:
        rank = (-(job.priority - self.age_weight * job.submit_time), job.submit_time, next(self._seq))
        entry = _Entry(key, rank, job, is_array)
        lst = self._classes.setdefault(job.priority, [])
        if not lst or lst[-1].rank <= rank:
            lst.append(entry)
        else:  # older than the newest (a requeue, or a rebuild after failover)
            insort(lst, entry, lo=self._start.get(job.priority, 0), key=lambda e: e.rank)
        return entry

    def remove(self, job_id: str) -> PendingJob | None:
        """Take a job out (placed, cancelled); returns it, or None if it was not pending."""
        found = self._by_job.pop(job_id, None)
        if found is None:
            return None
        entry, task = found
        if task is None:
            assert entry.job is not None
            job = entry.job
        else:
            job = entry.tasks.pop(task)
            order = entry.task_order
            while entry.head < len(order) and order[entry.head] not in entry.tasks:
                entry.head += 1
            if entry.head > 64 and entry.head * 2 > len(order):
                del order[: entry.head]
                entry.head = 0
            if entry.tasks:
                return job
            self._groups.pop((entry.key, entry.priority, entry.submit_time), None)
        entry.alive = False
        prio = entry.priority
        lst = self._classes[prio]
        start = self._start.get(prio, 0)
        while start < len(lst) and not lst[start].alive:
            start += 1
        self._start[prio] = start
        self._dead[prio] = self._dead.get(prio, 0) + 1
        if self._dead[prio] * 2 > len(lst):  # compact; amortized O(1) per removal
            self._classes[prio] = [e for e in lst[start:] if e.alive]
            self._dead[prio] = self._start[prio] = 0
        return job

    def entries(self) -> Iterator[_Entry]:
        """Live entries, highest effective priority first (ties: older first)."""
        lists = [_tail(lst, self._start.get(prio, 0)) for prio, lst in self._classes.items() if lst]
        for entry in heapq.merge(*lists, key=lambda e: e.rank):
            if entry.alive:
                yield entry

    def jobs(self) -> Iterator[PendingJob]:
        """Every pending job in queue order."""
        for entry in self.entries():
            if entry.job is not None:
                yield entry.job
            else:
                yield from entry.pending_tasks()

    def positions(self) -> dict[str, int]:
        """Position (1 = next) of every pending job; an array's tasks share one position."""
        out: dict[str, int] = {}
        for pos, entry in enumerate(self.entries(), start=1):
            if entry.job is not None:
                out[entry.job.job_id] = pos
            else:
                for job in entry.pending_tasks():
                    out[job.job_id] = pos
        return out


def _tail(lst: list[_Entry], start: int) -> Iterator[_Entry]:
    """``lst[start:]`` without copying it."""
    for pos in range(start, len(lst)):
        yield lst[pos]


def pending_jobs(job_id: str, tenant: str, spec: JobSpec, submit_time: float) -> list[PendingJob]:
    """The queue entries for a submitted job: one, or one per array index (``ID_INDEX``)."""
    job = PendingJob(
        job_id=job_id,
        tenant=tenant,
        request=spec.request,
        priority=spec.priority,
        submit_time=submit_time,
        time_limit=spec.time_limit,
    )
    if not spec.array:
        return [job]
    return [
        dataclasses.replace(
            job, job_id=f"{job_id}_{i}", array_id=job_id, array_task=i, array_limit=spec.array_limit
        )
        for i in expand_array(spec)
    ]


# --------------------------------------------------------------------------- the pass


class _Pass:
    """State of one pass; see :func:`schedule_pass`."""

    def __init__(self, snapshot: ClusterSnapshot, now: float, policy: QueuePolicy) -> None:
        self.snapshot = snapshot
        self.now = now
        self.policy = policy
        self.plan = Plan(snapshot)
        self.placements: list[Placement] = []
        self.ends: list[tuple[float | None, Placement]] = []  # this pass's placements, expected end
        self.reservation: Reservation | None = None
        self.reserve_attempts = policy.reserve_attempts
        self.shadow: Plan | None = None  # the cluster at the shadow time, reservation held
        self.failed: dict[tuple[ResourceRequest, bool], Reason] = {}
        # Requests that found no room now, by kind; a request of the same kind needing at
        # least as much of everything cannot find room either (see _dominated).
        self.no_room: dict[tuple[object, ...], list[tuple[int, int, int, int, int, ResourceRequest]]] = {}
        self.array_running: Counter[str] = Counter(a.array_id for a in snapshot.running if a.array_id)

    def try_job(self, job: PendingJob) -> Reason | None:
        """Place ``job`` if the rules allow; None when placed, else why not."""
        res = self.reservation
        long = res is not None and (
            res.start_time is None or job.time_limit is None or self.now + job.time_limit > res.start_time
        )
        shape = (job.request, long)
        cached = self.failed.get(shape) or self._dominated(job.request)
        if cached is not None:
            return cached
        got = self.plan.place(job, self.now)
        if isinstance(got, Reason):
            # The plan only fills up during a pass, so the same request fails again.
            self.failed[(job.request, False)] = self.failed[(job.request, True)] = got
            if got.code == "Resources":
                self._remember_no_room(job.request)
            if res is None and got.code == "Resources" and self.reserve_attempts > 0:
                self.reserve_attempts -= 1
                return self.reserve(job, got)
            return got
        if long:
            assert self.shadow is not None
            avoid: set[str] = set()
            for _ in range(self.policy.backfill_retries):
                if self.shadow.fits(got):
                    break
                avoid.update(m.node for m in got.members)
                retry = self.plan.place(job, self.now, exclude=avoid)
                if isinstance(retry, Reason):
                    break
                got = retry
            if not self.shadow.fits(got):
                assert res is not None
                reason = Reason(
                    "Priority",
                    f"it fits now, but only on resources reserved for job "
                    f"{res.job_id}{_start_text(res.start_time, self.now, res.waits_for)}",
                    {"reserved": len(avoid) or len(got.members)},
                )
                self.failed[shape] = reason
                return reason
            self.shadow.commit(got)
        self.commit(job, got)
        return None

    @staticmethod
    def _kind(req: ResourceRequest) -> tuple[object, ...]:
        return (
            req.gpu_brand,
            req.gpu_type,
            req.gpu_mode if req.gpus else None,
            req.servers,
            req.exclude,
            req.constraint,
            req.whole_member,
        )

    def _dominated(self, req: ResourceRequest) -> Reason | None:
        """A Resources reason if a no-bigger request of the same kind already found no room.

        Placement is exact when it fails (every indexed candidate is checked), and asking
        for more GPUs, VRAM, CPUs, RAM or members can only shrink the members that fit.
        """
        for gpus, vram, cpus, ram, nodes, smaller in self.no_room.get(self._kind(req), ()):
            if (
                gpus <= req.gpus
                and vram <= req.vram
                and cpus <= req.cpus
                and ram <= req.ram
                and nodes <= req.nodes
            ):
                reason = Reason(
                    "Resources",
                    f"needs {req.describe()}; no room now: even {smaller.describe()} does not fit",
                )
                self.failed[(req, False)] = self.failed[(req, True)] = reason
                return reason
        return None

    def _remember_no_room(self, req: ResourceRequest) -> None:
        entries = self.no_room.setdefault(self._kind(req), [])
        if len(entries) < 64:
            entries.append((req.gpus, req.vram, req.cpus, req.ram, req.nodes, req))

    def commit(self, job: PendingJob, placement: Placement) -> None:
        self.plan.commit(placement)
        self.placements.append(placement)
        self.ends.append((None if job.time_limit is None else self.now + job.time_limit, placement))
        if job.array_id is not None:
            self.array_running[job.array_id] += 1

    def reserve(self, job: PendingJob, why: Reason) -> Reason:
        """Make ``job`` the head: find when and where it could start, and hold that."""
        holding = [(a.expected_end, a.placement) for a in self.snapshot.running] + self.ends
        events = sorted(
            ((end, i, p) for i, (end, p) in enumerate(holding) if end is not None), key=lambda e: (e[0], e[1])
        )
        future = self.plan.copy()
        start: float | None = None
        got: Placement | Reason = why
        for end, batch in itertools.groupby(events, key=lambda e: e[0]):
            for _, _, placement in batch:
                future.release(placement)
            got = future.place(job, self.now)
            if isinstance(got, Placement):
                start = max(end, self.now)
                break
        waits_for: tuple[str, ...] = ()
        if not isinstance(got, Placement):
            # It waits for work without a time limit: hold the resources it would get
            # once everything has ended, with no start time to promise.
            unlimited = [placement for end, placement in holding if end is None]
            for placement in unlimited:
                future.release(placement)
            got = future.place(job, self.now)
            if isinstance(got, Placement):
                # Name what it waits for: the unlimited work on the members it would get.
                mine = set(got.nodes)
                waits_for = tuple(sorted({p.job_id for p in unlimited if mine & set(p.nodes)}))
        if not isinstance(got, Placement):
            return why
        future.commit(got)
        self.shadow = future
        self.reservation = Reservation(job.job_id, start, got, waits_for)
        return Reason(
            "Resources",
            f"{why.message}; resources are reserved for it on "
            f"{','.join(got.nodes)}{_start_text(start, self.now, waits_for)}",
            why.per_filter_counts,
        )


def _start_text(start: float | None, now: float, waits_for: tuple[str, ...] = ()) -> str:
    if start is None:
        if not waits_for:
            return " once the work holding them ends"
        shown = ", ".join(waits_for[:5]) + (" ..." if len(waits_for) > 5 else "")
        return (
            f" once job{'s' if len(waits_for) > 1 else ''} {shown} "
            f"end{'' if len(waits_for) > 1 else 's'} (no time limit)"
        )
    return f", expected to start within {format_time_limit(max(0.0, start - now))}"


def schedule_pass(
    snapshot: ClusterSnapshot, queue: PendingQueue, now: float, policy: QueuePolicy | None = None
) -> PassResult:
    """Decide what starts now: placements to journal, and why every examined job waits.

    Pure: neither ``snapshot`` nor ``queue`` is changed, and ``now`` is the only time
    used. The caller commits the placements and removes those jobs from the queue.
    """
    policy = policy or QueuePolicy()
    state = _Pass(snapshot, now, policy)
    pending: dict[str, PendingInfo] = {}
    examined = 0
    complete = True
    position = 1  # among the entries still pending after this pass
    for entry in queue.entries():
        if examined >= policy.max_examined or len(state.placements) >= policy.max_placements:
            complete = False
            break
        examined += 1
        prio = entry.priority + queue.age_weight * max(0.0, now - entry.submit_time)
        if entry.job is not None:
            why = state.try_job(entry.job)
            if why is not None:
                pending[entry.key] = _info(entry.key, position, why, prio, state, entry.job.job_id)
                position += 1
            continue
        why = None
        placed = 0
        task_id = None
        for task in entry.pending_tasks():
            if len(state.placements) >= policy.max_placements:
                complete = False
                break
            task_id = task.job_id
            limit = task.array_limit
            if limit is not None and state.array_running[entry.key] >= limit:
                why = Reason(
                    "JobArrayTaskLimit",
                    f"{limit} task(s) of array {entry.key} are running, its %{limit} limit",
                )
                break
            why = state.try_job(task)
            if why is not None:
                why = _for_array(why, task.job_id)
                break
            placed += 1
        remaining = len(entry.tasks) - placed
        if why is not None and remaining > 0:
            pending[entry.key] = _info(entry.key, position, why, prio, state, task_id, remaining)
            position += 1
    return PassResult(state.placements, pending, state.reservation, examined, complete)


def _for_array(why: Reason, task_id: str) -> Reason:
    return Reason(why.code, f"next task {task_id}: {why.message}", why.per_filter_counts)


def _info(
    key: str, position: int, why: Reason, prio: float, state: _Pass, job_id: str | None, tasks: int = 0
) -> PendingInfo:
    res = state.reservation
    start = res.start_time if res is not None and job_id is not None and res.job_id == job_id else None
    return PendingInfo(
        job_id=key,
        position=position,
        reason=why.code,
        message=why.message,
        effective_priority=round(prio, 3),
        expected_start=start,
        array_tasks=tasks,
        per_filter_counts=dict(why.per_filter_counts),
    )
