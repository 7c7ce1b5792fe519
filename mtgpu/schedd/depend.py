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

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtgpu.jobstate import CANCELLED, COMPLETED, FINAL_STATES, PENDING
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

    def item(kind: str, ids: tuple[str, ...]) -> tuple[str, str]:
        if kind == "singleton":
            earlier = [
                j
                for j in same_name
                if j.job_id != job.job_id and j.state not in FINAL and _order(j) < _order(job)
            ]
            return ("wait", f"job {earlier[0].job_id} of the same name") if earlier else ("ok", "")
        return _item(kind, ids, tasks_of)

    return _decide(job, spec_dependency, now, item)


def _item(kind: str, ids: tuple[str, ...], tasks_of: Callable[[str], list[JobRecord]]) -> tuple[str, str]:
    """("ok" | "wait" | "never", why) for one ``after*`` item."""
    named = [tasks_of(i) for i in ids]
    missing = [i for i, rs in zip(ids, named) if not rs]
    if missing:
        # Its record is gone (purged after JOB_RETENTION_DAYS): only after/afterany are met.
        return ("ok", "") if kind in ("after", "afterany") else ("never", f"job {missing[0]} is gone")
    return _one(kind, [r for rs in named for r in rs])


def _decide(
    job: JobRecord,
    spec_dependency: str | None,
    now: float,
    item: Callable[[str, tuple[str, ...]], tuple[str, str]],
) -> tuple[str, str, str]:
    """:func:`gate`, with ``item(kind, ids)`` saying how each item of the dependency stands."""
    if job.held:
        return "wait", HELD, "held: `mt-job release` lets it start"
    begin = job.begin_time
    if begin and begin > now:
        return "wait", BEGIN, "it may not start before its --begin time"
    if not spec_dependency:
        return "ok", "", ""
    dep = _parsed(spec_dependency)
    results = [item(kind, ids) for kind, ids in dep.items]
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


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Dependency:
    """:func:`parse_dependency`, once per text (the jobs of an array share theirs)."""
    return parse_dependency(text)


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


class _View:
    """What the gates read of the job table, each part made once and not per waiting
    job (a pass over thousands of them reads each record a few times, not once per
    job): the tenants' active jobs by name, for ``singleton``; the records each id
    names, per tenant; and how each dependency item stands."""

    def __init__(self, table: JobTable) -> None:
        self.table = table
        #: (user, name) -> (their active jobs in the table's order, the least
        #: :func:`_order` among the first k of them, for each k): made on first use.
        self._names: dict[tuple[str, str], tuple[list[JobRecord], list[tuple[float, int, int]]]] | None = None
        self._tasks: dict[tuple[str, str], list[JobRecord]] = {}
        self._items: dict[tuple[str, str, tuple[str, ...]], tuple[str, str]] = {}
        #: The jobs this pass ends for a dependency never met, as they read once ended.
        self.ending: dict[str, JobRecord] = {}

    def check(self, job: JobRecord, now: float) -> tuple[str, str, str]:
        return _decide(job, job.spec.dependency, now, lambda kind, ids: self._item(job, kind, ids))

    def ended(self, records: Iterable[JobRecord]) -> None:
        """Read ``records`` as CANCELLED from here on (this pass ends them)."""
        for r in records:
            self.ending[r.job_id] = dataclasses.replace(r, state=CANCELLED)
        self._items = {}

    def _item(self, job: JobRecord, kind: str, ids: tuple[str, ...]) -> tuple[str, str]:
        if kind == "singleton":
            earlier = self._earlier(job)
            return ("wait", f"job {earlier} of the same name") if earlier else ("ok", "")
        key = (job.user, kind, ids)
        hit = self._items.get(key)
        if hit is None:
            user = job.user
            hit = self._items[key] = _item(kind, ids, lambda i: self._tasks_of(user, i))
        return hit

    def _tasks_of(self, user: str, jid: str) -> list[JobRecord]:
        key = (user, jid)
        hit = self._tasks.get(key)
        if hit is None:
            hit = self._tasks[key] = [r for r in self.table.task_records(jid) if r.user == user]
        if self.ending:
            ending = self.ending
            return [ending.get(r.job_id, r) for r in hit]
        return hit

    def _earlier(self, job: JobRecord) -> str | None:
        """The first (in the table's order) active job of the same tenant and name
        submitted before ``job``, if any."""
        if self._names is None:
            self._names = {}
            for r in self.table.active_records():
                if r.state in FINAL:
                    continue
                group = self._names.get((r.user, r.name))
                if group is None:
                    group = self._names[(r.user, r.name)] = ([], [])
                order = _order(r)
                group[0].append(r)
                group[1].append(min(group[1][-1], order) if group[1] else order)
        group = self._names.get((job.user, job.name))
        mine = _order(job)
        if group is None or not group[1][-1] < mine:
            return None
        # The least order so far only falls: the first job before ``job`` is where it
        # first falls below ``job``'s (``job`` itself is not before itself).
        least, lo, hi = group[1], 0, len(group[1]) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if least[mid] < mine:
                hi = mid
            else:
                lo = mid + 1
        return group[0][lo].job_id


