"""RFC 4253's rule for a client's guessed first key-exchange packet, which Dropbear needs.

A client may send its first key-exchange packet right after its KEXINIT, guessing
the algorithm (``first_kex_packet_follows``). RFC 4253 section 7 says the guess is
wrong, and the packet MUST be ignored, when the two sides' *preferred* (first-listed)
key-exchange or host-key algorithms differ, whatever is then negotiated. The client
applies that rule too: after a wrong guess it sends the packet again.

asyncssh (2.24) ignores the guessed packet only when the *negotiated* algorithm is
not the client's first. Dropbear's ``dbclient`` guesses (OpenSSH, PuTTY and libssh2
never do): with MTGPU preferring ``mlkem768x25519-sha256`` and dbclient
``curve25519-sha256``, dbclient sends ``KEX_ECDH_INIT`` twice, asyncssh answers the
first, takes the second for a packet outside a key exchange and disconnects ("Key
exchange not in progress"); dbclient prints "Disconnect received". OpenSSH's sshd
applies the RFC's rule, which is why dbclient works there.

:func:`apply` wraps asyncssh's server-side KEXINIT handler so the decision follows
the RFC; the algorithms offered and negotiated are unchanged. It replaces an entry
of a private table (``SSHServerConnection._packet_handlers``), so it is applied only
on the asyncssh releases in :data:`TESTED` (tests/sshd/test_client_matrix.py logs in
with dbclient against the installed one); elsewhere asyncssh's own rule stays and
the daemon says so once. The same wrapper keeps why a key exchange failed
(:func:`kex_failure`), which the one line logged for a connection that ends before
authentication names.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger("mtgpu.sshd")

#: asyncssh releases (major.minor) whose KEXINIT handling this was checked against.
TESTED = ("2.24",)

_applied: str | None = None
#: Where a connection keeps why its key exchange failed (see :func:`kex_failure`).
FAILURE = "_mtgpu_kex_failure"


def kex_failure(conn: Any) -> Exception | None:
    """Why ``conn``'s key exchange failed (no common algorithm...), if it did."""
    failure = getattr(conn, FAILURE, None)
    return failure if isinstance(failure, Exception) else None


def first_guess_is_wrong(client_kexinit: bytes, server_kexinit: bytes) -> bool:
    """Whether the client announced a guessed packet that RFC 4253 says to ignore.

    Both arguments are whole KEXINIT payloads (message number first).

    >>> from asyncssh.packet import Boolean, Byte, NameList, UInt32
    >>> def kexinit(kex, hk, follows):
    ...     lists = [NameList(kex), NameList(hk)] + [NameList([b"x"])] * 6 + [NameList([])] * 2
    ...     return b"".join([Byte(20), bytes(16), *lists, Boolean(follows), UInt32(0)])
    >>> ours = kexinit([b"mlkem768x25519-sha256", b"curve25519-sha256"], [b"ssh-ed25519"], False)
    >>> first_guess_is_wrong(kexinit([b"curve25519-sha256"], [b"ssh-ed25519"], True), ours)
    True
    >>> first_guess_is_wrong(kexinit([b"mlkem768x25519-sha256"], [b"ssh-ed25519"], True), ours)
    False
    >>> first_guess_is_wrong(kexinit([b"curve25519-sha256"], [b"ssh-ed25519"], False), ours)
    False
    """
    from asyncssh.packet import SSHPacket

    def firsts(payload: bytes) -> tuple[bytes, bytes, bool]:
        pkt = SSHPacket(payload)
        pkt.get_byte()
        pkt.get_bytes(16)  # cookie
        kex, host_keys = pkt.get_namelist(), pkt.get_namelist()
        for _ in range(8):  # ciphers, MACs, compression (both ways), languages
            pkt.get_namelist()
        return (kex[:1] or [b""])[0], (host_keys[:1] or [b""])[0], pkt.get_boolean()

    client_kex, client_hk, follows = firsts(client_kexinit)
    server_kex, server_hk, _ = firsts(server_kexinit)
    return follows and (client_kex != server_kex or client_hk != server_hk)


def apply() -> str:
    """Make asyncssh's server follow RFC 4253 on a guessed first packet (idempotent);
    return "" once in place, else why asyncssh's own rule stays (logged once)."""
    global _applied
    if _applied is not None:
        return _applied
    import asyncssh

    version = getattr(asyncssh, "__version__", "?")
    _applied = _install(version)
    if _applied:
        log.warning(
            "key exchange: asyncssh %s's own rule for a client's guessed first packet is in use "
            "(%s); Dropbear's dbclient may be disconnected",
            version,
            _applied,
        )
    return _applied


def _install(version: str) -> str:
    if ".".join(version.split(".")[:2]) not in TESTED:
        return f"the RFC 4253 rule was checked with asyncssh {', '.join(TESTED)} only"
    import asyncssh
    from asyncssh.connection import SSHServerConnection
    from asyncssh.constants import MSG_KEXINIT

    handlers = dict(SSHServerConnection._packet_handlers)
    original = handlers.get(MSG_KEXINIT)
    if original is None or not inspect.iscoroutinefunction(original):
        return "asyncssh's connection no longer has the KEXINIT handling this adjusts"

    async def process_kexinit(self: Any, pkttype: int, pktid: int, packet: Any) -> None:
        try:
            await original(self, pkttype, pktid, packet)
        except asyncssh.DisconnectError as exc:
            # A client that finds no common algorithm closes at once, often before this
            # runs; the connection then reads as lost, and this is the real reason.
            self.__dict__[FAILURE] = exc
            raise
        # The guessed packet is only read once this handler has finished.
        self._ignore_first_kex = first_guess_is_wrong(self._client_kexinit, self._server_kexinit)

    handlers[MSG_KEXINIT] = process_kexinit
    SSHServerConnection._packet_handlers = handlers
    return ""
