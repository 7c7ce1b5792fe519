"""``USER_DISK_LIMIT``: real filesystem quotas where the home filesystem has them,
measured homes and refusals elsewhere.

Modes (:func:`detect_mode`, shown by ``mtgpu-admin usage``):

- ``ext4`` / ``xfs``: the filesystem under ``TENANT_HOME_ROOT`` has user quotas on, and
  the quota tools are installed. Each tenant gets a hard block limit (``setquota`` /
  ``xfs_quota``); the kernel enforces it, and usage is read from ``repquota`` /
  ``xfs_quota report`` (cheap, no walk).
- ``scan``: anything else. Each tenant's home is measured every
  ``USER_DISK_SCAN_INTERVAL`` by :mod:`mtgpu.accounts.homescan` in one low-priority
  child process; a round that takes long stretches the interval (to ten times the
  round's duration), so measuring never takes more than about a tenth of a core.

In both modes a tenant whose usage reaches the limit is *over*: told so at login and
by every ``mt-*`` command, and refused new jobs and workspaces (the refusal shows the
usage and the limit) until under it again. Running work is never stopped.

Only MTGPU tenants (users in the registry) are limited; existing OS accounts are not.
Measured usage is local to each member and not replicated, like GPU use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from mtgpu.accounts.registry import Registry
from mtgpu.clock import PolicyClock
from mtgpu.config import Options
from mtgpu.config.units import format_size
from mtgpu.errors import ApiError, CommandError
from mtgpu.proc import ROOT_CHILD_ENV, python_argv, run

log = logging.getLogger("mtgpu.accounts.quota")

#: A refused tenant's home is measured again first if its figure is older than this.
RECHECK_AFTER = 15.0
#: A scan round may use at most 1/STRETCH of the time between rounds.
STRETCH = 10


@dataclass(frozen=True)
class QuotaMode:
    """How usage is measured and enforced on this member."""

    kind: str  # "ext4", "xfs" or "scan"
    mount: str  # the mount point holding TENANT_HOME_ROOT
    fstype: str
    detail: str  # why this mode, in words


@dataclass(frozen=True)
class TenantUsage:
    """One tenant's home on this member."""

    user: str
    uid: int
    home: str
    used: int | None  # bytes, None until first measured
    files: int | None
    limit: int | None
    state: str  # "ok", "over", "unmeasured" or "unlimited"
    measured_at: float | None
    mode: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class QuotaHost(Protocol):
    options: Options
    registry: Registry
    clock: PolicyClock


# ------------------------------------------------------------ mode detection


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_of(path: str, mountinfo: str | None = None) -> tuple[str, str, str]:
    """(mount point, filesystem type, source) of the mount holding ``path``.

    >>> info = ("22 1 254:0 / / rw - ext4 /dev/vda rw\\n"
    ...         "40 22 7:0 / /srv/homes rw,relatime - xfs /dev/loop0 rw,usrquota\\n")
    >>> mount_of("/srv/homes/alice", info)
    ('/srv/homes', 'xfs', '/dev/loop0')
    """
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    target = path
    best = ("/", "", "")
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 2:
            continue
        mp = _unescape(fields[4])
        if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
            best = (mp, rfields[0], rfields[1])
    return best


def detect_mode(home_root: str) -> QuotaMode:
    """Real quotas if the home filesystem has user quotas on and the tools exist."""
    try:
        os.makedirs(home_root, exist_ok=True)
        with open("/proc/self/mountinfo") as f:
            mp, fstype, _src = mount_of(os.path.realpath(home_root), f.read())
    except OSError as exc:
        return QuotaMode("scan", "", "", f"cannot find the mount of {home_root}: {exc}")
    if fstype == "ext4":
        try:
            r = run(["quotaon", "-p", "-u", mp], check=False, timeout=20)
        except CommandError as exc:
            return QuotaMode(
                "scan",
                mp,
                fstype,
                f"ext4 without the quota tools ({exc.stderr.strip()}); "
                "install Debian's quota package for real quotas",
            )
        if re.search(r"user quota on .* is on", r.stdout + r.stderr):
            return QuotaMode("ext4", mp, fstype, f"user quotas are on at {mp}")
        return QuotaMode(
            "scan",
            mp,
            fstype,
            f"ext4 at {mp} has no user quotas on; make it with -O quota (or mount "
            "it with usrquota) for real quotas",
        )
    if fstype == "xfs":
        try:
            r = run(["xfs_quota", "-x", "-c", "state -u", mp], check=False, timeout=20)
        except CommandError:
            return QuotaMode("scan", mp, fstype, "xfs without xfs_quota; install xfsprogs")
        if re.search(r"Enforcement:\s*ON", r.stdout):
            return QuotaMode("xfs", mp, fstype, f"user quotas are enforced at {mp}")
        return QuotaMode("scan", mp, fstype, f"xfs at {mp} is not mounted with uquota")
    return QuotaMode(
        "scan",
        mp,
        fstype or "?",
        f"{fstype or 'this filesystem'} at {mp} has no quotas MTGPU can set; homes are measured instead",
    )


