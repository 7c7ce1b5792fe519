"""Per-tenant submission limits: USER_SUBMIT_RATE / USER_SUBMIT_BURST,
USER_MAX_QUEUED_JOBS and USER_MAX_QUEUED_SCRIPT_BYTES.

One tenant's script stuck in a loop must not fill the replicated journal or the queue
for everyone. Every submission, accepted or refused, first takes a token from a bucket
per tenant (``burst`` at once, then ``rate`` a second): refused submissions cost the
daemon work too. A tenant's pending jobs (array tasks counted one by one) and the
bytes of their pending jobs' scripts are capped. The checks run where the job table
is written (the scheduler), before anything is recorded, and a refusal says which
limit and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mtgpu.errors import ApiError


class SubmitLimits:
    """The limits of one member; ``None`` for a limit turns it off.

    >>> lim = SubmitLimits(rate=1, burst=2, max_queued=None, clock=lambda: 0.0)
    >>> lim.check("ann", 1, 0); lim.check("ann", 1, 0)
    >>> lim.check("ann", 1, 0)
    Traceback (most recent call last):
    ...
    mtgpu.errors.ApiError: too many submissions: USER_SUBMIT_RATE allows 1 a second after a burst of 2; wait 1s and retry (or submit an array with array=)
    """

    def __init__(
        self,
        rate: float | None,
        burst: int | None,
        max_queued: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.max_queued = rate, burst, max_queued
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, at)

    #: The most tenants whose buckets are kept; the longest idle go first.
    MAX_BUCKETS = 100_000

    def check(self, user: str, tasks: int, queued: int) -> None:
        """Refuse (ApiError ``rate_limited`` / ``queue_full``) or take one submission
        of ``tasks`` jobs by ``user``, who has ``queued`` jobs pending."""
        self.check_queue(user, tasks, queued)
        self.take(user)

    def check_queue(
        self,
        user: str,
        tasks: int,
        queued: int,
        script_bytes: int = 0,
        queued_bytes: int = 0,
        max_bytes: int | None = None,
    ) -> None:
        """Refuse (``queue_full``) ``tasks`` more pending jobs for ``user``, who has
        ``queued`` pending, or ``script_bytes`` more script on ``queued_bytes``."""
        if self.max_queued is not None and queued + tasks > self.max_queued:
            raise ApiError(
                f"too many pending jobs: you have {queued} waiting and "
                f"USER_MAX_QUEUED_JOBS is {self.max_queued}; wait for some to "
                "start or cancel some (`mt-job list`)",
                "queue_full",
            )
        if max_bytes is not None and queued_bytes + script_bytes > max_bytes:
            raise ApiError(
                f"too many bytes of pending job scripts: yours take {queued_bytes} "
                f"bytes, this one {script_bytes}, and USER_MAX_QUEUED_SCRIPT_BYTES is "
                f"{max_bytes}; wait for some to start, cancel some, or keep data "
                "out of job scripts",
                "queue_full",
            )

    def take(self, user: str) -> None:
        """Take one submission's token for ``user``, or refuse (``rate_limited``)."""
        if self.rate is not None and self.burst is not None:
            now = self.clock()
            tokens, at = self._buckets.get(user, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1:
                wait = (1 - tokens) / self.rate
                raise ApiError(
                    f"too many submissions: USER_SUBMIT_RATE allows {self.rate:g} a "
                    f"second after a burst of {self.burst}; wait {max(1, round(wait))}s "
                    "and retry (or submit an array with array=)",
                    "rate_limited",
                )
            self._buckets.pop(user, None)  # re-inserted last: the dict is in use order
            self._buckets[user] = (tokens - 1, now)
            while len(self._buckets) > self.MAX_BUCKETS:
                # A forgotten bucket is a full one: the idlest tenants lose nothing.
                del self._buckets[next(iter(self._buckets))]
