"""The test harness itself: its cleanup ends only what the test started.

The suite runs as root on real hosts (the README tells admins to run it), whose
/etc may hold real MTGPU tenants with processes of their own; a test host's /etc is
a copy of that /etc.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from mtgpu_testing import wait_for

from mtgpu.schedd.runner import read_json

pytestmark = pytest.mark.root


def test_cleanup_spares_a_foreign_tenant_and_ends_its_own(make_host):
    host = make_host({"SIMULATED_CPUS": 2}, start=False)
    # A tenant of the real host, as the copy of /etc shows it: an MTGPU account whose
    # UID is even inside this host's own TENANT_UID_RANGE, with a process running.
    lo, hi = (int(x) for x in host.config["TENANT_UID_RANGE"].split("-"))
    uid = hi
    with open(host.etc / "passwd", "a") as f:
        f.write(f"mtforeign:x:{uid}:{uid}:MTGPU tenant mtforeign:/nonexistent:/bin/sh\n")
    with open(host.etc / "group", "a") as f:
        f.write(f"mtforeign:x:{uid}:\n")
    foreign = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "300"]
    )
    try:
        host.start()
        key = host.add_user("tina")
        r = host.ssh(
            "tina",
            key,
            "mt-job",
            "submit",
            "--parsable",
            "-",
            input=b"#!/bin/bash\n#MTGPU cpus=1 ram=10M\nexec sleep 300\n",
        )
        assert r.returncode == 0, r.stderr
        jid = r.stdout.decode().strip()
        wait_for(
            lambda: json.loads(host.ssh("tina", key, "mt-job", "show", jid, "--json").stdout)["start_time"],
            what="the job's start",
        )
        (tina,) = host.tenant_uids()
        assert tina != uid and lo <= tina <= hi
        mine = host.own_processes()
        assert any(p.uids().real == tina for p in mine)  # the job and its session
        assert all(p.pid != foreign.pid for p in mine)

        cgroups = wait_for(
            lambda: read_json(host.state_dir / "jobs" / jid / "cgroups.json"), what="the job's cgroups"
        )

        host.cleanup()

        time.sleep(0.5)
        assert foreign.poll() is None, "the cleanup killed a process it did not start"
        # What this host started (its tenant's job and session, its supervisors) is gone.
        left = [(p.pid, p.status()) for p in mine if _alive(p)]
        assert left == [], f"processes the test started survived the cleanup: {left}"
        assert not any(Path(d).exists() for d in cgroups.values()), cgroups
    finally:
        foreign.kill()
        foreign.wait()


def _alive(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_cleanup_spares_a_process_in_a_namespace_made_after_the_daemon_stopped(make_host):
    """A freed mount namespace's inode number is soon handed to a new namespace
    (another test run's daemon, say): the host holds its daemons' namespaces open,
    so a namespace made after its daemon stopped is never taken for its own."""
    host = make_host({"SIMULATED_CPUS": 2})
    host.stop()
    strangers = [
        subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "300"]) for _ in range(20)
    ]  # each in a namespace made now, after the daemon's went
    try:
        time.sleep(0.5)
        mine = {p.pid for p in host.own_processes()}
        assert not mine & {s.pid for s in strangers}
        host.cleanup()
        assert all(s.poll() is None for s in strangers), "the cleanup killed a process it did not start"
    finally:
        for s in strangers:
            s.kill()
            s.wait()
