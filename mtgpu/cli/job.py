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

from mtgpu.cmdline import with_examples
from mtgpu.errors import MtgpuError
from mtgpu.jobstate import COMPLETED, FAILED, FINAL_STATES, PENDING, RUNNING

#: What messages start with: ``mt-job``, or the Slurm command run (main_with sets it).
_prog = "mt-job"

# `#MTGPU` keys accepted as --KEY=VALUE overrides on `submit` (as in the job file);
# the ones sbatch also has (--gpus, --time, --array...) are sbatch's options there.
OVERRIDES = (
    "gpu_mode",
    "vram",
    "cpus",
    "ram",
    "server",
    "name",
    "workdir",
)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _when(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="simple") if rows else "(no jobs)"


def submitting_session() -> dict[str, Any]:
    """What a submission carries from this shell, as sbatch's: its environment (for
    ``--export``), umask and resource limits (PROPAGATE_RESOURCE_LIMITS). Raises
    JobError if the environment is larger than any job could take."""
    import resource

    from mtgpu.errors import JobError
    from mtgpu.schedd.submitenv import MAX_SENT_ENV_BYTES, RLIMITS, UNLIMITED

    mask = os.umask(0o022)
    os.umask(mask)
    limits = {}
    for name, res in RLIMITS.items():
        pair = resource.getrlimit(res)
        limits[name] = [UNLIMITED if n == resource.RLIM_INFINITY else n for n in pair]
    # As the C mt-job: a variable that is not UTF-8 text is not sent.
    env = {k: v for k, v in os.environ.items() if _utf8(k + v)}
    size = sum(len(k) + len(v) + 2 for k, v in env.items())
    if size > MAX_SENT_ENV_BYTES:
        raise JobError(
            f"your environment is {size} bytes, over the {MAX_SENT_ENV_BYTES} a submission "
            "carries; unset what the job does not need (or submit with env -i)"
        )
    return {"umask": mask, "rlimits": limits, "env": env}


#: The largest JOB_SCRIPT_MAX (mtgpu.config.options.MAX_JOB_SCRIPT): a larger script is
#: refused here, before it is sent; the daemon refuses one over its own JOB_SCRIPT_MAX.
MAX_JOB_SCRIPT = 2 << 20


