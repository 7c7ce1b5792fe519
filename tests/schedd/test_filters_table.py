"""The placement filters one by one: rows of (member, request) -> passes now / could ever,
and the words the pending reason uses; and the registry that every path walks."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from mtgpu.schedd import filters
from mtgpu.schedd.filters import BY_NAME, EVER_ORDER, FILTERS, Check, Filter, Layout, Usage
from mtgpu.schedd.placement import Plan, explain, feasible_ever
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
EXCL, SHARED, OVER = GpuMode.EXCLUSIVE, GpuMode.SHARED, GpuMode.OVERCOMMIT


def gpu(index: int, vram: int = 80, used: int = 0, committed: int = 0, **kw: Any) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        brand=kw.pop("brand", "nvidia"),
        type=kw.pop("type", "a100"),
        vram_total=vram * G,
        vram_used=used * G,
        vram_committed=committed * G,
        **kw,
    )


def member(name: str = "a", gpus: tuple[GpuSnapshot, ...] = (), **kw: Any) -> NodeSnapshot:
    kw.setdefault("cpus", 16)
    kw.setdefault("ram_total", 64 * G)
    return NodeSnapshot(name=name, gpus=gpus, **kw)


@dataclass(frozen=True)
class Row:
    """Member ``a`` (the first of ``cluster``) against ``req``: does ``name`` pass it now, ever?"""

    name: str
    what: str
    cluster: tuple[NodeSnapshot, ...]
    req: ResourceRequest
    now: bool
    ever: bool
    excluded: frozenset[int] = field(default_factory=frozenset)


TWO = (gpu(0), gpu(1))
ROWS = [
    Row("server_pin", "not pinned", (member(), member("b")), ResourceRequest(servers=("b",)), False, False),
    Row("server_pin", "pinned", (member(), member("b")), ResourceRequest(servers=("a",)), True, True),
    Row("server_pin", "no pin", (member(),), ResourceRequest(), True, True),
    Row("reserved", "kept for another job", (member(),), ResourceRequest(), False, True, frozenset({0})),
    Row("reserved", "not kept", (member(),), ResourceRequest(), True, True),
    Row("gpu_model", "too few at all", (member(gpus=TWO),), ResourceRequest(gpus=3), False, False),
    Row(
        "gpu_model", "other type", (member(gpus=TWO),), ResourceRequest(gpus=1, gpu_type="h100"), False, False
    ),
    Row("gpu_model", "enough", (member(gpus=TWO),), ResourceRequest(gpus=2, gpu_brand="nvidia"), True, True),
    Row("node_state", "drained", (member(state=NodeState.DRAIN),), ResourceRequest(), False, True),
    Row("node_state", "down", (member(state=NodeState.DOWN),), ResourceRequest(), False, True),
    Row("node_state", "up", (member(),), ResourceRequest(), True, True),
    Row(
        "member_held",
        "held whole",
        (member(whole_job="j1", cpus_committed=16),),
        ResourceRequest(),
        False,
        True,
    ),
    Row("member_held", "not held", (member(),), ResourceRequest(), True, True),
    Row(
        "member_busy",
        "runs a job",
        (member(cpus_committed=1),),
        ResourceRequest(whole_member=True),
        False,
        True,
    ),
    Row(
        "member_busy",
        "shares a GPU",
        (member(gpus=(gpu(0, shared_jobs=1),)),),
        ResourceRequest(whole_member=True),
        False,
        True,
    ),
    Row("member_busy", "idle", (member(),), ResourceRequest(whole_member=True), True, True),
    Row("member_busy", "not asked", (member(cpus_committed=1),), ResourceRequest(), True, True),
    Row("cpus", "committed", (member(cpus_committed=14),), ResourceRequest(cpus=4), False, True),
    Row("cpus", "too few at all", (member(),), ResourceRequest(cpus=32), False, False),
    Row("cpus", "enough", (member(cpus_committed=12),), ResourceRequest(cpus=4), True, True),
    Row("ram", "measured", (member(ram_used=60 * G),), ResourceRequest(ram=8 * G), False, True),
    Row("ram", "committed", (member(ram_committed=60 * G),), ResourceRequest(ram=8 * G), False, True),
    Row("ram", "too little at all", (member(),), ResourceRequest(ram=128 * G), False, False),
    Row("ram", "enough", (member(ram_used=8 * G),), ResourceRequest(ram=8 * G), True, True),
    Row(
        "gpu_count",
        "held whole",
        (member(gpus=(gpu(0, exclusive_job="j1"), gpu(1))),),
        ResourceRequest(gpus=2),
        False,
        True,
    ),
    Row(
        "gpu_count",
        "shared, exclusive asked",
        (member(gpus=(gpu(0, shared_jobs=1),)),),
        ResourceRequest(gpus=1),
        False,
        True,
    ),
    Row(
        "gpu_count",
        "shared, shared asked",
        (member(gpus=(gpu(0, shared_jobs=1),)),),
        ResourceRequest(gpus=1, gpu_mode=SHARED, vram=G),
        True,
        True,
    ),
    Row(
        "gpu_count",
        "held, overcommit asked",
        (member(gpus=(gpu(0, exclusive_job="j1"),)),),
        ResourceRequest(gpus=1, gpu_mode=OVER, vram=G),
        False,
        True,
    ),
    Row(
        "vram",
        "shared: committed",
        (member(gpus=(gpu(0, committed=70),)),),
        ResourceRequest(gpus=1, gpu_mode=SHARED, vram=20 * G),
        False,
        True,
    ),
    Row(
        "vram",
        "shared: measured",
        (member(gpus=(gpu(0, used=70),)),),
        ResourceRequest(gpus=1, gpu_mode=SHARED, vram=20 * G),
        False,
        True,
    ),
    Row(
        "vram",
        "overcommit: committed is no bar",
        (member(gpus=(gpu(0, committed=70),)),),
        ResourceRequest(gpus=1, gpu_mode=OVER, vram=20 * G),
        True,
        True,
    ),
    Row(
        "vram",
        "overcommit: measured",
        (member(gpus=(gpu(0, used=70),)),),
        ResourceRequest(gpus=1, gpu_mode=OVER, vram=20 * G),
        False,
        True,
    ),
    Row(
        "vram",
        "exclusive with vram=",
        (member(gpus=(gpu(0, used=70),)),),
        ResourceRequest(gpus=1, vram=20 * G),
        False,
        True,
    ),
    Row(
        "vram",
        "exclusive without vram=",
        (member(gpus=(gpu(0, used=70),)),),
        ResourceRequest(gpus=1),
        True,
        True,
    ),
    Row(
        "vram",
        "too small at all",
        (member(gpus=TWO),),
        ResourceRequest(gpus=1, gpu_mode=SHARED, vram=100 * G),
        False,
        False,
    ),
]


def checks(row: Row) -> tuple[Check, Check]:
    snapshot = ClusterSnapshot(nodes=row.cluster)
    layout = Layout(snapshot)
    return Check(layout, Usage(snapshot), row.req, excluded=row.excluded), Check(
        layout, layout.empty, row.req
    )


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.name}: {r.what}" for r in ROWS])
def test_filter_table(row: Row) -> None:
    f = BY_NAME[row.name]
    now, ever = checks(row)
    assert (f.keep(now, [0]) == [0]) is row.now
    assert (f.ever(ever, [0]) == [0]) is row.ever


# The rows where this filter alone turns member ``a`` away: what the tenant is told.
ALONE = [r for r in ROWS if not r.now and len(r.cluster) == 1 and not r.excluded]


@pytest.mark.parametrize("row", ALONE, ids=[f"{r.name}: {r.what}" for r in ALONE])
def test_filter_reason(row: Row) -> None:
    f = BY_NAME[row.name]
    now, ever = checks(row)
    # It is the first filter to refuse (the one a decision counts).
    assert [g.name for g in FILTERS if g.applies(now) and g.keep(now, [0]) != [0]][0] == row.name
    snapshot = ClusterSnapshot(nodes=row.cluster)
    got = explain(snapshot, PendingJob(job_id="j9", tenant="t", request=row.req))
    assert isinstance(got, Reason)
    never = feasible_ever(snapshot, row.req)
    if not row.ever:
        assert never is not None and got == never
        assert got.code == "BadConstraints" and dict(got.per_filter_counts) == {row.name: 1}
        assert got.message == f.never(ever, [0], [0])
        return
    assert never is None
    assert got.per_filter_counts.get(row.name) == 1
    if row.name == "node_state":
        assert got.code == "ReqNodeNotAvail" and "down or drained (a)" in got.message
    else:
        label = "" if row.req.gpu_label() == "any" else row.req.gpu_label()
        assert got.code == "Resources"
        assert f"(of 1 members: 1 {f.text.format(label=label).replace('  ', ' ')})" in got.message


def test_reserved_reason() -> None:
    # A member kept for a higher-priority job (the queue's reservation).
    snapshot = ClusterSnapshot(nodes=(member(),))
    got = Plan(snapshot).place(PendingJob(job_id="j9", tenant="t", request=ResourceRequest()), exclude=("a",))
    assert isinstance(got, Reason) and got.code == "Resources"
    assert dict(got.per_filter_counts) == {"reserved": 1}
    assert "1 are reserved for a higher-priority job" in got.message


def test_registry() -> None:
    names = [f.name for f in FILTERS]
    assert len(set(names)) == len(names) and set(BY_NAME) == set(names)
    assert sorted(EVER_ORDER, key=lambda f: names.index(f.name)) == list(FILTERS)
    assert len({f.ever_order for f in FILTERS}) == len(FILTERS)
    assert all(f.text for f in FILTERS)
    # Every filter has rows that it passes and rows that it refuses.
    for name in names:
        assert {r.now for r in ROWS if r.name == name} == {True, False}, name


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, set[str]]]:
    """Which filters' keep and ever ran, by name."""
    seen: dict[str, set[str]] = {"keep": set(), "ever": set()}
    for f in FILTERS:
        for how in ("keep", "ever"):
            orig = getattr(f, how)

            def spy(c: Check, members: list[int], f: Filter = f, how: str = how, orig: Any = orig) -> Any:
                seen[how].add(f.name)
                return orig(c, members)

            monkeypatch.setattr(f, how, spy)
    yield seen


