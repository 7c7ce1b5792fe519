"""CONTAINERS.storage on a local directory: each tenant's images and containers live on
the member's own disk (homes on NFS cannot hold rootless podman's storage), and every
way in to podman uses that store: a session's ``podman``, workspaces (through the
policy hook), containerized jobs, and native jobs."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workspace_testing import IMAGE, podman_ready, start_workspace_host, stop_workspace_host  # noqa: E402

from mtgpu.workspaces.jobs import container_name  # noqa: E402
from mtgpu.workspaces.storage import LocalStores  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.podman]


def test_the_parts_of_a_multi_node_job_have_their_own_container_names() -> None:
    # Members that share a container store (homes shared, stores in them) must not
    # give two parts of one job the same name there.
    assert container_name("7") == "mtgpu-job-7"
    assert container_name("7_2") == "mtgpu-job-7_2"
    assert {container_name("9", r, 2) for r in (0, 1)} == {"mtgpu-job-9-0", "mtgpu-job-9-1"}


def test_local_stores_are_made_once_per_tenant_and_removed_with_the_tenant() -> None:
    why = podman_ready()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="mtgpu-stores-", dir="/tmp"))
    try:
        root = base / "stores"
        s = LocalStores(str(root))
        with pytest.raises(OSError, match=f"{base} is mode 0700, so tenants cannot reach"):
            s.prepare()  # mkdtemp makes it 0700
        os.chmod(base, 0o755)
        before = nobody_processes()
        s.prepare()
        # The driver probe's podman (as nobody) leaves no pause process behind.
        assert nobody_processes() - before == set()
        assert root.stat().st_mode & 0o7777 == 0o711 and root.stat().st_uid == 0
        conf = (root / "storage.conf").read_text()
        assert f'rootless_storage_path = "{root}/$UID/storage"' in conf
        driver = re.search(r'^driver = "(\w+)"$', conf, re.M)
        assert driver and driver.group(1) in ("overlay", "vfs", "btrfs", "zfs"), conf
        assert [p.name for p in root.iterdir()] == ["storage.conf"]  # the probe cleaned up
        s.prepare()  # a restart keeps the driver the stores were made with
        assert (root / "storage.conf").read_text() == conf
        d = Path(s.ensure(54321, 54321))
        assert d == root / "54321" and d.stat().st_uid == 54321 and d.stat().st_mode & 0o777 == 0o700
        (d / "storage").mkdir()
        os.chown(d / "storage", 54321 + 70000, 54321)  # a file of a sub-UID (a container's)
        s.remove(54321)
        assert not d.exists()
        (root / "99").symlink_to("/etc")
        with pytest.raises(OSError, match="symbolic link"):
            s.ensure(99, 99)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def nobody_processes() -> set[int]:
    """Live (not zombie) processes of nobody."""
    import psutil

    return {
        p.pid
        for p in psutil.process_iter(["username", "status"])
        if p.info["username"] == "nobody" and p.info["status"] != psutil.STATUS_ZOMBIE
    }


def wait_job(w, jid: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        v = json.loads(w.run(f"mt-job show {jid} --json")[1])
        if v["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return v
        assert time.time() < deadline, v
        time.sleep(0.2)


def test_every_podman_of_the_tenant_uses_the_store_on_local_disk() -> None:
    why = podman_ready()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="mtgpu-stores-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = base / "local"
    w = start_workspace_host(
        {
            "CONTAINERS": {
                "enabled": True,
                "storage": str(root),
                "templates": {"busybox": {"image": IMAGE, "cpus": 1, "ram": "256M"}},
            }
        },
        user="lois",
    )
    try:
        assert f"container stores: on this member's disk, under {root}" in w.podman_check
        uid = w.uid
        mine = root / str(uid)
        assert mine.stat().st_uid == uid and mine.stat().st_mode & 0o777 == 0o700
        # The image start_workspace_host imported over ssh went to the local store.
        _, out, _ = w.run("podman info --format '{{.Store.GraphRoot}}'")
        assert out.strip() == f"{mine}/storage"
        _, out, _ = w.run("podman images --format '{{.Repository}}:{{.Tag}}'")
        assert IMAGE in out.split()
        assert not (w.home / ".local" / "share" / "containers" / "storage").exists()

        # A workspace: created from the local store, and the policy hook accepts the
        # mounts podman makes from there (/dev/shm, /etc/hosts...).
        v = w.mc("create", "box", "--template", "busybox")
        try:
            assert v["state"] == "RUNNING", v
            _, out, _ = w.run(
                shlex.join(["mt-container", "shell", "box", "--", "sh", "-c", "id -u; echo in-box"])
            )
            assert out.split() == [str(uid), "in-box"]
            _, out, _ = w.run("podman ps --format '{{.Names}}'")
            assert "box" in out.split()
        finally:
            w.rm("box")

        # A containerized job, and a native job that runs podman itself.
        jid = w.run(
            "mt-job submit --parsable -",
            input=(b"#!/bin/sh\n#MTGPU container=busybox\necho in-job-container\n"),
        )[1].strip()
        v = wait_job(w, jid)
        log = w.home / ".mtgpu" / "podman-policy.log"
        assert v["state"] == "COMPLETED", (v["reason"], log.exists() and log.read_text())
        assert Path(v["stdout"]).read_text() == "in-job-container\n"
        jid = w.run(
            "mt-job submit --parsable -",
            input=(
                b"#!/bin/sh\necho $CONTAINERS_STORAGE_CONF\npodman info --format '{{.Store.GraphRoot}}'\n"
            ),
        )[1].strip()
        v = wait_job(w, jid)
        assert v["state"] == "COMPLETED", v["reason"]
        assert Path(v["stdout"]).read_text().split() == [f"{root}/storage.conf", f"{mine}/storage"]
    finally:
        stop_workspace_host(w.host)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_stores_directory_tenants_cannot_reach_stops_the_daemon_with_what_to_do() -> None:
    from mtgpu_testing import Host

    why = podman_ready()  # without podman the setting waits for it: nothing is refused
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="mtgpu-stores-", dir="/tmp"))  # 0700
    h = Host({"CONTAINERS": {"storage": str(base / "s")}})
    try:
        with pytest.raises(RuntimeError) as e:
            h.start()
        assert (
            f"CONTAINERS.storage: the tenants' container stores cannot be kept in {base}/s: "
            f"{base} is mode 0700, so tenants cannot reach their stores under {base}/s; let "
            "others traverse it (chmod o+x) or choose another directory"
        ) in str(e.value)
    finally:
        h.stop()
        h.cleanup()
        subprocess.run(["rm", "-rf", str(base)], check=False)
