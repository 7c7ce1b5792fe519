"""A job runs at most once, through partitions: members fence their own jobs when their
lease from the scheduler runs out, before the majority moves the work elsewhere.

Three real members in network namespaces (``CLUSTER_LOST_AFTER: 10s``,
``CLUSTER_FENCE_GRACE: 2s``: a 6 s lease). Every job is a heartbeat: once a second it
appends the time, its member and its pid to a file in one shared home (and traps
SIGTERM to write two more, as a job that checkpoints does). Then, one step at a
time: a member's link is cut and healed, the scheduler's link is cut and healed,
a member is drained with ``--now``; the long version (``MTGPU_PARTITION_LONG=1``)
adds a 1|2 split three times in a row and a kill -9 of the scheduler right after a
heal. After every step:

- no two writers of one job's heartbeat file overlap in time;
- every acknowledged submission is listed exactly once;
- every RUNNING job has exactly one live process tree, on its member, and every job
  process belongs to a RUNNING job of that member;
- every member's replica of the job table is the same (``cluster status``' digest).

And at the moment the majority declares a cut-off member's job lost, that job's
processes are already gone.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from pathlib import Path

import pytest
from cluster_harness import status, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

LONG = os.environ.get("MTGPU_PARTITION_LONG", "") not in ("", "0")
FAST = {"CLUSTER_LOST_AFTER": 10, "CLUSTER_FENCE_GRACE": 2}
#: How long a cut lasts: past the lost-member bound, so the majority moves the work.
CUT = 16.0
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY"}


def heartbeat(hb: Path, directives: str) -> str:
    line = f'echo "$(date +%s.%N) ${{SLURMD_NODENAME:-?}} $$" >> {hb}/$MTGPU_JOB_ID.${{MTGPU_NODE_RANK:-0}}'
    return (
        "#!/bin/bash\n"
        f"#MTGPU cpus=1 ram=10M {directives}\n"
        f"trap '{line}; sleep 1.5; {line}; exit 0' TERM\n"
        f"while :; do {line}; sleep 1; done\n"
    )


class Run:
    """The tenant's side of the suite and its checks."""

    def __init__(self, c, user: str) -> None:
        self.c, self.user = c, user
        self.entry = c.hosts[0]
        self.key = self.entry.add_user(user)
        for h in c.hosts:
            wait_for(lambda h=h: h.ssh(user, self.key, "true").returncode == 0, what="login")
        self.uid = int(self.entry.passwd(user)[2])
        # One shared home: every member sees this machine's filesystem.
        self.hb = self.entry.homes / user / "hb"
        self.entry.ssh(user, self.key, f"mkdir -p {self.hb}")
        self.acked: list[str] = []

    def up(self) -> list:
        return [h for h in self.c.hosts if not getattr(h, "cut_off", False)]

    def via(self):
        return self.up()[0]

    def submit(self, directives: str, host=None) -> str:
        h = host or self.via()
        r = h.ssh(
            self.user,
            self.key,
            "mt-job submit --parsable -",
            input=heartbeat(self.hb, directives).encode(),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        jid = r.stdout.decode().strip()
        self.acked.append(jid)
        return jid

    def jobs(self, host=None) -> dict[str, dict]:
        h = host or self.via()
        r = h.ssh(self.user, self.key, "mt-job list --all --json", timeout=120)
        if r.returncode != 0:
            return {}
        return {j["job_id"]: j for j in json.loads(r.stdout)}

    def job(self, jid: str) -> dict:
        return self.jobs().get(jid, {})

    def processes(self) -> dict[tuple[str, str], set[int]]:
        """(job id, member) -> the session ids of the tenant's live job processes."""
        out: dict[tuple[str, str], set[int]] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if d.stat().st_uid != self.uid:
                    continue
                env = dict(
                    e.split("=", 1)
                    for e in (d / "environ").read_bytes().decode(errors="replace").split("\0")
                    if "=" in e
                )
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                sid = os.getsid(int(d.name))
            except (OSError, ValueError):
                continue
            if state == "Z" or "MTGPU_JOB_ID" not in env:
                continue
            out.setdefault((env["MTGPU_JOB_ID"], env.get("SLURMD_NODENAME", "?")), set()).add(sid)
        return out

    # -------------------------------------------------------------- checks

    def writers(self) -> dict[str, list[tuple[float, float, str]]]:
        """Job id and rank -> each writer's (first, last, who), from the heartbeat files
        (one file per part: the parts of a ``nodes=N`` job write side by side)."""
        out = {}
        for f in self.hb.iterdir():
            spans: dict[str, list[float]] = {}
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) != 3:
                    continue
                t, who = float(parts[0]), f"{parts[1]}/{parts[2]}"
                s = spans.setdefault(who, [t, t])
                s[0], s[1] = min(s[0], t), max(s[1], t)
            out[f.name] = sorted((a, b, who) for who, (a, b) in spans.items())
        return out

    def check_one_writer(self, step: str) -> None:
        for jid, spans in self.writers().items():
            for (_, a1, wa), (b0, _, wb) in itertools.pairwise(spans):
                why = (
                    f"{step}: job {jid} had two writers at once: {wa} wrote until {a1:.2f}, "
                    f"{wb} from {b0:.2f}"
                )
                assert b0 > a1, (why, spans)

    def check_acked(self, step: str, jobs: dict[str, dict]) -> None:
        missing = [j for j in self.acked if j not in jobs]
        assert not missing, f"{step}: acknowledged jobs missing: {missing}"
        assert len(set(self.acked)) == len(self.acked), f"{step}: a job id acknowledged twice"

    def consistent(self) -> str:
        """'' when every RUNNING job has one live process tree on its member and every
        job process belongs to a RUNNING job of its member; what is wrong otherwise."""
        jobs = self.jobs()
        if not jobs:
            return "no job list"
        procs = self.processes()
        for jid, j in jobs.items():
            if j["state"] != "RUNNING":
                continue
            for node in j["nodes"]:
                if len(procs.get((jid, node), ())) != 1:
                    return f"job {jid} on {node}: process trees {procs.get((jid, node))}"
        for jid, node in procs:
            j = jobs.get(jid)
            if j is None or j["state"] != "RUNNING" or node not in j["nodes"]:
                return f"job {jid} still has processes on {node} ({(j or {}).get('state')})"
        return ""

    def check(self, step: str) -> None:
        wrong = [""]

        def settled():
            wrong[0] = self.consistent()
            return not wrong[0]

        try:
            wait_for(settled, timeout=60, interval=1.0, what="one process tree per running job")
        except AssertionError:
            raise AssertionError(f"{step}: {wrong[0]}") from None
        self.check_one_writer(step)
        self.check_acked(step, self.jobs())
        digests = {}

        def agree():
            digests.clear()
            for h in self.c.hosts:
                digests[h.config["SERVER_NAME"]] = (status(h).get("replica") or {}).get("jobs")
            return None not in digests.values() and len(set(digests.values())) == 1

        try:
            wait_for(agree, timeout=60, interval=1.0, what="replicas agreeing")
        except AssertionError:
            raise AssertionError(f"{step}: replicas disagree: {digests}") from None

    # ------------------------------------------------------------ the steps

    def cut(self, host) -> None:
        self.c.net.cut(host)
        host.cut_off = True

    def heal(self, host) -> None:
        self.c.net.heal(host)
        host.cut_off = False

    def scheduler(self) -> str:
        return self.c.scheduler(among=self.up())

    def running_on(self, name: str) -> list[str]:
        return [jid for jid, j in self.jobs().items() if j["state"] == "RUNNING" and name in j["nodes"]]

    def ensure_on(self, name: str) -> list[str]:
        """The jobs running on ``name``, after starting one there if none does."""
        if not self.running_on(name):
            self.submit(f"server={name} requeue=yes")
        return wait_for(lambda: self.running_on(name), what=f"a job on {name}")

    def cut_and_heal(self, victim, step: str) -> None:
        """Cut ``victim`` off; when the majority ends or requeues its jobs, they no
        longer run there; then heal and check."""
        name = victim.config["SERVER_NAME"]
        on_victim = self.ensure_on(name)
        self.cut(victim)
        up = {h.config["SERVER_NAME"] for h in self.up()}
        # The majority has (or keeps) a scheduler of its own (not the one just cut off,
        # which the others name for a moment).
        wait_for(lambda: self.scheduler() in up, timeout=60, what=f"{step}: a scheduler in {up}")
        self.submit("requeue=yes")  # acknowledged while the member is cut off
        # `mt-job nodes` on the majority never leaves the cut-off member out (a new
        # scheduler never heard from the old one).
        r = self.via().ssh(self.user, self.key, "mt-job nodes --json", timeout=120)
        assert r.returncode == 0, r.stderr
        names = {n["name"] for n in json.loads(r.stdout)}
        assert names == {h.config["SERVER_NAME"] for h in self.c.hosts}, (step, names)

        def moved(jid: str) -> dict | None:
            j = self.job(jid)
            return j if j.get("state") != "RUNNING" or name not in j.get("nodes", []) else None

        for jid in on_victim:
            j = wait_for(
                lambda jid=jid: moved(jid),
                timeout=90,
                interval=0.5,
                what=f"{step}: job {jid} moved off {name}",
            )
            if len(j.get("nodes") or ()) > 1 and j["state"] == "NODE_FAIL":
                # A split nodes=N job ends as soon as the member's lease is over, while
                # its part there is in its fencing grace: gone within that grace.
                wait_for(
                    lambda jid=jid: not self.processes().get((jid, name)),
                    timeout=FAST["CLUSTER_FENCE_GRACE"] + 1,
                    interval=0.2,
                    what=f"{step}: the part of job {jid} on {name} fenced",
                )
            alive = self.processes().get((jid, name))
            assert not alive, (
                f"{step}: job {jid} still ran on {name} when the majority "
                f"recorded it {j['state']} ({j.get('reason')})"
            )
            if j["state"] == "NODE_FAIL":
                assert name in j["reason"], j["reason"]
        time.sleep(max(0.0, CUT - 12))
        self.heal(victim)
        self.check(step)


