"""The AES-GCM fast path (mtgpu/sshd/fastpath.py) against the installed asyncssh: it is
in use on the pinned release, it seals and opens exactly asyncssh's own bytes, real
transfers through it are byte-exact both ways, and a corrupted MAC is detected and the
connection dropped."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

import asyncssh
import pytest
from asyncssh.crypto import cipher as _cipher
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.sshd import fastpath

GCM = "aes256-gcm@openssh.com"
ORIGINAL = (_cipher.GCMCipher.encrypt_and_sign, _cipher.GCMCipher.verify_and_decrypt)


@pytest.fixture(scope="module", autouse=True)
def applied() -> str:
    return fastpath.apply()


def test_the_fast_path_is_in_use_on_the_pinned_asyncssh(applied: str) -> None:
    assert asyncssh.__version__.rsplit(".", 1)[0] in fastpath.TESTED
    assert applied == fastpath.in_use() == fastpath.FAST
    assert _cipher.GCMCipher.encrypt_and_sign is not ORIGINAL[0]
    assert _cipher.GCMCipher.verify_and_decrypt is not ORIGINAL[1]


def test_the_self_test_catches_a_wrong_replacement() -> None:
    def wrong_seal(self: Any, header: bytes, data: bytes) -> tuple[bytes, bytes]:
        sealed, mac = ORIGINAL[0](self, header, data)
        return sealed, bytes(16)

    def accepts_anything(self: Any, header: bytes, data: bytes, mac: bytes) -> bytes | None:
        ORIGINAL[1](self, header, data, mac)
        return data

    gcm = _cipher.GCMCipher
    assert "sealed differently" in fastpath.self_test(gcm, ORIGINAL, (wrong_seal, ORIGINAL[1]))
    assert "corrupted tag was accepted" in fastpath.self_test(gcm, ORIGINAL, (ORIGINAL[0], accepts_anything))
    assert fastpath.self_test(gcm, ORIGINAL, (gcm.encrypt_and_sign, gcm.verify_and_decrypt)) == ""


def test_an_untested_asyncssh_keeps_its_own_code_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fastpath, "_path", None)
    monkeypatch.setattr(asyncssh, "__version__", "2.99.0")
    with caplog.at_level(logging.INFO, logger="mtgpu.sshd"):
        assert fastpath.apply() == fastpath.ASYNCSSH
    assert "asyncssh 2.99.0's own implementation is in use" in caplog.text
    assert "tested with asyncssh" in caplog.text


@settings(max_examples=60, deadline=None)
@given(
    key=st.binary(min_size=32, max_size=32),
    iv=st.binary(min_size=12, max_size=12),
    packets=st.lists(
        st.tuples(st.binary(min_size=4, max_size=4), st.binary(max_size=2048)), min_size=1, max_size=6
    ),
)
def test_it_seals_and_opens_asyncssh_own_bytes(
    key: bytes, iv: bytes, packets: list[tuple[bytes, bytes]]
) -> None:
    ours_tx, ours_rx = (_cipher.GCMCipher("aes256-gcm", key, iv) for _ in range(2))
    theirs = _cipher.GCMCipher("aes256-gcm", key, iv)
    for header, data in packets:
        sealed = ours_tx.encrypt_and_sign(header, data)
        assert sealed == ORIGINAL[0](theirs, header, data)
        assert ours_rx.verify_and_decrypt(header, sealed[0][4:], sealed[1]) == data
    assert ours_tx._iv == ours_rx._iv == theirs._iv  # the IV advances once per packet


class _Server(asyncssh.SSHServer):
    lost: asyncio.Future[Exception | None]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: this test is about the cipher


async def _echo(process: asyncssh.SSHServerProcess[bytes]) -> None:
    """Send back what arrives, then a digest of it, then 1 MiB of its own."""
    digest = hashlib.sha256()
    while chunk := await process.stdin.read(65536):
        digest.update(chunk)
        process.stdout.write(chunk)
    process.stdout.write(digest.digest() + hashlib.sha256(b"server").digest() * 32768)
    process.exit(0)


async def _serve(tmp: str) -> tuple[asyncssh.SSHAcceptor, _Server]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = _Server()
    server.lost = asyncio.get_running_loop().create_future()
    acceptor = await asyncssh.create_server(
        lambda: server,
        "127.0.0.1",
        0,
        server_host_keys=[key],
        process_factory=_echo,
        encoding=None,
        encryption_algs=[GCM],
    )
    return acceptor, server


def test_transfers_through_it_are_byte_exact_both_ways(tmp_path: Any) -> None:
    payload = os.urandom(3 << 20)

    async def go() -> tuple[bytes, str | None]:
        acceptor, _ = await _serve(str(tmp_path))
        port = acceptor.sockets[0].getsockname()[1]
        try:
            async with asyncssh.connect(
                "127.0.0.1", port, known_hosts=None, username="x", client_keys=None, encryption_algs=[GCM]
            ) as conn:
                r = await conn.run(input=payload, encoding=None, check=True)
                return r.stdout, conn.get_extra_info("send_cipher")
        finally:
            acceptor.close()

    out, cipher_name = asyncio.run(go())
    assert cipher_name == GCM
    assert out[: len(payload)] == payload
    assert out[len(payload) : len(payload) + 32] == hashlib.sha256(payload).digest()
    assert out[len(payload) + 32 :] == hashlib.sha256(b"server").digest() * 32768


def test_a_corrupted_mac_is_detected_and_the_connection_dropped(tmp_path: Any) -> None:
    async def go() -> tuple[Exception | None, BaseException | None]:
        acceptor, server = await _serve(str(tmp_path))
        port = acceptor.sockets[0].getsockname()[1]
        client_error: BaseException | None = None
        try:
            conn = await asyncssh.connect(
                "127.0.0.1", port, known_hosts=None, username="x", client_keys=None, encryption_algs=[GCM]
            )
            transport = conn._transport
            write = transport.write

            def corrupt(data: bytes) -> None:  # the last byte of a packet is its tag's
                write(data[:-1] + bytes([data[-1] ^ 0x01]))

            transport.write = corrupt  # type: ignore[method-assign]  # a man in the middle
            try:
                proc = await conn.create_process(encoding=None)
                proc.stdin.write(b"x" * 1000)
                await asyncio.wait_for(proc.wait(), 20)
            except (TimeoutError, asyncssh.Error, OSError) as exc:
                client_error = exc
            lost = await asyncio.wait_for(server.lost, 20)
            conn.abort()
            return lost, client_error
        finally:
            acceptor.close()

    lost, client_error = asyncio.run(go())
    assert isinstance(lost, asyncssh.MACError), lost
    assert client_error is not None
