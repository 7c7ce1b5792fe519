"""Each private part of PySyncObj that mtgpu/state/syncobj.py reaches, checked against
the installed PySyncObj on a real node: a release that renamed or changed one fails
here, naming it, instead of misbehaving in a running cluster."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pysyncobj
import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated

from mtgpu.state import syncobj

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Counter(SyncObj):
    def __init__(self, port: int, conf: SyncObjConf) -> None:
        super().__init__(f"127.0.0.1:{port}", [], conf)
        self.value = 0

    @replicated
    def add(self, n: int) -> int:
        self.value += n
        return self.value


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tick_until(node: SyncObj, cond: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"PySyncObj {getattr(pysyncobj, '__version__', '?')}: not seen: {what}")
        node.doTick(0.01)


@pytest.fixture
def node(tmp_path) -> Iterator[Counter]:
    """A lone node ticked by the test (no thread), with a journal and dumps."""
    conf = SyncObjConf(
        autoTick=False, fullDumpFile=str(tmp_path / "dump"), journalFile=str(tmp_path / "journal")
    )
    n = Counter(_port(), conf)
    _tick_until(n, lambda: n._isLeader(), "a lone node became leader")
    yield n
    n.destroy()


@pytest.fixture
def ticking() -> Iterator[Counter]:
    """A lone node with its own ticking thread, configured as the store's are."""
    n = Counter(_port(), SyncObjConf(autoTick=True, appendEntriesUseBatch=False))
    yield n
    n.destroy()
    t = syncobj.tick_thread(n)
    if t is not None:
        t.join(5)


def test_the_pinned_release_is_installed() -> None:
    from importlib import metadata

    assert metadata.version("pysyncobj") == syncobj.TESTED


def test_every_attribute_is_there(node: Counter, ticking: Counter) -> None:
    assert syncobj.check(node) == []
    assert syncobj.check(ticking) == []
    assert syncobj.tick_thread(ticking) is not None
    assert "_SyncObj__pipeNotifier" in syncobj.UNBATCHED  # checked on the ticking node


def test_check_names_what_a_different_release_lacks(node: Counter) -> None:
    class Older:
        _getLeader = _isLeader = _poller = None

        def _getConf(self) -> SyncObjConf:
            return SyncObjConf(appendEntriesUseBatch=False)

    missing = syncobj.check(Older())
    assert "_SyncObj__getCurrentLogIndex" in missing and "_SyncObj__raftCommitIndex" in missing
    assert "_SyncObj__pipeNotifier" in missing and "_getLeader" not in missing


def test_leader_and_is_leader(node: Counter) -> None:
    assert syncobj.is_leader(node) is True
    assert syncobj.leader(node) is not None and str(syncobj.leader(node)) == str(node.selfNode)


def test_log_commit_and_applied_indexes_follow_an_entry(node: Counter) -> None:
    before = syncobj.current_log_index(node)
    assert syncobj.commit_index(node) <= before and syncobj.last_applied(node) <= before
    node.add(2, sync=False)
    node.doTick(0)
    assert syncobj.current_log_index(node) == before + 1
    _tick_until(node, lambda: syncobj.commit_index(node) == before + 1, "the entry was committed")
    _tick_until(
        node, lambda: syncobj.last_applied(node) == before + 1 and node.value == 2, "the entry was applied"
    )
    assert syncobj.last_applied(node) == node.raftLastApplied  # the public read agrees


def test_last_serialized_entry_moves_with_a_snapshot(node: Counter) -> None:
    assert syncobj.last_serialized_entry(node) is None
    node.add(1, sync=False)
    _tick_until(node, lambda: node.value == 1, "the entry was applied")
    node.forceLogCompaction()
    _tick_until(node, lambda: syncobj.last_serialized_entry(node) is not None, "a snapshot was written")
    assert syncobj.last_serialized_entry(node) >= syncobj.last_applied(node) - 1


def test_election_deadline_is_what_the_node_waits_for(tmp_path) -> None:
    # A node far from its election calls it at once once the deadline is moved to 0.
    conf = SyncObjConf(autoTick=False, raftMinTimeout=30, raftMaxTimeout=31, connectionTimeout=31)
    n = Counter(_port(), conf)
    try:
        for _ in range(20):
            n.doTick(0)
        assert syncobj.leader(n) is None  # 30 s from its first election
        syncobj.set_election_deadline(n, 0.0)
        _tick_until(n, lambda: syncobj.is_leader(n), "an election at the moved deadline")
    finally:
        n.destroy()


class Pair(SyncObj):
    def __init__(self, port: int, other: int) -> None:
        super().__init__(f"127.0.0.1:{port}", [f"127.0.0.1:{other}"], SyncObjConf(autoTick=False))


