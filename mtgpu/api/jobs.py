"""API operations on jobs and nodes: job.submit/list/show/cancel, nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.api.limits import SubmitLimits
from mtgpu.config import Options
from mtgpu.errors import ApiError, JobError
from mtgpu.schedd.agent import job_output_paths
from mtgpu.schedd.jobenv import JobUser
from mtgpu.schedd.jobfile import check_priority, expand_array, parse_job_file
from mtgpu.schedd.jobtable import FINAL_STATES, PENDING, JobTable, spec_to_dict
from mtgpu.schedd.scheduler import Scheduler
from mtgpu.schedd.types import KNOWN_BRANDS

MAX_SCRIPT_BYTES = 1 << 20


class JobHost(Protocol):
    options: Options
    jobs: JobTable
    scheduler: Scheduler

    async def replicate(self, method: Any, *args: Any) -> Any: ...

    def home_of(self, caller: Caller) -> str | None: ...

    def job_user(self, name: str, uid: int) -> JobUser: ...

    async def job_image(self, user: str, uid: int, ref: str) -> dict[str, Any]: ...


_SOURCE_KEYS = {"ref": str, "image": str, "id": (str, type(None)), "origin": str,
                "archive": (str, type(None))}


def container_source(args: dict[str, Any]) -> dict[str, Any]:
    """The image a member that relayed a submission found for it, checked."""
    src = arg(args, "container_source", dict)
    if set(src) != set(_SOURCE_KEYS) or not all(isinstance(src[k], t) for k, t in _SOURCE_KEYS.items()):
        raise ApiError("container_source must have ref, image, id, origin and archive", "bad_request")
    return src


async def submitted_image(host: JobHost, caller: Caller, args: dict[str, Any],
                          ref: str | None) -> dict[str, Any] | None:
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


def directive_container(script: str, overrides: dict[str, Any]) -> str | None:
    """The ``container`` a job file (and its overrides) names, if any; a job file that
    does not parse is left to the submission to refuse."""
    try:
        return parse_job_file(script, {str(k): str(v) for k, v in overrides.items()},
                              default_workdir="/").container
    except JobError:
        return None


#: Views by job: a record is replaced whole when its job changes, so a view made from
#: the same record object is still right (pollers list the same jobs many times a second).
_views: dict[str, tuple[dict[str, Any], JobUser, dict[str, Any]]] = {}


def job_view(j: dict[str, Any], sched: Scheduler | None, user: JobUser) -> dict[str, Any]:
    """The public form of a job record (``mt-job show --json``)."""
    hit = _views.get(j["job_id"])
    if hit is not None and hit[0] is j and hit[1] == user:
        view = dict(hit[2])
    else:
        view = _base_view(j, user)
        if len(_views) > 200_000:
            _views.clear()
        _views[j["job_id"]] = (j, user, view)
        view = dict(view)
    if j["state"] == PENDING and sched is not None:
        info = sched.pending_info.get(j["job_id"]) or (
            sched.pending_info.get(j["array_id"]) if j.get("array_id") else None)
        if info is not None:
            view["position"] = info.position
            view["reason"] = info.reason
            view["reason_detail"] = info.message
        else:
            view["position"] = None
            view["reason"] = view["reason"] or "None"
    return view


def _base_view(j: dict[str, Any], user: JobUser) -> dict[str, Any]:
    stdout, stderr = job_output_paths(j, user)
    p = j.get("placement") or {}
    members = p.get("members", [])
    view = {
        "job_id": j["job_id"], "array_id": j.get("array_id"), "array_task": j.get("array_task"),
        "name": j["name"], "user": j["user"], "state": j["state"],
        "nodes": [m["node"] for m in members],
        "gpus": [{"node": m["node"], "index": i} for m in members for i in m["gpu_indices"]],
        "cpus": j["spec"]["request"]["cpus"], "ram": j["spec"]["request"]["ram"],
        "exit_code": j.get("exit_code"), "reason": j.get("reason") or "",
        "submit_time": j["submit_time"], "start_time": j.get("start_time"),
        "end_time": j.get("end_time"), "workdir": j["workdir"],
        "stdout": stdout, "stderr": stderr, "priority": j["spec"]["priority"],
        "time_limit": j["spec"].get("time_limit"), "warnings": list(j["spec"].get("warnings", ())),
        "container": (j.get("container") or {}).get("ref"),
        "image_id": (j.get("container") or {}).get("id"),
        "progress": dict(j.get("progress") or {}),
        "requeues": j.get("requeues", 0), "requeue_reason": j.get("requeue_reason"),
    }
    return view


#: The most job parts one ``job.dispatch`` request may carry.
MAX_DISPATCH_BATCH = 256


def dispatch_op(table: JobTable, start: Callable[[dict[str, Any], int], Awaitable[None]]
                ) -> Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]:
    """``job.dispatch``, a member's side: for each of ``jobs`` (job ids; the scheduler
    sends the starts waiting for this member together), once this member's replica has
    the job placed with the scheduler's term (10 s at most), ``start`` its part. The
    answer says, per job, what went wrong (``errors``)."""

    async def one(job_id: str, term: int) -> None:
        j = await table.wait_for(job_id, lambda j: bool(j.get("placement")) and j.get("term") == term,
                                 10.0)
        if j is None:
            raise ApiError(f"job {job_id} is not placed here with term {term}", "stale")
        await start(j, term)

    async def dispatch(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Start this member's part of jobs the scheduler placed (peers only)."""
        if caller.via != "peer":
            raise ApiError("only the scheduler may dispatch", "forbidden")
        term = arg(args, "term", int)
        ids = arg(args, "jobs", list)
        if not 0 < len(ids) <= MAX_DISPATCH_BATCH or not all(isinstance(i, str) for i in ids):
            raise ApiError(f"jobs must be a list of 1 to {MAX_DISPATCH_BATCH} job ids", "bad_request")
        results = await asyncio.gather(*(one(i, term) for i in ids), return_exceptions=True)
        errors = {}
        for i, r in zip(ids, results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            if isinstance(r, BaseException):
                errors[i] = str(r) or type(r).__name__
        return {"started": [i for i in ids if i not in errors], "errors": errors}

    return dispatch


def register(d: Dispatcher, host: JobHost) -> None:
    """Register the job operations on ``d``."""

    def _own(caller: Caller, j: dict[str, Any]) -> bool:
        return caller.admin or j["user"] == caller.name

    limits = SubmitLimits(None, None, None)

    def check_limits(caller: Caller, tasks: int) -> None:
        o = host.options  # read each time: SIGHUP may have changed them
        limits.rate, limits.burst, limits.max_queued = (o.user_submit_rate, o.user_submit_burst,
                                                        o.user_max_queued_jobs)
        limits.check(caller.name, tasks, host.jobs.pending_by_user.get(caller.name, 0))

    async def submit(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Submit a job file."""
        if caller.uid == 0:
            raise ApiError("root cannot submit jobs; submit as the tenant who should run them",
                           "forbidden")
        script = arg(args, "script", str)
        if len(script.encode()) > MAX_SCRIPT_BYTES:
            raise ApiError("the job file is larger than 1 MiB; keep data out of the script",
                           "too_large")
        overrides = arg(args, "overrides", dict, {})
        home = host.home_of(caller) or "/"
        workdir = arg(args, "workdir", str, "") or home
        if not workdir.startswith("/"):
            raise ApiError("workdir must be an absolute path", "bad_request")
        brands = set(KNOWN_BRANDS) | {p.brand for p in host.options.gpu_probes}
        try:
            spec = parse_job_file(script, {str(k): str(v) for k, v in overrides.items()},
                                  default_workdir=workdir, brands=brands)
            check_priority(spec.priority, is_admin=caller.admin)
            host.scheduler.check_submit(spec.request)
        except JobError as exc:
            raise ApiError(str(exc), "rejected") from exc
        tasks = expand_array(spec) if spec.array else None
        token = arg(args, "token", str, None)
        if not (token and token in host.jobs.tokens):  # a retry of an accepted one passes
            check_limits(caller, len(tasks) if tasks else 1)
        record = {"user": caller.name, "uid": caller.uid, "name": spec.name,
                  "spec": spec_to_dict(spec), "workdir": spec.workdir}
        if spec.container:
            record["container"] = await submitted_image(host, caller, args, spec.container)
        r = await host.replicate(host.jobs.submit, record, tasks, time.time(), token)
        host.scheduler.accepted(r["tasks"])
        return {"job_id": r["job_id"], "tasks": len(r["tasks"]), "warnings": list(spec.warnings),
                "duplicate": r.get("duplicate", False)}

    def list_(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Jobs: your active ones, or with all=true your finished ones too (admins: everyone's)."""
        show_all = arg(args, "all", bool, False)
        user = arg(args, "user", str, None)
        out = []
        users: dict[tuple[str, int], JobUser] = {}
        for j in (host.jobs.all() if show_all else host.jobs.active()):
            if not _own(caller, j) or (user and j["user"] != user):
                continue
            if not show_all and j["state"] in FINAL_STATES:
                continue
            who = (j["user"], j["uid"])
            if who not in users:
                users[who] = host.job_user(*who)
            out.append(job_view(j, host.scheduler, users[who]))
        out.sort(key=lambda v: (v["submit_time"], v["job_id"]))
        return out

    def show(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """One job; an array's id shows its tasks."""
        jid = str(arg(args, "job_id", (str, int)))
        tasks = [j for j in host.jobs.tasks_of(jid) if _own(caller, j)]
        if not tasks:
            raise ApiError(f"no job {jid} of yours; `mt-job list --all` shows your jobs",
                           "not_found")
        if len(tasks) == 1 and tasks[0]["job_id"] == jid:
            return job_view(tasks[0], host.scheduler, host.job_user(tasks[0]['user'], tasks[0]['uid']))
        views = [job_view(t, host.scheduler, host.job_user(t['user'], t['uid'])) for t in sorted(tasks, key=lambda t: t["array_task"])]
        states = sorted({v["state"] for v in views})
        return {"job_id": jid, "array": True, "state": states[0] if len(states) == 1 else "MIXED",
                "user": tasks[0]["user"], "name": tasks[0]["name"], "tasks": views,
                "nodes": sorted({n for v in views for n in v["nodes"]}),
                "gpus": [g for v in views for g in v["gpus"]], "exit_code": None, "reason": ""}

    async def cancel(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Cancel jobs (an array's id cancels every task), with an optional reason."""
        ids = arg(args, "job_ids", list)
        why = " ".join(arg(args, "reason", str, "").split())[:200]
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
        return {**r, "not_found": missing}

    def nodes(caller: Caller, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Every member's GPUs, VRAM, CPUs and RAM, with the jobs holding each GPU."""
        held: dict[str, dict[int, list[str]]] = {}
        for j in host.jobs.active():
            for m in (j.get("placement") or {}).get("members", []):
                for i in m["gpu_indices"]:
                    held.setdefault(m["node"], {}).setdefault(i, []).append(j["job_id"])
        out = []
        drains = host.scheduler.drains
        for name, inv in sorted(host.scheduler.nodes.items()):
            state = str(host.scheduler.state_of(name))
            d = inv.to_dict(held.get(name, {}), state=state)
            drain = drains.get(name) if drains is not None else None
            d["drain_reason"] = drain["reason"] if drain else None
            out.append(d)
        return out

    d.register("job.submit", submit)
    d.register("job.list", list_)
    d.register("job.show", show)
    d.register("job.cancel", cancel, audit=True)  # audited when an admin cancels
    d.register("nodes", nodes)

