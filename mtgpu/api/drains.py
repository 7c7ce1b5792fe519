"""API operations for admins: node.drain and node.undrain (``mtgpu-admin drain``).

In a cluster both run on the scheduler (other members relay them), so the scheduler
acts on the change at once; the drain itself is replicated state
(:class:`~mtgpu.schedd.drains.Drains`) and outlives a failover.

A drain with ``now`` also empties the member: each job running there is requeued if
it allows it (``requeue=yes``) and cancelled otherwise, with the drain's reason
recorded on the job.
"""

from __future__ import annotations

import time
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import ApiError
from mtgpu.jobstate import RUNNING


def known_nodes(host: Any) -> set[str]:
    """The members an admin may drain: this host, the members that reported to the
    scheduler and, in a cluster, every member in the replicated list."""
    names = {host.options.server_name}
    if host.scheduler is not None:
        names |= set(host.scheduler.nodes)
    cluster = getattr(host, "cluster", None)
    if cluster is not None:
        names |= {m["name"] for m in cluster.members.all()}
    return names


def running_on(host: Any, node: str) -> list[str]:
    """Ids of the jobs with a part on ``node`` that are running now."""
    out = []
    for j in host.jobs.running_records():
        if j.state == RUNNING and j.member_on(node) is not None:
            out.append(j.job_id)
    return sorted(out)


def register(d: Dispatcher, host: Any) -> None:
    """Register the drain operations on ``d`` (admins only)."""

    async def drain(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Drain a member: it takes no new work; its running jobs go on."""
        node = arg(args, "node", str)
        reason = " ".join(arg(args, "reason", str, "").split())
        known = known_nodes(host)
        if node not in known:
            raise ApiError(f"no member {node!r}; members: {', '.join(sorted(known))}", "not_found")
        now = arg(args, "now", bool, False)
        r = await host.replicate(host.drains.drain, node, reason, caller.name, time.time())
        requeued: list[str] = []
        cancelled: list[str] = []
        if now:
            why = f"{node} was drained now by {caller.name}" + (f": {reason}" if reason else "")
            for jid in running_on(host, node):
                j = host.jobs.record(jid)
                if j is None:
                    continue
                if j.spec.requeue and not j.cancel_requested:
                    await host.replicate(host.jobs.requeue, jid, f"requeued: {why}", time.time(), j.attempt)
                    requeued.append(jid)
                else:
                    await host.replicate(host.jobs.cancel, [jid], caller.name, time.time(), why)
                    cancelled.append(jid)
        if host.scheduler is not None:
            host.scheduler.kick()
        running = [j for j in running_on(host, node) if j not in cancelled]
        return {
            **r,
            "drained": True,
            "running": running,
            "now": now,
            "requeued": requeued,
            "cancelled": cancelled,
        }

    async def undrain(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Let a drained member take new work again."""
        node = arg(args, "node", str)
        if host.drains.get(node) is None:
            known = known_nodes(host)
            if node not in known:
                raise ApiError(f"no member {node!r}; members: {', '.join(sorted(known))}", "not_found")
            return {"node": node, "drained": False, "was": None}
        was = await host.replicate(host.drains.undrain, node)
        if host.scheduler is not None:
            host.scheduler.kick()
        return {"node": node, "drained": False, "was": was}

    d.register("node.drain", drain, admin=True, audit=True)
    d.register("node.undrain", undrain, admin=True, audit=True)
