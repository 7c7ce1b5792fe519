"""Job dependencies (sbatch's ``--dependency``), holds and deferred starts: the gates a
pending job passes before the queue considers it.

A dependency is ``TYPE:ID[:ID...]`` items, all of which must be met when joined by
``,`` or any one when joined by ``?`` (the two are not mixed, as in Slurm):

- ``after:ID`` once job ID has started (or ended without starting);
- ``afterany:ID`` once it has ended, however;
- ``afterok:ID`` once it has COMPLETED; never if it ended otherwise;
- ``afternotok:ID`` once it has ended other than COMPLETED; never if it COMPLETED;
- ``singleton`` once no earlier job of the same tenant and name is pending or running.

An array's id stands for all its tasks. :func:`gate` is pure: it reads the job
records it is given and the time it is told.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtgpu.jobstate import COMPLETED, FINAL_STATES, PENDING
from mtgpu.state.codec import JobRecord

if TYPE_CHECKING:
    from mtgpu.schedd.jobtable import JobTable

KINDS = ("after", "afterany", "afterok", "afternotok", "singleton")
#: The most job ids one dependency may name.
MAX_DEPENDENCY_IDS = 1000
_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,7})?", re.ASCII)
FINAL = FINAL_STATES
#: Slurm's pending reasons for the gates.
HELD, DEPENDENCY, NEVER, BEGIN = "JobHeldUser", "Dependency", "DependencyNeverSatisfied", "BeginTime"


@dataclass(frozen=True, slots=True)
class Dependency:
    """A parsed ``--dependency``: ``items`` of (kind, job ids), all (``any_of`` False)
    or any one of which must be met."""

    items: tuple[tuple[str, tuple[str, ...]], ...]
    any_of: bool = False

    def job_ids(self) -> tuple[str, ...]:
        """Every job id it names."""
        return tuple(i for _, ids in self.items for i in ids)


def parse_dependency(text: str) -> Dependency:
    """Parse ``--dependency``; ValueError names what is wrong.

    >>> parse_dependency("afterok:12:13,afterany:14_2")
    Dependency(items=(('afterok', ('12', '13')), ('afterany', ('14_2',))), any_of=False)
    >>> parse_dependency("afternotok:5?singleton").any_of
    True
    >>> parse_dependency("afterok:x")
    Traceback (most recent call last):
    ...
    ValueError: 'x' is not a job id
    """
    text = text.strip()
    if "," in text and "?" in text:
        raise ValueError("',' (all of) and '?' (any of) cannot be mixed")
    any_of = "?" in text
    items: list[tuple[str, tuple[str, ...]]] = []
    count = 0
    for part in [p.strip() for p in text.split("?" if any_of else ",")]:
        kind, _, rest = part.partition(":")
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise ValueError(f"{kind[:20]!r} is not a dependency; expected one of {', '.join(KINDS)}")
        if kind == "singleton":
            if rest:
                raise ValueError("singleton takes no job ids")
            items.append((kind, ()))
            continue
        ids = tuple(i.strip().split("+", 1)[0] for i in rest.split(":"))
        if not rest or not ids:
            raise ValueError(f"{kind} needs job ids, such as {kind}:12")
        for i in ids:
            if not _ID.fullmatch(i):
                raise ValueError(f"{i[:20]!r} is not a job id")
        count += len(ids)
        if count > MAX_DEPENDENCY_IDS:
            raise ValueError(f"a dependency names at most {MAX_DEPENDENCY_IDS} jobs")
        items.append((kind, ids))
    if not items:
        raise ValueError("it names no dependency")
    return Dependency(tuple(items), any_of)


def _one(kind: str, jobs: list[JobRecord]) -> tuple[str, str]:
    """("ok" | "wait" | "never", why) for one item over the records it names."""
    if kind == "after":
        waiting = [j for j in jobs if j.state not in FINAL and not j.start_time]
        return ("wait", f"job {waiting[0].job_id} has not started") if waiting else ("ok", "")
    left = [j for j in jobs if j.state not in FINAL]
    if kind == "afterany":
        return ("wait", f"job {left[0].job_id} has not ended") if left else ("ok", "")
    wrong = [j for j in jobs if j.state in FINAL and (j.state == COMPLETED) != (kind == "afterok")]
    if wrong:
        j = wrong[0]
        return "never", f"job {j.job_id} ended {j.state} ({kind})"
    return ("wait", f"job {left[0].job_id} has not ended") if left else ("ok", "")


def gate(
    job: JobRecord,
    spec_dependency: str | None,
    tasks_of: Callable[[str], list[JobRecord]],
    same_name: Iterable[JobRecord],
    now: float,
) -> tuple[str, str, str]:
    """Whether pending ``job`` may be queued: ``("ok", "", "")``, or ``("wait" |
    "never", REASON, why)`` with Slurm's reason (JobHeldUser, BeginTime, Dependency,
    DependencyNeverSatisfied). ``tasks_of(ID)`` gives the records an id names (an
    array's tasks); ``same_name`` the tenant's jobs of the same name (for singleton)."""
    if job.held:
        return "wait", HELD, "held: `mt-job release` lets it start"
    begin = job.begin_time
    if begin and begin > now:
        return "wait", BEGIN, "it may not start before its --begin time"
    if not spec_dependency:
        return "ok", "", ""
    dep = parse_dependency(spec_dependency)
    results = []
    for kind, ids in dep.items:
        if kind == "singleton":
            earlier = [
                j
                for j in same_name
                if j.job_id != job.job_id and j.state not in FINAL and _order(j) < _order(job)
            ]
            results.append(("wait", f"job {earlier[0].job_id} of the same name") if earlier else ("ok", ""))
            continue
        records = [r for i in ids for r in tasks_of(i)]
        missing = [i for i in ids if not tasks_of(i)]
        if missing:
            # Its record is gone (purged after JOB_RETENTION_DAYS): only after/afterany are met.
            results.append(
                ("ok", "") if kind in ("after", "afterany") else ("never", f"job {missing[0]} is gone")
            )
            continue
        results.append(_one(kind, records))
    states = [s for s, _ in results]
    if dep.any_of:
        if "ok" in states:
            return "ok", "", ""
        if all(s == "never" for s in states):
            return "never", NEVER, "; ".join(w for _, w in results)
        return "wait", DEPENDENCY, next(w for s, w in results if s == "wait")
    if "never" in states:
        return "never", NEVER, next(w for s, w in results if s == "never")
    if "wait" in states:
        return "wait", DEPENDENCY, next(w for s, w in results if s == "wait")
    return "ok", "", ""


def _order(j: JobRecord) -> tuple[float, int, int]:
    base, _, task = j.job_id.partition("_")
    return (j.submit_time, int(base) if base.isdigit() else 0, int(task) if task.isdigit() else -1)


_REL = re.compile(
    r"now\+([0-9]{1,9})(seconds|second|sec|s|minutes|minute|min|m|hours|hour|h|days|day|d|weeks|week|w)?",
    re.ASCII,
)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_begin(text: str, now: float) -> float:
    """sbatch's ``--begin`` as seconds since the epoch: ``now+N[seconds|minutes|hours|
    days|weeks]``, ``HH:MM[:SS]`` (today, or tomorrow once past), ``YYYY-MM-DD``
    and ``YYYY-MM-DDTHH:MM[:SS]`` (local time), ``now``, ``midnight``, ``noon``.

    >>> parse_begin("now+2hours", 1000.0)
    8200.0
    >>> parse_begin("now", 5.0)
    5.0
    """
    import datetime as dt

    t = text.strip().lower()
    m = _REL.fullmatch(t)
    if m:
        unit = (m.group(2) or "s")[0]
        return now + int(m.group(1)) * _UNIT[unit]
    if t == "now":
        return now
    today = dt.datetime.fromtimestamp(now)
    named = {"midnight": "00:00", "noon": "12:00", "teatime": "16:00"}
    t = named.get(t, t)
    for fmt in ("%H:%M", "%H:%M:%S"):
        try:
            clock = dt.datetime.strptime(t, fmt).time()
        except ValueError:
            continue
        at = dt.datetime.combine(today.date(), clock)
        if at.timestamp() < now:
            at += dt.timedelta(days=1)
        return at.timestamp()
    for fmt in ("%Y-%m-%d", "%Y-%m-%dt%H:%M", "%Y-%m-%dt%H:%M:%S"):
        try:
            return dt.datetime.strptime(t, fmt).timestamp()
        except ValueError:
            continue
    raise ValueError(
        f"{text[:40]!r} is not a start time; expected now+N[minutes|hours|days], HH:MM[:SS] "
        "or YYYY-MM-DD[THH:MM[:SS]]"
    )


class Gates:
    """The pending jobs a scheduler keeps out of its queue until their gates open: held,
    not yet at their --begin time, or waiting on a dependency."""

    def __init__(self) -> None:
        self.waiting: dict[str, None] = {}

    def check(self, job: JobRecord, table: JobTable, now: float) -> tuple[str, str, str]:
        """:func:`gate` for ``job``, looking only at its own tenant's jobs."""
        user = job.user
        dependency = job.spec.dependency
        if not (job.held or job.begin_time or dependency):
            return "ok", "", ""

        def tasks_of(jid: str) -> list[JobRecord]:
            return [r for r in table.task_records(jid) if r.user == user]

        same: list[JobRecord] = []
        if dependency and "singleton" in dependency.lower():
            same = [r for r in table.active_records() if r.user == user and r.name == job.name]
        return gate(job, dependency, tasks_of, same, now)

    def review(
        self, table: JobTable, queued: Callable[[str], bool], now: float
    ) -> tuple[list[JobRecord], list[tuple[str, str]], dict[str, tuple[str, str]]]:
        """Look at every waiting job again: (records whose gates opened, (job id, why)
        of those whose dependency can never be met and that end for it, {job id:
        (reason, why)} of those still waiting)."""
        opened: list[JobRecord] = []
        never: list[tuple[str, str]] = []
        still: dict[str, tuple[str, str]] = {}
        for jid in list(self.waiting):
            j = table.record(jid)
            if j is None or j.state != PENDING or queued(jid):
                self.waiting.pop(jid, None)
                continue
            state, reason, why = self.check(j, table, now)
            if state == "ok":
                self.waiting.pop(jid, None)
                opened.append(j)
            elif state == "never" and j.spec.kill_on_invalid_dep:
                self.waiting.pop(jid, None)
                never.append((jid, why))
            else:
                still[jid] = (reason, why)
        return opened, never, still
