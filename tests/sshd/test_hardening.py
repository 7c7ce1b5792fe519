"""OpenSSH-style hardening: grace time, MaxStartups (per source too), MaxAuthTries,
source penalties that never refuse a registered key, modern algorithms with strict
key exchange."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import subprocess
import time

import asyncssh
import pytest
from mtgpu_testing import SSH_OPTS, wait_for

from mtgpu.sshd.limits import PENALTY_DELAY

pytestmark = pytest.mark.root


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _closed_within(s: socket.socket, seconds: float) -> bool:
    s.settimeout(seconds)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _server_kexinit(port: int) -> dict[str, list[str]]:
    """Read the server's (unencrypted) KEXINIT and return its name-lists."""
    s = _raw(port)
    f = s.makefile("rb")
    banner = f.readline()
    assert banner.startswith(b"SSH-2.0-")
    s.sendall(b"SSH-2.0-probe\r\n")
    plen = struct.unpack(">I", f.read(4))[0]
    body = f.read(plen)
    s.close()
    pad = body[0]
    payload = body[1 : plen - pad]
    assert payload[0] == 20  # SSH_MSG_KEXINIT
    pos = 1 + 16
    names = ["kex", "hostkey", "enc_cs", "enc_sc", "mac_cs", "mac_sc", "comp_cs", "comp_sc"]
    out = {}
    for n in names:
        ln = struct.unpack(">I", payload[pos : pos + 4])[0]
        out[n] = payload[pos + 4 : pos + 4 + ln].decode().split(",")
        pos += 4 + ln
    return out


def test_asyncssh_is_recent_enough_for_strict_kex():
    major, minor, patch = (int(x) for x in asyncssh.__version__.split(".")[:3])
    assert (major, minor, patch) >= (2, 14, 2)


def test_only_modern_algorithms_with_strict_kex(shared_host):
    k = _server_kexinit(shared_host.port)
    assert "kex-strict-s-v00@openssh.com" in k["kex"]
    weak = ("sha1", "cbc", "group1-", "group14-sha1", "md5", "3des", "arcfour", "ssh-rsa", "ssh-dss")
    for field in ("kex", "hostkey", "enc_cs", "enc_sc", "mac_cs", "mac_sc"):
        for alg in k[field]:
            assert not any(w in alg for w in weak), f"{field}: {alg}"
    assert k["comp_cs"] == ["none"]
    key = shared_host.add_user("algo")
    # A weak MAC with a cipher that needs one (ChaCha20-Poly1305 and AES-GCM carry their own).
    for opts in (
        ["Ciphers=aes128-cbc"],
        ["KexAlgorithms=diffie-hellman-group14-sha1"],
        ["Ciphers=aes128-ctr", "MACs=hmac-sha1"],
    ):
        r = shared_host.ssh("algo", key, "true", opts=[a for o in opts for a in ("-o", o)])
        assert r.returncode == 255, opts
    assert shared_host.ssh("algo", key, "true").returncode == 0


def test_login_grace_time(make_host):
    host = make_host({"SSH_LOGIN_GRACE_TIME": "2s"})
    s = _raw(host.port)
    assert s.recv(100).startswith(b"SSH-2.0-")
    assert _closed_within(s, 20)


