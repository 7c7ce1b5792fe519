"""``TENANT_RETENTION_DAYS``: inactive tenants are locked, then removed, on every member.

A tenant is inactive when nothing happened for ``TENANT_RETENTION_DAYS``, counting from
when the account was created: no authenticated connection (``last_login``: sessions,
commands, port forwards alone), no job or workspace started and no job ended
(``last_active``, kept in the tenant's record when job records are purged, and the
submit and end times of the tenant's jobs still on record). The steps, decided by
:func:`plan` (pure: facts and ``now`` in, steps out):

1. **lock**: the registry marks the tenant locked (replicated, so every member
   refuses its logins at once) and each member expires the OS account
   (``usermod --expiredate 1``), so OpenSSH in front of MTGPU refuses it too. Logins
   within ``TENANT_RETENTION_WARN_DAYS`` of the lock date print :func:`warning`; a
   locked tenant who proves its key is told :func:`locked_message`;
2. **remove**, ``TENANT_RETENTION_GRACE`` after the lock: each member archives the
   home under ``TENANT_RETENTION_ARCHIVE_DIR`` as a tar (or removes it,
   ``TENANT_RETENTION_HOME: remove``) by descriptor, refusing a home that is not the
   tenant's own or holds a mount point or an immutable file
   (:mod:`mtgpu.accounts.homeremove`), and deletes the OS account; last, the registry
   drops the user. Its UID is never handed out again. A removal that fails is
   recorded in the tenant's record and retried with back-off (:func:`retry_delay`),
   never archived twice.

Never touched: admins (``ADMINS`` or the registry's admin flag), OS accounts MTGPU did
not create (checked on each member by the account's ``MTGPU tenant`` comment), and
tenants with a pending or running job, a workspace record (even released) or a live
process on some member (they block both steps).

Every action is written to ``STATE_DIR/retention.log`` (one JSON object per line) on
the member that did it, and the lock and removal are replicated audit entries.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mtgpu.accounts import homeremove
from mtgpu.errors import AccountError, CommandError
from mtgpu.proc import run

log = logging.getLogger("mtgpu.accounts.retention")

DAY = 86400.0
MANAGED_MARK = "MTGPU tenant"  # the comment useradd gives MTGPU's accounts


@dataclass(frozen=True)
class TenantFacts:
    """What retention knows of one registry user."""

    name: str
    admin: bool
    last_active: float  # the latest login, job or creation time
    locked: float | None = None  # when it was locked, if it is
    work: tuple[str, ...] = ()  # ids of pending/running jobs and workspaces
    failed: dict[str, Any] | None = None  # the last failed removal: reason, attempts, retry_at


@dataclass(frozen=True)
class Step:
    """One decision of :func:`plan`. ``action``: lock, remove, failed (a removal failed;
    retried at ``due``), blocked, exempt or wait."""

    user: str
    action: str
    reason: str
    inactive_days: float
    due: float | None = None  # when the next step falls due (wait)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def last_activity(user: dict[str, Any], jobs: Iterable[dict[str, Any]]) -> float:
    """The latest sign of life of a registry record and its jobs.

    >>> last_activity({"created": 5.0, "last_login": 9.0}, [{"submit_time": 12.0, "end_time": None}])
    12.0
    """
    times = [user.get("created") or 0.0, user.get("last_login") or 0.0, user.get("last_active") or 0.0]
    for j in jobs:
        times += [j.get("submit_time") or 0.0, j.get("end_time") or 0.0]
    return max(times)


#: A failed removal is retried after an hour, then twice as long each time, at most a week.
RETRY_FIRST = 3600.0
RETRY_MAX = 7 * DAY


def retry_delay(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed removals.

    >>> [retry_delay(n) / 3600 for n in (1, 2, 3)], retry_delay(50) / DAY
    ([1.0, 2.0, 4.0], 7.0)
    """
    return min(RETRY_MAX, RETRY_FIRST * 2 ** min(max(attempts, 1) - 1, 30))


