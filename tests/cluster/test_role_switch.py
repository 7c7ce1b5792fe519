"""Reopening a replica on the same journal, as a role change does, with real PySyncObj:
the consumers keep their state and no entry is applied twice."""

from __future__ import annotations

import asyncio
import copy
import gzip
from pathlib import Path

import pytest
from pysyncobj import SyncObjConsumer, replicated
from pysyncobj import pickle as raft_pickle
from pysyncobj.node import Node

from mtgpu.state.store import StateStore, forget_term, strip_dump_nodes

pytestmark = pytest.mark.timeout(60)


class Counter(SyncObjConsumer):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.seen: list[int] = []

    @replicated
    def add(self, n: int) -> int:
        self.total += n
        self.seen.append(n)
        return self.total


def _reopen(tmp_path: Path, snapshot: bool) -> tuple[Counter, list[int]]:
    async def go() -> tuple[Counter, list[int]]:
        c = Counter()
        blank = copy.deepcopy(c._serialize())
        store = StateStore("solo", [c], str(tmp_path))
        await store.wait_ready(10)
        for n in (1, 2, 3):
            await store.call(c.add, n)
        fresh = await asyncio.to_thread(store.snapshot) if snapshot else False
        store.close()
        if not fresh:  # what a role change does without a snapshot: replay onto blank state
            for k in c._serialize():
                del c.__dict__[k]
            c._deserialize(copy.deepcopy(blank))
        again = StateStore("solo", [c], str(tmp_path))
        await again.wait_ready(10)
        await again.call(c.add, 10)
        before = list(c.seen)
        again.close()
        return c, before

    return asyncio.run(go())


@pytest.mark.parametrize("snapshot", [True, False], ids=["from a snapshot", "replayed"])
def test_reopened_store_keeps_state_and_applies_nothing_twice(tmp_path: Path, snapshot: bool) -> None:
    c, seen = _reopen(tmp_path, snapshot)
    assert c.total == 16 and seen == [1, 2, 3, 10]
    assert (tmp_path / "raft.dump").exists() == snapshot
    if snapshot:
        # Written at gzip's fastest level (the header's XFL byte is 4), not its best
        # (2): the dump is made in the thread that sends Raft's heartbeats.
        assert (tmp_path / "raft.dump").read_bytes()[8] == 4


def test_dump_and_term_cleanup(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    with gzip.open(dump, "wb") as g:
        raft_pickle.dump(([{}], (b"x", 5, 2), (b"y", 4, 2), {Node("a"), Node("me"), None}), g)
    strip_dump_nodes(str(tmp_path), {None, "me"})
    with gzip.open(dump, "rb") as g:
        data = raft_pickle.load(g)
    assert data[3] == {Node("a")} and data[1] == (b"x", 5, 2)
    meta = tmp_path / "raft.journal.meta"
    meta.write_bytes(raft_pickle.dumps({"currentTerm": 9, "votedForNodeId": "me", "raftCommitIndex": 7}))
    forget_term(str(tmp_path))
    assert raft_pickle.loads(meta.read_bytes()) == {"raftCommitIndex": 7}
