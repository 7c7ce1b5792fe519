"""Placement: tables of small clusters and requests, with the expected member/GPUs or reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from mtgpu.schedd.placement import Plan, explain, feasible_ever, place, snapshot_with_allocations
from mtgpu.schedd.types import (
    Allocation,
    ClusterSnapshot,
    GpuMode,
    GpuSnapshot,
    MemberPlacement,
    NodeSnapshot,
    NodeState,
    PendingJob,
    Placement,
    Reason,
    ResourceRequest,
)

G = 1 << 30
EXCL, SHARED, OVER = GpuMode.EXCLUSIVE, GpuMode.SHARED, GpuMode.OVERCOMMIT


def gpu(
    index: int,
    type_: str = "a100",
    brand: str = "nvidia",
    vram: int = 80,
    used: int = 0,
    committed: int = 0,
    holder: str | None = None,
    shared: int = 0,
) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        brand=brand,
        type=type_,
        vram_total=vram * G,
        vram_used=used * G,
        vram_committed=committed * G,
        exclusive_job=holder,
        shared_jobs=shared,
    )


def gpus(n: int, **kw: Any) -> tuple[GpuSnapshot, ...]:
    return tuple(gpu(i, **kw) for i in range(n))


def node(
    name: str,
    gpu_list: tuple[GpuSnapshot, ...] = (),
    cpus: int = 32,
    ram: int = 256,
    ram_used: int = 0,
    cpus_committed: int = 0,
    ram_committed: int = 0,
    state: NodeState = NodeState.UP,
) -> NodeSnapshot:
    return NodeSnapshot(
        name=name,
        cpus=cpus,
        ram_total=ram * G,
        gpus=gpu_list,
        ram_used=ram_used * G,
        cpus_committed=cpus_committed,
        ram_committed=ram_committed * G,
        state=state,
    )


def job(job_id: str = "j1", **kw: Any) -> PendingJob:
    for k in ("vram", "ram"):
        if k in kw:
            kw[k] = int(kw[k] * G)
    kw.setdefault("ram", G)
    return PendingJob(job_id=job_id, tenant="ann", request=ResourceRequest(**kw))


@dataclass
class Case:
    id: str
    nodes: list[NodeSnapshot]
    request: dict[str, Any]
    #: node name -> GPU indices, for a placement
    placed: dict[str, tuple[int, ...]] | None = None
    #: reason code, for a refusal
    reason: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    message: str = ""
    #: words the reason must not use (a rule that did not block it)
    not_in: tuple[str, ...] = ()


CASES = [
    # --- exclusive
    Case(
        "exclusive takes a whole idle GPU",
        [node("a", (gpu(0, holder="x"), gpu(1)))],
        {"gpus": 1},
        placed={"a": (1,)},
    ),
    Case(
        "exclusive skips a GPU with shared jobs",
        [node("a", (gpu(0, shared=1, committed=8), gpu(1, holder="x")))],
        {"gpus": 1},
        reason="Resources",
        counts={"gpu_count": 1},
    ),
    Case(
        "exclusive takes several GPUs on one member",
        [node("a", gpus(8))],
        {"gpus": 4},
        placed={"a": (0, 1, 2, 3)},
    ),
    Case(
        "exclusive prefers the GPU with the least foreign use",
        [node("a", (gpu(0, used=10), gpu(1, used=0), gpu(2, used=5)))],
        {"gpus": 1},
        placed={"a": (1,)},
    ),
    Case(
        "exclusive with vram avoids a card mostly used by others",
        [node("a", (gpu(0, used=60), gpu(1, used=30)))],
        {"gpus": 1, "vram": 40},
        placed={"a": (1,)},
    ),
    Case(
        "exclusive with vram: no card has it free",
        [node("a", (gpu(0, used=60), gpu(1, used=50)))],
        {"gpus": 1, "vram": 40},
        reason="Resources",
        counts={"vram": 1},
    ),
    Case(
        "best fit: the member with fewest idle GPUs left",
        [node("a", gpus(8)), node("b", tuple(gpu(i, holder="x" if i < 6 else None) for i in range(8)))],
        {"gpus": 2},
        placed={"b": (6, 7)},
    ),
    # --- shared
    Case(
        "shared never on an exclusively held GPU",
        [node("a", (gpu(0, holder="x"), gpu(1, used=70, committed=70, shared=1)))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 16},
        reason="Resources",
        counts={"vram": 1},
    ),
    Case(
        "shared on a member whose only GPU is held whole: too few free GPUs, not VRAM",
        [node("a", (gpu(0, holder="x"),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 1},
        reason="Resources",
        counts={"gpu_count": 1},
        message="1 have too few free GPUs",
        not_in=("lack free VRAM",),
    ),
    Case(
        "shared: one member held whole, one short of VRAM: each named",
        [node("a", (gpu(0, holder="x"),)), node("b", (gpu(0, used=79),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 4},
        reason="Resources",
        counts={"gpu_count": 1, "vram": 1},
        message="1 lack free VRAM",
    ),
    Case(
        "shared fits beside another shared job",
        [node("a", (gpu(0, used=40, committed=40, shared=1),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 40},
        placed={"a": (0,)},
    ),
    Case(
        "shared: committed VRAM never passes the total",
        [node("a", (gpu(0, used=10, committed=70, shared=2),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 16},
        reason="Resources",
        counts={"vram": 1},
    ),
    Case(
        "shared: measured use above committed counts too",
        [node("a", (gpu(0, used=75, committed=0),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 10},
        reason="Resources",
        counts={"vram": 1},
    ),
    Case(
        "shared: best fit is the fullest GPU that still fits",
        [node("a", (gpu(0, used=50), gpu(1, used=68), gpu(2, used=30)))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 10},
        placed={"a": (1,)},
    ),
    Case(
        "shared: best fit across members",
        [node("a", (gpu(0, used=10),)), node("b", (gpu(0, used=60),)), node("c", (gpu(0, used=75),))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 16},
        placed={"b": (0,)},
    ),
    Case(
        "shared, two GPUs per member: a member with one fit is skipped",
        [node("a", (gpu(0), gpu(1, used=70))), node("b", (gpu(0, used=20), gpu(1, used=30)))],
        {"gpus": 2, "gpu_mode": SHARED, "vram": 40},
        placed={"b": (1, 0)},
    ),
    # --- overcommit
    Case(
        "overcommit places by measured free VRAM",
        [node("a", (gpu(0, used=20, committed=80, shared=2),))],
        {"gpus": 1, "gpu_mode": OVER, "vram": 40},
        placed={"a": (0,)},
    ),
    Case(
        "overcommit: measured use too high",
        [node("a", (gpu(0, used=60, committed=0),))],
        {"gpus": 1, "gpu_mode": OVER, "vram": 40},
        reason="Resources",
        counts={"vram": 1},
    ),
    Case(
        "overcommit never on an exclusively held GPU",
        [node("a", (gpu(0, holder="x", used=1),))],
        {"gpus": 1, "gpu_mode": OVER, "vram": 4},
        reason="Resources",
        counts={"gpu_count": 1},
    ),
    # --- CPU and RAM
    Case(
        "CPU-only job prefers a host without GPUs",
        [node("g", gpus(2), cpus=8), node("c", cpus=64)],
        {"cpus": 4},
        placed={"c": ()},
    ),
    Case(
        "CPU-only job uses a GPU host when that is all there is",
        [node("g", gpus(2), cpus=8)],
        {"cpus": 4},
        placed={"g": ()},
    ),
    Case(
        "CPU-only host does not take a GPU job",
        [node("c", cpus=64)],
        {"gpus": 1},
        reason="BadConstraints",
        message="no member has GPUs (no member has any GPU)",
    ),
    Case(
        "CPU best fit: the member left fullest",
        [node("c1", cpus=64, cpus_committed=10), node("c2", cpus=64, cpus_committed=56)],
        {"cpus": 8},
        placed={"c2": ()},
    ),
    Case(
        "not enough free CPUs",
        [node("a", gpus(2), cpus=8, cpus_committed=6)],
        {"gpus": 1, "cpus": 4},
        reason="Resources",
        counts={"cpus": 1},
    ),
    Case(
        "RAM: the larger of measured and committed",
        [node("a", gpus(1), ram=64, ram_used=50, ram_committed=10)],
        {"gpus": 1, "ram": 16},
        reason="Resources",
        counts={"ram": 1},
    ),
    Case(
        "RAM fits",
        [node("a", gpus(1), ram=64, ram_used=10, ram_committed=30)],
        {"gpus": 1, "ram": 32},
        placed={"a": (0,)},
    ),
    # --- constraints
    Case(
        "type constraint",
        [node("a", gpus(2)), node("r", gpus(2, type_="rtx4090", vram=24))],
        {"gpus": 1, "gpu_type": "rtx4090"},
        placed={"r": (0,)},
    ),
    Case(
        "brand constraint",
        [node("n", gpus(2)), node("m", gpus(2, brand="amd", type_="mi250", vram=64))],
        {"gpus": 2, "gpu_brand": "amd"},
        placed={"m": (0, 1)},
    ),
    Case(
        "brand and type",
        [node("n", gpus(2, type_="h100")), node("n2", gpus(2))],
        {"gpus": 1, "gpu_brand": "nvidia", "gpu_type": "a100"},
        placed={"n2": (0,)},
    ),
    Case(
        "mixed member: only matching GPUs are used",
        [node("x", (gpu(0, type_="rtx4090", vram=24), gpu(1), gpu(2, type_="rtx4090", vram=24)))],
        {"gpus": 2, "gpu_type": "rtx4090"},
        placed={"x": (0, 2)},
    ),
    Case(
        "server pin wins over a better fit",
        [node("a", gpus(8)), node("b", tuple(gpu(i, holder="x" if i else None) for i in range(8)))],
        {"gpus": 1, "servers": ("a",)},
        placed={"a": (0,)},
    ),
    Case(
        "pinned server is full",
        [node("a", (gpu(0, holder="x"),)), node("b", gpus(1))],
        {"gpus": 1, "servers": ("a",)},
        reason="Resources",
        counts={"server_pin": 1, "gpu_count": 1},
    ),
    Case(
        "pin to one of several servers",
        [node("a", gpus(1)), node("b", (gpu(0, holder="x"),)), node("c", gpus(1))],
        {"gpus": 1, "servers": ("b", "c")},
        placed={"c": (0,)},
    ),
    # --- state
    Case(
        "drained member is skipped",
        [node("a", gpus(8), state=NodeState.DRAIN), node("b", gpus(2))],
        {"gpus": 1},
        placed={"b": (0,)},
    ),
    Case(
        "down member is skipped",
        [node("a", gpus(8), state=NodeState.DOWN), node("b", gpus(2))],
        {"gpus": 2},
        placed={"b": (0, 1)},
    ),
    Case(
        "only a drained member could run it",
        [node("a", gpus(8), state=NodeState.DRAIN), node("b", gpus(2))],
        {"gpus": 4},
        reason="ReqNodeNotAvail",
        message="down or drained (a)",
    ),
    Case(
        "pinned to a down member",
        [node("a", gpus(8), state=NodeState.DOWN), node("b", gpus(2))],
        {"gpus": 1, "servers": ("a",)},
        reason="ReqNodeNotAvail",
    ),
    # --- impossible requests
    Case(
        "3 GPUs of a type no member has 3 of",
        [node("a", gpus(2, type_="rtx4090", vram=24)), node("b", gpus(8))],
        {"gpus": 3, "gpu_type": "rtx4090"},
        reason="BadConstraints",
        message="no member has 3 rtx4090 GPUs; the most on one member is 2",
    ),
    Case(
        "a type nobody has",
        [node("a", gpus(2))],
        {"gpus": 1, "gpu_type": "h100"},
        reason="BadConstraints",
        message="no member has h100 GPUs (there are nvidia:a100)",
    ),
    Case(
        "more VRAM than any card",
        [node("a", gpus(2, vram=24)), node("b", gpus(1, vram=48))],
        {"gpus": 1, "gpu_mode": SHARED, "vram": 64},
        reason="BadConstraints",
        message="no GPU has 64G of VRAM; the largest has 48G",
    ),
    Case(
        "more CPUs than any member",
        [node("a", gpus(2), cpus=32)],
        {"gpus": 1, "cpus": 64},
        reason="BadConstraints",
        message="has 64 CPUs; the most is 32",
    ),
    Case(
        "more RAM than any member",
        [node("a", gpus(2), ram=256)],
        {"gpus": 1, "ram": 512},
        reason="BadConstraints",
        message="512G of RAM; the most is 256G",
    ),
    Case(
        "more members than could ever take it",
        [node("a", gpus(4)), node("b", gpus(4)), node("c", gpus(2))],
        {"gpus": 4, "nodes": 3},
        reason="BadConstraints",
        message="only 2 member(s) could ever take",
    ),
    Case(
        "nodes=2 on a standalone host is impossible, not busy",
        [node("solo", gpus(1))],
        {"gpus": 1, "nodes": 2},
        reason="BadConstraints",
        message="nodes=2 needs 2 members, and this is a standalone host",
        not_in=("free", "busy"),
    ),
    Case(
        "nodes=3 on a cluster of two",
        [node("a", gpus(1)), node("b", gpus(1))],
        {"nodes": 3},
        reason="BadConstraints",
        message="this cluster has 2 members",
    ),
    Case(
        "nodes=2 with one of two members drained waits for it",
        [node("a"), node("b", state=NodeState.DRAIN)],
        {"nodes": 2},
        reason="ReqNodeNotAvail",
        message="down or drained (b)",
    ),
    Case(
        "unknown pinned server",
        [node("a", gpus(1))],
        {"gpus": 1, "servers": ("zz",)},
        reason="BadConstraints",
        message="server zz is not a member of this cluster; expected one of a",
    ),
    Case(
        "impossible ignores current use: a busy cluster is Resources",
        [node("a", (gpu(0, holder="x"), gpu(1, holder="y")))],
        {"gpus": 2},
        reason="Resources",
        counts={"gpu_count": 1},
    ),
    # --- multi-member
    Case(
        "nodes=2 takes two distinct members",
        [node("a", gpus(4)), node("b", gpus(4)), node("c", gpus(2))],
        {"gpus": 4, "nodes": 2},
        placed={"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)},
    ),
    Case(
        "nodes=2 all or nothing",
        [node("a", gpus(4)), node("b", (gpu(0, holder="x"),) + gpus(4)[1:])],
        {"gpus": 4, "nodes": 2},
        reason="Resources",
        counts={"gpu_count": 1},
        message="1 of the 2 members needed are free now",
    ),
    Case(
        "nodes=3 CPU-only",
        [node(f"c{i}", cpus=16, cpus_committed=1 if i == 1 else 0) for i in range(4)],
        {"cpus": 16, "nodes": 3},
        placed={"c0": (), "c2": (), "c3": ()},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("exhaustive", [False, True], ids=["indexed", "exhaustive"])
def test_place(case: Case, exhaustive: bool) -> None:
    snapshot = ClusterSnapshot(nodes=tuple(case.nodes))
    j = job(**case.request)
    got = explain(snapshot, j, 0.0) if exhaustive else place(snapshot, j, 0.0)
    if case.placed is not None:
        assert isinstance(got, Placement), got
        assert {m.node: m.gpu_indices for m in got.members} == case.placed
        assert [m.rank for m in got.members] == list(range(len(got.members)))
        assert all(
            m.cpus == j.request.cpus and m.ram == j.request.ram and m.vram_per_gpu == j.request.vram
            for m in got.members
        )
        assert got.gpu_mode == j.request.gpu_mode and got.job_id == "j1"
    else:
        assert isinstance(got, Reason), got
        assert got.code == case.reason, got.message
        # Both paths count each member under the rule that turned it away.
        for name, count in case.counts.items():
            assert got.per_filter_counts.get(name) == count, got.per_filter_counts
        assert case.message in got.message
        assert not any(text in got.message for text in case.not_in), got.message


def test_explain_counts_cover_every_member() -> None:
    nodes = [
        node("a", gpus(2), cpus=4, cpus_committed=4),
        node("b", gpus(2, type_="h100")),
        node("c", (gpu(0, holder="x"), gpu(1, holder="y"))),
        node("d", gpus(2), state=NodeState.DRAIN),
        node("e", gpus(2), ram=8, ram_used=8),
        node("f", (gpu(0, used=79), gpu(1, used=79))),
    ]
    got = explain(ClusterSnapshot(nodes=tuple(nodes)), job(gpus=1, gpu_type="a100", vram=20, gpu_mode=SHARED))
    assert isinstance(got, Reason)
    assert got.per_filter_counts == {
        "cpus": 1,
        "gpu_model": 1,
        "gpu_count": 1,
        "vram": 1,
        "node_state": 1,
        "ram": 1,
    }
    assert "6 members" in got.message


def test_scores_are_named() -> None:
    got = place(ClusterSnapshot(nodes=(node("a", gpus(2)),)), job(gpus=1))
    assert isinstance(got, Placement)
    names = [n for n, _ in got.members[0].scores]
    assert names == ["gpu_fit", "cpu_fit", "ram_fit", "tiebreak"]
    cpu_only = place(ClusterSnapshot(nodes=(node("c"),)), job(cpus=2))
    assert isinstance(cpu_only, Placement)
    assert [n for n, _ in cpu_only.members[0].scores] == ["cpu_fit", "ram_fit", "gpu_spare", "tiebreak"]


def test_deterministic_and_tiebreak_spreads_by_job_id() -> None:
    snapshot = ClusterSnapshot(nodes=tuple(node(f"n{i}", gpus(8)) for i in range(8)))
    first = {}
    for k in range(40):
        a = place(snapshot, job(f"job{k}", gpus=1))
        b = place(ClusterSnapshot(nodes=snapshot.nodes), job(f"job{k}", gpus=1))
        assert a == b  # same input, same answer
        assert isinstance(a, Placement)
        first[k] = a.members[0].node
    assert len(set(first.values())) > 1  # identical members: the job id decides


def test_place_does_not_change_the_snapshot_and_plan_commits() -> None:
    snapshot = ClusterSnapshot(nodes=(node("a", gpus(2)),))
    plan = Plan(snapshot)
    one = plan.place(job("j1", gpus=1))
    assert isinstance(one, Placement)
    assert plan.place(job("j1", gpus=1)) == one  # place alone changes nothing
    plan.commit(one)
    two = plan.place(job("j2", gpus=1))
    assert isinstance(two, Placement) and two.members[0].gpu_indices != one.members[0].gpu_indices
    plan.commit(two)
    assert isinstance(plan.place(job("j3", gpus=1)), Reason)
    # The snapshot and a fresh plan still see two idle GPUs.
    assert isinstance(place(snapshot, job("j3", gpus=2)), Placement)
    assert isinstance(Plan(snapshot).place(job("j3", gpus=2)), Placement)
    plan.release(one)
    assert plan.place(job("j3", gpus=1)).members[0].gpu_indices == one.members[0].gpu_indices  # type: ignore[union-attr]


def test_copy_is_independent() -> None:
    plan = Plan(ClusterSnapshot(nodes=(node("a", gpus(1)),)))
    other = plan.copy()
    got = plan.place(job(gpus=1))
    assert isinstance(got, Placement)
    plan.commit(got)
    assert isinstance(plan.place(job("x", gpus=1)), Reason)
    assert isinstance(other.place(job("x", gpus=1)), Placement)


def test_fits_checks_an_exact_placement() -> None:
    plan = Plan(ClusterSnapshot(nodes=(node("a", gpus(2)),)))
    p0 = Placement("p", EXCL, (MemberPlacement("a", 0, (0,), 1, G),))
    assert plan.fits(p0)
    plan.commit(p0)
    assert not plan.fits(Placement("q", EXCL, (MemberPlacement("a", 0, (0,), 1, G),)))
    assert plan.fits(Placement("q", EXCL, (MemberPlacement("a", 0, (1,), 1, G),)))
    assert not plan.fits(Placement("q", SHARED, (MemberPlacement("a", 0, (0,), 1, G, vram_per_gpu=G),)))
    assert not plan.fits(Placement("q", EXCL, (MemberPlacement("zz", 0, (0,), 1, G),)))


def test_exclude_counts_reserved() -> None:
    snapshot = ClusterSnapshot(nodes=(node("a", gpus(1)), node("b", gpus(1))))
    got = Plan(snapshot).place(job(gpus=1), exclude={"a", "b"})
    assert isinstance(got, Reason) and got.per_filter_counts == {"reserved": 2}
    ok = Plan(snapshot).place(job(gpus=1), exclude={"a"})
    assert isinstance(ok, Placement) and ok.nodes == ("b",)


def test_commit_and_release_keep_shared_accounting() -> None:
    snapshot = ClusterSnapshot(nodes=(node("a", (gpu(0),)),))
    plan = Plan(snapshot)
    placed = []
    for k in range(5):
        got = plan.place(job(f"s{k}", gpus=1, gpu_mode=SHARED, vram=16))
        assert isinstance(got, Placement)
        plan.commit(got)
        placed.append(got)
    assert isinstance(plan.place(job("s5", gpus=1, gpu_mode=SHARED, vram=16)), Reason)  # 5 * 16G = 80G
    assert isinstance(plan.place(job("e", gpus=1)), Reason)  # shared GPU takes no exclusive job
    snap = plan.to_snapshot()
    g = snap.nodes[0].gpus[0]
    assert (g.vram_committed, g.shared_jobs, g.exclusive_job) == (80 * G, 5, None)
    for p in placed:
        plan.release(p)
    assert isinstance(plan.place(job("e", gpus=1)), Placement)


def test_feasible_ever_ignores_use() -> None:
    full = ClusterSnapshot(nodes=(node("a", (gpu(0, holder="x"), gpu(1, holder="y")), cpus_committed=32),))
    assert feasible_ever(full, ResourceRequest(gpus=2, cpus=32)) is None
    bad = feasible_ever(full, ResourceRequest(gpus=3))
    assert isinstance(bad, Reason) and bad.code == "BadConstraints"


def test_snapshot_with_allocations() -> None:
    nodes = [node("a", (gpu(0, used=30), gpu(1, used=5)), cpus=16, ram=64, ram_used=20)]
    allocs = [
        Allocation(Placement("x", EXCL, (MemberPlacement("a", 0, (0,), 4, 8 * G),)), 100.0),
        Allocation(Placement("y", SHARED, (MemberPlacement("a", 0, (1,), 2, 4 * G, 10 * G),)), None),
    ]
    snap = snapshot_with_allocations(nodes, allocs)
    a = snap.nodes[0]
    assert (a.cpus_committed, a.ram_committed, a.ram_used) == (6, 12 * G, 20 * G)
    assert a.gpus[0].exclusive_job == "x" and a.gpus[0].vram_used == 30 * G
    assert (a.gpus[1].vram_committed, a.gpus[1].shared_jobs, a.gpus[1].vram_used) == (10 * G, 1, 5 * G)
    assert snap.running == tuple(allocs)


def test_duplicate_member_names_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate member names"):
        ClusterSnapshot(nodes=(node("a"), node("a")))


def test_to_dict() -> None:
    got = place(ClusterSnapshot(nodes=(node("a", gpus(1)),)), job(gpus=1))
    assert isinstance(got, Placement)
    d = got.to_dict()
    assert d["job_id"] == "j1" and d["gpu_mode"] == "exclusive" and d["members"][0]["gpu_indices"] == [0]
    why = place(ClusterSnapshot(nodes=(node("a"),)), job(gpus=1))
    assert isinstance(why, Reason) and why.to_dict()["code"] == "BadConstraints"


def test_candidate_limit_still_finds_a_rare_fit() -> None:
    # 200 members whose GPU is free but whose CPUs are all taken, and one that fits.
    nodes = [node(f"n{i:03d}", gpus(1), cpus=8, cpus_committed=8) for i in range(200)]
    nodes.append(node("ok", gpus(1), cpus=8))
    got = place(ClusterSnapshot(nodes=tuple(nodes)), job(gpus=1, cpus=4))
    assert isinstance(got, Placement) and got.nodes == ("ok",)


def _committed_view(snap: ClusterSnapshot) -> list[tuple[Any, ...]]:
    return [
        (
            n.name,
            n.state,
            n.cpus_committed,
            n.ram_committed,
            n.ram_used,
            tuple(
                sorted(
                    (g.index, g.vram_used, g.vram_committed, g.exclusive_job, g.shared_jobs) for g in n.gpus
                )
            ),
        )
        for n in snap.nodes
    ]


def test_snapshot_from_the_previous_one_equals_a_fresh_one() -> None:
    """Made from the last snapshot (as the scheduler does every pass), a snapshot shows
    exactly what one made from scratch shows, and places the same way; the layout is
    taken over only while members' hardware and states stay the same."""
    nodes = [node(f"n{i}", gpus(4, used=i % 3), ram_used=i) for i in range(6)]
    x = Allocation(Placement("x", EXCL, (MemberPlacement("n1", 0, (0,), 4, 8 * G),)), 100.0)
    y = Allocation(Placement("y", SHARED, (MemberPlacement("n2", 0, (1,), 2, 4 * G, 10 * G),)), None)
    first = snapshot_with_allocations(nodes, [x])
    # n2 reports anew (more measured use) and y starts there.
    nodes2 = list(nodes)
    nodes2[2] = node("n2", gpus(4, used=7), ram_used=9)
    second = snapshot_with_allocations(nodes2, [x, y], previous=first)
    fresh = snapshot_with_allocations(nodes2, [x, y])
    assert _committed_view(second) == _committed_view(fresh)
    assert Plan(second).layout is Plan(first).layout
    assert second.nodes[1] is first.nodes[1]  # n1: same report, same allocations
    for k in range(8):
        want = job(f"j{k}", gpus=2, gpu_mode=SHARED, vram=40)
        got, ref = place(second, want), place(fresh, want)
        assert got == ref
    # x ends: n1 shows no holder again.
    third = snapshot_with_allocations(nodes2, [y], previous=second)
    assert _committed_view(third) == _committed_view(snapshot_with_allocations(nodes2, [y]))
    assert third.nodes[1].gpus[0].exclusive_job is None
    # A drained member or new hardware is a new layout.
    nodes4 = list(nodes2)
    nodes4[0] = node("n0", gpus(4), state=NodeState.DRAIN)
    fourth = snapshot_with_allocations(nodes4, [y], previous=third)
    assert Plan(fourth).layout is not Plan(third).layout
    assert not isinstance(place(fourth, job("k", gpus=4, servers=("n0",))), Placement)
    assert isinstance(place(third, job("k", gpus=4, servers=("n0",))), Placement)
    nodes5 = list(nodes2)
    nodes5[3] = node("n3", gpus(8))
    fifth = snapshot_with_allocations(nodes5, [y], previous=third)
    assert Plan(fifth).layout is not Plan(third).layout
    assert isinstance(place(fifth, job("big", gpus=8)), Placement)


