"""Every connection that ends before authentication leaves one log line with its reason.

The line names the peer, the client's version string and why: no matching cipher,
key exchange method or MAC, timeout, penalised, too many refused keys, closed by the
client. A flood of such connections is summarized, not written line by line.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from collections import Counter

import pytest
from mtgpu_testing import SSH_OPTS, Host, wait_for

from mtgpu.sshd import preauth

pytestmark = pytest.mark.root

MARK = "closed before authentication"


@pytest.fixture(scope="module")
def host():
    h = Host({"SSH_LOGIN_GRACE_TIME": 3, "SSH_PENALTY_FAILURES": 2, "SSH_MAX_AUTH_TRIES": 2})
    h.start()
    h.add_user("known")
    yield h
    h.cleanup()


def _lines(host: Host) -> list[str]:
    return [line for line in host.log_path.read_text(errors="replace").splitlines() if MARK in line]


def _one_new_line(host: Host, before: int) -> str:
    """The single pre-authentication line logged since there were ``before``."""
    wait_for(lambda: len(_lines(host)) > before, timeout=30, what="the pre-authentication line")
    new = _lines(host)[before:]
    assert len(new) == 1, new
    return new[0]


def _ssh(host: Host, *opts: str, user: str = "known", key: str = "known") -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh",
        *SSH_OPTS,
        "-p",
        str(host.port),
        "-i",
        str(host.key(key)),
        *opts,
        f"{user}@127.0.0.1",
        "true",
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        (["-c", "aes128-cbc"], "no matching cipher"),
        (["-o", "KexAlgorithms=diffie-hellman-group14-sha256"], "no matching key exchange method"),
        (["-c", "aes128-ctr", "-o", "MACs=hmac-sha1"], "no matching MAC"),
    ],
)
def test_a_failed_negotiation_is_logged_once_with_its_reason(host, opts, reason):
    before = len(_lines(host))
    assert _ssh(host, *opts).returncode != 0
    line = _one_new_line(host, before)
    assert reason in line and "SSH-2.0-OpenSSH_" in line and "127.0.0.1 port " in line, line


def test_a_client_that_never_logs_in_is_logged_as_a_timeout(host):
    before = len(_lines(host))
    with socket.create_connection(("127.0.0.1", host.port), timeout=30) as s:
        s.sendall(b"SSH-2.0-slowpoke_1.0\r\n")
        wait_for(lambda: len(_lines(host)) > before, timeout=30, what="SSH_LOGIN_GRACE_TIME to pass")
    line = _one_new_line(host, before)
    assert "timeout" in line and "SSH_LOGIN_GRACE_TIME" in line and "(SSH-2.0-slowpoke_1.0)" in line, line


def test_a_client_that_leaves_is_logged_with_its_version(host):
    before = len(_lines(host))
    with socket.create_connection(("127.0.0.1", host.port), timeout=30) as s:
        s.sendall(b"SSH-2.0-leaver\x1b[31m\r\n")
        s.recv(100)
    line = _one_new_line(host, before)
    # The control character a client sent is shown escaped, never written raw.
    assert "closed by the client" in line and "SSH-2.0-leaver\\x1b[31m" in line and "\x1b" not in line, line


def test_refused_keys_then_penalised_each_leave_one_line(host):
    host.key("stranger")
    for _ in range(2):
        before = len(_lines(host))
        assert _ssh(host, user="pen", key="stranger").returncode != 0
        line = _one_new_line(host, before)
        assert "refused key" in line and "'pen'" in line, line
    before = len(_lines(host))
    r = _ssh(host, user="pen", key="stranger")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    line = _one_new_line(host, before)
    assert "penalised: too many failed logins as pen" in line and "SSH_PENALTY_FAILURES" in line, line


def test_too_many_refused_keys_is_logged_with_the_limit(host):
    keys = [str(host.key(f"wrong{i}")) for i in range(3)]
    before = len(_lines(host))
    argv = [
        "ssh",
        *SSH_OPTS,
        "-p",
        str(host.port),
        *(a for k in keys for a in ("-i", k)),
        "many@127.0.0.1",
        "true",
    ]
    assert subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL).returncode != 0
    line = _one_new_line(host, before)
    assert "too many authentication failures" in line and "SSH_MAX_AUTH_TRIES" in line, line


def test_a_login_leaves_no_preauth_line(host):
    before = len(_lines(host))
    assert _ssh(host).returncode == 0
    wait_for(lambda: "accepted" in host.log_path.read_text(errors="replace"), timeout=30, what="the login")
    assert len(_lines(host)) == before


def test_a_flood_of_preauth_disconnects_is_summarized_not_written(make_host):
    """Hostile: 600 connections that each send a version string and leave, from many
    threads, past SSH_MAX_STARTUPS(_PER_SOURCE) too. The log gets at most a burst of lines per kind
    and a count, never one line (or asyncssh's several) per connection."""
    h = make_host({"SSH_MAX_STARTUPS": 10, "SSH_MAX_STARTUPS_PER_SOURCE": 5})
    start = len(h.log_path.read_text(errors="replace").splitlines())
    count = 600
    done = []

    def flood(n: int) -> None:
        for _ in range(n):
            try:
                with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
                    s.sendall(b"SSH-2.0-flood\r\n")
            except OSError:
                pass
            done.append(1)

    threads = [threading.Thread(target=flood, args=(count // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == count
    # Once a login goes through, the daemon has read (and logged or counted) the flood.
    key = h.add_user("after")
    wait_for(lambda: h.ssh("after", key, "true").returncode == 0, timeout=120, what="a login after the flood")
    added = h.log_path.read_text(errors="replace").splitlines()[start:]
    preauth_lines = [line for line in added if MARK in line]
    assert preauth_lines, "no pre-authentication line at all"
    assert any("not written" in line for line in preauth_lines), preauth_lines[-3:]
    # No kind of line (asyncssh's own included) is written more than a burst per
    # window, and the whole flood is a few hundred lines at most, not one per connection.
    kinds = Counter(re.sub(r"[0-9]+", "#", line.split(" ", 2)[-1]) for line in added)
    worst = kinds.most_common(1)[0]
    assert worst[1] <= 2 * (preauth.BURST + 1), worst
    assert len(added) < count // 2, f"{len(added)} lines for {count} connections"
