"""The state's format: a STATE_DIR of format 1 (tests/data/state-format-1, left by a
real daemon at that format) loads with today's code, every job with its fields; a
newer format is refused before anything is written; a damaged record is named."""

from __future__ import annotations

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
from mtgpu.state import codec

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
