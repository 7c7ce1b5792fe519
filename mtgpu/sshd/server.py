"""The embedded SSH server: host keys, public-key authentication, rate limits.

:class:`MtgpuSSHServer` decides only who may log in. What each channel becomes is
the gateway's business. Keys are the only credential: password and
keyboard-interactive authentication are never offered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR
from asyncssh.stream import SSHReader, SSHWriter

from mtgpu.accounts.names import check_username
from mtgpu.cluster.identity import peer_name
from mtgpu.errors import AccountError, MtgpuError
from mtgpu.gateway.session import Gateway, Principal, ungranted_message
from mtgpu.sshd import fastpath

log = logging.getLogger("mtgpu.sshd")

HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256")
# Modern algorithms only; strict key exchange ("kex-strict") is on by default in asyncssh>=2.14.2.
KEX_ALGS = ["sntrup761x25519-sha512@openssh.com", "mlkem768x25519-sha256",
            "curve25519-sha256", "curve25519-sha256@libssh.org",
            "ecdh-sha2-nistp256", "ecdh-sha2-nistp384"]
# No chacha20-poly1305: asyncssh runs it about 3x slower than AES with AES-NI, and
# every current client (OpenSSH, PuTTY, VS Code) speaks AES-GCM and AES-CTR.
CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr"]
# UMAC (through libnettle, where installed) is OpenSSH's first choice and twice as fast
# as HMAC-SHA-256 here; asyncssh offers it only when libnettle is present.
MACS = ["umac-64-etm@openssh.com", "umac-128-etm@openssh.com", "hmac-sha2-256-etm@openssh.com",
        "hmac-sha2-512-etm@openssh.com", "hmac-sha2-256", "hmac-sha2-512"]
LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
PEER_SUBSYSTEMS = ("mtgpu-peer", "mtgpu-raft", "mtgpu-image")
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


class Penalties:
    """Refuse a source address for a while after repeated failures (PerSourcePenalties)."""

    def __init__(self, failures: int, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.failures = failures
        self.seconds = seconds
        self.clock = clock
        self._count: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def penalized(self, addr: str) -> bool:
        until = self._until.get(addr)
        if until is None:
            return False
        if self.clock() >= until:
            del self._until[addr]
            return False
        return True

    def failed(self, addr: str) -> None:
        n = self._count.get(addr, 0) + 1
        if n >= self.failures:
            self._until[addr] = self.clock() + self.seconds
            self._count.pop(addr, None)
            log.warning("penalizing %s for %.0fs after %d failed logins", addr, self.seconds, n)
        else:
            self._count[addr] = n

    def succeeded(self, addr: str) -> None:
        self._count.pop(addr, None)


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

    def signal_received(self, signal: str) -> None:
        if self.on_signal is not None:
            self.on_signal(signal)
        else:
            super().signal_received(signal)

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self.on_resize is not None:
            self.on_resize(width, height, pixwidth, pixheight)
        else:
            super().terminal_size_changed(width, height, pixwidth, pixheight)

    def break_received(self, msec: int) -> bool:
        return True

    def session_started(self) -> None:
        chan = self._chan
        if chan is not None and chan.get_subsystem() == "sftp":
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


class MtgpuSSHServer(asyncssh.SSHServer):
    """Authentication for one connection; the gateway serves its channels."""

    def __init__(self, daemon: Any, gateway: Gateway, counters: dict[str, int]) -> None:
        self.daemon = daemon
        self.gateway = gateway
        self.counters = counters
        self.conn: asyncssh.SSHServerConnection | None = None
        self.peer: tuple[str, int] = ("", 0)
        self.local: tuple[str, int] = ("", 0)
        self.principal: Principal | None = None
        self._candidate: tuple[str, str, str] | None = None  # (user, kind, key)
        self._authed = False
        self._counted = False
        self._refused = 0

    # ----------------------------------------------------------- lifecycle

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        sock = conn.get_extra_info("sockname") or ("", 0)
        self.peer = (str(peer[0]), int(peer[1]))
        self.local = (str(sock[0]), int(sock[1]))
        opts = self.daemon.options
        if self.daemon.penalties.penalized(self.peer[0]):
            log.info("refusing %s: penalized after repeated failures", self.peer[0])
            conn.abort()
            return
        if self.counters["unauthenticated"] >= opts.ssh_max_startups:
            log.warning("refusing %s: %d unauthenticated connections (SSH_MAX_STARTUPS)",
                        self.peer[0], self.counters["unauthenticated"])
            conn.abort()
            return
        self.counters["unauthenticated"] += 1
        self._counted = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted and not self._authed:
            self.counters["unauthenticated"] -= 1
            self.daemon.penalties.failed(self.peer[0])
        self._counted = False

    def auth_completed(self) -> None:
        self._authed = True
        if self._counted:
            self.counters["unauthenticated"] -= 1
        self.daemon.penalties.succeeded(self.peer[0])
        assert self._candidate is not None
        user, kind, key = self._candidate
        self.principal = Principal(user, kind, key, self.peer, self.local)
        log.info("accepted %s for %s (%s) from %s", key.split()[0] if key else "certificate",
                 user, kind, self.peer[0])

    # ---------------------------------------------------------------- auth

    def begin_auth(self, username: str) -> bool:
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
            log.warning("refused member %r from %s: its certificate is not signed by this "
                        "cluster's CA (another CLUSTER_ID or CLUSTER_KEY)", name, self.peer[0])
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
        if kind is None:
            self._candidate = None
            self._refused += 1
            if self._refused >= self.daemon.options.ssh_max_auth_tries and self.conn is not None:
                # Like OpenSSH's MaxAuthTries: too many refused keys end the connection.
                log.info("disconnecting %s: too many authentication failures", self.peer[0])
                self.conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                                     "Too many authentication failures")
            return False
        self._candidate = (username, kind, key.export_public_key("openssh").decode().strip())
        return True

    async def _kind_for(self, username: str, key: asyncssh.SSHKey) -> str | None:
        if peer_name(username) is not None:
            log.warning("refused %r from %s: a member must present its cluster certificate",
                        username, self.peer[0])
            return None
        try:
            check_username(username)
        except AccountError as exc:
            log.info("refusing login as %r from %s: %s", username, self.peer[0], exc)
            return None
        line = key.export_public_key("openssh").decode()
        registry = self.daemon.registry
        user = registry.get(username)
        if user is not None:
            if user.get("locked"):
                log.info("refusing login as %r from %s: the account is locked for inactivity "
                         "(TENANT_RETENTION_DAYS); an admin can run `mtgpu-admin retention "
                         "--unlock %s`", username, self.peer[0], username)
                return None
            if registry.has_key(username, line):
                return "tenant"
            if registry.pending_invite(username, time.time()):
                return "invitee"
            return None
        if registry.pending_invite(username, time.time()):
            return "invitee"
        if await self.daemon.local_key_allowed(username, line):
            return "local"
        return None

    # ---------------------------------------------------------- forwarding

    def _uid(self) -> int | None:
        p = self.principal
        if p is None or p.kind == "invitee":
            return None
        if p.kind == "tenant":
            u = self.daemon.registry.get(p.username)
            if u is None or not self.daemon.registry.granted(p.username,
                                                             self.daemon.options.cluster_name):
                return None  # not granted this cluster: no forwarding either
            return u["uid"]
        acct = self.daemon.accounts.existing(p.username)
        return acct.uid if acct else None

    def _no_uid_reason(self) -> str:
        p = self.principal
        if p is not None and p.kind == "tenant":
            return ungranted_message(self.daemon, p.username)
        return "forwarding needs a registered key"

    def _refuse(self, what: str, why: str) -> None:
        who = self.principal.username if self.principal else "?"
        log.warning("refused %s for %s from %s: %s", what, who, self.peer[0], why)
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, why)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> bool:
        """``ssh -L`` and ``ssh -D``: loopback destinations only."""
        if self._uid() is None:
            self._refuse(f"forwarding to {dest_host}:{dest_port}", self._no_uid_reason())
        if dest_host.lower().rstrip(".") not in LOOPBACK_NAMES:
            self._refuse(f"forwarding to {dest_host}:{dest_port}",
                         f"forwarding to {dest_host} is not allowed; only 127.0.0.1, ::1 and "
                         "localhost on this host can be reached")
        return True

    def server_requested(self, listen_host: str, listen_port: int) -> Any:
        """``ssh -R``: listen on loopback only, on ports 1024 and up."""
        if self._uid() is None or self.conn is None:
            return False
        host = listen_host.lower()
        if listen_port and listen_port < 1024:
            log.warning("refused remote forward of port %d for %s: privileged port",
                        listen_port, self.principal.username if self.principal else "?")
            return False
        if host not in ("", "localhost", "127.0.0.1", "::1"):
            log.warning("refused remote forward on %s for %s: loopback only", listen_host,
                        self.principal.username if self.principal else "?")
            return False
        bind = "::1" if host == "::1" else "127.0.0.1"
        return self.conn.forward_local_port(bind, listen_port, listen_host, listen_port)

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
        not_yours = (f"{dest_path} is not a socket you own (or does not exist); only your "
                     "own sockets can be reached")
        try:
            fd = os.open(dest_path, os.O_PATH | os.O_NOFOLLOW)
        except OSError as exc:
            log.info("forwarding to %s for %s: %s", dest_path,
                     self.principal.username if self.principal else "?", exc.strerror)
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
        log.warning("refused a remote Unix socket forward for %s",
                    self.principal.username if self.principal else "?")
        return False

    # ------------------------------------------------------------ sessions

    def session_requested(self) -> Any:
        if self.principal is None or self.conn is None:
            return False
        principal = self.principal
        chan = self.conn.create_server_channel(None, "strict", CHANNEL_WINDOW, CHANNEL_MAX_PKTSIZE)
        if principal.kind == "peer":
            name = peer_name(principal.username) or ""
            process = _PeerProcess(lambda p: self.daemon.peer_session(p, name), None, 0, False)
        else:
            process = _TenantProcess(lambda p: self.gateway.run(p, principal), None, 0, False)
        return chan, process


async def start_ssh_server(daemon: Any, gateway: Gateway) -> asyncssh.SSHAcceptor:
    """Listen on ``SSH_LISTEN``; raise MtgpuError if the address cannot be used."""
    fastpath.apply()
    opts = daemon.options
    host, port = opts.ssh_listen
    keys: list[Any] = list(ensure_host_keys(opts.state_dir))
    ident = getattr(daemon, "identity", None)
    if ident is not None:
        # Each member signs its own host key with the cluster's host CA at start.
        principals = host_principals(opts.server_name, opts.ssh_listen[0])
        keys = [(k, ident.host_certificate(k, principals)) for k in keys]
    counters = {"unauthenticated": 0}
    try:
        return await asyncssh.create_server(
            lambda: MtgpuSSHServer(daemon, gateway, counters), host if host != "0.0.0.0" else "",
            port, server_host_keys=keys, encoding=None, line_editor=False,
            allow_scp=False, x11_forwarding=False,
            agent_forwarding=opts.allow_agent_forwarding,
            login_timeout=opts.ssh_login_grace_time,
            kex_algs=_available(KEX_ALGS, asyncssh.kex.get_kex_algs()),
            encryption_algs=_available(CIPHERS, asyncssh.encryption.get_encryption_algs()),
            mac_algs=_available(MACS, asyncssh.mac.get_mac_algs()),
            compression_algs=["none"], reuse_address=True,
            window=CHANNEL_WINDOW, max_pktsize=CHANNEL_MAX_PKTSIZE,
            keepalive_interval=30, keepalive_count_max=4,
            server_version="MTGPU")
    except OSError as exc:
        raise MtgpuError(f"cannot listen on {host}:{port} (SSH_LISTEN): {exc.strerror}. "
                         "Another program may hold the port; choose another with SSH_LISTEN "
                         "or stop that program") from exc


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