class Gates:
    """The pending jobs a scheduler keeps out of its queue until their gates open: held,
    not yet at their --begin time, or waiting on a dependency."""

    def __init__(self) -> None:
        self.waiting: dict[str, None] = {}

    def check(self, job: JobRecord, table: JobTable, now: float) -> tuple[str, str, str]:
        """:func:`gate` for ``job``, looking only at its own tenant's jobs. For one job:
        :meth:`review` looks at every waiting job with one read of the table."""
        if not (job.held or job.begin_time or job.spec.dependency):
            return "ok", "", ""
        return _View(table).check(job, now)

    def review(
        self, table: JobTable, queued: Callable[[str], bool], now: float
    ) -> tuple[list[JobRecord], list[tuple[str, str]], dict[str, tuple[str, str]]]:
        """Look at every waiting job again: (records whose gates opened, (job id, why)
        of those whose dependency can never be met and that end for it, {job id:
        (reason, why)} of those still waiting).

        The table is read once for all of them, so a pass costs time in proportion to
        the jobs, not their square. A job whose dependency can only be met by one that
        ends here ends here too, and so on down a chain: all in this pass."""
        view = _View(table)
        opened: list[JobRecord] = []
        never: list[tuple[str, str]] = []
        still: dict[str, tuple[str, str]] = {}
        kept: dict[str, JobRecord] = {}
        for jid in list(self.waiting):
            j = table.record(jid)
            if j is None or j.state != PENDING or queued(jid):
                self.waiting.pop(jid, None)
                continue
            state, reason, why = view.check(j, now)
            if state == "ok":
                self.waiting.pop(jid, None)
                opened.append(j)
            elif state == "never" and j.spec.kill_on_invalid_dep:
                self.waiting.pop(jid, None)
                never.append((jid, why))
            else:
                still[jid] = (reason, why)
                kept[jid] = j
        if never and still:
            self._end_behind(view, [jid for jid, _ in never], kept, never, still, now)
        return opened, never, still

    def _end_behind(
        self,
        view: _View,
        ending: list[str],
        kept: dict[str, JobRecord],
        never: list[tuple[str, str]],
        still: dict[str, tuple[str, str]],
        now: float,
    ) -> None:
        """Look again, as if ``ending`` had ended, at the waiting jobs that name them;
        those whose dependency can then never be met join ``never`` (and theirs are
        looked at in turn). Each job is looked at once per round, a round being the
        jobs that end for the last one's."""
        dependents: dict[str, list[str]] = {}
        for jid, j in kept.items():
            if j.spec.dependency:
                for named in dict.fromkeys(_parsed(j.spec.dependency).job_ids()):
                    dependents.setdefault(named, []).append(jid)
        table = view.table
        while ending:
            records = [r for e in ending if (r := table.record(e)) is not None]
            view.ended(records)
            behind: dict[str, None] = {}
            for r in records:
                for name in (r.job_id, r.array_id, r.numeric_id):
                    for other in dependents.get(name or "", ()):
                        if other in still:
                            behind[other] = None
            ending = []
            for jid in behind:
                j = kept[jid]
                state, reason, why = view.check(j, now)
                if state != "never":
                    continue  # one it now could start is queued by the next pass, once these have ended
                if j.spec.kill_on_invalid_dep:
                    del still[jid]
                    self.waiting.pop(jid, None)
                    never.append((jid, why))
                    ending.append(jid)
                else:
                    still[jid] = (reason, why)
