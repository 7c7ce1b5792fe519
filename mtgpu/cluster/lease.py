"""Leases: a member keeps jobs running only while the scheduler vouches for it.

The scheduler grants a lease of ``lease_seconds(CLUSTER_LOST_AFTER, CLUSTER_FENCE_GRACE)``
with every answer to a member's report. The member counts it from the moment it
*sent* that report (before the grant, on its own clock), so its lease
runs out no later than the scheduler believes; no clock sync is needed, only clocks
that tick at about the same rate.

The member writes its lease to ``STATE_DIR/jobs/.lease.json``, beside the job
directories. Every job's supervisor reads it: when the lease runs out unrenewed, the
supervisor sends SIGTERM to the job's processes and SIGKILL ``CLUSTER_FENCE_GRACE``
later, and records the job as ended by fencing. The supervisors do this without the
daemon, so a member whose daemon died (or hangs) fences its jobs all the same.

The arithmetic, with T = CLUSTER_LOST_AFTER, G = CLUSTER_FENCE_GRACE and
M = :data:`LEASE_MARGIN`: the lease is L = T - G - M. A member last renewed at the
scheduler's time g has SIGTERMed its jobs by g + L and SIGKILLed them by g + L + G;
the scheduler declares it lost (and requeues its jobs) only at g + T, M later. A
scheduler that has just taken over starts every member's clock at its own start
plus the Raft leader fall-back time (a deposed scheduler may have granted leases
until it stepped down).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

#: The lease file, in the runner's directory (root-owned, beside the job directories).
LEASE_FILE = ".lease.json"
#: Between the SIGKILL of a fenced member's jobs and the scheduler's verdict (seconds):
#: covers the supervisors' reaction, the kill itself and clock-rate drift.
LEASE_MARGIN = 2.0


def now() -> float:
    """The clock leases are kept on, on a member: CLOCK_BOOTTIME, which (unlike the
    monotonic clock) goes on counting while the machine is suspended, so a member that
    wakes up after a long sleep finds its lease over."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def lease_seconds(lost_after: float, fence_grace: float) -> float:
    """L = CLUSTER_LOST_AFTER - CLUSTER_FENCE_GRACE - LEASE_MARGIN."""
    return lost_after - fence_grace - LEASE_MARGIN


def boot_id() -> str:
    """This boot's id: a lease time from an earlier boot means nothing."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class MemberLease:
    """This member's lease, as its daemon keeps it (and writes it for the supervisors)."""

    def __init__(self, root: Path, grace: float, *, clock: Callable[[], float] = now) -> None:
        self.path = Path(root) / LEASE_FILE
        self.grace = grace
        self.clock = clock
        self.until = 0.0
        self.granted_wall = 0.0
        self.boot = boot_id()
        old = read_lease(Path(root))
        if old is not None:
            self.until = old[0]  # what the supervisors already go by (a restart)

    def held(self) -> bool:
        return self.clock() < self.until

    def granted(self, sent_at: float, seconds: float) -> None:
        """The scheduler answered a report sent at ``sent_at`` with a lease of ``seconds``."""
        until = sent_at + max(0.0, float(seconds))
        if until <= self.until:
            return
        self.until = until
        self.granted_wall = time.time()
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {"until": self.until, "grace": self.grace, "boot": self.boot, "granted": self.granted_wall}
            )
        )
        os.replace(tmp, self.path)

    def lost_since(self) -> float | None:
        """When (wall clock) the lease ran out, or None while it holds."""
        left = self.until - self.clock()
        return None if left > 0 else time.time() + left


def read_lease(root: Path) -> tuple[float, float] | None:
    """``(until, grace)`` from the lease file in ``root``; None without one (a standalone
    host: no lease is needed). A lease from another boot or unreadable is over."""
    try:
        data = json.loads((Path(root) / LEASE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return (0.0, 0.0)
    if not isinstance(data, dict) or data.get("boot") != boot_id():
        return (0.0, 0.0)
    try:
        return (float(data.get("until", 0.0)), float(data.get("grace", 0.0)))
    except (TypeError, ValueError):
        return (0.0, 0.0)


def remove_lease(root: Path) -> None:
    """A standalone host needs no lease: its jobs answer to nobody else."""
    try:
        (Path(root) / LEASE_FILE).unlink()
    except FileNotFoundError:
        pass
