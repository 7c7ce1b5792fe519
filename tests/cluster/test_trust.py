"""Members trust each other through certificates derived from CLUSTER_KEY; users trust
every member with one @cert-authority line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import asyncssh
import pytest
from mtgpu_testing import python_env

from mtgpu.cluster.dial import connect_peer
from mtgpu.cluster.identity import CERT_BACKDATE, ClusterIdentity

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


def _strict(kh):
    return [
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


def _ssh(host, key, kh, *cmd, **kw):
    return subprocess.run(
        ["ssh", *_strict(kh), "-p", str(host.port), "-i", str(key), "carol@127.0.0.1", *cmd],
        capture_output=True,
        text=True,
        timeout=30,
        **kw,
    )


def test_one_cert_authority_line_trusts_every_member(make_host, tmp_path):
    a = _cluster(make_host, "alpha")
    b = _cluster(make_host, "beta")
    ka = a.add_user("carol")
    kb = b.add_user("carol")
    line = ClusterIdentity.derive("lab", KEY).known_hosts_line(["127.0.0.1", "[127.0.0.1]:*"])
    kh = tmp_path / "known_hosts"
    kh.write_text(line + "\n")
    strict = _strict(kh)
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


def test_printed_known_hosts_line_names_the_members(make_host, tmp_path):
    """`cluster status` prints an @cert-authority line for the members' names and
    addresses, never `*`; that line, as printed, lets ssh verify the member."""
    a = _cluster(make_host, "alpha")
    ka = a.add_user("carol")
    out = a.admin("cluster", "status").stdout
    line = out.strip().splitlines()[-1].strip()
    marker, hosts, kind, _body, comment = line.split(" ")
    assert marker == "@cert-authority" and kind == "ssh-ed25519" and comment == "mtgpu-lab", out
    assert hosts.split(",") == [f"[alpha]:{a.port}", f"[127.0.0.1]:{a.port}"], out
    assert line == a.api("cluster.status")["result"]["known_hosts"]
    kh = tmp_path / "known_hosts"
    kh.write_text(line + "\n")
    r = _ssh(a, ka, kh, "echo trusted")
    assert r.returncode == 0 and r.stdout.strip() == "trusted", r.stderr
    # An admin may name the hosts another way; a pattern for every host is refused.
    given = a.admin("cluster", "status", "--hosts", "gpu*.example.org").stdout
    assert f"@cert-authority gpu*.example.org {kind} " in given
    bad = a.admin("cluster", "status", "--hosts", "*", check=False)
    assert bad.returncode != 0 and "trusts the cluster's CA for every host" in bad.stderr


def test_host_certificate_is_renewed_while_the_server_runs(make_host, tmp_path):
    """With a 30 s validity: the member signs its host key again before the end, the
    running listener presents the new certificate, and ssh still verifies the host
    (@cert-authority line) after the first certificate expired: same daemon, same
    listening socket, and a session opened before goes on."""
    a = make_host(
        {"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab", "CLUSTER_KEY": KEY}, start=False, name="alpha"
    )
    a.env["MTGPU_HOST_CERT_VALIDITY"] = "30"
    a.start()
    pid = a.proc.pid
    ka = a.add_user("carol")
    first = a.api("ssh.host_certificate")["result"]
    assert first["valid_before"] - first["valid_after"] == 30 + CERT_BACKDATE and not first["warning"]
    kh = tmp_path / "known_hosts"
    kh.write_text(a.api("cluster.status")["result"]["known_hosts"] + "\n")
    r = _ssh(a, ka, kh, "echo trusted")
    assert r.returncode == 0 and r.stdout.strip() == "trusted", r.stderr
    # A session made with the first certificate: it must outlive the renewals.
    held = subprocess.Popen(
        ["ssh", *_strict(kh), "-p", str(a.port), "-i", str(ka), "carol@127.0.0.1", "read x; echo got $x"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < first["valid_before"] + 2 and time.time() < deadline:
            time.sleep(1)
        now = a.api("ssh.host_certificate")["result"]
        assert now["valid_before"] > first["valid_before"] + 5 and not now["warning"], now
        assert "renewed this member's host certificate" in a.log()
        r = _ssh(a, ka, kh, "echo still trusted")
        assert r.returncode == 0 and r.stdout.strip() == "still trusted", r.stderr
        out, err = held.communicate("hello\n", timeout=30)
        assert held.returncode == 0 and out.strip() == "got hello", err
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    assert a.proc.poll() is None and a.proc.pid == pid  # never restarted
    st = subprocess.run(
        [sys.executable, "-m", "mtgpu.install.setup", "status", "--config", str(a.config_path)],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=60,
    )
    assert "host cert:  " in st.stdout and "WARNING" not in st.stdout, st.stdout + st.stderr
