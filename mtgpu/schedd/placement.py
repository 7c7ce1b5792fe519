"""Placement: where can a job go now, and if nowhere, why.

``place(snapshot, job, now) -> Placement | Reason`` is a pure function. The stages,
in the shape of Nomad's generic stack::

    candidates   from an index, best fit first (see below), or the pinned servers
      filters    filters.FILTERS, one object per rule: pin, --exclude, --constraint,
                 reservation, GPU model, drain state, whole members (--exclusive),
                 CPUs, RAM, GPU count, VRAM for the mode; each refusal counted under
                 the filter's name (a reservation for another job is ``reserved``). The
                 same filters against total capacity answer "could it ever run"
                 (BadConstraints), and their texts make the pending reason
      limit      stop after nodes + L - 1 feasible members (L = log2 of the cluster
                 size, at least 2, as Nomad ranks log2 n candidates)
      rankers    rankers.score_node: best fit, then a tie-break seeded by the job id
      select     the best ``nodes`` members, all or nothing

A :class:`Plan` is the writable side, as in Nomad: it starts from an immutable
snapshot, answers ``place`` for many jobs, and ``commit`` applies a placement so the
next answer sees it. The queue runs one plan per pass.

Indexes keep a decision cheap on a large cluster. Each is built the first time a
request needs it and kept up to date by ``commit``/``release``:

- exclusive jobs: members bucketed by how many matching GPUs are idle; walking from
  ``gpus`` upwards visits the tightest fit first;
- shared and overcommit jobs: members sorted by the most VRAM one of their matching
  GPUs (not held whole) can give in the mode; walking from ``vram`` upwards visits
  the tightest fit first;
- CPU-only jobs: members bucketed by free CPUs, members without GPUs first.

Only members that are up are in the indexes. The indexes only narrow the candidates:
whether a member fits is the filters' answer. They offer a superset of the members
that fit, so a refusal is exact: when ``place`` says no, no member fits.
``exhaustive=True`` skips the indexes and the limit and checks every member: that is
what ``explain`` uses to give exact per-filter counts, and what the tests compare the
indexed path against.
"""

from __future__ import annotations

import math
import weakref
import zlib
from bisect import bisect_left, insort
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import islice

from mtgpu.schedd.filters import (
    BY_NAME,
    EVER_ORDER,
    SERVER_PIN,
    Check,
    Layout,
    Usage,
    active,
    apply_member,
    choose_gpus,
    idle_gpus,
    member_fits,
    run,
)
from mtgpu.schedd.rankers import score_node
from mtgpu.schedd.types import (
    Allocation,
    ClusterSnapshot,
    GpuMode,
    GpuSnapshot,
    MemberPlacement,
    NodeSnapshot,
    PendingJob,
    Placement,
    Reason,
    ResourceRequest,
)

_EXCLUSIVE = GpuMode.EXCLUSIVE


class _IdleIndex:
    """Exclusive requests: up members bucketed by their count of idle matching GPUs."""

    __slots__ = ("buckets", "class_ok", "count", "up")

    def __init__(self, layout: Layout, use: Usage, brand: str | None, type_: str | None) -> None:
        self.up = layout.up
        self.class_ok = layout.class_matches(brand, type_)
        self.count = [0] * len(layout)
        self.buckets: list[set[int]] = [set() for _ in range(layout.max_gpus + 1)]
        for i, ids in enumerate(layout.matching(brand, type_)):
            if layout.up[i] and ids:
                c = len(idle_gpus(use, ids))
                self.count[i] = c
                if c:
                    self.buckets[c].add(i)

    def shift(self, i: int, delta: int) -> None:
        """Member ``i`` gained (``delta`` > 0) or lost idle matching GPUs."""
        if not self.up[i]:
            return
        old = self.count[i]
        new = self.count[i] = old + delta
        if old:
            self.buckets[old].discard(i)
        if new:
            self.buckets[new].add(i)

    def walk(self, k: int) -> Iterator[int]:
        for c in range(k, len(self.buckets)):
            yield from self.buckets[c]

    def copy(self) -> _IdleIndex:
        new = _IdleIndex.__new__(_IdleIndex)
        new.up, new.class_ok = self.up, self.class_ok
        new.count = self.count.copy()
        new.buckets = [b.copy() for b in self.buckets]
        return new


