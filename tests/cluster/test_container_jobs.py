"""Containerized jobs across members: the image a tenant has on one member reaches
the member that runs the job (archived once on shared homes and loaded from there into
the other member's own store, streamed over SSH to a member with homes of its own,
cached there), a member that cannot get the image fails the job with the reason, and
the containers of a nodes=2 job reach each other.

ca and cb share the homes as an NFS export would be shared, so each keeps the tenants'
container stores on its own disk (CONTAINERS.storage: a local directory, what ``auto``
picks for homes on NFS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cluster_harness import status, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workspaces"))
from workspace_testing import IMAGE, make_rootfs, podman_ready, reap_tenant  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.podman]

USER = "cora"


def show(host, key, jid) -> dict:
    r = host.ssh(USER, key, f"mt-job show {jid} --json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def submit(host, key, script: str) -> str:
    r = host.ssh(USER, key, "mt-job submit --parsable -", input=script.encode())
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().strip()


def ended(host, key, jid, timeout=90) -> dict:
    final = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
    return wait_for(
        lambda: (lambda j: j if j["state"] in final else None)(show(host, key, jid)),
        timeout=timeout,
        what=f"job {jid} to end",
    )


def test_images_reach_the_member_that_runs_the_job(cluster) -> None:
    why = podman_ready()
    if why:
        pytest.skip(why)
    shared = Path(tempfile.mkdtemp(prefix="mtgpu-shared-homes-", dir="/tmp"))
    os.chmod(shared, 0o755)
    stores = Path(tempfile.mkdtemp(prefix="mtgpu-stores-", dir="/tmp"))
    os.chmod(stores, 0o755)
    containers = {"enabled": True, "allow_user_images": True, "templates": {"busybox": {"image": IMAGE}}}
    c = cluster(
        [
            (
                "ca",
                0,
                {"TENANT_HOME_ROOT": str(shared), "CONTAINERS": {**containers, "storage": f"{stores}/ca"}},
            ),
            (
                "cb",
                0,
                {"TENANT_HOME_ROOT": str(shared), "CONTAINERS": {**containers, "storage": f"{stores}/cb"}},
            ),
            ("cc", 0, {"CONTAINERS": containers}),
        ],
        # Each is another machine: its own /run (rootless podman's pause process,
        # whose namespaces every podman of the tenant joins, is recorded there).
        private_dirs={"cb": ("/run/user",), "cc": ("/run/user",)},
    )
    ca, cb, cc = (c.by_name(n) for n in ("ca", "cb", "cc"))
    try:
        setup = str(Path(sys.executable).parent / "mtgpu-setup")
        for h in c.hosts:
            r = h.in_ns([setup, "podman-check", "--fix", "--config", str(h.config_path)])
            assert r.returncode == 0, r.stdout + r.stderr
        key = ca.add_user(USER)
        for h in c.hosts:
            wait_for(lambda h=h: h.ssh(USER, key, "true").returncode == 0, what="a login")
        wait_for(lambda: status(ca).get("homes") == "mixed", timeout=30, what="mixed homes")
        tar = subprocess.run(
            ["tar", "-C", str(make_rootfs(ca.dir)), "-c", "."], capture_output=True, check=True
        ).stdout
        r = ca.ssh(USER, key, f"podman import - {IMAGE}", input=tar)
        assert r.returncode == 0, r.stderr
        # The image went to ca's own store, not to the shared home.
        uid = int(ca.passwd(USER)[2])
        assert (stores / "ca" / str(uid) / "storage").is_dir()
        assert (stores / "ca" / str(uid)).stat().st_uid == uid
        assert not (shared / USER / ".local" / "share" / "containers" / "storage").exists()
        r = cb.ssh(USER, key, "podman images --quiet")
        assert r.returncode == 0 and r.stdout.strip() == b"", r
        body = "#!/bin/sh\n#MTGPU container=busybox server={node} workdir=/tmp\necho ran-on $(cat /proc/1/cmdline | tr '\\0' _)\n"

        # cc has homes of its own: the image is streamed from ca, then cached there.
        jid = submit(ca, key, body.format(node="cc"))
        j = ended(ca, key, jid)
        err = Path(j["stderr"].replace(str(shared), str(cc.homes)))
        assert j["state"] == "COMPLETED", (j["reason"], err.exists() and err.read_text()[-1500:])
        image_id = j["image_id"]
        assert j["progress"]["cc"].startswith(f"streamed image {image_id[:12]} from ca"), j
        out = Path(j["stdout"].replace(str(shared), str(cc.homes)))
        assert out.read_text() == "ran-on /bin/sh_/.mtgpu-job_\n"
        assert (cc.state_dir / "images" / f"{image_id}.tar").is_file()
        # ca shares its homes with cb: the image was archived once, under the home.
        archives = list((shared / USER / ".mtgpu" / "images").glob("*.tar"))
        assert [a.name for a in archives] == [f"{image_id}.tar"]
        stamp = archives[0].stat().st_mtime_ns
        # A second job on cc finds the image in the tenant's store there: nothing moves.
        again = ended(ca, key, submit(ca, key, body.format(node="cc")))
        assert again["state"] == "COMPLETED" and "cc" not in again["progress"], again
        # cb shares the homes with ca: its store loads the archive there (nothing is
        # streamed), and the archive is not made again.
        onb = ended(ca, key, submit(ca, key, body.format(node="cb")))
        refusals = shared / USER / ".mtgpu" / "podman-policy.log"
        assert onb["state"] == "COMPLETED", (
            onb["reason"],
            onb["progress"],
            refusals.exists() and refusals.read_text()[-1500:],
        )
        assert onb["progress"]["cb"] == f"loading image {image_id[:12]} from {archives[0]}", onb
        assert archives[0].stat().st_mtime_ns == stamp  # archived once, not again
        r = cb.ssh(USER, key, "podman images --quiet --no-trunc")
        assert image_id in r.stdout.decode(), r

        # An image no member has, from a registry that is not there: the job fails
        # with the reason (it does not hang).
        bad = ended(
            ca, key, submit(ca, key, "#!/bin/sh\n#MTGPU container=localhost:1/absent:1 server=cc\ntrue\n")
        )
        assert bad["state"] == "FAILED", bad
        assert "the image localhost:1/absent:1 cannot reach cc" in bad["reason"], bad
        assert "pulling localhost:1/absent:1 failed" in bad["reason"], bad

        # nodes=2 on the members' own network: rank 1 reaches rank 0's port. ca and cb
        # share the homes, so the tenant's container store too: each part has its own
        # container name there.
        two = submit(
            ca,
            key,
            "#!/bin/sh\n#MTGPU container=busybox nodes=2 server=ca,cb workdir=/tmp\n"
            'if [ "$MTGPU_NODE_RANK" = 0 ]; then echo "got $(nc -l -p $MASTER_PORT)"; '
            "else for i in $(seq 300); do echo hello-from-rank-1 | nc $MASTER_ADDR "
            "$MASTER_PORT && break; sleep 0.1; done; fi\n",
        )
        j = ended(ca, key, two)
        err = Path(j["stderr"])
        assert j["state"] == "COMPLETED", (j["reason"], j["nodes"], err.exists() and err.read_text()[-1500:])
        assert sorted(j["nodes"]) == ["ca", "cb"], j["nodes"]
        assert Path(j["stdout"]).read_text() == "got hello-from-rank-1\n"
        for h in c.hosts:
            r = h.ssh(USER, key, "podman ps --all --filter label=mtgpu.job --format '{{.Names}}'")
            assert r.returncode == 0 and r.stdout.strip() == b"", (h.config["SERVER_NAME"], r)
    finally:
        uid = int((ca.passwd(USER) or [0, 0, 0])[2])
        for h in c.hosts:
            h.stop()
        if uid:
            reap_tenant(uid)
        subprocess.run(["rm", "-rf", str(shared), str(stores)], check=False)
