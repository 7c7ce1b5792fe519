"""API operations for tenant policy: ``usage`` (USER_DISK_LIMIT) and ``retention``
(TENANT_RETENTION_DAYS), and the guards that enforce both on new work.

- ``usage`` (admin): per-tenant usage, limit and state on this member; ``refresh``
  measures first.
- ``retention`` (admin, on the scheduler): one retention pass now, or with
  ``dry_run`` only what it would do. ``retention.unlock`` lets a locked tenant back.
- ``retention.member`` (peers and this daemon): one member's part: check, lock,
  unlock or remove a tenant's OS account and home here.

Guards on ``job.submit`` and ``workspace.create`` refuse tenants over the disk limit
or locked, and record the activity that retention counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from mtgpu.accounts import removal
from mtgpu.accounts import retention as ret
from mtgpu.accounts.quota import DiskQuotas
from mtgpu.accounts.registry import Registry
from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.clock import PolicyClock
from mtgpu.config import Options
from mtgpu.errors import ApiError, MtgpuError, ValidationError
from mtgpu.schedd.jobtable import JobTable

log = logging.getLogger("mtgpu.api.policy")

#: Activity is replicated at most this often per tenant (one log entry an hour).
ACTIVITY_GRANULARITY = 3600.0
#: A connection is recorded as a login at most this often per tenant.
LOGIN_GRANULARITY = 60.0
#: How long after a connection its sessions still show the retention warning (seconds).
WARNING_SHOWN_FOR = 600.0


def warn_on_failure(what: str, *args: object) -> Callable[[asyncio.Task[Any]], None]:
    """A done-callback that logs ``what % args`` and the error of a task that failed."""

    def done(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning(what + ": %s", *args, task.exception())

    return done


class PolicyHost(Protocol):
    options: Options
    registry: Registry
    jobs: JobTable
    clock: PolicyClock
    quotas: DiskQuotas
    cluster: Any

    async def replicate(self, method: Any, *args: Any) -> Any: ...

    def is_admin_name(self, name: str) -> bool: ...


class Retention:
    """Runs retention passes from the scheduler across every member."""

    def __init__(self, host: PolicyHost) -> None:
        self.host = host
        self._pass = asyncio.Lock()
        self._warnings: dict[str, tuple[float, str]] = {}  # name: (monotonic time, text)

    def facts(self) -> list[ret.TenantFacts]:
        by_user: dict[str, list[dict[str, Any]]] = {}
        for j in self.host.jobs.all():
            by_user.setdefault(j["user"], []).append(j)
        active: dict[str, list[str]] = {}
        for rec in self.host.jobs.active_records():
            active.setdefault(rec.user, []).append(rec.job_id)
        out = []
        for name in self.host.registry.names():
            u = self.host.registry.get(name)
            if u is None:
                continue
            out.append(
                ret.TenantFacts(
                    name,
                    self.host.is_admin_name(name),
                    ret.last_activity(u, by_user.get(name, [])),
                    u.get("locked"),
                    tuple(active.get(name, [])),
                    u.get("removal_failed"),
                )
            )
        return out

    # ------------------------------------------------ what tenants are told

    def admins(self) -> list[str]:
        reg = self.host.registry
        return sorted(
            {*self.host.options.admins, *(n for n in reg.names() if (reg.get(n) or {}).get("admin"))}
        )

    def last_active(self, name: str) -> float:
        """The tenant's latest activity: its record, and the jobs still on record."""
        u = self.host.registry.get(name) or {}
        return ret.last_activity(u, (j for j in self.host.jobs.all() if j["user"] == name))

    def connected(self, name: str) -> None:
        """An authenticated connection of a tenant (any: a session, ``ssh -N -L``): it is
        activity. A login close to the lock leaves the tenant a warning to be shown."""
        o = self.host.options
        u = self.host.registry.get(name)
        if u is None or not self.host.registry.granted(name, o.cluster_name):
            return  # a tenant not granted this cluster is refused; not activity here
        now = self.host.clock.now()
        days = o.tenant_retention_days
        quick = max(u.get("created") or 0, u.get("last_login") or 0, u.get("last_active") or 0)
        if days is not None and now >= quick + (days - o.tenant_retention_warn_days) * ret.DAY:
            text = ret.warning(
                name, self.last_active(name), now, days, o.tenant_retention_warn_days, self.admins()
            )
            if text:
                self._warnings[name] = (time.monotonic(), text)
                ret.write_log(o.state_dir, {"time": now, "user": name, "action": "warned", "detail": text})
        if now - (u.get("last_login") or 0) >= LOGIN_GRANULARITY:
            task = asyncio.get_running_loop().create_task(
                self.host.replicate(self.host.registry.record_login, name, now)
            )
            task.add_done_callback(warn_on_failure("could not record the connection of %s", name))

    def warning(self, name: str) -> str | None:
        """The warning a recent connection of ``name`` left (for its sessions to show)."""
        hit = self._warnings.get(name)
        if hit is None:
            return None
        if time.monotonic() - hit[0] > WARNING_SHOWN_FOR:
            self._warnings.pop(name, None)
            return None
        return hit[1]

    def locked_message(self, name: str) -> str | None:
        """What a locked tenant is told when it connects (None: not locked)."""
        u = self.host.registry.get(name)
        if u is None or not u.get("locked"):
            return None
        o = self.host.options
        return ret.locked_message(
            name, u["locked"], o.tenant_retention_grace, o.tenant_retention_home, self.admins()
        )

    def members(self) -> list[str]:
        cluster = self.host.cluster
        if cluster is None:
            return [self.host.options.server_name]
        return sorted({cluster.name, *cluster.addresses})

    async def on_members(
        self, action: str, name: str, uid: int, locked: float | None = None
    ) -> dict[str, Any]:
        """``retention.member`` on every member: {member: result or {"error": text}}."""

        async def one(member: str) -> Any:
            if member == self.host.options.server_name:
                return await member_action(self.host, action, name, uid, locked)
            return await self.host.cluster.peers.call(
                member, "retention.member", action=action, name=name, uid=uid, locked=locked, timeout=600
            )

        members = self.members()
        results = await asyncio.gather(*(one(m) for m in members), return_exceptions=True)
        return {
            m: ({"error": str(r) or type(r).__name__} if isinstance(r, BaseException) else r)
            for m, r in zip(members, results)
        }

    async def run(self, dry_run: bool, actor: str, retry: bool = False) -> dict[str, Any]:
        """One pass; ``retry``: failed removals are tried again without their back-off."""
        o = self.host.options
        now = self.host.clock.now()
        out: dict[str, Any] = {
            "now": now,
            "dry_run": dry_run,
            "days": o.tenant_retention_days,
            "grace_days": o.tenant_retention_grace / ret.DAY,
            "home": o.tenant_retention_home,
            "steps": [],
        }
        if o.tenant_retention_days is None:
            out["disabled"] = "TENANT_RETENTION_DAYS is not set; no tenant is ever removed"
            return out
        async with self._pass:
            steps = ret.plan(
                self.facts(), now, o.tenant_retention_days, o.tenant_retention_grace, retry_failed=retry
            )
            for step in steps:
                d = step.to_dict()
                if dry_run and step.action in ("lock", "remove"):
                    u = self.host.registry.get(step.user)
                    why = await self._blockers(step.user, u["uid"]) if u else ""
                    if why:
                        d["done"] = "would be blocked: " + why
                if not dry_run and step.action in ("lock", "remove"):
                    try:
                        d["done"] = await (
                            self._lock(step, now, actor)
                            if step.action == "lock"
                            else self._remove(step, now, actor)
                        )
                    except MtgpuError as exc:
                        d["done"] = f"failed: {exc}"
                        self._log(now, actor, step.user, step.action + " failed", str(exc))
                out["steps"].append(d)
        return out

    def _log(self, now: float, actor: str, user: str, action: str, detail: Any) -> None:
        """The action in STATE_DIR's retention log and in the replicated audit log."""
        ret.write_log(
            self.host.options.state_dir,
            {"time": now, "actor": actor, "user": user, "action": action, "detail": detail},
        )
        audit = getattr(self.host, "audit", None)
        if audit is not None:
            entry = {
                "time": now,
                "actor": actor or "retention",
                "uid": 0,
                "via": "retention",
                "member": self.host.options.server_name,
                "action": f"retention {action}",
                "args": {"user": user, "detail": str(detail)[:200]},
                "ok": True,
                "error": None,
            }
            task = asyncio.get_running_loop().create_task(self.host.replicate(audit.record, entry))
            task.add_done_callback(
                warn_on_failure("retention: the audit entry of %s %s was not written", action, user)
            )

    async def _lock(self, step: ret.Step, now: float, actor: str) -> str:
        u = self.host.registry.get(step.user)
        if u is None:
            return "gone"
        # A tenant's own processes (a nohup job) and workspaces keep it, as from removal.
        why = await self._blockers(step.user, u["uid"])
        if why:
            self._log(now, actor, step.user, "lock blocked", why)
            return "blocked: " + why
        await self.host.replicate(
            self.host.registry.lock_user, step.user, now, actor or "retention", step.reason
        )
        members = await self.on_members("lock", step.user, u["uid"])
        self._log(now, actor, step.user, "lock", {"reason": step.reason, "members": members})
        return "locked"

    async def _blockers(self, name: str, uid: int) -> str:
        """Why ``name`` cannot be removed right now on some member ("" if it can)."""
        blockers = []
        for member, c in sorted((await self.on_members("check", name, uid)).items()):
            if "error" in c:
                blockers.append(f"{member} did not answer ({c['error']})")
            elif c.get("processes"):
                blockers.append(
                    f"{len(c['processes'])} process(es) on {member} (a live session, tmux or job)"
                )
            if c.get("workspaces"):
                blockers.append(f"workspace(s) {', '.join(c['workspaces'][:5])} on {member}")
        return "; ".join(blockers)

    async def _remove(self, step: ret.Step, now: float, actor: str) -> str:
        u = self.host.registry.get(step.user)
        if u is None:
            return "gone"
        uid = u["uid"]
        why = await self._blockers(step.user, uid)
        if why:
            self._log(now, actor, step.user, "remove blocked", why)
            return "blocked: " + why
        removed = await self.on_members("remove", step.user, uid, locked=u.get("locked"))
        failed = {m: r["error"] for m, r in removed.items() if "error" in r}
        if failed:
            reason = "; ".join(f"{m}: {e}" for m, e in sorted(failed.items()))
            attempts = (u.get("removal_failed") or {}).get("attempts", 0) + 1
            retry_at = now + ret.retry_delay(attempts)
            await self.host.replicate(
                self.host.registry.record_removal_failure, step.user, now, reason, retry_at
            )
            self._log(now, actor, step.user, "remove failed", removed)
            return (
                f"failed (attempt {attempts}; the account stays locked, retried "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(retry_at))}): {reason}"
            )
        await self.host.replicate(self.host.registry.remove_user, step.user, now, actor or "retention")
        self._log(now, actor, step.user, "remove", removed)
        return "removed"


