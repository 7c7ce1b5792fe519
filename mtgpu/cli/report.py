"""``mtgpu-admin report`` and ``mt-job usage``: GPU-hours, CPU-hours and job counts
over a period, as Slurm's ``sreport`` gives them.

Both are one ``job.usage`` call per grouping (the daemon sums the replicated usage
rows; a tenant gets only their own), printed as a table, CSV or JSON. Days are UTC.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from typing import Any

from mtgpu.cli.common import add_common, table

#: --by's words -> the daemon's group names.
BY = {
    "user": "user",
    "tenant": "user",
    "member": "member",
    "gpu_type": "gpu_type",
    "gpu": "gpu_type",
    "day": "day",
}
_COLUMNS = ("jobs", "not_completed", "gpu_hours", "cpu_hours", "gpu_seconds", "cpu_seconds", "cpu_used")
_HEAD = {
    "user": "TENANT",
    "member": "MEMBER",
    "gpu_type": "GPU TYPE",
    "day": "DAY",
    "jobs": "JOBS",
    "not_completed": "NOT COMPLETED",
    "gpu_hours": "GPU-HOURS",
    "cpu_hours": "CPU-HOURS",
    "gpu_seconds": "GPU-SECONDS",
    "cpu_seconds": "CPU-SECONDS",
    "cpu_used": "CPU USED (s)",
}


def add_period(p: argparse.ArgumentParser) -> None:
    p.add_argument("--start", help="first day, YYYY-MM-DD (UTC; default: the 1st of this month)")
    p.add_argument("--end", help="last day, YYYY-MM-DD, included (default: the end of this month)")
    p.add_argument(
        "--by",
        help="group by these, comma-separated: user, member, gpu_type, day (default: one table of each)",
    )
    p.add_argument("--csv", action="store_true", help="comma-separated values, one header line")


def add_parser(sub: Any) -> None:
    """``mtgpu-admin report``."""
    rp = sub.add_parser(
        "report",
        help="GPU-hours, CPU-hours and jobs per tenant, member, GPU type and cluster over a period",
        description="Usage over a period (default this month, UTC), as Slurm's sreport.",
        epilog="example: mtgpu-admin report --start 2026-03-01 --end 2026-03-31 --by user,gpu_type --csv",
    )
    add_common(rp)
    add_period(rp)
    rp.add_argument("--user", "-u", help="only this tenant")


def parse_by(text: str | None) -> list[str] | None:
    if not text:
        return None
    out = []
    for w in text.split(","):
        w = w.strip().lower()
        if w not in BY:
            raise ValueError(f"--by: {w[:30]!r} is not one of user, member, gpu_type, day")
        if BY[w] not in out:
            out.append(BY[w])
    return out


def fetch(api: Any, args: argparse.Namespace, everyone: bool) -> dict[str, Any]:
    """The report's data: the one grouping --by names, or every section."""
    base: dict[str, Any] = {}
    if args.start:
        base["start"] = args.start
    if args.end:
        base["end"] = args.end
    if getattr(args, "user", None):
        base["user"] = args.user
    elif everyone:
        base["all"] = True
    by = parse_by(args.by)
    if by is not None:
        return api.call("job.usage", by=by, **base)
    first = api.call("job.usage", by=["user"], **base)
    out = {k: first[k] for k in ("cluster", "start", "end", "total", "cut_months")}
    out["cluster_rows"] = [{"cluster": first["cluster"], **first["total"]}]
    out["tenants"] = first["rows"]
    if everyone and "user" not in base:  # by member is the whole cluster's, for admins
        out["members"] = api.call("job.usage", by=["member"], **base)["rows"]
    out["gpu_types"] = api.call("job.usage", by=["gpu_type"], **base)["rows"]
    return out


def _cells(rows: list[dict[str, Any]], keys: list[str]) -> list[list[Any]]:
    return [[r.get(k) if r.get(k) != "" else "-" for k in keys] for r in rows]


def render(data: dict[str, Any], fmt: str) -> str:
    """The report as ``table``, ``csv`` or ``json`` text."""
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    if "rows" in data:  # one grouping
        keys = list(data["by"]) + list(_COLUMNS)
        sections = [("", data["rows"], keys)]
    else:
        sections = [
            ("cluster", data["cluster_rows"], ["cluster", *_COLUMNS]),
            ("tenants", data["tenants"], ["user", *_COLUMNS]),
            *([("members", data["members"], ["member", *_COLUMNS])] if "members" in data else []),
            ("GPU types", data["gpu_types"], ["gpu_type", *_COLUMNS]),
        ]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        multi = len(sections) > 1
        for name, rows, keys in sections:
            if multi:
                w.writerow(["section", "start", "end", *keys])
            else:
                w.writerow(["start", "end", *keys])
            for r in rows:
                w.writerow(
                    ([name] if multi else []) + [data["start"], data["end"]] + [r.get(k) for k in keys]
                )
        return buf.getvalue().rstrip("\n")
    out = [f"Usage of {data['cluster']} from {data['start']} to {data['end']} (UTC days)"]
    if data.get("cut_months"):
        out.append(
            f"(left out: {', '.join(data['cut_months'])}, kept as whole months only and cut by this period)"
        )
    for name, rows, keys in sections:
        heads = [_HEAD.get(k, k.upper()) for k in keys]
        out.append("")
        if name:
            out.append(name[0].upper() + name[1:])
        out.append(table(_cells(rows, keys), heads) if rows else "(no usage)")
    return "\n".join(out)


def run(api: Any, args: argparse.Namespace, everyone: bool) -> int:
    import sys

    try:
        data = fetch(api, args, everyone)
    except ValueError as exc:
        print(f"{'mtgpu-admin report' if everyone else 'mt-job usage'}: {exc}", file=sys.stderr)
        return 2
    fmt = "json" if getattr(args, "json", False) else ("csv" if args.csv else "table")
    print(render(data, fmt))
    return 0
