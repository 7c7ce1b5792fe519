"""Submissions that never see a failover, on a real three-member cluster.

A tenant submits continuously over real ssh with ``mt-job submit`` (several loops at
once, each submission through a member not killed while it is in flight) while the
test kills the scheduler with SIGKILL (the harness's own child process, never a name)
and starts it again, over and over. Every submission must exit 0 with a job id and
print nothing on stderr (the clients say they are sending again only after 5 s,
longer than a failover); every acknowledged id must be in ``mt-job list`` exactly
once (each submission's job has a name of its own: no name twice, none missing, the
id the one acknowledged), and every job must complete.

Run with each client (``mtjob_clients``), :data:`KILLS` kills each: the issue's 20 by
default. One kill cycle (kill, election, restart, the member back in every view and
answering) takes 3-17 s on a loaded two-CPU machine; 20 of them with the checks took
1 min 44 s (Python client) and 2 min 23 s (C client) alone, 3 min 33 s for both
together: within the 2.5 minutes per client asked of it. ``MTGPU_FAILOVER_KILLS=N`` runs N::

    MTGPU_FAILOVER_KILLS=5 tests/run.sh tests/cluster/test_failover_submissions.py -s
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from cluster_harness import status, wait_for

from mtgpu.jobstate import COMPLETED

#: How many times the scheduler is killed (and started again) per client.
KILLS = int(os.environ.get("MTGPU_FAILOVER_KILLS", "20"))
pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.mtjob_clients,
    pytest.mark.timeout(60 + 45 * KILLS),
]
#: Submitter loops at once.
LOOPS = 4
JOB = "#!/bin/bash\n#MTGPU cpus=1 ram=10M name={name}\ntrue\n"


class Members:
    """Which members a submission may go through: every member but the one about to
    be killed or down. A kill waits for the submissions in flight through its victim
    to end (a tenant logged in on a machine that dies loses its session, which no
    client can hide); the others go on through the kill."""

    def __init__(self, hosts) -> None:
        self.hosts = hosts
        self.cond = threading.Condition()
        self.away: object | None = None
        self.busy = {id(h): 0 for h in hosts}

    def take(self, i: int):
        with self.cond:
            ok = [h for h in self.hosts if h is not self.away]
            h = ok[i % len(ok)]
            self.busy[id(h)] += 1
            return h

    def done(self, h) -> None:
        with self.cond:
            self.busy[id(h)] -= 1
            self.cond.notify_all()

    def set_away(self, h) -> None:
        """No new submission through ``h``; returns once none is in flight there."""
        with self.cond:
            self.away = h
            self.cond.wait_for(lambda: self.busy[id(h)] == 0, timeout=240)
            assert self.busy[id(h)] == 0, "submissions through the victim did not end"

    def back(self) -> None:
        with self.cond:
            self.away = None


class Submitter:
    def __init__(self, members: Members, user: str, key, n: int) -> None:
        self.members, self.user, self.key, self.n = members, user, key, n
        #: (name, member, exit status, stdout, stderr) of every submission.
        self.results: list[tuple[str, str, int, str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            name = f"s{self.n}-{i}"
            h = self.members.take(self.n + i)
            try:
                r = h.ssh(
                    self.user,
                    self.key,
                    "mt-job submit --parsable -",
                    input=JOB.format(name=name).encode(),
                    timeout=180,
                )
                out, err, rc = r.stdout.decode().strip(), r.stderr.decode(), r.returncode
            except Exception as exc:  # noqa: BLE001 - recorded as a failed submission
                out, err, rc = "", f"test: {exc!r}", -1
            finally:
                self.members.done(h)
            self.results.append((name, h.config["SERVER_NAME"], rc, out, err))
            i += 1

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(240)


def test_submissions_through_repeated_scheduler_kills_see_no_error(cluster, mtjob_client):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    key = c.hosts[0].add_user("ida")
    for h in c.hosts:
        wait_for(lambda h=h: h.ssh("ida", key, "true").returncode == 0, what="login")
    members = Members(c.hosts)
    subs = [Submitter(members, "ida", key, n) for n in range(LOOPS)]
    wait_for(lambda: sum(len(s.results) for s in subs) >= LOOPS, timeout=120, what="first submissions")

    cycles = []
    for k in range(KILLS):
        t0 = time.monotonic()
        victim = c.by_name(c.scheduler())
        members.set_away(victim)
        victim.stop(signal.SIGKILL)
        survivors = [h for h in c.hosts if h is not victim]
        c.scheduler(among=survivors)
        victim.start(timeout=120)
        # Back in every member's view, naming the same scheduler: the next kill leaves
        # a majority.
        wait_for(
            lambda: all(
                len(status(h).get("members", [])) == 3
                and all(m["state"] == "up" for m in status(h)["members"])
                for h in c.hosts
            ),
            timeout=120,
            what="every member up in every view",
        )
        c.scheduler()
        # Its own daemon has loaded its state (a tenant logging in on a member that
        # has just restarted is told it is starting; that is no failover).
        wait_for(
            lambda v=victim: v.api("job.list", timeout=30).get("ok"), timeout=120, what="the member answering"
        )
        members.back()
        cycles.append(time.monotonic() - t0)
        print(f"kill {k + 1}: {victim.config['SERVER_NAME']} killed, cycle {cycles[-1]:.1f}s")
    for s in subs:
        s.finish()

    results = [r for s in subs for r in s.results]
    resent = [r for r in results if r[4].strip()]
    print(
        f"{mtjob_client} client: {KILLS} kills, {len(results)} submissions, "
        f"{sum(1 for r in results if r[2] != 0)} failed, {len(resent)} with stderr, "
        f"cycle {min(cycles):.1f}-{max(cycles):.1f}s"
    )
    for r in resent[:20]:
        print(f"  {r[0]} via {r[1]}: {r[4].strip()}")
    # Submissions were in flight through the kills: members' relays sent some again.
    relayed = sum(h.log_path.read_text(errors="replace").count("relaying job.submit:") for h in c.hosts)
    print(f"  {relayed} relayed submissions sent again")
    assert relayed, "no submission met a kill"
    # Seen by the tenant: an exit status, a job id, stderr.
    bad = [r for r in results if r[2] != 0 or not r[3].isdigit()]
    assert not bad, bad[:10]
    noisy = [r for r in results if r[4].strip()]
    assert not noisy, noisy[:10]
    ids = {r[0]: r[3] for r in results}
    assert len(set(ids.values())) == len(results), "one job id acknowledged twice"

    # Every acknowledged job exactly once, with its id, and each completes.
    def listed():
        r = c.hosts[0].ssh("ida", key, "mt-job list --all --json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    jobs = listed()
    names = [j["name"] for j in jobs]
    assert sorted(names) == sorted(ids), (
        f"missing {sorted(set(ids) - set(names))[:10]}, "
        f"twice {sorted({n for n in names if names.count(n) > 1})[:10]}, "
        f"unknown {sorted(set(names) - set(ids))[:10]}"
    )
    assert {j["name"]: str(j["job_id"]) for j in jobs} == ids
    left: list = []

    def completed():
        left[:] = [
            (j["job_id"], j["state"], j.get("node"), j.get("reason"))
            for j in listed()
            if j["state"] != COMPLETED
        ]
        return not left

    try:
        wait_for(completed, timeout=240, interval=2.0, what="every job completed")
    except AssertionError:
        # What the first few wrote on stderr (read as the tenant), to say why.
        why = {
            jid: c.hosts[0].ssh("ida", key, f"tail -c 600 ~/.mtgpu/jobs/lab/{jid}/stderr.log").stdout.decode()
            for jid, *_ in left[:3]
        }
        raise AssertionError(f"{len(left)} jobs not completed: {left[:10]}; their stderr: {why}") from None
