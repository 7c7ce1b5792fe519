"""A power cut of every machine of a 3-voter cluster while writes stream through its
leader: each acknowledged write was on disk on a majority, so the restarted cluster
holds every one, once (tests/durability_testing.py says how the cut is made).

Restarting all three voters proves little: the most complete disk wins the election.
The pair tests restart each pair of voters alone, from the images of one cut, with
one follower frozen some writes before the others (``lag``): a write is kept by every
pair only if it was on disk on the leader and on the follower that acknowledged it
(each member's syncs made slow, as on a slow disk, so that a member acknowledging
before its fsync is caught in the act). The leader's audit (``cmd_audit`` in
raft_harness.py) asserts that it never moved its commit index past what its journal
had fsynced. One run of each form is part of the suite; longer forms:

- ``MTGPU_DURABILITY_RUNS=N``: every test N times (each a fresh cut);
- ``MTGPU_DURABILITY_MUTANTS=1``: each mutant of raft_harness.MUTANTS must be caught.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from durability_testing import PowerCut, recovered  # noqa: E402
from raft_harness import _Member  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

VOTERS = ["n1", "n2", "n3"]
RUNS = range(int(os.environ.get("MTGPU_DURABILITY_RUNS", "1")))
#: Each sync of the cut cluster waits this long first (a slow disk): a member that
#: acknowledges before its fsync then has acknowledged, unsynced entries most of the time.
SYNC_DELAY = 0.03
#: Writes acknowledged before the first follower is frozen, and after.
BEFORE_LAG, LAG = 150, 250
#: ``logCompactionMinEntries`` of the compaction form (MTGPU runs with 20,000): the
#: log is dumped and trimmed every ~200 entries, so cuts land among compactions.
COMPACT_AT = 200
#: The restarted pairs elect sooner than the daemon's 1-2 s (safety does not depend on it).
RESTART = {"raftMinTimeout": 0.4, "raftMaxTimeout": 0.8}


@pytest.fixture
def cut(tmp_path: Path) -> Iterator[PowerCut]:
    p = PowerCut(tmp_path, VOTERS)
    yield p
    p.close()


@pytest.mark.parametrize("run", RUNS)
def test_every_acknowledged_write_survives_a_power_cut_of_every_voter(cut: PowerCut, run: int) -> None:
    acked, copies = cut.cut(cut.start(0), min_acked=500)
    after = recovered(cut.start(1, copies), VOTERS, acked)
    assert after["missing"] == 0, (
        f"{after['missing']} of {len(acked)} acknowledged writes lost: {after['sample']}"
    )
    assert after["puts"] == after["n"], after  # no write applied twice


def pair_cut(cut: PowerCut, **conf: Any) -> dict[str, Any]:
    """One cut with a lagging follower, then every pair restarted from its images:
    what each pair lost (or how its recovery failed), and the cut's details."""
    acked, copies = cut.cut(cut.start(0, sync_delay=SYNC_DELAY, **conf), min_acked=BEFORE_LAG, lag=LAG)
    lost: dict[str, Any] = {}
    for pair, c in cut.restart_pairs(copies, **RESTART).items():
        try:
            after = recovered(c, list(pair), acked)
        except AssertionError as exc:
            lost["+".join(pair)] = f"no recovery: {str(exc).splitlines()[0]}"
            continue
        if after["missing"] or after["puts"] != after["n"]:
            lost["+".join(pair)] = after
    leader = cut.last["audit"][cut.last["leader"]]
    return {"acked": acked, "lost": lost, "leader_audit": leader, **cut.last}


def check(result: dict[str, Any]) -> None:
    assert result["lost"] == {}, (
        f"of {len(result['acked'])} acknowledged writes (leader {result['leader']}, "
        f"{result['laggard']} frozen first), pairs lost: {result['lost']}"
    )
    audit = result["leader_audit"]
    assert audit["commits"] > 0 and audit["off_thread"] == 0, audit
    # (index committed, last index fsynced then) for each commit ahead of the disk
    assert audit["unsynced"] == [], f"the leader counted entries it had not fsynced: {audit}"


@pytest.mark.parametrize("run", RUNS)
def test_every_pair_of_voters_holds_every_acknowledged_write_after_a_power_cut(
    cut: PowerCut, run: int
) -> None:
    check(pair_cut(cut))


@pytest.mark.parametrize("run", RUNS)
def test_every_pair_holds_every_acknowledged_write_when_cut_among_log_compactions(
    cut: PowerCut, run: int
) -> None:
    # A cut between a compaction's dump and its journal trim once lost every write
    # after the dump (mtgpu/state/journal.py, align_journal_to_dump).
    result = pair_cut(cut, logCompactionMinEntries=COMPACT_AT)
    check(result)
    # The cut images held a full dump and a trimmed journal: compaction ran before the cut.
    assert any(had for where, had in cut.dumps.items() if where.startswith("pair-")), cut.dumps


if os.environ.get("MTGPU_DURABILITY_MUTANTS"):  # a long form: collected only when asked for

    @pytest.mark.parametrize("run", RUNS)
    @pytest.mark.parametrize("mutant", _Member.MUTANTS)
    def test_the_pair_cut_catches_a_member_that_acknowledges_what_it_has_not_synced(
        cut: PowerCut, mutant: str, run: int
    ) -> None:
        result = pair_cut(cut, mutant=mutant)
        print(f"{mutant}: lost {result['lost']}; leader audit {result['leader_audit']}")
        with pytest.raises(AssertionError):
            check(result)
        assert result["lost"], f"{mutant}: no pair lost a write ({result['leader_audit']})"
