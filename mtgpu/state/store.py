"""The replicated store: PySyncObj (Raft) holding MTGPU's durable state.

Standalone is a cluster of one: the same :class:`StateStore`, journal and replicated
methods serve a single host and a cluster. The store is handed its transport at start
(:class:`LocalTransport` for a cluster of one); it never imports the cluster code.

PySyncObj runs its own tick thread. Replicated methods are called from the asyncio
loop with a callback, and :meth:`StateStore.call` turns that callback into an
awaitable, so the event loop never blocks on a commit.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer
from pysyncobj import pickle as raft_pickle
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from mtgpu.errors import StateError
from mtgpu.state import syncobj
from mtgpu.state.durable import DurableSyncObj, durable_replace
from mtgpu.state.journal import align_journal_to_dump, repair_journal

log = logging.getLogger("mtgpu.state")


class CommitTimeout(StateError):
    """A state change was proposed but not seen committed in time. It may still be
    (the entry is in the leader's log), or never be (that leader lost its majority
    and a new one's log wins): its outcome is unknown, not a failure."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"the state change was not committed within {timeout:.0f}s; check `mtgpu-admin cluster status`"
        )
        self.timeout = timeout


#: A replica counts as cut off from its cluster's majority after this long without
#: hearing from it (a follower: its leader; the leader: a majority of voters): the
#: leader's heartbeats come every 0.1 s, and elections start after 1-2 s without.
OUT_OF_TOUCH_AFTER = 3.0

_FAIL_TEXT = {
    FAIL_REASON.QUEUE_FULL: "the command queue is full; retry shortly",
    FAIL_REASON.MISSING_LEADER: "no scheduler is elected yet; retry shortly",
    FAIL_REASON.DISCARDED: "the command was discarded by a leader change; retry",
    FAIL_REASON.NOT_LEADER: "this member is not the leader; retry",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before the command committed; retry",
    FAIL_REASON.REQUEST_DENIED: "the request was denied",
}
#: The refusal's code (mtgpu.errors): ``no_leader`` and ``busy`` appended nothing, so
#: the same request may be sent again; after ``leader_changed`` it may have committed.
_FAIL_CODE = {
    FAIL_REASON.QUEUE_FULL: "busy",
    FAIL_REASON.MISSING_LEADER: "no_leader",
    FAIL_REASON.NOT_LEADER: "no_leader",
    FAIL_REASON.DISCARDED: "leader_changed",
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
}


def _failure(error: int) -> StateError:
    return StateError(_FAIL_TEXT.get(error, f"commit failed ({error})"), _FAIL_CODE.get(error, "error"))


#: Free space STATE_DIR must keep for a state change to be accepted. The journal is a
#: memory-mapped file: a page written on a full filesystem kills the process with
#: SIGBUS instead of raising, so changes are refused well before the disk is full.
STATE_MIN_FREE = 32 << 20
#: Records of what already happened (a job started, ended, was cancelled) may use
#: most of that reserve: refusing them would leave a job's end unrecorded.
OUTCOMES = frozenset(
    {
        "started",
        "part_ended",
        "finish",
        "cancel",
        "requeue",
        "purge",
        "purge_usage",
        "set_progress",
        "place",
        "place_many",
    }
)

#: gzip level of the full dump PySyncObj writes when it compacts the log. Its default
#: (9) took 1.5 s for 20,000 jobs and 5,000 tenants here, in the tick thread that also
#: sends the heartbeats: long enough for the other voters to elect another scheduler.
#: Level 1 took 0.18 s for a dump 20 % larger.
DUMP_GZIP_LEVEL = 1


def _fast_dumps() -> None:
    """Make PySyncObj's serializer (pinned 0.3.17) write its dumps at DUMP_GZIP_LEVEL;
    reading is unchanged, so dumps written either way load."""
    import functools
    import types

    import pysyncobj.serializer as serializer

    if getattr(serializer.gzip, "mtgpu_level", None) == DUMP_GZIP_LEVEL:
        return
    serializer.gzip = types.SimpleNamespace(
        GzipFile=functools.partial(gzip.GzipFile, compresslevel=DUMP_GZIP_LEVEL), mtgpu_level=DUMP_GZIP_LEVEL
    )


