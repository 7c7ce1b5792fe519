"""Helpers of the attack, fuzz and fault tests: speaking raw API lines as a tenant."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
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


@dataclass
class Witness:
    """Another tenant logging in with OpenSSH (``ssh NAME echo alive``), one login after
    another, for as long as a hostile load runs: ``with Witness(host, tenant) as w:``.
    Each login must complete within ``bound`` seconds, a liveness bound (the daemon
    still serves), not a speed claim; the figures are printed for the closing report.
    The client is started under the lock that :func:`api_socket` holds while it
    switches the test's effective UID, so the client never inherits another's."""

    host: Any
    tenant: Tenant
    bound: float = 60
    label: str = "the attack"
    took: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        argv = self.host.ssh_argv(self.tenant.name, self.tenant.key, "echo", "alive")
        while not self._stop.is_set() or not self.took + self.failed:
            t0 = time.monotonic()
            with _euid_lock:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
            try:
                out, err = proc.communicate(timeout=self.bound)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                self.failed.append(f"no answer within {self.bound} s")
                continue
            if proc.returncode != 0 or out.strip() != b"alive":
                self.failed.append(f"rc {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}")
            else:
                self.took.append(time.monotonic() - t0)

    def __enter__(self) -> Witness:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.bound + 30)
        if exc[0] is not None:
            return
        ordered = sorted(self.took)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")
        print(
            f"witness: {len(self.took)} logins of {self.tenant.name} during {self.label}, "
            f"the slowest {max(ordered, default=float('nan')):.2f} s, p99 {p99:.2f} s"
        )
        assert not self.failed, self.failed
        assert ordered, "no witness login completed"
        from figures import highest, tally

        tally("witness_logins", len(ordered))
        highest("witness_login_slowest_ms", round(ordered[-1] * 1000))


#: A listener in the tenant's namespace that never accepts, its queue filled by its own
#: clients: a connection to it waits (SYN retries) until the helper's timeout.
STUCK_LISTENER = r"""
import socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(0)
held = []
for _ in range(4):
    c = socket.socket()
    c.setblocking(False)
    c.connect_ex(("127.0.0.1", int(sys.argv[1])))
    held.append(c)
print("stuck", flush=True)
time.sleep(int(sys.argv[2]))
"""


def procs_of(uid: int) -> dict[int, str]:
    """Every process whose real, effective, saved or file UID is ``uid``: pid -> command line."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        if str(uid) in uids:
            found[int(d.name)] = cmd
    return found
