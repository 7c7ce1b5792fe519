"""What one job member is told to run, and the environment and output files it gets.

:class:`JobLaunch` is everything the supervisor needs to start one member of a job on
this host, as plain values the daemon can write to JSON. :func:`build_env` and
:func:`output_paths` turn it into the job's environment and its stdout/stderr paths.
Everything here is pure: no I/O, no clock, so it is tested with tables of cases.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: Job ids name directories and cgroups, so they are kept to a safe alphabet.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: The PATH a job starts with; a job file or ``env`` extras may extend it.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Where output goes when the job file names no ``output``/``error`` (under the home).
DEFAULT_OUTPUT_DIR = "~/.mtgpu/jobs/%j"
#: torchrun's usual port; single-node jobs get one derived from the job id instead,
#: so two jobs on one host rarely pick the same one.
MASTER_PORT_BASE = 29500
#: Variables the scheduler owns. ``env`` extras cannot override them, so a job's
#: record and what it saw agree.
_RESERVED_PREFIXES = ("MTGPU_", "SLURM_", "SLURMD_")


@dataclass(frozen=True)
class JobUser:
    """The tenant a job runs as (the fields of an account the supervisor needs)."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str = "/bin/sh"
    groups: tuple[int, ...] = ()

    @classmethod
    def from_account(cls, account: Any) -> JobUser:
        """Take the fields from an :class:`mtgpu.accounts.provision.Account`."""
        return cls(account.name, account.uid, account.gid, account.home, account.shell,
                   tuple(account.groups))


@dataclass(frozen=True)
class JobLaunch:
    """One member of one job, as the daemon hands it to the runner.

    Sizes are bytes, times seconds. ``stdout``/``stderr`` are the job file's
    ``output``/``error`` patterns (``None``: the default files under
    ``~/.mtgpu/jobs/ID/``). ``gpu_env`` is :meth:`Sampler.visibility_env` for the
    reserved GPUs and ``device_nodes`` is :meth:`Sampler.device_nodes`: the only GPU
    device files the job may open. ``cpus`` are host core ids. ``state_dir`` is the
    root-owned directory of this job on this host; the runner fills it in.
    ``term`` is the scheduler leader's term that dispatched the job, kept for fencing.
    """

    job_id: str
    user: JobUser
    script: str
    workdir: str
    name: str = "job"
    array_task_id: int | None = None
    array_job_id: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_env: Mapping[str, str] = field(default_factory=dict)
    gpu_indices: tuple[int, ...] = ()
    device_nodes: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    ram: int | None = None
    time_limit: float | None = None
    node_rank: int = 0
    nnodes: int = 1
    nodelist: tuple[str, ...] = ()
    node_name: str = ""
    master_addr: str = ""
    master_port: int = 0
    submit_dir: str = ""
    container: str | None = None
    #: A containerized job: ``podman run ...`` up to and including the image (the
    #: workspaces layer makes it under the container policy); the supervisor adds the
    #: job's variables and script. Empty for a native job.
    container_argv: tuple[str, ...] = ()
    #: The container's name (removed when the job ends, whatever ended it).
    container_name: str = ""
    #: Where the supervisor writes the script, as the tenant, for the container to read.
    container_script: str = ""
    #: Variables podman itself needs (its runtime directory, PATH to its helpers).
    container_env: Mapping[str, str] = field(default_factory=dict)
    state_dir: str = ""
    term: int = 0
    #: Which run of the job this is: its requeue count (a requeued job may be placed
    #: again within the same term).
    attempt: int = 0
    #: Seconds between SIGTERM and SIGKILL when the time limit ends the job.
    kill_grace: float = 10.0
    #: Most processes and threads the job may have at once (a fork-bomb bound).
    pids_max: int = 4096
    #: What the reason says to do when ``workdir`` is missing on this member (the
    #: daemon fills it in a cluster whose members do not all share homes).
    workdir_help: str = ""

    def __post_init__(self) -> None:
        if not JOB_ID_RE.match(self.job_id):
            raise ValueError(f"job id {self.job_id!r} must be letters, digits, '_', '.' or '-'")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.ram is not None and self.ram <= 0:
            raise ValueError("ram must be a positive number of bytes or None")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :meth:`from_dict` reads it back."""
        d = asdict(self)
        d["env"], d["gpu_env"] = dict(self.env), dict(self.gpu_env)
        d["container_env"] = dict(self.container_env)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobLaunch:
        """The inverse of :meth:`to_dict`; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["user"] = JobUser(**{**d["user"], "groups": tuple(d["user"].get("groups", ()))})
        for name in ("gpu_indices", "device_nodes", "cpus", "nodelist", "container_argv"):
            if name in kw:
                kw[name] = tuple(kw[name])
        return cls(**kw)


