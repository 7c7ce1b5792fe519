"""Administration with real daemons: two small clusters (two standalone hosts with their
own CLUSTER_IDs) managed by one admin account through mtcode-admin over OpenSSH, grants
enforced at login, one UID everywhere, and mtgpu-admin's commands on a host (drain
--now, cancel with a reason, the audit log, --json on every command)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mtgpu_testing import Host, python_env

pytestmark = pytest.mark.root


class Pair:
    """Clusters alpha and beta (one host each), one admin account "boss" on both, and
    mtcode-admin's files (its list of clusters and an ssh configuration) for boss."""

    def __init__(self) -> None:
        self.alpha = Host({"CLUSTER_ID": "alpha", "SIMULATED_CPUS": 4}, name="a1")
        # One UID range for both (as one site's clusters would share), so a UID given
        # out on one can clash with a user created on the other alone.
        self.beta = Host(
            {
                "CLUSTER_ID": "beta",
                "SIMULATED_CPUS": 4,
                "TENANT_UID_RANGE": self.alpha.config["TENANT_UID_RANGE"],
            },
            name="b1",
        )
        self.beta.write_config()
        self.dir = self.alpha.dir / "mtcode"
        self.dir.mkdir()
        self.clusters = self.dir / "clusters.yaml"
        self.ssh_config = self.dir / "ssh_config"

    def start(self) -> None:
        starting = threading.Thread(target=self.beta.start)
        starting.start()
        self.alpha.start()
        starting.join()
        if self.beta.proc is None or not (self.beta.run_dir / "mtgpu.pid").exists():
            self.beta.start()  # raises with its log
        key = self.alpha.key("boss")
        for h in (self.alpha, self.beta):
            h.admin("user", "add", "boss", "--admin", "--key", self.alpha.pubkey("boss"))
        self.ssh_config.write_text(
            f"Host *\n  User boss\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        self.clusters.write_text(f"ssh_config: {self.ssh_config}\n")

    def mtcode(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "mtgpu.cli.code_admin", "--clusters", str(self.clusters), *args],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"mtcode-admin {' '.join(args)} failed: {proc.stderr}")
        return proc

    def cleanup(self) -> None:
        self.alpha.cleanup()
        self.beta.cleanup()


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    try:
        p.start()
        p.mtcode("cluster", "add", "alpha", f"127.0.0.1:{p.alpha.port}")
        p.mtcode("cluster", "add", "beta", f"127.0.0.1:{p.beta.port}")
        yield p
    finally:
        p.cleanup()


