"""Helpers of the attack, fuzz and fault tests: speaking raw API lines as a tenant."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_euid_lock = threading.Lock()


@dataclass(frozen=True)
class Tenant:
    name: str
    uid: int
    key: Path
    home: Path


def api_socket(run_dir: Path, uid: int, gid: int | None = None) -> socket.socket:
    """A connection to ``RUN_DIR/api.sock`` made with effective UID ``uid``: the kernel
    records the connecting credentials, so SO_PEERCRED names ``uid`` for its life."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    with _euid_lock:
        os.setegid(uid if gid is None else gid)
        os.seteuid(uid)
        try:
            s.connect(str(run_dir / "api.sock"))
        finally:
            os.seteuid(0)
            os.setegid(0)
    return s


def call(sock: socket.socket, op: str, args: dict[str, Any] | None = None, **extra: Any) -> dict:
    """One request, its answer (``extra`` adds top-level fields, such as forged ones)."""
    f = sock.makefile("rwb")
    f.write(json.dumps({"op": op, "args": args or {}, **extra}).encode() + b"\n")
    f.flush()
    line = f.readline()
    assert line, "the daemon closed the connection without an answer"
    return json.loads(line)


def lines(sock: socket.socket, requests: list[object]) -> list[dict]:
    """Send each request as one line (bytes as they are) and read one answer per request."""
    f = sock.makefile("rwb")
    for r in requests:
        f.write((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n")
    f.flush()
    return [json.loads(f.readline()) for _ in requests]
