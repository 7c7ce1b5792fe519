"""Whether the SSH connection behind a terminal still answers.

A login asks this (through :class:`mtgpu.tmux.runtime.LiveTerminals`) about the
terminals already attached to the tenant's sessions: a client that answers is a
live terminal in use; one that does not is a laptop asleep or a network gone,
and its session is taken over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncssh

KEEPALIVE_REQUEST = b"keepalive@openssh.com"


def connection_probe(chan: asyncssh.SSHServerChannel) -> Callable[[], Awaitable[bool]]:
    """A probe that sends the connection a keepalive and is True once it is answered.

    OpenSSH clients answer ``keepalive@openssh.com`` at once (with a failure, which
    is an answer), as they do the server's own keepalives; the caller bounds the
    wait. asyncssh has no public call for one request, so its keepalive's own
    method is used; without it every connection counts as live, as before.
    """

    async def probe() -> bool:
        if chan.is_closing():
            return False
        ask = getattr(chan.get_connection(), "_make_global_request", None)
        if ask is None:
            return True
        try:
            await ask(KEEPALIVE_REQUEST)
        except (asyncssh.Error, OSError):
            return False
        return not chan.is_closing()

    return probe
