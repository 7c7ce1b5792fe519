"""The scheduler service: the queue, the scheduling loop and submit-time checks.

It runs on the leader (on a standalone host, always). Its queue is rebuilt from the
job table whenever it starts, so losing the scheduler loses no job. Measured usage
comes from node reports kept in memory (never in the log); committed capacity comes
from the running jobs in the table. Each placement is journaled before it is
dispatched, with the leader's term, so a deposed leader cannot start a job twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.errors import FenceError, JobError
from mtgpu.gpuinfo.types import NodeInventory
from mtgpu.jobstate import FAILED, NODE_FAIL, PENDING
from mtgpu.schedd.depend import Gates
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobtable import JobTable, draft
from mtgpu.schedd.placement import feasible_ever, snapshot_with_allocations
from mtgpu.schedd.queue import PendingInfo, PendingQueue, QueuePolicy, schedule_pass
from mtgpu.schedd.types import (
    Allocation,
    ClusterSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    NodeState,
    ResourceRequest,
)
from mtgpu.state.codec import JobRecord

log = logging.getLogger("mtgpu.schedd")

#: Request shapes whose feasibility is remembered (each holds its server list).
MAX_FEASIBLE_CACHE = 1024

#: The shortest time between two scheduling passes, in seconds (Slurm's
#: sched_min_interval plays this part). A pass costs about the same whether it places
#: one job or fifty (on a thousand members it rebuilds the members' free capacity), so
#: while jobs are submitted and end all the time, at most ten a second; a submission to
#: an idle scheduler is still placed at once.
MIN_PASS_INTERVAL = 0.1
#: After a pass, the loop waits this many times as long as the pass computed, so that
#: passes take at most a fifth of the scheduler's time however large the cluster
#: (on a thousand members a pass computes for about 8 ms, and every submission and
#: every job end asks for one).
PASS_SHARE_WAIT = 4.0
#: ...but only this many times after a pass that stopped at ``max_placements`` with
#: more to place (a burst): the rest of the burst waits on it, and the requests the
#: pass's starts bring are served while they start anyway.
BURST_SHARE_WAIT = 1.0
#: How often the loop looks for members whose lease ran out (seconds). Leases last
#: ``lost_after`` (tens of seconds), so looking on every pass (up to ten a second,
#: each over every member and every running job) only cost CPU (a direct call of
#: :meth:`Scheduler.check_lost` still looks at once).
LOST_CHECK_INTERVAL = 0.5
#: A pass waits for submissions to pause this long (seconds)...
SUBMIT_QUIET = 0.01
#: ...but never longer than this in all.
MAX_DEFER = 1.0
#: Placements journaled together, as one log entry.
PLACE_BATCH = 64
#: Placed jobs being started at once on one member. They reach another member in
#: batches (one request carries the starts waiting for it), and the member runs a few
#: at a time itself (``agent.STARTS_AT_ONCE``), so this only bounds what one member's
#: starts hold of the total below.
DISPATCH_CONCURRENCY = 64
#: Placed jobs being started at once in all: starts on other members mostly wait on
#: the network, so a burst on a large cluster starts many members' jobs side by side.
DISPATCH_TOTAL = 256

Replicate = Callable[..., Awaitable[Any]]
Dispatch = Callable[[JobRecord, int], Awaitable[None]]


def node_snapshot(
    inv: NodeInventory,
    state: NodeState = NodeState.UP,
    previous: tuple[NodeInventory, NodeSnapshot] | None = None,
) -> NodeSnapshot:
    """The scheduler's view of one member from its latest report.

    With ``previous`` (an earlier report and the snapshot made from it), the GPUs'
    snapshots are kept when the GPU records are the very same objects (a
    :class:`~mtgpu.gpuinfo.types.ReportReader` keeps unchanged ones).
    """
    if (
        previous is not None
        and len(previous[0].gpus) == len(inv.gpus)
        and all(a is b for a, b in zip(previous[0].gpus, inv.gpus, strict=True))
    ):
        gpus = previous[1].gpus
    else:
        # A card in MIG mode is never placed whole: its instances are the GPUs.
        gpus = tuple(
            GpuSnapshot(
                index=g.index, brand=g.brand, type=g.type, vram_total=g.vram_total, vram_used=g.vram_used
            )
            for g in inv.gpus
            if g.placeable
        )
    return NodeSnapshot(
        name=inv.name,
        cpus=inv.host.cpus,
        ram_total=inv.host.ram_total,
        gpus=gpus,
        ram_used=inv.host.ram_used,
        state=state,
        features=inv.features,
    )


def _same_snapshot(a: NodeInventory, b: NodeInventory) -> bool:
    """Whether two reports make the same :func:`node_snapshot` (unchanged GPU records
    are the same objects when read by a :class:`~mtgpu.gpuinfo.types.ReportReader`)."""
    ha, hb = a.host, b.host
    return (
        ha.cpus == hb.cpus
        and ha.ram_total == hb.ram_total
        and ha.ram_used == hb.ram_used
        and a.features == b.features
        and len(a.gpus) == len(b.gpus)
        and all(x is y or x == y for x, y in zip(a.gpus, b.gpus, strict=True))
    )


_UNKNOWN = object()
#: What :meth:`Scheduler.unknown` names while the member list itself is not current.
MEMBER_LIST = "(the member list)"


def _hardware(inv: NodeInventory) -> tuple[Any, ...]:
    return (
        inv.host.cpus,
        inv.host.ram_total,
        tuple((g.index, g.brand, g.type, g.vram_total) for g in inv.gpus if g.placeable),
        inv.features,
    )


class Scheduler:
    """Places pending jobs on members; one instance, on the leader."""

    def __init__(
        self,
        table: JobTable,
        replicate: Replicate,
        dispatch: Dispatch,
        *,
        term: Callable[[], int],
        clock: Callable[[], float] | None = None,
        policy: QueuePolicy | None = None,
        aging_per_hour: float = 10.0,
        drains: Drains | None = None,
        members: Callable[[], Collection[str]] | None = None,
        own_name: str | None = None,
        state_current: Callable[[], bool] | None = None,
        grace: float = 0.0,
        lost_after: float | None = None,
        lease: float | None = None,
        takeover_wait: float = 0.0,
    ) -> None:
        self.table = table
        self.replicate = replicate
        self.dispatch = dispatch
        self.term = term
        self.clock = clock or time.time
        #: The clock leases and lost members are measured on: this scheduler's own
        #: monotonic clock (no clock sync between members is needed).
        self.lease_clock = clock or time.monotonic
        self.policy = policy or QueuePolicy()
        self.nodes: dict[str, NodeInventory] = {}
        self.node_state: dict[str, NodeState] = {}
        #: The admins' drains (replicated; see mtgpu.schedd.drains), given by the daemon.
        self.drains = drains
        self.age_weight = aging_per_hour / 3600
        self.queue = PendingQueue(self.age_weight)
        self.pending_info: dict[str, PendingInfo] = {}
        #: Pending jobs kept out of the queue: held, before --begin, or on a dependency.
        self.gates = Gates()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Starts in flight (placed and journaled; the member is starting them).
        self._starting: set[asyncio.Task[None]] = set()
        self._gate: asyncio.Semaphore | None = None
        #: One gate per member (its first member, for a multi-node job).
        self._member_gates: dict[str, asyncio.Semaphore] = {}
        self._last_submit = 0.0
        # Keyed by what tenants ask for, so bounded (least recently used go first).
        self._feasible: OrderedDict[ResourceRequest, Any] = OrderedDict()
        self._seen_version = 0
        #: The members the inventory must hold to be complete (the replicated member
        #: list, in a cluster); None: the reports alone (a standalone host).
        self.members = members
        #: This member's own name: never dropped from the inventory.
        self.own_name = own_name
        #: Whether this member's replica has applied every change committed before it
        #: became the scheduler (until then its member list may lack members).
        self.state_current = state_current
        #: The longest a submission that does not fit what has reported waits for the
        #: members that have not (seconds); after that it is accepted and re-checked.
        self.grace = grace
        #: Members taken out of the member list, and when this scheduler saw it: their
        #: running jobs are ended as a lost member's are, ``lost_after`` later.
        self._gone: dict[str, float] = {}
        #: Whether pending jobs are to be checked again once the inventory is complete
        #: (at start, and after a request was accepted on an incomplete one).
        self._recheck = True
        #: Whether the jobs an earlier scheduler placed but may not have started have
        #: been started again (once per start, when the replica is current).
        self._restarted_unstarted = False
        self.started_at = 0.0
        #: When this scheduler started, on ``lease_clock``.
        self.lease_started = 0.0
        #: When each member last reported, and so was last granted a lease
        #: (``lease_clock``; not replicated).
        self.last_report: dict[str, float] = {}
        #: A member silent for this long is lost: its jobs end NODE_FAIL or are
        #: requeued. None: never (a standalone host is its own only member). In a
        #: cluster it is the lease bound: a member's lease plus its fencing grace and
        #: a margin (see :mod:`mtgpu.cluster.lease`).
        self.lost_after = lost_after
        #: The lease granted with each report (seconds); None: no leases.
        self.lease = lease
        #: How long a deposed scheduler may still have granted leases after this one
        #: took over (Raft's leader fall-back time): every member's clock starts then.
        self.takeover_wait = takeover_wait
        self._last_old_runs = float("-inf")
        self._last_lost_check = float("-inf")
        #: Each member's snapshot, made when a pass first needs it, with the report it
        #: stands for: a report that is not the member's latest makes it stale (and
        #: its GPUs' part is reused where the GPU records are the same).
        self._node_snaps: dict[str, tuple[NodeInventory, NodeSnapshot]] = {}
        self._names: list[str] = []
        #: Running jobs' allocations, kept while their placement record is the same.
        self._allocs: dict[str, Allocation] = {}
        self._last_snapshot: Any = None
        #: How long the last pass computed (its snapshot and placements), in seconds.
        self.pass_cost = 0.0
        #: Whether the last pass stopped at its bound with more to place.
        self._bounded = False

    # -------------------------------------------------------------- state

    def report(self, inv: NodeInventory) -> None:
        """A member's inventory and measured use (from its sampler or a peer)."""
        if not self._listed(inv.name):
            return  # removed from the cluster: its capacity is not the cluster's any more
        old = self.nodes.get(inv.name)
        self.nodes[inv.name] = inv
        made = self._node_snaps.get(inv.name)
        if made is not None and old is not None and _same_snapshot(old, inv):
            self._node_snaps[inv.name] = (inv, made[1])  # the same snapshot stands for this report
        if old is None:
            self._names = sorted(self.nodes)
            if len(self.queue) and self.running_now():
                # A member new to this scheduler (just after a takeover, most often):
                # the jobs waiting may fit it, so a pass now rather than on the next tick.
                self.kick()
        self.last_report[inv.name] = self.lease_clock()
        if self.node_state.get(inv.name) is NodeState.DOWN:
            del self.node_state[inv.name]
            log.info("member %s reports again; it takes work again", inv.name)
            self.kick()
        if old is None or _hardware(old) != _hardware(inv):
            self._feasible.clear()

    def _listed(self, name: str) -> bool:
        names = self.members() if self.members is not None else ()
        return not names or name in names or name == self.own_name

    def unknown(self) -> list[str]:
        """Members in the member list that have not reported to this scheduler yet.

        The inventory is complete when this is empty. A member silent since this
        scheduler started for ``lost_after`` counts as lost rather than unknown, so a
        dead member delays nothing for longer than it takes to be declared lost.
        """
        if self.state_current is not None and not self.state_current():
            return [MEMBER_LIST]
        if self.members is not None and not self.running_now():
            # A member's scheduler that is not running (not, or not yet, the leader:
            # a request forwarded to it as its role changes) has only what reached it
            # by chance, and no start time to count lost members from.
            return [MEMBER_LIST]
        names = self._prune()
        if not names:
            return []
        missing = sorted(n for n in names if n not in self.nodes)
        if missing and self.lost_after is not None and self.clock() - self.started_at > self.lost_after:
            return []
        return missing

    def _prune(self) -> Collection[str]:
        """Drop the members no longer in the member list; the list (empty: unknown)."""
        names = self.members() if self.members is not None else ()
        if names:
            gone = [n for n in self.nodes if n not in names and n != self.own_name]
            for n in gone:
                self._gone[n] = self.clock()
                del self.nodes[n]
                self._node_snaps.pop(n, None)
                self.last_report.pop(n, None)
                self.node_state.pop(n, None)
            if gone:
                self._names = sorted(self.nodes)
                self._feasible.clear()
        return names

    def rebuild(self) -> None:
        """Refill the queue from the job table (start, or a new leader)."""
        self.queue = PendingQueue(self.age_weight)
        self._seen_version = getattr(self.table, "pending_version", 0)
        for j in self.table.active_records():
            if j.state == PENDING:
                self._enqueue(j)

    def _catch_up(self) -> None:
        """Queue pending jobs that reached the table some other way (another member's
        submission, a workspace reservation, a requeue)."""
        version = getattr(self.table, "pending_version", 0)
        if version == self._seen_version:
            return
        self._seen_version = version
        queue, record = self.queue, self.table.record
        for jid in list(self.table.active_ids):
            if jid in queue:
                continue  # most pending jobs: looked at without decoding them
            j = record(jid)
            if j is not None and j.state == PENDING:
                self._enqueue(j)

    def _enqueue(self, j: JobRecord, gated: bool = True) -> None:
        from mtgpu.schedd.types import PendingJob

        if j.old_run:
            return  # its earlier run may still be running: queued once it is known to be over
        # A dependency is looked at by the next pass, with every waiting job's (Gates.review
        # reads the table once for all of them); held and --begin are looked at now.
        if gated and (j.spec.dependency or self.gates.check(j, self.table, self.clock())[0] != "ok"):
            self.gates.waiting[j.job_id] = None  # looked at again by each pass
            return
        spec = j.spec
        self.queue.add(
            PendingJob(
                job_id=j.job_id,
                tenant=j.user,
                request=spec.request,
                priority=spec.priority,
                submit_time=j.submit_time,
                time_limit=spec.time_limit,
                array_id=j.array_id,
                array_task=j.array_task,
                array_limit=spec.array_limit,
            )
        )

    def state_of(self, name: str) -> NodeState:
        """A member's state: down (lost), drained (by an admin) or up."""
        state = self.node_state.get(name, NodeState.UP)
        if state is NodeState.UP and self.drains is not None and self.drains.is_drained(name):
            return NodeState.DRAIN
        return state

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now: members from their latest reports, running jobs committed.

        Work is done only for what changed since the last call: a member's snapshot is
        made once per report (or state change), a job's allocation once per placement,
        and the placement layout is kept while members' hardware and states stay.
        """
        if len(self._names) != len(self.nodes):
            self._names = sorted(self.nodes)
        nodes = []
        for name in self._names:
            state = self.state_of(name)
            inv = self.nodes[name]
            made = self._node_snaps.get(name)
            if made is None or made[0] is not inv or made[1].state is not state:
                made = self._node_snaps[name] = (inv, node_snapshot(inv, state, made))
            nodes.append(made[1])
        allocs = []
        cache: dict[str, Allocation] = {}
        known = self.nodes
        for j in self.table.running_records():
            placement = j.placement
            if placement is not None:
                if any(m.node not in known for m in placement.members):
                    # A member that has not reported to this scheduler yet (just after a
                    # failover): its work is counted once it reports.
                    continue
                tl = j.spec.time_limit
                start = j.placed_time or j.submit_time
                end = start + tl if tl else None
                got = self._allocs.get(j.job_id)
                if (
                    got is None
                    or got.placement is not placement
                    or got.expected_end != end
                    or got.array_id != j.array_id
                ):
                    got = Allocation(placement, end, j.array_id)
                cache[j.job_id] = got
                allocs.append(got)
        self._allocs = cache
        self._last_snapshot = snapshot_with_allocations(nodes, allocs, previous=self._last_snapshot)
        return self._last_snapshot

    def never(self, request: ResourceRequest) -> Any:
        """Why no member that has reported could ever run ``request`` (None if one could)."""
        # Whether a request could ever run depends only on the members' hardware, so
        # the answer is kept per request shape until a member's hardware changes.
        self._prune()
        why = self._feasible.get(request, _UNKNOWN)
        if why is _UNKNOWN:
            why = feasible_ever(self.snapshot(), request)
            self._feasible[request] = why
            while len(self._feasible) > MAX_FEASIBLE_CACHE:
                self._feasible.popitem(last=False)
        else:
            self._feasible.move_to_end(request)
        return why

    def check_submit(self, request: ResourceRequest) -> None:
        """Refuse at once what no member could ever run.

        Only against a complete inventory: while a member of the list has not reported
        (just after the cluster formed, a member joined or this scheduler took over),
        a request that does not fit the others is accepted, since that member might
        take it, and checked again the moment the inventory is complete
        (:meth:`refuse_impossible`). :meth:`settle` waits for that moment first.
        """
        why = self.never(request)
        if why is None:
            return
        if self.unknown() and not self._pinned_reported(request):
            self._recheck = True
            return
        raise JobError(f"rejected: {why.message}")

    def _pinned_reported(self, request: ResourceRequest) -> bool:
        """Whether ``request`` names its members (``server=``, a workspace's own host)
        and each has reported: then whether it could ever run is known from them."""
        return bool(request.servers) and all(n in self.nodes for n in request.servers)

    async def settle(self, request: ResourceRequest, poll: float = 0.05) -> None:
        """Wait (``grace`` seconds at most) for a complete inventory if ``request`` does
        not fit the members that have reported, so that the answer of
        :meth:`check_submit` is the one a complete inventory gives."""
        deadline = time.monotonic() + self.grace
        while (
            self.never(request) is not None
            and self.unknown()
            and not self._pinned_reported(request)
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(poll)

    async def refuse_impossible(self) -> list[str]:
        """End the pending jobs no member could ever run, with the reason a submission
        of the same request gets (once the inventory is complete)."""
        if self.unknown():
            return []
        self._recheck = False
        refused = []
        now = self.clock()
        log.info(
            "every member has reported: the inventory is complete (%.1f s after this scheduler started)",
            now - self.started_at,
        )
        for j in [j for j in self.table.active_records() if j.state == PENDING]:
            why = self.never(j.spec.request)
            if why is None:
                continue
            r = await self.replicate(
                self.table.finish, j.job_id, FAILED, None, f"rejected: {why.message}", now
            )
            if "error" not in r:
                refused.append(j.job_id)
                log.warning("job %s refused once every member had reported: %s", j.job_id, why.message)
            self.queue.remove(j.job_id)
            self.pending_info.pop(j.job_id, None)
        return refused

    def accepted(self, job_ids: list[str]) -> None:
        """Jobs newly in the table: queue them and schedule soon."""
        for jid in job_ids:
            j = self.table.record(jid)
            if j is not None and j.state == PENDING and jid not in self.queue:
                self._enqueue(j)
        self._last_submit = time.monotonic()
        self.kick()

    def forget(self, job_ids: list[str]) -> None:
        for jid in job_ids:
            self.queue.remove(jid)
            self.pending_info.pop(jid, None)
            self.gates.waiting.pop(jid, None)
        self.kick()

    def kick(self) -> None:
        self._kick.set()

    # --------------------------------------------------------------- loop

    def running_now(self) -> bool:
        return self._task is not None and not self._task.done()

    def grant(self, name: str) -> float | None:
        """The lease for member ``name``, which has just reported (None: no lease is
        granted, as this scheduler is not running)."""
        if self.lease is None or not self.running_now():
            return None
        self.last_report[name] = self.lease_clock()
        return self.lease

    def lease_over(self, name: str, now: float | None = None) -> bool:
        """Whether every lease ``name`` may hold has surely run out, and with it its
        jobs' fencing grace (``lost_after`` after this scheduler's last grant to it,
        or after this scheduler took over, whichever is later)."""
        if self.lost_after is None:
            return False
        now = self.lease_clock() if now is None else now
        since = max(self.last_report.get(name, float("-inf")), self.lease_started + self.takeover_wait)
        return now - since > self.lost_after

    def silent_members(self) -> list[str]:
        """Members in the member list that have not reported to this scheduler."""
        names = self.members() if self.members is not None else ()
        return sorted(n for n in names if n not in self.nodes and n != self.own_name)

    def start(self) -> None:
        self.started_at = self.clock()
        self.lease_started = self.lease_clock()
        self._recheck = True
        self._restarted_unstarted = False
        self.rebuild()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self.kick()  # the first pass (and the restart of unstarted jobs) now, not a tick later

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for t in list(self._starting):
            await cancel_and_wait(t)

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), 1.0)
            except TimeoutError:
                pass
            self._kick.clear()
            if (now := time.monotonic()) - self._last_lost_check >= LOST_CHECK_INTERVAL:
                self._last_lost_check = now
                try:
                    await self.check_lost()
                except Exception:  # noqa: BLE001 - a failed commit is retried next time
                    log.exception("checking for lost members failed")
            if not self._restarted_unstarted and (self.state_current is None or self.state_current()):
                self._restarted_unstarted = True
                self.start_unstarted()
            await self._defer_to_submissions()
            self.pass_cost = 0.0
            self._bounded = False
            try:
                await self.run_pass(wait=False)
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("scheduling pass failed")
                await asyncio.sleep(1)
            # Every submission and every job end kicks the loop. Let a burst of kicks
            # gather into one pass, and leave requests more time than the pass
            # computed, so passes over a long queue or a large cluster cannot starve
            # the API. (Not the time its placements took to commit: the loop served
            # requests then, and waiting that long again only delayed the next jobs.)
            share = BURST_SHARE_WAIT if self._bounded else PASS_SHARE_WAIT
            await asyncio.sleep(max(MIN_PASS_INTERVAL, share * self.pass_cost))

    async def check_lost(self) -> list[str]:
        """Mark members silent past ``lost_after`` down and end or requeue their jobs.

        A new scheduler counts from its own start, so members get the whole grace
        period to report after a failover before anything is declared lost.
        """
        if self.lost_after is None:
            return []
        now = self.lease_clock()
        lost = []
        # Every member is watched: those in the member list that never reported to
        # this scheduler (it took over from one that is gone) as well.
        listed = self.members() if self.members is not None else ()
        for name in sorted(set(self.nodes) | set(listed)):
            if name == self.own_name or self.node_state.get(name) is NodeState.DOWN:
                continue
            if not self.lease_over(name, now):
                continue
            self.node_state[name] = NodeState.DOWN
            lost.append(name)
            log.warning(
                "member %s has not reported for over %g s: its lease has run out; marked down",
                name,
                self.lost_after,
            )
        removed = [n for n, at in self._gone.items() if self.clock() - at > self.lost_after]
        for name in removed:
            del self._gone[name]
        for name in lost + removed:
            why = (
                f"its member {name} was removed from the cluster"
                if name in removed
                else f"its member {name} was lost (no report for over {self.lost_after:g} s)"
            )
            for j in self.table.running_records():
                members = j.nodes
                if name not in members:
                    continue
                # For the attempt seen lost: if its member's own report of the end (or
                # a requeue) was applied first, this changes nothing.
                attempt = j.attempt
                # Its lease is over: whatever ran there has been fenced, so the job may
                # run again at once (the other parts of a multi-member job are stopped
                # by their members, and the requeue waits for those).
                others = [m for m in members if m != name and not self.lease_over(m, now)]
                wall = self.clock()
                if j.spec.requeue:
                    await self.replicate(
                        self.table.requeue, j.job_id, f"requeued: {why}", wall, attempt, others
                    )
                else:
                    await self.replicate(self.table.finish, j.job_id, NODE_FAIL, None, why, wall, attempt)
        await self._end_split_jobs(now)
        if lost or removed:
            self.kick()
        await self.release_old_runs(now)
        return lost + removed

    async def _end_split_jobs(self, now: float) -> None:
        """End the ``nodes=N`` jobs one of whose members has gone a whole lease without
        a grant: that member is fencing its part, so the job cannot go on, and its
        other members stop theirs now rather than once the member is declared lost."""
        if self.lease is None:
            return
        for j in self.table.running_records():
            members = j.nodes
            if len(members) < 2:
                continue
            out = [
                m
                for m in members
                if m != self.own_name
                and now - max(self.last_report.get(m, float("-inf")), self.lease_started + self.takeover_wait)
                > self.lease
            ]
            if not out:
                continue
            why = f"its member {out[0]} was lost (its lease ran out: no report for over {self.lease:g} s)"
            log.warning("job %s: %s", j.job_id, why)
            if j.spec.requeue:
                # Placed again once every part is known to have ended (the silent
                # member's once its lease and fencing grace are surely over).
                await self.replicate(
                    self.table.requeue, j.job_id, f"requeued: {why}", self.clock(), j.attempt, members
                )
            else:
                await self.replicate(
                    self.table.finish, j.job_id, NODE_FAIL, None, why, self.clock(), j.attempt
                )

    async def release_old_runs(self, now: float | None = None) -> list[str]:
        """Let requeued jobs whose old run's members have all surely stopped it (their
        leases ran out) be placed again; a member that reports the end sooner releases
        it itself (:meth:`JobTable.part_ended`). Once a second at most."""
        now = self.lease_clock() if now is None else now
        if now - self._last_old_runs < 1.0:
            return []
        self._last_old_runs = now
        out = []
        for j in self.table.old_run_records():
            old = j.old_run
            if j.state != PENDING or old is None:
                continue
            if all(self.lease_over(m, now) for m in old["members"]):
                await self.replicate(
                    self.table.old_run_over,
                    j.job_id,
                    old["attempt"],
                    "the lease of " + ", ".join(old["members"]) + " ran out",
                )
                out.append(j.job_id)
        return out

    async def _defer_to_submissions(self) -> None:
        """While submissions stream in, answer them first (as Slurm's ``defer``): the
        pass waits until they pause for ``SUBMIT_QUIET``, or ``MAX_DEFER`` at most.
        Starting jobs costs far more CPU than accepting them, and a host busy starting
        the first of a thousand jobs would answer the next submissions late."""
        deadline = time.monotonic() + MAX_DEFER
        while (wait := SUBMIT_QUIET - (time.monotonic() - self._last_submit)) > 0:
            if time.monotonic() + wait > deadline:
                return
            await asyncio.sleep(wait)

    def trial(self, record: dict[str, Any], now: float) -> str:
        """--test-only: when and where a job like ``record`` would start, were it
        submitted now behind the queue as it is; nothing is queued or journalled."""
        import datetime as dt

        from mtgpu.schedd.types import PendingJob

        asked = draft(record, now)
        state, reason, why = self.gates.check(asked, self.table, now)
        if state != "ok":
            return f"the job would wait ({reason}: {why})"
        spec = asked.spec
        probe = PendingJob(
            job_id="test-only",
            tenant=asked.user,
            request=spec.request,
            priority=spec.priority,
            submit_time=now,
            time_limit=spec.time_limit,
        )
        self.queue.add(probe)  # schedule_pass is pure, and nothing runs in between
        try:
            result = schedule_pass(self.snapshot(), self.queue, now, self.policy)
        finally:
            self.queue.remove(probe.job_id)
        for p in result.placements:
            if p.job_id == probe.job_id:
                return f"the job would start now on {','.join(p.nodes)} ({spec.request.describe()})"
        info = result.pending.get(probe.job_id)
        if info is None:
            return "the job would wait behind the queue (it is longer than one pass looks at)"
        when = (
            dt.datetime.fromtimestamp(info.expected_start).isoformat(timespec="seconds")
            if info.expected_start
            else "an unknown time (the jobs ahead have no time limit)"
        )
        return f"the job would start at {when} ({info.reason}: {info.message})"

    async def _review_gates(self) -> dict[str, PendingInfo]:
        """Queue the jobs whose gates opened; end those whose dependency can never be
        met (DependencyNeverSatisfied, as Slurm's kill_invalid_depend); say why the
        rest wait."""
        if not self.gates.waiting:
            return {}
        now = self.clock()
        opened, never, still = self.gates.review(self.table, lambda jid: jid in self.queue, now)
        for j in opened:
            self._enqueue(j, gated=False)
        if never:
            await self.replicate(self.table.end_never_satisfied, never, now)
        infos = {}
        for jid, (reason, why) in still.items():
            rec = self.table.record(jid)
            if rec is not None:
                infos[jid] = PendingInfo(jid, 0, reason, why, float(rec.spec.priority))
        return infos

    async def run_pass(self, *, wait: bool = True) -> int:
        """Place what fits now; journal and dispatch each placement. Returns the count.

        Every placement is committed before this returns, so the next pass sees what
        this one took. The starts are awaited too unless ``wait`` is False: then they
        go on in the background while the next pass places more.
        """
        self._catch_up()
        gated = await self._review_gates()
        if self._recheck and len(self.queue):
            await self.refuse_impossible()
        if not self.nodes or not len(self.queue):
            self.pending_info = gated
            return 0
        now = self.clock()
        began = time.monotonic()
        result = schedule_pass(self.snapshot(), self.queue, now, self.policy)
        self.pass_cost = time.monotonic() - began
        self.pending_info = {**result.pending, **gated}
        missing = self.unknown()
        if missing:
            # Whether it could ever run is not known until every member has reported.
            note = (
                "waiting for the member list to be brought up to date"
                if missing == [MEMBER_LIST]
                else f"waiting for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                "to report its resources"
            )
            for jid, info in self.pending_info.items():
                if info.reason == "BadConstraints":
                    self.pending_info[jid] = dataclasses.replace(info, reason="Inventory", message=note)
        term = self.term()
        for p in result.placements:
            self.queue.remove(p.job_id)
        # The placements commit in log entries of PLACE_BATCH, side by side (one after
        # the other would wait on each; one entry per placement costs a burst dearly).
        chunks = [
            result.placements[k : k + PLACE_BATCH] for k in range(0, len(result.placements), PLACE_BATCH)
        ]
        got = await asyncio.gather(
            *(
                self.replicate(self.table.place_many, [(p.job_id, p.to_dict()) for p in chunk], term, now)
                for chunk in chunks
            ),
            return_exceptions=True,
        )
        answers: list[Any] = []
        for chunk, r in zip(chunks, got, strict=True):
            answers += [r] * len(chunk) if isinstance(r, BaseException) else r
        jobs, failed = [], None
        for p, r in zip(result.placements, answers, strict=True):
            job = self.table.record(p.job_id)
            if isinstance(r, BaseException):
                failed = failed or r
                if job is not None and job.state == PENDING:
                    self._enqueue(job)  # not placed after all: it waits for the next pass
            elif "error" not in r and job is not None:
                jobs.append(job)
        if len(result.placements) >= self.policy.max_placements:
            self._bounded = True
            self.kick()  # the pass stopped at its bound: the next one places the rest
        tasks = [asyncio.ensure_future(self._start(job, term)) for job in jobs]
        self._starting.update(tasks)
        for t in tasks:
            t.add_done_callback(self._starting.discard)
        if wait and tasks:
            await asyncio.gather(*tasks)
        if failed is not None:
            raise failed
        return len(tasks)

    def start_unstarted(self) -> list[str]:
        """Start again the jobs an earlier scheduler placed whose start is not recorded.

        A scheduler that loses its role (a hand-off, an election) stops its starts in
        flight: a job it placed may never have been asked for on its member, and
        would stay RUNNING there with nothing running. So a new scheduler asks each
        such job's members again, with the term it was placed with; a member that
        had started it already does not start it twice (and says so), and one whose
        job was requeued since answers that the start is stale. Jobs on a member
        marked down are left to the lost-member handling.
        """
        term = self.term()
        asked = []
        for j in self.table.running_records():
            placed_term = j.term
            if j.start_time is not None or not placed_term or placed_term == term:
                continue
            members = j.nodes
            if not members or any(self.node_state.get(m) is NodeState.DOWN for m in members):
                continue
            asked.append(j.job_id)
            task = asyncio.ensure_future(self._start(j, placed_term))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
        if asked:
            log.info(
                "starting again %d job(s) an earlier scheduler placed but whose start is not recorded: %s",
                len(asked),
                ", ".join(asked[:10]) + (" ..." if len(asked) > 10 else ""),
            )
        return asked

    async def _start(self, job: JobRecord, term: int) -> None:
        """Start one placed job; a failed start fails that job only."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(DISPATCH_TOTAL)
        node = job.nodes[0] if job.members else ""
        gate = self._member_gates.get(node)
        if gate is None:
            gate = self._member_gates[node] = asyncio.Semaphore(DISPATCH_CONCURRENCY)
        try:
            async with self._gate, gate:
                await self.dispatch(job, term)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, FenceError) or isinstance(exc.__cause__, FenceError):
                # Its tenant's fence cannot be set up here: logged once already, with
                # its cause; each job refused is one line, with no traceback.
                log.warning("job %s not started: %s", job.job_id, exc)
            else:
                log.exception("dispatch of %s failed", job.job_id)
            await self.replicate(
                self.table.finish,
                job.job_id,
                FAILED,
                None,
                f"could not start: {exc}",
                self.clock(),
                job.attempt,
            )
