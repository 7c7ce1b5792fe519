"""Voters replaced one at a time, with real members in network namespaces: a voter cut
off past the grace period, a voter removed, and a more capable member taking a vote."""

from __future__ import annotations

import time

import pytest
from cluster_harness import Cluster, _config, status, wait_for
from mtgpu_testing import Host

pytestmark = [pytest.mark.root, pytest.mark.slow]

GRACE = 3


def roles(host: Host) -> dict[str, str]:
    return {m["name"]: m["role"] for m in status(host).get("members", [])}


def voters(host: Host) -> set[str]:
    return {n for n, r in roles(host).items() if r in ("voter", "scheduler")}


def four_members(cluster) -> tuple[Cluster, Host, str]:
    """m1 (the scheduler), two more voters and one read-only member, all equal but m1."""
    c = cluster(
        [
            ("m1", 2, {"CLUSTER_VOTER_GRACE": GRACE}),
            ("m2", 1, {"CLUSTER_VOTER_GRACE": GRACE}),
            ("m3", 1, {"CLUSTER_VOTER_GRACE": GRACE}),
            ("m4", 1, {"CLUSTER_VOTER_GRACE": GRACE}),
        ]
    )
    wait_for(lambda: c.scheduler() == "m1", timeout=60, what="m1 to become the scheduler")
    lead = c.by_name("m1")
    r = wait_for(lambda: (lambda r: r if len(voters(lead)) == 3 else None)(roles(lead)), what="three voters")
    spare = next(n for n, role in r.items() if role == "read-only")
    return c, lead, spare


def test_cut_voter_is_replaced_by_the_read_only_member_and_stays_read_only(cluster):
    c, lead, spare = four_members(cluster)
    key = lead.add_user("vic")
    wait_for(lambda: lead.ssh("vic", key, "true").returncode == 0, what="login")
    victim = next(h for h in c.hosts if roles(lead)[h.config["SERVER_NAME"]] == "voter")
    gone = victim.config["SERVER_NAME"]
    c.net.cut(victim)
    wait_for(
        lambda: roles(lead).get(spare) == "voter" and roles(lead).get(gone) == "read-only",
        timeout=60,
        what=f"{spare} promoted in place of {gone}",
    )
    assert voters(lead) == {"m1", "m2", "m3", "m4"} - {gone}
    assert f"promoted {spare} to voter: replaces {gone}, unreachable for" in lead.log_path.read_text()
    # The cluster still commits: a job submitted now is accepted.
    r = lead.ssh(
        "vic",
        key,
        "mt-job submit --parsable -",
        input=b"#!/bin/bash\n#MTGPU cpus=1 ram=10M\nsleep 300\n",
        timeout=90,
    )
    assert r.returncode == 0 and r.stdout.strip(), r.stderr

    # Back on the network, the old voter finds out it is read-only and disrupts nothing.
    c.net.heal(victim)
    try:
        wait_for(
            lambda: roles(victim).get(gone) == "read-only" and status(victim).get("scheduler") == "m1",
            timeout=60,
            what=f"{gone} to follow the cluster read-only",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {gone} sees {status(victim)}\n{victim.log()}") from None
    time.sleep(2 * GRACE)
    assert c.scheduler() == "m1"
    for h in c.hosts:
        assert roles(h).get(gone) == "read-only"
        assert voters(h) == {"m1", "m2", "m3", "m4"} - {gone}
    assert "switching this member's replica to read-only" in victim.log_path.read_text()


def test_removed_voter_is_replaced_by_the_read_only_member(cluster):
    c, lead, spare = four_members(cluster)
    gone = next(n for n, role in roles(lead).items() if role == "voter")
    r = lead.admin("cluster", "remove", gone)
    assert f"removed {gone}" in r.stdout
    c.by_name(gone).stop()
    wait_for(
        lambda: voters(lead) == {"m1", "m2", "m3", "m4"} - {gone},
        timeout=60,
        what=f"{spare} promoted after {gone} was removed",
    )
    assert roles(lead)[spare] == "voter"
    assert gone not in roles(lead)
    # The promoted member votes: it holds the replica as a voter and follows m1.
    promoted = c.by_name(spare)
    wait_for(
        lambda: status(promoted).get("scheduler") == "m1" and roles(promoted).get(spare) == "voter",
        what="the promoted member's own view",
    )
    assert f"promoted {spare} to voter: 2 voters, 3 wanted" in lead.log_path.read_text()


def test_more_capable_member_takes_the_weakest_vote_after_the_grace_period(cluster):
    grace = 8
    c = cluster([(n, g, {"CLUSTER_VOTER_GRACE": grace}) for n, g in (("m1", 2), ("m2", 1), ("m3", 1))])
    big = c.net.add(Host(_config(4, CLUSTER_VOTER_GRACE=grace), name="m4"))
    big.config["TENANT_UID_RANGE"] = c.hosts[0].config["TENANT_UID_RANGE"]
    big.config["CLUSTER_PEERS"] = [f"{h.address}:{h.port}" for h in c.hosts]
    big.write_config()
    c.hosts.append(big)
    big.start(timeout=120)
    first = c.hosts[0]
    wait_for(lambda: roles(first).get("m4") == "read-only", what="m4 admitted read-only")
    seen = time.monotonic()
    # Not before the grace period: it must have been up that long.
    while time.monotonic() - seen < grace - 3:
        assert roles(first).get("m4") == "read-only"
        time.sleep(0.5)
    wait_for(lambda: roles(first).get("m4") in ("voter", "scheduler"), timeout=60, what="m4 promoted")
    # The weakest voter (m2 and m3 tie; by name, m2) gave its vote up; still three voters.
    wait_for(lambda: roles(first).get("m2") == "read-only", what="m2 demoted")
    assert voters(first) == {"m1", "m3", "m4"}
    # The most capable voter then becomes the scheduler, and nothing flaps.
    wait_for(lambda: c.scheduler() == "m4", timeout=30, what="m4 to become the scheduler")
    time.sleep(grace + 2)
    assert voters(first) == {"m1", "m3", "m4"}
    assert roles(c.by_name("m2")).get("m2") == "read-only"
