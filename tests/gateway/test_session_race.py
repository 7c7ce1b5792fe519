"""A session channel the client closes the moment it opens (mtgpu/gateway/session.py):
the daemon may find the channel's connection state already gone while it still sets
the session up. That is an ordinary hang-up, never a traceback in the daemon's log."""

from __future__ import annotations

import asyncio

import asyncssh
import pytest

pytestmark = pytest.mark.root

#: Channels opened and closed at once; enough that some close while the session is
#: still being set up (the account lookup runs in a thread).
CHANNELS = 40


def test_a_channel_closed_at_once_leaves_no_traceback(shared_host):
    host = shared_host
    key = host.add_user("quinn")
    assert host.ssh("quinn", key, "true").returncode == 0

    async def churn() -> str:
        async with asyncssh.connect(
            "127.0.0.1",
            host.port,
            username="quinn",
            client_keys=[str(key)],
            known_hosts=None,
            agent_path=None,
        ) as conn:
            for i in range(CHANNELS):
                cmd = None if i % 2 else "true"  # a shell and a command
                chan, _ = await conn.create_session(asyncssh.SSHClientSession, cmd)
                chan.close()
            await asyncio.sleep(2)  # the daemon's side of the closed channels ends
            r = await conn.run("echo still-here", timeout=30)
            return str(r.stdout).strip()

    assert asyncio.run(asyncio.wait_for(churn(), 120)) == "still-here"
    log = host.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "AttributeError" not in log, log[-3000:]
    assert "session of quinn failed" not in log, log[-3000:]
