"""The cluster's operations on the API: what members ask each other (joining, usage
reports, roles, the scheduler's log index) and ``mtgpu-admin cluster``.

The handlers live here, on the API's side, and act on the member's
:class:`~mtgpu.cluster.runtime.ClusterRuntime`; the cluster code itself never imports
the dispatcher.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from mtgpu.api import jobs as job_api
from mtgpu.api.dispatcher import Caller, Dispatcher, Middleware, Next, arg
from mtgpu.cluster.relay import relay
from mtgpu.cluster.runtime import ClusterRuntime
from mtgpu.errors import ApiError, ValidationError
from mtgpu.jsonl import Page
from mtgpu.schedd.jobtable import JobTable
from mtgpu.state.codec import JobRecord

#: The tenant job operations only the scheduler (the Raft leader) answers: another
#: member relays them there (:func:`leader_forwarding`).
LEADER_OPS = frozenset(
    {
        "job.submit",
        "job.list",
        "job.show",
        "job.cancel",
        "job.hold",
        "job.release",
        "job.requeue",
        "job.update",
        "nodes",
        "node.drain",
        "node.undrain",
        "retention",
        "retention.unlock",
    }
)
#: Those of LEADER_OPS that change nothing.
LEADER_READS = frozenset({"job.list", "job.show", "nodes"})


def register_hello(d: Dispatcher, rt: ClusterRuntime) -> None:
    """Answer joining members, from before this member's own store is open."""

    def hello(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """What this member knows of the cluster (for a joining member)."""
        _peer_only(caller)
        if arg(args, "cluster_id", str, rt.options.cluster_id) != rt.options.cluster_id:
            raise ApiError("another cluster ID", "wrong_cluster")
        leader = rt.leader()
        if rt.coordinator is None or leader is None:
            return {"name": rt.name, "formed": False}
        addr = rt.address if leader == rt.name else rt.addresses.get(leader)
        return {
            "name": rt.name,
            "formed": True,
            "leader": leader,
            "leader_address": addr,
            "voters": rt.members.voters(),
            "members": [m["name"] for m in rt.members.all()],
        }

    d.register("cluster.hello", hello)


def register(d: Dispatcher, rt: ClusterRuntime) -> None:
    """The peer and admin operations of a member whose store is open (after ``rt.start``)."""
    peer_only = _peer_only

    async def join(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Admit a member (on the leader)."""
        peer_only(caller)
        assert rt.coordinator is not None
        name = arg(args, "name", str)
        if caller.name != f"mtgpu-peer.{name}":
            raise ApiError("a member can only join as itself", "forbidden")
        address = arg(args, "address", str)

        async def reachable() -> bool:
            try:
                await rt.peers.call(
                    f"probe:{name}",
                    "cluster.hello",
                    dial_address=address,
                    timeout=3,
                    cluster_id=rt.options.cluster_id,
                )
                return True
            except ApiError:
                return False
            finally:
                rt.peers.forget(f"probe:{name}")

        r = await rt.coordinator.join(name, address, float(arg(args, "score", (int, float), 0.0)), reachable)
        r["addresses"] = {**rt.addresses, rt.name: rt.address}
        return r

    def report(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """A member's inventory and measured use, for the scheduler's memory."""
        peer_only(caller)
        inv = rt.reports.read(arg(args, "inventory", dict))
        if rt.coordinator is not None:
            rt.coordinator.reported[inv.name] = time.monotonic()
        if rt.on_report is not None:
            rt.on_report(inv)
        # The scheduler's answer renews the reporting member's lease (only a member's
        # own report: one member cannot renew another's).
        lease = None
        if rt.grant is not None and rt.is_leader() and caller.name == f"mtgpu-peer.{inv.name}":
            lease = rt.grant(inv.name)
        return {"ok": True, **({"lease": lease} if lease is not None else {})}

    def inventory(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """This member's inventory and measured use, for a scheduler that asks."""
        peer_only(caller)
        inv = rt.inventory()
        if inv is None:
            raise ApiError("this member has not sampled its resources yet", "not_ready")
        return inv.to_dict(processes=False)

    def status(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The cluster as this member sees it."""
        return rt.status()

    async def remove(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Take a member out of the cluster (on the scheduler)."""
        name = arg(args, "name", str)
        if not rt.is_leader():
            leader = rt.leader()
            if leader is None:
                raise ApiError("no scheduler is elected right now; retry", "no_leader")
            return await rt.peers.call(leader, "cluster.remove", name=name)
        m = rt.members.get(name)
        if m is None:
            raise ApiError(f"no member {name!r}; `mtgpu-admin cluster status` lists them", "not_found")
        if name == rt.name:
            raise ValidationError(
                "the scheduler cannot remove itself; run this on another "
                "member after moving the scheduler, or stop this one"
            )
        assert rt.coordinator is not None
        await rt.coordinator.remove_member(name)
        rt.reports.forget(name)
        return {"removed": name}

    async def role(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Run this member's replica as a voter or read-only (the scheduler asks)."""
        peer_only(caller)
        want = arg(args, "role", str)
        voters = arg(args, "voters", list)
        if want not in ("voter", "readonly"):
            raise ValidationError("role must be voter or readonly")
        if (want == "voter") != (rt.name in voters):
            raise ValidationError("the voters do not match the role")
        sender = caller.name.removeprefix("mtgpu-peer.")
        if want == "voter" and sender != rt.leader():
            raise ApiError(f"only the scheduler ({rt.leader()}) promotes members", "not_leader")
        changed = await rt.switch_role(want, [str(v) for v in voters])
        return {"role": want, "changed": changed}

    def log_index(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The scheduler's last log index, for a member catching up before a read."""
        peer_only(caller)
        if not rt.is_leader():
            raise ApiError(f"not the scheduler; ask {rt.leader()}", "not_leader")
        return {"index": rt.last_index()}

    d.register("cluster.log_index", log_index)
    d.register("cluster.join", join)
    d.register("cluster.remove", remove, admin=True, audit=True)
    d.register("cluster.role", role)
    d.register("node.report", report)
    d.register("node.inventory", inventory)
    d.register("cluster.status", status, admin=True)


class ForwardingHost(job_api.JobHost, Protocol):
    """What leader forwarding needs of the daemon besides the job operations' host."""

    def check_in_touch(self) -> None: ...


def leader_forwarding(rt: ClusterRuntime, host: ForwardingHost) -> Middleware:
    """The dispatcher middleware that, on a member that is not the scheduler, relays
    tenant job operations (LEADER_OPS) to the leader; on the leader (or for a request
    a member relayed) they are answered here."""

    async def forwarding(caller: Caller, op: str, args: dict[str, Any], call_next: Next) -> Any:
        if op not in LEADER_OPS:
            return await call_next(caller, args)
        if rt.is_leader() or caller.via == "forwarded":
            if op not in LEADER_READS:
                # A leader cut off from its majority would append a change that
                # a new leader's log may overwrite: none is taken there.
                host.check_in_touch()
            else:
                # A scheduler that has just taken over may not have applied every
                # committed entry yet: what was acknowledged is answered.
                await rt.catch_up()
            return await call_next(caller, args)
        host.check_in_touch()  # rather than a relay that waits 30 s for nothing
        if op == "job.submit":
            script = arg(args, "script", str)
            job_api.check_script_size(job_api.script_bytes(script), host.options.job_script_max)
            # The tenant's image is looked up here, where they submit it.
            src = await job_api.submitted_image(
                host,
                caller,
                args,
                await job_api.directive_container(
                    script, arg(args, "overrides", dict, {}), job_api.submit_options(args)
                ),
            )
            if src is not None:
                args = {**args, "container_source": src}
        # Through a failover, to the new scheduler as soon as it is named.
        return await relay(
            rt.peers,
            rt.leader,
            op,
            args,
            {"name": caller.name, "uid": caller.uid, "admin": caller.admin},
        )

    return forwarding


def register_relayed(
    d: Dispatcher,
    table: JobTable,
    start: Callable[[JobRecord, int, int], Awaitable[None]],
    rendezvous_port: Callable[[], int],
) -> None:
    """What other members ask of this one's job side: a tenant's request relayed to
    the scheduler (``forward``), a part of a placed job to start (``job.dispatch``)
    and a free rendezvous port (``job.rendezvous``)."""

    async def forward(caller: Caller, args: dict[str, Any]) -> Any:
        """A tenant's request relayed by another member (peers only)."""
        if caller.via != "peer":
            raise ApiError("only other members may relay requests", "forbidden")
        c = arg(args, "caller", dict)
        inner = Caller(str(c["name"]), int(c["uid"]), bool(c["admin"]), "forwarded")
        answer = await d.handle(inner, {"op": arg(args, "op", str), "args": arg(args, "args", dict)})
        if not answer["ok"]:
            raise ApiError.from_answer(answer)
        if answer.get("next_cursor"):  # a page of a listing: its cursor goes back too
            return Page(answer["result"], answer["next_cursor"])
        return answer["result"]

    d.register("forward", forward)
    d.register("job.dispatch", job_api.dispatch_op(table, start))
    d.register("job.rendezvous", job_api.rendezvous_op(rendezvous_port))


def _peer_only(caller: Caller) -> None:
    if caller.via != "peer":
        raise ApiError("only other members may call this", "forbidden")
