"""A login the replica cannot place makes the member catch up with the scheduler's log
before it refuses: a user, key or invite acknowledged on another member logs in here."""

from __future__ import annotations

import asyncio
import types

import asyncssh

from mtgpu.sshd.limits import ConnectionLimits
from mtgpu.sshd.server import MtgpuSSHServer


class _Registry:
    """A replica that holds ``users`` once ``applied`` (the catch-up applies it)."""

    def __init__(self) -> None:
        self.users: dict[str, set[str]] = {}
        self.later: dict[str, set[str]] = {}

    def get(self, name):
        return {"name": name} if name in self.users else None

    def has_key(self, name, line):
        return line.strip() in self.users.get(name, set())

    def pending_invite(self, name, now, line=None, max_failures=None):
        return None


def _daemon(registry, caught_up=True):
    calls = []

    async def catch_up():
        calls.append(1)
        registry.users.update(registry.later)
        return caught_up

    async def local_key_allowed(name, line):
        return False

    d = types.SimpleNamespace(
        registry=registry,
        catch_up=catch_up,
        local_key_allowed=local_key_allowed,
        options=types.SimpleNamespace(ssh_max_auth_tries=6, invite_max_failures=3),
    )
    return d, calls


def test_a_user_added_elsewhere_is_found_after_catching_up():
    key = asyncssh.generate_private_key("ssh-ed25519")
    line = key.export_public_key("openssh").decode().strip()
    reg = _Registry()
    reg.later = {"ana": {line}}  # acknowledged on another member, not applied here yet
    daemon, calls = _daemon(reg)
    server = MtgpuSSHServer(daemon, None, {"unauthenticated": 0}, ConnectionLimits(lambda: daemon.options))
    assert asyncio.run(server._kind_for("ana", key)) == "tenant"
    assert calls == [1]


def test_a_known_key_needs_no_catch_up_and_a_stranger_is_still_refused():
    key = asyncssh.generate_private_key("ssh-ed25519")
    line = key.export_public_key("openssh").decode().strip()
    reg = _Registry()
    reg.users = {"ana": {line}}
    daemon, calls = _daemon(reg)
    server = MtgpuSSHServer(daemon, None, {"unauthenticated": 0}, ConnectionLimits(lambda: daemon.options))
    assert asyncio.run(server._kind_for("ana", key)) == "tenant"
    assert calls == []
    # A stranger's key (hostile): one catch-up, then the refusal.
    other = asyncssh.generate_private_key("ssh-ed25519")
    assert asyncio.run(server._kind_for("ana", other)) is None
    assert asyncio.run(server._kind_for("mallory", other)) is None
    assert calls == [1, 1]