def check_local_script_size(size: int) -> None:
    """Refuse, before sending, a script no daemon would take (as the C mt-job does)."""
    from mtgpu.errors import JobError

    if size > MAX_JOB_SCRIPT:
        raise JobError(
            f"the job script is {size} bytes, over the largest JOB_SCRIPT_MAX ({MAX_JOB_SCRIPT}); "
            "keep data in files beside the script and read them from it"
        )


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def cmd_submit(args: argparse.Namespace, api: Any) -> int:
    from mtgpu.errors import JobError
    from mtgpu.schedd import sbatch
    from mtgpu.schedd.jobfile import decode_job_file

    try:
        if getattr(args, "script_text", None) is not None:  # sbatch --wrap
            script, workdir = args.script_text, args.script_workdir
        elif args.file == "-":
            # Bytes, decoded strictly: a byte that is not UTF-8 is named, not smuggled on.
            script = decode_job_file(sys.stdin.buffer.read())
            # mt-job: the daemon uses the tenant's home, as for `ssh host mt-job submit -`;
            # sbatch: where it was run, as Slurm's.
            workdir = getattr(args, "stdin_workdir", "")
        else:
            try:
                with open(args.file, "rb") as f:
                    data = f.read()
            except OSError as exc:
                print(f"{_prog}: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
                return 1
            # Universal newlines, as a text-mode read gave them.
            script = decode_job_file(data, args.file).replace("\r\n", "\n").replace("\r", "\n")
            workdir = os.getcwd()
        check_local_script_size(len(script.encode("utf-8")))
        script_args = list(getattr(args, "script_args", None) or [])
        for n, a in enumerate(script_args, 1):
            if not _utf8(a):
                raise JobError(f"the script's argument ${n} is not UTF-8 text")
        session = submitting_session()
    except JobError as exc:
        print(f"{_prog}: {exc}", file=sys.stderr)
        return 1
    overrides = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    r = submit_once(
        api,
        script=script,
        overrides=overrides,
        workdir=workdir,
        options=sbatch.argv_of(args),
        file_name=os.path.basename(args.file),
        **({"args": script_args} if script_args else {}),
        # sbatch: Slurm's slurm-%j.out in the working directory where no -o is given.
        **({"slurm_output": True} if getattr(args, "slurm_output", False) else {}),
        **session,
    )
    for w in r.get("warnings", []):
        print(f"{_prog}: warning: {w}", file=sys.stderr)
    if r.get("test_only"):
        if args.json:
            _print_json(r)
        print(f"{_prog}: {r['test_only']}", file=sys.stderr)
        return 0  # --test-only: nothing was submitted
    if args.json:
        _print_json(r)
    elif args.parsable:
        print(r["job_id"])
    else:
        banner = getattr(args, "banner", None)
        # sbatch prints Slurm's line exactly, with no count of an array's tasks.
        extra = f" ({r['tasks']} array tasks)" if r["tasks"] > 1 and banner is None else ""
        print(f"{banner or 'Submitted job'} {r['job_id']}{extra}")
    if r.get("wait"):
        sys.stdout.flush()
        return wait_for_job(api, r["job_id"])
    return 0


def wait_for_job(api: Any, jid: str) -> int:
    """sbatch --wait: return when the job (every task of an array) has ended, with its
    exit status (the highest of an array's), 1 for one that ended without one."""
    while True:
        j = _retrying(lambda: api.call("job.show", job_id=jid))
        views = j["tasks"] if j.get("array") else [j]
        if all(v["state"] in FINAL for v in views):
            break
        time.sleep(0.5)
    codes = [
        v["exit_code"] if v["exit_code"] is not None else (0 if v["state"] == COMPLETED else 1) for v in views
    ]
    bad = [v for v in views if v["state"] != COMPLETED]
    if bad:
        print(
            f"{_prog}: job {bad[0]['job_id']} ended {bad[0]['state']}: {bad[0].get('reason') or '-'}",
            file=sys.stderr,
        )
    return max(codes) or (1 if bad else 0)


def cmd_wait(args: argparse.Namespace, api: Any) -> int:
    return wait_for_job(api, args.job_id)


#: How long a read is retried through an election (seconds); a submission is
#: retried for SUBMIT_RETRY, in both clients (the C one hands reads to this one).
RETRY_SECONDS = 30.0


def _retrying(fn: Any) -> Any:
    """Retry through a scheduler election: a retryable refusal (nothing was done), or
    one whose outcome is unknown (``RESEND_CODES``: a leader change or a lost answer).
    Only reads and submissions come here: the submission token makes a retry of a
    request that did commit return the same job instead of a second one."""
    from mtgpu.errors import RESEND_CODES, ApiError

    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return fn()
        except ApiError as exc:
            if not (exc.retryable or exc.code in RESEND_CODES) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


#: The exit status of a submission whose outcome is unknown (EX_TEMPFAIL): it may or
#: may not have been made; `mt-job list` tells.
EXIT_UNKNOWN = 75
#: How long a submission is retried (seconds), unless MTGPU_SUBMIT_RETRY says otherwise.
SUBMIT_RETRY = 60.0
#: After how long a submission still being retried says so on stderr (seconds): a
#: failover's resends (an election, a leader change) end sooner and are not shown.
SUBMIT_NOTICE = 5.0


class SubmissionUnknown(MtgpuError):
    """A submission's outcome could not be learnt: it may or may not have been made."""


def submit_retry_seconds() -> float:
    """MTGPU_SUBMIT_RETRY (seconds, 0 to 3600), or :data:`SUBMIT_RETRY`."""
    try:
        v = float(os.environ.get("MTGPU_SUBMIT_RETRY", ""))
    except ValueError:
        return SUBMIT_RETRY
    return v if 0 <= v <= 3600 else SUBMIT_RETRY


def submit_once(api: Any, **args: Any) -> dict[str, Any]:
    """``job.submit`` with a key of its own, retried with that same key while its
    outcome is unknown or nothing was done (an election, a member cut off from its
    scheduler), so a retry returns the first outcome instead of a second job. Raises
    ApiError for a refusal, or for "nothing was done" once the retries are over, and
    :class:`SubmissionUnknown` if an attempt may have been made and none answered."""
    import secrets

    from mtgpu.api.client import IN_DOUBT, OF_THE_MOMENT, ApiClient
    from mtgpu.errors import ApiError

    key = secrets.token_hex(16)
    begun = time.monotonic()
    deadline = begun + submit_retry_seconds()
    # One request at a time: the retries are decided here, not again inside the client.
    send = getattr(api, "call_once", api.call)
    doubt: ApiError | None = None
    told = False
    while True:
        try:
            return send("job.submit", token=key, **args)
        except ApiError as exc:
            code = exc.code
            if code in IN_DOUBT:
                doubt = exc
            elif not exc.retryable and not (doubt is not None and code in OF_THE_MOMENT):
                raise  # decided: a refusal (its first attempt, if any, was refused too)
            if code == "starting":  # a daemon loading its state: as long as ApiClient waits
                deadline = max(deadline, begun + ApiClient.STARTING_RETRY)
            if time.monotonic() > deadline:
                if doubt is not None:
                    raise SubmissionUnknown(str(doubt)) from exc
                raise ApiError(f"not submitted: {exc}", code) from exc
            # A failover is over in a few seconds: the tenant is told only of a longer
            # wait (never of a daemon loading its state, which ApiClient waits out too).
            if not told and code != "starting" and time.monotonic() - begun >= SUBMIT_NOTICE:
                print(f"{_prog}: {exc}; retrying", file=sys.stderr)
                told = True
            time.sleep(0.5)


#: `mt-job list`'s columns, in the --format letters (Slurm's squeue letters).
LIST_FORMAT = "%i %j %u %T %Q %V %M %R"


def cmd_list(args: argparse.Namespace, api: Any) -> int:
    from mtgpu.cli.slurm import formats

    states = None
    if args.state:
        from mtgpu.cli.slurm.commands import parse_states

        try:
            states = parse_states(args.state)
        except ValueError as exc:
            print(f"{_prog}: {str(exc).splitlines()[0]}; such as --state=PD,R", file=sys.stderr)
            return 2
    finished = args.all or bool(states and states - {PENDING, RUNNING})
    # A read: retried through an election as a submission is (nothing is changed).
    jobs = _retrying(lambda: api.call_all("job.list", all=finished or None, user=args.user))
    if states is not None:
        jobs = [j for j in jobs if j["state"] in states]
    if args.json:
        _print_json(jobs)
        return 0
    now = time.time()
    rows = formats.collapse_pending_arrays(jobs)
    if args.format:
        try:
            lines = formats.squeue_lines(rows, args.format, now)
        except formats.FormatError as exc:
            print(f"{_prog}: {exc}; see `mt-job list --help`", file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
    table = []
    for j in rows:
        pos = j.get("position")
        table.append(
            [
                j["job_id"],
                j["name"][:20],
                j["user"],
                j["state"],
                pos if pos is not None else "",
                _when(j["submit_time"]),
                formats.elapsed(formats.run_time(j, now)),
                ",".join(j["nodes"]) if j["nodes"] else (f"({j['reason']})" if j["state"] == PENDING else ""),
            ]
        )
    print(_table(table, ["JOBID", "NAME", "USER", "STATE", "POS", "SUBMIT", "TIME", "NODES (REASON)"]))
    return 0


def cmd_show(args: argparse.Namespace, api: Any) -> int:
    j = _retrying(lambda: api.call("job.show", job_id=args.job_id))
    if args.json:
        _print_json(j)
        return 0
    views = j["tasks"] if j.get("array") else [j]
    for v in views:
        lines = [
            f"job_id:    {v['job_id']}",
            f"name:      {v['name']}",
            f"user:      {v['user']}",
            f"state:     {v['state']}",
        ]
        if v["state"] == PENDING:
            lines.append(f"position:  {v.get('position')}")
            lines.append(
                f"reason:    {v['reason']}" + (f" - {v['reason_detail']}" if v.get("reason_detail") else "")
            )
        elif v.get("reason"):
            lines.append(f"reason:    {v['reason']}")
        lines.append(f"attempt:   {v.get('attempt', 0)}")
        if v.get("requeues"):
            lines.append(f"requeued:  {v['requeues']} time(s), last: {v.get('requeue_reason')}")
        from mtgpu.cli.sacct import show_lines

        lines += [
            f"nodes:     {','.join(v['nodes']) or '-'}",
            *show_lines(v),
            f"submitted: {_when(v['submit_time'])}  started: {_when(v['start_time'])}  "
            f"ended: {_when(v['end_time'])}",
            f"workdir:   {v['workdir']}",
            f"stdout:    {v['stdout']}",
            f"stderr:    {v['stderr']}",
        ]
        if v.get("container"):
            image = f" ({v['image_id'][:12]})" if v.get("image_id") else ""
            lines.append(f"container: {v['container']}{image}")
        for node, text in sorted((v.get("progress") or {}).items()):
            lines.append(f"progress:  {node}: {text}")
        for st in v.get("steps") or ():
            code = st["exit_code"] if st["exit_code"] is not None else "-"
            lines.append(
                f"step:      {st['step_id']} {st['state']} exit {code}, {st['ntasks']} task(s) on "
                f"{st['node']}: {st['command']}"
            )
        print("\n".join(lines))
        if len(views) > 1:
            print()
    return 0


def cmd_usage(args: argparse.Namespace, api: Any) -> int:
    from mtgpu.cli.report import run

    return run(api, args, everyone=False)


def cmd_cancel(args: argparse.Namespace, api: Any) -> int:
    """Cancel jobs and wait (a bounded time) for the running ones to end; say which
    ended, and which had ended already (then exit 1, as for a job not found)."""
    from mtgpu.cli.common import CANCEL_WAIT, cancel_report

    r = api.call("job.cancel", job_ids=args.job_ids, wait=CANCEL_WAIT)
    out, err, rc = cancel_report(r)
    if args.json:
        _print_json(r)
    else:
        for line in out:
            print(line)
    for line in err:
        print(f"{_prog}: {line}", file=sys.stderr)
    return rc


def cmd_hold(args: argparse.Namespace, api: Any) -> int:
    """Hold pending jobs, or release held ones (``mt-job hold`` / ``mt-job release``)."""
    op = "job.release" if args.cmd == "release" else "job.hold"
    r = api.call(op, job_ids=args.job_ids)
    if args.json:
        _print_json(r)
        return 0
    from mtgpu.cli.common import hold_report

    out, err, rc = hold_report(r, released=args.cmd == "release")
    for line in out:
        print(line)
    for line in err:
        print(f"{_prog}: {line}", file=sys.stderr)
    return rc


def cmd_logs(args: argparse.Namespace, api: Any) -> int:
    """Print a job's output; with -f, follow it until the job ends (as the tenant)."""
    j = api.call("job.show", job_id=args.job_id)
    if j.get("array"):
        print(
            f"{_prog}: {args.job_id} is an array; name one task, such as {j['tasks'][0]['job_id']}",
            file=sys.stderr,
        )
        return 1
    path = j["stderr"] if args.stderr else j["stdout"]
    offset = 0
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            print(f"{_prog}: cannot read {path}: {exc.strerror}", file=sys.stderr)
            return 1
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            offset += len(data)
        if not args.follow or j["state"] in FINAL:
            if j["state"] == FAILED and str(j.get("reason", "")).startswith("rejected:"):
                # Refused after it was accepted (while members of a new cluster had not
                # yet reported): it never ran, and says why, as a refused submission does.
                print(f"{_prog}: job {args.job_id} {j['reason']}", file=sys.stderr)
                return 1
            return 0
        time.sleep(0.5)
        j = api.call("job.show", job_id=args.job_id)


#: The script of an allocation: it only holds the resources until its time limit.
#: The job an allocation is: it holds the resources until its shell ends, then ends
#: with that shell's exit status, which ``mt-job alloc`` writes into a pipe of the
#: tenant's own (``~/.mtgpu/alloc/MEMBER-ID``), so an allocation left with ``exit 4`` is
#: FAILED 4:0 and one left with ``exit`` COMPLETED, as Slurm records them. Where the
#: pipe cannot be made it holds until cancelled.
ALLOC_SCRIPT = """#!/bin/sh
# mt-job alloc: holds the allocation for interactive work, then ends as its shell did
d="$HOME/.mtgpu/alloc" f="$HOME/.mtgpu/alloc/$SLURMD_NODENAME-$MTGPU_JOB_ID"
{ mkdir -p -m 700 "$d" && rm -f "$f" && mkfifo -m 600 "$f"; } 2>/dev/null || exec sleep 2147483647
read -r rc < "$f"
rm -f "$f"
case "$rc" in ''|*[!0-9]*) exit 0 ;; esac
exit "$rc"
"""
FINAL = FINAL_STATES


def cmd_alloc(args: argparse.Namespace, api: Any) -> int:
    """Queue an interactive allocation, then run a shell inside it (as salloc does)."""
    if args.join:
        return _run_in(args, api, args.join)
    overrides = {
        k: v
        for k, v in (
            ("gpus", args.gpus),
            ("time", args.time),
            ("cpus", args.cpus),
            ("ram", args.mem),
            ("vram", args.vram),
            ("server", args.server),
            ("gpu_mode", args.gpu_mode),
        )
        if v is not None
    }
    overrides["name"] = args.name or "interactive"
    options = []
    exclusive = getattr(args, "exclusive", None)  # srun --pty has no --exclusive
    if exclusive is not None:
        options.append(f"--exclusive={exclusive}" if exclusive else "--exclusive")
    r = submit_once(api, script=ALLOC_SCRIPT, overrides=overrides, workdir="", options=options)
    jid = r["job_id"]
    print(f"{_prog}: pending job allocation {jid}", file=sys.stderr)
    try:
        while True:
            j = api.call("job.show", job_id=jid)
            if j["state"] == RUNNING and j.get("start_time"):
                break
            if j["state"] in FINAL:
                print(
                    f"{_prog}: job allocation {jid} ended {j['state']} before it started: "
                    f"{j.get('reason') or '-'}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.3)
    except KeyboardInterrupt:
        api.call("job.cancel", job_ids=[jid], reason="the allocation was given up while pending")
        print(f"{_prog}: job allocation {jid} cancelled", file=sys.stderr)
        return 130
    print(f"{_prog}: granted job allocation {jid} on {','.join(j['nodes'])}", file=sys.stderr)
    if args.window:
        if not os.environ.get("TMUX"):
            print(f"{_prog}: --window needs a tmux terminal; running the shell here instead", file=sys.stderr)
        else:
            from mtgpu.proc import call

            cmd = [sys.argv[0] if os.path.isabs(sys.argv[0]) else "mt-job", "alloc", "--join", jid]
            call(["tmux", "new-window", "-n", f"job-{jid}", "--", *cmd])
            return 0
    return _run_in(args, api, jid)


def alloc_args(args: argparse.Namespace) -> argparse.Namespace:
    """Settle ``alloc``'s salloc-shaped options: ``--gres gpu:TYPE:N`` is ``--gpus
    TYPE:N``, the time limit defaults to 1h, and ``--`` before a command goes."""
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.gres and not args.gpus:
        kind, _, rest = args.gres.partition(":")
        args.gpus = rest if kind == "gpu" and rest else args.gres
    args.time = args.time or "1h"
    return args


def _run_in(args: argparse.Namespace, api: Any, jid: str) -> int:
    """Run the shell (or the command given) inside allocation ``jid``, then end it.

    The child is moved into the allocation's cgroups before it execs, and this
    process stays outside them: ending the allocation ends the child, never this
    process, which then reports and cancels.
    """
    argv = args.command or [os.environ.get("SHELL") or "/bin/sh"]
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait to be moved, then become the shell
        os.close(go_w)
        env = os.read(go_r, 1 << 20)
        if not env:
            os._exit(1)
        try:
            os.execvpe(argv[0], argv, {**os.environ, **json.loads(env)})
        except OSError as exc:
            print(f"{_prog}: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    os.close(go_r)
    try:
        r = api.call("job.adopt", job_id=jid, pid=pid)
    except BaseException:
        os.close(go_w)
        os.waitpid(pid, 0)
        raise
    os.write(go_w, json.dumps(r["env"]).encode())
    os.close(go_w)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except KeyboardInterrupt:
            continue  # the shell has the terminal; Ctrl-C is for it
    rc = os.waitstatus_to_exitcode(status)
    rc = rc if rc >= 0 else 128 - rc
    from mtgpu.errors import MtgpuError

    state = api.call("job.show", job_id=jid)["state"]
    if state in FINAL:
        print(f"{_prog}: job allocation {jid} ended {state}", file=sys.stderr)
    else:
        print(f"{_prog}: relinquishing job allocation {jid}", file=sys.stderr)
        if not _end_allocation(r["node"], jid, rc):
            try:
                api.call("job.cancel", job_ids=[jid], reason="its shell exited")
            except MtgpuError as exc:
                print(f"{_prog}: job allocation {jid}: {exc}", file=sys.stderr)
    return rc


def _end_allocation(node: str, jid: str, rc: int, wait: float = 5.0) -> bool:
    """Hand the shell's exit status to the allocation's job (:data:`ALLOC_SCRIPT`), which
    then ends with it; False where its pipe is not there (the job then is cancelled)."""
    import errno
    import stat

    path = os.path.join(os.path.expanduser("~"), ".mtgpu", "alloc", f"{node}-{jid}")
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            break
        except OSError as exc:  # ENXIO: no reader yet; ENOENT: not made (yet)
            if exc.errno not in (errno.ENXIO, errno.ENOENT) or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, f"{rc}\n".encode())
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def cmd_nodes(args: argparse.Namespace, api: Any) -> int:
    nodes = api.call("nodes")
    if args.json:
        _print_json(nodes)
    else:
        from mtgpu.gpuinfo.report import format_nodes_table

        print(format_nodes_table(nodes))
    return 0


def add_submit_arguments(s: argparse.ArgumentParser) -> None:
    """The options of ``mt-job submit`` (and of any ``sbatch`` front end): every sbatch
    option (:mod:`mtgpu.schedd.sbatch`), the ``#MTGPU`` keys sbatch has no word for,
    ``--parsable`` and the job file."""
    from mtgpu.schedd import sbatch

    s.add_argument("--parsable", action="store_true", help="print only the job ID")
    sbatch.add_arguments(s, skip=("--parsable",))
    for k in OVERRIDES:
        s.add_argument(
            f"--{k}",
            *([f"--{k.replace('_', '-')}"] if "_" in k else []),
            dest=k,
            metavar="VALUE",
            help=f"#MTGPU {k}=VALUE",
        )
    s.add_argument("file", help="the job file, or - for standard input")
    s.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="ARG",
        help="arguments of the job script ($1 ...); options after the job file are the script's",
    )


def split_options(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` split where ``parser``'s options end, as sbatch and salloc read their
    command lines: at the first word that is neither an option nor an option's value
    (the job file, or salloc's command), or after ``--``. The options come back as
    ``parser`` must read them: one whose value is optional (``--exclusive[=user]``)
    takes a value only when attached, so ``--exclusive job.sh`` keeps its file.

    >>> p = subcommand(build_parser(), "submit")
    >>> split_options(p, ["-J", "x", "--exclusive", "-k", "job.sh", "200", "--gpus=1"])
    (['-J', 'x', '--exclusive=', '--no-kill='], ['job.sh', '200', '--gpus=1'])
    """
    actions: dict[str, argparse.Action] = {}
    for a in parser._actions:
        for name in a.option_strings:
            actions[name] = a
    longs = [n for n in actions if n.startswith("--")]
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            return out, argv[i:]
        if word == "-" or not word.startswith("-"):
            return out, argv[i - 1 :]
        if word.startswith("--"):
            name, eq, _ = word.partition("=")
            hits = [n for n in longs if n.startswith(name)]
            action = actions.get(name) or (actions[hits[0]] if len(hits) == 1 else None)
            attached = bool(eq)
        else:
            name = word[:2]
            action = actions.get(name)
            attached = len(word) > 2
        if action is None or action.nargs == 0 or attached:
            out.append(word)
        elif action.nargs == "?":
            out.append(f"{_long(action)}=")
        else:
            out.append(word)
            if i < len(argv):
                out.append(argv[i])
                i += 1
    return out, []


def _long(action: argparse.Action) -> str:
    """An option's first long name (its short one if it has none)."""
    return next((n for n in action.option_strings if n.startswith("--")), action.option_strings[0])


def subcommand(root: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of ``mt-job``'s subcommand ``name``."""
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[name]
    return parser


def submit_argv(argv: list[str], root: argparse.ArgumentParser | None = None) -> list[str]:
    """``submit``'s words as its parser reads them: ``--requeue=yes|no`` (the ``#MTGPU
    requeue`` form) as sbatch's flags, optional values attached, as in sbatch, and
    what follows the job file kept for the script (``$1``...) after ``--``; ``alloc``'s
    the same way, up to its command."""
    at = 2 if argv[:1] == ["--config"] else 1 if argv[:1] and argv[0].startswith("--config=") else 0
    cmd = argv[at] if at < len(argv) and argv[at] in ("submit", "alloc") else None
    if cmd is None:
        return argv
    at += 1
    table = {"--requeue=yes": "--requeue", "--requeue=no": "--no-requeue"} if cmd == "submit" else {}
    opts, rest = split_options(subcommand(root or build_parser(), cmd), argv[at:])
    return [*argv[:at], *(table.get(a, a) for a in opts), *(["--", *rest] if rest else [])]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mt-job", description="Submit and follow MTGPU jobs.")
    p.add_argument("--config", help="the daemon's configuration (default $MTGPU_CONFIG)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return sp

    s = common(
        sub.add_parser(
            "submit",
            help="submit a job file (- reads standard input)",
            description="Submit a job file. Every sbatch option is accepted, as in a #SBATCH "
            "line, and wins over the file's directives; #MTGPU keys are accepted as --KEY=VALUE.",
        )
    )
    add_submit_arguments(s)
    lp = common(sub.add_parser("list", help="your jobs (pending and running; --all for finished)"))
    lp.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    lp.add_argument("--user", "-u", help="only this user's jobs (admins)")
    lp.add_argument("--state", "-t", help="only jobs in these states: PD,R,CD,F,CA,TO (or full names)")
    lp.add_argument(
        "--format",
        "-o",
        help='columns in squeue\'s letters, such as "%%.10i %%.8j %%.2t %%M %%R" '
        "(i id, j name, u user, t/T state, M elapsed, l limit, R nodes or reason)",
    )
    sp = common(sub.add_parser("show", help="one job, with why it waits"))
    sp.add_argument("job_id")
    cp = common(sub.add_parser("cancel", help="cancel jobs"))
    cp.add_argument("job_ids", nargs="+")
    for verb, text in (("hold", "hold pending jobs (as sbatch --hold)"), ("release", "release held jobs")):
        hp = common(sub.add_parser(verb, help=text))
        hp.add_argument("job_ids", nargs="+")
    wp = common(sub.add_parser("wait", help="wait for a job to end; exit with its status (as sbatch --wait)"))
    wp.add_argument("job_id")
    gp = common(sub.add_parser("logs", help="a job's output"))
    gp.add_argument("job_id")
    gp.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    gp.add_argument("--stderr", action="store_true", help="the error stream")
    common(sub.add_parser("nodes", help="members, GPUs, VRAM, CPUs and RAM"))
    up = common(
        sub.add_parser(
            "usage",
            help="your GPU-hours, CPU-hours and jobs over a period (default this month)",
        )
    )
    from mtgpu.cli.report import add_period

    add_period(up)
    ap = common(
        sub.add_parser(
            "alloc", help="an interactive allocation: a shell with its GPUs (salloc's options work too)"
        )
    )
    ap.add_argument("--gpus", "-G", help="GPUs, such as rtx4090:1 (as gpus= in a job file)")
    ap.add_argument("--gres", dest="gres", help="Slurm's form, such as gpu:rtx4090:1")
    ap.add_argument("--time", "-t", help="time limit (30m, 2h, HH:MM:SS); default 1h")
    ap.add_argument("--cpus", "-c", "--cpus-per-task", dest="cpus", help="CPUs")
    ap.add_argument("--mem", "--ram", dest="mem", help="memory, such as 32G")
    ap.add_argument("--vram", help="VRAM per GPU (shared mode)")
    ap.add_argument("--gpu-mode", dest="gpu_mode", help="exclusive, shared or overcommit")
    ap.add_argument("--job-name", "-J", "--name", dest="name", help="the job's name (interactive)")
    ap.add_argument("--server", "-w", "--nodelist", dest="server", help="the member to run on")
    ap.add_argument(
        "--exclusive",
        nargs="?",
        const="",
        metavar="user|mcs",
        help="whole members, shared with no other job (a value only as --exclusive=VALUE, refused)",
    )
    ap.add_argument("--window", action="store_true", help="open the shell in a new tmux window")
    ap.add_argument("--join", metavar="JOB_ID", help=argparse.SUPPRESS)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="what to run instead of your shell (after --)")
    return with_examples(p, EXAMPLES)


#: The examples at the end of each command's --help (and manual page).
EXAMPLES = {
    "": "mt-job submit train.sh\nmt-job list\nmt-job logs -f 12",
    "submit": "mt-job submit train.sh\nmt-job submit --parsable train.sh\nssh gpu01 mt-job submit - < train.sh",
    "list": "mt-job list\nmt-job list --all --json",
    "show": "mt-job show 13\nmt-job show 42 --json",
    "cancel": "mt-job cancel 13\nmt-job cancel 13 14 15",
    "logs": "mt-job logs 12\nmt-job logs -f 12\nmt-job logs --stderr 12",
    "nodes": "mt-job nodes\nmt-job nodes --json",
    "hold": "mt-job hold 13\nmt-job hold 13 14",
    "release": "mt-job release 13",
    "wait": "mt-job wait 13 && echo done",
    "usage": "mt-job usage\nmt-job usage --start 2026-03-01 --by day\nmt-job usage --json",
    "alloc": "mt-job alloc --gpus rtx4090:1 --time 2h\n"
    "mt-job alloc -G rtx4090:1 -t 30m -- python -c 'import torch; print(torch.cuda.device_count())'",
}


def main(argv: list[str] | None = None) -> int:
    root = build_parser()
    args = root.parse_args(submit_argv(sys.argv[1:] if argv is None else argv, root))
    if args.cmd == "alloc":
        alloc_args(args)
    return main_with(args, "mt-job")


def main_with(args: argparse.Namespace, prog: str) -> int:
    """Run the parsed ``args`` (of ``mt-job`` or a Slurm command built on it); what it
    says starts with ``prog``, as ``sbatch: ...`` or ``salloc: ...`` in Slurm."""
    from mtgpu.cli.common import run_cli, tenant_client

    global _prog
    _prog = prog

    commands = {
        "submit": cmd_submit,
        "list": cmd_list,
        "show": cmd_show,
        "cancel": cmd_cancel,
        "hold": cmd_hold,
        "wait": cmd_wait,
        "release": cmd_hold,
        "logs": cmd_logs,
        "nodes": cmd_nodes,
        "alloc": cmd_alloc,
        "usage": cmd_usage,
    }
    cmd = getattr(args, "cmd", None) or "submit"

    def run() -> int:
        try:
            return commands[cmd](args, tenant_client(args))
        except SubmissionUnknown as exc:
            print(
                f"{prog}: unknown: the submission may or may not have been made ({exc}); check `mt-job list`",
                file=sys.stderr,
            )
            return EXIT_UNKNOWN

    return run_cli(prog, run)


if __name__ == "__main__":
    sys.exit(main())