def test_a_request_that_excludes_members_never_gets_them() -> None:
    """sbatch's --exclude: the excluded members are never chosen, whatever the index
    offers; excluding every member is refused as never feasible."""
    snapshot = ClusterSnapshot(nodes=(node("a", gpus(2)), node("b", gpus(1)), node("c")))
    for exhaustive in (False, True):
        got = Plan(snapshot).place(job(gpus=1, exclude=("a",)), exhaustive=exhaustive)
        assert isinstance(got, Placement) and got.nodes == ("b",), got
        cpu = Plan(snapshot).place(job(cpus=1, exclude=("c", "a")), exhaustive=exhaustive)
        assert isinstance(cpu, Placement) and cpu.nodes == ("b",), cpu
    waits = Plan(snapshot).place(job(gpus=2, exclude=("a",)))
    assert isinstance(waits, Reason)
    never = feasible_ever(snapshot, ResourceRequest(gpus=2, exclude=("a",)))
    assert isinstance(never, Reason) and never.code == "BadConstraints"
    gone = feasible_ever(snapshot, ResourceRequest(nodes=2, servers=("a", "b"), exclude=("b",)))
    assert isinstance(gone, Reason) and "--exclude: only 1 member(s) of this cluster qualify" in gone.message
    assert feasible_ever(snapshot, ResourceRequest(gpus=1, exclude=("a",))) is None


