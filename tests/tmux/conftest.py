"""Real tenants and real terminals for the tmux tests.

``tenant`` creates throwaway OS accounts with ``useradd`` (so it needs root) and
removes them, their tmux servers and their processes afterwards. ``Terminal``
plays the gateway: a fresh pty that is the controlling terminal of a program run
as the tenant in a new session (``setsid -c``, exactly as the gateway does),
with the gateway's clean environment.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pwd
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from mtgpu.proc import run
from mtgpu.tmux.runtime import session_env

ROOT = str(Path(__file__).resolve().parents[2])
# The interpreter tenants run: it must not live under /root (mode 0700).
PYTHON = sys.executable
_counter = itertools.count()


def wait_until(
    check: Callable[[], object], timeout: float = 10, what: str | Callable[[], str] = "condition"
) -> object:
    """Poll ``check`` until it returns something truthy (``what`` may be computed late)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


@dataclass
class Tenant:
    name: str
    uid: int
    gid: int
    home: str
    run_dir: str = ""  # the daemon's RUN_DIR stand-in; its tmux/ holds the sockets

    @property
    def socket(self) -> str:
        return os.path.join(self.run_dir, "tmux", f"tmux-{self.uid}", "mtgpu")

    def env(self, **extra: str | None) -> dict[str, str]:
        """The gateway's clean environment (plus where this checkout lives)."""
        env = {
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
            "SHELL": "/bin/bash",
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "SSH_CONNECTION": "127.0.0.1 40000 127.0.0.1 2222",
            "SSH_CLIENT": "127.0.0.1 40000 2222",
            "PYTHONPATH": ROOT,
        }
        if self.run_dir:
            env.update(session_env(self.run_dir, self.uid, self.gid))
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}

    def run(
        self, argv: Sequence[str], check: bool = True, **extra_env: str
    ) -> subprocess.CompletedProcess[str]:
        return run(
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[self.gid],
            env=self.env(**extra_env),
            cwd=self.home,
            check=check,
            timeout=30,
        )

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(["tmux", "-u", "-S", self.socket, *args], check=check)

    def sessions(self) -> dict[str, int]:
        """Session name -> number of attached clients."""
        p = self.tmux("list-sessions", "-F", "#{session_name} #{session_attached}", check=False)
        if p.returncode != 0:
            return {}
        return {n: int(a) for n, a in (line.rsplit(" ", 1) for line in p.stdout.splitlines())}

    def capture(self, target: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", f"={target}:").stdout

    @staticmethod
    def until(
        check: Callable[[], object], what: str | Callable[[], str] = "condition", timeout: float = 10
    ) -> object:
        return wait_until(check, timeout, what)

    def python(self, code: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run([PYTHON, "-P", "-c", code, *args], check=check)


@pytest.fixture
def tenant() -> Iterator[Callable[[], Tenant]]:
    """A factory of real, unprivileged OS accounts, removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create accounts")
    for tool in ("tmux", "useradd", "userdel", "setsid"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    base = tempfile.mkdtemp(prefix="mtgpu-tmux-")
    os.chmod(base, 0o755)
    run_dir = os.path.join(base, "run")  # root's, as the daemon's RUN_DIR is
    os.mkdir(run_dir, 0o755)
    made: list[Tenant] = []

    def make() -> Tenant:
        name = f"mtt{os.getpid() % 100000}x{next(_counter)}"
        home = os.path.join(base, name)
        run(
            [
                "useradd",
                "-m",
                "-d",
                home,
                "-s",
                "/bin/bash",
                "-K",
                "SUB_UID_COUNT=0",
                "-K",
                "SUB_GID_COUNT=0",
                "-c",
                "MTGPU tmux test",
                name,
            ]
        )
        pw = pwd.getpwnam(name)
        t = Tenant(name, pw.pw_uid, pw.pw_gid, home, run_dir)
        made.append(t)
        return t

    yield make
    for t in made:
        _remove(t)
    shutil.rmtree(base, ignore_errors=True)


def _remove(t: Tenant) -> None:
    t.tmux("kill-server", check=False)

    # What the test started as this tenant (tmux server, shells, sleeps) ends by pid.
    def leftovers() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["uids"]):
            try:
                if p.info["uids"] and p.info["uids"].real == t.uid:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    try:
        wait_until(lambda: not leftovers(), timeout=5, what="the tenant's processes to end")
    except AssertionError:
        for p in leftovers():
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers(), timeout=5)
    run(["userdel", "-r", t.name], check=False)
    shutil.rmtree(f"/tmp/tmux-{t.uid}", ignore_errors=True)


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """One SSH terminal, as the gateway makes it: a pty and a program as the tenant."""

    def __init__(
        self,
        tenant: Tenant,
        argv: Sequence[str],
        cols: int = 100,
        rows: int = 30,
        env: dict[str, str | None] | None = None,
    ) -> None:
        self.tenant = tenant
        self.master, slave = os.openpty()
        set_winsize(self.master, cols, rows)
        self.proc = subprocess.Popen(
            ["setsid", "-c", "-w", *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            user=tenant.uid,
            group=tenant.gid,
            extra_groups=[tenant.gid],
            env=tenant.env(**(env or {})),
            cwd=tenant.home,
            start_new_session=True,
            close_fds=True,
        )
        os.close(slave)
        self._out = bytearray()
        self._stop = threading.Event()
        # Drain the pty all along, as the gateway's pump does, so the client never stalls.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if not data:
                    return
                self._out += data

    @property
    def output(self) -> str:
        return self._out.decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 10) -> None:
        wait_until(
            lambda: text in self.output, timeout, lambda: f"{text!r} on the terminal; got {self.output!r}"
        )

    def send(self, data: str) -> None:
        os.write(self.master, data.encode())

    def resize(self, cols: int, rows: int) -> None:
        # The kernel sends SIGWINCH to the pty's foreground process group.
        set_winsize(self.master, cols, rows)

    def client_pid(self) -> int:
        """The process setsid started: the attach program, then the tmux client it became."""

        def child() -> int | None:
            kids = psutil.Process(self.proc.pid).children()
            return kids[0].pid if kids else None

        return int(wait_until(child, what="setsid's child"))  # type: ignore[arg-type]

    def hang_up(self) -> None:
        """Drop the connection: close the master, as the gateway does when SSH goes away."""
        self._stop.set()
        self._reader.join()
        os.close(self.master)
        self.master = -1
        self.proc.wait(10)

    def kill_tree(self) -> None:
        """SIGKILL every process group this terminal started: wrapper, attach, client."""
        groups = {os.getpgid(self.proc.pid), os.getpgid(self.client_pid())}
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)

    def close(self) -> None:
        if self.master >= 0:
            self._stop.set()
            self._reader.join()
            os.close(self.master)
            self.master = -1
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture
def terminals(tenant: Callable[[], Tenant]) -> Iterator[Callable[..., Terminal]]:
    """Open terminals with ``terminals(tenant, argv)``; all are closed at the end.

    It depends on ``tenant`` so that terminals close before their accounts go.
    """
    opened: list[Terminal] = []

    def open_(tenant: Tenant, argv: Sequence[str], **kw: Any) -> Terminal:
        t = Terminal(tenant, argv, **kw)
        opened.append(t)
        return t

    yield open_
    for t in opened:
        t.close()
