"""A per-packet speed-up for asyncssh's AES-GCM.

asyncssh builds a new ``AESGCM`` context for every packet; at OpenSSH's 32 KiB packet
size that costs about 15% of the cipher's throughput. The replacement computes
exactly the same bytes with one cached context per direction.

It replaces two methods of a private class (``asyncssh.crypto.cipher.GCMCipher``), so
it is applied only where it is known to be right:

- on the asyncssh releases in :data:`TESTED` (pyproject.toml pins the same range, and
  tests/sshd/test_fastpath.py checks the patch against the installed one: byte-exact
  transfers both ways, a corrupted MAC detected and the connection dropped);
- after a self-test at start: a few packets sealed and opened by both asyncssh's own
  methods and these must give the same bytes, and a corrupted tag must be refused.

Otherwise asyncssh's own code stays in place. Either way the daemon logs once which
path is in use, and why (:func:`apply` also returns it).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("mtgpu.sshd")

#: asyncssh releases (major.minor) whose GCMCipher this was checked against.
TESTED = ("2.24",)
#: The two paths :func:`apply` reports.
FAST, ASYNCSSH = "fast", "asyncssh"

_path: str | None = None


def in_use() -> str | None:
    """The path in use (:data:`FAST` or :data:`ASYNCSSH`), None before :func:`apply`."""
    return _path


def apply() -> str:
    """Install the faster implementations into asyncssh where that is known to be right
    (idempotent); log and return which path is in use."""
    global _path
    if _path is not None:
        return _path
    import asyncssh

    version = getattr(asyncssh, "__version__", "?")
    reason = _install(version)
    if reason:
        _path = ASYNCSSH
        log.warning("AES-GCM: asyncssh %s's own implementation is in use (%s)", version, reason)
    else:
        _path = FAST
        log.info("AES-GCM: the cached-context fast path is in use (asyncssh %s)", version)
    return _path


def _install(version: str) -> str:
    """Replace GCMCipher's methods; return why not, or "" once they are in place."""
    if ".".join(version.split(".")[:2]) not in TESTED:
        return f"the fast path was tested with asyncssh {', '.join(TESTED)} only"
    try:
        from asyncssh.crypto import cipher as _cipher
    except ImportError as exc:
        return f"asyncssh.crypto.cipher cannot be imported: {exc}"
    gcm_cls = getattr(_cipher, "GCMCipher", None)
    aesgcm = getattr(_cipher, "AESGCM", None)
    invalid_tag = getattr(_cipher, "InvalidTag", None)
    size = getattr(_cipher, "_GCM_MAC_SIZE", None)
    wanted = ("encrypt_and_sign", "verify_and_decrypt", "_update_iv")
    if (
        gcm_cls is None
        or aesgcm is None
        or invalid_tag is None
        or size != 16
        or not all(hasattr(gcm_cls, m) for m in wanted)
    ):
        return "asyncssh.crypto.cipher no longer has the GCMCipher it replaces"

    def _aead(self: Any) -> Any:
        ctx = self.__dict__.get("_mtgpu_aead")
        if ctx is None:
            ctx = self.__dict__["_mtgpu_aead"] = aesgcm(self._key)
        return ctx

    def encrypt_and_sign(self: Any, header: bytes, data: bytes) -> tuple[bytes, bytes]:
        out = _aead(self).encrypt(self._iv, data, header)
        self._update_iv()
        return header + out[:-size], out[-size:]

    def verify_and_decrypt(self: Any, header: bytes, data: bytes, mac: bytes) -> bytes | None:
        try:
            out: bytes | None = _aead(self).decrypt(self._iv, data + mac, header)
        except invalid_tag:
            out = None
        self._update_iv()
        return out

    original = (gcm_cls.encrypt_and_sign, gcm_cls.verify_and_decrypt)
    try:
        problem = self_test(gcm_cls, original, (encrypt_and_sign, verify_and_decrypt))
    except Exception as exc:  # noqa: BLE001 - any surprise keeps asyncssh's own code
        problem = f"the self-test failed: {type(exc).__name__}: {exc}"
    if problem:
        return problem
    gcm_cls.encrypt_and_sign = encrypt_and_sign
    gcm_cls.verify_and_decrypt = verify_and_decrypt
    return ""


def self_test(gcm_cls: Any, original: tuple[Any, Any], replacement: tuple[Any, Any]) -> str:
    """Seal and open a few packets with both implementations; "" if they agree and
    both refuse a corrupted tag, else what differed."""
    for cipher_name, key_size in (("aes128-gcm", 16), ("aes256-gcm", 32)):
        key, iv = os.urandom(key_size), os.urandom(12)
        theirs_tx, ours_tx = gcm_cls(cipher_name, key, iv), gcm_cls(cipher_name, key, iv)
        theirs_rx, ours_rx = gcm_cls(cipher_name, key, iv), gcm_cls(cipher_name, key, iv)
        for n in (0, 1, 16, 4096, 32768):
            header, data = os.urandom(4), os.urandom(n)
            sealed = original[0](theirs_tx, header, data)
            if replacement[0](ours_tx, header, data) != sealed:
                return f"{cipher_name}: a {n}-byte packet was sealed differently"
            body, mac = sealed[0][len(header) :], sealed[1]
            bad = bytes([mac[0] ^ 1]) + mac[1:]
            # A corrupted tag is refused by both, and both move on to the next IV.
            if (
                original[1](gcm_cls(cipher_name, key, theirs_rx._iv), header, body, bad) is not None
                or replacement[1](gcm_cls(cipher_name, key, ours_rx._iv), header, body, bad) is not None
            ):
                return f"{cipher_name}: a corrupted tag was accepted"
            if (
                replacement[1](ours_rx, header, body, mac) != data
                or original[1](theirs_rx, header, body, mac) != data
            ):
                return f"{cipher_name}: a {n}-byte packet was opened differently"
    return ""
