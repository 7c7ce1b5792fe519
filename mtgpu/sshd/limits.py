"""Bounds on what one user or one source address may hold open on the SSH server.

- :class:`Penalties`: failed logins penalise a (source address, user name) pair for
  a while (``SSH_PENALTY_FAILURES``, ``SSH_PENALTY_SECONDS``). Keyed on both, so one
  tenant's failures from ``127.0.0.1`` touch that name from there, not every local
  user. A penalty never refuses a key registered for the user: it slows each key
  that is not (:func:`penalty_delay`) and refuses invite logins.
- :func:`should_drop`: ``SSH_MAX_STARTUPS`` as OpenSSH's ``MaxStartups
  start:rate:full``, random early drop of unauthenticated connections.
- :class:`ConnectionLimits`: counts of connections per source address
  (``SSH_MAX_CONNECTIONS_PER_SOURCE``), unauthenticated connections per source
  address (``SSH_MAX_STARTUPS_PER_SOURCE``), authenticated connections per user
  (``SSH_MAX_CONNECTIONS_PER_USER``), session channels per user
  (``SSH_MAX_SESSIONS_PER_USER``) and forwarded channels and listeners per user
  (``SSH_MAX_FORWARDS_PER_USER``). A request past a limit is refused with a message
  naming the limit, and every count a connection holds is given back when it closes.

Cluster members (peer connections) are counted per source only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncssh

from mtgpu.errors import MtgpuError

log = logging.getLogger("mtgpu.sshd")

#: Option (lower-case key) and what it counts, for each kind of count.
LIMITS = {
    "source": ("ssh_max_connections_per_source", "connections from {who}"),
    "startup": ("ssh_max_startups_per_source", "unauthenticated connections from {who}"),
    "user": ("ssh_max_connections_per_user", "connections of {who}"),
    "session": ("ssh_max_sessions_per_user", "sessions (shells, commands, sftp) of {who}"),
    "forward": ("ssh_max_forwards_per_user", "forwarded connections and listeners of {who}"),
    # Connections past SSH_MAX_CONNECTIONS_PER_SOURCE kept until they can be told why
    # (after the key exchange); past these few, they are dropped at once.
    "refusing": ("", "refused connections from {who}"),
}
#: Refused connections per source that are told why (the "refusing" count).
EXPLAINED_PER_SOURCE = 4
#: Distinct (source, user) pairs remembered; beyond this the oldest are forgotten.
MAX_PENALTY_KEYS = 100_000
#: Seconds each refused key waits while its (source, user) is penalised.
PENALTY_DELAY = 1.0


def should_drop(startups: int, start: int, rate: int, full: int, roll: Callable[[], int]) -> bool:
    """Whether a new connection is dropped with ``startups`` unauthenticated ones open,
    as OpenSSH's sshd decides for ``MaxStartups start:rate:full``: never below
    ``start``, always from ``full``, in between with a probability rising linearly
    from ``rate`` percent. ``roll``: a random whole number from 0 to 99.

    >>> [should_drop(n, 10, 30, 100, lambda: 50) for n in (9, 10, 60, 99, 100)]
    [False, False, True, True, True]
    >>> [should_drop(n, 10, 30, 100, lambda: 0) for n in (9, 10)]
    [False, True]
    """
    if startups < start:
        return False
    if startups >= full or rate >= 100:
        return True
    p = rate + (100 - rate) * (startups - start) // (full - start)
    return roll() < p


def penalty_delay(grace: float, max_auth_tries: int) -> float:
    """How long each refused key of a penalised (source, user) waits: PENALTY_DELAY,
    but short enough that SSH_MAX_AUTH_TRIES of them take at most a quarter of
    SSH_LOGIN_GRACE_TIME, so the client still has time to offer its registered key.

    >>> penalty_delay(30, 6), penalty_delay(3, 2), penalty_delay(0, 6)
    (1.0, 0.375, 1.0)
    """
    if grace <= 0:  # no grace time: no limit to stay under
        return PENALTY_DELAY
    return min(PENALTY_DELAY, grace / (4 * max(1, max_auth_tries)))


class Penalties:
    """Penalise a user from a source address for a while after repeated failures.

    >>> now = [0.0]
    >>> p = Penalties(2, 60, clock=lambda: now[0])
    >>> p.failed("127.0.0.1", "ann"); p.failed("127.0.0.1", "ann")
    >>> p.penalized("127.0.0.1", "ann") > 0, p.penalized("127.0.0.1", "bob")
    (True, 0.0)
    >>> now[0] = 61.0
    >>> p.penalized("127.0.0.1", "ann")
    0.0
    """

    def __init__(self, failures: int, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.failures = failures
        self.seconds = seconds
        self.clock = clock
        self._count: dict[tuple[str, str], int] = {}
        self._until: dict[tuple[str, str], float] = {}

    def configure(self, failures: int, seconds: float) -> None:
        """New SSH_PENALTY_FAILURES and SSH_PENALTY_SECONDS (a reload), from the next failure on."""
        self.failures = failures
        self.seconds = seconds

    def penalized(self, addr: str, user: str) -> float:
        """Seconds left of the penalty of ``user`` from ``addr`` (0 if none)."""
        key = (addr, user)
        until = self._until.get(key)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left <= 0:
            del self._until[key]
            return 0.0
        return left

    def failed(self, addr: str, user: str) -> None:
        key = (addr, user)
        n = self._count.get(key, 0) + 1
        if n >= self.failures:
            self._until[key] = self.clock() + self.seconds
            self._count.pop(key, None)
            _trim(self._until)
            log.warning(
                "penalizing %s for logins as %r for %.0fs after %d failed logins (SSH_PENALTY_FAILURES): "
                "only keys registered for that user log in from there, other keys are slowed",
                addr,
                user,
                self.seconds,
                n,
            )
        else:
            self._count[key] = n
            _trim(self._count)

    def succeeded(self, addr: str, user: str) -> None:
        self._count.pop((addr, user), None)


def _trim(d: dict[Any, Any]) -> None:
    if len(d) > MAX_PENALTY_KEYS:
        for k in list(d)[: MAX_PENALTY_KEYS // 10]:
            del d[k]


class LimitReached(MtgpuError):
    """A count is at its limit; the message names the limit and what to do."""


class ConnectionLimits:
    """The counts of one SSH server, shared by all its connections."""

    def __init__(self, options: Callable[[], Any], server: str = "") -> None:
        self.options = options  # the daemon's current options (a SIGHUP may change them)
        self.server = server
        self.counts: dict[str, Counter[str]] = {kind: Counter() for kind in LIMITS}
        #: Live authenticated connections per user name (to end a removed user's).
        self.live: dict[str, set[Any]] = {}

    def limit(self, kind: str) -> int:
        if kind == "refusing":
            return EXPLAINED_PER_SOURCE
        return int(getattr(self.options(), LIMITS[kind][0]))

    def take(self, kind: str, who: str) -> None:
        """Count one more ``kind`` for ``who``, or raise LimitReached."""
        limit = self.limit(kind)
        have = self.counts[kind][who]
        if have >= limit:
            what = LIMITS[kind][1].format(who=who)
            key = LIMITS[kind][0].upper()
            raise LimitReached(
                f"too many {what} on {self.server or 'this host'}: {key} is {limit}; close some and retry"
            )
        self.counts[kind][who] = have + 1

    def give(self, kind: str, who: str, n: int = 1) -> None:
        c = self.counts[kind]
        left = c[who] - n
        if left > 0:
            c[who] = left
        else:
            c.pop(who, None)

    def started(self, user: str, server: Any) -> None:
        """``server`` (an MtgpuSSHServer) is a logged-in connection of ``user``."""
        self.live.setdefault(user, set()).add(server)

    def ended(self, user: str, server: Any) -> None:
        live = self.live.get(user)
        if live is not None:
            live.discard(server)
            if not live:
                del self.live[user]

    def close_user(self, user: str, reason: str) -> int:
        """Disconnect every live connection of ``user``; how many there were. The code
        says the user name is no longer valid (clients report it as an error, where
        "by application" reads as a normal end)."""
        conns = list(self.live.get(user, ()))
        for c in conns:
            if c.conn is not None:
                disconnect_first(c.conn, asyncssh.DISC_ILLEGAL_USER_NAME, reason)
        return len(conns)


def disconnect_first(conn: Any, code: int, reason: str) -> None:
    """End ``conn`` with its DISCONNECT message sent before anything else.

    asyncssh's ``disconnect`` closes every channel first, then sends DISCONNECT and
    aborts the socket. The client answers each channel close; an answer that reaches
    the aborted socket makes the kernel reset the connection, and the client may then
    report a broken pipe instead of the reason. Sent first (asyncssh's own
    ``_send_disconnect``, of the pinned asyncssh 2.24), DISCONNECT is the first thing
    the client reads, and it closes without answering anything.
    """
    send = getattr(conn, "_send_disconnect", None)
    if callable(send):
        send(code, reason, asyncssh.DEFAULT_LANG)
    conn.disconnect(code, reason)


class Held:
    """What one connection holds in a :class:`ConnectionLimits`, given back at its end."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.held: Counter[tuple[str, str]] = Counter()

    def take(self, kind: str, who: str) -> None:
        self.limits.take(kind, who)
        self.held[(kind, who)] += 1

    def give(self, kind: str, who: str) -> None:
        if self.held[(kind, who)] > 0:
            self.held[(kind, who)] -= 1
            self.limits.give(kind, who)

    def release_on_close(self, kind: str, who: str, session: Any) -> Any:
        """``session`` (an asyncssh session object) gives back one ``kind`` when its
        channel closes."""
        original = session.connection_lost
        done = False

        def connection_lost(exc: Exception | None) -> None:
            nonlocal done
            if not done:
                done = True
                self.give(kind, who)
            original(exc)

        session.connection_lost = connection_lost
        return session

    def release_all(self) -> None:
        for (kind, who), n in self.held.items():
            if n > 0:
                self.limits.give(kind, who, n)
        self.held.clear()
