"""API operations on jobs and nodes: job.submit/list/show/cancel, nodes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import heapq
import math
import operator
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.api.limits import SubmitLimits
from mtgpu.config import Options
from mtgpu.config.options import MAX_JOB_SCRIPT
from mtgpu.errors import ApiError, JobError, MtgpuError, ValidationError
from mtgpu.jobspec import spec_to_dict
from mtgpu.jobstate import FINAL_STATES, PENDING, RUNNING
from mtgpu.jsonl import Page
from mtgpu.schedd import submitkeys
from mtgpu.schedd.agent import job_output_paths
from mtgpu.schedd.jobenv import JobUser
from mtgpu.schedd.jobfile import (
    check_priority,
    expand_array,
    parse_job_file,
    script_text_error,
    text_value_error,
)
from mtgpu.schedd.jobtable import JobTable
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import KNOWN_BRANDS
from mtgpu.state.codec import JobRecord
from mtgpu.state.store import CommitTimeout
from mtgpu.text import natural_key

#: Job files parsed at once, off the event loop (which also serves logins): parsing a
#: tenant's file is bounded (directive lines and values have limits) but not free.
#: Two threads: parses wait their turn there rather than all running at once.
_PARSERS = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="jobfile")


async def parse_off_loop(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Run ``fn`` (a parser of tenant input) in a bounded pool of threads."""
    return await asyncio.get_running_loop().run_in_executor(_PARSERS, functools.partial(fn, *args, **kw))


def script_bytes(script: str) -> int:
    """The size of a job script as stored (UTF-8); refuse a script that is not text."""
    try:
        return len(script.encode("utf-8"))
    except UnicodeEncodeError:
        raise ApiError(script_text_error(script) or "the job file is not UTF-8 text", "rejected") from None


def submitted_session(args: dict[str, Any], export: str | None, propagate: frozenset[str]) -> dict[str, Any]:
    """What the submitting shell hands the job (its environment as ``--export`` says,
    its umask, the resource limits PROPAGATE_RESOURCE_LIMITS names), checked; raises
    JobError for what is not well formed."""
    from mtgpu.schedd import submitenv

    out: dict[str, Any] = {}
    umask = submitenv.check_umask(args.get("umask"))
    if umask is not None:
        out["umask"] = umask
    limits = submitenv.check_rlimits(args.get("rlimits"), propagate)
    if limits:
        out["rlimits"] = limits
    sent = submitenv.check_env(args.get("env"))
    try:
        env = submitenv.exported(sent, export)
    except ValueError as exc:
        raise JobError(f"--export: {exc}") from exc
    if env:
        out["env"] = env
    return out


def job_gates(spec: Any, own: Callable[[str], list[dict[str, Any]]]) -> dict[str, Any]:
    """The record's gates from ``--hold``, ``--begin`` and ``--dependency``: a job
    named in a dependency must be one of the submitter's own (``own(ID)``: their
    records for an id); another tenant's is refused as one that does not exist."""
    from mtgpu.schedd.depend import parse_begin, parse_dependency

    out: dict[str, Any] = {}
    if spec.hold:
        out["held"] = True
    if spec.begin:
        try:
            out["begin_time"] = parse_begin(spec.begin, time.time())
        except ValueError as exc:
            raise ApiError(f"--begin: {exc}", "rejected") from exc
    if spec.dependency:
        for jid in parse_dependency(spec.dependency).job_ids():
            if not own(jid):
                raise ApiError(
                    f"--dependency={spec.dependency[:60]}: no job {jid} of yours; "
                    "`mt-job list --all` shows your jobs",
                    "rejected",
                )
    return out


def check_script_size(size: int, limit: int) -> None:
    """Refuse a job script larger than JOB_SCRIPT_MAX, naming both sizes."""
    if size > limit:
        raise ApiError(
            f"the job script is {size} bytes and JOB_SCRIPT_MAX is {limit}; keep data "
            "in files beside the script and read them from it",
            "too_large",
        )


class JobHost(Protocol):
    options: Options
    jobs: JobTable
    scheduler: Scheduler

    async def replicate(self, method: Any, *args: Any) -> Any: ...

    def home_of(self, caller: Caller) -> str | None: ...

    def job_user(self, name: str, uid: int) -> JobUser: ...

    async def job_image(self, user: str, uid: int, ref: str) -> dict[str, Any]: ...


_SOURCE_KEYS: dict[str, type | tuple[type, ...]] = {
    "ref": str,
    "image": str,
    "id": (str, type(None)),
    "origin": str,
    "archive": (str, type(None)),
}


def container_source(args: dict[str, Any]) -> dict[str, Any]:
    """The image a member that relayed a submission found for it, checked."""
    src = arg(args, "container_source", dict)
    if set(src) != set(_SOURCE_KEYS) or not all(isinstance(src[k], t) for k, t in _SOURCE_KEYS.items()):
        raise ValidationError("container_source must have ref, image, id, origin and archive")
    return src


