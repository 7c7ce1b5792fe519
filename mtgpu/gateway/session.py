"""The forced-command shell: carry out what :func:`route` decided for one channel.

Every branch runs as the tenant. The daemon only routes bytes; the kernel enforces
file ownership because the processes really are the tenant's.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import struct
import sys
import termios
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR

from mtgpu.accounts.provision import Account, AccountProvisioner
from mtgpu.accounts.registry import Registry, hash_code
from mtgpu.api.dispatcher import Caller, Dispatcher
from mtgpu.api.unix import serve_lines
from mtgpu.config import Options
from mtgpu.errors import MtgpuError
from mtgpu.fsafe import give_socket
from mtgpu.gateway.liveness import connection_probe
from mtgpu.gateway.route import MAX_TERMINAL_SIZE, Kind, route, session_refusal
from mtgpu.gateway.spawn import (
    Spawned,
    big_pipe,
    channel_to_fd,
    exit_status,
    pipe_to_channel,
    set_winsize,
    signal_child,
    spawn_as,
)
from mtgpu.tmux import runtime as tmux_runtime
from mtgpu.tmux import terminal_argv

log = logging.getLogger("mtgpu.gateway")

#: Client variables a session takes, besides LC_* (OpenSSH's AcceptEnv).
ACCEPT_ENV = ("LANG", "COLORTERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION")
SFTP_SERVER_PATHS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
)


@dataclass
class Principal:
    """Who authenticated on a connection, as established by the SSH server."""

    username: str
    kind: str  # "tenant" (registry), "local" (existing OS account) or "invitee"
    # A tenant not granted this cluster authenticates, so that every channel can be
    # refused with the reason (a refused key would only say "Permission denied").
    key: str  # the authenticated public key, OpenSSH format
    peer: tuple[str, int] = ("", 0)
    local: tuple[str, int] = ("", 0)
    env: dict[str, str] = field(default_factory=dict)
    agent_socket: str | None = None


class Host(Protocol):
    """What the gateway needs from the daemon."""

    options: Options
    registry: Registry
    dispatcher: Dispatcher
    tools_dir: str

    @property
    def accounts(self) -> AccountProvisioner: ...  # read-only: any provisioner will do

    async def replicate(self, method: Any, *args: Any) -> Any: ...

    def caller_for(self, account: Account, via: str) -> Caller: ...


def tenant_env(
    account: Account, host: Host, principal: Principal, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The clean environment of a tenant session."""
    env = {
        "HOME": account.home,
        "USER": account.name,
        "LOGNAME": account.name,
        "SHELL": account.shell,
        "PATH": f"{host.tools_dir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "MTGPU_CONFIG": host.options.source or "/etc/mtgpu/mtgpu.yaml",
        "MTGPU_API_SOCKET": host.options.api_socket,
        "SSH_CONNECTION": f"{principal.peer[0]} {principal.peer[1]} "
        f"{principal.local[0]} {principal.local[1]}",
        "SSH_CLIENT": f"{principal.peer[0]} {principal.peer[1]} {principal.local[1]}",
    }
    # Like OpenSSH's AcceptEnv LANG LC_* COLORTERM TERM_PROGRAM*: nothing else from the
    # client is believed (bounded, as sshd's environment requests are).
    for k, v in principal.env.items():
        if (k in ACCEPT_ENV or k.startswith("LC_")) and len(k) <= 64 and len(v) <= 256 and "\0" not in v:
            env[k] = v
    if principal.agent_socket:
        env["SSH_AUTH_SOCK"] = principal.agent_socket
    env.update(container_store_env(host, account.uid, account.gid))
    env.update(tmux_runtime.session_env(host.options.run_dir, account.uid, account.gid))
    if extra:
        env.update(extra)
    return env


def container_store_env(host: Any, uid: int, gid: int) -> dict[str, str]:
    """``CONTAINERS_STORAGE_CONF`` when tenants' container stores are on this member's
    disk (their directory made first), else nothing: the store is in the home."""
    stores = getattr(host, "container_stores", None)
    if stores is None:
        return {}
    try:
        stores.ensure(uid, gid)
    except OSError as exc:
        log.warning("UID %d: the container store under %s cannot be made: %s", uid, stores.root, exc)
    return stores.env()


