"""The job table's index of active jobs agrees with the records, whatever happens."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.schedd.jobtable import ACTIVE_STATES, JobTable

RECORD = {"name": "j", "user": "ann", "uid": 20001, "workdir": "/tmp", "spec": {}}

ops = st.lists(st.tuples(st.sampled_from(["submit", "array", "place", "started", "finish",
                                          "cancel", "requeue", "purge"]),
                         st.integers(0, 30)), max_size=60)


def apply(t: JobTable, op: str, n: int) -> None:
    ids = sorted(t.jobs)
    jid = ids[n % len(ids)] if ids else "1"
    if op == "submit":
        t.submit(dict(RECORD), None, 1.0, _doApply=True)
    elif op == "array":
        t.submit(dict(RECORD), list(range(n % 4 + 1)), 1.0, _doApply=True)
    elif op == "place":
        t.place(jid, {"members": []}, 1, 2.0, _doApply=True)
    elif op == "started":
        t.started(jid, "h", 3.0, _doApply=True)
    elif op == "finish":
        t.finish(jid, "COMPLETED", 0, "", 4.0, _doApply=True)
    elif op == "cancel":
        t.cancel([jid], "ann", 5.0, _doApply=True)
    elif op == "requeue":
        t.requeue(jid, "member lost", 6.0, _doApply=True)
    else:
        t.purge([jid], _doApply=True)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_active_index_matches_the_records(seq):
    t = JobTable()
    for op, n in seq:
        apply(t, op, n)
        expect = [j for j in t.jobs.values() if j["state"] in ACTIVE_STATES]
        assert sorted(j["job_id"] for j in t.active()) == sorted(j["job_id"] for j in expect)
        running = sorted(j["job_id"] for j in t.jobs.values() if j["state"] == "RUNNING")
        assert sorted(j["job_id"] for j in t.running()) == running


def test_a_state_dump_without_the_index_rebuilds_it():
    t = JobTable()
    t.submit(dict(RECORD), [0, 1, 2], 1.0, _doApply=True)
    t.finish("1_0", "COMPLETED", 0, "", 2.0, _doApply=True)
    data = pickle.loads(pickle.dumps(t._serialize()))
    t.place("1_2", {"members": []}, 1, 2.0, _doApply=True)
    data.pop("active_ids")  # as written by a version without the indexes
    data.pop("running_ids")
    fresh = JobTable()
    fresh._deserialize(data)
    assert [j["job_id"] for j in fresh.active()] == ["1_1", "1_2"]
    assert fresh.running() == []  # the dump was taken before the placement


def _gang(t: JobTable, nodes: list[str]) -> str:
    t.submit(dict(RECORD, spec={"requeue": False}), None, 1.0, _doApply=True)
    jid = max(t.jobs, key=int)
    t.place(jid, {"members": [{"node": n} for n in nodes]}, 3, 2.0, _doApply=True)
    return jid


def test_a_multi_member_job_completes_when_every_part_has():
    t = JobTable()
    jid = _gang(t, ["a", "b"])
    r = t.part_ended(jid, "b", 3, "COMPLETED", 0, "", 5.0, _doApply=True)
    assert r["state"] == "RUNNING" and t.jobs[jid]["state"] == "RUNNING"
    r = t.part_ended(jid, "a", 3, "COMPLETED", 0, "", 6.0, _doApply=True)
    assert t.jobs[jid]["state"] == "COMPLETED" and t.jobs[jid]["end_time"] == 6.0


def test_the_first_part_that_fails_ends_the_job_naming_its_member():
    t = JobTable()
    jid = _gang(t, ["a", "b", "c"])
    t.part_ended(jid, "a", 3, "COMPLETED", 0, "", 5.0, _doApply=True)
    t.part_ended(jid, "c", 3, "OUT_OF_MEMORY", None, "the kernel's OOM killer stopped 1 process", 6.0,
                 _doApply=True)
    j = t.jobs[jid]
    assert j["state"] == "OUT_OF_MEMORY"
    assert j["reason"] == "its part on c (rank 2) ended OUT_OF_MEMORY: the kernel's OOM killer stopped 1 process"
    # The parts stopped because of it change nothing more.
    assert t.part_ended(jid, "b", 3, "CANCELLED", None, "", 7.0, _doApply=True)["code"] == "final"


def test_a_part_of_an_earlier_placement_changes_nothing():
    t = JobTable()
    jid = _gang(t, ["a", "b"])
    t.requeue(jid, "member lost", 4.0, _doApply=True)
    t.place(jid, {"members": [{"node": "a"}, {"node": "c"}]}, 5, 5.0, _doApply=True)
    assert t.part_ended(jid, "b", 3, "FAILED", 1, "", 6.0, _doApply=True)["code"] == "stale"
    assert t.jobs[jid]["state"] == "RUNNING"


def test_a_one_member_job_ends_with_its_part():
    t = JobTable()
    jid = _gang(t, ["a"])
    t.part_ended(jid, "a", 3, "FAILED", 2, "the job exited with status 2", 5.0, _doApply=True)
    assert t.jobs[jid]["state"] == "FAILED" and t.jobs[jid]["exit_code"] == 2
    assert t.jobs[jid]["reason"] == "the job exited with status 2"