def submit(host: Host, user: str, key: Path, script: str) -> str:
    r = host.ssh(user, key, "mt-job", "submit", "--parsable", "-", input=script.encode())
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def wait_job(host: Host, jid: str, pred, what: str, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while True:
        j = next(
            (j for j in json.loads(host.admin("jobs", "--all", "--json").stdout) if j["job_id"] == jid), None
        )
        if j is not None and pred(j):
            return j
        if time.time() > deadline:
            raise AssertionError(f"job {jid}: timed out waiting for {what}: {j}")
        time.sleep(0.2)


def test_cluster_list_and_a_wrong_name_is_refused(pair):
    listed = json.loads(pair.mtcode("cluster", "list", "--json").stdout)
    assert [(c["name"], c["reachable"], c["admin_as"]) for c in listed] == [
        ("alpha", True, "boss"),
        ("beta", True, "boss"),
    ]
    r = pair.mtcode("cluster", "add", "gamma", f"127.0.0.1:{pair.beta.port}", check=False)
    assert r.returncode == 1
    assert "is a member of cluster 'beta', not 'gamma'" in r.stderr
    assert "gamma" not in pair.clusters.read_text()


def test_grants_decide_which_clusters_a_user_logs_in_to_with_one_uid(pair):
    a, b = pair.alpha, pair.beta
    key = a.key("alice")
    r = pair.mtcode("grant", "alice", "alpha", "--key", a.pubkey("alice"), "--json")
    uid = json.loads(r.stdout)["uid"]
    assert json.loads(r.stdout)["carried_to"] == ["beta"]

    # Granted alpha only: in to alpha; refused on beta, with the reason and the remedy.
    assert a.ssh("alice", key, "id -u").stdout.decode().strip() == str(uid)
    refused = b.ssh("alice", key, "id -u")
    assert refused.returncode == 1
    assert (
        b"alice is not granted the cluster 'beta'" in refused.stderr
        and b"mtcode-admin grant alice beta" in refused.stderr
    ), refused.stderr
    assert b.passwd("alice") is None  # no account was made for a refused login

    # Granted beta too: in to both, with the same UID, each with its own queue.
    pair.mtcode("grant", "alice", "beta")
    assert b.ssh("alice", key, "id -u").stdout.decode().strip() == str(uid)
    job = "#!/bin/bash\n#MTGPU cpus=1 ram=10M name={}\ntrue\n"
    submit(a, "alice", key, job.format("on-alpha"))
    submit(b, "alice", key, job.format("on-beta"))
    for host, name in ((a, "on-alpha"), (b, "on-beta")):
        r = host.ssh("alice", key, "mt-job list --all --json")
        assert [j["name"] for j in json.loads(r.stdout)] == [name]
    shown = json.loads(pair.mtcode("user", "show", "alice", "--json").stdout)
    assert shown["uid"] == uid and shown["granted"] == ["alpha", "beta"]
    assert {c: r["uid"] for c, r in shown["clusters"].items()} == {"alpha": uid, "beta": uid}

    # Revoking takes effect at once, without a restart: the login and the queue.
    assert json.loads(pair.mtcode("revoke", "alice", "alpha", "--json").stdout)["changed"]
    refused = a.ssh("alice", key, "mt-job list --json")
    assert refused.returncode == 1 and b"not granted the cluster 'alpha'" in refused.stderr
    as_alice = a.in_ns(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-m",
            "mtgpu.cli.job",
            "--config",
            str(a.config_path),
            "list",
        ],
        env=python_env(),
        timeout=30,
    )
    assert as_alice.returncode != 0 and "not granted the cluster 'alpha'" in as_alice.stderr
    assert b.ssh("alice", key, "id -u").returncode == 0
    assert "alpha" in pair.mtcode("user", "show", "alice").stdout

    # Each cluster's audit log names the admin and the action; boss reads it over ssh.
    r = a.ssh("boss", a.key("boss"), "mtgpu-admin audit --json")
    entries = [(e["actor"], e["action"], e["args"].get("name"), e["ok"]) for e in json.loads(r.stdout)]
    assert ("boss", "user.add", "alice", True) in entries
    assert ("boss", "user.revoke", "alice", True) in entries


def test_a_uid_that_clashes_on_a_cluster_is_refused_loudly(pair):
    a, b = pair.alpha, pair.beta
    # bob exists on beta only, so beta gave out the next UID of the range, which alpha
    # then gives carol: beta cannot take carol's record.
    b.add_user("bob")
    r = pair.mtcode("grant", "carol", "alpha", "--key", a.pubkey("carol"), "--json")
    carol = json.loads(r.stdout)["uid"]
    bob = json.loads(b.admin("user", "show", "bob", "--json").stdout)["uid"]
    assert carol == bob
    assert f"cluster beta refuses UID {carol} for 'carol'" in r.stderr
    refused = pair.mtcode("grant", "carol", "beta", check=False)
    assert refused.returncode == 1
    assert (
        f"cluster beta refuses UID {carol} for 'carol': UID {carol} belongs to the user "
        "'bob' here" in refused.stderr
    ), refused.stderr
    users = {u["name"]: u for u in json.loads(b.admin("user", "list", "--json").stdout)}
    assert "carol" not in users and users["bob"]["uid"] == bob


