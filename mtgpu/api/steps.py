"""Job steps: what ``srun`` runs inside a job, for ``mt-job show`` to list.

``srun`` in a job's script (or an allocation's shell) asks ``job.step`` to begin a
step before it starts its tasks and to end it with their exit status. Steps are
numbered from 0 per job and member: every member of a ``nodes=N`` job runs the same
script, so its N-th ``srun`` is the same step everywhere, and each member records its
own part. They are kept in this member's memory only (the job's record is replicated;
its steps are a view of what ran here), bounded per job and in jobs.

A tenant may record steps of its own running jobs only; the text of a step (its
command) is bounded and shown escaped like every other tenant text.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import ApiError, ValidationError
from mtgpu.jobstate import RUNNING

#: The most steps kept per job (the count goes on; the oldest records are dropped),
#: and the most jobs whose steps are kept (the longest-unused jobs are forgotten).
MAX_STEPS_KEPT = 200
MAX_JOBS_KEPT = 5000
#: The longest command text kept for a step, and the most tasks one step may have.
MAX_STEP_COMMAND = 200
MAX_STEP_TASKS = 4096


class StepLog:
    """Steps by job id, on this member."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def begin(self, job_id: str, node: str, ntasks: int, first_task: int, command: str, now: float) -> int:
        """Record a new step of ``job_id`` on ``node`` and return its number."""
        entry = self._jobs.pop(job_id, None) or {"next": 0, "steps": []}
        self._jobs[job_id] = entry
        while len(self._jobs) > MAX_JOBS_KEPT:
            self._jobs.popitem(last=False)
        step_id = entry["next"]
        entry["next"] = step_id + 1
        entry["steps"].append(
            {
                "step_id": f"{job_id}.{step_id}",
                "step": step_id,
                "node": node,
                "ntasks": ntasks,
                "first_task": first_task,
                "command": command,
                "state": "RUNNING",
                "exit_code": None,
                "start_time": now,
                "end_time": None,
            }
        )
        del entry["steps"][:-MAX_STEPS_KEPT]
        return step_id

    def end(self, job_id: str, step: int, exit_code: int, now: float) -> bool:
        """Record the end of step ``step`` (False if it is not known here)."""
        entry = self._jobs.get(job_id)
        for s in (entry or {}).get("steps", ()):
            if s["step"] == step and s["state"] == "RUNNING":
                s.update(state="COMPLETED" if exit_code == 0 else "FAILED", exit_code=exit_code, end_time=now)
                return True
        return False

    def of(self, job_id: str) -> list[dict[str, Any]]:
        """The steps of ``job_id`` recorded here, oldest first (copies)."""
        return [dict(s) for s in (self._jobs.get(job_id) or {}).get("steps", ())]


def register(d: Dispatcher, host: Any, log: StepLog) -> None:
    """Register ``job.step`` on ``d``."""

    def step(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Begin (``action=begin``, with ``ntasks``, ``first_task`` and ``command``) or
        end (``action=end``, with ``step`` and ``exit_code``) a step of the caller's
        running job ``job_id`` on this member."""
        jid = arg(args, "job_id", str)
        action = arg(args, "action", str)
        job = host.jobs.record(jid)
        if job is None or job.user != caller.name or caller.uid == 0:
            raise ApiError(f"no job {jid} of yours", "not_found")
        here = host.options.server_name
        if action == "begin":
            if job.state != RUNNING:
                raise ValidationError(
                    f"job {jid} is {job.state}, not RUNNING; steps run inside a running job"
                )
            nodes = job.nodes
            if here not in nodes:
                raise ValidationError(f"job {jid} does not run on {here}")
            ntasks = arg(args, "ntasks", int)
            first = arg(args, "first_task", int, 0)
            if not 0 < ntasks <= MAX_STEP_TASKS or not 0 <= first < 1 << 20:
                raise ValidationError(f"ntasks must be 1 to {MAX_STEP_TASKS}")
            command = " ".join(arg(args, "command", str, "")[: MAX_STEP_COMMAND * 4].split())[
                :MAX_STEP_COMMAND
            ]
            return {"step": log.begin(jid, here, ntasks, first, command, time.time())}
        if action == "end":
            n = arg(args, "step", int)
            code = arg(args, "exit_code", int)
            if not -255 <= code <= 255:
                raise ValidationError("exit_code must be -255 to 255")
            return {"ended": log.end(jid, n, code, time.time())}
        raise ValidationError("action must be begin or end")

    d.register("job.step", step)
