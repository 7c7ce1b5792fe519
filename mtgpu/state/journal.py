"""Checking PySyncObj's journal before it is opened, and cutting a damaged tail.

PySyncObj trusts its journal file: a record torn by a power loss or damaged on disk
makes its tick thread raise on every tick, so the daemon never becomes ready and says
only what pickle said. :func:`repair_journal` walks the records first (the format of
PySyncObj 0.3.17's ``FileJournal``, which is why the version is pinned)::

    APP_NAME (24) APP_VERSION (8) FORMAT (4) LAST_RECORD_OFFSET (4)
    then per record: size (4) | idx (8) term (8) command (size - 16) | size (4)

It keeps every record up to the first damaged one, saves the whole original beside it
(``raft.journal.damaged-TIME``), writes the good prefix back and lowers the commit
index kept in ``raft.journal.meta`` to the last record kept. In a cluster the member
then takes the missing entries from the leader, as a member that was down would.

:func:`align_journal_to_dump` then fits the journal to the full dump (``raft.dump``).
When PySyncObj compacts its log it renames the dump into place (synced) first and
trims the journal to the dump's last two entries on its next tick; a power cut in
between leaves a dump newer than the journal's start. At start PySyncObj keeps the
journal only if its first two records are the dump's last two, and otherwise clears
it, losing every entry after the dump: entries this member had synced and
acknowledged. The journal is cut to start at the dump's entries instead, keeping
what follows them.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from pysyncobj import pickle as raft_pickle

log = logging.getLogger("mtgpu.state")

_HEADER = 24 + 8 + 4 + 4
_LAST_OFFSET_AT = 24 + 8 + 4
_REGULAR = 0  # PySyncObj's _COMMAND_TYPE.REGULAR: a pickled replicated call


@dataclass(frozen=True)
class JournalRepair:
    """What :func:`repair_journal` did to a damaged journal."""

    kept: int
    last_index: int | None
    problem: str
    saved_as: str


def _walk(data: bytes) -> tuple[int, int, int | None, str]:
    """(end offset of the good records, how many, last good index, problem or "")."""
    if len(data) < _HEADER or not data.startswith(b"PYSYNCOBJ"):
        return _HEADER, 0, None, "the header is missing or not PySyncObj's"
    last = struct.unpack_from("<I", data, _LAST_OFFSET_AT)[0]
    if last < _HEADER:
        return _HEADER, 0, None, f"the header's end offset {last} is inside the header"
    off, count, prev = _HEADER, 0, None
    while off < last:
        if off + 4 > len(data):
            return off, count, prev, f"record {count + 1} is cut off (the file ends at {len(data)})"
        size = struct.unpack_from("<I", data, off)[0]
        end = off + 4 + size + 4
        if size < 16 or end > min(last, len(data)):
            return off, count, prev, f"record {count + 1} at offset {off} is cut off or its size is damaged"
        if struct.unpack_from("<I", data, end - 4)[0] != size:
            return off, count, prev, f"record {count + 1} at offset {off} does not end with its size"
        idx, _term = struct.unpack_from("<QQ", data, off + 4)
        if prev is not None and idx != prev + 1:
            return off, count, prev, f"record {count + 1} has index {idx} after {prev}"
        command = data[off + 4 + 16 : end - 4]
        if command[:1] == bytes([_REGULAR]):
            try:
                raft_pickle.loads(command[1:])
            except Exception as exc:  # noqa: BLE001 - any failure to decode is damage
                return off, count, prev, f"record {count + 1} (index {idx}) cannot be decoded: {exc}"
        off, count, prev = end, count + 1, idx
    return off, count, prev, ""


def repair_journal(path: str | Path, now: float | None = None) -> JournalRepair | None:
    """Cut ``path`` back to its last intact record; None if it is intact (or absent)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    good_end, kept, last_index, problem = _walk(data)
    if not problem:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now if now is not None else time.time()))
    saved = p.with_name(f"{p.name}.damaged-{stamp}")
    os.replace(p, saved)
    if data.startswith(b"PYSYNCOBJ") and len(data) >= _HEADER:
        head = bytearray(data[:_HEADER])
        struct.pack_into("<I", head, _LAST_OFFSET_AT, good_end)
        fresh = bytes(head) + data[_HEADER:good_end]
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(fresh)
            f.flush()
            os.fsync(f.fileno())
    # else: no usable header; PySyncObj starts a new journal (the dump, if any, stays)
    _lower_commit_index(Path(str(p) + ".meta"), last_index)
    repair = JournalRepair(kept, last_index, problem, str(saved))
    log.error(
        "the state journal %s was damaged: %s. Kept the %d intact records before it "
        "(up to index %s); the original is saved as %s",
        p,
        problem,
        kept,
        last_index,
        saved,
    )
    return repair


