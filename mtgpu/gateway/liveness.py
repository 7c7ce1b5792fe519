"""Whether the SSH connection behind a terminal still answers.

A login asks this (through :class:`mtgpu.tmux.runtime.LiveTerminals`) about the
terminals already attached to the tenant's sessions: a client that answers is a
live terminal in use; one that does not is a laptop asleep or a network gone,
and its session is taken over.

The question is a ``keepalive@openssh.com`` global request with a reply wanted.
OpenSSH answers it at once (with a failure, which is an answer), from the same
loop that reads the terminal's keys; a frozen client (a closed lid: the server
still holds the connection, the kernel still acknowledges) never does. So:

- a connection that replies within :data:`ANSWER_DEADLINE` is live;
- one that does not is dead, however recently it last sent anything, and
  whatever the server's own keepalive timing (asyncssh closes a silent
  connection only after minutes);
- the daemon being busy does not make a live one dead: a reply that has reached
  the socket is read before the deadline is judged (:meth:`ConnectionProbe.__call__`);
- the question is asked once per connection at a time: a new login starts it
  (:meth:`LiveTerminals.prime`) while its own program is still starting, so by
  the time that program asks, a frozen connection has usually been silent for
  the whole deadline already.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncssh

KEEPALIVE_REQUEST = b"keepalive@openssh.com"
#: How long a client has to answer. OpenSSH answers in one round trip; a frozen
#: client never does, so this bounds how long a login waits to take it over.
ANSWER_DEADLINE = 1.0
#: Turns of the event loop given to read a reply already in the socket once the
#: deadline has passed (a busy daemon reads late, the client answered in time).
_DRAIN_TURNS = 8


class ConnectionProbe:
    """A probe of one channel's connection: awaiting it is True once the client answers.

    At most one request is outstanding per probe: asking again while one is
    unanswered waits for that one (until its deadline), so a frozen connection
    is not sent a request per login.
    """

    def __init__(self, chan: asyncssh.SSHServerChannel, deadline: float = ANSWER_DEADLINE) -> None:
        self.chan = chan
        self.deadline = deadline
        self._pending: asyncio.Future[bool] | None = None
        self._sent = 0.0

    def _ask(self) -> asyncio.Future[bool] | None:
        """The outstanding request, sent now if none is; None where it cannot be asked."""
        loop = asyncio.get_running_loop()
        if self._pending is not None and not self._pending.done():
            return self._pending
        conn: Any = self.chan.get_connection()
        ask = getattr(conn, "_make_global_request", None)
        if ask is None:  # pragma: no cover - asyncssh without it: counted live, as before
            return None
        self._pending = loop.create_task(_answered(ask))
        self._sent = loop.time()
        return self._pending

    def start(self) -> None:
        """Send the question now (if none is outstanding), without waiting for it."""
        if not self.chan.is_closing():
            self._ask()

    async def __call__(self) -> bool:
        if self.chan.is_closing():
            return False
        pending = self._ask()
        if pending is None:  # pragma: no cover - see _ask
            return True
        left = self._sent + self.deadline - asyncio.get_running_loop().time()
        if left > 0 and not pending.done():
            # asyncio.wait, not wait_for: the request stays outstanding past the
            # deadline (a later login reuses it), and a reply that came in with the
            # deadline is not thrown away by a cancellation.
            await asyncio.wait({pending}, timeout=left)
        for _ in range(_DRAIN_TURNS):
            if pending.done():
                break
            await asyncio.sleep(0)  # each turn reads what the sockets hold
        if not pending.done():
            return False
        return pending.result() and not self.chan.is_closing()


async def _answered(ask: Any) -> bool:
    try:
        await ask(KEEPALIVE_REQUEST)
    except (asyncssh.Error, OSError):
        return False
    return True


def connection_probe(chan: asyncssh.SSHServerChannel) -> ConnectionProbe:
    """The probe :class:`mtgpu.tmux.runtime.LiveTerminals` keeps for a pty on ``chan``."""
    return ConnectionProbe(chan)