def ungranted_message(host: Host, name: str) -> str:
    """What a user who is not granted this cluster is told at login."""
    cluster = host.options.cluster_name
    return (
        f"{name} is not granted the cluster {cluster!r}, so cannot log in to "
        f"{host.options.server_name} or see its queue. Ask an admin of the cluster to run "
        f"`mtcode-admin grant {name} {cluster}`"
    )


class Gateway:
    def __init__(self, host: Host) -> None:
        self.host = host

    async def run(self, process: asyncssh.SSHServerProcess, principal: Principal) -> None:
        """Serve one session channel to its end."""
        try:
            await self._run(process, principal)
        except MtgpuError as exc:
            _fail(process, str(exc))
        except (asyncssh.Error, ConnectionError, BrokenPipeError):
            pass
        except Exception:  # noqa: BLE001 - one broken session must not take down the daemon
            log.exception("session of %s failed", principal.username)
            _fail(process, "internal error in the MTGPU gateway; the admin can see the log")

    async def _run(self, process: asyncssh.SSHServerProcess, principal: Principal) -> None:
        # Checked for every channel, so a grant revoked after the login holds at once.
        if principal.kind == "tenant" and not self.host.registry.granted(
            principal.username, self.host.options.cluster_name
        ):
            _fail(process, ungranted_message(self.host, principal.username))
            return
        env = dict(process.env or {})
        refusal = session_refusal(
            command=process.command, env=env, term_type=process.term_type, term_size=process.term_size
        )
        if refusal is not None:
            log.info("refused a session of %s: %s", principal.username, refusal)
            _fail(process, refusal)
            return
        principal.env = {str(k): str(v) for k, v in env.items()}
        r = route(
            invitee=principal.kind == "invitee",
            command=process.command,
            subsystem=process.subsystem,
            pty=process.term_type is not None,
        )
        if r.kind is Kind.REFUSE:
            _fail(process, r.detail)
            return
        if r.kind is Kind.JOIN:
            await self._join(process, principal, r.command or "")
            return
        if r.kind is Kind.JOIN_PROMPT:
            await self._join_prompt(process, principal)
            return
        account = await self.account_for(principal)
        if process.channel.is_closing():
            # The client closed the channel while the account was looked up: asyncssh
            # has dropped the channel's connection state, and there is nothing to serve.
            return
        principal.agent_socket = _agent_socket(process, account)
        if r.kind is Kind.API:
            await self._api(process, account)
            return
        if r.kind is Kind.SFTP:
            sftp = next((p for p in SFTP_SERVER_PATHS if os.path.exists(p)), None)
            if sftp is None:
                _fail(process, "sftp is not available: install openssh-sftp-server on this host")
                return
            await self.pipe_session(process, account, [sftp], tenant_env(account, self.host, principal))
            return
        notice = self._login_notice(account) if r.command is None else None
        if notice:
            # Like a motd: for logins only, never in the output of a command.
            _write_stderr(process, f"mtgpu: warning: {notice}\r\n")
        if r.kind in (Kind.TERMINAL, Kind.EXEC_PTY):
            # A terminal is the tenant's tmux, run with this daemon's (world-readable)
            # interpreter; a command with -t runs in the pty directly, as OpenSSH does.
            argv = terminal_argv(sys.executable) if r.command is None else [account.shell, "-c", r.command]
            extra = {"TERM": process.term_type or "xterm"}
            if r.command is None:
                # Python would set LC_CTYPE=C.UTF-8 for a C or POSIX client (PEP 538) and
                # so change the tenant's tmux client; mt-attach drops this variable again.
                extra["PYTHONCOERCECLOCALE"] = "0"
            if notice:
                extra["MTGPU_LOGIN_NOTICE"] = notice  # shown again in tmux's status line
            env = tenant_env(account, self.host, principal, extra)
            await self.pty_session(process, account, argv, env)
            return
        argv = [account.shell] if r.command is None else [account.shell, "-c", r.command]
        await self.pipe_session(process, account, argv, tenant_env(account, self.host, principal))

    async def account_for(self, principal: Principal) -> Account:
        """The OS account of an authenticated principal, created on first login."""
        if principal.kind == "local":
            acct = self.host.accounts.existing(principal.username)
            if acct is None:
                raise MtgpuError(f"the local account {principal.username!r} has gone")
            return acct
        user = self.host.registry.get(principal.username)
        if user is None:
            raise MtgpuError(f"{principal.username!r} is no longer an MTGPU user")
        acct = await asyncio.to_thread(self.host.accounts.ensure, principal.username, user["uid"])
        asyncio.get_running_loop().create_task(self._record_login(principal.username))
        return acct

    def _login_notice(self, account: Account) -> str | None:
        """A warning for the tenant at login, such as being over USER_DISK_LIMIT."""
        quotas = getattr(self.host, "quotas", None)
        retention = getattr(self.host, "retention", None)
        notes = [
            quotas.notice(account.name) if quotas is not None else None,
            retention.warning(account.name) if retention is not None else None,
        ]
        return "; ".join(n for n in notes if n) or None

    async def _record_login(self, name: str) -> None:
        try:
            clock = getattr(self.host, "clock", None)
            now = clock.now() if clock is not None else time.time()
            await self.host.replicate(self.host.registry.record_login, name, now)
        except MtgpuError:
            log.warning("could not record the login of %s", name)

    # ------------------------------------------------------------ sessions

    async def fence_argv(self, account: Account) -> list[str]:
        """What starts a tenant program in the tenant's session cgroup and private
        namespace (see :mod:`mtgpu.schedd.fence`); empty without a fence."""
        fence = getattr(self.host, "fence", None)
        if fence is None or account.uid == 0 or os.geteuid() != 0:
            return []
        workdir = account.home if os.path.isdir(account.home) else "/"
        return await asyncio.to_thread(fence.prefix, account.uid, account.gid, list(account.groups), workdir)

    async def pipe_session(
        self, process: asyncssh.SSHServerProcess, account: Account, argv: list[str], env: dict[str, str]
    ) -> None:
        """Run ``argv`` as the tenant with stdin, stdout and stderr as plain pipes."""
        fence = await self.fence_argv(account)
        in_r, in_w = big_pipe()
        out_r, out_w = big_pipe()
        err_r, err_w = os.pipe()
        try:
            proc = await spawn_as(account, argv, env, stdin=in_r, stdout=out_w, stderr=err_w, fence=fence)
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        chan = process.channel
        child = Spawned(proc)
        _hook_signals(process, child)
        out_done = await pipe_to_channel(out_r, chan, None)
        err_done = await pipe_to_channel(err_r, chan, EXTENDED_DATA_STDERR)
        feeder = asyncio.get_running_loop().create_task(channel_to_fd(process, in_w))
        rc = await proc.wait()
        child.close()
        # The exit status goes out only after every byte of output.
        await asyncio.gather(out_done, err_done)
        feeder.cancel()
        _send_eof(chan)
        exit_status(process, rc)

    async def pty_session(
        self, process: asyncssh.SSHServerProcess, account: Account, argv: list[str], env: dict[str, str]
    ) -> None:
        """Run ``argv`` as the tenant on a new pty that is its controlling terminal."""
        live = getattr(self.host, "terminals", None)
        if live is not None:
            # The login will ask which of the tenant's terminals still answer: ask
            # their connections now, while its program starts, so that a frozen
            # one has had its whole deadline by then.
            live.prime(account.uid)
        fence = await self.fence_argv(account)
        master, slave = os.openpty()
        tty, probe = os.ttyname(slave), connection_probe(process.channel)
        width, height, pw, ph = process.term_size
        if width and height:
            set_winsize(master, width, height, pw, ph)
        setsid = shutil.which("setsid") or "/usr/bin/setsid"
        try:
            # setsid -c makes the pty the controlling terminal without a preexec_fn,
            # which is unsafe in a threaded daemon.
            proc = await spawn_as(
                account,
                [setsid, "-c", "-w", *argv],
                env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                fence=fence,
            )
        finally:
            os.close(slave)
        child = Spawned(proc, master_fd=master)
        if live is not None:  # so a later login can tell whether this one still answers
            live.add(tty, account.uid, probe)
        _hook_signals(process, child)
        loop = asyncio.get_running_loop()
        out_done = await pipe_to_channel(os.dup(master), process.channel, None)
        feeder = loop.create_task(channel_to_fd(process, master, close_at_eof=False))
        waiter = loop.create_task(proc.wait())
        closed = loop.create_task(process.channel.wait_closed())
        await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            # The client went away: hang up the terminal as a dropped line does. The
            # tmux client exits on SIGHUP and the tmux session lives on, detached.
            # The output pump still holds a copy of the master, so closing this one
            # alone hangs nothing up until the program writes again (and the pump,
            # finding the channel closed, lets go): make it redraw now.
            _hang_up(master)
            _close(master)
            master = -1
        rc = await waiter
        child.close()
        closed.cancel()
        try:
            await asyncio.wait_for(out_done, 2)
        except TimeoutError:
            pass
        feeder.cancel()
        _close(master)
        if live is not None:
            live.remove(tty, probe)
        if not process.channel.is_closing():
            exit_status(process, rc)

    # ------------------------------------------------------------- the API

    async def _api(self, process: asyncssh.SSHServerProcess, account: Account) -> None:
        """The mtgpu-api subsystem: JSON lines, answered in process, no subprocess."""
        await serve_lines(
            process.stdin, _ExitOnClose(process), self.host.dispatcher, self.host.caller_for(account, "ssh")
        )

    # ------------------------------------------------------------- invites

    async def _join(self, process: asyncssh.SSHServerProcess, principal: Principal, code: str) -> None:
        ok, message = await self.redeem(principal, code)
        stream = process.stdout if ok else process.stderr
        stream.write((message + "\n").encode())
        process.exit(0 if ok else 1)

    async def _join_prompt(self, process: asyncssh.SSHServerProcess, principal: Principal) -> None:
        out = process.stdout
        out.write(
            f"Welcome to MTGPU, {principal.username}. This key is not registered yet.\r\n"
            "Enter the invite code an admin gave you.\r\n".encode()
        )
        for _ in range(self.host.options.invite_max_failures):
            out.write(b"Invite code: ")
            code = await _read_line(process)
            if code is None:
                break
            ok, message = await self.redeem(principal, code)
            out.write(message.replace("\n", "\r\n").encode() + b"\r\n")
            if ok or "ask an admin" in message:
                process.exit(0 if ok else 1)
                return
        process.exit(1)

    async def redeem(self, principal: Principal, code: str) -> tuple[bool, str]:
        """Bind the connection's (already verified) key if ``code`` is right."""
        host = self.host
        skip = await asyncio.to_thread(host.accounts.local_uids)
        result = await host.replicate(
            host.registry.redeem_invite,
            principal.username,
            hash_code(code),
            principal.key,
            time.time(),
            skip,
            host.options.invite_max_failures,
            host.options.tenant_uid_range,
            host.options.cluster_name,
        )
        if "error" in result:
            log.warning(
                "invite for %s refused from %s: %s", principal.username, principal.peer[0], result["code"]
            )
            penalties = getattr(host, "penalties", None)
            if penalties is not None:  # a guessed code counts as a failed login
                penalties.failed(principal.peer[0], principal.username)
            return False, result["error"]
        principal.kind = "tenant"
        acct = await self.account_for(principal)
        port = host.options.ssh_listen[1]
        return True, (
            f"Your key is now registered for {acct.name} (UID {acct.uid}).\n"
            f"Log in with: ssh -p {port} {acct.name}@{host.options.server_name}"
        )


