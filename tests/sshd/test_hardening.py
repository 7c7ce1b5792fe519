"""OpenSSH-style hardening: grace time, MaxStartups, MaxAuthTries, source penalties,
modern algorithms with strict key exchange."""

from __future__ import annotations

import socket
import struct
import time

import asyncssh
import pytest

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


def test_max_startups_caps_unauthenticated_connections(make_host):
    host = make_host({"SSH_MAX_STARTUPS": 3})
    time.sleep(1)  # let the daemon see the start-up probe's connection go
    held = [_raw(host.port) for _ in range(3)]
    for s in held:
        assert s.recv(100).startswith(b"SSH-2.0-")
    extra = _raw(host.port)
    assert _closed_within(extra, 10)
    assert "SSH_MAX_STARTUPS" in host.log()
    for s in held:
        s.close()
    key = host.add_user("after")
    deadline = time.time() + 10
    while host.ssh("after", key, "true").returncode != 0 and time.time() < deadline:
        time.sleep(0.2)
    assert host.ssh("after", key, "true").returncode == 0


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


def test_repeated_failures_penalize_the_user_from_that_source_only(make_host):
    host = make_host({"SSH_PENALTY_FAILURES": 3, "SSH_PENALTY_SECONDS": "1h"})
    good = host.add_user("victim")
    other = host.add_user("neighbour")
    for i in range(3):
        r = host.ssh("victim", host.key(f"brute{i}"), "true")
        assert r.returncode == 255
    # Now even the right key is refused for that name from this address, with the
    # reason: the connection is dropped before any key is tried.
    r = host.ssh("victim", good, "true")
    assert r.returncode == 255
    assert b"Permission denied" not in r.stderr
    assert b"too many failed logins as victim" in r.stderr and b"SSH_PENALTY_SECONDS" in r.stderr
    assert "penalizing 127.0.0.1 for logins as 'victim'" in host.log()
    # Another user on the same address is not locked out.
    r = host.ssh("neighbour", other, "true")
    assert r.returncode == 0, r.stderr
