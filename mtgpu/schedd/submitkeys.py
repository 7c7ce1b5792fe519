"""Submission keys: what makes a retried ``job.submit`` return its first outcome.

Every submission carries a key its client made (128 random bits, as hex). The job
table keeps, in the replicated state beside the queue, each key's outcome: the job
id, or the refusal decided in the log. A retry with the same key after a timeout, a
dropped connection or a failover is answered with that outcome instead of making a
second job; the answer is decided where the log is applied, so two copies of one
submission in the log (the first still uncommitted when the retry was sent) make one
job on every replica.

The table is plain dicts (stable to pickle across versions), scoped per tenant: one
tenant's key can never read or evict another's outcome. It is bounded: a key is
kept for :data:`KEY_TTL` seconds, a tenant keeps at most :data:`MAX_KEYS_PER_TENANT`
(its oldest go first), and the whole table at most :data:`MAX_KEYS`. Everything here
is deterministic (``now`` is the submission's time, from the log), so every replica
keeps and drops the same keys.
"""

from __future__ import annotations

import re
from typing import Any

#: How long a key's outcome is kept (seconds): a client retries for minutes at most.
KEY_TTL = 24 * 3600.0
#: The most keys one tenant keeps; its oldest are dropped first.
MAX_KEYS_PER_TENANT = 10_000
#: The most keys the whole table keeps; the oldest tenant's oldest are dropped first.
MAX_KEYS = 200_000
#: A key as a client sends it: 1 to 64 letters, digits, ``-`` or ``_`` (the clients
#: send 32 hex digits; a UUID with its dashes fits too).
KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_KEY_CHARS = 64

#: Keys by tenant scope, then key -> outcome (``{"job_id", "at"}`` or
#: ``{"error", "code", "at"}``), oldest first.
Keys = dict[str, dict[str, dict[str, Any]]]


def key_error(key: object) -> str | None:
    """Why ``key`` is not a submission key, or None.

    >>> key_error("9f1c2e4b7a6d4c3e8f0a1b2c3d4e5f60") is None
    True
    >>> key_error("a b")
    'the submission key must be 1 to 64 letters, digits, - or _ (send 32 random hex digits)'
    """
    if isinstance(key, str) and len(key) <= MAX_KEY_CHARS and KEY_RE.fullmatch(key):
        return None
    return (
        f"the submission key must be 1 to {MAX_KEY_CHARS} letters, digits, - or _ (send 32 random hex digits)"
    )


def scope_of(name: str, uid: int) -> str:
    """The tenant scope of a submission: its account's name and UID, so that a UID
    given to a new account after a tenant was removed does not inherit its keys.

    >>> scope_of("ann", 20001)
    '20001:ann'
    """
    return f"{uid}:{name}"


def recall(keys: Keys, scope: str, key: str, now: float) -> dict[str, Any] | None:
    """The outcome kept for ``key`` in ``scope``, or None (never seen, or expired)."""
    hit = keys.get(scope, {}).get(key)
    if hit is None or now - hit.get("at", 0.0) > KEY_TTL:
        return None
    return hit


def remember(keys: Keys, scope: str, key: str, outcome: dict[str, Any], now: float) -> None:
    """Keep ``outcome`` for ``key`` in ``scope`` (at ``now``), then enforce the bounds."""
    mine = keys.setdefault(scope, {})
    mine.pop(key, None)  # an expired key used again counts from now
    mine[key] = {**outcome, "at": now}
    expire(keys, scope, now)
    while len(mine) > MAX_KEYS_PER_TENANT:
        del mine[next(iter(mine))]
    total = sum(len(v) for v in keys.values())
    while total > MAX_KEYS:
        oldest = min(keys, key=lambda s: next(iter(keys[s].values()))["at"] if keys[s] else 0.0)
        if keys[oldest]:
            del keys[oldest][next(iter(keys[oldest]))]
            total -= 1
        if not keys[oldest]:
            del keys[oldest]


def expire(keys: Keys, scope: str, now: float) -> int:
    """Drop ``scope``'s keys older than :data:`KEY_TTL`; how many went."""
    mine = keys.get(scope)
    n = 0
    while mine:
        first = next(iter(mine))
        if now - mine[first].get("at", 0.0) <= KEY_TTL:
            break
        del mine[first]
        n += 1
    if mine is not None and not mine:
        del keys[scope]
    return n
