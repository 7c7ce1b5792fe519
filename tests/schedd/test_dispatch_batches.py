"""Starting placed jobs on other members: batched requests (the scheduler's side), the
member's ``job.dispatch`` for a batch, and its wait for the placement to reach its
replica (woken by the change, not polled)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mtgpu.api.dispatcher import Caller
from mtgpu.api.jobs import dispatch_op
from mtgpu.cluster.starts import StartBatcher
from mtgpu.errors import ApiError, MtgpuError
from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
from mtgpu.jobstate import PENDING
from mtgpu.schedd.jobtable import JobTable

PEER = Caller("mtgpu-peer.sched", 0, True, "peer")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _table_with(*ids: str) -> JobTable:
    t = JobTable()
    for jid in ids:
        t._put(
            {
                "job_id": jid,
                "state": PENDING,
                "user": "ann",
                "uid": 2000,
                "name": "j",
                "workdir": "/w",
                "submit_time": 1.0,
                "placement": None,
                "term": None,
                "spec": spec_to_dict(JobSpec(ResourceRequest(), "")),
            }
        )
    return t


def _place(t: JobTable, jid: str, term: int) -> None:
    j = t.get(jid)
    assert j is not None
    member = {"node": "m1", "rank": 0, "gpu_indices": [], "cpus": 1, "ram": 0, "vram_per_gpu": 0}
    placement = {"job_id": jid, "gpu_mode": "exclusive", "members": [member]}
    t._put({**j, "state": "RUNNING", "placement": placement, "term": term})


def test_a_lone_start_is_one_request_and_a_burst_rides_in_few() -> None:
    sent: list[tuple[str, list[str], int]] = []
    release = asyncio.Event

    async def go() -> None:
        gate = release()

        async def call(member, op, *, jobs, term, timeout, attempts):
            assert op == "job.dispatch"
            sent.append((member, list(jobs), term))
            await gate.wait()
            return {"started": jobs, "errors": {}}

        b = StartBatcher(call, batch=10, in_flight=1)
        first = asyncio.ensure_future(b.start("m1", "1", 7))
        await _settle()
        assert sent == [("m1", ["1"], 7)]  # sent at once, alone
        # While it is out, 25 more for m1 and one for m2 wait; m2's goes at once.
        rest = [asyncio.ensure_future(b.start("m1", str(k), 7)) for k in range(2, 27)]
        other = asyncio.ensure_future(b.start("m2", "x", 7))
        await _settle()
        assert sent[-1] == ("m2", ["x"], 7) and len(sent) == 2
        gate.set()
        await asyncio.gather(first, other, *rest)
        m1 = [jobs for member, jobs, _ in sent if member == "m1"]
        assert [len(j) for j in m1] == [1, 10, 10, 5]
        assert [i for j in m1 for i in j] == [str(k) for k in range(1, 27)]

    asyncio.run(go())


def test_each_part_gets_its_own_answer_and_terms_are_never_mixed() -> None:
    sent: list[tuple[list[str], int]] = []

    async def go() -> None:
        async def call(member, op, *, jobs, term, timeout, attempts):
            sent.append((list(jobs), term))
            await asyncio.sleep(0.01)
            if "down" in jobs:
                raise ApiError("member m1 is unreachable", "unreachable")
            return {"started": [j for j in jobs if j != "bad"], "errors": {"bad": "no such user"}}

        b = StartBatcher(call, in_flight=1)
        lone = asyncio.ensure_future(b.start("m1", "0", 1))
        await _settle()
        parts = [asyncio.ensure_future(b.start("m1", j, 1)) for j in ("ok", "bad")]
        parts.append(asyncio.ensure_future(b.start("m1", "new", 2)))
        res = await asyncio.gather(lone, *parts, return_exceptions=True)
        assert res[0] is None and res[1] is None
        assert isinstance(res[2], MtgpuError) and "no such user" in str(res[2])
        assert res[3] is None
        assert sent == [(["0"], 1), (["ok", "bad"], 1), (["new"], 2)]
        # A request that fails fails every part in it.
        with pytest.raises(MtgpuError, match="unreachable"):
            await b.start("m1", "down", 3)

    asyncio.run(go())


def test_a_member_starts_a_batch_once_each_placement_reaches_its_replica() -> None:
    t = _table_with("1", "2", "3")
    started: list[str] = []

    ports: dict[str, int] = {}

    async def start(job, term, port):
        ports[job.job_id] = port
        if job.job_id == "3":
            raise RuntimeError("the account cannot be created")
        started.append(job.job_id)

    op = dispatch_op(t, start)

    async def go() -> None:
        loop = asyncio.get_running_loop()

        # The placements are applied on another thread (as PySyncObj's does), later.
        def apply() -> None:
            for jid in ("1", "2", "3"):
                _place(t, jid, 5)

        loop.call_later(0.05, lambda: threading.Thread(target=apply).start())
        r = await asyncio.wait_for(op(PEER, {"jobs": ["1", "2", "3"], "term": 5, "ports": {"2": 31000}}), 5)
        assert sorted(r["started"]) == ["1", "2"] and sorted(started) == ["1", "2"]
        assert ports == {"1": 0, "2": 31000, "3": 0}  # the rank-0 member's pick, where given
        assert "account cannot be created" in r["errors"]["3"]
        with pytest.raises(ApiError, match="1 to"):
            await op(PEER, {"jobs": [], "term": 5})
        with pytest.raises(ApiError, match="ports must map"):
            await op(PEER, {"jobs": ["1"], "term": 5, "ports": {"1": 70000}})
        with pytest.raises(ApiError, match="only the scheduler"):
            await op(Caller("ann", 20001, False, "ssh"), {"jobs": ["1"], "term": 5})

    asyncio.run(go())


def test_waiting_for_a_job_is_woken_by_its_change_and_gives_up_at_its_timeout() -> None:
    t = _table_with("1")

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: threading.Thread(target=_place, args=(t, "1", 3)).start())
        began = loop.time()
        j = await t.wait_for("1", lambda j: j.get("term") == 3, timeout=30)
        assert j is not None and j["term"] == 3
        assert loop.time() - began < 20  # woken, not left to the timeout
        assert await t.wait_for("1", lambda j: j.get("term") == 4, timeout=0.05) is None
        assert t._waiters == {}  # nobody left waiting

    asyncio.run(go())
    # Who waits is this member's business: never in the replicated state.
    assert "_waiters" not in t._serialize() and "_wait_lock" not in t._serialize()


def test_a_start_of_an_attempt_requeued_since_is_stale() -> None:
    """The scheduler's start of attempt 0 arrives after the job was requeued and placed
    again (attempt 1): the member does not start attempt 1 on its strength."""
    t = _table_with("1")
    _place(t, "1", 5)
    t._put({**t.get("1"), "cancel_requested": False, "reason": ""})
    t.requeue("1", "drained now", 3.0, 0, _doApply=True)
    _place(t, "1", 5)
    started: list[int] = []

    async def start(job, term, port=0):
        started.append(job.requeues)

    op = dispatch_op(t, start)

    async def go() -> None:
        r = await op(PEER, {"jobs": ["1"], "term": 5, "attempts": {"1": 0}})
        assert "attempt 0" in r["errors"]["1"] and started == []
        r = await op(PEER, {"jobs": ["1"], "term": 5, "attempts": {"1": 1}})
        assert r["started"] == ["1"] and started == [1]
        with pytest.raises(ApiError, match="attempts must"):
            await op(PEER, {"jobs": ["1"], "term": 5, "attempts": {"1": "x"}})

    asyncio.run(go())


def start_errors(*answers: ApiError) -> list[BaseException]:
    """What one start each raises, the member answering each request with the next answer."""
    left = list(answers)

    async def call(member, op, **kw):
        raise left.pop(0)

    async def go() -> list[BaseException]:
        b = StartBatcher(call, in_flight=1)
        got: list[BaseException] = []
        for jid in range(len(answers)):
            try:
                await b.start("m1", str(jid + 1), 1)
            except MtgpuError as exc:
                got.append(exc)
        return got

    return asyncio.run(go())


def test_a_start_lost_with_its_connection_says_it_may_have_started():
    from mtgpu.cluster.starts import StartUnanswered

    lost, refused = start_errors(
        ApiError("the connection to the member was lost", "unreachable"), ApiError("no such job", "not_found")
    )
    # Only the unanswered one may be asked again (a member starts a part once).
    assert isinstance(lost, StartUnanswered) and not isinstance(refused, StartUnanswered)


def test_a_start_refused_for_now_says_nothing_was_done():
    from mtgpu.cluster.starts import StartRefusedForNow, StartUnanswered

    starting, refused = start_errors(
        ApiError("the MTGPU daemon is starting (loading its state)", "starting"),
        ApiError("no such job", "not_found"),
    )
    # A member loading its state after a restart did nothing: its start is asked again
    # (a scheduler that failed the job there lost it to the failover).
    assert isinstance(starting, StartRefusedForNow) and not isinstance(starting, StartUnanswered)
    assert not isinstance(refused, StartRefusedForNow)


def test_a_part_whose_start_record_was_lost_to_a_leader_change_is_asked_again() -> None:
    """A member started the part, but the record of its start was lost to a leader
    change (as a forming cluster's hand-off of the scheduler role does): the scheduler
    asks again (the member never starts a part twice) rather than failing the job
    "could not start"; a part refused with nothing done is refused for now; one that
    failed for another reason fails."""
    from mtgpu.cluster.starts import StartRefusedForNow, StartUnanswered
    from mtgpu.errors import StateError

    t = _table_with("1", "2", "3")
    for jid in ("1", "2", "3"):
        _place(t, jid, 5)

    async def start(job, term, port):
        why = {
            "1": ("the leader changed before the command committed; retry", "leader_changed"),
            "2": ("no scheduler is elected", "no_leader"),
        }.get(job.job_id)
        if why:
            raise StateError(*why)
        raise RuntimeError("the account cannot be created")

    op = dispatch_op(t, start)

    async def go() -> list[BaseException | None]:
        async def call(member, opname, *, jobs, term, timeout, attempts):
            return await op(PEER, {"jobs": jobs, "term": term, "attempts": attempts})

        answer = await op(PEER, {"jobs": ["1", "2", "3"], "term": 5})
        assert answer["codes"] == {"1": "leader_changed", "2": "no_leader"}  # not a RuntimeError's
        b = StartBatcher(call, in_flight=1)
        return await asyncio.gather(*(b.start("m1", j, 5) for j in ("1", "2", "3")), return_exceptions=True)

    lost, refused, failed = asyncio.run(go())
    assert isinstance(lost, StartUnanswered) and "leader changed" in str(lost)
    assert isinstance(refused, StartRefusedForNow) and not isinstance(refused, StartUnanswered)
    assert type(failed) is MtgpuError and "account cannot be created" in str(failed)
