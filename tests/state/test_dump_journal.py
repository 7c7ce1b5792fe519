"""A stop between a compaction's full dump and its journal trim keeps the entries
after the dump (mtgpu/state/journal.py, :func:`align_journal_to_dump`). The power cut
that found it: tests/cluster/test_durability.py, among log compactions."""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import pytest
from pysyncobj import SyncObjConsumer, replicated
from pysyncobj.journal import FileJournal

from mtgpu.state.journal import align_journal_to_dump
from mtgpu.state.store import StateStore

pytestmark = pytest.mark.timeout(60)


class Box(SyncObjConsumer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.items: list[int] = []

    @replicated  # type: ignore[misc]
    def put(self, v: int) -> int:
        self.items.append(v)
        return len(self.items)


def entries(path: Path) -> list[tuple[bytes, int, int]]:
    j = FileJournal(str(path))
    try:
        return [(bytes(c), i, t) for c, i, t in (j[k] for k in range(len(j)))]
    finally:
        j._destroy()


def write_journal(path: Path, records: list[tuple[bytes, int, int]]) -> None:
    path.unlink(missing_ok=True)
    j = FileJournal(str(path))
    for r in records:
        j.add(*r)
    j._destroy()


def cut_between_dump_and_trim(state: Path) -> tuple[list[tuple[bytes, int, int]], int]:
    """A state directory as a power cut leaves it between a compaction's dump and its
    trim: the dump at the 10th write, the journal untrimmed, 5 writes after the dump.
    Returns the journal's records and the dump's last index."""
    box = Box()
    store = StateStore("solo", [box], str(state))
    try:
        for i in range(10):
            store.call_sync(box.put, i, timeout=20)
        untrimmed = state / "untrimmed"
        shutil.copyfile(state / "raft.journal", untrimmed)  # acknowledged: on disk
        assert store.snapshot(timeout=20) is True
        for i in range(10, 15):
            store.call_sync(box.put, i, timeout=20)
    finally:
        store.close()
    trimmed = entries(state / "raft.journal")
    old = entries(untrimmed)
    untrimmed.unlink()
    dumped = trimmed[1][1]  # the trimmed journal starts with the dump's last two entries
    assert old[0][1] < trimmed[0][1] and old[-1][1] >= dumped, (old, trimmed)
    merged = old + [e for e in trimmed if e[1] > old[-1][1]]
    assert [e[1] for e in merged] == list(range(merged[0][1], merged[-1][1] + 1))
    write_journal(state / "raft.journal", merged)
    return merged, dumped


def reopened_items(state: Path, want: int) -> tuple[list[int], StateStore]:
    box = Box()
    store = StateStore("solo", [box], str(state))
    deadline = time.monotonic() + 20
    while len(box.items) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # an entry applied twice would show now
    return list(box.items), store


def test_a_stop_between_the_dump_and_the_trim_keeps_the_entries_after_the_dump(tmp_path: Path) -> None:
    merged, dumped = cut_between_dump_and_trim(tmp_path)
    items, store = reopened_items(tmp_path, 15)
    try:
        # Unaligned, PySyncObj cleared the journal: only the dump's 10 items came back.
        assert items == list(range(15))
        assert store.aligned == dumped - 1 - merged[0][1]
        assert entries(tmp_path / "raft.journal")[0][1] == dumped - 1
        assert not list(tmp_path.glob("raft.journal.aligning"))
    finally:
        store.close()


def test_a_journal_that_starts_at_the_dump_is_left_as_it_is(tmp_path: Path) -> None:
    box = Box()
    store = StateStore("solo", [box], str(tmp_path))
    try:
        for i in range(5):
            store.call_sync(box.put, i, timeout=20)
        assert store.snapshot(timeout=20) is True
        store.call_sync(box.put, 5, timeout=20)
    finally:
        store.close()
    before = (tmp_path / "raft.journal").read_bytes()
    assert align_journal_to_dump(tmp_path / "raft.journal", tmp_path / "raft.dump") is None
    assert (tmp_path / "raft.journal").read_bytes() == before
    items, store = reopened_items(tmp_path, 6)
    try:
        assert items == list(range(6)) and store.aligned is None
    finally:
        store.close()


@pytest.mark.parametrize("where", ["term", "command", "short"])
def test_a_journal_of_another_history_than_the_dump_is_left_to_pysyncobj(tmp_path: Path, where: str) -> None:
    merged, dumped = cut_between_dump_and_trim(tmp_path)
    at = next(k for k, e in enumerate(merged) if e[1] == dumped)
    if where == "term":
        cmd, idx, term = merged[at]
        merged[at] = (cmd, idx, term + 1)
    elif where == "command":
        cmd, idx, term = merged[at - 1]
        merged[at - 1] = (cmd + b"x", idx, term)
    else:
        merged = merged[:at]  # ends before the dump's last entry
    write_journal(tmp_path / "raft.journal", merged)
    before = (tmp_path / "raft.journal").read_bytes()
    assert align_journal_to_dump(tmp_path / "raft.journal", tmp_path / "raft.dump") is None
    assert (tmp_path / "raft.journal").read_bytes() == before


def test_no_dump_or_an_unreadable_one_changes_nothing(tmp_path: Path) -> None:
    cut_between_dump_and_trim(tmp_path)
    journal, dump = tmp_path / "raft.journal", tmp_path / "raft.dump"
    before, good_dump = journal.read_bytes(), dump.read_bytes()
    assert align_journal_to_dump(tmp_path / "absent", dump) is None
    # A header whose end offset is past the file: not walked, not changed.
    damaged = bytearray(before)
    struct.pack_into("<I", damaged, 36, len(before) + 100)
    journal.write_bytes(bytes(damaged))
    assert align_journal_to_dump(journal, dump) is None
    assert journal.read_bytes() == bytes(damaged)
    journal.write_bytes(before)
    dump.write_bytes(b"not a dump")
    assert align_journal_to_dump(journal, dump) is None
    dump.unlink()
    assert align_journal_to_dump(journal, dump) is None
    assert journal.read_bytes() == before
    dump.write_bytes(good_dump)
    assert align_journal_to_dump(journal, dump) is not None


def test_the_aligned_journal_is_pysyncobjs_format(tmp_path: Path) -> None:
    merged, dumped = cut_between_dump_and_trim(tmp_path)
    dropped = align_journal_to_dump(tmp_path / "raft.journal", tmp_path / "raft.dump")
    assert dropped is not None
    assert entries(tmp_path / "raft.journal") == merged[dropped:]
    assert merged[dropped][1] == dumped - 1
    # Aligned once, a second start changes nothing.
    assert align_journal_to_dump(tmp_path / "raft.journal", tmp_path / "raft.dump") is None
