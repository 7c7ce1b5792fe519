"""In-process: the reasons given for connections that end before authentication, the
rate limit on asyncssh's lines, and RFC 4253's rule for a guessed first packet."""

from __future__ import annotations

import doctest
import logging

import asyncssh
import pytest
from asyncssh.packet import Boolean, Byte, NameList, UInt32

from mtgpu.sshd import interop, preauth


@pytest.mark.parametrize("module", [preauth, interop])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize(
    ("exc", "why", "expect", "problem"),
    [
        (
            asyncssh.KeyExchangeFailed("No matching MAC algorithm found, sent a and received b"),
            "",
            "no matching MAC",
            True,
        ),
        (
            asyncssh.KeyExchangeFailed("No matching key exchange algorithm found"),
            "",
            "no matching key exchange",
            True,
        ),
        (
            asyncssh.KeyExchangeFailed("Unable to find compatible server host key"),
            "",
            "key exchange failed: Unable",
            True,
        ),
        (
            asyncssh.ProtocolError("Key exchange not in progress"),
            "",
            "protocol error: Key exchange not",
            True,
        ),
        (ConnectionResetError(104, "reset"), "", "closed by the client (connection reset)", False),
        (asyncssh.ConnectionLost("Connection lost"), "penalised: too many", "penalised: too many", True),
        (None, "", "closed by the client", False),
    ],
)
def test_each_end_gets_a_reason_and_a_level(exc, why, expect, problem):
    assert preauth.reason(exc, why).startswith(expect)
    assert preauth.is_problem(exc, why) is problem


def test_a_clients_text_is_bounded_and_escaped(caplog):
    with caplog.at_level(logging.INFO, logger="mtgpu.sshd.preauth"):
        preauth.ended(
            ("10.0.0.1", 5), "SSH-2.0-x\x1b]0;pwned\x07" + "A" * 5000, "closed by the client", False
        )
    line = caplog.records[-1].getMessage()
    assert "\x1b" not in line and "\x07" not in line and "\\x1b" in line
    assert len(line) < preauth.MAX_VERSION + 200


def test_asyncssh_lines_of_one_kind_are_limited_whatever_the_connection():
    f = preauth._ContextFreeRepeats(burst=3, window=60, clock=lambda: 0.0)

    def rec(n: int) -> logging.LogRecord:
        return logging.LogRecord(
            "asyncssh", logging.INFO, "", 0, f"[conn={n}] Accepted SSH client connection", (), None
        )

    kept = [r for r in (rec(n) for n in range(50)) if f.filter(r)]
    assert len(kept) == 3
    # The connection stays in the line that is written, and the count is told.
    assert kept[0].getMessage() == "[conn=0] Accepted SSH client connection"
    assert kept[-1].getMessage().startswith("[conn=2] Accepted") and "not written" in kept[-1].getMessage()


def test_follow_log_level_sets_asyncssh_to_the_daemons_level():
    logger = logging.getLogger("asyncssh")
    old = logger.level
    try:
        preauth.follow_log_level("DEBUG")
        assert logger.level == logging.DEBUG and preauth._asyncssh_filter in logger.filters
        preauth.follow_log_level("WARNING")
        assert logger.level == logging.WARNING
        # At INFO only asyncssh's warnings: its INFO lines are several per channel, and
        # would push the daemon's own lines out of a busy host's log.
        preauth.follow_log_level("INFO")
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(old)


def _kexinit(kex: list[bytes], host_keys: list[bytes], follows: bool) -> bytes:
    lists = [NameList(kex), NameList(host_keys)] + [NameList([b"x"])] * 6 + [NameList([])] * 2
    return b"".join([Byte(20), bytes(16), *lists, Boolean(follows), UInt32(0)])


@pytest.mark.parametrize(
    ("client_kex", "client_hk", "wrong"),
    [
        ([b"curve25519-sha256"], [b"ssh-ed25519"], True),  # Dropbear against MTGPU: ignore
        ([b"mlkem768x25519-sha256"], [b"ssh-ed25519"], False),
        ([b"mlkem768x25519-sha256"], [b"ecdsa-sha2-nistp256", b"ssh-ed25519"], True),
    ],
)
def test_a_guess_is_wrong_when_the_preferred_methods_differ(client_kex, client_hk, wrong):
    ours = _kexinit([b"mlkem768x25519-sha256", b"curve25519-sha256"], [b"ssh-ed25519"], False)
    assert interop.first_guess_is_wrong(_kexinit(client_kex, client_hk, True), ours) is wrong


def test_the_rule_is_installed_on_the_tested_asyncssh():
    from asyncssh.connection import SSHConnection, SSHServerConnection
    from asyncssh.constants import MSG_KEXINIT

    assert interop.apply() == ""
    assert (
        SSHServerConnection._packet_handlers[MSG_KEXINIT] is not SSHConnection._packet_handlers[MSG_KEXINIT]
    )