class _VramIndex:
    """Shared/overcommit requests: up members sorted by the most VRAM one matching GPU,
    not held whole, can give in this mode. Walking from ``vram`` upwards visits the
    members whose best GPU is the tightest fit first."""

    __slots__ = ("class_ok", "entries", "key", "layout", "match", "mode")

    def __init__(
        self, layout: Layout, use: Usage, brand: str | None, type_: str | None, mode: GpuMode
    ) -> None:
        self.layout, self.mode = layout, mode
        self.class_ok = layout.class_matches(brand, type_)
        self.match = layout.matching(brand, type_)
        self.entries: list[tuple[int, int]] = []
        self.key: dict[int, int] = {}
        for i, ids in enumerate(self.match):
            if layout.up[i] and ids:
                best = self._best(use, i)
                if best is not None:
                    self.entries.append((best, i))
                    self.key[i] = best
        self.entries.sort()

    def _best(self, use: Usage, i: int) -> int | None:
        holder, layout, mode = use.gpu_holder, self.layout, self.mode
        frees = [use.gpu_free(layout, g, mode) for g in self.match[i] if holder[g] is None]
        return max(frees) if frees else None

    def update(self, use: Usage, i: int) -> None:
        """Member ``i`` changed: move or drop its entry."""
        if not self.layout.up[i]:
            return
        old = self.key.pop(i, None)
        if old is not None:
            del self.entries[bisect_left(self.entries, (old, i))]
        best = self._best(use, i)
        if best is not None:
            insort(self.entries, (best, i))
            self.key[i] = best

    def walk(self, vram: int) -> Iterator[int]:
        entries = self.entries
        for pos in range(bisect_left(entries, (vram, -1)), len(entries)):
            yield entries[pos][1]

    def copy(self) -> _VramIndex:
        new = _VramIndex.__new__(_VramIndex)
        new.layout, new.class_ok, new.match, new.mode = self.layout, self.class_ok, self.match, self.mode
        new.entries = self.entries.copy()
        new.key = self.key.copy()
        return new


class _CpuIndex:
    """CPU-only requests: up members bucketed by free CPUs; [0] without GPUs, [1] with."""

    __slots__ = ("count", "groups", "layout")

    def __init__(self, layout: Layout, use: Usage) -> None:
        self.layout = layout
        self.count = [-1] * len(layout)
        self.groups: tuple[dict[int, set[int]], dict[int, set[int]]] = ({}, {})
        for i in range(len(layout)):
            if layout.up[i]:
                self.update(use, i)

    def update(self, use: Usage, i: int) -> None:
        if not self.layout.up[i]:
            return
        group = self.groups[1 if self.layout.node_gpus[i] else 0]
        old, new = self.count[i], use.cpus_free[i]
        if old == new:
            return
        if old >= 0:
            group[old].discard(i)
        group.setdefault(new, set()).add(i)
        self.count[i] = new

    def walk(self, cpus: int) -> Iterator[int]:
        for group in self.groups:
            for free in range(max(cpus, 0), self.layout.max_cpus + 1):
                b = group.get(free)
                if b:
                    yield from b

    def copy(self) -> _CpuIndex:
        new = _CpuIndex.__new__(_CpuIndex)
        new.layout = self.layout
        new.count = self.count.copy()
        new.groups = (
            {k: v.copy() for k, v in self.groups[0].items()},
            {k: v.copy() for k, v in self.groups[1].items()},
        )
        return new