class _ExitOnClose:
    """The mtgpu-api channel's answer stream. When the client has closed its end and
    every answer is written, the channel ends with exit status 0, as a command that
    finished well does (``ssh -s mtgpu-api`` exits 0, not 255 for "no status")."""

    def __init__(self, process: asyncssh.SSHServerProcess) -> None:
        self._process = process

    def write(self, data: bytes) -> None:
        self._process.stdout.write(data)

    async def drain(self) -> None:
        await self._process.stdout.drain()

    def close(self) -> None:
        if not self._process.channel.is_closing():
            self._process.exit(0)


def _fail(process: asyncssh.SSHServerProcess, message: str) -> None:
    try:
        process.stderr.write(f"mtgpu: {message}\n".encode())
        process.exit(1)
    except (asyncssh.Error, OSError):
        pass


def _write_stderr(process: asyncssh.SSHServerProcess, text: str) -> None:
    try:
        process.stderr.write(text.encode())
    except (asyncssh.Error, OSError):
        pass


def _hook_signals(process: asyncssh.SSHServerProcess, child: Spawned) -> None:
    """Deliver the client's signals and window changes to the child directly."""

    def on_signal(name: str) -> None:
        signal_child(child, name)

    def on_resize(cols: int, rows: int, xpix: int, ypix: int) -> None:
        if any(not 0 <= n <= MAX_TERMINAL_SIZE for n in (cols, rows, xpix, ypix)):
            log.info("ignored a window change to %sx%s: out of range", cols, rows)
            return  # that request fails; the session goes on
        if child.master_fd is not None and child.master_fd >= 0:
            set_winsize(child.master_fd, cols, rows, xpix, ypix)

    process.on_signal = on_signal  # type: ignore[attr-defined]
    process.on_resize = on_resize  # type: ignore[attr-defined]


