"""Job states: their names, Slurm's short codes, what each means, and the moves the
job table makes between them. The one place that spells them: the scheduler, the
tools, the API, remotegpu-cli and the manual ("Job states") all read them here.

The names are Slurm's, and they are what the replicated journal and the wire carry:
a :class:`JobState` is a ``str`` equal to its name, and pickles as the plain string,
so records and journal entries stay plain strings whatever a caller passes.
"""

from __future__ import annotations

import enum
from typing import Any


class JobState(enum.StrEnum):
    """A job's state, in Slurm's words."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # The journal and snapshots hold plain strings: no reference to this module.
        return (str, (self._value_,))

    @property
    def code(self) -> str:
        """Slurm's compact code (squeue's ``%t``, ``--state=PD,R``)."""
        return CODES[self]

    @property
    def meaning(self) -> str:
        """What the state means, in one line (the manual's table)."""
        return MEANINGS[self]

    @property
    def final(self) -> bool:
        """True once the job has ended: it never runs again."""
        return self in FINAL_STATES


PENDING = JobState.PENDING
RUNNING = JobState.RUNNING
COMPLETED = JobState.COMPLETED
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED
TIMEOUT = JobState.TIMEOUT
NODE_FAIL = JobState.NODE_FAIL
OUT_OF_MEMORY = JobState.OUT_OF_MEMORY

#: States a job never leaves.
FINAL_STATES: frozenset[JobState] = frozenset(
    {COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY}
)
#: States of a job that has not ended (queued, or holding its resources).
ACTIVE_STATES: frozenset[JobState] = frozenset({PENDING, RUNNING})

#: Slurm's compact codes.
CODES: dict[JobState, str] = {
    PENDING: "PD",
    RUNNING: "R",
    COMPLETED: "CD",
    FAILED: "F",
    CANCELLED: "CA",
    TIMEOUT: "TO",
    NODE_FAIL: "NF",
    OUT_OF_MEMORY: "OOM",
}
#: A state by its name or its code (what ``--state``/``-s`` accept).
BY_NAME_OR_CODE: dict[str, JobState] = {**{s.value: s for s in JobState}, **{c: s for s, c in CODES.items()}}

MEANINGS: dict[JobState, str] = {
    PENDING: "queued: waiting for resources, a dependency, a hold or its begin time",
    RUNNING: "placed on its members, from the placement on (its supervisor starts a moment later)",
    COMPLETED: "its script exited 0 (on every member)",
    FAILED: "it exited non-zero, a signal killed it, it could not start, or it was rejected",
    CANCELLED: "it was cancelled, or a dependency of it can never be met",
    TIMEOUT: "it ran past its time limit",
    NODE_FAIL: "a member was lost, or its supervisor vanished without recording an end",
    OUT_OF_MEMORY: "it went over its ram (or its VRAM limit)",
}

#: Every move the job table makes, (from, to) with when it happens; ``None`` is
#: "no job yet". Nothing else ever changes a job's state.
TRANSITIONS: dict[tuple[JobState | None, JobState], str] = {
    (None, PENDING): "submitted",
    (PENDING, RUNNING): "placed on its members",
    (PENDING, CANCELLED): "cancelled while pending, or its dependency can never be met",
    (PENDING, FAILED): "rejected by the scheduler: no member could ever run it",
    (RUNNING, PENDING): "requeued (a job file with requeue=yes): its member was lost, or drained with --now",
    (RUNNING, COMPLETED): "its script exited 0",
    (RUNNING, FAILED): "its script failed, or it could not start",
    (RUNNING, CANCELLED): "cancelled while running (also a requeue of a job whose cancel was asked)",
    (RUNNING, TIMEOUT): "it ran past its time limit",
    (RUNNING, NODE_FAIL): "its member was lost, or its supervisor vanished",
    (RUNNING, OUT_OF_MEMORY): "it went over its ram (or its VRAM limit)",
}


def can_move(old: str | None, new: str) -> bool:
    """Whether the job table ever moves a job from ``old`` to ``new``."""
    try:
        key = (JobState(old) if old is not None else None, JobState(new))
    except ValueError:
        return False
    return key in TRANSITIONS
