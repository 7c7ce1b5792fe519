"""Usage accounting: what each job used, summed per tenant and day.

Pure functions over plain values; the job table (:mod:`mtgpu.schedd.jobtable`) calls
:func:`charge` as it applies each job's end, so every replica holds the same sums and
they survive a failover or a restart like any other replicated state. The sums are
bounded, never one row per job:

- a *tenant row* per (day, tenant, GPU type) that had work, and a *member row* per
  (day, member, GPU type): a tenant's usage by member is not kept (it would multiply
  the rows), the cluster's by member is;
- days before the last :data:`DAILY_DAYS` are rolled up into one row per month
  (:func:`roll_up`), as Slurm's accounting rolls hours into days and months;
- rows older than ``USAGE_RETENTION_DAYS`` are dropped (:func:`drop_before`), long
  after the job records themselves are gone (``JOB_RETENTION_DAYS``).

A row's key is ``"PERIOD\\tTENANT\\tMEMBER\\tGPU_TYPE"`` (``PERIOD`` a UTC day
``YYYY-MM-DD`` or a rolled-up month ``YYYY-MM``; ``MEMBER`` empty in a tenant row,
``TENANT`` in a member row) and its value a list in :data:`FIELDS` order. A job that
runs across midnight is split between the days by the seconds it ran in each; it is
counted once (``jobs``), on the day it ended, on its first member.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from mtgpu.jobstate import COMPLETED

#: The sums kept per row: job count (and how many of them did not complete), GPU and
#: CPU seconds allocated (count x seconds held), and CPU seconds used (user+system).
FIELDS = ("jobs", "not_completed", "gpu_seconds", "cpu_seconds", "cpu_used")
#: Rows a report groups by ("member" only on its own or with gpu_type and day).
GROUPS = ("user", "member", "gpu_type", "day")
#: Days kept one row per day before they are rolled up into their month: this month
#: and the last one are always there by day.
DAILY_DAYS = 62

_DAY = 86400


def day_of(t: float) -> str:
    """The UTC day of ``t`` (seconds since the epoch).

    >>> day_of(0), day_of(86399.9), day_of(86400)
    ('1970-01-01', '1970-01-01', '1970-01-02')
    """
    return dt.datetime.fromtimestamp(int(t // 1), dt.UTC).strftime("%Y-%m-%d")


def split_by_day(start: float, end: float) -> list[tuple[str, float]]:
    """The seconds of ``[start, end)`` in each UTC day.

    >>> split_by_day(86400 - 10, 86400 + 5)
    [('1970-01-01', 10.0), ('1970-01-02', 5.0)]
    """
    out: list[tuple[str, float]] = []
    t = float(start)
    while t < end:
        edge = (t // _DAY + 1) * _DAY
        upto = min(edge, float(end))
        out.append((day_of(t), upto - t))
        t = upto
    return out


def key(day: str, user: str, member: str, gpu_type: str) -> str:
    return f"{day}\t{user}\t{member}\t{gpu_type}"


def unkey(k: str) -> dict[str, str]:
    period, user, member, gpu_type = k.split("\t")
    return {"day": period, "user": user, "member": member, "gpu_type": gpu_type}


def _add(rows: dict[str, list[float]], k: str, values: Iterable[float]) -> None:
    row = rows.get(k)
    if row is None:
        rows[k] = [round(v, 3) for v in values]
    else:
        rows[k] = [round(a + b, 3) for a, b in zip(row, values, strict=True)]


def charge(rows: dict[str, list[float]], job: Mapping[str, Any], count: bool = True) -> None:
    """Add a job that has just ended (its final record) to ``rows``, in place.

    Each member is charged its CPUs and GPUs for the time the job held them (from
    its start, or its placement when it never reported a start, to its end), split
    by day; a job that never left the queue is only counted. ``count=False``: a run
    that ended in a requeue, whose time is charged but which is not a job of its own.
    """
    end = float(job.get("end_time") or 0.0)
    start = job.get("start_time") or job.get("placed_time")
    members = (job.get("placement") or {}).get("members") or []
    user = str(job["user"])
    per_member = job.get("usage") or {}
    gpu_info = job.get("gpu_info") or {}
    not_completed = 0.0 if job.get("state") == COMPLETED else 1.0
    if not members or start is None or end <= float(start):
        if not count:
            return
        values = (1.0, not_completed, 0.0, 0.0, 0.0)
        _add(rows, key(day_of(end), user, "", ""), values)
        if members:
            _add(rows, key(day_of(end), "", str(members[0]["node"]), ""), values)
        return
    start = float(start)
    for rank, m in enumerate(members):
        node = str(m["node"])
        gpus = len(m.get("gpu_indices") or ())
        types = sorted({str(g.get("type") or "") for g in gpu_info.get(node) or ()})
        gpu_type = (",".join(t for t in types if t) or "unknown") if gpus else ""
        cpus = int(m.get("cpus") or 0)
        used = per_member.get(node) or {}
        cpu_used = float(used.get("cpu_user") or 0.0) + float(used.get("cpu_system") or 0.0)
        held = end - start
        for day, secs in split_by_day(start, end):
            share = secs / held
            counted = 1.0 if count and rank == 0 and day == day_of(end) else 0.0
            values = (counted, counted * not_completed, gpus * secs, cpus * secs, cpu_used * share)
            _add(rows, key(day, user, "", gpu_type), values)
            _add(rows, key(day, "", node, gpu_type), values)


def roll_up(rows: dict[str, list[float]], before_day: str) -> int:
    """Merge the day rows of days before ``before_day`` into their months' rows, in
    place; returns how many day rows went.

    >>> rows = {key("2026-01-05", "ann", "", "a100"): [1, 0, 10, 0, 0],
    ...         key("2026-01-06", "ann", "", "a100"): [1, 0, 5, 0, 0]}
    >>> roll_up(rows, "2026-02-01"), rows
    (2, {'2026-01\\tann\\t\\ta100': [2, 0, 15, 0, 0]})
    """
    old = [k for k in rows if k[7] == "-" and k[:10] < before_day]
    for k in old:
        _add(rows, k[:7] + k[10:], rows.pop(k))
    return len(old)


def drop_before(rows: dict[str, list[float]], day: str) -> int:
    """Remove the rows of days (and whole months) before ``day``; returns how many."""
    old = [k for k in rows if (k[:10] < day if k[7] == "-" else k[:7] < day[:7])]
    for k in old:
        del rows[k]
    return len(old)


def _month_end(month: str) -> str:
    y, m = int(month[:4]), int(month[5:7])
    nxt = dt.date(y + (m == 12), m % 12 + 1, 1)
    return (nxt - dt.timedelta(days=1)).isoformat()


def cut_months(rows: Mapping[str, list[float]], start_day: str, end_day: str) -> list[str]:
    """Rolled-up months the period covers only in part: their rows are left out of a
    :func:`summarize` of it (a month is summed whole or not at all)."""
    months = {k[:7] for k in rows if k[7] == "\t"}
    return sorted(
        m
        for m in months
        if m + "-01" <= end_day
        and _month_end(m) >= start_day
        and not (start_day <= m + "-01" and _month_end(m) <= end_day)
    )


def summarize(
    rows: Mapping[str, list[float]],
    start_day: str,
    end_day: str,
    by: tuple[str, ...] = ("user",),
    users: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Sums of the rows of days ``start_day`` to ``end_day`` (inclusive; a rolled-up
    month counts when the period holds all of it) grouped by the fields in ``by`` (of
    :data:`GROUPS`), only for ``users`` when given. ``member`` reads the member rows
    (the cluster's, so not with ``user`` or ``users``); the rest, the tenant rows.
    Each result has those fields, the :data:`FIELDS`, and ``gpu_hours``/``cpu_hours``.

    >>> rows = {key("2026-01-01", "ann", "", "a100"): [1, 0, 7200, 3600, 10]}
    >>> summarize(rows, "2026-01-01", "2026-01-31")[0]["gpu_hours"]
    2.0
    """
    per_member = "member" in by
    if per_member and ("user" in by or users is not None):
        raise ValueError("usage by member is the whole cluster's: not by tenant too")
    only = set(users) if users is not None else None
    sums: dict[tuple[str, ...], list[float]] = {}
    for k, v in rows.items():
        if k[7] == "-":
            if not start_day <= k[:10] <= end_day:
                continue
        elif not (start_day <= k[:7] + "-01" and _month_end(k[:7]) <= end_day):
            continue
        f = unkey(k)
        if per_member != (f["user"] == "") or (only is not None and f["user"] not in only):
            continue
        g = tuple(f[b] for b in by)
        acc = sums.get(g)
        sums[g] = list(v) if acc is None else [a + b for a, b in zip(acc, v, strict=True)]
    out = []
    for g, v in sorted(sums.items()):
        rec: dict[str, Any] = dict(zip(by, g, strict=True))
        rec.update({name: round(x, 3) for name, x in zip(FIELDS, v, strict=True)})
        rec["jobs"] = int(rec["jobs"])
        rec["not_completed"] = int(rec["not_completed"])
        rec["gpu_hours"] = round(rec["gpu_seconds"] / 3600, 4)
        rec["cpu_hours"] = round(rec["cpu_seconds"] / 3600, 4)
        out.append(rec)
    return out


