"""Accounting across a failover: usage recorded before the scheduler dies is all there
after, on every member's replica, and a job lost with its member ends NODE_FAIL with
its record (GPUs, elapsed) and its usage charged."""

from __future__ import annotations

import json
import signal

import pytest
from cluster_harness import wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

FAST_LOSS = {"CLUSTER_LOST_AFTER": 8, "CLUSTER_FENCE_GRACE": 1}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}


def show(host, key, user, jid) -> dict:
    r = host.ssh(user, key, "mt-job", "show", jid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def submit(host, key, user, script: str) -> str:
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def state_of(host, key, user, jid, states, timeout=90) -> dict:
    return wait_for(
        lambda: (j := show(host, key, user, jid))["state"] in states and j,
        timeout=timeout,
        what=f"{jid} in {states}",
    )


def report(host) -> dict:
    r = host.admin("report", "--json", "--by", "user", check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def mine(rep: dict, user: str) -> dict:
    return next((r for r in rep["rows"] if r["user"] == user), {"jobs": 0, "gpu_seconds": 0.0})


def test_a_failover_loses_no_usage_and_a_lost_members_job_is_node_fail(cluster):
    c = cluster([("m1", 1, FAST_LOSS), ("m2", 1, FAST_LOSS), ("m3", 2, FAST_LOSS)])
    leader = c.scheduler()
    lost = c.by_name(leader)
    entry = next(h for h in c.hosts if h is not lost)
    other = next(h for h in c.hosts if h is not lost and h is not entry)
    key = entry.add_user("uma")
    for h in c.hosts:
        wait_for(lambda h=h: h.ssh("uma", key, "true").returncode == 0, what="login")
    where = other.config["SERVER_NAME"]
    done = submit(entry, key, "uma", f"#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=10M server={where}\nsleep 1\n")
    done_j = state_of(entry, key, "uma", done, FINAL)
    assert done_j["state"] == "COMPLETED"
    name = lost.config["SERVER_NAME"]
    doomed = submit(
        entry, key, "uma", f"#!/bin/bash\n#MTGPU gpus=1 cpus=1 ram=10M server={name}\nsleep 300\n"
    )
    state_of(entry, key, "uma", doomed, {"RUNNING"})
    wait_for(lambda: show(entry, key, "uma", doomed)["gpus"][0].get("uuid"), what="the job's GPU recorded")
    before = wait_for(lambda: mine(report(entry), "uma")["jobs"] == 1 and report(entry), what="usage")
    lost.stop(signal.SIGKILL)
    survivors = [h for h in c.hosts if h is not lost]
    # The survivors name the dead scheduler until their election timeout: wait for the
    # one they elect in its place.
    wait_for(
        lambda: c.scheduler(among=survivors) != name, timeout=90, what="a scheduler other than the lost one"
    )
    j = state_of(entry, key, "uma", doomed, {"NODE_FAIL"}, timeout=90)
    assert j["nodes"] == [name] and j["exit"] is None and j["signal"] is None
    assert j["gpus"][0]["type"] == "rtx4090" and j["gpus"][0]["uuid"] and j["elapsed"] > 0
    sacct = entry.ssh("uma", key, "sacct", "-j", doomed, "-P", "-n", "-o", "JobID,State,ExitCode,NodeList")
    assert sacct.stdout.decode().split() == [f"{doomed}|NODE_FAIL|0:0|{name}"]
    # After the failover, on two members' replicas: what was there, and the lost job.
    for h in survivors:
        after = mine(report(h), "uma")
        assert after["jobs"] == 2
        expect = mine(before, "uma")["gpu_seconds"] + (j["end_time"] - j["start_time"])
        assert after["gpu_seconds"] == pytest.approx(expect, abs=0.01)