def test_every_filter_on_every_path(calls: dict[str, set[str]]) -> None:
    """One registry: a decision, a refusal's reason and "could it ever" all walk it."""
    everything = set(BY_NAME)
    # Every filter has something to say: pinned, reserved, a down member, GPUs, whole members.
    snapshot = ClusterSnapshot(
        nodes=(
            member("a", gpus=TWO, cpus_committed=2),
            member("b", gpus=TWO, state=NodeState.DOWN),
            member("c", gpus=TWO),
        )
    )
    req = ResourceRequest(gpus=1, whole_member=True, servers=("b", "c"))
    got = Plan(snapshot).place(PendingJob(job_id="j8", tenant="t", request=req), exclude=("a",))
    assert isinstance(got, Placement) and got.nodes == ("c",)
    assert calls["keep"] == everything  # a decision
    calls["keep"].clear()
    req = dataclasses.replace(req, servers=("a", "b"))
    got = Plan(snapshot).place(PendingJob(job_id="j9", tenant="t", request=req), exclude=("c",))
    # a runs other work, b is down.
    assert isinstance(got, Reason) and got.code == "Resources"
    assert dict(got.per_filter_counts) == {"node_state": 1, "member_busy": 1, "server_pin": 1}
    assert calls["ever"] == everything  # "could it ever run"
    calls["ever"].clear()
    # Only b could run it, and it is down: named by the same filters' "ever" rules.
    req = dataclasses.replace(req, servers=("b",))
    got = explain(snapshot, PendingJob(job_id="j9", tenant="t", request=req))
    assert isinstance(got, Reason) and got.code == "ReqNodeNotAvail" and "(b)" in got.message
    assert calls["ever"] == everything
    calls["ever"].clear()
    assert feasible_ever(ClusterSnapshot(nodes=snapshot.nodes), req) is None
    assert calls["ever"] == everything


def test_fits_uses_the_filters(calls: dict[str, set[str]]) -> None:
    """An exact placement is checked by the same filters (the queue's reservations)."""
    snapshot = ClusterSnapshot(nodes=(member("a", gpus=TWO),))
    plan = Plan(snapshot)
    got = plan.place(PendingJob(job_id="j1", tenant="t", request=ResourceRequest(gpus=1, whole_member=True)))
    assert not isinstance(got, Reason)
    calls["keep"].clear()
    assert plan.fits(got)
    assert {"gpu_model", "member_held", "member_busy", "cpus", "ram", "gpu_count", "vram"} <= calls["keep"]
    plan.commit(got)
    assert not plan.fits(got)


def test_check_node_names_the_first() -> None:
    snapshot = ClusterSnapshot(nodes=(member(cpus_committed=16, ram_used=64 * G),))
    layout = Layout(snapshot)
    assert filters.check_node(layout, Usage(snapshot), 0, ResourceRequest()) == ("cpus", ())
