"""Isolation fails closed: a tenant whose fence cannot be set up is refused, never run
with less isolation than configured (issue: a tenant's private network could not be
made, the daemon ran its sessions in the host's network namespace, and another tenant
read its 0600 file through its loopback ``http.server``).

Two real daemons in network namespaces of their own (``Network``): one whose
``TENANT_NETWORK_SUBNET`` has no free /30 left refuses the tenant's logins and jobs
with a one-line reason, says so once in its log and in ``mtgpu-setup status``, runs
nothing of the tenant, and serves it again once the subnet has room; one started over
the mounts a killed daemon left under ``RUN_DIR/tenants`` (the directory bound onto
itself and unbindable, a stale namespace file bound in it) still gives the tenant its
own network namespace and private /tmp. Then the fence's parts on their own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtgpu_testing import Host, Network
from security_testing import api_socket, call

from mtgpu.errors import FenceError
from mtgpu.schedd.cgroups import CgroupSystem
from mtgpu.schedd.fence import SessionLimits, TenantFence
from mtgpu.schedd.netns import TenantNetwork

needs_iptables = pytest.mark.skipif(
    subprocess.run(["iptables", "-V"], check=False, capture_output=True).returncode != 0,
    reason="needs iptables",
)

#: A small subnet (64 /30s) the test fills up in the host's network namespace.
SUBNET = "100.73.0.0/24"


@pytest.fixture(scope="module")
def net():
    n = Network()
    try:
        yield n
    finally:
        n.close()


def _in_host_net(h: Host, *argv: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{h.netns}", *argv], check=False, capture_output=True, text=True, **kw
    )


def _wait_state(h: Host, uid: int, jid: str, timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while True:
        with api_socket(h.run_dir, uid) as s:
            v = call(s, "job.show", {"job_id": jid})["result"]
        if v["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return v
        assert time.time() < deadline, f"job {jid} did not end: {v}"
        time.sleep(0.2)


def _processes_of(uid: int) -> list[tuple[int, int]]:
    """(pid, network namespace inode) of every process running as ``uid``."""
    out = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] is not None and p.info["uids"].real == uid:
                out.append((p.pid, os.stat(f"/proc/{p.pid}/ns/net").st_ino))
        except (OSError, psutil.Error):
            continue
    return out


@needs_iptables
def test_a_tenant_whose_network_cannot_be_made_is_refused_and_never_runs_in_the_hosts(net) -> None:
    h = net.add(
        Host(
            {
                "TENANT_NETWORK": "private",
                "TENANT_NETWORK_SUBNET": SUBNET,
                "PRIVATE_TMP_SIZE": "64M",
                "SIMULATED_CPUS": 2,
            }
        )
    )
    # Every /30 of the subnet taken on the host: the namespace cannot be given an address.
    fill = [f"100.73.0.{4 * i + 1}/32 dev lo" for i in range(64)]
    r = _in_host_net(h, "ip", "-batch", "-", input="".join(f"addr add {a}\n" for a in fill))
    assert r.returncode == 0, r.stderr
    h.start()
    try:
        host_ns = os.stat(f"/run/netns/{h.netns}").st_ino
        key = h.add_user("fay")
        for _ in range(3):
            r = h.ssh("fay", key, "echo RAN; stat -L -c %i /proc/self/ns/net")
            err = r.stderr.decode()
            assert r.returncode != 0 and b"RAN" not in r.stdout, (r.stdout, err)
            said = [ln for ln in err.splitlines() if ln.startswith("mtgpu:")]
            assert len(said) == 1, err
            assert "private network namespace (TENANT_NETWORK: private)" in said[0], said
            assert "nothing was started" in said[0] and "TENANT_NETWORK: shared" in said[0], said
        uid = int(h.passwd("fay")[2])
        home = Path(h.passwd("fay")[5])

        # A forward to 127.0.0.1 is refused too, rather than made in the host's network.
        r = h.ssh("fay", key, input=b"", opts=["-W", f"127.0.0.1:{h.port}"])
        assert r.returncode != 0 and b"SSH-2.0" not in r.stdout, r
        said = f"forwarding to 127.0.0.1:{h.port} for fay: this host cannot set up your private network"
        assert said in h.log_path.read_text(errors="replace")

        # Her job is refused too, with the reason, rather than started in the host's network.
        with api_socket(h.run_dir, uid) as s:
            a = call(s, "job.submit", {"script": "#!/bin/sh\nstat -L -c %i /proc/self/ns/net > $HOME/ran\n"})
        assert a["ok"], a
        v = _wait_state(h, uid, a["result"]["job_id"])
        assert v["state"] == "FAILED" and "private network namespace" in (v["reason"] or ""), v
        assert not (home / "ran").exists()
        assert _processes_of(uid) == [], "a refused tenant has processes"

        # The admin log says it once, with the cause; mtgpu-setup status lists it.
        text = h.log_path.read_text(errors="replace")
        line = f"isolation: uid {uid}: the private network namespace (TENANT_NETWORK: private) cannot"
        assert text.count(line) == 1, text[-3000:]
        assert "no free /30" in text
        st = _in_host_net(
            h,
            sys.executable,
            "-m",
            "mtgpu.install.setup",
            "status",
            "--config",
            str(h.config_path),
            timeout=60,
        )
        assert f"REFUSED: uid {uid}: its private network namespace" in st.stdout, st.stdout + st.stderr
        assert "no free /30" in st.stdout

        # The admin makes room: her next login gets her own namespace, not the host's.
        r = _in_host_net(h, "ip", "-batch", "-", input="".join(f"addr del {a}\n" for a in fill))
        assert r.returncode == 0, r.stderr
        r = h.ssh("fay", key, "stat -L -c %i /proc/self/ns/net")
        assert r.returncode == 0, r.stderr
        assert int(r.stdout.decode().split()[0]) != host_ns
        assert "set up again after" in h.log_path.read_text(errors="replace")
        for _, ino in _processes_of(uid):
            assert ino != host_ns
    finally:
        h.cleanup()
    assert h.remove_network_rules() == []


@needs_iptables
def test_a_daemon_started_over_a_killed_daemons_mounts_gives_tenants_their_own_namespaces(net) -> None:
    h = net.add(Host({"TENANT_NETWORK": "private", "PRIVATE_TMP_SIZE": "64M", "SIMULATED_CPUS": 2}))
    h.start()
    try:
        key = h.add_user("gus")
        assert h.ssh("gus", key, "true").returncode == 0
        uid = int(h.passwd("gus")[2])
        h.stop()
        # What a daemon killed in this mount namespace leaves behind: its namespace
        # directory bound onto itself and unbindable (binding it again exits 32), and
        # a tenant's namespace file bound in it, here one with no link out. Made in
        # the new daemon's own mount namespace, so they go with it.
        tenants = h.run_dir / "tenants"
        stale = tenants / f"{uid}.net"
        h.before_start = (
            f"mount --bind {tenants} {tenants} && mount --make-unbindable {tenants} && "
            f"touch {stale} && unshare --net={stale} true && "
            f'echo "stale-ino=$(stat -L -c %i {stale})" && '
        )
        h.start()
        text = h.log_path.read_text(errors="replace")
        stale_ino = int(text.split("stale-ino=")[1].split()[0])
        r = h.ssh(
            "gus",
            key,
            "stat -L -c %i /proc/self/ns/net; ip -o link show eth0; grep -c mtgpu-tmp- /proc/self/mountinfo",
        )
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode().split("\n")
        ino = int(out[0])
        assert ino not in (os.stat(f"/run/netns/{h.netns}").st_ino, stale_ino), (ino, stale_ino, out)
        assert "eth0@" in out[1], out  # made again, with its link out
        assert int(out[2]) >= 1, out  # and its private /tmp
        assert _in_host_net(h, "ip", "link", "show", f"mtn{uid}").returncode == 0
        text = h.log_path.read_text(errors="replace")
        assert "cannot be set up" not in text and "exited 32" not in text, text[-3000:]
        assert "an earlier daemon left without its link" in text
    finally:
        h.cleanup()
    assert h.remove_network_rules() == []


# ------------------------------------------------------------- the parts alone


def _fence(tmp_size: int | None = 1 << 20) -> TenantFence:
    fence = TenantFence(CgroupSystem(), SessionLimits(), "/nonexistent", tmp_size=tmp_size)
    fence.tools = {
        "setpriv": "/usr/bin/setpriv",
        "nsenter": "/usr/bin/nsenter",
        "unshare": "/usr/bin/unshare",
    }
    return fence


def test_a_private_tmp_that_cannot_be_made_refuses_the_session_and_is_logged_once(
    monkeypatch, caplog
) -> None:
    fence = _fence()
    monkeypatch.setattr(fence, "session_cgroup", lambda uid, gid: [])
    monkeypatch.setattr(fence, "_find_namespace", lambda uid, path: None)

    def broken(uid: int, path: str) -> None:
        raise OSError("mount --bind /run/mtgpu/tenants exited 32")

    monkeypatch.setattr(fence, "_make_namespace", broken)
    caplog.set_level(logging.DEBUG, "mtgpu")
    for _ in range(5):
        with pytest.raises(FenceError) as exc:
            fence.prefix(20001, 20001, [], "/")
        msg = str(exc.value)
        assert "private /tmp, /var/tmp and /dev/shm (PRIVATE_TMP)" in msg and "PRIVATE_TMP: false" in msg
        assert "\n" not in msg
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "exited 32" in errors[0].getMessage(), errors
    [refused] = fence.refused()
    assert refused["uid"] == 20001 and refused["refused"] == 5 and "exited 32" in refused["cause"]

    # Fixed: the next session starts in its namespace, and the refusal is over.
    monkeypatch.setattr(fence, "_make_namespace", lambda uid, path: None)
    argv = fence.prefix(20001, 20001, [], "/")
    assert "--mount=/nonexistent/20001.mnt" in argv
    assert fence.refused() == []


def test_no_setpriv_or_no_util_linux_refuses_rather_than_runs_unfenced(monkeypatch) -> None:
    fence = _fence()
    monkeypatch.setattr(fence, "session_cgroup", lambda uid, gid: [])
    fence.tools["setpriv"] = None
    with pytest.raises(FenceError, match="setpriv"):
        fence.prefix(20001, 20001, [], "/")
    fence = _fence()
    monkeypatch.setattr(fence, "session_cgroup", lambda uid, gid: [])
    fence.tools["unshare"] = None
    with pytest.raises(FenceError, match="install util-linux, or set PRIVATE_TMP: false"):
        fence.prefix(20001, 20001, [], "/")
    # PRIVATE_TMP off: nothing to make, nothing refused.
    fence = _fence(tmp_size=None)
    monkeypatch.setattr(fence, "session_cgroup", lambda uid, gid: [])
    fence.tools["unshare"] = None
    assert fence.prefix(20001, 20001, [], "/")[-1] == "--"


def test_a_session_cgroup_that_cannot_be_made_refuses_the_session(tmp_path) -> None:
    # A "hierarchy" where the tenant's cgroup cannot be made (a file stands in the way).
    (tmp_path / "pids").write_text("not a directory")
    fence = _fence(tmp_size=None)
    fence.system = CgroupSystem({"pids": str(tmp_path / "pids")})
    with pytest.raises(FenceError, match=r"session cgroup \(mtgpu.slice/tenant-UID\)"):
        fence.prefix(20001, 20001, [], "/")


def test_a_private_network_the_host_cannot_give_is_refused_not_shared() -> None:
    network = TenantNetwork("/nonexistent", "100.72.0.0/16")
    network.tools["iptables"] = None
    with pytest.raises(FenceError) as exc:
        network.namespace(20001)
    assert "iptables" in str(exc.value) and "TENANT_NETWORK: shared" in str(exc.value)
    assert "REFUSED" in network.describe()
    fence = _fence(tmp_size=None)
    fence.network = network
    with pytest.raises(FenceError):
        fence.net_namespace(20001)
    # Configured shared by the admin: that stays as it is.
    assert TenantNetwork("/nonexistent", "100.72.0.0/16", wanted=False).namespace(20001) is None