def test_a_constraint_places_only_on_members_with_the_features() -> None:
    """sbatch's --constraint over NODE_FEATURES: & all of, | any of."""
    import dataclasses

    a = dataclasses.replace(node("a", gpus(2)), features=("a100", "nvlink"))
    b = dataclasses.replace(node("b", gpus(2)), features=("a100",))
    c = dataclasses.replace(node("c", gpus(2)), features=("h100",))
    snapshot = ClusterSnapshot(nodes=(a, b, c))
    for constraint, where in (("a100&nvlink", {"a"}), ("h100", {"c"}), ("a100&nvlink|h100", {"a", "c"})):
        for exhaustive in (False, True):
            got = Plan(snapshot).place(job(gpus=2, constraint=constraint), exhaustive=exhaustive)
            assert isinstance(got, Placement) and set(got.nodes) <= where, (constraint, got)
    two = Plan(snapshot).place(job(gpus=1, nodes=2, constraint="a100"))
    assert isinstance(two, Placement) and set(two.nodes) == {"a", "b"}
    never = feasible_ever(snapshot, ResourceRequest(gpus=1, constraint="mi300"))
    assert (
        isinstance(never, Reason) and never.code == "BadConstraints" and "--constraint=mi300" in never.message
    )
    assert isinstance(feasible_ever(snapshot, ResourceRequest(gpus=1, nodes=2, constraint="h100")), Reason)


