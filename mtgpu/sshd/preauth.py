"""One log line for every connection that ends before authentication, saying why.

As OpenSSH's sshd does, each such connection is logged once with the peer, the
client's version string and the reason: no matching cipher, key exchange failed,
timeout, penalised, refused by a limit, closed by the client. An administrator whose
user reports "Disconnect received" or "Connection closed" finds the cause here.

A flood of such connections (a scanner, a tenant's loop) must not fill the log: the
lines go through a :class:`~mtgpu.lograte.RepeatFilter` of their own, on their own
logger, so the bound holds whatever handlers the daemon's logging set-up has.

asyncssh's own logger follows the daemon's ``LOG_LEVEL`` (:func:`follow_log_level`):
at ``DEBUG`` it shows each step of the key exchange, with the algorithms each side
offered; at ``INFO`` only its warnings, since its informational lines are several per
connection and channel (MTGPU logs one line per login and per refused connection).
"""

from __future__ import annotations

import logging

import asyncssh

from mtgpu import lograte

log = logging.getLogger("mtgpu.sshd.preauth")
#: At most this many lines per reason kind and level per window; then a count.
BURST = 20
WINDOW = 60.0
_filter = lograte.RepeatFilter(burst=BURST, window=WINDOW)
log.addFilter(_filter)

#: asyncssh's key-exchange messages, as OpenSSH's sshd names the same failures.
_NO_MATCH = {
    "key exchange": "no matching key exchange method",
    "encryption": "no matching cipher",
    "MAC": "no matching MAC",
    "compression": "no matching compression method",
}
#: Longest client version string and reason logged (a client chooses parts of both:
#: its version and the algorithm lists it offered).
MAX_VERSION = 200
MAX_REASON = 800


def reason(exc: Exception | None, why: str = "", user: str = "", refused: int = 0) -> str:
    """Why a connection ended before authentication, in one line.

    ``why``: the daemon's own reason, when it ended the connection itself; ``user``
    and ``refused``: the user name last asked for and how many keys were refused.

    >>> reason(asyncssh.KeyExchangeFailed("No matching encryption algorithm found, sent a and received b"))
    'no matching cipher (No matching encryption algorithm found, sent a and received b)'
    >>> reason(asyncssh.ConnectionLost("Login timeout expired"))
    'timeout: no login within SSH_LOGIN_GRACE_TIME'
    >>> reason(None, user="ann", refused=2)
    "closed by the client after 2 refused keys for 'ann'"
    >>> reason(None)
    'closed by the client'
    """
    if why:
        return why
    if isinstance(exc, asyncssh.KeyExchangeFailed):
        text = str(exc.reason)
        for alg, name in _NO_MATCH.items():
            if text.startswith(f"No matching {alg} algorithm"):
                return f"{name} ({text})"
        return f"key exchange failed: {text}"
    if isinstance(exc, asyncssh.ConnectionLost) and "timeout" in str(exc.reason).lower():
        return "timeout: no login within SSH_LOGIN_GRACE_TIME"
    if isinstance(exc, asyncssh.ProtocolError):
        return f"protocol error: {exc.reason}"
    if isinstance(exc, asyncssh.DisconnectError) and not isinstance(exc, asyncssh.ConnectionLost):
        return f"disconnected: {exc.reason} (code {exc.code})"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "closed by the client (connection reset)"
    if exc is not None and not isinstance(exc, asyncssh.ConnectionLost):
        return f"connection error: {type(exc).__name__}: {exc}"
    if user and refused:
        return f"closed by the client after {refused} refused key{'s' if refused != 1 else ''} for {user!r}"
    if user:
        return f"closed by the client before a key was accepted for {user!r}"
    return "closed by the client"


def ended(peer: tuple[str, int], version: str | None, why: str, problem: bool) -> None:
    """Log the end of one unauthenticated connection (rate-limited).

    ``problem``: the daemon refused it or the protocol failed (a warning), rather than
    the client leaving (information).
    """
    shown = _printable(version, MAX_VERSION) if version else "no version string"
    log.log(
        logging.WARNING if problem else logging.INFO,
        "connection from %s port %d (%s) closed before authentication: %s",
        peer[0],
        peer[1],
        shown,
        _printable(why, MAX_REASON),
    )


def is_problem(exc: Exception | None, why: str) -> bool:
    """Whether the end is worth a warning: the daemon refused, or the protocol failed."""
    if why:
        return True
    return exc is not None and not isinstance(
        exc, (asyncssh.ConnectionLost, ConnectionResetError, BrokenPipeError)
    )


def _printable(text: str, limit: int) -> str:
    """``text`` bounded and with control characters escaped (a client sends it)."""
    text = text[:limit] + ("..." if len(text) > limit else "")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _ContextFreeRepeats(lograte.RepeatFilter):
    """A RepeatFilter for asyncssh's lines, which carry their connection in the message
    itself (``[conn=12] Accepted SSH client connection``): lines are of one kind
    whatever the connection."""

    def _decide(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        context, sep, rest = msg.partition("] ") if msg.startswith("[") else ("", "", msg)
        record.msg = rest
        try:
            return super()._decide(record)
        finally:
            record.msg = f"{context}{sep}{record.msg}"


_asyncssh_filter = _ContextFreeRepeats(burst=BURST, window=WINDOW)


def follow_log_level(level_name: str) -> None:
    """asyncssh's logger at the daemon's ``LOG_LEVEL`` (idempotent, cheap: called for each
    connection so a reload's level holds). At DEBUG it shows the algorithm lists of each
    key exchange (asyncssh's debug level 2, not its per-packet 3). Its lines are
    rate-limited like the daemon's own: a flood of connections cannot fill the log."""
    level = logging.getLevelName(level_name)
    if not isinstance(level, int):
        level = logging.INFO
    if logging.DEBUG < level < logging.WARNING:
        level = logging.WARNING  # asyncssh's INFO is per channel: a busy host's log would be it
    logger = logging.getLogger("asyncssh")
    if logger.level == level and _asyncssh_filter in logger.filters:
        return
    for name in ("asyncssh", "asyncssh.sftp"):
        one = logging.getLogger(name)
        if _asyncssh_filter not in one.filters:
            one.addFilter(_asyncssh_filter)
    asyncssh.set_log_level(level)
    asyncssh.set_debug_level(2 if level <= logging.DEBUG else 1)
