"""``sbatch``, ``squeue``, ``scancel``, ``sinfo``, ``scontrol`` and ``salloc``.

Each is a thin front end: it parses Slurm's options, makes the same API calls as
``mt-job`` (``sbatch`` and ``salloc`` go through ``mt-job submit`` and ``mt-job alloc``
themselves) and prints what Slurm prints, with Slurm's exit statuses: 0 on success,
1 on an error (an unknown job, a refused request), and 255 for a bad ``sbatch`` option.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from mtgpu.cli.slurm import formats
from mtgpu.cmdline import with_examples
from mtgpu.jobstate import PENDING, RUNNING

#: The message Slurm prints for a job it does not know (or one that is not yours).
INVALID_JOB = "Invalid job id specified"


class SlurmParser(argparse.ArgumentParser):
    """An argument parser whose usage errors end with Slurm's exit status."""

    def __init__(self, *a: Any, usage_status: int = 1, **kw: Any) -> None:
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*a, **kw)
        self.usage_status = usage_status

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(self.usage_status)


def _config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="the MTGPU daemon's configuration (default $MTGPU_CONFIG)")


def _version(p: argparse.ArgumentParser) -> None:
    """``-V``/``--version``, as every Slurm command has them (``slurm 22.05.8 (MTGPU ...)``)."""
    taken = {o for a in p._actions for o in a.option_strings}
    flags = [f for f in ("-V", "--version") if f not in taken]
    if flags:
        p.add_argument(
            *flags, action="version", version=formats.version_line(), help="the Slurm release followed"
        )


def _listing_parser(prog: str, description: str) -> SlurmParser:
    """A parser for squeue and sinfo, where ``-h`` is ``--noheader`` (help is ``--help``)."""
    p = SlurmParser(prog=prog, description=description, add_help=False)
    _config(p)
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("-h", "--noheader", action="store_true", help="no header line")
    _version(p)
    return p


def _run(prog: str, args: argparse.Namespace, body: Callable[[Any], int]) -> int:
    from mtgpu.cli.common import run_cli, tenant_client

    return run_cli(prog, lambda: body(tenant_client(args)))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _print_lines(prog: str, make: Callable[[], list[str]]) -> int:
    """Print the lines ``make`` gives; a format it cannot follow is an error (1)."""
    try:
        lines = make()
    except formats.FormatError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def _meta() -> dict[str, Any]:
    return formats.json_meta()


# ------------------------------------------------------------------ sbatch


def _subparser(name: str, prog: str) -> argparse.ArgumentParser:
    """``mt-job``'s own parser for ``name`` (submit, alloc), under Slurm's name."""
    from mtgpu.cli.job import build_parser

    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[name]
    p.prog = prog
    return p


SBATCH_EXAMPLES = """\
sbatch train.sh                        Submitted batch job 12
sbatch --parsable --gpus=1 train.sh    12
sbatch --wrap="nvidia-smi" --gpus=1    a one-line job without a file
ssh gpu01 sbatch - < train.sh          the script from standard input
sbatch < train.sh                      the same (no script named, input not a terminal)
sbatch sweep.sh 0.1 adam               sweep.sh runs with $1=0.1 $2=adam
"""


def sbatch_parser() -> argparse.ArgumentParser:
    """``mt-job submit``'s own parser under Slurm's name, with ``--wrap``."""
    p = _subparser("submit", "sbatch")
    p.description = (
        "Submit a batch script to MTGPU's queue, as Slurm's sbatch does.\n\n"
        "#SBATCH and #MTGPU lines in the script are read as mt-job submit reads them;\n"
        "options on the command line win over them."
    )
    # mt-job submit refuses --wrap (a job file has to be given there); sbatch takes it
    # (sbatch_main reads it before this parser sees the rest).
    wrap = next((a for a in p._actions if "--wrap" in a.option_strings), None)
    if wrap is None:
        p.add_argument("--wrap", metavar="COMMAND", help="run COMMAND as the job (no script file)")
    else:
        wrap.metavar, wrap.help = "COMMAND", "run COMMAND as the job (no script file)"
    _version(p)
    return with_examples(p, {"": SBATCH_EXAMPLES})


