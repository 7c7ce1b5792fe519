"""scp (both modes), sftp, rsync and git over ssh, as the tenant, byte for byte."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
from mtgpu_testing import SSH_OPTS

pytestmark = pytest.mark.root


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def tenant(shared_host):
    key = shared_host.add_user("fran")
    assert shared_host.ssh("fran", key, "true").returncode == 0
    return shared_host, key, int(shared_host.passwd("fran")[2])


def _ssh_cmd(host, key) -> str:
    return " ".join(["ssh", *SSH_OPTS, "-i", str(key), "-p", str(host.port)])


@pytest.mark.parametrize("mode", [[], ["-O"]], ids=["sftp-mode", "legacy-scp"])
def test_scp_round_trip(tenant, tmp_path, mode):
    host, key, uid = tenant
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    base = ["scp", *mode, *SSH_OPTS, "-i", str(key), "-P", str(host.port)]
    name = f"scp{len(mode)}.bin"
    r = subprocess.run([*base, str(src), f"fran@127.0.0.1:{name}"], capture_output=True)
    assert r.returncode == 0, r.stderr
    remote = host.homes / "fran" / name
    assert os.stat(remote).st_uid == uid
    back = tmp_path / "back.bin"
    r = subprocess.run([*base, f"fran@127.0.0.1:{name}", str(back)], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert _sha(back) == _sha(src) == _sha(remote)


def test_sftp_round_trip_and_permissions(tenant, tmp_path):
    host, key, uid = tenant
    src = tmp_path / "s.bin"
    src.write_bytes(os.urandom(2 << 20))
    batch = tmp_path / "batch"
    batch.write_text(f"put {src} s.bin\nget s.bin {tmp_path}/s.back\nls -l\n")
    sftp = ["sftp", *SSH_OPTS, "-i", str(key), "-P", str(host.port), "-b", str(batch), "fran@127.0.0.1"]
    r = subprocess.run(sftp, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _sha(tmp_path / "s.back") == _sha(src)
    assert os.stat(host.homes / "fran" / "s.bin").st_uid == uid
    # The kernel, not the daemon, refuses what the tenant may not touch.
    batch.write_text("put /etc/hostname /etc/evil\n")
    r = subprocess.run(sftp, capture_output=True, text=True)
    assert r.returncode != 0 and "ermission denied" in r.stdout + r.stderr
    assert not os.path.exists("/etc/evil")


def test_rsync_round_trip(tenant, tmp_path):
    host, key, uid = tenant
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for i in range(20):
        (tree / "sub" / f"f{i}").write_bytes(os.urandom(10000 + i))
    r = subprocess.run(
        ["rsync", "-a", "-e", _ssh_cmd(host, key), f"{tree}/", "fran@127.0.0.1:tree/"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back"
    r = subprocess.run(
        ["rsync", "-a", "-e", _ssh_cmd(host, key), "fran@127.0.0.1:tree/", f"{back}/"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for i in range(20):
        assert _sha(back / "sub" / f"f{i}") == _sha(tree / "sub" / f"f{i}")
        assert os.stat(host.homes / "fran" / "tree" / "sub" / f"f{i}").st_uid == uid


def test_git_clone_and_push(tenant, tmp_path):
    host, key, uid = tenant
    r = host.ssh("fran", key, "git init -q --bare repo.git && echo ok")
    assert r.stdout.strip() == b"ok", r.stderr
    env = {
        **os.environ,
        "GIT_SSH_COMMAND": _ssh_cmd(host, key),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    url = "ssh://fran@127.0.0.1/~/repo.git"
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", url, str(work)], check=True, env=env, capture_output=True)
    (work / "README").write_text("hello over mtgpu\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "first"], check=True, env=env)
    r = subprocess.run(
        ["git", "-C", str(work), "push", "-q", "origin", "HEAD:main"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    clone2 = tmp_path / "clone2"
    subprocess.run(
        ["git", "clone", "-q", "-b", "main", url, str(clone2)], check=True, env=env, capture_output=True
    )
    assert (clone2 / "README").read_text() == "hello over mtgpu\n"
    objs = host.homes / "fran" / "repo.git" / "objects"
    assert all(os.stat(p).st_uid == uid for p in objs.rglob("*"))


def test_exec_with_pty_and_signal(tenant):
    host, key, uid = tenant
    r = host.ssh("fran", key, "tty; echo $TERM", opts=["-tt"])
    assert r.returncode == 0
    assert r.stdout.decode().splitlines()[0].startswith("/dev/pts/")
    # A command killed by a signal is reported as exit-signal, not as a status.
    import asyncio

    import asyncssh

    async def run():
        async with asyncssh.connect(
            "127.0.0.1", host.port, username="fran", client_keys=[str(key)], known_hosts=None, agent_path=None
        ) as conn:
            return await conn.run("kill -TERM $$")

    result = asyncio.run(run())
    assert result.exit_signal is not None and result.exit_signal[0] == "TERM"


def test_api_subsystem_answers_json_lines(tenant):
    host, key, uid = tenant
    req = b'{"op": "whoami", "id": 1}\n{"op": "version", "id": 2}\nnot json\n{"op": "user.list", "id": 3}\n'
    r = host.ssh("fran", key, "-s", "mtgpu-api", input=req)
    import json

    # A clean exchange ends with status 0 (a channel closed with no status gives 255).
    assert r.returncode == 0, r.stderr

    answers = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert answers[0]["ok"] and answers[0]["result"]["name"] == "fran" and answers[0]["result"]["uid"] == uid
    assert answers[1]["ok"] and answers[1]["result"]["version"]
    assert not answers[2]["ok"] and answers[2]["code"] == "bad_request"
    assert not answers[3]["ok"] and answers[3]["code"] == "forbidden"


def test_unix_socket_identity_cannot_be_forged(tenant):
    """A tenant's claim in the request is ignored: SO_PEERCRED decides."""
    host, key, uid = tenant
    script = f"""
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("{host.run_dir}/api.sock")
s.sendall(b'{{"op": "whoami", "args": {{"uid": 0, "name": "root"}}, "caller": "root", "id": 1}}\\n')
print(s.recv(65536).decode())
"""
    r = host.ssh("fran", key, "python3 -", input=script.encode())
    import json

    ans = json.loads(r.stdout or b"{}")
    assert "result" in ans, (r.stdout, r.stderr)
    assert ans["result"]["uid"] == uid and ans["result"]["name"] == "fran" and not ans["result"]["admin"]
