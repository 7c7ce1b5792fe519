"""What one job member is told to run, and the environment and output files it gets.

:class:`JobLaunch` is everything the supervisor needs to start one member of a job on
this host, as plain values the daemon can write to JSON. :func:`build_env` and
:func:`output_paths` turn it into the job's environment and its stdout/stderr paths.
Everything here is pure: no I/O, no clock, so it is tested with tables of cases.
"""

from __future__ import annotations

import errno
import re
import secrets
import socket
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from mtgpu.errors import JobError

#: Job ids name directories and cgroups, so they are kept to a safe alphabet.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: The PATH a job starts with; a job file or ``env`` extras may extend it.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Where output goes when the job file names no ``output``/``error`` (under the home):
#: one directory per cluster, so clusters sharing homes never write to each other's.
DEFAULT_OUTPUT_DIR = "~/.mtgpu/jobs/{cluster}/%j"
#: The layout of records written before that, still read for them.
OLD_OUTPUT_DIR = "~/.mtgpu/jobs/%j"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def default_output_dir(cluster: str) -> str:
    """The default output directory pattern of a job submitted on ``cluster``.

    >>> default_output_dir("lab"), default_output_dir("")
    ('~/.mtgpu/jobs/lab/%j', '~/.mtgpu/jobs/%j')
    """
    if not cluster:
        return OLD_OUTPUT_DIR
    if not _SAFE_NAME.fullmatch(cluster):
        cluster = "cluster-" + format(zlib.crc32(cluster.encode()), "08x")
    return DEFAULT_OUTPUT_DIR.format(cluster=cluster)


