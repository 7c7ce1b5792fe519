"""The one clock of time-based policy (tenant retention, activity, disk-usage ages),
and the seam tests move a whole daemon's wall clock through.

Policy code asks :func:`PolicyClock.now` instead of calling ``time.time()``, so tests
move time forward without touching the machine's clock: when the daemon's
environment names ``MTGPU_CLOCK_OFFSET_FILE``, the number of seconds in that file is
added to the real time. The file is read at every call, so a test can advance a
running daemon. Production never sets the variable.

:func:`shift_wall_clock` (``MTGPU_WALL_CLOCK_OFFSET_FILE``, read by ``mtgpu-server``
at start; tests only) moves the process's whole wall clock (``time.time``, which the
daemon signs host certificates with and asyncssh checks them by) by the seconds in a
file, read again as the file changes: a test runs a cluster through a year of
certificates in minutes, or steps one member's clock by minutes as NTP would. The
monotonic clock (timeouts, Raft) and CLOCK_BOOTTIME (leases) are left as they are,
as a wall-clock step leaves them.
"""

from __future__ import annotations

import os
import time

#: Tests only: a file of seconds added to the daemon's wall clock (shift_wall_clock).
WALL_OFFSET_ENV = "MTGPU_WALL_CLOCK_OFFSET_FILE"
#: How often (seconds, monotonic) that file is read again.
WALL_OFFSET_REREAD = 0.25


def shift_wall_clock(path: str) -> None:
    """Make ``time.time`` (and ``time.time_ns``) the real time plus the seconds in
    ``path``, read every WALL_OFFSET_REREAD seconds; an unreadable file keeps the last
    offset. For tests: production never sets ``MTGPU_WALL_CLOCK_OFFSET_FILE``."""
    real, real_ns = time.time, time.time_ns
    seen = [-WALL_OFFSET_REREAD, 0.0]  # when last read (monotonic), the offset then

    def offset() -> float:
        now = time.monotonic()
        if now - seen[0] >= WALL_OFFSET_REREAD:
            seen[0] = now
            try:
                with open(path) as f:
                    seen[1] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return seen[1]

    time.time = lambda: real() + offset()
    time.time_ns = lambda: real_ns() + int(offset() * 1e9)


class PolicyClock:
    """Real time plus an optional offset (seconds) read from ``offset_file``.

    >>> PolicyClock().now() - time.time() < 1
    True
    """

    def __init__(self, offset_file: str | None = None) -> None:
        self.offset_file = offset_file

    @classmethod
    def from_environment(cls) -> PolicyClock:
        return cls(os.environ.get("MTGPU_CLOCK_OFFSET_FILE") or None)

    def offset(self) -> float:
        """Seconds added to real time: the file's number (read each time), else 0."""
        if not self.offset_file:
            return 0.0
        try:
            with open(self.offset_file) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def now(self) -> float:
        return time.time() + self.offset()