def substitute(pattern: str, launch: JobLaunch) -> str:
    """Expand Slurm's filename patterns in ``pattern``.

    ``%j`` job id, ``%A`` array master id (the job id outside arrays), ``%a`` array
    index (``4294967294``, as Slurm writes, outside arrays), ``%x`` job name, ``%u``
    user, ``%N`` node name, ``%n`` node rank, ``%%`` a percent sign. A leading
    ``~/`` is the tenant's home. Unknown ``%`` letters are kept as written.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> substitute("~/out/%x-%A_%a.log", JobLaunch("7_3", u, "", "/", name="train",
    ...            array_task_id=3, array_job_id="7"))
    '/home/ann/out/train-7_3.log'
    """
    values = {
        "j": launch.job_id,
        "A": launch.array_job_id or launch.job_id,
        "a": str(launch.array_task_id) if launch.array_task_id is not None else "4294967294",
        "x": launch.name,
        "u": launch.user.name,
        "N": launch.node_name,
        "n": str(launch.node_rank),
        "%": "%",
    }
    out = re.sub(r"%([A-Za-z%])", lambda m: values.get(m.group(1), m.group(0)), pattern)
    if out == "~" or out.startswith("~/"):
        out = launch.user.home.rstrip("/") + out[1:]
    return out


def output_paths(launch: JobLaunch) -> tuple[str, str, bool]:
    """``(stdout, stderr, default)``: absolute paths of the job's output files.

    As in Slurm, ``output`` alone sends both streams to one file, a relative path is
    relative to the working directory, and ``error`` alone leaves stdout at its
    default. ``default`` is True when stdout is the default file, whose directory the
    supervisor creates (as the tenant).

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> output_paths(JobLaunch("7", u, "", "/work", stdout="o-%j.txt"))
    ('/work/o-7.txt', '/work/o-7.txt', False)
    """
    default_dir = substitute(DEFAULT_OUTPUT_DIR, launch)

    def absolute(pattern: str) -> str:
        path = substitute(pattern, launch)
        return path if path.startswith("/") else f"{launch.workdir.rstrip('/')}/{path}"

    if launch.stdout:
        out = absolute(launch.stdout)
        return out, absolute(launch.stderr) if launch.stderr else out, False
    out = f"{default_dir}/stdout.log"
    err = absolute(launch.stderr) if launch.stderr else f"{default_dir}/stderr.log"
    return out, err, True


def master_port(launch: JobLaunch) -> int:
    """The rendezvous port: the daemon's choice, else one derived from the job id.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> master_port(JobLaunch("7", u, "", "/", master_port=4000))
    4000
    """
    if launch.master_port:
        return launch.master_port
    return MASTER_PORT_BASE + zlib.crc32((launch.array_job_id or launch.job_id).encode()) % 10000


