"""A cluster answers the same from its first second: while it forms, while the scheduler
role moves to a more capable member, while a member joins and after one is removed.

Three members (1, 2 and 3 simulated GPUs: a T4, then RTX 4090s) start together. From the moment a scheduler
is known, a tenant submits from every member in a loop: an impossible job (refused
every time, with the same reason), a valid one (accepted every time, run exactly
once), and ``mt-job list`` (every acknowledged job in it, states agreeing across
members). Midway a fourth, more capable member joins and takes the scheduler role;
later the least capable member is drained and removed.

``MTGPU_FORMATION_SECONDS`` sets how long the loop runs (30 s by default; the issue's
full check is 60).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from cluster_harness import join, status, wait_for

# Submissions from the first seconds of a cluster, with both mt-job clients.
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.mtjob_clients]

SECONDS = float(os.environ.get("MTGPU_FORMATION_SECONDS", "30"))
#: Lists are compared this far apart at least: a list begun this long after another
#: one ended never shows a job in an earlier state than that one did.
AGREE_WITHIN = 2.0
GRACE = 3
#: Only the members with RTX 4090s (m2 and m3) could take one member of it: the same
#: two before and after the fourth member (an H100) joins and the first (a T4) is
#: removed, so its reason is the same in every phase.
IMPOSSIBLE = "#!/bin/bash\n#MTGPU nodes=4 gpus=rtx4090:1 cpus=1 ram=10M\ntrue\n"
VALID = '#!/bin/bash\n#MTGPU cpus=1 ram=10M\necho "$MTGPU_JOB_ID" >> "$HOME/runs"\n'
ORDER = {"PENDING": 0, "RUNNING": 1, "COMPLETED": 2, "FAILED": 2, "CANCELLED": 2, "NODE_FAIL": 2}


class Tenant:
    """One member's submission loop, recording every answer with its time."""

    def __init__(self, host, user, key) -> None:
        self.host, self.user, self.key = host, user, key
        self.name = host.config["SERVER_NAME"]
        self.stop = threading.Event()
        self.refusals: list[tuple[int, str, float]] = []
        self.accepted: list[tuple[float, str]] = []  # (acknowledged at, job id)
        self.failures: list[str] = []
        self.lists: list[tuple[float, float, list[dict]]] = []  # (began, ended, jobs)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def ssh(self, cmd: str, script: str | None = None):
        return self.host.ssh(self.user, self.key, cmd, input=script.encode() if script else None, timeout=120)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                r = self.ssh("mt-job submit --parsable -", IMPOSSIBLE)
                # The verdict is the last line: a line before it says the client retried
                # (an election, say) with the submission's key.
                lines = r.stderr.decode().strip().splitlines() or [""]
                self.refusals.append((r.returncode, lines[-1], time.monotonic()))
                r = self.ssh("mt-job submit --parsable -", VALID)
                if r.returncode == 0:
                    self.accepted.append((time.monotonic(), r.stdout.decode().strip()))
                else:
                    self.failures.append(f"submit on {self.name}: {r.stderr.decode()}")
                began = time.monotonic()
                r = self.ssh("mt-job list --all --json")
                if r.returncode == 0:
                    self.lists.append((began, time.monotonic(), json.loads(r.stdout)))
                else:
                    self.failures.append(f"list on {self.name}: {r.stderr.decode()}")
            except subprocess.TimeoutExpired as exc:
                self.failures.append(f"{self.name}: {exc}")

    def start(self) -> Tenant:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(300)


