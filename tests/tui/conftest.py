"""One real host for the remotegpu-cli tests (two simulated GPUs, workspaces on), and a
laptop-side HOME whose ~/.ssh/config and servers.yaml point at it and at a dead server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workspaces"))

from mtgpu_testing import authorize_for_openssh, free_port, shared_uid_range, start_openssh  # noqa: E402
from workspace_testing import IMAGE, WorkspaceHost, podman_ready, start_workspace_host, stop_workspace_host  # noqa: E402

TEMPLATES = {"busybox": {"image": IMAGE, "cpus": 1, "ram": "256M"}}

#: An MTGPU server older than usage reporting, as its ``mtgpu-api`` subsystem answers:
#: who the user is, its node and jobs; every other operation is unknown there.
OLDER = r"""
import json, os, pwd, sys
user = pwd.getpwuid(os.getuid()).pw_name
known = {
    "whoami": {"name": user, "server": "oldhost", "uid": os.getuid(), "admin": False},
    "nodes": [{"name": "oldhost", "state": "up", "cpus": 2, "ram_total": 1 << 30, "ram_used": 0, "gpus": []}],
    "job.list": [],
}
for line in sys.stdin:
    req = json.loads(line)
    op = req.get("op")
    if op in known:
        out = {"id": req.get("id"), "ok": True, "result": known[op]}
    else:
        why = f"unknown operation {op!r}; known: {', '.join(known)}"
        out = {"id": req.get("id"), "ok": False, "code": "unknown_op", "error": why, "retryable": False}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


@dataclass
class Laptop:
    """The user's side: a HOME with ~/.ssh and ~/.config/remotegpu."""

    home: Path
    host: WorkspaceHost
    dead_port: int

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MTGPU_", "XDG_", "SSH_AUTH_SOCK", "NO_COLOR", "REMOTEGPU"))
        }
        env.update(HOME=str(self.home), TERM="xterm-256color", LANG="C.UTF-8", **extra)
        return env


@pytest.fixture(scope="package")
def laptop() -> Iterator[Laptop]:
    why = podman_ready()
    if why:
        pytest.skip(why)
    wh = start_workspace_host(
        {
            # Between the other tests' blocks (20000-30999) and the workspace tests'
            # (32100 up), and below 33767 (podman's subordinate IDs) for all 16 shares.
            "TENANT_UID_RANGE": shared_uid_range(31000, size=50, stride=60),
            "SIMULATED_GPUS": [{"type": "rtx4090", "count": 2, "vram": "24G"}],
            "CONTAINERS": {"enabled": True, "port_publishing": "loopback", "templates": TEMPLATES},
        },
        user="lena",
    )
    # A server that accepts connections and never answers: the worst case for a UI.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(8)
    home = Path(tempfile.mkdtemp(prefix="remotegpu-home-", dir="/tmp"))
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    scan = subprocess.run(
        ["ssh-keyscan", "-p", str(wh.host.port), "127.0.0.1"], capture_output=True, text=True, timeout=30
    ).stdout
    (ssh / "known_hosts").write_text(scan)
    (ssh / "config").write_text(
        f"Host gpu\n  HostName 127.0.0.1\n  Port {wh.host.port}\n  User lena\n"
        f"  IdentityFile {wh.key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {ssh / 'known_hosts'}\n\n"
        # A pattern (never a server), and a host that does not answer as MTGPU.
        "Host *.example.invalid\n  User nobody\n\n"
        f"Host elsewhere\n  HostName 127.0.0.1\n  Port {free_port()}\n"
    )
    cfg = home / ".config" / "remotegpu"
    cfg.mkdir(parents=True)
    (cfg / "servers.yaml").write_text(
        f"servers:\n  - name: dead\n    host: 127.0.0.1\n    port: {dead.getsockname()[1]}\n"
    )
    try:
        yield Laptop(home, wh, dead.getsockname()[1])
    finally:
        dead.close()
        stop_workspace_host(wh.host)
        subprocess.run(["rm", "-rf", str(home)], check=False)


@pytest.fixture
def at_home(laptop: Laptop, monkeypatch: pytest.MonkeyPatch) -> Laptop:
    """This process as the laptop: HOME is the laptop's, no agent, colours on."""
    for k in list(os.environ):
        if k.startswith(("XDG_", "REMOTEGPU", "NO_COLOR")) or k == "SSH_AUTH_SOCK":
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(laptop.home))
    return laptop


@dataclass
class OlderServer:
    """OpenSSH's sshd serving :data:`OLDER` as ``mtgpu-api``, trusted by the laptop."""

    port: int
    #: An ssh config whose Host ``older`` is it (for the VS Code extension's tests).
    ssh_config: Path


@pytest.fixture(scope="package")
def older(laptop: Laptop) -> Iterator[OlderServer]:
    wh = laptop.host
    script = wh.host.dir / "older_api.py"
    script.write_text(OLDER)
    script.chmod(0o644)
    authorize_for_openssh(wh.host, wh.user, wh.key)
    proc, port = start_openssh(wh.host, f"Subsystem mtgpu-api /usr/bin/python3 -I {script}")
    scan = subprocess.run(
        ["ssh-keyscan", "-p", str(port), "127.0.0.1"], capture_output=True, text=True, timeout=30
    ).stdout
    known = laptop.home / ".ssh" / "known_hosts"
    with known.open("a") as f:
        f.write(scan)
    cfg = laptop.home / "older_ssh_config"
    cfg.write_text(
        f"Host older\n  HostName 127.0.0.1\n  Port {port}\n  User {wh.user}\n  IdentityFile {wh.key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n  LogLevel ERROR\n"
    )
    try:
        yield OlderServer(port, cfg)
    finally:
        proc.terminate()
        proc.wait(10)