#: torchrun's usual port; single-node jobs get one derived from the job id instead,
#: so two jobs on one host rarely pick the same one.
#: RENDEZVOUS_PORTS's default (mtgpu/config/options.py).
DEFAULT_RENDEZVOUS_PORTS = (29500, 39499)
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
        return cls(account.name, account.uid, account.gid, account.home, account.shell, tuple(account.groups))


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
    #: An array task's own numeric id, its SLURM_JOB_ID as in Slurm ("": the job id).
    numeric_id: str = ""
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
    #: A multi-member job on a job network of its own (TENANT_NETWORK: private): each
    #: rank's member address, in rank order, between which its VXLAN link runs.
    member_addrs: tuple[str, ...] = ()
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
    #: The cluster the job was submitted on: its default output directory's parent
    #: (``""``: a record from before per-cluster directories, ``~/.mtgpu/jobs/ID``).
    output_cluster: str = ""
    #: How the job holds its GPUs (exclusive, shared, overcommit), the VRAM it declared
    #: per GPU and the smallest total VRAM of its GPUs here (0: unknown), from which
    #: frameworks are told their share (:func:`framework_env`).
    gpu_mode: str = ""
    vram: int = 0
    gpu_vram_total: int = 0
    #: The daemon's directory of tenant commands (``srun``, ``mt-job``), first on the
    #: job's PATH, and its API socket, which ``srun`` records steps through.
    tools_dir: str = ""
    api_socket: str = ""
    #: The submitting shell's umask (None: 022) and resource limits, ``{"nofile":
    #: [soft, hard]}`` with -1 for unlimited (:mod:`mtgpu.schedd.submitenv`).
    umask: int | None = None
    rlimits: Mapping[str, Any] = field(default_factory=dict)
    #: sbatch's --signal: this signal (0: none) ``warn_before`` seconds before the time
    #: limit, to the job's main process only (``B:``) or to all its processes.
    warn_signal: int = 0
    warn_before: float = 0.0
    warn_batch_only: bool = False
    #: sbatch's --open-mode=append: output files are appended to, not truncated.
    open_append: bool = False
    #: An array task's array: (count, lowest, highest, step) of its indices.
    array_shape: tuple[int, int, int, int] | None = None
    #: sbatch's task counts, when the job file gave them (SLURM_NTASKS...).
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    #: The script's arguments (``sbatch job.sh A B``: ``$1``, ``$2``), given in its argv.
    script_args: tuple[str, ...] = ()

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
        d["rlimits"] = {k: list(v) for k, v in self.rlimits.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobLaunch:
        """The inverse of :meth:`to_dict`; unknown keys are ignored (newer writers)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["user"] = JobUser(**{**d["user"], "groups": tuple(d["user"].get("groups", ()))})
        for name in (
            "gpu_indices",
            "device_nodes",
            "cpus",
            "nodelist",
            "member_addrs",
            "container_argv",
            "array_shape",
            "script_args",
        ):
            if kw.get(name) is not None:
                kw[name] = tuple(kw[name])
        return cls(**kw)


def array_shape(indices: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(count, lowest, highest, step) of an array's indices, as Slurm's
    SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP give them (step 1 unless evenly spaced).

    >>> array_shape((0, 5, 10)), array_shape((1, 2, 7))
    ((3, 0, 10, 5), (3, 1, 7, 1))
    """
    if not indices:
        return None
    steps = {b - a for a, b in zip(indices, indices[1:], strict=False)}
    return len(indices), indices[0], indices[-1], steps.pop() if len(steps) == 1 else 1


def substitute(pattern: str, launch: JobLaunch) -> str:
    """Expand Slurm's filename patterns in ``pattern``.

    ``%j`` job id (an array task's own numeric id, as in Slurm), ``%J`` the same (the
    batch script is no step, so Slurm adds no ``.STEP``), ``%A`` array master id (the
    job id outside arrays), ``%a`` array index (``4294967294``, as Slurm writes,
    outside arrays), ``%b`` that index modulo 10, ``%x`` job name, ``%u`` user, ``%N``
    node name, ``%n`` node rank, ``%t`` task rank (the script is the member's one task:
    its node rank), ``%s`` the step (``batch``), ``%%`` a percent sign. As in Slurm, a
    width between ``%`` and the letter (``%4a``, at most 10) zero-pads a number. A
    leading ``~/`` is the tenant's home. Unknown ``%`` letters are kept as written.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> substitute("~/out/%x-%A_%a.log", JobLaunch("7_3", u, "", "/", name="train",
    ...            array_task_id=3, array_job_id="7"))
    '/home/ann/out/train-7_3.log'
    >>> substitute("%x_%J_%t_%s-%3a.log", JobLaunch("12", u, "", "/", name="t", array_task_id=5))
    't_12_0_batch-005.log'
    """
    values = {
        "j": launch.numeric_id or launch.job_id,
        "J": launch.numeric_id or launch.job_id,
        "A": launch.array_job_id or launch.job_id,
        "a": str(launch.array_task_id) if launch.array_task_id is not None else "4294967294",
        "b": str((launch.array_task_id if launch.array_task_id is not None else 4294967294) % 10),
        "x": launch.name,
        "u": launch.user.name,
        "N": launch.node_name,
        "n": str(launch.node_rank),
        "t": str(launch.node_rank),
        "s": "batch",
    }

    def fill(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        if letter == "%":
            return "%" if not width else m.group(0)
        value = values.get(letter)
        if value is None:
            return m.group(0)
        return value.zfill(min(int(width), 10)) if width and value.isdigit() else value

    out = re.sub(r"%([0-9]*)([A-Za-z%])", fill, pattern)
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
    # The default directory is named by the id as shown (an array task's 13_1, not its
    # numeric id), where mt-job and the manual say a job's output is.
    default_dir = substitute(default_output_dir(launch.output_cluster), replace(launch, numeric_id=""))

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
    """The rendezvous port: the one the job's rank-0 member picked when it started it
    (:func:`pick_rendezvous_port`), else one picked here now.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> master_port(JobLaunch("7", u, "", "/", master_port=4000))
    4000
    """
    if launch.master_port:
        return launch.master_port
    return pick_rendezvous_port(DEFAULT_RENDEZVOUS_PORTS)


def pick_rendezvous_port(ports: tuple[int, int], tries: int = 1024) -> int:
    """A port from ``ports`` (FIRST, LAST), drawn at random (from the system's secure
    source: another tenant cannot guess it) among those nothing on this host is bound
    to now. Up to ``tries`` distinct ports are tried.

    >>> 29500 <= pick_rendezvous_port((29500, 39499)) <= 39499
    True
    """
    first, last = ports
    tries = min(tries, last - first + 1)
    for port in secrets.SystemRandom().sample(range(first, last + 1), tries):
        if port_free(port):
            return port
    raise JobError(
        f"no free rendezvous port in RENDEZVOUS_PORTS ({first}-{last}) after {tries} "
        "tries; widen the range or free ports in it"
    )


def port_free(port: int) -> bool:
    """True if no TCP socket here is bound to ``port`` (any address, IPv4 or IPv6)."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with s:
            try:
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((addr, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
    return True


def framework_env(launch: JobLaunch) -> dict[str, str]:
    """What tells frameworks the share of a shared or overcommit job's GPUs.

    JAX preallocates 75 % of a card and TensorFlow maps nearly all of it unless told
    otherwise, which would take a neighbour's promised VRAM: JAX gets its share as a
    fraction (rounded down), or no preallocation where the card's size is unknown;
    TensorFlow grows as needed; ``MTGPU_GPU_MEMORY`` is the share in bytes, for
    ``torch.cuda.set_per_process_memory_fraction``. The job's own settings win.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> sorted(framework_env(JobLaunch("1", u, "", "/", gpu_indices=(0,), gpu_mode="shared",
    ...     vram=20 << 30, gpu_vram_total=80 << 30)).items())  # doctest: +NORMALIZE_WHITESPACE
    [('MTGPU_GPU_MEMORY', '21474836480'), ('TF_FORCE_GPU_ALLOW_GROWTH', 'true'),
     ('XLA_PYTHON_CLIENT_MEM_FRACTION', '0.25')]
    """
    if not launch.gpu_indices or launch.gpu_mode not in ("shared", "overcommit"):
        return {}
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    if launch.vram > 0:
        env["MTGPU_GPU_MEMORY"] = str(launch.vram)
    if launch.vram > 0 and launch.gpu_vram_total > 0:
        fraction = max(1, min(100, launch.vram * 100 // launch.gpu_vram_total)) / 100
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.2f}"
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def build_env(launch: JobLaunch) -> dict[str, str]:
    """The whole environment of the job: a clean base, extras, scheduler variables.

    Later layers win: the base (HOME, USER, PATH...), then what tells frameworks
    a shared GPU's share (:func:`framework_env`), then the job's ``env``
    extras (except ``MTGPU_*``/``SLURM_*``), then the scheduler's variables, then
    the GPU visibility variables. Slurm's names are set too, so existing scripts run
    unchanged. With no GPU reserved, ``CUDA_VISIBLE_DEVICES`` is empty, which hides
    every NVIDIA GPU from CUDA (the devices cgroup is the wall behind that hint).
    """
    u = launch.user
    env: dict[str, str] = {
        "HOME": u.home,
        "USER": u.name,
        "LOGNAME": u.name,
        "SHELL": u.shell,
        "PATH": f"{launch.tools_dir}:{DEFAULT_PATH}" if launch.tools_dir else DEFAULT_PATH,
        "LANG": "C.UTF-8",
    }
    env.update(framework_env(launch))
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
        # Which start of the job this is (0 first; a requeue adds one), as Slurm's.
        "MTGPU_RESTART_COUNT": str(launch.attempt),
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "MTGPU_RDZV_ENDPOINT": f"{addr}:{port}",
        # torchrun reads its options from PET_* variables: an unmodified
        # `torchrun --nproc-per-node=N train.py` joins the other members.
        "PET_NNODES": str(launch.nnodes),
        "PET_NODE_RANK": str(launch.node_rank),
        "PET_MASTER_ADDR": addr,
        "PET_MASTER_PORT": port,
        # An array task's is its own numeric id, as in Slurm (13_1 is how the task is
        # shown); scancel, scontrol, sacct and mt-job accept either.
        "SLURM_JOB_ID": launch.numeric_id or launch.job_id,
        "SLURM_RESTART_COUNT": str(launch.attempt),
        "SLURM_JOBID": launch.numeric_id or launch.job_id,
        "SLURM_JOB_NAME": launch.name,
        "SLURM_JOB_USER": u.name,
        "SLURM_JOB_UID": str(u.uid),
        "SLURM_JOB_GID": str(u.gid),
        "SLURM_NODEID": str(launch.node_rank),
        "SLURM_PROCID": str(launch.node_rank),
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": str(launch.nnodes),
        "SLURM_JOB_NUM_NODES": str(launch.nnodes),
        "SLURM_NTASKS": str(launch.ntasks or launch.nnodes),
        "SLURM_NPROCS": str(launch.ntasks or launch.nnodes),
        "SLURM_NTASKS_PER_NODE": str(launch.ntasks_per_node or 1),
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_GPUS_ON_NODE": str(len(launch.gpu_indices)),
    }
    if launch.node_name:
        ours["SLURMD_NODENAME"] = launch.node_name
    if launch.umask is not None:
        ours["SLURM_UMASK"] = format(launch.umask, "04o")
    if cpus:
        ours.update(SLURM_CPUS_PER_TASK=str(launch.cpus_per_task or cpus), SLURM_CPUS_ON_NODE=str(cpus))
    if launch.ram is not None:
        ours["SLURM_MEM_PER_NODE"] = str(max(1, launch.ram >> 20))
    if launch.gpu_indices:
        ours["SLURM_JOB_GPUS"] = gpus
    if launch.array_task_id is not None:
        array_id = launch.array_job_id or launch.job_id
        ours.update(
            MTGPU_ARRAY_TASK_ID=str(launch.array_task_id),
            MTGPU_ARRAY_JOB_ID=array_id,
            SLURM_ARRAY_TASK_ID=str(launch.array_task_id),
            SLURM_ARRAY_JOB_ID=array_id,
        )
        if launch.array_shape:
            count, low, high, step = launch.array_shape
            ours.update(
                SLURM_ARRAY_TASK_COUNT=str(count),
                SLURM_ARRAY_TASK_MIN=str(low),
                SLURM_ARRAY_TASK_MAX=str(high),
                SLURM_ARRAY_TASK_STEP=str(step),
            )
    if launch.time_limit:
        ours["MTGPU_TIME_LIMIT"] = str(int(launch.time_limit))
    if launch.api_socket:
        ours["MTGPU_API_SOCKET"] = launch.api_socket
    env.update(ours)
    env.update(launch.gpu_env if launch.gpu_indices or launch.gpu_env else {"CUDA_VISIBLE_DEVICES": ""})
    return env


#: Where a containerized job's script is mounted in its container.
CONTAINER_SCRIPT = "/.mtgpu-job"
#: Variables of the job that a container does not take from the host (its image has
#: its own PATH and shell).
CONTAINER_SKIP_ENV = frozenset({"PATH", "SHELL"})
#: Variables that steer podman itself (podman(1), containers.conf(5),
#: containers-storage.conf(5)): the podman that runs a containerized job uses this
#: member's settings, never ones exported from the submitting shell (another member's
#: container store, or a containers.conf without the policy hook).
PODMAN_SETTINGS = frozenset(
    {
        "CONTAINERS_CONF",
        "CONTAINERS_CONF_OVERRIDE",
        "CONTAINERS_REGISTRIES_CONF",
        "CONTAINERS_STORAGE_CONF",
        "CONTAINER_CONNECTION",
        "CONTAINER_HOST",
        "CONTAINER_SSHKEY",
        "REGISTRIES_CONFIG_PATH",
        "STORAGE_DRIVER",
        "STORAGE_OPTS",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
    }
)


def container_env(launch: JobLaunch, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a containerized job's ``podman run``: the job's variables
    without those that steer podman, then this member's podman settings.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> la = JobLaunch("7", u, "echo hi", "/", container_env={"XDG_RUNTIME_DIR": "/run/user/2000"})
    >>> container_env(la, {"A": "1", "CONTAINERS_STORAGE_CONF": "/elsewhere/storage.conf"})
    {'A': '1', 'XDG_RUNTIME_DIR': '/run/user/2000'}
    """
    out = {k: v for k, v in env.items() if k not in PODMAN_SETTINGS}
    out.update(launch.container_env)
    return out


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
    skip = CONTAINER_SKIP_ENV | PODMAN_SETTINGS
    opts += [f"--env={k}" for k in sorted(env) if k not in skip]
    opts.append(f"--volume={launch.container_script}:{CONTAINER_SCRIPT}:ro")
    return [*opts, image, *job_argv(launch, CONTAINER_SCRIPT, default="/bin/sh")]


def job_argv(launch: JobLaunch, script_path: str, default: str = "/bin/bash") -> list[str]:
    """The argv that runs the job's script, stored at ``script_path``, with the
    script's arguments after it (as words of the argv, never through a shell).

    A ``#!`` line picks the interpreter, as ``sbatch`` does; otherwise bash runs it,
    since job files are written for Slurm's shell. The interpreter and at most one
    argument are taken from the line, as the kernel takes them.

    >>> u = JobUser("ann", 2000, 2000, "/home/ann")
    >>> job_argv(JobLaunch("7", u, "#!/usr/bin/env python3\\nprint(1)", "/"), "/s")
    ['/usr/bin/env', 'python3', '/s']
    >>> job_argv(JobLaunch("7", u, "echo hi", "/", script_args=("200", "a b")), "/s")
    ['/bin/bash', '/s', '200', 'a b']
    """
    first = launch.script.split("\n", 1)[0]
    if first.startswith("#!"):
        parts = first[2:].strip().split(None, 1)
        if parts:
            return [*parts, script_path, *launch.script_args]
    return [default, script_path, *launch.script_args]
