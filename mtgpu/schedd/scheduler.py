"""The scheduler service: the queue, the scheduling loop and submit-time checks.

It runs on the leader (on a standalone host, always). Its queue is rebuilt from the
job table whenever it starts, so losing the scheduler loses no job. Measured usage
comes from node reports kept in memory (never in the log); committed capacity comes
from the running jobs in the table. Each placement is journaled before it is
dispatched, with the leader's term, so a deposed leader cannot start a job twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mtgpu.aio import cancel_and_wait
from mtgpu.errors import JobError
from mtgpu.gpuinfo.types import NodeInventory
from mtgpu.schedd.drains import Drains
from mtgpu.schedd.jobtable import PENDING, JobTable, spec_from_dict
from mtgpu.schedd.placement import feasible_ever, snapshot_with_allocations
from mtgpu.schedd.queue import PendingInfo, PendingQueue, QueuePolicy, schedule_pass
from mtgpu.schedd.types import (Allocation, GpuMode, GpuSnapshot, MemberPlacement, NodeSnapshot,
                                NodeState, Placement, ResourceRequest)

log = logging.getLogger("mtgpu.schedd")

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
Dispatch = Callable[[dict[str, Any], int], Awaitable[None]]


def node_snapshot(inv: NodeInventory, state: NodeState = NodeState.UP,
                  previous: tuple[NodeInventory, NodeSnapshot] | None = None) -> NodeSnapshot:
    """The scheduler's view of one member from its latest report.

    With ``previous`` (an earlier report and the snapshot made from it), the GPUs'
    snapshots are kept when the GPU records are the very same objects (a
    :class:`~mtgpu.gpuinfo.types.ReportReader` keeps unchanged ones).
    """
    if previous is not None and len(previous[0].gpus) == len(inv.gpus) and all(
            a is b for a, b in zip(previous[0].gpus, inv.gpus, strict=True)):
        gpus = previous[1].gpus
    else:
        gpus = tuple(GpuSnapshot(index=g.index, brand=g.brand, type=g.type, vram_total=g.vram_total,
                                 vram_used=g.vram_used) for g in inv.gpus)
    return NodeSnapshot(name=inv.name, cpus=inv.host.cpus, ram_total=inv.host.ram_total,
                        gpus=gpus, ram_used=inv.host.ram_used, state=state)


def _same_snapshot(a: NodeInventory, b: NodeInventory) -> bool:
    """Whether two reports make the same :func:`node_snapshot` (unchanged GPU records
    are the same objects when read by a :class:`~mtgpu.gpuinfo.types.ReportReader`)."""
    ha, hb = a.host, b.host
    return (ha.cpus == hb.cpus and ha.ram_total == hb.ram_total and ha.ram_used == hb.ram_used
            and len(a.gpus) == len(b.gpus)
            and all(x is y or x == y for x, y in zip(a.gpus, b.gpus, strict=True)))


_UNKNOWN = object()


def _hardware(inv: NodeInventory) -> tuple[Any, ...]:
    return (inv.host.cpus, inv.host.ram_total,
            tuple((g.index, g.brand, g.type, g.vram_total) for g in inv.gpus))


def placement_from_dict(d: Mapping[str, Any]) -> Placement:
    return Placement(job_id=d["job_id"], gpu_mode=GpuMode(d["gpu_mode"]), members=tuple(
        MemberPlacement(node=m["node"], rank=m["rank"], gpu_indices=tuple(m["gpu_indices"]),
                        cpus=m["cpus"], ram=m["ram"], vram_per_gpu=m["vram_per_gpu"])
        for m in d["members"]))


class Scheduler:
    """Places pending jobs on members; one instance, on the leader."""

    def __init__(self, table: JobTable, replicate: Replicate, dispatch: Dispatch, *,
                 term: Callable[[], int], clock: Callable[[], float] = time.time,
                 policy: QueuePolicy | None = None, aging_per_hour: float = 10.0) -> None:
        self.table = table
        self.replicate = replicate
        self.dispatch = dispatch
        self.term = term
        self.clock = clock
        self.policy = policy or QueuePolicy()
        self.nodes: dict[str, NodeInventory] = {}
        self.node_state: dict[str, NodeState] = {}
        #: The admins' drains (replicated; see mtgpu.schedd.drains), set by the daemon.
        self.drains: Drains | None = None
        self.age_weight = aging_per_hour / 3600
        self.queue = PendingQueue(self.age_weight)
        self.pending_info: dict[str, PendingInfo] = {}
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Starts in flight (placed and journaled; the member is starting them).
        self._starting: set[asyncio.Task[None]] = set()
        self._gate: asyncio.Semaphore | None = None
        #: One gate per member (its first member, for a multi-node job).
        self._member_gates: dict[str, asyncio.Semaphore] = {}
        self._last_submit = 0.0
        self._feasible: dict[ResourceRequest, Any] = {}
        self._seen_version = 0
        #: Seconds after start during which submissions are not refused (members report).
        self.grace = 0.0
        self.started_at = 0.0
        #: When each member last reported (this scheduler's clock; not replicated).
        self.last_report: dict[str, float] = {}
        #: A member silent for this long is lost: its jobs end NODE_FAIL or are
        #: requeued. None: never (a standalone host is its own only member).
        self.lost_after: float | None = None
        #: Each member's snapshot, made when a pass first needs it, with the report it
        #: stands for: a report that is not the member's latest makes it stale (and
        #: its GPUs' part is reused where the GPU records are the same).
        self._node_snaps: dict[str, tuple[NodeInventory, NodeSnapshot]] = {}
        self._names: list[str] = []
        #: Running jobs' allocations, kept while their placement record is the same.
        self._allocs: dict[str, tuple[Any, float | None, str | None, Allocation]] = {}
        self._last_snapshot: Any = None
        #: How long the last pass computed (its snapshot and placements), in seconds.
        self.pass_cost = 0.0
        #: Whether the last pass stopped at its bound with more to place.
        self._bounded = False

    # -------------------------------------------------------------- state

    def report(self, inv: NodeInventory) -> None:
        """A member's inventory and measured use (from its sampler or a peer)."""
        old = self.nodes.get(inv.name)
        self.nodes[inv.name] = inv
        made = self._node_snaps.get(inv.name)
        if made is not None and old is not None and _same_snapshot(old, inv):
            self._node_snaps[inv.name] = (inv, made[1])  # the same snapshot stands for this report
        if old is None:
            self._names = sorted(self.nodes)
        self.last_report[inv.name] = self.clock()
        if self.node_state.get(inv.name) is NodeState.DOWN:
            del self.node_state[inv.name]
            log.info("member %s reports again; it takes work again", inv.name)
            self.kick()
        if old is None or _hardware(old) != _hardware(inv):
            self._feasible.clear()

    def rebuild(self) -> None:
        """Refill the queue from the job table (start, or a new leader)."""
        self.queue = PendingQueue(self.age_weight)
        self._seen_version = getattr(self.table, "pending_version", 0)
        for j in self.table.all():
            if j["state"] == PENDING:
                self._enqueue(j)

    def _catch_up(self) -> None:
        """Queue pending jobs that reached the table some other way (another member's
        submission, a workspace reservation, a requeue)."""
        version = getattr(self.table, "pending_version", 0)
        if version == self._seen_version:
            return
        self._seen_version = version
        for j in self.table.active():
            if j["state"] == PENDING and j["job_id"] not in self.queue:
                self._enqueue(j)

    def _enqueue(self, j: dict[str, Any]) -> None:
        from mtgpu.schedd.types import PendingJob

        spec = spec_from_dict(j["spec"])
        self.queue.add(PendingJob(job_id=j["job_id"], tenant=j["user"], request=spec.request,
                                  priority=spec.priority, submit_time=j["submit_time"],
                                  time_limit=spec.time_limit, array_id=j["array_id"],
                                  array_task=j["array_task"], array_limit=spec.array_limit))

    def state_of(self, name: str) -> NodeState:
        """A member's state: down (lost), drained (by an admin) or up."""
        state = self.node_state.get(name, NodeState.UP)
        if state is NodeState.UP and self.drains is not None and self.drains.is_drained(name):
            return NodeState.DRAIN
        return state

    def snapshot(self):  # type: ignore[no-untyped-def]
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
        cache: dict[str, tuple[Any, float | None, str | None, Allocation]] = {}
        known = self.nodes
        for j in self.table.running():
            placement = j["placement"]
            if placement:
                if any(m["node"] not in known for m in placement["members"]):
                    # A member that has not reported to this scheduler yet (just after a
                    # failover): its work is counted once it reports.
                    continue
                tl = j["spec"].get("time_limit")
                start = j.get("placed_time") or j["submit_time"]
                end = start + tl if tl else None
                got = self._allocs.get(j["job_id"])
                if got is None or got[0] is not placement or got[1] != end or got[2] != j["array_id"]:
                    got = (placement, end, j["array_id"],
                           Allocation(placement_from_dict(placement), end, j["array_id"]))
                cache[j["job_id"]] = got
                allocs.append(got[3])
        self._allocs = cache
        self._last_snapshot = snapshot_with_allocations(nodes, allocs, previous=self._last_snapshot)
        return self._last_snapshot

    def check_submit(self, request: ResourceRequest) -> None:
        """Refuse at once what no member could ever run.

        Right after this scheduler took over, members may not have reported yet; during
        that grace period a request is queued rather than refused on partial knowledge.
        """
        if self.clock() - self.started_at < self.grace:
            return
        # Whether a request could ever run depends only on the members' hardware, so
        # the answer is kept per request shape until a member's hardware changes.
        why = self._feasible.get(request, _UNKNOWN)
        if why is _UNKNOWN:
            why = feasible_ever(self.snapshot(), request)
            self._feasible[request] = why
        if why is not None:
            raise JobError(f"rejected: {why.message}", )

    def accepted(self, job_ids: list[str]) -> None:
        """Jobs newly in the table: queue them and schedule soon."""
        for jid in job_ids:
            j = self.table.get(jid)
            if j is not None and j["state"] == PENDING and jid not in self.queue:
                self._enqueue(j)
        self._last_submit = time.monotonic()
        self.kick()

    def forget(self, job_ids: list[str]) -> None:
        for jid in job_ids:
            self.queue.remove(jid)
            self.pending_info.pop(jid, None)
        self.kick()

    def kick(self) -> None:
        self._kick.set()

    # --------------------------------------------------------------- loop

    def start(self) -> None:
        self.started_at = self.clock()
        self.rebuild()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for t in list(self._starting):
            await cancel_and_wait(t)

    async def _loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            self._kick.clear()
            try:
                await self.check_lost()
            except Exception:  # noqa: BLE001 - a failed commit is retried next time
                log.exception("checking for lost members failed")
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
        now = self.clock()
        lost = []
        for name in list(self.nodes):
            silent = now - max(self.last_report.get(name, 0.0), self.started_at)
            if silent <= self.lost_after or self.node_state.get(name) is NodeState.DOWN:
                continue
            self.node_state[name] = NodeState.DOWN
            lost.append(name)
            log.warning("member %s has not reported for %.0f s: marked down", name, silent)
        for name in lost:
            why = f"its member {name} was lost (no report for over {self.lost_after:g} s)"
            for j in self.table.running():
                members = [m["node"] for m in (j.get("placement") or {}).get("members", [])]
                if name not in members:
                    continue
                if j["spec"].get("requeue"):
                    await self.replicate(self.table.requeue, j["job_id"], f"requeued: {why}", now)
                else:
                    await self.replicate(self.table.finish, j["job_id"], "NODE_FAIL", None, why, now)
        if lost:
            self.kick()
        return lost

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

    async def run_pass(self, *, wait: bool = True) -> int:
        """Place what fits now; journal and dispatch each placement. Returns the count.

        Every placement is committed before this returns, so the next pass sees what
        this one took. The starts are awaited too unless ``wait`` is False: then they
        go on in the background while the next pass places more.
        """
        self._catch_up()
        if not self.nodes or not len(self.queue):
            self.pending_info = {}
            return 0
        now = self.clock()
        began = time.monotonic()
        result = schedule_pass(self.snapshot(), self.queue, now, self.policy)
        self.pass_cost = time.monotonic() - began
        self.pending_info = dict(result.pending)
        term = self.term()
        for p in result.placements:
            self.queue.remove(p.job_id)
        # The placements commit in log entries of PLACE_BATCH, side by side (one after
        # the other would wait on each; one entry per placement costs a burst dearly).
        chunks = [result.placements[k:k + PLACE_BATCH]
                  for k in range(0, len(result.placements), PLACE_BATCH)]
        got = await asyncio.gather(*(self.replicate(self.table.place_many,
                                                    [(p.job_id, p.to_dict()) for p in chunk], term, now)
                                     for chunk in chunks), return_exceptions=True)
        answers: list[Any] = []
        for chunk, r in zip(chunks, got, strict=True):
            answers += [r] * len(chunk) if isinstance(r, BaseException) else r
        jobs, failed = [], None
        for p, r in zip(result.placements, answers, strict=True):
            job = self.table.get(p.job_id)
            if isinstance(r, BaseException):
                failed = failed or r
                if job is not None and job["state"] == PENDING:
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

    async def _start(self, job: dict[str, Any], term: int) -> None:
        """Start one placed job; a failed start fails that job only."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(DISPATCH_TOTAL)
        members = (job.get("placement") or {}).get("members") or [{"node": ""}]
        node = members[0]["node"]
        gate = self._member_gates.get(node)
        if gate is None:
            gate = self._member_gates[node] = asyncio.Semaphore(DISPATCH_CONCURRENCY)
        try:
            async with self._gate, gate:
                await self.dispatch(job, term)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.exception("dispatch of %s failed", job["job_id"])
            await self.replicate(self.table.finish, job["job_id"], "FAILED", None,
                                 f"could not start: {exc}", self.clock())

