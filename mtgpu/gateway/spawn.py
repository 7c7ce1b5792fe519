"""Start a process as a tenant and pump bytes between it and an SSH channel.

A tenant process gets the tenant's real uid, gid and supplementary groups, a new
session, a clean environment and the home as its working directory. The pumps are
small asyncio protocols that write straight into the channel and pause the pipe
while the channel's window is full, so large transfers neither buffer without
bound nor lose the tail: the exit status is sent only after stdout and stderr
have reached end of file.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import socket
import struct
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncssh

from mtgpu.accounts.provision import Account
from mtgpu.fsafe import Pinned
from mtgpu.proc import aspawn

log = logging.getLogger("mtgpu.gateway")

# Pause reading a pipe while this much is queued for the channel.
_HIGH_WATER = 4 << 20
_READ_CHUNK = 1 << 18


_F_SETPIPE_SZ = 1031
_PIPE_SIZE = 1 << 20


def big_pipe() -> tuple[int, int]:
    """A pipe with a 1 MiB buffer (Linux allows this unprivileged up to pipe-max-size).

    With the default 64 KiB, a chatty writer such as sftp-server fills the pipe in a
    few responses and both sides pay a system call per small chunk.
    """
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass
    return r, w


@dataclass
class Spawned:
    """A tenant's process, pinned by a pidfd from its start (see :func:`signal_child`)."""

    proc: asyncio.subprocess.Process
    master_fd: int | None = None  # the pty master, for pty sessions
    pinned: Pinned | None = None

    def __post_init__(self) -> None:
        if self.pinned is None:
            # Opened before the loop gets a chance to reap the child (the daemon reaps
            # through pidfds in its event loop, see use_pidfd_reaping), so the pidfd is
            # this child's.
            try:
                self.pinned = Pinned.of_child(self.proc.pid)
            except OSError:
                self.pinned = Pinned(self.proc.pid)  # already gone: signals do nothing

    def close(self) -> None:
        if self.pinned is not None:
            self.pinned.close()


def use_pidfd_reaping() -> None:
    """Reap asyncio's children in the event loop through pidfds (Python 3.12 does by
    default), not in a thread: then a child not yet seen to exit is not reaped, and its
    PID (its process group's ID) cannot have been reused."""
    import sys
    import warnings

    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())


async def spawn_as(
    account: Account,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    cwd: str | None = None,
    fence: Sequence[str] = (),
) -> asyncio.subprocess.Process:
    """Start ``argv`` as ``account`` in a new session with exactly ``env``.

    ``fence`` (from :meth:`mtgpu.schedd.fence.TenantFence.prefix`) is started as root
    in front of ``argv``: it places the process in the tenant's session cgroup and
    private namespace and becomes the tenant itself before it execs ``argv``.
    """
    as_root = os.geteuid() == 0
    kwargs: dict = {}
    if as_root and account.uid != 0 and fence:
        argv = [*fence, *argv]
    elif as_root and account.uid != 0:
        kwargs = dict(user=account.uid, group=account.gid, extra_groups=list(account.groups))
    workdir = cwd or account.home
    if not os.path.isdir(workdir):
        workdir = "/"
    return await aspawn(
        argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=dict(env),
        cwd=workdir,
        start_new_session=True,
        umask=0o022,
        close_fds=True,
        **kwargs,
    )


class _ToChannel(asyncio.Protocol):
    """Copy one pipe into one stream of an SSH channel, with flow control."""

    def __init__(
        self, chan: asyncssh.SSHServerChannel, datatype: int | None, done: asyncio.Future[None]
    ) -> None:
        self.chan = chan
        self.datatype = datatype
        self.done = done
        self.transport: asyncio.ReadTransport | None = None
        self._waiting = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.chan.write(data, self.datatype)
        except (asyncssh.Error, BrokenPipeError, OSError):
            self.transport.close()  # type: ignore[union-attr]
            return
        if not self._waiting and self.chan.get_write_buffer_size() > _HIGH_WATER:
            self._waiting = True
            self.transport.pause_reading()  # type: ignore[union-attr]
            asyncio.get_running_loop().create_task(self._wait_window())

    async def _wait_window(self) -> None:
        # The channel drains as the peer opens its window; poll at a fine grain.
        while not self.chan.is_closing() and self.chan.get_write_buffer_size() > _HIGH_WATER // 2:
            await asyncio.sleep(0.001)
        self._waiting = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def pipe_to_channel(
    fd: int, chan: asyncssh.SSHServerChannel, datatype: int | None
) -> asyncio.Future[None]:
    """Start copying ``fd`` into ``chan``; the returned future resolves at EOF."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: _ToChannel(chan, datatype, done), pipe)
    return done


async def channel_to_fd(process: asyncssh.SSHServerProcess, fd: int, *, close_at_eof: bool = True) -> None:
    """Copy the channel's stdin into ``fd`` until EOF."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    reader = process.stdin
    try:
        while True:
            try:
                data = await reader.read(_READ_CHUNK)
            except (asyncssh.SignalReceived, asyncssh.TerminalSizeChanged, asyncssh.BreakReceived):
                continue  # delivered through the session's hooks instead
            except (asyncssh.Error, ConnectionError):
                break
            if not data:
                break
            view = memoryview(data)
            while view:
                try:
                    n = os.write(fd, view)
                    view = view[n:]
                except BlockingIOError:
                    await _writable(loop, fd)
                except (BrokenPipeError, OSError):
                    return
    finally:
        if close_at_eof:
            try:
                os.close(fd)
            except OSError:
                pass


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_writer(fd, ready)
    try:
        await fut
    finally:
        loop.remove_writer(fd)


