"""Per-tenant submission limits: USER_SUBMIT_RATE / USER_SUBMIT_BURST and
USER_MAX_QUEUED_JOBS.

One tenant's script stuck in a loop must not fill the replicated journal or the queue
for everyone. Submissions pass a token bucket per tenant (``burst`` at once, then
``rate`` a second), and a tenant's pending jobs (array tasks counted one by one) are
capped. Both checks run where the job table is written (the scheduler), before
anything is recorded, and a refusal says which limit and what to do.
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

    def __init__(self, rate: float | None, burst: int | None, max_queued: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_queued = rate, burst, max_queued
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, at)

    def check(self, user: str, tasks: int, queued: int) -> None:
        """Refuse (ApiError ``rate_limited`` / ``queue_full``) or take one submission
        of ``tasks`` jobs by ``user``, who has ``queued`` jobs pending."""
        if self.max_queued is not None and queued + tasks > self.max_queued:
            raise ApiError(f"too many pending jobs: you have {queued} waiting and "
                           f"USER_MAX_QUEUED_JOBS is {self.max_queued}; wait for some to "
                           "start or cancel some (`mt-job list`)", "queue_full")
        if self.rate is not None and self.burst is not None:
            now = self.clock()
            tokens, at = self._buckets.get(user, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1:
                wait = (1 - tokens) / self.rate
                raise ApiError(f"too many submissions: USER_SUBMIT_RATE allows {self.rate:g} a "
                               f"second after a burst of {self.burst}; wait {max(1, round(wait))}s "
                               "and retry (or submit an array with array=)", "rate_limited")
            self._buckets[user] = (tokens - 1, now)
            if len(self._buckets) > 100_000:
                self._buckets.clear()
