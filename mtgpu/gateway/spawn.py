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
import struct
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncssh

from mtgpu.accounts.provision import Account

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
    proc: asyncio.subprocess.Process
    master_fd: int | None = None  # the pty master, for pty sessions


async def spawn_as(account: Account, argv: Sequence[str], env: Mapping[str, str], *,
                   stdin: int, stdout: int, stderr: int, cwd: str | None = None) -> asyncio.subprocess.Process:
    """Start ``argv`` as ``account`` in a new session with exactly ``env``."""
    as_root = os.geteuid() == 0
    kwargs: dict = {}
    if as_root and account.uid != 0:
        kwargs = dict(user=account.uid, group=account.gid, extra_groups=list(account.groups))
    workdir = cwd or account.home
    if not os.path.isdir(workdir):
        workdir = "/"
    return await asyncio.create_subprocess_exec(
        *argv, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env), cwd=workdir,
        start_new_session=True, umask=0o022, close_fds=True, **kwargs)


class _ToChannel(asyncio.Protocol):
    """Copy one pipe into one stream of an SSH channel, with flow control."""

    def __init__(self, chan: asyncssh.SSHServerChannel, datatype: int | None,
                 done: asyncio.Future[None]) -> None:
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
        while (not self.chan.is_closing()
               and self.chan.get_write_buffer_size() > _HIGH_WATER // 2):
            await asyncio.sleep(0.001)
        self._waiting = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def pipe_to_channel(fd: int, chan: asyncssh.SSHServerChannel,
                          datatype: int | None) -> asyncio.Future[None]:
    """Start copying ``fd`` into ``chan``; the returned future resolves at EOF."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: _ToChannel(chan, datatype, done), pipe)
    return done


async def channel_to_fd(process: asyncssh.SSHServerProcess, fd: int,
                        *, close_at_eof: bool = True) -> None:
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
    """Send the signal a client named (``INT``, ``TERM``...) to the child's session."""
    signum = getattr(signal, "SIG" + name.upper(), None)
    if signum is None:
        return
    try:
        os.killpg(child.proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def set_winsize(fd: int, cols: int, rows: int, xpix: int = 0, ypix: int = 0) -> None:
    """Set a pty's window size, as a terminal resize does."""
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
