"""Properties of placement over random clusters and random streams of jobs.

An independent model of what every GPU and member holds checks that no stream of
placements and releases ever oversubscribes anything, and the indexed placement is
compared with the exhaustive one on every decision.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.schedd.placement import Plan
from mtgpu.schedd.types import (
    ClusterSnapshot,
    GpuMode,
    GpuSnapshot,
    NodeSnapshot,
    NodeState,
    PendingJob,
    Placement,
    Reason,
    ResourceRequest,
)

G = 1 << 30
KINDS = [("nvidia", "a100", 80), ("nvidia", "rtx4090", 24), ("amd", "mi250", 64)]


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(KINDS))
        n_gpus = draw(st.integers(0, 4))
        gpus = tuple(
            GpuSnapshot(
                index=k,
                brand=kind[0],
                type=kind[1],
                vram_total=kind[2] * G,
                vram_used=draw(st.sampled_from((0, 0, 2, 10))) * G,
            )
            for k in range(n_gpus)
        )
        nodes.append(
            NodeSnapshot(
                name=f"n{i}",
                cpus=draw(st.sampled_from((4, 8, 32))),
                ram_total=draw(st.sampled_from((16, 64, 128))) * G,
                gpus=gpus,
                ram_used=draw(st.sampled_from((0, 2))) * G,
                state=draw(st.sampled_from((NodeState.UP,) * 4 + (NodeState.DRAIN,))),
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes))


@st.composite
def requests(draw: st.DrawFn) -> ResourceRequest:
    gpus = draw(st.integers(0, 3))
    mode = draw(st.sampled_from(list(GpuMode))) if gpus else GpuMode.EXCLUSIVE
    vram = (
        draw(st.sampled_from((4, 10, 20, 40))) * G
        if mode is not GpuMode.EXCLUSIVE
        else draw(st.sampled_from((0, 0, 20))) * G
        if gpus
        else 0
    )
    kind = draw(st.sampled_from(KINDS + [None]))
    brand = gpu_type = None
    if gpus and kind is not None:
        if draw(st.booleans()):
            brand = kind[0]
        else:
            gpu_type = kind[1]
    servers: tuple[str, ...] = ()
    if draw(st.integers(0, 9)) == 0:
        servers = (f"n{draw(st.integers(0, 6))}",)
    return ResourceRequest(
        gpus=gpus,
        gpu_brand=brand,
        gpu_type=gpu_type,
        gpu_mode=mode,
        vram=vram,
        cpus=draw(st.sampled_from((1, 2, 4, 8))),
        ram=draw(st.sampled_from((1, 4, 16))) * G,
        nodes=1 if servers else draw(st.sampled_from((1, 1, 1, 2))),
        servers=servers,
    )


class Model:
    """What each GPU and member holds, kept apart from the planner."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.gpu_jobs: dict[tuple[str, int], list[tuple[str, GpuMode, int]]] = defaultdict(list)
        self.cpus: dict[str, int] = defaultdict(int)
        self.ram: dict[str, int] = defaultdict(int)

    def add(self, p: Placement, sign: int) -> None:
        for m in p.members:
            self.cpus[m.node] += sign * m.cpus
            self.ram[m.node] += sign * m.ram
            for idx in m.gpu_indices:
                entry = (p.job_id, p.gpu_mode, m.vram_per_gpu)
                if sign > 0:
                    self.gpu_jobs[(m.node, idx)].append(entry)
                else:
                    self.gpu_jobs[(m.node, idx)].remove(entry)

    def check(self) -> None:
        for name, n in self.nodes.items():
            assert self.cpus[name] <= n.cpus, name
            assert self.ram[name] <= n.ram_total, name
            for g in n.gpus:
                held = self.gpu_jobs[(name, g.index)]
                if any(mode is GpuMode.EXCLUSIVE for _, mode, _ in held):
                    assert len(held) == 1, f"{name}/{g.index} exclusive and shared: {held}"
                shared = sum(v for _, mode, v in held if mode is GpuMode.SHARED)
                assert shared <= g.vram_total, f"{name}/{g.index} committed {shared} > {g.vram_total}"