class Plan:
    """A writable view of the cluster for one scheduling pass (Nomad's plan)::

        plan = Plan(snapshot)
        for job in jobs:
            got = plan.place(job, now)
            if isinstance(got, Placement):
                plan.commit(got)        # the next decision sees it

    ``place`` never changes the plan; ``commit`` and ``release`` do. ``copy`` is cheap
    (list copies), for what-if plans such as a reservation.
    """

    #: The allocations running in the snapshot the plan started from.
    running: tuple[Allocation, ...]
    layout: Layout
    use: Usage
    candidate_limit: int
    _idle: dict[tuple[str | None, str | None], _IdleIndex]
    _vram: dict[tuple[str | None, str | None, GpuMode], _VramIndex]
    _cpu: _CpuIndex | None
    # It depends only on the layout, so every copy shares it.
    _ever: dict[tuple[ResourceRequest, bool], Reason | None]

    def __init__(self, snapshot: ClusterSnapshot, *, candidate_limit: int | None = None) -> None:
        base = _base_plan(snapshot)
        self.running = snapshot.running
        self.layout = base.layout
        self.use = base.use.copy()
        self.candidate_limit = candidate_limit or base.candidate_limit
        self._idle = {k: v.copy() for k, v in base._idle.items()}
        self._vram = {k: v.copy() for k, v in base._vram.items()}
        self._cpu = base._cpu.copy() if base._cpu else None
        self._ever = base._ever

    @classmethod
    def _build(cls, snapshot: ClusterSnapshot) -> Plan:
        plan = cls.__new__(cls)
        plan.running = snapshot.running
        plan.layout = Layout(snapshot)
        plan.use = Usage(snapshot)
        plan.candidate_limit = max(2, math.ceil(math.log2(max(2, len(plan.layout)))))
        plan._idle, plan._vram, plan._cpu = {}, {}, None
        plan._ever = {}
        return plan

    def copy(self) -> Plan:
        """An independent plan with the same state."""
        new = Plan.__new__(Plan)
        new.running, new.layout, new.use = self.running, self.layout, self.use.copy()
        new.candidate_limit = self.candidate_limit
        new._idle = {k: v.copy() for k, v in self._idle.items()}
        new._vram = {k: v.copy() for k, v in self._vram.items()}
        new._cpu = self._cpu.copy() if self._cpu else None
        new._ever = self._ever
        return new

    # ------------------------------------------------------------------ writing

    def commit(self, placement: Placement) -> None:
        """Take the resources of ``placement`` (not checked: call ``place`` or ``fits`` first)."""
        self._apply(placement, 1)

    def release(self, placement: Placement) -> None:
        """Give back the resources of ``placement``, as when the job ends."""
        self._apply(placement, -1)

    def _apply(self, placement: Placement, sign: int, estimate: bool = True) -> None:
        layout, use = self.layout, self.use
        gpu_class = layout.gpu_class
        for member in placement.members:
            i = layout.index_of[member.node]
            gids = [layout.gpu_by_index[i][x] for x in member.gpu_indices if x in layout.gpu_by_index[i]]
            was_idle = set(idle_gpus(use, gids))
            apply_member(
                layout,
                use,
                member,
                placement.gpu_mode,
                placement.job_id,
                sign,
                estimate=estimate,
                whole=placement.whole_member,
            )
            # Only the GPUs this member touched can move in an index.
            touched = set()
            now_idle = set(idle_gpus(use, gids))
            for g in gids:
                cls = gpu_class[g]
                touched.add(cls)
                idle = g in now_idle
                if idle != (g in was_idle):
                    for index in self._idle.values():
                        if index.class_ok[cls]:
                            index.shift(i, 1 if idle else -1)
            for vindex in self._vram.values():
                if any(vindex.class_ok[cls] for cls in touched):
                    vindex.update(use, i)
            if self._cpu is not None:
                self._cpu.update(use, i)

    def to_snapshot(self, new: Sequence[Allocation] = ()) -> ClusterSnapshot:
        """A snapshot of the plan as it stands, with ``new`` added to the running work.

        Measured use in it is the plan's estimate (measured plus what was placed).
        """
        nodes = [self._node_snapshot(i) for i in range(len(self.layout))]
        return ClusterSnapshot(nodes=tuple(nodes), running=self.running + tuple(new))

    def _node_snapshot(self, i: int) -> NodeSnapshot:
        layout, use = self.layout, self.use
        gpus = tuple(
            GpuSnapshot(
                index=layout.gpu_index[g],
                brand=layout.gpu_brand[g],
                type=layout.gpu_type[g],
                vram_total=layout.gpu_total[g],
                vram_used=use.gpu_used[g],
                vram_committed=use.gpu_committed[g],
                exclusive_job=use.gpu_holder[g],
                shared_jobs=use.gpu_shared[g],
            )
            for g in layout.node_gpus[i]
        )
        return NodeSnapshot(
            name=layout.names[i],
            cpus=layout.cpus[i],
            ram_total=layout.ram_total[i],
            gpus=gpus,
            ram_used=use.ram_used[i],
            cpus_committed=layout.cpus[i] - use.cpus_free[i],
            ram_committed=use.ram_committed[i],
            state=layout.states[i],
            whole_job=use.whole[i],
        )

    def fits(self, placement: Placement) -> bool:
        """True if this exact placement (members and GPU indices) fits the plan now."""
        return all(
            member_fits(self.layout, self.use, m, placement.gpu_mode, placement.whole_member)
            for m in placement.members
        )

    # ------------------------------------------------------------------ placing

    def place(
        self, job: PendingJob, now: float = 0.0, *, exclude: Collection[str] = (), exhaustive: bool = False
    ) -> Placement | Reason:
        """Place one job: its members on ``request.nodes`` distinct members, or a Reason.

        ``exclude`` names members kept for another job (counted as ``reserved``; the
        request's own --exclude and --constraint are filters of their own). ``now`` is
        part of the contract so time-aware filters can be added; nothing here reads a clock.
        """
        del now
        req = job.request
        layout = self.layout
        match = layout.matching(req.gpu_brand, req.gpu_type) if req.gpus else layout.node_gpus
        need = req.nodes
        limit = math.inf if exhaustive else need + self.candidate_limit - 1
        excluded = {layout.index_of[n] for n in exclude if n in layout.index_of}
        counts: dict[str, int] = {}
        seed = zlib.crc32(job.job_id.encode() + b"\0")
        use = self.use
        check = Check(layout, use, req, match, excluded)
        filters = active(check)
        found: list[tuple[float, int, tuple[int, ...]]] = []
        candidates = self._candidates(req, match, exhaustive)
        # The filters run on batches of candidates in the index's order; the first
        # ``limit`` that pass are ranked, as if they had been checked one by one.
        # ``limit - found`` at first (enough if they all pass), then batches that grow.
        want, step = int(min(limit, len(layout))), 0
        while len(found) < limit:
            batch = list(islice(candidates, max(want - len(found), step)))
            if not batch:
                break
            for i in run(check, batch, filters, counts):
                chosen = choose_gpus(check, i)
                found.append((-score_node(layout, use, i, req, chosen, match, seed)[0], i, chosen))
                if len(found) >= limit:
                    break
            step = max(8, 2 * step)
        if len(found) < need:
            return self._reason(check, counts, len(found), exhaustive)
        found.sort()
        members = tuple(
            MemberPlacement(
                node=layout.names[i],
                rank=rank,
                gpu_indices=tuple(layout.gpu_index[g] for g in chosen),
                # A whole member's CPUs are all the job's, as in Slurm; RAM and GPUs
                # are what it asked for (ram 0, sbatch's --mem=0: all of the member's).
                cpus=layout.cpus[i] if req.whole_member else req.cpus,
                ram=req.ram or layout.ram_total[i],
                vram_per_gpu=req.vram,
                scores=score_node(layout, use, i, req, chosen, match, seed, detail=True)[1],
            )
            for rank, (_, i, chosen) in enumerate(found[:need])
        )
        return Placement(
            job_id=job.job_id, gpu_mode=req.gpu_mode, members=members, whole_member=req.whole_member
        )

    def warm(self, requests: Iterable[ResourceRequest]) -> None:
        """Build the indexes these requests will use now, rather than on their first decision."""
        for req in requests:
            if not req.servers:
                match = (
                    self.layout.matching(req.gpu_brand, req.gpu_type) if req.gpus else self.layout.node_gpus
                )
                self._candidates(req, match, exhaustive=False)

    def _candidates(
        self, req: ResourceRequest, match: list[tuple[int, ...]], exhaustive: bool
    ) -> Iterator[int]:
        layout = self.layout
        if exhaustive:
            # Every member, so that each filter (the pin too) counts those it turns away.
            return iter(range(len(layout)))
        if req.servers:
            return iter(SERVER_PIN.pinned(layout, req))
        if not req.gpus:
            if self._cpu is None:
                self._cpu = _CpuIndex(layout, self.use)
            return self._cpu.walk(req.cpus)
        if req.gpu_mode is _EXCLUSIVE:
            key = (req.gpu_brand, req.gpu_type)
            idle = self._idle.get(key)
            if idle is None:
                idle = self._idle[key] = _IdleIndex(layout, self.use, *key)
            return idle.walk(req.gpus)
        vkey = (req.gpu_brand, req.gpu_type, req.gpu_mode)
        vram = self._vram.get(vkey)
        if vram is None:
            vram = self._vram[vkey] = _VramIndex(layout, self.use, req.gpu_brand, req.gpu_type, req.gpu_mode)
        return vram.walk(req.vram)

    # ------------------------------------------------------------------ reasons

    def never(self, req: ResourceRequest, *, up_only: bool = False) -> Reason | None:
        """:func:`feasible_ever` on this plan's layout, cached per request shape."""
        key = (req, up_only)
        if key not in self._ever:
            self._ever[key] = _feasible_ever(self.layout, req, up_only)
        return self._ever[key]

    def _reason(self, check: Check, counts: dict[str, int], found: int, exhaustive: bool) -> Reason:
        layout, req = self.layout, check.req
        never = self.never(req)
        if never is not None:
            return never
        if not exhaustive:
            # The index (or the pin) offered only members that might fit: run the
            # filters on the others too, so each refusal is counted under the rule that
            # made it (a GPU held whole by another job is not "lack free VRAM"). A
            # refusal is rarer than a placement, and the queue keeps it per request
            # shape for the pass.
            counts = {}
            run(check, list(range(len(layout))), active(check), counts)
        down = None if layout.all_up else self.never(req, up_only=True)
        if down is not None:
            # The members that could ever run it, by the same filters on an empty cluster.
            ever = Check(layout, layout.empty, req, check.match)
            names = [layout.names[i] for i in run_ever(ever, list(range(len(layout)))) if not layout.up[i]]
            shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
            return Reason(
                "ReqNodeNotAvail",
                f"the members that could run it are down or drained ({shown}); "
                f"it waits for them to come back",
                dict(counts, node_state=len(names)),
            )
        n = len(layout)
        counts = {k: v for k, v in counts.items() if v}
        label = req.gpu_label() if req.gpu_label() != "any" else ""
        parts = [
            f"{v} {BY_NAME[k].text.format(label=label).replace('  ', ' ')}"
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
        ]
        have = (
            f"{found} of the {req.nodes} members needed are free now"
            if req.nodes > 1
            else "no member is free now"
        )
        msg = f"needs {req.describe()}; {have}"
        if parts:
            msg += f" (of {n} members: " + ", ".join(parts) + ")"
        return Reason("Resources", msg, counts)