@pytest.fixture
def run(cluster):
    c = cluster([("m1", 0, FAST), ("m2", 0, FAST), ("m3", 0, FAST)])
    r = Run(c, "hana")
    return r


def test_a_job_runs_at_most_once_through_cuts_of_a_member_and_of_the_scheduler(run):
    sched = run.scheduler()
    gang = run.submit("nodes=2")  # split by the cut below: ended on both sides
    nodes = wait_for(
        lambda: run.job(gang).get("state") == "RUNNING" and run.job(gang)["nodes"],
        what="the nodes=2 job running",
    )
    vname = next(n for n in nodes if n != sched)
    victim = run.c.by_name(vname)
    pinned = run.submit(f"server={vname}")  # ends NODE_FAIL when its member is lost
    moving = run.submit("requeue=yes")
    for _ in range(2):
        run.submit("requeue=yes")
    wait_for(
        lambda: all(run.job(j).get("state") == "RUNNING" for j in (pinned, moving)), what="the jobs running"
    )
    run.check("start")

    # 1. A member's link is cut (its daemon and jobs go on, as on a switch failure).
    run.cut_and_heal(victim, "member cut")
    for jid in (pinned, gang):
        j = run.job(jid)
        assert j["state"] == "NODE_FAIL" and f"its member {vname} was lost" in j["reason"], j

    # 2. The scheduler's link is cut: a new scheduler watches it too (it never
    #    reported to the new one) and moves its work once its lease is surely over.
    run.cut_and_heal(run.c.by_name(sched), "scheduler cut")

    # 3. Drain --now: the requeued job starts again only once its old run (which
    #    traps SIGTERM) has ended.
    target = run.scheduler()
    run.ensure_on(target)
    run.via().admin("drain", target, "--now", "--reason", "partition suite")
    wait_for(lambda: not run.running_on(target), timeout=60, what=f"{target} emptied")
    run.check("drain --now")
    run.via().admin("undrain", target)

    if LONG:
        for i in range(3):  # 1|2 splits in a row, each member's turn
            run.cut_and_heal(run.c.hosts[i % 3], f"split {i + 1}")
        # kill -9 of the scheduler right after a heal.
        victim = run.c.by_name(run.scheduler())
        run.ensure_on(victim.config["SERVER_NAME"])
        run.cut(victim)
        time.sleep(3)
        run.heal(victim)
        victim.stop(signal.SIGKILL)
        victim.cut_off = True  # not answering while it is down
        run.scheduler()
        time.sleep(CUT)
        victim.start(timeout=120)
        victim.cut_off = False
        run.check("kill -9 of the scheduler after a heal")
    # Every job that ran more than once did so one run after the other.
    assert any(len(s) > 1 for s in run.writers().values())
