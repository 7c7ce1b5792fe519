"""USER_DISK_LIMIT (scan mode) and TENANT_RETENTION_DAYS through one real daemon,
driven by real OpenSSH tenants, mt-job, mt-container and mtgpu-admin.

The daemon's policy clock is moved forward through MTGPU_CLOCK_OFFSET_FILE; the
machine's clock is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from mtgpu_testing import ClientTerminal, Host

pytestmark = pytest.mark.root

DAY = 86400
CONFIG = {
    "USER_DISK_LIMIT": "1M",
    "USER_DISK_SCAN_INTERVAL": "1s",
    "TENANT_RETENTION_DAYS": 30,
    "TENANT_RETENTION_GRACE": "7d",
    "TENANT_RETENTION_HOME": "archive",
    "ADMINS": ["boss"],
    "SIMULATED_CPUS": 8,
}


@pytest.fixture(scope="module")
def host():
    # Tenants' container stores on local disk (CONTAINERS.storage): removing a tenant
    # removes theirs too.
    stores = Path(tempfile.mkdtemp(prefix="mtgpu-stores-", dir="/tmp"))
    os.chmod(stores, 0o755)  # tenants reach their stores through it
    h = Host({**CONFIG, "CONTAINERS": {"storage": str(stores / "s")}})
    h.stores = stores / "s"
    h.env["MTGPU_CLOCK_OFFSET_FILE"] = str(h.dir / "clock-offset")
    h.start()
    yield h
    h.cleanup()
    subprocess.run(["rm", "-rf", str(stores)], check=False)


def set_clock(host: Host, days: float) -> None:
    (host.dir / "clock-offset").write_text(str(days * DAY))


def submit(host, user, key, body):
    return host.ssh(
        user,
        key,
        "mt-job",
        "submit",
        "--parsable",
        "-",
        input=f"#!/bin/bash\n#MTGPU cpus=1 ram=50M\n{body}\n".encode(),
    )


def job_state(host, user, key, jid):
    r = host.ssh(user, key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["state"]


def wait_running(host, user, key, jid):
    deadline = time.time() + 30
    while (state := job_state(host, user, key, jid)) != "RUNNING":
        assert state == "PENDING" and time.time() < deadline, state
        time.sleep(0.2)


def usage_of(host, user):
    r = json.loads(host.admin("usage", "--refresh", "--json").stdout)
    return r, next(t for t in r["tenants"] if t["user"] == user)


def test_over_limit_tenant_is_warned_and_refused_but_running_work_goes_on(host):
    key = host.add_user("quinn")
    r = submit(host, "quinn", key, "sleep 60")
    assert r.returncode == 0, r.stderr
    jid = r.stdout.decode().strip()
    wait_running(host, "quinn", key, jid)

    assert host.ssh("quinn", key, "head -c 3M /dev/urandom > ~/big").returncode == 0
    report, mine = usage_of(host, "quinn")
    assert report["mode"] == "scan" and report["limit"] == 1 << 20
    assert mine["state"] == "over" and mine["used"] >= 3 << 20 and mine["files"] >= 2

    r = submit(host, "quinn", key, "true")
    err = r.stderr.decode()
    assert r.returncode == 1 and "USER_DISK_LIMIT" in err, err
    assert "uses 3.0M of its 1M limit" in err, err
    r = host.ssh("quinn", key, "mt-container", "create", "ws1", "--image", "busybox")
    err = r.stderr.decode()
    assert r.returncode == 1 and "a new workspace refused" in err and "of its 1M limit" in err, err

    # Every mt-* command warns, on stderr; JSON output stays clean.
    r = host.ssh("quinn", key, "mt-job", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["job_id"] == jid
    assert "mtgpu: warning: your home" in r.stderr.decode()

    # A terminal login shows the warning in tmux's status line.
    term = ClientTerminal(host, "quinn", key)
    try:
        term.wait_for("USER_DISK_LIMIT")
    finally:
        term.close()

    assert job_state(host, "quinn", key, jid) == "RUNNING"  # running work is not killed

    assert host.ssh("quinn", key, "rm ~/big").returncode == 0
    _, mine = usage_of(host, "quinn")
    assert mine["state"] == "ok"
    r = submit(host, "quinn", key, "true")
    assert r.returncode == 0, r.stderr
    table = host.admin("usage").stdout
    assert "quinn" in table and "USE%" in table and "mode scan" in table
    host.ssh("quinn", key, "mt-job", "cancel", jid)


def passwd_has(host: Host, name: str) -> bool:
    return host.passwd(name) is not None


def shadow_expire(host: Host, name: str) -> str:
    for line in (host.etc / "shadow").read_text().splitlines():
        f = line.split(":")
        if f[0] == name:
            return f[7]
    return "(none)"


def retention(host, *args):
    return json.loads(host.admin("retention", "--json", *args).stdout)


def steps(r):
    return {s["user"]: s for s in r["steps"]}


def test_retention_locks_then_removes_only_inactive_tenants_without_work(host):
    set_clock(host, 0)
    keys = {n: host.add_user(n) for n in ("idle", "lingers", "boss", "busy")}
    for n, k in keys.items():
        assert host.ssh(n, k, "true").returncode == 0  # first login provisions the account
    idle_uid = int(host.passwd("idle")[2])
    stores = host.stores if shutil.which("podman") else None  # podman installed: stores on
    if stores is not None:
        assert (stores / str(idle_uid)).stat().st_uid == idle_uid
    assert host.ssh("idle", keys["idle"], "echo keep > ~/notes.txt").returncode == 0
    # An OS account MTGPU did not create, with a home under the same root.
    native_home = host.homes / "native"
    host.in_ns(["useradd", "-m", "-d", str(native_home), "-c", "local user", "native"])
    assert passwd_has(host, "native")
    # A process left behind (like a tmux server) and a running job block removal.
    assert (
        host.ssh("lingers", keys["lingers"], "setsid sleep 300 </dev/null >/dev/null 2>&1 &").returncode == 0
    )
    r = submit(host, "busy", keys["busy"], "sleep 120")
    jid = r.stdout.decode().strip()
    wait_running(host, "busy", keys["busy"], jid)

    others = [
        u["name"] for u in json.loads(host.admin("user", "list", "--json").stdout) if u["name"] not in keys
    ]

    def others_log_in():  # tenants of other tests stay active: a login counts
        for n in others:
            assert host.ssh(n, host.key(n), "true").returncode == 0

    set_clock(host, 31)
    others_log_in()
    dry = retention(host, "--dry-run")
    s = steps(dry)
    assert s["idle"]["action"] == "lock" and s["lingers"]["action"] == "lock"
    assert s["busy"]["action"] == "blocked" and jid in s["busy"]["reason"]
    assert s["boss"]["action"] == "exempt"
    assert "native" not in s and not set(others) & set(s)
    assert "would lock" in host.admin("retention", "--dry-run").stdout
    assert shadow_expire(host, "idle") == ""  # the dry run changed nothing

    done = steps(retention(host))
    assert done["idle"]["done"] == "locked"
    # A process of its own (a nohup job) keeps a tenant from the lock, as from removal.
    assert done["lingers"]["done"].startswith("blocked: 1 process(es)"), done["lingers"]
    assert shadow_expire(host, "lingers") == ""
    r = host.ssh("idle", keys["idle"], "true")
    assert r.returncode != 0
    # Told why, when and whom to ask, not only "Permission denied".
    err = r.stderr.decode()
    assert "The MTGPU account idle is locked for inactivity since" in err, err
    assert "ask an administrator (boss)" in err and "--unlock idle" in err, err
    # Another key for the same name learns nothing.
    r = host.ssh("idle", host.key("stranger"), "true")
    assert r.returncode != 0 and "locked" not in r.stderr.decode()
    assert shadow_expire(host, "idle") == "1"
    assert passwd_has(host, "idle")  # locked, not yet removed

    set_clock(host, 39)
    others_log_in()
    s = steps(retention(host, "--dry-run"))
    assert s["idle"]["action"] == "remove" and "done" not in s["idle"]
    assert s["lingers"]["done"].startswith("would be blocked: 1 process(es)")
    done = steps(retention(host))
    assert done["idle"]["done"] == "removed"
    assert done["lingers"]["done"].startswith("blocked: 1 process(es)")
    assert done["busy"]["action"] == "blocked" and done["boss"]["action"] == "exempt"
    names = {u["name"] for u in json.loads(host.admin("user", "list", "--json").stdout)}
    assert "idle" not in names and {"lingers", "busy", "boss"} <= names
    assert not passwd_has(host, "idle") and not (host.homes / "idle").exists()
    if stores is not None:
        assert not (stores / str(idle_uid)).exists()
        assert (stores / str(int(host.passwd("busy")[2]))).is_dir()
    archives = list((host.state_dir / "retired-homes").glob("idle-*.tar.gz"))
    assert len(archives) == 1
    with tarfile.open(archives[0]) as tar:
        assert tar.extractfile("idle/notes.txt").read() == b"keep\n"
    assert passwd_has(host, "native") and native_home.is_dir()
    assert passwd_has(host, "boss") and passwd_has(host, "busy")
    assert job_state(host, "busy", keys["busy"], jid) == "RUNNING"

    log = [json.loads(line) for line in (host.state_dir / "retention.log").read_text().splitlines()]
    assert [e["action"] for e in log if e["user"] == "idle" and "actor" in e] == ["lock", "remove"]
    assert any(e["user"] == "lingers" and e["action"] == "lock blocked" for e in log)

    # An admin can let a locked tenant back in.
    host.admin("retention", "--unlock", "lingers")
    assert host.ssh("lingers", keys["lingers"], "true").returncode == 0
    host.ssh("busy", keys["busy"], "mt-job", "cancel", jid)
    set_clock(host, 0)
    subprocess.run(
        ["nsenter", "-t", str(host._server_pid()), "-m", "userdel", "-r", "native"], capture_output=True
    )
    assert Path(archives[0]).stat().st_mode & 0o077 == 0