def _from(source: str, port: int) -> socket.socket:
    """A TCP connection to the daemon from the loopback address ``source`` (127.0.0.N)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return s


def test_max_startups_caps_unauthenticated_connections(make_host):
    """SSH_MAX_STARTUPS as a plain number: every unauthenticated connection past it is
    dropped at once, whatever its address (each of these comes from its own)."""
    host = make_host({"SSH_MAX_STARTUPS": 3, "SSH_MAX_STARTUPS_PER_SOURCE": 2})
    time.sleep(1)  # let the daemon see the start-up probe's connection go
    held = [_from(f"127.0.0.{n}", host.port) for n in (2, 3, 4)]
    for s in held:
        assert s.recv(100).startswith(b"SSH-2.0-")
    extra = _from("127.0.0.5", host.port)
    assert _closed_within(extra, 10)
    assert "(SSH_MAX_STARTUPS is 3:100:3)" in host.log()
    for s in held:
        s.close()
    key = host.add_user("after")
    deadline = time.time() + 10
    while host.ssh("after", key, "true").returncode != 0 and time.time() < deadline:
        time.sleep(0.2)
    assert host.ssh("after", key, "true").returncode == 0


def test_max_startups_per_source_drops_one_addresss_excess_only(make_host):
    """Past SSH_MAX_STARTUPS_PER_SOURCE unauthenticated connections from one address,
    that address's next one is dropped at once; another address logs in, and so does
    the same address once it has logged in (a logged-in connection holds no slot)."""
    host = make_host({"SSH_MAX_STARTUPS_PER_SOURCE": 2})
    key = host.add_user("nat")
    time.sleep(1)
    held = [_from("127.0.0.2", host.port) for _ in range(2)]
    try:
        for s in held:
            assert s.recv(100).startswith(b"SSH-2.0-")
        extra = _from("127.0.0.2", host.port)
        assert _closed_within(extra, 10)
        assert "from 127.0.0.2 (SSH_MAX_STARTUPS_PER_SOURCE is 2)" in host.log()
        r = host.ssh("nat", key, "true")
        assert r.returncode == 0, r.stderr
    finally:
        for s in held:
            s.close()

    async def logged_in_three() -> str:
        conns = [
            await asyncssh.connect(
                "127.0.0.1", host.port, username="nat", client_keys=[str(key)], known_hosts=None
            )
            for _ in range(3)
        ]
        try:
            r = await conns[-1].run("echo three", timeout=30)
            return str(r.stdout).strip()
        finally:
            for c in conns:
                c.close()

    # Three logged-in connections from one address, past its startup slots of 2.
    assert asyncio.run(logged_in_three()) == "three"


def test_idle_connections_from_one_address_do_not_keep_another_out(make_host):
    """Hostile: 105 TCP connections from 127.0.0.2 that never send a version string.
    With the default limits all but SSH_MAX_STARTUPS_PER_SOURCE of them are closed at
    once, and a login from 127.0.0.1 goes through at once (it used to find the
    SSH_MAX_STARTUPS slots all taken and be closed: "kex_exchange_identification")."""
    host = make_host()
    key = host.add_user("colleague")
    t0 = time.monotonic()
    r = host.ssh("colleague", key, "true")
    quiet = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    flood = [_from("127.0.0.2", host.port) for _ in range(105)]
    try:
        t0 = time.monotonic()
        r = host.ssh("colleague", key, "true")
        took = time.monotonic() - t0
        print(f"login during the flood took {took:.2f}s (without it {quiet:.2f}s)")
        assert r.returncode == 0, r.stderr
        assert took < 15, f"the login took {took:.1f}s"
        # The daemon closed the flood's excess itself; it kept a few until the grace time.
        open_ = _still_open(flood, 10)
        assert len(open_) <= 10, f"{len(open_)} of the flood's connections still open"
    finally:
        for s in flood:
            s.close()
    assert "(SSH_MAX_STARTUPS_PER_SOURCE is 10)" in host.log()


def _still_open(socks: list[socket.socket], seconds: float) -> list[socket.socket]:
    """The sockets the daemon has not closed within ``seconds`` (reading what it sent)."""
    left = list(socks)
    deadline = time.monotonic() + seconds
    while left and time.monotonic() < deadline:
        ready, _, _ = select.select(left, [], [], 0.2)
        for s in ready:
            try:
                if not s.recv(65536):
                    left.remove(s)
            except OSError:
                left.remove(s)
        if not ready and len(left) <= 10:
            break
    return left


def test_max_auth_tries_drops_the_connection(make_host):
    host = make_host({"SSH_MAX_AUTH_TRIES": 2})
    host.add_user("tries")
    wrong = [host.key(f"wrong{i}") for i in range(4)]
    opts = []
    for k in wrong:
        opts += ["-i", str(k)]
    r = host.ssh("tries", None, "true", opts=opts)
    assert r.returncode == 255
    assert b"Too many authentication failures" in r.stderr


def _ssh_verbose(host, user: str, *keys, cmd: str = "true") -> subprocess.CompletedProcess[bytes]:
    """OpenSSH at LogLevel INFO (the test default is ERROR), which prints the daemon's
    authentication banner; each of ``keys`` offered in turn."""
    argv = ["ssh", "-o", "LogLevel=INFO", *SSH_OPTS, "-p", str(host.port)]
    for k in keys:
        argv += ["-i", str(k)]
    return subprocess.run(
        [*argv, f"{user}@127.0.0.1", cmd], capture_output=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_a_penalty_slows_other_keys_but_never_refuses_a_registered_one(make_host):
    """After SSH_PENALTY_FAILURES failed logins as a user from one address (anyone
    behind the same NAT could make them), that user's own key still logs in from there,
    even offered after a wrong one; a key that is not registered is refused slowly,
    with the reason; other users from the address are not touched."""
    host = make_host({"SSH_PENALTY_FAILURES": 3, "SSH_PENALTY_SECONDS": "1h"})
    good = host.add_user("victim")
    other = host.add_user("neighbour")
    for i in range(3):
        r = host.ssh("victim", host.key(f"brute{i}"), "true")
        assert r.returncode == 255
    wait_for(lambda: "penalizing 127.0.0.1 for logins as 'victim'" in host.log(), 30, "the penalty")
    # A wrong key: refused, late, and told why.
    t0 = time.monotonic()
    r = _ssh_verbose(host, "victim", host.key("brute9"))
    slow = time.monotonic() - t0
    assert r.returncode == 255
    assert b"too many failed logins as victim" in r.stderr and b"SSH_PENALTY_SECONDS" in r.stderr, r.stderr
    assert slow >= PENALTY_DELAY * 0.9, slow
    # The registered key logs in, alone or after a wrong one, as often as asked.
    for _ in range(3):
        r = host.ssh("victim", good, "echo in")
        assert r.returncode == 0 and r.stdout.strip() == b"in", r.stderr
    r = _ssh_verbose(host, "victim", host.key("brute8"), good, cmd="echo in")
    assert r.returncode == 0 and r.stdout.strip() == b"in", r.stderr
    # Another user on the same address is not penalised.
    r = host.ssh("neighbour", other, "true")
    assert r.returncode == 0, r.stderr


def test_a_penalty_refuses_invite_logins_from_that_address(make_host):
    """Wrong invite codes count as failed logins: past SSH_PENALTY_FAILURES, the
    invite cannot be tried from that address (not even with the right code) until the
    penalty ends; the code is what the penalty guards."""
    host = make_host({"SSH_PENALTY_FAILURES": 2, "SSH_PENALTY_SECONDS": "1h", "INVITE_MAX_FAILURES": 10})
    code = json.loads(host.admin("invite", "ivan", "--json").stdout)["code"]
    stranger = host.key("ivan-stranger")
    for _ in range(2):
        r = host.ssh("ivan", stranger, "mtgpu-join", "aaaa-bbbb-cccc")
        assert r.returncode == 1 and b"wrong or expired invite code" in r.stderr, r.stderr
    wait_for(lambda: "penalizing 127.0.0.1 for logins as 'ivan'" in host.log(), 30, "the penalty")
    r = host.ssh("ivan", host.key("ivan"), "mtgpu-join", code)
    assert r.returncode == 255 and b"Permission denied" in r.stderr, r.stderr
