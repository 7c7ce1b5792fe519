"""The voter rules as a table: members, how long each was up or down, scores, and now."""

from __future__ import annotations

import pytest

from mtgpu.cluster.voters import MemberState, VoterChange, plan

GRACE = 60.0
NOW = 1000.0


def v(
    name: str, score: float = 100, *, down: float | None = None, changed: float | None = None
) -> MemberState:
    """A voter; ``down`` is how many seconds it has been unreachable."""
    if down is None:
        return MemberState(name, "voter", score, True, up_since=0.0, changed=changed)
    return MemberState(name, "voter", score, False, down_since=NOW - down, changed=changed)


def r(
    name: str,
    score: float = 100,
    *,
    up: float | None = 1000,
    dialable: bool = True,
    changed: float | None = None,
) -> MemberState:
    """A read-only member; ``up`` is how many seconds it has been up (None: down now)."""
    if up is None:
        return MemberState(name, "readonly", score, False, down_since=0.0, dialable=dialable, changed=changed)
    return MemberState(name, "readonly", score, True, up_since=NOW - up, dialable=dialable, changed=changed)


CASES = [
    # (what, members, expected change or None)
    (
        "three healthy voters and a weaker read-only member: nothing",
        [v("a"), v("b"), v("c"), r("d", 90)],
        None,
    ),
    (
        "a voter down past the grace: demoted first, the read-only member promoted",
        [v("a"), v("b"), v("c", down=75), r("d")],
        VoterChange("d", "c", "unreachable for 75 s", demote_first=True),
    ),
    ("a voter down within the grace: nothing yet", [v("a"), v("b"), v("c", down=30), r("d")], None),
    (
        "a dead voter, but its replacement came up only 10 s ago: nothing yet",
        [v("a"), v("b"), v("c", down=75), r("d", up=10)],
        None,
    ),
    (
        "a dead voter and the only read-only member is down: nothing",
        [v("a"), v("b"), v("c", down=75), r("d", up=None)],
        None,
    ),
    (
        "a dead voter and the only read-only member cannot be dialed: nothing",
        [v("a"), v("b"), v("c", down=75), r("d", dialable=False)],
        None,
    ),
    (
        "two voters of three down: no majority commits anything, so nothing",
        [v("a"), v("b", down=90), v("c", down=75), r("d"), r("e")],
        None,
    ),
    (
        "of two dead voters, the one down longest is replaced first, by the most capable",
        [v("a"), v("b"), v("c"), v("d", down=65), v("e", down=90), r("f", 50), r("g", 300)],
        VoterChange("g", "e", "unreachable for 90 s", demote_first=True),
    ),
    ("the leader is never demoted, even when it looks down", [v("a", down=90), v("b"), v("c"), r("d")], None),
    (
        "too few voters: the most capable member up now is promoted at once",
        [v("a"), v("b"), r("c", 50, up=1), r("d", 200, up=1)],
        VoterChange("d", None, "2 voters, 3 wanted"),
    ),
    (
        "too few voters, but the member changed role 10 s ago: the other one",
        [v("a"), v("b"), r("c", 50), r("d", 200, changed=NOW - 10)],
        VoterChange("c", None, "2 voters, 3 wanted"),
    ),
    ("too few voters and nobody to promote: nothing", [v("a"), v("b"), r("c", up=None)], None),
    (
        "five members want five voters",
        [v("a"), v("b"), v("c"), r("d", 10), r("e", 20)],
        VoterChange("e", None, "3 voters, 5 wanted"),
    ),
    (
        "four voters among four members: the weakest non-leader steps down",
        [v("a", 50), v("b", 100), v("c", 40), v("d", 300)],
        VoterChange(None, "c", "4 voters, 3 wanted"),
    ),
    (
        "a read-only member 30% better than the weakest voter: swapped, added first",
        [v("a", 300), v("b", 100), v("c", 200), r("d", 130)],
        VoterChange("d", "b", "score 130 beats b's 100 by more than 25%"),
    ),
    ("only 20% better: no swap", [v("a", 300), v("b", 100), v("c", 200), r("d", 120)], None),
    (
        "better, but up for less than the grace: no swap yet",
        [v("a", 300), v("b", 100), v("c", 200), r("d", 500, up=59)],
        None,
    ),
    (
        "better, but the weakest voter was promoted 30 s ago: no flapping",
        [v("a", 300), v("b", 100, changed=NOW - 30), v("c", 200), r("d", 130)],
        None,
    ),
    (
        "the weakest voter is the leader: the next weakest is swapped",
        [v("a", 100), v("b", 150), v("c", 200), r("d", 500)],
        VoterChange("d", "b", "score 500 beats b's 150 by more than 25%"),
    ),
]


@pytest.mark.parametrize("members, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan(members: list[MemberState], expected: VoterChange | None) -> None:
    assert plan(members, "a", NOW, grace=GRACE) == expected


def test_one_change_at_a_time_then_settled() -> None:
    # After the swap, the same members ask for nothing more within the grace period.
    before = [v("a", 300), v("b", 100), v("c", 200), r("d", 500)]
    change = plan(before, "a", NOW, grace=GRACE)
    assert change is not None and (change.promote, change.demote) == ("d", "b")
    after = [v("a", 300), r("b", 100, changed=NOW), v("c", 200), v("d", 500, changed=NOW)]
    assert plan(after, "a", NOW + 1, grace=GRACE) is None
    assert plan(after, "a", NOW + GRACE, grace=GRACE) is None  # b is weaker: it stays read-only
