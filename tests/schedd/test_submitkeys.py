"""Submission keys: a retried submission returns its first outcome, within bounds, per
tenant, through snapshots, on every replica alike."""

from __future__ import annotations

import pickle

import pytest

from mtgpu.schedd import submitkeys
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.submitkeys import KEY_TTL, key_error, recall, remember, scope_of

RECORD = {"name": "j", "user": "ann", "uid": 20001, "workdir": "/tmp", "spec": {}}
ANN, MAL = scope_of("ann", 20001), scope_of("mal", 20002)
KEY = "9f1c2e4b7a6d4c3e8f0a1b2c3d4e5f60"


def submit(t: JobTable, key: str | None, scope: str = ANN, now: float = 100.0, tasks=None):
    return t.submit(dict(RECORD), tasks, now, key, scope, _doApply=True)


def test_the_same_key_twice_in_the_log_makes_one_job():
    # The first copy was still uncommitted when the client sent it again: both are in
    # the log, and applying them makes one job, answered twice with its id.
    t = JobTable()
    first, again = submit(t, KEY), submit(t, KEY)
    assert again == {**first, "duplicate": True}
    assert list(t.jobs) == ["1"]


def test_an_arrays_retry_returns_every_task():
    t = JobTable()
    first = submit(t, KEY, tasks=[0, 1, 2])
    assert submit(t, KEY, tasks=[0, 1, 2])["tasks"] == first["tasks"] == ["1_0", "1_1", "1_2"]
    assert len(t.jobs) == 3


def test_a_refusal_decided_in_the_log_is_the_retrys_answer_too():
    t = JobTable()
    first = submit(t, KEY, tasks=[int("9" * 200)])
    assert first["code"] == "bad_id"
    again = submit(t, KEY, tasks=[int("9" * 200)])
    assert again["error"] == first["error"] and again["duplicate"]
    assert not t.jobs


def test_another_tenants_key_is_a_new_submission_and_reads_nothing():
    # mal learnt ann's key (from a shared script, say): it neither names ann's job
    # for mal nor stops ann's own retry from being one.
    t = JobTable()
    ann = submit(t, KEY, ANN)
    mal = submit(t, KEY, MAL)
    assert mal["job_id"] != ann["job_id"] and "duplicate" not in mal
    assert t.outcome(MAL, KEY, 100.0)["job_id"] == mal["job_id"]
    assert submit(t, KEY, ANN)["job_id"] == ann["job_id"]


def test_a_uid_given_to_a_new_account_does_not_inherit_the_keys():
    t = JobTable()
    submit(t, KEY, scope_of("ann", 20001))
    assert t.outcome(scope_of("newcomer", 20001), KEY, 100.0) is None


def test_keys_expire_after_the_stated_time():
    t = JobTable()
    first = submit(t, KEY, now=100.0)
    assert submit(t, KEY, now=100.0 + KEY_TTL)["job_id"] == first["job_id"]
    later = submit(t, KEY, now=101.0 + KEY_TTL)  # too late to be a retry: a new job
    assert later["job_id"] != first["job_id"] and "duplicate" not in later
    # The expired entry went, and the key counts from its new use.
    assert list(t.submit_keys[ANN]) == [KEY]
    assert t.submit_keys[ANN][KEY]["at"] == 101.0 + KEY_TTL


def test_expired_keys_leave_the_table_when_their_tenant_submits_again():
    keys: submitkeys.Keys = {}
    for i in range(5):
        remember(keys, ANN, f"k{i}", {"job_id": str(i)}, float(i))
    remember(keys, ANN, "late", {"job_id": "9"}, 3.0 + KEY_TTL + 0.5)
    assert list(keys[ANN]) == ["k4", "late"]


def test_a_flooding_tenant_evicts_only_its_own_keys(monkeypatch):
    monkeypatch.setattr(submitkeys, "MAX_KEYS_PER_TENANT", 5)
    keys: submitkeys.Keys = {}
    remember(keys, ANN, KEY, {"job_id": "1"}, 1.0)
    for i in range(50):
        remember(keys, MAL, f"flood{i}", {"job_id": str(i + 2)}, 2.0 + i)
    assert recall(keys, ANN, KEY, 60.0) == {"job_id": "1", "at": 1.0}
    assert list(keys[MAL]) == [f"flood{i}" for i in range(45, 50)]  # its newest five


def test_the_whole_table_is_bounded_oldest_first(monkeypatch):
    monkeypatch.setattr(submitkeys, "MAX_KEYS", 4)
    keys: submitkeys.Keys = {}
    for i, scope in enumerate([ANN, MAL, ANN, MAL, ANN, MAL]):
        remember(keys, scope, f"k{i}", {"job_id": str(i)}, float(i))
    assert sum(len(v) for v in keys.values()) == 4
    assert sorted(k for v in keys.values() for k in v) == ["k2", "k3", "k4", "k5"]


@pytest.mark.parametrize("key", ["", "a" * 65, "a b", "ключ", "k\n", "../x", "k;rm", 7, None])
def test_a_hostile_key_is_refused_by_rule(key):
    assert key_error(key) is not None


@pytest.mark.parametrize("key", [KEY, "a" * 64, "0b7e5c3a-4d2f-4e8b-9c1a-2f3e4d5c6b7a", "x"])
def test_keys_clients_send_are_accepted(key):
    assert key_error(key) is None


def test_keys_survive_a_snapshot_and_a_retry_after_it_returns_the_first_job():
    t = JobTable()
    first = submit(t, KEY)
    submit(t, "other-key", MAL)
    fresh = JobTable()
    fresh._deserialize(pickle.loads(pickle.dumps(t._serialize())))
    assert fresh.submit_keys == t.submit_keys
    assert submit(fresh, KEY)["job_id"] == first["job_id"]
    assert len(fresh.jobs) == 2


def test_state_from_before_scoped_keys_loads_without_them():
    t = JobTable()
    submit(t, None)
    data = pickle.loads(pickle.dumps(t._serialize()))
    data.pop("submit_keys")
    data["tokens"] = {"20001:abc": "1"}  # as an earlier version kept them
    fresh = JobTable()
    fresh._deserialize(data)
    assert "tokens" not in fresh.__dict__ and fresh.submit_keys == {}
    assert submit(fresh, "abc")["job_id"] == "2"


def test_an_entry_journalled_before_keys_were_scoped_still_applies_alike():
    # An older leader's entry: submit(record, tasks, now, "UID:token").
    a, b = JobTable(), JobTable()
    for t in (a, b):
        t.submit(dict(RECORD), None, 1.0, "20001:abc", _doApply=True)
        t.submit(dict(RECORD), None, 2.0, "20001:abc", _doApply=True)
    assert list(a.jobs) == ["1"] and a.submit_keys == b.submit_keys


def test_replicas_applying_the_same_log_keep_the_same_keys(monkeypatch):
    monkeypatch.setattr(submitkeys, "MAX_KEYS_PER_TENANT", 3)
    log = [(f"k{i % 5}", [ANN, MAL][i % 2], 10.0 * i) for i in range(40)]
    replicas = [JobTable(), JobTable()]
    for t in replicas:
        for key, scope, now in log:
            submit(t, key, scope, now)
    a, b = replicas
    assert a.submit_keys == b.submit_keys and a.jobs == b.jobs
    assert [list(v) for v in a.submit_keys.values()] == [list(v) for v in b.submit_keys.values()]