# --------------------------------------------------------------- whole members (--exclusive)


def test_a_whole_member_job_goes_only_where_nothing_runs_and_takes_every_cpu() -> None:
    busy_cpu = node("a", gpus(2), cpus_committed=1)
    busy_ram = node("b", gpus(2), ram_committed=1)
    busy_gpu = node("c", (gpu(0, holder="x"), gpu(1)))
    shared_gpu = node("d", (gpu(0, shared=1, committed=8), gpu(1)))
    idle = node("e", gpus(2), cpus=16)
    snap = ClusterSnapshot(nodes=(busy_cpu, busy_ram, busy_gpu, shared_gpu, idle))
    got = explain(snap, job(gpus=1, cpus=2, ram=4, whole_member=True))
    assert isinstance(got, Placement) and got.nodes == ("e",) and got.whole_member
    (m,) = got.members
    # Every CPU is the job's, as in Slurm; RAM and GPUs only as asked.
    assert (m.cpus, m.ram, m.gpu_indices) == (16, 4 * G, (0,))
    none = explain(ClusterSnapshot(nodes=(busy_cpu, busy_ram, busy_gpu, shared_gpu)), job(whole_member=True))
    assert isinstance(none, Reason) and none.code == "Resources"
    assert none.per_filter_counts == {"member_busy": 4}
    assert "run other jobs (it asks for whole members, --exclusive)" in none.message
    assert "on one whole member" in none.message