def sbatch_main(argv: list[str] | None = None) -> int:
    """``sbatch``: ``mt-job submit`` with Slurm's banner, ``--wrap`` and exit codes.

    As Slurm's, it reads options up to the script; what follows is the script's
    arguments. With no script (and no ``--wrap``) it reads one from standard input,
    unless that is a terminal."""
    import os

    from mtgpu.cli import job

    argv = list(sys.argv[1:] if argv is None else argv)
    p = sbatch_parser()
    opts, rest = job.split_options(p, argv)
    try:
        args = p.parse_args([*opts, "--", *(rest or ["-"])])
    except SystemExit as exc:
        return 255 if exc.code == 2 else int(exc.code or 0)
    # --wrap is sbatch's here, never sent on as an option (mt-job submit refuses it).
    dest = next(a.dest for a in p._actions if "--wrap" in a.option_strings)
    wrap = getattr(args, dest)
    setattr(args, dest, None)
    if wrap is not None:
        if rest:
            print("sbatch: error: Script arguments not permitted with --wrap option", file=sys.stderr)
            return 1
        args.script_text = f"#!/bin/sh\n{wrap}\n"
        args.script_workdir = os.getcwd()
        args.file = "wrap"  # the job's name unless -J gives one, as Slurm names it
    elif not rest and (sys.stdin is None or sys.stdin.isatty()):
        print(
            "sbatch: error: no batch script: name a file (- for standard input), pipe one in, or use --wrap",
            file=sys.stderr,
        )
        return 1
    if args.file == "-":
        # As Slurm's: a script from standard input runs where sbatch was run.
        try:
            args.stdin_workdir = os.getcwd()
        except OSError:
            pass
    args.banner = "Submitted batch job"
    args.slurm_output = True  # slurm-%j.out in the working directory unless -o says
    return job.main_with(args, "sbatch")


# ------------------------------------------------------------------ squeue


SQUEUE_EXAMPLES = """\
squeue                         your pending and running jobs
squeue -t PD -h -o "%i %j"     pending job ids and names, no header
squeue -j 12 --json            one job, as JSON
squeue -r                      every array task on a line of its own
"""


def squeue_parser() -> argparse.ArgumentParser:
    p = _listing_parser(
        "squeue",
        "Show MTGPU's queue in Slurm's format.\n\n"
        "Tenants see their own jobs only (as Slurm with PrivateData=jobs); admins see all.",
    )
    p.add_argument("-o", "--format", help='output format, such as "%%.18i %%.8j %%.2t %%M"')
    p.add_argument("-l", "--long", action="store_true", help="the long format (full state names, time limit)")
    p.add_argument("-t", "--states", help="only jobs in these states (PD,R,CD or names); ALL for every state")
    p.add_argument("-u", "--user", help="only this user's jobs")
    p.add_argument("--me", action="store_true", help="only your jobs")
    p.add_argument("-j", "--jobs", help="only these job ids (comma-separated)")
    p.add_argument("-n", "--name", help="only jobs with these names (comma-separated)")
    p.add_argument("-r", "--array", action="store_true", help="one line per array task")
    p.add_argument("-a", "--all", action="store_true", help="accepted for Slurm's sake (one partition)")
    p.add_argument("-p", "--partition", help="accepted for Slurm's sake (one partition)")
    p.add_argument("--json", action="store_true", help="JSON, with Slurm's key names")
    p.add_argument("-O", "--Format", dest="format_names", help="columns by name: jobid,name:30,state:.10")
    p.add_argument("-S", "--sort", help="sort by -o letters, - for descending: -t,i")
    p.add_argument("-i", "--iterate", type=float, metavar="SECONDS", help="print again every SECONDS")
    p.add_argument("-w", "--nodelist", help="only jobs on these members (a host list: gpu[01-04])")
    p.add_argument("--start", action="store_true", help="pending jobs and their expected start (N/A)")
    return with_examples(p, {"": SQUEUE_EXAMPLES})


