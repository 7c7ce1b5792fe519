"""The journal is synced before Raft counts or reports an entry (mtgpu/state/durable.py),
on real PySyncObj nodes with a recording transport. The power cut itself:
tests/state/test_durable_crash.py and tests/cluster/test_durability.py."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from mtgpu.errors import StateError
from mtgpu.state import syncobj
from mtgpu.state.durable import DurableJournal, DurableSyncObj, durable_replace, replace_dump
from mtgpu.state.store import StateStore

NOOP = b"\x01"  # PySyncObj's _COMMAND_TYPE.NO_OP


class Recording(Transport):  # type: ignore[misc]
    sent: list[tuple[str, dict[str, Any]]]

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        super().__init__(syncObj, selfNode, otherNodes)
        self.sent = []

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:  # noqa: N802
        return None

    def send(self, node: Node, message: Any) -> bool:
        self.sent.append((node.id, message))
        return True

    def addNode(self, node: Node) -> None:  # noqa: N802
        return None

    def dropNode(self, node: Node) -> None:  # noqa: N802
        return None

    def destroy(self) -> None:
        return None


def follower(tmp_path: Path, fsync: bool = True) -> tuple[DurableSyncObj, Recording, DurableJournal]:
    made: list[Recording] = []

    def transport(*a: Any) -> Recording:
        made.append(Recording(*a))
        return made[0]

    conf = SyncObjConf(
        autoTick=False,
        journalFile=str(tmp_path / "raft.journal"),
        raftMinTimeout=30,
        raftMaxTimeout=31,
        connectionTimeout=31,
    )
    s = DurableSyncObj(
        Node("a"), [Node("b")], conf=conf, nodeClass=Node, transportClass=transport, fsync=fsync
    )
    journal = syncobj.raft_log(s)
    assert isinstance(journal, DurableJournal)
    return s, made[0], journal


def append(t: Recording, entries: list[tuple[bytes, int, int]]) -> None:
    t._onMessageReceived(
        Node("b"),
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 1,
            "prevLogIdx": 1,
            "prevLogTerm": 0,
            "entries": entries,
        },
    )


def test_a_follower_reports_appended_entries_only_after_syncing_them(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    try:
        s.sync_journal()
        append(t, [(NOOP, 2, 1), (NOOP, 3, 1)])
        assert journal.needs_sync
        assert [m for _, m in t.sent if m["type"] == "next_node_idx"] == []  # held: not on disk yet
        before = journal.syncs
        s.sync_journal()
        assert journal.syncs == before + 1 and not journal.needs_sync
        (ack,) = [m for _, m in t.sent if m["type"] == "next_node_idx"]
        assert ack["next_node_idx"] == 4 and ack["success"] is True
    finally:
        s.destroy()


def test_a_burst_of_appends_costs_one_sync(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    try:
        s.sync_journal()
        before = journal.syncs
        for i in range(2, 12):
            t._onMessageReceived(
                Node("b"),
                {
                    "type": "append_entries",
                    "term": 1,
                    "commit_index": 1,
                    "prevLogIdx": i - 1,
                    "prevLogTerm": 0 if i == 2 else 1,
                    "entries": [(NOOP, i, 1)],
                },
            )
        s.doTick(0)  # the tick starts with the sync
        assert journal.syncs == before + 1
        acks = [m["next_node_idx"] for _, m in t.sent if m["type"] == "next_node_idx"]
        assert acks == list(range(3, 13))  # all of them, in order, after the one sync
    finally:
        s.destroy()


def test_a_sync_is_an_fsync_that_lets_the_event_loop_run(tmp_path: Path, monkeypatch: Any) -> None:
    """CPython's mmap.flush() holds the GIL for the whole msync, which stopped the
    daemon's event loop (every tenant's request) for each disk write; fsync releases
    it and, on Linux, writes the mapped pages too (the power cut tests read what
    reached the disk)."""
    s, t, journal = follower(tmp_path)
    held: list[str] = []
    fsynced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    try:
        monkeypatch.setattr(journal, "flush", lambda: held.append("mmap.flush"))
        monkeypatch.setattr(os, "fsync", fsync)
        s.sync_journal()
        append(t, [(NOOP, 2, 1), (NOOP, 3, 1)])
        s.sync_journal()
        assert held == [] and fsynced and not journal.needs_sync
    finally:
        monkeypatch.undo()
        s.destroy()


def test_a_vote_is_sent_only_once_stored(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    try:
        s.sync_journal()
        t._onMessageReceived(
            Node("b"), {"type": "request_vote", "term": 5, "last_log_index": 1, "last_log_term": 0}
        )
        assert journal.meta_dirty and [m for _, m in t.sent if m["type"] == "response_vote"] == []
        s.sync_journal()
        assert [m["term"] for _, m in t.sent if m["type"] == "response_vote"] == [5]
        assert journal.getVotedForNodeId() == "b" and not journal.needs_sync
    finally:
        s.destroy()


def test_a_leaders_appends_go_out_before_its_own_sync(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    try:
        journal.add(NOOP, 2, 1)
        assert journal.needs_sync
        s._send(t.send, Node("b"), {"type": "append_entries", "term": 1})
        s._send(t.send, Node("b"), {"type": "next_node_idx", "term": 1})
        assert [m["type"] for _, m in t.sent] == ["append_entries"]
    finally:
        s.destroy()


def test_without_fsync_nothing_waits(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path, fsync=False)
    try:
        append(t, [(NOOP, 2, 1)])
        assert [m["next_node_idx"] for _, m in t.sent if m["type"] == "next_node_idx"] == [3]
        before = journal.syncs
        s.sync_journal()
        assert journal.syncs == before
    finally:
        s.destroy()


def test_a_failed_sync_stops_acknowledging_for_good(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    try:
        append(t, [(NOOP, 2, 1)])
        os.close(journal._fd)  # the next fsync fails (EBADF), as on an I/O error
        with pytest.raises(StateError, match="could not be synced"):
            s.sync_journal()
        journal._fd = os.open(journal.path, os.O_RDONLY)
        journal.dirty = True
        with pytest.raises(StateError, match="could not be synced"):
            s.sync_journal()  # a later fsync proves nothing: still refused
        assert [m for _, m in t.sent if m["type"] == "next_node_idx"] == []
    finally:
        s.destroy()


class Box(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.items: list[int] = []

    @replicated  # type: ignore[misc]
    def put(self, v: int) -> int:
        self.items.append(v)
        return len(self.items)


def test_a_standalone_store_commits_only_synced_entries(tmp_path: Path) -> None:
    store = StateStore("solo", [Box()], str(tmp_path))
    box = store.consumers[0]
    journal = syncobj.raft_log(store.sync)
    seen: list[tuple[int, int]] = []
    try:
        for i in range(20):
            done = threading.Event()

            def cb(result: Any, err: int, done: threading.Event = done) -> None:
                # On the tick thread, as the tenant's acknowledgement is given.
                seen.append((syncobj.commit_index(store.sync), journal.synced_index))
                done.set()

            box.put(i, callback=cb)
            assert done.wait(20)
    finally:
        store.close()
    assert len(seen) == 20 and all(committed <= synced for committed, synced in seen), seen


def test_durable_replace_moves_the_file_with_its_data(tmp_path: Path) -> None:
    src, dst = tmp_path / "raft.dump.tmp", tmp_path / "raft.dump"
    with gzip.open(src, "wb") as f:
        f.write(b"state")
    dst.write_bytes(b"old")
    durable_replace(str(src), str(dst))
    assert not src.exists() and gzip.decompress(dst.read_bytes()) == b"state"


def test_pysyncobj_renames_its_dumps_and_makes_journals_through_mtgpu(tmp_path: Path) -> None:
    import pysyncobj.serializer
    import pysyncobj.syncobj

    assert pysyncobj.serializer.atomicReplace is replace_dump
    assert syncobj.missing_module_attributes() == []
    box = Box()
    store = StateStore("solo", [box], str(tmp_path))
    try:
        assert isinstance(syncobj.raft_log(store.sync), DurableJournal)
        for i in range(3):
            store.call_sync(box.put, i, timeout=20)
        assert store.snapshot(timeout=20) is True
    finally:
        store.close()
    assert (tmp_path / "raft.dump").exists() and not (tmp_path / "raft.dump.tmp").exists()


def test_a_late_acknowledgement_does_not_make_the_leader_send_its_window_again(tmp_path: Path) -> None:
    s, t, journal = follower(tmp_path)
    b = Node("b")
    try:
        t._onNodeConnected(b)
        syncobj.set_election_deadline(s, 0.0)
        s.doTick(0)  # a candidate; its vote request goes out once its term is stored
        (vote,) = [m for _, m in t.sent if m["type"] == "request_vote"]
        assert not journal.needs_sync
        t._onMessageReceived(b, {"type": "response_vote", "term": vote["term"]})
        assert syncobj.is_leader(s)
        for _ in range(5):
            journal.add(NOOP, syncobj.current_log_index(s) + 1, vote["term"])
        index = syncobj.next_index(s)
        for _ in range(100):  # until the next heartbeat carries them (every 0.1 s)
            if index[b] == syncobj.current_log_index(s) + 1:
                break
            s.doTick(0.01)
        sent_up_to = index[b]
        assert sent_up_to == syncobj.current_log_index(s) + 1  # everything went out
        ack = {"type": "next_node_idx", "term": vote["term"], "success": True, "reset": False}
        t._onMessageReceived(b, {**ack, "next_node_idx": sent_up_to - 3})  # written before the last 3
        assert index[b] == sent_up_to
        t._onMessageReceived(b, {**ack, "success": False, "reset": True, "next_node_idx": 2})
        assert index[b] == 2  # a follower that lacks entries still rewinds it
    finally:
        s.destroy()


def test_a_leader_counts_its_own_entry_only_once_it_is_fsynced(tmp_path: Path, monkeypatch: Any) -> None:
    """PySyncObj's leader counts its own copy towards every commit unconditionally
    (``count = 1``): it is safe only because every entry it appends is fsynced before
    its next commit loop (the tick starts with the sync). Here its follower
    acknowledges each entry the moment the leader appends it, before any sync, and
    every commit-index advance must find the entry already fsynced."""
    made: list[Recording] = []

    def transport(*a: Any) -> Recording:
        made.append(Recording(*a))
        return made[0]

    conf = SyncObjConf(
        autoTick=False,
        journalFile=str(tmp_path / "raft.journal"),
        raftMinTimeout=30,
        raftMaxTimeout=31,
        connectionTimeout=31,
        appendEntriesUseBatch=False,
    )
    box = Box()
    s = DurableSyncObj(
        Node("a"), [Node("b")], conf=conf, consumers=[box], nodeClass=Node, transportClass=transport
    )
    t, journal, b = made[0], syncobj.raft_log(s), Node("b")
    fsynced = [0]  # the last index the journal held when its fsync returned
    commits: list[tuple[int, int]] = []  # (commit index set by the leader, fsynced then)
    real_fsync, real_add, real_commit = os.fsync, journal.add, journal.setRaftCommitIndex

    def fsync(fd: int) -> None:
        last = journal[-1][1] if fd == journal._fd and len(journal) else None
        real_fsync(fd)
        if last is not None:
            fsynced[0] = last

    def add(command: bytes, idx: int, term: int) -> None:
        real_add(command, idx, term)
        if syncobj.is_leader(s):  # an infinitely fast follower: on its disk at once
            ack = {"type": "next_node_idx", "term": term, "next_node_idx": idx + 1}
            t._onMessageReceived(b, {**ack, "success": True, "reset": False})

    def set_commit(index: int) -> None:
        if syncobj.is_leader(s):
            commits.append((index, fsynced[0]))
        real_commit(index)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(journal, "add", add)
    monkeypatch.setattr(journal, "setRaftCommitIndex", set_commit)
    done: list[int] = []
    try:
        t._onNodeConnected(b)
        syncobj.set_election_deadline(s, 0.0)
        s.doTick(0)
        (vote,) = [m for _, m in t.sent if m["type"] == "request_vote"]
        # Elected outside a tick, as by a message: its no-op entry is appended there.
        t._onMessageReceived(b, {"type": "response_vote", "term": vote["term"]})
        assert syncobj.is_leader(s)
        for i in range(30):
            box.put(i, callback=lambda r, e: done.append(e))
            if i % 7 == 0:
                s.doTick(0)
        for _ in range(50):
            if len(done) == 30:
                break
            s.doTick(0)
    finally:
        monkeypatch.undo()
        s.destroy()
    assert done == [0] * 30
    assert commits and commits[-1][0] == syncobj.current_log_index(s)
    assert all(index <= synced for index, synced in commits), commits
