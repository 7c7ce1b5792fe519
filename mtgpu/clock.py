"""The one clock of time-based policy (tenant retention, activity, disk-usage ages).

Policy code asks :func:`PolicyClock.now` instead of calling ``time.time()``, so tests
move time forward without touching the machine's clock: when the daemon's
environment names ``MTGPU_CLOCK_OFFSET_FILE``, the number of seconds in that file is
added to the real time. The file is re-read when it changes, so a test can advance a
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
        self._stamp: tuple[int, int] | None = None
        self._offset = 0.0

    @classmethod
    def from_environment(cls) -> PolicyClock:
        return cls(os.environ.get("MTGPU_CLOCK_OFFSET_FILE") or None)

    def offset(self) -> float:
        if not self.offset_file:
            return 0.0
        try:
            st = os.stat(self.offset_file)
        except OSError:
            return 0.0
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.offset_file) as f:
                    self._offset = float(f.read().strip() or 0)
            except (OSError, ValueError):
                self._offset = 0.0
            self._stamp = stamp
        return self._offset

    def now(self) -> float:
        return time.time() + self.offset()
