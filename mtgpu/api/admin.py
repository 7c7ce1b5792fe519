"""API operations for admins: the audit log, the daemon's own recent log lines and,
on a standalone host, ``cluster.status`` (a cluster of one).

``audit`` reads the replicated :class:`~mtgpu.state.audit.AuditLog`, so any member
answers it with every member's entries. ``logs`` answers with this daemon's recent
lines, kept in memory by :class:`RecentLog`; in a cluster, ``node`` asks another
member for its own.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import ApiError, ValidationError
from mtgpu.state.audit import summarize

#: Lines kept in memory for ``mtgpu-admin logs``.
RECENT_LINES = 5000
MAX_LINES = RECENT_LINES


class RecentLog(logging.Handler):
    """The daemon's newest log records, as plain dicts, for ``mtgpu-admin logs``."""

    def __init__(self, size: int = RECENT_LINES) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        with self._guard:
            self.lines.append(
                {"time": record.created, "level": record.levelname, "logger": record.name, "message": message}
            )

    def tail(self, n: int, level: int = logging.NOTSET) -> list[dict[str, Any]]:
        with self._guard:
            lines = list(self.lines)
        if level:
            lines = [ln for ln in lines if logging.getLevelName(ln["level"]) >= level]
        return lines[-n:] if n else []


_recent: RecentLog | None = None


def recent_log() -> RecentLog:
    """The process's one :class:`RecentLog`, attached to the root logger on first use."""
    global _recent
    if _recent is None:
        _recent = RecentLog()
        logging.getLogger().addHandler(_recent)
    return _recent


def _level(args: dict[str, Any]) -> int:
    name = arg(args, "level", str, "").upper()
    if not name:
        return logging.NOTSET
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValidationError(f"unknown level {name!r}; use DEBUG, INFO, WARNING or ERROR")
    return level


def standalone_status(host: Any) -> dict[str, Any]:
    """``cluster.status`` of a standalone host: a cluster of one, the same fields."""
    o = host.options
    drain = host.drains.get(o.server_name)
    st = host.store.status() if host.store is not None else {}
    keys = []
    for pub in sorted(Path(o.state_dir).glob("ssh_host_*_key.pub")):
        typ, body = pub.read_text().split()[:2]
        port = o.ssh_listen[1]
        keys.append(
            f"[{o.server_name}]:{port} {typ} {body}" if port != 22 else f"{o.server_name} {typ} {body}"
        )
    addr = o.ssh_listen[0] if o.ssh_listen[0] not in ("0.0.0.0", "::", "") else o.server_name
    return {
        "cluster_id": o.cluster_name,
        "mode": "standalone",
        "scheduler": o.server_name,
        "term": st.get("term"),
        "self": o.server_name,
        "warning": "",
        "homes": None,
        "tenant_home_root": o.tenant_home_root,
        "members": [
            {
                "name": o.server_name,
                "address": f"{addr}:{o.ssh_listen[1]}",
                "role": "scheduler",
                "state": "up",
                "score": None,
                "drained": drain is not None,
                "drain_reason": drain["reason"] if drain else None,
                "homes_shared_with": None,
            }
        ],
        "known_hosts": "\n  ".join(keys),
    }


def register(d: Dispatcher, host: Any) -> None:
    """Register the admin operations on ``d``."""
    recent = recent_log()

    def audit(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """The audit log of admin actions (every member's), oldest first."""
        limit = arg(args, "limit", int, 100)
        if limit < 0:
            raise ValidationError("limit must be 0 (everything) or more")
        return host.audit.list(limit or None, arg(args, "actor", str, None), arg(args, "action", str, None))

    async def logs(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """This daemon's recent log lines (or, with node, another member's)."""
        n = arg(args, "lines", int, 100)
        if not 0 <= n <= MAX_LINES:
            raise ValidationError(f"lines must be between 0 and {MAX_LINES}")
        level = _level(args)
        node = arg(args, "node", str, host.options.server_name)
        if node != host.options.server_name:
            cluster = getattr(host, "cluster", None)
            if cluster is None:
                raise ApiError(
                    f"no member {node!r}; this standalone host is {host.options.server_name}", "not_found"
                )
            names = {m["name"] for m in cluster.members.all()}
            if node not in names:
                raise ApiError(f"no member {node!r}; members: {', '.join(sorted(names))}", "not_found")
            return await cluster.peers.call(node, "logs", lines=n, level=args.get("level"), timeout=15)
        return {"node": host.options.server_name, "lines": recent.tail(n, level), "now": time.time()}

    def isolation(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """The tenants' fence parts this host cannot set up now, whose sessions and
        jobs it refuses (``mtgpu-setup status``)."""
        fence = getattr(host, "fence", None)
        return {"refused": fence.refused() if fence is not None else []}

    d.register("audit", audit, admin=True)
    d.register("logs", logs, admin=True)
    d.register("isolation", isolation, admin=True)
    if getattr(host, "cluster", None) is None:

        def status(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
            """This standalone host, as a cluster of one."""
            return standalone_status(host)

        d.register("cluster.status", status, admin=True)


async def write_audit(host: Any, caller: Caller, op: str, args: dict[str, Any], error: str | None) -> None:
    """One audit entry for an admin action (the dispatcher's auditor)."""
    entry = {
        "time": time.time(),
        "actor": caller.name,
        "uid": caller.uid,
        "via": caller.via,
        "member": host.options.server_name,
        "action": op,
        "args": summarize(args),
        "ok": error is None,
        "error": error,
    }
    await host.replicate(host.audit.record, entry, timeout=5)
