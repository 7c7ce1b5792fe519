"""The state's format: a STATE_DIR of format 1 (tests/data/state-format-1, left by a
real daemon at that format) loads with today's code, every job with its fields; a
newer format is refused before anything is written; a damaged record is named."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import pickle as raft_pickle
from state_testing import FIXTURE, copy_fixture, load_jobs

import mtgpu
from mtgpu.errors import MtgpuError
from mtgpu.jobstate import CANCELLED, COMPLETED, FAILED, PENDING, RUNNING, JobState
from mtgpu.server import Daemon
from mtgpu.state import codec, durable

pytestmark = pytest.mark.timeout(120)


def _bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _rewrite_dump(d: Path, change: Any) -> None:
    with gzip.open(d / "raft.dump", "rb") as f:
        data = raft_pickle.load(f)
    table = next(p for p in data[0] if isinstance(p, dict) and "jobs" in p)
    change(table)
    with gzip.open(d / "raft.dump", "wb") as f:
        raft_pickle.dump(data, f)


def test_the_format_is_two() -> None:
    # The fixture is of format 1; this release converts it (and says so in docs/manual.md).
    assert mtgpu.STATE_FORMAT == codec.FORMAT == 2
    assert codec.check_state_dir(FIXTURE / "snapshot") == 1
    assert codec.check_state_dir(FIXTURE / "journal") is None


@pytest.mark.parametrize("kind", ["journal", "snapshot"])
def test_state_of_format_1_loads_with_every_job_and_its_fields(tmp_path: Path, kind: str) -> None:
    table = load_jobs(copy_fixture(kind, tmp_path))
    listed = [line.split() for line in (FIXTURE / "jobs.txt").read_text().splitlines()]
    ids = {what: jid for jid, what, _ in listed}
    assert sorted(table.jobs) == sorted(
        [jid for jid, what, _ in listed if what != "array"] + ["6_0", "6_1", "6_2"]
    )
    assert table.state_format == 2 and table.next_id == 11
    records = {jid: table.record(jid) for jid in table.jobs}
    for jid, rec in records.items():
        assert rec is not None and rec.job_id == jid and rec.user == "fixture" and rec.name == "sbatch"
        assert type(rec.state) is JobState and rec.uid == records[ids["completed"]].uid  # type: ignore[union-attr]
        # Format 2: each record holds every key format 1 could leave out.
        assert set(codec.FORMAT_2_DEFAULTS) <= set(table.jobs[jid])
        assert rec.submit_time > 0 and rec.workdir.endswith("/homes/fixture")
    done, failed, running = records[ids["completed"]], records[ids["failed"]], records[ids["running"]]
    assert done and (done.state, done.exit_code, done.reason) == (COMPLETED, 0, "")
    assert done.start_time and done.end_time and done.end_time >= done.start_time
    assert failed and (failed.state, failed.exit_code) == (FAILED, 3)
    assert running and running.state == RUNNING and running.end_time is None and running.term == 1
    assert [(m.node, m.rank, m.gpu_indices) for m in running.members] == [("testhost", 0, (0,))]
    assert running.gpu_info["testhost"][0]["uuid"] == "SIM-testhost-0" and running.ram == 50 << 20
    cancelled = records[ids["cancelled"]]
    assert cancelled and cancelled.state == CANCELLED and cancelled.reason.startswith("cancelled by ")
    held = records[ids["held"]]
    assert held and held.state == PENDING and held.held
    dep = records[ids["dependency"]]
    assert dep and dep.state == PENDING and not dep.held
    assert dep.raw["spec"]["dependency"] == f"afterok:{ids['running']}"
    tasks = [records[f"6_{i}"] for i in range(3)]
    assert [(t.array_id, t.array_task, t.numeric_id, t.state) for t in tasks if t] == [
        ("6", i, str(7 + i), COMPLETED) for i in range(3)
    ]
    # What the table counts from its records came back too.
    assert list(table.running_ids) == [ids["running"]]
    assert list(table.active_ids) == [ids["running"], ids["held"], ids["dependency"]]
    assert table.pending_by_user == {"fixture": 2}


@pytest.mark.parametrize("kind", ["journal", "snapshot"])
def test_the_converted_state_is_dumped_in_format_2(tmp_path: Path, kind: str) -> None:
    d = copy_fixture(kind, tmp_path)
    load_jobs(d, dump=True)
    assert codec.check_state_dir(d) == 2
    again = load_jobs(d)
    assert again.state_format == 2 and len(again.jobs) == 9 and again.record("2").exit_code == 3  # type: ignore[union-attr]


def test_the_typed_record_is_made_once_per_change(tmp_path: Path) -> None:
    table = load_jobs(copy_fixture("snapshot", tmp_path))
    first = table.record("5")
    assert first is not None and table.record("5") is first
    table._put({**table.jobs["5"], "held": False})
    again = table.record("5")
    assert again is not first and again is not None and not again.held
    table.purge(["1"], _doApply=True)
    assert table.record("1") is None and "1" not in table._records


def test_a_record_holds_what_was_asked_and_where_it_went_typed(tmp_path: Path) -> None:
    """The scheduler, the agent and the API read one type: JobSpec, Placement and
    MemberPlacement of mtgpu.jobspec, held by the record, the same as the dicts say."""
    from mtgpu.jobspec import GpuMode, JobSpec, MemberPlacement, Placement, spec_from_dict

    table = load_jobs(copy_fixture("snapshot", tmp_path))
    placed = [r for r in (table.record(j) for j in table.jobs) if r is not None and r.placement is not None]
    assert placed, "the fixture has placed jobs"
    for rec in placed:
        raw = rec.raw
        assert isinstance(rec.spec, JobSpec) and rec.spec == spec_from_dict(raw["spec"])
        assert isinstance(rec.placement, Placement)
        assert rec.placement.gpu_mode is GpuMode(raw["placement"]["gpu_mode"])
        assert all(isinstance(m, MemberPlacement) for m in rec.members)
        assert rec.nodes == [m["node"] for m in raw["placement"]["members"]]
        assert [list(m.gpu_indices) for m in rec.members] == [
            m["gpu_indices"] for m in raw["placement"]["members"]
        ]
        first = rec.members[0]
        assert rec.member_on(first.node) is first and rec.member_on("no-such-member") is None
        assert (rec.cpus, rec.ram, rec.priority) == (
            rec.spec.request.cpus,
            rec.spec.request.ram,
            rec.spec.priority,
        )
    pending = table.record("5")
    assert pending is not None and pending.placement is None and pending.members == () and pending.nodes == []


def test_a_transition_decodes_only_what_it_changed(tmp_path: Path) -> None:
    """A job's records share their spec and placement dicts: the record after a change
    of state keeps the JobSpec and Placement decoded before it."""
    table = load_jobs(copy_fixture("snapshot", tmp_path))
    jid = next(j for j, r in table.jobs.items() if r.get("placement") and r["state"] == RUNNING)
    before = table.record(jid)
    assert before is not None
    table._put({**table.jobs[jid], "progress": {"testhost": "halfway"}})
    after = table.record(jid)
    assert after is not None and after is not before and after.progress == {"testhost": "halfway"}
    assert after.spec is before.spec and after.placement is before.placement
    # A record whose spec changed (a finished job's script leaves the state) decodes it again.
    table._put({**table.jobs[jid], "state": COMPLETED, "exit_code": 0, "end_time": 10.0})
    ended = table.record(jid)
    assert ended is not None and ended.spec is not before.spec and ended.spec.script == ""
    assert ended.placement is before.placement


@pytest.mark.parametrize("where", ["dump", "release.json"])
def test_state_of_a_newer_format_is_refused_and_left_as_it_was(tmp_path: Path, where: str) -> None:
    d = copy_fixture("snapshot", tmp_path)
    if where == "dump":
        _rewrite_dump(d, lambda t: t.update(state_format=3))
    else:
        (d / "release.json").write_text('{"version": "9.0.0", "state_format": 3}\n')
    before = _bytes(d)
    with pytest.raises(MtgpuError) as info:
        Daemon._check_state_format(_Stub(d))  # type: ignore[arg-type]
    text = str(info.value)
    assert "holds state format 3" in text and "reads formats 1 to 2" in text
    assert "Nothing was changed" in text and "mtgpu-setup install" in text
    assert _bytes(d) == before


def _received(d: Path, fmt: int, by: str | None = "9.0.0") -> bytes:
    """The fixture's dump made into one of format ``fmt`` written by ``by``, as the
    bytes the scheduler would send."""
    src = d.parent / f"sent-{fmt}"
    src.mkdir()
    (src / "raft.dump").write_bytes((d / "raft.dump").read_bytes())
    _rewrite_dump(src, lambda t: t.update(state_format=fmt, **({"written_by": by} if by else {})))
    return (src / "raft.dump").read_bytes()


def _receive(d: Path, sent: bytes) -> bool:
    """PySyncObj's own receiving code (its Serializer, as a follower runs it) given
    ``sent`` in two parts: whether it took the dump."""
    from pysyncobj.serializer import Serializer

    s = Serializer(str(d / "raft.dump"), 1 << 20, False, None, None, None)
    s.setTransmissionData((sent[:100], True, False))
    return bool(s.setTransmissionData((sent[100:], False, True)))


def test_a_dump_of_a_newer_format_from_the_scheduler_is_refused_before_it_replaces_this_members(
    tmp_path: Path,
) -> None:
    """A member of an older release in a cluster a newer one leads: the full dump the
    scheduler sends is refused (this member's stays as it was), the refusal names the
    release that wrote it, and the daemon is told (it stops with exit status 3)."""
    d = copy_fixture("snapshot", tmp_path)
    sent = _received(d, 3)
    before = _bytes(d)
    heard: list[str] = []
    unlisten = durable.on_refused_dump(heard.append)
    try:
        assert _receive(d, sent) is False
    finally:
        unlisten()
    assert _bytes(d) == before  # neither replaced nor left behind as a part-file
    assert len(heard) == 1
    assert "the full dump the scheduler sent holds state format 3, written by MTGPU 9.0.0" in heard[0]
    assert "Run MTGPU 9.0.0 or newer" in heard[0]


def test_the_daemon_stops_with_exit_status_3_when_it_refuses_the_schedulers_dump(tmp_path: Path) -> None:
    from mtgpu.config import load_text
    from mtgpu.server import EXIT_STATE_FORMAT

    d = copy_fixture("snapshot", tmp_path)
    sent = _received(d, 3)
    daemon = Daemon(load_text(f"STATE_DIR: {tmp_path / 'state'}\nRUN_DIR: {tmp_path / 'run'}\n"))

    async def go() -> None:
        daemon._listen_for_refused_state(asyncio.get_running_loop())
        try:
            # The refusal comes on PySyncObj's thread, as a follower receives the dump.
            assert await asyncio.to_thread(_receive, d, sent) is False
            await asyncio.wait_for(daemon.stopping.wait(), 10)
        finally:
            assert daemon._unlisten is not None
            daemon._unlisten()

    asyncio.run(go())
    assert daemon.exit_status == EXIT_STATE_FORMAT == 3


def test_a_dump_of_this_format_from_the_scheduler_is_taken(tmp_path: Path) -> None:
    d = copy_fixture("snapshot", tmp_path)
    sent = _received(d, 2, None)
    heard: list[str] = []
    unlisten = durable.on_refused_dump(heard.append)
    try:
        assert _receive(d, sent) is True
    finally:
        unlisten()
    assert heard == [] and (d / "raft.dump").read_bytes() == sent
    assert load_jobs(d).written_by == mtgpu.__version__  # loaded: the table is this release's


def test_the_table_says_which_release_wrote_its_dump(tmp_path: Path) -> None:
    d = copy_fixture("snapshot", tmp_path)
    load_jobs(d, dump=True)
    table = next(p for p in codec.read_dump(d)[0] if isinstance(p, dict) and "jobs" in p)
    assert (table["state_format"], table["written_by"]) == (2, mtgpu.__version__)
    _rewrite_dump(d, lambda t: t.update(state_format=3, written_by="9.1.0"))
    with pytest.raises(codec.StateFormatError, match="written by MTGPU 9.1.0"):
        codec.check_state_dir(d)


def test_a_damaged_record_names_the_job_and_the_field(tmp_path: Path) -> None:
    d = copy_fixture("snapshot", tmp_path)
    _rewrite_dump(d, lambda t: t["jobs"]["2"].update(exit_code="three"))
    before = _bytes(d)
    with pytest.raises(
        codec.StateFormatError, match=r"the record of job '2' has 'exit_code' = 'three', not int"
    ):
        codec.check_state_dir(d)
    assert _bytes(d) == before


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda j: j.update(state="DONE"), "the state 'DONE', which is no job state"),
        (lambda j: j.pop("submit_time"), "has no 'submit_time'"),
        (lambda j: j["spec"]["request"].update(cpus=None), "has 'spec.request.cpus' = None, not int"),
        (lambda j: j.update(placement={"members": [{"node": "a"}]}), "a damaged placement member"),
        (lambda j: j.update(uid=True), "'uid' = True, not int"),
        (lambda j: j["spec"]["request"].update(gpu_mode="sometimes"), "a damaged spec"),
        (lambda j: j["spec"].update(colour="blue"), "a damaged spec"),
        (lambda j: j.update(placement={"members": []}), "a placement with no GPU mode"),
    ],
)
def test_decode_names_what_is_wrong(tmp_path: Path, change: Any, problem: str) -> None:
    table = load_jobs(copy_fixture("snapshot", tmp_path))
    j = {
        **table.jobs["3"],
        "spec": {**table.jobs["3"]["spec"], "request": dict(table.jobs["3"]["spec"]["request"])},
    }
    change(j)
    with pytest.raises(codec.StateFormatError, match="job '3'") as info:
        codec.decode_job(j)
    assert problem in str(info.value)


def test_format_1_records_are_converted_and_format_2_left_alone() -> None:
    old = {"job_id": "1", "state": "PENDING"}
    new = codec.upgrade_job(old, 1)
    assert new == {
        "job_id": "1",
        "state": "PENDING",
        "requeues": 0,
        "held": False,
        "numeric_id": None,
        "placed_time": None,
    }
    assert (
        codec.upgrade_job({**old, "requeues": 2, "held": True, "numeric_id": "4", "placed_time": 1.0}, 1)[
            "requeues"
        ]
        == 2
    )
    jobs = {"1": new}
    assert codec.upgrade_jobs(jobs, 2) is jobs
    with pytest.raises(codec.StateFormatError, match="holds state format 3"):
        codec.upgrade_jobs(jobs, 3)


class _Stub:
    """What MtgpuServer._check_state_format reads of the server."""

    def __init__(self, state_dir: Path) -> None:
        self.options = type("O", (), {"state_dir": str(state_dir)})()


def test_the_tasks_of_an_array_share_one_decoded_spec() -> None:
    from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
    from mtgpu.schedd.jobtable import JobTable

    table = JobTable()
    asked = spec_to_dict(JobSpec(ResourceRequest(cpus=2), "true", array="0-99"))
    record = {"user": "ann", "uid": 20001, "name": "a", "spec": asked, "workdir": "/w"}
    r = table.submit(record, list(range(100)), 1.0, None, None, True, _doApply=True)
    recs = [table.record(t) for t in r["tasks"]]
    assert len(recs) == 100 and all(rec is not None and rec.cpus == 2 for rec in recs)
    assert len({id(rec.spec) for rec in recs if rec is not None}) == 1
    # The check at start shares them the same way, and still names a damaged one.
    jobs = dict(table.jobs)
    bad = r["tasks"][50]
    jobs[bad] = {**jobs[bad], "spec": {**jobs[bad]["spec"], "priority": "high"}}
    dump = [[{"jobs": jobs, "next_id": table.next_id, "state_format": codec.FORMAT}]]
    with pytest.raises(codec.StateFormatError, match=f"job '{bad}' has 'spec.priority' = 'high'"):
        codec.check_dump(dump, "the test's dump")


def test_warnings_stored_before_their_bound_are_cut_when_read_back(tmp_path: Path) -> None:
    """A state (or a journal entry) of a release that kept every warning (33 MB for one
    job of `#SBATCH -Q -Q ...`) is read back with each job's warnings within today's
    bound, the same on every replica; records within it stay the very same objects."""
    from mtgpu.jobspec import MAX_WARNINGS

    d = copy_fixture("snapshot", tmp_path)
    flood = ["line 2: #SBATCH -Q is ignored"] * 40000 + [f"line {i}: other" for i in range(300)]

    def swell(table: dict) -> None:
        table["jobs"]["5"]["spec"]["warnings"] = flood

    _rewrite_dump(d, swell)
    table = load_jobs(d)
    kept = table.jobs["5"]["spec"]["warnings"]
    assert len(kept) <= MAX_WARNINGS + 1 and kept[-1].startswith("... and "), kept[-3:]
    assert any("(x40000)" in w for w in kept), kept[:3]
    other = next(j for jid, j in table.jobs.items() if jid != "5")
    assert codec.bounded_warnings(other) is other
    # A submission as an older release journalled it: bounded as it is applied.
    record = {**table.jobs["5"], "spec": {**table.jobs["5"]["spec"], "warnings": flood}}
    for k in ("job_id", "array_id", "array_task"):
        record.pop(k, None)
    r = table.submit(record, None, 1.0, _doApply=True)
    assert len(table.jobs[r["job_id"]]["spec"]["warnings"]) <= MAX_WARNINGS + 1
