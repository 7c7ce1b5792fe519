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
drifting host. A fourth member joins a third of the way through (at that day's time)
and is removed two thirds of the way; each step a new user is added and the one
before removed. After each step: every member's certificate covers its own now (it
renewed itself while running); a client at one member's time logs in to every member
(so a certificate signed on a clock five minutes off is taken by the others, as peers
dialing it take it); once a month each member dials every other afresh at its own
time; the new user logs in everywhere and the removed one nowhere; a
job for each simulated day, submitted through the members in turn, runs and
completes; nothing was re-elected and no member was lost. At the end the daemons are
still the ones started, and their state, logs and memory are within the bounds
docs/SECURITY.md states; each journal was compacted while it ran (every 200 entries
here), and the daemons' own log files (``--log-file``, as off systemd) rotated at
LOG_MAX_SIZE, keeping LOG_KEEP (one member logs at DEBUG to pass the size).

The short form (CI) runs 96 simulated days; the full year is
``MTGPU_YEAR_DAYS=400 python -m pytest -q tests/cluster/test_a_year.py`` (about
four minutes on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cluster_harness import KEY, join
from mtgpu_testing import wait_for
from security_testing import api_socket, call

from mtgpu.cluster.identity import CERT_VALIDITY
from mtgpu.state.store import COMPACTION_ENV

pytestmark = pytest.mark.root

DAYS = int(os.environ.get("MTGPU_YEAR_DAYS", "96"))
STEP = 8  # simulated days a step: a certificate renewed at a third of 30 days left is never passed by
SKEW = 300  # NTP's correction of one member, in seconds
LIB = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
#: What a member may hold after the run (docs/SECURITY.md, "A year on one start").
STATE_BOUND = 64 << 20
LOG_BOUND = 64 << 20
RSS_BOUND = 400 << 20
#: The daemons write their own logs (--log-file), rotated at 64 KiB with two kept, and
#: compact their journals every 200 entries (at most every 5 s) instead of 20,000.
LOGS = {"LOG_MAX_SIZE": "64K", "LOG_KEEP": 2}
COMPACT_AT = "200:5"


#: A fresh dial from one member to others, as the member makes one: its host key, a
#: user certificate signed at its time, the others' host certificates checked at its
#: time (argv: offset file, cluster id, key, member name, its STATE_DIR, addresses).
DIAL = r"""
import asyncio, sys
from mtgpu.clock import shift_wall_clock
shift_wall_clock(sys.argv[1])
from mtgpu.cluster.dial import connect_peer
from mtgpu.cluster.identity import ClusterIdentity
ident = ClusterIdentity.derive(sys.argv[2], sys.argv[3])
async def main():
    for address in sys.argv[6:]:
        conn = await connect_peer(address, ident, sys.argv[4], sys.argv[5])
        conn.close()
        await conn.wait_closed()
        print("dialed", address, flush=True)
asyncio.run(main())
"""


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
        # m2 logs at DEBUG, so that its log passes LOG_MAX_SIZE and rotates within the run.
        [(n, 1, {**LOGS, **({"LOG_LEVEL": "DEBUG"} if n == "m2" else {})}) for n in names],
        env={COMPACTION_ENV: COMPACT_AT},
        member_env={n: {"MTGPU_WALL_CLOCK_OFFSET_FILE": str(offsets[n])} for n in names},
        log_file=True,
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

    def login(h, offset: float, user: str = "yara", key: Path = key) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LD_PRELOAD": str(LIB), "FAKETIME": f"{offset:+.0f}"}
        argv = ["ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}"]
        argv += ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"]
        argv += ["-p", str(h.port), "-i", str(key), f"{user}@{h.address}", "echo ok"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    def cert(h) -> dict:
        return h.api("ssh.host_certificate")["result"]

    def name(h) -> str:
        return str(h.config["SERVER_NAME"])

    members = list(c.hosts)
    added = removed = None
    dials = 0
    leaver: tuple[str, Path] | None = None
    seen = []
    for day in range(STEP, DAYS + 1, STEP):
        month = day // 30
        skew = {"m3": SKEW if month % 2 else -SKEW} if month else {}
        shifts = {n: day * 86400 + skew.get(n, 0) for n in offsets}
        for n, f in offsets.items():
            f.write_text(str(shifts[n]))
        # A member joins a third of the way through, on a clock at that day.
        if added is None and day >= DAYS // 3:
            offsets["m4"] = tmp_path / "m4.offset"
            offsets["m4"].write_text(str(day * 86400))
            shifts["m4"] = day * 86400
            env = {"MTGPU_WALL_CLOCK_OFFSET_FILE": str(offsets["m4"]), COMPACTION_ENV: COMPACT_AT}
            added = join(c, "m4", 1, env=env, **LOGS)
            members.append(added)
            wait_for(
                lambda: all(len(h.api("cluster.status")["result"]["members"]) == 4 for h in members),
                90,
                f"m4 in every member's view on day {day}",
            )
            kh.write_text(first.api("cluster.status")["result"]["known_hosts"] + "\n")
        # ... and is removed two thirds of the way: its daemon stops, the others forget it.
        elif added is not None and removed is None and day >= 2 * DAYS // 3:
            r = first.admin("cluster", "remove", "m4")
            assert "removed m4" in r.stdout, r.stdout
            added.stop()
            removed = added
            members.remove(added)
            del offsets["m4"], shifts["m4"]
            wait_for(
                lambda: all(
                    [m["name"] for m in h.api("cluster.status")["result"]["members"]] == list(names)
                    for h in members
                ),
                90,
                f"m4 gone from every member's view on day {day}",
            )
        # Each member renews its own certificate while it runs, before a third is left.
        for h in members:
            shift = shifts[name(h)]

            def renewed(h=h, shift=shift):
                k, at = cert(h), time.time() + shift
                return k if k["valid_after"] <= at and k["valid_before"] - at > CERT_VALIDITY / 3 else None

            got = wait_for(renewed, 60, f"{name(h)}'s certificate renewed by day {day}")
            assert not got["warning"], (day, name(h), got)
        # Once a month each member dials every other afresh, at its own time.
        if day // 30 != (day - STEP) // 30:
            for h in members:
                others = [f"{o.address}:{o.port}" for o in members if o is not h]
                argv = [sys.executable, "-I", "-c", DIAL, str(offsets[name(h)]), "lab", KEY, name(h)]
                r = subprocess.run(
                    [*argv, h.config["STATE_DIR"], *others], capture_output=True, text=True, timeout=60
                )
                assert r.returncode == 0 and r.stdout.count("dialed") == len(others), (day, name(h), r.stderr)
                dials += len(others)
        # A user at each member's time logs in to every member through the one line.
        for at in shifts:
            for h in members:
                r = login(h, shifts[at])
                assert r.returncode == 0 and r.stdout.strip() == "ok", (day, at, name(h), r.stderr)
        # A user joins (mtgpu-admin user add) and logs in everywhere; last step's leaves
        # (user remove) and is refused everywhere.
        newcomer = f"u{day}"
        nkey = first.add_user(newcomer)
        for h in members:
            r = login(h, shifts[name(h)], newcomer, nkey)
            assert r.returncode == 0 and r.stdout.strip() == "ok", (day, newcomer, name(h), r.stderr)
        if leaver is not None:
            first.admin("user", "remove", leaver[0], "--json")
            for h in members:
                shift = shifts[name(h)]

                def refused(h=h, shift=shift, gone=leaver) -> bool:
                    return login(h, shift, *gone).returncode != 0

                wait_for(refused, 30, f"{leaver[0]} refused by {name(h)} on day {day}")
        leaver = (newcomer, nkey)
        # A job for each simulated day, submitted through the members in turn.
        jobs = []
        for d in range(day - STEP + 1, day + 1):
            through = members[d % len(members)]
            with api_socket(through.run_dir, uid) as s:
                a = call(s, "job.submit", {"script": f"#!/bin/sh\n#MTGPU cpus=1 ram=16M\necho day {d}\n"})
            assert a["ok"], (day, d, name(through), a)
            jobs.append((a["result"]["job_id"], through))
        for jid, through in jobs:

            def ended(jid=jid, through=through):
                with api_socket(through.run_dir, uid) as s:
                    j = call(s, "job.show", {"job_id": jid})["result"]
                return j if j["state"] not in ("PENDING", "RUNNING") else None

            j = wait_for(ended, 90, f"job {jid} of day {day} to end")
            assert j["state"] == "COMPLETED", (day, j)
        # Nothing was re-elected, nobody was lost and every member holds its lease.
        for h in members:
            st = h.api("cluster.status")["result"]
            assert (st["scheduler"], st["term"]) == (leader, term), (day, name(h), st)
            assert [(m["name"], m["state"]) for m in st["members"]] == [(name(m), "up") for m in members], (
                day,
                st,
            )
            assert st["lease"]["held"], (day, name(h), st["lease"])
        seen.append(day)
    assert added is not None and removed is added, "the run was too short to add and remove a member"
    assert seen and seen[-1] >= DAYS - STEP
    # The same daemons, within their bounds.
    figures = {}
    for h in members:
        n = h.config["SERVER_NAME"]
        assert h.proc.poll() is None and h.proc.pid == pids[n], f"{n} restarted"
        rss = psutil.Process(h._server_pid()).memory_info().rss
        state = _du(Path(h.config["STATE_DIR"]))
        logs = sorted(h.log_path.parent.glob(h.log_path.name + "*"))
        log = sum(p.stat().st_size for p in logs)
        figures[n] = {
            "rss_mib": rss >> 20,
            "state_kib": state >> 10,
            "log_kib": log >> 10,
            "log_files": len(logs),
        }
        assert rss < RSS_BOUND and state < STATE_BOUND and log < LOG_BOUND, (n, figures[n])
        # The journal was compacted while it ran (a full dump, the journal trimmed)...
        assert (Path(h.config["STATE_DIR"]) / "raft.dump").exists(), (n, "never compacted")
        # ... and the log rotated itself at its size, keeping LOG_KEEP files.
        assert len(logs) <= 1 + LOGS["LOG_KEEP"], (n, logs)
        assert all(p.stat().st_size <= (64 << 10) + 4096 for p in logs), (n, [p.stat().st_size for p in logs])
    assert figures["m2"]["log_files"] > 1, ("m2's DEBUG log never rotated", figures["m2"])
    print(
        f"\nyear test: {DAYS} simulated days in steps of {STEP}, {dials} fresh dials: {json.dumps(figures)}"
    )
