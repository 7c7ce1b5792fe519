"""Symlink and path tricks against what the daemon does with a tenant's files, and
resource abuse: fork bombs, jobs that ignore SIGTERM, floods of submissions and of
idle SSH connections."""

from __future__ import annotations

import hashlib
import json
import re
import resource
import socket
import time
from pathlib import Path

import asyncssh
import pytest
from figures import tally
from security_testing import api_socket, call, lines

pytestmark = pytest.mark.root


def _final(h, tenant, ids, timeout=60):
    deadline = time.time() + timeout
    with api_socket(h.run_dir, tenant.uid) as s:
        while True:
            views = {j: call(s, "job.show", {"job_id": j})["result"] for j in ids}
            if all(v["state"] not in ("PENDING", "RUNNING") for v in views.values()):
                return views
            if time.time() > deadline:
                raise AssertionError(f"jobs did not end: {views}")
            time.sleep(0.2)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_job_paths_never_lead_the_daemon_into_files_it_must_not_touch(arena):
    """Output files, the default output directory ~/.mtgpu and the working directory
    pointed (directly, through links, or by swapping a link in while jobs start) at
    /etc/shadow, root's home and another tenant's home."""
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    shadow = h.etc / "shadow"  # the daemon's /etc in its mount namespace
    before = _digest(shadow), shadow.stat().st_mode
    r = h.ssh("alice", alice.key, "echo mine > ~/victim.txt && chmod 600 ~/victim.txt && echo ok")
    assert r.stdout.strip() == b"ok"
    home = mal.home
    r = h.ssh(
        "mallory",
        mal.key,
        f"""
        ln -sf /etc/shadow ~/shadow-link && ln -sf {alice.home}/victim.txt ~/alice-link &&
        mkdir -p ~/swap && rm -rf ~/.mtgpu && ln -s /etc ~/.mtgpu && echo ok""",
    )
    assert r.stdout.strip() == b"ok", r.stderr
    body = "#!/bin/sh\necho written-by-mallory\n"
    attempts = {
        "output=/etc/shadow": {"script": body, "overrides": {"output": "/etc/shadow"}},
        "output link to /etc/shadow": {"script": body, "overrides": {"output": f"{home}/shadow-link"}},
        "output link to another home": {"script": body, "overrides": {"output": f"{home}/alice-link"}},
        "error=another home": {"script": body, "overrides": {"error": f"{alice.home}/victim.txt"}},
        "~/.mtgpu linked to /etc": {"script": body},
        "workdir=/root": {"script": body, "workdir": "/root"},
        "workdir=another home": {"script": body, "workdir": str(alice.home)},
        "output in a swapped link": {"script": body, "overrides": {"output": f"{home}/swap/out"}},
    }
    # Swap ~/swap/out between a file and a link to /etc/shadow while the jobs start.
    swapper = h.ssh_argv(
        "mallory",
        mal.key,
        "for i in $(seq 4000); do ln -sfn /etc/shadow ~/swap/out; rm -f ~/swap/out; : > ~/swap/out; done",
    )
    import subprocess

    swap = subprocess.Popen(swapper, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ids = {}
    try:
        with api_socket(h.run_dir, mal.uid) as s:
            for what, args in attempts.items():
                a = call(s, "job.submit", args)
                assert a["ok"], (what, a)
                ids[what] = a["result"]["job_id"]
            for i in range(6):  # more starts while the swapper runs
                a = call(s, "job.submit", attempts["output in a swapped link"])
                ids[f"swap {i}"] = a["result"]["job_id"]
        views = _final(h, mal, list(ids.values()))
    finally:
        swap.kill()
        swap.wait()
        h.ssh("mallory", mal.key, "rm -f ~/.mtgpu")
    assert (_digest(shadow), shadow.stat().st_mode) == before
    assert (alice.home / "victim.txt").read_text() == "mine\n"
    assert not (h.etc / "jobs").exists()
    # Each job that could not open its files failed, saying which path and why.
    for what in (
        "output=/etc/shadow",
        "output link to /etc/shadow",
        "output link to another home",
        "error=another home",
        "workdir=/root",
        "workdir=another home",
    ):
        v = views[ids[what]]
        assert v["state"] == "FAILED" and (
            "Permission denied" in v["reason"] or "Not a directory" in v["reason"]
        ), (what, v)
    tally("attacks_refused", len(ids))


def test_quota_scans_do_not_follow_links_out_of_the_home(arena):
    h, mal = arena["host"], arena["mallory"]
    r = h.ssh(
        "mallory",
        mal.key,
        "ln -sfn /usr ~/usr-link && ln -sfn / ~/root-link && mkdir -p ~/d && ln -sfn /var ~/d/var && echo ok",
    )
    assert r.stdout.strip() == b"ok"
    with api_socket(h.run_dir, 0) as s:
        a = call(s, "usage", {"refresh": True})
    assert a["ok"], a
    text = json.dumps(a["result"])
    assert "mallory" in text, text
    mine = next(t for t in a["result"]["tenants"] if t["user"] == "mallory")
    assert mine["used"] < 16 << 20, mine  # /usr alone is hundreds of MiB
    tally("attacks_refused", 3)


def test_fork_bomb_is_bounded_by_the_pids_limit(arena):
    h, mal = arena["host"], arena["mallory"]
    script = """#!/usr/bin/python3
#MTGPU cpus=1 time=2m
import os, signal
n = 0
try:
    for _ in range(20000):
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "60"])  # small: the limit, not memory, stops it
        n += 1
except OSError as e:
    print("forked", n, "then", e.strerror, flush=True)
else:
    print("forked", n, "without refusal", flush=True)
os.killpg(0, signal.SIGKILL)
"""
    with api_socket(h.run_dir, mal.uid) as s:
        jid = call(s, "job.submit", {"script": script})["result"]["job_id"]
    v = _final(h, mal, [jid], timeout=120)[jid]
    out = open(v["stdout"]).read()
    assert "forked" in out and "without refusal" not in out, (out, v["state"], v["reason"])
    assert int(out.split()[1]) < 20000
    tally("attacks_refused")


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(arena):
    h, mal = arena["host"], arena["mallory"]
    script = "#!/bin/sh\ntrap '' TERM\necho $$ > ~/stubborn.pid\nwhile :; do sleep 1; done\n"
    with api_socket(h.run_dir, mal.uid) as s:
        jid = call(s, "job.submit", {"script": script})["result"]["job_id"]
        deadline = time.time() + 60
        while not (mal.home / "stubborn.pid").exists():  # its trap is set
            assert time.time() < deadline
            time.sleep(0.1)
        assert call(s, "job.cancel", {"job_ids": [jid]})["ok"]
    v = _final(h, mal, [jid])[jid]
    assert v["state"] == "CANCELLED", v
    pid = int((mal.home / "stubborn.pid").read_text())
    assert not Path(f"/proc/{pid}").exists()
    tally("attacks_refused")


def test_a_flood_of_submissions_meets_the_rate_and_queue_limits(arena):
    """Thousands of submissions on one connection: past USER_SUBMIT_BURST they are
    refused with the limit's name; another tenant still submits; an array past
    USER_MAX_QUEUED_JOBS is refused whole."""
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]
    script = "#!/bin/sh\n#MTGPU cpus=2 time=1\ntrue\n"
    with api_socket(h.run_dir, mal.uid) as s:
        answers = lines(s, [{"op": "job.submit", "args": {"script": script}, "id": i} for i in range(2000)])
        ok = [a for a in answers if a["ok"]]
        refused = [a for a in answers if not a["ok"]]
        big = call(s, "job.submit", {"script": "#!/bin/sh\n#MTGPU array=0-99\ntrue\n"})
        with api_socket(h.run_dir, 0) as root:
            root_cancel = call(root, "job.cancel", {"job_ids": [a["result"]["job_id"] for a in ok]})
    assert 0 < len(ok) <= 45, len(ok)  # the burst of 40 (plus what the rate refilled)
    assert {a["code"] for a in refused} == {"rate_limited"}, {a["code"] for a in refused}
    assert "USER_SUBMIT_RATE" in refused[0]["error"] and "retry" in refused[0]["error"]
    assert not big["ok"] and big["code"] in ("queue_full", "rate_limited"), big
    assert root_cancel["ok"], root_cancel
    with api_socket(h.run_dir, alice.uid) as s:
        a = call(s, "job.submit", {"script": "#!/bin/sh\ntrue\n"})
    assert a["ok"], a
    tally("attacks_refused", 2)
    tally("flood_requests_refused", len(refused) + 1)


