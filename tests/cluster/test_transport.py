"""Raft over real SSH between processes: elections, replication, failover, restarts.

Every member is a separate process (``raft_harness.py``) with its own asyncssh server;
peers reach each other only through the ``mtgpu-raft`` subsystem. Timings are printed
(run with ``-s`` to see them) and asserted only with generous bounds.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raft_harness import Cluster  # noqa: E402

from mtgpu.cluster import framing  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

VOTERS = ["n1", "n2", "n3"]
FIGURES: dict[str, str] = {}


def _note(key: str, value: str) -> None:
    FIGURES[key] = value
    print(f"\n  {key}: {value}")


@pytest.fixture(scope="module")
def cl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("raft"), VOTERS, readonly=["r1"])
    t0 = time.monotonic()
    c.start(*VOTERS)
    started = time.monotonic()
    c.leader()
    _note(
        "first leader",
        f"{time.monotonic() - t0:.2f}s from spawn, "
        f"{time.monotonic() - started:.2f}s after all members were up",
    )
    yield c
    c.close()
    print("\n" + "\n".join(f"  {k}: {v}" for k, v in FIGURES.items()))


def _whole(c: Cluster) -> str:
    """Bring back any voter an earlier test stopped; return the agreed leader."""
    for n in VOTERS:
        p = c.procs.get(n)
        if p is not None and p.alive():
            p.proc.send_signal(signal.SIGCONT)
            c.call(n, "partition", on=False)
        else:
            c.start(n)
    leader = c.leader(among=VOTERS)
    c.converge(VOTERS)
    for n in VOTERS:
        _wait_peers(c, n, sorted(set(VOTERS) - {n}))
    return leader


def _wait_peers(c: Cluster, name: str, peers: list[str], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := c.call(name, "status")["peers"]) != peers:
        assert time.monotonic() < deadline, (name, got)
        time.sleep(0.05)


def test_election_and_replication(cl: Cluster) -> None:
    leader = _whole(cl)
    res = cl.call(leader, "write", prefix="w", n=1000)
    assert res["ok"] == 1000, res
    _note("1000 async+ack writes on the leader", f"{res['secs']:.3f}s ({1000 / res['secs']:.0f}/s)")
    follower = next(n for n in VOTERS if n != leader)
    res = cl.call(follower, "write", prefix="f", n=200)
    assert res["ok"] == 200, res
    _note("200 async+ack writes through a follower", f"{res['secs']:.3f}s")
    st = cl.converge(VOTERS)
    assert st["n"] >= 1200
    # Every member ends up with a channel to both others (a dial that raced a peer's
    # start is retried a second later).
    for n in VOTERS:
        _wait_peers(cl, n, sorted(set(VOTERS) - {n}))


def test_readonly_member_receives_state(cl: Cluster) -> None:
    leader = _whole(cl)
    t0 = time.monotonic()
    cl.start("r1", readonly=True)
    st = cl.converge(VOTERS + ["r1"])
    _note("read-only member caught up", f"{time.monotonic() - t0:.2f}s from spawn, {st['n']} keys")
    _wait_peers(cl, "r1", VOTERS)  # it dialed every voter
    assert "r1" in cl.call(leader, "status")["peers"]
    assert cl.call(leader, "write", prefix="after-r1-", n=100)["ok"] == 100
    cl.converge(VOTERS + ["r1"])
    # A write submitted on the read-only member is forwarded to the leader.
    assert cl.call("r1", "write", prefix="from-r1-", n=10)["ok"] == 10
    cl.converge(VOTERS + ["r1"])
    cl.call("r1", "destroy")
    cl.procs["r1"].proc.wait(10)


def test_hello_with_wrong_id_is_refused(cl: Cluster) -> None:
    import asyncssh

    _whole(cl)
    keys = cl.root / "keys"
    before = cl.call("n1", "status")["since"]

    async def impostor() -> tuple[dict, bytes | None]:
        # Authenticated as n3 (the test-only shared key), claiming to be n2.
        async with asyncssh.connect(
            "127.0.0.1",
            cl.ports["n1"],
            username="n3",
            client_keys=[keys / "client"],
            known_hosts=([asyncssh.read_public_key(keys / "host-n1.pub")], [], []),
            agent_path=None,
            config=[],
        ) as conn:
            proc = await conn.create_process(subsystem="mtgpu-raft", encoding=None)
            proc.stdin.write(framing.hello("n2", False))
            fr = framing.FrameReader(proc.stdout, 1 << 16)
            answer = await asyncio.wait_for(fr.next_control(), 5)
            after = await asyncio.wait_for(fr.next(), 5)
            return answer, after

    answer, after = asyncio.run(impostor())
    assert "refused" in answer and "authenticated as 'n3'" in answer["refused"], answer
    assert after is None  # and the channel was closed
    # The real n2 and n3 are still connected to n1, on the same channels as before.
    assert cl.call("n1", "status")["since"] == before


def test_kill9_leader_new_leader_and_commit(cl: Cluster) -> None:
    old = _whole(cl)
    others = [n for n in VOTERS if n != old]
    t0 = time.monotonic()
    cl.kill(old)
    new = cl.leader(among=others, exclude=old)
    t_leader = time.monotonic() - t0
    res = cl.call(new, "write", prefix="after-kill-", n=1)
    t_commit = time.monotonic() - t0
    assert res["ok"] == 1, res
    _note("kill -9 of the leader", f"new leader after {t_leader:.2f}s, first commit after {t_commit:.2f}s")
    assert t_commit < 15
    # The killed member comes back as a follower and catches up.
    t0 = time.monotonic()
    cl.start(old)
    cl.converge(VOTERS)
    _note("killed leader restarted and caught up", f"{time.monotonic() - t0:.2f}s")


def test_a_killed_leader_is_replaced_without_waiting_for_an_election_timeout(cl: Cluster) -> None:
    """kill -9 closes the leader's connections: the survivor first in the order of
    succession calls an election at once, and wins it in one round."""
    old = _whole(cl)
    others = [n for n in VOTERS if n != old]
    term = cl.call(old, "status")["term"]
    # With elections only after a minute without a leader, a new leader within the
    # 30 s below can only come from the followers seeing the channel end.
    for n in others:
        cl.call(n, "election_timeout", low=60.0, high=61.0)
    try:
        t0 = time.monotonic()
        cl.kill(old)
        new = cl.leader(among=others, exclude=old, timeout=30.0)
        took = time.monotonic() - t0
        st = cl.call(new, "status")
        assert new == others[0], (new, others)  # the first of the survivors in VOTERS' order
        assert st["term"] == term + 1, (term, st)  # one election: the other did not stand
        assert cl.call(new, "write", prefix="after-expedited-", n=1)["ok"] == 1
        _note("kill -9 of the leader, elections slowed to 60 s", f"new leader after {took:.2f}s")
        # The other survivor left its own election for later and follows.
        assert cl.call(others[1], "status")["leader"] == new
    finally:
        for n in others:
            cl.call(n, "election_timeout", low=1.0, high=2.0)


def test_partitioned_leader_cannot_commit(cl: Cluster) -> None:
    old = _whole(cl)
    others = [n for n in VOTERS if n != old]
    cl.call(old, "partition", on=True)  # its channels close; no dial or accept succeeds
    t0 = time.monotonic()
    lost = cl.call(old, "write", prefix="lost-", n=1, wait=3.0)
    assert lost["ok"] == 0, lost
    new = cl.leader(among=others, exclude=old)
    assert cl.call(new, "write", prefix="majority-", n=10)["ok"] == 10
    _note(
        "partitioned leader",
        f"its write unacknowledged after {lost['secs']:.1f}s; "
        f"the majority elected {new} and committed by {time.monotonic() - t0:.2f}s",
    )
    cl.call(old, "partition", on=False)
    cl.converge(VOTERS)
    for n in VOTERS:
        assert not cl.call(n, "has", key="lost-0")["has"], n
    assert cl.call(old, "status")["state"] != 2

    # A stopped (SIGSTOP) leader: the others elect and commit, and drop its channels
    # through the keepalive check, not TCP.
    stopped = cl.leader(among=VOTERS)
    rest = [n for n in VOTERS if n != stopped]
    cl.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    new = cl.leader(among=rest, exclude=stopped)
    t_leader = time.monotonic() - t0
    assert cl.call(new, "write", prefix="while-stopped-", n=10)["ok"] == 10
    deadline = time.monotonic() + 10
    while stopped in cl.call(new, "status")["peers"]:
        assert time.monotonic() < deadline, "a stopped peer was never dropped"
        time.sleep(0.05)
    t_drop = time.monotonic() - t0
    _note(
        "SIGSTOP of the leader", f"new leader after {t_leader:.2f}s, its channel dropped after {t_drop:.2f}s"
    )
    cl.kill(stopped, signal.SIGCONT)
    cl.converge(VOTERS)


def test_whole_cluster_restart_keeps_acked_writes(tmp_path: Path) -> None:
    c = Cluster(tmp_path, VOTERS)
    rng = random.Random(7)
    stops = ["kill -9 all", "destroy() all", "kill -9 leader first"]
    try:
        for cycle in range(len(stops) + 1):
            order = rng.sample(VOTERS, 3)
            t0 = time.monotonic()
            c.start(*order, stagger=rng.uniform(0, 0.2))
            leader = c.leader()
            t_leader = time.monotonic() - t0
            acked = c.acked()
            deadline = time.monotonic() + 15
            for n in VOTERS:
                while (m := c.call(n, "missing", keys=acked))["missing"]:
                    assert time.monotonic() < deadline, (n, m)
                    time.sleep(0.05)
            c.converge(VOTERS)
            _note(
                f"restart {cycle}",
                f"leader {t_leader:.2f}s after spawn; all {len(acked)} "
                "acknowledged writes present on every member",
            )
            if cycle == len(stops):
                break
            c.call(leader, "stream", prefix=f"c{cycle}-")
            time.sleep(rng.uniform(0.3, 0.7))
            how = stops[cycle]
            if how == "destroy() all":
                for n in order:
                    c.call(n, "destroy")
                for n in order:
                    c.procs[n].proc.wait(10)
            else:
                victims = [leader] + [n for n in order if n != leader] if "leader" in how else order
                for n in victims:
                    c.kill(n)
        assert len(c.acked()) > 100  # the streams did acknowledge writes
    finally:
        c.close()