async def member_action(
    host: PolicyHost, action: str, name: str, uid: int, locked: float | None = None
) -> dict[str, Any]:
    """This member's part of a retention step, done here with its own accounts."""
    o = host.options
    now = host.clock.now()
    workspaces = getattr(host, "workspaces", None)
    if action == "check":
        r = await asyncio.to_thread(ret.check_member, name, uid)
        if workspaces is not None:  # a stopped or released one keeps its tenant too
            r["workspaces"] = workspaces.names_of(uid)
        return r
    if action in ("lock", "unlock"):
        account = await asyncio.to_thread(ret.lock_account, name, uid, action == "lock")
        result: dict[str, Any] = {"account": account}
    elif action == "disable":  # mtgpu-admin user remove: this member's part
        result = await disable_member(host, name, uid)
    elif action == "remove":
        result = await asyncio.to_thread(
            ret.remove_member,
            name,
            uid,
            o.tenant_retention_home,
            o.retention_archive_dir,
            o.tenant_home_root,
            now,
            locked,
        )
        stores = getattr(host, "container_stores", None)
        if stores is not None and result.get("account") == "deleted":
            result["containers"] = await asyncio.to_thread(stores.remove, uid)
        if workspaces is not None and result.get("account") == "deleted":
            result["workspace_records"] = workspaces.forget(uid)
        fence = getattr(host, "fence", None)
        if fence is not None and result.get("account") == "deleted":
            # Its session cgroup and private /tmp, /var/tmp and /dev/shm go with it.
            await asyncio.to_thread(fence.remove, uid)
            result["private_tmp"] = "removed"
    else:
        raise ValidationError(f"unknown retention action {action!r}")
    ret.write_log(
        o.state_dir, {"time": now, "user": name, "action": action, "member": o.server_name, "detail": result}
    )
    return result


