"""Members trust each other through certificates derived from CLUSTER_KEY; users trust
every member with one @cert-authority line."""

from __future__ import annotations

import asyncio
import json
import subprocess

import asyncssh
import pytest

from mtgpu.cluster.dial import connect_peer
from mtgpu.cluster.identity import ClusterIdentity

pytestmark = pytest.mark.root

KEY = "s3cret-cluster-key-0123456789"


def _cluster(make_host, name, key=KEY, cid="lab"):
    return make_host({"CLUSTER_MODE": "cluster", "CLUSTER_ID": cid, "CLUSTER_KEY": key}, name=name)


async def _peer_call(address, identity, me, state_dir, request):
    conn = await connect_peer(address, identity, me, state_dir)
    async with conn:
        proc = await conn.create_process(subsystem="mtgpu-peer", encoding=None)
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        line = await proc.stdout.readline()
        proc.stdin.write_eof()
        return json.loads(line)


def test_member_reaches_member_as_itself(make_host):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    ident = ClusterIdentity.derive("lab", KEY)
    ans = asyncio.run(
        _peer_call(f"127.0.0.1:{b.port}", ident, "alpha", str(a.state_dir), {"op": "whoami", "id": 1})
    )
    assert ans["ok"] and ans["result"]["name"] == "mtgpu-peer.alpha" and ans["result"]["via"] == "peer"


def test_member_links_use_aes_gcm(make_host):
    """Members ask each other for AES-GCM (MTGPU's cached-context path), not
    asyncssh's default ChaCha20-Poly1305, which makes a cipher context per packet."""
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    ident = ClusterIdentity.derive("lab", KEY)

    async def ciphers():
        conn = await connect_peer(f"127.0.0.1:{b.port}", ident, "alpha", str(a.state_dir))
        async with conn:
            return conn.get_extra_info("send_cipher"), conn.get_extra_info("recv_cipher")

    assert asyncio.run(ciphers()) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")


@pytest.mark.parametrize("cid, key", [("lab", "another-key-0123456789"), ("other", KEY)])
def test_member_with_another_key_or_id_is_refused_both_ways(make_host, cid, key):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    wrong = ClusterIdentity.derive(cid, key)
    # The stranger's certificate is refused by the member ...
    with pytest.raises((asyncssh.PermissionDenied, asyncssh.HostKeyNotVerifiable)):
        asyncio.run(
            _peer_call(f"127.0.0.1:{b.port}", wrong, "alpha", str(a.state_dir), {"op": "whoami", "id": 1})
        )
    # ... and the member's host certificate is refused by the stranger.
    right_client_wrong_ca = ClusterIdentity(cid, wrong.host_ca, ClusterIdentity.derive("lab", KEY).user_ca)
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(
            _peer_call(
                f"127.0.0.1:{b.port}",
                right_client_wrong_ca,
                "alpha",
                str(a.state_dir),
                {"op": "whoami", "id": 1},
            )
        )


def test_wrong_certificate_is_logged(make_host):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    wrong = ClusterIdentity.derive("lab", "another-key-0123456789")
    with pytest.raises(asyncssh.Error):  # the member refuses the login
        asyncio.run(
            _peer_call(
                f"127.0.0.1:{b.port}",
                ClusterIdentity("lab", ClusterIdentity.derive("lab", KEY).host_ca, wrong.user_ca),
                "alpha",
                str(a.state_dir),
                {"op": "whoami", "id": 1},
            )
        )
    assert "refused member 'alpha'" in b.log()


def test_peers_get_no_shell(make_host):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    ident = ClusterIdentity.derive("lab", KEY)

    async def try_shell():
        conn = await connect_peer(f"127.0.0.1:{b.port}", ident, "alpha", str(a.state_dir))
        async with conn:
            return await conn.run("id", check=False)

    with pytest.raises(asyncssh.ChannelOpenError):
        asyncio.run(try_shell())


def test_one_cert_authority_line_trusts_every_member(make_host, tmp_path):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    ka = a.add_user("carol")
    kb = b.add_user("carol")
    line = ClusterIdentity.derive("lab", KEY).known_hosts_line()
    kh = tmp_path / "known_hosts"
    kh.write_text(
        line.replace("@cert-authority *", "@cert-authority 127.0.0.1")
        + "\n"
        + line.replace("@cert-authority *", "@cert-authority [127.0.0.1]:*")
        + "\n"
    )
    strict = [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={kh}",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
    ]
    for host, key in ((a, ka), (b, kb)):
        r = subprocess.run(
            ["ssh", *strict, "-p", str(host.port), "-i", str(key), "carol@127.0.0.1", "echo trusted"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0 and r.stdout.strip() == "trusted", r.stderr
    # A host outside the cluster (standalone, no certificate) is not trusted.
    c = make_host(name="gamma")
    kc = c.add_user("carol")
    r = subprocess.run(
        ["ssh", *strict, "-p", str(c.port), "-i", str(kc), "carol@127.0.0.1", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 255 and "verification failed" in r.stderr.lower()
