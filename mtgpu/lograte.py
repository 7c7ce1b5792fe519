"""Repeated log lines are summarized, not written thousands of times.

A tenant who floods the daemon (connections, refused requests) must not fill the
disk or bury everything else in the log. :class:`RepeatFilter` lets through the
first ``burst`` lines of one kind (the same logger, level and message template,
whatever the arguments) in each ``window`` seconds. The last line let through says
that more are being counted; the first line of the next window says how many were
left out. Tracebacks of a repeated line are left out with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

BURST = 20
WINDOW = 60.0
MAX_KINDS = 10_000


class RepeatFilter(logging.Filter):
    """Drop lines of one kind beyond ``burst`` per ``window`` seconds.

    >>> now = [0.0]
    >>> f = RepeatFilter(burst=2, window=60, clock=lambda: now[0])
    >>> rec = lambda: logging.LogRecord("x", logging.WARNING, "", 0, "refused %s", ("a",), None)
    >>> [f.filter(rec()) for _ in range(4)]
    [True, True, False, False]
    >>> now[0] = 61.0
    >>> r = rec(); f.filter(r), r.getMessage()
    (True, 'refused a [2 more like this in the last 61s were left out]')
    """

    def __init__(
        self, burst: int = BURST, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        # kind -> [window start, lines let through, lines left out]
        self._kinds: dict[tuple[str, int, str], list[float]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "_mtgpu_repeat", None)
        if decided is not None:  # one record, several handlers: decide once
            return bool(decided)
        keep = self._decide(record)
        record._mtgpu_repeat = keep
        return keep

    def _decide(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        state = self._kinds.get(key)
        if state is None or now - state[0] >= self.window:
            if len(self._kinds) >= MAX_KINDS:
                self._kinds.clear()
            left_out = int(state[2]) if state is not None else 0
            self._kinds[key] = [now, 1, 0]
            if left_out:
                since = now - state[0] if state is not None else self.window
                record.msg = (
                    f"{record.msg} [{left_out} more like this in the last {since:.0f}s were left out]"
                )
            return True
        if state[1] < self.burst:
            state[1] += 1
            if state[1] == self.burst:
                record.msg = (
                    f"{record.msg} [repeated {self.burst} times; more like this are "
                    f"counted for {self.window:.0f}s, not written]"
                )
            return True
        state[2] += 1
        return False


_installed: RepeatFilter | None = None


def install(logger: logging.Logger | None = None) -> RepeatFilter:
    """Put the one shared filter on every handler of ``logger`` (the root logger)."""
    global _installed
    if _installed is None:
        _installed = RepeatFilter()
    for handler in (logger or logging.getLogger()).handlers:
        if _installed not in handler.filters:
            handler.addFilter(_installed)
    return _installed
