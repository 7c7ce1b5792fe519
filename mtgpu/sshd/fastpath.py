"""Per-packet speed-ups for asyncssh's MACs and AES-GCM.

asyncssh builds a new ``hmac.HMAC`` object and a new ``AESGCM`` object for every
packet; at OpenSSH's 32 KiB packet size that object churn, not the cryptography,
dominates a bulk transfer. These replacements compute exactly the same bytes with
OpenSSL's one-shot HMAC (``hmac.digest``) and a cached ``AESGCM`` context. They are
applied once at start, only when asyncssh still has the methods they replace, and
every SSH test (all driven by the real OpenSSH client) checks their output.
"""

from __future__ import annotations

import hmac
import logging
import struct

log = logging.getLogger("mtgpu.sshd")

_applied = False


def apply() -> None:
    """Install the faster implementations into asyncssh (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    try:
        from asyncssh import mac as _mac
        from asyncssh.crypto import cipher as _cipher
    except ImportError:  # pragma: no cover - layout changed: keep asyncssh's own code
        return
    hmac_cls = getattr(_mac, "_HMAC", None)
    if hmac_cls is not None and hasattr(hmac_cls, "sign"):
        pack = struct.Struct(">I").pack
        digest = hmac.digest

        def sign(self, seq: int, packet: bytes) -> bytes:  # type: ignore[no-untyped-def]
            return digest(self._key, pack(seq) + packet, self._hash_alg)[:self._hash_size]

        hmac_cls.sign = sign
    gcm_cls = getattr(_cipher, "GCMCipher", None)
    aesgcm = getattr(_cipher, "AESGCM", None)
    if gcm_cls is not None and aesgcm is not None and hasattr(gcm_cls, "encrypt_and_sign"):
        size = getattr(_cipher, "_GCM_MAC_SIZE", 16)
        invalid_tag = getattr(_cipher, "InvalidTag", Exception)

        def _aead(self):  # type: ignore[no-untyped-def]
            ctx = self.__dict__.get("_mtgpu_aead")
            if ctx is None:
                ctx = self.__dict__["_mtgpu_aead"] = aesgcm(self._key)
            return ctx

        def encrypt_and_sign(self, header: bytes, data: bytes):  # type: ignore[no-untyped-def]
            out = _aead(self).encrypt(self._iv, data, header)
            self._update_iv()
            return header + out[:-size], out[-size:]

        def verify_and_decrypt(self, header: bytes, data: bytes, mac: bytes):  # type: ignore[no-untyped-def]
            try:
                out = _aead(self).decrypt(self._iv, data + mac, header)
            except invalid_tag:
                out = None
            self._update_iv()
            return out

        gcm_cls.encrypt_and_sign = encrypt_and_sign
        gcm_cls.verify_and_decrypt = verify_and_decrypt
