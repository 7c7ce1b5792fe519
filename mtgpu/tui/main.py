"""``remotegpu-cli``: the terminal client on the user's laptop.

With no subcommand it opens the full-screen view; ``servers`` and ``jobs`` print what
the view shows, for scripts (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from mtgpu.errors import MtgpuError
from mtgpu.tui.fleet import Fleet, ServerState
from mtgpu.tui.sources import load_server_list, servers_file


def gib(n: int | None) -> str:
    """Bytes as GiB with one decimal.

    >>> gib(3 * 2**30)
    '3.0G'
    """
    return "-" if n is None else f"{n / 2**30:.1f}G"


def gpu_summary(node: dict[str, Any] | None) -> str:
    """``2x rtx4090 24.0G`` style, one group per GPU type."""
    if not node or not node.get("gpus"):
        return "no GPUs" if node else "-"
    groups: dict[tuple[str, int], int] = {}
    for g in node["gpus"]:
        k = (str(g.get("type")), int(g.get("vram_total") or 0))
        groups[k] = groups.get(k, 0) + 1
    return ", ".join(f"{n}x {t} {gib(v)}" for (t, v), n in groups.items())


def _fleet(args: argparse.Namespace) -> Fleet:
    return Fleet(load_server_list(), timeout=args.timeout, interval=args.interval)


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True)


def cmd_servers(args: argparse.Namespace) -> int:
    states = asyncio.run(_fleet(args).once())
    if args.json:
        print(json.dumps([s.to_dict() for s in states], indent=2, sort_keys=True))
        return 0
    if not states:
        print(f"no servers: add one with `remotegpu-cli` (key a) or to {servers_file()}",
              file=sys.stderr)
        return 0
    rows = []
    for s in states:
        n = s.node() or {}
        if s.status != "up":
            rows.append([s.name, s.status, s.reason, "", "", ""])
            continue
        ram = f"{gib(n.get('ram_used'))}/{gib(n.get('ram_total'))}" if n else "-"
        rows.append([s.name, s.status, s.cluster_id or "standalone", gpu_summary(n),
                     n.get("cpus", "-"), ram])
    print(_table(rows, ["SERVER", "STATUS", "CLUSTER", "GPUS", "CPUS", "RAM"]))
    return 0


def job_rows(fleet_jobs: list[tuple[ServerState, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{**j, "server": st.name, "cluster_id": st.cluster_id} for st, j in fleet_jobs]


def cmd_jobs(args: argparse.Namespace) -> int:
    fleet = _fleet(args)
    states = asyncio.run(fleet.once())
    jobs = job_rows(fleet.jobs())
    if not args.all:
        jobs = [j for j in jobs if j.get("state") not in
                ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")]
    down = [s for s in states if s.status != "up"]
    for s in down:
        print(f"remotegpu-cli: {s.name}: {s.reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(jobs, indent=2, sort_keys=True))
    else:
        rows = [[j["job_id"], j.get("name", ""), j["state"], j["server"],
                 ",".join(j.get("nodes") or []) or "-",
                 (f"#{j['position']} " if j.get("position") else "") + (j.get("reason") or "")]
                for j in jobs]
        print(_table(rows, ["JOBID", "NAME", "STATE", "SERVER", "NODES", "REASON"]))
    return 1 if states and len(down) == len(states) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="remotegpu-cli",
        description="Your MTGPU servers: hardware, live usage, workspaces and jobs, over SSH.")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="give up on a server that does not answer in this time (default 10)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="refresh every this many seconds (default 2)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sp = sub.add_parser("servers", help="every server found, with its hardware and state")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    jp = sub.add_parser("jobs", help="your jobs on every server")
    jp.add_argument("--json", action="store_true", help="machine-readable output")
    jp.add_argument("--all", "-a", action="store_true", help="finished jobs too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.timeout <= 0 or args.interval <= 0:
        print("remotegpu-cli: --timeout and --interval must be more than 0", file=sys.stderr)
        return 2
    try:
        if args.cmd == "servers":
            return cmd_servers(args)
        if args.cmd == "jobs":
            return cmd_jobs(args)
        from mtgpu.tui.screen import run_screen

        return run_screen(_fleet(args))
    except MtgpuError as exc:
        print(f"remotegpu-cli: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
