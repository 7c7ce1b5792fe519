"""A cluster left running for a year on one start: certificates, logins, jobs and
leases under a moved wall clock.

Each member's daemon runs with ``MTGPU_WALL_CLOCK_OFFSET_FILE`` (mtgpu.clock): its wall
clock, which it signs its host certificates with and asyncssh checks its peers' by,
is the real one plus the seconds in that file, moved while it runs. The monotonic
clock (timeouts, Raft) and CLOCK_BOOTTIME (leases) run on, as they do when NTP steps
the wall clock. A user's OpenSSH client runs under libfaketime at a member's offset
and trusts the cluster through the ``@cert-authority`` line ``cluster status``
prints, as the manual says.

Each step moves every member STEP days on; one member's clock is also stepped five
minutes ahead for a month, and five minutes behind for the next, as NTP corrects a
drifting host. After each step: every member's certificate covers its own now (it
renewed itself while running); a client at one member's time logs in to every member
(so a certificate signed on a clock five minutes off is taken by the others, as peers
dialing it take it); a job submitted through a member runs and completes; nothing was
re-elected and no member was lost. At the end the daemons are still the ones started,
and their state, logs and memory are within the bounds docs/SECURITY.md states.

The short form (CI) runs 96 simulated days; the full year is
``MTGPU_YEAR_DAYS=400 python -m pytest -q tests/cluster/test_a_year.py`` (about
eight minutes on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from mtgpu_testing import wait_for
from security_testing import api_socket, call

from mtgpu.cluster.identity import CERT_VALIDITY

pytestmark = pytest.mark.root

DAYS = int(os.environ.get("MTGPU_YEAR_DAYS", "96"))
STEP = 8  # simulated days a step: a certificate renewed at a third of 30 days left is never passed by
SKEW = 300  # NTP's correction of one member, in seconds
LIB = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
#: What a member may hold after the run (docs/SECURITY.md, "A year on one start").
STATE_BOUND = 64 << 20
LOG_BOUND = 64 << 20
RSS_BOUND = 400 << 20


def _du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_cluster_runs_a_year_on_one_start(cluster, tmp_path):
    if LIB is None:
        pytest.fail("the year test needs libfaketime: apt-get install faketime")
    names = ("m1", "m2", "m3")
    offsets = {n: tmp_path / f"{n}.offset" for n in names}
    for f in offsets.values():
        f.write_text("0")
    c = cluster(
        [(n, 1, {}) for n in names],
        member_env={n: {"MTGPU_WALL_CLOCK_OFFSET_FILE": str(offsets[n])} for n in names},
    )
    pids = {h.config["SERVER_NAME"]: h.proc.pid for h in c.hosts}
    leader = c.scheduler()
    term = c.hosts[0].api("cluster.status")["result"]["term"]
    first = c.hosts[0]
    key = first.add_user("yara")
    for h in c.hosts:  # the account, with one UID, on every member
        assert h.ssh("yara", key, "true").returncode == 0
    uid = int(first.passwd("yara")[2])
    kh = tmp_path / "known_hosts"
    kh.write_text(first.api("cluster.status")["result"]["known_hosts"] + "\n")

    def login(h, offset: float) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LD_PRELOAD": str(LIB), "FAKETIME": f"{offset:+.0f}"}
        argv = ["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}"]
        argv += ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"]
        argv += ["-p", str(h.port), "-i", str(key), f"yara@{h.address}", "echo ok"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    def cert(h) -> dict:
        return h.api("ssh.host_certificate")["result"]

    seen = []
    for day in range(STEP, DAYS + 1, STEP):
        month = day // 30
        skew = {"m3": SKEW if month % 2 else -SKEW} if month else {}
        for n, f in offsets.items():
            f.write_text(str(day * 86400 + skew.get(n, 0)))
        shifts = {n: day * 86400 + skew.get(n, 0) for n in names}
        # Each member renews its own certificate while it runs, before a third is left.
        for h in c.hosts:
            n = h.config["SERVER_NAME"]
            shift = shifts[n]

            def renewed(h=h, shift=shift):
                k, at = cert(h), time.time() + shift
                return k if k["valid_after"] <= at and k["valid_before"] - at > CERT_VALIDITY / 3 else None

            got = wait_for(renewed, 60, f"{n}'s certificate renewed by day {day}")
            assert not got["warning"], (day, n, got)
        # A user at each member's time logs in to every member through the one line.
        for at in names:
            for h in c.hosts:
                r = login(h, shifts[at])
                assert r.returncode == 0 and r.stdout.strip() == "ok", (
                    day,
                    at,
                    h.config["SERVER_NAME"],
                    r.stderr,
                )
        # A job submitted through one member (in turn) runs and completes.
        through = c.hosts[(day // STEP) % len(c.hosts)]
        with api_socket(through.run_dir, uid) as s:
            a = call(s, "job.submit", {"script": f"#!/bin/sh\n#MTGPU cpus=1 ram=16M\necho day {day}\n"})
        assert a["ok"], (day, a)
        jid = a["result"]["job_id"]

        def ended(jid=jid, through=through):
            with api_socket(through.run_dir, uid) as s:
                j = call(s, "job.show", {"job_id": jid})["result"]
            return j if j["state"] not in ("PENDING", "RUNNING") else None

        j = wait_for(ended, 90, f"day {day}'s job to end")
        assert j["state"] == "COMPLETED", (day, j)
        # Nothing was re-elected, nobody was lost and every member holds its lease.
        for h in c.hosts:
            st = h.api("cluster.status")["result"]
            assert (st["scheduler"], st["term"]) == (leader, term), (day, h.config["SERVER_NAME"], st)
            assert [(m["name"], m["state"]) for m in st["members"]] == [(n, "up") for n in names], (day, st)
            assert st["lease"]["held"], (day, h.config["SERVER_NAME"], st["lease"])
        seen.append(day)
    assert seen and seen[-1] >= DAYS - STEP
    # The same daemons, within their bounds.
    figures = {}
    for h in c.hosts:
        n = h.config["SERVER_NAME"]
        assert h.proc.poll() is None and h.proc.pid == pids[n], f"{n} restarted"
        rss = psutil.Process(h._server_pid()).memory_info().rss
        state, log = _du(Path(h.config["STATE_DIR"])), h.log_path.stat().st_size
        figures[n] = {"rss_mib": rss >> 20, "state_kib": state >> 10, "log_kib": log >> 10}
        assert rss < RSS_BOUND and state < STATE_BOUND and log < LOG_BOUND, (n, figures[n])
    print(f"\nyear test: {DAYS} simulated days in steps of {STEP}: {json.dumps(figures)}")
