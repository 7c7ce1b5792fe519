"""Acknowledged means on disk: the Raft journal is fsynced before an entry counts.

PySyncObj's ``FileJournal`` writes through ``mmap`` and syncs only when it is closed,
and its term/vote file is replaced without an fsync: an acknowledged submission sat in
the page cache, lost with a power cut. Here:

* :class:`DurableJournal` is that journal marking itself dirty on every change
  (an entry added, a tail cut, the log trimmed after a dump, a new term or vote);
  :meth:`DurableJournal.sync` fsyncs the journal (its pages written through the
  mapping too), and the term/vote file and their directory when those changed.
* :class:`DurableSyncObj` syncs at two points of every tick: at its start, before the
  leader counts its own copy towards a commit, and at its end, before the tick thread
  waits for messages (so a leader's fsync overlaps its followers'). Messages that
  report the journal (a follower's ``next_node_idx`` with its match index, a vote, a
  vote request, a relayed command) are held while the journal is dirty and sent right
  after the next sync. Raft tolerates reordered messages, and a leader's
  ``append_entries`` go out at once: the leader counts itself only once synced.

  This is group commit: one fsync per tick covers every entry appended in it (a
  follower answering a burst of appends syncs once), not one per entry.
* the full dump written when the log is compacted (``raft.dump``, also one received
  from the leader) is fsynced before its rename and its directory after, so the
  journal trimmed after it is never durable before the dump it relies on.

A journal that cannot be synced (an I/O error) stops the member acknowledging: Linux
may drop the failed pages, so a later fsync that succeeds proves nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.journal import FileJournal, MemoryJournal

from mtgpu.errors import StateError
from mtgpu.state import syncobj as parts

log = logging.getLogger("mtgpu.state")

#: Messages a leader may send before its own copy is on disk (Raft: the leader counts
#: itself towards a commit only once it is, which the tick's first sync ensures).
UNHELD = frozenset({"append_entries"})


def fsync_path(path: str | os.PathLike[str], directory: bool = False) -> None:
    """fsync ``path`` (a file, or a directory for the names in it)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_replace(src: str, dst: str) -> None:
    """Rename ``src`` over ``dst`` with both the data and the new name on disk."""
    fsync_path(src)
    os.rename(src, dst)
    fsync_path(os.path.dirname(os.path.abspath(dst)) or ".", directory=True)