def run_ever(check: Check, members: list[int]) -> list[int]:
    """The ``members`` that pass every filter's "ever" rule (``check.use`` is ``Layout.empty``)."""
    for f in EVER_ORDER:
        members = f.ever(check, members)
    return members


def _feasible_ever(layout: Layout, req: ResourceRequest, up_only: bool) -> Reason | None:
    unknown = SERVER_PIN.unknown(layout, req)
    if unknown is not None:
        return Reason("BadConstraints", unknown, {SERVER_PIN.name: len(layout)})
    # The members to consider, each standing for ``weight[i]`` members: the pinned
    # servers; every member when --exclude or --constraint (rules that read names and
    # features) may tell them apart; else one member per hardware profile (the rules
    # then read only hardware).
    weight: dict[int, int] = {}
    pool: list[int] = []
    if req.servers or req.exclude or req.constraint:
        for i in SERVER_PIN.pinned(layout, req) if req.servers else range(len(layout)):
            if layout.up[i] or not up_only:
                pool.append(i)
                weight[i] = 1
    else:
        for i, all_, up in layout.profiles:
            if up if up_only else all_:
                pool.append(i)
                weight[i] = up if up_only else all_
    check = Check(layout, layout.empty, req)
    need, n = req.nodes, len(layout)
    reached = pool
    # Each filter's "ever" rule in turn, counting the members (weights) that pass it.
    # Too few members is told at the first rule that turns one away (or after the last,
    # when none does): a rule every member passes says nothing about the request.
    last = len(EVER_ORDER) - 1
    for at, f in enumerate(EVER_ORDER):
        kept = f.ever(check, reached)
        passed = sum(weight[i] for i in kept)
        if passed == 0:
            return Reason("BadConstraints", f.never(check, pool, reached), {f.name: n})
        if len(kept) == len(reached) and at < last:
            reached = kept
            continue
        if passed < need and passed == n and not req.servers:
            # Every member could take a part: the cluster is simply too small.
            where = (
                "this is a standalone host (a cluster of one member)"
                if n == 1
                else f"this cluster has {n} members"
            )
            return Reason(
                "BadConstraints",
                f"nodes={need} needs {need} members, and {where}; "
                f"submit it with nodes={n} or fewer, or add members to the cluster",
                {"cluster_size": n},
            )
        if passed < need:
            return Reason(
                "BadConstraints",
                f.too_few(check, passed)
                or f"only {passed} member(s) could ever take one member of it "
                f"({req.describe()}), but nodes={need} needs {need}",
                {f.name: n - passed},
            )
        reached = kept
    return None


