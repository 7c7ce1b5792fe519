"""Jobs across members: the homes layout (shared or independent), a working directory
that exists only where it was made, and drained members, with real members."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from cluster_harness import status, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def homes(host) -> str | None:
    return status(host).get("homes")


def login(host, user, key) -> None:
    wait_for(lambda: host.ssh(user, key, "true").returncode == 0, what=f"{user} logging in")


def submit(host, user, key, script, *args) -> str:
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", *args, "-", input=script.encode(), timeout=90)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def show(host, user, key, jid) -> dict:
    r = host.ssh(user, key, "mt-job", "show", jid, "--json", timeout=90)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_job(host, user, key, jid, states, timeout=60) -> dict:
    return wait_for(
        lambda: (lambda j: j if j["state"] in states else None)(show(host, user, key, jid)),
        timeout=timeout,
        what=f"job {jid} in {states}",
    )


def test_independent_homes_and_a_workdir_only_the_submitter_has(cluster):
    c = cluster([("c1", 0, {}), ("c2", 0, {}), ("c3", 0, {})], private_homes=True)
    wait_for(
        lambda: all(homes(h) == "independent" for h in c.hosts),
        timeout=30,
        what="every member to report independent homes",
    )
    st = status(c.hosts[1])
    assert all(m["homes_shared_with"] == [] for m in st["members"])
    table = c.hosts[0].admin("cluster", "status").stdout
    assert "HOMES" in table and "homes (" in table and "): independent" in table

    c1 = c.by_name("c1")
    key = c1.add_user("lee")
    login(c1, "lee", key)
    r = c1.ssh("lee", key, "mkdir -p ~/proj && echo ~/proj")
    proj = r.stdout.decode().strip()
    assert r.returncode == 0 and proj.startswith(str(c1.homes))
    script = "#!/bin/bash\n#MTGPU cpus=1 ram=10M\npwd\n"
    # Here it runs: the directory is on c1.
    ok = submit(c1, "lee", key, script, "--server=c1", f"--workdir={proj}")
    assert wait_job(c1, "lee", key, ok, {"COMPLETED", "FAILED"})["state"] == "COMPLETED"
    # Pinned to c2, which has its own homes: the job fails, and says where and why.
    jid = submit(c1, "lee", key, script, "--server=c2", f"--workdir={proj}")
    j = wait_job(c1, "lee", key, jid, {"COMPLETED", "FAILED"})
    assert j["state"] == "FAILED" and j["nodes"] == ["c2"], j
    reason = j["reason"]
    assert reason.startswith(
        f"the job could not start on c2: entering the working directory {proj}: No such file or directory"
    ), reason
    assert "c2 does not share TENANT_HOME_ROOT with c1, c3" in reason, reason
    assert "copy the directory to c2" in reason and "server=" in reason, reason
    # Every member tells the same story (the reason is replicated).
    assert show(c.by_name("c3"), "lee", key, jid)["reason"] == reason


def test_shared_homes_need_no_copy(cluster):
    shared = Path(tempfile.mkdtemp(prefix="mtgpu-shared-homes-", dir="/tmp"))
    os.chmod(shared, 0o755)
    try:
        c = cluster([(n, 0, {"TENANT_HOME_ROOT": str(shared)}) for n in ("s1", "s2", "s3")])
        wait_for(
            lambda: all(homes(h) == "shared" for h in c.hosts),
            timeout=30,
            what="every member to report shared homes",
        )
        st = status(c.hosts[0])
        assert {m["name"]: m["homes_shared_with"] for m in st["members"]} == {
            "s1": ["s2", "s3"],
            "s2": ["s1", "s3"],
            "s3": ["s1", "s2"],
        }
        assert sorted(p.name for p in shared.glob(".mtgpu-member-*")) == [
            ".mtgpu-member-s1",
            ".mtgpu-member-s2",
            ".mtgpu-member-s3",
        ]
        s1 = c.by_name("s1")
        key = s1.add_user("max")
        login(s1, "max", key)
        r = s1.ssh("max", key, "mkdir -p ~/data && echo hello > ~/data/in && echo ~/data")
        data = r.stdout.decode().strip()
        jid = submit(
            s1,
            "max",
            key,
            "#!/bin/bash\n#MTGPU cpus=1 ram=10M\ncat in > out\n",
            "--server=s3",
            f"--workdir={data}",
        )
        j = wait_job(s1, "max", key, jid, {"COMPLETED", "FAILED"})
        assert j["state"] == "COMPLETED" and j["nodes"] == ["s3"], j
        assert (Path(data) / "out").read_text() == "hello\n"
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_drained_member_takes_no_new_work_and_the_drain_survives_a_failover(cluster):
    # d3 is the most capable: the scheduler. d2 is drained.
    c = cluster([("d1", 0, {}), ("d2", 1, {}), ("d3", 2, {})])
    wait_for(lambda: c.scheduler() == "d3", timeout=30, what="d3 to become the scheduler")
    d1 = c.by_name("d1")
    key = d1.add_user("ned")
    login(d1, "ned", key)
    sleeper = "#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 300\n"
    running = submit(d1, "ned", key, sleeper, "--server=d2")
    wait_job(d1, "ned", key, running, {"RUNNING"})

    # Drained through a member that is not the scheduler: it is relayed there.
    r = d1.admin("drain", "d2", "--reason", "replacing a fan")
    assert r.stdout.startswith("d2 is drained: it takes no new work") and running in r.stdout
    refused = d1.ssh("ned", key, "mtgpu-admin", "drain", "d1")
    assert refused.returncode != 0 and b"needs an admin" in refused.stderr, refused.stderr
    st = status(c.hosts[2])
    d2 = next(m for m in st["members"] if m["name"] == "d2")
    assert d2["drained"] and d2["drain_reason"] == "replacing a fan"
    assert "d2 is drained: replacing a fan" in d1.admin("cluster", "status").stdout
    nodes = {n["name"]: n for n in json.loads(d1.admin("nodes", "--json").stdout)}
    assert nodes["d2"]["state"] == "drain" and nodes["d2"]["drain_reason"] == "replacing a fan"
    assert nodes["d1"]["state"] == "up" and nodes["d1"]["drain_reason"] is None
    assert "d2 is drained: replacing a fan" in d1.ssh("ned", key, "mt-job nodes").stdout.decode()

    # New work goes elsewhere; work that only d2 may run waits, and says why.
    free = [submit(d1, "ned", key, sleeper) for _ in range(4)]
    for jid in free:
        assert wait_job(d1, "ned", key, jid, {"RUNNING"})["nodes"] != ["d2"]
    pinned = submit(d1, "ned", key, "#!/bin/bash\n#MTGPU cpus=1 ram=10M\ntrue\n", "--server=d2")
    j = wait_for(
        lambda: (lambda j: j if j["reason"] == "ReqNodeNotAvail" else None)(show(d1, "ned", key, pinned)),
        what="the pinned job's reason",
    )
    assert j["state"] == "PENDING" and "d2" in j["reason_detail"]
    assert show(d1, "ned", key, running)["state"] == "RUNNING"  # running work goes on

    # The scheduler dies; the next one knows about the drain.
    c.by_name("d3").stop(signal.SIGKILL)
    survivors = [h for h in c.hosts if h.config["SERVER_NAME"] != "d3"]
    wait_for(lambda: c.scheduler(among=survivors) in ("d1", "d2"), what="a new scheduler")
    j = wait_for(
        lambda: (lambda j: j if j["reason"] == "ReqNodeNotAvail" else None)(show(d1, "ned", key, pinned)),
        what="the pinned job's reason after the failover",
    )
    assert j["state"] == "PENDING"
    assert next(m for m in status(d1)["members"] if m["name"] == "d2")["drained"]

    r = c.by_name("d2").admin("undrain", "d2")
    assert r.stdout.strip() == "d2 takes new work again"
    j = wait_job(d1, "ned", key, pinned, {"COMPLETED"})
    assert j["nodes"] == ["d2"]
    assert show(d1, "ned", key, running)["state"] == "RUNNING"
    assert d1.admin("undrain", "d2").stdout.strip() == "d2 was not drained"