def plan(
    facts: Iterable[TenantFacts], now: float, days: float, grace: float, retry_failed: bool = False
) -> list[Step]:
    """What retention does at ``now``. Tenants active within ``days`` are left out.

    A removal that failed is retried when its back-off has passed (or at once with
    ``retry_failed``, a pass an admin asked for); until then its step is ``failed``.

    >>> f = [TenantFacts("old", False, 0.0), TenantFacts("new", False, 39 * DAY),
    ...      TenantFacts("boss", True, 0.0), TenantFacts("busy", False, 0.0, work=("7",)),
    ...      TenantFacts("gone", False, 0.0, locked=31 * DAY)]
    >>> [(s.user, s.action) for s in plan(f, 40 * DAY, 30, 7 * DAY)]
    [('boss', 'exempt'), ('busy', 'blocked'), ('gone', 'remove'), ('old', 'lock')]
    >>> [(s.user, s.action) for s in plan(f, 35 * DAY, 30, 7 * DAY)]
    [('boss', 'exempt'), ('busy', 'blocked'), ('gone', 'wait'), ('old', 'lock')]
    """
    steps = []
    for t in sorted(facts, key=lambda t: t.name):
        idle = (now - t.last_active) / DAY
        if t.locked is None and idle < days:
            continue
        if t.admin:
            steps.append(Step(t.name, "exempt", "an admin is never removed", idle))
        elif t.work:
            steps.append(
                Step(
                    t.name,
                    "blocked",
                    f"has running work: {', '.join(t.work[:5])}",
                    idle,
                    details={"work": list(t.work)},
                )
            )
        elif t.locked is None:
            steps.append(
                Step(
                    t.name,
                    "lock",
                    f"no login or job for {idle:.1f} days (TENANT_RETENTION_DAYS is {days:g})",
                    idle,
                )
            )
        elif now - t.locked >= grace and t.failed and not retry_failed and now < t.failed.get("retry_at", 0):
            steps.append(
                Step(
                    t.name,
                    "failed",
                    f"removal failed {t.failed.get('attempts', 1)} time(s): {t.failed.get('reason', '?')}",
                    idle,
                    due=t.failed.get("retry_at"),
                    details={"failed": t.failed},
                )
            )
        elif now - t.locked >= grace:
            steps.append(
                Step(
                    t.name,
                    "remove",
                    f"locked {(now - t.locked) / DAY:.1f} days ago "
                    f"(TENANT_RETENTION_GRACE is {grace / DAY:g} days)",
                    idle,
                )
            )
        else:
            steps.append(
                Step(
                    t.name,
                    "wait",
                    "locked; removed when TENANT_RETENTION_GRACE has passed",
                    idle,
                    due=t.locked + grace,
                )
            )
    return steps


