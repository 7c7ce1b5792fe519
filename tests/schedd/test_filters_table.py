"""The placement filters one by one: rows of (member, request) -> passes now / could ever,
and the words the pending reason uses; and the registry that every path walks."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mtgpu.schedd import filters
from mtgpu.schedd.filters import BY_NAME, EVER_ORDER, FILTERS, Check, Filter, Layout, Usage
from mtgpu.schedd.placement import Plan, explain, feasible_ever
from mtgpu.schedd.queue import PendingQueue, schedule_pass
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
    Row("excluded", "named", (member(), member("b")), ResourceRequest(exclude=("a",)), False, False),
    Row("excluded", "the only member, named", (member(),), ResourceRequest(exclude=("a",)), False, False),
    Row("excluded", "another named", (member(), member("b")), ResourceRequest(exclude=("b",)), True, True),
    Row("excluded", "no member named", (member(),), ResourceRequest(exclude=("zz",)), True, True),
    Row("constraint", "lacks it", (member(features=("x",)),), ResourceRequest(constraint="y"), False, False),
    Row(
        "constraint",
        "lacks one of all",
        (member(features=("x",)),),
        ResourceRequest(constraint="x&y"),
        False,
        False,
    ),
    Row(
        "constraint", "has all", (member(features=("x", "y")),), ResourceRequest(constraint="x&y"), True, True
    ),
    Row(
        "constraint",
        "has one of any",
        (member(features=("x",)),),
        ResourceRequest(constraint="y|x"),
        True,
        True,
    ),
    Row("constraint", "none asked", (member(features=("x",)),), ResourceRequest(), True, True),
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


def _busy_and_two_others(**features: tuple[str, ...]) -> ClusterSnapshot:
    """Member ``a`` with its one GPU held by another job, ``b`` and ``c`` idle."""
    return ClusterSnapshot(
        nodes=(
            member("a", gpus=(gpu(0, exclusive_job="other"),), features=features.get("a", ())),
            member("b", gpus=(gpu(0),), features=features.get("b", ())),
            member("c", gpus=(gpu(0),), features=features.get("c", ())),
        )
    )


def _seen(snapshot: ClusterSnapshot, req: ResourceRequest) -> list[tuple[str, str, dict[str, int]]]:
    """The pending reason of a job alone in the queue, as the scheduler's pass gives it
    (what ``mt-job list`` and ``mt-job show`` print), and as ``explain`` gives it."""
    job = PendingJob(job_id="9", tenant="t", request=req)
    queue = PendingQueue()
    queue.add(job)
    info = schedule_pass(snapshot, queue, 0.0).pending["9"]
    got = explain(snapshot, job)
    assert isinstance(got, Reason)
    return [
        (info.reason, info.message, dict(info.per_filter_counts)),
        (got.code, got.message, dict(got.per_filter_counts)),
    ]


def test_constraint_reason() -> None:
    """A job with --constraint and nothing else queued: the members without the features
    are counted under --constraint, not as reserved for a higher-priority job."""
    for code, message, counts in _seen(
        _busy_and_two_others(a=("fast",)), ResourceRequest(gpus=1, constraint="fast")
    ):
        assert code == "Resources" and counts == {"constraint": 2, "gpu_count": 1}
        assert (
            "(of 3 members: 2 lack the features asked by --constraint, 1 have too few free GPUs)" in message
        )
        assert "reserved" not in message and "with features fast" in message


def test_exclude_reason() -> None:
    """A job with --exclude and nothing else queued: the members it names are counted
    under --exclude, not as reserved for a higher-priority job."""
    for code, message, counts in _seen(_busy_and_two_others(), ResourceRequest(gpus=1, exclude=("b", "c"))):
        assert code == "Resources" and counts == {"excluded": 2, "gpu_count": 1}
        assert "(of 3 members: 2 are excluded by --exclude, 1 have too few free GPUs)" in message
        assert "reserved" not in message


def test_own_exclusions_come_before_a_reservation() -> None:
    """A member both kept for another job and left out by the job itself counts as the
    job's own choice; only the rest count as reserved."""
    snapshot = _busy_and_two_others(a=("fast",), b=("fast",))
    req = ResourceRequest(gpus=1, constraint="fast", exclude=("b",))
    got = Plan(snapshot).place(PendingJob(job_id="9", tenant="t", request=req), exclude=("b", "c"))
    assert isinstance(got, Reason) and got.code == "Resources"
    assert dict(got.per_filter_counts) == {"excluded": 1, "constraint": 1, "gpu_count": 1}
    got = Plan(snapshot).place(
        PendingJob(job_id="9", tenant="t", request=ResourceRequest(gpus=1, constraint="fast")), exclude=("b",)
    )
    assert isinstance(got, Reason)
    assert dict(got.per_filter_counts) == {"constraint": 1, "reserved": 1, "gpu_count": 1}
    assert "1 are reserved for a higher-priority job" in got.message


