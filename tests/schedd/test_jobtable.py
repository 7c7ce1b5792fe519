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