def test_a_forming_cluster_answers_as_in_steady_state_through_join_hand_off_and_removal(cluster):
    specs = [(f"m{g}", g, {"CLUSTER_VOTER_GRACE": GRACE}) for g in (1, 2, 3)]
    specs[0][2]["SIMULATED_GPUS"] = [{"type": "t4", "count": 1, "vram": "16G"}]
    c = cluster(specs, settled=False)
    entry = c.hosts[0]
    # The first moment a scheduler is known: add the tenant on one member, and log in
    # on every member at once (no waiting for the replicas to apply it).
    wait_for(lambda: status(entry).get("scheduler"), what="a scheduler")
    key = entry.add_user("tina")
    for h in c.hosts:
        r = h.ssh("tina", key, "true")
        assert r.returncode == 0, (h.config["SERVER_NAME"], r.stderr)
    tenants = [Tenant(h, "tina", key).start() for h in c.hosts]
    time.sleep(SECONDS / 3)

    # A fourth member joins, more capable than any: it takes a vote, then the scheduler.
    m4 = join(
        c,
        "m4",
        1,
        CLUSTER_VOTER_GRACE=GRACE,
        SIMULATED_CPUS=400,
        SIMULATED_GPUS=[{"type": "h100", "count": 1, "vram": "80G"}],
    )
    r = m4.ssh("tina", key, "true")
    assert r.returncode == 0, r.stderr
    tenants.append(Tenant(m4, "tina", key).start())
    wait_for(lambda: c.scheduler() == "m4", timeout=120, what="the hand-off to m4")
    time.sleep(SECONDS / 3)

    # The least capable member is drained, its jobs end, and it is removed.
    tenants[0].finish()
    c.by_name("m2").admin("drain", "m1", "--reason", "leaving")

    def on_m1():
        r = entry.ssh("tina", key, "mt-job list --json")
        assert r.returncode == 0, f"mt-job list on m1 after its drain: {r.stderr.decode()}"
        return [j for j in json.loads(r.stdout) if "m1" in j["nodes"]]

    try:
        wait_for(lambda: not on_m1(), what="no job on m1")
    except AssertionError as exc:
        left = [(j["job_id"], j["state"], j["reason"]) for j in on_m1()]
        raise AssertionError((str(exc), f"jobs still on m1: {left}", [h.log() for h in c.hosts])) from None
    r = c.by_name("m2").admin("cluster", "remove", "m1")
    assert "removed m1" in r.stdout
    wait_for(
        lambda: all(m["name"] != "m1" for h in c.hosts[1:] for m in status(h)["members"]),
        what="m1 gone from every view",
    )
    time.sleep(SECONDS / 3)
    for t in tenants[1:]:
        t.finish()

    logs = "\n".join(h.log()[-3000:] for h in c.hosts)
    failures = [f for t in tenants for f in t.failures]
    assert not failures, (failures, logs)

    # The impossible job: refused every time, everywhere, with the same reason.
    refusals = [r for t in tenants for r in t.refusals]
    first = min(at for _, _, at in refusals)
    accepted = [round(at - first, 1) for code, _, at in refusals if code == 0]
    assert refusals and not accepted, f"impossible jobs accepted at {accepted} s"
    reasons = {why for _, why, _ in refusals}
    assert len(reasons) == 1, {
        why: round(min(at for _, w, at in refusals if w == why) - first, 1) for why in reasons
    }  # each reason, and when it was first given
    assert "only 2 member(s) could ever take one member of it" in reasons.pop()

    # The valid job: accepted every time, each once, and each run exactly once.
    acked = [(at, jid) for t in tenants for at, jid in t.accepted]
    ids = [jid for _, jid in acked]
    assert len(ids) == len(set(ids)) and len(ids) >= len(tenants)
    m2 = c.by_name("m2")

    def all_done():
        jobs = {j["job_id"]: j for j in json.loads(m2.ssh("tina", key, "mt-job list --all --json").stdout)}
        return jobs if all(jobs.get(i, {}).get("state") == "COMPLETED" for i in ids) else None

    try:
        jobs = wait_for(all_done, timeout=180, what="every accepted job completed")
    except AssertionError:
        got = json.loads(m2.ssh("tina", key, "mt-job list --all --json").stdout)
        raise AssertionError(
            [
                (j["job_id"], j["state"], j["reason"])
                for j in got
                if j["job_id"] in ids and j["state"] != "COMPLETED"
            ]
        ) from None
    assert not [j for j in jobs.values() if j["job_id"] not in ids], "a job nobody submitted"
    runs = []
    for h in c.hosts:
        f = h.homes / "tina" / "runs"
        if f.exists():
            runs += f.read_text().split()
    assert sorted(runs) == sorted(ids), "each accepted job runs exactly once"

    # Every list shows every job acknowledged before it began, and no list begun
    # AGREE_WITHIN after another ended shows a job in an earlier state.
    lists = [(b, e, {j["job_id"]: j["state"] for j in got}) for t in tenants for b, e, got in t.lists]
    assert lists
    for began, _, seen in lists:
        missing = [jid for at, jid in acked if at < began and jid not in seen]
        assert not missing, f"acknowledged but not listed: {missing}"
    for _, e1, s1 in lists:
        for b2, _, s2 in lists:
            if b2 < e1 + AGREE_WITHIN:
                continue
            behind = {j: (s1[j], s2.get(j)) for j in s1 if ORDER[s2.get(j, "PENDING")] < ORDER[s1[j]]}
            assert not behind, f"a later list shows earlier states: {behind}"


def test_a_user_added_on_one_member_logs_in_at_once_on_every_other(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 2, {})])
    for i in range(4):
        adder = c.hosts[i % 3]
        key = adder.add_user(f"ivy{i}")
        for h in c.hosts:
            if h is adder:
                continue
            r = h.ssh(f"ivy{i}", key, "true")  # at once: no retry, no wait
            assert r.returncode == 0, (i, h.config["SERVER_NAME"], r.stderr)
    # A key added to an existing user: the same, on the others.
    second = c.hosts[0].key("ivy0-second")
    c.hosts[0].admin("user", "key", "add", "ivy0", c.hosts[0].pubkey("ivy0-second"))
    for h in c.hosts[1:]:
        r = h.ssh("ivy0", second, "true")
        assert r.returncode == 0, (h.config["SERVER_NAME"], r.stderr)


def test_a_tenant_cannot_ask_for_the_log_index_or_force_catch_ups(cluster):
    c = cluster([("m1", 1, {}), ("m2", 1, {}), ("m3", 2, {})])
    key = c.hosts[0].add_user("mal")
    h = c.hosts[1]
    req = json.dumps({"op": "cluster.log_index", "args": {}, "id": 1}).encode() + b"\n"
    r = h.ssh("mal", key, "mtgpu-api", opts=["-s"], input=req)
    ans = json.loads(r.stdout.splitlines()[0])
    assert not ans["ok"] and ans["code"] == "forbidden", ans
    # Logins as users that do not exist, each making the member catch up before it
    # refuses, do not stop a real user from logging in, and are refused. They come from
    # an address of their own: twenty at once from the user's would meet
    # SSH_MAX_STARTUPS_PER_SOURCE (10) before any catch-up, as with OpenSSH.
    stranger = c.hosts[0].key("stranger")
    elsewhere = ["-b", c.net.second_source()]
    procs = [
        subprocess.Popen(
            h.ssh_argv(f"nobody{i}", stranger, "true", opts=elsewhere),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(20)
    ]
    r = h.ssh("mal", key, "true")
    assert r.returncode == 0, r.stderr
    assert all(p.wait(120) != 0 for p in procs)
