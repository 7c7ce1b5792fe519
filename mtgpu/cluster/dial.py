"""Dialing another member: SSH with this member's cluster certificate, both ways checked."""

from __future__ import annotations

from pathlib import Path

import asyncssh

from mtgpu.cluster.identity import ClusterIdentity, peer_username

#: Seconds of silence on a connection to another member before asyncssh asks whether
#: it is still there (three unanswered asks drop it). Longer than the usage report
#: interval, so a member's link to the scheduler never needs one; at 5 s, a scheduler
#: with a thousand members answered and sent about 400 keepalives a second. Raft
#: channels check their peer every second on their own (``transport``).
PEER_KEEPALIVE = 15
#: The ciphers a member asks for on its links to other members, first choice first.
#: Both ends are MTGPU, whose AES-GCM keeps one cipher context per direction
#: (mtgpu/sshd/fastpath.py); asyncssh's own first choice, ChaCha20-Poly1305, makes a
#: new one for every packet, which was a tenth of a 1,000-member scheduler's CPU.
PEER_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)


async def connect_peer(
    address: str, identity: ClusterIdentity, my_name: str, state_dir: str, *, connect_timeout: float = 5.0
) -> asyncssh.SSHClientConnection:
    """Log in to the member at ``HOST:PORT`` as this member.

    The client presents its host key with a user certificate naming it, and accepts
    only a server whose host key carries a certificate from the cluster's host CA.
    """
    host, _, port = address.rpartition(":")
    key = asyncssh.read_private_key(str(Path(state_dir) / "ssh_host_ed25519_key"))
    cert = identity.peer_certificate(key, my_name)
    return await asyncssh.connect(
        host.strip("[]"),
        int(port),
        username=peer_username(my_name),
        client_keys=[(key, cert)],
        known_hosts=identity.known_hosts(),
        agent_path=None,
        config=[],
        encryption_algs=_available(PEER_CIPHERS),
        connect_timeout=connect_timeout,
        keepalive_interval=PEER_KEEPALIVE,
        keepalive_count_max=3,
    )


def _available(wanted: tuple[str, ...]) -> list[str]:
    """``wanted``, in its order, less what this asyncssh (or its crypto) lacks."""
    have = {a.decode() for a in asyncssh.encryption.get_encryption_algs()}
    return [w for w in wanted if w in have]