def test_pending_jobs_past_the_queue_limit_are_refused(arena):
    h, mal = arena["host"], arena["mallory"]
    with api_socket(h.run_dir, mal.uid) as s:
        # Impossible to place now (all CPUs), so they stay pending.
        hold = "#!/bin/sh\n#MTGPU cpus=2 array=0-49\ntrue\n"
        first = call(s, "job.submit", {"script": hold})
        if not first["ok"] and first["code"] == "rate_limited":
            time.sleep(1.5)
            first = call(s, "job.submit", {"script": hold})
        second = call(s, "job.submit", {"script": hold})
        if not second["ok"] and second["code"] == "rate_limited":
            # The flood test before this one may have left the burst empty: the queue
            # limit is what this test asks about.
            time.sleep(1.5)
            second = call(s, "job.submit", {"script": hold})
        with api_socket(h.run_dir, 0) as root:
            if first["ok"]:
                call(root, "job.cancel", {"job_ids": [first["result"]["job_id"]]})
    assert first["ok"], first
    assert not second["ok"] and second["code"] == "queue_full", second
    assert "USER_MAX_QUEUED_JOBS" in second["error"]
    tally("attacks_refused")


async def _hold_idle(h, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((h.address, h.port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def test_a_thousand_idle_connections_leave_logged_in_tenants_working(arena):
    """Past SSH_MAX_STARTUPS unauthenticated connections are dropped at once; a tenant
    already logged in keeps working, and logins come back when the flood goes."""
    h, alice = arena["host"], arena["alice"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))

    async def run():
        async with asyncssh.connect(
            h.address, h.port, username="alice", client_keys=[str(alice.key)], known_hosts=None
        ) as conn:
            socks = await _hold_idle(h, 1000)
            await asyncio_sleep(1)
            r = await conn.run("echo still-here", timeout=30)
            for s in socks:
                s.close()
            return r.stdout.strip()

    from asyncio import run as arun
    from asyncio import sleep as asyncio_sleep

    try:
        assert arun(run()) == "still-here"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "SSH_MAX_STARTUPS" in h.log() or "refusing" in h.log()
    # Logins come back, and stay back: the kernel still holds connections of the
    # flood that the daemon accepts (and counts as unauthenticated until it reads
    # their end) for a moment after the client closed them, so one login getting
    # through is not the end of it; ten in a row is.
    deadline = time.time() + 60
    streak = 0
    while streak < 10:
        assert time.time() < deadline, "logins did not come back"
        if h.ssh("alice", alice.key, "true").returncode == 0:
            streak += 1
        else:
            streak = 0
            time.sleep(0.3)
    assert h.proc.poll() is None
    tally("attacks_refused")
    tally("flood_requests_refused", 1000 - 20)


def test_exclusive_takes_no_member_from_another_tenant_and_meets_the_queue_limit(arena):
    """--exclusive gives mallory nothing another job would not get: an array of
    whole-member tasks past USER_MAX_QUEUED_JOBS is refused whole, and a whole-member
    job waits while alice's job runs on the member (it never takes it from her)."""
    h, alice, mal = arena["host"], arena["alice"], arena["mallory"]

    def submit(s, script):
        r = call(s, "job.submit", {"script": script})
        if not r["ok"] and r["code"] == "rate_limited":  # earlier floods emptied the burst
            time.sleep(1.5)
            r = call(s, "job.submit", {"script": script})
        return r

    def show(tenant, jid):
        with api_socket(h.run_dir, tenant.uid) as s:
            return call(s, "job.show", {"job_id": jid})["result"]

    def until(what, pred, timeout=60):
        deadline = time.time() + timeout
        while not (got := pred()):
            assert time.time() < deadline, f"timed out waiting for {what}"
            time.sleep(0.3)
        return got

    with api_socket(h.run_dir, alice.uid) as s:
        held = submit(s, "#!/bin/sh\n#MTGPU ram=64M\nsleep 300\n")
    assert held["ok"], held
    hid = held["result"]["job_id"]
    until("alice's job to run", lambda: show(alice, hid)["state"] == "RUNNING")
    with api_socket(h.run_dir, mal.uid) as s:
        big = submit(s, "#!/bin/sh\n#SBATCH --exclusive --array=0-60\ntrue\n")
        one = submit(s, "#!/bin/sh\n#SBATCH --exclusive\n#MTGPU ram=64M\nsleep 300\n")
    try:
        assert not big["ok"] and big["code"] == "queue_full", big
        assert "USER_MAX_QUEUED_JOBS" in big["error"]
        assert one["ok"], one
        mid = one["result"]["job_id"]
        v = until(
            "mallory's reason",
            lambda: (
                (v := show(mal, mid))["state"] == "PENDING"
                and "run other jobs" in (v.get("reason_detail") or "")
                and v
            ),
        )
        assert v["exclusive"] is True
        assert show(alice, hid)["state"] == "RUNNING"
        # The reason never names alice's job: "another tenant's job" (Slurm's
        # PrivateData=jobs); alice's own view of a reason names her own jobs.
        assert not re.search(rf"\bjobs? [^ ]*\b{hid}\b", v["reason_detail"]), v["reason_detail"]
    finally:
        with api_socket(h.run_dir, 0) as root:
            ids = [hid] + ([one["result"]["job_id"]] if one.get("ok") else [])
            call(root, "job.cancel", {"job_ids": ids})
    tally("attacks_refused")