def test_nothing_is_placed_on_a_member_held_whole_until_its_job_is_released() -> None:
    plan = Plan(ClusterSnapshot(nodes=(node("a", gpus(4)),)))
    whole = place(plan, job("w", gpus=1, whole_member=True))
    assert isinstance(whole, Placement)
    plan.commit(whole)
    # GPUs and RAM are left over, yet no job of any kind fits beside it.
    for other in (job("g", gpus=1), job("c", cpus=1), job("s", gpus=1, vram=1, gpu_mode=SHARED)):
        got = explain(plan, other)
        assert isinstance(got, Reason) and got.per_filter_counts == {"member_held": 1}, other
        assert "held whole by another job" in got.message
    assert not plan.fits(Placement("g", EXCL, (MemberPlacement("a", 0, (3,), cpus=0, ram=0),)))
    plan.release(whole)
    assert isinstance(place(plan, job("g", gpus=1)), Placement)


def test_mem_0_gets_all_of_a_whole_members_ram_and_its_placement_still_fits() -> None:
    """sbatch's --mem=0 (ram 0, held whole): the member's RAM is all the job's (its
    memory limit), though the system uses some of it; nothing fits beside it."""
    plan = Plan(ClusterSnapshot(nodes=(node("a", gpus(2), ram=64, ram_used=3),)))
    got = place(plan, job("m", ram=0, whole_member=True))
    assert isinstance(got, Placement) and got.members[0].ram == 64 * G, got
    assert plan.fits(got)
    plan.commit(got)
    assert isinstance(explain(plan, job("c", cpus=1)), Reason)


