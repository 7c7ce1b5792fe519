"""bin/mtgpu-shell behind a real OpenSSH sshd (ForceCommand): same routing as the
embedded server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from mtgpu_testing import SSH_OPTS, ClientTerminal, authorize_for_openssh, start_openssh

pytestmark = [pytest.mark.root, pytest.mark.tmux]


@pytest.fixture(scope="module")
def behind_openssh(shared_host):
    host = shared_host
    key = host.add_user("fc")
    authorize_for_openssh(host, "fc", key)
    shell = os.path.join(os.path.dirname(sys.executable), "mtgpu-shell")
    sshd, port = start_openssh(
        host,
        f"ForceCommand {shell} --config {host.config_path}\n"
        f"Subsystem mtgpu-api {shell} --config {host.config_path} --api\n",
    )
    yield host, key, port
    sshd.kill()


def _ssh(port, key, *cmd, **kw):
    return subprocess.run(
        ["ssh", *SSH_OPTS, "-p", str(port), "-i", str(key), "fc@127.0.0.1", *cmd], capture_output=True, **kw
    )


def test_commands_reach_mtgpu_tools(behind_openssh):
    host, key, port = behind_openssh
    r = _ssh(port, key, "echo $MTGPU_CONFIG; mtgpu-admin whoami --json; exit 5")
    assert r.returncode == 5
    out = r.stdout.decode().split("\n", 1)
    assert out[0] == str(host.config_path)
    assert json.loads(out[1])["name"] == "fc"


def test_api_subsystem_through_openssh(behind_openssh):
    host, key, port = behind_openssh
    r = _ssh(port, key, "-s", "mtgpu-api", input=b'{"op": "whoami", "id": 7}\n')
    ans = json.loads(r.stdout)
    assert ans["id"] == 7 and ans["result"]["name"] == "fc"


def test_sftp_through_forced_command(behind_openssh, tmp_path):
    host, key, port = behind_openssh
    batch = tmp_path / "b"
    (tmp_path / "x.txt").write_text("via openssh\n")
    batch.write_text(f"put {tmp_path}/x.txt x.txt\n")
    r = subprocess.run(
        ["sftp", *SSH_OPTS, "-P", str(port), "-i", str(key), "-b", str(batch), "fc@127.0.0.1"],
        capture_output=True,
    )
    assert r.returncode == 0, r.stderr
    assert (host.homes / "fc" / "x.txt").read_text() == "via openssh\n"


def test_terminal_lands_in_tmux(behind_openssh):
    host, key, port = behind_openssh

    class Openssh:  # ClientTerminal needs only ssh_argv
        def ssh_argv(self, user, key_, *cmd, opts=None):
            return [
                "ssh",
                *SSH_OPTS,
                "-p",
                str(port),
                "-i",
                str(key_),
                *(opts or []),
                f"{user}@127.0.0.1",
                *cmd,
            ]

    t = ClientTerminal(Openssh(), "fc", key)
    try:
        t.type("echo forced-$((6*7))")
        t.wait_for("forced-42")
        uid = host.passwd("fc")[2]
        deadline = time.time() + 10
        while time.time() < deadline:
            r = host.in_ns(
                [
                    "setpriv",
                    f"--reuid={uid}",
                    f"--regid={uid}",
                    "--clear-groups",
                    "tmux",
                    "-u",
                    "-L",
                    "mtgpu",
                    "list-sessions",
                    "-F",
                    "#{session_name}",
                ],
                env={"PATH": "/usr/bin:/bin", "HOME": "/", "TMUX_TMPDIR": str(host.run_dir / "tmux")},
            )
            if r.stdout.strip():
                break
            time.sleep(0.2)
        assert r.stdout.split() == ["main"]
    finally:
        t.close()


def test_a_tenant_not_granted_this_cluster_is_refused_with_the_reason(shared_host):
    from mtgpu.api.client import ApiClient

    host = shared_host
    key = host.add_user("fcrev")
    authorize_for_openssh(host, "fcrev", key)
    shell = os.path.join(os.path.dirname(sys.executable), "mtgpu-shell")
    sshd, port = start_openssh(host, f"ForceCommand {shell} --config {host.config_path}\n")
    try:
        api = ApiClient(str(host.run_dir / "api.sock"))
        api.call("user.revoke", name="fcrev")  # what `mtcode-admin revoke` asks for
        r = subprocess.run(
            ["ssh", *SSH_OPTS, "-p", str(port), "-i", str(key), "fcrev@127.0.0.1", "id"], capture_output=True
        )
        assert r.returncode == 1 and r.stdout == b""
        assert b"fcrev is not granted the cluster 'testhost'" in r.stderr, r.stderr
    finally:
        sshd.kill()