def parse_states(text: str | None) -> set[str] | None:
    """``-t`` as a set of MTGPU states (None: pending and running); raises ValueError
    naming a state Slurm's commands do not know."""
    if not text:
        return None
    out = set()
    for s in text.upper().split(","):
        s = s.strip()
        if s == "ALL":
            return set(formats.STATE_NAMES.values())
        if s not in formats.STATE_NAMES:
            valid = ",".join(sorted({v for v in formats.STATE_NAMES.values()}))
            raise ValueError(f"Invalid job state specified: {s}\nValid job states include: {valid}")
        out.add(formats.STATE_NAMES[s])
    return out


def select_jobs(
    jobs: list[dict[str, Any]],
    states: set[str] | None,
    ids: list[str] | None,
    names: list[str] | None,
    user: str | None,
) -> list[dict[str, Any]]:
    """The jobs ``squeue``'s filters keep (an array's id keeps its tasks, a task's
    numeric id that task)."""
    keep = states or {PENDING, RUNNING}
    out = []
    for j in jobs:
        if j["state"] not in keep:
            continue
        if ids and not formats.named(j, ids):
            continue
        if names and j["name"] not in names:
            continue
        if user and j["user"] != user:
            continue
        out.append(j)
    return out


def _glue_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``-S -t,i`` as getopt reads it: the next word is the option's value even when it
    starts with ``-`` (argparse would take it for an option).

    >>> _glue_values(["-S", "-i", "-h"], ("-S", "--sort"))
    ['--sort=-i', '-h']
    """
    out, i = [], 0
    while i < len(argv):
        if argv[i] in options and i + 1 < len(argv):
            out.append(f"{options[-1]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def squeue_main(argv: list[str] | None = None) -> int:
    argv = _glue_values(list(sys.argv[1:] if argv is None else argv), ("-S", "--sort"))
    args = squeue_parser().parse_args(argv)
    try:
        states = parse_states(args.states)
    except ValueError as exc:
        for line in str(exc).splitlines():
            print(f"squeue: error: {line}", file=sys.stderr)
        return 1
    ids = [s.strip() for s in args.jobs.split(",") if s.strip()] if args.jobs else None
    names = args.name.split(",") if args.name else None
    if args.start:
        states = {PENDING}
    if args.iterate is not None and not 1 <= args.iterate <= 86400:
        print("squeue: error: --iterate takes seconds from 1 to 86400", file=sys.stderr)
        return 1
    try:
        if args.format_names:
            args.format = formats.format_from_names(args.format_names)
        on = set(formats.expand_hostlist(args.nodelist)) if args.nodelist else None
    except ValueError as exc:
        print(f"squeue: error: {exc}", file=sys.stderr)
        return 1

    def body(api: Any) -> int:
        if args.iterate is None:
            return once(api)
        while True:  # until interrupted, as Slurm's: a blank line, then the time, each time
            rc = once(api, stamp=True)
            if rc != 0:
                return rc
            sys.stdout.flush()
            time.sleep(args.iterate)
            print()

    def once(api: Any, stamp: bool = False) -> int:
        finished = bool(ids) or bool(states and states - {PENDING, RUNNING})
        jobs = api.call_all("job.list", all=finished or None)
        now = time.time()
        who = None if args.me else args.user
        if args.me:
            import os
            import pwd

            who = pwd.getpwuid(os.getuid()).pw_name
        picked = select_jobs(jobs, states, ids, names, who)
        if on is not None:
            picked = [j for j in picked if on & set(j.get("nodes") or ())]
        if ids and not picked and not any(formats.named(j, ids) for j in jobs):
            print(f"slurm_load_jobs error: {INVALID_JOB}", file=sys.stderr)
            return 1
        picked = formats.sort_jobs(picked)
        if args.sort:
            picked = formats.sort_by(picked, args.sort, now)
        if args.json:
            _print_json(
                {"meta": _meta(), "errors": [], "jobs": [formats.slurm_job_json(j, now) for j in picked]}
            )
            return 0
        if not args.array:
            picked = formats.collapse_pending_arrays(picked)
        fmt = args.format or (
            formats.SQUEUE_START
            if args.start
            else formats.SQUEUE_LONG
            if args.long
            else formats.SQUEUE_DEFAULT
        )
        # -l and -i start with the time, as Slurm's do.
        pre = [time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now))] if args.long or stamp else []
        return _print_lines("squeue", lambda: pre + formats.squeue_lines(picked, fmt, now, not args.noheader))

    return _run("squeue", args, body)


# ------------------------------------------------------------------ scancel


SCANCEL_EXAMPLES = """\
scancel 12               cancel job 12 (an array's id cancels every task)
scancel 12_3             one array task
scancel 12_[3-5,8]       array tasks 3, 4, 5 and 8
scancel -u $USER -t PD   every pending job of yours
scancel -n train         your jobs named train
"""


def scancel_parser() -> argparse.ArgumentParser:
    p = SlurmParser(prog="scancel", description="Cancel MTGPU jobs, as Slurm's scancel does.")
    _config(p)
    p.add_argument(
        "job_ids",
        nargs="*",
        metavar="JOBID",
        help="jobs to cancel (ID, ID_TASK, ID_[A-B,C] or an array's ID)",
    )
    p.add_argument("-u", "--user", help="every job of this user (yours, unless you are an admin)")
    p.add_argument("--me", action="store_true", help="every job of yours")
    p.add_argument("-t", "--state", help="only jobs in these states (PD, R)")
    p.add_argument("-n", "--name", "--jobname", dest="name", help="only jobs with this name")
    p.add_argument("-s", "--signal", help="only KILL or TERM: a job is ended, not signalled")
    p.add_argument("-Q", "--quiet", action="store_true", help="no error for jobs that had ended")
    p.add_argument("-v", "--verbose", action="store_true", help="say what was cancelled")
    _version(p)
    return with_examples(p, {"": SCANCEL_EXAMPLES})


#: The most array tasks one ``ID_[...]`` may name (the daemon's MAX_CANCEL_IDS).
MAX_TASK_RANGE = 10_000


def expand_task_ranges(job_ids: list[str]) -> list[str]:
    """Job ids with each ``ID_[A-B,C]`` as its array tasks' ids (``ID_A`` ...), as
    scancel takes them; other ids unchanged. Raises ValueError naming a bad one.

    >>> expand_task_ranges(["20_[6-7,9]", "21_3", "22"])
    ['20_6', '20_7', '20_9', '21_3', '22']
    """
    import re

    out: list[str] = []
    for jid in job_ids:
        if "[" not in jid and "]" not in jid:
            out.append(jid)
            continue
        m = re.fullmatch(r"([A-Za-z0-9.-]+)_\[([^\]]*)\]", jid)
        if not m:
            raise ValueError(f"Invalid job id {jid}: an array's tasks are ID_[A-B,C], such as 20_[6-7]")
        tasks: list[int] = []
        for part in m.group(2).split(","):
            r = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if not r or int(r.group(2) or r.group(1)) < int(r.group(1)):
                raise ValueError(f"Invalid job id {jid}: {part!r} is not a task index or a range A-B")
            lo, hi = int(r.group(1)), int(r.group(2) or r.group(1))
            if hi - lo + 1 + len(tasks) > MAX_TASK_RANGE:
                raise ValueError(f"Invalid job id {jid}: more than {MAX_TASK_RANGE} array tasks")
            tasks += range(lo, hi + 1)
        out += [f"{m.group(1)}_{t}" for t in dict.fromkeys(tasks)]
    return out


def scancel_main(argv: list[str] | None = None) -> int:
    args = scancel_parser().parse_args(argv)
    try:
        args.job_ids = expand_task_ranges(args.job_ids)
    except ValueError as exc:
        print(f"scancel: error: {exc}", file=sys.stderr)
        return 1
    if args.signal and args.signal.upper().removeprefix("SIG") not in ("KILL", "TERM", "9", "15"):
        print(
            f"scancel: error: --signal={args.signal}: MTGPU ends jobs (TERM, then KILL) but does not "
            "send them other signals; trap TERM in the script to clean up",
            file=sys.stderr,
        )
        return 1
    try:
        states = parse_states(args.state)
    except ValueError as exc:
        print(f"scancel: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if not args.job_ids and not (args.user or args.me or args.state or args.name):
        print("scancel: error: No job identification provided", file=sys.stderr)
        return 1

    def body(api: Any) -> int:
        ids = list(args.job_ids)
        if not ids or args.state or args.name or args.user or args.me:
            jobs = api.call_all("job.list")
            user = args.user
            if args.me:
                import os
                import pwd

                user = pwd.getpwuid(os.getuid()).pw_name
            picked = select_jobs(jobs, states, ids or None, [args.name] if args.name else None, user)
            ids = [j["job_id"] for j in picked]
            if not ids:
                return 0
        from mtgpu.errors import ApiError

        try:
            r = api.call("job.cancel", job_ids=ids)
        except ApiError as exc:
            if exc.code != "not_found":
                raise
            r = {"cancelled": [], "stopping": [], "ended": [], "not_found": ids}
        rc = 0
        for jid in r.get("not_found", []):
            print(f"scancel: error: Kill job error on job id {jid}: {INVALID_JOB}", file=sys.stderr)
            rc = 1
        if not args.quiet:
            for jid in r.get("ended", []):
                print(
                    f"scancel: error: Kill job error on job id {jid}: Job/step already completing or completed",
                    file=sys.stderr,
                )
        if args.verbose:
            for jid in [*r.get("cancelled", []), *r.get("stopping", [])]:
                print(f"scancel: Terminating job {jid}", file=sys.stderr)
        return rc

    return _run("scancel", args, body)


# ------------------------------------------------------------------ sinfo


SINFO_EXAMPLES = """\
sinfo                    members grouped by state (idle, mix, alloc, drain, down)
sinfo -N                 one line per member
sinfo -N -o "%N %c %m %G"  name, CPUs, memory (MB) and GPUs of each member
sinfo -o "%C"            CPUs allocated/idle/other/total
sinfo -s                 one line: members allocated/idle/other/total
sinfo -N -l              one long line per member (CPUs, S:C:T, memory, features, reason)
"""


def sinfo_parser() -> argparse.ArgumentParser:
    p = _listing_parser("sinfo", "Show MTGPU's members in Slurm's format.")
    p.add_argument("-N", "--Node", action="store_true", help="one line per member")
    p.add_argument("-o", "--format", help='output format, such as "%%N %%t %%G"')
    p.add_argument(
        "-l", "--long", action="store_true", help="more columns and long state names, after the date"
    )
    p.add_argument(
        "-s", "--summarize", action="store_true", help="one line: members allocated/idle/other/total"
    )
    p.add_argument("-p", "--partition", help="accepted for Slurm's sake (one partition)")
    p.add_argument("--json", action="store_true", help="JSON")
    return with_examples(p, {"": SINFO_EXAMPLES})


def sinfo_main(argv: list[str] | None = None) -> int:
    args = sinfo_parser().parse_args(argv)

    def body(api: Any) -> int:
        nodes = api.call("nodes")
        if args.json:
            _print_json({"meta": _meta(), "errors": [], "nodes": nodes})
            return 0
        fmt = args.format
        if args.long and not fmt and not args.summarize:
            fmt = formats.SINFO_NODES_LONG if args.Node else formats.SINFO_LONG
        summary = args.summarize and not args.Node
        if args.long and not args.noheader:
            print(time.strftime("%a %b %d %H:%M:%S %Y"))  # as Slurm's long forms begin
        return _print_lines(
            "sinfo", lambda: formats.sinfo_lines(nodes, args.Node, fmt, not args.noheader, summary)
        )

    return _run("sinfo", args, body)


# ------------------------------------------------------------------ scontrol


SCONTROL_EXAMPLES = """\
scontrol show job 12        one job (an array's id shows each task)
scontrol show job           every job of yours
scontrol -o show node gpu01 one member, on one line
scontrol --json show job 12
scontrol show hostnames     the job's members, one a line (from $SLURM_JOB_NODELIST)
scontrol show hostnames gpu[01-03]  gpu01, gpu02 and gpu03, one a line
scontrol show hostlist gpu01,gpu02  gpu[01-02]
scontrol hold 12 15_3       keep pending jobs from starting (mt-job hold)
scontrol release 12,15_3    let held jobs start again (mt-job release)
"""


def scontrol_parser() -> argparse.ArgumentParser:
    p = SlurmParser(prog="scontrol", description="Show MTGPU jobs and members as Slurm's scontrol does.")
    _config(p)
    p.add_argument("-o", "--oneliner", action="store_true", help="one line per record")
    p.add_argument("--json", action="store_true", help="JSON")
    p.add_argument("verb", help="show, hold, uhold or release")
    p.add_argument(
        "entity", nargs="?", help="show: job, node, hostnames or hostlist; hold, release: a job id"
    )
    p.add_argument(
        "name",
        nargs="*",
        help="a job id or member name (default: all); a host list (default: $SLURM_JOB_NODELIST); "
        "more job ids to hold or release",
    )
    _version(p)
    return with_examples(p, {"": SCONTROL_EXAMPLES})


def show_hostlist(entity: str, text: str | None) -> int:
    """``scontrol show hostnames [LIST]`` (one name a line) and ``show hostlist
    [LIST]`` (compressed), of LIST or else $SLURM_JOB_NODELIST; no daemon is asked."""
    import os

    if text is None:
        text = os.environ.get("SLURM_JOB_NODELIST", "")
        if not text:
            print(
                f"scontrol: error: show {entity}: name a host list, or run it in a job "
                "(SLURM_JOB_NODELIST is not set)",
                file=sys.stderr,
            )
            return 1
    try:
        names = formats.expand_hostlist(text)
    except formats.HostlistError as exc:
        print(f"scontrol: error: invalid host list {exc}", file=sys.stderr)
        return 1
    if entity == "hostlist":
        print(formats.compress_hostlist(names))
    else:
        for n in names:
            print(n)
    return 0


def scontrol_hold(args: argparse.Namespace) -> int:
    """``scontrol hold|uhold|release JOB_LIST``: ``mt-job hold`` and ``release``, quiet on
    success as Slurm's; ids apart by spaces or commas, an array's id for all its tasks."""
    ids = [i for w in [args.entity or "", *args.name] for i in w.split(",") if i]
    if not ids:
        print(
            f"scontrol: error: {args.verb}: name the jobs, as `scontrol {args.verb} 12 15_3`", file=sys.stderr
        )
        return 1
    op = "job.release" if args.verb == "release" else "job.hold"

    def body(api: Any) -> int:
        from mtgpu.errors import ApiError

        try:
            r = api.call(op, job_ids=ids)
        except ApiError as exc:
            if exc.code != "not_found":
                raise
            print(f"{INVALID_JOB} for job_id {' '.join(ids)}", file=sys.stderr)
            return 1
        for jid in r["not_pending"]:
            print(
                f"Job {jid} is no longer pending: it can only be held or released while it waits",
                file=sys.stderr,
            )
        for jid in r["not_found"]:
            print(f"{INVALID_JOB} for job_id {jid}", file=sys.stderr)
        return 1 if r["not_pending"] or r["not_found"] else 0

    return _run("scontrol", args, body)


def scontrol_main(argv: list[str] | None = None) -> int:
    args = scontrol_parser().parse_args(argv)
    if args.verb in ("hold", "uhold", "release"):
        return scontrol_hold(args)
    if args.verb != "show":
        print(
            f"scontrol: error: `{args.verb}` is not available in MTGPU; use `show job|node`, "
            "`hold`, `release`, `mt-job cancel`, or an admin's `mtgpu-admin requeue|update`",
            file=sys.stderr,
        )
        return 1
    if not args.entity or len(args.name) > 1:
        print(
            "scontrol: error: show takes an entity and at most one name, as `scontrol show job 12`",
            file=sys.stderr,
        )
        return 1
    args.name = args.name[0] if args.name else None
    if args.entity.lower() in ("hostnames", "hostlist"):
        return show_hostlist(args.entity.lower(), args.name)
    entity = args.entity.lower().rstrip("s")
    if entity not in ("job", "node"):
        print(
            f"scontrol: error: invalid entity: {args.entity} (MTGPU shows job, node, hostnames or hostlist)",
            file=sys.stderr,
        )
        return 1

    def body(api: Any) -> int:
        from mtgpu.errors import ApiError

        now = time.time()
        if entity == "job":
            if args.name:
                try:
                    j = api.call("job.show", job_id=args.name)
                except ApiError as exc:
                    if exc.code != "not_found":
                        raise
                    print(f"slurm_load_jobs error: {INVALID_JOB}", file=sys.stderr)
                    return 1
                views = j["tasks"] if j.get("array") else [j]
            else:
                views = formats.sort_jobs(api.call_all("job.list"))
            if args.json:
                _print_json(
                    {"meta": _meta(), "errors": [], "jobs": [formats.slurm_job_json(v, now) for v in views]}
                )
                return 0
            if not views:
                print("No jobs in the system")
            for v in views:
                print(formats.scontrol_job(v, now, args.oneliner))
            return 0
        nodes = api.call("nodes")
        if args.name:
            nodes = [n for n in nodes if n["name"] == args.name]
            if not nodes:
                print(f"Node {args.name} not found", file=sys.stderr)
                return 1
        if args.json:
            _print_json({"meta": _meta(), "errors": [], "nodes": nodes})
            return 0
        for n in nodes:
            print(formats.scontrol_node(n, args.oneliner))
        return 0

    return _run("scontrol", args, body)


# ------------------------------------------------------------------ salloc


SALLOC_EXAMPLES = """\
salloc --gpus=1 -t 2h         a shell with one GPU for two hours
salloc --gres=gpu:1 -- python train.py
"""


def salloc_parser() -> argparse.ArgumentParser:
    """``mt-job alloc``'s own parser under Slurm's name."""
    p = _subparser("alloc", "salloc")
    p.description = "Queue an interactive allocation and run a shell (or COMMAND) inside it."
    _version(p)
    return with_examples(p, {"": SALLOC_EXAMPLES})


#: Each program of this module and the function that makes its parser.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "sbatch": sbatch_parser,
    "squeue": squeue_parser,
    "scancel": scancel_parser,
    "sinfo": sinfo_parser,
    "scontrol": scontrol_parser,
    "salloc": salloc_parser,
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The parser of ``prog`` (one of :data:`PARSERS`), the one its ``*_main`` parses with."""
    return PARSERS[prog]()


def salloc_main(argv: list[str] | None = None) -> int:
    """``salloc``: ``mt-job alloc`` under Slurm's name."""
    from mtgpu.cli import job

    p = salloc_parser()
    opts, rest = job.split_options(p, list(sys.argv[1:] if argv is None else argv))
    args = p.parse_args([*opts, *(["--", *rest] if rest else [])])

    job.alloc_args(args)
    args.cmd = "alloc"
    return job.main_with(args, "salloc")