def test_the_leader_hears_its_follower_and_the_follower_puts_its_election_off() -> None:
    a_port, b_port = _port(), _port()
    a, b = Pair(a_port, b_port), Pair(b_port, a_port)
    try:
        deadline = time.monotonic() + 20
        while not (syncobj.is_leader(a) or syncobj.is_leader(b)):
            assert time.monotonic() < deadline, "no leader elected between two nodes"
            a.doTick(0.01)
            b.doTick(0.01)
        leader, follower = (a, b) if syncobj.is_leader(a) else (b, a)
        for _ in range(50):
            a.doTick(0.01)
            b.doTick(0.01)
        (other,) = list(leader.otherNodes)
        heard = syncobj.last_response_time(leader, other)
        assert 0 < time.monotonic() - heard < 10, heard
        assert syncobj.last_response_time(leader, object()) == 0.0
        assert syncobj.leader(follower) is not None
        assert syncobj.election_deadline(follower) > time.monotonic()
    finally:
        a.destroy()
        b.destroy()


def test_conf_is_the_nodes_own(node: Counter) -> None:
    assert isinstance(syncobj.conf(node), SyncObjConf) and syncobj.conf(node).autoTick is False


def test_wake_reaches_the_ticking_thread(ticking: Counter) -> None:
    assert isinstance(syncobj.tick_thread(ticking), threading.Thread)
    assert syncobj.wake(ticking) is True
    deadline = time.monotonic() + 10
    while not syncobj.is_leader(ticking):
        assert time.monotonic() < deadline, "the ticking node became leader"
        time.sleep(0.01)
    before = syncobj.commit_index(ticking)
    ticking.add(5, sync=False)
    syncobj.wake(ticking)
    while ticking.value != 5:
        assert time.monotonic() < deadline, "the woken thread committed the entry"
        time.sleep(0.01)
    assert syncobj.commit_index(ticking) > before


def test_a_node_without_a_thread_has_none(node: Counter) -> None:
    assert syncobj.tick_thread(node) is None


def test_poller_is_the_one_the_node_polls(node: Counter) -> None:
    p = syncobj.poller(node)
    assert hasattr(p, "subscribe") and hasattr(p, "unsubscribe") and hasattr(p, "poll")


def test_a_store_refuses_to_start_on_a_pysyncobj_without_them(tmp_path, monkeypatch) -> None:
    from mtgpu.errors import StateError
    from mtgpu.state.store import StateStore

    monkeypatch.setattr(syncobj, "ALWAYS", (*syncobj.ALWAYS, "_SyncObj__renamedInANewRelease"))
    with pytest.raises(StateError, match=r"lacks _SyncObj__renamedInANewRelease.*pysyncobj==0\.3\.17"):
        StateStore("solo", [], str(tmp_path))


def test_a_module_attribute_a_release_lacks_is_named_and_refused(tmp_path, monkeypatch) -> None:
    import sys
    import types

    from mtgpu.errors import StateError
    from mtgpu.state.store import StateStore

    assert syncobj.missing_module_attributes() == []  # both were there to replace
    monkeypatch.setitem(sys.modules, "mtgpu_test_release", types.ModuleType("mtgpu_test_release"))
    monkeypatch.setattr(syncobj, "_LACKED", [])
    syncobj._replace("mtgpu_test_release", "createJournal", object())
    assert syncobj.missing_module_attributes() == ["mtgpu_test_release.createJournal"]
    with pytest.raises(StateError, match=r"lacks mtgpu_test_release\.createJournal"):
        StateStore("solo", [], str(tmp_path))


def test_loading_pysyncobj_leaves_socket_inet_ntop_alone() -> None:
    """PySyncObj 0.3.17's TCP transport imports a module that replaces
    ``socket.inet_ntop`` with a Windows-only function on every platform; MTGPU's
    package keeps it out (mtgpu/__init__.py), so a process that runs the cluster can
    still turn addresses into text (psutil's connection lists did not)."""
    code = (
        "import mtgpu, pysyncobj, pysyncobj.tcp_connection, socket\n"
        "print(socket.inet_ntop(socket.AF_INET, bytes([127, 0, 0, 1])), socket.inet_ntop(socket.AF_INET6, bytes(16)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0 and r.stdout.split() == ["127.0.0.1", "::"], r.stderr
    # Without MTGPU's guard the same import breaks it: the reason for the guard.
    bare = "import pysyncobj.tcp_connection, socket\nsocket.inet_ntop(socket.AF_INET, bytes(4))\n"
    r = subprocess.run(
        [sys.executable, "-I", "-c", bare], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert r.returncode != 0 and "not_windows" in r.stderr, (r.returncode, r.stderr[-500:])
