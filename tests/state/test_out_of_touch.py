"""A replica knows when it is cut off from its cluster's majority, and since when."""

from __future__ import annotations

import time

from mtgpu.state import store as store_mod
from mtgpu.state.store import OUT_OF_TOUCH_AFTER, StateStore


class FakeSync:
    """The parts of PySyncObj's SyncObj the contact watch reads."""

    def __init__(self, others, leader=None, is_leader=False, deadline=0.0, responses=None):
        self.otherNodes = others
        self.leader, self.is_leader = leader, is_leader
        self._SyncObj__raftElectionDeadline = deadline
        self._SyncObj__lastResponseTime = responses or {}

    def _isLeader(self):
        return self.is_leader

    def _getLeader(self):
        return self.leader


def replica(sync, contact):
    s = object.__new__(StateStore)
    s.sync, s._contact = sync, contact
    return s


def test_a_follower_hearing_its_leader_is_in_touch_and_one_cut_off_says_since_when(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(store_mod.time, "monotonic", lambda: now[0])
    s = replica(FakeSync(["b", "c"], leader="b", deadline=1001.5), 990.0)
    s._watch_contact()
    assert s.out_of_touch_since() is None
    # The leader's messages stop: the deadline passes, elections (no leader) follow.
    s.sync._SyncObj__raftElectionDeadline = 1001.5
    now[0] = 1002.0
    s._watch_contact()
    s.sync.leader = None
    now[0] = 1000.0 + OUT_OF_TOUCH_AFTER + 1
    s._watch_contact()
    since = s.out_of_touch_since()
    assert since is not None and abs((time.time() - since) - (OUT_OF_TOUCH_AFTER + 1)) < 1


def test_a_leader_needs_a_majority_of_voters_recently_heard(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(store_mod.time, "monotonic", lambda: now[0])
    # Five voters: the leader and two others make a majority.
    sync = FakeSync(
        ["b", "c", "d", "e"], is_leader=True, responses={"b": 999.9, "c": 999.8, "d": 900.0, "e": 900.0}
    )
    s = replica(sync, 900.0)
    s._watch_contact()
    assert s.out_of_touch_since() is None
    sync._SyncObj__lastResponseTime = {"b": 999.9, "c": 990.0, "d": 900.0, "e": 900.0}
    s = replica(sync, 900.0)
    s._watch_contact()  # only one other heard lately: its contact is c's, 10 s ago
    assert s.out_of_touch_since() is not None


def test_a_cluster_of_one_is_its_own_majority():
    assert replica(FakeSync([]), 0.0).out_of_touch_since() is None
