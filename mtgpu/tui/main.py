"""``remotegpu-cli``: the terminal client on the user's laptop.

With no subcommand it opens the full-screen view; ``servers`` and ``jobs`` print what
the view shows, for scripts (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from mtgpu.cmdline import with_examples
from mtgpu.errors import MtgpuError
from mtgpu.text import printable
from mtgpu.tui.fleet import Fleet, ServerState
from mtgpu.tui.sources import load_server_list, servers_file
from mtgpu.tui.view import FINAL, duration, elapsed, gib, left_text, usage_text


def mig_under_cards(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A server's GPUs by index, a MIG device (``parent`` set) right after its card."""
    return sorted(
        gpus,
        key=lambda g: (
            (int(g.get("index") or 0), -1)
            if g.get("parent") is None
            else (int(g["parent"]), int(g.get("index") or 0))
        ),
    )


def gpu_summary(node: dict[str, Any] | None) -> str:
    """``2x rtx4090 24.0G`` style, one group per GPU type; a card in MIG mode counts
    as its MIG devices, which are what jobs get."""
    if not node or not node.get("gpus"):
        return "no GPUs" if node else "-"
    groups: dict[tuple[str, int], int] = {}
    for g in mig_under_cards(node["gpus"]):
        if g.get("mig_mode") and g.get("parent") is None:
            continue
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
        return 1 if states and all(s.status != "up" for s in states) else 0
    if not states:
        print(f"no servers: add one with `remotegpu-cli` (key a) or to {servers_file()}", file=sys.stderr)
        return 0
    down = [s for s in states if s.status != "up"]
    rows = []
    for s in states:
        n = s.node() or {}
        if s.status != "up":
            rows.append([s.name, s.status, s.reason, "", "", ""])
            continue
        ram = f"{gib(n.get('ram_used'))}/{gib(n.get('ram_total'))}" if n else "-"
        rows.append([s.name, s.status, s.cluster_id or "standalone", gpu_summary(n), n.get("cpus", "-"), ram])
    print(_table(rows, ["SERVER", "STATUS", "CLUSTER", "GPUS", "CPUS", "RAM"]))
    # Your own usage this month on each server that answered (a cluster's members
    # each give the cluster's sums).
    used = [s for s in states if s.status == "up" and (s.usage is not None or s.usage_error is not None)]
    if used:
        print()
        for s in used:
            print(printable(f"{s.name}: {usage_text(s.usage, s.usage_error)}"))
    for s in states:
        if s.status == "up" and s.notice:
            print(f"remotegpu-cli: {s.name}: warning: {s.notice}", file=sys.stderr)
    if len(down) == len(states):
        print("remotegpu-cli: no server answered", file=sys.stderr)
        return 1
    return 0


def job_rows(fleet_jobs: list[tuple[ServerState, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{**j, "server": st.name, "cluster_id": st.cluster_id} for st, j in fleet_jobs]


def cmd_jobs(args: argparse.Namespace) -> int:
    fleet = _fleet(args)
    states = asyncio.run(fleet.once())
    jobs = job_rows(fleet.jobs())
    if not args.all:
        jobs = [j for j in jobs if j.get("state") not in FINAL]
    down = [s for s in states if s.status != "up"]
    for s in down:
        print(f"remotegpu-cli: {s.name}: {s.reason}", file=sys.stderr)
    if args.json:
        print(json.dumps(jobs, indent=2, sort_keys=True))
    else:
        now = time.time()
        rows = [
            [
                j["job_id"],
                j.get("name", ""),
                j["state"],
                j["server"],
                ",".join(j.get("nodes") or []) or "-",
                duration(elapsed(j, now)),
                left_text(j, now),
                (f"#{j['position']} " if j.get("position") else "") + (j.get("reason") or ""),
            ]
            for j in jobs
        ]
        print(_table(rows, ["JOBID", "NAME", "STATE", "SERVER", "NODES", "ELAPSED", "LEFT", "REASON"]))
    return 1 if states and len(down) == len(states) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="remotegpu-cli",
        description="Your MTGPU servers: hardware, live usage, workspaces and jobs, over SSH.",
        epilog=(
            "examples:\n"
            "  remotegpu-cli                  the full-screen view (press ? for its keys)\n"
            "  remotegpu-cli servers          every server, its GPUs and whether it answers\n"
            "  remotegpu-cli jobs --all       your jobs everywhere, finished ones too\n"
            "\n"
            "Servers come from ~/.ssh/config and ~/.config/remotegpu/servers.yaml."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up on a server that does not answer in this time (default 10)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="refresh every this many seconds (default 2)",
    )
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sp = sub.add_parser(
        "servers",
        help="every server found, with its hardware and state",
        description="Every server found, with its hardware and state; exits 1 when none answers.",
    )
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    jp = sub.add_parser("jobs", help="your jobs on every server")
    jp.add_argument("--json", action="store_true", help="machine-readable output")
    jp.add_argument("--all", "-a", action="store_true", help="finished jobs too")
    return with_examples(
        p,
        {
            "": "remotegpu-cli\nremotegpu-cli --interval 5",
            "servers": "remotegpu-cli servers\nremotegpu-cli servers --json",
            "jobs": "remotegpu-cli jobs --all",
        },
    )


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
