"""``mtgpu-admin usage`` and ``mtgpu-admin retention``: tenant policy on a member."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mtgpu.cli.common import add_common, emit, table
from mtgpu.config.units import format_size


def add_parsers(sub: Any) -> None:
    """Add the ``usage`` and ``retention`` commands to mtgpu-admin's subparsers."""
    us = sub.add_parser("usage", help="tenants' disk usage against USER_DISK_LIMIT on this member")
    add_common(us)
    us.add_argument("--refresh", action="store_true", help="measure every home now first")
    rt = sub.add_parser(
        "retention", help="lock, then remove, tenants inactive for TENANT_RETENTION_DAYS (runs one pass now)"
    )
    add_common(rt)
    rt.add_argument(
        "--dry-run", "-n", action="store_true", help="only list what a pass would do; change nothing"
    )
    rt.add_argument(
        "--retry", action="store_true", help="retry failed removals now, without waiting for their back-off"
    )
    rt.add_argument("--unlock", metavar="NAME", help="let a tenant that retention locked log in again")


def dispatch(args: argparse.Namespace, api: Any) -> None:
    if args.cmd == "usage":
        emit(args, api.call("usage", refresh=args.refresh or None), usage_text)
    elif args.unlock:
        r = api.call("retention.unlock", name=args.unlock)
        emit(
            args,
            r,
            f"{r['name']} is unlocked; its inactivity counts from now"
            if r["was_locked"]
            else f"{r['name']} was not locked",
        )
    else:
        emit(
            args,
            api.call("retention", dry_run=args.dry_run or None, retry=args.retry or None),
            retention_text,
        )


def _ago(t: float | None, now: float) -> str:
    if not t:
        return "never"
    d = max(0, int(now - t))
    return f"{d}s ago" if d < 120 else f"{d // 60}m ago" if d < 7200 else f"{d // 3600}h ago"


def usage_text(r: dict[str, Any]) -> str:
    now = time.time()
    limit = r["limit"]
    head = (
        f"{r['server']}: USER_DISK_LIMIT {format_size(limit) if limit else 'not set'}; "
        f"mode {r['mode']} ({r['detail']})"
    )
    if r["mode"] == "scan":
        head += f"; homes measured every {r['scan_interval']:g}s"
    rows = []
    for t in r["tenants"]:
        used = t["used"]
        pct = f"{100 * used / limit:.0f}%" if used is not None and limit else ""
        rows.append(
            [
                t["user"],
                t["uid"],
                format_size(used) if used is not None else "-",
                t["files"] if t["files"] is not None else "-",
                format_size(limit) if limit else "-",
                pct,
                t["state"] + (f" ({t['error']})" if t["error"] else ""),
                _ago(t["measured_at"], now),
            ]
        )
    return head + "\n" + table(rows, ["USER", "UID", "USED", "FILES", "LIMIT", "USE%", "STATE", "MEASURED"])


def retention_text(r: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r["now"]))
    if r.get("disabled"):
        return r["disabled"]
    head = (
        f"{'dry run' if r['dry_run'] else 'retention pass'} at {when}: tenants inactive "
        f"{r['days']:g} days are locked, and removed {r['grace_days']:g} days later "
        f"(home: {r['home']})" + ("; nothing was changed" if r["dry_run"] else "")
    )
    rows = []
    for s in r["steps"]:
        action = s["action"]
        if r["dry_run"] and action in ("lock", "remove"):
            action = "would " + action
        extra = s.get("done") or (
            time.strftime(
                ("retried %Y-%m-%d %H:%M" if action == "failed" else "due %Y-%m-%d"), time.gmtime(s["due"])
            )
            if s.get("due")
            else ""
        )
        rows.append([s["user"], action, f"{s['inactive_days']:.0f}", s["reason"], extra])
    return head + "\n" + table(rows, ["USER", "ACTION", "IDLE DAYS", "WHY", "RESULT"])
