"""``TENANT_RETENTION_DAYS``: inactive tenants are locked, then removed, on every member.

A tenant is inactive when nothing happened for ``TENANT_RETENTION_DAYS``: no login
(``last_login``), no job or workspace started (``last_active``, and the submit and end
times of the tenant's jobs still on record), counting from when the account was
created. The steps, decided by :func:`plan` (pure: facts and ``now`` in, steps out):

1. **lock**: the registry marks the tenant locked (replicated, so every member
   refuses its logins at once) and each member expires the OS account
   (``usermod --expiredate 1``), so OpenSSH in front of MTGPU refuses it too;
2. **remove**, ``TENANT_RETENTION_GRACE`` after the lock: every member checks that
   the tenant has no process left (a live SSH session or tmux blocks removal); then
   each member archives the home under ``TENANT_RETENTION_ARCHIVE_DIR`` as a tar (or
   removes it, ``TENANT_RETENTION_HOME: remove``) and deletes the OS account; last,
   the registry drops the user. Its UID is never handed out again.

Never touched: admins (``ADMINS`` or the registry's admin flag), OS accounts MTGPU did
not create (checked on each member by the account's ``MTGPU tenant`` comment), and
tenants with a pending or running job or a workspace (they block both steps).

Every action is written to ``STATE_DIR/retention.log`` (one JSON object per line) on
the member that did it, and the lock and removal are replicated audit entries.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import tarfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    last_active: float            # the latest login, job or creation time
    locked: float | None = None   # when it was locked, if it is
    work: tuple[str, ...] = ()    # ids of pending/running jobs and workspaces


@dataclass(frozen=True)
class Step:
    """One decision of :func:`plan`. ``action``: lock, remove, blocked, exempt or wait."""

    user: str
    action: str
    reason: str
    inactive_days: float
    due: float | None = None      # when the next step falls due (wait)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def last_activity(user: dict[str, Any], jobs: Iterable[dict[str, Any]]) -> float:
    """The latest sign of life of a registry record and its jobs.

    >>> last_activity({"created": 5.0, "last_login": 9.0}, [{"submit_time": 12.0, "end_time": None}])
    12.0
    """
    times = [user.get("created") or 0.0, user.get("last_login") or 0.0,
             user.get("last_active") or 0.0]
    for j in jobs:
        times += [j.get("submit_time") or 0.0, j.get("end_time") or 0.0]
    return max(times)


def plan(facts: Iterable[TenantFacts], now: float, days: float, grace: float) -> list[Step]:
    """What retention does at ``now``. Tenants active within ``days`` are left out.

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
            steps.append(Step(t.name, "blocked", f"has running work: {', '.join(t.work[:5])}",
                              idle, details={"work": list(t.work)}))
        elif t.locked is None:
            steps.append(Step(t.name, "lock", f"no login or job for {idle:.1f} days "
                              f"(TENANT_RETENTION_DAYS is {days:g})", idle))
        elif now - t.locked >= grace:
            steps.append(Step(t.name, "remove", f"locked {(now - t.locked) / DAY:.1f} days ago "
                              f"(TENANT_RETENTION_GRACE is {grace / DAY:g} days)", idle))
        else:
            steps.append(Step(t.name, "wait", "locked; removed when TENANT_RETENTION_GRACE "
                              "has passed", idle, due=t.locked + grace))
    return steps


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
        return {"account": True, "managed": False, "processes": [],
                "problem": f"the local account {name!r} has UID {pw.pw_uid}, not {uid}"}
    return {"account": True, "managed": is_managed(pw), "home": pw.pw_dir,
            "processes": processes_of(pw.pw_uid)}


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
        raise AccountError(f"cannot {'lock' if locked else 'unlock'} the account {name!r}: "
                           f"{exc}") from exc
    return "locked" if locked else "unlocked"


def _archive(home: str, name: str, archive_dir: str, now: float) -> str:
    """A tar of ``home`` (links stored as links, never followed), readable by root only."""
    Path(archive_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    dest = Path(archive_dir) / f"{name}-{stamp}.tar.gz"
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        tar.add(home, arcname=name, recursive=True)  # tarfile never dereferences links
    return str(dest)


def remove_member(name: str, uid: int, how: str, archive_dir: str, home_root: str,
                  now: float) -> dict[str, Any]:
    """Archive or remove the home and delete the OS account, if MTGPU made it."""
    pw = local_account(name)
    if pw is None:
        return {"account": "none here", "home": "none here"}
    if pw.pw_uid != uid or not is_managed(pw):
        return {"account": "not created by MTGPU; left alone", "home": "left alone"}
    if processes_of(uid):
        raise AccountError(f"{name!r} has processes running on this member; not removed")
    result: dict[str, Any] = {}
    home = pw.pw_dir
    inside = os.path.realpath(home).startswith(os.path.realpath(home_root).rstrip("/") + "/")
    if os.path.isdir(home) and not os.path.islink(home) and inside:
        if how == "archive":
            result["archive"] = _archive(home, name, archive_dir, now)
        # --one-file-system: a mount below the home is never followed into.
        run(["rm", "-rf", "--one-file-system", "--", home], timeout=3600)
        result["home"] = "archived and removed" if how == "archive" else "removed"
    else:
        result["home"] = "none here" if not os.path.exists(home) else \
            f"{home} is not a directory under TENANT_HOME_ROOT; left alone"
    try:
        run(["userdel", name])
    except CommandError as exc:
        raise AccountError(f"cannot delete the account {name!r}: {exc}") from exc
    result["account"] = "deleted"
    return result