# ------------------------------------------------------------- real quotas

_REPQUOTA_ROW = re.compile(r"^#(\d+)\s+[-+]{2}\s+(\d+)\s")
_XFS_ROW = re.compile(r"^#(\d+)\s+(\d+)\s")


def parse_repquota(text: str) -> dict[int, int]:
    """Bytes used per UID from ``repquota -u -n`` (1 KiB blocks).

    >>> parse_repquota("User  used soft hard\\n#0  --  20 0 0  2 0 0\\n#20001 +-  2048 0 2048 0 3 0 0\\n")
    {0: 20480, 20001: 2097152}
    """
    out = {}
    for line in text.splitlines():
        m = _REPQUOTA_ROW.match(line.strip())
        if m:
            out[int(m.group(1))] = int(m.group(2)) * 1024
    return out


def parse_xfs_report(text: str) -> dict[int, int]:
    """Bytes used per UID from ``xfs_quota -x -c 'report -u -n -b -N'`` (1 KiB blocks).

    >>> parse_xfs_report("#0  8 0 0 00 [--------]\\n#20001  1024 0 4096 00 [--------]\\n")
    {0: 8192, 20001: 1048576}
    """
    out = {}
    for line in text.splitlines():
        m = _XFS_ROW.match(line.strip())
        if m:
            out[int(m.group(1))] = int(m.group(2)) * 1024
    return out


