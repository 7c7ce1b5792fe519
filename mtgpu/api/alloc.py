"""Interactive allocations: a tenant's own process joins one of its running jobs.

``mt-job alloc`` queues a job that only holds its resources (its script sleeps to its
time limit). Once it runs here, the client asks ``job.adopt`` to move the client's
own process into the job's cgroups, as Slurm's ``pam_slurm_adopt`` moves an ssh
session into a job: the shell it then starts has exactly the job's GPUs (devices
cgroup), CPUs, memory and time limit, and the supervisor ends it with the job.

The process is pinned with a pidfd before it is checked: every uid of it (real,
effective, saved, filesystem) must be the caller's, so a tenant moves only its own
unprivileged processes, and only into its own job.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from mtgpu.api.dispatcher import Caller, Dispatcher, arg
from mtgpu.errors import ApiError, ValidationError
from mtgpu.jobstate import RUNNING
from mtgpu.schedd.jobenv import JobLaunch, build_env


def _uids(pid: int) -> list[str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return []
    return next((ln.split()[1:] for ln in text.splitlines() if ln.startswith("Uid:")), [])


def register(d: Dispatcher, host: Any) -> None:
    """Register ``job.adopt`` on ``d``."""

    async def adopt(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
        """Move the caller's process ``pid`` into its running job ``job_id`` here."""
        jid = arg(args, "job_id", str)
        pid = arg(args, "pid", int)
        job = host.jobs.record(jid)
        if job is None or job.user != caller.name or caller.uid == 0:
            raise ApiError(f"no job {jid} of yours", "not_found")
        if job.state != RUNNING:
            raise ValidationError(f"job {jid} is {job.state}, not RUNNING; wait for it to start")
        nodes = job.nodes
        here = host.options.server_name
        if here not in nodes:
            raise ValidationError(f"job {jid} runs on {', '.join(nodes)}, not {here}; log in there to use it")
        job_dir = host.agent.runner.job_dir(jid)
        try:
            dirs = json.loads((job_dir / "cgroups.json").read_text())
            launch = json.loads((job_dir / "spec.json").read_text())["launch"]
        except (OSError, ValueError, KeyError) as exc:
            raise ApiError(
                f"job {jid} has no cgroups on {here} (yet); its processes cannot "
                "be joined. Try again in a moment, or ask the admin",
                "unavailable",
            ) from exc
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError) as exc:
            raise ValidationError(f"no process {pid}") from exc
        try:
            if _uids(pid) != [str(caller.uid)] * 4:
                raise ApiError(f"process {pid} is not yours", "forbidden")
            for path in dirs.values():
                fd = os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(pid).encode())
                finally:
                    os.close(fd)
            signal.pidfd_send_signal(pidfd, 0)  # still the process that was checked
        except ProcessLookupError as exc:
            raise ValidationError(f"process {pid} ended") from exc
        except OSError as exc:
            raise ApiError(
                f"cannot move process {pid} into job {jid}: {exc.strerror}", "unavailable"
            ) from exc
        finally:
            os.close(pidfd)
        env = dict(launch.get("gpu_env") or {}) or {"CUDA_VISIBLE_DEVICES": ""}
        try:  # what a batch job of it sees: Slurm's and MTGPU's variables, as salloc's shell
            whole = build_env(JobLaunch.from_dict(launch))
            env.update({k: v for k, v in whole.items() if k.startswith(("SLURM_", "SLURMD_", "MTGPU_"))})
        except (KeyError, TypeError, ValueError):  # a launch of an older release: the ids
            pass
        env.update(MTGPU_JOB_ID=jid, SLURM_JOB_ID=jid)
        if launch.get("time_limit"):
            env["MTGPU_TIME_LIMIT"] = str(int(launch["time_limit"]))
        return {
            "job_id": jid,
            "node": here,
            "env": env,
            "gpus": list(launch.get("gpu_indices") or []),
            "cgroups": sorted(dirs),
        }

    d.register("job.adopt", adopt)