def zero() -> dict[str, Any]:
    """A total with nothing in it (what :func:`summarize` gives a group without rows)."""
    rec: dict[str, Any] = {name: 0 for name in FIELDS}
    rec.update(gpu_hours=0.0, cpu_hours=0.0)
    return rec


def this_month(now: float) -> tuple[str, str]:
    """The first and last UTC day of the month of ``now``.

    >>> this_month(dt.datetime(2026, 2, 10, tzinfo=dt.UTC).timestamp())
    ('2026-02-01', '2026-02-28')
    """
    d = dt.datetime.fromtimestamp(now, dt.UTC).date()
    first = d.replace(day=1)
    nxt = (first + dt.timedelta(days=32)).replace(day=1)
    return first.isoformat(), (nxt - dt.timedelta(days=1)).isoformat()


def parse_day(text: str, what: str) -> str:
    """``YYYY-MM-DD`` (or an ISO time, whose day is taken) checked; ValueError names
    ``what`` and the format otherwise.

    >>> parse_day("2026-03-04T10:00", "--start")
    '2026-03-04'
    """
    text = text.strip()
    if len(text) > 40:
        raise ValueError(f"{what}: {text[:40]!r}... is too long; give a day as YYYY-MM-DD")
    try:
        return dt.datetime.fromisoformat(text).date().isoformat()
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a day; give one as YYYY-MM-DD") from None
