"""``mt-job``: submit, list, show, cancel and follow jobs; see the nodes.

Every action is one API call over the Unix socket, made as the tenant, so the same
command works in tmux and as ``ssh host mt-job ...``. It imports little, so it starts
fast: Slurm's ``sbatch`` is the yardstick.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

# Directive names accepted as --KEY=VALUE overrides on `submit` (as in the job file).
OVERRIDES = ("gpus", "gpu_mode", "vram", "cpus", "ram", "container", "nodes", "array",
             "server", "name", "priority", "time", "output", "error", "workdir", "requeue")




def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _when(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="simple") if rows else "(no jobs)"


def cmd_submit(args: argparse.Namespace, api: Any) -> int:
    import uuid

    if args.file == "-":
        script = sys.stdin.read()
        workdir = ""  # the daemon uses the tenant's home, as for `ssh host mt-job submit -`
    else:
        try:
            with open(args.file) as f:
                script = f.read()
        except OSError as exc:
            print(f"mt-job: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return 1
        workdir = os.getcwd()
    overrides = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    token = uuid.uuid4().hex
    r = _retrying(lambda: api.call("job.submit", script=script, overrides=overrides,
                                   workdir=workdir, token=token))
    for w in r.get("warnings", []):
        print(f"mt-job: warning: {w}", file=sys.stderr)
    if args.json:
        _print_json(r)
    elif args.parsable:
        print(r["job_id"])
    else:
        extra = f" ({r['tasks']} array tasks)" if r["tasks"] > 1 else ""
        print(f"Submitted job {r['job_id']}{extra}")
    return 0


RETRY_CODES = ("no_leader", "unreachable", "no_answer", "closed", "error")
RETRY_SECONDS = 30.0


def _retrying(fn: Any) -> Any:
    """Retry through a scheduler election. The submission token makes a retry of a
    request that did commit return the same job instead of a second one."""
    from mtgpu.errors import ApiError

    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return fn()
        except ApiError as exc:
            retriable = exc.code in RETRY_CODES and ("retry" in str(exc) or exc.code != "error")
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def cmd_list(args: argparse.Namespace, api: Any) -> int:
    jobs = api.call("job.list", all=args.all or None, user=args.user)
    if args.json:
        _print_json(jobs)
        return 0
    rows = []
    for j in jobs:
        where = ",".join(j["nodes"]) if j["nodes"] else (
            f"({j['reason']})" if j["state"] == "PENDING" else "")
        pos = j.get("position")
        rows.append([j["job_id"], j["name"][:20], j["user"], j["state"],
                     pos if pos is not None else "", _when(j["submit_time"]), where])
    print(_table(rows, ["JOBID", "NAME", "USER", "STATE", "POS", "SUBMIT", "NODES (REASON)"]))
    return 0


def cmd_show(args: argparse.Namespace, api: Any) -> int:
    j = api.call("job.show", job_id=args.job_id)
    if args.json:
        _print_json(j)
        return 0
    views = j["tasks"] if j.get("array") else [j]
    for v in views:
        lines = [f"job_id:    {v['job_id']}", f"name:      {v['name']}", f"user:      {v['user']}",
                 f"state:     {v['state']}"]
        if v["state"] == "PENDING":
            lines.append(f"position:  {v.get('position')}")
            lines.append(f"reason:    {v['reason']}" + (f" - {v['reason_detail']}" if v.get("reason_detail") else ""))
        elif v.get("reason"):
            lines.append(f"reason:    {v['reason']}")
        if v.get("requeues"):
            lines.append(f"requeued:  {v['requeues']} time(s), last: {v.get('requeue_reason')}")
        gpus = ", ".join(str(g["node"]) + ":" + str(g["index"]) for g in v["gpus"]) or "-"
        lines += [f"nodes:     {','.join(v['nodes']) or '-'}",
                  f"gpus:      {gpus}",
                  f"exit_code: {v['exit_code'] if v['exit_code'] is not None else '-'}",
                  f"submitted: {_when(v['submit_time'])}  started: {_when(v['start_time'])}  "
                  f"ended: {_when(v['end_time'])}",
                  f"workdir:   {v['workdir']}", f"stdout:    {v['stdout']}", f"stderr:    {v['stderr']}"]
        if v.get("container"):
            image = f" ({v['image_id'][:12]})" if v.get("image_id") else ""
            lines.append(f"container: {v['container']}{image}")
        for node, text in sorted((v.get("progress") or {}).items()):
            lines.append(f"progress:  {node}: {text}")
        print("\n".join(lines))
        if len(views) > 1:
            print()
    return 0


def cmd_cancel(args: argparse.Namespace, api: Any) -> int:
    r = api.call("job.cancel", job_ids=args.job_ids)
    if args.json:
        _print_json(r)
    for jid in r.get("not_found", []):
        print(f"mt-job: no job {jid} of yours", file=sys.stderr)
    return 1 if r.get("not_found") else 0


def cmd_logs(args: argparse.Namespace, api: Any) -> int:
    """Print a job's output; with -f, follow it until the job ends (as the tenant)."""
    j = api.call("job.show", job_id=args.job_id)
    if j.get("array"):
        print(f"mt-job: {args.job_id} is an array; name one task, such as {j['tasks'][0]['job_id']}",
              file=sys.stderr)
        return 1
    path = j["stderr"] if args.stderr else j["stdout"]
    offset = 0
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            print(f"mt-job: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 1
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            offset += len(data)
        if not args.follow or j["state"] in final:
            return 0
        time.sleep(0.5)
        j = api.call("job.show", job_id=args.job_id)


def cmd_nodes(args: argparse.Namespace, api: Any) -> int:
    nodes = api.call("nodes")
    if args.json:
        _print_json(nodes)
    else:
        from mtgpu.gpuinfo.report import format_nodes_table

        print(format_nodes_table(nodes))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mt-job", description="Submit and follow MTGPU jobs.")
    p.add_argument("--config", help="the daemon's configuration (default $MTGPU_CONFIG)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return sp

    s = common(sub.add_parser("submit", help="submit a job file (- reads standard input)"))
    s.add_argument("--parsable", action="store_true", help="print only the job ID")
    for k in OVERRIDES:
        s.add_argument(f"--{k}", *( [f"--{k.replace('_', '-')}"] if "_" in k else []), dest=k,
                       metavar="VALUE", help=argparse.SUPPRESS)
    s.add_argument("file", help="the job file, or - for standard input")
    lp = common(sub.add_parser("list", help="your jobs (pending and running; --all for finished)"))
    lp.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    lp.add_argument("--user", "-u", help="only this user's jobs (admins)")
    sp = common(sub.add_parser("show", help="one job, with why it waits"))
    sp.add_argument("job_id")
    cp = common(sub.add_parser("cancel", help="cancel jobs"))
    cp.add_argument("job_ids", nargs="+")
    gp = common(sub.add_parser("logs", help="a job's output"))
    gp.add_argument("job_id")
    gp.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    gp.add_argument("--stderr", action="store_true", help="the error stream")
    common(sub.add_parser("nodes", help="members, GPUs, VRAM, CPUs and RAM"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mtgpu.cli.common import run_cli, tenant_client

    commands = {"submit": cmd_submit, "list": cmd_list, "show": cmd_show, "cancel": cmd_cancel,
                "logs": cmd_logs, "nodes": cmd_nodes}
    return run_cli("mt-job", lambda: commands[args.cmd](args, tenant_client(args)))


if __name__ == "__main__":
    sys.exit(main())
