"""The cluster identity every member derives from ``CLUSTER_KEY``.

Members share one secret. From it (and the cluster ID) each derives the same two
Ed25519 certificate authorities:

- the **host CA** signs each member's own host key at start, so a user who adds one
  ``@cert-authority`` line to ``known_hosts`` trusts every member, and members verify
  each other's host keys the same way;
- the **user CA** signs each member's peer identity: a certificate for the member's
  host key whose only principal is ``mtgpu-peer.NAME``. A peer logs in as that user
  name, so the certificate proves which member is on the other end.

A member with another cluster ID or key derives other CAs, and both directions of
authentication fail. Tenants never hold the secret, so they never reach the peer
channel.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import asyncssh
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PEER_PREFIX = "mtgpu-peer."
CERT_VALIDITY = 30 * 86400


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

    def host_certificate(self, host_key: asyncssh.SSHKey, principals: list[str]) -> asyncssh.SSHCertificate:
        """A host certificate for this member's host key (valid 30 days; renewed at start)."""
        return self.host_ca.generate_host_certificate(
            host_key,
            key_id=principals[0],
            principals=principals,
            valid_after="-5m",
            valid_before=f"+{CERT_VALIDITY}s",
        )

    def peer_certificate(self, key: asyncssh.SSHKey, name: str) -> asyncssh.SSHCertificate:
        """A user certificate naming this member, for logging in to the others."""
        return self.user_ca.generate_user_certificate(
            key,
            key_id=peer_username(name),
            principals=[peer_username(name)],
            valid_after="-5m",
            valid_before=f"+{CERT_VALIDITY}s",
        )

    def is_user_ca(self, key: asyncssh.SSHKey) -> bool:
        return key.public_data == self.user_ca.public_data

    def known_hosts_line(self) -> str:
        """The one line a user adds to ``~/.ssh/known_hosts`` to trust every member."""
        pub = self.host_ca.export_public_key("openssh").decode().strip()
        return f"@cert-authority * {pub.split()[0]} {pub.split()[1]} mtgpu-{self.cluster_id}"

    def known_hosts(self) -> tuple[list, list, list]:
        """What asyncssh takes as ``known_hosts`` to accept exactly the members."""
        return ([], [self.host_ca.convert_to_public()], [])
