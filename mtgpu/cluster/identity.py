"""The cluster identity every member derives from ``CLUSTER_KEY``.

Members share one secret. From it (and the cluster ID) each derives the same two
Ed25519 certificate authorities:

- the **host CA** signs each member's own host key at start (and again well before
  that certificate expires: mtgpu.sshd.hostcerts), so a user who adds one
  ``@cert-authority`` line naming the members to ``known_hosts`` trusts every member,
  and members verify each other's host keys the same way;
- the **user CA** signs each member's peer identity: a certificate for the member's
  host key whose only principal is ``mtgpu-peer.NAME``. A peer logs in as that user
  name, so the certificate proves which member is on the other end.

A member with another cluster ID or key derives other CAs, and both directions of
authentication fail. Tenants never hold the secret, so they never reach the peer
channel.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import asyncssh
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PEER_PREFIX = "mtgpu-peer."
CERT_VALIDITY = 30 * 86400
#: A certificate is valid from this many seconds before it is signed: members' and
#: users' clocks may differ by up to this much (NTP stepping one by minutes, say)
#: before a fresh certificate looks "not yet valid" to them.
CERT_BACKDATE = 3600


def derive_key(label: str, cluster_id: str, secret: str) -> asyncssh.SSHKey:
    """A deterministic Ed25519 key from the cluster secret.

    >>> a = derive_key("host-ca", "lab", "0123456789abcdef")
    >>> b = derive_key("host-ca", "lab", "0123456789abcdef")
    >>> a.export_public_key() == b.export_public_key()
    True
    >>> derive_key("host-ca", "lab2", "0123456789abcdef").export_public_key() == a.export_public_key()
    False
    """
    seed = hashlib.sha256(f"mtgpu:{label}:{cluster_id}:{secret}".encode()).digest()
    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return asyncssh.import_private_key(pem)


def peer_username(name: str) -> str:
    return PEER_PREFIX + name


def peer_name(username: str) -> str | None:
    """The member name a peer user name stands for, or None for any other user."""
    return username[len(PEER_PREFIX) :] if username.startswith(PEER_PREFIX) else None


@dataclass
class ClusterIdentity:
    """One member's view of the cluster's trust: the CAs and its own certificates."""

    cluster_id: str
    host_ca: asyncssh.SSHKey
    user_ca: asyncssh.SSHKey

    @classmethod
    def derive(cls, cluster_id: str, secret: str) -> ClusterIdentity:
        return cls(
            cluster_id, derive_key("host-ca", cluster_id, secret), derive_key("user-ca", cluster_id, secret)
        )

    def host_certificate(
        self,
        host_key: asyncssh.SSHKey,
        principals: list[str],
        *,
        now: float | None = None,
        validity: int = CERT_VALIDITY,
    ) -> asyncssh.SSHCertificate:
        """A host certificate for this member's host key, valid from five minutes
        before ``now`` (default: the real time) for ``validity`` seconds after it."""
        at = int(time.time() if now is None else now)
        return self.host_ca.generate_host_certificate(
            host_key,
            key_id=principals[0],
            principals=principals,
            valid_after=at - CERT_BACKDATE,
            valid_before=at + validity,
        )

    def peer_certificate(self, key: asyncssh.SSHKey, name: str) -> asyncssh.SSHCertificate:
        """A user certificate naming this member, for logging in to the others: valid
        from CERT_BACKDATE before now, as host certificates are, so a member whose clock
        is behind this one's (by up to that) still takes a fresh one."""
        at = int(time.time())
        return self.user_ca.generate_user_certificate(
            key,
            key_id=peer_username(name),
            principals=[peer_username(name)],
            valid_after=at - CERT_BACKDATE,
            valid_before=at + CERT_VALIDITY,
        )

    def is_user_ca(self, key: asyncssh.SSHKey) -> bool:
        return key.public_data == self.user_ca.public_data

    def known_hosts_line(self, hosts: Sequence[str]) -> str:
        """The one line a user adds to ``~/.ssh/known_hosts`` to trust every member:
        the host CA for the host patterns ``hosts`` only (known_hosts_patterns)."""
        kind, body = self.host_ca.export_public_key("openssh").decode().split()[:2]
        return f"@cert-authority {check_host_patterns(','.join(hosts))} {kind} {body} mtgpu-{self.cluster_id}"

    def known_hosts(self) -> tuple[list, list, list]:
        """What asyncssh takes as ``known_hosts`` to accept exactly the members."""
        return ([], [self.host_ca.convert_to_public()], [])


def known_hosts_patterns(members: Iterable[dict]) -> list[str]:
    """The known_hosts host patterns of members (``name`` and ``address`` HOST:PORT):
    each one's name and address as ``ssh`` looks them up, ``[HOST]:PORT`` off port 22.

    >>> known_hosts_patterns([{"name": "a1", "address": "10.0.0.5:2222"},
    ...                       {"name": "a2", "address": "[fd00::2]:22"}])
    ['[a1]:2222', '[10.0.0.5]:2222', 'a2', 'fd00::2']
    """
    out: list[str] = []
    for m in members:
        host, _, port = str(m.get("address") or "").rpartition(":")
        host = host.strip("[]")
        for h in (str(m.get("name") or ""), host):
            if not h or h in ("0.0.0.0", "::") or not port.isdigit():
                continue
            pattern = h if port == "22" else f"[{h}]:{port}"
            if pattern not in out:
                out.append(pattern)
    return out


def check_host_patterns(patterns: str) -> str:
    """``patterns`` (comma-separated known_hosts host patterns) if they name some hosts,
    else ValueError with the reason: a bare ``*`` would trust the CA for every host.

    >>> check_host_patterns("gpu*.example.org,[10.0.0.5]:2222")
    'gpu*.example.org,[10.0.0.5]:2222'
    >>> check_host_patterns("*")
    Traceback (most recent call last):
    ...
    ValueError: the host pattern '*' trusts the cluster's CA for every host; name the cluster's hosts (e.g. 'gpu*.example.org')
    """
    parts = patterns.split(",")
    if not patterns or any(not p or any(c.isspace() or c == "#" for c in p) for p in parts):
        raise ValueError(
            f"bad host patterns {patterns!r}: give comma-separated names or patterns "
            "without spaces (e.g. 'gpu*.example.org,10.0.0.5')"
        )
    for p in parts:
        core = p[1 : p.index("]:")] if p.startswith("[") and "]:" in p else p
        if set(core) <= set("*?."):
            raise ValueError(
                f"the host pattern {p!r} trusts the cluster's CA for every host; name the "
                "cluster's hosts (e.g. 'gpu*.example.org')"
            )
    return patterns