_fast_dumps()


def state_dir_free(state_dir: str) -> int:
    """Bytes free for root under ``state_dir``."""
    st = os.statvfs(state_dir)
    return st.f_bavail * st.f_frsize


class LocalTransport(Transport):
    """The transport of a cluster of one: there is nobody to talk to."""

    def __init__(self, syncObj: SyncObj, selfNode: Node | None, otherNodes: Sequence[Node]) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        if otherNodes:
            raise StateError("LocalTransport serves a cluster of one; peers need the SSH transport")

    @property
    def ready(self) -> bool:
        return True

    def waitReady(self) -> None:
        return None

    def addNode(self, node: Node) -> None:
        raise StateError("a standalone host cannot add members; set CLUSTER_MODE: cluster")

    def dropNode(self, node: Node) -> None:
        return None

    def send(self, node: Node, message: Any) -> bool:
        return False

    def destroy(self) -> None:
        return None


#: How long a Raft leader cut off from its majority goes on leading (seconds): a new
#: scheduler counts every member's lease from its own start plus this.
LEADER_FALLBACK = 5.0

#: After a leader's process ended, how long each voter waits after the one before it
#: in the order of succession before it calls an election itself
#: (:meth:`StateStore.expedite_elections`): more than a vote's round trip on a busy
#: host, far less than the election timeout.
ELECTION_STEP = 0.5


#: ``ENTRIES:SECONDS`` in the daemon's environment replaces the journal's compaction
#: thresholds (20,000 entries, 600 s apart), so that a test sees compactions within
#: minutes (a year of state); production never sets it.
COMPACTION_ENV = "MTGPU_RAFT_COMPACTION"


def make_conf(state_dir: str, **overrides: Any) -> SyncObjConf:
    """The SyncObjConf MTGPU runs with, journaling under ``state_dir``.

    ``appendEntriesUseBatch=False`` lets a commit wake the tick thread at once instead
    of waiting for the next heartbeat; ``useFork=False`` because forking a threaded
    asyncio daemon for log compaction is unsafe.
    """
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    kw: dict[str, Any] = dict(
        journalFile=str(Path(state_dir) / "raft.journal"),
        fullDumpFile=str(Path(state_dir) / "raft.dump"),
        appendEntriesUseBatch=False,
        useFork=False,
        dynamicMembershipChange=True,
        commandsWaitLeader=True,
        logCompactionMinEntries=20000,
        logCompactionMinTime=600,
        connectionRetryTime=1.0,
        # A follower that hears no leader for 1-2 s starts an election (etcd's default
        # is 1 s with 100 ms heartbeats). Shorter ones lost the scheduler to
        # elections whenever a busy host held its loop or its tick thread for a
        # moment (a burst of starts on a thousand members, a full dump), each a
        # pause of every submission; a dead scheduler is still replaced in about 1-2 s.
        raftMinTimeout=1.0,
        raftMaxTimeout=2.0,
        connectionTimeout=3.5,
        # A leader cut off from its majority steps down after this long (default 30 s).
        leaderFallbackTimeout=LEADER_FALLBACK,
    )
    if spec := os.environ.get(COMPACTION_ENV):
        entries, _, seconds = spec.partition(":")
        kw.update(logCompactionMinEntries=int(entries), logCompactionMinTime=float(seconds or 0))
    kw.update(overrides)
    return SyncObjConf(**kw)


