"""A daemon whose policy clock the test moves (MTGPU_CLOCK_OFFSET_FILE), for the
TENANT_RETENTION_DAYS tests; the machine's clock is never touched."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from mtgpu_testing import Host

DAY = 86400


def clock_host(config: dict[str, Any]) -> Iterator[Host]:
    """A started host whose policy clock :func:`clock_mover` moves; cleaned up after."""
    h = Host(config)
    h.env["MTGPU_CLOCK_OFFSET_FILE"] = str(h.dir / "clock-offset")
    h.start()
    try:
        yield h
    finally:
        h.cleanup()


def clock_mover(host: Host) -> Iterator[Callable[[float], None]]:
    """``move(days)`` sets the host's policy clock that many days ahead (back to 0 after)."""

    def move(days: float) -> None:
        (host.dir / "clock-offset").write_text(str(days * DAY))

    move(0)
    yield move
    move(0)