def test_drain_now_requeues_or_cancels_with_the_reason(pair):
    a = pair.alpha
    key = a.add_user("dora")
    sleeper = "#!/bin/bash\n#MTGPU cpus=1 ram=10M{}\nsleep 300\n"
    again = submit(a, "dora", key, sleeper.format(" requeue=yes"))
    once = submit(a, "dora", key, sleeper.format(""))
    for jid in (again, once):
        wait_job(a, jid, lambda j: j["state"] == "RUNNING", "RUNNING")
    try:
        r = a.admin("drain", "a1", "--now", "--reason", "fan")
        assert r.stdout.strip() == f"a1 is drained: it takes no new work; requeued {again}; cancelled {once}"
        j = wait_job(a, once, lambda j: j["state"] == "CANCELLED", "CANCELLED")
        assert j["reason"].startswith("cancelled by root: a1 was drained now by root: fan;")
        j = wait_job(a, again, lambda j: j["state"] == "PENDING", "PENDING")
        assert j["requeues"] == 1
        assert j["requeue_reason"] == "requeued: a1 was drained now by root: fan"
        assert j["reason"] == "ReqNodeNotAvail"  # it waits for the drained host
        r = a.admin("cancel", again, "--reason", "not needed after all", "--json")
        assert json.loads(r.stdout)["cancelled"] == [again]
        j = wait_job(a, again, lambda j: j["state"] == "CANCELLED", "CANCELLED")
        assert j["reason"] == "cancelled by root: not needed after all"  # it was pending
    finally:
        a.admin("undrain", "a1")
    audit = json.loads(a.admin("audit", "--action", "node", "--json").stdout)
    assert [(e["action"], e["args"]) for e in audit[-2:]] == [
        ("node.drain", {"node": "a1", "now": True, "reason": "fan"}),
        ("node.undrain", {"node": "a1"}),
    ]


def test_an_admin_holds_and_releases_any_tenants_pending_job(pair):
    a = pair.alpha
    key = a.add_user("hal")
    first = submit(a, "hal", key, "#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 300\n")
    after = submit(
        a, "hal", key, f"#!/bin/bash\n#SBATCH --dependency=afterok:{first}\n#MTGPU cpus=1 ram=10M\ntrue\n"
    )
    try:
        wait_job(a, first, lambda j: j["state"] == "RUNNING", "RUNNING")
        assert a.admin("hold", after).stdout.strip() == f"Held job {after}"
        assert wait_job(a, after, lambda j: j["state"] == "PENDING", "PENDING").get("held") is True
        r = a.admin("release", after, first, check=False)
        assert r.returncode == 1 and r.stdout.strip() == f"Released job {after}", r.stdout + r.stderr
        assert f"mtgpu-admin: job {first} is no longer pending" in r.stderr
        assert not wait_job(a, after, lambda j: True, "listed").get("held")
    finally:
        a.admin("cancel", first, after)
    audit = json.loads(a.admin("audit", "--action", "job", "--json").stdout)
    assert ("job.hold", {"job_ids": [after]}) in [(e["action"], e["args"]) for e in audit]


