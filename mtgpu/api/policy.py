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
from typing import Any, Protocol

from mtgpu.accounts import retention as ret
from mtgpu.accounts.quota import DiskQuotas
from mtgpu.accounts.registry import Registry
from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.clock import PolicyClock
from mtgpu.config import Options
from mtgpu.errors import ApiError, MtgpuError
from mtgpu.schedd.jobtable import JobTable

log = logging.getLogger("mtgpu.api.policy")

#: Activity is replicated at most this often per tenant (one log entry an hour).
ACTIVITY_GRANULARITY = 3600.0


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

    def facts(self) -> list[ret.TenantFacts]:
        by_user: dict[str, list[dict[str, Any]]] = {}
        for j in self.host.jobs.all():
            by_user.setdefault(j["user"], []).append(j)
        active: dict[str, list[str]] = {}
        for j in self.host.jobs.active():
            active.setdefault(j["user"], []).append(j["job_id"])
        out = []
        for name in self.host.registry.names():
            u = self.host.registry.get(name)
            if u is None:
                continue
            out.append(ret.TenantFacts(
                name, self.host.is_admin_name(name), ret.last_activity(u, by_user.get(name, [])),
                u.get("locked"), tuple(active.get(name, []))))
        return out

    def members(self) -> list[str]:
        cluster = self.host.cluster
        if cluster is None:
            return [self.host.options.server_name]
        return sorted({cluster.name, *cluster.addresses})

    async def on_members(self, action: str, name: str, uid: int) -> dict[str, Any]:
        """``retention.member`` on every member: {member: result or {"error": text}}."""
        async def one(member: str) -> Any:
            if member == self.host.options.server_name:
                return await member_action(self.host, action, name, uid)
            return await self.host.cluster.peers.call(member, "retention.member", action=action,
                                                      name=name, uid=uid, timeout=600)

        members = self.members()
        results = await asyncio.gather(*(one(m) for m in members), return_exceptions=True)
        return {m: ({"error": str(r) or type(r).__name__} if isinstance(r, BaseException) else r)
                for m, r in zip(members, results)}

    async def run(self, dry_run: bool, actor: str) -> dict[str, Any]:
        o = self.host.options
        now = self.host.clock.now()
        out: dict[str, Any] = {"now": now, "dry_run": dry_run, "days": o.tenant_retention_days,
                               "grace_days": o.tenant_retention_grace / ret.DAY,
                               "home": o.tenant_retention_home, "steps": []}
        if o.tenant_retention_days is None:
            out["disabled"] = "TENANT_RETENTION_DAYS is not set; no tenant is ever removed"
            return out
        async with self._pass:
            steps = ret.plan(self.facts(), now, o.tenant_retention_days,
                             o.tenant_retention_grace)
            for step in steps:
                d = step.to_dict()
                if dry_run and step.action == "remove":
                    u = self.host.registry.get(step.user)
                    why = await self._blockers(step.user, u["uid"]) if u else ""
                    if why:
                        d["done"] = "would be blocked: " + why
                if not dry_run and step.action in ("lock", "remove"):
                    try:
                        d["done"] = await (self._lock(step, now, actor) if step.action == "lock"
                                           else self._remove(step, now, actor))
                    except MtgpuError as exc:
                        d["done"] = f"failed: {exc}"
                        self._log(now, actor, step.user, step.action + " failed", str(exc))
                out["steps"].append(d)
        return out

    def _log(self, now: float, actor: str, user: str, action: str, detail: Any) -> None:
        """The action in STATE_DIR's retention log and in the replicated audit log."""
        ret.write_log(self.host.options.state_dir, {"time": now, "actor": actor, "user": user,
                                                    "action": action, "detail": detail})
        audit = getattr(self.host, "audit", None)
        if audit is not None:
            entry = {"time": now, "actor": actor or "retention", "uid": 0, "via": "retention",
                     "member": self.host.options.server_name, "action": f"retention {action}",
                     "args": {"user": user, "detail": str(detail)[:200]}, "ok": True,
                     "error": None}
            task = asyncio.get_running_loop().create_task(self.host.replicate(audit.record, entry))
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or log.warning(
                "retention: the audit entry of %s %s was not written: %s", action, user,
                t.exception()))

    async def _lock(self, step: ret.Step, now: float, actor: str) -> str:
        u = self.host.registry.get(step.user)
        if u is None:
            return "gone"
        await self.host.replicate(self.host.registry.lock_user, step.user, now, actor or
                                  "retention", step.reason)
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
                blockers.append(f"{len(c['processes'])} process(es) on {member} (a live "
                                "session, tmux or job)")
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
        removed = await self.on_members("remove", step.user, uid)
        failed = {m: r["error"] for m, r in removed.items() if "error" in r}
        if failed:
            self._log(now, actor, step.user, "remove incomplete", removed)
            return "incomplete (the account stays locked; retried next pass): " + "; ".join(
                f"{m}: {e}" for m, e in sorted(failed.items()))
        await self.host.replicate(self.host.registry.remove_user, step.user, now,
                                  actor or "retention")
        self._log(now, actor, step.user, "remove", removed)
        return "removed"


async def member_action(host: PolicyHost, action: str, name: str, uid: int) -> dict[str, Any]:
    """This member's part of a retention step, done here with its own accounts."""
    o = host.options
    now = host.clock.now()
    if action == "check":
        return await asyncio.to_thread(ret.check_member, name, uid)
    if action in ("lock", "unlock"):
        r = await asyncio.to_thread(ret.lock_account, name, uid, action == "lock")
        result = {"account": r}
    elif action == "remove":
        result = await asyncio.to_thread(ret.remove_member, name, uid, o.tenant_retention_home,
                                         o.retention_archive_dir, o.tenant_home_root, now)
        stores = getattr(host, "container_stores", None)
        if stores is not None and result.get("account") == "deleted":
            await asyncio.to_thread(stores.remove, uid)
            result["containers"] = f"{stores.dir_of(uid)} removed"
    else:
        raise ApiError(f"unknown retention action {action!r}", "bad_request")
    ret.write_log(o.state_dir, {"time": now, "user": name, "action": action,
                                "member": o.server_name, "detail": result})
    return result


def register(d: Dispatcher, host: PolicyHost, retention: Retention) -> None:
    """Register the policy operations and guards on ``d``."""

    async def usage(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Per-tenant disk usage, limit and state on this member."""
        if arg(args, "refresh", bool, False):
            await host.quotas.measure()
        return {"server": host.options.server_name, **host.quotas.report()}

    async def run_retention(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Run tenant retention now (dry_run: only say what it would do)."""
        return await retention.run(arg(args, "dry_run", bool, False), caller.name)

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

    async def member(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One member's part of a retention step (peers only)."""
        if caller.via != "peer":
            raise ApiError("only the scheduler may ask this", "forbidden")
        return await member_action(host, arg(args, "action", str), arg(args, "name", str),
                                   arg(args, "uid", int))

    async def new_work(caller: Caller, args: dict[str, Any], what: str) -> None:
        if caller.via in ("forwarded", "peer") or caller.uid == 0:
            return  # checked by the member the tenant asked
        u = host.registry.get(caller.name)
        if u is not None and u.get("locked"):
            raise ApiError(f"{what} refused: your account is locked for inactivity "
                           "(TENANT_RETENTION_DAYS); ask an admin to unlock it", "locked")
        await host.quotas.check(caller.name, what)
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
    d.guard("job.submit", job_guard)
    d.guard("workspace.create", workspace_guard)
    d.notice = lambda caller: None if caller.uid == 0 else host.quotas.notice(caller.name)
