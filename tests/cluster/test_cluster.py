"""Real members in network namespaces of their own, each with its own /etc: forming,
electing the most capable scheduler, accounts across members, failover, restarts."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
from cluster_harness import _config, status, wait_for
from mtgpu_testing import Host

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_most_capable_member_becomes_scheduler_even_if_started_last(cluster):
    # a-small starts first (and founds: it has the smallest name); big is most capable.
    c = cluster([("a-small", 0, {}), ("mid", 1, {}), ("big", 4, {})], start_order=[0, 1, 2], stagger=1.0)
    # The founder hands the role to the most capable caught-up voter within seconds.
    wait_for(lambda: c.scheduler() == "big", timeout=30, what="big to become the scheduler")
    st = status(c.by_name("a-small"))
    roles = {m["name"]: m["role"] for m in st["members"]}
    assert roles == {"a-small": "voter", "mid": "voter", "big": "scheduler"}
    assert all(m["state"] == "up" for m in st["members"])
    assert st["cluster_id"] == "lab" and st["term"] >= 1


def test_user_added_on_one_member_logs_in_on_another_with_same_uid(cluster, tmp_path, monkeypatch):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 2, {})])
    k = c.hosts[0].add_user("uma")
    uids = set()
    for h in c.hosts:

        def login(h=h):
            r = h.ssh("uma", k, "id -u")
            return r if r.returncode == 0 else None

        r = wait_for(login, what="login on every member")
        uids.add(r.stdout.strip())
        assert h.passwd("uma") is not None  # created on that member's own /etc
    # Any member tells a tenant every member and its SSH address (remotegpu-cli's discovery).
    want = {h.config["SERVER_NAME"]: f"{h.address}:{h.port}" for h in c.hosts}
    req = json.dumps({"op": "cluster.members", "args": {}, "id": 1}).encode() + b"\n"

    def members():
        r = c.hosts[1].ssh("uma", k, "mtgpu-api", opts=["-s"], input=req)
        ans = json.loads(r.stdout.splitlines()[0])
        assert ans["ok"] and ans["result"]["cluster_id"] == "lab", ans
        got = {m["name"]: m["address"] for m in ans["result"]["members"]}
        return got if got == want else None

    wait_for(members, what=f"members {want}")

    # remotegpu-cli, told of one member, finds and reaches the others as the same user.
    import asyncio

    from mtgpu.tui.fleet import Fleet
    from mtgpu.tui.sources import ServerList, Target

    scans = [
        subprocess.run(
            ["ssh-keyscan", "-p", str(h.port), h.address], capture_output=True, text=True, timeout=30
        ).stdout
        for h in c.hosts
    ]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text("".join(scans))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    first = c.hosts[0]
    fleet = Fleet(
        ServerList((Target("first", first.address, first.port, "uma", str(k)),), ssh_config=False), timeout=5
    )
    found = asyncio.run(fleet.once())
    assert {(s.server, s.status, s.target.source, s.user) for s in found} == {
        ("m1", "up", "list", "uma"),
        ("m2", "up", "cluster", "uma"),
        ("m3", "up", "cluster", "uma"),
    }
    assert {s.cluster_id for s in found} == {"lab"}
    assert len(uids) == 1
    # The audit entry written through m1 is read on m3, from its own replica.
    entry = wait_for(
        lambda: next(
            (e for e in json.loads(c.hosts[2].admin("audit", "--json").stdout) if e["action"] == "user.add"),
            None,
        ),
        what="the audit entry",
    )
    assert (entry["actor"], entry["member"], entry["args"]["name"], entry["ok"]) == (
        "root",
        "m1",
        "uma",
        True,
    )
    # And m1 shows m3's own log, asked over the peer channel.
    logs = json.loads(c.hosts[0].admin("logs", "--node", "m3", "-n", "2000", "--json").stdout)
    assert logs["node"] == "m3"
    assert any("serving SSH" in ln["message"] and "as m3" in ln["message"] for ln in logs["lines"])


def test_wrong_key_member_is_refused(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 1, {})])
    bad = c.net.add(Host(_config(1, CLUSTER_KEY="a-different-cluster-key-0000"), name="intruder"))
    bad.config["TENANT_UID_RANGE"] = c.hosts[0].config["TENANT_UID_RANGE"]
    bad.config["CLUSTER_PEERS"] = [f"{h.address}:{h.port}" for h in c.hosts]
    bad.write_config()
    c.hosts.append(bad)  # cleaned up with the others
    with pytest.raises(RuntimeError):
        bad.start(timeout=8)  # it never finds a cluster that accepts it
    time.sleep(1)
    assert all(len(status(h)["members"]) == 3 for h in c.hosts[:3])
    assert "is not of this cluster" in bad.log()


def _submit(host, key, user, n_jobs, out, errors=None):
    """Submit through mt-job on one member, one CLI call each; collect acknowledged ids."""
    script = "#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 600\n"
    for _ in range(n_jobs):
        try:
            r = host.ssh(user, key, "mt-job submit --parsable -", input=script.encode(), timeout=90)
        except subprocess.TimeoutExpired:
            if errors is not None:
                errors.append("timeout")
            continue
        if r.returncode == 0:
            out.append(r.stdout.decode().strip())
        elif errors is not None:
            errors.append(r.stderr.decode())


@pytest.mark.mtjob_clients
def test_kill_scheduler_during_submissions_loses_no_acknowledged_job(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 2, {})])
    wait_for(lambda: c.scheduler() == "m3", timeout=30, what="m3 to become the scheduler")
    leader = "m3"
    entry = c.by_name("m1")
    key = entry.add_user("sam")
    wait_for(lambda: entry.ssh("sam", key, "true").returncode == 0, what="login")
    acked: list[str] = []
    errors: list[str] = []
    t = threading.Thread(target=_submit, args=(entry, key, "sam", 12, acked, errors))
    t.start()
    wait_for(lambda: len(acked) >= 4, what="some submissions")
    c.by_name(leader).stop(signal.SIGKILL)
    t.join()
    survivors = [h for h in c.hosts if h.config["SERVER_NAME"] != leader]
    new = c.scheduler(among=survivors)
    assert new in ("m1", "m2")
    r = entry.ssh("sam", key, "mt-job list --all --json")
    seen = {j["job_id"] for j in json.loads(r.stdout)}
    assert set(acked) <= seen, f"lost: {set(acked) - seen}"
    assert len(seen) == len(set(seen))
    assert not errors, (errors, [h.log()[-6000:] for h in c.hosts])  # retried through the election


def test_partitioned_old_leader_cannot_start_jobs(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 2, {})])
    old = c.by_name(c.scheduler())
    key = old.add_user("pat")
    wait_for(lambda: old.ssh("pat", key, "true").returncode == 0, what="login")
    c.net.cut(old)
    others = [h for h in c.hosts if h is not old]
    new = wait_for(
        lambda: (lambda s: s if s and s != old.config["SERVER_NAME"] else None)(c.scheduler(among=others)),
        what="a new scheduler",
    )
    assert new != old.config["SERVER_NAME"]
    # The old leader has no majority: its submission is not acknowledged, nothing starts.
    r = old.ssh(
        "pat",
        key,
        "mt-job submit --parsable -",
        input=b"#!/bin/bash\n#MTGPU cpus=1 ram=10M\ntouch /tmp/should-not-run-$$\n",
        timeout=90,
    )
    assert r.returncode != 0
    assert subprocess.run(["pgrep", "-u", old.passwd("pat")[2]], capture_output=True).returncode == 1
    c.net.heal(old)


def test_whole_cluster_restart_keeps_the_queue(cluster):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    entry = c.hosts[0]
    key = entry.add_user("quinn")
    wait_for(lambda: entry.ssh("quinn", key, "true").returncode == 0, what="login")
    # Asks for more CPUs than any member has free now: it waits in the queue.
    ids = []
    for _ in range(3):
        r = entry.ssh("quinn", key, "mt-job submit --parsable --cpus=8 -", input=b"#!/bin/bash\nsleep 300\n")
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.decode().strip())
    for h in c.hosts:
        h.stop(signal.SIGKILL)
    threads = [threading.Thread(target=h.start, kwargs={"timeout": 120}) for h in c.hosts]
    [t.start() for t in threads]
    [t.join() for t in threads]
    c.scheduler()
    r = wait_for(
        lambda: (lambda r: r if r.returncode == 0 else None)(
            entry.ssh("quinn", key, "mt-job list --all --json")
        ),
        what="the queue after restart",
    )
    seen = {j["job_id"] for j in json.loads(r.stdout)}
    assert set(ids) <= seen


def test_member_joins_running_cluster_and_one_is_removed(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 1, {})])
    new = c.net.add(Host(_config(1), name="m4"))
    new.config["TENANT_UID_RANGE"] = c.hosts[0].config["TENANT_UID_RANGE"]
    new.config["CLUSTER_PEERS"] = [f"{c.hosts[0].address}:{c.hosts[0].port}"]
    new.write_config()
    c.hosts.append(new)
    new.start(timeout=120)
    wait_for(
        lambda: any(m["name"] == "m4" for m in status(c.hosts[0]).get("members", [])),
        what="m4 in the member list",
    )
    roles = {m["name"]: m["role"] for m in status(new)["members"]}
    assert roles["m4"] == "read-only"  # K is 3 below five members
    r = c.hosts[0].admin("cluster", "remove", "m4")
    assert "removed m4" in r.stdout
    wait_for(lambda: all(m["name"] != "m4" for m in status(c.hosts[1])["members"]), what="m4 gone")


def test_member_behind_a_one_way_path_joins_read_only(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {})])
    assert status(c.hosts[0])["warning"]  # two voters cannot keep a majority through a failure
    natted = c.net.add(Host(_config(1), name="m3"))
    natted.config["TENANT_UID_RANGE"] = c.hosts[0].config["TENANT_UID_RANGE"]
    natted.config["CLUSTER_PEERS"] = [f"{h.address}:{h.port}" for h in c.hosts]
    natted.write_config()
    c.hosts.append(natted)
    # It can open connections to the others, but nothing can open one to it.
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            natted.netns,
            "iptables",
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            str(natted.port),
            "--syn",
            "-j",
            "DROP",
        ],
        check=True,
    )
    natted.start(timeout=120, wait_port=False)  # the harness cannot reach it either
    st = wait_for(
        lambda: (lambda s: s if any(m["name"] == "m3" for m in s.get("members", [])) else None)(
            status(c.hosts[0])
        ),
        what="m3 admitted",
    )
    roles = {m["name"]: m["role"] for m in st["members"]}
    assert roles["m3"] == "read-only"
    # Its replica follows the cluster over the connections it opened.
    c.hosts[0].add_user("replicated")
    wait_for(lambda: "replicated" in natted.admin("user", "list").stdout, what="replicated user")