async def submitted_image(
    host: JobHost, caller: Caller, args: dict[str, Any], ref: str | None
) -> dict[str, Any] | None:
    """For a containerized job (``ref``: its ``container=``): its image, checked and
    looked up where the tenant submits it (relayed submissions carry what the first
    member found)."""
    from mtgpu.workspaces.types import WorkspaceError

    if caller.via == "forwarded":
        return container_source(args)
    if not ref:
        return None
    try:
        return await host.job_image(caller.name, caller.uid, ref)
    except WorkspaceError as exc:
        raise ApiError(f"container={ref}: {exc}", "rejected") from exc


def submit_options(args: dict[str, Any]) -> list[str]:
    """The sbatch options given on the submitting command line, bounded."""
    options = arg(args, "options", list, [])
    if len(options) > 256 or not all(isinstance(o, str) and len(o) <= 4096 for o in options):
        raise ValidationError("options must be at most 256 strings of at most 4096 characters")
    return options


#: The most arguments a batch script is given (``sbatch job.sh A B``: ``$1``, ``$2``),
#: and the most bytes of them in all: the kernel's bound on a command line is shared
#: with the job's environment.
MAX_SCRIPT_ARGS = 1024
MAX_SCRIPT_ARGS_BYTES = 64 << 10


def submit_script_args(args: dict[str, Any]) -> list[str]:
    """The job script's arguments, checked: strings of UTF-8 text with no NUL, bounded."""
    given = arg(args, "args", list, [])
    if len(given) > MAX_SCRIPT_ARGS or not all(isinstance(a, str) for a in given):
        raise ValidationError(f"args must be at most {MAX_SCRIPT_ARGS} strings")
    size = 0
    for n, a in enumerate(given, 1):
        bad = text_value_error(f"the script's argument ${n}", a[: MAX_SCRIPT_ARGS_BYTES + 1])
        if bad is not None:
            raise ValidationError(bad)
        size += len(a.encode("utf-8")) + 1
        if size > MAX_SCRIPT_ARGS_BYTES:
            raise ValidationError(
                f"the script's arguments are over {MAX_SCRIPT_ARGS_BYTES} bytes; pass large data in a file"
            )
    return given


def default_job_name(args: dict[str, Any]) -> str:
    """The job's name when it gives none: the job file's name, as sbatch names it
    (``sbatch`` for a script read from standard input)."""
    from mtgpu.schedd.jobfile import MAX_JOB_NAME

    name = arg(args, "file_name", str, "").rsplit("/", 1)[-1][:MAX_JOB_NAME]
    if not name or name == "-" or not name.isprintable():
        return "sbatch"
    return name


async def directive_container(
    script: str, overrides: dict[str, Any], options: list[str] | None = None
) -> str | None:
    """The ``container`` a job file (and its overrides) names, if any; a job file that
    does not parse (or is too large) is left to the submission to refuse."""
    if len(script) > MAX_JOB_SCRIPT:
        return None
    try:
        spec = await parse_off_loop(
            parse_job_file,
            script,
            {str(k): str(v) for k, v in overrides.items()},
            default_workdir="/",
            options=options,
        )
    except JobError:
        return None
    return spec.container