def _lower_commit_index(meta: Path, last_index: int | None) -> None:
    try:
        values = raft_pickle.loads(meta.read_bytes())
    except Exception:  # noqa: BLE001 - absent or unreadable: PySyncObj starts from 1
        return
    if not isinstance(values, dict):
        return
    limit = last_index or 1
    if values.get("raftCommitIndex", 1) > limit:
        values["raftCommitIndex"] = limit
        tmp = meta.with_name(meta.name + ".tmp")
        tmp.write_bytes(raft_pickle.dumps(values))
        os.replace(tmp, meta)


def _records(data: bytes) -> list[tuple[int, int, int, bytes]] | None:
    """(offset, idx, term, command) of each record of an intact journal, else None."""
    if len(data) < _HEADER or not data.startswith(b"PYSYNCOBJ"):
        return None
    last = struct.unpack_from("<I", data, _LAST_OFFSET_AT)[0]
    if last < _HEADER or last > len(data):
        return None
    out: list[tuple[int, int, int, bytes]] = []
    off = _HEADER
    while off < last:
        if off + 4 > last:
            return None
        size = struct.unpack_from("<I", data, off)[0]
        end = off + 4 + size + 4
        if size < 16 or end > last or struct.unpack_from("<I", data, end - 4)[0] != size:
            return None
        idx, term = struct.unpack_from("<QQ", data, off + 4)
        out.append((off, idx, term, data[off + 4 + 16 : end - 4]))
        off = end
    return out


def _dump_entries(dump: Path) -> tuple[tuple[bytes, int, int], tuple[bytes, int, int]] | None:
    """The last two log entries a full dump holds ((command, idx, term) each), or None
    when it is absent or cannot be read (PySyncObj then reports it as it loads it)."""
    try:
        with gzip.open(dump, "rb") as f:
            data = raft_pickle.load(f)
        before, last = data[2], data[1]
        pair = (
            (bytes(before[0]), int(before[1]), int(before[2])),
            (bytes(last[0]), int(last[1]), int(last[2])),
        )
    except Exception:  # noqa: BLE001 - absent, damaged or not PySyncObj's: left to it
        return None
    return pair


def align_journal_to_dump(path: str | Path, dump: str | Path) -> int | None:
    """Cut the records before the full dump's last two entries off journal ``path``
    when it still holds them (a power cut between a compaction's dump and its trim).

    Returns how many records were dropped (each is in the dump), or None when nothing
    was changed: no dump, no journal, a journal that already starts at the dump, or
    one that does not hold the dump's entries (PySyncObj then starts from the dump
    alone). The new journal replaces the old by a synced rename, so a cut during
    this leaves one or the other.
    """
    p, d = Path(path), Path(dump)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    entries = _dump_entries(d)
    records = _records(data)
    if entries is None or not records:
        return None
    (cmd0, idx0, term0), (cmd1, idx1, term1) = entries
    first = records[0][1]
    pos = idx0 - first
    if pos <= 0 or pos + 1 >= len(records):
        return None  # already aligned, or the journal lacks the dump's entries (or any after)
    at, r0, r1 = records[pos][0], records[pos], records[pos + 1]
    if (r0[1], r0[2], r0[3]) != (idx0, term0, cmd0) or (r1[1], r1[2], r1[3]) != (idx1, term1, cmd1):
        return None  # another history than the dump's: PySyncObj's clearing is right
    last = struct.unpack_from("<I", data, _LAST_OFFSET_AT)[0]
    head = bytearray(data[:_HEADER])
    struct.pack_into("<I", head, _LAST_OFFSET_AT, _HEADER + last - at)
    tmp = p.with_name(p.name + ".aligning")
    try:
        tmp.unlink()  # left by a cut during an earlier start (STATE_DIR is root's, 0700)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(head) + data[at:last])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    dfd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    log.warning(
        "the state journal %s still held the %d entries before the full dump's index %d "
        "(a stop between writing the dump and trimming the journal): dropped them and kept "
        "the %d entries from there on",
        p,
        pos,
        idx0,
        len(records) - pos,
    )
    return pos
