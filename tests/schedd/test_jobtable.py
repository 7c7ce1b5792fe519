"""The job table's index of active jobs agrees with the records, whatever happens."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.jobspec import JobSpec, ResourceRequest, spec_to_dict
from mtgpu.jobstate import ACTIVE_STATES
from mtgpu.schedd.jobtable import JobTable

RECORD = {"name": "j", "user": "ann", "uid": 20001, "workdir": "/tmp", "spec": {}}

ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "array", "place", "started", "finish", "cancel", "requeue", "old_run_over", "purge"]
        ),
        st.integers(0, 30),
    ),
    max_size=60,
)


def apply(t: JobTable, op: str, n: int) -> None:
    ids = sorted(t.jobs)
    jid = ids[n % len(ids)] if ids else "1"
    if op == "submit":
        t.submit(dict(RECORD), None, 1.0, _doApply=True)
    elif op == "array":
        t.submit(dict(RECORD), list(range(n % 4 + 1)), 1.0, _doApply=True)
    elif op == "place":
        t.place(jid, {"members": [{"node": "h"}] if n % 2 else []}, 1, 2.0, _doApply=True)
    elif op == "started":
        t.started(jid, "h", 3.0, _doApply=True)
    elif op == "finish":
        t.finish(jid, "COMPLETED", 0, "", 4.0, _doApply=True)
    elif op == "cancel":
        t.cancel([jid], "ann", 5.0, _doApply=True)
    elif op == "requeue":
        t.requeue(jid, "member lost", 6.0, _doApply=True)
    elif op == "old_run_over":
        old = (t.jobs.get(jid) or {}).get("old_run") or {}
        t.old_run_over(jid, old.get("attempt", 0), "its lease ran out", _doApply=True)
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
        # The jobs an agent and the scheduler look at each second for an earlier run.
        old = sorted(j["job_id"] for j in expect if j.get("old_run"))
        assert sorted(t.old_run_ids) == old


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


def test_the_index_of_earlier_runs_is_made_from_the_records_not_dumped():
    t = JobTable()
    spec = spec_to_dict(JobSpec(ResourceRequest(nodes=2), "true", requeue=True))
    t.submit(dict(RECORD, spec=spec), None, 1.0, _doApply=True)
    jid = max(t.jobs, key=int)
    members = [{"node": n, "rank": r, "gpu_indices": [], "cpus": 1, "ram": 0} for r, n in enumerate("ab")]
    t.place(jid, {"job_id": jid, "gpu_mode": "exclusive", "members": members}, 3, 2.0, _doApply=True)
    t.requeue(jid, "member lost", 6.0, 0, ["b"], _doApply=True)
    assert t.jobs[jid]["old_run"] == {"attempt": 0, "members": ["b"]} and list(t.old_run_ids) == [jid]
    assert [r.job_id for r in t.old_run_records()] == [jid]
    data = pickle.loads(pickle.dumps(t._serialize()))
    assert "old_run_ids" not in data
    fresh = JobTable()
    fresh._deserialize(data)
    assert list(fresh.old_run_ids) == [jid]
    fresh.cancel([jid], "ann", 7.0, _doApply=True)  # ended: nothing to wait for any more
    assert fresh.jobs[jid]["state"] == "CANCELLED" and fresh.old_run_records() == []


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
    t.part_ended(
        jid, "c", 3, "OUT_OF_MEMORY", None, "the kernel's OOM killer stopped 1 process", 6.0, _doApply=True
    )
    j = t.jobs[jid]
    assert j["state"] == "OUT_OF_MEMORY"
    assert (
        j["reason"] == "its part on c (rank 2) ended OUT_OF_MEMORY: the kernel's OOM killer stopped 1 process"
    )
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


def test_pending_script_bytes_count_an_array_once_and_finished_scripts_are_dropped():
    t = JobTable()
    rec = dict(RECORD, spec={"script": "x" * 1000, "requeue": False}, script_bytes=1000)
    t.submit(rec, [0, 1, 2], 1.0, _doApply=True)
    t.submit(rec, None, 1.0, _doApply=True)
    assert t.pending_script_bytes == {"ann": 2000}
    t.cancel(["1_0", "1_1"], "ann", 2.0, _doApply=True)
    assert t.pending_script_bytes == {"ann": 2000}  # one task of the array still waits
    t.cancel(["1_2", "2"], "ann", 2.0, _doApply=True)
    assert t.pending_script_bytes == {}
    assert all(j["spec"]["script"] == "" for j in t.jobs.values())  # out of the state
    fresh = JobTable()
    t.submit(rec, None, 3.0, _doApply=True)
    fresh._deserialize(pickle.loads(pickle.dumps(t._serialize())))
    assert fresh.pending_script_bytes == {"ann": 1000}


def test_a_job_id_that_reading_would_refuse_never_enters_the_table():
    t = JobTable()
    r = t.submit(dict(RECORD), [int("9" * 200)], 1.0, _doApply=True)
    assert r["code"] == "bad_id" and not t.jobs and t.next_id == 1


# ------------------------------------------------------------------- attempts

ONE = {"members": [{"node": "h", "rank": 0, "gpu_indices": [0]}]}


def running_table(requeues: int = 0) -> JobTable:
    t = JobTable()
    t.submit(dict(RECORD), None, 1.0, _doApply=True)
    t.place("1", ONE, 1, 2.0, _doApply=True)
    for _ in range(requeues):
        t.requeue("1", "drained now", 3.0, _doApply=True)
        t.place("1", ONE, 1, 4.0, _doApply=True)
    return t


def test_a_late_report_of_an_earlier_attempt_neither_ends_nor_starts_the_next():
    t = running_table(requeues=1)
    assert t.get("1")["requeues"] == 1
    # Attempt 0's start and end arrive after attempt 1 was placed on the same host.
    t.started("1", "h", 5.0, 0, _doApply=True)
    assert t.get("1")["start_time"] is None
    r = t.part_ended("1", "h", 1, "CANCELLED", None, "stopped: requeued", 6.0, 0, _doApply=True)
    assert r["code"] == "stale" and t.get("1")["state"] == "RUNNING"
    assert t.finish("1", "NODE_FAIL", None, "lost", 6.0, 0, _doApply=True)["code"] == "stale"
    assert t.requeue("1", "lost", 6.0, 0, _doApply=True)["code"] == "stale"
    assert t.get("1")["state"] == "RUNNING" and t.get("1")["requeues"] == 1
    # Attempt 1's own reports count.
    t.started("1", "h", 7.0, 1, _doApply=True)
    assert t.get("1")["start_time"] == 7.0
    assert t.part_ended("1", "h", 1, "COMPLETED", 0, "", 8.0, 1, _doApply=True)["state"] == "COMPLETED"


def test_a_journal_without_attempts_reads_as_attempt_zero():
    """Records journalled before attempts were counted have no requeue count: their
    first start's reports are attempt 0's, as before."""
    t = running_table()
    rec = dict(t.get("1"))
    rec.pop("requeues", None)
    t.jobs["1"] = rec
    assert t.part_ended("1", "h", 1, "COMPLETED", 0, "", 8.0, _doApply=True)["state"] == "COMPLETED"


def test_a_job_whose_cancel_was_asked_is_not_requeued():
    t = running_table()
    r = t.cancel(["1"], "ann", 3.0, _doApply=True)
    assert r["stopping"] == ["1"] and r["cancelled"] == [] and r["ended"] == []
    # Asked again while it stops: it is still named as stopping (the tools say so).
    assert t.cancel(["1"], "ann", 3.5, _doApply=True)["stopping"] == ["1"]
    t.requeue("1", "drained now", 4.0, _doApply=True)
    assert t.get("1")["state"] == "CANCELLED" and "cancelled by ann" in t.get("1")["reason"]
    assert t.cancel(["1"], "ann", 5.0, _doApply=True) == {"cancelled": [], "stopping": [], "ended": ["1"]}


def test_a_requeue_forgets_the_earlier_attempts_parts():
    t = JobTable()
    t.submit(dict(RECORD), None, 1.0, _doApply=True)
    two = {
        "members": [{"node": "a", "rank": 0, "gpu_indices": []}, {"node": "b", "rank": 1, "gpu_indices": []}]
    }
    t.place("1", two, 1, 2.0, _doApply=True)
    t.part_ended("1", "a", 1, "COMPLETED", 0, "", 3.0, 0, _doApply=True)
    t.requeue("1", "b lost", 4.0, 0, _doApply=True)
    t.place("1", two, 1, 5.0, _doApply=True)
    # Attempt 1's part on b completing does not complete the job: a's part of attempt 0 is gone.
    assert t.part_ended("1", "b", 1, "COMPLETED", 0, "", 6.0, 1, _doApply=True)["state"] == "RUNNING"


@settings(max_examples=100, deadline=None)
@given(st.permutations(["report", "lost", "timeout", "requeue"]))
def test_an_end_is_recorded_once_whichever_decision_comes_first(order):
    """The member's report, the scheduler's lost-member and failed-start decisions and
    a requeue race for one attempt: the first applied decides, the rest change nothing."""
    t = running_table()
    first = None
    for what in order:
        if what == "report":
            r = t.part_ended("1", "h", 1, "COMPLETED", 0, "", 5.0, 0, _doApply=True)
        elif what == "lost":
            r = t.finish("1", "NODE_FAIL", None, "lost", 5.0, 0, _doApply=True)
        elif what == "timeout":
            r = t.finish("1", "TIMEOUT", None, "time limit", 5.0, 0, _doApply=True)
        else:
            r = t.requeue("1", "lost", 5.0, 0, _doApply=True)
        if first is None:
            first = what
            assert "error" not in r
        else:
            assert r.get("code") in ("final", "stale", "not_running"), (what, r)
    expect = {"report": "COMPLETED", "lost": "NODE_FAIL", "timeout": "TIMEOUT", "requeue": "PENDING"}
    assert t.get("1")["state"] == expect[first]


def test_a_finished_jobs_exported_environment_leaves_the_state():
    t = JobTable()
    rec = dict(
        RECORD, spec={"script": "x", "requeue": False}, submit={"umask": 0o27, "env": {"TOKEN": "secret"}}
    )
    t.submit(rec, None, 1.0, _doApply=True)
    assert t.jobs["1"]["submit"]["env"] == {"TOKEN": "secret"}  # a pending job still needs it
    t.cancel(["1"], "ann", 2.0, _doApply=True)
    assert t.jobs["1"]["submit"] == {"umask": 0o27, "env": {}}


def test_array_tasks_get_numeric_ids_of_their_own_that_no_later_job_reuses():
    t = JobTable()
    assert t.submit(dict(RECORD), None, 1.0, _doApply=True)["job_id"] == "1"
    r = t.submit(dict(RECORD), [0, 5, 10], 1.0, None, None, True, _doApply=True)
    assert r == {"job_id": "2", "tasks": ["2_0", "2_5", "2_10"]}
    # The array keeps its id (2); its tasks take the block after it, as Slurm's do.
    assert [t.jobs[i]["numeric_id"] for i in r["tasks"]] == ["3", "4", "5"]
    assert t.submit(dict(RECORD), None, 1.0, _doApply=True)["job_id"] == "6"
    # A task's numeric id names that task only; the array's id still names all of them.
    assert [j["job_id"] for j in t.tasks_of("4")] == ["2_5"]
    assert [j["job_id"] for j in t.tasks_of("2")] == ["2_0", "2_5", "2_10"]
    assert t.tasks_of("7") == []
    t.finish("2_5", "COMPLETED", 0, "", 2.0, _doApply=True)
    t.purge(["2_5"], _doApply=True)
    assert t.tasks_of("4") == [] and "4" not in t.numeric_ids


def test_an_array_journalled_before_tasks_were_numbered_replays_with_the_ids_it_had():
    # A log written by an earlier version: the array took one id, the next job the next.
    t = JobTable()
    t.submit(dict(RECORD), [0, 1], 1.0, _doApply=True)
    assert t.submit(dict(RECORD), None, 1.0, _doApply=True)["job_id"] == "2"
    assert t.jobs["1_0"]["numeric_id"] is None and t.tasks_of("2") == [t.jobs["2"]]


def test_numeric_ids_survive_a_state_dump_and_a_replay_alike():
    def replay() -> JobTable:
        t = JobTable()
        t.submit(dict(RECORD), [0, 1], 1.0, None, None, True, _doApply=True)
        t.submit(dict(RECORD), [7], 1.0, None, None, True, _doApply=True)
        return t

    a, b = replay(), replay()
    assert {i: j.get("numeric_id") for i, j in a.jobs.items()} == {"1_0": "2", "1_1": "3", "4_7": "5"}
    assert a.numeric_ids == b.numeric_ids
    data = pickle.loads(pickle.dumps(a._serialize()))
    data.pop("numeric_ids")  # a dump from before the index: rebuilt
    c = JobTable()
    c._deserialize(data)
    assert c.numeric_ids == {"2": "1_0", "3": "1_1", "5": "4_7"}
    assert [j["job_id"] for j in c.tasks_of("5")] == ["4_7"]


def test_an_arrays_tasks_are_looked_up_through_purges_and_a_state_dump():
    """What an array's id names comes from an index of the records (not a search of
    every job), kept through purges and made again from a dump, which does not hold it."""
    t = JobTable()
    t.submit(dict(RECORD), None, 1.0, _doApply=True)
    assert t.submit(dict(RECORD), [0, 1, 2], 1.0, _doApply=True)["job_id"] == "2"
    t.finish("2_1", "COMPLETED", 0, "", 2.0, _doApply=True)
    t.purge(["2_1"], _doApply=True)
    assert [j["job_id"] for j in t.tasks_of("2")] == ["2_0", "2_2"]
    data = pickle.loads(pickle.dumps(t._serialize()))
    assert "array_tasks" not in data
    c = JobTable()
    c._deserialize(data)
    assert [j["job_id"] for j in c.tasks_of("2")] == ["2_0", "2_2"]
    for jid in ("2_0", "2_2"):
        c.finish(jid, "FAILED", 1, "", 3.0, _doApply=True)
    c.purge(["2_0", "2_2"], _doApply=True)
    assert c.tasks_of("2") == [] and "2" not in c.array_tasks
