"""Frames of the ``mtgpu-raft`` channel: a ``<I`` length, then the payload.

Three kinds of payload travel in the same framing:

* **Keepalives** are empty frames (four zero bytes). Either side sends one when it has
  sent nothing for a while, so that the other side can tell a silent peer from a
  stopped one.
* **Handshake** frames are small JSON objects (see :func:`hello`). They are JSON, not
  pickle, so that nothing arriving on a channel is unpickled before the peer's
  identity has been checked against its certificate.
* **Raft messages** are PySyncObj's own pickle (``pysyncobj.pickle``), exactly as its
  TCP transport sends them, once the handshake is over.
"""

from __future__ import annotations

import json
import struct
import time
from typing import Any, Protocol

from mtgpu.errors import MtgpuError

PROTO = "mtgpu-raft/1"
HEADER = struct.Struct("<I")
PING = HEADER.pack(0)


class FrameError(MtgpuError):
    """The peer sent something that is not a valid frame or handshake."""


class ByteReader(Protocol):
    """What :class:`FrameReader` needs from a stream (asyncssh or asyncio reader)."""

    async def read(self, n: int = -1) -> bytes: ...


def frame(payload: bytes) -> bytes:
    """One frame carrying ``payload``."""
    return HEADER.pack(len(payload)) + payload


def _control(**fields: Any) -> bytes:
    return frame(json.dumps({"proto": PROTO, **fields}, separators=(",", ":")).encode())


def hello(node_id: str, readonly: bool) -> bytes:
    """The dialer's first frame: who it claims to be, and whether it only reads."""
    return _control(hello=node_id, readonly=bool(readonly))


def welcome(node_id: str) -> bytes:
    """The acceptor's answer to a hello it accepts."""
    return _control(welcome=node_id)


def refused(reason: str) -> bytes:
    """The acceptor's answer to a hello it refuses; the channel closes after it."""
    return _control(refused=reason)


def ready() -> bytes:
    """The dialer's answer to a welcome: both directions have now carried a frame."""
    return _control(ready=True)


def parse_control(payload: bytes) -> dict[str, Any]:
    """Decode a handshake frame, refusing anything that is not one of ours."""
    try:
        msg = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"not a handshake frame: {exc}") from None
    if not isinstance(msg, dict) or msg.get("proto") != PROTO:
        raise FrameError(f"not a {PROTO} handshake frame")
    return msg


class FrameReader:
    """Splits a byte stream into frames, reading large chunks at a time.

    A chunk of the stream usually holds many frames; they are sliced out of one
    buffer, which is compacted only when more bytes are read, so a burst of small
    Raft messages costs one ``read`` and no per-frame buffer shuffling.
    """

    def __init__(self, reader: ByteReader, max_frame: int, chunk: int = 1 << 18) -> None:
        self._reader = reader
        self._max = max_frame
        self._chunk = chunk
        self._buf = bytearray()
        self._pos = 0
        #: ``time.monotonic()`` of the last bytes received: the dead-peer check reads it.
        self.last_rx = time.monotonic()

    async def next(self) -> bytes | None:
        """The next frame's payload (``b""`` for a keepalive), or None at end of stream.

        Raises :class:`FrameError` for a frame longer than ``max_frame``: a peer that
        speaks another protocol, or a corrupted stream.
        """
        while True:
            buf, pos = self._buf, self._pos
            if len(buf) - pos >= 4:
                (n,) = HEADER.unpack_from(buf, pos)
                if n > self._max:
                    raise FrameError(f"frame of {n} bytes exceeds the limit of {self._max}")
                end = pos + 4 + n
                if len(buf) >= end:
                    self._pos = end
                    return bytes(buf[pos + 4 : end])
            data = await self._reader.read(self._chunk)
            if not data:
                return None
            if pos:
                del buf[:pos]
                self._pos = 0
            buf += data
            self.last_rx = time.monotonic()

    async def next_control(self) -> dict[str, Any] | None:
        """The next handshake frame, skipping keepalives; None at end of stream."""
        while True:
            payload = await self.next()
            if payload is None:
                return None
            if payload:
                return parse_control(payload)
