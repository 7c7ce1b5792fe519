"""Each tenant's own network namespace: a loopback no other tenant shares.

With ``TENANT_NETWORK: private`` every process a tenant starts through MTGPU (login
shells, the tmux server and its panes, exec commands, jobs, forward helpers) runs in
the tenant's **network namespace**, one per tenant per host, made on first use and
kept alive by a bind mount of its ``ns/net`` file at ``RUN_DIR/tenants/UID.net`` (as
``ip netns`` keeps its namespaces). Its ``127.0.0.1`` is the tenant's alone.

The namespace reaches out through a veth pair: ``mtnUID`` on the host side and
``eth0`` inside, a ``/30`` of ``TENANT_NETWORK_SUBNET`` between them, a default route
to the host side, and on the host iptables rules tagged ``mtgpu-net ...``:

- ``nat POSTROUTING -s TENANT -j MASQUERADE``: outbound traffic leaves with the host's
  address, reaching what the host reaches;
- ``filter FORWARD``: the tenant's packets to another tenant's veth are dropped, new
  connections into the tenant's namespace from anywhere are dropped, replies pass.

The link carries IPv4 only: IPv6 is turned off on both of its ends (the namespace's
``::1`` stays), so the rules above, which are IPv4's, are the whole wall.

DNS: the tenant sees the host's ``/etc/resolv.conf``. A nameserver there on a loopback
address (systemd-resolved's ``127.0.0.53``, a local dnsmasq) would be the tenant's own
empty loopback, so the daemon relays it: it listens on that address and port 53
inside the namespace (UDP and TCP; a tenant cannot bind port 53 itself) and passes
each query to the same address in the host's namespace, bounded in size and number.

Sockets inside a namespace are opened from a short-lived thread that joined it
(``setns`` is per thread for network namespaces), never from a shared worker thread.

Fail closed: when a tenant's namespace cannot be made (or the host cannot make any),
:meth:`TenantNetwork.namespace` raises :class:`~mtgpu.errors.FenceError` and whatever
would have run in it (a login, a job, a forward, a workspace) is refused; a tenant
never runs in the host's namespace while ``TENANT_NETWORK`` is private. The cause is
logged once per tenant (:class:`Refusals`) until the namespace can be made again.
A namespace file found bound at start that is not a namespace this daemon's
``mtnUID`` leads into (left by a killed daemon, say) is unbound and made again.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import hashlib
import ipaddress
import logging
import os
import re
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from mtgpu.errors import CommandError, FenceError
from mtgpu.proc import run

log = logging.getLogger("mtgpu.schedd.netns")

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
#: Host-side veth names: the prefix and the uid (15 bytes at most).
VETH_PREFIX = "mtn"
#: Queries relayed at once per tenant and resolver, and the largest one accepted.
DNS_MAX_PENDING = 64
DNS_MAX_TCP = 16
DNS_TIMEOUT = 5.0

#: Multi-member jobs' own networks: where their /24s come from, the VXLAN port between
#: members (IANA's), the link name prefix and the most members one joins.
JOB_NET_SUBNET = ipaddress.IPv4Network("100.80.0.0/12")
JOB_NET_PORT = 4789
JOB_NET_PREFIX = "mtj"
JOB_NET_MAX = 254
JOB_NET_PART = "multi-member job network (VXLAN between the job's members)"
JOB_NET_FIX = (
    "see the cause in the daemon's log (the vxlan kernel module, UDP port 4789 between members) "
    "and remove it, or set TENANT_NETWORK: shared"
)

#: The fence part this module makes, as refusals name it, and what the admin can do.
NET_PART = "private network namespace (TENANT_NETWORK: private)"
NET_FIX = (
    "see the cause in `mtgpu-setup status` or the daemon's log and remove it, or set TENANT_NETWORK: shared"
)


class Refusals:
    """The fence parts that cannot be set up now, per tenant. Each is logged once, as
    an error with its cause, however often it is asked for again, until it is set up
    (logged too); ``mtgpu-setup status`` lists them (:meth:`now`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: dict[tuple[int, str], dict[str, Any]] = {}

    def refuse(self, uid: int, part: str, cause: str, fix: str) -> FenceError:
        """Record that ``part`` of ``uid``'s fence cannot be set up (``cause``, for the
        admin); the error that refuses what would have run in it (for the tenant)."""
        cause = " ".join(str(cause).split())[:500] or "unknown"
        now = time.time()
        with self._lock:
            rec = self._now.get((uid, part))
            first = rec is None
            if rec is None:
                rec = self._now[(uid, part)] = {"uid": uid, "part": part, "since": now, "refused": 0}
            rec.update(cause=cause, fix=fix, last=now)
            rec["refused"] += 1
        if first:
            log.error(
                "isolation: uid %d: the %s cannot be set up: %s; its sessions and jobs are "
                "refused until it can (%s)",
                uid,
                part,
                cause,
                fix,
            )
        else:
            log.debug("isolation: uid %d: the %s still cannot be set up: %s", uid, part, cause)
        return FenceError(
            f"this host cannot set up your {part} now, so nothing was started (a tenant "
            f"never runs with less isolation); the admin should {fix}"
        )

    def cleared(self, uid: int, part: str) -> None:
        """``part`` of ``uid``'s fence is set up (again)."""
        with self._lock:
            rec = self._now.pop((uid, part), None)
        if rec is not None:
            log.warning(
                "isolation: uid %d: the %s is set up again after %d refusal(s)", uid, part, rec["refused"]
            )

    def now(self) -> list[dict[str, Any]]:
        """The parts refused now, oldest first: uid, part, cause, fix, since, last, refused."""
        with self._lock:
            return sorted((dict(r) for r in self._now.values()), key=lambda r: (r["since"], r["uid"]))


def mount_point(path: str) -> bool:
    """Whether ``path`` is a mount point in this mount namespace. Unlike
    :func:`os.path.ismount` it sees a directory bound onto itself (same device), as
    the namespace directory is: taking that for no mount and binding it again fails
    once it is unbindable (``mount --bind`` exits 32)."""
    want = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and _unescape(fields[4]) == want:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _unescape(field: str) -> str:
    r"""A mountinfo path: space, tab, newline and backslash come as octal escapes.

    >>> _unescape("/run/a\\040b")
    '/run/a b'
    """
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def veth_name(uid: int) -> str:
    """The host side of ``uid``'s veth pair.

    >>> veth_name(20001)
    'mtn20001'
    """
    return f"{VETH_PREFIX}{uid}"


def block(subnet: ipaddress.IPv4Network, slot: int) -> tuple[str, str]:
    """The host-side and tenant-side addresses of ``slot``'s /30 of ``subnet``.

    >>> block(ipaddress.IPv4Network("100.72.0.0/16"), 3)
    ('100.72.0.13', '100.72.0.14')
    """
    base = int(subnet.network_address) + 4 * slot
    return str(ipaddress.IPv4Address(base + 1)), str(ipaddress.IPv4Address(base + 2))


def _ipv6_off(dev: str) -> None:
    """Turn IPv6 off on ``dev`` (in the calling thread's network namespace)."""
    with open(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "w") as f:
        f.write("1")


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` here, or None."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


@dataclass(frozen=True)
class JobNet:
    """A multi-member job's own network (``TENANT_NETWORK: private``): a VXLAN segment
    (``vni``) between its members, one link ``dev`` in each part's tenant namespace,
    rank r at ``address(r)`` of ``subnet`` with MAC ``mac(r)``. Derived from the job id
    alone, so every member computes the same without asking.

    >>> n = job_net("42")
    >>> n.dev == f"mtj{n.vni:06x}", ipaddress.ip_address(n.address(0)) in n.subnet, n.subnet.subnet_of(JOB_NET_SUBNET)
    (True, True, True)
    >>> n.address(1) == str(n.subnet.network_address + 2), n.mac(1)[-2:]
    (True, '01')
    """

    vni: int
    subnet: ipaddress.IPv4Network

    @property
    def dev(self) -> str:
        return f"{JOB_NET_PREFIX}{self.vni:06x}"

    def address(self, rank: int) -> str:
        return str(self.subnet.network_address + rank + 1)

    def mac(self, rank: int) -> str:
        """Locally administered, unicast: 02:VNI:rank."""
        v = self.vni
        return (
            f"02:{v >> 16 & 255:02x}:{v >> 8 & 255:02x}:{v & 255:02x}:{rank >> 8 & 255:02x}:{rank & 255:02x}"
        )


def job_net(job_id: str) -> JobNet:
    """``job_id``'s :class:`JobNet`: its VNI (1 to 2**24-2) and /24 of
    :data:`JOB_NET_SUBNET` from a digest of the id."""
    h = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    vni = 1 + h % 0xFFFFFE
    blocks = JOB_NET_SUBNET.num_addresses // 256
    base = int(JOB_NET_SUBNET.network_address) + 256 * ((h >> 24) % blocks)
    return JobNet(vni, ipaddress.IPv4Network((base, 24)))


def loopback_nameservers(text: str) -> list[str]:
    """The loopback nameservers of a resolv.conf, which a tenant namespace must relay.

    >>> loopback_nameservers("nameserver 127.0.0.53\\nnameserver 10.0.0.1\\nnameserver ::1\\n")
    ['127.0.0.53', '::1']
    """
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(parts[1].split("%")[0])
            except ValueError:
                continue
            if addr.is_loopback and str(addr) not in out:
                out.append(str(addr))
    return out


def in_namespace(path: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` run on a new thread that joined the network namespace at ``path``; the
    thread ends with it, so no other code ever runs in the tenant's namespace."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err), path)
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=body, name="mtgpu-netns", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class TenantNetwork:
    """The private network namespaces of this host's tenants (``TENANT_NETWORK``).

    ``ns_dir`` is the root-only, unbindable directory the namespace files live in
    (the fence's ``RUN_DIR/tenants``); ``prepare`` makes it so.
    """

    def __init__(
        self,
        ns_dir: str,
        subnet: str,
        *,
        wanted: bool = True,
        prepare: Callable[[], None] | None = None,
        resolv_conf: str = "/etc/resolv.conf",
        loop: asyncio.AbstractEventLoop | None = None,
        open_ports: tuple[int, ...] = (),
    ) -> None:
        self.ns_dir = ns_dir
        #: The TCP ports of this host that tenants' namespaces may open connections
        #: to (its SSH servers'); every other new connection to the host is refused.
        self.open_ports = tuple(sorted(set(open_ports)))
        self.subnet = ipaddress.IPv4Network(subnet)
        self.wanted = wanted
        self.prepare = prepare
        self.resolv_conf = resolv_conf
        self.tools = {
            t: shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")
            for t in ("ip", "bridge", "iptables", "unshare", "nsenter", "setpriv")
        }
        # Rules carry the namespace directory's digest: two daemons on one host (tests)
        # never take each other's rules for their own.
        self.tag = hashlib.sha256(os.path.normpath(ns_dir).encode()).hexdigest()[:10]
        self._guard = threading.Lock()
        self._locks: dict[int, threading.Lock] = {}
        #: uid -> the DNS relays listening in its namespace (closed with it).
        self._relays: dict[int, list[Any]] = {}
        self._forwarding_was: str | None = None
        #: Job networks here: link name -> uid (None: not looked up yet).
        self._jobs: dict[str, int] | None = None
        #: The daemon's event loop, which runs the DNS relays.
        self.loop = loop
        #: The tenants whose namespace cannot be made now (the fence shares its own).
        self.refusals = Refusals()
        #: uids whose namespace file this daemon made, adopted or checked.
        self._checked: set[int] = set()

    # ------------------------------------------------------------ reporting

    def unsupported(self) -> str | None:
        """Why this host cannot give tenants private networks (None when it can)."""
        missing = [t for t, p in self.tools.items() if not p]
        if missing:
            return f"{', '.join(missing)} not found (install iproute2, iptables and util-linux)"
        if not os.path.exists("/proc/self/ns/net"):
            return "this kernel has no network namespaces (CONFIG_NET_NS)"
        if os.geteuid() != 0:
            return "the daemon does not run as root"
        return None

    @property
    def private(self) -> bool:
        """Whether tenants get private networks here."""
        return self.wanted and self.unsupported() is None

    def describe(self) -> str:
        """Which mode is in force and why, for the log and ``mtgpu-setup status``."""
        if not self.wanted:
            return "network: shared (TENANT_NETWORK: shared): tenants share the host's loopback"
        why = self.unsupported()
        if why:
            return (
                f"network: REFUSED: TENANT_NETWORK is private but {why}; tenants' sessions "
                "and jobs are refused until it is fixed (or TENANT_NETWORK is shared)"
            )
        return (
            f"network: private (TENANT_NETWORK: private): each tenant has its own "
            f"loopback and namespace, out through veth and NAT from {self.subnet}"
        )

    # ------------------------------------------------------------ namespaces

    def path(self, uid: int) -> str:
        return os.path.join(self.ns_dir, f"{uid}.net")

    def namespace(self, uid: int) -> str | None:
        """The file of ``uid``'s network namespace, made on first use; None only with
        ``TENANT_NETWORK: shared``. Raises :class:`FenceError` when it is private and
        the namespace cannot be made (the cause is logged once): the caller refuses
        what would have run in it, never running it in the host's namespace."""
        if not self.wanted:
            return None
        why = self.unsupported()
        if why:
            raise self.refusals.refuse(uid, NET_PART, why, f"fix this ({why}) or set TENANT_NETWORK: shared")
        path = self.path(uid)
        with self._guard:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            made = False
            try:
                if self.prepare is not None:
                    self.prepare()
                if uid not in self._checked and os.path.ismount(path) and not self._still_ours(uid, path):
                    # Bound by an earlier daemon that was killed, but not a namespace our
                    # mtnUID leads into: unbound (it lies in our root-only directory), and
                    # the tenant's namespace is found in its processes or made again.
                    log.warning(
                        "uid %d: %s is a namespace an earlier daemon left without its link: made again",
                        uid,
                        path,
                    )
                    self._close_relays(uid)
                    release_file(path)
                if not os.path.ismount(path):
                    made = True
                    if not self._adopt(uid, path):
                        self._make(uid, path)
                self._ensure_relays(uid, path)
            except (OSError, CommandError) as exc:
                if made:
                    try:
                        self._teardown(uid, path)
                    except (OSError, CommandError) as again:
                        log.warning("uid %d: removing its half-made network: %s", uid, again)
                raise self.refusals.refuse(uid, NET_PART, str(exc), NET_FIX) from exc
            self._checked.add(uid)
            self.refusals.cleared(uid, NET_PART)
            return path

    def _still_ours(self, uid: int, path: str) -> bool:
        """Whether the namespace bound at ``path`` (before this daemon started) is one
        this daemon's ``mtnUID`` leads into, which it then takes over (its rules put
        back); else it is stale."""
        ip, veth = str(self.tools["ip"]), veth_name(uid)
        r = self._run([ip, "-o", "link", "show", veth], check=False)
        if r.returncode != 0:
            return False
        ifindex = r.stdout.split(":", 1)[0].strip()
        links = self._run([*self._enter(path), ip, "-o", "link", "show", "eth0"], check=False)
        if links.returncode != 0 or f"eth0@if{ifindex}:" not in links.stdout:
            return False
        tenant = self._tenant_address(path)
        if tenant:
            self._forwarding_on()
            self._rules(uid, tenant, add=True)
        log.info("uid %d: private network an earlier daemon bound at %s taken over", uid, path)
        return True

    def _run(
        self, argv: list[str], check: bool = True, stdin_text: str | None = None
    ) -> CompletedProcess[str]:
        try:
            r = run(
                argv,
                input=stdin_text,
                check=False,
                timeout=30,
                cwd="/",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
            )
        except CommandError as exc:  # could not start, or timed out
            raise OSError(str(exc)) from exc
        if check and r.returncode != 0:
            raise OSError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-300:]}")
        return r

    def _slot(self, uid: int) -> int:
        """A free /30 for ``uid``: the one its uid points at, or the next free one."""
        r = self._run([str(self.tools["ip"]), "-o", "-4", "addr", "show"])
        used = set()
        for line in r.stdout.splitlines():
            for word in line.split():
                if "/" in word:
                    try:
                        used.add(ipaddress.IPv4Interface(word).ip)
                    except ValueError:
                        pass
        count = self.subnet.num_addresses // 4
        for i in range(count):
            slot = (uid + i) % count
            if slot == 0:
                continue
            host, tenant = block(self.subnet, slot)
            if ipaddress.IPv4Address(host) not in used and ipaddress.IPv4Address(tenant) not in used:
                return slot
        raise OSError(f"TENANT_NETWORK_SUBNET {self.subnet} has no free /30 left")

    def _make(self, uid: int, path: str) -> None:
        ip, veth = str(self.tools["ip"]), veth_name(uid)
        if self._run([ip, "link", "show", veth], check=False).returncode == 0:
            # Left by a namespace nobody can be found in any more: make a fresh one.
            self._run([ip, "link", "del", veth], check=False)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        self._run([str(self.tools["unshare"]), f"--net={path}", "true"])
        host, tenant = block(self.subnet, self._slot(uid))
        inside = [*self._enter(path), ip]
        self._run([ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", path])
        self._ipv4_only(veth, path)
        self._run([ip, "addr", "add", f"{host}/30", "dev", veth])
        self._run([ip, "link", "set", veth, "up"])
        self._run([*inside, "link", "set", "lo", "up"])
        self._run([*inside, "addr", "add", f"{tenant}/30", "dev", "eth0"])
        self._run([*inside, "link", "set", "eth0", "up"])
        self._run([*inside, "route", "add", "default", "via", host])
        self._forwarding_on()
        self._rules(uid, tenant, add=True)
        log.info("uid %d: private network made (%s, %s on %s)", uid, path, tenant, veth)

    def _adopt(self, uid: int, path: str) -> bool:
        """Bind ``uid``'s namespace at ``path`` again from one of its processes (a daemon
        restarted in a mount namespace of its own lost the binding). Only a namespace
        whose ``eth0`` is the peer of our ``mtnUID`` counts: root made that one."""
        ip, veth = str(self.tools["ip"]), veth_name(uid)
        r = self._run([ip, "-o", "link", "show", veth], check=False)
        if r.returncode != 0:
            return False
        ifindex = r.stdout.split(":", 1)[0].strip()
        own = os.stat("/proc/self/ns/net").st_ino
        own_user = os.stat("/proc/self/ns/user").st_ino
        seen = set()
        for pid in _uid_pids(uid):
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if (
                    st.st_ino == own
                    or st.st_ino in seen
                    or os.stat(f"/proc/{pid}/ns/user").st_ino != own_user
                ):
                    continue
                seen.add(st.st_ino)
                links = run(
                    [
                        str(self.tools["nsenter"]),
                        f"--net=/proc/self/fd/{fd}",
                        "--",
                        ip,
                        "-o",
                        "link",
                        "show",
                        "eth0",
                    ],
                    check=False,
                    timeout=30,
                    pass_fds=(fd,),
                    cwd="/",
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                )
                if links.returncode != 0 or f"eth0@if{ifindex}:" not in links.stdout:
                    continue
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
                run(
                    ["mount", "--bind", f"/proc/self/fd/{fd}", path],
                    check=True,
                    timeout=30,
                    pass_fds=(fd,),
                )
            finally:
                os.close(fd)
            self._ipv4_only(veth, path)
            tenant = self._tenant_address(path)
            if tenant:
                self._forwarding_on()
                self._rules(uid, tenant, add=True)
            log.info("uid %d: private network found again in process %d", uid, pid)
            return True
        return False

    @staticmethod
    def _ipv4_only(veth: str, path: str) -> None:
        """No IPv6 on either end of a tenant's link (``disable_ipv6`` on ``mtnUID`` and
        on the namespace's ``eth0``; its ``::1`` stays): the FORWARD rules are IPv4's,
        and a link-local address would let the tenant reach the host's IPv6 services
        (``[fe80::…%eth0]``) past them. A kernel without IPv6 has nothing to turn off."""
        if not os.path.isdir("/proc/sys/net/ipv6"):
            return
        _ipv6_off(veth)  # an OSError (naming the file) refuses the namespace, as any part does
        in_namespace(path, functools.partial(_ipv6_off, "eth0"))

    def _tenant_address(self, path: str) -> str | None:
        r = self._run(
            [*self._enter(path), str(self.tools["ip"]), "-o", "-4", "addr", "show", "dev", "eth0"],
            check=False,
        )
        for word in r.stdout.split():
            if "/" in word:
                try:
                    return str(ipaddress.IPv4Interface(word).ip)
                except ValueError:
                    continue
        return None

    def _forwarding_on(self) -> None:
        f = Path("/proc/sys/net/ipv4/ip_forward")
        try:
            if f.read_text().strip() != "1":
                self._forwarding_was = f.read_text().strip()
                f.write_text("1")
                log.info("IPv4 forwarding turned on for the tenants' private networks")
        except OSError as exc:
            log.warning("cannot turn on IPv4 forwarding: %s", exc)

    def rule_specs(self, uid: int, tenant: str) -> list[tuple[str, str, list[str]]]:
        """``uid``'s iptables rules: (table, chain, match and target), in insert order.

        >>> [r[:2] for r in TenantNetwork("/run/t", "100.72.0.0/16").rule_specs(1, "100.72.0.6")]
        [('nat', 'POSTROUTING'), ('filter', 'FORWARD'), ('filter', 'FORWARD'), ('filter', 'FORWARD'), ('filter', 'FORWARD'), ('filter', 'INPUT'), ('filter', 'FORWARD'), ('filter', 'INPUT')]
        """
        veth, note = veth_name(uid), ["-m", "comment", "--comment", f"mtgpu-net {self.tag} {uid}"]
        return [
            ("nat", "POSTROUTING", ["-s", f"{tenant}/32", "!", "-o", veth, *note, "-j", "MASQUERADE"]),
            # Inserted at the top one by one, so they end in the reverse of this order.
            ("filter", "FORWARD", ["-o", veth, *note, "-j", "DROP"]),
            (
                "filter",
                "FORWARD",
                ["-o", veth, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", *note, "-j", "ACCEPT"],
            ),
            ("filter", "FORWARD", ["-i", veth, *note, "-j", "ACCEPT"]),
            ("filter", "FORWARD", ["-i", veth, "-o", f"{VETH_PREFIX}+", *note, "-j", "DROP"]),
            # No new connection from the namespace to this host's own services (a
            # database on 0.0.0.0, another tenant's job in the host's network) but its
            # SSH server's ports: a new connection is refused (REJECT), replies pass.
            ("filter", "INPUT", ["-i", veth, "-m", "conntrack", "--ctstate", "NEW", *note, "-j", "REJECT"]),
            *(
                ("filter", "INPUT", ["-i", veth, "-p", "tcp", "--dport", str(p), *note, "-j", "ACCEPT"])
                for p in self.open_ports
            ),
            # No tenant sends into a job network: VXLAN to any member's port, which
            # NAT would send with this member's address, one the others take it from.
            (
                "filter",
                "FORWARD",
                ["-i", veth, "-p", "udp", "--dport", str(JOB_NET_PORT), *note, "-j", "DROP"],
            ),
            ("filter", "INPUT", ["-i", veth, "-p", "udp", "--dport", str(JOB_NET_PORT), *note, "-j", "DROP"]),
        ]

    def _rules(self, uid: int, tenant: str, *, add: bool) -> None:
        ipt = str(self.tools["iptables"])
        for table, chain, spec in self.rule_specs(uid, tenant):
            have = self._run([ipt, "-w", "-t", table, "-C", chain, *spec], check=False).returncode == 0
            if add and not have:
                self._run([ipt, "-w", "-t", table, "-I" if table == "filter" else "-A", chain, *spec])
            elif not add:
                while have:
                    self._run([ipt, "-w", "-t", table, "-D", chain, *spec], check=False)
                    have = (
                        self._run([ipt, "-w", "-t", table, "-C", chain, *spec], check=False).returncode == 0
                    )

    def _delete_rules(
        self, note: str, tables: tuple[str, ...] = ("filter",), *, prefix: bool = False, path: str = ""
    ) -> None:
        """Delete every rule whose comment is ``note`` (this daemon's tag in it), or
        begins with it (``prefix``), in the namespace at ``path`` (default: ours)."""
        ipt = [*(self._enter(path) if path else []), str(self.tools["iptables"]), "-w"]
        quoted = f'"{note}' if prefix else f'"{note}"'
        for table in tables:
            for line in self._run([*ipt, "-t", table, "-S"], check=False).stdout.splitlines():
                if line.startswith("-A ") and quoted in line:
                    self._run([*ipt, "-t", table, "-D", *shlex.split(line)[1:]], check=False)

    def _enter(self, path: str) -> list[str]:
        """The argv prefix that runs a command in the network namespace at ``path``."""
        return [str(self.tools["nsenter"]), f"--net={path}", "--"]

    def _remove_tagged_rules(self, uid: int) -> None:
        """Every rule of ``uid`` this daemon made, whatever address it named."""
        self._delete_rules(f"mtgpu-net {self.tag} {uid}", ("nat", "filter"))

    # ------------------------------------------------------ multi-member jobs

    def open_job(
        self, job_id: str, uid: int, rank: int, members: tuple[str, ...], ports: tuple[int, int] = (0, 0)
    ) -> JobNet:
        """Give the part of multi-member job ``job_id`` that runs here (rank ``rank``;
        ``members``: each rank's member address, in rank order) its job network in
        ``uid``'s namespace: a VXLAN link to the other members' parts, whose address is
        ``job_net(job_id).address(rank)``.

        Scripts that take a member's own address for the rendezvous (``MASTER_ADDR=$(
        scontrol show hostnames | head -n 1)``, as on Slurm) still meet: inside the
        namespace, TCP to a member's address on ``ports`` (RENDEZVOUS_PORTS) goes to
        that member's rank on the job network instead (``nat OUTPUT DNAT``, tagged
        with the link's name), for as long as the job runs.

        Fails closed: raises :class:`~mtgpu.errors.FenceError` (the part is refused,
        never started in the host's network) when the link cannot be made.
        """
        plan = job_net(job_id)
        if not 2 <= len(members) <= JOB_NET_MAX or not 0 <= rank < len(members):
            raise FenceError(
                f"a job network joins 2 to {JOB_NET_MAX} members; this job has {len(members)}: "
                "ask for fewer nodes"
            )
        path = self.namespace(uid)
        assert path is not None
        ip, bridge = str(self.tools["ip"]), str(self.tools["bridge"])
        inside = [*self._enter(path), ip]
        try:
            addrs = [socket.gethostbyname(m) for m in members]
            for line in self._run([*inside, "-o", "-4", "addr", "show"]).stdout.splitlines():
                words = line.split()  # "3: DEV inet ADDR/LEN ..."
                if len(words) >= 4 and words[1] != plan.dev and words[2] == "inet":
                    if ipaddress.IPv4Interface(words[3]).network.overlaps(plan.subnet):
                        raise FenceError(
                            f"this job's network {plan.subnet} is taken here by another job "
                            "of yours; resubmit it (it gets another)"
                        )
            # Left by an earlier run of this job that a killed daemon did not end.
            self._run([*inside, "link", "del", plan.dev], check=False)
            self._run([ip, "link", "del", plan.dev], check=False)
            add = [ip, "link", "add", plan.dev, "address", plan.mac(rank), "type", "vxlan"]
            add += ["id", str(plan.vni), "dstport", str(JOB_NET_PORT), "local", addrs[rank], "nolearning"]
            underlay = interface_of(addrs[rank])
            if underlay:  # the link's MTU is then the underlay's less VXLAN's 50 bytes
                add += ["dev", underlay]
            self._run(add)
        except (OSError, CommandError) as exc:
            raise self.refusals.refuse(uid, JOB_NET_PART, str(exc), JOB_NET_FIX) from exc
        try:
            fdb, neigh = [], []
            for r, a in enumerate(addrs):
                if r != rank:
                    fdb.append(f"fdb append 00:00:00:00:00:00 dev {plan.dev} dst {a}")
                    fdb.append(f"fdb append {plan.mac(r)} dev {plan.dev} dst {a}")
                    neigh.append(
                        f"neigh replace {plan.address(r)} lladdr {plan.mac(r)} dev {plan.dev} nud permanent"
                    )
            self._run([bridge, "-batch", "-"], stdin_text="\n".join(fdb) + "\n")
            self._run([ip, "link", "set", plan.dev, "netns", path])
            if os.path.isdir("/proc/sys/net/ipv6"):  # IPv4 only, as the tenant's own link
                in_namespace(path, functools.partial(_ipv6_off, plan.dev))
            self._run(
                [*inside, "addr", "add", f"{plan.address(rank)}/{plan.subnet.prefixlen}", "dev", plan.dev]
            )
            self._run([*inside, "-batch", "-"], stdin_text="\n".join(neigh) + "\n")
            self._run([*inside, "link", "set", plan.dev, "up"])
            if ports[0] and self.tools["iptables"]:
                nat = [*self._enter(path), str(self.tools["iptables"]), "-w"]
                note = ["-m", "comment", "--comment", f"mtgpu-jobnet {plan.dev}"]
                for r, a in enumerate(addrs):
                    self._run(
                        [*nat, "-t", "nat", "-A", "OUTPUT", "-d", f"{a}/32", "-p", "tcp"]
                        + ["--dport", f"{ports[0]}:{ports[1]}", *note]
                        + ["-j", "DNAT", "--to-destination", plan.address(r)]
                    )
                # ... from the link's own address (the socket took eth0's), for replies.
                self._run([*nat, "-t", "nat", "-A", "POSTROUTING", "-o", plan.dev, *note, "-j", "MASQUERADE"])
        except (OSError, CommandError) as exc:
            self._run([*inside, "link", "del", plan.dev], check=False)
            self._run([ip, "link", "del", plan.dev], check=False)
            raise self.refusals.refuse(uid, JOB_NET_PART, str(exc), JOB_NET_FIX) from exc
        with self._guard:
            if self._jobs is not None:
                self._jobs[plan.dev] = uid
        self.refusals.cleared(uid, JOB_NET_PART)
        log.info(
            "job %s: rank %d on its network %s (%s, VXLAN %d to %s)",
            job_id,
            rank,
            plan.address(rank),
            plan.dev,
            plan.vni,
            ", ".join(a for r, a in enumerate(addrs) if r != rank),
        )
        return plan

    def close_job(self, job_id: str) -> None:
        """Remove ``job_id``'s job network here, if it has one (every job's end calls
        this: it is a lookup unless the job had one)."""
        if not self.tools["ip"] or not self.tools["nsenter"]:
            return
        with self._guard:
            if self._jobs is None:  # the first end seen: what an earlier daemon made too
                self._jobs = self._job_links()
            dev = job_net(job_id).dev
            uid = self._jobs.pop(dev, None)
        if uid is None:
            return
        path = self.path(uid)
        if os.path.ismount(path):
            self._run([*self._enter(path), str(self.tools["ip"]), "link", "del", dev], check=False)
            if self.tools["iptables"]:
                self._delete_rules(f"mtgpu-jobnet {dev}", ("nat",), path=path)
        log.info("job %s: its network %s removed", job_id, dev)

    def _job_links(self) -> dict[str, int]:
        """The job networks in the namespaces here (an earlier daemon's too): link name
        (:attr:`JobNet.dev`) -> uid."""
        out: dict[str, int] = {}
        if self.tools["iptables"]:  # an earlier version walled rendezvous ports off instead
            self._delete_rules(f"mtgpu-job {self.tag} ", prefix=True)
        for uid in self.known():
            r = self._run(
                [*self._enter(self.path(uid)), str(self.tools["ip"]), "-o", "link", "show"], check=False
            )
            for line in r.stdout.splitlines():
                name = line.split(":", 2)[1].strip().split("@", 1)[0] if line.count(":") >= 2 else ""
                if name.startswith(JOB_NET_PREFIX):
                    out[name] = uid
        return out

    # --------------------------------------------------------------- DNS relay

    def _ensure_relays(self, uid: int, path: str) -> None:
        if uid in self._relays or self.loop is None:
            return
        try:
            servers = loopback_nameservers(Path(self.resolv_conf).read_text())
        except OSError:
            servers = []
        if not servers:
            self._relays[uid] = []
            return

        def open_sockets() -> list[tuple[str, socket.socket, socket.socket]]:
            out = []
            for addr in servers:
                fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
                try:
                    u = socket.socket(fam, socket.SOCK_DGRAM)
                    u.bind((addr, 53))
                    t = socket.socket(fam, socket.SOCK_STREAM)
                    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    t.bind((addr, 53))
                    t.listen(16)
                except OSError as exc:
                    log.warning("uid %d: DNS relay on %s cannot listen: %s", uid, addr, exc)
                    continue
                for s in (u, t):
                    s.setblocking(False)
                out.append((addr, u, t))
            return out

        socks = in_namespace(path, open_sockets)
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:  # never block the loop on itself: the relays start a moment later
            held: list[Any] = []
            self._relays[uid] = held
            task = self.loop.create_task(_start_relays(socks))
            task.add_done_callback(lambda t: held.extend(t.result()) if not t.exception() else None)
        else:
            fut = asyncio.run_coroutine_threadsafe(_start_relays(socks), self.loop)
            self._relays[uid] = fut.result(30)
        log.info("uid %d: DNS relayed from its namespace to %s", uid, ", ".join(servers))

    def _close_relays(self, uid: int) -> None:
        relays = self._relays.pop(uid, [])
        loop = self.loop
        for r in relays:
            if loop is not None and loop.is_running():
                loop.call_soon_threadsafe(r.close)
            else:
                r.close()

    # ----------------------------------------------------------------- removal

    def _teardown(self, uid: int, path: str) -> None:
        self._close_relays(uid)
        if self.tools["ip"]:
            self._run([str(self.tools["ip"]), "link", "del", veth_name(uid)], check=False)
        if self.tools["iptables"]:
            self._remove_tagged_rules(uid)
        release_file(path)

    def remove(self, uid: int) -> None:
        """Remove ``uid``'s namespace, veth pair, rules and relays (its processes are
        gone already: the fence ended them)."""
        with self._guard:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            self._checked.discard(uid)
            self._teardown(uid, self.path(uid))

    def known(self) -> list[int]:
        """The uids whose namespace file lies in ``ns_dir`` now."""
        try:
            names = os.listdir(self.ns_dir)
        except OSError:
            return []
        return sorted(int(n[:-4]) for n in names if n.endswith(".net") and n[:-4].isdigit())

    def close(self) -> None:
        """At daemon stop: remove the namespaces no process lives in any more (a tenant's
        running tmux and jobs keep theirs, so a restart cuts no one off), and stop
        every relay (the next daemon opens them again)."""
        for uid in self.known():
            path = self.path(uid)
            try:
                ino = os.stat(path).st_ino
            except OSError:
                continue
            if not _processes_in(ino):
                self.remove(uid)
            else:
                self._close_relays(uid)
        for uid in list(self._relays):
            self._close_relays(uid)
        if self._forwarding_was is not None and not self.known():
            try:
                Path("/proc/sys/net/ipv4/ip_forward").write_text(self._forwarding_was)
            except OSError:
                pass


def release_file(path: str) -> None:
    """Unbind a namespace file kept at ``path`` and remove it (the namespace goes with
    its last process)."""
    if os.path.ismount(path):
        try:
            run(["umount", "-l", path], check=False, timeout=30)
        except CommandError as exc:
            log.warning("unbinding %s: %s", path, exc)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _uid_pids(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except OSError:
                continue
    return sorted(out)


def _processes_in(ino: int) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/net").st_ino == ino:
                    return True
            except OSError:
                continue
    return False


# ------------------------------------------------------------------ DNS relays


class _UdpRelay(asyncio.DatagramProtocol):
    """Passes each query that reaches the namespace's resolver address to the host's."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if len(self.pending) >= DNS_MAX_PENDING or len(data) < 12:
            return  # too many in flight, or not a DNS message: dropped, as a busy server does
        task = asyncio.ensure_future(self._ask(data, addr))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _ask(self, data: bytes, addr: Any) -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bytes] = loop.create_future()

        class Reply(asyncio.DatagramProtocol):
            def datagram_received(self, d: bytes, a: Any) -> None:
                if not answer.done():
                    answer.set_result(d)

        try:
            tr, _ = await loop.create_datagram_endpoint(Reply, remote_addr=(self.upstream, 53))
        except OSError:
            return
        try:
            tr.sendto(data)
            reply = await asyncio.wait_for(answer, DNS_TIMEOUT)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.sendto(reply, addr)
        except (TimeoutError, OSError):
            pass
        finally:
            tr.close()


class _Relay:
    """One resolver address relayed: its UDP endpoint and TCP server."""

    def __init__(self, udp: asyncio.BaseTransport, tcp: asyncio.AbstractServer) -> None:
        self.udp, self.tcp = udp, tcp

    def close(self) -> None:
        self.udp.close()
        self.tcp.close()


async def _start_relays(socks: list[tuple[str, socket.socket, socket.socket]]) -> list[_Relay]:
    loop = asyncio.get_running_loop()
    out = []
    for addr, u, t in socks:
        udp, _ = await loop.create_datagram_endpoint(functools.partial(_UdpRelay, addr), sock=u)
        busy = [0]

        async def handle(
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            upstream: str = addr,
            busy: list[int] = busy,
        ) -> None:
            if busy[0] >= DNS_MAX_TCP:
                writer.close()
                return
            busy[0] += 1
            try:
                ur, uw = await asyncio.wait_for(asyncio.open_connection(upstream, 53), DNS_TIMEOUT)
            except (OSError, TimeoutError):
                busy[0] -= 1
                writer.close()
                return

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                try:
                    while True:
                        chunk = await asyncio.wait_for(r.read(65536), 30)
                        if not chunk:
                            break
                        w.write(chunk)
                        await w.drain()
                except (OSError, TimeoutError):
                    pass
                finally:
                    w.close()

            try:
                await asyncio.gather(pipe(reader, uw), pipe(ur, writer))
            finally:
                busy[0] -= 1

        tcp = await asyncio.start_server(handle, sock=t)
        out.append(_Relay(udp, tcp))
    return out
