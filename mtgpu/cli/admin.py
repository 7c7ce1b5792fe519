"""``mtgpu-admin``: users, invites, members, jobs, the audit log and the daemon's log,
for admins on a member (root, or a user with the admin flag, over ssh too)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mtgpu.cli import policy_admin, report
from mtgpu.cli.common import (
    CANCEL_WAIT,
    add_common,
    base_parser,
    cancel_report,
    emit,
    hold_report,
    run_cli,
    table,
    tenant_client,
)
from mtgpu.cmdline import with_examples
from mtgpu.errors import MtgpuError, ValidationError
from mtgpu.jobstate import PENDING, RUNNING


def _ago(t: float | None) -> str:
    if not t:
        return "never"
    d = time.time() - t
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= secs:
            return f"{int(d // secs)}{unit} ago"
    return "just now"


def build_parser() -> argparse.ArgumentParser:
    p = base_parser("mtgpu-admin", "Manage MTGPU users, invites and hosts.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    user = sub.add_parser("user", help="add, list, show and remove users")
    add_common(user)
    us = user.add_subparsers(dest="ucmd", required=True, metavar="ACTION")
    a = us.add_parser("add", help="register a user with a public key")
    add_common(a)
    a.add_argument("name")
    a.add_argument("--key", action="append", required=True, help="an OpenSSH public key line (repeatable)")
    a.add_argument("--admin", action="store_true", help="make the user an MTGPU admin")
    for name, hlp in (("list", "list users"),):
        add_common(us.add_parser(name, help=hlp))
    for name, hlp in (
        ("show", "show one user"),
        ("remove", "remove a user: lock the account, end its work (keeps the home)"),
    ):
        x = us.add_parser(name, help=hlp)
        add_common(x)
        x.add_argument("name")
    key = us.add_parser("key", help="add or remove a user's keys")
    add_common(key)
    ks = key.add_subparsers(dest="kcmd", required=True, metavar="ACTION")
    for name in ("add", "remove"):
        k = ks.add_parser(name, help=f"{name} a public key")
        add_common(k)
        k.add_argument("name")
        k.add_argument("key", help="an OpenSSH public key line, quoted")

    inv = sub.add_parser("invite", help="issue a one-time invite code for a user")
    add_common(inv)
    inv.add_argument("name")
    inv.add_argument("--expires", help="how long the code stays valid (default 7d): 30m, 12h, 7d")
    inv.add_argument("--admin", action="store_true", help="the user becomes an admin")

    who = sub.add_parser("whoami", help="who the daemon believes you are")
    add_common(who)

    nodes = sub.add_parser("nodes", help="members, GPUs, VRAM, CPUs, RAM and the jobs on them")
    add_common(nodes)
    dr = sub.add_parser("drain", help="take no new work on a member; its running jobs go on")
    add_common(dr)
    dr.add_argument("node", help="the member's name (SERVER_NAME)")
    dr.add_argument("--reason", default="", help="why, shown with the member's state")
    dr.add_argument(
        "--now",
        action="store_true",
        help="also empty it: requeue its running jobs that allow it (requeue=yes) "
        "and cancel the others, recording the reason",
    )
    ud = sub.add_parser("undrain", help="let a drained member take new work again")
    add_common(ud)
    ud.add_argument("node", help="the member's name (SERVER_NAME)")
    jobs = sub.add_parser("jobs", help="every tenant's jobs")
    add_common(jobs)
    jobs.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    jobs.add_argument("--user", "-u", help="only this user's jobs")
    jobs.add_argument("--state", "-t", help="only jobs in this state (RUNNING, PENDING...)")
    can = sub.add_parser("cancel", help="cancel any tenant's jobs, with a reason")
    add_common(can)
    can.add_argument("job_ids", nargs="+", metavar="JOBID")
    can.add_argument("--reason", default="", help="why; the job's owner sees it with the job")
    for verb, what in (
        ("hold", "keep any tenant's pending jobs from starting"),
        ("release", "let held jobs start"),
    ):
        hr = sub.add_parser(verb, help=what)
        add_common(hr)
        hr.add_argument(
            "job_ids", nargs="+", metavar="JOBID", help="jobs (an array's id: all its pending tasks)"
        )
    rq = sub.add_parser("requeue", help="put any tenant's running jobs back in the queue, to run again")
    add_common(rq)
    rq.add_argument("job_ids", nargs="+", metavar="JOBID", help="jobs (an array's id: all its running tasks)")
    rq.add_argument("--reason", default="", help="why; the job's owner sees it with the job")
    up = sub.add_parser("update", help="change pending jobs' time limit or priority")
    add_common(up)
    up.add_argument("job_ids", nargs="+", metavar="JOBID", help="jobs (an array's id: all its pending tasks)")
    up.add_argument(
        "-t",
        "--time-limit",
        dest="time_limit",
        help="the new limit, as sbatch's --time (2:00:00, 90, UNLIMITED)",
    )
    up.add_argument("--priority", type=int, help="the new priority, 0 to 100 (default 50)")
    aud = sub.add_parser("audit", help="admin actions: who did what, when, with which arguments")
    add_common(aud)
    aud.add_argument(
        "--limit", "-n", type=int, default=50, help="the newest N entries (default 50; 0: all kept)"
    )
    aud.add_argument("--user", help="only this admin's actions")
    aud.add_argument("--action", help="only this action, e.g. node.drain or user")
    lg = sub.add_parser("logs", help="the daemon's own recent log lines")
    add_common(lg)
    lg.add_argument("--lines", "-n", type=int, default=100, help="how many (default 100)")
    lg.add_argument("--level", help="at least this level: DEBUG, INFO, WARNING, ERROR")
    lg.add_argument("--node", help="another member's log (in a cluster)")
    cl = sub.add_parser("cluster", help="the cluster: members, roles, the scheduler")
    add_common(cl)
    cls = cl.add_subparsers(dest="ccmd", required=True, metavar="ACTION")
    cst = cls.add_parser("status", help="members, their roles and state, the scheduler")
    add_common(cst)
    cst.add_argument(
        "--hosts",
        metavar="PATTERNS",
        help="the host patterns of the printed known_hosts line, comma-separated "
        "(default: the members' names and addresses), e.g. 'gpu*.example.org'",
    )
    rm = cls.add_parser("remove", help="take a member out of the cluster")
    add_common(rm)
    rm.add_argument("name")
    sim = sub.add_parser(
        "simulate",
        help="set a simulated GPU's outside use, or a job's use "
        "(hosts with SIMULATED_GPUS only: tests, demos)",
    )
    add_common(sim)
    sim.add_argument("node", nargs="?", help="this member's name (with GPU_INDEX)")
    sim.add_argument("gpu_index", type=int, nargs="?")
    sim.add_argument(
        "--used",
        required=True,
        help="VRAM taken, e.g. 20G: by work outside "
        "MTGPU on NODE's GPU GPU_INDEX, or with --job by the job's process",
    )
    sim.add_argument(
        "--job", help="a job running here: its main process holds --used on each of its GPUs here"
    )
    sim.add_argument("--pid", type=int, help="with --job: this process holds it instead")
    policy_admin.add_parsers(sub)
    report.add_parser(sub)
    return with_examples(p, EXAMPLES)


#: The examples at the end of each command's --help (and manual page).
EXAMPLES = {
    "": 'sudo mtgpu-admin user add alice --key "$(cat alice.pub)"\nsudo mtgpu-admin nodes\n'
    'sudo mtgpu-admin drain gpu01 --reason "replacing a fan"',
    "user": "sudo mtgpu-admin user list\nsudo mtgpu-admin user show alice",
    "user add": 'sudo mtgpu-admin user add alice --key "ssh-ed25519 AAAAC3Nza... alice@laptop"\n'
    'sudo mtgpu-admin user add bob --key "$(cat bob.pub)" --admin',
    "user list": "sudo mtgpu-admin user list\nsudo mtgpu-admin user list --json",
    "user show": "sudo mtgpu-admin user show alice",
    "user remove": "sudo mtgpu-admin user remove bob",
    "user key": 'sudo mtgpu-admin user key add alice "$(cat alice-desktop.pub)"',
    "user key add": 'sudo mtgpu-admin user key add alice "$(cat alice-desktop.pub)"',
    "user key remove": 'sudo mtgpu-admin user key remove alice "ssh-ed25519 AAAAC3Nza... alice@old"',
    "invite": "sudo mtgpu-admin invite carol\nsudo mtgpu-admin invite dave --expires 12h",
    "whoami": "mtgpu-admin whoami",
    "nodes": "sudo mtgpu-admin nodes\nsudo mtgpu-admin nodes --json",
    "drain": 'sudo mtgpu-admin drain gpu01 --reason "replacing a fan"\n'
    'sudo mtgpu-admin drain gpu01 --now --reason "replacing a fan"',
    "undrain": "sudo mtgpu-admin undrain gpu01",
    "jobs": "sudo mtgpu-admin jobs\nsudo mtgpu-admin jobs --all --user alice --state FAILED",
    "cancel": 'sudo mtgpu-admin cancel 2 --reason "runs on the wrong dataset"',
    "hold": "sudo mtgpu-admin hold 42 43",
    "release": "sudo mtgpu-admin release 42",
    "requeue": 'sudo mtgpu-admin requeue 42 --reason "gpu01 is going down"',
    "update": "sudo mtgpu-admin update 42 --time-limit 4:00:00\nsudo mtgpu-admin update 42 43 --priority 90",
    "audit": "sudo mtgpu-admin audit\nsudo mtgpu-admin audit --action node --json -n 1",
    "logs": "sudo mtgpu-admin logs -n 20\nsudo mtgpu-admin logs --level ERROR --node gpu02",
    "cluster": "sudo mtgpu-admin cluster status",
    "cluster status": "sudo mtgpu-admin cluster status --json",
    "cluster remove": "sudo mtgpu-admin cluster remove gpu03",
    "simulate": "sudo mtgpu-admin simulate gpu01 0 --used 20G\nsudo mtgpu-admin simulate --job 42 --used 30G",
    "usage": "mtgpu-admin usage\nmtgpu-admin usage --refresh",
    "report": "sudo mtgpu-admin report\nsudo mtgpu-admin report --start 2026-11-01 --end 2026-12-01 --csv",
    "retention": "mtgpu-admin retention --dry-run\nmtgpu-admin retention --unlock carol",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_cli("mtgpu-admin", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    # In a session, the socket the session was given: a cluster's configuration holds
    # CLUSTER_KEY and is root's alone, so a tenant could not read it to find the socket
    # (and hear that the command needs an admin).
    api = tenant_client(args)
    if args.cmd == "whoami":
        emit(
            args,
            api.call("whoami"),
            lambda r: (
                f"{r['name']} (UID {r['uid']})" + (", admin" if r["admin"] else "") + f" on {r['server']}"
            ),
        )
    elif args.cmd == "invite":
        r = api.call("invite", name=args.name, expires=args.expires, admin=args.admin or None)
        emit(args, r, lambda r: _invite_text(r))
    elif args.cmd == "user":
        _user(args, api)
    elif args.cmd == "nodes":
        from mtgpu.gpuinfo.report import format_nodes_table

        emit(args, api.call("nodes"), format_nodes_table)
    elif args.cmd == "drain":
        r = api.call("node.drain", node=args.node, reason=args.reason, now=args.now or None)
        emit(args, r, _drain_text)
    elif args.cmd == "cancel":
        r = api.call("job.cancel", job_ids=args.job_ids, reason=args.reason or None, wait=CANCEL_WAIT)
        out, err, rc = cancel_report(r)
        emit(args, r, "\n".join(out) or None)
        for line in err:
            print(f"mtgpu-admin: {line}", file=sys.stderr)
        return rc
    elif args.cmd in ("hold", "release"):
        r = api.call(f"job.{args.cmd}", job_ids=args.job_ids)
        out, err, rc = hold_report(r, released=args.cmd == "release")
        emit(args, r, "\n".join(out) or None)
        for line in err:
            print(f"mtgpu-admin: {line}", file=sys.stderr)
        return rc
    elif args.cmd == "requeue":
        r = api.call("job.requeue", job_ids=args.job_ids, reason=args.reason or None)
        out = [f"Requeued job {jid}" for jid in r["requeued"]]
        err = [f"job {jid} is not running" for jid in r["not_running"]]
        err += [f"no job {jid}" for jid in r["not_found"]]
        emit(args, r, "\n".join(out) or None)
        for line in err:
            print(f"mtgpu-admin: {line}", file=sys.stderr)
        return 1 if err else 0
    elif args.cmd == "update":
        if args.time_limit is None and args.priority is None:
            raise ValidationError("nothing to change: give --time-limit and/or --priority")
        changes: dict[str, Any] = {}
        if args.time_limit is not None:
            changes["time_limit"] = args.time_limit
        if args.priority is not None:
            changes["priority"] = args.priority
        r = api.call("job.update", job_ids=args.job_ids, **changes)
        out = [f"Updated job {jid}" for jid in r["changed"]]
        err = [f"job {jid} is no longer pending" for jid in r["not_pending"]]
        err += [f"no job {jid}" for jid in r["not_found"]]
        emit(args, r, "\n".join(out) or None)
        for line in err:
            print(f"mtgpu-admin: {line}", file=sys.stderr)
        return 1 if err else 0
    elif args.cmd == "audit":
        if args.limit < 0:
            raise ValidationError("--limit must be 0 (all) or more")
        r = api.call("audit", limit=args.limit, actor=args.user, action=args.action)
        emit(args, r, _audit_text)
    elif args.cmd == "logs":
        r = api.call("logs", lines=args.lines, level=args.level, node=args.node)
        emit(
            args,
            r,
            lambda r: (
                "\n".join(
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(ln['time']))} "
                    f"{ln['level']:<7} {ln['logger']}: {ln['message']}"
                    for ln in r["lines"]
                )
                or f"(nothing logged on {r['node']} yet)"
            ),
        )
    elif args.cmd == "undrain":
        r = api.call("node.undrain", node=args.node)
        emit(
            args,
            r,
            f"{r['node']} takes new work again" if r["was"] is not None else f"{r['node']} was not drained",
        )
    elif args.cmd == "jobs":
        state = args.state.upper() if args.state else None
        jobs = [
            j
            for j in api.call_all(
                "job.list",
                all=args.all or (state is not None and state not in (PENDING, RUNNING)) or None,
                user=args.user,
            )
            if state is None or j["state"] == state
        ]
        emit(
            args,
            jobs,
            lambda js: table(
                [
                    [
                        j["job_id"],
                        j["name"][:20],
                        j["user"],
                        j["state"],
                        _elapsed(j),
                        ",".join(j["nodes"]) or f"({j['reason']})",
                    ]
                    for j in js
                ],
                ["JOBID", "NAME", "USER", "STATE", "TIME", "NODES (REASON)"],
            ),
        )
    elif args.cmd == "cluster" and args.ccmd == "remove":
        r = api.call("cluster.remove", name=args.name)
        emit(args, r, f"removed {r['removed']} from the cluster")
    elif args.cmd == "cluster":
        st = api.call("cluster.status")
        if getattr(args, "hosts", None) and st.get("mode") != "standalone":
            st["known_hosts"] = scoped_known_hosts(st["known_hosts"], args.hosts)
        emit(args, st, _cluster_text)
    elif args.cmd in ("usage", "retention"):
        policy_admin.dispatch(args, api)
    elif args.cmd == "report":
        return report.run(api, args, everyone=True)
    elif args.cmd == "simulate":
        if args.job is not None:
            if args.node is not None:
                raise MtgpuError("give either --job ID or NODE GPU_INDEX, not both")
            r = api.call(
                "simulate",
                job=args.job,
                used=args.used,
                **({"pid": args.pid} if args.pid is not None else {}),
            )
            emit(
                args,
                r,
                f"job {r['job']} on {r['node']}: process {r['pid']} holds {args.used} "
                f"of GPU {','.join(map(str, r['gpus']))}",
            )
        else:
            if args.node is None or args.gpu_index is None:
                raise MtgpuError("give NODE GPU_INDEX (a GPU's outside use) or --job ID (a job's use)")
            if args.pid is not None:
                raise MtgpuError("--pid goes with --job")
            r = api.call("simulate", node=args.node, index=args.gpu_index, used=args.used)
            emit(args, r, f"{r['node']} GPU {r['index']}: outside use set to {args.used}")
    return 0


def _elapsed(j: dict[str, Any]) -> str:
    start = j.get("start_time")
    if not start:
        return ""
    secs = int((j.get("end_time") or time.time()) - start)
    days, rest = divmod(secs, 86400)
    text = time.strftime("%H:%M:%S", time.gmtime(rest))
    return f"{days}-{text}" if days else text


def _audit_text(entries: list[dict[str, Any]]) -> str:
    rows = []
    for e in entries:
        args = " ".join(f"{k}={_short(v)}" for k, v in sorted(e.get("args", {}).items()))
        rows.append(
            [
                e["seq"],
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])),
                e["actor"],
                e["member"],
                e["action"],
                args[:60],
                "ok" if e["ok"] else f"refused: {(e.get('error') or '')[:40]}",
            ]
        )
    return table(rows, ["#", "TIME", "WHO", "ON", "ACTION", "ARGUMENTS", "RESULT"])


def _short(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(_short(x) for x in v)
    text = str(v)
    return text if len(text) <= 24 else text[:21] + "..."


def _drain_text(r: dict[str, Any]) -> str:
    if r.get("now"):
        done = []
        if r.get("requeued"):
            done.append(f"requeued {', '.join(r['requeued'])}")
        if r.get("cancelled"):
            done.append(f"cancelled {', '.join(r['cancelled'])}")
        return f"{r['node']} is drained: it takes no new work; " + (
            "; ".join(done) if done else "nothing ran there"
        )
    running = r.get("running") or []
    jobs = (
        f"; {len(running)} running job{'s go' if len(running) != 1 else ' goes'} on "
        f"({', '.join(running[:10])}{' ...' if len(running) > 10 else ''})"
        if running
        else "; nothing runs there"
    )
    return f"{r['node']} is drained: it takes no new work{jobs}"


def scoped_known_hosts(line: str, patterns: str) -> str:
    """The cluster's ``@cert-authority`` line for the host patterns an admin gave.

    >>> scoped_known_hosts("@cert-authority a1,[a1]:2222 ssh-ed25519 AAAA mtgpu-lab", "gpu*.lab")
    '@cert-authority gpu*.lab ssh-ed25519 AAAA mtgpu-lab'
    """
    from mtgpu.cluster.identity import check_host_patterns

    try:
        check_host_patterns(patterns)
    except ValueError as exc:
        raise ValidationError(f"--hosts: {exc}") from None
    marker, _, rest = line.split(" ", 2)
    return f"{marker} {patterns} {rest}"


def _cluster_text(st: dict[str, Any]) -> str:
    if st.get("mode") == "standalone":
        (m,) = st["members"]
        out = [
            f"standalone host {m['name']} (cluster {st['cluster_id']}), term {st['term']}",
            table(
                [[m["name"], m["address"], "standalone", m["state"] + (", drained" if m["drained"] else "")]],
                ["MEMBER", "ADDRESS", "ROLE", "STATE"],
            ),
        ]
        if m["drained"]:
            out.append(f"{m['name']} is drained: {m.get('drain_reason') or '(no reason given)'}")
        out.append(f"users trust this host with these known_hosts lines:\n  {st['known_hosts']}")
        return "\n".join(out)
    rows = []
    for m in st["members"]:
        state = m["state"] + (", drained" if m.get("drained") else "")
        shares = m.get("homes_shared_with")
        homes = ("shared with " + ",".join(shares) if shares else "own") if shares is not None else "unknown"
        rows.append([m["name"], m["address"], m["role"], state, m["score"], homes])
    out = [
        f"cluster {st['cluster_id']}: scheduler {st['scheduler'] or '(none elected)'}, term {st['term']}",
        table(rows, ["MEMBER", "ADDRESS", "ROLE", "STATE", "SCORE", "HOMES"]),
    ]
    if st.get("homes"):
        out.append(f"homes ({st.get('tenant_home_root', 'TENANT_HOME_ROOT')}): {st['homes']}")
    for m in st["members"]:
        if m.get("drained"):
            out.append(f"{m['name']} is drained: {m.get('drain_reason') or '(no reason given)'}")
    if st.get("warning"):
        out.append(f"warning: {st['warning']}")
    out.append(
        "users trust every member with this known_hosts line (for these host names only; "
        f"--hosts PATTERNS for others):\n  {st['known_hosts']}"
    )
    return "\n".join(out)


def _invite_text(r: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(r["expires"]))
    return (
        f"Invite code for {r['name']}: {r['code']}  (one use, expires {when})\n\n"
        f"The user connects with any SSH key and types the code when asked:\n"
        f"    {r['command']}\n"
        f"or, without a terminal:\n"
        f"    {r['command_noninteractive']}"
    )


def _user(args: argparse.Namespace, api: Any) -> None:
    if args.ucmd == "add":
        r = api.call("user.add", name=args.name, keys=args.key, admin=args.admin or None)
        emit(args, r, f"added {r['name']} with UID {r['uid']}" + (" (admin)" if r["admin"] else ""))
    elif args.ucmd == "list":
        users = api.call("user.list")
        emit(
            args,
            users,
            lambda us: table(
                [
                    [
                        u["name"],
                        u["uid"],
                        "yes" if u["admin"] else "",
                        "yes" if u["granted"] else "no",
                        len(u["keys"]),
                        _ago(u["last_login"]),
                    ]
                    for u in us
                ],
                ["USER", "UID", "ADMIN", "GRANTED", "KEYS", "LAST LOGIN"],
            ),
        )
    elif args.ucmd == "show":
        u = api.call("user.show", name=args.name)
        emit(
            args,
            u,
            lambda u: "\n".join(
                [
                    f"user:       {u['name']}",
                    f"uid:        {u['uid']}",
                    f"admin:      {'yes' if u['admin'] else 'no'}",
                    f"granted:    {'yes' if u['granted'] else 'no'} (cluster {u['cluster']})",
                    f"last login: {_ago(u['last_login'])}",
                    "keys:",
                ]
                + [f"  {k}" for k in u["keys"]]
            ),
        )
    elif args.ucmd == "remove":
        r = api.call("user.remove", name=args.name)
        ended = sum(int(m.get("processes_ended", 0)) for m in r.get("members", {}).values())
        for w in r.get("warnings", []):
            print(f"mtgpu-admin: warning: {w}", file=sys.stderr)
        emit(
            args,
            r,
            f"removed {r['name']}: account locked on {len(r.get('members', {}))} "
            f"member(s), {len(r.get('jobs_cancelled', []))} job(s) cancelled, "
            f"{ended} process(es) ended (UID {r['uid']} stays reserved; the home is "
            "kept)",
        )
    elif args.ucmd == "key":
        op = "user.key.add" if args.kcmd == "add" else "user.key.remove"
        r = api.call(op, name=args.name, key=args.key)
        emit(args, r, f"{args.name} now has {r['keys']} key(s)")


if __name__ == "__main__":
    raise SystemExit(main())
