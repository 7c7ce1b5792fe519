"""Per-process GPU use from DRM fdinfo (``/proc/PID/fdinfo``), for drivers without an SMI library.

The kernel's "DRM client usage stats" give, for each open DRM file, the driver,
the PCI device, a client id, memory per region and busy time per engine class.
This is what intel_gpu_top and nvtop read. Two dialects exist:

- i915: ``drm-engine-render: 123 ns`` (busy time), ``drm-engine-capacity-X``,
  memory in ``drm-total-local0`` / ``drm-resident-local0``;
- xe: ``drm-cycles-rcs`` over ``drm-total-cycles-rcs`` (busy cycles against the
  GPU clock), memory in ``drm-total-vram0`` / ``drm-resident-vram0``.

A client can be reachable through several file descriptors or processes (dup,
fork); it is counted once, under the lowest PID that holds it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


@dataclass
class DrmClient:
    """One DRM client (one open of a GPU), as fdinfo shows it."""

    pid: int
    pdev: str
    client_id: str
    vram: int = 0
    # engine class -> (busy, clock): busy ns and None (i915), or busy and total cycles (xe)
    engines: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)


def parse_fdinfo(text: str) -> dict[str, str]:
    """``key: value`` lines of one fdinfo file.

    >>> parse_fdinfo("pos:\\t0\\ndrm-driver:\\txe\\n")["drm-driver"]
    'xe'
    """
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _amount(value: str) -> int:
    """``"1024 KiB"`` -> 1048576; anything unreadable -> 0."""
    number, _, unit = value.partition(" ")
    try:
        return int(number) * _UNITS.get(unit.strip(), 1)
    except ValueError:
        return 0


def client_from_fdinfo(pid: int, info: Mapping[str, str]) -> DrmClient | None:
    """A :class:`DrmClient` from parsed fdinfo, or None if it is not a DRM client."""
    if "drm-driver" not in info or "drm-client-id" not in info:
        return None
    c = DrmClient(pid=pid, pdev=info.get("drm-pdev", "").lower(), client_id=info["drm-client-id"])
    resident = total = legacy = 0
    for key, value in info.items():
        if key.startswith(("drm-resident-local", "drm-resident-vram")):
            resident += _amount(value)
        elif key.startswith(("drm-total-local", "drm-total-vram")):
            total += _amount(value)
        elif key.startswith(("drm-memory-local", "drm-memory-vram")):
            legacy += _amount(value)
        elif key.startswith("drm-engine-capacity-"):
            c.capacity[key[len("drm-engine-capacity-") :]] = max(1, _amount(value))
        elif key.startswith("drm-engine-"):
            c.engines[key[len("drm-engine-") :]] = (_amount(value.split()[0]), None)
        elif key.startswith("drm-cycles-"):
            cls = key[len("drm-cycles-") :]
            clock = _amount(info.get(f"drm-total-cycles-{cls}", "0"))
            c.engines[cls] = (_amount(value), clock)
    # Resident memory is what sits in VRAM now; older kernels only give the total.
    c.vram = resident or total or legacy
    return c


def scan(proc_root: str = "/proc", drivers: Collection[str] = ("xe", "i915")) -> list[DrmClient]:
    """Every DRM client of ``drivers`` on the host, one entry per client.

    Only descriptors that point into ``/dev/dri`` are read, so the cost is one
    ``readlink`` per open file on the host plus one small read per GPU client.
    """
    seen: dict[tuple[str, str], DrmClient] = {}
    try:
        pids = sorted(int(p) for p in os.listdir(proc_root) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # exited, or not ours to read
        for fd in fds:
            try:
                if not os.readlink(f"{fd_dir}/{fd}").startswith("/dev/dri/"):
                    continue
                with open(f"{proc_root}/{pid}/fdinfo/{fd}") as f:
                    info = parse_fdinfo(f.read())
            except OSError:
                continue
            if info.get("drm-driver") not in drivers:
                continue
            client = client_from_fdinfo(pid, info)
            if client is not None:
                seen.setdefault((client.pdev, client.client_id), client)
    return list(seen.values())


class EngineMeter:
    """Turns successive client snapshots into a busy percentage per PCI device."""

    def __init__(self) -> None:
        self._prev: dict[tuple[str, str], DrmClient] = {}
        self._prev_ns: int | None = None

    def update(self, clients: list[DrmClient], now_ns: int) -> dict[str, int]:
        """Busy % of each device's busiest engine class since the last update.

        The first update has nothing to compare with and gives 0.
        """
        busy: dict[tuple[str, str], float] = {}
        wall = (now_ns - self._prev_ns) if self._prev_ns is not None else 0
        for c in clients:
            prev = self._prev.get((c.pdev, c.client_id))
            if prev is None:
                continue
            for cls, (value, clock) in c.engines.items():
                if cls not in prev.engines:
                    continue
                pvalue, pclock = prev.engines[cls]
                if clock is not None and pclock is not None:
                    span = clock - pclock
                else:
                    span = wall
                if span <= 0 or value < pvalue:
                    continue
                share = (value - pvalue) / span / c.capacity.get(cls, 1)
                busy[(c.pdev, cls)] = busy.get((c.pdev, cls), 0.0) + share
        self._prev = {(c.pdev, c.client_id): c for c in clients}
        self._prev_ns = now_ns
        out: dict[str, int] = {}
        for (pdev, _cls), share in busy.items():
            out[pdev] = max(out.get(pdev, 0), min(100, round(share * 100)))
        return out
