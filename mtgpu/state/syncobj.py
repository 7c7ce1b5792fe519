"""Every private part of PySyncObj that MTGPU reaches, in one place.

PySyncObj has no public way to do a few things MTGPU needs (read how far the log and
the journal are, elect a lone member at once, wake the ticking thread, let a custom
transport share the node's poller). Those reads and writes go through the functions
here, and nowhere else, so that an upgrade has one module to check:
tests/state/test_syncobj.py checks each attribute against the installed PySyncObj
and fails naming the one that moved. pyproject.toml pins the release they were
written for (:data:`TESTED`); :func:`check` says at start what a different one lacks.

The names (PySyncObj 0.3.17, ``pysyncobj/syncobj.py``):

===============================  ============================================
``_SyncObj__getCurrentLogIndex``  the last index in the node's log
``_SyncObj__raftCommitIndex``     the highest index known committed
``_SyncObj__raftLastApplied``     the highest index applied to the consumers
``_SyncObj__lastSerializedEntry`` the log index of the last snapshot written
``_SyncObj__raftElectionDeadline`` when the node next calls an election
``_SyncObj__lastResponseTime``    when the leader last heard each other node
``_SyncObj__pipeNotifier``        wakes the ticking thread (``appendEntriesUseBatch=False``)
``_SyncObj__thread``              the ticking thread (autoTick only)
``_getLeader`` / ``_isLeader``    the leader as the node sees it
``_getConf``                      the node's SyncObjConf
``_poller``                       the node's poller, shared with the transport
``_SyncObj__raftLog``             the node's journal (mtgpu/state/durable.py syncs it)
``_onTick``                       one tick; ``DurableSyncObj`` syncs before it
``_SyncObj__raftNextIndex``       the leader's next index to send, per follower
===============================  ============================================

And two module attributes MTGPU replaces (mtgpu/state/durable.py), so that what
PySyncObj writes reaches the disk before it is counted:

====================================  ========================================
``pysyncobj.syncobj.createJournal``   makes each node's journal
``pysyncobj.serializer.atomicReplace`` renames a full dump into place
====================================  ========================================
"""

from __future__ import annotations

import threading
from typing import Any

#: The PySyncObj release these attributes were read from.
TESTED = "0.3.17"

#: Attributes every SyncObj has once constructed.
ALWAYS = (
    "_SyncObj__getCurrentLogIndex",
    "_SyncObj__raftCommitIndex",
    "_SyncObj__raftLastApplied",
    "_SyncObj__lastSerializedEntry",
    "_SyncObj__raftElectionDeadline",
    "_SyncObj__lastResponseTime",
    "_SyncObj__thread",
    "_getLeader",
    "_isLeader",
    "_getConf",
    "_poller",
    "_SyncObj__raftLog",
    "_onTick",
    "_SyncObj__raftNextIndex",
)
#: Module attributes replaced at import (``module``, ``name``).
REPLACED = (("pysyncobj.syncobj", "createJournal"), ("pysyncobj.serializer", "atomicReplace"))
#: Made only without batched appends (``SyncObjConf(appendEntriesUseBatch=False)``, as
#: mtgpu/state/store.py configures every node).
UNBATCHED = ("_SyncObj__pipeNotifier",)


def check(sync: Any) -> list[str]:
    """The attributes this module uses that ``sync`` (a constructed SyncObj) lacks."""
    conf = sync._getConf() if hasattr(sync, "_getConf") else None
    unbatched = conf is not None and not getattr(conf, "appendEntriesUseBatch", True)
    want = ALWAYS + (UNBATCHED if unbatched else ())
    return [name for name in want if not hasattr(sync, name)]


#: Module attributes of :data:`REPLACED` that were not there to replace.
_LACKED: list[str] = []


def missing_module_attributes() -> list[str]:
    """The module attributes of :data:`REPLACED` the installed PySyncObj lacked."""
    return list(_LACKED)


def _replace(module_name: str, name: str, value: Any) -> None:
    import importlib

    module = importlib.import_module(module_name)
    if not hasattr(module, name) and f"{module_name}.{name}" not in _LACKED:
        _LACKED.append(f"{module_name}.{name}")
    setattr(module, name, value)


def raft_log(sync: Any) -> Any:
    """The node's journal (a ``pysyncobj.journal.Journal``)."""
    return sync._SyncObj__raftLog


def next_index(sync: Any) -> dict[Any, int]:
    """The leader's next log index to send to each follower (the dict itself)."""
    index: dict[Any, int] = sync._SyncObj__raftNextIndex
    return index


def use_journal_factory(factory: Any) -> None:
    """Make PySyncObj create every node's journal with ``factory(journal_file)``."""
    _replace("pysyncobj.syncobj", "createJournal", factory)


def use_dump_replace(replace: Any) -> None:
    """Make PySyncObj move a full dump into place with ``replace(tmp, path)``
    (written by the node, or received from the leader)."""
    _replace("pysyncobj.serializer", "atomicReplace", replace)


def current_log_index(sync: Any) -> int:
    """The last index in the node's log (committed or not)."""
    return int(sync._SyncObj__getCurrentLogIndex())


def commit_index(sync: Any) -> int:
    return int(sync._SyncObj__raftCommitIndex)


def last_applied(sync: Any) -> int:
    return int(sync._SyncObj__raftLastApplied)


def last_serialized_entry(sync: Any) -> int | None:
    """The log index the last snapshot was written at, None before the first."""
    value = sync._SyncObj__lastSerializedEntry
    return None if value is None else int(value)


def set_election_deadline(sync: Any, when: float) -> None:
    """Make the node call its next election at ``when`` (monotonic; 0: at its next tick)."""
    sync._SyncObj__raftElectionDeadline = when


def election_deadline(sync: Any) -> float:
    """When (monotonic) the node calls its next election; a follower's moves ahead
    with every message from its leader."""
    return float(sync._SyncObj__raftElectionDeadline)


def last_response_time(sync: Any, node: Any) -> float:
    """When (monotonic) this node, as leader, last heard ``node`` (one of its
    ``otherNodes``); 0.0 if never."""
    return float(sync._SyncObj__lastResponseTime.get(node, 0.0))


def wake(sync: Any) -> bool:
    """Wake the ticking thread now; False when the node has no notifier (batched appends)."""
    notifier = getattr(sync, "_SyncObj__pipeNotifier", None)
    if notifier is None:
        return False
    notifier.notify()
    return True


def tick_thread(sync: Any) -> threading.Thread | None:
    return getattr(sync, "_SyncObj__thread", None)


def leader(sync: Any) -> Any:
    """The leader's node as this member sees it, or None."""
    return sync._getLeader()


def is_leader(sync: Any) -> bool:
    return bool(sync._isLeader())


def conf(sync: Any) -> Any:
    """The node's ``SyncObjConf``."""
    return sync._getConf()


def poller(sync: Any) -> Any:
    """The node's poller, for a transport that adds its own descriptors to it."""
    return sync._poller
