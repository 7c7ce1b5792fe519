"""A host that pre-pulls from a private registry with credentials (Debian's
docker-registry on loopback, htpasswd auth) and allows tenants' own images: the daemon
archives the image, the tenant's podman loads it and never sees the credentials; a
devcontainer.json's Dockerfile is built as the tenant."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from workspace_testing import IMAGE, make_rootfs, podman_ready, start_workspace_host, stop_workspace_host

pytestmark = [pytest.mark.root, pytest.mark.podman]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry():
    why = podman_ready() or (
        None
        if shutil.which("docker-registry") and shutil.which("htpasswd") and shutil.which("skopeo")
        else "needs docker-registry, apache2-utils, skopeo"
    )
    if why:
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix="mtgpu-registry-", dir="/tmp"))
    os.chmod(d, 0o755)  # the archives under it are for every tenant
    port = _free_port()
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", "robot", "s3cret"], capture_output=True, text=True, check=True
    ).stdout
    (d / "htpasswd").write_text(htpasswd)
    (d / "config.yml").write_text(f"""version: 0.1
log: {{level: error}}
storage: {{filesystem: {{rootdirectory: {d}/data}}}}
http: {{addr: 127.0.0.1:{port}}}
auth: {{htpasswd: {{realm: test, path: {d}/htpasswd}}}}
""")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(d / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        # Push the test image with a private, throw-away root store (test set-up only).
        rootfs = make_rootfs(d)
        store = ["podman", "--root", str(d / "store"), "--runroot", str(d / "run"), "--storage-driver", "vfs"]
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        subprocess.run([*store, "import", "-", IMAGE], input=tar, capture_output=True, check=True)
        subprocess.run(
            [
                *store,
                "push",
                "--quiet",
                "--creds",
                "robot:s3cret",
                "--tls-verify=false",
                IMAGE,
                f"docker://127.0.0.1:{port}/mtgpu/test:1",
            ],
            capture_output=True,
            check=True,
        )
        subprocess.run(
            [
                *store,
                "push",
                "--quiet",
                "--creds",
                "robot:s3cret",
                "--tls-verify=false",
                IMAGE,
                f"docker://127.0.0.1:{port}/mtgpu/jobs:2",
            ],
            capture_output=True,
            check=True,
        )  # not pre-pulled: a containerized job pulls it
        yield d, port
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def open_host(registry):
    d, port = registry
    creds = d / "registry-auth"
    creds.write_text("robot:s3cret\n")
    os.chmod(creds, 0o600)
    w = start_workspace_host(
        {
            "CONTAINERS": {
                "enabled": True,
                "prepull": ["mtgpu/test:1"],
                "archive_dir": str(d / "images"),
                "allow_user_images": True,
                "registry": {"url": f"127.0.0.1:{port}", "credentials": str(creds), "tls_verify": False},
            }
        }
    )
    yield w, d, port, creds
    stop_workspace_host(w.host)


def test_prepull_with_credentials_feeds_a_workspace(open_host) -> None:
    from mtgpu.api.client import ApiClient

    w, d, port, creds = open_host
    archives = d / "images"
    try:
        ref = f"127.0.0.1:{port}/mtgpu/test:1"
        archive = archives / f"127.0.0.1_{port}_mtgpu_test_1.tar"
        deadline = time.time() + 60
        while not archive.exists():  # pulled in the background when the daemon starts
            assert time.time() < deadline, w.host.log()
            time.sleep(0.2)
        assert archive.stat().st_mode & 0o777 == 0o644
        v = w.mc("create", "pp", "--image", "mtgpu/test:1")
        assert v["state"] == "RUNNING" and v["image"] == ref
        _, out, _ = w.run("mt-container shell pp -- echo from-the-registry-image")
        assert out == "from-the-registry-image\n"
        # The tenant never saw the credentials: pulling directly is refused by the registry.
        rc, _, err = w.run(f"mt-podman pull --tls-verify=false {ref}", ok=False)
        assert rc != 0 and ("authentication required" in err or "unauthorized" in err), err
        assert not list(w.home.rglob("auth.json"))
        # Wrong credentials: the admin's prepull says why.
        creds.write_text("robot:wrong\n")
        api = ApiClient(str(w.host.run_dir / "api.sock"))
        [r] = api.call("workspace.prepull", force=True)
        assert r["ok"] is False and r["image"] == ref
        assert "unauthorized" in r["error"] or "authentication required" in r["error"]
        creds.write_text("robot:s3cret\n")
        [r] = api.call("workspace.prepull", force=True)
        assert r["ok"] is True
    finally:
        w.rm("pp")


def test_a_devcontainer_dockerfile_is_built_as_the_tenant(open_host) -> None:
    w = open_host[0]
    w.run(
        "mkdir -p built/.devcontainer && cd built/.devcontainer && "
        "printf 'FROM localhost/mtgpu-test:1\\nRUN echo built-by-$(id -u) > /built.txt\\n' > Dockerfile"
    )
    w.run(
        "cat > built/.devcontainer/devcontainer.json",
        input=b"""{
      "build": {"dockerfile": "Dockerfile"},
      "postCreateCommand": ["sh", "-c", "cat /built.txt > from-post-create.txt"]
    }""",
    )
    v = w.mc("create", "bd", "--devcontainer", "built")
    try:
        assert v["state"] == "RUNNING" and v["image"] == "localhost/mtgpu-devcontainer/bd:latest"
        _, out, _ = w.run("mt-container shell bd -- cat /built.txt")
        assert out == "built-by-0\n"  # RUN steps run as the image's root, in the tenant's namespace
        made = w.home / "built" / "from-post-create.txt"
        assert made.read_text() == out and made.stat().st_uid == w.uid
    finally:
        w.rm("bd")


def test_a_containerized_job_pulls_its_image_with_the_registry_credentials(open_host) -> None:
    import json

    w, _d, port, _creds = open_host
    ref = f"127.0.0.1:{port}/mtgpu/jobs:2"
    _, out, _ = w.run(
        "mt-job submit --parsable -",
        input=f"#!/bin/sh\n#MTGPU container={ref}\necho pulled-and-ran\n".encode(),
    )
    jid = out.strip()
    deadline = time.time() + 90
    while (v := json.loads(w.run(f"mt-job show {jid} --json")[1]))["state"] in ("PENDING", "RUNNING"):
        assert time.time() < deadline, v
        time.sleep(0.3)
    assert v["state"] == "COMPLETED", (v["reason"], w.host.log()[-2000:])
    assert open(v["stdout"]).read() == "pulled-and-ran\n"
    assert v["progress"] == {w.host.config["SERVER_NAME"]: f"pulling {ref}"}
    assert not list(w.home.rglob("auth.json"))  # the credentials stayed root's
    assert w.run(f"podman image exists {ref}", ok=False)[0] == 0  # now in the tenant's store
