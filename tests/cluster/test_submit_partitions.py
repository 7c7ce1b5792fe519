"""Submissions through partitions, on a real three-member cluster: a member cut off
from its scheduler refuses at once, retryably, and nothing it refused appears after
the heal; a submission in flight when the scheduler's link is cut, or when the
scheduler is killed, is sent again with its key (by the member's relay, or by the
client) and makes exactly one job. Both clients (the Python mt-job and the C fast
path) submit."""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest
from cluster_harness import wait_for
from mtgpu_testing import fast_mtjob

pytestmark = [pytest.mark.root, pytest.mark.slow]

JOB = "#!/bin/bash\n#MTGPU cpus=1 ram=10M name={name}\ntrue\n"


@pytest.fixture(scope="module")
def fast_client():
    return str(fast_mtjob())


def inside(host, user, key, cmd, input=None, timeout=120):
    """ssh from inside the member's own network namespace: a member whose link is cut
    is still reachable there, as from a tenant logged in on it."""
    argv = ["ip", "netns", "exec", host.netns, *host.ssh_argv(user, key, cmd)]
    return subprocess.run(
        argv,
        input=input,
        capture_output=True,
        timeout=timeout,
        check=False,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


def names_of(host, user, key) -> list[str]:
    r = inside(host, user, key, "mt-job list --all --json")
    assert r.returncode == 0, r.stderr
    return [j["name"] for j in json.loads(r.stdout)]


class Submitter:
    """Submits uniquely named jobs from one member in a loop, alternating the clients."""

    def __init__(self, host, user, key, fast, prefix: str) -> None:
        self.host, self.user, self.key, self.fast, self.prefix = host, user, key, fast, prefix
        self.results: list[tuple[str, int, str, str]] = []  # (name, status, job id, stderr)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            name = f"{self.prefix}{i}"
            client = self.fast if i % 2 else "mt-job"
            r = inside(
                self.host,
                self.user,
                self.key,
                f"{client} submit --parsable -",
                JOB.format(name=name).encode(),
                timeout=180,
            )
            self.results.append((name, r.returncode, r.stdout.decode().strip(), r.stderr.decode()))
            i += 1

    def acked(self) -> int:
        return sum(1 for r in self.results if r[1] == 0)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(240)


def root_answer(host, op: str) -> str:
    try:
        return host.api(op, timeout=40).get("error", "")
    except OSError as exc:  # no answer in time: asked again
        return str(exc)


def test_submissions_through_a_cut_member_a_cut_scheduler_and_a_killed_one(cluster, fast_client):
    c = cluster([("m1", 0, {}), ("m2", 0, {}), ("m3", 0, {})])
    sched = c.by_name(c.scheduler())
    follower, other = [h for h in c.hosts if h is not sched]
    key = follower.add_user("ida")
    for h in c.hosts:
        wait_for(lambda h=h: h.ssh("ida", key, "true").returncode == 0, what="login")

    # A member cut off from the majority answers at once that it cannot reach the
    # scheduler, and since when; both clients retry a bounded time, then say so.
    c.net.cut(follower)
    wait_for(
        lambda: "cannot reach its cluster's scheduler since" in root_answer(follower, "job.list"),
        timeout=90,
        what="the cut-off member's answer",
    )
    for client in ("mt-job", fast_client):
        r = inside(
            follower,
            "ida",
            key,
            f"MTGPU_SUBMIT_RETRY=8 {client} submit --parsable -",
            JOB.format(name="refused").encode(),
        )
        err = r.stderr.decode()
        assert r.returncode == 1, (client, r)
        assert "cannot reach its cluster's scheduler since" in err and "retrying" in err, (client, err)
        assert "not submitted" in err, err
    c.net.heal(follower)
    # Its elections while cut off may move the scheduler role when it is back.
    sched = c.by_name(wait_for(lambda: c.scheduler(), timeout=120, what="one scheduler again"))
    follower, other = [h for h in c.hosts if h is not sched]

    # The scheduler's link is cut with submissions in flight through a follower...
    sub = Submitter(other, "ida", key, fast_client, "a")
    wait_for(lambda: sub.acked() >= 3, what="submissions")
    c.net.cut(sched)
    gone = sched.config["SERVER_NAME"]
    new = c.by_name(
        wait_for(
            lambda: next((s for s in [c.scheduler(among=[follower, other])] if s != gone), None),
            what="a new scheduler",
        )
    )
    at_cut = len(sub.results)
    wait_for(
        lambda: sub.acked() >= 3 + 3 and len(sub.results) > at_cut + 1,
        timeout=180,
        what="submissions through the new scheduler",
    )
    c.net.heal(sched)

    # ... then the new scheduler is killed with submissions in flight, through a
    # member that stays up.
    subs = [sub]
    if new is other:
        sub.finish()
        sub = Submitter(follower, "ida", key, fast_client, "b")
        subs.append(sub)
        wait_for(lambda: sub.acked() >= 2, what="submissions through the other follower")
    acked = sub.acked()
    new.stop(signal.SIGKILL)
    survivors = [h for h in c.hosts if h is not new]
    c.scheduler(among=survivors)
    wait_for(lambda: sub.acked() >= acked + 3, timeout=180, what="submissions after the kill")
    sub.finish()

    # Exactly one job for every acknowledged submission, on every member still up
    # (the one that was cut included, once it has caught up): none twice, none lost.
    results = [r for s in subs for r in s.results]
    # Some were caught by the cut or the kill (relayed into a lost link, or met the
    # election) and went again with their key: sent again by the member's relay (to
    # the new scheduler once it is named), or by the client after a refusal.
    relayed = [h for h in c.hosts if "relaying job.submit:" in h.log_path.read_text(errors="replace")]
    assert relayed or any("retrying" in err for *_, err in results), results
    assert all(rc == 0 for _, rc, _, _ in results), [r for r in results if r[1] != 0]
    want = sorted(name for name, *_ in results)
    ids = {jid for _, _, jid, _ in results}
    assert len(ids) == len(results)
    for h in survivors:
        wait_for(
            lambda h=h: sorted(n for n in names_of(h, "ida", key) if n != "refused") == want,
            timeout=90,
            what=f"exactly one job per submission on {h.config['SERVER_NAME']}",
        )
        assert "refused" not in names_of(h, "ida", key)