def test_a_whole_member_survives_the_round_trip_through_the_snapshot() -> None:
    from mtgpu.jobspec import placement_from_dict

    plan = Plan(ClusterSnapshot(nodes=(node("a", gpus(2)), node("b", gpus(2)))))
    whole = place(plan, job("w", nodes=2, whole_member=True))
    assert isinstance(whole, Placement) and whole.to_dict()["whole_member"] is True
    again = placement_from_dict(whole.to_dict())
    assert again.whole_member and again.nodes == whole.nodes
    # As the daemon builds it: running work from the job table on the measured members.
    snap = snapshot_with_allocations([node("a", gpus(2)), node("b", gpus(2))], [Allocation(again, None)])
    assert [n.whole_job for n in snap.nodes] == ["w", "w"]
    got = place(snap, job("c"))
    assert isinstance(got, Reason) and got.per_filter_counts == {"member_held": 2}
    # A placement journalled before whole members were known holds no member whole.
    old = {k: v for k, v in whole.to_dict().items() if k != "whole_member"}
    assert placement_from_dict(old).whole_member is False


def test_the_indexed_path_agrees_with_every_member_checked_for_whole_members() -> None:
    nodes = [node(f"n{i}", gpus(2), cpus_committed=i % 3, ram_committed=i % 2) for i in range(12)]
    snap = ClusterSnapshot(nodes=tuple(nodes))
    for req in (
        {"whole_member": True},
        {"whole_member": True, "gpus": 2},
        {"whole_member": True, "nodes": 2},
    ):
        fast, slow = place(snap, job(**req)), explain(snap, job(**req))
        assert type(fast) is type(slow), req
        if isinstance(fast, Placement):
            assert isinstance(slow, Placement)
            assert {n for n in fast.nodes} <= {"n0", "n6"} and {n for n in slow.nodes} <= {"n0", "n6"}