def test_exclude_and_constraint_never() -> None:
    """An impossible --exclude or --constraint is refused by the filter that makes it so,
    in its own words."""
    snapshot = _busy_and_two_others(a=("fast",), b=("nvme",))
    for req, message, counts in (
        (
            ResourceRequest(gpus=1, constraint="mi300"),
            "--constraint=mi300: only 0 member(s) of this cluster qualify, and it needs 1 "
            "(features of the members it may use: fast, nvme)",
            {"constraint": 3},
        ),
        (
            ResourceRequest(gpus=1, constraint="fast", exclude=("a",)),
            "--constraint=fast: only 0 member(s) of this cluster qualify, and it needs 1 "
            "(features of the members it may use: nvme)",
            {"constraint": 3},
        ),
        (
            ResourceRequest(gpus=1, nodes=2, constraint="fast|nvme", exclude=("b",)),
            "--constraint=fast|nvme: only 1 member(s) of this cluster qualify, and it needs 2",
            {"constraint": 2},
        ),
        (
            ResourceRequest(gpus=1, exclude=("a", "b", "c")),
            "--exclude: only 0 member(s) of this cluster qualify, and it needs 1",
            {"excluded": 3},
        ),
        (
            ResourceRequest(gpus=1, nodes=3, exclude=("a",)),
            "--exclude: only 2 member(s) of this cluster qualify, and it needs 3",
            {"excluded": 1},
        ),
        (
            ResourceRequest(gpus=1, nodes=2, servers=("a", "b"), exclude=("a",)),
            "--exclude: only 1 member(s) of this cluster qualify, and it needs 2",
            {"excluded": 2},
        ),
    ):
        never = feasible_ever(snapshot, req)
        assert never is not None and never.code == "BadConstraints", req
        assert (never.message, dict(never.per_filter_counts)) == (message, counts), req
        assert explain(snapshot, PendingJob(job_id="9", tenant="t", request=req)) == never
    # Every member has the features: the cluster is what is too small.
    snapshot = _busy_and_two_others(a=("x",), b=("x",), c=("x", "y"))
    never = feasible_ever(snapshot, ResourceRequest(nodes=4, constraint="x", exclude=("zz",)))
    assert never is not None and never.message.startswith("nodes=4 needs 4 members, and this cluster has 3 ")


# Each rule is written once: the exclusive-idle test of a GPU ("nobody holds it whole
# and no job shares it") and the server pin live in filters.py, and the planner's
# indexes, its commit and the rankers call them.
_PLACING = ("filters.py", "placement.py", "rankers.py")
_IDLE = re.compile(
    r"holder\[[^\]]+\]\s+is\s+None\s+and\s+not\s+[\w.]*shared\[|not\s+[\w.]*shared\[[^\]]+\]\s+and\s+[\w.]*holder\[[^\]]+\]\s+is\s+None"
)
_PIN = re.compile(r"for\s+\w+\s+in\s+[\w.]*\bservers\b")


def test_each_placement_rule_is_written_once() -> None:
    root = Path(filters.__file__).parent
    sources = {name: (root / name).read_text() for name in _PLACING}
    where = [(name, m.group(0)) for name, text in sources.items() for m in _IDLE.finditer(text)]
    assert len(where) == 1, f"the exclusive-idle GPU rule is written {len(where)} times: {where}"
    assert where[0][0] == "filters.py"
    pins = [(name, m.group(0)) for name, text in sources.items() for m in _PIN.finditer(text)]
    assert {name for name, _ in pins} == {"filters.py"}, f"the server pin outside ServerPin: {pins}"
    # The scan sees the forms the rule was written in.
    for text in (
        "[g for g in ids if holder[g] is None and not shared[g]]",
        "all(self.gpu_holder[g] is None and not self.gpu_shared[g] for g in x)",
        "not use.gpu_shared[g] and use.gpu_holder[g] is None",
    ):
        assert _IDLE.search(text), text
    assert _PIN.search("iter([layout.index_of[s] for s in req.servers if s in layout.index_of])")


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
    # Every filter has something to say: pinned, --exclude, --constraint, reserved, a
    # down member, GPUs, whole members.
    snapshot = ClusterSnapshot(
        nodes=(
            member("a", gpus=TWO, cpus_committed=2, features=("x",)),
            member("b", gpus=TWO, state=NodeState.DOWN, features=("x",)),
            member("c", gpus=TWO, features=("x", "y")),
        )
    )
    req = ResourceRequest(gpus=1, whole_member=True, servers=("b", "c"), exclude=("a",), constraint="x")
    got = Plan(snapshot).place(PendingJob(job_id="j8", tenant="t", request=req), exclude=("a",))
    assert isinstance(got, Placement) and got.nodes == ("c",)
    assert calls["keep"] == everything  # a decision
    calls["keep"].clear()
    req = dataclasses.replace(req, servers=("a", "b"), exclude=("c",))
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