class DurableJournal(FileJournal):
    """PySyncObj's FileJournal (same file format) that knows when it needs a sync."""

    def __init__(self, journal_file: str) -> None:
        existed = os.path.exists(journal_file)
        super().__init__(journal_file)
        self.path = journal_file
        self.meta_path = journal_file + ".meta"
        self.dir = os.path.dirname(os.path.abspath(journal_file))
        self.dirty = not existed  # a new file: its name and header need a sync
        self.meta_dirty = False
        self.dir_dirty = not existed
        self.syncs = 0
        #: The last log index on disk as of the last sync (0: none yet).
        self.synced_index = 0
        self.broken: OSError | None = None
        self._fd = os.open(journal_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.dirty = True

    def clear(self) -> None:
        super().clear()
        self.dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - PySyncObj's name
        super().deleteEntriesFrom(entryFrom)
        self.dirty = True

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802,N803
        super().setCurrentTerm(term, votedForNodeId)
        self.meta_dirty = self.dir_dirty = True  # stored by a rename, not synced

    @property
    def needs_sync(self) -> bool:
        return self.dirty or self.meta_dirty or self.dir_dirty

    def sync(self) -> bool:
        """Put every change so far on disk; False if there was none. Raises
        :class:`StateError` once an fsync has failed (and on every later call)."""
        if self.broken is not None:
            raise StateError(f"the state journal {self.path} could not be synced ({self.broken}); restart")
        if not self.needs_sync:
            return False
        last = self[-1][1] if len(self) else 0
        try:
            if self.dirty:
                self.dirty = False
                # fsync, not the mapping's flush(): on Linux the pages written through a
                # shared mapping are the file's page cache, dirty-tracked, and fsync
                # writes them back with the size the mapping's growth changed
                # (msync(MS_SYNC) is the same writeback of the file's range). CPython's
                # mmap.flush() holds the GIL through the msync, so every sync stopped
                # the event loop serving tenants for a disk write: 14 % of the GIL's time
                # on a scheduler of 1,000 members (benchmarks/README.md). The power cut
                # test (tests/cluster/test_durability.py) reads what reached the disk.
                os.fsync(self._fd)
            if self.meta_dirty:
                self.meta_dirty = False
                fsync_path(self.meta_path)
            if self.dir_dirty:
                self.dir_dirty = False
                fsync_path(self.dir, directory=True)
        except OSError as exc:
            self.broken = exc
            log.critical(
                "cannot sync the state journal %s: %s; this member stops acknowledging", self.path, exc
            )
            raise StateError(f"the state journal {self.path} could not be synced ({exc}); restart") from exc
        self.syncs += 1
        self.synced_index = last
        return True

    def _destroy(self) -> None:
        super()._destroy()
        try:
            os.close(self._fd)
        except OSError:
            pass


def create_journal(journal_file: str | None = None) -> Any:
    """PySyncObj's ``createJournal``, making :class:`DurableJournal` for a file."""
    return MemoryJournal() if journal_file is None else DurableJournal(journal_file)


#: PySyncObj names a full dump received from the leader ``<dump>.1.tmp`` until it is
#: complete (its own are ``<dump>.tmp``).
RECEIVED_SUFFIX = ".1.tmp"
#: Called (on PySyncObj's thread) with the refusal when a received dump is refused.
_on_refused: list[Callable[[str], None]] = []


def on_refused_dump(fn: Callable[[str], None]) -> Callable[[], None]:
    """Call ``fn(message)`` when a full dump from the leader is refused (its state is
    of a newer format); returns what unregisters it."""
    _on_refused.append(fn)
    return lambda: _on_refused.remove(fn) if fn in _on_refused else None


def replace_dump(src: str, dst: str) -> None:
    """Move a full dump into place durably; one received from the leader is checked
    first (:func:`mtgpu.state.codec.check_received_dump`). A dump of a newer format
    is removed, this member's is left as it was, and the refusal is logged and told
    to :func:`on_refused_dump`'s listeners: PySyncObj sees the rename fail and
    does not load it."""
    if src.endswith(RECEIVED_SUFFIX):
        from mtgpu.state import codec

        try:
            codec.check_received_dump(src)
        except codec.StateFormatError as exc:
            try:
                os.unlink(src)
            except OSError:
                pass
            log.error("%s", exc)
            for fn in list(_on_refused):
                fn(str(exc))
            raise
    durable_replace(src, dst)


parts.use_journal_factory(create_journal)
parts.use_dump_replace(replace_dump)


class DurableSyncObj(SyncObj):
    """A SyncObj that acknowledges only what its journal has synced (``fsync=True``).

    With ``fsync=False`` it behaves as PySyncObj does (the journal reaches the disk
    when the kernel writes it back), for benchmarks and throw-away state.
    """

    def __init__(
        self,
        self_node: Any,
        other_nodes: Sequence[Any],
        *,
        transportClass: Callable[..., Any],  # noqa: N803 - PySyncObj's name
        fsync: bool = True,
        **kw: Any,
    ) -> None:
        # Set before SyncObj.__init__: it leaves the attributes it finds out of its dumps.
        self.mtgpu_fsync = fsync
        self.mtgpu_journal: DurableJournal | None = None
        self.mtgpu_held: list[tuple[Callable[..., Any], Any, Any]] = []

        def transport(sync: Any, node: Any, others: Any) -> Any:
            # Called while SyncObj constructs, after its journal and before its tick thread.
            t = transportClass(sync, node, others)
            journal = parts.raft_log(sync)
            self.mtgpu_journal = journal if isinstance(journal, DurableJournal) else None
            real = t.send
            t.send = lambda n, message: self._send(real, n, message)
            set_receiver = t.setOnMessageReceivedCallback
            t.setOnMessageReceivedCallback = lambda cb: set_receiver(
                None if cb is None else self._receiver(cb)
            )
            return t

        super().__init__(self_node, other_nodes, transportClass=transport, **kw)
        self.addOnTickCallback(self.sync_journal)

    def _send(self, real: Callable[..., Any], node: Any, message: Any) -> bool:
        j = self.mtgpu_journal
        if (
            not self.mtgpu_fsync
            or j is None
            or not (self.mtgpu_held or j.needs_sync)
            or (isinstance(message, dict) and message.get("type") in UNHELD)
        ):
            return bool(real(node, message))
        self.mtgpu_held.append((real, node, message))
        return True

    def _receiver(self, deliver: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def receive(node: Any, message: Any) -> None:
            # PySyncObj's leader sets a follower's next index back to what each
            # acknowledgement says, so every tick then sends again all it had sent since:
            # with acknowledgements that wait for a sync, the whole window, over and over.
            # Keep the index where it was after a success; a follower missing entries
            # answers the next append with a failure (``reset``), which still rewinds it.
            if not (
                isinstance(message, dict)
                and message.get("type") == "next_node_idx"
                and message.get("success")
                and not message.get("reset")
            ):
                deliver(node, message)
                return
            index = parts.next_index(self)
            before = index.get(node)
            deliver(node, message)
            if before is not None and index.get(node, before) < before:
                index[node] = before

        return receive

    def sync_journal(self) -> None:
        """Sync the journal if it changed, then send what waited for it (tick thread)."""
        j = self.mtgpu_journal
        if not self.mtgpu_fsync or j is None:
            return
        j.sync()
        held, self.mtgpu_held = self.mtgpu_held, []
        for real, node, message in held:
            real(node, message)

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802,N803 - PySyncObj's names
        self.sync_journal()
        super()._onTick(timeToWait)
