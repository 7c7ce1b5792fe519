"""Catching up with the scheduler's log (Raft's read-index) while the scheduler role
moves: a member asks again while the answer is one a moment mends (no scheduler
elected, the role passing to another member, the scheduler out of reach), and refuses
at once on any other answer. A first login on a member during the hand-off of the
scheduler role was refused because the first "no scheduler" answer ended the wait."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from mtgpu.cluster.runtime import ClusterRuntime
from mtgpu.errors import ApiError


class _Peers:
    """The scheduler's answers to ``cluster.log_index``, one per call, in order; the
    last one repeats."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers
        self.calls = 0

    async def call(self, target, method, timeout=None):
        assert method == "cluster.log_index"
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        return {"index": answer}


def _member(peers: _Peers, applied: int, leaders: list[str | None] | None = None) -> ClusterRuntime:
    """A member whose replica has applied ``applied`` entries; ``leaders`` is who it
    believes the scheduler is at each ask (the last repeats)."""
    rt = ClusterRuntime.__new__(ClusterRuntime)
    rt._next_round = None
    rt._rounds_task = None
    seen = iter(leaders or ["m1"])
    last: list[str | None] = ["m1"]

    def leader():
        last[0] = next(seen, last[0])
        return last[0]

    rt.coordinator = types.SimpleNamespace(is_leader=lambda: False, leader=leader)
    rt.peers = peers
    rt.store = types.SimpleNamespace(sync=types.SimpleNamespace(raftLastApplied=applied))
    return rt


def test_no_scheduler_yet_is_asked_again_until_one_answers():
    peers = _Peers([7])
    rt = _member(peers, applied=7, leaders=[None, None, "m3"])
    asyncio.run(rt.catch_up(timeout=3))
    assert peers.calls == 1  # asked the scheduler once it was elected


def test_the_role_passing_between_members_is_asked_again():
    peers = _Peers(
        [
            ApiError("not the scheduler; ask m3", "not_leader"),
            OSError("the connection to m1 closed"),
            ApiError("starting", "starting"),
            9,
        ]
    )
    rt = _member(peers, applied=9)
    asyncio.run(rt.catch_up(timeout=3))
    assert peers.calls == 4


def test_any_other_refusal_ends_the_wait_at_once():
    peers = _Peers([ApiError("no such method", "bad_request"), 5])
    rt = _member(peers, applied=5)
    began = time.monotonic()
    with pytest.raises(ApiError) as err:
        asyncio.run(rt.catch_up(timeout=3))
    assert err.value.code == "not_caught_up"
    assert "no such method" in str(err.value)
    assert peers.calls == 1
    assert time.monotonic() - began < 2.5  # not the whole timeout


def test_a_scheduler_never_elected_is_a_retryable_refusal_after_the_timeout():
    peers = _Peers([3])
    rt = _member(peers, applied=3, leaders=[None])
    with pytest.raises(ApiError) as err:
        asyncio.run(rt.catch_up(timeout=0.4))
    assert err.value.code == "not_caught_up"
    assert err.value.retryable
    assert peers.calls == 0
