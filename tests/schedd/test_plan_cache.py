"""What placing derives from a snapshot is kept beside it, never on it, and goes with it."""

from __future__ import annotations

import dataclasses
import gc

import pytest

from mtgpu.schedd.placement import SNAPSHOTS, Plan, place, snapshot_with_allocations
from mtgpu.schedd.types import ClusterSnapshot, NodeSnapshot, PendingJob, Placement, ResourceRequest

G = 1 << 30


def cluster() -> ClusterSnapshot:
    return ClusterSnapshot(nodes=(NodeSnapshot(name="a", cpus=8, ram_total=64 * G),))


def test_snapshot_takes_no_cache() -> None:
    snapshot = cluster()
    with pytest.raises((AttributeError, TypeError)):
        object.__setattr__(snapshot, "_cache", {})
    assert not hasattr(snapshot, "__dict__")
    got = place(snapshot, PendingJob(job_id="j1", tenant="t", request=ResourceRequest(cpus=2)))
    assert isinstance(got, Placement)
    # The plan is kept beside the snapshot, and a second decision uses it.
    kept = SNAPSHOTS.get(snapshot)
    assert kept is not None
    place(snapshot, PendingJob(job_id="j2", tenant="t", request=ResourceRequest(cpus=2)))
    assert SNAPSHOTS.get(snapshot) is kept
    # Plans copy it: the snapshot's own plan is not written.
    plan = Plan(snapshot)
    plan.commit(got)
    assert kept.plan.use.cpus_free == [8] and plan.use.cpus_free == [6]


def test_cache_goes_with_the_snapshot() -> None:
    before = len(SNAPSHOTS)
    snapshot = snapshot_with_allocations(cluster().nodes, ())
    place(snapshot, PendingJob(job_id="j1", tenant="t", request=ResourceRequest()))
    # The next snapshot takes over the layout of the last.
    nxt = snapshot_with_allocations(cluster().nodes, (), previous=snapshot)
    a, b = SNAPSHOTS.get(snapshot), SNAPSHOTS.get(nxt)
    assert a is not None and b is not None and a.plan.layout is b.plan.layout
    assert len(SNAPSHOTS) == before + 2
    del snapshot, nxt, a, b
    gc.collect()
    assert len(SNAPSHOTS) == before


def test_each_snapshot_has_its_own_plan() -> None:
    snapshot = cluster()
    place(snapshot, PendingJob(job_id="j1", tenant="t", request=ResourceRequest()))
    other = dataclasses.replace(snapshot, nodes=(NodeSnapshot(name="b", cpus=4, ram_total=8 * G),))
    got = place(other, PendingJob(job_id="j1", tenant="t", request=ResourceRequest()))
    assert isinstance(got, Placement) and got.nodes == ("b",)


def test_a_member_whose_features_changed_is_chosen_by_its_new_ones() -> None:
    """The layout the next snapshot takes over holds the features --constraint reads:
    an administrator's new NODE_FEATURES are not hidden behind the old layout."""
    old = (NodeSnapshot(name="a", cpus=8, ram_total=64 * G, features=("slow",)),)
    first = snapshot_with_allocations(old, ())
    want = PendingJob(job_id="j1", tenant="t", request=ResourceRequest(constraint="fast"))
    assert not isinstance(place(first, want), Placement)
    new = (dataclasses.replace(old[0], features=("fast",)),)
    nxt = snapshot_with_allocations(new, (), previous=first)
    got = place(nxt, want)
    assert isinstance(got, Placement) and got.nodes == ("a",)