def check_placement(snapshot: ClusterSnapshot, req: ResourceRequest, p: Placement) -> None:
    nodes = {n.name: n for n in snapshot.nodes}
    assert len(p.members) == req.nodes
    assert len(set(p.nodes)) == req.nodes  # distinct members, all or nothing
    for m in p.members:
        n = nodes[m.node]
        assert n.state is NodeState.UP
        if req.servers:
            assert m.node in req.servers
        assert len(set(m.gpu_indices)) == req.gpus
        by_index = {g.index: g for g in n.gpus}
        for idx in m.gpu_indices:
            assert req.gpu_matches(by_index[idx].brand, by_index[idx].type)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=clusters(), stream=st.lists(st.tuples(requests(), st.integers(0, 4)), min_size=1, max_size=40)
)
def test_random_streams_never_oversubscribe(
    snapshot: ClusterSnapshot, stream: list[tuple[ResourceRequest, int]]
) -> None:
    plan = Plan(snapshot)
    model = Model(snapshot)
    placed: list[Placement] = []
    for k, (req, action) in enumerate(stream):
        if action == 0 and placed:  # now and then a job ends
            done = placed.pop(k % len(placed))
            plan.release(done)
            model.add(done, -1)
        job = PendingJob(job_id=f"j{k}", tenant="t", request=req)
        got = plan.place(job)
        full = plan.place(job, exhaustive=True)
        # The indexes and the candidate limit never miss a fit the full scan finds.
        assert isinstance(got, Placement) == isinstance(full, Placement), (got, full)
        if isinstance(got, Reason):
            assert isinstance(full, Reason) and got.code == full.code
            assert full.per_filter_counts and sum(full.per_filter_counts.values()) <= len(snapshot.nodes)
            # Both name the same rule for each member (the indexed path checks the members
            # its index did not offer too).
            assert got.per_filter_counts == full.per_filter_counts, (got, full)
            continue
        check_placement(snapshot, req, got)
        assert plan.fits(got)
        plan.commit(got)
        model.add(got, 1)
        model.check()
        placed.append(got)
    # The plan's own accounting agrees with the model's.
    after = plan.to_snapshot()
    for n in after.nodes:
        assert n.cpus_committed == model.cpus[n.name]
        assert n.ram_committed == model.ram[n.name]
        for g in n.gpus:
            held = model.gpu_jobs[(n.name, g.index)]
            shared = sum(v for _, mode, v in held if mode is GpuMode.SHARED)
            assert g.vram_committed == shared
            assert g.vram_committed <= g.vram_total
            assert g.shared_jobs == sum(1 for _, mode, _ in held if mode is not GpuMode.EXCLUSIVE)
            assert (g.exclusive_job is not None) == any(mode is GpuMode.EXCLUSIVE for _, mode, _ in held)


@settings(max_examples=100, deadline=None)
@given(snapshot=clusters(), reqs=st.lists(requests(), min_size=1, max_size=20))
def test_copy_then_commit_matches_fresh_indexes(
    snapshot: ClusterSnapshot, reqs: list[ResourceRequest]
) -> None:
    """A plan copied mid-stream answers like a plan rebuilt from its own snapshot."""
    plan = Plan(snapshot)
    for k, req in enumerate(reqs):
        got = plan.place(PendingJob(f"j{k}", "t", req))
        if isinstance(got, Placement):
            plan.commit(got)
    copy = plan.copy()
    fresh = Plan(plan.to_snapshot())
    for k, req in enumerate(reqs):
        job = PendingJob(f"q{k}", "t", req)
        a, b = copy.place(job), fresh.place(job)
        assert isinstance(a, Placement) == isinstance(b, Placement)


def _use_lists(snapshot: ClusterSnapshot) -> dict[str, list[object]]:
    from mtgpu.schedd.placement import SNAPSHOTS

    derived = SNAPSHOTS.get(snapshot)
    assert derived is not None
    use = derived.plan.use
    return {k: list(getattr(use, k)) for k in type(use).__slots__}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=clusters(),
    rounds=st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 8), st.booleans())),
            st.lists(requests(), max_size=4),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_a_snapshot_from_the_last_one_has_the_use_of_a_fresh_one(
    snapshot: ClusterSnapshot, rounds: list[tuple[list[tuple[int, int, int, bool]], list[ResourceRequest]]]
) -> None:
    """Each pass makes its snapshot from the last one and sets again only the members
    that reported since: what it counts free, GPU by GPU, is what a snapshot made from
    scratch counts, over any sequence of reports (GPUs listed in any order) and jobs."""
    from mtgpu.schedd.placement import Allocation, snapshot_with_allocations

    nodes = list(snapshot.nodes)
    allocs: list[Allocation] = []
    last = snapshot_with_allocations(nodes, allocs)
    for k, (reports, reqs) in enumerate(rounds):
        for i, used, ram, backwards in reports:
            if i >= len(nodes):
                continue
            n = nodes[i]
            gpus = [
                GpuSnapshot(g.index, g.brand, g.type, g.vram_total, vram_used=(used + 5 * g.index) % 40 * G)
                for g in n.gpus
            ]
            nodes[i] = NodeSnapshot(
                name=n.name,
                cpus=n.cpus,
                ram_total=n.ram_total,
                gpus=tuple(reversed(gpus) if backwards else gpus),
                ram_used=min(ram * G, n.ram_total),
                state=n.state,
            )
        plan = Plan(last)
        for j, req in enumerate(reqs):
            got = plan.place(PendingJob(f"r{k}-{j}", "t", req))
            if isinstance(got, Placement):
                plan.commit(got)
                allocs.append(Allocation(got, None))
        if allocs and k % 2:
            allocs.pop(0)  # one ends
        made = snapshot_with_allocations(nodes, allocs, previous=last)
        fresh = snapshot_with_allocations(nodes, allocs)
        assert _use_lists(made) == _use_lists(fresh)
        assert [Plan(made).place(PendingJob("p", "t", r)) for r in reqs] == [
            Plan(fresh).place(PendingJob("p", "t", r)) for r in reqs
        ]
        last = made