def set_limit(mode: QuotaMode, name: str, limit: int | None) -> None:
    """Give ``name`` a hard block limit of ``limit`` bytes (None: no limit)."""
    kib = 0 if limit is None else -(-limit // 1024)
    if mode.kind == "ext4":
        run(["setquota", "-u", name, "0", str(kib), "0", "0", mode.mount])
    elif mode.kind == "xfs":
        run(["xfs_quota", "-x", "-c", f"limit -u bsoft=0 bhard={kib}k {name}", mode.mount])


def read_usage(mode: QuotaMode) -> dict[int, int]:
    if mode.kind == "ext4":
        return parse_repquota(run(["repquota", "-u", "-n", mode.mount]).stdout)
    if mode.kind == "xfs":
        return parse_xfs_report(run(["xfs_quota", "-x", "-c", "report -u -n -b -N", mode.mount]).stdout)
    return {}


# ------------------------------------------------------------ the service


def over_message(u: TenantUsage, now: float) -> str:
    """What an over-limit tenant reads.

    >>> u = TenantUsage("ann", 1, "/home/ann", 3 << 20, 5, 2 << 20, "over", 100.0, "scan")
    >>> over_message(u, 130.0)
    'your home /home/ann uses 3M of its 2M limit (USER_DISK_LIMIT, measured 30s ago)'
    """
    age = max(0, int(now - (u.measured_at or now)))
    return (
        f"your home {u.home} uses {format_size(u.used or 0)} of its "
        f"{format_size(u.limit or 0)} limit (USER_DISK_LIMIT, measured {age}s ago)"
    )


class DiskQuotas:
    """Measures tenants' homes on this member and answers whether one is over."""

    def __init__(self, host: QuotaHost) -> None:
        self.host = host
        self.mode = QuotaMode("scan", "", "", "not detected yet")
        self.usage: dict[str, TenantUsage] = {}
        self._limits_set: dict[str, int | None] = {}
        self._task: asyncio.Task[None] | None = None
        self._round = asyncio.Lock()
        self.last_round_seconds = 0.0

    @property
    def limit(self) -> int | None:
        return self.host.options.user_disk_limit

    async def start(self) -> None:
        self.mode = await asyncio.to_thread(detect_mode, self.host.options.tenant_home_root)
        log.info("disk usage: %s mode (%s)", self.mode.kind, self.mode.detail)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            # With real quotas, a limit taken away (SIGHUP) is also cleared in the kernel.
            stale = any(v is not None for v in self._limits_set.values())
            if self.limit is not None or (self.mode.kind != "scan" and stale):
                t0 = time.monotonic()
                try:
                    await self.measure()
                except Exception:  # noqa: BLE001 - measuring must never stop the daemon
                    log.exception("measuring homes failed")
                self.last_round_seconds = time.monotonic() - t0
            interval = self.host.options.user_disk_scan_interval
            await asyncio.sleep(max(interval, STRETCH * self.last_round_seconds))

    def tenants(self, names: list[str] | None = None) -> list[tuple[str, int, str]]:
        """(name, uid, home) of the registry's tenants that have an account here."""
        out = []
        for name in names if names is not None else self.host.registry.names():
            u = self.host.registry.get(name)
            if u is None:
                continue
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            if pw.pw_uid == u["uid"]:
                out.append((name, pw.pw_uid, pw.pw_dir))
        return out

    async def measure(self, names: list[str] | None = None) -> list[TenantUsage]:
        """Measure every tenant here (or ``names``) now; returns the new figures."""
        async with self._round:
            tenants = self.tenants(names)
            if not tenants:
                return []
            if self.mode.kind == "scan":
                found = await asyncio.to_thread(self._scan, [h for _, _, h in tenants])
                now = self.host.clock.now()
                results = []
                for name, uid, home in tenants:
                    r = found.get(home, {"error": "not measured"})
                    results.append(
                        self._record(name, uid, home, r.get("bytes"), r.get("files"), now, r.get("error", ""))
                    )
                return results
            usage = await asyncio.to_thread(self._real, tenants)
            now = self.host.clock.now()
            return [
                self._record(name, uid, home, usage.get(uid, 0), None, now, "") for name, uid, home in tenants
            ]

    def _scan(self, homes: list[str]) -> dict[str, dict[str, Any]]:
        existing = [h for h in homes if os.path.isdir(h)]
        out: dict[str, dict[str, Any]] = {
            h: {"error": f"{h} does not exist"} for h in homes if h not in existing
        }
        if not existing:
            return out
        try:
            # Isolated, in /: nothing in a directory a tenant can write is ever imported.
            r = run(
                python_argv(sys.executable, "mtgpu.accounts.homescan", *existing),
                env=ROOT_CHILD_ENV,
                timeout=3600,
                cwd="/",
            )
        except CommandError as exc:
            log.warning("measuring homes failed: %s", exc)
            return {h: {"error": "the measuring process failed; see the daemon's log"} for h in homes}
        for line in r.stdout.splitlines():
            d = json.loads(line)
            if d.get("error"):
                d["bytes"] = d["files"] = None
            out[d["path"]] = d
        return out

    def _real(self, tenants: list[tuple[str, int, str]]) -> dict[int, int]:
        for name, _uid, _home in tenants:
            if self._limits_set.get(name, -1) != self.limit:
                try:
                    set_limit(self.mode, name, self.limit)
                    self._limits_set[name] = self.limit
                    log.info(
                        "quota of %s set to %s on %s",
                        name,
                        format_size(self.limit) if self.limit else "none",
                        self.mode.mount,
                    )
                except CommandError as exc:
                    log.warning("cannot set the quota of %s: %s", name, exc)
        return read_usage(self.mode)

    def _record(
        self, name: str, uid: int, home: str, used: int | None, files: int | None, now: float, error: str
    ) -> TenantUsage:
        limit = self.limit
        if used is None:
            state = "unmeasured"
        elif limit is None:
            state = "unlimited"
        else:
            state = "over" if used >= limit else "ok"
        u = TenantUsage(
            name,
            uid,
            home,
            used,
            files,
            limit,
            state,
            now if used is not None else None,
            self.mode.kind,
            error,
        )
        old = self.usage.get(name)
        if old is not None and old.state != state and "over" in (old.state, state):
            log.info(
                "disk usage of %s: %s (%s of %s)",
                name,
                state,
                format_size(used or 0),
                format_size(limit or 0),
            )
        self.usage[name] = u
        return u

    # ------------------------------------------------------------ questions

    def current(self, name: str) -> TenantUsage | None:
        """The last figure for ``name``, re-judged against the current limit."""
        u = self.usage.get(name)
        if u is None or u.used is None:
            return u
        limit = self.limit
        state = "unlimited" if limit is None else ("over" if u.used >= limit else "ok")
        if state != u.state or limit != u.limit:
            u = TenantUsage(
                u.user, u.uid, u.home, u.used, u.files, limit, state, u.measured_at, u.mode, u.error
            )
        return u

    def notice(self, name: str) -> str | None:
        """The warning an over-limit tenant gets at login and from mt-* commands."""
        u = self.current(name)
        if u is None or u.state != "over":
            return None
        return (
            over_message(u, self.host.clock.now()) + "; new jobs and workspaces are "
            "refused until you free space. Running work goes on"
        )

    async def check(self, name: str, what: str) -> None:
        """Refuse ``what`` (a new job or workspace) for a tenant over the limit."""
        u = self.current(name)
        if u is None or u.state != "over":
            return
        if self.host.clock.now() - (u.measured_at or 0) > RECHECK_AFTER:
            await self.measure([name])  # they may have freed space since
            u = self.current(name)
            if u is None or u.state != "over":
                return
        raise ApiError(
            f"{what} refused: {over_message(u, self.host.clock.now())}. Free some "
            "space (`du -sh ~/* ~/.[!.]* | sort -h` shows where it goes) and try "
            "again; your running jobs and workspaces go on",
            "over_disk_limit",
        )

    def report(self) -> dict[str, Any]:
        """Every tenant with an account here, for ``mtgpu-admin usage``."""
        rows = []
        for name, uid, home in self.tenants():
            u = self.current(name) or TenantUsage(
                name, uid, home, None, None, self.limit, "unmeasured", None, self.mode.kind
            )
            rows.append(u.to_dict())
        return {
            "mode": self.mode.kind,
            "mount": self.mode.mount,
            "detail": self.mode.detail,
            "limit": self.limit,
            "scan_interval": self.host.options.user_disk_scan_interval,
            "last_round_seconds": round(self.last_round_seconds, 3),
            "tenants": rows,
        }
