"""Draining a standalone host through a real daemon: new jobs wait, running ones go on."""

from __future__ import annotations

import json

import pytest
from mtgpu_testing import show_job, wait_job

# Every mt-job behaviour here is checked with both clients (Python, C fast path).
pytestmark = [pytest.mark.root, pytest.mark.mtjob_clients]

SLEEPER = "#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 300\n"
QUICK = "#!/bin/bash\n#MTGPU cpus=1 ram=10M\necho ran\n"


def submit(host, key, script):
    r = host.ssh("dora", key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, key, jid):
    return show_job(host, "dora", key, jid)


def wait(host, key, jid, pred, what, timeout=30):
    return wait_job(host, "dora", key, jid, pred, what, timeout)


def test_drain_holds_new_jobs_keeps_running_ones_and_outlives_a_restart(make_host):
    host = make_host({"SIMULATED_CPUS": 4}, name="solo")
    key = host.add_user("dora")
    running = submit(host, key, SLEEPER)
    wait(host, key, running, lambda j: j["state"] == "RUNNING", "RUNNING")

    r = host.admin("drain", "solo", "--reason", "kernel update")
    assert r.stdout.strip() == (f"solo is drained: it takes no new work; 1 running job goes on ({running})")
    assert host.admin("drain", "nosuch", check=False).returncode != 0
    tenant = host.ssh("dora", key, "mtgpu-admin", "drain", "solo")
    assert tenant.returncode != 0 and b"needs an admin" in tenant.stderr

    waiting = submit(host, key, QUICK)
    j = wait(host, key, waiting, lambda j: j["reason"] == "ReqNodeNotAvail", "its reason")
    assert j["state"] == "PENDING" and "solo" in j["reason_detail"]
    (node,) = json.loads(host.ssh("dora", key, "mt-job nodes --json").stdout)
    assert node["state"] == "drain" and node["drain_reason"] == "kernel update"
    assert "solo is drained: kernel update" in host.admin("nodes").stdout
    assert show(host, key, running)["state"] == "RUNNING"

    # The drain is replicated state: a restarted daemon still holds the job back.
    host.restart()
    j = wait(host, key, waiting, lambda j: j["reason"] == "ReqNodeNotAvail", "its reason again")
    assert j["state"] == "PENDING" and show(host, key, running)["state"] == "RUNNING"

    assert host.admin("undrain", "solo").stdout.strip() == "solo takes new work again"
    j = wait(host, key, waiting, lambda j: j["state"] == "COMPLETED", "COMPLETED")
    assert open(j["stdout"]).read() == "ran\n"
    (node,) = json.loads(host.admin("nodes", "--json").stdout)
    assert node["state"] == "up" and node["drain_reason"] is None
    host.ssh("dora", key, "mt-job", "cancel", running)