def _agent_socket(process: asyncssh.SSHServerProcess, account: Account) -> str | None:
    """The forwarded agent's socket, handed to the tenant (ALLOW_AGENT_FORWARDING)."""
    chan = process.channel
    if chan.is_closing():
        return None  # a closed channel has no connection to ask (its state is gone)
    path = chan.get_agent_path()
    if not path:
        return None
    # asyncssh made the socket in a private directory as root. The socket becomes the
    # tenant's; the directory stays root's (0711), so the tenant can never swap the
    # socket for a link that a later channel of this connection would hand out.
    try:
        give_socket(path, account.uid, account.gid)
    except OSError as exc:
        log.warning("agent forwarding for %s not offered: %s", account.name, exc)
        return None
    return path


def _hang_up(master: int) -> None:
    """Make the program on the pty write (a size change: SIGWINCH), so the output pump
    sees the closed channel, closes its copy of the master, and the kernel hangs up
    the terminal (SIGHUP) as a dropped line does. No process ID is signalled."""
    try:
        rows, cols, xpix, ypix = struct.unpack("HHHH", fcntl.ioctl(master, termios.TIOCGWINSZ, b"\0" * 8))
        set_winsize(master, max(1, cols - 1) if cols > 1 else cols + 1, rows, xpix, ypix)
    except OSError:
        pass


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _send_eof(chan: asyncssh.SSHServerChannel) -> None:
    try:
        chan.write_eof()
    except (asyncssh.Error, OSError):
        pass


async def _read_line(process: asyncssh.SSHServerProcess) -> str | None:
    """Read a line typed on the client's terminal, echoing it (no line editor here)."""
    buf = bytearray()
    while True:
        try:
            data = await process.stdin.read(64)
        except asyncssh.Error:
            return None
        if not data:
            return None
        for b in data:
            if b in (13, 10):
                process.stdout.write(b"\r\n")
                return buf.decode(errors="replace").strip()
            if b in (127, 8):
                if buf:
                    buf.pop()
                    process.stdout.write(b"\b \b")
            elif b == 3:  # Ctrl-C
                return None
            elif b >= 32 and len(buf) < 200:
                buf.append(b)
                process.stdout.write(bytes([b]))