class _Derived:
    """What placing derived from one snapshot: its plan and, for a snapshot made by
    :func:`snapshot_with_allocations`, what the next one may take over."""

    __slots__ = ("inputs", "made", "measured", "plan", "ref")

    def __init__(
        self,
        ref: weakref.ref[ClusterSnapshot],
        plan: Plan,
        inputs: tuple[NodeSnapshot, ...] | None = None,
        made: dict[str, tuple[NodeSnapshot, list[Allocation], NodeSnapshot]] | None = None,
        measured: Usage | None = None,
    ) -> None:
        self.ref, self.plan = ref, plan
        #: The measured nodes the snapshot was made from.
        self.inputs = inputs
        #: Per member with allocations: (measured node, its allocations, the node as committed).
        self.made = made or {}
        #: The use of ``inputs`` alone, before the allocations (never written to).
        self.measured = measured


class SnapshotCache:
    """Plans built from snapshots, kept beside them (the snapshots stay immutable) and
    dropped when the snapshot is. Nothing here holds a snapshot alive."""

    def __init__(self) -> None:
        self._by_id: dict[int, _Derived] = {}

    def get(self, snapshot: ClusterSnapshot) -> _Derived | None:
        got = self._by_id.get(id(snapshot))
        return got if got is not None and got.ref() is snapshot else None

    def put(
        self,
        snapshot: ClusterSnapshot,
        plan: Plan,
        inputs: tuple[NodeSnapshot, ...] | None = None,
        made: dict[str, tuple[NodeSnapshot, list[Allocation], NodeSnapshot]] | None = None,
        measured: Usage | None = None,
    ) -> None:
        key, by_id = id(snapshot), self._by_id

        def gone(ref: weakref.ref[ClusterSnapshot]) -> None:
            got = by_id.get(key)
            if got is not None and got.ref is ref:
                del by_id[key]

        by_id[key] = _Derived(weakref.ref(snapshot, gone), plan, inputs, made, measured)

    def __len__(self) -> int:
        return len(self._by_id)


