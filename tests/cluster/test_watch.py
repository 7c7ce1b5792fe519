"""A member follows the Raft leadership in one long-lived task, and that task is what
starts the scheduler on a new leader. A round that fails must not end it: in a
1,000-member load run a member became the Raft leader, took 326 submissions over two
minutes and never placed one (it never logged "now the scheduler")."""

from __future__ import annotations

import asyncio
import logging
import types

from mtgpu.cluster.runtime import ClusterRuntime


class _Members:
    def __init__(self) -> None:
        self.fail = 2  # the first rounds fail, as a damaged member record would

    def all(self):
        if self.fail:
            self.fail -= 1
            raise KeyError("address")
        return [{"name": "m1", "address": "10.0.0.1:22"}]

    def get(self, name):
        return {"name": name}

    def voters(self):
        return ["m1"]


def test_a_failed_round_is_logged_and_leadership_is_still_followed(caplog) -> None:
    rt = ClusterRuntime.__new__(ClusterRuntime)
    rt.members = _Members()
    rt.addresses = {}
    rt.name, rt.role = "m1", "readonly"
    rt._was_leader = False
    rt.coordinator = types.SimpleNamespace(is_leader=lambda: True, leader=lambda: "m1")
    seen: list[bool] = []

    async def on_leader(leader: bool) -> None:
        seen.append(leader)

    rt.on_leader = on_leader
    rt._grant_self = lambda now: None  # type: ignore[method-assign]
    rt._maybe_check_role = lambda: None  # type: ignore[method-assign]

    async def go() -> None:
        task = asyncio.ensure_future(rt._watch())
        for _ in range(60):
            if seen:
                break
            await asyncio.sleep(0.1)
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="mtgpu.cluster"):
        asyncio.run(go())
    assert seen == [True], "the leadership was not noticed after a failed round"
    assert rt.addresses == {"m1": "10.0.0.1:22"}
    assert "following the cluster's leadership failed" in caplog.text and "KeyError" in caplog.text