RTX = dict(type_="rtx4090", vram=24)


@pytest.mark.parametrize(
    "members, expected",
    [
        # One member lacks the model: the GPU rule is the one that turns it away.
        (
            (
                node("m1", gpus(1, type_="t4", vram=16)),
                node("m2", gpus(2, **RTX)),
                node("m3", gpus(3, **RTX)),
            ),
            "only 2",
        ),
        ((node("m1", gpus(1, type_="t4")), node("m2", gpus(1, **RTX)), node("m3", ())), "only 1"),
        # Every member could take a part: the cluster is too small, whatever rule comes first.
        (
            (node("m2", gpus(2, **RTX)), node("m3", gpus(3, **RTX)), node("m4", gpus(1, **RTX))),
            "this cluster has 3",
        ),
        (
            (node("m2", gpus(2, **RTX)), node("m3", gpus(3, **RTX), state=NodeState.DRAIN)),
            "this cluster has 2",
        ),
    ],
)
def test_a_multi_member_job_that_could_never_run_names_the_rule_that_turns_members_away(
    members, expected
) -> None:
    req = ResourceRequest(gpus=1, gpu_type="rtx4090", cpus=1, ram=10 << 20, nodes=4)
    r = feasible_ever(ClusterSnapshot(nodes=members), req)
    assert isinstance(r, Reason) and r.code == "BadConstraints"
    assert expected in r.message, r.message