#: The plans of the snapshots alive in this process.
SNAPSHOTS = SnapshotCache()


def _base_plan(snapshot: ClusterSnapshot) -> Plan:
    """The plan built from ``snapshot`` once, kept beside it; callers copy before writing."""
    got = SNAPSHOTS.get(snapshot)
    if got is None:
        base = Plan._build(snapshot)
        SNAPSHOTS.put(snapshot, base)
        return base
    return got.plan


def snapshot_with_allocations(
    nodes: Sequence[NodeSnapshot],
    allocations: Sequence[Allocation],
    *,
    previous: ClusterSnapshot | None = None,
) -> ClusterSnapshot:
    """A snapshot whose committed figures are those of ``allocations`` on top of ``nodes``.

    For the daemon, which knows the allocations from the replicated state and measured
    use from heartbeats: measured use in ``nodes`` is kept as it is (it already shows the
    running work), and CPUs, RAM, VRAM and GPU holders are committed per allocation.

    The plan that placing needs is built here once and kept beside the snapshot. With
    ``previous`` (the last snapshot made this way), what depends only on the members'
    hardware and states (the layout and its caches) is taken over when those are
    unchanged, and members without allocations keep their ``NodeSnapshot`` objects:
    on a thousand members a scheduling pass then costs what changed, not the cluster.
    """
    nodes = tuple(nodes)
    measured = ClusterSnapshot(nodes=nodes)
    was = SNAPSHOTS.get(previous) if previous is not None else None
    plan = Plan.__new__(Plan)
    plan.running = ()
    base: Usage | None = None
    if was is not None and was.inputs is not None and _same_layout(was.plan.layout, was.inputs, nodes):
        plan.layout, plan._ever = was.plan.layout, was.plan._ever
        if was.measured is not None:
            # Between two passes only the members that reported since have new
            # measurements: their entries are set again, the rest copied as lists.
            base = was.measured.copy()
            gids = plan.layout.node_gpus
            for i, (then, now) in enumerate(zip(was.inputs, nodes)):
                if then is not now:
                    base.refresh(i, now, gids[i])
    else:
        plan.layout, plan._ever = Layout(measured), {}
    if base is None:
        base = Usage(measured)
    plan.use = base.copy()
    plan.candidate_limit = max(2, math.ceil(math.log2(max(2, len(plan.layout)))))
    plan._idle, plan._vram, plan._cpu = {}, {}, None
    on: dict[int, list[Allocation]] = {}
    index_of = plan.layout.index_of
    for alloc in allocations:
        plan._apply(alloc.placement, 1, estimate=False)
        for m in alloc.placement.members:
            on.setdefault(index_of[m.node], []).append(alloc)
    out = list(nodes)
    # A member's committed snapshot is made again only when its report or its
    # allocations changed since ``previous``.
    made: dict[str, tuple[NodeSnapshot, list[Allocation], NodeSnapshot]] = {}
    kept = was.made if was is not None else {}
    for i, allocs in on.items():
        node = nodes[i]
        old = kept.get(node.name)
        if (
            old is not None
            and old[0] is node
            and len(old[1]) == len(allocs)
            and all(a is b for a, b in zip(old[1], allocs))
        ):
            out[i] = old[2]
        else:
            out[i] = plan._node_snapshot(i)
        made[node.name] = (node, allocs, out[i])
    snapshot = ClusterSnapshot(nodes=tuple(out), running=tuple(allocations))
    # The plan's figures are those the snapshot shows, so it is the snapshot's own.
    plan.running = snapshot.running
    SNAPSHOTS.put(snapshot, plan, nodes, made, base)
    return snapshot