def _date(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def warning(
    name: str, last_active: float, now: float, days: float, warn_days: float, admins: Iterable[str]
) -> str | None:
    """What a login tells a tenant whose account was due to be locked within ``warn_days``.

    ``last_active`` is the activity before this login, which itself keeps the account.

    >>> print(warning("ann", 0.0, 25 * DAY, 30, 7, ["boss"]))
    your account ann had no login, job or workspace use since 1970-01-01 and was due to be locked for inactivity on 1970-01-31 (TENANT_RETENTION_DAYS is 30). This login keeps it until 1970-02-25; log in, run a job or use a workspace before then to keep it longer, or ask an administrator (boss)
    >>> warning("ann", 0.0, 20 * DAY, 30, 7, ["boss"]) is None
    True
    """
    due = last_active + days * DAY
    if warn_days <= 0 or now < due - warn_days * DAY:
        return None
    return (
        f"your account {name} had no login, job or workspace use since {_date(last_active)} "
        f"and was due to be locked for inactivity on {_date(due)} (TENANT_RETENTION_DAYS is "
        f"{days:g}). This login keeps it until {_date(now + days * DAY)}; log in, run a job "
        "or use a workspace before then to keep it longer, or ask an administrator "
        f"({', '.join(admins) or 'root'})"
    )


def locked_message(name: str, locked: float, grace: float, how: str, admins: Iterable[str]) -> str:
    """What a locked tenant who connects is told, before the refusal.

    >>> print(locked_message("ann", 31 * DAY, 7 * DAY, "archive", ["boss"]))
    The MTGPU account ann is locked for inactivity since 1970-02-01 (TENANT_RETENTION_DAYS). Its files are kept until 1970-02-08, then archived by the administrator and removed from this cluster. To keep the account, ask an administrator (boss) to run: mtgpu-admin retention --unlock ann
    """
    fate = "archived by the administrator and removed" if how == "archive" else "deleted"
    return (
        f"The MTGPU account {name} is locked for inactivity since {_date(locked)} "
        f"(TENANT_RETENTION_DAYS). Its files are kept until {_date(locked + grace)}, then "
        f"{fate} from this cluster. To keep the account, ask an administrator "
        f"({', '.join(admins) or 'root'}) to run: mtgpu-admin retention --unlock {name}"
    )


# ----------------------------------------------------- one member's part


def write_log(state_dir: str, entry: dict[str, Any]) -> None:
    """Append one action to ``STATE_DIR/retention.log``."""
    path = Path(state_dir) / "retention.log"
    line = json.dumps({"time": entry.get("time", time.time()), **entry}, sort_keys=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    log.info("retention: %s", line)


def local_account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def is_managed(pw: pwd.struct_passwd) -> bool:
    return MANAGED_MARK in pw.pw_gecos


def processes_of(uid: int) -> list[int]:
    """PIDs running as ``uid`` on this member (sessions, tmux, jobs)."""
    import psutil

    pids = []
    for p in psutil.process_iter(["uids"]):
        try:
            uids = p.info["uids"]
        except (psutil.Error, KeyError):
            continue
        if uids is not None and uid in (uids.real, uids.effective):
            pids.append(p.pid)
    return pids


def check_member(name: str, uid: int) -> dict[str, Any]:
    """Whether this member would let ``name`` go: its account and live processes."""
    pw = local_account(name)
    if pw is None:
        return {"account": False, "managed": False, "processes": []}
    if pw.pw_uid != uid:
        return {
            "account": True,
            "managed": False,
            "processes": [],
            "problem": f"the local account {name!r} has UID {pw.pw_uid}, not {uid}",
        }
    return {
        "account": True,
        "managed": is_managed(pw),
        "home": pw.pw_dir,
        "processes": processes_of(pw.pw_uid),
    }


def lock_account(name: str, uid: int, locked: bool) -> str:
    """Expire (or un-expire) an MTGPU account here; an OS account of its own is kept as is."""
    pw = local_account(name)
    if pw is None or pw.pw_uid != uid:
        return "no account here"
    if not is_managed(pw):
        return "not created by MTGPU; left alone"
    try:
        run(["usermod", "--expiredate", "1" if locked else "", name])
    except CommandError as exc:
        raise AccountError(f"cannot {'lock' if locked else 'unlock'} the account {name!r}: {exc}") from exc
    return "locked" if locked else "unlocked"


def _stamp(now: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))


def earlier_archive(archive_dir: str, name: str, uid: int, since: float | None) -> str | None:
    """An archive of this tenant written since ``since`` (the lock) by an earlier attempt."""
    if since is None:
        return None
    prefix = f"{name}-{uid}-"
    try:
        names = sorted(os.listdir(archive_dir))
    except FileNotFoundError:
        return None
    for n in reversed(names):
        if (
            n.startswith(prefix)
            and n.endswith(".tar.gz")
            and n[len(prefix) : -len(".tar.gz")] >= _stamp(since)
        ):
            return str(Path(archive_dir) / n)
    return None


def remove_member(
    name: str, uid: int, how: str, archive_dir: str, home_root: str, now: float, locked: float | None = None
) -> dict[str, Any]:
    """Archive or remove the home and delete the OS account, if MTGPU made it.

    The home is walked by descriptor (:mod:`mtgpu.accounts.homeremove`): one that is
    not the tenant's own, or holds a mount point or an immutable file, is refused
    before anything is touched, and the account is kept so the next attempt can
    finish. An archive written since ``locked`` by an earlier attempt is reused.
    """
    pw = local_account(name)
    if pw is None:
        return {"account": "none here", "home": "none here"}
    if pw.pw_uid != uid or not is_managed(pw):
        return {"account": "not created by MTGPU; left alone", "home": "left alone"}
    if processes_of(uid):
        raise AccountError(f"{name!r} has processes running on this member; not removed")
    result: dict[str, Any] = {}
    home = os.path.normpath(pw.pw_dir)
    root = os.path.normpath(home_root)
    if os.path.dirname(home) != root or not os.path.lexists(home):
        result["home"] = (
            "none here"
            if not os.path.lexists(home)
            else f"{home} is not a directory directly under TENANT_HOME_ROOT; left alone"
        )
    else:
        try:
            with homeremove.Home(root, os.path.basename(home), uid) as h:
                h.check()
                if how == "archive":
                    result["archive"] = earlier_archive(archive_dir, name, uid, locked)
                    if result["archive"] is None:
                        Path(archive_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
                        result["archive"] = h.archive(
                            str(Path(archive_dir) / f"{name}-{uid}-{_stamp(now)}.tar.gz")
                        )
                h.remove()
            result["home"] = "archived and removed" if how == "archive" else "removed"
        except FileNotFoundError as exc:
            if os.path.lexists(home):  # something below it went: another member's removal?
                raise AccountError(f"cannot remove the home {home}: {exc}; retried later") from exc
            result["home"] = "none here (removed meanwhile)"
        except OSError as exc:
            raise AccountError(f"cannot remove the home {home}: {exc.strerror or exc}") from exc
    try:
        run(["userdel", name])
    except CommandError as exc:
        raise AccountError(f"cannot delete the account {name!r}: {exc}") from exc
    result["account"] = "deleted"
    return result
