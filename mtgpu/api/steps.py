"""Job steps: what ``srun`` runs inside a job, for ``mt-job show`` to list.

``srun`` in a job's script (or an allocation's shell) asks ``job.step`` to begin a
step before it starts its tasks and to end it with their exit status. Steps are
numbered from 0 per job and member: every member of a ``nodes=N`` job runs the same
script, so its N-th ``srun`` is the same step everywhere, and each member records its
own part. They are kept in this member's memory only (the job's record is replicated;
its steps are a view of what ran here), bounded per job and in jobs.

A tenant may record steps of its own running jobs only; the text of a step (its
command) is bounded and shown escaped like every other tenant text.

A step that asks for GPUs (``srun --gres=gpu:N``, ``-G N``, ``--gpus-per-task``)
holds that many of the job's GPUs on this member while it runs, by their place in
the job's list (``CUDA_VISIBLE_DEVICES``): two steps running at once never get the
same one unless one asks for none. A step asking for more than are free now is
answered ``step_busy`` (srun waits and asks again, as Slurm's "step creation temporarily
disabled"); more than the job holds here is refused.
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

    def free_gpus(self, job_id: str, held: int) -> list[int]:
        """The places (0 to ``held``-1) in the job's GPU list no running step holds."""
        taken = {
            g
            for s in (self._jobs.get(job_id) or {}).get("steps", ())
            if s["state"] == "RUNNING"
            for g in s.get("gpus", ())
        }
        return [g for g in range(held) if g not in taken]

    def begin(
        self,
        job_id: str,
        node: str,
        ntasks: int,
        first_task: int,
        command: str,
        now: float,
        gpus: list[int] | None = None,
    ) -> int:
        """Record a new step of ``job_id`` on ``node`` (holding the places ``gpus`` of
        the job's GPUs) and return its number."""
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
                "gpus": list(gpus or ()),
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
            want = arg(args, "gpus", int, 0)
            held = next((len(m.gpu_indices) for m in job.members if m.node == here), 0)
            if not 0 <= want <= MAX_STEP_TASKS:
                raise ValidationError(f"gpus must be 0 to {MAX_STEP_TASKS}")
            if want > held:
                raise ValidationError(f"the step asks for {want} GPUs; job {jid} holds {held} on {here}")
            free = log.free_gpus(jid, held)
            if want > len(free):
                raise ApiError(
                    f"{want} GPUs asked; {len(free)} of job {jid}'s {held} on {here} are not "
                    "held by its running steps",
                    "step_busy",  # srun waits and asks again (not the client's own retry)
                )
            taken = free[:want]
            n = log.begin(jid, here, ntasks, first, command, time.time(), taken)
            return {"step": n, "gpus": taken}
        if action == "end":
            n = arg(args, "step", int)
            code = arg(args, "exit_code", int)
            if not -255 <= code <= 255:
                raise ValidationError("exit_code must be -255 to 255")
            return {"ended": log.end(jid, n, code, time.time())}
        raise ValidationError("action must be begin or end")

    d.register("job.step", step)
