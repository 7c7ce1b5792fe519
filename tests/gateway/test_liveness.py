"""The probe that tells a terminal's live SSH client from a frozen or dead one
(mtgpu/gateway/liveness.py): an asyncssh server in this process, a real OpenSSH
client frozen with SIGSTOP (a closed lid: the kernel still holds the connection)."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncssh
import pytest
from mtgpu_testing import SSH_OPTS

from mtgpu.gateway.liveness import ANSWER_DEADLINE, ConnectionProbe
from mtgpu.tmux.runtime import LiveTerminals

#: Far more than the probe needs; only a hang fails it.
GENEROUS = 30.0


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: this is about the connection


async def _with_client(test: Callable[[ConnectionProbe, asyncio.subprocess.Process], Awaitable[Any]]) -> Any:
    """Run ``test`` with a probe of a real ``ssh`` client's session channel."""
    channels: asyncio.Queue[asyncssh.SSHServerChannel] = asyncio.Queue()

    async def hold(process: asyncssh.SSHServerProcess) -> None:
        await channels.put(process.channel)
        await process.stdin.read()  # until the client goes
        process.exit(0)

    acceptor = await asyncssh.create_server(
        _Server,
        "127.0.0.1",
        0,
        server_host_keys=[asyncssh.generate_private_key("ssh-ed25519")],
        process_factory=hold,
        encoding=None,
    )
    port = acceptor.sockets[0].getsockname()[1]
    client = await asyncio.create_subprocess_exec(
        "ssh", *SSH_OPTS, "-T", "-p", str(port), "x@127.0.0.1", "hold",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        chan = await asyncio.wait_for(channels.get(), GENEROUS)
        return await test(ConnectionProbe(chan), client)
    finally:
        if client.returncode is None:
            os.kill(client.pid, signal.SIGCONT)
            client.kill()
            await client.wait()
        acceptor.close()


def _run(test: Callable[[ConnectionProbe, asyncio.subprocess.Process], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(_with_client(test), 3 * GENEROUS))


def test_a_live_client_answers() -> None:
    async def go(probe: ConnectionProbe, client: Any) -> list[bool]:
        return [await probe() for _ in range(3)]

    assert _run(go) == [True, True, True]


def test_a_frozen_client_is_dead_within_the_deadline_and_live_again_when_it_wakes() -> None:
    async def go(probe: ConnectionProbe, client: Any) -> tuple[bool, float, bool, bool]:
        assert await probe()
        os.kill(client.pid, signal.SIGSTOP)  # the lid closes right after it answered
        t0 = time.monotonic()
        frozen = await probe()
        took = time.monotonic() - t0
        again = await probe()  # the same unanswered question, not a new one each login
        os.kill(client.pid, signal.SIGCONT)
        deadline = time.monotonic() + GENEROUS
        while not await probe() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return frozen, took, again, await probe()

    frozen, took, again, woke = _run(go)
    assert (frozen, again, woke) == (False, False, True)
    assert took < GENEROUS


def test_a_killed_client_is_dead() -> None:
    async def go(probe: ConnectionProbe, client: Any) -> bool:
        client.kill()
        await client.wait()
        deadline = time.monotonic() + GENEROUS
        while await probe() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return await probe()

    assert _run(go) is False


def test_a_busy_daemon_still_counts_an_answer_that_came_in_time() -> None:
    """The reply reached the socket while the daemon's loop was blocked past the
    deadline: it is read, and the terminal is live, not taken over."""

    async def go(probe: ConnectionProbe, client: Any) -> bool:
        probe.start()
        for _ in range(3):
            await asyncio.sleep(0)  # the request goes out
        t0 = time.monotonic()
        # The whole loop blocked, as under load, until the answer is in the socket (however
        # slow a loaded machine makes the client) and past the deadline.
        sock = probe.chan.get_connection().get_extra_info("socket")
        select.select([sock.fileno()], [], [], 60)
        time.sleep(max(0.0, 3 * ANSWER_DEADLINE - (time.monotonic() - t0)))  # noqa: ASYNC251
        return await probe()

    assert _run(go) is True


def test_prime_starts_asking_so_a_later_question_is_answered_at_once() -> None:
    async def go(probe: ConnectionProbe, client: Any) -> tuple[int, float]:
        live = LiveTerminals()
        live.add("/dev/pts/7", 1000, probe)
        os.kill(client.pid, signal.SIGSTOP)
        assert live.prime(2000) == 0  # another tenant's login asks nothing of this one
        assert live.prime(1000) == 1
        await asyncio.sleep(ANSWER_DEADLINE + 0.5)  # the new login's program starting
        t0 = time.monotonic()
        dead = await live.dead(1000, ["/dev/pts/7"])
        return len(dead), time.monotonic() - t0

    n, took = _run(go)
    assert n == 1
    # Already past its deadline: answered without waiting another one (generously).
    assert took < ANSWER_DEADLINE + 5


@pytest.mark.parametrize("frozen", [False, True])
def test_dead_names_frozen_connections_only(frozen: bool) -> None:
    async def go(probe: ConnectionProbe, client: Any) -> list[str]:
        live = LiveTerminals()
        live.add("/dev/pts/8", 1000, probe)
        if frozen:
            os.kill(client.pid, signal.SIGSTOP)
        return await live.dead(1000, ["/dev/pts/8"])

    assert _run(go) == (["/dev/pts/8"] if frozen else [])
