"""Who votes: the pure decision behind promotions and demotions of voters.

The leader's coordinator keeps K voters (:func:`~mtgpu.cluster.members.voter_count`),
the most capable members that are up. Each second it describes the members as
:class:`MemberState` rows and asks :func:`plan` for at most one change; it carries the
change out and only then asks again, so one change is in flight at a time.

The rules, in the order they are tried:

1. **A dead voter is replaced.** A voter unreachable from the leader for ``grace``
   seconds gives its vote to the most capable healthy read-only member: the dead one
   is demoted first (the remaining voters must still hold a majority of the smaller
   configuration), then the other is promoted.
2. **Too few voters.** Below K (after ``cluster remove``, or a demotion), the most
   capable healthy read-only member is promoted.
3. **Too many voters.** Above K (members left and K fell from 5 to 3), the weakest
   voter is demoted.
4. **A clearly more capable member takes a vote.** A read-only member that beats the
   weakest voter's score by ``margin`` replaces it: the newcomer is added first, then
   the weakest is demoted, so fault tolerance never drops.

Healthy means up now and continuously up for ``grace`` seconds (for promotion when
voters are short, up now is enough), and dialable by the leader. No member is changed
again within ``grace`` seconds of its last change, so roles do not flap. The leader is
never demoted: it hands the scheduler role on first (``transferLeadership``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtgpu.cluster.members import voter_count

#: A read-only member must beat the weakest voter's score by this factor to replace it.
SWAP_MARGIN = 1.25


@dataclass(frozen=True)
class MemberState:
    """One member as the leader sees it now."""

    name: str
    role: str  # "voter" or "readonly"
    score: float
    up: bool  # connected to the leader (and reporting, for read-only members)
    up_since: float | None = None  # continuously up since (None while down)
    down_since: float | None = None  # unreachable since (None while up)
    dialable: bool = True  # the leader can open connections to it
    changed: float | None = None  # when its role last changed


@dataclass(frozen=True)
class VoterChange:
    """One change: promote and/or demote, in the order that keeps a majority."""

    promote: str | None
    demote: str | None
    reason: str
    demote_first: bool = False


def _rank(m: MemberState) -> tuple[float, str]:
    return (m.score, m.name)


def plan(
    members: list[MemberState], leader: str, now: float, *, grace: float, margin: float = SWAP_MARGIN
) -> VoterChange | None:
    """The one voter change to make now, or None.

    >>> ms = [MemberState("a", "voter", 100, True), MemberState("b", "voter", 100, True),
    ...       MemberState("c", "readonly", 50, True, up_since=0)]
    >>> plan(ms, "a", 100.0, grace=60)
    VoterChange(promote='c', demote=None, reason='2 voters, 3 wanted', demote_first=False)
    """
    k = voter_count(len(members))

    def settled(m: MemberState) -> bool:
        return m.changed is None or now - m.changed >= grace

    def healthy(m: MemberState, steady: bool = True) -> bool:
        stable = m.up_since is not None and now - m.up_since >= grace
        return m.up and m.dialable and settled(m) and (stable or not steady)

    voters = [m for m in members if m.role == "voter"]
    if 2 * sum(1 for m in voters if m.up) <= len(voters):
        return None  # no majority up: nothing could commit
    readonly = [m for m in members if m.role != "voter"]
    steady = sorted((m for m in readonly if healthy(m)), key=_rank, reverse=True)

    # 1. A voter down for the grace period gives its vote to a healthy read-only member.
    dead = sorted(
        (
            m
            for m in voters
            if m.name != leader
            and not m.up
            and m.down_since is not None
            and now - m.down_since >= grace
            and settled(m)
        ),
        key=lambda m: (m.down_since, m.name),
    )
    for d in dead:
        rest = [m for m in voters if m is not d]
        if 2 * sum(1 for m in rest if m.up) <= len(rest) or not steady:
            break
        down = now - d.down_since  # type: ignore[operator]
        return VoterChange(steady[0].name, d.name, f"unreachable for {down:.0f} s", demote_first=True)

    # 2. Too few voters: any member up now will do, the most capable first.
    if len(voters) < k:
        ready = sorted((m for m in readonly if healthy(m, steady=False)), key=_rank, reverse=True)
        if ready:
            return VoterChange(ready[0].name, None, f"{len(voters)} voters, {k} wanted")
        return None

    movable = sorted((m for m in voters if m.name != leader and settled(m)), key=_rank)

    # 3. Too many voters: the weakest one steps down (the dead first).
    if len(voters) > k and movable:
        weakest = min(movable, key=lambda m: (m.up, m.score, m.name))
        return VoterChange(None, weakest.name, f"{len(voters)} voters, {k} wanted")

    # 4. A clearly more capable member replaces the weakest voter; add first, then demote.
    if steady and movable and steady[0].score > movable[0].score * margin:
        best, weakest = steady[0], movable[0]
        return VoterChange(
            best.name,
            weakest.name,
            f"score {best.score:g} beats {weakest.name}'s {weakest.score:g} "
            f"by more than {round((margin - 1) * 100)}%",
        )
    return None
