"""The pending queue and scheduling passes: order, aging, reservation, backfill, arrays."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtgpu.schedd.jobfile import parse_job_file
from mtgpu.schedd.placement import feasible_ever, snapshot_with_allocations
from mtgpu.schedd.queue import PendingQueue, QueuePolicy, pending_jobs, schedule_pass
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
    ResourceRequest,
)

G = 1 << 30
H = 3600.0


def node(name: str, n_gpus: int = 4, cpus: int = 32, ram: int = 256, vram: int = 80) -> NodeSnapshot:
    return NodeSnapshot(
        name=name,
        cpus=cpus,
        ram_total=ram * G,
        gpus=tuple(
            GpuSnapshot(index=i, brand="nvidia", type="a100", vram_total=vram * G) for i in range(n_gpus)
        ),
    )


def pj(
    job_id: str, submit: float = 0.0, priority: int = 50, limit: float | None = H, **req: Any
) -> PendingJob:
    req.setdefault("ram", G)
    return PendingJob(
        job_id=job_id,
        tenant="ann",
        request=ResourceRequest(**req),
        priority=priority,
        submit_time=submit,
        time_limit=limit,
    )


def task(array_id: str, index: int, limit: int | None, submit: float = 0.0, **req: Any) -> PendingJob:
    req.setdefault("ram", G)
    return PendingJob(
        job_id=f"{array_id}_{index}",
        tenant="ann",
        request=ResourceRequest(**req),
        submit_time=submit,
        time_limit=H,
        array_id=array_id,
        array_task=index,
        array_limit=limit,
    )


def cluster(nodes: list[NodeSnapshot], allocations: list[Allocation]) -> ClusterSnapshot:
    """Members with these allocations committed on them."""
    return snapshot_with_allocations(nodes, allocations)


def queue_of(*jobs: PendingJob) -> PendingQueue:
    q = PendingQueue()
    for j in jobs:
        q.add(j)
    return q


def running(
    job_id: str, node_name: str, gpu_indices: tuple[int, ...], end: float | None, array_id: str | None = None
) -> Allocation:
    member = MemberPlacement(node=node_name, rank=0, gpu_indices=gpu_indices, cpus=1, ram=G)
    return Allocation(Placement(job_id, GpuMode.EXCLUSIVE, (member,)), end, array_id)


# ------------------------------------------------------------------- the queue itself


def test_order_is_priority_then_submit_time() -> None:
    q = queue_of(
        pj("a", submit=10, priority=10),
        pj("b", submit=20, priority=50),
        pj("c", submit=5, priority=50),
        pj("d", submit=1, priority=10),
    )
    assert [j.job_id for j in q.jobs()] == ["c", "b", "d", "a"]


def test_aging_makes_an_old_low_priority_job_overtake() -> None:
    # 10 points an hour: a priority-0 job catches up 50 points in 5 hours.
    q = queue_of(
        pj("low", submit=0, priority=0),
        pj("new", submit=5 * H + 60, priority=50),
        pj("older", submit=5 * H - 60, priority=50),
    )
    assert [j.job_id for j in q.jobs()] == ["older", "low", "new"]
    low = q.get("low")
    assert low is not None and q.effective_priority(low, 5 * H) == pytest.approx(50.0)


def test_add_remove_get_len() -> None:
    q = queue_of(pj("a"), pj("b", submit=1))
    assert len(q) == 2 and "a" in q and q.get("b") is not None
    with pytest.raises(ValueError, match="already pending"):
        q.add(pj("a"))
    assert q.remove("a") is not None and q.remove("a") is None
    assert [j.job_id for j in q.jobs()] == ["b"] and len(q) == 1 and q.get("a") is None


def test_out_of_order_submit_time_is_inserted_in_place() -> None:
    q = queue_of(pj("late", submit=100), pj("early", submit=1))  # e.g. a requeue, or a rebuild
    assert [j.job_id for j in q.jobs()] == ["early", "late"]


def test_array_tasks_form_one_entry_and_share_a_position() -> None:
    q = queue_of(pj("solo", submit=0), *[task("7", i, 2, submit=1) for i in (3, 1, 2)], pj("after", submit=2))
    assert [j.job_id for j in q.jobs()] == ["solo", "7_1", "7_2", "7_3", "after"]
    assert q.positions() == {"solo": 1, "7_1": 2, "7_2": 2, "7_3": 2, "after": 3}
    assert q.remove("7_1") is not None and q.get("7_2") is not None
    q.remove("7_2")
    q.remove("7_3")
    assert q.positions() == {"solo": 1, "after": 2}
    q.add(task("7", 9, 2, submit=1))  # a task coming back makes the entry again
    assert q.positions()["7_9"] == 2


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 30), st.integers(0, 3), st.integers(0, 20)), max_size=120
    )
)
def test_queue_order_matches_a_sorted_list(ops: list[tuple[bool, int, int, int]]) -> None:
    q = PendingQueue()
    ref: dict[str, PendingJob] = {}
    for add, ident, prio, submit in ops:
        jid = f"j{ident}"
        if add and jid not in ref:
            ref[jid] = pj(jid, submit=float(submit), priority=prio * 10)
            q.add(ref[jid])
        elif not add:
            assert (q.remove(jid) is not None) == (ref.pop(jid, None) is not None)
    got = [j.job_id for j in q.jobs()]
    want = sorted(ref.values(), key=lambda j: (-(j.priority - q.age_weight * j.submit_time), j.submit_time))
    assert sorted(got) == sorted(ref) and len(q) == len(ref)
    keys = [(-(ref[j].priority - q.age_weight * ref[j].submit_time), ref[j].submit_time) for j in got]
    assert keys == sorted(keys) and [k for k in keys] == [
        (-(j.priority - q.age_weight * j.submit_time), j.submit_time) for j in want
    ]


def test_pending_jobs_from_a_spec() -> None:
    spec = parse_job_file("#MTGPU gpus=1 array=0-3%2 priority=10 time=1h\nrun\n", default_workdir="/h")
    jobs = pending_jobs("42", "ann", spec, 100.0)
    assert [j.job_id for j in jobs] == ["42_0", "42_1", "42_2", "42_3"]
    assert all(
        j.array_id == "42"
        and j.array_limit == 2
        and j.priority == 10
        and j.time_limit == 3600
        and j.submit_time == 100.0
        and j.request == spec.request
        for j in jobs
    )
    single = pending_jobs("43", "ann", parse_job_file("#MTGPU cpus=2\n", default_workdir="/h"), 1.0)
    assert [(j.job_id, j.array_id) for j in single] == [("43", None)]


# ------------------------------------------------------------------- one pass


def test_pass_places_in_order_and_reports_the_rest() -> None:
    snap = ClusterSnapshot(nodes=(node("a", 2),))
    q = queue_of(pj("1", gpus=1), pj("2", submit=1, gpus=1), pj("3", submit=2, gpus=1))
    r = schedule_pass(snap, q, 10.0)
    assert [p.job_id for p in r.placements] == ["1", "2"]
    assert r.pending["3"].reason == "Resources" and r.pending["3"].position == 1
    assert r.complete and r.examined == 3
    assert len(q) == 3  # the pass changes nothing; the caller removes what it starts


def test_bad_constraints_waits_without_holding_the_reservation() -> None:
    snap = cluster([node("a", 2)], [running("r", "a", (0, 1), 100.0)])
    q = queue_of(pj("never", gpus=8), pj("big", submit=1, gpus=2))
    r = schedule_pass(snap, q, 0.0)
    assert r.pending["never"].reason == "BadConstraints"
    assert r.reservation is not None and r.reservation.job_id == "big"
    assert r.pending["big"].expected_start == 100.0
    assert "reserved for it on a" in r.pending["big"].message


def test_easy_backfill_short_job_before_the_shadow_time() -> None:
    # Two members of 4 GPUs; 4 GPUs busy on "a" until t=1h. The head needs both members.
    snap = cluster([node("a"), node("b")], [running("r", "a", (0, 1, 2, 3), H)])
    q = queue_of(
        pj("head", gpus=4, nodes=2, limit=2 * H),
        pj("short", submit=1, gpus=2, limit=0.5 * H),
        pj("long", submit=2, gpus=2, limit=3 * H),
        pj("forever", submit=3, gpus=1, limit=None),
    )
    r = schedule_pass(snap, q, 0.0)
    assert [p.job_id for p in r.placements] == ["short"]
    assert r.reservation is not None and r.reservation.start_time == H
    assert r.pending["head"].reason == "Resources" and r.pending["head"].expected_start == H
    assert r.pending["long"].reason == "Priority" and r.pending["forever"].reason == "Priority"
    assert "reserved for job head" in r.pending["long"].message
    assert [r.pending[k].position for k in ("head", "long", "forever")] == [1, 2, 3]


def test_long_backfill_allowed_where_the_reservation_does_not_reach() -> None:
    # "c" is outside the reservation (the head needs 4 GPUs on one member, "a" frees at 1h).
    snap = cluster([node("a"), node("c", 2)], [running("r", "a", (0, 1, 2, 3), H)])
    q = queue_of(pj("head", gpus=4), pj("long", submit=1, gpus=2, limit=None))
    r = schedule_pass(snap, q, 0.0)
    assert [p.job_id for p in r.placements] == ["long"]
    assert r.placements[0].nodes == ("c",)


def test_backfill_moves_off_the_reserved_member() -> None:
    # Best fit alone would put "long" on the reserved "a"; the pass tries again elsewhere.
    snap = cluster([node("a"), node("b")], [running("r", "a", (0, 1), H), running("s", "b", (0,), None)])
    q = queue_of(pj("head", gpus=4), pj("long", submit=1, gpus=2, limit=None))
    r = schedule_pass(snap, q, 0.0)
    assert r.reservation is not None and r.reservation.placement.nodes == ("a",)
    assert [(p.job_id, p.nodes) for p in r.placements] == [("long", ("b",))]


def test_reservation_waits_for_unlimited_work() -> None:
    snap = cluster([node("a", 2)], [running("r", "a", (0,), None)])
    q = queue_of(pj("head", gpus=2), pj("short", submit=1, gpus=1, limit=60))
    r = schedule_pass(snap, q, 0.0)
    assert r.reservation is not None and r.reservation.start_time is None
    assert r.placements == []  # even a short job may not use what the head will need
    assert r.pending["short"].reason == "Priority"
    assert "once job r ends (no time limit)" in r.pending["head"].message
    assert "once job r ends (no time limit)" in r.pending["short"].message


def test_a_reason_names_only_what_really_blocks() -> None:
    """Nothing runs and nothing but the job's own size is in the way: the reason is not
    "work without a time limit" (there is none) but the rule that turned each member
    away."""
    busy = NodeSnapshot(
        name="w",
        cpus=8,
        ram_total=64 * G,
        gpus=(GpuSnapshot(index=0, brand="nvidia", type="a100", vram_total=80 * G, vram_used=75 * G),),
    )
    r = schedule_pass(cluster([busy], []), queue_of(pj("big", gpus=1, vram=40 * G)), 0.0)
    why = r.pending["big"]
    assert why.reason == "Resources" and "time limit" not in why.message, why.message
    assert "1 lack free VRAM" in why.message and r.reservation is None


def test_no_reservation_when_use_outside_mtgpu_blocks() -> None:
    # 70G of the card is used by a process MTGPU did not start; no job ending frees it.
    busy = NodeSnapshot(
        name="w",
        cpus=8,
        ram_total=64 * G,
        gpus=(GpuSnapshot(index=0, brand="nvidia", type="a100", vram_total=80 * G, vram_used=70 * G),),
    )
    snap = ClusterSnapshot(nodes=(busy, node("a", 1)))
    q = queue_of(
        pj("shared", gpus=1, gpu_mode=GpuMode.SHARED, vram=20 * G, servers=("w",)),
        pj("other", submit=1, gpus=1),
    )
    r = schedule_pass(snap, q, 0.0)
    assert r.reservation is None
    assert r.pending["shared"].reason == "Resources"
    assert [p.job_id for p in r.placements] == ["other"]


def test_pinned_to_a_drained_server() -> None:
    drained = dataclasses.replace(node("d"), state=NodeState.DRAIN)
    q = queue_of(pj("pinned", gpus=1, servers=("d",)), pj("free", submit=1, gpus=1))
    r = schedule_pass(ClusterSnapshot(nodes=(drained, node("a"))), q, 0.0)
    assert r.pending["pinned"].reason == "ReqNodeNotAvail"
    assert [p.job_id for p in r.placements] == ["free"] and r.reservation is None


def test_array_limit() -> None:
    snap = cluster([node("a", 8)], [running("9_0", "a", (0,), H, array_id="9")])
    q = queue_of(*[task("9", i, 3) for i in range(1, 10)], pj("other", submit=5, gpus=1))
    r = schedule_pass(snap, q, 0.0)
    assert [p.job_id for p in r.placements] == ["9_1", "9_2", "other"]
    info = r.pending["9"]
    assert info.reason == "JobArrayTaskLimit" and info.array_tasks == 7 and info.position == 1
    assert "%3 limit" in info.message


def test_array_without_limit_runs_what_fits() -> None:
    snap = ClusterSnapshot(nodes=(node("a", 2),))
    q = queue_of(*[task("5", i, None, gpus=1) for i in range(4)])
    r = schedule_pass(snap, q, 0.0)
    assert [p.job_id for p in r.placements] == ["5_0", "5_1"]
    assert r.pending["5"].reason == "Resources" and r.pending["5"].array_tasks == 2
    assert r.pending["5"].message.startswith("next task 5_2: ")


def test_max_examined() -> None:
    snap = ClusterSnapshot(nodes=(node("a", 1),))
    q = queue_of(*[pj(f"j{i}", submit=i, gpus=1) for i in range(10)])
    r = schedule_pass(snap, q, 0.0, QueuePolicy(max_examined=4))
    assert r.examined == 4 and not r.complete
    assert len(r.placements) == 1 and set(r.pending) == {"j1", "j2", "j3"}


def test_max_placements_bounds_a_pass_and_the_next_places_the_rest() -> None:
    snap = ClusterSnapshot(nodes=tuple(node(f"n{i}", 4) for i in range(10)))
    q = queue_of(*[task("7", i, None, gpus=1) for i in range(30)], pj("solo", submit=1, gpus=1))
    policy = QueuePolicy(max_placements=12)
    first = schedule_pass(snap, q, 0.0, policy)
    assert [p.job_id for p in first.placements] == [f"7_{i}" for i in range(12)]
    assert not first.complete and "7" not in first.pending  # not waiting: not reached yet
    for p in first.placements:
        q.remove(p.job_id)
    allocs = [Allocation(p, None, "7") for p in first.placements]
    second = schedule_pass(snapshot_with_allocations(snap.nodes, allocs), q, 0.0, policy)
    assert [p.job_id for p in second.placements] == [f"7_{i}" for i in range(12, 24)]
    for p in second.placements:
        q.remove(p.job_id)
    allocs += [Allocation(p, None, "7") for p in second.placements]
    third = schedule_pass(snapshot_with_allocations(snap.nodes, allocs), q, 0.0, policy)
    assert [p.job_id for p in third.placements] == [f"7_{i}" for i in range(24, 30)] + ["solo"]
    assert third.complete and not third.pending


def test_a_bigger_request_of_the_same_kind_is_refused_without_a_search() -> None:
    snap = cluster([node("a", 2, cpus=4)], [running("r", "a", (0, 1), None)])
    q = queue_of(pj("head", gpus=1), pj("x", submit=1, gpus=1, cpus=2), pj("y", submit=2, gpus=2, cpus=1))
    r = schedule_pass(snap, q, 0.0)
    assert r.pending["x"].reason == "Priority" or r.pending["x"].reason == "Resources"
    assert "even 1 GPU" in r.pending["y"].message


def test_pass_is_deterministic() -> None:
    def run() -> list[tuple[str, tuple[str, ...]]]:
        snap = ClusterSnapshot(nodes=tuple(node(f"n{i}") for i in range(4)))
        q = queue_of(*[pj(f"j{i}", submit=i, gpus=1 + i % 3) for i in range(12)])
        return [(p.job_id, p.nodes) for p in schedule_pass(snap, q, 0.0).placements]

    assert run() == run()


# ------------------------------------------------------------------- simulations


@dataclass
class Sim:
    """Runs passes over time the way the daemon will: start, end, pass again."""

    nodes: list[NodeSnapshot]
    queue: PendingQueue = field(default_factory=PendingQueue)
    runtime: dict[str, float] = field(default_factory=dict)  # how long each job really runs
    jobs: dict[str, PendingJob] = field(default_factory=dict)
    active: list[tuple[Allocation, float]] = field(default_factory=list)  # (allocation, real end)
    started: dict[str, float] = field(default_factory=dict)
    promised: dict[str, float] = field(default_factory=dict)  # first start promised to a head

    def submit(self, job: PendingJob, runtime: float) -> None:
        self.queue.add(job)
        self.jobs[job.job_id] = job
        self.runtime[job.job_id] = runtime

    def step(self, now: float) -> None:
        self.active = [(a, end) for a, end in self.active if end > now]
        snap = snapshot_with_allocations(self.nodes, [a for a, _ in self.active])
        self.check(snap)
        result = schedule_pass(snap, self.queue, now)
        if result.reservation is not None and result.reservation.start_time is not None:
            self.promised.setdefault(result.reservation.job_id, result.reservation.start_time)
        for p in result.placements:
            job = self.jobs[p.job_id]
            self.queue.remove(p.job_id)
            self.started[p.job_id] = now
            end = None if job.time_limit is None else now + job.time_limit
            self.active.append((Allocation(p, end, job.array_id), now + self.runtime[p.job_id]))
        self.check(snapshot_with_allocations(self.nodes, [a for a, _ in self.active]))

    @staticmethod
    def check(snap: ClusterSnapshot) -> None:
        per_array: dict[str, int] = defaultdict(int)
        for a in snap.running:
            if a.array_id:
                per_array[a.array_id] += 1
        for n in snap.nodes:
            assert n.cpus_committed <= n.cpus and n.ram_committed <= n.ram_total
            for g in n.gpus:
                assert g.vram_committed <= g.vram_total
                assert not (g.exclusive_job and g.shared_jobs)


def test_big_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    # Small one-GPU jobs keep every GPU busy. Without a reservation each GPU that frees
    # would go to the next small job and the 8-GPU job would never find 8 at once.
    sim = Sim([node("a"), node("b")])
    t, k = 0.0, 0
    while t < 4 * H and "big" not in sim.started:
        if t == 600:
            sim.submit(pj("big", submit=t, priority=60, gpus=4, nodes=2, limit=2 * H), 2 * H)
        for _ in range(3):  # three small jobs a minute, each asking for (and using) 30 minutes
            sim.submit(pj(f"s{k}", submit=t, gpus=1, limit=0.5 * H), 0.5 * H)
            k += 1
        sim.step(t)
        t += 60
    assert "big" in sim.started
    assert sim.started["big"] <= sim.promised["big"]
    assert sim.started["big"] <= 600 + 0.5 * H  # as soon as the small jobs running at 600 s end
    started_small_after_big = [
        j for j, when in sim.started.items() if j.startswith("s") and 600 < when < sim.started["big"]
    ]
    # Meanwhile small jobs still ran, but only those that end before the big one starts.
    assert all(sim.started[j] + 0.5 * H <= sim.started["big"] for j in started_small_after_big)


def test_aging_lets_a_low_priority_job_through() -> None:
    sim = Sim([node("a", 1)])
    sim.submit(pj("low", submit=0, priority=0, gpus=1, limit=600), 600)
    t = 0.0
    k = 0
    while t < 12 * H and "low" not in sim.started:
        if k * 600 <= t:  # a default-priority job every 10 minutes, each running 10 minutes
            sim.submit(pj(f"n{k}", submit=t, gpus=1, limit=600), 600)
            k += 1
        sim.step(t)
        t += 60
    assert "low" in sim.started
    assert 5 * H <= sim.started["low"] <= 6 * H  # 50 points at 10 an hour, then its turn


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[PendingJob, float]]:
    out = []
    for k in range(draw(st.integers(1, 25))):
        gpus = draw(st.integers(0, 4))
        mode = draw(st.sampled_from(list(GpuMode))) if gpus else GpuMode.EXCLUSIVE
        vram = draw(st.sampled_from((10, 40))) * G if mode is not GpuMode.EXCLUSIVE else 0
        limit = draw(st.sampled_from((600.0, 1800.0, 3600.0, None)))
        runtime = draw(st.sampled_from((0.3, 0.7, 1.0))) * (limit or 5400.0)
        req = ResourceRequest(
            gpus=gpus,
            gpu_mode=mode,
            vram=vram,
            cpus=draw(st.sampled_from((1, 8, 16))),
            ram=G,
            nodes=draw(st.sampled_from((1, 1, 2))),
        )
        array = draw(st.sampled_from((None, None, None, 2)))
        if array:
            # Arrays come last in the queue (see the promise check below).
            for i in range(3):
                out.append(
                    (
                        PendingJob(
                            f"{k}_{i}",
                            "t",
                            req,
                            priority=0,
                            submit_time=1.0,
                            time_limit=limit,
                            array_id=str(k),
                            array_task=i,
                            array_limit=array,
                        ),
                        runtime,
                    )
                )
        else:
            out.append(
                (
                    PendingJob(
                        str(k),
                        "t",
                        req,
                        priority=draw(st.sampled_from((0, 50))),
                        submit_time=0.0,
                        time_limit=limit,
                    ),
                    runtime,
                )
            )
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=workloads())
def test_random_workloads_keep_every_promise(work: list[tuple[PendingJob, float]]) -> None:
    """Everything submitted at once, jobs ending within their limits: nothing is ever
    oversubscribed, array limits hold, every job runs, and no head starts later than the
    first time it was promised.

    Reservations are worked out afresh each pass, so a task of a throttled array ahead of
    the head may take the head's place once its array has room, as in Slurm; the promise
    check therefore covers the jobs queued ahead of every array.
    """
    sim = Sim([node("a", 4, cpus=16), node("b", 2, cpus=16)])
    base = ClusterSnapshot(nodes=tuple(sim.nodes))
    for job, runtime in work:
        if feasible_ever(base, job.request) is None:  # the rest are refused at submit
            sim.submit(job, runtime)
    t = 0.0
    while len(sim.queue) and t < 100 * H:
        sim.step(t)
        running_per_array: dict[str, int] = defaultdict(int)
        for alloc, _ in sim.active:
            if alloc.array_id:
                running_per_array[alloc.array_id] += 1
        assert all(n <= 2 for n in running_per_array.values())
        ends = [end for _, end in sim.active if end > t]
        t = min(ends) if ends else t + 60  # jump to the next job end
    assert len(sim.queue) == 0, [j.job_id for j in sim.queue.jobs()]
    for job_id, promise in sim.promised.items():
        if sim.jobs[job_id].array_id is None:
            assert sim.started[job_id] <= promise + 1e-6, (job_id, sim.started[job_id], promise)


# --------------------------------------------------------------- whole members (--exclusive)


def test_a_whole_member_job_at_the_head_is_not_starved_by_small_jobs() -> None:
    # One member, a small job on it until 1h; the head wants the member whole. A stream
    # of small jobs that would still run at 1h must not start there; one that ends
    # before may (EASY backfill).
    snap = cluster([node("a")], [running("r", "a", (0,), H)])
    q = queue_of(
        pj("whole", whole_member=True, limit=2 * H),
        pj("small", submit=1, gpus=1, limit=2 * H),
        pj("quick", submit=2, gpus=1, limit=0.5 * H),
        pj("forever", submit=3, cpus=1, limit=None),
    )
    r = schedule_pass(snap, q, 0.0)
    assert r.reservation is not None and r.reservation.job_id == "whole"
    assert r.reservation.start_time == H and r.reservation.placement.whole_member
    assert [p.job_id for p in r.placements] == ["quick"]
    assert r.pending["small"].reason == "Priority" and r.pending["forever"].reason == "Priority"
    assert "reserved for job whole" in r.pending["small"].message
    assert "run other jobs" in r.pending["whole"].message


def test_a_failed_whole_member_request_does_not_turn_away_a_bigger_ordinary_one() -> None:
    # A whole-member request of 1 CPU finds no idle member; an ordinary request of 2
    # CPUs still fits beside the running job (the two are not of one kind).
    snap = cluster([node("a")], [running("r", "a", (0,), None)])
    q = queue_of(pj("whole", whole_member=True, limit=None), pj("two", submit=1, cpus=2, limit=None))
    r = schedule_pass(snap, q, 0.0, QueuePolicy(reserve_attempts=0))
    assert [p.job_id for p in r.placements] == ["two"]
    assert r.pending["whole"].reason == "Resources"