def build_env(launch: JobLaunch) -> dict[str, str]:
    """The whole environment of the job: a clean base, extras, scheduler variables.

    Later layers win: the base (HOME, USER, PATH...), then the job's ``env``
    extras (except ``MTGPU_*``/``SLURM_*``), then the scheduler's variables, then
    the GPU visibility variables. Slurm's names are set too, so existing scripts run
    unchanged. With no GPU reserved, ``CUDA_VISIBLE_DEVICES`` is empty, which hides
    every NVIDIA GPU from CUDA (the devices cgroup is the wall behind that hint).
    """
    u = launch.user
    env: dict[str, str] = {
        "HOME": u.home, "USER": u.name, "LOGNAME": u.name, "SHELL": u.shell,
        "PATH": DEFAULT_PATH, "LANG": "C.UTF-8",
    }
    env.update({k: v for k, v in launch.env.items() if not k.startswith(_RESERVED_PREFIXES)})
    nodes = list(launch.nodelist) or [launch.node_name or "localhost"]
    addr = launch.master_addr or (nodes[0] if launch.nnodes > 1 else "127.0.0.1")
    port = str(master_port(launch))
    cpus = len(launch.cpus)
    gpus = ",".join(str(i) for i in launch.gpu_indices)
    submit_dir = launch.submit_dir or launch.workdir
    ours = {
        "MTGPU_JOB_ID": launch.job_id,
        "MTGPU_JOB_NAME": launch.name,
        "MTGPU_NODE_RANK": str(launch.node_rank),
        "MTGPU_NNODES": str(launch.nnodes),
        "MTGPU_NODELIST": ",".join(nodes),
        "MTGPU_GPUS": gpus,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "MTGPU_RDZV_ENDPOINT": f"{addr}:{port}",
        # torchrun reads its options from PET_* variables: an unmodified
        # `torchrun --nproc-per-node=N train.py` joins the other members.
        "PET_NNODES": str(launch.nnodes),
        "PET_NODE_RANK": str(launch.node_rank),
        "PET_MASTER_ADDR": addr,
        "PET_MASTER_PORT": port,
        "SLURM_JOB_ID": launch.job_id,
        "SLURM_JOBID": launch.job_id,
        "SLURM_JOB_NAME": launch.name,
        "SLURM_JOB_USER": u.name,
        "SLURM_JOB_UID": str(u.uid),
        "SLURM_JOB_GID": str(u.gid),
        "SLURM_NODEID": str(launch.node_rank),
        "SLURM_PROCID": str(launch.node_rank),
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": str(launch.nnodes),
        "SLURM_JOB_NUM_NODES": str(launch.nnodes),
        "SLURM_NTASKS": str(launch.nnodes),
        "SLURM_NPROCS": str(launch.nnodes),
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_GPUS_ON_NODE": str(len(launch.gpu_indices)),
    }
    if launch.node_name:
        ours["SLURMD_NODENAME"] = launch.node_name
    if cpus:
        ours.update(SLURM_CPUS_PER_TASK=str(cpus), SLURM_CPUS_ON_NODE=str(cpus))
    if launch.ram is not None:
        ours["SLURM_MEM_PER_NODE"] = str(max(1, launch.ram >> 20))
    if launch.gpu_indices:
        ours["SLURM_JOB_GPUS"] = gpus
    if launch.array_task_id is not None:
        array_id = launch.array_job_id or launch.job_id
        ours.update(MTGPU_ARRAY_TASK_ID=str(launch.array_task_id), MTGPU_ARRAY_JOB_ID=array_id,
                    SLURM_ARRAY_TASK_ID=str(launch.array_task_id), SLURM_ARRAY_JOB_ID=array_id)
    if launch.time_limit:
        ours["MTGPU_TIME_LIMIT"] = str(int(launch.time_limit))
    env.update(ours)
    env.update(launch.gpu_env if launch.gpu_indices or launch.gpu_env
               else {"CUDA_VISIBLE_DEVICES": ""})
    return env


#: Where a containerized job's script is mounted in its container.
CONTAINER_SCRIPT = "/.mtgpu-job"
#: Variables of the job that a container does not take from the host (its image has
#: its own PATH and shell).
CONTAINER_SKIP_ENV = frozenset({"PATH", "SHELL"})


def container_command(launch: JobLaunch, env: Mapping[str, str]) -> list[str]:
    """The whole ``podman run`` command of a containerized job: the launch's options,
    each job variable passed by name (podman reads the values from its own
    environment, so none is on a command line), the script mounted read-only, the
    image, then the script's interpreter (``/bin/sh`` without a ``#!`` line: images
    often have no bash).

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> la = JobLaunch("7", u, "echo hi", "/", container_argv=("podman", "run", "img"),
    ...                container_script="/run/user/2000/j7")
    >>> container_command(la, {"PATH": "/bin", "MTGPU_JOB_ID": "7"})
    ['podman', 'run', '--env=MTGPU_JOB_ID', '--volume=/run/user/2000/j7:/.mtgpu-job:ro', 'img', '/bin/sh', '/.mtgpu-job']
    """
    *opts, image = launch.container_argv
    opts += [f"--env={k}" for k in sorted(env) if k not in CONTAINER_SKIP_ENV]
    opts.append(f"--volume={launch.container_script}:{CONTAINER_SCRIPT}:ro")
    return [*opts, image, *job_argv(launch, CONTAINER_SCRIPT, default="/bin/sh")]


def job_argv(launch: JobLaunch, script_path: str, default: str = "/bin/bash") -> list[str]:
    """The argv that runs the job's script, stored at ``script_path``.

    A ``#!`` line picks the interpreter, as ``sbatch`` does; otherwise bash runs it,
    since job files are written for Slurm's shell. The interpreter and at most one
    argument are taken from the line, as the kernel takes them.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> job_argv(JobLaunch("7", u, "#!/usr/bin/env python3\\nprint(1)", "/"), "/s")
    ['/usr/bin/env', 'python3', '/s']
    >>> job_argv(JobLaunch("7", u, "echo hi", "/"), "/s")
    ['/bin/bash', '/s']
    """
    first = launch.script.split("\n", 1)[0]
    if first.startswith("#!"):
        parts = first[2:].strip().split(None, 1)
        if parts:
            return [*parts, script_path]
    return [default, script_path]