class StateStore:
    """One PySyncObj instance and its consumers (the registry, the job table...)."""

    def __init__(
        self,
        self_node: str | None,
        consumers: Sequence[SyncObjConsumer],
        state_dir: str,
        *,
        peers: Sequence[str] = (),
        transport_factory: Callable[..., Transport] | None = None,
        fsync: bool = True,
        **conf_overrides: Any,
    ) -> None:
        """``fsync=False`` leaves the journal to the kernel's writeback: an
        acknowledged change then survives the daemon's crash, not the host's power cut
        (for benchmarks and tests comparing the two; the daemon always syncs)."""
        self.consumers = list(consumers)
        conf = make_conf(state_dir, **conf_overrides)
        #: What was cut from a damaged journal at this start, if anything.
        self.repaired = repair_journal(conf.journalFile) if conf.journalFile else None
        #: Records dropped from a journal that still held what the full dump holds
        #: (stopped between a compaction's dump and its trim), else None.
        self.aligned = (
            align_journal_to_dump(conf.journalFile, conf.fullDumpFile)
            if conf.journalFile and conf.fullDumpFile
            else None
        )
        tclass = transport_factory or LocalTransport
        try:
            # A self node of None makes a read-only member: a full replica that never votes.
            self.sync = DurableSyncObj(
                Node(self_node) if self_node else None,
                [Node(p) for p in peers],
                conf=conf,
                consumers=self.consumers,
                nodeClass=Node,
                transportClass=tclass,
                fsync=fsync,
            )
        except (OSError, ValueError, EOFError) as exc:
            raise StateError(
                f"cannot open the state journal in {state_dir}: {exc}; "
                "check the disk and the directory's permissions"
            ) from exc
        missing = syncobj.check(self.sync) + syncobj.missing_module_attributes()
        if missing:
            self.sync.destroy()
            raise StateError(
                f"the installed PySyncObj lacks {', '.join(missing)}, which MTGPU "
                f"uses; install pysyncobj=={syncobj.TESTED} (pyproject.toml pins it)"
            )
        if not peers:
            self.sync.addOnTickCallback(self._commit_alone)
            if self_node:
                self.sync.addOnTickCallback(self._elect_alone)
        self.state_dir = state_dir
        self._free: tuple[float, int] = (-1.0, 0)  # (when, bytes free)
        self._contact = time.monotonic()  # last heard from the majority (see out_of_touch_since)
        self.sync.addOnTickCallback(self._watch_contact)

    def check_space(self, method: Callable[..., Any] | None = None) -> None:
        """Refuse a state change while STATE_DIR is nearly full (looked at most every
        100 ms): the journal cannot take it safely, and nothing is recorded."""
        now = time.monotonic()
        at, free = self._free
        if now - at >= 0.1:
            try:
                free = state_dir_free(self.state_dir)
            except OSError:
                return
            self._free = (now, free)
        need = STATE_MIN_FREE // 4 if getattr(method, "__name__", "") in OUTCOMES else STATE_MIN_FREE
        if free < need:
            raise StateError(
                f"STATE_DIR {self.state_dir} is nearly full ({free >> 20} MiB free, "
                f"{need >> 20} MiB needed); nothing was recorded. "
                "An admin must free space there, then retry"
            )

    def _elect_alone(self) -> None:
        # A voter with no other voter (a standalone host, a cluster's founder) needs
        # only its own vote: it takes it at once instead of waiting out an election
        # timeout (1-2 s) at every start. With others in its configuration (from its
        # journal) it waits, as PySyncObj does. Uses PySyncObj 0.3.17 internals.
        s = self.sync
        if not s.otherNodes and syncobj.leader(s) is None:
            syncobj.set_election_deadline(s, 0.0)

    def _commit_alone(self) -> None:
        # A leader without peers commits an entry on the tick after appending it, but
        # nothing wakes the tick thread in between: it would sleep a whole tick period
        # (50 ms) per commit. Wake it when entries wait. Uses PySyncObj 0.3.17 internals,
        # which is why the version is pinned.
        # A member that founded its cluster alone keeps this callback when others
        # join; from then on a commit waits for their acknowledgements, and waking
        # the tick thread for each waiting entry only spins it (most of a core on a
        # busy scheduler).
        s = self.sync
        if s.otherNodes:
            return
        if syncobj.current_log_index(s) > syncobj.commit_index(s):
            syncobj.wake(s)

    def _watch_contact(self) -> None:
        # On PySyncObj's tick: when this replica last heard its cluster's majority (a
        # follower: its leader, whose every message pushes the election deadline 1-2 s
        # ahead; the leader: a majority of voters), through mtgpu/state/syncobj.py.
        s = self.sync
        now = time.monotonic()
        if syncobj.is_leader(s):
            others = list(s.otherNodes)
            heard = sorted((syncobj.last_response_time(s, n) for n in others), reverse=True)
            need = (len(others) + 1) // 2  # others that, with the leader, make a majority
            last = heard[need - 1] if need else now
        elif syncobj.leader(s) is not None and syncobj.election_deadline(s) > now:
            last = now
        else:
            return
        if last > self._contact:
            self._contact = last

    def out_of_touch_since(self) -> float | None:
        """Since when (wall-clock time) this replica cannot reach its cluster's
        majority, or None while it can (it heard from it within
        :data:`OUT_OF_TOUCH_AFTER` seconds; a cluster of one always can). A change
        accepted there could be lost (a new leader's log wins), and one relayed from
        there waits for an answer that cannot come: tenants are told to retry instead."""
        if not self.sync.otherNodes:
            return None
        mono = time.monotonic()
        if mono - self._contact < OUT_OF_TOUCH_AFTER:
            return None
        return time.time() - (mono - self._contact)

    async def call(self, method: Callable[..., Any], *args: Any, timeout: float = 30.0) -> Any:
        """Run a replicated ``method`` and return its result once committed."""
        self.check_space(method)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: int) -> None:
            loop.call_soon_threadsafe(_resolve, fut, result, error)

        method(*args, callback=done)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as exc:
            raise CommitTimeout(timeout) from exc

    def call_sync(self, method: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
        """Blocking form of :meth:`call`, for threads outside the event loop."""
        import threading

        self.check_space(method)
        box: dict[str, Any] = {}
        ev = threading.Event()

        def done(result: Any, error: int) -> None:
            box["r"], box["e"] = result, error
            ev.set()

        method(*args, callback=done)
        if not ev.wait(timeout):
            raise StateError(f"the state change was not committed within {timeout:.0f}s")
        if box["e"] != FAIL_REASON.SUCCESS:
            raise _failure(box["e"])
        return box["r"]

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the journal is replayed and a leader is known."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (self.sync.isReady() and syncobj.leader(self.sync) is not None):
            if loop.time() > deadline:
                raise StateError(
                    "the replicated state did not become ready in time; "
                    "check the journal under STATE_DIR and the cluster peers"
                )
            await asyncio.sleep(0.02)

    def status(self) -> dict[str, Any]:
        st = self.sync.getStatus()
        leader = st.get("leader")
        return {
            "leader": getattr(leader, "id", None),
            "term": st.get("raft_term"),
            "commit_idx": st.get("commit_idx"),
            "state": st.get("state"),
            "self": getattr(st.get("self"), "id", None),
        }

    def snapshot(self, timeout: float = 5.0) -> bool:
        """Write the full dump at the last applied entry and trim the journal to it.

        Blocks until the tick thread has done both (so call it from a thread), and
        returns False when it could not within ``timeout``. A store reopened on the same
        directory after a snapshot starts from the dump: it replays no entry its
        consumers already hold. Uses PySyncObj 0.3.17 internals.
        """
        s = self.sync
        before = syncobj.last_serialized_entry(s)
        if before is not None and before >= syncobj.last_applied(s) - 1:
            return True  # the dump on disk is current
        s.forceLogCompaction()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = syncobj.last_serialized_entry(s)
            if now is not None and now != before:
                return True
            time.sleep(0.01)
        return False

    def hold_elections(self, seconds: float) -> None:
        """Start no election until a leader is heard from (or ``seconds`` pass).

        For a member that just became a voter: the others accept its channels only once
        they hold its addition, and PySyncObj has no pre-vote, so without this it would
        raise the term (and depose a healthy leader) as soon as it reached one voter
        ahead of the leader. Uses PySyncObj 0.3.17 internals.
        """
        s = self.sync
        until = time.monotonic() + seconds
        conf = syncobj.conf(s)

        def hold() -> None:
            if syncobj.leader(s) is None and time.monotonic() < until:
                syncobj.set_election_deadline(s, time.monotonic() + conf.raftMaxTimeout)

        s.addOnTickCallback(hold)

    def expedite_elections(
        self, transport: Any, order: Callable[[], Sequence[str]], step: float = ELECTION_STEP
    ) -> None:
        """Replace a leader whose process ended without waiting out the election timeout.

        ``transport`` calls ``on_peer_ended(node)`` on the tick thread when a voter
        ended its channel itself (the SSH transport does: a process that crashed, was
        killed or restarted closes its connections). When that voter is this
        follower's leader, the survivors call an election in the order of
        ``order()`` (every voter's name, the one that should lead first): the first
        at once, the next ``step`` (:data:`ELECTION_STEP`) later if no one has won by then, and
        so on, so two of them do not split the votes by standing together. A leader
        whose host went away, or whose network did, closes nothing: then the timeout
        (1-2 s) applies as before. Raft's safety does not depend on when an election
        starts; only a voter whose log is as complete as a majority's can win one.
        """
        transport.on_peer_ended = lambda node: self._leader_ended(node, order, step)

    def _leader_ended(self, node: Node, order: Callable[[], Sequence[str]], step: float) -> None:
        s = self.sync
        current = syncobj.leader(s)
        if s.selfNode is None or current is None or current.id != node.id:
            return  # a read-only member, or not this member's leader: nothing to replace
        voters = {n.id for n in s.otherNodes if n is not None} | {s.selfNode.id}
        voters.discard(node.id)
        standing = [n for n in order() if n in voters]
        standing += sorted(voters - set(standing))  # any the order leaves out, by name
        me = s.selfNode.id
        rank = standing.index(me)
        when = time.monotonic() + rank * step
        if when < syncobj.election_deadline(s):
            syncobj.set_election_deadline(s, when)
            log.info(
                "the leader %s ended its raft channel: this member calls an election %s",
                node.id,
                "now" if not rank else f"in {rank * step:.1f}s unless another wins first",
            )

    def close(self) -> None:
        """Stop the tick thread and flush the journal."""
        try:
            self.sync.destroy()
            t = syncobj.tick_thread(self.sync)
            if t is not None and t.is_alive():
                t.join(5)
        except Exception:  # noqa: BLE001 - closing must not raise during shutdown
            log.exception("closing the state store")


def strip_dump_nodes(state_dir: str, drop: set[str | None]) -> None:
    """Take the nodes ``drop`` out of the configuration saved in the full dump.

    A dump records the Raft configuration as ``otherNodes | {selfNode}``; a read-only
    member's self node is None. Reopened under another role, PySyncObj would take that
    entry (or its own name) for a peer, so a member changing role drops both first.
    """
    path = Path(state_dir) / "raft.dump"
    try:
        with gzip.open(path, "rb") as f:
            data = raft_pickle.load(f)
    except FileNotFoundError:
        return
    cluster = {n for n in data[3] if n is not None and getattr(n, "id", n) not in drop}
    if cluster == set(data[3]):
        return
    tmp = path.with_suffix(".tmp-role")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as g:
        raft_pickle.dump((data[0], data[1], data[2], cluster), g)
    durable_replace(str(tmp), str(path))


def forget_term(state_dir: str) -> None:
    """Drop the Raft term and vote saved beside the journal (for a member turning read-only).

    A voter cut off from the others keeps starting elections until its channels time
    out, and comes back with a term above the leader's. A read-only member never sends
    a message that would tell the leader so: it would ignore the leader's appends
    forever. It does not vote, so its term need not survive; reopened, it starts from
    its last entry's term, which no leader's is below.
    """
    path = Path(state_dir) / "raft.journal.meta"
    try:
        meta = raft_pickle.loads(path.read_bytes())
    except (OSError, ValueError, EOFError):
        return
    meta.pop("currentTerm", None)
    meta.pop("votedForNodeId", None)
    tmp = path.with_suffix(".tmp-role")
    tmp.write_bytes(raft_pickle.dumps(meta))
    durable_replace(str(tmp), str(path))


def _resolve(fut: asyncio.Future[Any], result: Any, error: int) -> None:
    if fut.done():
        return
    if error == FAIL_REASON.SUCCESS:
        fut.set_result(result)
    else:
        fut.set_exception(_failure(error))
