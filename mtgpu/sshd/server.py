"""The embedded SSH server: host keys, public-key authentication, rate limits.

:class:`MtgpuSSHServer` decides only who may log in. What each channel becomes is
the gateway's business. Keys are the only credential: password and
keyboard-interactive authentication are never offered.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR
from asyncssh.forward import SSHForwarder
from asyncssh.stream import SSHReader, SSHWriter

from mtgpu.accounts.names import check_username
from mtgpu.cluster.identity import peer_name
from mtgpu.config.options import max_startups
from mtgpu.errors import AccountError, MtgpuError
from mtgpu.gateway.session import Gateway, Principal, ungranted_message
from mtgpu.gateway.spawn import connect_as
from mtgpu.sshd import fastpath, interop, preauth
from mtgpu.sshd.hostcerts import HostCertificates
from mtgpu.sshd.limits import ConnectionLimits, Held, LimitReached, penalty_delay, should_drop

log = logging.getLogger("mtgpu.sshd")

HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256")
# Modern algorithms only; strict key exchange ("kex-strict") is on by default in asyncssh>=2.14.2.
KEX_ALGS = [
    "sntrup761x25519-sha512@openssh.com",
    "mlkem768x25519-sha256",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
]
# The client's order decides which cipher is used; this order only says what MTGPU
# does best (AES-GCM, with AES-NI and the fast path in fastpath.py). ChaCha20-Poly1305
# is OpenSSH's and Dropbear's first choice and the only modern AEAD some clients have.
CIPHERS = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
]
# UMAC (through libnettle, where installed) is OpenSSH's first choice and twice as fast
# as HMAC-SHA-256 here; asyncssh offers it only when libnettle is present.
MACS = [
    "umac-64-etm@openssh.com",
    "umac-128-etm@openssh.com",
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512-etm@openssh.com",
    "hmac-sha2-256",
    "hmac-sha2-512",
]
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
PEER_SUBSYSTEMS = ("mtgpu-peer", "mtgpu-raft", "mtgpu-image")
#: The server's keepalives to clients: every 15 s, a connection missing three is dropped.
KEEPALIVE_INTERVAL = 15
KEEPALIVE_COUNT_MAX = 3
CHANNEL_WINDOW = 8 << 20
CHANNEL_MAX_PKTSIZE = 256 << 10


def ensure_host_keys(state_dir: str) -> list[asyncssh.SSHKey]:
    """Load the host keys under ``state_dir``, generating any that are missing (0600)."""
    keys = []
    for alg in HOST_KEY_TYPES:
        short = alg.split("-")[1] if alg.startswith("ssh-") else "ecdsa"
        path = Path(state_dir) / f"ssh_host_{short}_key"
        if not path.exists():
            key = asyncssh.generate_private_key(alg)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(b"")
            tmp.chmod(0o600)
            tmp.write_bytes(key.export_private_key())
            tmp.rename(path)
            Path(str(path) + ".pub").write_bytes(key.export_public_key())
        path.chmod(0o600)
        keys.append(asyncssh.read_private_key(str(path)))
    return keys


def fingerprints(state_dir: str) -> list[str]:
    """``SHA256:...`` fingerprints of the host keys, as ``ssh-keygen -l`` prints them."""
    out = []
    for pub in sorted(Path(state_dir).glob("ssh_host_*_key.pub")):
        key = asyncssh.read_public_key(str(pub))
        out.append(f"{key.get_fingerprint('sha256')} ({key.get_algorithm()})")
    return out


class _TenantProcess(asyncssh.SSHServerProcess):
    """A session that also accepts the sftp and mtgpu-api subsystems.

    asyncssh serves ``sftp`` with its own in-process server; MTGPU instead runs
    OpenSSH's sftp-server as the tenant, so the request goes to the gateway like any
    other.
    """

    # Set by the gateway once the tenant's process runs: signals and window changes
    # then go straight to it instead of queueing in the channel's input stream.
    on_signal: Callable[[str], None] | None = None
    on_resize: Callable[[int, int, int, int], None] | None = None

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem in ("sftp", "mtgpu-api")

    def _no_process(self) -> bool:
        """True for a channel that has no process to signal or resize: the mtgpu-api
        subsystem is answered in the daemon, so a signal there has nothing to reach
        (queued in its input, it would break the request stream)."""
        chan = self._chan
        return chan is not None and chan.get_subsystem() == "mtgpu-api"

    def signal_received(self, signal: str) -> None:
        if self.on_signal is not None:
            self.on_signal(signal)
        elif not self._no_process():
            super().signal_received(signal)

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if any(not 0 <= n <= 65535 for n in (width, height, pixwidth, pixheight)):
            log.info("ignored a window change to %sx%s: past 65535", width, height)
            return  # that request only; the session goes on
        if self.on_resize is not None:
            self.on_resize(width, height, pixwidth, pixheight)
        elif not self._no_process():
            super().terminal_size_changed(width, height, pixwidth, pixheight)

    def break_received(self, msec: int) -> bool:
        return True

    def session_started(self) -> None:
        chan = self._chan
        if chan is not None and chan.get_subsystem() == "sftp":
            # asyncssh sets both before it starts a session.
            assert self._session_factory is not None and self._conn is not None
            stdin = SSHReader(self, chan)
            stdout = SSHWriter(self, chan)
            stderr = SSHWriter(self, chan, EXTENDED_DATA_STDERR)
            handler = self._session_factory(stdin, stdout, stderr)
            if asyncio.iscoroutine(handler):
                self._conn.create_task(handler, stdin.logger)
            return
        super().session_started()


class _PeerProcess(asyncssh.SSHServerProcess):
    """A session of another member: only the peer subsystems, never a shell."""

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem in PEER_SUBSYSTEMS

    def shell_requested(self) -> bool:
        return False

    def exec_requested(self, command: str) -> bool:
        return False


async def tenant_listener(conn: Any, sock: socket.socket, listen_host: str) -> Any:
    """An ``ssh -R`` listener on ``sock`` (bound in the tenant's namespace): each
    connection it accepts is forwarded back over ``conn``, as asyncssh's own
    ``forward_local_port`` does for a socket it binds itself."""
    from asyncssh.forward import SSHLocalPortForwarder
    from asyncssh.listener import SSHForwardListener

    port = sock.getsockname()[1]
    sock.setblocking(False)

    async def tunnel(session_factory: Any, orig_host: str, orig_port: int) -> Any:
        return await conn.create_connection(session_factory, listen_host, port, orig_host, orig_port)

    server = await asyncio.get_running_loop().create_server(
        lambda: SSHLocalPortForwarder(conn, tunnel), sock=sock
    )
    return SSHForwardListener(conn, [server], (listen_host, port), port)


def _counted_forward(method: Callable[..., Any]) -> Callable[..., Any]:
    """Count what a forwarding callback grants against SSH_MAX_FORWARDS_PER_USER."""
    listener = method.__name__ == "server_requested"

    @functools.wraps(method)
    def counted(self: MtgpuSSHServer, *args: Any) -> Any:
        who = self.principal.username if self.principal else "?"
        try:
            self.held.take("forward", who)
        except LimitReached as exc:
            if listener:  # a global request: refused with False, logged
                log.warning("refused a remote forward for %s: %s", who, exc)
                return False
            self._refuse("a forward", str(exc))
        try:
            result = method(self, *args)
        except BaseException:
            self.held.give("forward", who)
            raise
        return self._hold_forward(who, result, args, listener)

    return counted


class MtgpuSSHServer(asyncssh.SSHServer):
    """Authentication for one connection; the gateway serves its channels."""

    def __init__(
        self, daemon: Any, gateway: Gateway, counters: dict[str, int], limits: ConnectionLimits
    ) -> None:
        self.daemon = daemon
        self.gateway = gateway
        self.counters = counters
        self.limits = limits
        self.held = Held(limits)
        self._user = ""  # the user name the client last asked to log in as
        self._refusal = ""  # why this connection is refused, told at begin_auth
        self.conn: asyncssh.SSHServerConnection | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.local: tuple[str, int] = ("", 0)
        self.principal: Principal | None = None
        self._candidate: tuple[str, str, str] | None = None  # (user, kind, key)
        self._authed = False
        self._counted = False
        self._refused = 0
        self._why = ""  # why the daemon itself ended this connection before authentication

    # ----------------------------------------------------------- lifecycle

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        sock = conn.get_extra_info("sockname") or ("", 0)
        self.peer = (str(peer[0]), int(peer[1]))
        self.local = (str(sock[0]), int(sock[1]))
        opts = self.daemon.options
        preauth.follow_log_level(opts.log_level)  # a reload's LOG_LEVEL holds from here on
        try:
            self.held.take("source", self.peer[0])
        except LimitReached as exc:
            self._why = f"refused: {exc}"
            try:
                # Told at the first authentication request: a disconnect before the
                # key exchange reads as a garbled banner. Only a few are kept for it.
                self.held.take("refusing", self.peer[0])
                self._refusal = str(exc)
            except LimitReached:
                conn.abort()
            return
        addr = self.peer[0]
        try:
            # As OpenSSH's PerSourceMaxStartups: one address cannot hold the slots of
            # everyone's key exchanges (idle connections that never send a banner).
            self.held.take("startup", addr)
        except LimitReached:
            self._why = (
                f"refused: {self.limits.counts['startup'][addr]} unauthenticated connections from "
                f"{addr} (SSH_MAX_STARTUPS_PER_SOURCE is {self.limits.limit('startup')})"
            )
            conn.abort()
            return
        start, rate, full = max_startups(opts.ssh_max_startups)
        have = self.counters["unauthenticated"]
        if should_drop(have, start, rate, full, lambda: secrets.randbelow(100)):
            self.held.give("startup", addr)
            self._why = (
                f"refused: {have} unauthenticated connections (SSH_MAX_STARTUPS is {start}:{rate}:{full})"
            )
            conn.abort()
            return
        self.counters["unauthenticated"] += 1
        self._counted = True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._authed:
            version = self.conn.get_extra_info("client_version") if self.conn is not None else None
            exc = interop.kex_failure(self.conn) or exc
            why = preauth.reason(exc, self._why, self._user, self._refused)
            preauth.ended(self.peer, version, why, preauth.is_problem(exc, self._why))
        if self._counted and not self._authed:
            self.counters["unauthenticated"] -= 1
            if self._user:  # a connection that never named a user is no failed login
                self.daemon.penalties.failed(self.peer[0], self._user)
        self._counted = False
        self.held.release_all()
        if self.principal is not None:
            self.limits.ended(self.principal.username, self)

    def auth_completed(self) -> None:
        self._authed = True
        if self._counted:
            self.counters["unauthenticated"] -= 1
            self.held.give("startup", self.peer[0])
        assert self._candidate is not None
        user, kind, key = self._candidate
        if kind != "invitee":  # any key gets that far: its wrong codes count until one is right
            self.daemon.penalties.succeeded(self.peer[0], user)
        self.principal = Principal(user, kind, key, self.peer, self.local)
        if kind != "peer":
            try:
                self.held.take("user", user)
            except LimitReached as exc:
                log.warning("refusing %s from %s: %s", user, self.peer[0], exc)
                if self.conn is not None:
                    self.conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, str(exc))
                return
            self.limits.started(user, self)
        log.info(
            "accepted %s for %s (%s) from %s",
            key.split()[0] if key else "certificate",
            user,
            kind,
            self.peer[0],
        )
        retention = getattr(self.daemon, "retention", None)
        if kind == "locked" and self.conn is not None:
            # The key was proven: tell the tenant why, instead of a bare "Permission denied".
            text = retention.locked_message(user) if retention is not None else None
            self.conn.disconnect(
                asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                text or "this account is locked; ask an administrator",
            )
        elif kind == "tenant" and retention is not None:
            retention.connected(user)  # any connection is activity (ssh -N -L too)

    # ---------------------------------------------------------------- auth

    def begin_auth(self, username: str) -> bool:
        if self._refusal and self.conn is not None:
            self.conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, self._refusal)
            return True
        self._user = username
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_ca_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """A member of this cluster, proving its name with a certificate from the user CA."""
        ident = getattr(self.daemon, "identity", None)
        name = peer_name(username)
        if name is None or ident is None:
            return False
        if not ident.is_user_ca(key):
            log.warning(
                "refused member %r from %s: its certificate is not signed by this "
                "cluster's CA (another CLUSTER_ID or CLUSTER_KEY)",
                name,
                self.peer[0],
            )
            self._refused += 1
            return False
        self._candidate = (username, "peer", "")
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """Accept ``key`` for ``username``; asyncssh then verifies its signature.

        Called once to query a key and again with the signature, so the key recorded
        at the last acceptance is the one that proved possession.
        """
        try:
            kind = await self._kind_for(username, key)
        except Exception:  # noqa: BLE001 - a failed lookup is a refusal, never a crash
            log.exception("checking the key of %r", username)
            kind = None
        if kind == "invitee" and self.daemon.penalties.penalized(self.peer[0], username):
            kind = None  # an invite code is what a penalty guards: no guesses while it lasts
        if kind is None:
            self._candidate = None
            self._refused += 1
            await self._penalty_pause(username)
            if self._refused >= self.daemon.options.ssh_max_auth_tries and self.conn is not None:
                # Like OpenSSH's MaxAuthTries: too many refused keys end the connection.
                self._why = (
                    f"too many authentication failures: {self._refused} keys refused for "
                    f"{username[:64]!r} (SSH_MAX_AUTH_TRIES)"
                )
                self.conn.disconnect(
                    asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, "Too many authentication failures"
                )
            return False
        self._candidate = (username, kind, key.export_public_key("openssh").decode().strip())
        return True

    async def _penalty_pause(self, username: str) -> None:
        """While ``username`` from this address is penalised (PerSourcePenalties), a
        refused key is answered late, and the client is told why once. A key
        registered for the user never comes here: a penalty never keeps it out."""
        left = self.daemon.penalties.penalized(self.peer[0], username)
        if not left or self.conn is None:
            return
        why = (
            f"too many failed logins as {username[:64]} from {self.peer[0]}: for "
            f"{max(1, round(left))}s more only keys registered for {username[:64]} log in from here, "
            "others are refused slowly (SSH_PENALTY_FAILURES, SSH_PENALTY_SECONDS)"
        )
        if not self._why:
            self._why = f"penalised: {why}"
            try:
                self.conn.send_auth_banner(why + "\r\n")
            except OSError:  # authentication ended meanwhile
                pass
        opts = self.daemon.options
        await asyncio.sleep(penalty_delay(opts.ssh_login_grace_time, opts.ssh_max_auth_tries))

    async def _kind_for(self, username: str, key: asyncssh.SSHKey) -> str | None:
        if peer_name(username) is not None:
            log.warning(
                "refused %r from %s: a member must present its cluster certificate", username, self.peer[0]
            )
            return None
        try:
            check_username(username)
        except AccountError as exc:
            log.info("refusing login as %r from %s: %s", username, self.peer[0], exc)
            return None
        line = key.export_public_key("openssh").decode()
        registered, kind = self._registry_kind(username, line)
        if kind is None:
            # Nothing here lets this key in: this replica may not have applied a user, key,
            # invite or unlock just acknowledged on another member. Catch up with
            # the scheduler's log first, then look again (a refusal is final to the user).
            catch_up = getattr(self.daemon, "catch_up", None)
            if catch_up is not None and await catch_up():
                registered, kind = self._registry_kind(username, line)
        if kind is not None or registered:
            return kind
        if await self.daemon.local_key_allowed(username, line):
            return "local"
        return None

    def _registry_kind(self, username: str, line: str) -> tuple[bool, str | None]:
        """(whether ``username`` is in the user registry, what ``line`` makes it there)."""
        registry = self.daemon.registry
        max_failures = self.daemon.options.invite_max_failures
        user = registry.get(username)
        if user is not None:
            if user.get("locked"):
                log.info(
                    "refusing login as %r from %s: the account is locked for inactivity "
                    "(TENANT_RETENTION_DAYS); an admin can run `mtgpu-admin retention "
                    "--unlock %s`",
                    username,
                    self.peer[0],
                    username,
                )
                # Its own key proves who connects; auth_completed then disconnects with
                # the reason. Any other key is refused as usual.
                return True, ("locked" if registry.has_key(username, line) else None)
            if registry.has_key(username, line):
                return True, "tenant"
            if registry.pending_invite(username, time.time(), line, max_failures):
                return True, "invitee"
            return True, None
        if registry.pending_invite(username, time.time(), line, max_failures):
            return False, "invitee"
        return False, None

    # ---------------------------------------------------------- forwarding

    def _uid(self) -> int | None:
        p = self.principal
        if p is None or p.kind in ("invitee", "locked"):
            return None
        if p.kind == "tenant":
            u = self.daemon.registry.get(p.username)
            if u is None or not self.daemon.registry.granted(p.username, self.daemon.options.cluster_name):
                return None  # not granted this cluster: no forwarding either
            return u["uid"]
        acct = self.daemon.accounts.existing(p.username)
        return acct.uid if acct else None

    def _no_uid_reason(self) -> str:
        p = self.principal
        if p is not None and p.kind == "tenant":
            return ungranted_message(self.daemon, p.username)
        return "forwarding needs a registered key"

    def _refuse(self, what: str, why: str) -> NoReturn:
        who = self.principal.username if self.principal else "?"
        log.warning("refused %s for %s from %s: %s", what, who, self.peer[0], why)
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, why)

    @_counted_forward
    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        """``ssh -L`` and ``ssh -D``: loopback destinations only."""
        if self._uid() is None:
            self._refuse(f"forwarding to {dest_host[:60]}:{dest_port}", self._no_uid_reason())
        if not 0 < dest_port <= 65535:
            self._refuse(
                f"forwarding to port {dest_port}",
                f"port {dest_port} does not exist; ports run from 1 to 65535",
            )
        if dest_host.lower().rstrip(".") not in LOOPBACK_NAMES:
            self._refuse(
                f"forwarding to {dest_host}:{dest_port}",
                f"forwarding to {dest_host} is not allowed; only 127.0.0.1, ::1 and "
                "localhost on this host can be reached",
            )
        uid, principal = self._uid(), self.principal
        assert uid is not None and principal is not None
        who = principal.username

        async def connect() -> Any:
            # The tenant's own process makes the connection: the service it reaches (and
            # the kernel's owner checks) see the tenant, never root.
            try:
                account = await self._account(principal, uid)
                fence = await self._tenant_fence(account)
                sock = await connect_as(account, dest_host, dest_port, fence=fence)
            except OSError as exc:
                log.info("forwarding to %s:%d for %s: %s", dest_host, dest_port, who, exc)
                raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(exc)) from None
            _, peer = await asyncio.get_running_loop().create_connection(SSHForwarder, sock=sock)
            return SSHForwarder(peer)

        return connect()  # type: ignore[return-value]

    async def _tenant_fence(self, account: Any) -> list[str]:
        """What starts a forward's helper in the tenant's fence (session cgroup, mount
        and network namespaces), as sessions start; OSError when a part cannot be set
        up: the forward is refused, never made outside the fence."""
        try:
            return await self.gateway.fence_argv(account)
        except MtgpuError as exc:  # FenceError: the cause is in the log already
            raise OSError(str(exc)) from exc

    async def _tenant_netns(self, uid: int) -> str | None:
        """The tenant's private network namespace (TENANT_NETWORK), which its forwards
        connect and listen in; None when tenants share the host's network. OSError
        when it is private and cannot be made: the forward is refused, never made in
        the host's network."""
        fence = getattr(self.daemon, "fence", None)
        if fence is None or os.geteuid() != 0 or uid == 0:
            return None
        try:
            return await asyncio.to_thread(fence.net_namespace, uid)
        except MtgpuError as exc:  # FenceError: the cause is in the log already
            raise OSError(str(exc)) from exc

    async def _account(self, principal: Principal, uid: int) -> Any:
        """The OS account of the caller (made here if it is a tenant's first visit)."""
        accounts = self.daemon.accounts
        try:
            if principal.kind == "tenant":
                acct = await asyncio.to_thread(accounts.ensure, principal.username, uid)
            else:
                acct = accounts.existing(principal.username)
        except MtgpuError as exc:
            raise OSError(str(exc)) from exc
        if acct is None or acct.uid != uid:
            raise OSError(f"the account {principal.username!r} is not there with UID {uid}")
        return acct

    @_counted_forward
    def server_requested(self, listen_host: str, listen_port: int) -> Any:
        """``ssh -R``: listen on loopback only, on ports 1024 and up."""
        if self._uid() is None or self.conn is None:
            return False
        host = listen_host.lower()
        if listen_port > 65535:
            log.info("refused remote forward of port %d: ports run to 65535", listen_port)
            return False
        if listen_port and listen_port < 1024:
            log.warning(
                "refused remote forward of port %d for %s: privileged port",
                listen_port,
                self.principal.username if self.principal else "?",
            )
            return False
        if host not in ("", "localhost", "127.0.0.1", "::1"):
            log.warning(
                "refused remote forward on %s for %s: loopback only",
                listen_host,
                self.principal.username if self.principal else "?",
            )
            return False
        bind = "::1" if host == "::1" else "127.0.0.1"
        uid, principal, conn = self._uid(), self.principal, self.conn
        assert uid is not None and principal is not None

        async def listen() -> Any:
            try:
                netns = await self._tenant_netns(uid)
            except OSError as exc:
                log.info("remote forward of %s:%d for %s: %s", bind, listen_port, principal.username, exc)
                self.held.give("forward", principal.username)
                return False
            if netns is None:
                return await conn.forward_local_port(bind, listen_port, listen_host, listen_port)
            # The tenant's own process binds the port in the tenant's namespace: only the
            # tenant's processes reach it, and it holds only ports the tenant may hold.
            try:
                account = await self._account(principal, uid)
                fence = await self._tenant_fence(account)
                sock = await connect_as(account, bind, listen_port, fence=fence, listen=True)
            except OSError as exc:
                log.info("remote forward of %s:%d for %s: %s", bind, listen_port, principal.username, exc)
                self.held.give("forward", principal.username)
                return False
            return await tenant_listener(conn, sock, listen_host)

        return listen()

    @_counted_forward
    def unix_connection_requested(self, dest_path: str) -> Any:
        """``ssh -L port:/path``: only to sockets the tenant owns.

        The socket is opened without following a final symlink and checked by its
        inode, then reached through ``/proc/self/fd``, so swapping the path between
        the check and the connect cannot redirect the daemon (root) elsewhere.
        """
        uid = self._uid()
        if uid is None or self.conn is None:
            self._refuse(f"forwarding to {dest_path}", self._no_uid_reason())
        # One answer for a path that is missing, unreachable or not the tenant's: the
        # daemon (root) resolves it, and must not tell whether something exists in a
        # directory the tenant cannot read.
        if "\0" in dest_path or len(dest_path) > 4096:
            self._refuse(
                "forwarding to a socket path",
                "the socket path contains a NUL byte or is over 4096 characters",
            )
        not_yours = (
            f"{dest_path} is not a socket you own (or does not exist); only your own sockets can be reached"
        )
        try:
            fd = os.open(dest_path, os.O_PATH | os.O_NOFOLLOW)
        except OSError as exc:
            log.info(
                "forwarding to %s for %s: %s",
                dest_path,
                self.principal.username if self.principal else "?",
                exc.strerror,
            )
            self._refuse(f"forwarding to {dest_path}", not_yours)
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != uid:
            os.close(fd)
            self._refuse(f"forwarding to {dest_path}", not_yours)
        conn = self.conn

        async def connect() -> Any:
            try:
                return await conn.forward_unix_connection(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)

        return connect()

    def unix_server_requested(self, listen_path: str) -> bool:
        log.warning(
            "refused a remote Unix socket forward for %s", self.principal.username if self.principal else "?"
        )
        return False

    # ------------------------------------------------------------ sessions

    def session_requested(self) -> Any:
        if self.principal is None or self.conn is None or self.principal.kind == "locked":
            return False
        principal = self.principal
        chan = self.conn.create_server_channel(None, "strict", CHANNEL_WINDOW, CHANNEL_MAX_PKTSIZE)
        process: asyncssh.SSHServerProcess[Any]
        if principal.kind == "peer":
            name = peer_name(principal.username) or ""
            process = _PeerProcess(lambda p: self.daemon.peer_session(p, name), None, 0, False)
        else:
            try:
                self.held.take("session", principal.username)
            except LimitReached as exc:
                self._refuse("a session", str(exc))
            process = _TenantProcess(lambda p: self.gateway.run(p, principal), None, 0, False)
            self.held.release_on_close("session", principal.username, process)
        return chan, process

    def _hold_forward(self, who: str, result: Any, args: tuple[Any, ...], listener: bool) -> Any:
        """``result`` of a forwarding callback, holding one SSH_MAX_FORWARDS_PER_USER
        count until its channel closes (a listener: until the connection ends)."""
        if not result:
            self.held.give("forward", who)
            return result
        if listener:
            return result
        if result is True and self.conn is not None:
            result = self.conn.forward_connection(args[0], args[1])
        if isinstance(result, tuple):
            chan, session = result
            return chan, self.held.release_on_close("forward", who, session)
        if inspect.isawaitable(result):
            pending = result

            async def opened() -> Any:
                try:
                    session = await pending
                except BaseException:
                    self.held.give("forward", who)
                    raise
                return self.held.release_on_close("forward", who, session)

            return opened()
        return self.held.release_on_close("forward", who, result)


async def start_ssh_server(daemon: Any, gateway: Gateway) -> asyncssh.SSHAcceptor:
    """Listen on ``SSH_LISTEN``; raise MtgpuError if the address cannot be used."""
    fastpath.apply()
    interop.apply()
    opts = daemon.options
    preauth.follow_log_level(opts.log_level)
    host, port = opts.ssh_listen
    keys: list[Any] = list(ensure_host_keys(opts.state_dir))
    ident = getattr(daemon, "identity", None)
    certs: HostCertificates | None = None
    if ident is not None:
        # Each member signs its own host key with the cluster's host CA at start, and
        # again well before that expires (daemon.host_certs.run, a task of the daemon's).
        certs = HostCertificates(ident, keys, lambda: host_principals(opts.server_name, opts.ssh_listen[0]))
        keys = list(certs.pairs)
    counters = {"unauthenticated": 0}
    limits = ConnectionLimits(lambda: daemon.options, opts.server_name)
    daemon.ssh_limits = limits
    try:
        acceptor = await asyncssh.create_server(
            lambda: MtgpuSSHServer(daemon, gateway, counters, limits),
            host if host != "0.0.0.0" else "",
            port,
            server_host_keys=keys,
            encoding=None,
            line_editor=False,
            allow_scp=False,
            x11_forwarding=False,
            agent_forwarding=opts.allow_agent_forwarding,
            login_timeout=opts.ssh_login_grace_time,
            kex_algs=_available(KEX_ALGS, asyncssh.kex.get_kex_algs()),
            encryption_algs=_available(CIPHERS, asyncssh.encryption.get_encryption_algs()),
            mac_algs=_available(MACS, asyncssh.mac.get_mac_algs()),
            compression_algs=["none"],
            reuse_address=True,
            window=CHANNEL_WINDOW,
            max_pktsize=CHANNEL_MAX_PKTSIZE,
            # A connection that stops answering is closed after 45 s (was 2 min), so
            # its tmux client detaches; a login before that asks (terminal.dead).
            keepalive_interval=KEEPALIVE_INTERVAL,
            keepalive_count_max=KEEPALIVE_COUNT_MAX,
            server_version="MTGPU",
        )
    except OSError as exc:
        raise MtgpuError(
            f"cannot listen on {host}:{port} (SSH_LISTEN): {exc.strerror}. "
            "Another program may hold the port; choose another with SSH_LISTEN "
            "or stop that program"
        ) from exc
    if certs is not None:
        certs.attach(acceptor)  # renewed certificates go to this listener, which stays
        daemon.host_certs = certs
    return acceptor


def host_principals(server_name: str, listen_host: str) -> list[str]:
    """Names and addresses a member answers to, for its host certificate."""
    import socket

    import psutil

    names = [server_name, socket.gethostname(), socket.getfqdn(), "localhost"]
    if listen_host not in ("0.0.0.0", "::", ""):
        names.append(listen_host)
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                names.append(a.address.split("%")[0])
    seen: list[str] = []
    for n in names:
        if n and n not in seen:
            seen.append(n)
    return seen


def _available(wanted: list[str], supported: list[bytes]) -> list[str]:
    have = {s.decode() for s in supported}
    return [w for w in wanted if w in have]
