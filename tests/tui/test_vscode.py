"""The VS Code extension (clients/vscode): its Node tests run here against the real server
of the remotegpu-cli tests, over the real OpenSSH client, with the laptop's HOME; a hostile
mtgpu-api subsystem behind a real OpenSSH sshd stands in for a broken or malicious server;
and the .vsix it packs carries what the Marketplace needs and nothing of the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mtgpu_testing import authorize_for_openssh, start_openssh

pytestmark = [pytest.mark.root, pytest.mark.podman]

REPO = Path(__file__).resolve().parent.parent.parent
EXT = REPO / "clients" / "vscode"
NODE_TESTS = ("sources", "commands", "protocol", "server", "hostile")

#: The hostile server's mtgpu-api subsystem: what it answers depends on the operation.
HOSTILE = r"""
import json, sys
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    req = json.loads(line)
    op, rid = req.get("op"), req.get("id")
    if op == "whoami":  # a line that never ends
        out.write(b"x" * (9 << 20))
    elif op == "job.list":  # garbage, then the answer
        out.write(b'not json\n[1, 2]\n{"id": "%d"}\n{"id": 99999, "ok": true}\n' % rid)
        out.write(json.dumps({"id": rid, "ok": True, "result": []}).encode() + b"\n")
    elif op == "refuse":
        out.write(json.dumps({"id": rid, "ok": False, "error": "E" * 100000, "code": "nope"}).encode() + b"\n")
    elif op == "flood":
        while True:
            out.write(b"garbage\n" * 1000)
    elif op == "deep":
        out.write(b'{"id": %d, "ok": true, "result": ' % rid + b"[" * 1000000 + b"]" * 1000000 + b"}\n")
    out.flush()  # "nodes": never answered
"""


def _npm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["npm", *args], cwd=EXT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built() -> Path:
    """The extension compiled (into clients/vscode/out), from its locked dependencies."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("the VS Code extension's tests need Node.js and npm: apt-get install nodejs npm")
    stamp = EXT / "node_modules" / ".mtgpu-lock"
    lock = (EXT / "package-lock.json").read_bytes()
    if not stamp.exists() or stamp.read_bytes() != lock:
        r = _npm("ci", "--no-audit", "--no-fund")
        assert r.returncode == 0, r.stdout + r.stderr
        stamp.write_bytes(lock)
    shutil.rmtree(EXT / "out", ignore_errors=True)
    r = subprocess.run(
        [str(EXT / "node_modules" / ".bin" / "tsc"), "-p", str(EXT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return EXT / "out"


@pytest.fixture(scope="module")
def hostile(laptop) -> Iterator[Path]:
    """An ssh config whose Host `evil` is OpenSSH's sshd serving HOSTILE as mtgpu-api."""
    wh = laptop.host
    script = wh.host.dir / "hostile_api.py"
    script.write_text(HOSTILE)
    script.chmod(0o644)
    authorize_for_openssh(wh.host, wh.user, wh.key)
    proc, port = start_openssh(wh.host, f"Subsystem mtgpu-api /usr/bin/python3 -I {script}")
    cfg = laptop.home / "hostile_ssh_config"
    cfg.write_text(
        f"Host evil\n  HostName 127.0.0.1\n  Port {port}\n  User {wh.user}\n  IdentityFile {wh.key}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    try:
        yield cfg
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("name", NODE_TESTS)
def test_node(name: str, built: Path, hostile: Path, older, laptop) -> None:
    """clients/vscode/test/NAME.test.ts under `node --test`, every test run, none skipped."""
    env = laptop.env(
        MTGPU_TEST_SSH_CONFIG=str(laptop.home / ".ssh" / "config"),
        MTGPU_TEST_HOSTILE_CONFIG=str(hostile),
        MTGPU_TEST_OLDER_CONFIG=str(older.ssh_config),
        MTGPU_TEST_FIXTURE=str(REPO / "clients" / "protocol" / "api.jsonl"),
        MTGPU_TEST_USER=laptop.host.user,
        MTGPU_TEST_SERVER="testhost",
        TMPDIR=str(laptop.home),
    )
    r = subprocess.run(
        ["node", "--test", str(built / "test" / f"{name}.test.js")],
        cwd=EXT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-20000:]
    assert "# fail 0" in out and "# skipped 0" in out and "# cancelled 0" in out, out[-5000:]
    assert "# pass 0" not in out, out[-5000:]


def test_the_vsix_has_the_marketplace_metadata(built: Path, tmp_path: Path) -> None:
    vsix = tmp_path / "mtgpu.vsix"
    r = subprocess.run(
        [
            str(EXT / "node_modules" / ".bin" / "vsce"),
            "package",
            "--allow-missing-repository",
            "--out",
            str(vsix),
        ],
        cwd=EXT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "npm_config_offline": "true"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    names = set(zipfile.ZipFile(vsix).namelist())
    for want in (
        "extension/package.json",
        "extension/readme.md",
        "extension/changelog.md",
        "extension/LICENSE.txt",
        "extension/media/icon.png",
        "extension/out/src/extension.js",
        "extension/node_modules/yaml/package.json",
    ):
        assert want in names, sorted(names)[:50]
    assert not [
        n for n in names if n.startswith(("extension/out/test/", "extension/src/", "extension/test/"))
    ]
    assert not [n for n in names if "@vscode/vsce" in n or "typescript/" in n]
    manifest = zipfile.ZipFile(vsix).read("extension.vsixmanifest").decode()
    assert 'Publisher="mtgpu"' in manifest and "<DisplayName>MTGPU</DisplayName>" in manifest
    png = zipfile.ZipFile(vsix).read("extension/media/icon.png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