class JobViews:
    """The public form of a job table's records (``mt-job show --json``), kept per job.

    A record is replaced whole when its job changes, and the table gives the same
    :class:`JobRecord` for the same record, so a view made from that record is still
    right (pollers list the same jobs many times a second). At most ``limit`` views
    are kept, the oldest made dropped first.
    """

    def __init__(self, table: JobTable, limit: int = 200_000) -> None:
        self.table = table
        self.limit = limit
        self._views: dict[str, tuple[JobRecord, JobUser, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._views)

    def view(self, j: dict[str, Any], sched: Scheduler | None, user: JobUser) -> dict[str, Any]:
        """The view of ``j`` (one of the table's records) for its owner ``user``."""
        rec = self.table.typed(j)
        hit = self._views.get(rec.job_id)
        if hit is not None and hit[0] is rec and hit[1] == user:
            view = dict(hit[2])
        else:
            base = base_view(rec, user)
            self._views.pop(rec.job_id, None)
            while len(self._views) >= self.limit:
                del self._views[next(iter(self._views))]
            self._views[rec.job_id] = (rec, user, base)
            view = dict(base)
        if rec.state == PENDING and sched is not None:
            info = sched.pending_info.get(rec.job_id) or (
                sched.pending_info.get(rec.array_id) if rec.array_id else None
            )
            if info is not None:
                # 0: not in the queue yet (waiting on a dependency, a hold or --begin)
                view["position"] = info.position or None
                # When the scheduler holds resources back for it (the next in line)
                view["expected_start"] = info.expected_start
                view["reason"] = info.reason
                view["reason_detail"] = private_reason(info.message, rec.uid, sched.table.get)
            else:
                view["position"] = None
                view["reason"] = view["reason"] or "None"
        return view


#: ``job.list``'s page: LIST_LIMIT jobs unless the request says ``limit``, at most
#: LIST_LIMIT_MAX (a page of 10,000 jobs was a 10 MB answer built in up to 1.5 s on the
#: event loop). The Python clients follow ``next_cursor`` and show every job.
LIST_LIMIT = 1000
LIST_LIMIT_MAX = 5000
#: Jobs looked at between two yields to the event loop while a page is made.
LIST_CHUNK = 500


def list_cursor(job: dict[str, Any]) -> str:
    """The ``next_cursor`` after ``job``: its submission time and id (the listing's order).

    >>> list_cursor({"submit_time": 1700000000.25, "job_id": "113_2"})
    '1700000000.25/113_2'
    """
    return f"{float(job.get('submit_time') or 0.0)!r}/{job['job_id']}"


def parse_list_cursor(cursor: str | None) -> tuple[float, tuple[tuple[int, int | str], ...]] | None:
    """The listing key a ``cursor`` names (None for none); ValidationError for a cursor
    ``job.list`` did not give (not echoed back).

    >>> parse_list_cursor("1700000000.25/113_2")
    (1700000000.25, ((0, 113), (1, '_'), (0, 2)))
    """
    if cursor is None:
        return None
    when, _, job_id = cursor.partition("/")
    try:
        t = float(when)
    except ValueError:
        t = math.nan
    if not job_id or len(cursor) > 200 or not math.isfinite(t):
        raise ValidationError(
            "cursor is not one that job.list gave (it is its answer's next_cursor); list again without it"
        )
    return t, natural_key(job_id)


#: How a job of another tenant's is named to a tenant (pending reasons, ``nodes``).
OTHER_TENANTS_JOB = "another tenant's job"

#: Where a pending reason names other jobs: "reserved for job 17", "once jobs 4, 5 end".
_NAMED_JOBS = re.compile(r"\b(for|once) (jobs?) ([\w]+(?:, [\w]+)*(?: \.\.\.)?)")


def private_reason(message: str, uid: int | None, job: Callable[[str], dict[str, Any] | None]) -> str:
    """``message`` as the job's owner may read it: a job of someone else's that it
    names (the job holding the reservation, the jobs it waits for) is "another
    tenant's job", as Slurm's PrivateData=jobs hides other users' jobs.

    >>> jobs = {"4": {"uid": 1000}, "5": {"uid": 1001}}
    >>> private_reason("reserved for it once jobs 4, 5 end (no time limit)", 1000, jobs.get)
    "reserved for it once other tenants' jobs end (no time limit)"
    >>> private_reason("it fits now, but only on resources reserved for job 4", 1000, jobs.get)
    'it fits now, but only on resources reserved for job 4'
    >>> private_reason("it fits now, but only on resources reserved for job 5", 1000, jobs.get)
    "it fits now, but only on resources reserved for another tenant's job"
    """

    def one(m: re.Match[str]) -> str:
        ids = m.group(3).removesuffix(" ...").split(", ")
        if not m.group(3).endswith("...") and all((job(i) or {}).get("uid") == uid for i in ids):
            return m.group(0)
        hidden = "other tenants' jobs" if m.group(2) == "jobs" else OTHER_TENANTS_JOB
        return f"{m.group(1)} {hidden}"

    return _NAMED_JOBS.sub(one, message)


def base_view(rec: JobRecord, user: JobUser) -> dict[str, Any]:
    """The public form of a job's record, without what the scheduler adds to a pending
    job's (its position and reason)."""
    stdout, stderr = job_output_paths(rec, user)
    view = {
        "job_id": rec.job_id,
        "array_id": rec.array_id,
        "array_task": rec.array_task,
        # An array task's own numeric id (its SLURM_JOB_ID); a job's own id otherwise.
        "numeric_id": rec.numeric_id or (rec.job_id if rec.array_id is None else None),
        "name": rec.name,
        "user": rec.user,
        "state": rec.state.value,
        "nodes": rec.nodes,
        "gpus": [{"node": m.node, "index": i} for m in rec.members for i in m.gpu_indices],
        "cpus": rec.cpus,
        "ram": rec.ram,
        # What it asked for, shown while it waits too: GPUs on each member, members.
        "req_gpus": rec.spec.request.gpus,
        "req_nodes": rec.spec.request.nodes,
        # sbatch's --exclusive: the job holds its members whole.
        "exclusive": rec.exclusive,
        "exit_code": rec.exit_code,
        "reason": rec.reason,
        "submit_time": rec.submit_time,
        "start_time": rec.start_time,
        "end_time": rec.end_time,
        "workdir": rec.workdir,
        "stdout": stdout,
        "stderr": stderr,
        "priority": rec.priority,
        "time_limit": rec.time_limit,
        "warnings": list(rec.warnings),
        "container": rec.container_ref,
        "image_id": rec.image_id,
        "progress": dict(rec.progress),
        "requeues": rec.requeues,
        "requeue_reason": rec.requeue_reason,
        # Which start this is (0 first; each requeue adds one), as Slurm's restart count.
        "attempt": rec.attempt,
        "cancel_requested": rec.cancel_requested,
        # Kept from starting (--hold, mt-job hold) until released.
        "held": rec.held,
    }
    view.update(accounting_view(rec))
    return view


def accounting_view(rec: JobRecord) -> dict[str, Any]:
    """A job's accounting fields (Slurm's ``sacct``): what it was given, where, and
    what it used; the ``gpus`` list with each GPU's UUID and type."""
    rows: list[dict[str, Any]] = []
    for m in rec.members:
        known = {g["index"]: g for g in rec.gpu_info.get(m.node) or ()}
        gpus = [
            {
                "node": m.node,
                "index": i,
                "uuid": (known.get(i) or {}).get("uuid") or None,
                "type": (known.get(i) or {}).get("type") or None,
            }
            for i in m.gpu_indices
        ]
        rows.append({"node": m.node, "rank": m.rank, "cpus": m.cpus, "ram": m.ram, "gpus": gpus})
    parts = [rec.usage.get(m.node) or {} for m in rec.members]
    signals = [u["signal"] for u in parts if u.get("signal")]
    sig = signals[0] if signals else None
    code = rec.exit_code
    start, end = rec.start_time, rec.end_time

    def total(name: str) -> float | None:
        vals = [u[name] for u in parts if u.get(name) is not None]
        return round(sum(vals), 3) if vals else None

    def peak(name: str) -> int | None:
        vals = [u[name] for u in parts if u.get(name) is not None]
        return max(vals) if vals else None

    user_s, sys_s = total("cpu_user"), total("cpu_system")
    return {
        "gpus": [g for r in rows for g in r["gpus"]],
        "members": rows,
        "alloc_cpus": sum(r["cpus"] for r in rows),
        "alloc_ram": sum(r["ram"] for r in rows),
        "alloc_gpus": sum(len(r["gpus"]) for r in rows),
        "elapsed": round(end - start, 3) if start is not None and end is not None else None,
        # A job a signal ended has status 0 and the signal, as in Slurm's ExitCode 0:11.
        "exit_code": 0 if code is None and sig else code,
        "signal": sig,
        # Slurm's ExitCode, "status:signal"; a signal's end has status 0, as there.
        "exit": None if code is None and sig is None else f"{code or 0}:{sig or 0}",
        "max_rss": peak("max_rss"),
        "memory_peak": peak("memory_peak"),
        "cpu_user": user_s,
        "cpu_system": sys_s,
        "total_cpu": round((user_s or 0) + (sys_s or 0), 3)
        if user_s is not None or sys_s is not None
        else None,
        "restarts": rec.attempt,
    }


#: The most jobs one ``job.cancel`` may name, and the longest it waits for running
#: ones to end (below the 30 s a relayed request is given).
MAX_CANCEL_IDS = 10_000
MAX_CANCEL_WAIT = 20

#: The most job parts one ``job.dispatch`` request may carry.
MAX_DISPATCH_BATCH = 256


def dispatch_op(
    table: JobTable, start: Callable[[JobRecord, int, int], Awaitable[None]]
) -> Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]:
    """``job.dispatch``, a member's side: for each of ``jobs`` (job ids; the scheduler
    sends the starts waiting for this member together), once this member's replica has
    the job placed with the scheduler's term and the attempt in ``attempts`` (10 s at
    most), ``start`` its part; a start of an attempt since requeued is stale. The
    answer says, per job, what went wrong (``errors``) and its code (``codes``: a
    commit lost to a leader change is asked for again). ``ports``: the rendezvous
    port of multi-member jobs, by job id, as their rank-0 member picked it."""

    async def one(job_id: str, term: int, attempt: int | None, port: int) -> None:
        def placed(j: dict[str, Any]) -> bool:
            rec = table.typed(j)
            return (
                rec.placement is not None and rec.term == term and (attempt is None or rec.attempt >= attempt)
            )

        j = await table.wait_for(job_id, placed, 10.0)
        rec = table.typed(j) if j is not None else None
        if rec is None or (attempt is not None and rec.attempt != attempt):
            # Not placed yet with this term, or requeued since: this start is stale.
            raise ApiError(f"job {job_id} is not placed here with term {term}, attempt {attempt}", "stale")
        await start(rec, term, port)

    async def dispatch(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Start this member's part of jobs the scheduler placed (peers only)."""
        if caller.via != "peer":
            raise ApiError("only the scheduler may dispatch", "forbidden")
        term = arg(args, "term", int)
        ids = arg(args, "jobs", list)
        if not 0 < len(ids) <= MAX_DISPATCH_BATCH or not all(isinstance(i, str) for i in ids):
            raise ValidationError(f"jobs must be a list of 1 to {MAX_DISPATCH_BATCH} job ids")
        ports = args.get("ports") or {}
        if not isinstance(ports, dict) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in ports.values()
        ):
            raise ValidationError("ports must map job ids to port numbers")
        attempts = arg(args, "attempts", dict, {})  # absent from older schedulers
        if not all(isinstance(v, int) for v in attempts.values()):
            raise ValidationError("attempts must map job ids to attempt numbers")
        results = await asyncio.gather(
            *(one(i, term, attempts.get(i), ports.get(i, 0)) for i in ids), return_exceptions=True
        )
        errors, codes = {}, {}
        for i, r in zip(ids, results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            if isinstance(r, BaseException):
                errors[i] = str(r) or type(r).__name__
                if isinstance(r, MtgpuError):
                    codes[i] = r.code
        return {"started": [i for i in ids if i not in errors], "errors": errors, "codes": codes}

    return dispatch


def rendezvous_op(pick: Callable[[], int]) -> Callable[[Caller, dict[str, Any]], dict[str, Any]]:
    """``job.rendezvous`` (peers only): a rendezvous port for a multi-member job whose
    rank 0 this member runs, picked here, where the job will listen."""

    def rendezvous(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        if caller.via != "peer":
            raise ApiError("only the scheduler may ask for a rendezvous port", "forbidden")
        return {"port": pick()}

    return rendezvous


def submission_key(caller: Caller, key: str | None) -> tuple[str, str] | None:
    """The submission key as the job table keeps it, with the tenant scope it is kept
    in (the caller's account), checked as the hostile input it may be: a key seen in
    another tenant's submission neither names that tenant's job nor lets a submission
    past the submit limits as a "retry".

    >>> submission_key(Caller("ann", 20001, False, "socket"), "abc")
    ('20001:ann', 'abc')
    """
    if not key:
        return None
    why = submitkeys.key_error(key)
    if why is not None:
        raise ValidationError(why)
    return submitkeys.scope_of(caller.name, caller.uid), key


def cut_off_text(since: float) -> str:
    """What a tenant is told on a member cut off from its cluster's majority since
    ``since`` (a wall-clock time, shown in this host's time zone)."""
    at = time.strftime("%H:%M:%S %Z", time.localtime(since)).strip()
    return (
        f"this member cannot reach its cluster's scheduler since {at}; nothing was "
        "done here: retry in a few seconds, or from another member"
    )


#: The answer to a submission whose log entry was not committed in time: it may still
#: be (the scheduler lost its majority, or a new one takes over), so the client sends
#: it again with the same key, which returns the first outcome if there was one.
IN_DOUBT = (
    "the submission was not committed within {t:g}s (the scheduler may be cut off "
    "from its majority or changing); it may still be: send it again with the same key, "
    "or check `mt-job list`"
)


def register(d: Dispatcher, host: JobHost) -> None:
    """Register the job operations on ``d``."""

    def _own(caller: Caller, j: dict[str, Any]) -> bool:
        return caller.admin or j["user"] == caller.name

    limits = SubmitLimits(None, None, None)
    job_views = JobViews(host.jobs)

    def set_limits() -> None:
        o = host.options  # read each time: SIGHUP may have changed them
        limits.rate, limits.burst, limits.max_queued = (
            o.user_submit_rate,
            o.user_submit_burst,
            o.user_max_queued_jobs,
        )

    def known(keyed: tuple[str, str] | None) -> dict[str, Any] | None:
        """The answer to a retry of a submission this replica has applied (so it is
        committed): its first outcome, with nothing parsed, charged or added again."""
        seen = host.jobs.outcome(*keyed, time.time()) if keyed else None
        if seen is None:
            return None
        if "error" in seen:
            raise ApiError(seen["error"], "rejected")
        tasks = seen["tasks"]
        rec = host.jobs.record(tasks[0]) if tasks else None
        return {
            "job_id": seen["job_id"],
            "tasks": len(tasks) or 1,
            "warnings": list(rec.warnings) if rec else [],
            "duplicate": True,
        }

    async def submit(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Submit a job file."""
        if caller.uid == 0:
            raise ApiError("root cannot submit jobs; submit as the tenant who should run them", "forbidden")
        o = host.options
        keyed = submission_key(caller, arg(args, "token", str, None))
        first = known(keyed)
        if first is not None:
            return first
        # Every submission counts against the rate, refused or not: a refusal costs
        # the daemon reading and parsing too.
        set_limits()
        limits.take(caller.name)
        script = arg(args, "script", str)
        size = script_bytes(script)
        check_script_size(size, o.job_script_max)
        overrides = arg(args, "overrides", dict, {})
        if len(overrides) > 64:
            raise ValidationError("overrides has more than 64 keys; there are fewer directives")
        home = host.home_of(caller) or "/"
        workdir = arg(args, "workdir", str, "") or home
        bad = text_value_error("workdir", workdir[:4097])
        if bad is not None:
            raise ValidationError(bad)
        if not workdir.startswith("/") or len(workdir) > 4096 or "\0" in workdir:
            raise ValidationError("workdir must be an absolute path of at most 4096 characters")
        brands = set(KNOWN_BRANDS) | {p.brand for p in o.gpu_probes}
        options = submit_options(args)
        script_args = submit_script_args(args)
        try:
            spec = await parse_off_loop(
                parse_job_file,
                script,
                {str(k): str(v) for k, v in overrides.items()},
                default_workdir=workdir,
                default_name=default_job_name(args),
                brands=brands,
                options=options,
            )
            check_priority(spec.priority, is_admin=caller.admin)
            if spec.output is None and arg(args, "slurm_output", bool, False):
                # sbatch's default, as Slurm's: both streams (unless --error) in the
                # working directory, slurm-%j.out (an array task's slurm-%A_%a.out).
                spec = dataclasses.replace(spec, output="slurm-%A_%a.out" if spec.array else "slurm-%j.out")
            submitted = submitted_session(args, spec.export, o.propagate_resource_limits)
            # Decided on a complete inventory: members that have not reported yet are
            # waited for (briefly) before a request that does not fit the others is refused.
            await host.scheduler.settle(spec.request)
            host.scheduler.check_submit(spec.request)
        except JobError as exc:
            raise ApiError(str(exc), "rejected") from exc
        gates = job_gates(spec, lambda i: [j for j in host.jobs.tasks_of(i) if j["user"] == caller.name])
        if spec.test_only:
            said = host.scheduler.trial(
                {
                    "user": caller.name,
                    "uid": caller.uid,
                    "name": spec.name,
                    "spec": spec_to_dict(spec),
                    "workdir": spec.workdir,
                    **gates,
                },
                time.time(),
            )
            return {"job_id": None, "tasks": 0, "warnings": list(spec.warnings), "test_only": said}
        tasks = expand_array(spec) if spec.array else None
        # The exported environment is kept in the job's record, counted with its script.
        size += sum(len(k) + len(v) + 2 for k, v in submitted.get("env", {}).items())
        if script_args:
            # `sbatch job.sh A B`: the script runs with them as $1, $2 (kept with the job).
            submitted["args"] = script_args
            size += sum(len(a.encode("utf-8")) + 1 for a in script_args)
        first = known(keyed)  # committed while this one was parsed
        if first is not None:
            return first
        set_limits()
        limits.check_queue(
            caller.name,
            len(tasks) if tasks else 1,
            host.jobs.pending_by_user.get(caller.name, 0),
            size,
            host.jobs.pending_script_bytes.get(caller.name, 0),
            o.user_max_queued_script_bytes,
        )
        record = {
            "user": caller.name,
            "uid": caller.uid,
            "name": spec.name,
            "spec": spec_to_dict(spec),
            "workdir": spec.workdir,
            "script_bytes": size,
            "log_cluster": host.options.cluster_name,
        }
        if submitted:
            record["submit"] = submitted
        record.update(gates)
        if spec.container:
            record["container"] = await submitted_image(host, caller, args, spec.container)
        scope, key = keyed or (None, None)
        try:
            r = await host.replicate(host.jobs.submit, record, tasks, time.time(), key, scope, True)
        except CommitTimeout as exc:
            raise ApiError(IN_DOUBT.format(t=exc.timeout), "in_doubt") from exc
        if "error" in r:
            raise ApiError(r["error"], "rejected")
        host.scheduler.accepted(r["tasks"])
        return {
            "job_id": r["job_id"],
            "tasks": len(r["tasks"]),
            "warnings": list(spec.warnings),
            "duplicate": r.get("duplicate", False),
            "wait": spec.wait,
        }

    async def list_(caller: Caller, args: dict[str, Any]) -> Page:
        """Jobs: your active ones, or with all=true your finished ones too (admins:
        everyone's), in pages of ``limit`` (LIST_LIMIT unless given, LIST_LIMIT_MAX at
        most) in submission order; ``cursor`` (an answer's ``next_cursor``) asks for the
        page after it."""
        show_all = arg(args, "all", bool, False)
        user = arg(args, "user", str, None)
        limit = arg(args, "limit", int, LIST_LIMIT)
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise ValidationError(
                f"limit must be 1 to {LIST_LIMIT_MAX}; follow next_cursor for the jobs after a page"
            )
        after = parse_list_cursor(arg(args, "cursor", str, None))
        records = host.jobs.all() if show_all else host.jobs.active()  # a list of its own
        keyed = []
        for i, j in enumerate(records):
            if i % LIST_CHUNK == LIST_CHUNK - 1:
                await asyncio.sleep(0)  # other tenants' requests and logins between chunks
            if not _own(caller, j) or (user and j["user"] != user):
                continue
            if not show_all and j["state"] in FINAL_STATES:
                continue
            # Ids in natural order within a submission: task 113_2 before 113_10.
            key = (j.get("submit_time") or 0.0, natural_key(j["job_id"]))
            if after is None or key > after:
                keyed.append((key, j))
        page = heapq.nsmallest(limit + 1, keyed, key=operator.itemgetter(0))
        more = len(page) > limit
        del page[limit:]
        out = []
        users: dict[tuple[str, int], JobUser] = {}
        for i, (_key, j) in enumerate(page):
            if i % LIST_CHUNK == LIST_CHUNK - 1:
                await asyncio.sleep(0)
            who = (j["user"], j["uid"])
            if who not in users:
                users[who] = host.job_user(*who)
            view = job_views.view(j, host.scheduler, users[who])
            view["cluster"] = host.options.cluster_name
            out.append(view)
        last = page[-1][1] if page else None
        return Page(out, list_cursor(last) if more and last is not None else None)

    def show(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One job; an array's id shows its tasks."""
        jid = str(arg(args, "job_id", (str, int)))
        tasks = [j for j in host.jobs.tasks_of(jid) if _own(caller, j)]
        if not tasks:
            raise ApiError(f"no job {jid} of yours; `mt-job list --all` shows your jobs", "not_found")
        steps = getattr(host, "steps", None)
        cluster = host.options.cluster_name

        def view(t: dict[str, Any]) -> dict[str, Any]:
            v = {**job_views.view(t, host.scheduler, host.job_user(t["user"], t["uid"])), "cluster": cluster}
            return {**v, "steps": steps.of(t["job_id"])} if steps is not None else v

        if len(tasks) == 1 and jid in (tasks[0]["job_id"], tasks[0].get("numeric_id")):
            return view(tasks[0])
        views = [view(t) for t in sorted(tasks, key=lambda t: t["array_task"])]
        states = sorted({v["state"] for v in views})
        return {
            "job_id": jid,
            "array": True,
            "state": states[0] if len(states) == 1 else "MIXED",
            "user": tasks[0]["user"],
            "name": tasks[0]["name"],
            "tasks": views,
            "nodes": sorted({n for v in views for n in v["nodes"]}),
            "gpus": [g for v in views for g in v["gpus"]],
            "exit_code": None,
            "reason": "",
        }

    async def cancel(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Cancel jobs (an array's id cancels every task), with an optional reason.

        Pending jobs end at once (``cancelled``); running ones are stopped by their
        members (``stopping``). With ``wait`` (seconds, at most MAX_CANCEL_WAIT) the
        answer comes once those have ended too (then they are in ``cancelled`` as
        well), or the wait is over. Jobs that had already ended are in ``ended``
        with their state, in ``ended_states``.
        """
        ids = arg(args, "job_ids", list)
        if not 0 < len(ids) <= MAX_CANCEL_IDS:
            raise ValidationError(f"name 1 to {MAX_CANCEL_IDS} jobs to cancel")
        why = " ".join(arg(args, "reason", str, "").split())[:200]
        wait = arg(args, "wait", (int, float), 0)
        if not 0 <= wait <= MAX_CANCEL_WAIT:
            raise ValidationError(f"wait must be 0 to {MAX_CANCEL_WAIT} seconds")
        targets, missing = [], []
        for raw in ids:
            jid = str(raw)
            tasks = [j for j in host.jobs.tasks_of(jid) if _own(caller, j)]
            if not tasks:
                missing.append(jid)
            targets += [t["job_id"] for t in tasks]
        if missing and not targets:
            raise ApiError(f"no job {', '.join(missing)} of yours to cancel", "not_found")
        r = await host.replicate(host.jobs.cancel, targets, caller.name, time.time(), why)
        host.scheduler.forget(r["cancelled"])
        r = {**r, "ended": list(r.get("ended", ())), "not_found": missing}
        if wait and r["stopping"]:
            deadline = time.monotonic() + wait
            ends = await asyncio.gather(
                *(
                    host.jobs.wait_for(
                        jid, lambda j: j["state"] in FINAL_STATES, max(0.0, deadline - time.monotonic())
                    )
                    for jid in r["stopping"]
                )
            )
            done = [jid for jid, j in zip(r["stopping"], ends, strict=True) if j is not None]
            r["cancelled"] = r["cancelled"] + done
            r["stopping"] = [jid for jid in r["stopping"] if jid not in done]
        ended = {jid: host.jobs.record(jid) for jid in r["ended"]}
        r["ended_states"] = {jid: rec.state.value if rec else None for jid, rec in ended.items()}
        return r

    def nodes(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Every member's GPUs, VRAM, CPUs and RAM, with the jobs holding each GPU: a
        tenant's own by id, another tenant's as "another tenant's job" (admins see
        every id), as pending reasons name them (:func:`private_reason`)."""
        held: dict[str, dict[int, list[str]]] = {}
        for j in host.jobs.active():
            rec = host.jobs.typed(j)
            shown = rec.job_id if caller.admin or rec.user == caller.name else OTHER_TENANTS_JOB
            for m in rec.members:
                for i in m.gpu_indices:
                    held.setdefault(m.node, {}).setdefault(i, []).append(shown)
        out = []
        drains = host.scheduler.drains
        # What running work holds on each member (scontrol's CPUAlloc and AllocMem,
        # sinfo's %C): the scheduler's own committed figures; a member held whole
        # (--exclusive) has all its CPUs allocated, as in Slurm.
        committed = {n.name: n for n in host.scheduler.snapshot().nodes}
        for name, inv in sorted(host.scheduler.nodes.items()):
            state = str(host.scheduler.state_of(name))
            d = inv.to_dict(held.get(name, {}), state=state)
            snap = committed.get(name)
            if snap is not None:
                d["cpus_alloc"] = snap.cpus if snap.whole_job else min(snap.cpus, snap.cpus_committed)
                d["ram_alloc"] = min(snap.ram_total, snap.ram_committed)
            drain = drains.get(name) if drains is not None else None
            d["drain_reason"] = drain["reason"] if drain else None
            out.append(d)
        for name in host.scheduler.silent_members():
            # Listed but silent since this scheduler started: shown, never left out.
            drain = drains.get(name) if drains is not None else None
            out.append(
                {
                    "name": name,
                    "state": str(host.scheduler.state_of(name))
                    if host.scheduler.lease_over(name)
                    else "unknown",
                    "gpus": [],
                    "drain_reason": drain["reason"] if drain else None,
                }
            )
        return sorted(out, key=lambda d: d["name"])

    def usage_(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Usage sums (GPU-hours, CPU-hours, jobs) over days ``start``..``end`` (default
        this month, UTC), grouped ``by`` user, member, gpu_type and/or day: the caller's
        own, or with ``all`` (admins) everyone's, or one ``user``'s (admins)."""
        from mtgpu.schedd import usage

        first, last = usage.this_month(time.time())
        try:
            start = usage.parse_day(arg(args, "start", str, first), "start")
            end = usage.parse_day(arg(args, "end", str, last), "end")
        except ValueError as exc:
            raise ApiError(str(exc), "bad_request") from None
        if end < start:
            raise ApiError(f"the period ends ({end}) before it starts ({start})", "bad_request")
        by = arg(args, "by", list, ["user"])
        if (
            len(by) > len(usage.GROUPS)
            or not all(isinstance(b, str) and b in usage.GROUPS for b in by)
            or len(set(by)) != len(by)
        ):
            raise ApiError(f"by: group by some of {', '.join(usage.GROUPS)}, each once", "bad_request")
        user = arg(args, "user", str, None)
        everyone = arg(args, "all", bool, False)
        if not caller.admin and (everyone or (user is not None and user != caller.name)):
            raise ApiError("you may see only your own usage; admins see everyone's", "forbidden")
        users = None if everyone and user is None else [user or caller.name]
        try:
            rows = usage.summarize(host.jobs.usage, start, end, tuple(by), users)
        except ValueError as exc:
            raise ApiError(f"{exc}; ask for `member` alone (admins), or `user`", "bad_request") from None
        total = usage.summarize(host.jobs.usage, start, end, (), users)
        return {
            "cluster": host.options.cluster_name,
            "start": start,
            "end": end,
            "by": by,
            "rows": rows,
            "total": total[0] if total else usage.zero(),
            # Months kept as one row each (older than DAILY_DAYS) that the period cuts:
            # left out, as a month is summed whole or not at all.
            "cut_months": usage.cut_months(host.jobs.usage, start, end),
        }

    async def set_held(caller: Caller, args: dict[str, Any], held: bool) -> dict[str, Any]:
        targets, missing = own_tasks(caller, arg(args, "job_ids", list))
        if not targets:
            raise ApiError(f"no job {', '.join(missing)} of yours", "not_found")
        r = await host.replicate(host.jobs.set_held, targets, held)
        host.scheduler.kick()
        return {**r, "not_found": missing}

    async def hold(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Hold pending jobs (an array's id holds every pending task)."""
        return await set_held(caller, args, True)

    async def release(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Release held jobs, so that the queue considers them."""
        return await set_held(caller, args, False)

    def own_tasks(caller: Caller, ids: list[Any], what: str = "") -> tuple[list[str], list[str]]:
        """The jobs (an array's id: its tasks) that ``ids`` name, and the ids naming none."""
        if not 0 < len(ids) <= MAX_CANCEL_IDS:
            raise ValidationError(f"name 1 to {MAX_CANCEL_IDS} jobs" + (f" to {what}" if what else ""))
        targets, missing = [], []
        for raw in ids:
            tasks = [j for j in host.jobs.tasks_of(str(raw)) if _own(caller, j)]
            if not tasks:
                missing.append(str(raw))
            targets += [t["job_id"] for t in tasks]
        return targets, missing

    async def requeue(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Put running jobs back in the queue (admins): each runs again from its start,
        as Slurm's ``scontrol requeue``."""
        targets, missing = own_tasks(caller, arg(args, "job_ids", list), "requeue")
        reason = " ".join(arg(args, "reason", str, "").split())[:500]
        why = f"requeued by {caller.name}" + (f": {reason}" if reason else "")
        requeued: list[str] = []
        not_running: list[str] = []
        for jid in targets:
            rec = host.jobs.record(jid)
            if rec is None or rec.state != RUNNING or rec.cancel_requested:
                not_running.append(jid)
                continue
            r = await host.replicate(host.jobs.requeue, jid, why, time.time(), rec.attempt)
            (not_running if r.get("error") else requeued).append(jid)
        host.scheduler.kick()
        return {"requeued": requeued, "not_running": not_running, "not_found": missing}

    async def update(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Change pending jobs' time limit or priority (admins), as Slurm's ``scontrol
        update JobId=N TimeLimit=... Priority=...``."""
        from mtgpu.jobspec import MAX_PRIORITY, MIN_PRIORITY
        from mtgpu.schedd.timefmt import parse_time_limit

        targets, missing = own_tasks(caller, arg(args, "job_ids", list), "update")
        changes: dict[str, Any] = {}
        if "time_limit" in args:
            try:
                changes["time_limit"] = parse_time_limit(arg(args, "time_limit", str))
            except ValueError as exc:
                raise ValidationError(f"time_limit: {exc}") from None
        if "priority" in args:
            prio = arg(args, "priority", int)
            if not MIN_PRIORITY <= prio <= MAX_PRIORITY:
                raise ValidationError(f"priority: {prio} is not {MIN_PRIORITY} to {MAX_PRIORITY}")
            changes["priority"] = prio
        if not changes:
            raise ValidationError("nothing to change: give time_limit and/or priority")
        r = await host.replicate(host.jobs.update, targets, changes)
        for jid in r["changed"]:
            # Queued again, at its new priority and with its new limit (the queue keeps
            # what a job had when it was queued).
            host.scheduler.queue.remove(jid)
        host.scheduler.kick()
        return {**r, "not_found": missing, "changes": changes}

    d.register("job.submit", submit)
    d.register("job.usage", usage_)
    d.register("job.hold", hold, audit=True)  # audited when an admin holds another's job
    d.register("job.release", release, audit=True)
    d.register("job.list", list_)
    d.register("job.show", show)
    d.register("job.cancel", cancel, audit=True)  # audited when an admin cancels
    d.register("job.requeue", requeue, admin=True, audit=True)
    d.register("job.update", update, admin=True, audit=True)
    d.register("nodes", nodes)
