"""The one clock of time-based policy (tenant retention, activity, disk-usage ages).

Policy code asks :func:`PolicyClock.now` instead of calling ``time.time()``, so tests
move time forward without touching the machine's clock: when the daemon's
environment names ``MTGPU_CLOCK_OFFSET_FILE``, the number of seconds in that file is
added to the real time. The file is read at every call, so a test can advance a
running daemon. Production never sets the variable.
"""

from __future__ import annotations

import os
import time


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
