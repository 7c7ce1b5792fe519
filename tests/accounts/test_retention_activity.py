"""What counts as activity for TENANT_RETENTION_DAYS, what a tenant is told before the
lock, and job logs of clusters that share homes. Real daemons, real OpenSSH tenants;
the policy clock is moved through MTGPU_CLOCK_OFFSET_FILE (negative offsets put a
tenant's past activity in the past)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from mtgpu_testing import Host, free_port, wait_for
from retention_testing import DAY, clock_host, clock_mover

pytestmark = pytest.mark.root

CONFIG = {
    "TENANT_RETENTION_DAYS": 30,
    "TENANT_RETENTION_GRACE": "7d",
    "TENANT_RETENTION_WARN_DAYS": 7,
    "ADMINS": ["boss"],
    "SIMULATED_CPUS": 4,
    # Finished job records go after about 9 s (the purge runs every second).
    "JOB_RETENTION_DAYS": 0.0001,
}


@pytest.fixture(scope="module")
def host():
    yield from clock_host({**CONFIG, "SERVER_NAME": "clustera"})


@pytest.fixture
def clock(host):
    """Move the daemon's policy clock (days ahead of real time)."""
    yield from clock_mover(host)


def user(host, name):
    return next(u for u in json.loads(host.admin("user", "list", "--json").stdout) if u["name"] == name)


def planned(host):
    r = json.loads(host.admin("retention", "--dry-run", "--json").stdout)
    return {s["user"]: s for s in r["steps"]}


def submit(host, name, key, body):
    r = host.ssh(
        name,
        key,
        "mt-job",
        "submit",
        "--parsable",
        "-",
        input=f"#!/bin/bash\n#MTGPU cpus=1 ram=50M\n{body}\n".encode(),
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def test_a_tunnel_only_tenant_is_active(host, clock):
    key = host.add_user("tunneler")
    assert host.ssh("tunneler", key, "true").returncode == 0
    clock(25)
    before = user(host, "tunneler")["last_login"]
    # Only `ssh -N -L`: no session, no command.
    tunnel = subprocess.Popen(
        host.ssh_argv("tunneler", key, opts=["-N", "-L", f"{free_port()}:127.0.0.1:9"]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (user(host, "tunneler")["last_login"] or 0) > before + 20 * DAY,
            what="the tunnel's connection recorded",
        )
    finally:
        tunnel.terminate()
        tunnel.wait()
    clock(40)  # 40 days after the first login, 15 after the tunnel
    assert "tunneler" not in planned(host)
    clock(56)
    assert planned(host)["tunneler"]["action"] == "lock"


def test_a_long_jobs_end_counts_after_its_record_is_purged(host, clock):
    clock(-25)  # the account, the login and the submission were 25 days ago ...
    key = host.add_user("longrun")
    assert host.ssh("longrun", key, "true").returncode == 0
    jid = submit(host, "longrun", key, "sleep 1")
    # ... and the job ended now, real time; its record is purged seconds later.
    wait_for(
        lambda: host.ssh("longrun", key, "mt-job", "show", jid).returncode != 0,
        timeout=120,
        what="the job record purged",
    )
    clock(7.5)
    assert "longrun" not in planned(host)  # 7.5 days since the job ended, not 32.5
    clock(31)
    assert planned(host)["longrun"]["action"] == "lock"


def test_a_login_near_the_lock_warns_with_the_date_and_a_locked_tenant_is_told(host, clock):
    key = host.add_user("warned")
    assert host.ssh("warned", key, "true").returncode == 0
    clock(20)  # 10 days before the lock date: no warning
    r = host.ssh("warned", key, "mt-job", "list")
    assert r.returncode == 0 and "locked" not in r.stderr.decode(), r.stderr
    clock(20 + 25)  # 25 days after that login: within TENANT_RETENTION_WARN_DAYS
    r = host.ssh("warned", key, "mt-job", "list")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    due = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 50 * DAY))
    assert "mtgpu: warning: your account warned had no login" in err, err
    assert f"was due to be locked for inactivity on {due}" in err, err
    assert "ask an administrator (boss)" in err

    # Locked: the tenant who connects is told since when, until when, whom to ask.
    clock(20 + 25 + 31)
    for name in (u["name"] for u in json.loads(host.admin("user", "list", "--json").stdout)):
        if name != "warned":
            host.admin("retention", "--unlock", name)
    done = {s["user"]: s for s in json.loads(host.admin("retention", "--json").stdout)["steps"]}
    assert done["warned"]["done"] == "locked"
    r = host.ssh("warned", key, opts=["-N", "-L", f"{free_port()}:127.0.0.1:9"], timeout=30)
    err = r.stderr.decode()
    locked_on = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 76 * DAY))
    kept = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 83 * DAY))
    assert r.returncode != 0
    assert f"locked for inactivity since {locked_on}" in err, err
    assert f"files are kept until {kept}" in err and "--unlock warned" in err, err
    host.admin("retention", "--unlock", "warned")
    assert host.ssh("warned", key, "true").returncode == 0