def _same_layout(layout: Layout, old: tuple[NodeSnapshot, ...], new: tuple[NodeSnapshot, ...]) -> bool:
    """Whether ``new`` has the members, hardware, features and states ``layout`` was built from."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new):
        if a is b:
            continue
        if (
            a.name != b.name
            or a.cpus != b.cpus
            or a.ram_total != b.ram_total
            or a.state is not b.state
            or a.features != b.features
            or len(a.gpus) != len(b.gpus)
        ):
            return False
        for g, h in zip(a.gpus, b.gpus):
            if g.index != h.index or g.vram_total != h.vram_total or g.type != h.type or g.brand != h.brand:
                return False
    return True


def place(snapshot: ClusterSnapshot | Plan, job: PendingJob, now: float = 0.0) -> Placement | Reason:
    """Place ``job`` on ``snapshot`` (or on a plan): a Placement, or the Reason it waits."""
    plan = snapshot if isinstance(snapshot, Plan) else _base_plan(snapshot)
    return plan.place(job, now)


def explain(snapshot: ClusterSnapshot | Plan, job: PendingJob, now: float = 0.0) -> Placement | Reason:
    """Like :func:`place` but checks every member, so a Reason's counts are exact (for ``mt-job show``)."""
    plan = snapshot if isinstance(snapshot, Plan) else _base_plan(snapshot)
    return plan.place(job, now, exhaustive=True)


def feasible_ever(snapshot: ClusterSnapshot, request: ResourceRequest) -> Reason | None:
    """None if some members could run ``request`` on an empty cluster; else why not (BadConstraints).

    Current use and drain state are ignored: this is the submit-time check that turns
    away a request no member could ever satisfy.
    """
    return _base_plan(snapshot).never(request)