def signal_child(child: Spawned, name: str) -> None:
    """Send the signal a client named (``INT``, ``TERM``...) to the child's process group.

    Only through the pidfd held since the start: once the child has been reaped, the
    request does nothing, whoever holds its PID now. While the pidfd still reaches the
    child (running, or a zombie not yet reaped), its PID is pinned, so is its group's
    ID (the child leads its group), and the group is signalled.
    """
    signum = getattr(signal, "SIG" + name.upper(), None)
    if not isinstance(signum, int) or child.pinned is None or child.proc.returncode is not None:
        return
    if not child.pinned.signal(0):
        return  # reaped: its PID may be another process's now
    try:
        os.killpg(child.proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        child.pinned.signal(signum)


def set_winsize(fd: int, cols: int, rows: int, xpix: int = 0, ypix: int = 0) -> None:
    """Set a pty's window size, as a terminal resize does; a size the kernel's 16-bit
    fields cannot hold is ignored (that request fails, the session goes on)."""
    if any(not 0 <= n <= 65535 for n in (cols, rows, xpix, ypix)):
        return
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, xpix, ypix))
    except OSError:
        pass


def exit_status(process: asyncssh.SSHServerProcess, returncode: int) -> None:
    """Report ``returncode`` (negative for a signal) to the client and close."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name[3:]
        except ValueError:
            name = "KILL"
        process.exit_with_signal(name)
    else:
        process.exit(returncode)


# Run as the tenant: connect, hand the connected socket back over the socketpair.
_CONNECT = (
    "import socket, sys\n"
    "mode, host, port, back = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])\n"
    "try:\n"
    "    if mode == 'listen':\n"
    "        fam = socket.AF_INET6 if ':' in host else socket.AF_INET\n"
    "        c = socket.socket(fam, socket.SOCK_STREAM)\n"
    "        c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "        c.bind((host, port))\n"
    "        c.listen(128)\n"
    "    else:\n"
    "        c = socket.create_connection((host, port), timeout=10)\n"
    "except OSError as exc:\n"
    "    sys.exit(f'{host}:{port}: {exc.strerror or exc}')\n"
    "socket.send_fds(socket.socket(fileno=back), [b'k'], [c.fileno()])\n"
)


async def connect_as(
    account: Account,
    host: str,
    port: int,
    timeout: float = 15,
    *,
    fence: Sequence[str] = (),
    listen: bool = False,
) -> socket.socket:
    """A TCP connection to ``host:port`` made by a process of ``account`` (its uid, gid
    and groups), handed back to the daemon: the connection is the tenant's, as the
    kernel sees it (its owner in ``/proc/net/tcp``, ``iptables -m owner``), not root's.

    ``fence`` (from :meth:`mtgpu.schedd.fence.TenantFence.prefix`, as for sessions)
    starts the helper as root in the tenant's session cgroup, private mount namespace
    and network namespace (``TENANT_NETWORK: private``: ``127.0.0.1`` is the tenant's
    own loopback), where it becomes the tenant: a tenant who attaches to it (same UID)
    finds nothing a session of theirs lacks. With ``listen`` the socket is a listening
    one bound at ``host:port`` instead (``ssh -R``).

    Raises ``OSError`` with the reason if it cannot connect.
    """
    import sys

    ours, theirs = socket.socketpair()
    try:
        kwargs: dict = {}
        prefix: list[str] = []
        if os.geteuid() == 0 and account.uid != 0:
            if fence:
                prefix = list(fence)
            else:  # a daemon without a fence: its sessions run so too
                kwargs = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
        proc = await aspawn(
            [
                *prefix,
                sys.executable,
                "-I",
                "-c",
                _CONNECT,
                "listen" if listen else "connect",
                host,
                str(port),
                str(theirs.fileno()),
            ],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(theirs.fileno(),),
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True,
            **kwargs,
        )
        theirs.close()
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise OSError(f"{host}:{port}: no answer within {timeout:.0f}s") from None
        ours.setblocking(False)
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except (BlockingIOError, OSError):
            fds = []
        if not fds:
            lines = err.decode(errors="replace").strip().splitlines()
            raise OSError(lines[-1] if lines else f"{host}:{port}: the connection failed")
        return socket.socket(fileno=fds[0])
    finally:
        theirs.close()
        ours.close()