def test_clusters_sharing_homes_keep_their_own_job_logs(host, clock, tmp_path):
    # Cluster B shares cluster A's TENANT_HOME_ROOT; the tenant has the same UID on both.
    b = Host({"SERVER_NAME": "clusterb", "TENANT_HOME_ROOT": str(host.homes), "SIMULATED_CPUS": 4})
    try:
        b.start()
        key = host.add_user("both")
        assert host.ssh("both", key, "true").returncode == 0
        uid = int(host.passwd("both")[2])
        r = b.api("user.import", name="both", keys=[host.pubkey("both")], uid=uid, grant=True)
        assert "error" not in r, r
        assert b.ssh("both", key, "true").returncode == 0
        assert host.passwd("both")[2] == b.passwd("both")[2]
        # A's job runs a while; B's job with the same ID writes its log meanwhile.
        ja = submit(host, "both", key, "sleep 15; echo from-a")
        for _ in range(int(ja) if ja.isdigit() else 0):
            jb = submit(b, "both", key, "echo from-b")
            if jb == ja:
                break
        assert jb == ja  # the same job ID on both clusters, in the same home
        home = host.homes / "both" / ".mtgpu" / "jobs"
        out_b = home / "clusterb" / jb / "stdout.log"
        wait_for(lambda: out_b.exists() and out_b.read_text() == "from-b\n", what="B's log")
        # A's job ends, and its record is purged (JOB_RETENTION_DAYS), with its own logs only.
        wait_for(
            lambda: host.ssh("both", key, "mt-job", "show", ja).returncode != 0,
            timeout=180,
            what="A's job purged",
        )
        assert not (home / "clustera" / ja).exists()
        assert out_b.read_text() == "from-b\n"
        shown = json.loads(b.ssh("both", key, "mt-job", "show", jb, "--json").stdout)
        assert shown["stdout"] == str(out_b)
    finally:
        b.cleanup()


def test_remotegpu_cli_shows_the_warning(host, clock, tmp_path):
    import sys

    key = host.add_user("laptop")
    assert host.ssh("laptop", key, "true").returncode == 0
    clock(26)  # 4 days before the lock date
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    scan = subprocess.run(
        ["ssh-keyscan", "-p", str(host.port), "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    (home / ".ssh" / "known_hosts").write_text(scan)
    (home / ".ssh" / "config").write_text(
        f"Host gpu\n  HostName 127.0.0.1\n  Port {host.port}\n  User laptop\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "mtgpu.tui.main", "servers", "--json"],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    [gpu] = [s for s in json.loads(r.stdout) if s["name"] == "gpu"]
    assert gpu["status"] == "up", gpu
    assert "was due to be locked for inactivity on" in (gpu["notice"] or ""), gpu
