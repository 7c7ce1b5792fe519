"""A member's relay to the scheduler through a failover (``mtgpu.cluster.relay``).

The old scheduler's machine is gone: a dial to it is answered by nothing, so it would
wait out the whole connect timeout (600 s here). Once the member's view names
another scheduler, the relay gives up on the old one at once and goes to the new one.
Real dials over TCP (the peer client as members use it); the bound below is far under
the connect timeout, so a relay inside it did not wait for the dead machine."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import asyncssh
import pytest

from mtgpu.cluster.identity import ClusterIdentity
from mtgpu.cluster.peers import PeerClient
from mtgpu.cluster.relay import relay
from mtgpu.errors import ApiError

KEY = "s3cret-cluster-key-0123456789"
CONNECT_TIMEOUT = 600.0
#: Far under CONNECT_TIMEOUT: a relay that ended this soon did not wait for the dial.
BOUND = 60.0


def silent_listener() -> socket.socket:
    """A port that takes TCP connections and never says a word (a hung machine)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peers(tmp_path: Path, addresses: dict[str, str]) -> PeerClient:
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(tmp_path / "ssh_host_ed25519_key"))
    return PeerClient(
        ClusterIdentity.derive("lab", KEY),
        "m9",
        str(tmp_path),
        addresses.get,
        connect_timeout=CONNECT_TIMEOUT,
    )


def test_a_relay_leaves_a_dial_to_a_dead_scheduler_once_another_is_named(tmp_path):
    dead = silent_listener()
    addresses = {"old": f"127.0.0.1:{dead.getsockname()[1]}", "new": f"127.0.0.1:{closed_port()}"}
    client = peers(tmp_path, addresses)
    view = {"leader": "old"}

    async def main() -> ApiError:
        async def elect() -> None:
            await asyncio.sleep(1.0)  # the dial to the old one is under way by now
            view["leader"] = "new"

        election = asyncio.ensure_future(elect())
        with pytest.raises(ApiError) as err:
            await relay(
                client, lambda: view["leader"], "job.submit", {"script": "x", "token": "k"}, {}, wait=3.0
            )
        await election
        return err.value

    t0 = time.monotonic()
    try:
        exc = asyncio.run(main())
    finally:
        client.close()
        dead.close()
    # It went on to the new scheduler (here refusing connections, so the relay ends
    # with its error) instead of waiting out the dial to the dead one.
    assert exc.code == "unreachable" and "member new" in str(exc), exc
    assert time.monotonic() - t0 < BOUND


def test_a_relay_waits_for_a_scheduler_during_an_election_and_says_so_after(tmp_path):
    client = peers(tmp_path, {})

    async def main() -> ApiError:
        with pytest.raises(ApiError) as err:
            await relay(client, lambda: None, "job.list", {}, {}, wait=0.5)
        return err.value

    exc = asyncio.run(main())
    assert exc.code == "no_leader" and exc.retryable, exc


# -------------------------------------------------------- on a real cluster

#: A dial to a machine that answers nothing waits this long here (the default is 5 s):
#: a relay that waited for the dead scheduler's dial would outlast the bound below.
SLOW_DIAL = "120s"


@pytest.mark.root
@pytest.mark.slow
def test_a_request_relayed_as_the_scheduler_dies_goes_to_the_new_one_at_once(cluster):
    from cluster_harness import wait_for

    c = cluster([(f"m{i}", 0, {"CLUSTER_CONNECT_TIMEOUT": SLOW_DIAL}) for i in (1, 2, 3)])
    sched = c.by_name(c.scheduler())
    follower = next(h for h in c.hosts if h is not sched)
    wait_for(lambda: follower.api("job.list", timeout=30).get("ok"), what="a relayed list")
    # The scheduler's machine dies: its process is killed (its connections reset), then
    # its address answers nothing, as a powered-off machine's does. The follower still
    # names it until a new scheduler is elected (1-2 s), so a request relayed now dials
    # the dead address.
    sched.stop(signal.SIGKILL)
    c.net.cut(sched)
    t0 = time.monotonic()
    try:
        answer = follower.api("job.list", timeout=110)
    except OSError as exc:  # no answer within 110 s: it waited for the dead scheduler
        answer = {"ok": False, "error": f"no answer: {exc}"}
    took = time.monotonic() - t0
    c.net.heal(sched)
    assert answer.get("ok"), (answer, follower.log()[-4000:])
    assert took < BOUND, took