def admin_here(host: Host, capsys, *argv: str) -> str:
    """mtgpu-admin run in this process (as root), like the CLI tests; returns stdout."""
    from mtgpu.cli import admin

    assert admin.main(["--config", str(host.config_path), *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_every_admin_command_answers_json(pair, capsys):
    b = pair.beta
    pub = b.pubkey("erin")
    other = b.pubkey("erin2")
    commands = [
        ("user", "add", "erin", "--key", pub),
        ("user", "list"),
        ("user", "show", "erin"),
        ("user", "key", "add", "erin", other),
        ("user", "key", "remove", "erin", other),
        ("invite", "frank"),
        ("whoami",),
        ("nodes",),
        ("jobs", "--all"),
        ("jobs", "--state", "completed"),
        ("drain", "b1"),
        ("undrain", "b1"),
        ("cluster", "status"),
        ("logs", "-n", "3"),
        ("audit", "-n", "5"),
        ("user", "remove", "erin"),
    ]
    for argv in commands:
        json.loads(admin_here(b, capsys, *argv, "--json"))  # parses
    assert json.loads(admin_here(b, capsys, "cluster", "status", "--json"))["cluster_id"] == "beta"
    lines = json.loads(admin_here(b, capsys, "logs", "-n", "500", "--json"))["lines"]
    assert any("serving SSH" in ln["message"] for ln in lines)
    actions = [e["action"] for e in json.loads(admin_here(b, capsys, "audit", "-n", "0", "--json"))]
    for op in (
        "user.add",
        "user.key.add",
        "user.key.remove",
        "invite",
        "node.drain",
        "node.undrain",
        "user.remove",
    ):
        assert op in actions
    assert "user.list" not in actions and "audit" not in actions  # reads are not actions
    for argv in (("user", "list"), ("audit",), ("cluster", "status"), ("jobs", "--all")):
        assert admin_here(b, capsys, *argv).strip()  # readable tables too


def test_an_admin_requeues_a_running_job_and_updates_a_pending_ones_limit_and_priority(pair):
    """``mtgpu-admin requeue`` puts any tenant's running job back in the queue (it runs
    again, attempt 2); ``update`` changes a pending job's time limit and priority and
    refuses a running one's; a tenant cannot use either; both are audited."""
    a = pair.alpha
    key = a.add_user("rhea")
    running = submit(a, "rhea", key, "#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 300\n")
    waiting = submit(
        a,
        "rhea",
        key,
        f"#!/bin/bash\n#SBATCH --dependency=afterok:{running} -t 10\n#MTGPU cpus=1 ram=10M\ntrue\n",
    )
    try:
        wait_job(a, running, lambda j: j["state"] == "RUNNING", "RUNNING")
        r = a.admin("update", waiting, "--time-limit", "2:00:00", "--priority", "90")
        assert r.stdout.strip() == f"Updated job {waiting}", r.stdout + r.stderr
        j = wait_job(a, waiting, lambda j: j["state"] == "PENDING", "PENDING")
        assert (j["time_limit"], j["priority"]) == (7200, 90), j
        r = a.admin("update", running, "--priority", "10", check=False)
        assert r.returncode == 1 and f"mtgpu-admin: job {running} is no longer pending" in r.stderr
        r = a.admin("update", waiting, "--priority", "101", check=False)
        assert r.returncode != 0 and "0 to 100" in r.stderr, r.stderr
        refused = a.ssh("rhea", key, "mtgpu-admin", "requeue", running)
        assert refused.returncode != 0 and b"admin" in refused.stderr, refused.stderr
        r = a.admin("requeue", running, "--reason", "moving it")
        assert r.stdout.strip() == f"Requeued job {running}", r.stdout + r.stderr
        j = wait_job(
            a, running, lambda j: j["state"] == "RUNNING" and j["requeues"] == 1, "its second run", 60
        )
        assert j["requeue_reason"] == "requeued by root: moving it", j
        r = a.admin("requeue", waiting, check=False)
        assert r.returncode == 1 and f"mtgpu-admin: job {waiting} is not running" in r.stderr
    finally:
        a.admin("cancel", running, waiting)
    audit = [
        (e["action"], e["args"]) for e in json.loads(a.admin("audit", "--action", "job", "--json").stdout)
    ]
    assert ("job.update", {"job_ids": [waiting], "time_limit": "2:00:00", "priority": 90}) in audit, audit
    assert ("job.requeue", {"job_ids": [running], "reason": "moving it"}) in audit, audit


def test_an_admins_new_priority_moves_a_pending_job_in_the_queue(pair):
    """Two jobs wait behind one holding every CPU; raising the second's priority with
    ``mtgpu-admin update`` puts it first in line (the queue takes the job again at
    its new priority)."""
    a = pair.alpha
    key = a.add_user("pia")
    full = submit(a, "pia", key, "#!/bin/bash\n#MTGPU cpus=4 ram=10M\nsleep 300\n")
    wait_job(a, full, lambda j: j["state"] == "RUNNING", "RUNNING")
    first, second = (submit(a, "pia", key, "#!/bin/bash\n#MTGPU cpus=1 ram=10M\ntrue\n") for _ in range(2))
    try:
        wait_job(a, second, lambda j: j.get("position") == 2, "second in line")
        a.admin("update", second, "--priority", "90")
        wait_job(a, second, lambda j: j.get("position") == 1, "first in line after the update")
        assert wait_job(a, first, lambda j: True, "listed").get("position") == 2
    finally:
        a.admin("cancel", full, first, second)
