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
        connect_timeout=connect_timeout,
        keepalive_interval=PEER_KEEPALIVE,
        keepalive_count_max=3,
    )