async def disable_member(host: PolicyHost, name: str, uid: int) -> dict[str, Any]:
    """A removed user on this member: its live SSH connections closed, its workspaces
    stopped, its account locked and its processes ended (mtgpu.accounts.removal)."""
    out: dict[str, Any] = {}
    limits = getattr(host, "ssh_limits", None)
    if limits is not None:
        out["ssh_connections_closed"] = limits.close_user(name, f"{name} was removed from MTGPU by an admin")
    workspaces = getattr(host, "workspaces", None)
    if workspaces is not None:
        stopped = []
        for rec in [r for r in workspaces.records.values() if r.uid == uid]:
            try:
                await workspaces.stop_ws(name, uid, rec.name, release=True)
                stopped.append(rec.name)
            except MtgpuError as exc:
                log.warning("removing %s: workspace %s not stopped: %s", name, rec.name, exc)
        out["workspaces_stopped"] = stopped
    out.update(await asyncio.to_thread(removal.disable, name, uid))
    fence = getattr(host, "fence", None)
    if fence is not None:
        # Its session cgroup and private /tmp, /var/tmp and /dev/shm go with it.
        await asyncio.to_thread(fence.remove, uid)
        out["session_fence"] = "removed"
    return out


def register(d: Dispatcher, host: PolicyHost, retention: Retention) -> None:
    """Register the policy operations and guards on ``d``."""

    async def usage(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Per-tenant disk usage, limit and state on this member."""
        if arg(args, "refresh", bool, False):
            await host.quotas.measure()
        return {"server": host.options.server_name, **host.quotas.report()}

    async def run_retention(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Run tenant retention now (dry_run: only say what it would do)."""
        return await retention.run(
            arg(args, "dry_run", bool, False), caller.name, retry=arg(args, "retry", bool, False)
        )

    async def unlock(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Unlock a tenant retention locked; its inactivity counts from now."""
        name = arg(args, "name", str)
        u = host.registry.get(name)
        if u is None:
            raise ApiError(f"no user {name!r}", "not_found")
        r = await host.replicate(host.registry.unlock_user, name, host.clock.now(), caller.name)
        r["members"] = await retention.on_members("unlock", name, u["uid"])
        retention._log(host.clock.now(), caller.name, name, "unlock", r["members"])
        return r

    async def retention_status(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The tenants retention locked, with any removal that failed and why."""
        locked = []
        for name in host.registry.names():
            u = host.registry.get(name)
            if u is not None and u.get("locked"):
                locked.append(
                    {
                        "user": name,
                        "locked": u["locked"],
                        "reason": u.get("lock_reason"),
                        "removal_failed": u.get("removal_failed"),
                    }
                )
        return {"days": host.options.tenant_retention_days, "now": host.clock.now(), "locked": locked}

    async def member(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One member's part of a retention step (peers only)."""
        if caller.via != "peer":
            raise ApiError("only the scheduler may ask this", "forbidden")
        return await member_action(
            host,
            arg(args, "action", str),
            arg(args, "name", str),
            arg(args, "uid", int),
            arg(args, "locked", (int, float), None),
        )

    async def new_work(caller: Caller, args: dict[str, Any], what: str) -> None:
        if caller.via in ("forwarded", "peer") or caller.uid == 0:
            return  # checked by the member the tenant asked
        u = host.registry.get(caller.name)
        if u is not None and u.get("locked"):
            raise ApiError(
                f"{what} refused: your account is locked for inactivity "
                "(TENANT_RETENTION_DAYS); ask an admin to unlock it",
                "locked",
            )
        await host.quotas.check(caller.name, what)
        in_touch = getattr(host, "check_in_touch", None)
        if in_touch is not None:
            # Cut off from the majority: refused now (retryably) rather than after a
            # record of activity waited for a commit that cannot come.
            in_touch()
        now = host.clock.now()
        if u is not None and now - (u.get("last_active") or 0) > ACTIVITY_GRANULARITY:
            try:
                await host.replicate(host.registry.record_activity, caller.name, now)
            except MtgpuError:
                log.warning("could not record the activity of %s", caller.name)

    async def job_guard(caller: Caller, args: dict[str, Any]) -> None:
        await new_work(caller, args, "a new job")

    async def workspace_guard(caller: Caller, args: dict[str, Any]) -> None:
        await new_work(caller, args, "a new workspace")

    d.register("usage", usage, admin=True)
    d.register("retention", run_retention, admin=True)
    d.register("retention.unlock", unlock, admin=True)
    d.register("retention.member", member, admin=True)
    d.register("retention.status", retention_status, admin=True)
    d.guard("job.submit", job_guard)
    d.guard("workspace.create", workspace_guard)

    def quota_notice(caller: Caller) -> str | None:
        return None if caller.uid == 0 else host.quotas.notice(caller.name)

    def retention_notice(caller: Caller) -> str | None:
        return None if caller.uid == 0 else retention.warning(caller.name)

    d.add_notice(quota_notice)
    d.add_notice(retention_notice)
